//! Matrix multiplication on row-major views with explicit strides.
//!
//! Two kernels, picked per machine at run time by benchmark (see docs/kernels.md): on x86-64 with AVX2
//! and FMA but no AVX-512, brigade's own BLIS-style kernel ([`super::sgemm`]); elsewhere the
//! `gemm` crate, which dispatches AVX-512 kernels at run time. Both parallelise over the
//! caller's rayon pool, so `--threads` controls them.

pub use super::mat::Mat;
use gemm::Parallelism;

/// Whether a product runs on the current rayon pool or on this thread alone.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    Pool,
    Single,
}

fn parallelism(t: Threads, flops: usize) -> Parallelism {
    let n = rayon::current_num_threads();
    // Tiny products are faster on one thread than split across the pool.
    if t == Threads::Single || n <= 1 || flops < 64 * 64 * 64 {
        Parallelism::None
    } else {
        Parallelism::Rayon(n)
    }
}

/// Which kernel runs a product: [`Backend::Auto`] is the machine's faster one; the others exist
/// so that benchmarks can run both side by side.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Backend {
    Auto,
    Brigade,
    GemmCrate,
}

impl Backend {
    /// The kernel `Auto` resolves to on this machine: brigade's where it runs, unless the
    /// environment variable `BRIGADE_MATMUL=gemm-crate` asks for the `gemm` crate, and
    /// `BRIGADE_MATMUL=brigade` for brigade's kernel (to compare whole training steps on both).
    pub fn resolve(self) -> Backend {
        static AUTO: std::sync::OnceLock<Backend> = std::sync::OnceLock::new();
        match self {
            Backend::Auto => *AUTO.get_or_init(|| {
                let asked = std::env::var("BRIGADE_MATMUL").ok();
                let forced = asked.as_deref() == Some("gemm-crate");
                // `BRIGADE_MATMUL=brigade` asks for brigade's kernel wherever it runs (AVX2 + FMA)
                let ours = asked.as_deref() == Some("brigade") && super::sgemm::runs_here();
                if ours || (super::sgemm::preferred() && !forced) {
                    Backend::Brigade
                } else {
                    Backend::GemmCrate
                }
            }),
            b => b,
        }
    }

    /// How reports name the kernel `self` resolves to.
    pub fn name(self) -> &'static str {
        match self.resolve() {
            Backend::Brigade => "brigade",
            _ => "gemm-crate",
        }
    }
}

/// `c = beta·c + alpha·a·b` where `beta` is 0 (overwrite) or 1 (`accumulate`).
///
/// Panics if a view reaches outside its slice: shapes are the caller's invariant, not user input.
#[allow(clippy::too_many_arguments)]
pub fn gemm_into(
    c: &mut [f32],
    cm: Mat,
    a: &[f32],
    am: Mat,
    b: &[f32],
    bm: Mat,
    alpha: f32,
    accumulate: bool,
    threads: Threads,
) {
    gemm_into_on(Backend::Auto, c, cm, a, am, b, bm, alpha, accumulate, threads)
}

/// As [`gemm_into`] on a chosen kernel (panics if `Backend::Brigade` is not available here).
#[allow(clippy::too_many_arguments)]
pub fn gemm_into_on(
    backend: Backend,
    c: &mut [f32],
    cm: Mat,
    a: &[f32],
    am: Mat,
    b: &[f32],
    bm: Mat,
    alpha: f32,
    accumulate: bool,
    threads: Threads,
) {
    assert!(cm.span() <= c.len());
    // SAFETY: `c` is a unique borrow covering the whole view; the shapes are checked there.
    unsafe { gemm_ptr_on(backend, c.as_mut_ptr(), cm, a, am, b, bm, alpha, accumulate, threads) }
}

/// As [`gemm_into`], writing through a raw pointer so that parallel tasks can fill disjoint
/// strided blocks of one buffer.
///
/// # Safety
/// `c` must be valid for writes over the whole view `cm`, and no other thread may touch the
/// elements of that view during the call.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_ptr(
    c: *mut f32,
    cm: Mat,
    a: &[f32],
    am: Mat,
    b: &[f32],
    bm: Mat,
    alpha: f32,
    accumulate: bool,
    threads: Threads,
) {
    unsafe { gemm_ptr_on(Backend::Auto, c, cm, a, am, b, bm, alpha, accumulate, threads) }
}

/// As [`gemm_ptr`] on a chosen kernel.
///
/// # Safety
/// As [`gemm_ptr`]; `Backend::Brigade` also needs [`super::sgemm::runs_here`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_ptr_on(
    backend: Backend,
    c: *mut f32,
    cm: Mat,
    a: &[f32],
    am: Mat,
    b: &[f32],
    bm: Mat,
    alpha: f32,
    accumulate: bool,
    threads: Threads,
) {
    assert_eq!(am.rows, cm.rows, "matmul: rows of a and c differ");
    assert_eq!(bm.cols, cm.cols, "matmul: cols of b and c differ");
    assert_eq!(am.cols, bm.rows, "matmul: inner dimensions differ");
    assert!(am.span() <= a.len() && bm.span() <= b.len());
    let (m, n, k) = (cm.rows, cm.cols, am.cols);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                for j in 0..n {
                    *c.add(i * cm.rs + j * cm.cs) = 0.0;
                }
            }
        }
        return;
    }
    let par = parallelism(threads, m * n * k);
    if backend.resolve() == Backend::Brigade {
        assert!(super::sgemm::runs_here(), "matmul: brigade's kernel needs AVX2 and FMA");
        let t = match par {
            Parallelism::Rayon(t) => t,
            _ => 1,
        };
        // SAFETY: as below; the CPU features are checked.
        unsafe { super::sgemm::sgemm(c, cm, a.as_ptr(), am, b.as_ptr(), bm, alpha, accumulate, t) };
        return;
    }
    if wants_row_major_b(bm, m) {
        // The copy is this call's own: taken out of the thread's slot while in use, so a nested
        // call that rayon runs on this thread while it waits finds the slot empty, not borrowed.
        let mut bt = ROW_MAJOR_B.with(|slot| slot.take());
        transpose_into(&mut bt, b, bm, matches!(par, Parallelism::Rayon(_)));
        // SAFETY: as below, with b now the dense row-major copy.
        unsafe { gemm_crate(c, cm, a, am, &bt, Mat::rm(k, n), alpha, accumulate, par) };
        ROW_MAJOR_B.with(|slot| slot.set(bt));
        return;
    }
    // SAFETY: as the caller's.
    unsafe { gemm_crate(c, cm, a, am, b, bm, alpha, accumulate, par) }
}

thread_local! {
    static ROW_MAJOR_B: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Whether the gemm crate should get a row-major copy of `b` (a product has `m` rows). The crate
/// runs a right operand stored column by column whose column stride is a multiple of 2 KiB (the
/// input gradient `dy·Wᵀ` of `c_fc`, k = 3072 floats = 12 KiB; tensor-parallel halves, 6 KiB)
/// 10–50% slower than the row-major one, more the fewer rows there are: its reads of such
/// columns fall into the same cache sets. Measured on an AVX-512 machine, 2 threads, as is /
/// copied / row-major GFLOP/s: 1024×3072×768 127 / 156 / 169, 1024×1536×768 158 / 177 / 189,
/// 128×3072×768 53 / 101 / 150; strides that are not such multiples (k = 2304, 1152, 1500) ran
/// as fast as the row-major layout, and there the copy only cost. The copy reads and writes
/// `k·n` floats once (≈ 1.6 ms for 3072 × 768 on 2 threads) against the product's `2·m·k·n`
/// flops, so it pays from tens of rows up; decoding's few rows never take it. The copy stays
/// in a buffer of the calling thread (one per rank thread), so operands past `MAX_COPY` floats
/// (16 MiB), beyond the shapes measured — a tied LM head of width 1024 would hold 206 MB per
/// thread — are left as they are.
fn wants_row_major_b(bm: Mat, m: usize) -> bool {
    const MAX_COPY: usize = 4 << 20;
    bm.rs == 1 && bm.cs.is_multiple_of(512) && m >= 64 && bm.rows * bm.cols <= MAX_COPY
}

/// `out = b` as a dense row-major `b.rows × b.cols` matrix, for a `b` stored column by column
/// (`b.rs == 1`): 8 × 8 tiles read as eight contiguous runs of a column and written as eight
/// contiguous runs of a row, 64 rows of `out` per task over the caller's rayon pool when
/// `parallel`.
fn transpose_into(out: &mut Vec<f32>, b: &[f32], bm: Mat, parallel: bool) {
    use rayon::prelude::*;
    debug_assert_eq!(bm.rs, 1);
    const ROWS: usize = 64;
    let (k, n, cs) = (bm.rows, bm.cols, bm.cs);
    // Every element is written below, so a reused buffer needs no clearing.
    out.resize(k * n, 0.0);
    let rows = |(t, block): (usize, &mut [f32])| {
        let r0 = t * ROWS;
        let nr = block.len() / n;
        let (full_r, full_j) = (nr - nr % 8, n - n % 8);
        for j0 in (0..full_j).step_by(8) {
            for q0 in (0..full_r).step_by(8) {
                let mut tile = [[0f32; 8]; 8];
                for (jj, run) in tile.iter_mut().enumerate() {
                    let s = (j0 + jj) * cs + r0 + q0;
                    *run = b[s..s + 8].try_into().unwrap();
                }
                for q in 0..8 {
                    let row: &mut [f32; 8] = (&mut block[(q0 + q) * n + j0..][..8]).try_into().unwrap();
                    for (jj, v) in row.iter_mut().enumerate() {
                        *v = tile[jj][q];
                    }
                }
            }
        }
        // The ragged edges: the last rows (below a multiple of 8) and the last columns.
        for q in 0..nr {
            let js = if q < full_r { full_j } else { 0 };
            for j in js..n {
                block[q * n + j] = b[j * cs + r0 + q];
            }
        }
    };
    if parallel {
        out.par_chunks_mut(ROWS * n).enumerate().for_each(rows);
    } else {
        out.chunks_mut(ROWS * n).enumerate().for_each(rows);
    }
}

/// The `gemm` crate's product on strided views.
///
/// # Safety
/// As [`gemm_ptr`], with the views' spans inside `a` and `b` checked by the caller.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_crate(
    c: *mut f32,
    cm: Mat,
    a: &[f32],
    am: Mat,
    b: &[f32],
    bm: Mat,
    alpha: f32,
    accumulate: bool,
    par: Parallelism,
) {
    let (m, n, k) = (cm.rows, cm.cols, am.cols);
    // SAFETY: the asserts keep every read inside `a` and `b`; the caller vouches for `c`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c,
            cm.cs as isize,
            cm.rs as isize,
            accumulate,
            a.as_ptr(),
            am.cs as isize,
            am.rs as isize,
            b.as_ptr(),
            bm.cs as isize,
            bm.rs as isize,
            1.0,
            alpha,
            false,
            false,
            false,
            par,
        );
    }
}

/// Dense row-major `c[m,n] (+)= op(a)·op(b)`, where `ta`/`tb` say that `a` is stored as `[k,m]`
/// or `b` as `[n,k]`.
#[allow(clippy::too_many_arguments)]
pub fn matmul(c: &mut [f32], a: &[f32], b: &[f32], m: usize, k: usize, n: usize, ta: bool, tb: bool, accumulate: bool) {
    matmul_on(Backend::Auto, c, a, b, m, k, n, ta, tb, accumulate);
}

/// As [`matmul`] on a chosen kernel (panics if `Backend::Brigade` is not available here).
#[allow(clippy::too_many_arguments)]
pub fn matmul_on(
    backend: Backend,
    c: &mut [f32],
    a: &[f32],
    b: &[f32],
    m: usize,
    k: usize,
    n: usize,
    ta: bool,
    tb: bool,
    accumulate: bool,
) {
    let am = if ta { Mat::rm_t(m, k) } else { Mat::rm(m, k) };
    let bm = if tb { Mat::rm_t(k, n) } else { Mat::rm(k, n) };
    gemm_into_on(backend, c, Mat::rm(m, n), a, am, b, bm, 1.0, accumulate, Threads::Pool);
}

/// Naive triple loop in f64, the reference the tests compare `matmul` against.
#[allow(clippy::too_many_arguments)]
pub fn matmul_reference(a: &[f32], b: &[f32], m: usize, k: usize, n: usize, ta: bool, tb: bool) -> Vec<f32> {
    let mut c = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0f64;
            for p in 0..k {
                let av = if ta { a[p * m + i] } else { a[i * k + p] };
                let bv = if tb { b[j * k + p] } else { b[p * n + j] };
                s += av as f64 * bv as f64;
            }
            c[i * n + j] = s as f32;
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n).map(|i| ((i * 7919 + seed * 104729) % 1999) as f32 / 1999.0 - 0.5).collect()
    }

    #[test]
    fn transpose_into_matches_a_naive_transpose_on_ragged_strided_views() {
        for &(k, n, cs) in &[(8, 8, 8), (13, 11, 1024), (64, 40, 512), (130, 17, 1536), (700, 9, 1024), (1, 1, 512)] {
            let b = values(cs * n, k);
            let bm = Mat { rows: k, cols: n, rs: 1, cs };
            for parallel in [false, true] {
                // A reused buffer, longer than needed and full of other values.
                let mut out = vec![f32::NAN; k * n + 37];
                transpose_into(&mut out, &b, bm, parallel);
                assert_eq!(out.len(), k * n);
                for i in 0..k {
                    for j in 0..n {
                        assert_eq!(out[i * n + j], b[j * cs + i], "({k}, {n}, {cs}) at ({i}, {j})");
                    }
                }
            }
        }
    }

    /// The copy must change nothing but the speed: the product through it has the bits of the
    /// same product on a row-major b, and agrees with the f64 reference.
    #[test]
    fn gemm_crate_with_a_copied_b_gives_the_row_major_products_bits() {
        let lm_head_1024 = Mat { rows: 1024, cols: 50257, rs: 1, cs: 1024 };
        assert!(!wants_row_major_b(lm_head_1024, 1024), "no 206 MB copy held per thread");
        for &(m, k, n, cs) in &[(64, 512, 24, 512), (100, 1024, 37, 1024), (70, 300, 21, 1536), (63, 512, 8, 512)] {
            let a = values(m * k, 1);
            let b = values(cs * n, 2);
            let bm = Mat { rows: k, cols: n, rs: 1, cs };
            assert_eq!(wants_row_major_b(bm, m), m >= 64, "the rule under test");
            let row_major: Vec<f32> = (0..k * n).map(|i| b[(i % n) * cs + i / n]).collect();
            for accumulate in [false, true] {
                let init = values(m * n, 3);
                let (mut c, mut want) = (init.clone(), init.clone());
                gemm_into_on(
                    Backend::GemmCrate,
                    &mut c,
                    Mat::rm(m, n),
                    &a,
                    Mat::rm(m, k),
                    &b,
                    bm,
                    0.5,
                    accumulate,
                    Threads::Pool,
                );
                gemm_into_on(
                    Backend::GemmCrate,
                    &mut want,
                    Mat::rm(m, n),
                    &a,
                    Mat::rm(m, k),
                    &row_major,
                    Mat::rm(k, n),
                    0.5,
                    accumulate,
                    Threads::Pool,
                );
                assert!(c.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()), "({m}, {k}, {n}) bits differ");
                let r = matmul_reference(&a, &row_major, m, k, n, false, false);
                for (i, (&x, &y)) in c.iter().zip(&r).enumerate() {
                    let y = 0.5 * y + if accumulate { init[i] } else { 0.0 };
                    assert!((x - y).abs() <= 1e-4 * (1.0 + y.abs()), "({m}, {k}, {n}) at {i}: {x} vs {y}");
                }
            }
        }
    }
}
