//! Inference kernels of the encoder (BERT): bidirectional attention over sequences packed end
//! to end, bias + exact-erf GELU in place, and the post-LayerNorm residual in place.
//!
//! Sequences of different lengths share one `[tokens, width]` buffer with no padding: every
//! matrix product runs over all tokens at once, and attention runs per (sequence, head) over
//! that sequence's own rows, which is what a padding mask computes, without the padded work.

use super::layernorm::layernorm_row;
use super::matmul::{gemm_into_on, Backend, Mat, Threads};
use super::ROW_CHUNK;
use rayon::prelude::*;

/// Where each packed sequence starts: `starts[i]..starts[i + 1]` are its rows.
#[cfg(test)]
fn starts_of(lens: &[usize]) -> Vec<usize> {
    let mut s = Vec::with_capacity(lens.len() + 1);
    s.push(0);
    for &l in lens {
        s.push(s.last().unwrap() + l);
    }
    s
}

/// `ctx[n, C] = softmax(q·kᵀ/√d)·v` per sequence and head, from the fused `qkv[n, 3C]`
/// (q | k | v, heads side by side). Every token of a sequence attends to all of its tokens.
/// One rayon task per sequence, looping over its heads: the sequence's rows are contiguous, so
/// they come into cache once for all heads. Heads of 8, 16, 32 or 64 on a machine with AVX2
/// and FMA and without AVX-512 (or held to AVX2 by `BRIGADE_SIMD=avx2`) run `simd`'s kernels
/// (the keys transposed once a head, so a score row is vectors across keys; the context rows
/// over the value rows); otherwise two small matrix products a head. On AVX2 a sequence of ~37
/// tokens leaves the products' 6 × 16 tiles a third empty and packs both operands of every
/// 37 × 37 × 32 product; the AVX-512 machines keep the products (their 12 × 32 tile was not
/// measured against the kernels).
pub fn attention_packed(ctx: &mut [f32], qkv: &[f32], lens: &[usize], c: usize, heads: usize) {
    attention_on(ctx, qkv, lens, c, heads, Path::pick(c / heads))
}

/// How a head's two products run.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    Kernels,
    Products(Backend),
}

impl Path {
    fn pick(hd: usize) -> Path {
        #[cfg(target_arch = "x86_64")]
        if simd::fits(hd) && !super::wide() && simd::runs_here() {
            return Path::Kernels;
        }
        let _ = hd;
        Path::Products(Backend::Auto)
    }
}

fn attention_on(ctx: &mut [f32], qkv: &[f32], lens: &[usize], c: usize, heads: usize, path: Path) {
    let n: usize = lens.iter().sum();
    assert!(ctx.len() == n * c && qkv.len() == 3 * n * c && c.is_multiple_of(heads));
    let hd = c / heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let mut parts = Vec::with_capacity(lens.len());
    let (mut rest, mut row) = (ctx, 0);
    for &l in lens {
        let (mine, tail) = rest.split_at_mut(l * c);
        parts.push((mine, &qkv[row * 3 * c..(row + l) * 3 * c], l));
        (rest, row) = (tail, row + l);
    }
    let backend = match path {
        #[cfg(target_arch = "x86_64")]
        Path::Kernels => {
            assert!(simd::fits(hd) && simd::runs_here());
            parts.into_par_iter().filter(|p| p.2 > 0).for_each_init(
                || (Vec::new(), Vec::new()),
                |(kt, sc): &mut (Vec<f32>, Vec<f32>), (out, block, l)| {
                    // SAFETY: AVX2 and FMA are present (asserted); the block holds l rows of 3c.
                    unsafe { simd::sequence(out, block, l, c, heads, scale, kt, sc) }
                },
            );
            return;
        }
        #[cfg(not(target_arch = "x86_64"))]
        Path::Kernels => unreachable!("the attention kernels are x86-64's"),
        Path::Products(b) => b,
    };
    parts.into_par_iter().filter(|p| p.2 > 0).for_each_init(Vec::new, |buf: &mut Vec<f32>, (out, block, l)| {
        buf.resize(l * l, 0.0);
        let head = Mat::strided(l, hd, 3 * c);
        for h in 0..heads {
            let q = h * hd;
            let (qs, ks) = (&block[q..], &block[q + c..]);
            gemm_into_on(backend, buf, Mat::rm(l, l), qs, head, ks, head.t(), scale, false, Threads::Single);
            buf.chunks_exact_mut(l).for_each(super::math::softmax_row);
            let om = Mat::strided(l, hd, c);
            let vs = &block[q + 2 * c..];
            gemm_into_on(backend, &mut out[q..], om, buf, Mat::rm(l, l), vs, head, 1.0, false, Threads::Single);
        }
    });
}

/// The attention of one sequence on AVX2 + FMA, head by head: keys transposed into `kt`
/// (`[hd][lp]`, lp = l rounded up to 8, zero past l; 8 × 8 blocks in registers), the scores
/// `scale · q·kᵀ` of R query rows at once across up to 64 keys, each row's softmax over its l
/// keys, then the context rows `p·v` of R rows at once over the l value rows. Both products are
/// one tile (`tile`): rows of a times a matrix whose rows are vectors, an `fma` chain over the
/// inner index from 0: the chains brigade's blocked product runs on sequences of up to 256
/// tokens (KC), so there the two paths give the same bits (tested).
#[cfg(target_arch = "x86_64")]
mod simd {
    use super::super::sgemm::transpose8;
    use std::arch::x86_64::*;

    /// Head widths the kernels take (`hd / 8` vectors a context row).
    pub fn fits(hd: usize) -> bool {
        matches!(hd, 8 | 16 | 32 | 64)
    }

    /// Whether this CPU has what the kernels use.
    pub fn runs_here() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }

    /// `out[l, c]` (this sequence's rows) from its `block[l, 3c]` of q | k | v.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn sequence(
        out: &mut [f32],
        block: &[f32],
        l: usize,
        c: usize,
        heads: usize,
        scale: f32,
        kt: &mut Vec<f32>,
        sc: &mut Vec<f32>,
    ) {
        let hd = c / heads;
        let lp = l.div_ceil(8) * 8;
        assert!(fits(hd) && out.len() == l * c && block.len() == l * 3 * c);
        kt.resize(hd * lp, 0.0);
        sc.resize(l * lp, 0.0);
        let zeros = [0f32; 8];
        for h in 0..heads {
            let (q, k, v) = (h * hd, c + h * hd, 2 * c + h * hd);
            // k's rows 8 × 8 at a time into kt's columns (rows past l read as zeros)
            for j0 in (0..lp).step_by(8) {
                for d0 in (0..hd).step_by(8) {
                    let rows: [__m256; 8] = std::array::from_fn(|t| {
                        let row =
                            if j0 + t < l { block.as_ptr().add((j0 + t) * 3 * c + k + d0) } else { zeros.as_ptr() };
                        _mm256_loadu_ps(row)
                    });
                    for (d, col) in transpose8(rows).iter().enumerate() {
                        _mm256_storeu_ps(kt.as_mut_ptr().add((d0 + d) * lp + j0), *col);
                    }
                }
            }
            let qs = Operand { p: block.as_ptr().add(q), ld: 3 * c };
            for j0 in (0..lp).step_by(64) {
                let n = ((lp - j0) / 8).min(8);
                let keys = Operand { p: kt.as_ptr().add(j0), ld: lp };
                // two query rows at once where 2n accumulators fit, else one
                rows_by(
                    if n <= 6 { 2 } else { 1 },
                    (l, n, hd),
                    qs,
                    keys,
                    Dst { p: sc.as_mut_ptr().add(j0), ld: lp },
                    scale,
                );
            }
            for row in sc.chunks_exact_mut(lp).take(l) {
                super::super::math::softmax_row(&mut row[..l]);
            }
            let p = Operand { p: sc.as_ptr(), ld: lp };
            let values = Operand { p: block.as_ptr().add(v), ld: 3 * c };
            rows_by(
                if hd <= 32 { 3 } else { 1 },
                (l, hd / 8, l),
                p,
                values,
                Dst { p: out.as_mut_ptr().add(q), ld: c },
                1.0,
            );
        }
    }

    /// A row-major matrix in memory: its first element and its row stride.
    #[derive(Clone, Copy)]
    struct Operand {
        p: *const f32,
        ld: usize,
    }

    /// Where a product's rows go: the first element and the row stride.
    #[derive(Clone, Copy)]
    struct Dst {
        p: *mut f32,
        ld: usize,
    }

    /// `o[i][..8n] = scale · Σ_x a[i][x] · b[x][..8n]` for rows i < m, `r` rows at a time (then
    /// one at a time).
    #[inline(always)]
    unsafe fn rows_by(r: usize, (m, n, x): (usize, usize, usize), a: Operand, b: Operand, o: Dst, scale: f32) {
        let at = |i: usize| (Operand { p: a.p.add(i * a.ld), ..a }, Dst { p: o.p.add(i * o.ld), ..o });
        let mut i = 0;
        while r > 1 && i + r <= m {
            let (a, o) = at(i);
            if r == 3 {
                tile_n::<3>(n, a, b, x, o, scale)
            } else {
                tile_n::<2>(n, a, b, x, o, scale)
            }
            i += r;
        }
        for i in i..m {
            let (a, o) = at(i);
            tile_n::<1>(n, a, b, x, o, scale);
        }
    }

    #[inline(always)]
    unsafe fn tile_n<const R: usize>(n: usize, a: Operand, b: Operand, x: usize, o: Dst, scale: f32) {
        match n {
            1 => tile::<R, 1>(a, b, x, o, scale),
            2 => tile::<R, 2>(a, b, x, o, scale),
            3 => tile::<R, 3>(a, b, x, o, scale),
            4 => tile::<R, 4>(a, b, x, o, scale),
            5 => tile::<R, 5>(a, b, x, o, scale),
            6 => tile::<R, 6>(a, b, x, o, scale),
            7 => tile::<R, 7>(a, b, x, o, scale),
            _ => tile::<R, 8>(a, b, x, o, scale),
        }
    }

    /// `o[r][8t..8t + 8] = scale · Σ_x a[r][x] · b[x][8t..8t + 8]` for R rows and N vectors.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile<const R: usize, const N: usize>(a: Operand, b: Operand, x: usize, o: Dst, scale: f32) {
        let mut acc = [[_mm256_setzero_ps(); N]; R];
        for xx in 0..x {
            let av: [__m256; R] = std::array::from_fn(|r| _mm256_broadcast_ss(&*a.p.add(r * a.ld + xx)));
            for t in 0..N {
                let bv = _mm256_loadu_ps(b.p.add(xx * b.ld + 8 * t));
                for (accr, avr) in acc.iter_mut().zip(&av) {
                    accr[t] = _mm256_fmadd_ps(*avr, bv, accr[t]);
                }
            }
        }
        let sv = _mm256_set1_ps(scale);
        for (r, accr) in acc.iter().enumerate() {
            for (t, v) in accr.iter().enumerate() {
                _mm256_storeu_ps(o.p.add(r * o.ld + 8 * t), _mm256_mul_ps(*v, sv));
            }
        }
    }
}

/// `x[i, :] = act(x[i, :] + bias)` with GELU in its exact form `x·(1 + erf(x/√2))/2`, or the
/// tanh approximation when `tanh` is set.
pub fn bias_gelu_inplace(x: &mut [f32], bias: &[f32], tanh: bool) {
    let c = bias.len();
    assert!(x.len().is_multiple_of(c));
    x.par_chunks_mut(c).with_min_len(ROW_CHUNK).for_each(|row| {
        for (v, &b) in row.iter_mut().zip(bias) {
            let u = *v + b;
            *v = if tanh {
                super::elementwise::gelu_tanh(u)
            } else {
                0.5 * u * (1.0 + super::math::erf(u * std::f32::consts::FRAC_1_SQRT_2))
            };
        }
    });
}

/// The post-LayerNorm residual of BERT: `x = LayerNorm(x + y + bias)` row by row, in place.
pub fn residual_layernorm_inplace(x: &mut [f32], y: &[f32], bias: &[f32], w: &[f32], b: &[f32], eps: f32) {
    let c = w.len();
    assert!(x.len() == y.len() && x.len().is_multiple_of(c) && bias.len() == c && b.len() == c);
    x.par_chunks_mut(c).zip(y.par_chunks(c)).with_min_len(ROW_CHUNK).for_each(|(x, y)| {
        for ((x, &y), &bi) in x.iter_mut().zip(y).zip(bias) {
            *x += y + bi;
        }
        layernorm_row(x, w, b, eps);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Attention of one sequence written out naively, in f64.
    fn naive(qkv: &[f32], r0: usize, l: usize, c: usize, heads: usize) -> Vec<f64> {
        let hd = c / heads;
        let mut out = vec![0f64; l * c];
        let at = |r: usize, col: usize| qkv[(r0 + r) * 3 * c + col] as f64;
        for h in 0..heads {
            for i in 0..l {
                let s: Vec<f64> = (0..l)
                    .map(|j| {
                        (0..hd).map(|d| at(i, h * hd + d) * at(j, c + h * hd + d)).sum::<f64>() / (hd as f64).sqrt()
                    })
                    .collect();
                let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
                let z: f64 = e.iter().sum();
                for d in 0..hd {
                    out[i * c + h * hd + d] = (0..l).map(|j| e[j] / z * at(j, 2 * c + h * hd + d)).sum();
                }
            }
        }
        out
    }

    /// Each path against the f64 reference: the kernels (head widths 8, 16, 32, 64, where the
    /// CPU has AVX2 and FMA, whatever `attention_packed` picks here) and the products (every
    /// width, 20 included); and on sequences of ≤ 256 tokens the kernels give brigade's
    /// product's bits.
    #[test]
    fn packed_attention_matches_naive_per_sequence() {
        let mut kernel_widths = Vec::new();
        for (c, heads) in [(96, 3), (24, 3), (128, 2), (48, 3), (60, 3)] {
            let hd = c / heads;
            let lens = [5usize, 1, 0, 9, 100, 3, 64, 65, 129, 8, 4];
            let n: usize = lens.iter().sum();
            let qkv: Vec<f32> = (0..n * 3 * c).map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 1.5).collect();
            let mut paths = vec![Path::pick(hd), Path::Products(Backend::Auto)];
            #[cfg(target_arch = "x86_64")]
            if simd::fits(hd) && simd::runs_here() {
                paths.push(Path::Kernels);
                kernel_widths.push(hd);
            }
            let mut got = Vec::new();
            for &path in &paths {
                let mut ctx = vec![f32::NAN; n * c];
                attention_on(&mut ctx, &qkv, &lens, c, heads, path);
                let starts = starts_of(&lens);
                for (s, &l) in lens.iter().enumerate() {
                    let want = naive(&qkv, starts[s], l, c, heads);
                    for (i, w) in want.iter().enumerate() {
                        let got = ctx[starts[s] * c + i] as f64;
                        assert!((got - w).abs() < 1e-5, "{path:?} c {c}: sequence {s} element {i}: {got} vs {w}");
                    }
                }
                got.push((path, ctx));
            }
            if let Some((_, k)) = got.iter().find(|(p, _)| *p == Path::Kernels) {
                if super::super::sgemm::runs_here() {
                    let mut ctx = vec![f32::NAN; n * c];
                    attention_on(&mut ctx, &qkv, &lens, c, heads, Path::Products(Backend::Brigade));
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert!(bits(k) == bits(&ctx), "c {c}: the kernels' bits differ from brigade's products'");
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        if simd::runs_here() {
            assert_eq!(kernel_widths, [32, 8, 64, 16], "the kernels ran on every width they take");
        }
    }

    #[test]
    fn gelu_is_exact_erf_form() {
        let mut x: Vec<f32> = (-400..400).map(|i| i as f32 / 50.0).collect();
        let want: Vec<f64> =
            x.iter().map(|&v| 0.5 * (v as f64 + 0.25) * (1.0 + libm::erf((v as f64 + 0.25) / 2f64.sqrt()))).collect();
        bias_gelu_inplace(&mut x, &[0.25; 8], false);
        for (g, w) in x.iter().zip(want) {
            assert!((*g as f64 - w).abs() < 2e-6, "{g} vs {w}");
        }
    }
}
