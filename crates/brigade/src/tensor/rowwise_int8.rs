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

use super::{quantized_product, wide, STRIP as W, TASK};
use rayon::prelude::*;

/// A `[k, n]` matrix in 8 bits with its scales.
pub struct Int8 {
    pub k: usize,
    pub n: usize,
    /// Rows of k that share a scale (`k`: one per column).
    pub group: usize,
    q: Vec<i8>,
    scales: Vec<f32>,
}

impl Int8 {
    fn groups(&self) -> usize {
        self.k.div_ceil(self.group)
    }

    /// Quantizes strips of f32 values `[strip][k][16]` (the f32 kernel's packing).
    pub fn from_strips(strips: &[f32], k: usize, n: usize, group: usize) -> Int8 {
        assert!(group > 0 && strips.len() == n.div_ceil(W) * k * W);
        let groups = k.div_ceil(group);
        let ns = n.div_ceil(W);
        let mut q = vec![0i8; ns * k * W];
        let mut scales = vec![0f32; ns * groups * W];
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
        Int8 { k, n, group, q, scales }
    }

    /// The dequantized matrix `[k, n]` (row-major): `q · s`, each in f32 — what the kernel
    /// computes with.
    pub fn dequantized(&self) -> Vec<f32> {
        let (k, n) = (self.k, self.n);
        let mut out = vec![0f32; k * n];
        for j in 0..n {
            let (s, t) = (j / W, j % W);
            for kk in 0..k {
                out[kk * n + j] =
                    self.q[(s * k + kk) * W + t] as f32 * self.scales[(s * self.groups() + kk / self.group) * W + t];
            }
        }
        out
    }

    /// Bytes of values and scales.
    pub fn bytes(&self) -> usize {
        self.q.len() + 4 * self.scales.len()
    }

    fn strip(&self, s: usize) -> (&[i8], &[f32]) {
        let g = self.groups();
        (&self.q[s * self.k * W..(s + 1) * self.k * W], &self.scales[s * g * W..(s + 1) * g * W])
    }
}

/// `c[m, n] = a[m, k] · w` (overwritten).
pub fn matmul_rows_int8(c: &mut [f32], a: &[f32], w: &Int8, m: usize) {
    quantized_product(
        c,
        a,
        (m, w.k, w.n),
        |acc, rows, [s, s2]| {
            // SAFETY: called only where the CPU has AVX-512F; `rows` holds 8 rows of k.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                simd::tile_8x32_avx512(acc, rows, w.k, w.group, [w.strip(s), w.strip(s2)])
            };
        },
        |acc, rows, s| tile_rows(acc, rows, w, s),
        |acc, row, four| tile_1x64(acc, row, w, four),
    );
}

/// `acc[r][t] = Σ_k a[r, k]·(q[k, t]·s[k / group, t])` for 4 rows of strip `s`.
fn tile_rows(acc: &mut [[f32; W]; 4], a: &[f32], w: &Int8, s: usize) {
    let k = w.k;
    assert_eq!(a.len(), 4 * k);
    let (q, sc) = w.strip(s);
    #[cfg(target_arch = "x86_64")]
    if wide() {
        // SAFETY: the CPU has AVX-512F (checked); the lengths are checked above and by `strip`.
        return unsafe { simd::tile_rows_avx512(acc, a, k, w.group, q, sc) };
    }
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("fma") && is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 and FMA (checked); the slices' lengths are checked above
        // and by `strip`.
        return unsafe { simd::tile_rows(acc, a, k, w.group, q, sc) };
    }
    for kk in 0..k {
        let g = kk / w.group;
        for (r, accr) in acc.iter_mut().enumerate() {
            let av = a[r * k + kk];
            for t in 0..W {
                let wv = q[kk * W + t] as f32 * sc[g * W + t];
                accr[t] = av.mul_add(wv, accr[t]);
            }
        }
    }
}

/// One row × the four strips `ss`.
fn tile_1x64(acc: &mut [[f32; W]; TASK], a: &[f32], w: &Int8, ss: [usize; TASK]) {
    let k = w.k;
    assert_eq!(a.len(), k);
    let strips = ss.map(|s| w.strip(s));
    #[cfg(target_arch = "x86_64")]
    if wide() {
        // SAFETY: the CPU has AVX-512F (checked); the lengths are checked above and by `strip`.
        return unsafe { simd::tile_1x64_avx512(acc, a, w.group, strips) };
    }
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("fma") && is_x86_feature_detected!("avx2") {
        let (lo, hi) = acc.split_at_mut(2);
        // SAFETY: as above, with AVX2 and FMA.
        unsafe {
            simd::tile_1x32(lo.try_into().unwrap(), a, w.group, [strips[0], strips[1]]);
            simd::tile_1x32(hi.try_into().unwrap(), a, w.group, [strips[2], strips[3]]);
        }
        return;
    }
    for (kk, &av) in a.iter().enumerate() {
        let g = kk / w.group;
        for (accq, (q, sc)) in acc.iter_mut().zip(&strips) {
            for t in 0..W {
                accq[t] = av.mul_add(q[kk * W + t] as f32 * sc[g * W + t], accq[t]);
            }
        }
    }
}

/// The tiles with AVX2/FMA intrinsics; each lane computes what the portable loops compute.
#[cfg(target_arch = "x86_64")]
mod simd {
    use super::W;
    use std::arch::x86_64::*;

    /// 8 weights of a strip's row, dequantized: `q · s`.
    #[inline(always)]
    unsafe fn dequant(q: *const i8, s: __m256) -> __m256 {
        let b = _mm_loadl_epi64(q as *const __m128i);
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), s)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn tile_rows(acc: &mut [[f32; W]; 4], a: &[f32], k: usize, group: usize, q: &[i8], sc: &[f32]) {
        let mut c = [[_mm256_setzero_ps(); 2]; 4];
        let (ap, qp) = (a.as_ptr(), q.as_ptr());
        let mut kk = 0;
        for g in 0..k.div_ceil(group) {
            let s0 = _mm256_loadu_ps(sc.as_ptr().add(g * W));
            let s1 = _mm256_loadu_ps(sc.as_ptr().add(g * W + 8));
            while kk < ((g + 1) * group).min(k) {
                let w0 = dequant(qp.add(kk * W), s0);
                let w1 = dequant(qp.add(kk * W + 8), s1);
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
    pub unsafe fn tile_8x32_avx512(
        acc: &mut [[[f32; W]; 8]; 2],
        a: &[f32],
        k: usize,
        group: usize,
        strips: [(&[i8], &[f32]); 2],
    ) {
        assert!(a.len() == 8 * k);
        let mut c = [[_mm512_setzero_ps(); 2]; 8];
        let (ap, q0, q1) = (a.as_ptr(), strips[0].0.as_ptr(), strips[1].0.as_ptr());
        let mut kk = 0;
        for g in 0..k.div_ceil(group) {
            let s0 = _mm512_loadu_ps(strips[0].1.as_ptr().add(g * W));
            let s1 = _mm512_loadu_ps(strips[1].1.as_ptr().add(g * W));
            while kk < ((g + 1) * group).min(k) {
                let b0 = _mm_loadu_si128(q0.add(kk * W) as *const __m128i);
                let b1 = _mm_loadu_si128(q1.add(kk * W) as *const __m128i);
                let w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b0)), s0);
                let w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b1)), s1);
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

    /// 4 rows × one strip with 512-bit vectors: the strip's row dequantized once for the 4.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn tile_rows_avx512(acc: &mut [[f32; W]; 4], a: &[f32], k: usize, group: usize, q: &[i8], sc: &[f32]) {
        let mut c = [_mm512_setzero_ps(); 4];
        let (ap, qp) = (a.as_ptr(), q.as_ptr());
        let mut kk = 0;
        for g in 0..k.div_ceil(group) {
            let s = _mm512_loadu_ps(sc.as_ptr().add(g * W));
            while kk < ((g + 1) * group).min(k) {
                let b = _mm_loadu_si128(qp.add(kk * W) as *const __m128i);
                let wv = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), s);
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
    pub unsafe fn tile_1x64_avx512(acc: &mut [[f32; W]; 4], a: &[f32], group: usize, strips: [(&[i8], &[f32]); 4]) {
        let k = a.len();
        let mut c = [_mm512_setzero_ps(); 4];
        let q: [*const i8; 4] = std::array::from_fn(|i| strips[i].0.as_ptr());
        let mut kk = 0;
        for g in 0..k.div_ceil(group) {
            let s: [__m512; 4] = std::array::from_fn(|i| _mm512_loadu_ps(strips[i].1.as_ptr().add(g * W)));
            while kk < ((g + 1) * group).min(k) {
                let av = _mm512_set1_ps(*a.get_unchecked(kk));
                for i in 0..4 {
                    let b = _mm_loadu_si128(q[i].add(kk * W) as *const __m128i);
                    let wv = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), s[i]);
                    c[i] = _mm512_fmadd_ps(av, wv, c[i]);
                }
                kk += 1;
            }
        }
        for i in 0..4 {
            _mm512_storeu_ps(acc[i].as_mut_ptr(), c[i]);
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn tile_1x32(acc: &mut [[f32; W]; 2], a: &[f32], group: usize, strips: [(&[i8], &[f32]); 2]) {
        let k = a.len();
        let mut c = [_mm256_setzero_ps(); 4];
        let (q0, q1) = (strips[0].0.as_ptr(), strips[1].0.as_ptr());
        let mut kk = 0;
        for g in 0..k.div_ceil(group) {
            let s: [__m256; 4] = [
                _mm256_loadu_ps(strips[0].1.as_ptr().add(g * W)),
                _mm256_loadu_ps(strips[0].1.as_ptr().add(g * W + 8)),
                _mm256_loadu_ps(strips[1].1.as_ptr().add(g * W)),
                _mm256_loadu_ps(strips[1].1.as_ptr().add(g * W + 8)),
            ];
            while kk < ((g + 1) * group).min(k) {
                let av = _mm256_broadcast_ss(a.get_unchecked(kk));
                c[0] = _mm256_fmadd_ps(av, dequant(q0.add(kk * W), s[0]), c[0]);
                c[1] = _mm256_fmadd_ps(av, dequant(q0.add(kk * W + 8), s[1]), c[1]);
                c[2] = _mm256_fmadd_ps(av, dequant(q1.add(kk * W), s[2]), c[2]);
                c[3] = _mm256_fmadd_ps(av, dequant(q1.add(kk * W + 8), s[3]), c[3]);
                kk += 1;
            }
        }
        for q in 0..2 {
            _mm256_storeu_ps(acc[q].as_mut_ptr(), c[2 * q]);
            _mm256_storeu_ps(acc[q].as_mut_ptr().add(8), c[2 * q + 1]);
        }
    }
}
