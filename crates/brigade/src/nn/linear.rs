//! `y = x·W + b` with `W` stored `[in, out]` (GPT-2's Conv1D layout, as Hugging Face keeps it).

use super::WeightGrads;
use crate::params::{Init, ParamLayout, View};
use crate::tensor::elementwise::add_column_sums;
use crate::tensor::{matmul, ROW_CHUNK};
use rayon::prelude::*;

#[derive(Clone, Debug)]
pub struct Linear {
    pub w: View,
    pub b: View,
    pub d_in: usize,
    pub d_out: usize,
}

impl Linear {
    pub fn new(layout: &mut ParamLayout, prefix: &str, d_in: usize, d_out: usize, std: f32) -> Linear {
        let w = layout.add(&format!("{prefix}.weight"), &[d_in, d_out], Init::Normal(std), true);
        let b = layout.add(&format!("{prefix}.bias"), &[d_out], Init::Zeros, false);
        Linear { w, b, d_in, d_out }
    }

    /// `out[n, out] = x[n, in]·W + b`.
    pub fn forward(&self, p: &[f32], x: &[f32], out: &mut [f32]) {
        let n = x.len() / self.d_in;
        let bias = self.b.of(p);
        out.par_chunks_mut(self.d_out).with_min_len(ROW_CHUNK).for_each(|row| row.copy_from_slice(bias));
        matmul(out, x, self.w.of(p), n, self.d_in, self.d_out, false, false, true);
    }

    /// Accumulates `db += Σ dout` and `dW += xᵀ·dout` through `dw` (at once, or left for a
    /// zero-bubble W); overwrites `dx = dout·Wᵀ`.
    pub fn backward(&self, p: &[f32], g: &mut [f32], x: &[f32], dout: &[f32], dx: &mut [f32], dw: &mut WeightGrads) {
        let n = x.len() / self.d_in;
        dw.add(g, self.w, x, dout, (self.d_in, n, self.d_out));
        add_column_sums(self.b.of_mut(g), dout);
        matmul(dx, dout, self.w.of(p), n, self.d_out, self.d_in, false, true, false);
    }
}
