//! Matrix multiplication on row-major views with explicit strides.
//!
//! Two kernels, picked per machine at run time by benchmark (see README): on x86-64 with AVX2
//! and FMA but no AVX-512, brigade's own BLIS-style kernel ([`super::sgemm`]); elsewhere the
//! `gemm` crate, which dispatches AVX-512 kernels at run time. Both parallelise over the
//! caller's rayon pool, so `--threads` controls them.

use gemm::Parallelism;

/// A strided matrix operand: element (i, j) is at `data[i * rs + j * cs]`.
#[derive(Clone, Copy, Debug)]
pub struct Mat {
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl Mat {
    /// A dense row-major `rows × cols` matrix.
    pub fn rm(rows: usize, cols: usize) -> Mat {
        Mat { rows, cols, rs: cols, cs: 1 }
    }
    /// The transpose of a dense row-major matrix stored as `cols × rows`.
    pub fn rm_t(rows: usize, cols: usize) -> Mat {
        Mat { rows, cols, rs: 1, cs: rows }
    }
    /// A row-major block with a wider row stride (a column slice of a bigger matrix).
    pub fn strided(rows: usize, cols: usize, rs: usize) -> Mat {
        Mat { rows, cols, rs, cs: 1 }
    }
    /// Transposed view of a strided block.
    pub fn t(self) -> Mat {
        Mat { rows: self.cols, cols: self.rows, rs: self.cs, cs: self.rs }
    }
    fn span(&self) -> usize {
        if self.rows == 0 || self.cols == 0 {
            0
        } else {
            (self.rows - 1) * self.rs + (self.cols - 1) * self.cs + 1
        }
    }
}

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
    /// environment variable `BRIGADE_MATMUL=gemm-crate` asks for the `gemm` crate (to compare
    /// whole training steps on both).
    pub fn resolve(self) -> Backend {
        static AUTO: std::sync::OnceLock<Backend> = std::sync::OnceLock::new();
        match self {
            Backend::Auto => *AUTO.get_or_init(|| {
                let forced = std::env::var("BRIGADE_MATMUL").is_ok_and(|v| v == "gemm-crate");
                if super::sgemm::available() && !forced {
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
/// As [`gemm_ptr`]; `Backend::Brigade` also needs [`super::sgemm::available`].
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
        assert!(super::sgemm::available(), "matmul: brigade's kernel needs AVX2 and FMA");
        let t = match par {
            Parallelism::Rayon(t) => t,
            _ => 1,
        };
        // SAFETY: as below; the CPU features are checked.
        unsafe { super::sgemm::sgemm(c, cm, a.as_ptr(), am, b.as_ptr(), bm, alpha, accumulate, t) };
        return;
    }
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
