//! `brigade bench …`: one file a subcommand, its flags beside what it measures; `args` holds
//! the flags and helpers several share. Each prints ratios measured side by side in one run.

mod args;
mod beside;
mod checkpoint;
mod comm;
mod embed;
mod engine;
mod loadgen;
mod matmul;
mod parallel;
mod plan;
mod programs;
mod serve;
mod train;

use anyhow::Result;
use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum BenchCmd {
    /// The planner's local prediction of a training step beside a real run of it; with
    /// --layout, of a parallel layout (rank threads, --threads each) from one rank's measured
    /// work, the groups' measured all-reduces and the schedule's simulated pipeline.
    Plan(plan::Flags),
    /// What the machine takes from ranks side by side before any communication: kernels and
    /// one worker's step alone on a core, then as independent copies at once; the ceiling of
    /// a layout's speedup, and (--layouts) each layout as a fraction of it.
    Beside(beside::Flags),
    /// What a periodic checkpoint costs training: the same job without saves, with saves
    /// written in the foreground and in the background; the step's wait and the job's time.
    Checkpoint(checkpoint::Flags),
    /// Collective bandwidth and latency per message size, in nccl-tests' form, after a memcpy baseline.
    Comm(comm::Flags),
    /// f32 matmul GFLOP/s on the shapes of the PyTorch peer and of GPT-2's backward.
    Matmul(matmul::Flags),
    /// Training throughput of parallel layouts run side by side in this process (one rank
    /// thread each, --threads threads per rank), with the speedup over the first layout.
    Parallel(parallel::Flags),
    /// `brigade embed` on a generated corpus (documents of 20–40 words) with 1 and 2 workers
    /// of 1 thread and 1 worker of 2 threads, against the matrix-product rate at the
    /// encoder's shapes; projects 100 million documents.
    Embed(embed::Flags),
    /// The serving engine alone in this process (no HTTP): N requests generated at once on a
    /// GPT-2 shape with random weights, output tokens/s per concurrency.
    Engine(engine::Flags),
    /// The HTTP server under load: `brigade serve` started in this process on loopback (or the
    /// server at --url) and a load generator of streamed completions; vLLM's serving figures
    /// per load, and the fraction of the weight-read and matmul limits measured in the run.
    Serve(serve::Flags),
    /// Programs of generation calls inside the engine against the same calls one at a time
    /// and driven by a client through /v1/completions.
    Programs(programs::Flags),
    /// Training-step throughput and model FLOP utilisation against this machine's matmul rate.
    Train(train::Flags),
}

pub fn run(cmd: BenchCmd) -> Result<()> {
    match cmd {
        BenchCmd::Plan(f) => plan::run(f),
        BenchCmd::Beside(f) => beside::run(f),
        BenchCmd::Checkpoint(f) => checkpoint::run(f),
        BenchCmd::Comm(f) => comm::run(f),
        BenchCmd::Matmul(f) => matmul::run(f),
        BenchCmd::Parallel(f) => parallel::run(f),
        BenchCmd::Embed(f) => embed::run(f),
        BenchCmd::Engine(f) => engine::run(f),
        BenchCmd::Serve(f) => serve::run(f),
        BenchCmd::Programs(f) => programs::run(f),
        BenchCmd::Train(f) => train::run(f),
    }
}
