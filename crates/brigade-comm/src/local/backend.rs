//! The collectives of the `local` backend.
//!
//! Every collective starts the same way: the rank publishes a descriptor (call number,
//! operation, length, argument) and the addresses of its buffers in its slot, and waits at a
//! barrier; then each rank checks that every peer published the same descriptor, so a
//! mismatched call fails on all ranks at once. Then, by algorithm:
//! - **direct** (bandwidth-optimal, large all-reduce; also reduce-scatter, all-gather,
//!   broadcast): rank r owns chunk r of the buffer; it reads chunk r of every peer's buffer
//!   once, reduces, and writes the result into chunk r of every peer's buffer — a reduce-scatter
//!   and an all-gather fused into one pass, so each byte of each buffer is read once and written
//!   once, the least any all-reduce can move. A second barrier keeps buffers alive until all
//!   ranks are done with them.
//! - **one-shot** (latency-optimal, small all-reduce): each rank copies its buffer into its
//!   staging area, one barrier, and each reduces all staging areas into its own buffer. One
//!   synchronisation instead of two; staging areas alternate by call number, so a rank may
//!   leave without waiting for the others to finish reading.
//!
//! Reductions add ranks in rank order, so both algorithms, and every rank, give bit-identical
//! results.

use super::group::{Desc, Group, Slot};
use crate::chunks::chunk_range;
use crate::comm::Backend;
use crate::error::{all_to_all_disagreement, describe_call, mismatch, CommError, Result};
use crate::ReduceOp;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub const ALGO_DIRECT: &str = "direct";
pub const ALGO_ONE_SHOT: &str = "one_shot";

/// Elements reduced per block: the accumulator stays in L1.
const BLOCK: usize = 2048;

/// What a rank publishes for an `all_to_all_v`: its input and its counts (a group's worth).
struct Exchange {
    input: *const f32,
    send: *const usize,
    recv: *const usize,
}

pub struct LocalBackend {
    group: Arc<Group>,
    rank: usize,
    /// Collective calls made on this group (descriptor sequence number).
    seq: AtomicU64,
    /// Barriers passed on this group.
    phase: AtomicU64,
}

fn op_code(op: ReduceOp) -> u64 {
    match op {
        ReduceOp::Sum => 0,
        ReduceOp::Avg => 1,
        ReduceOp::Max => 2,
    }
}

fn describe(d: &Desc) -> String {
    match d.op {
        "split" => format!("split(colour {}, key {})", d.arg >> 32, d.arg & 0xffff_ffff),
        op => describe_call(op, d.len, d.arg),
    }
}

/// `dst[i] = op(srcs[0][i], srcs[1][i], …)`, in rank order.
fn reduce_block(acc: &mut [f32], srcs: &[*const f32], off: usize, op: ReduceOp, scale: f32) {
    reduce_from(acc, srcs.len(), |r| srcs[r], off, op, scale)
}

/// `reduce_block` with the sources given by rank (no list to build on the small-message path).
fn reduce_from(acc: &mut [f32], n_src: usize, src: impl Fn(usize) -> *const f32, off: usize, op: ReduceOp, scale: f32) {
    let n = acc.len();
    // SAFETY: the caller guarantees each source holds `off + n` elements that no one writes
    // during this call.
    unsafe {
        acc.copy_from_slice(std::slice::from_raw_parts(src(0).add(off), n));
        for r in 1..n_src {
            let s = std::slice::from_raw_parts(src(r).add(off), n);
            match op {
                ReduceOp::Sum | ReduceOp::Avg => acc.iter_mut().zip(s).for_each(|(a, &b)| *a += b),
                ReduceOp::Max => acc.iter_mut().zip(s).for_each(|(a, &b)| *a = a.max(b)),
            }
        }
    }
    if op == ReduceOp::Avg {
        acc.iter_mut().for_each(|a| *a *= scale);
    }
}

impl LocalBackend {
    pub(super) fn new(group: Arc<Group>, rank: usize) -> LocalBackend {
        LocalBackend { group, rank, seq: AtomicU64::new(0), phase: AtomicU64::new(0) }
    }

    fn barrier_phase(&self, d: &Desc) -> Result<()> {
        let phase = self.phase.fetch_add(1, Ordering::Relaxed) + 1;
        self.group.wait_all(self.rank, phase, d)
    }

    /// Publishes this rank's slot for a new call, waits for all, and checks agreement.
    /// Returns the call's slot parity.
    fn begin(&self, op: &'static str, len: usize, arg: u64, src: usize, dst: usize) -> Result<usize> {
        let g = &self.group;
        g.world.check(op)?;
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let parity = (seq % 2) as usize;
        let desc = Desc { seq, op, len, arg };
        // SAFETY: our own slot, before we arrive at this call's barrier.
        unsafe { *g.slot_mut(self.rank, parity) = Slot { desc, src, dst } };
        self.barrier_phase(&desc)?;
        // SAFETY: published by the barrier just passed.
        if (0..g.size()).any(|r| unsafe { g.slot(r, parity) }.desc != desc) {
            let calls: Vec<String> = (0..g.size()).map(|r| describe(&unsafe { g.slot(r, parity) }.desc)).collect();
            return Err(mismatch(seq, &calls));
        }
        Ok(parity)
    }

    fn peers(&self, parity: usize, f: impl Fn(&Slot) -> usize) -> Vec<usize> {
        // SAFETY: slots of this call, published by its first barrier.
        (0..self.group.size()).map(|r| f(&unsafe { self.group.slot(r, parity) })).collect()
    }

    /// The second barrier of a direct call: nobody leaves while a peer may still touch its buffers.
    fn end(&self, op: &'static str, len: usize) -> Result<()> {
        let seq = self.seq.load(Ordering::Relaxed);
        self.barrier_phase(&Desc { seq, op, len, arg: 0 })
    }

    fn all_reduce_direct(&self, buf: &mut [f32], op: ReduceOp) -> Result<()> {
        let n = buf.len();
        let p = self.begin("all_reduce", n, op_code(op), buf.as_ptr() as usize, buf.as_mut_ptr() as usize)?;
        let addrs = self.peers(p, |s| s.dst);
        let srcs: Vec<*const f32> = addrs.iter().map(|&a| a as *const f32).collect();
        let mine = chunk_range(n, self.group.size(), self.rank);
        let scale = 1.0 / self.group.size() as f32;
        let mut acc = vec![0f32; BLOCK.min(mine.len())];
        let mut off = mine.start;
        while off < mine.end {
            let len = BLOCK.min(mine.end - off);
            reduce_block(&mut acc[..len], &srcs, off, op, scale);
            for &a in &addrs {
                // SAFETY: chunk `mine` of every buffer is read and written by this rank only,
                // between the two barriers of this call; each buffer holds `n` elements.
                unsafe { std::ptr::copy_nonoverlapping(acc.as_ptr(), (a as *mut f32).add(off), len) };
            }
            off += len;
        }
        self.end("all_reduce", n)
    }

    fn all_reduce_one_shot(&self, buf: &mut [f32], op: ReduceOp) -> Result<()> {
        let g = &self.group;
        let parity = ((self.seq.load(Ordering::Relaxed) + 1) % 2) as usize;
        // SAFETY: our own staging area of the coming call, before its barrier.
        unsafe {
            let st = g.staging_mut(self.rank, parity);
            st.clear();
            st.extend_from_slice(buf);
        }
        let p = self.begin("all_reduce", buf.len(), op_code(op), 0, 0)?;
        debug_assert_eq!(p, parity);
        // SAFETY: staging areas of this call, published by its barrier; a peer rewrites its
        // area of this parity only after the barrier of our next call, which we have not reached.
        reduce_from(buf, g.size(), |r| unsafe { g.staging(r, p) }.as_ptr(), 0, op, 1.0 / g.size() as f32);
        Ok(())
    }
}

impl Backend for LocalBackend {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.group.size()
    }

    fn all_reduce(&self, buf: &mut [f32], op: ReduceOp) -> Result<&'static str> {
        if std::mem::size_of_val(buf) <= self.group.world.cfg.one_shot_max_bytes {
            self.all_reduce_one_shot(buf, op).map(|_| ALGO_ONE_SHOT)
        } else {
            self.all_reduce_direct(buf, op).map(|_| ALGO_DIRECT)
        }
    }

    fn reduce_scatter(&self, input: &[f32], output: &mut [f32], op: ReduceOp) -> Result<&'static str> {
        let n = input.len();
        let p = self.begin("reduce_scatter", n, op_code(op), input.as_ptr() as usize, 0)?;
        let srcs: Vec<*const f32> = self.peers(p, |s| s.src).into_iter().map(|a| a as *const f32).collect();
        let mine = chunk_range(n, self.group.size(), self.rank);
        // Peers' inputs are only read during this call, so the reduction goes straight to `output`.
        let scale = 1.0 / self.group.size() as f32;
        for (k, out) in output.chunks_mut(BLOCK).enumerate() {
            reduce_block(out, &srcs, mine.start + k * BLOCK, op, scale);
        }
        self.end("reduce_scatter", n).map(|_| ALGO_DIRECT)
    }

    fn all_gather(&self, input: &[f32], output: &mut [f32]) -> Result<&'static str> {
        let n = output.len();
        let p = self.begin("all_gather", n, 0, input.as_ptr() as usize, 0)?;
        let srcs = self.peers(p, |s| s.src);
        for (r, &a) in srcs.iter().enumerate() {
            let c = chunk_range(n, self.group.size(), r);
            // SAFETY: rank r's input holds its chunk and is not written during this call.
            let src = unsafe { std::slice::from_raw_parts(a as *const f32, c.len()) };
            output[c].copy_from_slice(src);
        }
        self.end("all_gather", n).map(|_| ALGO_DIRECT)
    }

    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<&'static str> {
        let n = buf.len();
        let p = self.begin("broadcast", n, root as u64, buf.as_ptr() as usize, 0)?;
        if self.rank != root {
            let a = self.peers(p, |s| s.src)[root];
            // SAFETY: the root's buffer holds n elements and is not written during this call.
            buf.copy_from_slice(unsafe { std::slice::from_raw_parts(a as *const f32, n) });
        }
        self.end("broadcast", n).map(|_| ALGO_DIRECT)
    }

    fn all_to_all_v(&self, input: &[f32], send: &[usize], output: &mut [f32], recv: &[usize]) -> Result<&'static str> {
        // sizes differ by rank: they travel behind `src`, not in the descriptor
        let mine = Exchange { input: input.as_ptr(), send: send.as_ptr(), recv: recv.as_ptr() };
        let p = self.begin("all_to_all_v", 0, 0, &mine as *const Exchange as usize, 0)?;
        let n = self.group.size();
        // SAFETY: every rank's `Exchange` and the slices it points to stay alive and unwritten
        // until this call's second barrier; each holds a group's worth of counts.
        let peers: Vec<&Exchange> =
            self.peers(p, |s| s.src).into_iter().map(|a| unsafe { &*(a as *const Exchange) }).collect();
        let counts: Vec<Vec<usize>> = peers
            .iter()
            .map(|x| unsafe { [std::slice::from_raw_parts(x.send, n), std::slice::from_raw_parts(x.recv, n)].concat() })
            .collect();
        // every rank reads every rank's counts, so all reach the same verdict
        if let Some(detail) = all_to_all_disagreement(&counts) {
            self.end("all_to_all_v", 0)?;
            return Err(CommError::Mismatch { seq: self.seq.load(Ordering::Relaxed), size: n, detail });
        }
        let mut at = 0;
        for (src, x) in peers.iter().enumerate() {
            let offset: usize = counts[src][..self.rank].iter().sum();
            let len = recv[src];
            // SAFETY: rank `src`'s input holds the sum of its send counts, and is read-only here.
            let piece = unsafe { std::slice::from_raw_parts(x.input.add(offset), len) };
            output[at..at + len].copy_from_slice(piece);
            at += len;
        }
        self.end("all_to_all_v", 0).map(|_| ALGO_DIRECT)
    }

    fn send(&self, buf: &[f32], dst: usize, tag: u32) -> Result<()> {
        self.group.world.check("send")?;
        self.group.world.mail.put((self.group.id, self.rank, dst, tag), buf);
        Ok(())
    }

    fn recv(&self, buf: &mut [f32], src: usize, tag: u32) -> Result<()> {
        let w = &self.group.world;
        let msg = w.mail.take((self.group.id, src, self.rank, tag), w.cfg.timeout, || w.check("recv"))?;
        if msg.len() != buf.len() {
            return Err(CommError::Mismatch {
                seq: 0,
                size: self.group.size(),
                detail: format!(
                    "rank {src} sent {} elements with tag {tag} but rank {} receives {}",
                    msg.len(),
                    self.rank,
                    buf.len()
                ),
            });
        }
        buf.copy_from_slice(&msg);
        w.mail.recycle(msg);
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        self.begin("barrier", 0, 0, 0, 0).map(|_| ())
    }

    fn split(&self, color: u32, key: u32) -> Result<Box<dyn Backend>> {
        let arg = ((color as u64) << 32) | key as u64;
        // Colour and key differ across ranks by design, so they travel in `src`, not the descriptor.
        let p = self.begin("split", 0, 0, arg as usize, 0)?;
        let seq = self.seq.load(Ordering::Relaxed);
        let all = self.peers(p, |s| s.src);
        let mut mine: Vec<(u32, usize)> = all
            .iter()
            .enumerate()
            .filter(|(_, &a)| (a as u64 >> 32) as u32 == color)
            .map(|(r, &a)| ((a as u64 & 0xffff_ffff) as u32, r))
            .collect();
        mine.sort();
        let new_rank = mine.iter().position(|&(_, r)| r == self.rank).expect("this rank has its own colour");
        let members: Vec<usize> = mine.iter().map(|&(_, r)| self.group.members[r]).collect();
        let world = self.group.world.clone();
        let group = world
            .splits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((self.group.id, seq, color))
            .or_insert_with(|| Arc::new(Group::new(world.clone(), members)))
            .clone();
        // Everyone has its group before anyone's first call on it.
        self.end("split", 0)?;
        if new_rank == 0 {
            world.splits.lock().unwrap_or_else(|p| p.into_inner()).remove(&(self.group.id, seq, color));
        }
        Ok(Box::new(LocalBackend::new(group, new_rank)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::group::World;
    use crate::local::LocalConfig;

    /// A split's new groups are found by every member through the world's table, and the
    /// table is empty again once the split returns — groups of one rank included, whose only
    /// member is its rank 0 — so a job that splits every step holds no groups it has left.
    #[test]
    fn a_split_leaves_no_group_behind_in_the_world() {
        let world = Arc::new(World::new(LocalConfig::default()));
        let group = Arc::new(Group::new(world.clone(), (0..5).collect()));
        let sizes: Vec<Vec<usize>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..5)
                .map(|rank| {
                    let group = group.clone();
                    s.spawn(move || {
                        let b = LocalBackend::new(group, rank);
                        // colours {0, 1, 3} of sizes 2, 2, 1, then everyone alone
                        let pairs = b.split([0, 0, 1, 1, 3][rank], (5 - rank) as u32).unwrap();
                        let alone = b.split(rank as u32, 0).unwrap();
                        let mut one = [1f32];
                        alone.all_reduce(&mut one, ReduceOp::Sum).unwrap();
                        vec![pairs.size(), pairs.rank(), alone.size(), one[0] as usize]
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        // keys 5 - rank: the higher world rank comes first in its pair
        assert_eq!(sizes, [[2, 1, 1, 1], [2, 0, 1, 1], [2, 1, 1, 1], [2, 0, 1, 1], [1, 0, 1, 1]]);
        assert!(world.splits.lock().unwrap().is_empty(), "groups left in the world's table");
    }
}
