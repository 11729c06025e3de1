//! Causal multi-head self-attention core: `softmax(q·kᵀ/√d + mask)·v` per (batch, head).
//!
//! Input is the fused projection `qkv[b,t,0..3C]` (q | k | v, heads side by side, as GPT-2's
//! `c_attn` produces it); heads are addressed with strides, never copied out. Each
//! (batch, head) pair is one rayon task doing single-threaded products.

use super::matmul::{gemm_into, gemm_ptr, Mat, Threads};
use super::SendPtr;
use rayon::prelude::*;

/// Shapes of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub b: usize,
    pub t: usize,
    pub c: usize,
    pub heads: usize,
}

impl AttnShape {
    fn hd(&self) -> usize {
        self.c / self.heads
    }
    pub fn probs_len(&self) -> usize {
        self.b * self.heads * self.t * self.t
    }
}

/// A view of one head's rows inside a `[b, t, width]` buffer (width = 3C for qkv, C for out).
fn head_view(s: &AttnShape, width: usize, b: usize, col: usize) -> (usize, Mat) {
    (b * s.t * width + col, Mat::strided(s.t, s.hd(), width))
}

/// Rows per causal block: products skip the tiles above the diagonal at this granularity.
const BLOCK: usize = 64;

/// `(start, end)` of each block of `BLOCK` rows (or columns) out of `t`.
fn blocks(t: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..t.div_ceil(BLOCK)).map(move |i| (i * BLOCK, ((i + 1) * BLOCK).min(t)))
}

/// Rows `r0..r1`, columns `0..cols` of a dense `t × t` matrix.
fn tile(t: usize, r0: usize, r1: usize, c0: usize, c1: usize) -> (usize, Mat) {
    (r0 * t + c0, Mat::strided(r1 - r0, c1 - c0, t))
}

/// Rows `r0..r1` of a head view.
fn rows(off: usize, m: Mat, r0: usize, r1: usize) -> (usize, Mat) {
    (off + r0 * m.rs, Mat { rows: r1 - r0, ..m })
}

/// Writes `out[b,t,C]` and saves the attention probabilities `probs[b,h,t,t]` for backward.
pub fn attention_forward(out: &mut [f32], probs: &mut [f32], qkv: &[f32], s: AttnShape) {
    let (t, c, hd) = (s.t, s.c, s.hd());
    assert!(out.len() == s.b * t * c && qkv.len() == 3 * out.len() && probs.len() == s.probs_len());
    let scale = 1.0 / (hd as f32).sqrt();
    let outp = SendPtr(out.as_mut_ptr());
    probs.par_chunks_mut(t * t).enumerate().for_each(|(bh, p)| {
        let (b, h) = (bh / s.heads, bh % s.heads);
        let (qo, qm) = head_view(&s, 3 * c, b, h * hd);
        let (ko, km) = head_view(&s, 3 * c, b, c + h * hd);
        let (vo, vm) = head_view(&s, 3 * c, b, 2 * c + h * hd);
        let (oo, om) = head_view(&s, c, b, h * hd);
        for (r0, r1) in blocks(t) {
            // scores of rows r0..r1 against keys 0..r1 (later keys are masked anyway)
            let (so, sm) = tile(t, r0, r1, 0, r1);
            let (qbo, qbm) = rows(qo, qm, r0, r1);
            let (kbo, kbm) = rows(ko, km, 0, r1);
            gemm_into(&mut p[so..], sm, &qkv[qbo..], qbm, &qkv[kbo..], kbm.t(), scale, false, Threads::Single);
            for i in r0..r1 {
                let row = &mut p[i * t..(i + 1) * t];
                let (live, masked) = row.split_at_mut(i + 1);
                super::math::softmax_row(live);
                masked.fill(0.0);
            }
            let (obo, obm) = rows(oo, om, r0, r1);
            let (vbo, vbm) = rows(vo, vm, 0, r1);
            // SAFETY: task (b, h) writes only rows of batch b, columns h·hd..(h+1)·hd of `out`;
            // no two tasks share an element, and `out` outlives the parallel loop.
            unsafe { gemm_ptr(outp.at(obo), obm, &p[so..], sm, &qkv[vbo..], vbm, 1.0, false, Threads::Single) };
        }
    });
}

/// From `dout[b,t,C]`, writes `dqkv[b,t,3C]` (overwritten, not accumulated).
pub fn attention_backward(dqkv: &mut [f32], dout: &[f32], qkv: &[f32], probs: &[f32], s: AttnShape) {
    let (t, c, hd) = (s.t, s.c, s.hd());
    assert!(dout.len() == s.b * t * c && qkv.len() == 3 * dout.len() && dqkv.len() == qkv.len());
    let scale = 1.0 / (hd as f32).sqrt();
    let dp = SendPtr(dqkv.as_mut_ptr());
    probs.par_chunks(t * t).enumerate().for_each(|(bh, p)| {
        let (b, h) = (bh / s.heads, bh % s.heads);
        let (qo, qm) = head_view(&s, 3 * c, b, h * hd);
        let (ko, km) = head_view(&s, 3 * c, b, c + h * hd);
        let (vo, vm) = head_view(&s, 3 * c, b, 2 * c + h * hd);
        let (oo, om) = head_view(&s, c, b, h * hd);
        let mut ds = vec![0f32; t * t];
        for (r0, r1) in blocks(t) {
            // dP = dO·vᵀ on the live tiles, then the softmax backward:
            // dS = P ⊙ (dP − rowsum(dP ⊙ P)), zero above the diagonal
            let (so, sm) = tile(t, r0, r1, 0, r1);
            let (obo, obm) = rows(oo, om, r0, r1);
            let (vbo, vbm) = rows(vo, vm, 0, r1);
            gemm_into(&mut ds[so..], sm, &dout[obo..], obm, &qkv[vbo..], vbm.t(), 1.0, false, Threads::Single);
            for i in r0..r1 {
                let pr = &p[i * t..(i + 1) * t];
                let dr = &mut ds[i * t..(i + 1) * t];
                let dot = super::math::dot(&pr[..=i], &dr[..=i]);
                for j in 0..=i {
                    dr[j] = pr[j] * (dr[j] - dot);
                }
                dr[i + 1..].fill(0.0);
            }
            // dQ[rows] = dS[rows, 0..r1]·k[0..r1]·scale
            let (qbo, qbm) = rows(qo, qm, r0, r1);
            let (kbo, kbm) = rows(ko, km, 0, r1);
            // SAFETY: as in forward, task (b, h) alone writes its head's q, k and v columns of batch b.
            unsafe { gemm_ptr(dp.at(qbo), qbm, &ds[so..], sm, &qkv[kbo..], kbm, scale, false, Threads::Single) };
        }
        for (c0, c1) in blocks(t) {
            // Columns c0..c1 receive from rows c0..t only (causal): dV = Pᵀ·dO, dK = dSᵀ·q·scale
            let (to, tm) = tile(t, c0, t, c0, c1);
            let (vbo, vbm) = rows(vo, vm, c0, c1);
            let (kbo, kbm) = rows(ko, km, c0, c1);
            let (obo, obm) = rows(oo, om, c0, t);
            let (qbo, qbm) = rows(qo, qm, c0, t);
            unsafe {
                gemm_ptr(dp.at(vbo), vbm, &p[to..], tm.t(), &dout[obo..], obm, 1.0, false, Threads::Single);
                gemm_ptr(dp.at(kbo), kbm, &ds[to..], tm.t(), &qkv[qbo..], qbm, scale, false, Threads::Single);
            }
        }
    });
}
