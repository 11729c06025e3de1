//! The feed-forward block, split across a tensor-parallel group: GPT-2's
//! `c_proj(gelu(c_fc(x)))` (width 4·C) or the Llama family's SwiGLU
//! `down_proj(silu(gate_proj(x)) ⊙ up_proj(x))`. The input projections are column-parallel
//! and the output one row-parallel, so the activation runs on each rank's block of the hidden
//! units with no communication between them.

use super::{ensure, Grads};
use crate::nn::tp::{ColumnParallelLinear, RowParallelLinear};
use crate::params::ParamLayout;
use crate::tensor::elementwise::{gelu_backward, gelu_forward, swiglu_backward, swiglu_forward};

#[derive(Clone, Debug)]
pub struct Mlp {
    /// GPT-2's `c_fc`, or SwiGLU's `up_proj`.
    pub c_fc: ColumnParallelLinear,
    /// SwiGLU's `gate_proj` (none for GPT-2).
    pub gate: Option<ColumnParallelLinear>,
    /// GPT-2's `c_proj`, or SwiGLU's `down_proj`.
    pub c_proj: RowParallelLinear,
}

#[derive(Default)]
pub struct MlpStash {
    /// `c_fc` (or `up_proj`) output, the gate's, and the activation.
    pub fc: Vec<f32>,
    pub gate: Vec<f32>,
    pub act: Vec<f32>,
}

/// The backward's scratch buffers: the hidden units' gradient `dh`, and under SwiGLU the up
/// projection's gradient `dup` and its share `dx2` of the input gradient.
pub struct MlpScratch<'a> {
    pub dh: &'a mut Vec<f32>,
    pub dup: &'a mut Vec<f32>,
    pub dx2: &'a mut Vec<f32>,
}

impl MlpStash {
    pub fn floats(&self) -> usize {
        self.fc.len() + self.gate.len() + self.act.len()
    }
}

impl Mlp {
    /// GELU between two biased products stored `[in, out]` (`c_fc`, `c_proj`, named as the
    /// family's spec names them) of hidden width `m`.
    pub fn new(
        layout: &mut ParamLayout,
        (c_fc, c_proj): (&str, &str),
        (c, m): (usize, usize),
        tp: usize,
        (std, proj_std): (f32, f32),
    ) -> Mlp {
        let c_fc = ColumnParallelLinear::new(layout, c_fc, c, m, 1, tp, std);
        let c_proj = RowParallelLinear::new(layout, c_proj, m, c, tp, proj_std);
        Mlp { c_fc, gate: None, c_proj }
    }

    /// SwiGLU of hidden width `m` (`[gate, up, down]` named as the family's spec names them),
    /// weights stored `[out, in]` without biases.
    pub fn swiglu(
        layout: &mut ParamLayout,
        [gate, up, down]: [&str; 3],
        (c, m): (usize, usize),
        tp: usize,
        std: f32,
    ) -> Mlp {
        let gate = ColumnParallelLinear::out_in(layout, gate, (c, m), tp, 1, std, false);
        let c_fc = ColumnParallelLinear::out_in(layout, up, (c, m), tp, 1, std, false);
        let c_proj = RowParallelLinear::out_in(layout, down, (m, c), tp, std, false);
        Mlp { c_fc, gate: Some(gate), c_proj }
    }

    /// `part = act(x)·W_proj` on this rank's hidden units (no bias: added after `g`).
    pub fn forward(&self, p: &[f32], x: &[f32], st: &mut MlpStash, part: &mut Vec<f32>) {
        let n = x.len() / self.c_fc.local.d_in;
        let m = self.c_fc.local.d_out;
        ensure(&mut st.fc, n * m);
        ensure(&mut st.act, n * m);
        ensure(part, n * self.c_proj.d_out);
        self.c_fc.forward(p, x, &mut st.fc);
        match &self.gate {
            None => gelu_forward(&mut st.act, &st.fc),
            Some(gate) => {
                ensure(&mut st.gate, n * m);
                gate.forward(p, x, &mut st.gate);
                swiglu_forward(&mut st.act, &st.gate, &st.fc);
            }
        }
        self.c_proj.forward_partial(p, &st.act, part);
    }

    /// Overwrites `dx` with this rank's part of the input gradient.
    pub fn backward(&self, gr: &mut Grads, x: &[f32], st: &MlpStash, dout: &[f32], dx: &mut Vec<f32>, sc: MlpScratch) {
        let MlpScratch { dh, dup, dx2 } = sc;
        let Grads { p, g, dw } = gr;
        let (p, g) = (*p, &mut **g);
        ensure(dh, st.act.len());
        ensure(dx, x.len());
        self.c_proj.backward(p, g, &st.act, dout, dh, dw);
        match &self.gate {
            None => {
                gelu_backward(dh, &st.fc);
                self.c_fc.backward(p, g, x, dh, dx, dw);
            }
            Some(gate) => {
                ensure(dup, st.act.len());
                ensure(dx2, x.len());
                // dh becomes the gate's gradient, dup the up projection's
                swiglu_backward(dh, dup, &st.gate, &st.fc);
                gate.backward(p, g, x, dh, dx, dw);
                self.c_fc.backward(p, g, x, dup, dx2, dw);
                crate::tensor::elementwise::add_into(dx, dx2);
            }
        }
    }
}
