//! Context parallelism's attention core: each rank of a context group holds two chunks of
//! every sequence — of `2·cp` equal chunks, chunks `r` and `2·cp − 1 − r` ("zigzag", so that
//! under a causal mask every rank has the same attention work) — and everything but attention
//! is local to its rows. Attention all-gathers the group's keys and values (cheap under
//! grouped-query attention's few key/value heads: what Llama 3 did), runs the local queries over
//! every rank's block with the blockwise kernel (`tensor::blockwise`), merged in rank order, and
//! the backward reduce-scatters the keys' and values' gradients back to the ranks holding those
//! rows. Positions are global: row i of a rank is at `Zigzag::positions()[i]` of its sequence.
//!
//! Layout of one sequence's rows on a rank: `q` `[t_loc, heads·hd]`, `k` and `v`
//! `[t_loc, kv_heads·hd]`, heads side by side in a row (as the projections write them); query
//! head h reads key/value head `h / (heads / kv_heads)`.

use crate::error::{Error, Result};
use crate::tensor::blockwise::{block_backward, block_forward, merge, row_dots, Queries};
use brigade_comm::{Comm, ReduceOp};

/// Which rows of a sequence of `t` tokens rank `rank` of a context group of `cp` holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Zigzag {
    pub cp: usize,
    pub t: usize,
}

impl Zigzag {
    /// A split of sequences of `t` tokens over `cp` ranks, or why there is none.
    pub fn new(cp: usize, t: usize) -> Result<Zigzag> {
        if cp == 0 || !t.is_multiple_of(2 * cp) {
            return Err(Error::Layout(format!(
                "cp={cp} splits each sequence into {} chunks, and {t} tokens do not divide into them; pick a sequence length that is a multiple of {}",
                2 * cp,
                2 * cp
            )));
        }
        Ok(Zigzag { cp, t })
    }

    /// Rows of a sequence on one rank.
    pub fn local(&self) -> usize {
        self.t / self.cp
    }

    /// The global positions of rank `rank`'s rows, in its order: chunk `rank`, then chunk
    /// `2·cp − 1 − rank`.
    pub fn positions(&self, rank: usize) -> Vec<u32> {
        let c = self.t / (2 * self.cp);
        let (a, b) = (rank * c, (2 * self.cp - 1 - rank) * c);
        (a..a + c).chain(b..b + c).map(|p| p as u32).collect()
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

/// What the forward keeps for the backward: the group's keys and values (rank order) and each
/// query row's log-sum-exp per head (`[heads, t_loc]`).
#[derive(Default)]
pub struct CpStash {
    pub k_all: Vec<f32>,
    pub v_all: Vec<f32>,
    pub lse: Vec<f32>,
}

fn comm_err(e: brigade_comm::CommError) -> Error {
    Error::Train(format!("context-parallel attention: {e}"))
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

/// The attention of this rank's query rows over the whole sequence: `out` `[t_loc, heads·hd]`
/// (overwritten). `lo[i]` is the first global position row i may see (0, or its document's
/// start). `comm` is the context group (rank r holds `z.positions(r)`).
#[allow(clippy::too_many_arguments)]
pub fn forward(
    comm: &Comm,
    z: Zigzag,
    s: Heads,
    (q, k, v): (&[f32], &[f32], &[f32]),
    lo: &[u32],
    out: &mut [f32],
    st: &mut CpStash,
) -> Result<()> {
    let (n, hd) = (z.local(), s.hd);
    let (qw, kvw) = (s.heads * hd, s.kv_heads * hd);
    assert!(q.len() == n * qw && k.len() == n * kvw && v.len() == n * kvw && out.len() == n * qw && lo.len() == n);
    st.k_all.resize(z.cp * n * kvw, 0.0);
    st.v_all.resize(z.cp * n * kvw, 0.0);
    comm.all_gather(k, &mut st.k_all).map_err(comm_err)?;
    comm.all_gather(v, &mut st.v_all).map_err(comm_err)?;
    let pos = z.positions(comm.rank());
    let qs = Queries { pos: &pos, lo };
    st.lse.resize(s.heads * n, 0.0);
    let blocks: Vec<Vec<u32>> = (0..z.cp).map(|r| z.positions(r)).collect();
    for g in 0..s.kv_heads {
        let kv = kv_blocks(st, z, kvw, g, hd);
        for h in g * s.group()..(g + 1) * s.group() {
            let qh = column(q, qw, h, hd);
            let (mut o, mut l) = (vec![0f32; n * hd], vec![f32::NEG_INFINITY; n]);
            let (mut ob, mut lb) = (vec![0f32; n * hd], vec![0f32; n]);
            for ((kb, vb), kpos) in kv.iter().zip(&blocks) {
                block_forward(&qh, kb, vb, hd, qs, kpos, &mut ob, &mut lb);
                merge(&mut o, &mut l, &ob, &lb, hd);
            }
            put_column(out, qw, h, hd, &o, false);
            st.lse[h * n..(h + 1) * n].copy_from_slice(&l);
        }
    }
    Ok(())
}

/// Key/value head `g`'s rows of every rank's block, each as its own `[t_loc, hd]`, in rank
/// order (taken once for the query heads that share them).
fn kv_blocks(st: &CpStash, z: Zigzag, kvw: usize, g: usize, hd: usize) -> Vec<(Vec<f32>, Vec<f32>)> {
    let n = z.local();
    (0..z.cp)
        .map(|r| {
            let blk = r * n * kvw..(r + 1) * n * kvw;
            (column(&st.k_all[blk.clone()], kvw, g, hd), column(&st.v_all[blk], kvw, g, hd))
        })
        .collect()
}

/// From `dout` (`[t_loc, heads·hd]`) and the forward's `out` and stash: this rank's `dq`
/// (overwritten) and, reduce-scattered over the group, the gradients of its own key and value
/// rows `dk`, `dv` (overwritten).
#[allow(clippy::too_many_arguments)]
pub fn backward(
    comm: &Comm,
    z: Zigzag,
    s: Heads,
    q: &[f32],
    lo: &[u32],
    (out, dout): (&[f32], &[f32]),
    st: &CpStash,
    (dq, dk, dv): (&mut [f32], &mut [f32], &mut [f32]),
) -> Result<()> {
    let (n, hd) = (z.local(), s.hd);
    let (qw, kvw) = (s.heads * hd, s.kv_heads * hd);
    assert!(dq.len() == n * qw && dk.len() == n * kvw && dv.len() == n * kvw);
    let pos = z.positions(comm.rank());
    let qs = Queries { pos: &pos, lo };
    let (mut dk_all, mut dv_all) = (vec![0f32; z.cp * n * kvw], vec![0f32; z.cp * n * kvw]);
    let blocks: Vec<Vec<u32>> = (0..z.cp).map(|r| z.positions(r)).collect();
    for g in 0..s.kv_heads {
        let kv = kv_blocks(st, z, kvw, g, hd);
        for h in g * s.group()..(g + 1) * s.group() {
            let (qh, oh, doh) = (column(q, qw, h, hd), column(out, qw, h, hd), column(dout, qw, h, hd));
            let delta = row_dots(&doh, &oh, hd);
            let lse = &st.lse[h * n..(h + 1) * n];
            let mut dqh = vec![0f32; n * hd];
            for (r, ((kb, vb), kpos)) in kv.iter().zip(&blocks).enumerate() {
                let blk = r * n * kvw..(r + 1) * n * kvw;
                let (mut dkb, mut dvb) = (vec![0f32; n * hd], vec![0f32; n * hd]);
                block_backward(&qh, kb, vb, hd, qs, kpos, &doh, lse, &delta, (&mut dqh, &mut dkb, &mut dvb));
                put_column(&mut dk_all[blk.clone()], kvw, g, hd, &dkb, true);
                put_column(&mut dv_all[blk], kvw, g, hd, &dvb, true);
            }
            put_column(dq, qw, h, hd, &dqh, false);
        }
    }
    comm.reduce_scatter(&dk_all, dk, ReduceOp::Sum).map_err(comm_err)?;
    comm.reduce_scatter(&dv_all, dv, ReduceOp::Sum).map_err(comm_err)?;
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

    fn run(cp: usize, doc_start: Option<usize>) {
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
        let z = Zigzag::new(cp, t).unwrap();
        let got = brigade_comm::local::run(cp, |comm| -> std::result::Result<_, String> {
            let pos = z.positions(comm.rank());
            let lo: Vec<u32> =
                pos.iter().map(|&p| doc_start.filter(|&d| p as usize >= d).unwrap_or(0) as u32).collect();
            let (ql, kl, vl) = (rows(&q, qw, &pos), rows(&k, kvw, &pos), rows(&v, kvw, &pos));
            let mut st = CpStash::default();
            let mut o = vec![0f32; z.local() * qw];
            forward(&comm, z, s, (&ql, &kl, &vl), &lo, &mut o, &mut st).map_err(|e| e.to_string())?;
            let dol = rows(&dout, qw, &pos);
            let (mut dq, mut dk, mut dv) = (vec![0f32; ql.len()], vec![0f32; kl.len()], vec![0f32; vl.len()]);
            backward(&comm, z, s, &ql, &lo, (&o, &dol), &st, (&mut dq, &mut dk, &mut dv)).map_err(|e| e.to_string())?;
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
        for cp in [1, 2, 4] {
            run(cp, None);
            run(cp, Some(11));
        }
    }

    #[test]
    fn zigzag_gives_each_rank_two_chunks_and_refuses_lengths_that_do_not_split() {
        let z = Zigzag::new(2, 8).unwrap();
        assert_eq!((z.positions(0), z.positions(1)), (vec![0, 1, 6, 7], vec![2, 3, 4, 5]));
        let mut all: Vec<u32> = (0..4).flat_map(|r| Zigzag::new(4, 16).unwrap().positions(r)).collect();
        all.sort();
        assert_eq!(all, (0..16).collect::<Vec<u32>>());
        let e = Zigzag::new(2, 10).unwrap_err().to_string();
        assert!(e.contains("multiple of 4"), "{e}");
    }
}
