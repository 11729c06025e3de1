//! brigade's own f32 matrix product for AVX2 + FMA machines (and their AVX-512 successors),
//! organised as BLIS does it (Van Zee & van de Geijn, "BLIS: A Framework for Rapidly
//! Instantiating BLAS Functionality"):
//!
//! ```text
//! for each NC-wide block of columns of c (jc)
//!   for each KC-deep block of the inner dimension (pc)       pack b's kc × nc block: L3
//!     for each MC-tall block of rows (ic)   [parallel tasks]  pack a's mc × kc block: L2
//!       for each 16-wide strip of that b block (jr)            a kc × 16 strip: L1
//!         for each 6-tall panel of that a block (ir)
//!           6 × 16 micro-kernel: 12 ymm accumulators, kc fused multiply-adds each
//! ```
//!
//! Where AVX-512 runs (and `BRIGADE_SIMD=avx2` does not hold it back) the same loops run a
//! 12 × 32 tile: 24 zmm accumulators, panels of 12 rows and strips of 32 columns.
//!
//! Packing turns any operand layout (row-major, transposed, strided) into the contiguous
//! panels the micro-kernel streams, so transposed operands run at the rate of plain ones.
//! Where c has more than one column block, a is packed once for all of them (up to 16 MiB a
//! thread; a taller a in slices of rows) instead of once a block: GPT-2's LM head has 50 such
//! blocks on the 12 × 32 tile.
//!
//! Every element of `c` is the same sum whatever the thread count and the row/column tiling:
//! for each kc block in order, an `fma` chain over that block from 0, added to what `c` held.
//! The block depth KC is a constant, so results do not depend on `--threads` either.

use super::mat::Mat;
use super::SendPtr;
use rayon::prelude::*;
use std::cell::RefCell;

pub const MR: usize = 6;
pub const NR: usize = 16;
const KC: usize = 256;
const MC: usize = 144;
const NC: usize = 4080;
/// The AVX-512 tile: rows of a panel, columns of a strip, and the column block (a multiple of
/// the strip; its packed b, 1 MiB, stays in L2 while each 12 KiB panel of a, in L1, meets
/// every strip). MC = 144 is a multiple of both tiles' rows; KC is the same for both, so both
/// give every element the same chain of sums, bit for bit. Measured on a 2-core AVX-512 Xeon,
/// 1 thread: the tile alone in L1 at 188 GFLOP/s (the 6 × 16 one 113), whole products at
/// 0.97× the gemm crate's median over `bench matmul`'s shapes, 1.2–1.35× on transposed ones.
const MR_WIDE: usize = 12;
const NR_WIDE: usize = 32;
const NC_WIDE: usize = 1024;
/// The most values of a packed once for every block of columns of a product (16 MiB a
/// thread); a taller a is multiplied in slices of rows (see `a_once`).
const A_ONCE: usize = 4 << 20;

/// A micro-kernel: `(kc, packed a panel, packed b strip, c, c's view, rows, cols, alpha, beta)`.
pub(crate) type Kernel = unsafe fn(usize, &[f32], &[f32], *mut f32, Mat, usize, usize, f32, bool);

/// Which tile the blocked product runs: 6 × 16 on ymm registers, or 12 × 32 on zmm ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tile {
    Avx2,
    Avx512,
}

impl Tile {
    /// The widest tile this machine runs (within `BRIGADE_SIMD`).
    pub(crate) fn here() -> Tile {
        if super::wide() {
            Tile::Avx512
        } else {
            Tile::Avx2
        }
    }

    fn dims(self) -> (usize, usize) {
        (self.rows(), self.cols())
    }

    /// Rows of the tile (of a's packed panels).
    pub(crate) const fn rows(self) -> usize {
        match self {
            Tile::Avx2 => MR,
            Tile::Avx512 => MR_WIDE,
        }
    }

    /// Columns of the tile (of b's packed strips).
    pub(crate) const fn cols(self) -> usize {
        match self {
            Tile::Avx2 => NR,
            Tile::Avx512 => NR_WIDE,
        }
    }

    /// The tile's micro-kernel. Panics for the wide tile where AVX-512 does not run, so that
    /// no caller can reach its instructions there.
    pub(crate) fn kernel(self) -> Kernel {
        match self {
            Tile::Avx2 => kernel,
            Tile::Avx512 => {
                #[cfg(target_arch = "x86_64")]
                assert!(is_x86_feature_detected!("avx512f"), "the 12 × 32 tile runs only where AVX-512 does");
                kernel_wide
            }
        }
    }
}

/// Whether this machine can run brigade's kernel: x86-64 with AVX2 and FMA (its tests run
/// wherever it can).
pub fn runs_here() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether matrix products use brigade's kernel by default here: wherever it runs, on its
/// 12 × 32 tile where AVX-512 does. Against the `gemm` crate's AVX-512 kernels on a 2-core
/// AVX-512 Xeon (alternated in one session): GPT-2-small's step at batch 8 in one go 0.99×, in
/// eight micro-batches of one sequence 1.05× (the crate packs every weight again for each
/// 256-row product and copies the transposed ones), pp = 2 1.07×, SmolLM2-135M's step on 2
/// threads 1.10×, embedding 1.00–1.03×. `BRIGADE_MATMUL=gemm-crate` still asks for the crate.
pub fn preferred() -> bool {
    runs_here()
}

/// A reusable 64-byte-aligned f32 buffer (packed panels): the micro-kernel loads b's strips
/// with aligned loads, so a strip must start on a 32-byte boundary (64 for the 12 × 32 tile).
#[derive(Default)]
pub(crate) struct Buf(Vec<f32>);

impl Buf {
    pub(crate) fn get(&mut self, len: usize) -> &mut [f32] {
        if self.0.len() < len + 16 {
            self.0 = vec![0f32; len + 16];
        }
        let off = self.0.as_ptr().align_offset(64).min(16);
        &mut self.0[off..off + len]
    }
}

thread_local! {
    static A_BUF: RefCell<Buf> = RefCell::default();
    static B_BUF: RefCell<Buf> = RefCell::default();
}

/// Runs `f` with this thread's buffer taken out of `slot` (a nested call on the same thread,
/// as rayon's work stealing can make, gets a fresh one instead of a double borrow).
fn with_buf<R>(slot: &'static std::thread::LocalKey<RefCell<Buf>>, f: impl FnOnce(&mut Buf) -> R) -> R {
    let mut buf = slot.with(|s| std::mem::take(&mut *s.borrow_mut()));
    let r = f(&mut buf);
    slot.with(|s| *s.borrow_mut() = buf);
    r
}

/// `c = beta·c + alpha·a·b` with `beta` = 1 when `accumulate`, else 0 (c is not read).
///
/// With several threads, c is cut into one block of columns (or of rows) per thread and each
/// thread runs the whole blocked product on its block alone: no barrier inside the product,
/// and each packs only the part of b (or a) its block reads.
///
/// # Safety
/// [`available`] must be true; `a` and `b` must be valid for reads over their views and `c`
/// for writes over its view, which no other thread touches during the call.
#[allow(clippy::too_many_arguments)]
pub unsafe fn sgemm(
    c: *mut f32,
    cm: Mat,
    a: *const f32,
    am: Mat,
    b: *const f32,
    bm: Mat,
    alpha: f32,
    accumulate: bool,
    threads: usize,
) {
    // SAFETY: as the caller's.
    unsafe { sgemm_tiled(Tile::here(), c, cm, a, am, b, bm, alpha, accumulate, threads) }
}

/// [`sgemm`] on a chosen tile (the AVX-512 one only where AVX-512 runs).
///
/// # Safety
/// As [`sgemm`].
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn sgemm_tiled(
    tile: Tile,
    c: *mut f32,
    cm: Mat,
    a: *const f32,
    am: Mat,
    b: *const f32,
    bm: Mat,
    alpha: f32,
    accumulate: bool,
    threads: usize,
) {
    let (m, n) = (cm.rows, cm.cols);
    let (cp, ap, bp) = (SendPtr(c), a as usize, b as usize);
    let parts = split(m, n, threads, tile.dims());
    let run = |c, cm, a, am, b, bm| match tile {
        // SAFETY: the caller's, and AVX-512 runs where the wide tile is asked for.
        Tile::Avx2 => unsafe { serial::<MR, NR, NC, false>(kernel, c, cm, a, am, b, bm, alpha, accumulate) },
        Tile::Avx512 => unsafe {
            serial::<MR_WIDE, NR_WIDE, NC_WIDE, true>(kernel_wide, c, cm, a, am, b, bm, alpha, accumulate)
        },
    };
    let part = |&(by_cols, lo, hi): &(bool, usize, usize)| {
        let (a, b) = (ap as *const f32, bp as *const f32);
        // SAFETY: the parts are disjoint blocks of c inside its view; the caller vouches for
        // the operands, and a block's operands are sub-views of theirs.
        unsafe {
            if by_cols {
                let cm = Mat { cols: hi - lo, ..cm };
                let bm = Mat { cols: hi - lo, ..bm };
                run(cp.at(lo * cm.cs), cm, a, am, b.add(lo * bm.cs), bm);
            } else {
                let cm = Mat { rows: hi - lo, ..cm };
                let am = Mat { rows: hi - lo, ..am };
                run(cp.at(lo * cm.rs), cm, a.add(lo * am.rs), am, b, bm);
            }
        }
    };
    if parts.len() == 1 {
        part(&parts[0]);
    } else {
        parts.par_iter().for_each(part);
    }
}

/// How c is cut between threads: `(by columns, from, to)` blocks of whole strips of the tile's
/// columns (or panels of its rows), along the dimension whose operand is the larger to pack
/// (each thread then packs only its share of it and all of the smaller one).
fn split(m: usize, n: usize, threads: usize, (mr, nr): (usize, usize)) -> Vec<(bool, usize, usize)> {
    let strips = n.div_ceil(nr);
    let panels = m.div_ceil(mr);
    let by_cols = if strips >= threads && panels >= threads { n >= m } else { strips >= panels };
    let (units, unit, len) = if by_cols { (strips, nr, n) } else { (panels, mr, m) };
    let t = threads.clamp(1, units.max(1));
    (0..t)
        .map(|p| {
            let (lo, hi) = (units * p / t * unit, (units * (p + 1) / t * unit).min(len));
            (by_cols, lo, hi)
        })
        .filter(|&(_, lo, hi)| hi > lo)
        .collect()
}

/// Where the packed panels of a's rows `ic..ic + rows` over depth block `pc..pc + kc` lie when a
/// is packed once for every column block (`all_panels` panels of R rows a depth block, the
/// depth blocks in order): the one offset both the packing and the kernels read.
fn once_block<const R: usize>(
    all_panels: usize,
    pc: usize,
    kc: usize,
    ic: usize,
    rows: usize,
) -> std::ops::Range<usize> {
    let at = all_panels * R * pc + (ic / R) * kc * R;
    at..at + rows.div_ceil(R) * kc * R
}

/// Whether a product packs its a once for all its column blocks (`Some(rows)`: in slices of
/// that many rows, each packing b again) or once a block (`None`): only with more than one
/// column block, an a slice of at least one MC block within `A_ONCE` values, and fewer values
/// of b packed again for the slices than of a saved (`n·(slices − 1) < m·(blocks − 1)`).
fn a_once(m: usize, k: usize, n: usize, nb: usize) -> Option<usize> {
    let blocks = n.div_ceil(nb);
    let slice = A_ONCE / k.max(1) / MC * MC;
    if blocks < 2 || slice == 0 {
        return None;
    }
    let slices = m.div_ceil(slice);
    (n * (slices - 1) < m * (blocks - 1)).then_some(slice)
}

/// The blocked product on this thread, on tiles of `R × C` by `kernel`, `NB` columns a block;
/// `PANELS_OUTER`: each panel of a meets every strip of b in turn (else each strip every
/// panel). The order of the tiles changes no sum.
#[allow(clippy::too_many_arguments)]
unsafe fn serial<const R: usize, const C: usize, const NB: usize, const PANELS_OUTER: bool>(
    kernel: Kernel,
    c: *mut f32,
    cm: Mat,
    a: *const f32,
    am: Mat,
    b: *const f32,
    bm: Mat,
    alpha: f32,
    accumulate: bool,
) {
    let (m, n, k) = (cm.rows, cm.cols, am.cols);
    if m == 0 || n == 0 {
        return;
    }
    // With more than one block of columns, a is packed once for all of them (its rows' panels
    // for every kc block, in order), not again for each; with one, block by block as it is met.
    // A tall a is taken in slices of whole MC blocks that fit A_ONCE (each slice packs b again).
    let all_panels = m.div_ceil(R);
    let plan = a_once(m, k, n, NB);
    let a_once = plan.is_some();
    if let Some(slice) = plan.filter(|&slice| m > slice) {
        for i0 in (0..m).step_by(slice) {
            let rows = slice.min(m - i0);
            // SAFETY: rows i0..i0+rows of c and a are sub-views of the caller's.
            unsafe {
                serial::<R, C, NB, PANELS_OUTER>(
                    kernel,
                    c.wrapping_add(i0 * cm.rs),
                    Mat { rows, ..cm },
                    a.wrapping_add(i0 * am.rs),
                    Mat { rows, ..am },
                    b,
                    bm,
                    alpha,
                    accumulate,
                )
            };
        }
        return;
    }
    with_buf(&B_BUF, |bbuf| {
        with_buf(&A_BUF, |abuf| {
            if a_once {
                let whole = abuf.get(all_panels * R * k);
                for pc in (0..k).step_by(KC) {
                    let kc = KC.min(k - pc);
                    for ic in (0..m).step_by(MC) {
                        let rows = MC.min(m - ic);
                        let at = once_block::<R>(all_panels, pc, kc, ic, rows);
                        // SAFETY: the block lies inside the caller's view.
                        unsafe { pack::<R>(&mut whole[at], a, am, ic, rows, pc, kc) };
                    }
                }
            }
            for jc in (0..n).step_by(NB) {
                let nc = NB.min(n - jc);
                let strips = nc.div_ceil(C);
                for pc in (0..k).step_by(KC) {
                    let kc = KC.min(k - pc);
                    let beta = accumulate || pc > 0;
                    let packed_b = bbuf.get(strips * kc * C);
                    // SAFETY (here and below): the blocks lie inside the caller's views.
                    unsafe { pack::<C>(packed_b, b, bm.t(), jc, nc, pc, kc) };
                    for ic in (0..m).step_by(MC) {
                        let rows = MC.min(m - ic);
                        let panels = rows.div_ceil(R);
                        let packed_a: &[f32] = if a_once {
                            &abuf.get(all_panels * R * k)[once_block::<R>(all_panels, pc, kc, ic, rows)]
                        } else {
                            let packed_a = abuf.get(panels * kc * R);
                            unsafe { pack::<R>(packed_a, a, am, ic, rows, pc, kc) };
                            packed_a
                        };
                        let tile = |pnl: usize, s: usize| {
                            let i = ic + pnl * R;
                            let ap = &packed_a[pnl * kc * R..(pnl + 1) * kc * R];
                            let bs = &packed_b[s * kc * C..(s + 1) * kc * C];
                            let (j, cols) = (jc + s * C, C.min(nc - s * C));
                            let cij = c.wrapping_add(i * cm.rs + j * cm.cs);
                            unsafe { kernel(kc, ap, bs, cij, cm, R.min(m - i), cols, alpha, beta) };
                        };
                        if PANELS_OUTER {
                            // a's panel stays in L1 while b's strips stream from L2
                            (0..panels).for_each(|pnl| (0..strips).for_each(|s| tile(pnl, s)));
                        } else {
                            // b's strip stays in L1 while a's panels stream from L2
                            (0..strips).for_each(|s| (0..panels).for_each(|pnl| tile(pnl, s)));
                        }
                    }
                }
            }
        })
    })
}

/// Whether `pack` transposes row-major blocks of panels `w` wide in registers: the tiles'
/// widths (rows of 8, then 6 or 4 at a panel's end).
const fn transposed_in_registers(w: usize) -> bool {
    matches!(w, MR | NR | MR_WIDE | NR_WIDE)
}

/// Asks for the cache lines of `len` floats from `p` (a hint: never faults).
#[inline(always)]
fn prefetch(p: *const f32, len: usize) {
    #[cfg(target_arch = "x86_64")]
    for off in (0..len).step_by(16) {
        // SAFETY: prefetching is a hint and cannot fault, whatever the address.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.wrapping_add(off) as *const i8)
        };
    }
}

/// How many rows ahead the packing loops prefetch.
const AHEAD: usize = 4;

/// Packs x's rows `i0..i0+rows` × columns `pc..pc+kc` as panels of W rows, each panel's
/// `kc × W` values contiguous (column p of the panel at `p·W`), the last panel zero-padded.
/// a is packed with W = 6 or 12 (its row panels); b as its transpose with W = 16 or 32 (its
/// column strips).
/// Reads go along x's contiguous dimension.
///
/// # Safety
/// Rows `i0..i0+rows` and columns `pc..pc+kc` of `xm` must lie inside memory valid for reads
/// from `x`; `dst` must hold `rows.div_ceil(W) · kc · W` values.
pub(crate) unsafe fn pack<const W: usize>(
    dst: &mut [f32],
    x: *const f32,
    xm: Mat,
    i0: usize,
    rows: usize,
    pc: usize,
    kc: usize,
) {
    let (rs, cs) = (xm.rs, xm.cs);
    if !rows.is_multiple_of(W) {
        dst[(rows / W) * kc * W..].fill(0.0);
    }
    if cs == 1 {
        // rows scattered into their panels: blocks of 8 columns of the full panels transposed
        // in registers where AVX2 runs, the rest one value at a time
        let mut done = 0;
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && transposed_in_registers(W) {
            // SAFETY: the feature is present; the reads are rows i0.. of the caller's block.
            unsafe { avx2::pack_rows::<W>(dst, x, rs, i0, rows / W, pc, kc) };
            done = kc / 8 * 8;
        }
        for i in 0..rows {
            if i < rows / W * W && done == kc {
                continue;
            }
            let from = if i < rows / W * W { done } else { 0 };
            let row = x.wrapping_add((i0 + i) * rs + pc);
            prefetch(row.wrapping_add(AHEAD * rs), kc);
            // SAFETY: row i0+i, columns pc..pc+kc lie inside the view.
            let src = unsafe { std::slice::from_raw_parts(row, kc) };
            let panel = &mut dst[(i / W) * kc * W..(i / W + 1) * kc * W];
            for (p, &v) in src.iter().enumerate().skip(from) {
                panel[p * W + i % W] = v;
            }
        }
    } else if rs == 1 {
        // a column at a time, W contiguous values into each panel
        for p in 0..kc {
            let col = x.wrapping_add(i0 + (pc + p) * cs);
            prefetch(col.wrapping_add(AHEAD * cs), rows);
            // SAFETY: rows i0..i0+rows of column pc+p lie inside the view.
            let src = unsafe { std::slice::from_raw_parts(col, rows) };
            let mut chunks = src.chunks_exact(W);
            // whole panels as fixed-size copies (register moves, not a memcpy call each)
            for (q, chunk) in (&mut chunks).enumerate() {
                let at = q * kc * W + p * W;
                let to: &mut [f32; W] = (&mut dst[at..at + W]).try_into().expect("W values");
                *to = chunk.try_into().expect("W values");
            }
            let rest = chunks.remainder();
            if !rest.is_empty() {
                let at = rows / W * kc * W + p * W;
                dst[at..at + rest.len()].copy_from_slice(rest);
            }
        }
    } else {
        for p in 0..kc {
            let col = x.wrapping_add(i0 * rs + (pc + p) * cs);
            for i in 0..rows {
                // SAFETY: as above.
                dst[(i / W) * kc * W + p * W + i % W] = unsafe { *col.add(i * rs) };
            }
        }
    }
}

/// One 6 × 16 tile: `c[i, j] = (beta ? c[i, j] : 0) + alpha · Σ_p a[i, p]·b[p, j]` for the
/// `rows × cols` corner that lies inside c, from a packed 6-row panel of a and a packed
/// 16-column strip of b (starting on a 32-byte boundary). Each sum is one `fma` chain over
/// `p` in order, on every machine: the AVX2 kernel where it runs, the same chain in plain
/// Rust elsewhere (bit for bit the same).
///
/// # Safety
/// The `rows × cols` corner of c at `c` (strides of `cm`) must be valid for writes (and reads
/// when `beta`), and touched by no other thread during the call.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn kernel(
    kc: usize,
    a: &[f32],
    b: &[f32],
    c: *mut f32,
    cm: Mat,
    rows: usize,
    cols: usize,
    alpha: f32,
    beta: bool,
) {
    debug_assert!(a.len() == kc * MR && b.len() == kc * NR);
    debug_assert!(b.as_ptr().align_offset(32) == 0, "b's strip must be 32-byte aligned");
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY: the features are present; the caller vouches for c.
        return unsafe { avx2::kernel(kc, a.as_ptr(), b.as_ptr(), c, cm, rows, cols, alpha, beta) };
    }
    // SAFETY: the caller vouches for the corner.
    unsafe { write_corner(&portable_sums::<MR, NR>(kc, a, b), c, cm, rows, cols, alpha, beta) }
}

/// The last step of every tile's contract, on the `rows × cols` corner of c: `c = beta ?
/// fma(alpha, sum, c) : alpha · sum`, from a tile's sums (the plain Rust tile's, and the
/// vector tiles' where the corner is ragged or c is strided).
///
/// # Safety
/// As [`kernel`]'s, for the corner.
unsafe fn write_corner<const C: usize>(
    sums: &[[f32; C]],
    c: *mut f32,
    cm: Mat,
    rows: usize,
    cols: usize,
    alpha: f32,
    beta: bool,
) {
    for (r, row) in sums.iter().enumerate().take(rows) {
        for (j, &v) in row.iter().enumerate().take(cols) {
            // SAFETY: (r, j) lies in the corner the caller vouches for.
            let cij = unsafe { c.add(r * cm.rs + j * cm.cs) };
            unsafe { *cij = if beta { alpha.mul_add(v, *cij) } else { alpha * v } };
        }
    }
}

/// The 12 × 32 tile of [`kernel`]'s contract on zmm registers: the same `fma` chain for each
/// element, so the same bits as the 6 × 16 tile (and as the plain Rust sums).
///
/// # Safety
/// As [`kernel`]; AVX-512 must be present, b's strip 64-byte aligned.
#[allow(clippy::too_many_arguments)]
unsafe fn kernel_wide(
    kc: usize,
    a: &[f32],
    b: &[f32],
    c: *mut f32,
    cm: Mat,
    rows: usize,
    cols: usize,
    alpha: f32,
    beta: bool,
) {
    debug_assert!(a.len() == kc * MR_WIDE && b.len() == kc * NR_WIDE);
    debug_assert!(b.as_ptr().align_offset(64) == 0, "b's strip must be 64-byte aligned");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller vouches for the feature and for c.
    unsafe {
        avx512::kernel(kc, a.as_ptr(), b.as_ptr(), c, cm, rows, cols, alpha, beta)
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("the 12 × 32 tile runs only where AVX-512 does")
}

/// The micro-kernel's sums in plain Rust, for machines without AVX2 (`mul_add` is the same
/// fused operation, in the same order), on an `R × C` tile.
fn portable_sums<const R: usize, const C: usize>(kc: usize, a: &[f32], b: &[f32]) -> [[f32; C]; R] {
    let mut acc = [[0f32; C]; R];
    for p in 0..kc {
        let bp = &b[p * C..(p + 1) * C];
        for (r, accr) in acc.iter_mut().enumerate() {
            let av = a[p * R + r];
            for (x, &bv) in accr.iter_mut().zip(bp) {
                *x = av.mul_add(bv, *x);
            }
        }
    }
    acc
}

#[cfg(target_arch = "x86_64")]
pub use avx2::transpose8;

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Mat, MR, NR};
    use std::arch::x86_64::*;

    /// `pack`'s row-major case for the first `panels` full panels of W rows (W = 6, 12, 16 or
    /// 32) and columns `pc..pc + kc/8·8`: each 8 × 8 block (6 or 4 rows × 8 at a panel's end)
    /// is loaded a row at a time, transposed in registers and stored a column at a time,
    /// instead of 64 scalar stores.
    ///
    /// # Safety
    /// AVX2 must be present; rows `i0..i0 + panels·W`, columns `pc..pc + kc` at `x` (row
    /// stride `rs`) valid for reads; `dst` holds at least `panels · kc · W` values.
    #[target_feature(enable = "avx2")]
    pub unsafe fn pack_rows<const W: usize>(
        dst: &mut [f32],
        x: *const f32,
        rs: usize,
        i0: usize,
        panels: usize,
        pc: usize,
        kc: usize,
    ) {
        assert!(dst.len() >= panels * kc * W && super::transposed_in_registers(W));
        let d = dst.as_mut_ptr();
        for q in 0..panels {
            for g in (0..W).step_by(8) {
                let nr = (W - g).min(8);
                let row = |r: usize| x.wrapping_add((i0 + q * W + g + r) * rs + pc);
                for p0 in (0..kc / 8 * 8).step_by(8) {
                    let mut v = [_mm256_setzero_ps(); 8];
                    for (r, vr) in v.iter_mut().enumerate().take(nr) {
                        *vr = unsafe { _mm256_loadu_ps(row(r).add(p0)) };
                    }
                    let c = transpose8(v);
                    // column p0+j of these rows: W·(p0+j) + g into the panel
                    let at = |j: usize| unsafe { d.add(q * kc * W + (p0 + j) * W + g) };
                    for (j, &cj) in c.iter().enumerate() {
                        if nr == 8 {
                            unsafe { _mm256_storeu_ps(at(j), cj) };
                        } else if nr == 4 {
                            unsafe { _mm_storeu_ps(at(j), _mm256_castps256_ps128(cj)) };
                        } else {
                            let lo = _mm256_castps256_ps128(cj);
                            let hi = _mm256_extractf128_ps::<1>(cj);
                            unsafe {
                                _mm_storeu_ps(at(j), lo);
                                _mm_store_sd(at(j).add(4) as *mut f64, _mm_castps_pd(hi));
                            }
                        }
                    }
                }
            }
        }
    }

    /// The transpose of an 8 × 8 block held as eight rows.
    #[inline(always)]
    pub fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
        // SAFETY: register shuffles only; AVX2 is enabled in the caller.
        unsafe {
            let t0 = _mm256_unpacklo_ps(r[0], r[1]);
            let t1 = _mm256_unpackhi_ps(r[0], r[1]);
            let t2 = _mm256_unpacklo_ps(r[2], r[3]);
            let t3 = _mm256_unpackhi_ps(r[2], r[3]);
            let t4 = _mm256_unpacklo_ps(r[4], r[5]);
            let t5 = _mm256_unpackhi_ps(r[4], r[5]);
            let t6 = _mm256_unpacklo_ps(r[6], r[7]);
            let t7 = _mm256_unpackhi_ps(r[6], r[7]);
            let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
            let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
            let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
            let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
            let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
            let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
            [
                _mm256_permute2f128_ps::<0x20>(u0, u4),
                _mm256_permute2f128_ps::<0x20>(u1, u5),
                _mm256_permute2f128_ps::<0x20>(u2, u6),
                _mm256_permute2f128_ps::<0x20>(u3, u7),
                _mm256_permute2f128_ps::<0x31>(u0, u4),
                _mm256_permute2f128_ps::<0x31>(u1, u5),
                _mm256_permute2f128_ps::<0x31>(u2, u6),
                _mm256_permute2f128_ps::<0x31>(u3, u7),
            ]
        }
    }

    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn kernel(
        kc: usize,
        a: *const f32,
        b: *const f32,
        c: *mut f32,
        cm: Mat,
        rows: usize,
        cols: usize,
        alpha: f32,
        beta: bool,
    ) {
        // the tile of c is read (or written) once the products are summed: fetch its lines
        // now, so that it comes from L1 rather than stalling on memory then
        if cm.cs == 1 {
            for r in 0..rows {
                let cr = c.add(r * cm.rs) as *const i8;
                _mm_prefetch::<_MM_HINT_T0>(cr);
                _mm_prefetch::<_MM_HINT_T0>(cr.wrapping_add(4 * cols - 4));
            }
        }
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        for p in 0..kc {
            let b0 = _mm256_load_ps(b.add(p * NR));
            let b1 = _mm256_load_ps(b.add(p * NR + 8));
            for (r, accr) in acc.iter_mut().enumerate() {
                let av = _mm256_broadcast_ss(&*a.add(p * MR + r));
                accr[0] = _mm256_fmadd_ps(av, b0, accr[0]);
                accr[1] = _mm256_fmadd_ps(av, b1, accr[1]);
            }
        }
        let al = _mm256_set1_ps(alpha);
        if rows == MR && cols == NR && cm.cs == 1 {
            for (r, accr) in acc.iter().enumerate() {
                let cr = c.add(r * cm.rs);
                for (h, &sum) in accr.iter().enumerate() {
                    let v = if beta {
                        _mm256_fmadd_ps(al, sum, _mm256_loadu_ps(cr.add(8 * h)))
                    } else {
                        _mm256_mul_ps(al, sum)
                    };
                    _mm256_storeu_ps(cr.add(8 * h), v);
                }
            }
            return;
        }
        let mut tile = [[0f32; NR]; MR];
        for (t, accr) in tile.iter_mut().zip(&acc) {
            _mm256_storeu_ps(t.as_mut_ptr(), accr[0]);
            _mm256_storeu_ps(t.as_mut_ptr().add(8), accr[1]);
        }
        super::write_corner(&tile, c, cm, rows, cols, alpha, beta);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Mat, MR_WIDE as MR, NR_WIDE as NR};
    use std::arch::x86_64::*;

    /// The 12 × 32 tile: 24 zmm accumulators (two 16-wide vectors a row), each row's value of
    /// a broadcast against the strip's two vectors at every step of `p`.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn kernel(
        kc: usize,
        a: *const f32,
        b: *const f32,
        c: *mut f32,
        cm: Mat,
        rows: usize,
        cols: usize,
        alpha: f32,
        beta: bool,
    ) {
        // the tile of c is read (or written) once the products are summed: fetch its lines now
        if cm.cs == 1 {
            for r in 0..rows {
                let cr = c.add(r * cm.rs) as *const i8;
                _mm_prefetch::<_MM_HINT_T0>(cr);
                _mm_prefetch::<_MM_HINT_T0>(cr.wrapping_add(64));
                _mm_prefetch::<_MM_HINT_T0>(cr.wrapping_add(4 * cols - 4));
            }
        }
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        for p in 0..kc {
            let b0 = _mm512_load_ps(b.add(p * NR));
            let b1 = _mm512_load_ps(b.add(p * NR + 16));
            for (r, accr) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_ps(*a.add(p * MR + r));
                accr[0] = _mm512_fmadd_ps(av, b0, accr[0]);
                accr[1] = _mm512_fmadd_ps(av, b1, accr[1]);
            }
        }
        let al = _mm512_set1_ps(alpha);
        if rows == MR && cols == NR && cm.cs == 1 {
            for (r, accr) in acc.iter().enumerate() {
                let cr = c.add(r * cm.rs);
                for (h, &sum) in accr.iter().enumerate() {
                    let v = if beta {
                        _mm512_fmadd_ps(al, sum, _mm512_loadu_ps(cr.add(16 * h)))
                    } else {
                        _mm512_mul_ps(al, sum)
                    };
                    _mm512_storeu_ps(cr.add(16 * h), v);
                }
            }
            return;
        }
        let mut tile = [[0f32; NR]; MR];
        for (t, accr) in tile.iter_mut().zip(&acc) {
            _mm512_storeu_ps(t.as_mut_ptr(), accr[0]);
            _mm512_storeu_ps(t.as_mut_ptr().add(16), accr[1]);
        }
        super::write_corner(&tile, c, cm, rows, cols, alpha, beta);
    }
}

#[cfg(test)]
mod tests {
    use super::super::matmul::{gemm_into_on, matmul_on, matmul_reference, Backend, Mat, Threads};
    use super::*;
    use rand::{Rng, SeedableRng};

    /// `pack`'s layout written out one value at a time: panel `i / W`, column p at `p·W + i % W`,
    /// the rows past the last full panel zero.
    fn pack_reference<const W: usize>(x: &[f32], xm: Mat, i0: usize, rows: usize, pc: usize, kc: usize) -> Vec<f32> {
        let mut want = vec![0f32; rows.div_ceil(W) * kc * W];
        for i in 0..rows {
            for p in 0..kc {
                want[(i / W) * kc * W + p * W + i % W] = x[(i0 + i) * xm.rs + (pc + p) * xm.cs];
            }
        }
        want
    }

    fn check_pack<const W: usize>(rng: &mut rand::rngs::StdRng) {
        // row-major (the transposing path), transposed and strided views; ragged rows and columns
        for &(rows, kc) in &[(1, 1), (W, 8), (W, 13), (3 * W + 1, 37), (2 * W, 256), (W - 1, 20), (5, 7)] {
            let (i0, pc) = (rng.gen_range(0..3), rng.gen_range(0..5));
            let (r, c) = (i0 + rows, pc + kc);
            let x: Vec<f32> = (0..(r + 2) * (c + 3)).map(|_| rng.gen_range(-1.0..1.0)).collect();
            for xm in [Mat::strided(r, c, c + 3), Mat::rm_t(r, c), Mat { rows: r, cols: c, rs: 2, cs: 2 * r + 1 }] {
                if xm.rs == 2 && (r - 1) * 2 + (c - 1) * (2 * r + 1) >= x.len() {
                    continue;
                }
                let mut got = vec![f32::NAN; rows.div_ceil(W) * kc * W];
                // SAFETY: the block lies inside x.
                unsafe { pack::<W>(&mut got, x.as_ptr(), xm, i0, rows, pc, kc) };
                let want = pack_reference::<W>(&x, xm, i0, rows, pc, kc);
                assert_eq!(got, want, "W={W} rows={rows} kc={kc} view {xm:?}");
            }
        }
    }

    #[test]
    fn the_portable_sums_are_the_avx2_kernels_bit_for_bit() {
        if unavailable() {
            return;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(23);
        let kc = 77;
        let a: Vec<f32> = (0..kc * MR).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let mut b = Buf::default();
        let b = b.get(kc * NR);
        b.iter_mut().for_each(|x| *x = rng.gen_range(-1.0..1.0));
        let mut c = vec![0f32; MR * NR];
        // SAFETY: c is a whole 6 × 16 tile.
        unsafe { kernel(kc, &a, b, c.as_mut_ptr(), Mat::rm(MR, NR), MR, NR, 1.0, false) };
        assert_eq!(c, portable_sums::<MR, NR>(kc, &a, b).concat());
    }

    #[test]
    fn packing_matches_the_layout_written_out() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(17);
        check_pack::<MR>(&mut rng);
        check_pack::<NR>(&mut rng);
        check_pack::<MR_WIDE>(&mut rng);
        check_pack::<NR_WIDE>(&mut rng);
    }

    /// Whether this machine cannot run the 12 × 32 tile (said once per test).
    fn wide_unavailable() -> bool {
        let here = runs_here() && is_x86_feature_detected!("avx512f");
        if !here {
            println!("skipped: the 12 × 32 tile needs AVX-512 (this machine runs the 6 × 16 one)");
        }
        !here
    }

    #[test]
    fn the_wide_tile_is_the_portable_sums_bit_for_bit() {
        if wide_unavailable() {
            return;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(29);
        for kc in [1, 77, 256] {
            let a: Vec<f32> = (0..kc * MR_WIDE).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let mut b = Buf::default();
            let b = b.get(kc * NR_WIDE);
            b.iter_mut().for_each(|x| *x = rng.gen_range(-1.0..1.0));
            let mut c = vec![0f32; MR_WIDE * NR_WIDE];
            // SAFETY: c is a whole 12 × 32 tile; AVX-512 runs here.
            unsafe { kernel_wide(kc, &a, b, c.as_mut_ptr(), Mat::rm(MR_WIDE, NR_WIDE), MR_WIDE, NR_WIDE, 1.0, false) };
            assert_eq!(c, portable_sums::<MR_WIDE, NR_WIDE>(kc, &a, b).concat(), "kc={kc}");
        }
    }

    /// The 12 × 32 tile's products are the 6 × 16 tile's bit for bit, on any shape (ragged
    /// panels and strips, several column blocks and k blocks), view, alpha, accumulation and
    /// thread count: a machine with AVX-512 computes what one with AVX2 only does.
    #[test]
    fn the_wide_tile_gives_the_narrow_tiles_bits() {
        if wide_unavailable() {
            return;
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(31);
        let shapes = [(1, 1, 1), (12, 256, 32), (13, 257, 33), (150, 600, 1100), (40, 70, 2100), (300, 9, 5)];
        for &(m, k, n) in &shapes {
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                let a = rand_vec(&mut rng, m * k);
                let b = rand_vec(&mut rng, k * n);
                let c0 = rand_vec(&mut rng, m * n);
                let am = if ta { Mat::rm_t(m, k) } else { Mat::rm(m, k) };
                let bm = if tb { Mat::rm_t(k, n) } else { Mat::rm(k, n) };
                for (threads, accumulate, alpha) in [(1, false, 1.0), (2, true, -0.5), (3, true, 1.0)] {
                    let run = |tile: Tile| {
                        let mut c = c0.clone();
                        // SAFETY: the views are dense over their buffers; the tile runs here.
                        pool(threads).install(|| unsafe {
                            sgemm_tiled(
                                tile,
                                c.as_mut_ptr(),
                                Mat::rm(m, n),
                                a.as_ptr(),
                                am,
                                b.as_ptr(),
                                bm,
                                alpha,
                                accumulate,
                                threads,
                            )
                        });
                        c
                    };
                    let (wide, narrow) = (run(Tile::Avx512), run(Tile::Avx2));
                    let same = wide.iter().zip(&narrow).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "({m},{k},{n}) ta={ta} tb={tb} threads={threads}: the tiles' bits differ");
                }
            }
        }
    }

    /// When a is packed once: several column blocks, a slice within `A_ONCE`, and slicing
    /// cheaper than what it saves (a weight gradient over 8192 tokens is not worth slicing).
    #[test]
    fn a_is_packed_once_where_it_saves_packing() {
        assert_eq!(a_once(2048, 768, 768, NC_WIDE), None, "one column block");
        assert!(a_once(256, 768, 50257, NC_WIDE).is_some_and(|s| s >= 256), "GPT-2's LM head, unsliced");
        assert_eq!(a_once(3999, 2100, 1100, NC_WIDE), Some(1872));
        assert_eq!(a_once(64, 40_000, 5000, NC_WIDE), None, "not one MC block of a fits");
        assert_eq!(a_once(3072, 8192, 3072, NC_WIDE), None, "8 slices would pack b 7 more times");
        assert_eq!(a_once(300, 600, 4140, NC), Some(A_ONCE / 600 / MC * MC));
    }

    /// On the 6 × 16 tile (blocks of 4080 columns) a product of two column blocks packs its a
    /// once: the same bits as the same product taken one column block at a time.
    #[test]
    fn a_packed_once_on_the_narrow_tile_gives_the_blocks_bits() {
        if unavailable() {
            return;
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(46);
        let (m, k, n) = (300, 600, NC + 60);
        let a = rand_vec(&mut rng, m * k);
        let b = rand_vec(&mut rng, k * n);
        for threads in [1, 2] {
            let run = |cols: std::ops::Range<usize>| {
                let mut c = vec![0f32; m * n];
                // SAFETY: the views lie inside the buffers; the narrow tile runs wherever AVX2 does.
                pool(threads).install(|| unsafe {
                    sgemm_tiled(
                        Tile::Avx2,
                        c[cols.start..].as_mut_ptr(),
                        Mat::strided(m, cols.len(), n),
                        a.as_ptr(),
                        Mat::rm(m, k),
                        b[cols.start..].as_ptr(),
                        Mat::strided(k, cols.len(), n),
                        1.0,
                        false,
                        threads,
                    )
                });
                c
            };
            let whole = run(0..n);
            let (left, right) = (run(0..NC), run(NC..n));
            for i in 0..m {
                let row = &whole[i * n..(i + 1) * n];
                assert!(row[..NC] == left[i * n..i * n + NC], "threads={threads} row {i}: first block");
                assert!(row[NC..] == right[i * n + NC..(i + 1) * n], "threads={threads} row {i}: second block");
            }
        }
    }

    /// A product wide enough for several column blocks packs its a once for all of them, and
    /// a tall one (more than `A_ONCE` values of a) in slices of rows: the same bits as the
    /// 6 × 16 tile (one column block here, a packed block by block) and as the rows alone.
    #[test]
    fn a_packed_once_and_in_slices_gives_the_same_bits() {
        if wide_unavailable() {
            return;
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(47);
        let (m, k, n) = (2 * A_ONCE / 2100 + 5, 2100, 1100);
        assert!(a_once(m, k, n, NC_WIDE).is_some_and(|slice| slice < m) && a_once(m, k, n, NC).is_none());
        for ta in [false, true] {
            let a = rand_vec(&mut rng, m * k);
            let b = rand_vec(&mut rng, k * n);
            let am = if ta { Mat::rm_t(m, k) } else { Mat::rm(m, k) };
            for threads in [1, 2] {
                let run = |tile: Tile, rows: std::ops::Range<usize>| {
                    let mut c = vec![0f32; rows.len() * n];
                    let off = if ta { rows.start } else { rows.start * k };
                    // SAFETY: the views lie inside the buffers; the tile runs here.
                    pool(threads).install(|| unsafe {
                        sgemm_tiled(
                            tile,
                            c.as_mut_ptr(),
                            Mat::rm(rows.len(), n),
                            a[off..].as_ptr(),
                            Mat { rows: rows.len(), ..am },
                            b.as_ptr(),
                            Mat::rm(k, n),
                            1.0,
                            false,
                            threads,
                        )
                    });
                    c
                };
                let wide = run(Tile::Avx512, 0..m);
                assert!(wide == run(Tile::Avx2, 0..m), "ta={ta} threads={threads}: the tiles' bits differ");
                let tail = m - 7..m;
                assert!(wide[tail.start * n..] == run(Tile::Avx512, tail)[..], "ta={ta}: the last rows alone differ");
            }
        }
    }

    fn rand_vec(rng: &mut impl Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect()
    }

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap()
    }

    /// Whether this machine cannot run the kernel (said once per test).
    fn unavailable() -> bool {
        if !runs_here() {
            println!("skipped: brigade's kernel needs AVX2 and FMA (the gemm crate runs here)");
        }
        !runs_here()
    }

    #[test]
    fn strided_views_alpha_and_accumulate_match_the_reference() {
        if unavailable() {
            return;
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let (m, k, n) = (157, 300, 45);
        // a is a column block of a wider matrix, b is transposed, c is a block of a wider c
        let (lda, ldc) = (k + 5, n + 7);
        let a = rand_vec(&mut rng, m * lda);
        let b = rand_vec(&mut rng, n * k);
        let c0 = rand_vec(&mut rng, m * ldc);
        let mut dense_a = vec![0f32; m * k];
        for i in 0..m {
            dense_a[i * k..(i + 1) * k].copy_from_slice(&a[i * lda + 2..i * lda + 2 + k]);
        }
        let want = matmul_reference(&dense_a, &b, m, k, n, false, true);
        // k = 300 spans two 256-deep blocks: the second adds to the first even when the call
        // itself overwrites c
        for (threads, accumulate) in [(1, true), (2, true), (3, true), (1, false), (2, false)] {
            let mut c = c0.clone();
            pool(threads).install(|| {
                gemm_into_on(
                    Backend::Brigade,
                    &mut c[3..],
                    Mat::strided(m, n, ldc),
                    &a[2..],
                    Mat::strided(m, k, lda),
                    &b,
                    Mat::rm_t(k, n),
                    -2.0,
                    accumulate,
                    Threads::Pool,
                )
            });
            for i in 0..m {
                for j in 0..ldc {
                    let (got, old) = (c[i * ldc + j], c0[i * ldc + j]);
                    if j < 3 || j >= n + 3 {
                        assert_eq!(got, old, "({i}, {j}) outside the view was written");
                    } else {
                        let w = if accumulate { old } else { 0.0 } - 2.0 * want[i * n + j - 3];
                        assert!((got - w).abs() < 1e-3, "({i}, {j}), accumulate {accumulate}: {got} vs {w}");
                    }
                }
            }
        }
    }

    #[test]
    fn results_do_not_depend_on_threads_or_tiling() {
        if unavailable() {
            return;
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4);
        for &(m, k, n, ta, tb) in &[(300, 600, 70, false, false), (50, 257, 4100, true, false), (13, 9, 33, true, true)]
        {
            let a = rand_vec(&mut rng, m * k);
            let b = rand_vec(&mut rng, k * n);
            let run = |threads: usize| {
                let mut c = vec![0f32; m * n];
                pool(threads).install(|| matmul_on(Backend::Brigade, &mut c, &a, &b, m, k, n, ta, tb, false));
                c
            };
            let one = run(1);
            let want = matmul_reference(&a, &b, m, k, n, ta, tb);
            for (i, (g, w)) in one.iter().zip(&want).enumerate() {
                assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "({m},{k},{n}) element {i}: {g} vs {w}");
            }
            for threads in [2, 3, 4] {
                assert!(run(threads) == one, "({m},{k},{n}): {threads} threads differ from 1");
            }
            // the rows of a sub-matrix come out bit for bit as in the whole product (other
            // row tilings), here for the first 7 rows
            if !ta {
                let mut c7 = vec![0f32; 7 * n];
                matmul_on(Backend::Brigade, &mut c7, &a[..7 * k], &b, 7, k, n, false, tb, false);
                assert!(c7[..] == one[..7 * n], "({m},{k},{n}): 7 rows alone differ");
            }
        }
    }
}
