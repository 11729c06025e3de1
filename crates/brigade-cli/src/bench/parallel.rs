//! `brigade bench parallel`: training throughput of parallel layouts run side by side in this
//! process, with where each step's time goes and the pipeline's bubble.

use anyhow::{bail, Result};
use clap::Args;

#[derive(Args, Debug)]
pub struct Flags {
    #[arg(long, default_value = "gpt2-small")]
    pub(crate) model: String,
    #[arg(long, default_value_t = 256)]
    pub(crate) seq: usize,
    /// The model's longest sequence (default: the model's own, raised to --seq where it is
    /// shorter, for long-context runs).
    #[arg(long)]
    pub(crate) block_size: Option<usize>,
    /// Global batch in sequences (with --weak: per data-parallel replica).
    #[arg(long, default_value_t = 8)]
    pub(crate) batch: usize,
    /// Weak scaling, as DDP benchmarks measure: each layout's global batch is --batch × dp,
    /// so every replica runs the same work as the first layout's.
    #[arg(long)]
    pub(crate) weak: bool,
    /// Layouts separated by ';', e.g. "dp=1;dp=2;dp=2,zero=1"; the first is the baseline of
    /// the speedups.
    #[arg(long, default_value = "dp=1;dp=2")]
    pub(crate) layouts: String,
    /// Sequences per forward pass on a rank (default: the rank's whole share).
    #[arg(long)]
    pub(crate) micro_batch: Option<usize>,
    #[arg(long, default_value_t = 1)]
    pub(crate) threads: usize,
    /// Give every layout the same cores: each rank runs on cores / ranks threads (at least 1),
    /// so one worker on 2 cores is set beside cp=2 on 1 core a rank. Replaces --threads.
    #[arg(long, conflicts_with = "threads")]
    pub(crate) cores: Option<usize>,
    #[arg(long, default_value_t = 3)]
    pub(crate) steps: usize,
    #[arg(long, default_value_t = 1)]
    pub(crate) warmup: usize,
    #[arg(long)]
    pub(crate) json: bool,
}

pub fn run(f: Flags) -> Result<()> {
    let Flags { model, seq, batch, weak, layouts, micro_batch, threads, steps, warmup, json, block_size, cores } = f;

    crate::threads::check_threads(threads, "--threads")?;
    if let Some(c) = cores {
        crate::threads::check_threads(c, "--cores")?;
    }
    let threads_of = |l: &brigade::layout::Layout| cores.map_or(threads, |c| (c / l.world()).max(1));
    if steps == 0 {
        bail!("--steps must be at least 1");
    }
    let parsed = super::args::training_layouts(&layouts, |l, layout| {
        crate::threads::check_threads(layout.world() * threads_of(layout), &format!("layout '{l}': ranks × --threads"))
    })?;
    if parsed.is_empty() {
        bail!("--layouts is empty; give e.g. \"dp=1;dp=2\"");
    }
    let (mut cfg, dir) = super::args::text_run(&model, seq, batch, micro_batch, warmup + steps + 1)?;
    cfg.block_size = match block_size {
        Some(b) => Some(b),
        // the preset's block, unless --seq is longer
        None => cfg.model_config(256).ok().filter(|m| m.block_size < seq).map(|_| seq),
    };
    let mut base = None;
    if !json {
        let per_rank = match cores {
            Some(c) => format!("{c} cores per layout (cores / ranks threads a rank)"),
            None => format!("{threads} thread(s) per rank"),
        };
        outln!(
            "{model}, {} batch {batch} × seq {seq}, {per_rank}, median of {steps} steps",
            if weak { "per-replica" } else { "global" }
        );
        outln!(
            "{:<34} {:>5} {:>10} {:>8} {:>10} {:>8} {:>10} {:>9} {:>8} {:>8} {:>10} {:>9} {:>7} {:>7} {:>10} {:>11}",
            "layout",
            "ranks",
            "tokens/s",
            "speedup",
            "compute s",
            "optim s",
            "exp.comm s",
            "cp comm s",
            "wait s",
            "other s",
            "peak MiB",
            "stash MiB",
            "bubble",
            "theory",
            "attn imbal",
            "stage imbal"
        );
    }
    let mut rows = Vec::new();
    let bucket = brigade::parallel::data::DataParallel::default().bucket_elems;
    for (l, layout) in parsed {
        let cfg = brigade::train::TrainConfig { batch: if weak { batch * layout.dp } else { batch }, ..cfg.clone() };
        let r = brigade::bench::parallel_step(cfg, &layout, bucket, threads_of(&layout), warmup, steps)?;
        let speedup = r.tokens_per_s / *base.get_or_insert(r.tokens_per_s);
        if json {
            rows.push(serde_json::json!({"layout": l, "ranks": r.ranks, "tokens_per_s": r.tokens_per_s,
                "speedup": speedup, "compute_s": r.compute_s, "optimizer_s": r.optimizer_s,
                "exposed_comm_s": r.exposed_comm_s, "tp_comm_s": r.tp_comm_s, "dp_comm_s": r.dp_comm_s,
                "pp_comm_s": r.pp_comm_s, "cp_comm_s": r.cp_comm_s, "attention_s_per_rank": r.attention_s_per_rank,
                "attention_imbalance": r.attention_imbalance, "pipeline_wait_s": r.pipeline_wait_s, "idle_s": r.other_s, "peak_mib_per_rank": r.peak_mib_per_rank,
                "bubble_measured": r.bubble_measured, "bubble_theory": r.bubble_theory,
                "stash_mib_per_rank": r.stash_mib, "stage_busy_s": r.stage_busy_s, "stage_imbalance": r.stage_imbalance}));
        } else {
            let pct = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{:.1}%", 100.0 * x));
            outln!(
                "{l:<34} {:>5} {:>10.1} {:>7.2}x {:>10.3} {:>8.3} {:>10.3} {:>9.3} {:>8.3} {:>8.3} {:>10.0} {:>9} {:>7} {:>7} {:>10} {:>11}",
                r.ranks,
                r.tokens_per_s,
                speedup,
                r.compute_s,
                r.optimizer_s,
                r.exposed_comm_s,
                r.cp_comm_s,
                r.pipeline_wait_s,
                r.other_s,
                r.peak_mib_per_rank.unwrap_or(f64::NAN),
                r.stash_mib.map_or("-".to_string(), |m| format!("{m:.1}")),
                pct(r.bubble_measured),
                pct(r.bubble_theory),
                pct(r.attention_imbalance),
                pct(r.stage_imbalance)
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
