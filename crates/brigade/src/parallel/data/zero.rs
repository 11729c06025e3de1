//! ZeRO's shards (Rajbhandari et al. 2020): every unit of the flat buffers (the embedding, each
//! block, the final LayerNorm) is cut into dp pieces (`chunk_range` of the unit) and each rank
//! of the dp group keeps its piece of every unit, laid end to end in a compact buffer. ZeRO-1
//! keeps the optimizer state only there, ZeRO-2 also the gradient, ZeRO-3 also the parameters.
//! Cutting each unit (not the whole buffer) lets one unit's parameters be gathered, and its
//! gradient be reduce-scattered, on its own, just when backward or forward reaches it.

use crate::error::{Error, Result};
use crate::params::{ParamLayout, Split};
use brigade_comm::{chunk_range, Comm, ReduceOp};
use std::ops::Range;

pub(super) fn comm_err(e: brigade_comm::CommError) -> Error {
    Error::Train(format!("data-parallel communication failed: {e}"))
}

/// This rank's pieces of every unit.
#[derive(Clone, Debug)]
pub struct Shards {
    pub units: Vec<Range<usize>>,
    /// This rank's piece of each unit, in the flat buffer.
    pub pieces: Vec<Range<usize>>,
    /// Where each piece starts in the compact buffer.
    pub at: Vec<usize>,
    /// Elements of the compact buffer.
    pub len: usize,
    /// Whether the units are cut across the dp group (else every rank holds them whole).
    pub sharded: bool,
}

impl Shards {
    /// Pieces of `units` for rank `rank` of `dp` (whole units when not sharded).
    pub fn new(units: &[Range<usize>], dp: usize, rank: usize, sharded: bool) -> Shards {
        let pieces: Vec<Range<usize>> = units
            .iter()
            .map(|u| match sharded {
                false => u.clone(),
                true => {
                    let c = chunk_range(u.len(), dp, rank);
                    u.start + c.start..u.start + c.end
                }
            })
            .collect();
        let mut at = Vec::with_capacity(pieces.len());
        let mut len = 0;
        for p in &pieces {
            at.push(len);
            len += p.len();
        }
        Shards { units: units.to_vec(), pieces, at, len, sharded: sharded && dp > 1 }
    }

    /// This rank's pieces copied out of a full buffer, end to end.
    pub fn compact(&self, full: &[f32]) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.len);
        for p in &self.pieces {
            out.extend_from_slice(&full[p.clone()]);
        }
        out
    }

    /// This rank's piece of unit `u` in the compact buffer.
    pub fn piece(&self, u: usize) -> Range<usize> {
        self.at[u]..self.at[u] + self.pieces[u].len()
    }

    /// Ranges of the compact buffer that hold parameters replicated across the tensor-parallel
    /// group (`replicated`) or cut across it.
    pub fn compact_ranges(&self, layout: &ParamLayout, which: Cut) -> Vec<Range<usize>> {
        let mut out = Vec::new();
        for (k, p) in self.pieces.iter().enumerate() {
            for s in layout.specs.iter().filter(|s| Cut::of(s.split) == which) {
                let (lo, hi) = (s.view.offset.max(p.start), (s.view.offset + s.view.len).min(p.end));
                if lo < hi {
                    out.push(self.at[k] + lo - p.start..self.at[k] + hi - p.start);
                }
            }
        }
        out
    }

    /// The full buffer from every rank's compact pieces (collective over the dp group). Whether
    /// a unit is copied or gathered is decided alike on every rank (a unit shorter than dp is
    /// whole on one rank and empty on the others, and is still gathered).
    pub fn gather(&self, dp: &Comm, compact: &[f32], full: &mut [f32]) -> Result<()> {
        for u in 0..self.units.len() {
            let r = self.units[u].clone();
            if dp.size() == 1 || !self.sharded {
                full[r].copy_from_slice(&compact[self.piece(u)]);
            } else {
                dp.all_gather(&compact[self.piece(u)], &mut full[r]).map_err(comm_err)?;
            }
        }
        Ok(())
    }
}

/// How a tensor lies across the tensor-parallel group, as the gradient's norm and sums see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// Each rank holds a different piece.
    Cut,
    /// Every rank holds all of it.
    Replicated,
    /// Groups of ranks hold the same piece (key/value heads replicated when tp exceeds them).
    Shared,
}

impl Cut {
    pub fn of(split: Split) -> Cut {
        match split {
            Split::Replicated => Cut::Replicated,
            Split::Shared { .. } => Cut::Shared,
            _ => Cut::Cut,
        }
    }
}

/// ZeRO-1's reduce-scatter during the last micro-batch's backward: each unit's starts on the
/// communicator's thread as soon as backward has finished that unit (`ready(g, from)`: the
/// gradients of `g[from..]` are final), in the same order on every rank.
pub struct UnitReducer<'a> {
    shards: &'a Shards,
    dp: &'a Comm,
    launched: Vec<bool>,
    pending: Vec<(usize, brigade_comm::Handle<Vec<f32>>)>,
}

impl<'a> UnitReducer<'a> {
    pub fn new(shards: &'a Shards, dp: &'a Comm) -> UnitReducer<'a> {
        UnitReducer { shards, dp, launched: vec![false; shards.units.len()], pending: Vec::new() }
    }

    /// (units launched, units)
    pub fn launched(&self) -> (usize, usize) {
        (self.launched.iter().filter(|&&l| l).count(), self.launched.len())
    }

    pub fn ready(&mut self, g: &[f32], from: usize) {
        for (u, r) in self.shards.units.iter().enumerate() {
            if !self.launched[u] && r.start >= from {
                self.launched[u] = true;
                self.pending.push((u, self.dp.reduce_scatter_async(g[r.clone()].to_vec(), ReduceOp::Sum)));
            }
        }
    }

    /// Launches what is left, waits, and writes this rank's pieces of the sums into `compact`.
    pub fn finish(mut self, g: &[f32], compact: &mut [f32]) -> Result<()> {
        self.ready(g, 0);
        for (u, h) in self.pending {
            compact[self.shards.piece(u)].copy_from_slice(&h.wait().map_err(comm_err)?);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_unit_is_cut_on_its_own() {
        // units of 5, 2 and 7 elements over 2 ranks: chunk_range of each
        let units = [0..5, 5..7, 7..14];
        let s = Shards::new(&units, 2, 1, true);
        assert_eq!(s.pieces, vec![3..5, 6..7, 11..14]);
        assert_eq!((s.at.clone(), s.len), (vec![0, 2, 3], 6));
        let full: Vec<f32> = (0..14).map(|i| i as f32).collect();
        assert_eq!(s.compact(&full), [3., 4., 6., 11., 12., 13.]);
        let whole = Shards::new(&units, 2, 1, false);
        assert_eq!((whole.pieces.clone(), whole.len), (units.to_vec(), 14));
    }

    #[test]
    fn compact_ranges_tile_the_pieces_without_empty_ranges() {
        // units that end where tensors end (as a model's units do), cut over 2 and 3 ranks
        let gpt = crate::models::Gpt::new(crate::models::GptConfig::preset("tiny").unwrap()).unwrap();
        let layout = &gpt.layout;
        let units: Vec<Range<usize>> = layout.specs.iter().map(|s| s.view.offset..s.view.offset + s.view.len).collect();
        for (dp, rank) in [(2, 0), (2, 1), (3, 2)] {
            let s = Shards::new(&units, dp, rank, true);
            let mut covered = vec![0u8; s.len];
            for which in [Cut::Cut, Cut::Replicated, Cut::Shared] {
                for r in s.compact_ranges(layout, which) {
                    assert!(!r.is_empty(), "dp={dp} rank {rank}: an empty range {r:?}");
                    covered[r].iter_mut().for_each(|c| *c += 1);
                }
            }
            assert!(covered.iter().all(|&c| c == 1), "dp={dp} rank {rank}: the ranges do not tile the pieces once");
        }
    }

    #[test]
    fn unit_reduce_scatter_and_gather_invert_each_other() {
        let units = [0..5, 5..7, 7..14];
        let out = brigade_comm::local::run(3, |c| {
            let s = Shards::new(&units, 3, c.rank(), true);
            let full: Vec<f32> = (0..14).map(|i| (i * 10 + c.rank()) as f32).collect();
            let mut mine = vec![0f32; s.len];
            UnitReducer::new(&s, &c).finish(&full, &mut mine)?;
            let mut back = vec![0f32; 14];
            s.gather(&c, &mine, &mut back)?;
            Ok::<_, Error>(back)
        })
        .unwrap();
        // the sum over ranks 0, 1, 2 of i·10 + rank, on every rank
        let want: Vec<f32> = (0..14).map(|i| (i * 30 + 3) as f32).collect();
        for b in out {
            assert_eq!(b, want);
        }
    }

    #[test]
    fn overlapped_units_launch_once_each_as_backward_finishes_them() {
        // backward finishes the units last first; each reduce-scatter starts once, when its
        // unit is final, and carries the gradient as it was then
        let units = [0..5, 5..7, 7..14];
        let out = brigade_comm::local::run(2, |c| {
            let s = Shards::new(&units, 2, c.rank(), true);
            let mut g = vec![0f32; 14];
            let mut r = UnitReducer::new(&s, &c);
            let mut launched = Vec::new();
            for unit in units.iter().rev() {
                g[unit.clone()].iter_mut().zip(unit.clone()).for_each(|(x, i)| *x = (i * 10 + c.rank()) as f32);
                r.ready(&g, unit.start);
                launched.push(r.pending.iter().map(|(u, _)| *u).collect::<Vec<_>>());
                // a later write to a launched unit does not reach its sum
                g[unit.clone()].fill(f32::NAN);
            }
            r.ready(&g, 0);
            let again: Vec<usize> = r.pending.iter().map(|(u, _)| *u).collect();
            let mut mine = vec![0f32; s.len];
            r.finish(&g, &mut mine)?;
            let mut back = vec![0f32; 14];
            s.gather(&c, &mine, &mut back)?;
            Ok::<_, Error>((launched, again, back))
        })
        .unwrap();
        let want: Vec<f32> = (0..14).map(|i| (i * 20 + 1) as f32).collect();
        for (launched, again, back) in out {
            assert_eq!(launched, vec![vec![2], vec![2, 1], vec![2, 1, 0]]);
            assert_eq!(again, vec![2, 1, 0], "a unit launched twice");
            assert_eq!(back, want);
        }
    }

    #[test]
    fn a_unit_shorter_than_dp_is_gathered_on_every_rank() {
        // a 1-element unit over 3 ranks: whole on rank 0, empty on ranks 1 and 2; every rank
        // must still take part in its gather
        let units = [0..1, 1..3, 3..8];
        let out = brigade_comm::local::run(3, |c| {
            let s = Shards::new(&units, 3, c.rank(), true);
            let full: Vec<f32> = (0..8).map(|i| i as f32).collect();
            let mut back = vec![f32::NAN; 8];
            s.gather(&c, &s.compact(&full), &mut back)?;
            Ok::<_, Error>(back)
        })
        .unwrap();
        for b in out {
            assert_eq!(b, (0..8).map(|i| i as f32).collect::<Vec<_>>());
        }
    }

    #[test]
    fn unsharded_pieces_gather_as_a_copy() {
        // without ZeRO every rank holds whole units (a checkpoint of plain dp gathers so)
        let units = [0..5, 5..7, 7..14];
        let out = brigade_comm::local::run(3, |c| {
            let s = Shards::new(&units, 3, c.rank(), false);
            let mine: Vec<f32> = (0..14).map(|i| (i * 10 + c.rank()) as f32).collect();
            let mut back = vec![0f32; 14];
            s.gather(&c, &s.compact(&mine), &mut back)?;
            Ok::<_, Error>((mine, back))
        })
        .unwrap();
        for (mine, back) in out {
            assert_eq!(back, mine);
        }
    }
}
