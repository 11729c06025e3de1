//! `matmul_rows` over 8-bit weights: symmetric quantization (no zero point), a scale per
//! output column and per group of `group` rows of k (`group = k`: one scale per output
//! channel), dequantized in registers — `w = q · s` in f32, then the same `fma` chain over k
//! in order from 0 as the f32 kernel. Every output element is therefore bit for bit the f32
//! kernel's result on the dequantized matrix, whatever the rows around it: batch invariance
//! holds for 8-bit weights too, and reading a quarter of the bytes is the whole saving.
//!
//! Layout as the f32 kernel's: columns in strips of 16, `[strip][k][16]` i8 values and
//! `[strip][group][16]` scales. Tiles: 4 rows × 16 columns (8 accumulators, the strip's two
//! dequantized vectors, the group's two scale vectors), and 1 row × 64 columns for the last
//! rows (a decode's single row; one 512-bit register a strip where the CPU has AVX-512).
//!
//! A file's 8-bit and 5- or 6-bit rows as stored (`from_quant_rows`: Q8_0, Q5_0, Q5_1, Q5_K,
//! Q6_K) take the same kernels; those with a minimum per group compute `q · s + m` (the
//! product, then the sum, as the file's reference dequantizes them).

use super::{quantized_product, wide, STRIP as W, TASK};
use crate::pages::Pages;
use rayon::prelude::*;

/// A `[k, n]` matrix in 8 bits with its scales.
pub struct Int8 {
    pub k: usize,
    pub n: usize,
    /// Rows of k that share a scale (`k`: one per column).
    pub group: usize,
    q: Pages<i8>,
    scales: Pages<f32>,
    /// `[strip][group][16]` minimums (Q5_1, Q5_K); `None`: `q · s`.
    mins: Option<Pages<f32>>,
}

/// A strip's values, scales and minimums (empty without them).
type Strip<'a> = (&'a [i8], &'a [f32], &'a [f32]);

impl Int8 {
    fn groups(&self) -> usize {
        self.k.div_ceil(self.group)
    }

    /// Quantizes strips of f32 values `[strip][k][16]` (the f32 kernel's packing).
    pub fn from_strips(strips: &[f32], k: usize, n: usize, group: usize) -> Int8 {
        assert!(group > 0 && strips.len() == n.div_ceil(W) * k * W);
        let groups = k.div_ceil(group);
        let ns = n.div_ceil(W);
        let mut q = Pages::<i8>::zeroed(ns * k * W);
        let mut scales = Pages::<f32>::zeroed(ns * groups * W);
        q.par_chunks_mut(k * W).zip(scales.par_chunks_mut(groups * W)).enumerate().for_each(|(s, (qs, ss))| {
            let strip = &strips[s * k * W..(s + 1) * k * W];
            for g in 0..groups {
                let rows = g * group..((g + 1) * group).min(k);
                for t in 0..W {
                    let amax = rows.clone().map(|kk| strip[kk * W + t].abs()).fold(0f32, f32::max);
                    let scale = amax / 127.0;
                    ss[g * W + t] = scale;
                    for kk in rows.clone() {
                        let v =
                            if scale > 0.0 { (strip[kk * W + t] / scale).round().clamp(-127.0, 127.0) } else { 0.0 };
                        qs[kk * W + t] = v as i8;
                    }
                }
            }
        });
        Int8 { k, n, group, q, scales, mins: None }
    }

    /// A file's rows as stored (any `bits`, groups dividing k): row `j` becomes output column
    /// `j`.
    pub fn from_quant_rows(rows: &super::quant_rows::QuantRows) -> Int8 {
        let (k, n, group, groups) = (rows.k, rows.rows, rows.group, rows.groups());
        assert!(k.is_multiple_of(group));
        let ns = n.div_ceil(W);
        let mut q = Pages::<i8>::zeroed(ns * k * W);
        let mut scales = Pages::<f32>::zeroed(ns * groups * W);
        let mut mins = rows.mins.as_ref().map(|_| Pages::<f32>::zeroed(ns * groups * W));
        for j in 0..n {
            let (s, t) = (j / W, j % W);
            for kk in 0..k {
                q[(s * k + kk) * W + t] = rows.q[j * k + kk];
            }
            for g in 0..groups {
                scales[(s * groups + g) * W + t] = rows.scales[j * groups + g];
                if let (Some(o), Some(m)) = (&mut mins, &rows.mins) {
                    o[(s * groups + g) * W + t] = m[j * groups + g];
                }
            }
        }
        Int8 { k, n, group, q, scales, mins }
    }

    /// The dequantized matrix `[k, n]` (row-major): `q · s`, each in f32 — what the kernel
    /// computes with.
    pub fn dequantized(&self) -> Vec<f32> {
        let (k, n) = (self.k, self.n);
        let mut out = vec![0f32; k * n];
        for j in 0..n {
            let (strip, t) = (self.strip(j / W), j % W);
            for kk in 0..k {
                out[kk * n + j] = weight(strip, self.group, kk, t);
            }
        }
        out
    }

    /// Bytes of values and scales.
    pub fn bytes(&self) -> usize {
        self.q.len() + 4 * (self.scales.len() + self.mins.as_ref().map_or(0, |m| m.len()))
    }

    fn strip(&self, s: usize) -> Strip<'_> {
        let g = self.groups();
        let mn = self.mins.as_ref().map_or(&[][..], |m| &m[s * g * W..(s + 1) * g * W]);
        (&self.q[s * self.k * W..(s + 1) * self.k * W], &self.scales[s * g * W..(s + 1) * g * W], mn)
    }
}

/// The weight of row `kk`, column `t` of a strip: `q · s`, or `q · s + m`.
#[inline(always)]
fn weight((q, sc, mn): Strip, group: usize, kk: usize, t: usize) -> f32 {
    let g = kk / group * W + t;
    let p = q[kk * W + t] as f32 * sc[g];
    if mn.is_empty() {
        p
    } else {
        p + mn[g]
    }
}

/// `c[m, n] = a[m, k] · w` (overwritten).
pub fn matmul_rows_int8(c: &mut [f32], a: &[f32], w: &Int8, m: usize) {
    if w.mins.is_some() {
        product::<true>(c, a, w, m)
    } else {
        product::<false>(c, a, w, m)
    }
}

/// The product's tiles, with (`MIN`) or without minimums.
fn product<const MIN: bool>(c: &mut [f32], a: &[f32], w: &Int8, m: usize) {
    quantized_product(
        c,
        a,
        (m, w.k, w.n),
        |acc, rows, [s, s2]| {
            // SAFETY: called only where the CPU has AVX-512F; `rows` holds 8 rows of k.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                simd::tile_8x32_avx512::<MIN>(acc, rows, w.k, w.group, [w.strip(s), w.strip(s2)])
            };
        },
        |acc, rows, s| tile_rows::<MIN>(acc, rows, w, s),
        |out, s| strip_f32::<MIN>(out, w, s),
        |acc, row, four| tile_1x64::<MIN>(acc, row, w, four),
    );
}

/// `acc[r][t] = Σ_k a[r, k]·w[k, t]` for the 4, 5 or 6 rows of strip `s` that `acc` has.
fn tile_rows<const MIN: bool>(acc: &mut [[f32; W]], a: &[f32], w: &Int8, s: usize) {
    match acc.len() {
        4 => rows::<MIN, 4>(acc.try_into().expect("4 rows"), a, w, s),
        5 => rows::<MIN, 5>(acc.try_into().expect("5 rows"), a, w, s),
        6 => rows::<MIN, 6>(acc.try_into().expect("6 rows"), a, w, s),
        r => unreachable!("{r}-row tiles are not made"),
    }
}

fn rows<const MIN: bool, const R: usize>(acc: &mut [[f32; W]; R], a: &[f32], w: &Int8, s: usize) {
    let k = w.k;
    assert_eq!(a.len(), R * k);
    let strip = w.strip(s);
    #[cfg(target_arch = "x86_64")]
    if wide() {
        // SAFETY: the CPU has AVX-512F (checked); the lengths are checked above and by `strip`.
        return unsafe { simd::tile_rows_avx512::<MIN, R>(acc, a, k, w.group, strip) };
    }
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("fma") && is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 and FMA (checked); the slices' lengths are checked above
        // and by `strip`.
        return unsafe { simd::tile_rows::<MIN, R>(acc, a, k, w.group, strip) };
    }
    for kk in 0..k {
        for (r, accr) in acc.iter_mut().enumerate() {
            let av = a[r * k + kk];
            for (t, x) in accr.iter_mut().enumerate() {
                *x = av.mul_add(weight(strip, w.group, kk, t), *x);
            }
        }
    }
}

/// Strip `s` dequantized, `out[kk · 16 + t]`: the weights every tile computes with.
fn strip_f32<const MIN: bool>(out: &mut [f32], w: &Int8, s: usize) {
    assert_eq!(out.len(), w.k * W);
    let strip = w.strip(s);
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("fma") && is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked); `out` holds the strip's k rows (checked above).
        return unsafe { simd::strip_f32::<MIN>(out, w.k, w.group, strip) };
    }
    for kk in 0..w.k {
        for t in 0..W {
            out[kk * W + t] = weight(strip, w.group, kk, t);
        }
    }
}

/// One row × the four strips `ss`.
fn tile_1x64<const MIN: bool>(acc: &mut [[f32; W]; TASK], a: &[f32], w: &Int8, ss: [usize; TASK]) {
    let k = w.k;
    assert_eq!(a.len(), k);
    let strips = ss.map(|s| w.strip(s));
    #[cfg(target_arch = "x86_64")]
    if wide() {
        // SAFETY: the CPU has AVX-512F (checked); the lengths are checked above and by `strip`.
        return unsafe { simd::tile_1x64_avx512::<MIN>(acc, a, w.group, strips) };
    }
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("fma") && is_x86_feature_detected!("avx2") {
        // SAFETY: as above, with AVX2 and FMA.
        return unsafe { simd::tile_1x64::<MIN>(acc, a, w.group, strips) };
    }
    for (kk, &av) in a.iter().enumerate() {
        for (accq, &strip) in acc.iter_mut().zip(&strips) {
            for (t, x) in accq.iter_mut().enumerate() {
                *x = av.mul_add(weight(strip, w.group, kk, t), *x);
            }
        }
    }
}

/// The tiles with AVX2/FMA and AVX-512 intrinsics; each lane computes what the portable loops
/// compute (the 256-bit ones inlined where the build has AVX2 and FMA: see `rowwise::simd`).
/// `MIN`: the strips carry minimums (`q · s + m`).
#[cfg(target_arch = "x86_64")]
mod simd {
    use super::super::lanes::{ahead, group256, group512, scaled256, scaled512};
    use super::{Strip, W};
    use std::arch::x86_64::*;

    /// 8 weights of a strip's row, dequantized: `q · s` (`+ m`).
    #[inline(always)]
    unsafe fn dequant<const MIN: bool>(q: *const i8, s: __m256, m: __m256) -> __m256 {
        scaled256::<MIN>(_mm256_cvtepi8_epi32(_mm_loadl_epi64(q as *const __m128i)), s, m)
    }

    /// 16 weights of a strip's row in one 512-bit register, as `dequant`.
    #[inline(always)]
    unsafe fn dequant512<const MIN: bool>(q: *const i8, s: __m512, m: __m512) -> __m512 {
        scaled512::<MIN>(_mm512_cvtepi8_epi32(_mm_loadu_si128(q as *const __m128i)), s, m)
    }

    /// A strip's k rows dequantized into `out`, as the tiles dequantize them.
    #[cfg_attr(all(target_feature = "avx2", target_feature = "fma"), inline(always))]
    #[cfg_attr(not(all(target_feature = "avx2", target_feature = "fma")), target_feature(enable = "avx2,fma"))]
    pub unsafe fn strip_f32<const MIN: bool>(out: &mut [f32], k: usize, group: usize, (q, sc, mn): Strip) {
        let (op, qp) = (out.as_mut_ptr(), q.as_ptr());
        let mut kk = 0;
        for g in 0..k.div_ceil(group) {
            let (s0, s1) = (group256(sc, g, 0), group256(sc, g, 1));
            let (m0, m1) = (group256(mn, g, 0), group256(mn, g, 1));
            while kk < ((g + 1) * group).min(k) {
                _mm256_storeu_ps(op.add(kk * W), dequant::<MIN>(qp.add(kk * W), s0, m0));
                _mm256_storeu_ps(op.add(kk * W + 8), dequant::<MIN>(qp.add(kk * W + 8), s1, m1));
                kk += 1;
            }
        }
    }

    /// R rows × one strip: the strip's row dequantized once (two vectors) for the R rows' 2R
    /// accumulators.
    #[cfg_attr(all(target_feature = "avx2", target_feature = "fma"), inline(always))]
    #[cfg_attr(not(all(target_feature = "avx2", target_feature = "fma")), target_feature(enable = "avx2,fma"))]
    pub unsafe fn tile_rows<const MIN: bool, const R: usize>(
        acc: &mut [[f32; W]; R],
        a: &[f32],
        k: usize,
        group: usize,
        (q, sc, mn): Strip,
    ) {
        let mut c = [[_mm256_setzero_ps(); 2]; R];
        let (ap, qp) = (a.as_ptr(), q.as_ptr());
        let mut kk = 0;
        for g in 0..k.div_ceil(group) {
            let (s0, s1) = (group256(sc, g, 0), group256(sc, g, 1));
            let (m0, m1) = (group256(mn, g, 0), group256(mn, g, 1));
            while kk < ((g + 1) * group).min(k) {
                ahead(qp, kk * W);
                let w0 = dequant::<MIN>(qp.add(kk * W), s0, m0);
                let w1 = dequant::<MIN>(qp.add(kk * W + 8), s1, m1);
                for (r, cr) in c.iter_mut().enumerate() {
                    let av = _mm256_broadcast_ss(&*ap.add(r * k + kk));
                    cr[0] = _mm256_fmadd_ps(av, w0, cr[0]);
                    cr[1] = _mm256_fmadd_ps(av, w1, cr[1]);
                }
                kk += 1;
            }
        }
        for (accr, cr) in acc.iter_mut().zip(&c) {
            _mm256_storeu_ps(accr.as_mut_ptr(), cr[0]);
            _mm256_storeu_ps(accr.as_mut_ptr().add(8), cr[1]);
        }
    }

    /// 8 rows × two strips with 512-bit vectors: 16 accumulators, each strip's row
    /// dequantized once for the 8 rows.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn tile_8x32_avx512<const MIN: bool>(
        acc: &mut [[[f32; W]; 8]; 2],
        a: &[f32],
        k: usize,
        group: usize,
        strips: [Strip; 2],
    ) {
        assert!(a.len() == 8 * k);
        let mut c = [[_mm512_setzero_ps(); 2]; 8];
        let (ap, q0, q1) = (a.as_ptr(), strips[0].0.as_ptr(), strips[1].0.as_ptr());
        let mut kk = 0;
        for g in 0..k.div_ceil(group) {
            let (s0, s1) = (group512(strips[0].1, g), group512(strips[1].1, g));
            let (m0, m1) = (group512(strips[0].2, g), group512(strips[1].2, g));
            while kk < ((g + 1) * group).min(k) {
                ahead(q0, kk * W);
                ahead(q1, kk * W);
                let w0 = dequant512::<MIN>(q0.add(kk * W), s0, m0);
                let w1 = dequant512::<MIN>(q1.add(kk * W), s1, m1);
                for (r, cr) in c.iter_mut().enumerate() {
                    let av = _mm512_set1_ps(*ap.add(r * k + kk));
                    cr[0] = _mm512_fmadd_ps(av, w0, cr[0]);
                    cr[1] = _mm512_fmadd_ps(av, w1, cr[1]);
                }
                kk += 1;
            }
        }
        for (r, cr) in c.iter().enumerate() {
            _mm512_storeu_ps(acc[0][r].as_mut_ptr(), cr[0]);
            _mm512_storeu_ps(acc[1][r].as_mut_ptr(), cr[1]);
        }
    }

    /// R rows × one strip with 512-bit vectors: the strip's row dequantized once for the R.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn tile_rows_avx512<const MIN: bool, const R: usize>(
        acc: &mut [[f32; W]; R],
        a: &[f32],
        k: usize,
        group: usize,
        (q, sc, mn): Strip,
    ) {
        let mut c = [_mm512_setzero_ps(); R];
        let (ap, qp) = (a.as_ptr(), q.as_ptr());
        let mut kk = 0;
        for g in 0..k.div_ceil(group) {
            let (s, m) = (group512(sc, g), group512(mn, g));
            while kk < ((g + 1) * group).min(k) {
                ahead(qp, kk * W);
                let wv = dequant512::<MIN>(qp.add(kk * W), s, m);
                for (r, cr) in c.iter_mut().enumerate() {
                    *cr = _mm512_fmadd_ps(_mm512_set1_ps(*ap.add(r * k + kk)), wv, *cr);
                }
                kk += 1;
            }
        }
        for (accr, cr) in acc.iter_mut().zip(&c) {
            _mm512_storeu_ps(accr.as_mut_ptr(), *cr);
        }
    }

    /// One row × four strips with 512-bit vectors: a strip's row of 16 weights widened,
    /// converted and scaled in one register — lanewise the same operations as the 256-bit
    /// and portable paths, so the same bits.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn tile_1x64_avx512<const MIN: bool>(
        acc: &mut [[f32; W]; 4],
        a: &[f32],
        group: usize,
        strips: [Strip; 4],
    ) {
        let k = a.len();
        let mut c = [_mm512_setzero_ps(); 4];
        let q: [*const i8; 4] = std::array::from_fn(|i| strips[i].0.as_ptr());
        let mut kk = 0;
        for g in 0..k.div_ceil(group) {
            let s: [__m512; 4] = std::array::from_fn(|i| group512(strips[i].1, g));
            let m: [__m512; 4] = std::array::from_fn(|i| group512(strips[i].2, g));
            while kk < ((g + 1) * group).min(k) {
                let av = _mm512_set1_ps(*a.get_unchecked(kk));
                for i in 0..4 {
                    c[i] = _mm512_fmadd_ps(av, dequant512::<MIN>(q[i].add(kk * W), s[i], m[i]), c[i]);
                }
                kk += 1;
            }
        }
        for i in 0..4 {
            _mm512_storeu_ps(acc[i].as_mut_ptr(), c[i]);
        }
    }

    /// One row × four strips in one pass over k: 8 accumulators, so that the `fma` chains'
    /// latency hides behind each other (two strips at a time left 4 chains, each step waiting on
    /// the last); each strip's group scales (and minimums) read from memory at their use.
    #[cfg_attr(all(target_feature = "avx2", target_feature = "fma"), inline(always))]
    #[cfg_attr(not(all(target_feature = "avx2", target_feature = "fma")), target_feature(enable = "avx2,fma"))]
    pub unsafe fn tile_1x64<const MIN: bool>(acc: &mut [[f32; W]; 4], a: &[f32], group: usize, strips: [Strip; 4]) {
        let k = a.len();
        let mut c = [_mm256_setzero_ps(); 8];
        let q: [*const i8; 4] = std::array::from_fn(|i| strips[i].0.as_ptr());
        let mut kk = 0;
        for g in 0..k.div_ceil(group) {
            while kk < ((g + 1) * group).min(k) {
                let av = _mm256_broadcast_ss(a.get_unchecked(kk));
                for i in 0..4 {
                    for h in 0..2 {
                        let (s, m) = (group256(strips[i].1, g, h), group256(strips[i].2, g, h));
                        let w = dequant::<MIN>(q[i].add(kk * W + 8 * h), s, m);
                        c[2 * i + h] = _mm256_fmadd_ps(av, w, c[2 * i + h]);
                    }
                }
                kk += 1;
            }
        }
        for i in 0..4 {
            _mm256_storeu_ps(acc[i].as_mut_ptr(), c[2 * i]);
            _mm256_storeu_ps(acc[i].as_mut_ptr().add(8), c[2 * i + 1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::quant_rows::QuantRows;
    use rand::{Rng, SeedableRng};

    /// Every path — the portable loops, AVX2 and AVX-512 where the CPU has them — gives the
    /// same bits for tiles of 4, 5 and 6 rows and single rows, with and without minimums, with
    /// groups that end inside k and one group for all of k (the dispatch takes the widest, so
    /// the narrower paths are called here).
    #[test]
    fn every_path_computes_the_same_bits() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(8);
        let (k, n) = (75, 64);
        let wv: Vec<f32> = (0..k * n).map(|_| rng.gen_range(-2.0..2.0)).collect();
        let strips = crate::tensor::rowwise::tests_strips(&crate::tensor::rowwise::Packed::new(&wv, k, n));
        let (rows, kq, g) = (n, 96, 32);
        let with_mins = Int8::from_quant_rows(&QuantRows {
            rows,
            k: kq,
            group: g,
            bits: 8,
            q: (0..rows * kq).map(|_| rng.gen_range(-128..=127)).collect(),
            scales: (0..rows * kq / g).map(|_| rng.gen_range(0.001..0.1)).collect(),
            mins: Some((0..rows * kq / g).map(|_| rng.gen_range(-0.8..0.0)).collect()),
        });
        for w in [Int8::from_strips(&strips, k, n, 32), Int8::from_strips(&strips, k, n, k), with_mins] {
            let k = w.k;
            let a: Vec<f32> = (0..6 * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
            if w.mins.is_some() {
                check::<true, 4>(&w, &a[..4 * k]);
                check::<true, 5>(&w, &a[..5 * k]);
                check::<true, 6>(&w, &a);
            } else {
                check::<false, 4>(&w, &a[..4 * k]);
                check::<false, 5>(&w, &a[..5 * k]);
                check::<false, 6>(&w, &a);
            }
        }
    }

    fn check<const MIN: bool, const R: usize>(w: &Int8, a: &[f32]) {
        let k = w.k;
        // the portable loops, written out
        let mut want = [[0f32; W]; R];
        let strip = w.strip(1);
        for kk in 0..k {
            for (r, accr) in want.iter_mut().enumerate() {
                for (t, x) in accr.iter_mut().enumerate() {
                    *x = a[r * k + kk].mul_add(weight(strip, w.group, kk, t), *x);
                }
            }
        }
        let bits = |x: &[[f32; W]]| x.iter().flatten().map(|v| v.to_bits()).collect::<Vec<_>>();
        let mut got = [[0f32; W]; R];
        tile_rows::<MIN>(&mut got, a, w, 1);
        assert_eq!(bits(&got), bits(&want), "dispatched {R} rows");
        // the strip dequantized once (the tiles of a product of many rows run over it)
        let mut f = vec![0f32; k * W];
        strip_f32::<MIN>(&mut f, w, 1);
        let each: Vec<u32> = (0..k * W).map(|i| weight(strip, w.group, i / W, i % W).to_bits()).collect();
        assert_eq!(f.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), each, "the strip dequantized once");
        // one row over four different strips (a decode's tile), each strip's columns its own
        let want_one = crate::tensor::tests_one_row(&a[..k], |q, kk, t| weight(w.strip(q), w.group, kk, t));
        let mut one = [[0f32; W]; 4];
        tile_1x64::<MIN>(&mut one, &a[..k], w, [0, 1, 2, 3]);
        assert_eq!(bits(&one), bits(&want_one), "dispatched one row");
        #[cfg(target_arch = "x86_64")]
        let four = [0, 1, 2, 3].map(|q| w.strip(q));
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("fma") && is_x86_feature_detected!("avx2") {
                let mut got = [[0f32; W]; R];
                // SAFETY: AVX2 and FMA checked; `a` holds R rows of k, `strip` one strip
                unsafe { simd::tile_rows::<MIN, R>(&mut got, a, k, w.group, strip) };
                assert_eq!(bits(&got), bits(&want), "AVX2 {R} rows");
                let mut one = [[0f32; W]; 4];
                // SAFETY: as above, one row and four strips
                unsafe { simd::tile_1x64::<MIN>(&mut one, &a[..k], w.group, four) };
                assert_eq!(bits(&one), bits(&want_one), "AVX2 one row");
            }
            if wide() {
                let mut got = [[0f32; W]; R];
                // SAFETY: AVX-512F checked
                unsafe { simd::tile_rows_avx512::<MIN, R>(&mut got, a, k, w.group, strip) };
                assert_eq!(bits(&got), bits(&want), "AVX-512 {R} rows");
                let mut one = [[0f32; W]; 4];
                // SAFETY: as above
                unsafe { simd::tile_1x64_avx512::<MIN>(&mut one, &a[..k], w.group, four) };
                assert_eq!(bits(&one), bits(&want_one), "AVX-512 one row");
            }
        }
    }
}
