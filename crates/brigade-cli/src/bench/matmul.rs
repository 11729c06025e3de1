//! `brigade bench matmul`: f32 matrix-product rates on the shapes of the PyTorch peer and of
//! GPT-2's backward, brigade's kernel beside the gemm crate where both run.

use anyhow::{bail, Result};
use clap::Args;

#[derive(Args, Debug)]
pub struct Flags {
    #[arg(long, default_value_t = crate::threads::default_threads())]
    pub(crate) threads: usize,
    /// Timed repetitions per shape (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub(crate) reps: usize,
    #[arg(long)]
    pub(crate) json: bool,
}

pub fn run(f: Flags) -> Result<()> {
    let Flags { threads, reps, json } = f;

    crate::threads::check_threads(threads, "--threads")?;
    if reps == 0 {
        bail!("--reps must be at least 1");
    }
    // brigade's kernel beside the gemm crate where both run (AVX2 + FMA)
    use brigade::tensor::Backend;
    let both = brigade::tensor::sgemm::runs_here();
    let backends: &[Backend] = if both { &[Backend::Brigade, Backend::GemmCrate] } else { &[Backend::GemmCrate] };
    if !both && !json {
        outln!("(this CPU runs the gemm crate only: brigade's kernel needs AVX2 + FMA)");
    }
    let mut ratios = Vec::new();
    for &(m, k, n, ta, tb) in brigade::bench::MATMUL_SHAPES {
        let g = brigade::with_threads(threads, || brigade::bench::matmul_gflops_on(backends, m, k, n, ta, tb, reps))?;
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
            let mut line =
                format!("{m:>6} x {k:>6} x {n:>6}  a{} b{}  {threads} threads: {:7.1} GFLOP/s", op(ta), op(tb), g[0]);
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
    // serving's row-invariant kernel at a decode step's shapes, its weights from memory, beside
    // the 2048³ rate `bench serve` takes as its matmul limit
    let square = brigade::with_threads(threads, || brigade::bench::matmul_gflops(2048, 2048, 2048, reps))?;
    if !json {
        outln!("row-invariant kernel (serving), weights from memory, vs 2048³ on the general kernel ({square:.1} GFLOP/s):");
    }
    for &(k, n) in brigade::bench::ROWS_SHAPES {
        let counts = brigade::bench::ROWS_COUNTS;
        let rates = brigade::with_threads(threads, || brigade::bench::rows_gflops(k, n, counts, reps))?;
        for (&m, &g) in counts.iter().zip(&rates) {
            if json {
                outln!(
                    "{}",
                    serde_json::json!({"bench": "matmul_rows", "threads": threads, "m": m, "k": k, "n": n,
                    "gflops": (g * 10.0).round() / 10.0, "of_2048_cubed": (g / square * 1000.0).round() / 1000.0})
                );
            } else {
                outln!(
                    "{m:>6} x {k:>6} x {n:>6}  rows  {threads} threads: {g:7.1} GFLOP/s   {:.0}% of 2048³",
                    100.0 * g / square
                );
            }
        }
    }
    // the cores' own peak: no product can pass it
    let Some(peak) = brigade::bench::machine::fma_peak_gflops_concurrent(threads) else { return Ok(()) };
    if json {
        outln!(
            "{}",
            serde_json::json!({"bench": "fma_peak", "threads": threads, "simd": brigade::tensor::simd_name(),
            "gflops": (peak * 10.0).round() / 10.0, "of_fma_peak_2048_cubed": (square / peak * 1000.0).round() / 1000.0})
        );
    } else {
        outln!(
            "the cores' peak (register-only fused multiply-adds, {}, {threads} threads at once): {peak:.1} GFLOP/s; 2048³ runs at {:.0}% of it",
            brigade::tensor::simd_name(),
            100.0 * square / peak
        );
    }
    Ok(())
}
