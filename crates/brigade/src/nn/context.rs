//! Context parallelism's attention: each rank of a context group holds some rows of every
//! sequence — of `2·cp` equal chunks, chunks `r` and `2·cp − 1 − r` ("zigzag", so that under a
//! causal mask every rank has the same attention work), or of `cp` chunks, chunk `r`
//! ("contiguous") — and everything but attention is local to its rows. Attention exchanges the
//! group's keys and values, one of two ways ([`CpComm`]):
//!
//! - **all-gather** (what Llama 3 did; cheap under grouped-query attention's few key/value
//!   heads): every rank's block gathered, the local queries run over each in rank order, and the
//!   backward reduce-scatters the keys' and values' gradients back to the ranks holding them;
//! - **ring** (Ring Attention): each rank sends the block in hand to the next rank and attends to
//!   it while the transfer runs, cp − 1 times; the backward passes the blocks round again with
//!   their dK/dV accumulating, one more hop bringing each block's home.
//!
//! Each block is cut into its contiguous runs of positions, and a (query run, key run) pair the
//! mask hides entirely is skipped: what makes zigzag balanced. Partial results merge by online
//! softmax (`tensor::blockwise`). Positions are global: row i of a rank is at
//! `SeqSplit::positions(rank)[i]` of its sequence.
//!
//! Layout of one sequence's rows on a rank: `q` `[t_loc, heads·hd]`, `k` and `v`
//! `[t_loc, kv_heads·hd]`, heads side by side in a row (as the projections write them); query
//! head h reads key/value head `h / (heads / kv_heads)`.

use crate::error::{Error, Result};
pub use crate::layout::{CpComm, CpOrder};
use crate::tensor::blockwise::{block_backward, block_forward, merge, row_dots, Queries};
use brigade_comm::{Comm, ReduceOp};
use rayon::prelude::*;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Which rows of a sequence of `t` tokens each rank of a context group of `cp` holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqSplit {
    pub cp: usize,
    pub t: usize,
    pub order: CpOrder,
}

impl SeqSplit {
    /// A split of sequences of `t` tokens over `cp` ranks, or why there is none.
    pub fn new(cp: usize, t: usize, order: CpOrder) -> Result<SeqSplit> {
        let layout = crate::layout::Layout { cp, cp_order: order, ..Default::default() };
        if cp == 0 {
            return Err(Error::Layout("cp=0: a context group has at least one rank".into()));
        }
        layout.check_seq(t)?;
        Ok(SeqSplit { cp, t, order })
    }

    /// The zigzag split (the default).
    pub fn zigzag(cp: usize, t: usize) -> Result<SeqSplit> {
        SeqSplit::new(cp, t, CpOrder::Zigzag)
    }

    /// Rows of a sequence on one rank.
    pub fn local(&self) -> usize {
        self.t / self.cp
    }

    /// The runs of global positions rank `rank` holds, in its row order.
    pub fn runs(&self, rank: usize) -> Vec<Range<u32>> {
        let k = self.order.chunks(self.cp);
        let c = self.t / k;
        let chunk = |i: usize| (i * c) as u32..((i + 1) * c) as u32;
        match self.order {
            CpOrder::Zigzag => vec![chunk(rank), chunk(k - 1 - rank)],
            CpOrder::Contiguous => vec![chunk(rank)],
        }
    }

    /// The global positions of rank `rank`'s rows, in its order.
    pub fn positions(&self, rank: usize) -> Vec<u32> {
        self.runs(rank).into_iter().flatten().collect()
    }
}

/// A context group as a layer sees it: its communicator, how it splits each sequence, how it
/// exchanges keys and values, and (if given) where to count the seconds spent attending (the
/// blocks' arithmetic, not the exchange: the load balance).
#[derive(Clone, Copy)]
pub struct Context<'a> {
    pub comm: &'a Comm,
    pub split: SeqSplit,
    pub kind: CpComm,
    pub clock: Option<&'a AttendClock>,
}

/// Seconds a rank spent in the blockwise attention of its context group's blocks.
#[derive(Debug, Default)]
pub struct AttendClock {
    ns: AtomicU64,
}

impl AttendClock {
    fn add(&self, since: Instant) {
        self.ns.fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// The seconds counted since the last `take`.
    pub fn take(&self) -> f64 {
        self.ns.swap(0, Ordering::Relaxed) as f64 * 1e-9
    }
}

impl Context<'_> {
    fn timed<R>(&self, f: impl FnOnce() -> R) -> R {
        let t0 = Instant::now();
        let r = f();
        if let Some(c) = self.clock {
            c.add(t0);
        }
        r
    }

    /// This rank's rows' global positions.
    pub fn positions(&self) -> Vec<u32> {
        self.split.positions(self.comm.rank())
    }
}

/// The shape of one sequence's attention on a rank.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    pub heads: usize,
    pub kv_heads: usize,
    pub hd: usize,
}

impl Heads {
    /// Query heads a key/value head serves.
    fn group(&self) -> usize {
        self.heads / self.kv_heads
    }
}

/// What the forward keeps for the backward: each query row's log-sum-exp per head
/// (`[heads, t_loc]`), and the keys and values the backward reads again — every rank's
/// (all-gather, in rank order), or this rank's own (ring: they travel round again).
#[derive(Default)]
pub struct CpStash {
    pub kv: Vec<f32>,
    pub lse: Vec<f32>,
}

impl CpStash {
    pub fn floats(&self) -> usize {
        self.kv.len() + self.lse.len()
    }
}

fn comm_err(e: brigade_comm::CommError) -> Error {
    Error::Train(format!("context-parallel attention: {e}"))
}

/// Message tags of the ring (on the context group's own communicator): a block of keys and
/// values forward, again backward, and the gradients travelling with it.
const TAG_KV: u32 = 1;
const TAG_KV_BACK: u32 = 2;
const TAG_DKV: u32 = 3;

/// The blocks in the order a ring brings them to rank `r`: its own, then r − 1, r − 2, …
fn ring_order(r: usize, cp: usize) -> impl Iterator<Item = usize> {
    (0..cp).map(move |s| (r + cp - s) % cp)
}

/// Column block `h` (of width `hd`) of a row-major `[n, w]` matrix, as its own `[n, hd]`.
fn column(x: &[f32], w: usize, h: usize, hd: usize) -> Vec<f32> {
    x.chunks(w).flat_map(|row| row[h * hd..(h + 1) * hd].iter().copied()).collect()
}

fn put_column(x: &mut [f32], w: usize, h: usize, hd: usize, from: &[f32], add: bool) {
    for (row, src) in x.chunks_mut(w).zip(from.chunks(hd)) {
        let dst = &mut row[h * hd..(h + 1) * hd];
        if add {
            dst.iter_mut().zip(src).for_each(|(a, b)| *a += b);
        } else {
            dst.copy_from_slice(src);
        }
    }
}

/// The (query rows, key rows) pairs of runs of which some query sees some key: rows as
/// ranges into this rank's rows and the block's rows.
fn visible_pairs(qruns: &[Range<u32>], lo: &[u32], kruns: &[Range<u32>]) -> Vec<(Range<usize>, Range<usize>)> {
    let mut out = Vec::new();
    let mut qa = 0;
    for qr in qruns {
        let rows = qa..qa + qr.len();
        qa = rows.end;
        let (qmax, lmin) = (qr.end - 1, lo[rows.clone()].iter().copied().min().unwrap_or(0));
        let mut ka = 0;
        for kr in kruns {
            let krows = ka..ka + kr.len();
            ka = krows.end;
            if kr.start <= qmax && kr.end > lmin {
                out.push((rows.clone(), krows));
            }
        }
    }
    out
}

/// One query head's output gradient, its rows' log-sum-exp and `D = Σ dout ⊙ out` per row.
struct HeadGrad<'a> {
    dout: Vec<f32>,
    lse: &'a [f32],
    delta: Vec<f32>,
}

/// This rank's side of one sequence's attention: its query heads, split into columns once.
struct Local<'a> {
    s: Heads,
    n: usize,
    pos: Vec<u32>,
    runs: Vec<Range<u32>>,
    lo: &'a [u32],
    qh: Vec<Vec<f32>>,
}

impl<'a> Local<'a> {
    fn new(cx: &Context, s: Heads, q: &[f32], lo: &'a [u32]) -> Local<'a> {
        let n = cx.split.local();
        let qh = (0..s.heads).map(|h| column(q, s.heads * s.hd, h, s.hd)).collect();
        Local { s, n, pos: cx.positions(), runs: cx.split.runs(cx.comm.rank()), lo, qh }
    }

    /// A block's (`kv`: its `k` rows, then its `v` rows) keys and values by key/value head,
    /// each `[t_loc, hd]`: taken once for the query heads that share them.
    fn kv_heads(&self, kv: &[f32]) -> Vec<(Vec<f32>, Vec<f32>)> {
        let (s, hd) = (self.s, self.s.hd);
        let kvw = s.kv_heads * hd;
        let (kblk, vblk) = kv.split_at(self.n * kvw);
        (0..s.kv_heads).map(|g| (column(kblk, kvw, g, hd), column(vblk, kvw, g, hd))).collect()
    }

    /// Attends to rank `src`'s block (`kv`: its `k` rows, then its `v` rows), merged into each
    /// head's `(out, lse)`.
    fn attend(&self, split: SeqSplit, src: usize, kv: &[f32], acc: &mut [(Vec<f32>, Vec<f32>)]) {
        let (s, hd) = (self.s, self.s.hd);
        let kvh = self.kv_heads(kv);
        let (kruns, kpos) = (split.runs(src), split.positions(src));
        let pairs = visible_pairs(&self.runs, self.lo, &kruns);
        acc.par_iter_mut().enumerate().for_each(|(h, (o, l))| {
            let (kb, vb) = &kvh[h / s.group()];
            for (qr, kr) in &pairs {
                let qs = Queries { pos: &self.pos[qr.clone()], lo: &self.lo[qr.clone()] };
                let (mut ob, mut lb) = (vec![0f32; qr.len() * hd], vec![0f32; qr.len()]);
                let kk = &kb[kr.start * hd..kr.end * hd];
                let vv = &vb[kr.start * hd..kr.end * hd];
                block_forward(
                    &self.qh[h][qr.start * hd..qr.end * hd],
                    kk,
                    vv,
                    hd,
                    qs,
                    &kpos[kr.clone()],
                    &mut ob,
                    &mut lb,
                );
                merge(&mut o[qr.start * hd..qr.end * hd], &mut l[qr.clone()], &ob, &lb, hd);
            }
        });
    }

    /// Rank `src`'s block's part of the backward: adds to each head's `dq` and to the block's
    /// `dkv` (`dk` rows, then `dv` rows, as the block).
    fn attend_back(
        &self,
        (split, src, kv): (SeqSplit, usize, &[f32]),
        grads: &[HeadGrad],
        dq: &mut [Vec<f32>],
        dkv: &mut [f32],
    ) {
        let (s, n, hd) = (self.s, self.n, self.s.hd);
        let kvw = s.kv_heads * hd;
        let kvh = self.kv_heads(kv);
        let (kruns, kpos) = (split.runs(src), split.positions(src));
        let pairs = visible_pairs(&self.runs, self.lo, &kruns);
        // each head's dK and dV of the block, summed per key/value head in head order
        let per_head: Vec<(Vec<f32>, Vec<f32>)> = dq
            .par_iter_mut()
            .enumerate()
            .map(|(h, dqh)| {
                let (kb, vb) = &kvh[h / s.group()];
                let HeadGrad { dout: doh, lse, delta } = &grads[h];
                let (mut dkb, mut dvb) = (vec![0f32; n * hd], vec![0f32; n * hd]);
                for (qr, kr) in &pairs {
                    let qs = Queries { pos: &self.pos[qr.clone()], lo: &self.lo[qr.clone()] };
                    let (q, k) = (qr.start * hd..qr.end * hd, kr.start * hd..kr.end * hd);
                    block_backward(
                        &self.qh[h][q.clone()],
                        &kb[k.clone()],
                        &vb[k.clone()],
                        hd,
                        qs,
                        &kpos[kr.clone()],
                        &doh[q.clone()],
                        &lse[qr.clone()],
                        &delta[qr.clone()],
                        (&mut dqh[q], &mut dkb[k.clone()], &mut dvb[k]),
                    );
                }
                (dkb, dvb)
            })
            .collect();
        let (dk, dv) = dkv.split_at_mut(n * kvw);
        for (h, (dkb, dvb)) in per_head.iter().enumerate() {
            put_column(dk, kvw, h / s.group(), hd, dkb, true);
            put_column(dv, kvw, h / s.group(), hd, dvb, true);
        }
    }
}

/// The attention of this rank's query rows over the whole sequence: `out` `[t_loc, heads·hd]`
/// (overwritten). `lo[i]` is the first global position row i may see (0, or its document's
/// start).
#[allow(clippy::too_many_arguments)]
pub fn forward(
    cx: Context,
    s: Heads,
    (q, k, v): (&[f32], &[f32], &[f32]),
    lo: &[u32],
    out: &mut [f32],
    st: &mut CpStash,
) -> Result<()> {
    let (z, comm) = (cx.split, cx.comm);
    let (n, hd) = (z.local(), s.hd);
    let (qw, kvw) = (s.heads * hd, s.kv_heads * hd);
    assert!(q.len() == n * qw && k.len() == n * kvw && v.len() == n * kvw && out.len() == n * qw && lo.len() == n);
    assert_eq!(comm.size(), z.cp, "a context group of cp ranks");
    let me = Local::new(&cx, s, q, lo);
    let mut acc: Vec<(Vec<f32>, Vec<f32>)> =
        (0..s.heads).map(|_| (vec![0f32; n * hd], vec![f32::NEG_INFINITY; n])).collect();
    let own: Vec<f32> = [k, v].concat();
    match cx.kind {
        CpComm::AllGather => {
            // every rank's block [k | v], in rank order
            st.kv.resize(z.cp * 2 * n * kvw, 0.0);
            comm.all_gather(&own, &mut st.kv).map_err(comm_err)?;
            // in the ring's order (own block first), so that both exchanges merge alike
            let blk = 2 * n * kvw;
            for src in ring_order(comm.rank(), z.cp) {
                cx.timed(|| me.attend(z, src, &st.kv[src * blk..(src + 1) * blk], &mut acc));
            }
        }
        CpComm::Ring => {
            let (r, cp) = (comm.rank(), z.cp);
            let (next, prev) = ((r + 1) % cp, (r + cp - 1) % cp);
            let mut hand = own.clone();
            let mut src = r;
            for step in 0..cp {
                // the block in hand goes on while this rank attends to it
                if step + 1 < cp {
                    comm.send(&hand, next, TAG_KV).map_err(comm_err)?;
                }
                cx.timed(|| me.attend(z, src, &hand, &mut acc));
                if step + 1 < cp {
                    comm.recv(&mut hand, prev, TAG_KV).map_err(comm_err)?;
                    src = (src + cp - 1) % cp;
                }
            }
            st.kv = own;
        }
    }
    st.lse.resize(s.heads * n, 0.0);
    for (h, (o, l)) in acc.iter().enumerate() {
        put_column(out, qw, h, hd, o, false);
        st.lse[h * n..(h + 1) * n].copy_from_slice(l);
    }
    Ok(())
}

/// From `dout` (`[t_loc, heads·hd]`) and the forward's `out` and stash: this rank's `dq`
/// (overwritten) and the gradients of its own key and value rows `dk`, `dv` (overwritten),
/// summed over every rank's queries.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    cx: Context,
    s: Heads,
    q: &[f32],
    lo: &[u32],
    (out, dout): (&[f32], &[f32]),
    st: &CpStash,
    (dq, dk, dv): (&mut [f32], &mut [f32], &mut [f32]),
) -> Result<()> {
    let (z, comm) = (cx.split, cx.comm);
    let (n, hd) = (z.local(), s.hd);
    let (qw, kvw) = (s.heads * hd, s.kv_heads * hd);
    assert!(dq.len() == n * qw && dk.len() == n * kvw && dv.len() == n * kvw);
    let me = Local::new(&cx, s, q, lo);
    // each head's output gradient, its log-sum-exp and D = Σ dout ⊙ out per row
    let grads: Vec<HeadGrad> = (0..s.heads)
        .map(|h| {
            let dout = column(dout, qw, h, hd);
            let delta = row_dots(&dout, &column(out, qw, h, hd), hd);
            HeadGrad { dout, lse: &st.lse[h * n..(h + 1) * n], delta }
        })
        .collect();
    let mut dqh: Vec<Vec<f32>> = (0..s.heads).map(|_| vec![0f32; n * hd]).collect();
    let blk = 2 * n * kvw;
    let mut mine = vec![0f32; blk];
    match cx.kind {
        CpComm::AllGather => {
            let mut dkv_all = vec![0f32; z.cp * blk];
            for src in ring_order(comm.rank(), z.cp) {
                let (kv, dkv) = (&st.kv[src * blk..(src + 1) * blk], &mut dkv_all[src * blk..(src + 1) * blk]);
                cx.timed(|| me.attend_back((z, src, kv), &grads, &mut dqh, dkv));
            }
            comm.reduce_scatter(&dkv_all, &mut mine, ReduceOp::Sum).map_err(comm_err)?;
        }
        CpComm::Ring if z.cp == 1 => cx.timed(|| me.attend_back((z, 0, &st.kv), &grads, &mut dqh, &mut mine)),
        CpComm::Ring => {
            let (r, cp) = (comm.rank(), z.cp);
            let (next, prev) = ((r + 1) % cp, (r + cp - 1) % cp);
            let mut hand = st.kv.clone();
            let mut src = r;
            let mut dkv = vec![0f32; blk];
            for step in 0..cp {
                if step + 1 < cp {
                    comm.send(&hand, next, TAG_KV_BACK).map_err(comm_err)?;
                }
                let mut part = vec![0f32; blk];
                cx.timed(|| me.attend_back((z, src, &hand), &grads, &mut dqh, &mut part));
                // the block's gradient so far, from the ranks it visited before this one
                if step > 0 {
                    comm.recv(&mut dkv, prev, TAG_DKV).map_err(comm_err)?;
                } else {
                    dkv.fill(0.0);
                }
                dkv.iter_mut().zip(&part).for_each(|(a, b)| *a += b);
                comm.send(&dkv, next, TAG_DKV).map_err(comm_err)?;
                if step + 1 < cp {
                    comm.recv(&mut hand, prev, TAG_KV_BACK).map_err(comm_err)?;
                    src = (src + cp - 1) % cp;
                }
            }
            // one more hop: each block's summed gradient comes home
            comm.recv(&mut mine, prev, TAG_DKV).map_err(comm_err)?;
        }
    }
    dk.copy_from_slice(&mine[..n * kvw]);
    dv.copy_from_slice(&mine[n * kvw..]);
    for (h, d) in dqh.iter().enumerate() {
        put_column(dq, qw, h, hd, d, false);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! cp = 2 and 4 as rank threads against the single worker's attention kernel
    //! (`tensor::attention`, the one training runs today) on the whole sequence: the output
    //! rows and every gradient each rank holds, grouped-query heads, with and without packed
    //! documents.
    use super::*;
    use crate::tensor::attention::{attention_backward, attention_forward, AttnShape};
    use crate::tensor::docs::Docs;

    fn rand(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn rows(x: &[f32], w: usize, pos: &[u32]) -> Vec<f32> {
        pos.iter().flat_map(|&p| x[p as usize * w..(p as usize + 1) * w].to_vec()).collect()
    }

    fn close(a: &[f32], b: &[f32], what: &str) {
        assert_eq!(a.len(), b.len(), "{what}");
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= 2e-5 * (1.0 + y.abs()), "{what}[{i}]: {x} vs {y}");
        }
    }

    fn run(cp: usize, doc_start: Option<usize>, kind: CpComm, order: CpOrder) {
        let (t, s) = (32, Heads { heads: 4, kv_heads: 2, hd: 8 });
        let (qw, kvw) = (s.heads * s.hd, s.kv_heads * s.hd);
        let (q, k, v, dout) = (rand(t * qw, 1), rand(t * kvw, 2), rand(t * kvw, 3), rand(t * qw, 4));
        // the single worker: q | k | v blocks of the whole sequence, the grouped kernel
        let shape = AttnShape::grouped(1, t, s.heads, s.kv_heads, s.hd);
        let qkv: Vec<f32> = [q.clone(), k.clone(), v.clone()].concat();
        let doc_pos: Option<Vec<u32>> =
            doc_start.map(|d| (0..t).map(|r| if r >= d { (r - d) as u32 } else { r as u32 }).collect());
        let docs = Docs::of(doc_pos.as_deref());
        let (mut out, mut probs) = (vec![0f32; t * qw], vec![0f32; shape.probs_len()]);
        attention_forward(&mut out, &mut probs, &qkv, shape, docs);
        let mut dqkv = vec![0f32; qkv.len()];
        attention_backward(&mut dqkv, &dout, &qkv, &probs, shape);
        let (dq_all, dk_all, dv_all) = (&dqkv[..t * qw], &dqkv[t * qw..t * (qw + kvw)], &dqkv[t * (qw + kvw)..]);
        let z = SeqSplit::new(cp, t, order).unwrap();
        let got = brigade_comm::local::run(cp, |comm| -> std::result::Result<_, String> {
            let pos = z.positions(comm.rank());
            let lo: Vec<u32> =
                pos.iter().map(|&p| doc_start.filter(|&d| p as usize >= d).unwrap_or(0) as u32).collect();
            let (ql, kl, vl) = (rows(&q, qw, &pos), rows(&k, kvw, &pos), rows(&v, kvw, &pos));
            let mut st = CpStash::default();
            let mut o = vec![0f32; z.local() * qw];
            let cx = Context { comm: &comm, split: z, kind, clock: None };
            forward(cx, s, (&ql, &kl, &vl), &lo, &mut o, &mut st).map_err(|e| e.to_string())?;
            let dol = rows(&dout, qw, &pos);
            let (mut dq, mut dk, mut dv) = (vec![0f32; ql.len()], vec![0f32; kl.len()], vec![0f32; vl.len()]);
            backward(cx, s, &ql, &lo, (&o, &dol), &st, (&mut dq, &mut dk, &mut dv)).map_err(|e| e.to_string())?;
            Ok((pos, o, dq, dk, dv))
        })
        .unwrap();
        for (pos, o, dq, dk, dv) in got {
            close(&o, &rows(&out, qw, &pos), "out");
            close(&dq, &rows(dq_all, qw, &pos), "dq");
            close(&dk, &rows(dk_all, kvw, &pos), "dk");
            close(&dv, &rows(dv_all, kvw, &pos), "dv");
        }
    }

    #[test]
    fn context_parallel_attention_equals_the_single_workers() {
        for kind in [CpComm::AllGather, CpComm::Ring] {
            for order in [CpOrder::Zigzag, CpOrder::Contiguous] {
                for cp in [1, 2, 4] {
                    run(cp, None, kind, order);
                    run(cp, Some(11), kind, order);
                }
            }
        }
    }

    #[test]
    fn zigzag_gives_each_rank_two_chunks_and_refuses_lengths_that_do_not_split() {
        let z = SeqSplit::zigzag(2, 8).unwrap();
        assert_eq!((z.positions(0), z.positions(1)), (vec![0, 1, 6, 7], vec![2, 3, 4, 5]));
        let c = SeqSplit::new(2, 8, CpOrder::Contiguous).unwrap();
        assert_eq!((c.positions(0), c.positions(1)), (vec![0, 1, 2, 3], vec![4, 5, 6, 7]));
        for order in [CpOrder::Zigzag, CpOrder::Contiguous] {
            let mut all: Vec<u32> = (0..4).flat_map(|r| SeqSplit::new(4, 16, order).unwrap().positions(r)).collect();
            all.sort();
            assert_eq!(all, (0..16).collect::<Vec<u32>>());
        }
        let e = SeqSplit::zigzag(2, 10).unwrap_err().to_string();
        assert!(e.contains("multiple of 4"), "{e}");
        // the mask hides whole (query run, key run) pairs: under zigzag, rank 0's first chunk
        // sees only its own chunk of its own block, and nothing of rank 1's
        let z = SeqSplit::zigzag(2, 16).unwrap();
        let lo = vec![0u32; 8];
        assert_eq!(visible_pairs(&z.runs(0), &lo, &z.runs(0)), vec![(0..4, 0..4), (4..8, 0..4), (4..8, 4..8)]);
        assert_eq!(visible_pairs(&z.runs(0), &lo, &z.runs(1)), vec![(4..8, 0..4), (4..8, 4..8)]);
    }
}
