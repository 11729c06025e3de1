//! GPT-2's feed-forward block: `c_proj(gelu(c_fc(x)))`, hidden width 4·C, split across a
//! tensor-parallel group: `c_fc` column-parallel, `c_proj` row-parallel, so the GELU runs on
//! each rank's block of the hidden units with no communication between the two.

use super::{ensure, Grads};
use crate::nn::tp::{ColumnParallelLinear, RowParallelLinear};
use crate::params::ParamLayout;
use crate::tensor::elementwise::{gelu_backward, gelu_forward};

#[derive(Clone, Debug)]
pub struct Mlp {
    pub c_fc: ColumnParallelLinear,
    pub c_proj: RowParallelLinear,
}

#[derive(Default)]
pub struct MlpStash {
    pub fc: Vec<f32>,
    pub act: Vec<f32>,
}

impl Mlp {
    pub fn new(layout: &mut ParamLayout, prefix: &str, c: usize, tp: usize, (std, proj_std): (f32, f32)) -> Mlp {
        let c_fc = ColumnParallelLinear::new(layout, &format!("{prefix}.c_fc"), c, 4 * c, 1, tp, std);
        let c_proj = RowParallelLinear::new(layout, &format!("{prefix}.c_proj"), 4 * c, c, tp, proj_std);
        Mlp { c_fc, c_proj }
    }

    /// `part = gelu(c_fc(x))·W_proj` on this rank's hidden units (no bias: added after `g`).
    pub fn forward(&self, p: &[f32], x: &[f32], st: &mut MlpStash, part: &mut Vec<f32>) {
        let n = x.len() / self.c_fc.local.d_in;
        ensure(&mut st.fc, n * self.c_fc.local.d_out);
        ensure(&mut st.act, n * self.c_fc.local.d_out);
        ensure(part, n * self.c_proj.d_out);
        self.c_fc.forward(p, x, &mut st.fc);
        gelu_forward(&mut st.act, &st.fc);
        self.c_proj.forward_partial(p, &st.act, part);
    }

    /// Overwrites `dx` with this rank's part of the input gradient; `dh` is scratch of the
    /// local hidden width.
    pub fn backward(
        &self,
        gr: &mut Grads,
        x: &[f32],
        st: &MlpStash,
        dout: &[f32],
        dx: &mut Vec<f32>,
        dh: &mut Vec<f32>,
    ) {
        let Grads { p, g, dw } = gr;
        let (p, g) = (*p, &mut **g);
        ensure(dh, st.act.len());
        ensure(dx, x.len());
        self.c_proj.backward(p, g, &st.act, dout, dh, dw);
        gelu_backward(dh, &st.fc);
        self.c_fc.backward(p, g, x, dh, dx, dw);
    }
}
