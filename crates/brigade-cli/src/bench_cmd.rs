use anyhow::{bail, Result};
use clap::{Args, Subcommand};

/// The training step a benchmark times.
#[derive(Args, Debug)]
pub struct StepArgs {
    #[arg(long, default_value = "gpt2-small")]
    pub(crate) model: String,
    #[arg(long, default_value_t = 256)]
    pub(crate) seq: usize,
    #[arg(long, default_value_t = 4)]
    pub(crate) batch: usize,
    #[arg(long, default_value_t = crate::default_threads())]
    pub(crate) threads: usize,
    /// Steps timed (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub(crate) steps: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

/// The generation load a serving benchmark runs: a model shape, concurrent requests, prompt
/// and output lengths (shared by `bench engine` and `bench serve`).
#[derive(Args, Debug)]
pub struct LoadArgs {
    /// Model preset (random weights).
    #[arg(long, default_value = "gpt2-small")]
    pub(crate) model: String,
    /// Concurrent requests, comma-separated: one row each.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    pub(crate) concurrency: Vec<usize>,
    #[arg(long, default_value_t = 32)]
    pub(crate) prompt_len: usize,
    #[arg(long, default_value_t = 64)]
    pub(crate) output_len: usize,
    #[arg(long, default_value_t = crate::default_threads())]
    pub(crate) threads: usize,
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Subcommand, Debug)]
pub enum BenchCmd {
    /// The planner's local prediction of a training step beside a real run of it; with
    /// --layout, of a parallel layout (rank threads, --threads each) from one rank's measured
    /// work, the groups' measured all-reduces and the schedule's simulated pipeline.
    Plan {
        #[command(flatten)]
        step: StepArgs,
        /// A training layout, e.g. dp=2 or dp=2,pp=2,tp=2 or pp=2,schedule=zb,mb=1.
        #[arg(long)]
        layout: Option<String>,
        /// Sequences per forward pass on a rank (default: the layout's mb, else the rank's
        /// whole share).
        #[arg(long)]
        micro_batch: Option<usize>,
    },
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
    /// Training throughput of parallel layouts run side by side in this process (one rank
    /// thread each, --threads threads per rank), with the speedup over the first layout.
    Parallel {
        #[arg(long, default_value = "gpt2-small")]
        model: String,
        #[arg(long, default_value_t = 256)]
        seq: usize,
        /// Global batch in sequences (with --weak: per data-parallel replica).
        #[arg(long, default_value_t = 8)]
        batch: usize,
        /// Weak scaling, as DDP benchmarks measure: each layout's global batch is --batch × dp,
        /// so every replica runs the same work as the first layout's.
        #[arg(long)]
        weak: bool,
        /// Layouts separated by ';', e.g. "dp=1;dp=2;dp=2,zero=1"; the first is the baseline of
        /// the speedups.
        #[arg(long, default_value = "dp=1;dp=2")]
        layouts: String,
        /// Sequences per forward pass on a rank (default: the rank's whole share).
        #[arg(long)]
        micro_batch: Option<usize>,
        #[arg(long, default_value_t = 1)]
        threads: usize,
        #[arg(long, default_value_t = 3)]
        steps: usize,
        #[arg(long, default_value_t = 1)]
        warmup: usize,
        #[arg(long)]
        json: bool,
    },
    /// `brigade embed` on a generated corpus (documents of 20–40 words) with 1 and 2 workers
    /// of 1 thread and 1 worker of 2 threads, against the matrix-product rate at the
    /// encoder's shapes; projects 100 million documents.
    Embed {
        /// sentence-transformers model folder.
        #[arg(long)]
        model: std::path::PathBuf,
        #[arg(long, default_value_t = 10_000)]
        docs: usize,
        /// Documents per shard (default: a 100th of --docs, so two workers finish together).
        #[arg(long)]
        shard_size: Option<usize>,
        #[arg(long, default_value_t = 2048)]
        max_batch_tokens: usize,
        #[arg(long)]
        json: bool,
    },
    /// The serving engine alone in this process (no HTTP): N requests generated at once on a
    /// GPT-2 shape with random weights, output tokens/s per concurrency.
    Engine {
        #[command(flatten)]
        load: LoadArgs,
    },
    /// The HTTP server under load: `brigade serve` started in this process on loopback (or the
    /// server at --url) and a load generator of streamed completions; vLLM's serving figures
    /// per load, and the fraction of the weight-read and matmul limits measured in the run.
    Serve {
        #[command(flatten)]
        load: LoadArgs,
        /// Checkpoint directory to serve (default: --model's shape with random weights).
        #[arg(long, conflicts_with = "model")]
        checkpoint: Option<std::path::PathBuf>,
        /// Drive this OpenAI-compatible server instead (e.g. http://127.0.0.1:8080 for
        /// llama-server); the model shape still sets prompt token ids and the limits.
        #[arg(long)]
        url: Option<String>,
        /// Poisson arrivals at this many requests a second instead of --concurrency.
        #[arg(long, conflicts_with = "concurrency")]
        rate: Option<f64>,
        /// Requests per load (default: 4 × concurrency, at least 8; 30 s of arrivals at --rate).
        #[arg(long)]
        requests: Option<usize>,
        /// Tensor-parallel ranks of the server (threads split evenly over them).
        #[arg(long, default_value_t = 1)]
        tp: usize,
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// Training-step throughput and model FLOP utilisation against this machine's matmul rate.
    Train {
        #[command(flatten)]
        step: StepArgs,
        /// Untimed steps first.
        #[arg(long, default_value_t = 1)]
        warmup: usize,
        /// Also time every kernel of the step alone at its shapes (matrix products by shape
        /// and transposition, attention, LayerNorm, GELU, cross-entropy, optimizer) with its
        /// GFLOP/s or GB/s.
        #[arg(long)]
        breakdown: bool,
    },
}

pub fn run(cmd: BenchCmd) -> Result<()> {
    match cmd {
        BenchCmd::Plan { step, layout: Some(layout), micro_batch } => {
            crate::bench_plan::run(&step, &layout, micro_batch)
        }
        BenchCmd::Plan { step: StepArgs { model, seq, batch, threads, steps, json }, .. } => {
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
        BenchCmd::Engine { load: l } => {
            crate::check_threads(l.threads, "--threads")?;
            crate::bench_engine::run(&l.model, &l.concurrency, l.prompt_len, l.output_len, l.threads, l.json)
        }
        BenchCmd::Serve { load: l, checkpoint, url, rate, requests, tp, seed } => {
            crate::check_threads(l.threads, "--threads")?;
            crate::bench_serve::run(crate::bench_serve::Args {
                tp,
                checkpoint,
                model: l.model,
                url,
                concurrency: if rate.is_some() { vec![] } else { l.concurrency },
                rate,
                requests,
                prompt_len: l.prompt_len,
                output_len: l.output_len,
                threads: l.threads,
                seed,
                json: l.json,
            })
        }
        BenchCmd::Embed { model, docs, shard_size, max_batch_tokens, json } => {
            crate::bench_embed::run(&model, docs, shard_size, max_batch_tokens, json)
        }
        BenchCmd::Comm { ranks, backend, op, min_bytes, max_bytes, json } => {
            crate::comm_bench::run(ranks, &backend, &op, min_bytes, max_bytes, json)
        }
        BenchCmd::Parallel { model, seq, batch, weak, layouts, micro_batch, threads, steps, warmup, json } => {
            crate::check_threads(threads, "--threads")?;
            if steps == 0 {
                bail!("--steps must be at least 1");
            }
            let mut parsed = Vec::new();
            for l in layouts.split(';').map(str::trim).filter(|l| !l.is_empty()) {
                let layout = brigade::layout::Layout::parse(l)?;
                layout.check_training()?;
                crate::check_threads(layout.world() * threads, &format!("layout '{l}': ranks × --threads"))?;
                parsed.push((l.to_string(), layout));
            }
            if parsed.is_empty() {
                bail!("--layouts is empty; give e.g. \"dp=1;dp=2\"");
            }
            let (cfg, dir) = text_run(&model, seq, batch, micro_batch, warmup + steps + 1)?;
            let mut base = None;
            if !json {
                outln!(
                    "{model}, {} batch {batch} × seq {seq}, {threads} thread(s) per rank, median of {steps} steps",
                    if weak { "per-replica" } else { "global" }
                );
                outln!(
                    "{:<34} {:>5} {:>10} {:>8} {:>10} {:>10} {:>10} {:>10} {:>9} {:>7} {:>7}",
                    "layout",
                    "ranks",
                    "tokens/s",
                    "speedup",
                    "compute s",
                    "exp.comm s",
                    "other s",
                    "peak MiB",
                    "stash MiB",
                    "bubble",
                    "theory"
                );
            }
            let mut rows = Vec::new();
            let bucket = brigade::parallel::data::DataParallel::default().bucket_elems;
            for (l, layout) in parsed {
                let cfg =
                    brigade::train::TrainConfig { batch: if weak { batch * layout.dp } else { batch }, ..cfg.clone() };
                let r = brigade::bench::parallel_step(cfg, &layout, bucket, threads, warmup, steps)?;
                let speedup = r.tokens_per_s / *base.get_or_insert(r.tokens_per_s);
                if json {
                    rows.push(serde_json::json!({"layout": l, "ranks": r.ranks, "tokens_per_s": r.tokens_per_s,
                        "speedup": speedup, "compute_s": r.compute_s, "exposed_comm_s": r.exposed_comm_s,
                        "idle_s": r.other_s, "peak_mib_per_rank": r.peak_mib_per_rank,
                        "bubble_measured": r.bubble_measured, "bubble_theory": r.bubble_theory,
                        "stash_mib_per_rank": r.stash_mib}));
                } else {
                    let pct = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{:.1}%", 100.0 * x));
                    outln!(
                        "{l:<34} {:>5} {:>10.1} {:>7.2}x {:>10.3} {:>10.3} {:>10.3} {:>10.0} {:>9} {:>7} {:>7}",
                        r.ranks,
                        r.tokens_per_s,
                        speedup,
                        r.compute_s,
                        r.exposed_comm_s,
                        r.other_s,
                        r.peak_mib_per_rank.unwrap_or(f64::NAN),
                        r.stash_mib.map_or("-".to_string(), |m| format!("{m:.1}")),
                        pct(r.bubble_measured),
                        pct(r.bubble_theory)
                    );
                }
            }
            let _ = std::fs::remove_dir_all(&dir);
            if json {
                outln!(
                    "{}",
                    serde_json::json!({"bench": "parallel", "model": model, "batch": batch, "weak": weak, "seq": seq, "rows": rows})
                );
            }
            Ok(())
        }
        BenchCmd::Matmul { threads, reps, json } => {
            crate::check_threads(threads, "--threads")?;
            if reps == 0 {
                bail!("--reps must be at least 1");
            }
            // brigade's kernel beside the gemm crate where both run (AVX2 without AVX-512)
            use brigade::tensor::Backend;
            let both = brigade::tensor::sgemm::available();
            let backends: &[Backend] =
                if both { &[Backend::Brigade, Backend::GemmCrate] } else { &[Backend::GemmCrate] };
            if !both && !json {
                outln!("(this CPU runs the gemm crate only: brigade's kernel needs AVX2 + FMA without AVX-512)");
            }
            let mut ratios = Vec::new();
            for &(m, k, n, ta, tb) in brigade::bench::MATMUL_SHAPES {
                let g = brigade::with_threads(threads, || {
                    brigade::bench::matmul_gflops_on(backends, m, k, n, ta, tb, reps)
                })?;
                let r = |x: f64| (x * 10.0).round() / 10.0;
                if json {
                    let mut v = serde_json::json!({"bench": "matmul", "threads": threads, "m": m, "k": k, "n": n,
                        "ta": ta, "tb": tb, "gflops": r(g[0])});
                    if both {
                        v["gemm_crate_gflops"] = r(g[1]).into();
                        v["ratio"] = ((g[0] / g[1] * 1000.0).round() / 1000.0).into();
                    }
                    outln!("{v}");
                } else {
                    let op = |t: bool| if t { "ᵀ" } else { "" };
                    let mut line = format!(
                        "{m:>6} x {k:>6} x {n:>6}  a{} b{}  {threads} threads: {:7.1} GFLOP/s",
                        op(ta),
                        op(tb),
                        g[0]
                    );
                    if both {
                        line += &format!("   gemm crate {:7.1}   {:.2}x", g[1], g[0] / g[1]);
                    }
                    outln!("{line}");
                }
                if both {
                    ratios.push(g[0] / g[1]);
                }
            }
            if both && !json {
                outln!("median ratio brigade / gemm crate: {:.2}x", brigade::bench::median(&ratios));
            }
            Ok(())
        }
        BenchCmd::Train { step: StepArgs { model, seq, batch, threads, steps, json }, warmup, breakdown } => {
            if steps == 0 {
                bail!("--steps must be at least 1");
            }
            let cfg = crate::plan_cmd::step_shape(&model, batch, seq, threads)?;
            let r = brigade::with_threads(threads, || brigade::bench::train_step(cfg, batch, seq, warmup, steps))??;
            // a streaming copy reads and writes its bytes: its traffic is twice its size, as the
            // kernels' rates count theirs
            let kernels = match breakdown {
                true => Some(brigade::with_threads(threads, || {
                    (
                        brigade::bench::breakdown::breakdown(&cfg, batch, seq),
                        2.0 * brigade::bench::machine::copy_gbps(256 << 20),
                    )
                })?),
                false => None,
            };
            if json {
                let mut v = serde_json::to_value(&r)?;
                v["bench"] = "train".into();
                v["model"] = model.into();
                if let Some((rows, mem)) = &kernels {
                    v["breakdown"] = serde_json::to_value(rows)?;
                    v["memory_gbps"] = (*mem).into();
                }
                outln!("{v}");
            } else {
                outln!(
                    "matmul 2048x2048x2048 f32, {} threads: {:.1} GFLOP/s ({} kernel)",
                    r.threads,
                    r.matmul_gflops_per_s,
                    r.matmul_kernel
                );
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
                if let Some((rows, mem)) = &kernels {
                    print_breakdown(rows, *mem, r.matmul_gflops_per_s, r.step_s_median)?;
                }
            }
            Ok(())
        }
    }
}

/// The kernels of a step, slowest first, against the machine's matmul rate and memory
/// bandwidth, and their sum against the step as it ran.
fn print_breakdown(
    rows: &[brigade::bench::breakdown::KernelRow],
    mem_gbps: f64,
    matmul: f64,
    step_s: f64,
) -> Result<()> {
    let total: f64 = rows.iter().map(|r| r.seconds).sum();
    outln!("kernels of the step, each timed alone at its shapes (against a 256 MiB streaming copy's {mem_gbps:.1} GB/s of traffic and the {matmul:.1} GFLOP/s of a 2048³ matmul):");
    outln!("  {:<52} {:>5} {:>9} {:>6} {:>14} {:>8}", "kernel", "calls", "s/step", "share", "rate", "of peak");
    for r in rows {
        let peak = if r.unit == "GB/s" { mem_gbps } else { matmul };
        outln!(
            "  {:<52} {:>5} {:>9.4} {:>5.1}% {:>8.1} {:<7} {:>5.0}%",
            r.kernel,
            r.calls,
            r.seconds,
            100.0 * r.seconds / total,
            r.rate,
            r.unit,
            100.0 * r.rate / peak
        );
    }
    outln!(
        "  sum of the kernels {total:.3} s; the step as it ran {step_s:.3} s ({:.0}% of it in these kernels)",
        100.0 * total / step_s
    );
    Ok(())
}

/// A fresh private directory under the system's temporary directory.
/// A training run of `model` on random text (enough for any window: a step's cost does not
/// depend on it), in a fresh directory the caller removes.
pub(crate) fn text_run(
    model: &str,
    seq: usize,
    batch: usize,
    micro_batch: Option<usize>,
    steps: usize,
) -> Result<(brigade::train::TrainConfig, std::path::PathBuf)> {
    let dir = tempfile_dir()?;
    let data = dir.join("bench.txt");
    let text: String = {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        (0..20 * (seq + 1) + 1000).map(|_| rng.gen_range(b'a'..=b'z') as char).collect()
    };
    std::fs::write(&data, text)?;
    let cfg = brigade::train::TrainConfig {
        model: model.to_string(),
        data: Some(data),
        seq: Some(seq),
        batch,
        micro_batch,
        steps,
        eval_every: 0,
        ..Default::default()
    };
    Ok((cfg, dir))
}

fn tempfile_dir() -> Result<std::path::PathBuf> {
    let d = std::env::temp_dir().join(format!("brigade-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
