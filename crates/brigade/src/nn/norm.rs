//! The normalisation a block uses: GPT-2's LayerNorm (scale and shift) or the Llama family's
//! RMSNorm (scale only). Both keep their statistics in an [`LnStash`].

use super::{ensure, LayerNorm, LnStash};
use crate::params::{Init, ParamLayout, View};
use crate::tensor::rmsnorm::{rmsnorm_backward, rmsnorm_forward};

#[derive(Clone, Debug)]
pub struct RmsNorm {
    pub w: View,
    pub c: usize,
    pub eps: f32,
}

impl RmsNorm {
    pub fn new(layout: &mut ParamLayout, prefix: &str, c: usize, eps: f32) -> RmsNorm {
        let w = layout.add(&format!("{prefix}.weight"), &[c], Init::Ones, false);
        RmsNorm { w, c, eps }
    }
}

#[derive(Clone, Debug)]
pub enum Norm {
    Layer(LayerNorm),
    Rms(RmsNorm),
}

impl Norm {
    /// Forward into `st.out`, keeping the row statistics (`rstd`; LayerNorm also `mean`).
    pub fn forward(&self, p: &[f32], x: &[f32], st: &mut LnStash) {
        match self {
            Norm::Layer(l) => l.forward(p, x, st),
            Norm::Rms(r) => {
                ensure(&mut st.out, x.len());
                ensure(&mut st.rstd, x.len() / r.c);
                rmsnorm_forward(&mut st.out, &mut st.rstd, x, r.w.of(p), r.c, r.eps);
            }
        }
    }

    /// Accumulates into `dx` (the residual gradient) and the parameter gradients.
    pub fn backward(&self, p: &[f32], g: &mut [f32], x: &[f32], st: &LnStash, dout: &[f32], dx: &mut [f32]) {
        match self {
            Norm::Layer(l) => l.backward(p, g, x, st, dout, dx),
            Norm::Rms(r) => rmsnorm_backward(dx, r.w.of_mut(g), dout, x, &st.rstd, r.w.of(p), r.c),
        }
    }
}
