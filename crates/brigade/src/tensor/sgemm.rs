//! brigade's own f32 matrix product for AVX2 + FMA machines, organised as BLIS does it
//! (Van Zee & van de Geijn, "BLIS: A Framework for Rapidly Instantiating BLAS Functionality"):
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
//! Packing turns any operand layout (row-major, transposed, strided) into the contiguous
//! panels the micro-kernel streams, so transposed operands run at the rate of plain ones.
//!
//! Every element of `c` is the same sum whatever the thread count and the row/column tiling:
//! for each kc block in order, an `fma` chain over that block from 0, added to what `c` held.
//! The block depth KC is a constant, so results do not depend on `--threads` either.

use super::matmul::Mat;
use super::SendPtr;
use rayon::prelude::*;
use std::cell::RefCell;

pub const MR: usize = 6;
pub const NR: usize = 16;
const KC: usize = 256;
const MC: usize = 144;
const NC: usize = 4080;

/// Whether this machine runs brigade's kernel: x86-64 with AVX2 and FMA. Machines with
/// AVX-512 keep the `gemm` crate, whose 512-bit kernels are faster there.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && !is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// A reusable 64-byte-aligned f32 buffer (packed panels), kept per thread.
#[derive(Default)]
struct Buf(Vec<f32>);

impl Buf {
    fn get(&mut self, len: usize) -> &mut [f32] {
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
    let (m, n) = (cm.rows, cm.cols);
    let (cp, ap, bp) = (SendPtr(c), a as usize, b as usize);
    let parts = split(m, n, threads);
    let part = |&(by_cols, lo, hi): &(bool, usize, usize)| {
        let (a, b) = (ap as *const f32, bp as *const f32);
        // SAFETY: the parts are disjoint blocks of c inside its view; the caller vouches for
        // the operands, and a block's operands are sub-views of theirs.
        unsafe {
            if by_cols {
                let cm = Mat { cols: hi - lo, ..cm };
                let bm = Mat { cols: hi - lo, ..bm };
                serial(cp.at(lo * cm.cs), cm, a, am, b.add(lo * bm.cs), bm, alpha, accumulate);
            } else {
                let cm = Mat { rows: hi - lo, ..cm };
                let am = Mat { rows: hi - lo, ..am };
                serial(cp.at(lo * cm.rs), cm, a.add(lo * am.rs), am, b, bm, alpha, accumulate);
            }
        }
    };
    if parts.len() == 1 {
        part(&parts[0]);
    } else {
        parts.par_iter().for_each(part);
    }
}

/// How c is cut between threads: `(by columns, from, to)` blocks of whole 16-column strips
/// (or 6-row panels), along the dimension whose operand is the larger to pack (each thread
/// then packs only its share of it and all of the smaller one).
fn split(m: usize, n: usize, threads: usize) -> Vec<(bool, usize, usize)> {
    let strips = n.div_ceil(NR);
    let panels = m.div_ceil(MR);
    let by_cols = if strips >= threads && panels >= threads { n >= m } else { strips >= panels };
    let (units, unit, len) = if by_cols { (strips, NR, n) } else { (panels, MR, m) };
    let t = threads.clamp(1, units.max(1));
    (0..t)
        .map(|p| {
            let (lo, hi) = (units * p / t * unit, (units * (p + 1) / t * unit).min(len));
            (by_cols, lo, hi)
        })
        .filter(|&(_, lo, hi)| hi > lo)
        .collect()
}

/// The blocked product on this thread.
#[allow(clippy::too_many_arguments)]
unsafe fn serial(c: *mut f32, cm: Mat, a: *const f32, am: Mat, b: *const f32, bm: Mat, alpha: f32, accumulate: bool) {
    let (m, n, k) = (cm.rows, cm.cols, am.cols);
    if m == 0 || n == 0 {
        return;
    }
    with_buf(&B_BUF, |bbuf| {
        with_buf(&A_BUF, |abuf| {
            for jc in (0..n).step_by(NC) {
                let nc = NC.min(n - jc);
                let strips = nc.div_ceil(NR);
                for pc in (0..k).step_by(KC) {
                    let kc = KC.min(k - pc);
                    let beta = accumulate || pc > 0;
                    let packed_b = bbuf.get(strips * kc * NR);
                    // SAFETY (here and below): the blocks lie inside the caller's views.
                    unsafe { pack::<NR>(packed_b, b, bm.t(), jc, nc, pc, kc) };
                    for ic in (0..m).step_by(MC) {
                        let rows = MC.min(m - ic);
                        let panels = rows.div_ceil(MR);
                        let packed_a = abuf.get(panels * kc * MR);
                        unsafe { pack::<MR>(packed_a, a, am, ic, rows, pc, kc) };
                        for s in 0..strips {
                            let bs = &packed_b[s * kc * NR..(s + 1) * kc * NR];
                            let (j, cols) = (jc + s * NR, NR.min(nc - s * NR));
                            for pnl in 0..panels {
                                let i = ic + pnl * MR;
                                let ap = &packed_a[pnl * kc * MR..(pnl + 1) * kc * MR];
                                let cij = c.wrapping_add(i * cm.rs + j * cm.cs);
                                unsafe { kernel(kc, ap, bs, cij, cm, MR.min(m - i), cols, alpha, beta) };
                            }
                        }
                    }
                }
            }
        })
    })
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
/// a is packed with W = 6 (its row panels); b as its transpose with W = 16 (its column strips).
/// Reads go along x's contiguous dimension.
unsafe fn pack<const W: usize>(dst: &mut [f32], x: *const f32, xm: Mat, i0: usize, rows: usize, pc: usize, kc: usize) {
    let (rs, cs) = (xm.rs, xm.cs);
    if !rows.is_multiple_of(W) {
        dst[(rows / W) * kc * W..].fill(0.0);
    }
    if cs == 1 {
        // a row at a time, scattered into its panel
        for i in 0..rows {
            let row = x.wrapping_add((i0 + i) * rs + pc);
            prefetch(row.wrapping_add(AHEAD * rs), kc);
            // SAFETY: row i0+i, columns pc..pc+kc lie inside the view.
            let src = unsafe { std::slice::from_raw_parts(row, kc) };
            let panel = &mut dst[(i / W) * kc * W..(i / W + 1) * kc * W];
            for (p, &v) in src.iter().enumerate() {
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
            for (q, chunk) in src.chunks(W).enumerate() {
                let at = q * kc * W + p * W;
                dst[at..at + chunk.len()].copy_from_slice(chunk);
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
/// `rows × cols` corner that lies inside c.
#[allow(clippy::too_many_arguments)]
unsafe fn kernel(
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
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sgemm` runs only where `available()` (AVX2 and FMA) holds.
    unsafe {
        avx2::kernel(kc, a.as_ptr(), b.as_ptr(), c, cm, rows, cols, alpha, beta)
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("sgemm runs on x86-64 only ({kc}, {a:?}, {b:?}, {c:?}, {rows}, {cols}, {alpha}, {beta})");
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Mat, MR, NR};
    use std::arch::x86_64::*;

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
        for (r, t) in tile.iter().enumerate().take(rows) {
            for (j, &v) in t.iter().enumerate().take(cols) {
                let cij = c.add(r * cm.rs + j * cm.cs);
                *cij = if beta { alpha.mul_add(v, *cij) } else { alpha * v };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::matmul::{gemm_into, matmul_on, matmul_reference, Backend, Mat, Threads};
    use super::*;
    use rand::{Rng, SeedableRng};

    fn rand_vec(rng: &mut impl Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect()
    }

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap()
    }

    /// Whether this machine cannot run the kernel (said once per test).
    fn unavailable() -> bool {
        if !available() {
            println!("skipped: brigade's kernel needs AVX2 and FMA without AVX-512 (the gemm crate runs here)");
        }
        !available()
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
        for threads in [1, 2, 3] {
            let mut c = c0.clone();
            pool(threads).install(|| {
                gemm_into(
                    &mut c[3..],
                    Mat::strided(m, n, ldc),
                    &a[2..],
                    Mat::strided(m, k, lda),
                    &b,
                    Mat::rm_t(k, n),
                    -2.0,
                    true,
                    Threads::Pool,
                )
            });
            for i in 0..m {
                for j in 0..ldc {
                    let (got, old) = (c[i * ldc + j], c0[i * ldc + j]);
                    if j < 3 || j >= n + 3 {
                        assert_eq!(got, old, "({i}, {j}) outside the view was written");
                    } else {
                        let w = old - 2.0 * want[i * n + j - 3];
                        assert!((got - w).abs() < 1e-3, "({i}, {j}): {got} vs {w}");
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
