//! `brigade`: parse, validate, call the library. No logic here that a test could not call.

/// `println!` that returns an error instead of panicking when standard output is full or
/// unwritable (a closed pipe ends the process quietly, as Unix tools do: see `main`).
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($arg)*)
            .map_err(|e| anyhow::anyhow!("cannot write to standard output: {e}"))?;
    }};
}

/// Counts bytes per rank (for `bench parallel`'s peak memory) on top of the system allocator.
#[global_allocator]
static ALLOC: brigade::alloc::RankAlloc = brigade::alloc::RankAlloc;

mod bench;
mod embed_cmd;
mod eval_cmd;
mod export_cmd;
mod interrupt;
mod launch_cmd;
mod launch_serve;
mod plan_cmd;
mod route_cmd;
mod run_cmd;
mod sample_cmd;
mod serve_cmd;
mod shard_job;
mod threads;
mod tokenize_cmd;
mod train_args;
mod train_cmd;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "brigade", version, about = "Parallel training and inference for transformer models")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Train a GPT model (default: the built-in addition task on the `tiny` preset).
    Train(Box<train_cmd::TrainArgs>),
    /// Supervise a training job: restart it from its last checkpoint when a rank dies.
    Launch(launch_cmd::LaunchArgs),
    /// Generate text from a checkpoint directory (ours or a Hugging Face GPT-2).
    Sample(sample_cmd::SampleArgs),
    /// Predict step time, memory and utilisation of 3D layouts on a cluster, and pick the best.
    Plan(Box<plan_cmd::PlanArgs>),
    /// Embed a corpus with a sentence-transformers model, across workers, resumable.
    Embed(Box<embed_cmd::EmbedArgs>),
    /// Tokenize a corpus into token shards for training, across workers, resumable.
    Tokenize(Box<tokenize_cmd::TokenizeArgs>),
    /// Write a checkpoint as a GGUF file that llama.cpp and Ollama run.
    Export(export_cmd::ExportArgs),
    /// Measure a quantized model against its reference (KL divergence, top-1, perplexity).
    #[command(subcommand)]
    Eval(eval_cmd::EvalCmd),
    /// Write a checkpoint as a quantized GGUF file (q8_0, q4_0; the export's writer).
    Quantize(export_cmd::QuantizeArgs),
    /// Serve a GPT checkpoint over an OpenAI-compatible HTTP API, with continuous batching.
    Serve(Box<serve_cmd::ServeArgs>),
    /// One OpenAI-compatible front door over several `brigade serve` replicas: round robin,
    /// least loaded or cache-aware, health-checked, requests retried that have not started.
    Route(route_cmd::RouteArgs),
    /// Run a program of generation calls (fork, map, select, join) inside the engine.
    Run(Box<run_cmd::RunArgs>),
    /// Measure speed, side by side with a baseline measured in the same run.
    Bench {
        #[command(subcommand)]
        what: bench::BenchCmd,
    },
}

/// Keeps freed buffers in the process: gemm allocates packing buffers on every call, and
/// glibc's defaults would hand large ones back to the kernel each time, so every matmul paid
/// for fresh zeroed pages and TLB shootdowns (10–15% of a GPT-2 step, measured with perf).
fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only adjusts glibc's allocator thresholds; called before any threads start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

fn main() {
    // Rust ignores SIGPIPE, so writing to a closed pipe (`brigade plan … | head -1`) would
    // fail every later print; the default action ends the process quietly, as Unix tools do.
    #[cfg(unix)]
    // SAFETY: restores the default disposition of one signal before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    tune_allocator();
    let cli = Cli::parse();
    // the kernels read these once, wherever they run: a bad value is refused before any work
    if let Err(e) = brigade::tensor::check_simd_env() {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
    let res = match cli.cmd {
        Cmd::Train(a) => train_cmd::run(*a),
        // a server's ranks (launch_serve), or a training job (launch_cmd)
        Cmd::Launch(a) if a.command.first().is_some_and(|c| c == "serve") => launch_serve::run(&a),
        Cmd::Launch(a) => launch_cmd::run(a),
        Cmd::Sample(a) => sample_cmd::run(a),
        Cmd::Plan(a) => plan_cmd::run(*a),
        Cmd::Embed(a) => embed_cmd::run(*a),
        Cmd::Tokenize(a) => tokenize_cmd::run(*a),
        Cmd::Export(a) => export_cmd::run(a),
        Cmd::Quantize(a) => export_cmd::quantize(a),
        Cmd::Eval(c) => eval_cmd::run(c),
        Cmd::Serve(a) => serve_cmd::run(*a),
        Cmd::Route(a) => route_cmd::run(a),
        Cmd::Run(a) => run_cmd::run(*a),
        Cmd::Bench { what } => bench::run(what),
    };
    if let Err(e) = res {
        eprintln!("error: {e:#}");
        let code = if e.is::<interrupt::Interrupted>() {
            130
        } else if e.is::<train_cmd::RankLost>() {
            train_cmd::RANK_LOST_EXIT
        } else {
            1
        };
        std::process::exit(code);
    }
}
