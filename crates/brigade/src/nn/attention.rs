//! Causal multi-head self-attention: `c_proj(attention(c_attn(x)))`, split by heads across a
//! tensor-parallel group: `c_attn` is column-parallel (each rank computes q, k, v of its
//! heads), `c_proj` row-parallel (each rank's heads give a partial output, summed by `g`).

use super::{ensure, Grads};
use crate::nn::tp::{ColumnParallelLinear, RowParallelLinear};
use crate::params::ParamLayout;
use crate::tensor::attention::{attention_backward, attention_forward, AttnShape};

/// The backward's working space, reused across layers and steps: the gradients of the
/// attention output and of q, k, v, and (selective recompute) the probabilities again.
#[derive(Default)]
pub struct AttnScratch {
    pub datt: Vec<f32>,
    pub dqkv: Vec<f32>,
    pub probs: Vec<f32>,
}

#[derive(Clone, Debug)]
pub struct CausalSelfAttention {
    pub c_attn: ColumnParallelLinear,
    pub c_proj: RowParallelLinear,
    /// Heads on this rank.
    pub heads: usize,
    /// Width of this rank's q (and k, v): heads × head size.
    pub c: usize,
}

#[derive(Default)]
pub struct AttnStash {
    /// Sequences and their length, as the forward ran.
    pub bt: (usize, usize),
    pub qkv: Vec<f32>,
    pub probs: Vec<f32>,
    pub att: Vec<f32>,
}

impl CausalSelfAttention {
    /// `std` and `proj_std`: the initial scale of `c_attn` and of `c_proj`.
    pub fn new(
        layout: &mut ParamLayout,
        prefix: &str,
        (c, heads): (usize, usize),
        tp: usize,
        (std, proj_std): (f32, f32),
    ) -> Self {
        let c_attn = ColumnParallelLinear::new(layout, &format!("{prefix}.c_attn"), c, 3 * c, 3, tp, std);
        let c_proj = RowParallelLinear::new(layout, &format!("{prefix}.c_proj"), c, c, tp, proj_std);
        CausalSelfAttention { c_attn, c_proj, heads: heads / tp, c: c / tp }
    }

    fn shape(&self, b: usize, t: usize) -> AttnShape {
        AttnShape { b, t, c: self.c, heads: self.heads }
    }

    /// `part = attention(c_attn(x))·W_proj` for this rank's heads (no bias: added after `g`).
    /// With `keep_scores` false (selective recompute) the softmax probabilities are not kept:
    /// the backward computes them again from q and k.
    pub fn forward(
        &self,
        p: &[f32],
        x: &[f32],
        (b, t): (usize, usize),
        st: &mut AttnStash,
        part: &mut Vec<f32>,
        keep_scores: bool,
    ) {
        st.bt = (b, t);
        let s = self.shape(b, t);
        let n = b * t;
        ensure(&mut st.qkv, 3 * n * self.c);
        ensure(&mut st.probs, s.probs_len());
        ensure(&mut st.att, n * self.c);
        ensure(part, n * self.c_proj.d_out);
        self.c_attn.forward(p, x, &mut st.qkv);
        attention_forward(&mut st.att, &mut st.probs, &st.qkv, s);
        self.c_proj.forward_partial(p, &st.att, part);
        if !keep_scores {
            st.probs = Vec::new();
        }
    }

    /// From the output gradient `dout` (all rows), overwrites `dx` with this rank's part of
    /// the input gradient.
    pub fn backward(
        &self,
        gr: &mut Grads,
        x: &[f32],
        st: &AttnStash,
        dout: &[f32],
        dx: &mut Vec<f32>,
        sc: &mut AttnScratch,
    ) {
        let (b, t) = st.bt;
        let AttnScratch { datt, dqkv, probs } = sc;
        let Grads { p, g, dw } = gr;
        let (p, g) = (*p, &mut **g);
        let n = b * t;
        let s = self.shape(b, t);
        ensure(datt, n * self.c);
        ensure(dqkv, 3 * n * self.c);
        ensure(dx, x.len());
        let probs: &[f32] = if st.probs.is_empty() {
            // selective recompute: the attention core again (its output lands in `datt`, which
            // the projection's backward then overwrites)
            ensure(probs, s.probs_len());
            attention_forward(datt, probs, &st.qkv, s);
            probs
        } else {
            &st.probs
        };
        self.c_proj.backward(p, g, &st.att, dout, datt, dw);
        attention_backward(dqkv, datt, &st.qkv, probs, s);
        self.c_attn.backward(p, g, x, dqkv, dx, dw);
        // The key bias adds q·b_k to every score of a row, which softmax ignores: its gradient
        // is zero in exact arithmetic. Computed, it is rounding noise that Adam would scale up
        // to a ±lr step of arbitrary sign, different for every summation order (micro-batches,
        // data-parallel ranks); so it is set to its exact value.
        self.c_attn.local.b.of_mut(g)[self.c..2 * self.c].fill(0.0);
    }
}
