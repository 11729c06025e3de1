//! Megatron's two halves of a split matrix product (Shoeybi et al. 2019). A column-parallel
//! layer holds a block of the output columns and needs its whole input (`f` before it); a
//! row-parallel layer holds the matching block of input rows, so each rank's output is a
//! partial sum (`g` after it) and its bias is added once, after the sum. On one rank they are
//! the plain `Linear`.

use crate::nn::{Linear, WeightGrads};
use crate::params::{Init, ParamLayout, Split, View};
use crate::tensor::matmul;

/// `y[:, cols] = x·W[:, cols] + b[cols]`: this rank's output columns.
#[derive(Clone, Debug)]
pub struct ColumnParallelLinear {
    /// The local block as a plain layer (`d_out` is the local width).
    pub local: Linear,
}

impl ColumnParallelLinear {
    /// `parts` equal segments side by side in the output (3 for q | k | v), each split.
    pub fn new(
        layout: &mut ParamLayout,
        prefix: &str,
        d_in: usize,
        d_out: usize,
        parts: usize,
        tp: usize,
        std: f32,
    ) -> Self {
        let split = Split::Cols { parts };
        let w = layout.add_split(&format!("{prefix}.weight"), &[d_in, d_out], split, tp, Init::Normal(std), true);
        let b = layout.add_split(&format!("{prefix}.bias"), &[d_out], split, tp, Init::Zeros, false);
        ColumnParallelLinear { local: Linear { w, b, d_in, d_out: d_out / tp, out_in: false } }
    }

    /// The weight stored `[out, in]` (`torch.nn.Linear`), rows cut across the group; with
    /// `copies` > 1 the output is cut into tp / copies blocks, each held by `copies`
    /// consecutive ranks (key/value heads replicated when tp exceeds them). The bias is optional.
    pub fn out_in(
        layout: &mut ParamLayout,
        prefix: &str,
        (d_in, d_out): (usize, usize),
        tp: usize,
        copies: usize,
        std: f32,
        bias: bool,
    ) -> Self {
        let split = Split::kv_heads(copies);
        let w = layout.add_split(&format!("{prefix}.weight"), &[d_out, d_in], split, tp, Init::Normal(std), true);
        let b = if bias {
            layout.add_split(&format!("{prefix}.bias"), &[d_out], split, tp, Init::Zeros, false)
        } else {
            View { offset: layout.total, len: 0 }
        };
        ColumnParallelLinear { local: Linear { w, b, d_in, d_out: d_out * copies / tp, out_in: true } }
    }

    pub fn forward(&self, p: &[f32], x: &[f32], out: &mut [f32]) {
        self.local.forward(p, x, out);
    }

    /// Accumulates the local weight and bias gradients; `dx` is this rank's part of the input
    /// gradient (summed over the group by `f` backward).
    pub fn backward(&self, p: &[f32], g: &mut [f32], x: &[f32], dout: &[f32], dx: &mut [f32], dw: &mut WeightGrads) {
        self.local.backward(p, g, x, dout, dx, dw);
    }
}

/// `y = Σ_ranks x[:, rows]·W[rows, :]`, then `+ b`: this rank's partial product.
#[derive(Clone, Debug)]
pub struct RowParallelLinear {
    pub w: View,
    /// Replicated: added after the partial products are summed.
    pub b: View,
    /// The local input width.
    pub d_in: usize,
    pub d_out: usize,
    /// Whether `W` is stored `[out, in]` (its columns, the input, cut across the group).
    pub out_in: bool,
}

impl RowParallelLinear {
    pub fn new(layout: &mut ParamLayout, prefix: &str, d_in: usize, d_out: usize, tp: usize, std: f32) -> Self {
        let w = layout.add_split(&format!("{prefix}.weight"), &[d_in, d_out], Split::Rows, tp, Init::Normal(std), true);
        let b = layout.add(&format!("{prefix}.bias"), &[d_out], Init::Zeros, false);
        RowParallelLinear { w, b, d_in: d_in / tp, d_out, out_in: false }
    }

    /// The weight stored `[out, in]` (`torch.nn.Linear`), its input columns cut across the
    /// group; the (replicated) bias optional.
    pub fn out_in(
        layout: &mut ParamLayout,
        prefix: &str,
        (d_in, d_out): (usize, usize),
        tp: usize,
        std: f32,
        bias: bool,
    ) -> Self {
        let split = Split::Cols { parts: 1 };
        let w = layout.add_split(&format!("{prefix}.weight"), &[d_out, d_in], split, tp, Init::Normal(std), true);
        let b = if bias {
            layout.add(&format!("{prefix}.bias"), &[d_out], Init::Zeros, false)
        } else {
            View { offset: layout.total, len: 0 }
        };
        RowParallelLinear { w, b, d_in: d_in / tp, d_out, out_in: true }
    }

    /// `part = x·W_local`, without the bias.
    pub fn forward_partial(&self, p: &[f32], x: &[f32], part: &mut [f32]) {
        let n = x.len() / self.d_in;
        matmul(part, x, self.w.of(p), n, self.d_in, self.d_out, false, self.out_in, false);
    }

    pub fn bias<'a>(&self, p: &'a [f32]) -> &'a [f32] {
        self.b.of(p)
    }

    /// Accumulates `dW += xᵀ·dout` and overwrites `dx = dout·Wᵀ` (the local input columns).
    pub fn backward(&self, p: &[f32], g: &mut [f32], x: &[f32], dout: &[f32], dx: &mut [f32], dw: &mut WeightGrads) {
        let n = x.len() / self.d_in;
        if self.out_in {
            dw.add(g, self.w, dout, x, (self.d_out, n, self.d_in));
        } else {
            dw.add(g, self.w, x, dout, (self.d_in, n, self.d_out));
        }
        matmul(dx, dout, self.w.of(p), n, self.d_out, self.d_in, false, !self.out_in, false);
    }

    /// Accumulates the bias gradient from this rank's rows of the output gradient (all rows,
    /// or under sequence parallelism a block, summed over the group later).
    pub fn bias_backward(&self, g: &mut [f32], drows: &[f32]) {
        if self.b.len > 0 {
            crate::tensor::elementwise::add_column_sums(self.b.of_mut(g), drows);
        }
    }
}
