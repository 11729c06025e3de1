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
        // scores = q·kᵀ·scale (the masked upper triangle is computed and then discarded)
        gemm_into(
            p,
            Mat::rm(t, t),
            &qkv[qo..],
            qm,
            &qkv[ko..],
            km.t(),
            scale,
            false,
            Threads::Single,
        );
        for i in 0..t {
            let row = &mut p[i * t..(i + 1) * t];
            let (live, masked) = row.split_at_mut(i + 1);
            let mx = live.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
            let mut sum = 0f32;
            for v in live.iter_mut() {
                *v = super::math::exp(*v - mx);
                sum += *v;
            }
            let inv = 1.0 / sum;
            live.iter_mut().for_each(|v| *v *= inv);
            masked.fill(0.0);
        }
        let (oo, om) = head_view(&s, c, b, h * hd);
        // SAFETY: task (b, h) writes only rows of batch b, columns h·hd..(h+1)·hd of `out`;
        // no two tasks share an element, and `out` outlives the parallel loop.
        unsafe {
            gemm_ptr(
                outp.at(oo),
                om,
                p,
                Mat::rm(t, t),
                &qkv[vo..],
                vm,
                1.0,
                false,
                Threads::Single,
            )
        };
    });
}

/// From `dout[b,t,C]`, writes `dqkv[b,t,3C]` (overwritten, not accumulated).
pub fn attention_backward(
    dqkv: &mut [f32],
    dout: &[f32],
    qkv: &[f32],
    probs: &[f32],
    s: AttnShape,
) {
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
        // dP = dO·vᵀ
        gemm_into(
            &mut ds,
            Mat::rm(t, t),
            &dout[oo..],
            om,
            &qkv[vo..],
            vm.t(),
            1.0,
            false,
            Threads::Single,
        );
        // dV = Pᵀ·dO
        // SAFETY: as in forward, task (b, h) alone writes its head's q, k and v columns of batch b.
        unsafe {
            gemm_ptr(
                dp.at(vo),
                vm,
                p,
                Mat::rm(t, t).t(),
                &dout[oo..],
                om,
                1.0,
                false,
                Threads::Single,
            )
        };
        // softmax backward: dS = P ⊙ (dP − rowsum(dP ⊙ P)), zero above the diagonal
        for i in 0..t {
            let pr = &p[i * t..(i + 1) * t];
            let dr = &mut ds[i * t..(i + 1) * t];
            let dot: f32 = pr[..=i].iter().zip(&dr[..=i]).map(|(a, b)| a * b).sum();
            for j in 0..=i {
                dr[j] = pr[j] * (dr[j] - dot);
            }
            dr[i + 1..].fill(0.0);
        }
        // dQ = dS·k·scale, dK = dSᵀ·q·scale
        unsafe {
            gemm_ptr(
                dp.at(qo),
                qm,
                &ds,
                Mat::rm(t, t),
                &qkv[ko..],
                km,
                scale,
                false,
                Threads::Single,
            );
            gemm_ptr(
                dp.at(ko),
                km,
                &ds,
                Mat::rm(t, t).t(),
                &qkv[qo..],
                qm,
                scale,
                false,
                Threads::Single,
            );
        }
    });
}
