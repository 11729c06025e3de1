//! `matmul_rows` over 4-bit weights, as llama.cpp's Q4_0 holds them: a scale per output column
//! and per group of 32 rows of k, each weight 4 bits `q` standing for `(q − 8) · s` —
//! dequantized in registers (the nibble widened, 8 subtracted, converted, times the scale: one
//! rounding, the product), then the same `fma` chain over k in order from 0 as the f32 kernel.
//! Every output element is bit for bit the f32 kernel's result on the dequantized matrix,
//! whatever rows are around it (batch invariance holds), and the weights are read at 4.5 bits
//! a value (half the 8-bit form's bytes, an eighth of f32's).
//!
//! Layout as the other kernels': columns in strips of 16, `[strip][k][8]` bytes — byte `j` of
//! a row holds column `j` in its low nibble and column `j + 8` in its high one — and
//! `[strip][group][16]` scales. Quantization is llama.cpp's `quantize_row_q4_0_ref` per column
//! and group (`q4_0_block`, which the GGUF writer uses too), so a matrix quantized here is the
//! one `llama-quantize` makes of it.
//!
//! With a minimum per group (Q4_1, and Q4_K's groups of 32 — `from_quant_rows`, a file's blocks
//! as they are stored) a weight is `q · s + m`, `q` the nibble itself (no 8 subtracted): the
//! product and the sum rounded as the file's reference dequantizes them.

use super::{quantized_product, wide, STRIP as W, TASK};
use crate::pages::Pages;
use rayon::prelude::*;

/// Rows of k that share a scale.
pub const GROUP: usize = 32;

/// The value of `x` largest in magnitude, with its sign (the first of equals; 0 for none):
/// what llama.cpp's `q4_0`/`q5_0` quantizers divide by.
pub fn signed_absmax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// One Q4_0 block of 32 values as llama.cpp's `quantize_row_q4_0_ref` makes it: the scale
/// `d = max / −8` (`max` the value of largest magnitude, its sign kept; stored as f16) and each
/// value's 4 bits `min(15, trunc(x / d + 8.5))`, from the unrounded scale. The value is then
/// `(q − 8) · d`, with `d` as stored.
pub fn q4_0_block(x: &[f32]) -> (f32, [u8; 32]) {
    let d = signed_absmax(x) / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0u8; 32];
    for (qj, &v) in q.iter_mut().zip(x) {
        *qj = ((v * id + 8.5) as i8).min(15) as u8;
    }
    (d, q)
}

/// A `[k, n]` matrix in 4 bits with its scales.
pub struct Int4 {
    pub k: usize,
    pub n: usize,
    q: Pages<u8>,
    scales: Pages<f32>,
    /// `[strip][group][16]` minimums (Q4_1, Q4_K); `None`: the nibble minus 8 times the scale.
    mins: Option<Pages<f32>>,
}

/// A strip's nibbles, scales and minimums (empty without them).
type Strip<'a> = (&'a [u8], &'a [f32], &'a [f32]);

impl Int4 {
    fn groups(&self) -> usize {
        self.k.div_ceil(GROUP)
    }

    /// Quantizes strips of f32 values `[strip][k][16]` (the f32 kernel's packing); a last
    /// group shorter than 32 is quantized as if padded with zeros.
    pub fn from_strips(strips: &[f32], k: usize, n: usize) -> Int4 {
        assert!(strips.len() == n.div_ceil(W) * k * W);
        let groups = k.div_ceil(GROUP);
        let ns = n.div_ceil(W);
        let mut q = Pages::<u8>::zeroed(ns * k * W / 2);
        let mut scales = Pages::<f32>::zeroed(ns * groups * W);
        q.par_chunks_mut(k * W / 2).zip(scales.par_chunks_mut(groups * W)).enumerate().for_each(|(s, (qs, ss))| {
            let strip = &strips[s * k * W..(s + 1) * k * W];
            for g in 0..groups {
                let rows = g * GROUP..((g + 1) * GROUP).min(k);
                for t in 0..W {
                    let mut x = [0f32; GROUP];
                    for (xi, kk) in x.iter_mut().zip(rows.clone()) {
                        *xi = strip[kk * W + t];
                    }
                    let (d, nib) = q4_0_block(&x);
                    // the scale as llama.cpp stores it (f16)
                    ss[g * W + t] = half::f16::from_f32(d).to_f32();
                    for (i, kk) in rows.clone().enumerate() {
                        let byte = &mut qs[kk * W / 2 + t % 8];
                        *byte |= if t < 8 { nib[i] } else { nib[i] << 4 };
                    }
                }
            }
        });
        Int4 { k, n, q, scales, mins: None }
    }

    /// A file's 4-bit rows as stored (`rows.bits == 4`, groups of 32): row `j` becomes output
    /// column `j`.
    pub fn from_quant_rows(rows: &super::quant_rows::QuantRows) -> Int4 {
        assert!(rows.bits == 4 && rows.group == GROUP && rows.k.is_multiple_of(GROUP));
        let (k, n, groups) = (rows.k, rows.rows, rows.groups());
        let ns = n.div_ceil(W);
        let mut q = Pages::<u8>::zeroed(ns * k * W / 2);
        let mut scales = Pages::<f32>::zeroed(ns * groups * W);
        let mut mins = rows.mins.as_ref().map(|_| Pages::<f32>::zeroed(ns * groups * W));
        let offset = if rows.mins.is_some() { 0 } else { 8 };
        for j in 0..n {
            let (s, t) = (j / W, j % W);
            for kk in 0..k {
                let nib = (rows.q[j * k + kk] + offset) as u8 & 0x0F;
                q[s * k * W / 2 + kk * W / 2 + t % 8] |= if t < 8 { nib } else { nib << 4 };
            }
            for g in 0..groups {
                scales[(s * groups + g) * W + t] = rows.scales[j * groups + g];
                if let (Some(o), Some(m)) = (&mut mins, &rows.mins) {
                    o[(s * groups + g) * W + t] = m[j * groups + g];
                }
            }
        }
        Int4 { k, n, q, scales, mins }
    }

    /// The dequantized matrix `[k, n]` (row-major): `(q − 8) · s`, each in f32 — what the
    /// kernel computes with.
    pub fn dequantized(&self) -> Vec<f32> {
        let (k, n) = (self.k, self.n);
        let mut out = vec![0f32; k * n];
        for j in 0..n {
            let (strip, t) = (self.strip(j / W), j % W);
            for kk in 0..k {
                out[kk * n + j] = weight(strip, kk, t);
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
        (&self.q[s * self.k * W / 2..(s + 1) * self.k * W / 2], &self.scales[s * g * W..(s + 1) * g * W], mn)
    }
}

/// The weight of row `kk`, column `t` of a strip: `(q − 8) · s`, or `q · s + m`.
#[inline(always)]
fn weight((q, sc, mn): Strip, kk: usize, t: usize) -> f32 {
    let b = q[kk * W / 2 + t % 8];
    let nib = if t < 8 { b & 0x0F } else { b >> 4 };
    let g = kk / GROUP * W + t;
    if mn.is_empty() {
        (nib as i32 - 8) as f32 * sc[g]
    } else {
        nib as f32 * sc[g] + mn[g]
    }
}

/// `c[m, n] = a[m, k] · w` (overwritten).
pub fn matmul_rows_int4(c: &mut [f32], a: &[f32], w: &Int4, m: usize) {
    if w.mins.is_some() {
        product::<true>(c, a, w, m)
    } else {
        product::<false>(c, a, w, m)
    }
}

/// The product's tiles, with (`MIN`) or without minimums.
fn product<const MIN: bool>(c: &mut [f32], a: &[f32], w: &Int4, m: usize) {
    quantized_product(
        c,
        a,
        (m, w.k, w.n),
        |acc, rows, [s, s2]| {
            // SAFETY: called only where the CPU has AVX-512F; `rows` holds 8 rows of k.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                simd::tile_8x32_avx512::<MIN>(acc, rows, w.k, [w.strip(s), w.strip(s2)])
            };
        },
        |acc, rows, s| tile_rows::<MIN>(acc, rows, w, s),
        |out, s| strip_f32::<MIN>(out, w, s),
        |acc, row, four| tile_1x64::<MIN>(acc, row, w, four),
    );
}

/// Strip `s` dequantized, `out[kk · 16 + t]`: the weights every tile computes with.
fn strip_f32<const MIN: bool>(out: &mut [f32], w: &Int4, s: usize) {
    assert_eq!(out.len(), w.k * W);
    let strip = w.strip(s);
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("fma") && is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked); `out` holds the strip's k rows (checked above).
        return unsafe { simd::strip_f32::<MIN>(out, w.k, strip) };
    }
    for kk in 0..w.k {
        for t in 0..W {
            out[kk * W + t] = weight(strip, kk, t);
        }
    }
}

/// `acc[r][t] = Σ_k a[r, k]·w[k, t]` for the 4, 5 or 6 rows of strip `s` that `acc` has.
fn tile_rows<const MIN: bool>(acc: &mut [[f32; W]], a: &[f32], w: &Int4, s: usize) {
    match acc.len() {
        4 => rows::<MIN, 4>(acc.try_into().expect("4 rows"), a, w, s),
        5 => rows::<MIN, 5>(acc.try_into().expect("5 rows"), a, w, s),
        6 => rows::<MIN, 6>(acc.try_into().expect("6 rows"), a, w, s),
        r => unreachable!("{r}-row tiles are not made"),
    }
}

fn rows<const MIN: bool, const R: usize>(acc: &mut [[f32; W]; R], a: &[f32], w: &Int4, s: usize) {
    let k = w.k;
    assert_eq!(a.len(), R * k);
    let strip = w.strip(s);
    #[cfg(target_arch = "x86_64")]
    if wide() {
        // SAFETY: the CPU has AVX-512F (checked); the lengths are checked above and by `strip`.
        return unsafe { simd::tile_rows_avx512::<MIN, R>(acc, a, k, strip) };
    }
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("fma") && is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 and FMA (checked); lengths as above.
        return unsafe { simd::tile_rows::<MIN, R>(acc, a, k, strip) };
    }
    for kk in 0..k {
        for (r, accr) in acc.iter_mut().enumerate() {
            let av = a[r * k + kk];
            for (t, x) in accr.iter_mut().enumerate() {
                *x = av.mul_add(weight(strip, kk, t), *x);
            }
        }
    }
}

/// One row × the four strips `ss`.
fn tile_1x64<const MIN: bool>(acc: &mut [[f32; W]; TASK], a: &[f32], w: &Int4, ss: [usize; TASK]) {
    let k = w.k;
    assert_eq!(a.len(), k);
    let strips = ss.map(|s| w.strip(s));
    #[cfg(target_arch = "x86_64")]
    if wide() {
        // SAFETY: the CPU has AVX-512F (checked); the lengths are checked above and by `strip`.
        return unsafe { simd::tile_1x64_avx512::<MIN>(acc, a, strips) };
    }
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("fma") && is_x86_feature_detected!("avx2") {
        // SAFETY: as above, with AVX2 and FMA.
        return unsafe { simd::tile_1x64::<MIN>(acc, a, strips) };
    }
    for (kk, &av) in a.iter().enumerate() {
        for (accq, &strip) in acc.iter_mut().zip(&strips) {
            for (t, x) in accq.iter_mut().enumerate() {
                *x = av.mul_add(weight(strip, kk, t), *x);
            }
        }
    }
}

/// The tiles with AVX2/FMA and AVX-512 intrinsics; each lane computes what the portable loops
/// compute (the 256-bit ones inlined where the build has AVX2 and FMA: see `rowwise::simd`).
/// `MIN`: the strips carry minimums (`q · s + m`); otherwise `(q − 8) · s`.
#[cfg(target_arch = "x86_64")]
mod simd {
    use super::super::lanes::{ahead, group256, group512, scaled256, scaled512};
    use super::{Strip, GROUP, W};
    use std::arch::x86_64::*;

    /// The 8 low nibbles (columns 0..8) and 8 high ones (columns 8..16) of a row's 8 bytes
    /// (each minus 8 without minimums), as 32-bit integers.
    #[inline(always)]
    unsafe fn nibbles256<const MIN: bool>(q: *const u8) -> (__m256i, __m256i) {
        let b = _mm_loadl_epi64(q as *const __m128i);
        let m = _mm_set1_epi8(0x0F);
        let lo = _mm256_cvtepu8_epi32(_mm_and_si128(b, m));
        let hi = _mm256_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b, 4), m));
        if MIN {
            return (lo, hi);
        }
        let eight = _mm256_set1_epi32(8);
        (_mm256_sub_epi32(lo, eight), _mm256_sub_epi32(hi, eight))
    }

    /// The row's 16 weights in one 512-bit register.
    #[inline(always)]
    unsafe fn weights512<const MIN: bool>(q: *const u8, s: __m512, mn: __m512) -> __m512 {
        let b = _mm_loadl_epi64(q as *const __m128i);
        let m = _mm_set1_epi8(0x0F);
        let both = _mm_unpacklo_epi64(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
        let mut v = _mm512_cvtepu8_epi32(both);
        if !MIN {
            v = _mm512_sub_epi32(v, _mm512_set1_epi32(8));
        }
        scaled512::<MIN>(v, s, mn)
    }

    /// Two consecutive rows' 16 weights each (their 16 bytes loaded, masked and shifted once):
    /// lanewise what `weights512` gives for each row.
    #[inline(always)]
    unsafe fn weights512_pair<const MIN: bool>(q: *const u8, s: __m512, mn: __m512) -> (__m512, __m512) {
        let b = _mm_loadu_si128(q as *const __m128i);
        let m = _mm_set1_epi8(0x0F);
        let (lo, hi) = (_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
        let mut v0 = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(lo, hi));
        let mut v1 = _mm512_cvtepu8_epi32(_mm_unpackhi_epi64(lo, hi));
        if !MIN {
            let eight = _mm512_set1_epi32(8);
            (v0, v1) = (_mm512_sub_epi32(v0, eight), _mm512_sub_epi32(v1, eight));
        }
        (scaled512::<MIN>(v0, s, mn), scaled512::<MIN>(v1, s, mn))
    }

    /// A strip's k rows dequantized into `out`, as the tiles dequantize them.
    #[cfg_attr(all(target_feature = "avx2", target_feature = "fma"), inline(always))]
    #[cfg_attr(not(all(target_feature = "avx2", target_feature = "fma")), target_feature(enable = "avx2,fma"))]
    pub unsafe fn strip_f32<const MIN: bool>(out: &mut [f32], k: usize, (q, sc, mn): Strip) {
        let (op, qp) = (out.as_mut_ptr(), q.as_ptr());
        let mut kk = 0;
        for g in 0..k.div_ceil(GROUP) {
            let (s0, s1) = (group256(sc, g, 0), group256(sc, g, 1));
            let (m0, m1) = (group256(mn, g, 0), group256(mn, g, 1));
            while kk < ((g + 1) * GROUP).min(k) {
                let (lo, hi) = nibbles256::<MIN>(qp.add(kk * W / 2));
                _mm256_storeu_ps(op.add(kk * W), scaled256::<MIN>(lo, s0, m0));
                _mm256_storeu_ps(op.add(kk * W + 8), scaled256::<MIN>(hi, s1, m1));
                kk += 1;
            }
        }
    }

    /// R rows × one strip: the strip's row of 16 nibbles unpacked and scaled once for the R
    /// rows' 2R accumulators.
    #[cfg_attr(all(target_feature = "avx2", target_feature = "fma"), inline(always))]
    #[cfg_attr(not(all(target_feature = "avx2", target_feature = "fma")), target_feature(enable = "avx2,fma"))]
    pub unsafe fn tile_rows<const MIN: bool, const R: usize>(
        acc: &mut [[f32; W]; R],
        a: &[f32],
        k: usize,
        (q, sc, mn): Strip,
    ) {
        let mut c = [[_mm256_setzero_ps(); 2]; R];
        let (ap, qp) = (a.as_ptr(), q.as_ptr());
        let mut kk = 0;
        for g in 0..k.div_ceil(GROUP) {
            let (s0, s1) = (group256(sc, g, 0), group256(sc, g, 1));
            let (m0, m1) = (group256(mn, g, 0), group256(mn, g, 1));
            while kk < ((g + 1) * GROUP).min(k) {
                ahead(qp, kk * W / 2);
                let (lo, hi) = nibbles256::<MIN>(qp.add(kk * W / 2));
                let w0 = scaled256::<MIN>(lo, s0, m0);
                let w1 = scaled256::<MIN>(hi, s1, m1);
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

    /// One row × four strips in one pass over k: 8 accumulators, so that the `fma` chains'
    /// latency hides behind each other (two strips at a time left 4 chains, each step waiting on
    /// the last); each strip's group scales (and minimums) read from memory at their use.
    #[cfg_attr(all(target_feature = "avx2", target_feature = "fma"), inline(always))]
    #[cfg_attr(not(all(target_feature = "avx2", target_feature = "fma")), target_feature(enable = "avx2,fma"))]
    pub unsafe fn tile_1x64<const MIN: bool>(acc: &mut [[f32; W]; 4], a: &[f32], strips: [Strip; 4]) {
        let k = a.len();
        let mut c = [_mm256_setzero_ps(); 8];
        let q: [*const u8; 4] = std::array::from_fn(|i| strips[i].0.as_ptr());
        let mut kk = 0;
        for g in 0..k.div_ceil(GROUP) {
            while kk < ((g + 1) * GROUP).min(k) {
                let av = _mm256_broadcast_ss(a.get_unchecked(kk));
                for i in 0..4 {
                    let (lo, hi) = nibbles256::<MIN>(q[i].add(kk * W / 2));
                    for (h, v) in [lo, hi].into_iter().enumerate() {
                        let (s, m) = (group256(strips[i].1, g, h), group256(strips[i].2, g, h));
                        let w = scaled256::<MIN>(v, s, m);
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

    /// 8 rows × two strips: 16 accumulators, each strip's row unpacked once for the 8 rows.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn tile_8x32_avx512<const MIN: bool>(
        acc: &mut [[[f32; W]; 8]; 2],
        a: &[f32],
        k: usize,
        strips: [Strip; 2],
    ) {
        assert!(a.len() == 8 * k);
        let mut c = [[_mm512_setzero_ps(); 2]; 8];
        let (ap, q0, q1) = (a.as_ptr(), strips[0].0.as_ptr(), strips[1].0.as_ptr());
        let mut kk = 0;
        for g in 0..k.div_ceil(GROUP) {
            let (s0, s1) = (group512(strips[0].1, g), group512(strips[1].1, g));
            let (m0, m1) = (group512(strips[0].2, g), group512(strips[1].2, g));
            while kk < ((g + 1) * GROUP).min(k) {
                ahead(q0, kk * W / 2);
                ahead(q1, kk * W / 2);
                let w0 = weights512::<MIN>(q0.add(kk * W / 2), s0, m0);
                let w1 = weights512::<MIN>(q1.add(kk * W / 2), s1, m1);
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

    #[target_feature(enable = "avx512f")]
    pub unsafe fn tile_rows_avx512<const MIN: bool, const R: usize>(
        acc: &mut [[f32; W]; R],
        a: &[f32],
        k: usize,
        (q, sc, mn): Strip,
    ) {
        let mut c = [_mm512_setzero_ps(); R];
        let (ap, qp) = (a.as_ptr(), q.as_ptr());
        let mut kk = 0;
        for g in 0..k.div_ceil(GROUP) {
            let (s, m) = (group512(sc, g), group512(mn, g));
            while kk < ((g + 1) * GROUP).min(k) {
                ahead(qp, kk * W / 2);
                let wv = weights512::<MIN>(qp.add(kk * W / 2), s, m);
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

    /// One row × four strips: a strip's row of 16 weights in one register, four chains.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn tile_1x64_avx512<const MIN: bool>(acc: &mut [[f32; W]; 4], a: &[f32], strips: [Strip; 4]) {
        let k = a.len();
        let mut c = [_mm512_setzero_ps(); 4];
        let q: [*const u8; 4] = std::array::from_fn(|i| strips[i].0.as_ptr());
        let mut kk = 0;
        for g in 0..k.div_ceil(GROUP) {
            let s: [__m512; 4] = std::array::from_fn(|i| group512(strips[i].1, g));
            let m: [__m512; 4] = std::array::from_fn(|i| group512(strips[i].2, g));
            let end = ((g + 1) * GROUP).min(k);
            // two rows of k at once: their 16 bytes masked and shifted in one go (a group's
            // rows are an even number but the last group's may not be)
            while kk + 2 <= end {
                let (a0, a1) = (_mm512_set1_ps(*a.get_unchecked(kk)), _mm512_set1_ps(*a.get_unchecked(kk + 1)));
                for i in 0..4 {
                    let (w0, w1) = weights512_pair::<MIN>(q[i].add(kk * W / 2), s[i], m[i]);
                    c[i] = _mm512_fmadd_ps(a0, w0, c[i]);
                    c[i] = _mm512_fmadd_ps(a1, w1, c[i]);
                }
                kk += 2;
            }
            while kk < end {
                let av = _mm512_set1_ps(*a.get_unchecked(kk));
                for i in 0..4 {
                    c[i] = _mm512_fmadd_ps(av, weights512::<MIN>(q[i].add(kk * W / 2), s[i], m[i]), c[i]);
                }
                kk += 1;
            }
        }
        for i in 0..4 {
            _mm512_storeu_ps(acc[i].as_mut_ptr(), c[i]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::quant_rows::QuantRows;
    use rand::{Rng, SeedableRng};

    /// Q4_1-like rows as a file stores them: nibbles, scales and minimums.
    pub(crate) fn rows_with_mins(rng: &mut impl Rng, rows: usize, k: usize) -> QuantRows {
        let g = k / GROUP;
        QuantRows {
            rows,
            k,
            group: GROUP,
            bits: 4,
            q: (0..rows * k).map(|_| rng.gen_range(0..16)).collect(),
            scales: (0..rows * g).map(|_| rng.gen_range(0.001..0.1)).collect(),
            mins: Some((0..rows * g).map(|_| rng.gen_range(-0.8..0.0)).collect()),
        }
    }

    /// Every path — the portable loops, AVX2 and AVX-512 where the CPU has them — gives the
    /// same bits for tiles of 4, 5 and 6 rows and single rows, with and without minimums (the
    /// dispatch takes the widest, so the narrower paths are called here).
    #[test]
    fn every_path_computes_the_same_bits() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let (k, n) = (75, 64);
        let wv: Vec<f32> = (0..k * n).map(|_| rng.gen_range(-2.0..2.0)).collect();
        let packed = crate::tensor::rowwise::Packed::new(&wv, k, n);
        let plain = Int4::from_strips(&crate::tensor::rowwise::tests_strips(&packed), k, n);
        let with_mins = Int4::from_quant_rows(&rows_with_mins(&mut rng, n, 96));
        for w in [plain, with_mins] {
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

    fn check<const MIN: bool, const R: usize>(w: &Int4, a: &[f32]) {
        let k = w.k;
        // the portable loops, written out
        let mut want = [[0f32; W]; R];
        let strip = w.strip(1);
        for kk in 0..k {
            for (r, accr) in want.iter_mut().enumerate() {
                for (t, x) in accr.iter_mut().enumerate() {
                    *x = a[r * k + kk].mul_add(weight(strip, kk, t), *x);
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
        let each: Vec<u32> = (0..k * W).map(|i| weight(strip, i / W, i % W).to_bits()).collect();
        assert_eq!(f.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), each, "the strip dequantized once");
        // one row over four different strips (a decode's tile), each strip's columns its own
        let want_one = crate::tensor::tests_one_row(&a[..k], |q, kk, t| weight(w.strip(q), kk, t));
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
                unsafe { simd::tile_rows::<MIN, R>(&mut got, a, k, strip) };
                assert_eq!(bits(&got), bits(&want), "AVX2 {R} rows");
                let mut one = [[0f32; W]; 4];
                // SAFETY: as above, one row and four strips
                unsafe { simd::tile_1x64::<MIN>(&mut one, &a[..k], four) };
                assert_eq!(bits(&one), bits(&want_one), "AVX2 one row");
            }
            if wide() {
                let mut got = [[0f32; W]; R];
                // SAFETY: AVX-512F checked
                unsafe { simd::tile_rows_avx512::<MIN, R>(&mut got, a, k, strip) };
                assert_eq!(bits(&got), bits(&want), "AVX-512 {R} rows");
                let mut one = [[0f32; W]; 4];
                // SAFETY: as above
                unsafe { simd::tile_1x64_avx512::<MIN>(&mut one, &a[..k], four) };
                assert_eq!(bits(&one), bits(&want_one), "AVX-512 one row");
            }
        }
    }
}
