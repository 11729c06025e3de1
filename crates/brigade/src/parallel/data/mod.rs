//! Data parallelism: every rank of a dp group holds the same parameters and runs its own share
//! of the global batch; their gradients are summed (each rank's loss is already scaled by the
//! global number of targets, so the sum is the single worker's gradient). With ZeRO the sum
//! is reduce-scattered: each rank keeps only its pieces of the gradient (`zero`), updates only
//! its pieces of the parameters with only its pieces of the AdamW moments, and the pieces are
//! gathered (ZeRO-1/2) or stay apart until a unit is needed (ZeRO-3, `store`).

pub mod store;
pub mod zero;

use crate::error::{Error, Result};
use crate::parallel::mesh::Axis;
use brigade_comm::{Comm, ReduceOp};
use std::ops::Range;

/// The axes of the group data parallelism runs over: the ranks that hold the same parameters
/// and see different tokens. A gradient is summed over them, ZeRO cuts its pieces across them,
/// the loss adds up over them. The dp group while cp = 1; once sequences are split over cp,
/// each rank also holds part of every sequence of its replica (torchtitan's `loss` mesh,
/// picotron's `cp_dp_group`, Megatron-Core's dp × cp group).
pub const REPLICAS: &[Axis] = &[Axis::Dp, Axis::Cp];

/// How gradients are reduced and optimizer state is split over the dp group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataParallel {
    /// ZeRO stage: 0 (replicated), 1 (optimizer state sharded), 2 (and gradients), 3 (and
    /// parameters).
    pub zero: u8,
    /// Gradient elements per all-reduce bucket (ZeRO-0).
    pub bucket_elems: usize,
}

impl Default for DataParallel {
    fn default() -> Self {
        // 25 MB of f32, as PyTorch DDP's default bucket
        DataParallel { zero: 0, bucket_elems: 25_000_000 / 4 }
    }
}

impl DataParallel {
    pub fn validate(&self) -> Result<()> {
        if self.zero > 3 {
            return Err(Error::Layout(format!("zero={}: expected a ZeRO stage 0, 1, 2 or 3", self.zero)));
        }
        if self.bucket_elems == 0 {
            return Err(Error::Layout("the gradient bucket must hold at least one element".into()));
        }
        Ok(())
    }
}

use zero::comm_err;

/// Sums the `ranges` of `g` over `comm`, packed into one all-reduce.
pub fn sum_ranges(comm: &Comm, g: &mut [f32], ranges: &[Range<usize>]) -> Result<()> {
    if comm.size() == 1 || ranges.is_empty() {
        return Ok(());
    }
    crate::nn::tp::state::reduce_ranges(g, ranges, |buf| comm.all_reduce(buf, ReduceOp::Sum).map_err(comm_err))
}

/// The parts of `0..total` that none of the sorted, disjoint `ranges` covers.
pub fn complement(total: usize, ranges: &[Range<usize>]) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut at = 0;
    for r in ranges {
        if r.start > at {
            out.push(at..r.start);
        }
        at = r.end;
    }
    if at < total {
        out.push(at..total);
    }
    out
}

/// A reduction that launches its pieces while backward still runs: told each time the
/// gradients of `g[from..]` are final (bucket by bucket, or ZeRO-1's unit by unit).
pub trait OnReady {
    fn ready(&mut self, g: &[f32], from: usize);
}

impl OnReady for BucketReducer<'_> {
    fn ready(&mut self, g: &[f32], from: usize) {
        BucketReducer::ready(self, g, from)
    }
}

impl OnReady for zero::UnitReducer<'_> {
    fn ready(&mut self, g: &[f32], from: usize) {
        zero::UnitReducer::ready(self, g, from)
    }
}

/// The buckets of a `total`-element gradient, last elements first (the order backward
/// finishes them), each at most `bucket` elements.
pub fn buckets(total: usize, bucket: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut end = total;
    while end > 0 {
        let start = end.saturating_sub(bucket);
        out.push(start..end);
        end = start;
    }
    out
}

/// Reduces ZeRO-0 gradient buckets while backward still runs: backward reports how far from
/// the end the gradients are final, and every bucket inside that region starts its all-reduce
/// on the communicator's thread at once.
pub struct BucketReducer<'a> {
    dp: &'a Comm,
    buckets: Vec<Range<usize>>,
    next: usize,
    pending: Vec<(Range<usize>, brigade_comm::Handle<Vec<f32>>)>,
}

impl<'a> BucketReducer<'a> {
    pub fn new(dp: &'a Comm, total: usize, cfg: &DataParallel) -> BucketReducer<'a> {
        BucketReducer { dp, buckets: buckets(total, cfg.bucket_elems), next: 0, pending: Vec::new() }
    }

    /// (buckets launched, buckets)
    pub fn launched(&self) -> (usize, usize) {
        (self.next, self.buckets.len())
    }

    /// `g[from..]` holds final gradients: launch the buckets that lie inside it.
    pub fn ready(&mut self, g: &[f32], from: usize) {
        while self.next < self.buckets.len() && self.buckets[self.next].start >= from {
            let r = self.buckets[self.next].clone();
            self.pending.push((r.clone(), self.dp.all_reduce_async(g[r].to_vec(), ReduceOp::Sum)));
            self.next += 1;
        }
    }

    /// Launches what is left, waits for every bucket and writes the sums back into `g`.
    pub fn finish(mut self, g: &mut [f32]) -> Result<()> {
        self.ready(g, 0);
        for (r, h) in self.pending {
            g[r].copy_from_slice(&h.wait().map_err(comm_err)?);
        }
        Ok(())
    }
}

/// A scalar summed over the dp group when each rank holds only its pieces (ZeRO ≥ 1).
pub fn sum_sharded(dp: &Comm, x: f64, cfg: &DataParallel) -> Result<f64> {
    if cfg.zero == 0 {
        return Ok(x);
    }
    sum_scalar(dp, x)
}

/// A scalar summed over the group (the loss sum of each rank's share of the batch).
pub fn sum_scalar(dp: &Comm, x: f64) -> Result<f64> {
    if dp.size() == 1 {
        return Ok(x);
    }
    let mut v = [x as f32];
    dp.all_reduce(&mut v, ReduceOp::Sum).map_err(comm_err)?;
    Ok(v[0] as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_the_buffer_backwards() {
        assert_eq!(buckets(10, 4), vec![6..10, 2..6, 0..2]);
        assert_eq!(buckets(8, 4), vec![4..8, 0..4]);
        assert_eq!(buckets(3, 100), vec![0..3]);
        assert!(buckets(0, 4).is_empty());
    }
}
