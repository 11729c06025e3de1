//! Causal multi-head self-attention: `c_proj(attention(c_attn(x)))`.

use super::{ensure, Linear};
use crate::params::ParamLayout;
use crate::tensor::attention::{attention_backward, attention_forward, AttnShape};

#[derive(Clone, Debug)]
pub struct CausalSelfAttention {
    pub c_attn: Linear,
    pub c_proj: Linear,
    pub heads: usize,
    pub c: usize,
}

#[derive(Default)]
pub struct AttnStash {
    pub qkv: Vec<f32>,
    pub probs: Vec<f32>,
    pub att: Vec<f32>,
}

impl CausalSelfAttention {
    pub fn new(layout: &mut ParamLayout, prefix: &str, c: usize, heads: usize, std: f32, proj_std: f32) -> Self {
        let c_attn = Linear::new(layout, &format!("{prefix}.c_attn"), c, 3 * c, std);
        let c_proj = Linear::new(layout, &format!("{prefix}.c_proj"), c, c, proj_std);
        CausalSelfAttention { c_attn, c_proj, heads, c }
    }

    fn shape(&self, b: usize, t: usize) -> AttnShape {
        AttnShape { b, t, c: self.c, heads: self.heads }
    }

    pub fn forward(&self, p: &[f32], x: &[f32], b: usize, t: usize, st: &mut AttnStash, out: &mut [f32]) {
        let s = self.shape(b, t);
        ensure(&mut st.qkv, 3 * x.len());
        ensure(&mut st.probs, s.probs_len());
        ensure(&mut st.att, x.len());
        self.c_attn.forward(p, x, &mut st.qkv);
        attention_forward(&mut st.att, &mut st.probs, &st.qkv, s);
        self.c_proj.forward(p, &st.att, out);
    }

    /// Overwrites `dx`; `datt` and `dqkv` are scratch.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        p: &[f32],
        g: &mut [f32],
        x: &[f32],
        b: usize,
        t: usize,
        st: &AttnStash,
        dout: &[f32],
        dx: &mut [f32],
        datt: &mut Vec<f32>,
        dqkv: &mut Vec<f32>,
    ) {
        ensure(datt, x.len());
        ensure(dqkv, 3 * x.len());
        self.c_proj.backward(p, g, &st.att, dout, datt);
        attention_backward(dqkv, datt, &st.qkv, &st.probs, self.shape(b, t));
        self.c_attn.backward(p, g, x, dqkv, dx);
        // The key bias adds q·b_k to every score of a row, which softmax ignores: its gradient
        // is zero in exact arithmetic. Computed, it is rounding noise that Adam would scale up
        // to a ±lr step of arbitrary sign, different for every summation order (micro-batches,
        // data-parallel ranks); so it is set to its exact value.
        self.c_attn.b.of_mut(g)[self.c..2 * self.c].fill(0.0);
    }
}
