//! A matrix product whose every output row is computed the same way whatever the other rows
//! are: element (i, j) is an `fma` chain over k = 0, 1, …, K−1 in that order, from 0, in every
//! tile shape and thread split. A request's tokens then come out bit-identical alone or inside
//! any batch (batch invariance), which general gemm kernels do not promise (their blocking and
//! split of the inner dimension may depend on the matrix sizes).
//!
//! The right operand is packed once (`Packed`): columns in strips of 16, each strip's `k × 16`
//! values contiguous, so a strip streams from memory once and stays in cache while every
//! group of rows uses it. Tiles: with 512-bit registers 8 rows × 32 columns first (as many as
//! the rows allow: 8 concurrent decodes read each weight once), then 6 rows × 16 columns (12
//! vector accumulators: 12 FMAs for 2 loads of the strip and 6 broadcasts; with 256-bit
//! registers 5 × 16 tiles share the rows where 6a + 5b covers them), then 4 × 16, and for
//! the last rows (a single decode row, say) 1 row × 64 columns — enough independent FMA chains
//! to hide their latency.

use super::rowwise_int4::{matmul_rows_int4, Int4};
use super::rowwise_int8::{matmul_rows_int8, Int8};
use super::{store_strip as store, tile_and_store, wide, RowTiles, SendPtr, Upcoming, STRIP as W};
use crate::pages::Pages;
use rayon::prelude::*;

/// Strips per task (and per one-row tile).
const GROUP: usize = 4;

/// `w[k, n]` (row-major) packed for `matmul_rows`: in f32, or quantized to 8 bits.
pub struct Packed {
    pub k: usize,
    pub n: usize,
    /// `[strip][k][16]`, the last strip zero-padded (empty once quantized).
    data: Pages<f32>,
    int8: Option<Int8>,
    int4: Option<Int4>,
}

impl Packed {
    pub fn new(w: &[f32], k: usize, n: usize) -> Packed {
        assert_eq!(w.len(), k * n);
        let strips = n.div_ceil(W);
        let mut data = Pages::<f32>::zeroed(strips * k * W);
        for s in 0..strips {
            let width = W.min(n - s * W);
            for kk in 0..k {
                data[(s * k + kk) * W..(s * k + kk) * W + width]
                    .copy_from_slice(&w[kk * n + s * W..kk * n + s * W + width]);
            }
        }
        Packed { k, n, data, int8: None, int4: None }
    }

    /// From the transpose of a row-major `[n, k]` matrix (a tied embedding as the LM head),
    /// packed straight from it: strip s reads its 16 rows of `wt` side by side.
    pub fn from_transposed(wt: &[f32], n: usize, k: usize) -> Packed {
        assert_eq!(wt.len(), k * n);
        let strips = n.div_ceil(W);
        let mut data = Pages::<f32>::zeroed(strips * k * W);
        data.par_chunks_mut(k * W).enumerate().for_each(|(s, strip)| {
            let width = W.min(n - s * W);
            for t in 0..width {
                let row = &wt[(s * W + t) * k..(s * W + t + 1) * k];
                for (kk, &v) in row.iter().enumerate() {
                    strip[kk * W + t] = v;
                }
            }
        });
        Packed { k, n, data, int8: None, int4: None }
    }

    /// The same matrix in 8 bits (`rowwise_int8`): a scale per column and per `group` rows of
    /// k (`group` ≥ k: one per column).
    pub fn quantized_int8(self, group: usize) -> Packed {
        let int8 = Int8::from_strips(&self.data, self.k, self.n, group.min(self.k).max(1));
        Packed { k: self.k, n: self.n, data: Pages::default(), int8: Some(int8), int4: None }
    }

    /// The same matrix in 4 bits (`rowwise_int4`, llama.cpp's Q4_0): a scale per column and
    /// per 32 rows of k.
    pub fn quantized_int4(self) -> Packed {
        let int4 = Int4::from_strips(&self.data, self.k, self.n);
        Packed { k: self.k, n: self.n, data: Pages::default(), int8: None, int4: Some(int4) }
    }

    /// A file's block-quantized rows kept as stored (row `j` of `rows` is output column `j`):
    /// the 4-bit kernel for 4-bit rows in groups of 32, the 8-bit kernel (with the rows'
    /// groups) for the others. The product computes exactly what the f32 kernel computes on
    /// `rows.dequantized()`.
    pub fn from_quant_rows(rows: &super::quant_rows::QuantRows) -> Packed {
        let (k, n) = (rows.k, rows.rows);
        if rows.bits == 4 && rows.group == super::rowwise_int4::GROUP {
            return Packed { k, n, data: Pages::default(), int8: None, int4: Some(Int4::from_quant_rows(rows)) };
        }
        Packed { k, n, data: Pages::default(), int8: Some(Int8::from_quant_rows(rows)), int4: None }
    }

    /// The matrix `[k, n]` (row-major) the product computes with: the values, or the quantized
    /// ones dequantized.
    pub fn dequantized(&self) -> Vec<f32> {
        match (&self.int8, &self.int4) {
            (Some(q), _) => q.dequantized(),
            (_, Some(q)) => q.dequantized(),
            _ => {
                let (k, n) = (self.k, self.n);
                let mut out = vec![0f32; k * n];
                for j in 0..n {
                    for kk in 0..k {
                        out[kk * n + j] = self.data[((j / W) * k + kk) * W + j % W];
                    }
                }
                out
            }
        }
    }

    /// Bytes the product reads of the weights.
    pub fn bytes(&self) -> usize {
        match (&self.int8, &self.int4) {
            (Some(q), _) => q.bytes(),
            (_, Some(q)) => q.bytes(),
            _ => 4 * self.data.len(),
        }
    }

    fn strip(&self, s: usize) -> &[f32] {
        &self.data[s * self.k * W..(s + 1) * self.k * W]
    }
}

/// The f32 strips of a packed (unquantized) matrix, for the quantized kernels' tests.
#[cfg(test)]
pub(crate) fn tests_strips(p: &Packed) -> Vec<f32> {
    p.data.to_vec()
}

/// `c[m, n] = a[m, k] · w` (overwritten).
pub fn matmul_rows(c: &mut [f32], a: &[f32], w: &Packed, m: usize) {
    if let Some(q) = &w.int8 {
        return matmul_rows_int8(c, a, q, m);
    }
    if let Some(q) = &w.int4 {
        return matmul_rows_int4(c, a, q, m);
    }
    let (k, n) = (w.k, w.n);
    assert!(a.len() == m * k && c.len() == m * n);
    let strips = n.div_ceil(W);
    let cp = SendPtr(c.as_mut_ptr());
    (0..strips.div_ceil(GROUP)).into_par_iter().for_each(|g| {
        let s0 = g * GROUP;
        let s1 = (s0 + GROUP).min(strips);
        let mut i = 0;
        // with 512-bit registers, 8 rows × two strips first (16 accumulators); one fewer when
        // 2 or 3 rows would be left, which then go as 6 + 4 (+ 1) rows instead of singles
        let mut eights = 0;
        if wide() {
            eights = m / 8;
            if eights > 0 && matches!(m % 8, 2 | 3) {
                eights -= 1;
            }
        }
        // every tile, the 8-row ones included, asks for its share of the next task's strips
        // where the tiles are few (see below)
        let tiles = RowTiles::over(m - 8 * eights, false);
        let all = eights + tiles.len();
        let ask = all <= ASKING_TILES && (!wide() || 2 * GROUP * k * W * 4 <= WIDE_ASKING_BYTES);
        for j in 0..eights {
            rows_by_strip_pairs(cp, a, w, i, s0..s1, (ask, j, all));
            i += 8;
        }
        // 6 rows × one strip at a time (12 vector accumulators), then 5, then 4, then single
        // rows, as `RowTiles` counts them: tile by tile over the task's strips (which stay in
        // cache for every tile after the first), every tile asking for its share of the next
        // task's strips (the memory that follows), so that the next task's tiles do not wait on
        // memory — where the tiles are few (a decode step's rows: up to `ASKING_TILES`); many
        // tiles (a prompt, a batch of documents) leave the first tile's wait small, and asking
        // cost all-MiniLM-L6-v2's batches 2.5%. The first tile asks too: with one or two tiles
        // (4 to 11 rows) the asking otherwise came too late or never (8 rows 1.5×, 4 rows 1.1×
        // in `bench matmul`'s rows, gpt2-small's 8-concurrent decode 1.115×)
        for (j, r) in tiles.heights().enumerate() {
            for s in s0..s1 {
                let up = if ask && s + GROUP < strips {
                    Upcoming::part(w.strip(s + GROUP), eights + j, all, k)
                } else {
                    Upcoming::NONE
                };
                tile_and_store(cp, (i, r), s, n, |acc| tile_rows_of(acc, &a[i * k..(i + r) * k], k, w.strip(s), up));
            }
            i += r;
        }
        // the remaining rows one at a time × up to four strips
        while i < m {
            let mut acc = [[0f32; W]; GROUP];
            let ar = &a[i * k..(i + 1) * k];
            let ws: [&[f32]; GROUP] = std::array::from_fn(|q| w.strip((s0 + q).min(s1 - 1)));
            tile_1x64(&mut acc, ar, ws);
            for (q, s) in (s0..s1).enumerate() {
                store(cp, i * n, s, n, &acc[q]);
            }
            i += 1;
        }
    });
}

/// Tiles of rows up to which a row-invariant product's tiles ask for the next task's strips
/// (see `matmul_rows`): 32 rows are 6 tiles, 48 rows 8. Measured on an AMD EPYC (Zen 2), with
/// every tile count asking: gpt2-small's 32-concurrent decode 1.076×, all-MiniLM-L6-v2's
/// batches of 2048 tokens 0.975×.
const ASKING_TILES: usize = 8;

/// The most bytes of strips, this task's and the next one's together, at which the 512-bit
/// tiles ask: past it the next task's strips push this task's out of a 1 MiB L2 before its
/// later tiles read them.
const WIDE_ASKING_BYTES: usize = 1 << 20;

/// Rows `i..i + 8` in the columns of strips `ss`, two strips at a time (512-bit tiles only);
/// `(ask, j, tiles)`: whether this product's tiles ask for the next task's strips, and this
/// tile's place among them (its share of what they ask for).
fn rows_by_strip_pairs(
    cp: SendPtr,
    a: &[f32],
    w: &Packed,
    i: usize,
    ss: std::ops::Range<usize>,
    (ask, j, tiles): (bool, usize, usize),
) {
    let (k, n) = (w.k, w.n);
    let strips = n.div_ceil(W);
    let a = &a[i * k..(i + 8) * k];
    for s in ss.clone().step_by(2) {
        if s + 1 < ss.end {
            let mut acc = [[[0f32; W]; 8]; 2];
            // the next task's two strips in these columns (adjacent in memory)
            let next = s + GROUP..(s + GROUP + 2).min(strips);
            let up = match ask && !next.is_empty() {
                true => Upcoming::part(&w.data[next.start * k * W..next.end * k * W], j, tiles, k),
                false => Upcoming::NONE,
            };
            // SAFETY: only called when `wide()` (AVX-512F); the slices hold 8 rows and 2 strips.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                match up.asks() {
                    true => simd::tile_8x32_avx512::<true>(&mut acc, a, k, [w.strip(s), w.strip(s + 1)], up),
                    false => simd::tile_8x32_avx512::<false>(&mut acc, a, k, [w.strip(s), w.strip(s + 1)], up),
                }
            };
            for (q, accq) in acc.iter().enumerate() {
                for (r, accr) in accq.iter().enumerate() {
                    store(cp, (i + r) * n, s + q, n, accr);
                }
            }
        } else {
            let mut acc = [[0f32; W]; 8];
            tile_rows(&mut acc, a, k, w.strip(s), Upcoming::NONE);
            for (r, accr) in acc.iter().enumerate() {
                store(cp, (i + r) * n, s, n, accr);
            }
        }
    }
}

/// `tile_rows` for the 4, 5 or 6 rows `acc` has (also the quantized products' tiles over a
/// strip they dequantized).
pub(crate) fn tile_rows_of(acc: &mut [[f32; W]], a: &[f32], k: usize, strip: &[f32], up: Upcoming) {
    match acc.len() {
        4 => tile_rows::<4>(acc.try_into().expect("4 rows"), a, k, strip, up),
        5 => tile_rows::<5>(acc.try_into().expect("5 rows"), a, k, strip, up),
        6 => tile_rows::<6>(acc.try_into().expect("6 rows"), a, k, strip, up),
        r => unreachable!("{r}-row tiles are not made"),
    }
}

/// `acc[r][t] = Σ_k a[r, k]·strip[k, t]` for R rows, each an fma chain over k in order (asking
/// for `up`'s lines as it goes, on 256-bit registers).
fn tile_rows<const R: usize>(acc: &mut [[f32; W]; R], a: &[f32], k: usize, strip: &[f32], up: Upcoming) {
    assert!(a.len() == R * k && strip.len() == k * W);
    #[cfg(target_arch = "x86_64")]
    if wide() {
        // SAFETY: the CPU has AVX-512F (checked); the slices' lengths are checked above.
        return unsafe {
            match up.asks() {
                true => simd::tile_rows_avx512::<R, true>(acc, a, k, strip, up),
                false => simd::tile_rows_avx512::<R, false>(acc, a, k, strip, up),
            }
        };
    }
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("fma") && is_x86_feature_detected!("avx") {
        // SAFETY: the CPU has AVX and FMA (checked); the slices' lengths are checked above.
        // (a tile that asks for nothing runs a loop without the asking's step)
        return unsafe {
            match up.asks() {
                true => simd::tile_rows::<R, true>(acc, a, k, strip, up),
                false => simd::tile_rows::<R, false>(acc, a, k, strip, up),
            }
        };
    }
    for kk in 0..k {
        for (r, accr) in acc.iter_mut().enumerate() {
            let av = a[r * k + kk];
            for t in 0..W {
                accr[t] = av.mul_add(strip[kk * W + t], accr[t]);
            }
        }
    }
}

/// `acc[q][t] = Σ_k a[k]·strips[q][k, t]` for one row and four strips.
fn tile_1x64(acc: &mut [[f32; W]; GROUP], a: &[f32], strips: [&[f32]; GROUP]) {
    let k = a.len();
    assert!(strips.iter().all(|s| s.len() == k * W));
    #[cfg(target_arch = "x86_64")]
    if wide() {
        // SAFETY: as above, with AVX-512F.
        return unsafe { simd::tile_1x64_avx512(acc, a, strips) };
    }
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("fma") && is_x86_feature_detected!("avx") {
        // SAFETY: as above.
        return unsafe { simd::tile_1x64(acc, a, strips) };
    }
    for (kk, &av) in a.iter().enumerate() {
        for q in 0..GROUP {
            for t in 0..W {
                acc[q][t] = av.mul_add(strips[q][kk * W + t], acc[q][t]);
            }
        }
    }
}

/// The tiles with AVX/FMA intrinsics: the accumulators in 8 ymm registers. Each lane does the
/// same fused multiply-add chain as the portable loops, so results are bit-identical to them.
/// Where the build already has AVX and FMA (this workspace's `target-cpu=x86-64-v3`), the
/// 256-bit tiles are inlined into their callers by attribute rather than left to the inliner,
/// whose choice moved with unrelated code elsewhere in the crate: a new function in
/// `tensor::math` took the f32 tile out of line and gpt2-small's 32-concurrent decode went
/// from 456 to 443 tokens/s; inlined, 465. The int8 and int4 tiles are held the same way.
#[cfg(target_arch = "x86_64")]
mod simd {
    use super::super::lanes::{ahead, Asker};
    use super::super::Upcoming;
    use super::{GROUP, W};
    use std::arch::x86_64::*;

    /// R rows × 16 columns: 2R accumulators (R = 6: 12 of the 16 ymm registers); `ASK`: asking
    /// for `up`'s lines as it goes.
    #[cfg_attr(all(target_feature = "avx", target_feature = "fma"), inline(always))]
    #[cfg_attr(not(all(target_feature = "avx", target_feature = "fma")), target_feature(enable = "avx,fma"))]
    pub unsafe fn tile_rows<const R: usize, const ASK: bool>(
        acc: &mut [[f32; W]; R],
        a: &[f32],
        k: usize,
        strip: &[f32],
        up: Upcoming,
    ) {
        let mut c = [[_mm256_setzero_ps(); 2]; R];
        let (ap, wp) = (a.as_ptr(), strip.as_ptr());
        let mut asker = Asker::new(up);
        for kk in 0..k {
            ahead(wp, kk * W);
            if ASK {
                asker.step();
            }
            let w0 = _mm256_loadu_ps(wp.add(kk * W));
            let w1 = _mm256_loadu_ps(wp.add(kk * W + 8));
            for (r, cr) in c.iter_mut().enumerate() {
                let av = _mm256_broadcast_ss(&*ap.add(r * k + kk));
                cr[0] = _mm256_fmadd_ps(av, w0, cr[0]);
                cr[1] = _mm256_fmadd_ps(av, w1, cr[1]);
            }
        }
        for (accr, cr) in acc.iter_mut().zip(&c) {
            _mm256_storeu_ps(accr.as_mut_ptr(), cr[0]);
            _mm256_storeu_ps(accr.as_mut_ptr().add(8), cr[1]);
        }
    }

    /// R rows × 16 columns in R 512-bit accumulators, the broadcast of a[r, k] folded into
    /// each FMA; `ASK`: asking for `up`'s lines as it goes.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn tile_rows_avx512<const R: usize, const ASK: bool>(
        acc: &mut [[f32; W]; R],
        a: &[f32],
        k: usize,
        strip: &[f32],
        up: Upcoming,
    ) {
        let mut c = [_mm512_setzero_ps(); R];
        let (ap, wp) = (a.as_ptr(), strip.as_ptr());
        let mut asker = Asker::new(up);
        for kk in 0..k {
            ahead(wp, kk * W);
            if ASK {
                asker.step();
            }
            let w = _mm512_loadu_ps(wp.add(kk * W));
            for (r, cr) in c.iter_mut().enumerate() {
                *cr = _mm512_fmadd_ps(_mm512_set1_ps(*ap.add(r * k + kk)), w, *cr);
            }
        }
        for (accr, cr) in acc.iter_mut().zip(&c) {
            _mm512_storeu_ps(accr.as_mut_ptr(), *cr);
        }
    }

    /// 8 rows × two strips: 16 accumulators, each broadcast of a[r, k] used twice; `ASK`:
    /// asking for `up`'s lines as it goes.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn tile_8x32_avx512<const ASK: bool>(
        acc: &mut [[[f32; W]; 8]; 2],
        a: &[f32],
        k: usize,
        strips: [&[f32]; 2],
        up: Upcoming,
    ) {
        assert!(a.len() == 8 * k && strips[0].len() == k * W && strips[1].len() == k * W);
        // c[r] = (strip 0, strip 1) of row r
        let mut c = [[_mm512_setzero_ps(); 2]; 8];
        let (ap, w0p, w1p) = (a.as_ptr(), strips[0].as_ptr(), strips[1].as_ptr());
        let mut asker = Asker::new(up);
        for kk in 0..k {
            ahead(w0p, kk * W);
            ahead(w1p, kk * W);
            if ASK {
                asker.step();
            }
            let w0 = _mm512_loadu_ps(w0p.add(kk * W));
            let w1 = _mm512_loadu_ps(w1p.add(kk * W));
            for (r, cr) in c.iter_mut().enumerate() {
                let av = _mm512_set1_ps(*ap.add(r * k + kk));
                cr[0] = _mm512_fmadd_ps(av, w0, cr[0]);
                cr[1] = _mm512_fmadd_ps(av, w1, cr[1]);
            }
        }
        for (r, cr) in c.iter().enumerate() {
            _mm512_storeu_ps(acc[0][r].as_mut_ptr(), cr[0]);
            _mm512_storeu_ps(acc[1][r].as_mut_ptr(), cr[1]);
        }
    }

    #[target_feature(enable = "avx512f")]
    pub unsafe fn tile_1x64_avx512(acc: &mut [[f32; W]; GROUP], a: &[f32], strips: [&[f32]; GROUP]) {
        let mut c = [_mm512_setzero_ps(); GROUP];
        let p: [*const f32; GROUP] = std::array::from_fn(|q| strips[q].as_ptr());
        for (kk, av) in a.iter().enumerate() {
            let av = _mm512_set1_ps(*av);
            for q in 0..GROUP {
                c[q] = _mm512_fmadd_ps(av, _mm512_loadu_ps(p[q].add(kk * W)), c[q]);
            }
        }
        for q in 0..GROUP {
            _mm512_storeu_ps(acc[q].as_mut_ptr(), c[q]);
        }
    }

    #[cfg_attr(all(target_feature = "avx", target_feature = "fma"), inline(always))]
    #[cfg_attr(not(all(target_feature = "avx", target_feature = "fma")), target_feature(enable = "avx,fma"))]
    pub unsafe fn tile_1x64(acc: &mut [[f32; W]; GROUP], a: &[f32], strips: [&[f32]; GROUP]) {
        let mut c = [_mm256_setzero_ps(); 8];
        let p: [*const f32; GROUP] = std::array::from_fn(|q| strips[q].as_ptr());
        for (kk, av) in a.iter().enumerate() {
            let av = _mm256_broadcast_ss(av);
            for q in 0..GROUP {
                c[2 * q] = _mm256_fmadd_ps(av, _mm256_loadu_ps(p[q].add(kk * W)), c[2 * q]);
                c[2 * q + 1] = _mm256_fmadd_ps(av, _mm256_loadu_ps(p[q].add(kk * W + 8)), c[2 * q + 1]);
            }
        }
        for q in 0..GROUP {
            _mm256_storeu_ps(acc[q].as_mut_ptr(), c[2 * q]);
            _mm256_storeu_ps(acc[q].as_mut_ptr().add(8), c[2 * q + 1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn every_row_is_bitwise_the_same_alone_or_in_any_batch() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        for &(k, n) in &[(7, 5), (64, 48), (33, 100), (16, 200)] {
            let wv: Vec<f32> = (0..k * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let w = Packed::new(&wv, k, n);
            let a: Vec<f32> = (0..40 * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let alone: Vec<Vec<f32>> = (0..40)
                .map(|i| {
                    let mut c = vec![0f32; n];
                    matmul_rows(&mut c, &a[i * k..(i + 1) * k], &w, 1);
                    c
                })
                .collect();
            // alone, each element is the scalar fma chain over k in order, bit for bit
            for (i, row) in alone.iter().enumerate() {
                for j in 0..n {
                    let chain = (0..k).fold(0f32, |acc, kk| a[i * k + kk].mul_add(wv[kk * n + j], acc));
                    assert_eq!(row[j].to_bits(), chain.to_bits(), "k {k} n {n}: ({i}, {j})");
                }
            }
            // every tiling of m rows (8-row tiles where AVX-512 runs, 6-, 4-row tiles and single
            // rows in their mixes)
            for m in [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 17, 24, 25, 32, 37, 40] {
                let mut c = vec![0f32; m * n];
                matmul_rows(&mut c, &a[..m * k], &w, m);
                for i in 0..m {
                    let same = c[i * n..(i + 1) * n].iter().zip(&alone[i]).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "k {k} n {n}: row {i} of {m} differs from alone");
                }
            }
            for i in 0..40 {
                for j in 0..n {
                    let want: f64 = (0..k).map(|kk| a[i * k + kk] as f64 * wv[kk * n + j] as f64).sum();
                    assert!((alone[i][j] as f64 - want).abs() < 1e-4, "({i}, {j})");
                }
            }
            // the transposed constructor packs the same matrix
            let mut wt = vec![0f32; n * k];
            for j in 0..n {
                for kk in 0..k {
                    wt[j * k + kk] = wv[kk * n + j];
                }
            }
            assert_eq!(Packed::from_transposed(&wt, n, k).data[..], w.data[..]);
        }
    }

    /// 4-bit weights: every row, alone or in any batch, is bit for bit the f32 kernel's
    /// product with the dequantized matrix, which is within a step of the original (a step:
    /// the group's largest magnitude / 8; half a step but at the end opposite the largest
    /// value, where Q4_0's 16 levels stop at 7 steps).
    #[test]
    fn int4_rows_are_the_f32_kernel_on_the_dequantized_matrix() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for &(k, n) in &[(7, 5), (64, 48), (70, 100), (33, 40), (96, 17), (128, 64)] {
            let wv: Vec<f32> = (0..k * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let q = Packed::new(&wv, k, n).quantized_int4();
            let deq = q.int4.as_ref().unwrap().dequantized();
            for (j, (d, w)) in deq.iter().zip(&wv).enumerate() {
                // |w| < 1: a step is at most 1/8 (and the f16 scale's rounding a little more)
                assert!((d - w).abs() <= 1.0 / 8.0 * 1.01 + 1e-6, "k {k} n {n}: element {j}: {d} vs {w}");
            }
            let reference = Packed::new(&deq, k, n);
            let a: Vec<f32> = (0..37 * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let mut want = vec![0f32; n];
            // 8-row tiles where AVX-512 runs; 6-, 5- and 4-row tiles and single rows in their mixes
            for m in [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 16, 17, 23, 25, 32, 37] {
                let mut c = vec![0f32; m * n];
                matmul_rows(&mut c, &a[..m * k], &q, m);
                for i in 0..m {
                    matmul_rows(&mut want, &a[i * k..(i + 1) * k], &reference, 1);
                    let same = c[i * n..(i + 1) * n].iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "k {k} n {n}: row {i} of {m}");
                }
            }
            assert_eq!(q.bytes(), n.div_ceil(16) * (8 * k + 64 * k.div_ceil(32)));
        }
    }

    /// 8-bit weights: every row, alone or in any batch, is bit for bit the f32 kernel's
    /// product with the dequantized matrix; and the dequantized matrix is within half a step
    /// of the original.
    #[test]
    fn int8_rows_are_the_f32_kernel_on_the_dequantized_matrix() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
        for &(k, n, group) in &[(7, 5, 32), (64, 48, 32), (70, 100, 32), (33, 40, 33), (96, 17, 16)] {
            let wv: Vec<f32> = (0..k * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let q = Packed::new(&wv, k, n).quantized_int8(group);
            let deq = q.int8.as_ref().unwrap().dequantized();
            for (j, (d, w)) in deq.iter().zip(&wv).enumerate() {
                // the scale of a group is at most 1/127 here (|w| < 1)
                assert!((d - w).abs() <= 0.5 / 127.0 + 1e-6, "k {k} n {n}: element {j}: {d} vs {w}");
            }
            assert!(deq.iter().zip(&wv).any(|(d, w)| d != w), "quantized at all");
            let reference = Packed::new(&deq, k, n);
            let a: Vec<f32> = (0..37 * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let mut want = vec![0f32; n];
            // 8-row tiles where AVX-512 runs; 6-, 5- and 4-row tiles and single rows in their mixes
            for m in [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 16, 17, 23, 25, 32, 37] {
                let mut c = vec![0f32; m * n];
                matmul_rows(&mut c, &a[..m * k], &q, m);
                for i in 0..m {
                    matmul_rows(&mut want, &a[i * k..(i + 1) * k], &reference, 1);
                    let same = c[i * n..(i + 1) * n].iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "k {k} n {n} group {group}: row {i} of {m}");
                }
            }
            assert_eq!(q.bytes(), n.div_ceil(16) * 16 * (k + 4 * k.div_ceil(group.min(k))));
        }
    }
}
