//! Causal multi-head self-attention core: `softmax(q·kᵀ/√d + mask)·v` per (batch, head).
//!
//! Input is the fused projection `qkv[b,t,0..3C]` (q | k | v, heads side by side, as GPT-2's
//! `c_attn` produces it). Each (batch, head) pair is one rayon task. A task packs its head's
//! operands once, in the panels brigade's matrix kernel streams (`sgemm::pack`), then walks
//! the rows a tile's height at a time: scores, softmax and `P·V` for those query rows are done
//! while they sit in L1, with only the tiles on or left of the diagonal computed. The products
//! are that kernel's micro-kernel on the widest tile the machine runs (6 × 16 on AVX2, 12 × 32
//! on AVX-512), so no product pays for packing twice. Each element is the same `fma` chain on
//! either tile: a wider tile's extra query rows and key columns only add zeros of P or dS at a
//! sum's ends, so for finite q, k, v and dO the results are bit for bit the same on both (an
//! infinite or NaN value where P is zero turns `0 · x` into NaN on whichever tile reaches it).

use super::docs::Docs;
use super::mat::Mat;
use super::sgemm::{pack, Buf, Kernel, Tile};
use super::SendPtr;
use rayon::prelude::*;
use std::cell::RefCell;

thread_local! {
    /// Each thread's packed operands and scratch, reused from task to task and step to step.
    static BUFS: RefCell<Vec<Buf>> = RefCell::default();
}

/// Runs `f` with this thread's buffers (taken out while in use: a task that rayon starts on
/// this thread inside `f` gets fresh ones instead of a double borrow).
fn with_bufs<R>(f: impl FnOnce(&mut [Buf; 7]) -> R) -> R {
    let mut v = BUFS.with(|b| std::mem::take(&mut *b.borrow_mut()));
    v.resize_with(7, Buf::default);
    let bufs: &mut [Buf; 7] = (&mut v[..]).try_into().expect("seven buffers");
    let r = f(bufs);
    BUFS.with(|b| *b.borrow_mut() = v);
    r
}

/// Shapes of one attention call, and how q, k and v lie in their buffer.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub b: usize,
    pub t: usize,
    /// Query heads, and key/value heads (grouped-query attention: each key/value head serves
    /// `heads / kv_heads` consecutive query heads).
    pub heads: usize,
    pub kv_heads: usize,
    pub hd: usize,
    /// GPT-2's fused rows `q | k | v` (`[b, t, 3C]`); else three blocks, `q [b·t, heads·hd]`
    /// then `k` and `v` `[b·t, kv_heads·hd]` each (the Llama family's separate projections).
    pub fused: bool,
}

impl AttnShape {
    /// GPT-2's attention: `heads` heads of width c / heads, fused q | k | v rows.
    pub fn fused(b: usize, t: usize, c: usize, heads: usize) -> AttnShape {
        AttnShape { b, t, heads, kv_heads: heads, hd: c / heads, fused: true }
    }

    /// Grouped-query attention over separate q, k, v blocks.
    pub fn grouped(b: usize, t: usize, heads: usize, kv_heads: usize, hd: usize) -> AttnShape {
        assert!(kv_heads > 0 && heads.is_multiple_of(kv_heads), "{heads} query heads in groups of {kv_heads}");
        AttnShape { b, t, heads, kv_heads, hd, fused: false }
    }

    fn hd(&self) -> usize {
        self.hd
    }
    pub fn probs_len(&self) -> usize {
        self.b * self.heads * self.t * self.t
    }
    /// Elements of the output (and of q).
    pub fn out_len(&self) -> usize {
        self.b * self.t * self.heads * self.hd
    }
    /// Elements of the q, k, v buffer.
    pub fn qkv_len(&self) -> usize {
        self.b * self.t * (self.heads + 2 * self.kv_heads) * self.hd
    }
    /// Query heads per key/value head.
    pub fn group(&self) -> usize {
        self.heads / self.kv_heads
    }
}

/// Where one head's q, k, v (in `qkv`) and output (in a `[b, t, heads·hd]` buffer) start,
/// and their `t × hd` views.
struct Head {
    q: usize,
    k: usize,
    v: usize,
    o: usize,
    /// `t × hd` views of q, of k and v (their row strides), and of the output.
    qm: Mat,
    kvm: Mat,
    out: Mat,
}

impl Head {
    /// Query head `bh % heads` of sequence `bh / heads`, with its key/value head.
    fn new(s: &AttnShape, bh: usize) -> Head {
        let (b, h, t, hd) = (bh / s.heads, bh % s.heads, s.t, s.hd());
        let (qw, kvw, n) = (s.heads * hd, s.kv_heads * hd, s.b * s.t);
        let kvh = h / s.group();
        if s.fused {
            let q = b * t * 3 * qw + h * hd;
            let m = Mat::strided(t, hd, 3 * qw);
            return Head {
                q,
                k: q + qw,
                v: q + 2 * qw,
                o: b * t * qw + h * hd,
                qm: m,
                kvm: m,
                out: Mat::strided(t, hd, qw),
            };
        }
        Head {
            q: b * t * qw + h * hd,
            k: n * qw + b * t * kvw + kvh * hd,
            v: n * (qw + kvw) + b * t * kvw + kvh * hd,
            o: b * t * qw + h * hd,
            qm: Mat::strided(t, hd, qw),
            kvm: Mat::strided(t, hd, kvw),
            out: Mat::strided(t, hd, qw),
        }
    }
}

/// x (a `t × hd` view at `at`) packed as the right operand `xᵀ` (`hd × t`): NR-row strips of
/// x, `hd` deep. Used where the product runs over the head dimension (`q·kᵀ`, `dO·vᵀ`).
fn strips_over_rows<'a, const NR: usize>(buf: &'a mut Buf, x: &[f32], at: usize, m: Mat) -> &'a [f32] {
    let (t, hd) = (m.rows, m.cols);
    let dst = buf.get(t.div_ceil(NR) * hd * NR);
    // SAFETY: rows 0..t, columns 0..hd of the view lie inside x (checked by the callers' asserts).
    unsafe { pack::<NR>(dst, x.as_ptr().wrapping_add(at), m, 0, t, 0, hd) };
    dst
}

/// x (a `t × hd` view at `at`) packed as the right operand x: NR-column strips over the head
/// dimension, `t` deep. Used where the product runs over positions (`P·v`, `dS·k`, `Pᵀ·dO`).
fn strips_over_cols<'a, const NR: usize>(buf: &'a mut Buf, x: &[f32], at: usize, m: Mat) -> &'a [f32] {
    let (t, hd) = (m.rows, m.cols);
    let dst = buf.get(hd.div_ceil(NR) * t * NR);
    // SAFETY: as above.
    unsafe { pack::<NR>(dst, x.as_ptr().wrapping_add(at), m.t(), 0, hd, 0, t) };
    dst
}

/// x (a `t × hd` view at `at`) packed as the left operand: MR-row panels, `hd` deep.
fn panels<'a, const MR: usize>(buf: &'a mut Buf, x: &[f32], at: usize, m: Mat) -> &'a [f32] {
    let (t, hd) = (m.rows, m.cols);
    let dst = buf.get(t.div_ceil(MR) * hd * MR);
    // SAFETY: as above.
    unsafe { pack::<MR>(dst, x.as_ptr().wrapping_add(at), m, 0, t, 0, hd) };
    dst
}

/// Rows `i0..i0+rows`, columns `c0..c0+kc` of a view packed as one MR-row panel into `dst`.
fn panel_of<'a, const MR: usize>(
    dst: &'a mut [f32],
    x: &[f32],
    m: Mat,
    i0: usize,
    rows: usize,
    c0: usize,
    kc: usize,
) -> &'a [f32] {
    let dst = &mut dst[..kc * MR];
    assert!(i0 + rows <= m.rows && c0 + kc <= m.cols && x.len() > (m.rows - 1) * m.rs + (m.cols - 1) * m.cs);
    // SAFETY: checked just above.
    unsafe { pack::<MR>(dst, x.as_ptr(), m, i0, rows, c0, kc) };
    dst
}

/// Rows `i0..i0 + rows` of a `t × t` block `sq_rows` (starting at row i0), columns lo..live
/// (`lo` a whole strip's start; `live` rounded up to whole strips, clipped to t):
/// `alpha · a_panel · xᵀ` over the head dimension, with x packed by `strips_over_rows` (the
/// scores `q·kᵀ`, or `dO·vᵀ`). Overwritten.
#[allow(clippy::too_many_arguments)]
fn left_of_diagonal<const MR: usize, const NR: usize>(
    kernel: Kernel,
    sq_rows: &mut [f32],
    t: usize,
    rows: usize,
    (lo, live): (usize, usize),
    a: &[f32],
    x: &[f32],
    hd: usize,
    alpha: f32,
) {
    assert!(sq_rows.len() >= rows * t && lo.is_multiple_of(NR));
    for (st, j0) in (lo..live).step_by(NR).enumerate().map(|(k, j0)| (k + lo / NR, j0)) {
        // SAFETY: rows 0..rows, columns j0..j0 + NR clipped to t lie inside `sq_rows` (checked).
        unsafe {
            kernel(
                hd,
                &a[..hd * MR],
                &x[st * hd * NR..][..hd * NR],
                sq_rows.as_mut_ptr().add(j0),
                Mat::rm(t, t),
                rows,
                NR.min(t - j0),
                alpha,
                false,
            )
        };
    }
}

/// `c[rows × hd] (+)= alpha · a_panel · x[from..from + kc, ..]` with x packed by
/// `strips_over_cols` (`t` deep): a panel of P or dS times v, k, dO or q. Overwritten, or
/// added to with `beta`.
///
/// # Safety
/// The `rows × cm.cols` block at `c` (strides of `cm`) must be this task's alone to write.
#[allow(clippy::too_many_arguments)]
unsafe fn times_head<const MR: usize, const NR: usize>(
    kernel: Kernel,
    c: *mut f32,
    cm: Mat,
    rows: usize,
    a: &[f32],
    x: &[f32],
    t: usize,
    from: usize,
    kc: usize,
    (alpha, beta): (f32, bool),
) {
    let hd = cm.cols;
    for (sd, d0) in (0..hd).step_by(NR).enumerate() {
        let strip = &x[(sd * t + from) * NR..][..kc * NR];
        // SAFETY: the caller vouches for the block; columns d0..d0 + NR clipped to hd lie in it.
        unsafe { kernel(kc, &a[..kc * MR], strip, c.add(d0), cm, rows, NR.min(hd - d0), alpha, beta) };
    }
}

/// Writes `out[b, t, heads·hd]` and saves the attention probabilities `probs[b,h,t,t]` for
/// backward. Each query row attends to the keys of its document (`docs`: all before it, or
/// those of its own packed document); the probabilities of the others are zero, which is all
/// the backward needs to know of the mask.
pub fn attention_forward(out: &mut [f32], probs: &mut [f32], qkv: &[f32], s: AttnShape, docs: Docs) {
    attention_forward_on(Tile::here(), out, probs, qkv, s, docs)
}

/// [`attention_forward`] on a chosen tile (the AVX-512 one only where AVX-512 runs).
pub(crate) fn attention_forward_on(
    tile: Tile,
    out: &mut [f32],
    probs: &mut [f32],
    qkv: &[f32],
    s: AttnShape,
    docs: Docs,
) {
    match tile {
        Tile::Avx2 => {
            forward::<{ Tile::Avx2.rows() }, { Tile::Avx2.cols() }>(Tile::Avx2.kernel(), out, probs, qkv, s, docs)
        }
        Tile::Avx512 => {
            forward::<{ Tile::Avx512.rows() }, { Tile::Avx512.cols() }>(Tile::Avx512.kernel(), out, probs, qkv, s, docs)
        }
    }
}

/// [`attention_forward`] on `MR × NR` tiles of `kernel`.
fn forward<const MR: usize, const NR: usize>(
    kernel: Kernel,
    out: &mut [f32],
    probs: &mut [f32],
    qkv: &[f32],
    s: AttnShape,
    docs: Docs,
) {
    let (t, hd) = (s.t, s.hd());
    assert!(out.len() == s.out_len() && qkv.len() == s.qkv_len() && probs.len() == s.probs_len());
    docs.check(s.b * t, t);
    let scale = 1.0 / (hd as f32).sqrt();
    let outp = SendPtr(out.as_mut_ptr());
    let sq = Mat::rm(t, t);
    let ow = s.heads * hd;
    probs.par_chunks_mut(t * t).enumerate().for_each(|(bh, p)| {
        let hv = Head::new(&s, bh);
        let row0 = bh / s.heads * t;
        with_bufs(|[qb, kb, vb, pb, ..]| {
            let q = panels::<MR>(qb, qkv, hv.q, hv.qm);
            let k = strips_over_rows::<NR>(kb, qkv, hv.k, hv.kvm);
            let v = strips_over_cols::<NR>(vb, qkv, hv.v, hv.kvm);
            let pp = pb.get(t * MR);
            for (pnl, i0) in (0..t).step_by(MR).enumerate() {
                let rows = MR.min(t - i0);
                let live = i0 + rows; // keys 0..live reach these rows
                                      // keys before `lo` (whole strips before the panel's earliest first key) reach none
                let first = |i: usize| docs.first_key(row0 + i, t);
                let lo = first(i0) / NR * NR;
                let qa = &q[pnl * hd * MR..(pnl + 1) * hd * MR];
                left_of_diagonal::<MR, NR>(kernel, &mut p[i0 * t..], t, rows, (lo, live), qa, k, hd, scale);
                for i in i0..live {
                    let row = &mut p[i * t..(i + 1) * t];
                    let (before, rest) = row.split_at_mut(first(i));
                    let (seen, masked) = rest.split_at_mut(i + 1 - before.len());
                    before.fill(0.0);
                    super::math::softmax_row(seen);
                    masked.fill(0.0);
                }
                let pa = panel_of::<MR>(pp, p, sq, i0, rows, lo, live - lo);
                // SAFETY: task (b, h) writes only rows of batch b, columns h·hd..(h+1)·hd of
                // `out`; no two tasks share an element, and `out` outlives the parallel loop.
                unsafe {
                    times_head::<MR, NR>(
                        kernel,
                        outp.at(hv.o + i0 * ow),
                        hv.out,
                        rows,
                        pa,
                        v,
                        t,
                        lo,
                        live - lo,
                        (1.0, false),
                    )
                };
            }
        })
    });
}

/// From `dout[b, t, heads·hd]`, writes `dqkv` (laid out as `qkv`; overwritten, not
/// accumulated). The mask (causal, or packed documents') is read off `probs`: zero where a
/// row does not attend, so no gradient flows there. One task per key/value head: its group's query heads in turn, their
/// contributions to dk and dv summed in head order.
pub fn attention_backward(dqkv: &mut [f32], dout: &[f32], qkv: &[f32], probs: &[f32], s: AttnShape) {
    attention_backward_on(Tile::here(), dqkv, dout, qkv, probs, s)
}

/// [`attention_backward`] on a chosen tile (the AVX-512 one only where AVX-512 runs).
pub(crate) fn attention_backward_on(
    tile: Tile,
    dqkv: &mut [f32],
    dout: &[f32],
    qkv: &[f32],
    probs: &[f32],
    s: AttnShape,
) {
    match tile {
        Tile::Avx2 => {
            backward::<{ Tile::Avx2.rows() }, { Tile::Avx2.cols() }>(Tile::Avx2.kernel(), dqkv, dout, qkv, probs, s)
        }
        Tile::Avx512 => backward::<{ Tile::Avx512.rows() }, { Tile::Avx512.cols() }>(
            Tile::Avx512.kernel(),
            dqkv,
            dout,
            qkv,
            probs,
            s,
        ),
    }
}

/// [`attention_backward`] on `MR × NR` tiles of `kernel`.
fn backward<const MR: usize, const NR: usize>(
    kernel: Kernel,
    dqkv: &mut [f32],
    dout: &[f32],
    qkv: &[f32],
    probs: &[f32],
    s: AttnShape,
) {
    let (t, hd, group) = (s.t, s.hd(), s.group());
    assert!(dout.len() == s.out_len() && qkv.len() == s.qkv_len() && dqkv.len() == qkv.len());
    assert_eq!(probs.len(), s.probs_len());
    let scale = 1.0 / (hd as f32).sqrt();
    let dp = SendPtr(dqkv.as_mut_ptr());
    let sq = Mat::rm(t, t);
    let qrs = hv_rs(&s);
    probs.par_chunks(group * t * t).enumerate().for_each(|(bk, pg)| {
        with_bufs(|[b0, b1, b2, b3, b4, b5, b6]| {
            let first = Head::new(&s, bk * group);
            let vt = strips_over_rows::<NR>(b1, qkv, first.v, first.kvm);
            let kd = strips_over_cols::<NR>(b2, qkv, first.k, first.kvm);
            for (j, p) in pg.chunks(t * t).enumerate() {
                let hv = Head::new(&s, bk * group + j);
                let doa = panels::<MR>(b0, dout, hv.o, hv.out);
                let qd = strips_over_cols::<NR>(b3, qkv, hv.q, hv.qm);
                let dod = strips_over_cols::<NR>(b4, dout, hv.o, hv.out);
                let pp = b5.get(t * MR);
                // every element of a row of dS that pass 2 reads is written in pass 1
                let ds = b6.get(t * t);
                // Query rows, MR at a time: dP = dO·vᵀ on the tiles left of the diagonal, the
                // softmax backward dS = P ⊙ (dP − rowsum(dP ⊙ P)) (zero above the diagonal),
                // dQ = dS·k·scale.
                for (pnl, i0) in (0..t).step_by(MR).enumerate() {
                    let rows = MR.min(t - i0);
                    let live = i0 + rows;
                    let da = &doa[pnl * hd * MR..(pnl + 1) * hd * MR];
                    left_of_diagonal::<MR, NR>(kernel, &mut ds[i0 * t..], t, rows, (0, live), da, vt, hd, 1.0);
                    for i in i0..live {
                        let pr = &p[i * t..(i + 1) * t];
                        let dr = &mut ds[i * t..(i + 1) * t];
                        let (seen, after) = dr.split_at_mut(i + 1);
                        let dot = super::math::dot(&pr[..=i], seen);
                        // zipped slices, not indices over `0..=i`: LLVM vectorises this form
                        seen.iter_mut().zip(&pr[..=i]).for_each(|(d, &pv)| *d = pv * (*d - dot));
                        after.fill(0.0);
                    }
                    let a = panel_of::<MR>(pp, ds, sq, i0, rows, 0, live);
                    // SAFETY: task (b, kv head) alone writes its query heads' q columns and its
                    // key/value head's k and v columns of batch b.
                    unsafe {
                        times_head::<MR, NR>(
                            kernel,
                            dp.at(hv.q + i0 * qrs),
                            hv.qm,
                            rows,
                            a,
                            kd,
                            t,
                            0,
                            live,
                            (scale, false),
                        )
                    };
                }
                // Key rows, MR at a time: they receive from query rows j0..t only (causal):
                // dV += Pᵀ·dO, dK += dSᵀ·q·scale, the group's first head overwriting.
                let kvrs = hv.kvm.rs;
                for j0 in (0..t).step_by(MR) {
                    let rows = MR.min(t - j0);
                    let kq = t - j0;
                    let beta = j > 0;
                    let (dv, dk) = (dp.at(hv.v + j0 * kvrs), dp.at(hv.k + j0 * kvrs));
                    let a = panel_of::<MR>(pp, p, sq.t(), j0, rows, j0, kq);
                    // SAFETY: as above.
                    unsafe { times_head::<MR, NR>(kernel, dv, hv.kvm, rows, a, dod, t, j0, kq, (1.0, beta)) };
                    let a = panel_of::<MR>(pp, ds, sq.t(), j0, rows, j0, kq);
                    // SAFETY: as above.
                    unsafe { times_head::<MR, NR>(kernel, dk, hv.kvm, rows, a, qd, t, j0, kq, (scale, beta)) };
                }
            }
        })
    });
}

/// The row stride of q.
fn hv_rs(s: &AttnShape) -> usize {
    if s.fused {
        3 * s.heads * s.hd
    } else {
        s.heads * s.hd
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Forward and backward of one shape on a tile: the output, the probabilities, dqkv.
    fn run(tile: Tile, s: AttnShape, docs: Docs, qkv: &[f32], dout: &[f32]) -> [Vec<f32>; 3] {
        let mut out = vec![f32::NAN; s.out_len()];
        let mut probs = vec![f32::NAN; s.probs_len()];
        let mut dqkv = vec![f32::NAN; s.qkv_len()];
        attention_forward_on(tile, &mut out, &mut probs, qkv, s, docs);
        attention_backward_on(tile, &mut dqkv, dout, qkv, &probs, s);
        [out, probs, dqkv]
    }

    #[test]
    fn the_wide_tile_gives_the_narrow_tiles_bits() {
        if !crate::tensor::sgemm::runs_here() || !crate::tensor::wide() {
            eprintln!("skipped: this machine (or BRIGADE_SIMD) runs no AVX-512, so only the 6 × 16 tile is here");
            return;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(47);
        // lengths off both tiles' edges (a 12-row panel's and a 32-column strip's), head widths
        // under, at and over a strip, fused and grouped heads, whole sequences and packed documents
        let cases = [
            (AttnShape::fused(2, 37, 48, 3), false),
            (AttnShape::fused(1, 64, 128, 2), true),
            (AttnShape::grouped(2, 45, 6, 2, 40), false),
            (AttnShape::grouped(1, 100, 4, 1, 64), true),
            (AttnShape::grouped(3, 13, 2, 2, 8), false),
        ];
        for (s, packed) in cases {
            let qkv: Vec<f32> = (0..s.qkv_len()).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let dout: Vec<f32> = (0..s.out_len()).map(|_| rng.gen_range(-1.0..1.0)).collect();
            // documents of 1 to 19 tokens packed into each sequence
            let pos: Vec<u32> = (0..s.b * s.t)
                .scan(0u32, |p, i| {
                    let start = i % s.t == 0 || (packed && rng.gen_range(0..19) == 0);
                    *p = if start { 0 } else { *p + 1 };
                    Some(*p)
                })
                .collect();
            let docs = if packed { Docs::of(Some(&pos)) } else { Docs::WHOLE };
            let narrow = run(Tile::Avx2, s, docs, &qkv, &dout);
            let wide = run(Tile::Avx512, s, docs, &qkv, &dout);
            for (what, (n, w)) in ["output", "probabilities", "dqkv"].iter().zip(narrow.iter().zip(&wide)) {
                let differ = n.iter().zip(w).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                assert_eq!(differ, 0, "{s:?} packed {packed}: {what} differs in {differ} of {} values", n.len());
            }
        }
    }
}
