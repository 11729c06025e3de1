use anyhow::{bail, Result};
use clap::{Args, Subcommand};

/// The training step a benchmark times.
#[derive(Args, Debug)]
pub struct StepArgs {
    #[arg(long, default_value = "gpt2-small")]
    model: String,
    #[arg(long, default_value_t = 256)]
    seq: usize,
    #[arg(long, default_value_t = 4)]
    batch: usize,
    #[arg(long, default_value_t = crate::default_threads())]
    threads: usize,
    /// Steps timed (the median is reported).
    #[arg(long, default_value_t = 5)]
    steps: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand, Debug)]
pub enum BenchCmd {
    /// The planner's local prediction of a training step beside a real run of it.
    Plan(StepArgs),
    /// Collective bandwidth and latency per message size, in nccl-tests' form, after a memcpy baseline.
    Comm {
        /// Ranks (threads) for the local backend; under mpirun the launcher decides.
        #[arg(long, default_value_t = 2)]
        ranks: usize,
        /// local (threads sharing memory) or mpi (run under mpirun; needs --features mpi).
        #[arg(long, default_value = "local")]
        backend: String,
        /// all_reduce, reduce_scatter, all_gather or broadcast.
        #[arg(long, default_value = "all_reduce")]
        op: String,
        #[arg(long, default_value_t = 8)]
        min_bytes: usize,
        #[arg(long, default_value_t = 256 << 20)]
        max_bytes: usize,
        #[arg(long)]
        json: bool,
    },
    /// f32 matmul GFLOP/s on the shapes of the PyTorch peer and of GPT-2's backward.
    Matmul {
        #[arg(long, default_value_t = crate::default_threads())]
        threads: usize,
        /// Timed repetitions per shape (the median is reported).
        #[arg(long, default_value_t = 5)]
        reps: usize,
        #[arg(long)]
        json: bool,
    },
    /// Training-step throughput and model FLOP utilisation against this machine's matmul rate.
    Train {
        #[command(flatten)]
        step: StepArgs,
        /// Untimed steps first.
        #[arg(long, default_value_t = 1)]
        warmup: usize,
    },
}

pub fn run(cmd: BenchCmd) -> Result<()> {
    match cmd {
        BenchCmd::Plan(StepArgs { model, seq, batch, threads, steps, json }) => {
            if steps == 0 {
                bail!("--steps must be at least 1");
            }
            let (cfg, _, p) = crate::plan_cmd::local_prediction(&model, batch, seq, threads)?;
            let r = brigade::with_threads(threads, || brigade::bench::train_step(cfg, batch, seq, 1, steps))??;
            let ratio = p.step_s / r.step_s_median;
            if json {
                outln!(
                    "{}",
                    serde_json::json!({"bench": "plan", "model": model, "batch": batch, "seq": seq, "threads": threads,
                    "predicted_step_s": p.step_s, "measured_step_s": r.step_s_median, "predicted_over_measured": ratio, "parts": p})
                );
            } else {
                outln!(
                    "{model}, batch {batch} × seq {seq}, {threads} threads: predicted {:.4} s, measured {:.4} s (median of {steps}) → predicted/measured {:.3}",
                    p.step_s, r.step_s_median, ratio
                );
            }
            Ok(())
        }
        BenchCmd::Comm { ranks, backend, op, min_bytes, max_bytes, json } => {
            crate::comm_bench::run(ranks, &backend, &op, min_bytes, max_bytes, json)
        }
        BenchCmd::Matmul { threads, reps, json } => {
            crate::check_threads(threads, "--threads")?;
            if reps == 0 {
                bail!("--reps must be at least 1");
            }
            for &(m, k, n, ta, tb) in brigade::bench::MATMUL_SHAPES {
                let g = brigade::with_threads(threads, || brigade::bench::matmul_gflops_t(m, k, n, ta, tb, reps))?;
                if json {
                    let v = serde_json::json!({"bench": "matmul", "threads": threads, "m": m, "k": k, "n": n,
                        "ta": ta, "tb": tb, "gflops": (g * 10.0).round() / 10.0});
                    outln!("{v}");
                } else {
                    let op = |t: bool| if t { "ᵀ" } else { "" };
                    outln!("{m:>6} x {k:>6} x {n:>6}  a{} b{}  {threads} threads: {g:7.1} GFLOP/s", op(ta), op(tb));
                }
            }
            Ok(())
        }
        BenchCmd::Train { step: StepArgs { model, seq, batch, threads, steps, json }, warmup } => {
            if steps == 0 {
                bail!("--steps must be at least 1");
            }
            let cfg = crate::plan_cmd::step_shape(&model, batch, seq, threads)?;
            let r = brigade::with_threads(threads, || brigade::bench::train_step(cfg, batch, seq, warmup, steps))??;
            if json {
                let mut v = serde_json::to_value(&r)?;
                v["bench"] = "train".into();
                v["model"] = model.into();
                outln!("{v}");
            } else {
                outln!("matmul 2048x2048x2048 f32, {} threads: {:.1} GFLOP/s", r.threads, r.matmul_gflops_per_s);
                outln!(
                    "{model} training step, batch {batch} x seq {seq} ({:.1}M params): median {:.3} s over {} steps",
                    r.params as f64 / 1e6,
                    r.step_s_median,
                    r.steps_measured
                );
                outln!(
                    "  {:.1} tokens/s, {:.1} model GFLOP/s = {:.1}% of the matmul rate (loss {:.3} -> {:.3})",
                    r.tokens_per_s,
                    r.model_gflops_per_s,
                    100.0 * r.mfu,
                    r.loss_first,
                    r.loss_last
                );
            }
            Ok(())
        }
    }
}
