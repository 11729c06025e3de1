//! `brigade bench train`: training-step throughput and model FLOP utilisation against this
//! machine's matmul rate, optionally with every kernel of the step timed alone.

use super::args::{ShapeArgs, StepArgs};
use anyhow::{bail, Result};
use clap::Args;

#[derive(Args, Debug)]
pub struct Flags {
    #[command(flatten)]
    pub(crate) step: StepArgs,
    /// Untimed steps first.
    #[arg(long, default_value_t = 1)]
    pub(crate) warmup: usize,
    /// Also time every kernel of the step alone at its shapes (matrix products by shape
    /// and transposition, attention, LayerNorm, GELU, cross-entropy, optimizer) with its
    /// GFLOP/s or GB/s.
    #[arg(long)]
    pub(crate) breakdown: bool,
    /// Also time drawing each step's batch from this token corpus (an llm.c or nanoGPT .bin,
    /// a Megatron dataset), 200 steps of them, and the resident memory the corpus adds.
    #[arg(long)]
    pub(crate) data: Option<std::path::PathBuf>,
}

pub fn run(f: Flags) -> Result<()> {
    let Flags {
        step: StepArgs { shape: ShapeArgs { model, seq, batch, threads, json }, steps },
        warmup,
        breakdown,
        data,
    } = f;

    if steps == 0 {
        bail!("--steps must be at least 1");
    }
    let cfg = crate::plan_cmd::step_shape(&model, batch, seq, threads)?;
    // the corpus first, so that its resident memory is measured beside nothing else's
    let loader = match &data {
        Some(p) => Some(brigade::bench::data_loader(p, cfg.vocab_size, batch, seq, 200)?),
        None => None,
    };
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
        if let Some(d) = &loader {
            v["data"] = serde_json::to_value(d)?;
            v["data"]["share_of_step"] = (d.batch_s_median / r.step_s_median).into();
        }
        v["bench"] = "train".into();
        v["model"] = model.into();
        if let Some((rows, mem)) = &kernels {
            v["breakdown"] = serde_json::to_value(rows)?;
            v["memory_gbps"] = (*mem).into();
            let (measured, streamed) = brigade::bench::breakdown::ceiling_s(rows, r.matmul_gflops_per_s, *mem);
            v["ceiling_s"] = measured.into();
            v["ceiling_mfu"] = (r.mfu * r.step_s_median / measured).into();
            v["ceiling_streamed_s"] = streamed.into();
            v["ceiling_streamed_mfu"] = (r.mfu * r.step_s_median / streamed).into();
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
            print_breakdown(rows, *mem, r.matmul_gflops_per_s, (r.step_s_median, r.mfu))?;
        }
        if let Some(d) = &loader {
            outln!(
                "data: {} tokens in {} documents, opened in {:.2} s; a step's batch in {:.3} ms median over {} steps = {:.4}% of the step; resident memory {:.0} -> {:.0} MiB (+{:.1})",
                d.corpus_tokens,
                d.documents,
                d.open_s,
                d.batch_s_median * 1e3,
                d.batches,
                100.0 * d.batch_s_median / r.step_s_median,
                d.rss_before_mib,
                d.rss_after_mib,
                d.rss_after_mib - d.rss_before_mib
            );
        }
    }
    Ok(())
}

/// The kernels of a step, slowest first, against the machine's matmul rate and memory
/// bandwidth, and their sum against the step as it ran.
fn print_breakdown(
    rows: &[brigade::bench::breakdown::KernelRow],
    mem_gbps: f64,
    matmul: f64,
    (step_s, mfu): (f64, f64),
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
    let (measured, streamed) = brigade::bench::breakdown::ceiling_s(rows, matmul, mem_gbps);
    outln!(
        "  ceiling: every product and the attention at the 2048³ rate, the memory-bound passes as measured: {measured:.3} s a step = {:.1}% of the matmul rate (those passes at most at the streaming rate: {streamed:.3} s = {:.1}%)",
        100.0 * mfu * step_s / measured,
        100.0 * mfu * step_s / streamed
    );
    Ok(())
}
