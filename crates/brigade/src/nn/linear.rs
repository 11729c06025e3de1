//! `y = x·W + b` with `W` stored `[in, out]` (GPT-2's Conv1D layout, as Hugging Face keeps it)
//! or `[out, in]` (`torch.nn.Linear`'s, as the Llama family keeps it); the bias is optional.

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
    /// Whether `W` is stored `[out, in]`.
    pub out_in: bool,
}

impl Linear {
    pub fn new(layout: &mut ParamLayout, prefix: &str, d_in: usize, d_out: usize, std: f32) -> Linear {
        let w = layout.add(&format!("{prefix}.weight"), &[d_in, d_out], Init::Normal(std), true);
        let b = layout.add(&format!("{prefix}.bias"), &[d_out], Init::Zeros, false);
        Linear { w, b, d_in, d_out, out_in: false }
    }

    fn has_bias(&self) -> bool {
        self.b.len > 0
    }

    /// `out[n, out] = x[n, in]·W + b`.
    pub fn forward(&self, p: &[f32], x: &[f32], out: &mut [f32]) {
        let n = x.len() / self.d_in;
        if self.has_bias() {
            let bias = self.b.of(p);
            out.par_chunks_mut(self.d_out).with_min_len(ROW_CHUNK).for_each(|row| row.copy_from_slice(bias));
        }
        matmul(out, x, self.w.of(p), n, self.d_in, self.d_out, false, self.out_in, self.has_bias());
    }

    /// Accumulates `db += Σ dout` and `dW += xᵀ·dout` (`doutᵀ·x` stored `[out, in]`) through
    /// `dw` (at once, or left for a zero-bubble W); overwrites `dx = dout·Wᵀ`.
    pub fn backward(&self, p: &[f32], g: &mut [f32], x: &[f32], dout: &[f32], dx: &mut [f32], dw: &mut WeightGrads) {
        let n = x.len() / self.d_in;
        if self.out_in {
            dw.add(g, self.w, dout, x, (self.d_out, n, self.d_in));
        } else {
            dw.add(g, self.w, x, dout, (self.d_in, n, self.d_out));
        }
        if self.has_bias() {
            add_column_sums(self.b.of_mut(g), dout);
        }
        matmul(dx, dout, self.w.of(p), n, self.d_out, self.d_in, false, !self.out_in, false);
    }
}
