//! This machine, measured through brigade's own kernels and collectives: what `brigade plan
//! --local` and `brigade bench plan` feed the planner's local cost model (`plan::local`).

use super::median;
use crate::models::family::Qkv;
use crate::models::GptConfig;
use crate::plan::local::{Collectives, Machine};
use crate::tensor::attention::{attention_backward, attention_forward, AttnShape};
use crate::tensor::docs::Docs;
use crate::tensor::matmul;
use std::time::Instant;

/// Measures all-reduce latency and bandwidth among `ranks` rank threads.
pub fn measure_collectives(ranks: usize) -> crate::Result<Collectives> {
    use brigade_comm::bench::{sweep, Op};
    let rows = |lo, hi| {
        brigade_comm::local::run(ranks, |c| sweep(&c, Op::AllReduce, lo, hi, Default::default()))
            .map_err(|e| crate::Error::Train(format!("collective measurement failed: {e}")))
    };
    // Latency: the fastest small all-reduce (8 B – 4 KiB) of one sweep, since the first calls
    // of freshly started rank threads run cold.
    let small = rows(8, 4096)?;
    let large = rows(64 << 20, 64 << 20)?;
    let latency_us = small[0].iter().map(|r| r.time_us).fold(f64::INFINITY, f64::min);
    Ok(Collectives { ranks, latency_us, busbw_gbps: large[0][0].busbw_gbps })
}

/// Seconds of one call of `f`: the median of at least three timed calls after an untimed one,
/// and of as many more as fit in 50 ms of calls (at most 101). A product of a millisecond timed
/// three times read half its rate on 2 threads where a hundred calls read its own.
pub(super) fn time_it(mut f: impl FnMut()) -> f64 {
    f();
    let mut v = Vec::new();
    let start = Instant::now();
    while v.len() < 3 || (v.len() < 101 && start.elapsed().as_secs_f64() < 0.05) {
        let t0 = Instant::now();
        f();
        v.push(t0.elapsed().as_secs_f64());
    }
    median(&v)
}

/// Forward, weight-gradient and input-gradient products of an `n × d_in → d_out` layer.
fn linear_parts_s(n: usize, d_in: usize, d_out: usize) -> [f64; 3] {
    let x = vec![0.5f32; n * d_in];
    let w = vec![0.25f32; d_in * d_out];
    let mut y = vec![0f32; n * d_out];
    let mut dw = vec![0f32; d_in * d_out];
    let mut dx = vec![0f32; n * d_in];
    [
        time_it(|| matmul(&mut y, &x, &w, n, d_in, d_out, false, false, true)),
        time_it(|| matmul(&mut dw, &x, &y, d_in, n, d_out, true, false, true)),
        time_it(|| matmul(&mut dx, &y, &w, n, d_out, d_in, false, true, false)),
    ]
}

/// Bytes per second of a streaming copy of `bytes`, split over the pool, one stream a task: the
/// rate a step's passes (one or two arrays in, one out) see, which the planner predicts them
/// with. Not a bound on what a kernel copies (four streams side by side a core copied 1.5× as
/// fast on an AMD EPYC, Zen 2); `read_rates` gives the bound on reading.
pub fn copy_gbps(bytes: usize) -> f64 {
    use rayon::prelude::*;
    let src = vec![1f32; bytes / 4];
    let mut dst = vec![0f32; bytes / 4];
    let s =
        time_it(|| dst.par_chunks_mut(1 << 16).zip(src.par_chunks(1 << 16)).for_each(|(d, s)| d.copy_from_slice(s)));
    bytes as f64 / s / 1e9
}

/// Bytes per second of reading `bytes` (a sum over them, split over the pool: what a decode
/// step does with the weights) with each of `STREAMS` streams side by side a task; the best of
/// them is the bound on reading. One core following one stream leaves most of what memory
/// gives unused (an AMD EPYC, Zen 2, read 25.7 GB/s on 2 cores from one stream a core and
/// 52–53 GB/s from eight, while brigade's one-row product, four strips side by side, read its
/// weights at 48–50 GB/s), so a single stream's rate is no bound on what a kernel reads.
pub fn read_rates(bytes: usize) -> Vec<(usize, f64)> {
    let src = vec![1f32; bytes / 4];
    STREAMS
        .iter()
        .map(|&streams| {
            let s = time_it(|| {
                std::hint::black_box(read_streams(&src, streams));
            });
            (streams, bytes as f64 / s / 1e9)
        })
        .collect()
}

/// The stream counts `read_rates` tries.
pub const STREAMS: [usize; 5] = [1, 2, 4, 8, 16];

/// Floats each stream of a task reads: 60 KB, not a power of two (streams a power of two
/// apart read 5–10% slower here).
const STREAM_LEN: usize = 15_000;

/// The sum of `src`, split over the pool in tasks of `streams` streams read side by side (2, 4,
/// 8 and 16 have their own loops; any other count reads each task as one stream).
pub fn read_streams(src: &[f32], streams: usize) -> f32 {
    use rayon::prelude::*;
    src.par_chunks(streams.max(1) * STREAM_LEN)
        .map(|c| match streams {
            2 => side_by_side::<2>(c),
            4 => side_by_side::<4>(c),
            8 => side_by_side::<8>(c),
            16 => side_by_side::<16>(c),
            _ => read_all(c),
        })
        .sum()
}

/// The sum of `c` read as `S` streams side by side, 16 lanes each (the streams' whole groups
/// of 16), then what is left.
fn side_by_side<const S: usize>(c: &[f32]) -> f32 {
    let len = c.len() / S / 16 * 16;
    let mut acc = [[0f32; 16]; S];
    for i in (0..len).step_by(16) {
        for (q, a) in acc.iter_mut().enumerate() {
            let x: &[f32; 16] = c[q * len + i..q * len + i + 16].try_into().unwrap();
            a.iter_mut().zip(x).for_each(|(a, x)| *a += x);
        }
    }
    acc.iter().flatten().sum::<f32>() + read_all(&c[S * len..])
}

/// The sum of `c` in 16 lanes (whole groups of 16, then what is left; a streaming read the
/// compiler keeps vectorised).
pub(super) fn read_all(c: &[f32]) -> f32 {
    let whole = c.chunks_exact(16);
    let rest: f32 = whole.remainder().iter().sum();
    whole
        .fold([0f32; 16], |mut a, x| {
            a.iter_mut().zip(x).for_each(|(a, x)| *a += x);
            a
        })
        .iter()
        .sum::<f32>()
        + rest
}

/// This core's peak rate of fused multiply-adds, GFLOP/s: a loop of nothing but `fma`s on
/// registers (12 independent chains, so none waits on its own latency, each from its own
/// start), at the vector width brigade's kernels run here (512 bits where `tensor::wide()`,
/// else 256; `BRIGADE_SIMD=avx2` holds it to 256). No product can beat it: every fraction of a
/// product rate is bounded by it, and a job's FLOPs at this rate are the ceiling no kernel work
/// can pass. On one thread (the caller's); the best of five runs of 15–30 ms. `None` where
/// the CPU has no AVX + FMA (the kernels' own vector paths are not this loop's there).
pub fn fma_peak_gflops() -> Option<f64> {
    const ITERS: usize = 1 << 23;
    let mut best = None::<f64>;
    for _ in 0..5 {
        let t = Instant::now();
        let lanes = fma_chains(ITERS)?;
        let s = t.elapsed().as_secs_f64();
        best = Some(best.unwrap_or(0.0).max((ITERS * 12 * lanes * 2) as f64 / s / 1e9));
    }
    best
}

/// `fma_peak_gflops` on `workers` threads at once, summed: the most arithmetic the cores do
/// side by side (they may share a clock budget); `None` without AVX + FMA or where the
/// threads cannot start.
pub fn fma_peak_gflops_concurrent(workers: usize) -> Option<f64> {
    fma_chains(0)?;
    super::concurrent(workers, || fma_peak_gflops().unwrap_or(0.0)).ok()
}

/// `iters` rounds of 12 independent `fma`s on registers; the lanes a vector holds (`None`
/// without AVX + FMA).
fn fma_chains(iters: usize) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::tensor::wide() {
            // SAFETY: `wide()` checked AVX-512F
            return Some(unsafe { fma_chains_512(iters) });
        }
        if is_x86_feature_detected!("fma") && is_x86_feature_detected!("avx") {
            // SAFETY: AVX and FMA checked
            return Some(unsafe { fma_chains_256(iters) });
        }
    }
    let _ = iters;
    None
}

/// `fma_chains_256` and `fma_chains_512`: the same loop at each width.
macro_rules! fma_chains_at {
    ($name:ident, $features:literal, $vec:ident, $set1:ident, $fmadd:ident, $lanes:literal) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name(iters: usize) -> usize {
            use std::arch::x86_64::*;
            let (a, b) = ($set1(std::hint::black_box(0.999)), $set1(std::hint::black_box(1e-7)));
            // each chain from its own value, so that no compiler may fold them into one
            let mut c: [$vec; 12] = std::array::from_fn(|i| $set1(std::hint::black_box(i as f32 * 1e-3)));
            for _ in 0..iters {
                for x in c.iter_mut() {
                    *x = $fmadd(*x, a, b);
                }
            }
            std::hint::black_box(c);
            $lanes
        }
    };
}
fma_chains_at!(fma_chains_256, "avx,fma", __m256, _mm256_set1_ps, _mm256_fmadd_ps, 8);
fma_chains_at!(fma_chains_512, "avx512f", __m512, _mm512_set1_ps, _mm512_fmadd_ps, 16);

/// Measures the parts of a training step of `cfg` at `batch × seq` on the current pool, as
/// one rank of a tensor-parallel group of `tp` runs them (its heads, hidden units and
/// vocabulary block).
pub fn measure(cfg: &GptConfig, batch: usize, seq: usize, tp: usize) -> Machine {
    let n = batch * seq;
    let c = cfg.n_embd;
    // this rank's widths: its query heads, its key/value heads (replicated past tp = kv), its
    // hidden units
    let (hd, heads) = (cfg.head_dim(), cfg.n_head / tp);
    let kv_heads = cfg.kv_heads() * crate::models::config::kv_copies(cfg, tp) / tp;
    // each group of products of one shape (k with v, gate with up) timed once
    let block = cfg.block(0);
    let mut kinds: Vec<(&str, [f64; 3])> = Vec::new();
    for group in block.product_groups() {
        let (d_in, d_out) = crate::models::config::local_dims(cfg, &block, group[0], tp);
        let parts = linear_parts_s(n, d_in, d_out);
        kinds.extend(group.iter().map(|(l, _)| (block.local(&l.name), parts)));
    }
    let mut block_matmul_s = [0.0; 3];
    for (_, parts) in &kinds {
        block_matmul_s.iter_mut().zip(parts).for_each(|(a, b)| *a += b);
    }
    let mut matmul_s: Vec<(String, f64)> =
        kinds.iter().map(|(k, p)| (k.to_string(), cfg.n_layer as f64 * p.iter().sum::<f64>())).collect();
    // the tied LM head on this rank's vocabulary block: h·wteᵀ, dwte += dlogitsᵀ·h, dh = dlogits·wte
    let v = cfg.vocab_size.div_ceil(tp);
    let h = vec![0.5f32; n * c];
    let wte = vec![0.25f32; v * c];
    let mut logits = vec![0f32; n * v];
    let mut dwte = vec![0f32; v * c];
    let mut dh = vec![0f32; n * c];
    let head_matmul_s = [
        time_it(|| matmul(&mut logits, &h, &wte, n, c, v, false, true, false)),
        time_it(|| matmul(&mut dwte, &logits, &h, v, n, c, true, false, true)),
        time_it(|| matmul(&mut dh, &logits, &wte, n, v, c, false, false, false)),
    ];
    matmul_s.push(("lm_head".to_string(), head_matmul_s.iter().sum()));
    drop((logits, dwte));
    let s = match block.attn.qkv {
        Qkv::Fused(_) => AttnShape::fused(batch, seq, c / tp, heads),
        Qkv::Separate { .. } => AttnShape::grouped(batch, seq, heads, kv_heads, hd),
    };
    let qkv = vec![0.1f32; s.qkv_len()];
    let mut out = vec![0f32; s.out_len()];
    let mut probs = vec![0f32; s.probs_len()];
    let mut dqkv = vec![0f32; s.qkv_len()];
    let attention_fwd_s = time_it(|| attention_forward(&mut out, &mut probs, &qkv, s, Docs::WHOLE));
    let attention_bwd_s = time_it(|| attention_backward(&mut dqkv, &out, &qkv, &probs, s));
    Machine {
        threads: rayon::current_num_threads(),
        tp,
        matmul_s,
        block_matmul_s,
        head_matmul_s,
        attention_layer_s: attention_fwd_s + attention_bwd_s,
        attention_fwd_s,
        attention_bwd_s,
        mem_gbps: copy_gbps(256 << 20),
        matmul_gflops: crate::bench::matmul_gflops(2048, 2048, 2048, 3),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every stream count reads every float once: a reader that skipped the streams' tails (or
    /// read one twice) would report a rate for bytes it never read.
    #[test]
    fn reading_side_by_side_sums_every_float_once() {
        // small integers, so that every order of addition gives the exact sum
        for len in [0usize, 1, 15, 16, 17, 2 * 15_000 - 1, 7 * 15_000 + 333, 40 * 15_000 + 5] {
            let src: Vec<f32> = (0..len).map(|i| ((i * 7919) % 5) as f32).collect();
            let want: f64 = src.iter().map(|&x| x as f64).sum();
            for streams in STREAMS.into_iter().chain([3]) {
                assert_eq!(read_streams(&src, streams) as f64, want, "{streams} streams over {len} floats");
            }
            assert_eq!(read_all(&src) as f64, want, "one stream over {len} floats");
        }
    }
}
