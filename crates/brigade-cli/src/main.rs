//! `brigade`: parse, validate, call the library. No logic here that a test could not call.

mod bench_cmd;
mod comm_bench;
mod plan_cmd;
mod sample_cmd;
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
    /// Generate text from a checkpoint directory (ours or a Hugging Face GPT-2).
    Sample(sample_cmd::SampleArgs),
    /// Predict step time, memory and utilisation of 3D layouts on a cluster, and pick the best.
    Plan(Box<plan_cmd::PlanArgs>),
    /// Measure speed, side by side with a baseline measured in the same run.
    Bench {
        #[command(subcommand)]
        what: bench_cmd::BenchCmd,
    },
}

/// Default intra-op threads: every core of the machine.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
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
    tune_allocator();
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Train(a) => train_cmd::run(*a),
        Cmd::Sample(a) => sample_cmd::run(a),
        Cmd::Plan(a) => plan_cmd::run(*a),
        Cmd::Bench { what } => bench_cmd::run(what),
    };
    if let Err(e) = res {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
