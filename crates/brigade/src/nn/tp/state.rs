//! The tensor-parallel group's view of the flat buffers: the full model from every rank's
//! slice, the gradient norm of a model cut across ranks, and the sums that keep replicated
//! parameters identical under sequence parallelism.

use super::Tp;
use crate::error::{Error, Result};
use crate::params::ParamLayout;
use brigade_comm::{Comm, ReduceOp};
use std::ops::Range;

/// The full buffer (in `layout.full()`) from this rank's `local` one: an all-gather over the
/// group, every rank gets it. On one rank, the buffer itself.
pub fn gather_full(tp: &Comm, layout: &ParamLayout, local: &[f32]) -> Result<Vec<f32>> {
    if tp.size() == 1 {
        return Ok(local.to_vec());
    }
    let mut all = vec![0f32; local.len() * tp.size()];
    tp.all_gather(local, &mut all)
        .map_err(|e| Error::Train(format!("gathering the model across the tensor-parallel group failed: {e}")))?;
    Ok(layout.assemble_full(&all, tp.size()))
}

/// The squared L2 norm of the full model's gradient from this rank's `g`, whose ranges `cut`
/// hold parameters cut across the group and `replicated` parameters every rank holds: the cut
/// ones' squares summed over the group, the replicated ones (equal on every rank) counted once.
pub fn grad_sq_norm(tp: &Tp, g: &[f32], cut: &[Range<usize>], replicated: &[Range<usize>]) -> Result<f64> {
    let sq = |rs: &[Range<usize>]| rs.iter().map(|r| crate::tensor::math::grad_sq_norm(&g[r.clone()])).sum::<f64>();
    if tp.size() == 1 {
        return Ok(sq(cut) + sq(replicated));
    }
    let replicated = if tp.rank() == 0 { sq(replicated) } else { 0.0 };
    let mut v = [(sq(cut) + replicated) as f32];
    tp.all_reduce(&mut v, ReduceOp::Sum)?;
    Ok(v[0] as f64)
}

/// Under sequence parallelism each rank computed the gradients of the replicated parameters
/// (LayerNorm, row-parallel biases, positions) from its rows only: sums them over the group,
/// in the `replicated` ranges of `g`, so that the parameters stay identical on every rank.
pub fn sum_replicated_grads(tp: &Tp, g: &mut [f32], replicated: &[Range<usize>]) -> Result<()> {
    if !tp.sp {
        return Ok(());
    }
    let mut buf: Vec<f32> = replicated.iter().flat_map(|r| g[r.clone()].iter().copied()).collect();
    tp.all_reduce(&mut buf, ReduceOp::Sum)?;
    let mut at = 0;
    for r in replicated {
        let n = r.len();
        g[r.clone()].copy_from_slice(&buf[at..at + n]);
        at += n;
    }
    Ok(())
}
