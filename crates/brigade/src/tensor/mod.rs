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

/// Whether the 512-bit tiles of the row-invariant kernels run (AVX-512F): they compute the
/// same chains as the 256-bit and portable ones, lane for lane.
/// Strips a task of the quantized products takes (and a one-row tile's width).
pub(crate) const TASK: usize = 4;

/// Rows `from..m` of a quantized product `c[m, n] = a[m, k] · w` in the strips `ss`: 4-row
/// tiles (`four(acc, rows, strip)`), then single rows × four strips (`one(acc, row, strips)`,
/// the last strip repeated to fill); each tile stored once.
#[allow(clippy::too_many_arguments)]
pub(crate) fn quantized_rows(
    cp: SendPtr,
    a: &[f32],
    (from, m, k, n): (usize, usize, usize, usize),
    ss: std::ops::Range<usize>,
    four: impl Fn(&mut [[f32; STRIP]; 4], &[f32], usize),
    one: impl Fn(&mut [[f32; STRIP]; TASK], &[f32], [usize; TASK]),
) {
    let mut i = from;
    while i + 4 <= m {
        for s in ss.clone() {
            let mut acc = [[0f32; STRIP]; 4];
            four(&mut acc, &a[i * k..(i + 4) * k], s);
            for (r, accr) in acc.iter().enumerate() {
                store_strip(cp, (i + r) * n, s, n, accr);
            }
        }
        i += 4;
    }
    while i < m {
        let strips: [usize; TASK] = std::array::from_fn(|q| (ss.start + q).min(ss.end - 1));
        let mut acc = [[0f32; STRIP]; TASK];
        one(&mut acc, &a[i * k..(i + 1) * k], strips);
        for (q, s) in ss.clone().enumerate() {
            store_strip(cp, i * n, s, n, &acc[q]);
        }
        i += 1;
    }
}

pub(crate) fn wide() -> bool {
    #[cfg(target_arch = "x86_64")]
    return is_x86_feature_detected!("avx512f");
    #[allow(unreachable_code)]
    false
}
