//! The communication of tensor parallelism, in conjugate pairs (Megatron's `mappings.py`):
//! each op states its forward and its backward, side by side.
//!
//! - `f`: identity forward, all-reduce backward — entering the column-parallel layer, whose
//!   input is used by every rank and whose input gradient each rank holds only a part of;
//! - `g`: all-reduce forward, identity backward — leaving the row-parallel layer, whose output
//!   each rank holds only a part of.
//!
//! With sequence parallelism (Korthikanti et al. 2022) the residual stream, LayerNorm and the
//! biases work on a rank's block of rows; `f` becomes all-gather forward / reduce-scatter
//! backward and `g` reduce-scatter forward / all-gather backward. On one rank all are nothing.

use crate::error::{Error, Result};
use brigade_comm::{Comm, ReduceOp};
use std::ops::Range;

/// One rank's handle on its tensor-parallel group, passed to every forward and backward.
#[derive(Clone, Copy)]
pub struct Tp<'a> {
    comm: Option<&'a Comm>,
    /// Sequence parallelism: the residual stream is split by rows across the group.
    pub sp: bool,
}

fn comm_err(e: brigade_comm::CommError) -> Error {
    Error::Train(format!("tensor-parallel communication failed: {e}"))
}

impl<'a> Tp<'a> {
    /// The single worker: no group, every op the identity.
    pub const SOLO: Tp<'static> = Tp { comm: None, sp: false };

    pub fn new(comm: &'a Comm, sp: bool) -> Tp<'a> {
        Tp { comm: Some(comm), sp: sp && comm.size() > 1 }
    }

    pub fn size(&self) -> usize {
        self.comm.map_or(1, |c| c.size())
    }

    pub fn rank(&self) -> usize {
        self.comm.map_or(0, |c| c.rank())
    }

    /// The group, when it has more than one rank.
    fn group(&self) -> Option<&'a Comm> {
        self.comm.filter(|c| c.size() > 1)
    }

    /// The rows of the residual stream (of `n`) this rank holds: all, or its block under sp.
    pub fn rows(&self, n: usize) -> Range<usize> {
        if self.sp {
            let per = n / self.size();
            self.rank() * per..(self.rank() + 1) * per
        } else {
            0..n
        }
    }

    /// Sums `buf` over the group in place.
    pub fn all_reduce(&self, buf: &mut [f32], op: ReduceOp) -> Result<()> {
        match self.group() {
            Some(c) => c.all_reduce(buf, op).map_err(comm_err),
            None => Ok(()),
        }
    }

    /// `f` backward: the input gradient of a column-parallel layer, summed over the group.
    pub fn f_backward(&self, dx: &mut [f32]) -> Result<()> {
        self.all_reduce(dx, ReduceOp::Sum)
    }

    /// `g` forward: the output of a row-parallel layer, summed over the group.
    pub fn g_forward(&self, y: &mut [f32]) -> Result<()> {
        self.all_reduce(y, ReduceOp::Sum)
    }

    /// Into the tensor-parallel region: the full-row input of a column-parallel layer from
    /// this rank's rows. `f` forward (the rows themselves), or under sp an all-gather into `buf`.
    pub fn enter<'b>(&self, rows: &'b [f32], buf: &'b mut Vec<f32>) -> Result<&'b [f32]> {
        match self.group().filter(|_| self.sp) {
            None => Ok(rows),
            Some(c) => {
                crate::nn::ensure(buf, rows.len() * c.size());
                c.all_gather(rows, buf).map_err(comm_err)?;
                Ok(buf)
            }
        }
    }

    /// `enter` backward: this rank's rows of the summed input gradient. `f` backward (an
    /// all-reduce in place), or under sp a reduce-scatter into `rows`.
    pub fn enter_backward<'b>(&self, dfull: &'b mut [f32], rows: &'b mut Vec<f32>) -> Result<&'b [f32]> {
        self.sum_into_rows(dfull, rows, Tp::f_backward)
    }

    /// Out of the tensor-parallel region: this rank's rows of the sum of the row-parallel
    /// layer's partial outputs. `g` forward (an all-reduce in place), or under sp a
    /// reduce-scatter into `rows`.
    pub fn exit<'b>(&self, part: &'b mut [f32], rows: &'b mut Vec<f32>) -> Result<&'b [f32]> {
        self.sum_into_rows(part, rows, Tp::g_forward)
    }

    /// `exit` backward: the full-row output gradient from this rank's rows. `g` backward (the
    /// rows themselves), or under sp an all-gather into `buf`.
    pub fn exit_backward<'b>(&self, drows: &'b [f32], buf: &'b mut Vec<f32>) -> Result<&'b [f32]> {
        self.enter(drows, buf)
    }

    /// This rank's rows of the sum over the group of the full-row `x`: `all_rows` (`f`
    /// backward or `g` forward) in place, or under sp a reduce-scatter into `rows`.
    fn sum_into_rows<'b>(
        &self,
        x: &'b mut [f32],
        rows: &'b mut Vec<f32>,
        all_rows: fn(&Self, &mut [f32]) -> Result<()>,
    ) -> Result<&'b [f32]> {
        match self.group().filter(|_| self.sp) {
            None => {
                all_rows(self, x)?;
                Ok(x)
            }
            Some(c) => {
                crate::nn::ensure(rows, x.len() / c.size());
                c.reduce_scatter(x, rows, ReduceOp::Sum).map_err(comm_err)?;
                Ok(rows)
            }
        }
    }
}
