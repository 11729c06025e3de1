//! Data parallelism: every rank of a dp group holds the same parameters and runs its own share
//! of the global batch; their gradients are summed (each rank's loss is already scaled by the
//! global number of targets, so the sum is the single worker's gradient). With ZeRO-1 the sum
//! is reduce-scattered: each rank keeps only its shard of the gradient, updates only its shard
//! of the parameters with only its shard of the AdamW moments, and the shards are gathered.

use crate::error::{Error, Result};
use brigade_comm::{chunk_range, Comm, ReduceOp};
use std::ops::Range;

/// How gradients are reduced and optimizer state is split over the dp group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataParallel {
    /// ZeRO stage: 0 (replicated optimizer) or 1 (optimizer state sharded).
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
        if self.zero > 1 {
            return Err(Error::Config(format!(
                "zero={} is not implemented yet (ZeRO-2 and ZeRO-3 come with the bucketed, overlapped reduction); use zero=0 or zero=1",
                self.zero
            )));
        }
        if self.bucket_elems == 0 {
            return Err(Error::Config("the gradient bucket must hold at least one element".into()));
        }
        Ok(())
    }

    /// The slice of the flat buffers this rank updates: all of it without ZeRO.
    pub fn shard(&self, dp: &Comm, total: usize) -> Range<usize> {
        if self.zero == 0 {
            0..total
        } else {
            chunk_range(total, dp.size(), dp.rank())
        }
    }
}

fn comm_err(e: brigade_comm::CommError) -> Error {
    Error::Train(format!("data-parallel communication failed: {e}"))
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

/// Whether gradients are reduced bucket by bucket during the last backward (ZeRO-0, dp > 1).
pub fn overlaps(dp: &Comm, cfg: &DataParallel) -> bool {
    cfg.zero == 0 && dp.size() > 1
}

/// Sums `grads` over the dp group. ZeRO-0: every rank gets the whole sum, bucket by bucket,
/// the buckets in flight together. ZeRO-1: only this rank's shard of `grads` holds the sum
/// afterwards (the rest is stale and must not be read).
pub fn reduce_gradients(dp: &Comm, grads: &mut [f32], cfg: &DataParallel) -> Result<()> {
    if dp.size() == 1 {
        return Ok(());
    }
    if cfg.zero == 0 {
        BucketReducer::new(dp, grads.len(), cfg).finish(grads)?;
    } else {
        let shard = cfg.shard(dp, grads.len());
        let mut out = vec![0f32; shard.len()];
        dp.reduce_scatter(grads, &mut out, ReduceOp::Sum).map_err(comm_err)?;
        grads[shard].copy_from_slice(&out);
    }
    Ok(())
}

/// The squared L2 norm of the summed gradient, from each rank's shard.
pub fn global_sq_norm(dp: &Comm, local_sq: f64, cfg: &DataParallel) -> Result<f64> {
    if cfg.zero == 0 {
        return Ok(local_sq);
    }
    sum_scalar(dp, local_sq)
}

/// After a sharded update: every rank gets every shard of `buf`.
pub fn gather_shards(dp: &Comm, buf: &mut [f32], cfg: &DataParallel) -> Result<()> {
    if cfg.zero == 0 || dp.size() == 1 {
        return Ok(());
    }
    let shard = cfg.shard(dp, buf.len());
    let mine = buf[shard].to_vec();
    dp.all_gather(&mine, buf).map_err(comm_err)
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
