//! LayerNorm with a learned scale and shift.

use super::ensure;
use crate::params::{Init, ParamLayout, View};
use crate::tensor::layernorm::{layernorm_backward, layernorm_forward};

#[derive(Clone, Debug)]
pub struct LayerNorm {
    pub w: View,
    pub b: View,
    pub c: usize,
}

/// What backward needs: the normalised output (the next layer's input) and row statistics.
#[derive(Default)]
pub struct LnStash {
    pub out: Vec<f32>,
    pub mean: Vec<f32>,
    pub rstd: Vec<f32>,
}

impl LayerNorm {
    pub fn new(layout: &mut ParamLayout, prefix: &str, c: usize) -> LayerNorm {
        let w = layout.add(&format!("{prefix}.weight"), &[c], Init::Ones, false);
        let b = layout.add(&format!("{prefix}.bias"), &[c], Init::Zeros, false);
        LayerNorm { w, b, c }
    }

    pub fn forward(&self, p: &[f32], x: &[f32], st: &mut LnStash) {
        let n = x.len() / self.c;
        ensure(&mut st.out, x.len());
        ensure(&mut st.mean, n);
        ensure(&mut st.rstd, n);
        layernorm_forward(&mut st.out, &mut st.mean, &mut st.rstd, x, self.w.of(p), self.b.of(p), self.c);
    }

    /// Accumulates into `dx` (the residual gradient) and the parameter gradients.
    pub fn backward(&self, p: &[f32], g: &mut [f32], x: &[f32], st: &LnStash, dout: &[f32], dx: &mut [f32]) {
        let (wo, bo) = (self.w.offset, self.b.offset);
        assert_eq!(bo, wo + self.c, "LayerNorm weight and bias are adjacent in the layout");
        let (dw, db) = g[wo..bo + self.c].split_at_mut(self.c);
        layernorm_backward(dx, dw, db, dout, x, &st.mean, &st.rstd, self.w.of(p), self.c);
    }
}
