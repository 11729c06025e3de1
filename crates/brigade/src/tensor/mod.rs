//! f32 kernels on flat row-major buffers, each with its forward and its backward.
//!
//! Layers call these functions and never loop over buffers themselves, so another device
//! (CUDA, with cuBLAS for `matmul`) can provide the same set without touching `nn/`.

pub mod attention;
pub mod blockwise;
pub mod docs;
pub mod elementwise;
pub mod embedding;
pub mod encoder;
pub mod layernorm;
pub mod loss;
pub mod mat;
pub mod math;
pub mod matmul;
pub mod quant_rows;
pub mod rmsnorm;
pub mod rope;
pub mod rowwise;
pub mod rowwise_int4;
pub mod rowwise_int8;
pub mod sgemm;

pub use matmul::{gemm_into, matmul, matmul_on, Backend, Mat, Threads};

/// Rows handled per rayon task in row-parallel kernels. Fixed (not derived from the thread
/// count) so that reductions over rows add in the same order whatever `--threads` is.
pub const ROW_CHUNK: usize = 16;

/// A raw pointer that may cross threads; used where parallel tasks write disjoint,
/// strided regions of one buffer that slices cannot express.
#[derive(Clone, Copy)]
pub(crate) struct SendPtr(pub *mut f32);
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// Through a method, so closures capture the whole (Sync) wrapper, not the raw field.
    pub(crate) fn at(self, offset: usize) -> *mut f32 {
        self.0.wrapping_add(offset)
    }
}

/// Columns in a strip of the row-invariant kernels (`rowwise`, `rowwise_int8`).
pub(crate) const STRIP: usize = 16;

/// Writes strip `s`'s columns of the row starting at `row0` of a `[_, n]` output (the strip's
/// padding past `n` is not written): the row-invariant kernels' one store.
pub(crate) fn store_strip(c: SendPtr, row0: usize, s: usize, n: usize, acc: &[f32; STRIP]) {
    let width = STRIP.min(n - s * STRIP);
    // SAFETY: each task writes the columns of its own strips only, in rows below m; tasks'
    // strips are disjoint and `c` outlives the parallel loop.
    let dst = unsafe { std::slice::from_raw_parts_mut(c.at(row0 + s * STRIP), width) };
    dst.copy_from_slice(&acc[..width]);
}

/// Cache lines of the strip a product reads next, asked for one every `every` steps of k by
/// each tile, a share each: a product of many rows reads each strip from memory in its first
/// tile and from cache in the others, so without this the first tile waits on memory while
/// the others leave it idle (in gpt2-small's 32-row decode products, the first of six passes
/// over a strip took as long as three of the others).
/// Only hints: they never fault, and change no result.
#[derive(Clone, Copy)]
pub(crate) struct Upcoming {
    start: *const u8,
    lines: usize,
    every: usize,
}

impl Upcoming {
    pub(crate) const NONE: Upcoming = Upcoming { start: std::ptr::null(), lines: 0, every: 1 };

    /// Whether there is anything to ask for.
    pub(crate) fn asks(self) -> bool {
        self.lines > 0
    }

    /// Part `part` of `parts` of `next`'s cache lines, spread over a tile's `k` steps.
    pub(crate) fn part<T>(next: &[T], part: usize, parts: usize, k: usize) -> Upcoming {
        let total = std::mem::size_of_val(next).div_ceil(64);
        let per = total.div_ceil(parts.max(1));
        let first = (part * per).min(total);
        let lines = per.min(total - first);
        let start = next.as_ptr().cast::<u8>().wrapping_add(64 * first);
        Upcoming { start, lines, every: (k / lines.max(1)).max(1) }
    }
}

/// Strips a task of the quantized products takes (and a one-row tile's width).
pub(crate) const TASK: usize = 4;

/// The tiles of 6, 5 and 4 rows the row-invariant kernels run over `left` rows, in that
/// order, before their single rows. With 256-bit tiles, rows that are 6a + 5b (0 < b ≤ 5: any
/// count from 25 up) run as a sixes and b fives — 10 accumulators hide the FMA's latency, a
/// 4-row tile's 8 do not; otherwise one 6-row tile fewer when that leaves rows for two 4-row
/// tiles instead of single rows.
#[derive(Clone, Copy)]
pub(crate) struct RowTiles {
    sixes: usize,
    fives: usize,
    fours: usize,
}

impl RowTiles {
    /// Over `left` rows; `fours_only`: 4-row tiles alone (the quantized products' 512-bit path).
    pub(crate) fn over(left: usize, fours_only: bool) -> RowTiles {
        if fours_only {
            return RowTiles { sixes: 0, fives: 0, fours: left / 4 };
        }
        let fives = match (6 - left % 6) % 6 {
            b if !wide() && left >= 5 * b => b,
            _ => 0,
        };
        let mut sixes = (left - 5 * fives) / 6;
        if fives == 0 && sixes > 0 && matches!(left % 6, 2 | 3) {
            sixes -= 1;
        }
        RowTiles { sixes, fives, fours: (left - 6 * sixes - 5 * fives) / 4 }
    }

    pub(crate) fn len(self) -> usize {
        self.sixes + self.fives + self.fours
    }

    /// The rows the tiles cover.
    pub(crate) fn rows(self) -> usize {
        6 * self.sixes + 5 * self.fives + 4 * self.fours
    }

    /// Each tile's rows, in order.
    pub(crate) fn heights(self) -> impl Iterator<Item = usize> + Clone {
        let sixes_fives = std::iter::repeat_n(6, self.sixes).chain(std::iter::repeat_n(5, self.fives));
        sixes_fives.chain(std::iter::repeat_n(4, self.fours))
    }
}

/// Runs `tile` on the accumulators of `r` rows (at most 6) and stores them as rows
/// `r0..r0 + r` of strip `s` of a `[_, n]` output.
pub(crate) fn tile_and_store(
    c: SendPtr,
    (r0, r): (usize, usize),
    s: usize,
    n: usize,
    tile: impl FnOnce(&mut [[f32; STRIP]]),
) {
    let mut acc = [[0f32; STRIP]; 6];
    tile(&mut acc[..r]);
    for (q, accr) in acc[..r].iter().enumerate() {
        store_strip(c, (r0 + q) * n, s, n, accr);
    }
}

/// Rows from which a quantized product with 256-bit tiles dequantizes each strip once into f32
/// and runs the f32 kernel's tiles over it, instead of dequantizing the strip in registers in
/// every tile: two 6-row tiles and up (below, the in-register tiles are as fast).
pub(crate) const DEQUANTIZE_ONCE_ROWS: usize = 12;

/// A quantized product `c[m, n] = a[m, k] · w` (overwritten), tasks of `TASK` strips in
/// parallel. With 512-bit registers: 8-row × two-strip tiles first (`eight(acc, rows,
/// [s, s2])`, each dequantized weight vector feeding 8 FMAs), then 4-row tiles (`rows(acc,
/// rows, s)`, as many accumulator rows as rows given). With 256-bit ones, 6-, 5- and 4-row tiles
/// as [`RowTiles`] counts them: from [`DEQUANTIZE_ONCE_ROWS`] rows, each strip
/// dequantized once (`strip_f32(out, s)`: `out[kk · 16 + t]`, the weights every tile computes
/// with) and the f32 kernel's tiles run over it — the same fma chains on the same weights, so
/// the same bits, with the dequantization paid once a strip instead of once a tile; below, the
/// kernel's own tiles (`rows`). Then single rows × four strips (`one(acc, row, strips)`, the last
/// strip repeated to fill). Each tile is stored once. The kernels (`rowwise_int8`,
/// `rowwise_int4`) give the tiles.
pub(crate) fn quantized_product(
    c: &mut [f32],
    a: &[f32],
    (m, k, n): (usize, usize, usize),
    eight: impl Fn(&mut [[[f32; STRIP]; 8]; 2], &[f32], [usize; 2]) + Sync,
    rows: impl Fn(&mut [[f32; STRIP]], &[f32], usize) + Sync,
    strip_f32: impl Fn(&mut [f32], usize) + Sync,
    one: impl Fn(&mut [[f32; STRIP]; TASK], &[f32], [usize; TASK]) + Sync,
) {
    use rayon::prelude::*;
    assert!(a.len() == m * k && c.len() == m * n);
    let strips = n.div_ceil(STRIP);
    let cp = SendPtr(c.as_mut_ptr());
    (0..strips.div_ceil(TASK)).into_par_iter().for_each(|task| {
        let ss = task * TASK..((task + 1) * TASK).min(strips);
        let mut i = 0;
        if wide() {
            while i + 8 <= m {
                for s in ss.clone().step_by(2) {
                    let s2 = (s + 1).min(ss.end - 1);
                    let mut acc = [[[0f32; STRIP]; 8]; 2];
                    eight(&mut acc, &a[i * k..(i + 8) * k], [s, s2]);
                    for (q, st) in [s, s2].into_iter().enumerate().take(if s2 == s { 1 } else { 2 }) {
                        for (r, accr) in acc[q].iter().enumerate() {
                            store_strip(cp, (i + r) * n, st, n, accr);
                        }
                    }
                }
                i += 8;
            }
        }
        let tiles = RowTiles::over(m - i, wide());
        if !wide() && tiles.rows() >= DEQUANTIZE_ONCE_ROWS {
            // strip by strip: dequantized once, then every tile of rows over it (asking for the
            // next strip's stored values meanwhile, as the f32 kernel does, gained nothing: a
            // quarter or an eighth of the bytes)
            let mut weights = vec![0f32; k * STRIP];
            for s in ss.clone() {
                strip_f32(&mut weights, s);
                let mut r0 = i;
                for r in tiles.heights() {
                    tile_and_store(cp, (r0, r), s, n, |acc| {
                        rowwise::tile_rows_of(acc, &a[r0 * k..(r0 + r) * k], k, &weights, Upcoming::NONE)
                    });
                    r0 += r;
                }
            }
            i += tiles.rows();
        } else {
            for r in tiles.heights() {
                for s in ss.clone() {
                    tile_and_store(cp, (i, r), s, n, |acc| rows(acc, &a[i * k..(i + r) * k], s));
                }
                i += r;
            }
        }
        while i < m {
            let four_strips: [usize; TASK] = std::array::from_fn(|q| (ss.start + q).min(ss.end - 1));
            let mut acc = [[0f32; STRIP]; TASK];
            one(&mut acc, &a[i * k..(i + 1) * k], four_strips);
            for (q, s) in ss.clone().enumerate() {
                store_strip(cp, i * n, s, n, &acc[q]);
            }
            i += 1;
        }
    });
}

/// One row `a` times four strips, written out: `out[q][t] = Σ_kk a[kk] · weight(q, kk, t)` as
/// an `fma` chain over k in order (what every tile computes for a column).
#[cfg(test)]
pub(crate) fn tests_one_row(a: &[f32], weight: impl Fn(usize, usize, usize) -> f32) -> [[f32; STRIP]; TASK] {
    let mut out = [[0f32; STRIP]; TASK];
    for (q, accq) in out.iter_mut().enumerate() {
        for (kk, &av) in a.iter().enumerate() {
            for (t, x) in accq.iter_mut().enumerate() {
                *x = av.mul_add(weight(q, kk, t), *x);
            }
        }
    }
    out
}

/// The vector steps the quantized kernels share: a group's scales or minimums loaded, and
/// integers turned into weights (`q · s`, then `+ m` with minimums: two roundings, as the
/// files' reference dequantizes).
#[cfg(target_arch = "x86_64")]
pub(crate) mod lanes {
    use super::STRIP as W;
    use std::arch::x86_64::*;

    /// Bytes ahead of a tile's weight loads that `ahead` asks for.
    pub const AHEAD_BYTES: usize = 1536;

    /// Asks for the cache line `AHEAD_BYTES` past element `at` of a strip at `p`, so that it
    /// arrives from memory while the rows before it compute: left to the hardware's
    /// prefetcher, the batched tiles stalled on their weight loads (a decode's weights are
    /// read from memory once a step). Only a hint: it never faults, past the end included.
    #[inline(always)]
    pub unsafe fn ahead<T>(p: *const T, at: usize) {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(at).cast::<i8>().wrapping_add(AHEAD_BYTES));
    }

    /// Asks for `up`'s lines one every `up.every` calls (a tile calls it once a step of k).
    pub struct Asker {
        p: *const u8,
        left: usize,
        every: usize,
        wait: usize,
    }

    impl Asker {
        #[inline(always)]
        pub fn new(up: super::Upcoming) -> Asker {
            Asker { p: up.start, left: up.lines, every: up.every, wait: 0 }
        }

        #[inline(always)]
        pub unsafe fn step(&mut self) {
            if self.left > 0 {
                if self.wait == 0 {
                    _mm_prefetch::<_MM_HINT_T1>(self.p.cast::<i8>());
                    self.p = self.p.wrapping_add(64);
                    self.left -= 1;
                    self.wait = self.every;
                }
                self.wait -= 1;
            }
        }
    }

    /// The 16-wide scales (or minimums) of group `g`; zeros where a strip has none.
    #[inline(always)]
    pub unsafe fn group512(v: &[f32], g: usize) -> __m512 {
        if v.is_empty() {
            _mm512_setzero_ps()
        } else {
            _mm512_loadu_ps(v.as_ptr().add(g * W))
        }
    }

    /// Half `h` (8 lanes) of group `g`'s scales or minimums; zeros where a strip has none.
    #[inline(always)]
    pub unsafe fn group256(v: &[f32], g: usize, h: usize) -> __m256 {
        if v.is_empty() {
            _mm256_setzero_ps()
        } else {
            _mm256_loadu_ps(v.as_ptr().add(g * W + 8 * h))
        }
    }

    /// 16 integers to weights: times the scales, plus the minimums with them (`MIN`).
    #[inline(always)]
    pub unsafe fn scaled512<const MIN: bool>(v: __m512i, s: __m512, m: __m512) -> __m512 {
        let w = _mm512_mul_ps(_mm512_cvtepi32_ps(v), s);
        if MIN {
            _mm512_add_ps(w, m)
        } else {
            w
        }
    }

    /// 8 integers to weights, as `scaled512`.
    #[inline(always)]
    pub unsafe fn scaled256<const MIN: bool>(v: __m256i, s: __m256, m: __m256) -> __m256 {
        let w = _mm256_mul_ps(_mm256_cvtepi32_ps(v), s);
        if MIN {
            _mm256_add_ps(w, m)
        } else {
            w
        }
    }
}

/// Whether the 512-bit paths run: the machine has AVX-512F and `BRIGADE_SIMD` does not hold
/// brigade to AVX2.
pub(crate) fn wide() -> bool {
    #[cfg(target_arch = "x86_64")]
    return is_x86_feature_detected!("avx512f") && !simd_limited_to_avx2();
    #[allow(unreachable_code)]
    false
}

/// The instruction sets `BRIGADE_SIMD` allows: `avx2` holds every kernel to its AVX2 path
/// (brigade's matrix kernel on its 6 × 16 tile, never the `gemm` crate's AVX-512 one, the row
/// kernels' 256-bit paths), so that a machine with AVX-512 measures and tests what one without it runs;
/// unset or `auto`, the best the machine has. Read once.
pub fn simd_limited_to_avx2() -> bool {
    static LIMIT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| std::env::var("BRIGADE_SIMD").is_ok_and(|v| v == "avx2"))
}

/// The widest instruction set the kernels use here (`avx512`, `avx2`, or `scalar`), as
/// benchmarks report it.
pub fn simd_name() -> &'static str {
    if wide() {
        "avx512"
    } else if sgemm::runs_here() {
        "avx2"
    } else {
        "scalar"
    }
}

/// `BRIGADE_SIMD` and `BRIGADE_MATMUL` checked together (the binary does at start): a value
/// other than those understood, or the `gemm` crate (AVX-512 inside) asked for under `avx2`.
pub fn check_simd_env() -> Result<(), String> {
    let simd = std::env::var("BRIGADE_SIMD").ok();
    match simd.as_deref() {
        None | Some("") | Some("auto") | Some("avx2") => {}
        Some(v) => return Err(format!("BRIGADE_SIMD={v} is not understood; use auto (the default) or avx2")),
    }
    let matmul = std::env::var("BRIGADE_MATMUL").ok();
    match matmul.as_deref() {
        None | Some("") | Some("brigade") | Some("gemm-crate") => {}
        Some(v) => return Err(format!("BRIGADE_MATMUL={v} is not understood; use brigade or gemm-crate")),
    }
    if simd.as_deref() == Some("avx2") {
        if matmul.as_deref() == Some("gemm-crate") {
            return Err("BRIGADE_SIMD=avx2 runs brigade's own AVX2 matrix kernel; BRIGADE_MATMUL=gemm-crate would use AVX-512: unset one".into());
        }
        if !sgemm::runs_here() {
            return Err("BRIGADE_SIMD=avx2 needs a CPU with AVX2 and FMA; this one has neither".into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Upcoming;

    /// The parts of a next strip's lines cover every line once, in order, each part's asks
    /// spread so that all are made within a tile's k steps.
    #[test]
    fn upcoming_parts_cover_the_next_strip_once() {
        for (len, k) in [(768 * 16, 768), (896 * 16, 896), (10, 3), (0, 5), (16 * 7, 7), (4864 * 16, 4864)] {
            let v = vec![0f32; len];
            for parts in 1..=7 {
                let (mut lines, mut at) = (0, v.as_ptr().cast::<u8>());
                for part in 0..parts {
                    let u = Upcoming::part(&v, part, parts, k);
                    if u.lines > 0 {
                        assert_eq!(u.start, at, "len {len} part {part} of {parts}");
                    }
                    assert!(
                        u.every >= 1 && u.lines * u.every <= k,
                        "len {len} k {k}: {} lines every {}",
                        u.lines,
                        u.every
                    );
                    at = at.wrapping_add(64 * u.lines);
                    lines += u.lines;
                }
                assert_eq!(lines, (4 * len).div_ceil(64), "len {len}, {parts} parts");
            }
        }
    }
}
