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

/// This rank's share of the squared L2 norm of the full model's gradient, before the group's
/// sum (a scalar all-reduce over tp gives the norm): of this rank's `g`, the ranges `cut` hold
/// parameters cut across the group (each rank's squares count) and `replicated` parameters every
/// rank holds (counted on rank 0 only); `shared` ranges are held alike by each group of `copies`
/// consecutive ranks (counted on the group's first).
pub fn local_sq_norm(
    tp: &Tp,
    g: &[f32],
    (cut, replicated): (&[Range<usize>], &[Range<usize>]),
    (shared, copies): (&[Range<usize>], usize),
) -> f64 {
    let sq = |rs: &[Range<usize>]| rs.iter().map(|r| crate::tensor::math::grad_sq_norm(&g[r.clone()])).sum::<f64>();
    if tp.size() == 1 {
        return sq(cut) + sq(replicated) + sq(shared);
    }
    let replicated = if tp.rank() == 0 { sq(replicated) } else { 0.0 };
    let shared = if tp.rank().is_multiple_of(copies.max(1)) { sq(shared) } else { 0.0 };
    sq(cut) + replicated + shared
}

/// Under sequence parallelism each rank computed the gradients of the replicated parameters
/// (LayerNorm, row-parallel biases, positions) from its rows only: sums them over the group,
/// in the `replicated` ranges of `g`, so that the parameters stay identical on every rank.
pub fn sum_replicated_grads(tp: &Tp, g: &mut [f32], replicated: &[Range<usize>]) -> Result<()> {
    if !tp.sp {
        return Ok(());
    }
    reduce_ranges(g, replicated, |buf| tp.all_reduce(buf, ReduceOp::Sum))
}

/// The `ranges` of `g` packed into one buffer, reduced by `all_reduce`, and put back: one
/// collective for scattered tensors (the data-parallel sums use it too).
pub fn reduce_ranges(
    g: &mut [f32],
    ranges: &[Range<usize>],
    all_reduce: impl FnOnce(&mut [f32]) -> Result<()>,
) -> Result<()> {
    let mut buf: Vec<f32> = ranges.iter().flat_map(|r| g[r.clone()].iter().copied()).collect();
    all_reduce(&mut buf)?;
    let mut at = 0;
    for r in ranges {
        g[r.clone()].copy_from_slice(&buf[at..at + r.len()]);
        at += r.len();
    }
    Ok(())
}

/// Key/value heads replicated over groups of `copies` consecutive ranks: each copy's gradient
/// came from its own query heads only, so the group's copies are summed (in the `shared`
/// ranges of `g`) and every copy takes the same step. One all-reduce over the whole group, each
/// group's sum in its own slot.
pub fn sum_shared_grads(tp: &Tp, g: &mut [f32], shared: &[Range<usize>], copies: usize) -> Result<()> {
    if copies <= 1 || shared.is_empty() {
        return Ok(());
    }
    let n: usize = shared.iter().map(|r| r.len()).sum();
    let groups = tp.size() / copies;
    let slot = tp.rank() / copies;
    let mut buf = vec![0f32; groups * n];
    let mut at = slot * n;
    for r in shared {
        buf[at..at + r.len()].copy_from_slice(&g[r.clone()]);
        at += r.len();
    }
    tp.all_reduce(&mut buf, ReduceOp::Sum)
        .map_err(|e| Error::Train(format!("summing the replicated key/value heads' gradients failed: {e}")))?;
    let mut at = slot * n;
    for r in shared {
        g[r.clone()].copy_from_slice(&buf[at..at + r.len()]);
        at += r.len();
    }
    Ok(())
}
