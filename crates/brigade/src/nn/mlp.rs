//! GPT-2's feed-forward block: `c_proj(gelu(c_fc(x)))`, hidden width 4·C.

use super::{ensure, Linear};
use crate::params::ParamLayout;
use crate::tensor::elementwise::{gelu_backward, gelu_forward};

#[derive(Clone, Debug)]
pub struct Mlp {
    pub c_fc: Linear,
    pub c_proj: Linear,
}

#[derive(Default)]
pub struct MlpStash {
    pub fc: Vec<f32>,
    pub act: Vec<f32>,
}

impl Mlp {
    pub fn new(layout: &mut ParamLayout, prefix: &str, c: usize, std: f32, proj_std: f32) -> Mlp {
        let c_fc = Linear::new(layout, &format!("{prefix}.c_fc"), c, 4 * c, std);
        let c_proj = Linear::new(layout, &format!("{prefix}.c_proj"), 4 * c, c, proj_std);
        Mlp { c_fc, c_proj }
    }

    pub fn forward(&self, p: &[f32], x: &[f32], st: &mut MlpStash, out: &mut [f32]) {
        let n = x.len() / self.c_fc.d_in;
        ensure(&mut st.fc, n * self.c_fc.d_out);
        ensure(&mut st.act, n * self.c_fc.d_out);
        self.c_fc.forward(p, x, &mut st.fc);
        gelu_forward(&mut st.act, &st.fc);
        self.c_proj.forward(p, &st.act, out);
    }

    /// Overwrites `dx`; `dh` is scratch of the hidden width.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        p: &[f32],
        g: &mut [f32],
        x: &[f32],
        st: &MlpStash,
        dout: &[f32],
        dx: &mut [f32],
        dh: &mut Vec<f32>,
    ) {
        ensure(dh, st.act.len());
        self.c_proj.backward(p, g, &st.act, dout, dh);
        gelu_backward(dh, &st.fc);
        self.c_fc.backward(p, g, x, dh, dx);
    }
}
