//! Causal attention of each packed row over its own sequence's cached keys and values (the
//! paged KV cache), in a fixed order: scores position by position, the softmax in order, the
//! weighted values summed over positions in order — a row's result does not depend on the
//! other rows of the step. Grouped-query attention: each key/value head serves its group of
//! `heads / kv_heads` query heads (GPT-2: groups of one), and each cached row is read once
//! for all of them. The cache holds f32 or f16 ([`Cached`]): halves are converted exactly as
//! they are loaded, so the sums are those of an f32 cache holding the same numbers.

use super::kv_store::{KvStore, Slots, View};
use super::weights::Dims;
use half::f16;
use rayon::prelude::*;

/// A number as the cache holds it: f32, or f16 (converted to f32 exactly on reading).
pub(crate) trait Cached: Copy + Send + Sync {
    fn f32(self) -> f32;

    /// Eight numbers from `p` as f32 lanes.
    ///
    /// # Safety
    /// `p` points at eight readable numbers.
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
}

impl Cached for f32 {
    #[inline(always)]
    fn f32(self) -> f32 {
        self
    }

    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller's
        unsafe { std::arch::x86_64::_mm256_loadu_ps(p) }
    }
}

impl Cached for f16 {
    #[inline(always)]
    fn f32(self) -> f32 {
        self.to_f32()
    }

    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    #[inline(always)]
    unsafe fn load8(p: *const f16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's (eight halves: 16 bytes)
        unsafe {
            #[cfg(target_feature = "f16c")]
            return _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
            #[cfg(not(target_feature = "f16c"))]
            {
                let x: [f32; 8] = std::array::from_fn(|i| (*p.add(i)).to_f32());
                _mm256_loadu_ps(x.as_ptr())
            }
        }
    }
}

/// Cached positions a pass: the scores of this many keys are summed side by side (one
/// accumulator each, so no sum waits on the one before it), and the weighted values of this
/// many are added to a head's output while it sits in registers (one load and one store of
/// the output a pass, not one a position).
const PASS: usize = 8;

/// `ctx[r] = softmax(q_r · K / √hd) · V` for every packed row `r` at its `(sequence,
/// position)` in `rows` (`tables[sequence]`: its block table), with `q_r` the first `heads · hd` floats of row `r` of `qkv`
/// (row width `(heads + 2·kv_heads) · hd`) and K, V its sequence's positions `0..=pos` of
/// layer `layer` in `kv`. Each score is `dot`'s sum and each output element a chain of
/// `fma`s over the positions in order, so the passes change no bit of the result.
pub(crate) fn attention(
    ctx: &mut [f32],
    qkv: &[f32],
    rows: &[(usize, usize)],
    tables: &[&[usize]],
    kv: &KvStore,
    layer: usize,
    d: Dims,
) {
    match kv.view() {
        View::F32(c) => attention_over(ctx, qkv, (rows, tables), (&c, kv.block_size), layer, d),
        View::F16(c) => attention_over(ctx, qkv, (rows, tables), (&c, kv.block_size), layer, d),
    }
}

/// `attention` over a cache of `T`s (`bs` tokens a block).
fn attention_over<T: Cached>(
    ctx: &mut [f32],
    qkv: &[f32],
    (rows, tables): (&[(usize, usize)], &[&[usize]]),
    (kv, bs): (&Slots<T>, usize),
    layer: usize,
    d: Dims,
) {
    let (heads, hd) = (d.heads, d.hd);
    let (qw, qkvw) = (d.q_width(), d.q_width() + 2 * d.kv_width());
    let group = heads / d.kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    ctx.par_chunks_mut(qw).zip(rows.par_iter()).enumerate().for_each_init(Vec::new, |sc, (r, (out, &(wi, pos)))| {
        let table = tables[wi];
        let q = &qkv[r * qkvw..r * qkvw + qw];
        let np = pos + 1;
        // the key (0) or value (1) rows of positions p0.. (the pass's last repeated past np)
        let pass = |p0: usize, m: usize, kind: usize| -> [&[T]; PASS] {
            std::array::from_fn(|j| {
                let p = p0 + j.min(m - 1);
                kv.slot(table[p / bs], layer, kind, p % bs)
            })
        };
        // scores [head][position]: each cached key row is read once, for every head
        sc.resize(heads * np, 0.0);
        for p0 in (0..np).step_by(PASS) {
            let m = PASS.min(np - p0);
            let keys = pass(p0, m, 0);
            for h in 0..heads {
                let g = h / group;
                let qh = &q[h * hd..(h + 1) * hd];
                let s = &mut sc[h * np + p0..h * np + p0 + m];
                if m == PASS {
                    let d = dots(qh, keys.map(|k| &k[g * hd..(g + 1) * hd]));
                    for (s, d) in s.iter_mut().zip(d) {
                        *s = d * scale;
                    }
                } else {
                    for (s, k) in s.iter_mut().zip(keys) {
                        *s = dot(qh, &k[g * hd..(g + 1) * hd]) * scale;
                    }
                }
            }
        }
        for s in sc.chunks_exact_mut(np) {
            softmax_in_order(s);
        }
        // out[h] = Σ_p s[h][p] · v_p[g(h)], over p in order: each value row read once
        out.fill(0.0);
        for p0 in (0..np).step_by(PASS) {
            let m = PASS.min(np - p0);
            let vals = pass(p0, m, 1);
            for h in 0..heads {
                let g = h / group;
                let vs = vals.map(|v| &v[g * hd..(g + 1) * hd]);
                add_weighted(&mut out[h * hd..(h + 1) * hd], &sc[h * np + p0..h * np + p0 + m], &vs[..m]);
            }
        }
    });
}

/// `PASS` dot products of `q` with the rows `k`, side by side, each summed as `dot` sums it
/// (eight lanes of `fma`s over the row, then the lanes in order).
#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
fn dots<T: Cached>(q: &[f32], k: [&[T]; PASS]) -> [f32; PASS] {
    use std::arch::x86_64::*;
    let n = q.len();
    let n8 = n / 8 * 8;
    assert!(k.iter().all(|k| k.len() >= n), "a key row shorter than the query");
    // SAFETY: every load reads elements 0..n8 of `q` or of a row at least `n` long (checked above).
    unsafe {
        let mut acc = [_mm256_setzero_ps(); PASS];
        for c in (0..n8).step_by(8) {
            let x = _mm256_loadu_ps(q.as_ptr().add(c));
            for (a, kj) in acc.iter_mut().zip(&k) {
                *a = _mm256_fmadd_ps(x, T::load8(kj.as_ptr().add(c)), *a);
            }
        }
        // the 8 × 8 accumulators transposed: lane t of every dot in one register, then the
        // lanes added in order (what `iter().sum()` does row by row)
        let lane = brigade::tensor::sgemm::transpose8(acc);
        let mut sum = lane[0];
        for l in &lane[1..] {
            sum = _mm256_add_ps(sum, *l);
        }
        let mut out = [0f32; PASS];
        _mm256_storeu_ps(out.as_mut_ptr(), sum);
        for (o, kj) in out.iter_mut().zip(&k) {
            for (x, y) in q[n8..].iter().zip(&kj[n8..n]) {
                *o = x.mul_add(y.f32(), *o);
            }
        }
        out
    }
}

/// `PASS` dot products of `q` with the rows `k`, each `dot`'s sum (where AVX2 is not compiled in).
#[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
fn dots<T: Cached>(q: &[f32], k: [&[T]; PASS]) -> [f32; PASS] {
    k.map(|k| dot(q, &k[..q.len()]))
}

/// The scores `s` turned into their softmax in place: the maximum subtracted, the
/// exponentials summed in order, each divided by the sum.
fn softmax_in_order(s: &mut [f32]) {
    let mx = brigade::tensor::math::max_in_lanes(s);
    for v in s.iter_mut() {
        *v = brigade::tensor::math::exp(*v - mx);
    }
    let mut sum = 0f32;
    for &v in s.iter() {
        sum += v;
    }
    for v in s.iter_mut() {
        *v /= sum;
    }
}

/// `o += Σ_j w_j · v_j`, each element a chain of `fma`s over `j` in order, held in registers
/// 64 elements at a time (eight independent chains, each value row read 256 bytes at a time).
#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
fn add_weighted<T: Cached>(o: &mut [f32], w: &[f32], v: &[&[T]]) {
    use std::arch::x86_64::*;
    /// `o[c..c + 8·B] += Σ_j w_j · v_j[c..c + 8·B]`.
    ///
    /// # Safety
    /// `o` and every row of `v` hold at least `c + 8·B` floats.
    #[inline(always)]
    unsafe fn block<const B: usize, T: Cached>(o: &mut [f32], w: &[f32], v: &[&[T]], c: usize) {
        // SAFETY: the caller's bound covers every offset below
        unsafe {
            let op = o.as_mut_ptr().add(c);
            let mut acc: [__m256; B] = std::array::from_fn(|b| _mm256_loadu_ps(op.add(8 * b)));
            for (&wj, vj) in w.iter().zip(v) {
                let x = _mm256_set1_ps(wj);
                let vp = vj.as_ptr().add(c);
                for (b, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(x, T::load8(vp.add(8 * b)), *a);
                }
            }
            for (b, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(op.add(8 * b), *a);
            }
        }
    }
    let n = o.len();
    assert!(v.iter().all(|v| v.len() >= n), "a value row shorter than the output");
    let n8 = n / 8 * 8;
    let mut c = 0;
    // SAFETY: c + 64 ≤ n, then c + 8 ≤ n, for `o` and (asserted) every row
    unsafe {
        while c + 64 <= n8 {
            block::<8, T>(o, w, v, c);
            c += 64;
        }
        while c < n8 {
            block::<1, T>(o, w, v, c);
            c += 8;
        }
    }
    for (e, o) in o[n8..].iter_mut().enumerate() {
        for (&wj, vj) in w.iter().zip(v) {
            *o = wj.mul_add(vj[n8 + e].f32(), *o);
        }
    }
}

/// `o += Σ_j w_j · v_j`, each element a chain of `fma`s over `j` in order (where AVX2 is not
/// compiled in).
#[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
fn add_weighted<T: Cached>(o: &mut [f32], w: &[f32], v: &[&[T]]) {
    for (&wj, vj) in w.iter().zip(v) {
        for (o, &y) in o.iter_mut().zip(vj.iter()) {
            *o = wj.mul_add(y.f32(), *o);
        }
    }
}

/// A dot product in a fixed order: 8 lanes, then the lanes in order.
pub(super) fn dot<T: Cached>(a: &[f32], b: &[T]) -> f32 {
    let mut acc = [0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for t in 0..8 {
            acc[t] = x[t].mul_add(y[t].f32(), acc[t]);
        }
    }
    let mut s = acc.iter().sum::<f32>();
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        s = x.mul_add(y.f32(), s);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attention one cached position at a time (as it was before the passes): the
    /// reference the passes must equal bit for bit.
    fn attention_position_by_position(
        ctx: &mut [f32],
        qkv: &[f32],
        rows: &[(usize, usize)],
        tables: &[&[usize]],
        kv: &KvStore,
        layer: usize,
        d: Dims,
    ) {
        let (heads, hd) = (d.heads, d.hd);
        let (qw, qkvw) = (d.q_width(), d.q_width() + 2 * d.kv_width());
        let group = heads / d.kv_heads;
        let scale = 1.0 / (hd as f32).sqrt();
        for (r, (out, &(wi, pos))) in ctx.chunks_mut(qw).zip(rows).enumerate() {
            let table = tables[wi];
            let q = &qkv[r * qkvw..r * qkvw + qw];
            let np = pos + 1;
            let mut sc = vec![0f32; heads * np];
            let mut inv = vec![0f32; heads];
            let mut buf = Vec::new();
            for p in 0..np {
                let k = kv.read(table[p / kv.block_size], layer, 0, p % kv.block_size, &mut buf);
                for h in 0..heads {
                    let g = h / group;
                    sc[h * np + p] = dot::<f32>(&q[h * hd..(h + 1) * hd], &k[g * hd..(g + 1) * hd]) * scale;
                }
            }
            for (h, s) in sc.chunks_exact_mut(np).enumerate() {
                let mx = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                let mut sum = 0f32;
                for v in s.iter_mut() {
                    *v = brigade::tensor::math::exp(*v - mx);
                    sum += *v;
                }
                inv[h] = sum;
            }
            out.fill(0.0);
            for p in 0..np {
                let v = kv.read(table[p / kv.block_size], layer, 1, p % kv.block_size, &mut buf);
                for h in 0..heads {
                    let g = h / group;
                    let wgt = sc[h * np + p] / inv[h];
                    for (o, &vv) in out[h * hd..(h + 1) * hd].iter_mut().zip(&v[g * hd..(g + 1) * hd]) {
                        *o = wgt.mul_add(vv, *o);
                    }
                }
            }
        }
    }

    /// `numbers` as one sequence's keys and values in layer `layer`, position after position
    /// (its key, then its value, `kv.width` numbers each) in the blocks of `table`.
    fn write_positions(kv: &mut KvStore, table: &[usize], layer: usize, numbers: &[f32]) {
        let bs = kv.block_size;
        for (i, x) in numbers.chunks_exact(kv.width).enumerate() {
            kv.write(table[i / 2 / bs], layer, i % 2, i / 2 % bs, x);
        }
    }

    /// The passes of eight positions against one position at a time, bit for bit: every
    /// length from 1 to 41 cached positions (whole passes, and every tail), head widths a
    /// multiple of 8 and not (64, 12, 5), grouped-query heads (6 over 2, 3 over 3), blocks out
    /// of order in the cache.
    #[test]
    fn passes_equal_one_position_at_a_time_bit_for_bit() {
        let val = |i: usize, scale: f32| ((i * 2654435761 % 1000) as f32 / 500.0 - 1.0) * scale;
        for (heads, kv_heads, hd) in [(6, 2, 64), (3, 3, 12), (6, 2, 5)] {
            let d = Dims { c: heads * hd, heads, kv_heads, hd, q_all: heads * hd, mlp: 0, mlp_local: 0, swiglu: false };
            let (kvw, bs, layers) = (kv_heads * hd, 4, 2);
            let mut kv = KvStore::new(12, bs, layers, kvw);
            // one sequence over 11 blocks in a scrambled order: positions 0..44
            let table: Vec<usize> = (0..11).map(|b| (b * 7 + 3) % 12).collect();
            let numbers: Vec<f32> = (0..44 * 2 * kvw).map(|i| val(i + 17, 3.0)).collect();
            write_positions(&mut kv, &table, 1, &numbers);
            let rows: Vec<(usize, usize)> = (0..41).map(|pos| (0, pos)).collect();
            let qkvw = heads * hd + 2 * kvw;
            let qkv: Vec<f32> = (0..rows.len() * qkvw).map(|i| val(3 * i + 1, 2.0)).collect();
            let tables = [table.as_slice()];
            let mut got = vec![0f32; rows.len() * heads * hd];
            let mut want = got.clone();
            attention(&mut got, &qkv, &rows, &tables, &kv, 1, d);
            attention_position_by_position(&mut want, &qkv, &rows, &tables, &kv, 1, d);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let (r, e) = (i / (heads * hd), i % (heads * hd));
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{heads}/{kv_heads} heads of {hd}: row at position {r}, [{e}]: {g} vs {w}"
                );
            }
        }
    }

    /// Every row against attention written out in f64 from the same numbers: two sequences
    /// whose blocks lie out of order in the cache, grouped-query heads (4 over 2), and scores
    /// from small to past exp's range (q·k/√hd up to ~300: a softmax that does not subtract its
    /// maximum overflows).
    #[test]
    fn rows_match_attention_written_out() {
        let (heads, kv_heads, hd, bs, layers) = (4, 2, 8, 2, 2);
        let d = Dims { c: heads * hd, heads, kv_heads, hd, q_all: heads * hd, mlp: 0, mlp_local: 0, swiglu: false };
        let kvw = kv_heads * hd;
        let mut kv = KvStore::new(8, bs, layers, kvw);
        let tables: Vec<Vec<usize>> = vec![vec![5, 1, 6], vec![2, 7]];
        let lens = [5usize, 3];
        let val = |i: usize, scale: f32| ((i * 2654435761 % 1000) as f32 / 500.0 - 1.0) * scale;
        let layer = 1;
        for scale in [0.3f32, 20.0] {
            // keys and values of every cached position
            let mut keys = vec![vec![]; 2];
            let mut vals = vec![vec![]; 2];
            for (s, table) in tables.iter().enumerate() {
                for p in 0..lens[s] {
                    let k: Vec<f32> = (0..kvw).map(|j| val(7 * s + 31 * p + j, scale)).collect();
                    let v: Vec<f32> = (0..kvw).map(|j| val(11 * s + 17 * p + 3 * j + 1, 1.0)).collect();
                    kv.write(table[p / bs], layer, 0, p % bs, &k);
                    kv.write(table[p / bs], layer, 1, p % bs, &v);
                    keys[s].push(k);
                    vals[s].push(v);
                }
            }
            // rows: each sequence at a few positions
            let rows = vec![(0, 4), (1, 2), (0, 0), (1, 1), (0, 2)];
            let qkvw = heads * hd + 2 * kvw;
            let qkv: Vec<f32> = (0..rows.len() * qkvw).map(|i| val(i + 5, scale)).collect();
            let refs: Vec<&[usize]> = tables.iter().map(|t| t.as_slice()).collect();
            let mut ctx = vec![0f32; rows.len() * heads * hd];
            attention(&mut ctx, &qkv, &rows, &refs, &kv, layer, d);
            for (r, &(s, pos)) in rows.iter().enumerate() {
                for h in 0..heads {
                    let g = h / (heads / kv_heads);
                    let q = &qkv[r * qkvw + h * hd..r * qkvw + (h + 1) * hd];
                    let scores: Vec<f64> = (0..=pos)
                        .map(|p| {
                            let k = &keys[s][p][g * hd..(g + 1) * hd];
                            q.iter().zip(k).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() / (hd as f64).sqrt()
                        })
                        .collect();
                    let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let w: Vec<f64> = scores.iter().map(|x| (x - mx).exp()).collect();
                    let sum: f64 = w.iter().sum();
                    for i in 0..hd {
                        let want: f64 = (0..=pos).map(|p| w[p] / sum * vals[s][p][g * hd + i] as f64).sum();
                        let got = ctx[r * heads * hd + h * hd + i] as f64;
                        assert!(
                            (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                            "scale {scale}, row {r} head {h} [{i}]: {got} vs {want} (largest score {mx:.1})"
                        );
                    }
                }
            }
        }
    }

    /// An f16 cache against an f32 cache holding the same numbers rounded to halves, bit for
    /// bit: the halves are converted exactly, so the sums (the passes and their tails, the
    /// scalar tails of head widths not a multiple of 8, grouped-query heads) are the same.
    /// And the f16 cache's attention stays within half-precision rounding of the unrounded
    /// f32 cache's.
    #[test]
    fn an_f16_cache_equals_an_f32_cache_of_the_rounded_numbers() {
        let val = |i: usize, scale: f32| ((i * 2654435761 % 1000) as f32 / 500.0 - 1.0) * scale + 1e-3 * (i % 7) as f32;
        for (heads, kv_heads, hd) in [(6, 2, 64), (3, 3, 12), (6, 2, 5), (4, 4, 16)] {
            let d = Dims { c: heads * hd, heads, kv_heads, hd, q_all: heads * hd, mlp: 0, mlp_local: 0, swiglu: false };
            let (kvw, bs, layers) = (kv_heads * hd, 4, 2);
            let table: Vec<usize> = (0..11).map(|b| (b * 7 + 3) % 12).collect();
            let numbers: Vec<f32> = (0..44 * 2 * kvw).map(|i| val(i + 5, 3.0)).collect();
            let rounded: Vec<f32> = numbers.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
            assert!(numbers != rounded, "the numbers are not all halves already");
            let mut caches = [
                KvStore::with_dtype(12, bs, layers, kvw, super::super::kv_store::KvDtype::F16),
                KvStore::new(12, bs, layers, kvw),
                KvStore::new(12, bs, layers, kvw),
            ];
            for (kv, xs) in caches.iter_mut().zip([&numbers, &rounded, &numbers]) {
                write_positions(kv, &table, 1, xs);
            }
            let rows: Vec<(usize, usize)> = (0..41).map(|pos| (0, pos)).collect();
            let qkvw = heads * hd + 2 * kvw;
            let qkv: Vec<f32> = (0..rows.len() * qkvw).map(|i| val(3 * i + 1, 2.0)).collect();
            let tables = [table.as_slice()];
            let outs: Vec<Vec<f32>> = caches
                .iter()
                .map(|kv| {
                    let mut out = vec![0f32; rows.len() * heads * hd];
                    attention(&mut out, &qkv, &rows, &tables, kv, 1, d);
                    out
                })
                .collect();
            for (i, ((h, f), x)) in outs[0].iter().zip(&outs[1]).zip(&outs[2]).enumerate() {
                assert_eq!(
                    h.to_bits(),
                    f.to_bits(),
                    "{heads}/{kv_heads} heads of {hd}, [{i}]: f16 {h} vs rounded f32 {f}"
                );
                assert!((h - x).abs() <= 2e-2 * (1.0 + x.abs()), "[{i}]: f16 {h} vs f32 {x}");
            }
            assert!(outs[0] != outs[2], "rounding to halves changes some output");
        }
    }
}
