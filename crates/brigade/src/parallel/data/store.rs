//! The unit store of ZeRO-2 and ZeRO-3 for one micro-batch: each unit's gradient lives in a
//! window only while backward fills it, then is reduce-scattered (asynchronously, while the
//! earlier units run backward) into this rank's pieces; under ZeRO-3 each unit's parameters
//! are gathered from the pieces just before forward or backward needs them, the next unit's
//! gather already in flight, and dropped after. The embedding (tied to the LM head, used first
//! and last) stays gathered for the whole micro-batch.

use super::zero::{comm_err, Shards};
use crate::error::Result;
use crate::models::units::UnitStore;
use brigade_comm::{Comm, Handle, ReduceOp};

pub struct ShardStore<'a> {
    shards: &'a Shards,
    dp: &'a Comm,
    /// ZeRO-2: the whole parameter buffer. ZeRO-3: `None`, units gathered from `pshard`.
    full: Option<&'a [f32]>,
    pshard: &'a [f32],
    windows: Vec<Option<Vec<f32>>>,
    prefetch: Vec<Option<Handle<Vec<f32>>>>,
    grads: Vec<Option<Vec<f32>>>,
    pending: Vec<(usize, Handle<Vec<f32>>)>,
    /// Units whose parameters forward has asked for, and times backward asked for unit 0.
    furthest: usize,
    embedding_backward_calls: usize,
    /// Seconds this store has waited for gathered parameters (ZeRO-3), inside forward and
    /// backward: communication, not compute (the trainer takes it).
    pub waited_s: f64,
}

impl<'a> ShardStore<'a> {
    /// `full`: the whole parameters (ZeRO-2) or `None` (ZeRO-3: from `pshard`).
    pub fn new(shards: &'a Shards, dp: &'a Comm, full: Option<&'a [f32]>, pshard: &'a [f32]) -> Self {
        let n = shards.units.len();
        ShardStore {
            shards,
            dp,
            full,
            pshard,
            windows: (0..n).map(|_| None).collect(),
            prefetch: (0..n).map(|_| None).collect(),
            grads: (0..n).map(|_| None).collect(),
            pending: Vec::new(),
            furthest: 0,
            embedding_backward_calls: 0,
            waited_s: 0.0,
        }
    }

    fn last(&self) -> usize {
        self.shards.units.len() - 1
    }

    /// Starts gathering unit `u`'s parameters, unless it is here or on its way.
    fn start_gather(&mut self, u: usize) {
        if self.full.is_none() && self.windows[u].is_none() && self.prefetch[u].is_none() {
            let piece = self.pshard[self.shards.piece(u)].to_vec();
            self.prefetch[u] = Some(self.dp.all_gather_async(piece, self.shards.units[u].len()));
        }
    }

    /// Makes unit `u`'s parameters present (ZeRO-3), dropping the other blocks' (not the
    /// embedding's) and prefetching `next`.
    fn bring(&mut self, u: usize, next: Option<usize>) -> Result<()> {
        if self.full.is_some() {
            return Ok(());
        }
        self.start_gather(u);
        if let Some(h) = self.prefetch[u].take() {
            let t0 = std::time::Instant::now();
            self.windows[u] = Some(h.wait().map_err(comm_err)?);
            self.waited_s += t0.elapsed().as_secs_f64();
        }
        if u != 0 {
            for (k, w) in self.windows.iter_mut().enumerate() {
                if k != 0 && k != u {
                    *w = None;
                }
            }
        }
        if let Some(n) = next {
            self.start_gather(n);
        }
        Ok(())
    }

    fn params_of(&self, u: usize) -> &[f32] {
        unit_params(self.full, &self.windows, self.shards, u)
    }

    /// Waits for every reduce-scatter and adds this rank's pieces into `gshard`.
    pub fn finish(self, gshard: &mut [f32]) -> Result<()> {
        for (u, h) in self.pending {
            let mine = h.wait().map_err(comm_err)?;
            let r = self.shards.piece(u);
            gshard[r].iter_mut().zip(&mine).for_each(|(g, x)| *g += x);
        }
        Ok(())
    }
}

/// Unit `u`'s parameters: a slice of the whole buffer (ZeRO-2) or its gathered window (ZeRO-3).
/// (Over the fields, so that a gradient window can be borrowed beside it.)
fn unit_params<'s>(full: Option<&'s [f32]>, windows: &'s [Option<Vec<f32>>], shards: &Shards, u: usize) -> &'s [f32] {
    match full {
        Some(p) => &p[shards.units[u].clone()],
        None => windows[u].as_deref().expect("brought before use"),
    }
}

impl UnitStore for ShardStore<'_> {
    fn params(&mut self, u: usize) -> Result<&[f32]> {
        // forward order: 0, 1, …, last, then 0 again for the LM head
        let next = (u < self.last() && self.furthest <= u).then_some(u + 1);
        self.furthest = self.furthest.max(u);
        self.bring(u, next)?;
        Ok(self.params_of(u))
    }

    fn params_grads(&mut self, u: usize) -> Result<(&[f32], &mut [f32])> {
        // backward order: 0 (LM head), last, …, 1, then 0 again for the embedding
        let next = match u {
            0 => {
                self.embedding_backward_calls += 1;
                (self.embedding_backward_calls == 1).then(|| self.last())
            }
            1 => None,
            k => Some(k - 1),
        };
        self.bring(u, next)?;
        let len = self.shards.units[u].len();
        let g = self.grads[u].get_or_insert_with(|| vec![0f32; len]);
        Ok((unit_params(self.full, &self.windows, self.shards, u), g))
    }

    fn grads_done(&mut self, u: usize) -> Result<()> {
        if let Some(g) = self.grads[u].take() {
            self.pending.push((u, self.dp.reduce_scatter_async(g, ReduceOp::Sum)));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    const UNITS: [std::ops::Range<usize>; 5] = [0..4, 4..10, 10..13, 13..20, 20..22];

    /// Units held gathered (ZeRO-3 windows) and units whose gather is in flight.
    fn held(s: &ShardStore) -> (Vec<usize>, Vec<usize>) {
        let some = |v: Vec<bool>| v.iter().enumerate().filter(|(_, &b)| b).map(|(i, _)| i).collect();
        (some(s.windows.iter().map(Option::is_some).collect()), some(s.prefetch.iter().map(Option::is_some).collect()))
    }

    /// One micro-batch's calls in the executor's order, on 2 ranks, ZeRO-3 (`zero3`) or
    /// ZeRO-2: each unit's parameters are the full buffer's, only unit 0 and the unit in use
    /// stay gathered, the next unit's gather is in flight when it is needed next, and each
    /// rank's gradient pieces end up the sum over ranks.
    fn one_micro_batch(zero3: bool) -> Vec<Vec<(Vec<usize>, Vec<usize>)>> {
        let full: Vec<f32> = (0..22).map(|i| i as f32).collect();
        brigade_comm::local::run(2, |c| {
            let shards = Shards::new(&UNITS, 2, c.rank(), true);
            let pshard = shards.compact(&full);
            let mut s = ShardStore::new(&shards, &c, (!zero3).then_some(&full[..]), &pshard);
            let mut seen = Vec::new();
            // forward: 0, 1, …, 4, then 0 again for the LM head
            for u in [0, 1, 2, 3, 4, 0] {
                assert_eq!(s.params(u)?, &full[UNITS[u].clone()], "forward unit {u}");
                seen.push(held(&s));
            }
            // backward: 0 (the LM head), 4, …, 1, then 0 again for the embedding
            for u in [0, 4, 3, 2, 1, 0] {
                let (p, g) = s.params_grads(u)?;
                assert_eq!(p, &full[UNITS[u].clone()], "backward unit {u}");
                g.iter_mut().enumerate().for_each(|(i, g)| *g += (i + 1) as f32 * (c.rank() + 1) as f32);
                seen.push(held(&s));
                if u != 0 || seen.len() == 12 {
                    s.grads_done(u)?;
                }
            }
            let mut gshard = vec![0.5f32; shards.len];
            s.finish(&mut gshard)?;
            // the sum over ranks 1 and 2 of (i + 1) · rank — unit 0 twice (head and embedding)
            let mut want = vec![0f32; 22];
            for (u, r) in UNITS.iter().enumerate() {
                for (i, w) in want[r.clone()].iter_mut().enumerate() {
                    *w = 0.5 + 3.0 * (i + 1) as f32 * if u == 0 { 2.0 } else { 1.0 };
                }
            }
            assert_eq!(gshard, shards.compact(&want), "rank {}", c.rank());
            Ok::<_, Error>(seen)
        })
        .unwrap()
    }

    #[test]
    fn zero3_holds_the_embedding_and_one_block_and_prefetches_the_next() {
        for seen in one_micro_batch(true) {
            let (w, p): (Vec<_>, Vec<_>) = seen.into_iter().unzip();
            // windows after each call, and gathers in flight
            let want_w: [&[usize]; 12] = [
                &[0],
                &[0, 1],
                &[0, 2],
                &[0, 3],
                &[0, 4],
                &[0, 4],
                &[0, 4],
                &[0, 4],
                &[0, 3],
                &[0, 2],
                &[0, 1],
                &[0, 1],
            ];
            let want_p: [&[usize]; 12] = [&[1], &[2], &[3], &[4], &[], &[], &[], &[3], &[2], &[1], &[], &[]];
            for i in 0..12 {
                assert_eq!(w[i], want_w[i], "windows after call {i}");
                assert_eq!(p[i], want_p[i], "gathers in flight after call {i}");
            }
        }
    }

    #[test]
    fn a_backward_first_prefetches_the_last_block_once() {
        // a store whose first call is the LM head's backward (nothing gathered by a forward):
        // the head's call starts the last block's gather, the embedding's second call does not
        let full: Vec<f32> = (0..22).map(|i| i as f32).collect();
        let seen = brigade_comm::local::run(2, |c| {
            let shards = Shards::new(&UNITS, 2, c.rank(), true);
            let pshard = shards.compact(&full);
            let mut s = ShardStore::new(&shards, &c, None, &pshard);
            let mut seen = Vec::new();
            for u in [0, 4, 3, 2, 1, 0] {
                s.params_grads(u)?;
                seen.push(held(&s));
            }
            Ok::<_, Error>(seen)
        })
        .unwrap();
        for seen in seen {
            let p: Vec<Vec<usize>> = seen.into_iter().map(|(_, p)| p).collect();
            assert_eq!(p, [vec![4], vec![3], vec![2], vec![1], vec![], vec![]]);
        }
    }

    #[test]
    fn zero2_reads_the_whole_buffer_and_gathers_nothing() {
        for seen in one_micro_batch(false) {
            assert!(seen.iter().all(|(w, p)| w.is_empty() && p.is_empty()), "{seen:?}");
        }
    }
}
