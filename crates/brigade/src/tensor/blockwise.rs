//! Blockwise attention: a block of query rows against a block of key/value rows, every row at
//! a global position, with each query row's log-sum-exp kept so that the partial results over
//! several key blocks merge, in a fixed order, into exactly the attention over all of them (the
//! online softmax). Context parallelism passes key/value blocks round a ring of ranks and runs
//! this on the block in hand; a prompt split across ranks is served the same way. The backward
//! recomputes a block's probabilities from the merged log-sum-exp and needs nothing kept of the
//! block: no `t × t` probabilities are stored.
//!
//! The mask is by position: query row i sees key row j iff `lo[i] <= kpos[j] <= qpos[i]`
//! (causal; inside its document when `lo[i]` is its document's first position, 0 otherwise).
//! Matrices are row-major: `q`, `out` `[nq, hd]`, `k`, `v` `[nk, hd]`, one head.

use super::matmul::matmul;

/// Which keys each query row sees: its global position and the first position it may see.
#[derive(Clone, Copy, Debug)]
pub struct Queries<'a> {
    pub pos: &'a [u32],
    pub lo: &'a [u32],
}

impl Queries<'_> {
    /// The keys of a block at ascending positions `kpos` that row `i` sees: a run of them.
    fn seen(&self, i: usize, kpos: &[u32]) -> std::ops::Range<usize> {
        let a = kpos.partition_point(|&p| p < self.lo[i]);
        let b = kpos.partition_point(|&p| p <= self.pos[i]);
        a..b.max(a)
    }
}

/// The scores `q·kᵀ` of a block, unscaled, every entry (the caller reads each row's seen run).
fn scores(q: &[f32], k: &[f32], hd: usize, (nq, nk): (usize, usize), s: &mut Vec<f32>) {
    s.clear();
    s.resize(nq * nk, 0.0);
    matmul(s, q, k, nq, hd, nk, false, true, false);
}

/// The attention of the queries over this key/value block alone: `out` (overwritten) and each
/// row's log-sum-exp `lse` (`-inf`, with a zero row of `out`, where the block holds no key the
/// row sees). The block's positions `kpos` ascend (a rank's runs in order).
#[allow(clippy::too_many_arguments)]
pub fn block_forward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    hd: usize,
    qs: Queries,
    kpos: &[u32],
    out: &mut [f32],
    lse: &mut [f32],
) {
    let (nq, nk) = (qs.pos.len(), kpos.len());
    assert!(q.len() == nq * hd && k.len() == nk * hd && v.len() == nk * hd);
    assert!(out.len() == nq * hd && lse.len() == nq && qs.lo.len() == nq);
    assert!(kpos.is_sorted(), "a block's key positions ascend");
    if nk == 0 {
        // an empty block: no row sees anything of it
        out.fill(0.0);
        lse.fill(f32::NEG_INFINITY);
        return;
    }
    let mut p = Vec::new();
    scores(q, k, hd, (nq, nk), &mut p);
    let scale = 1.0 / (hd as f32).sqrt();
    for (i, (row, l)) in p.chunks_mut(nk).zip(lse.iter_mut()).enumerate() {
        let seen = qs.seen(i, kpos);
        if seen.is_empty() {
            row.fill(0.0);
            *l = f32::NEG_INFINITY;
            continue;
        }
        let (before, rest) = row.split_at_mut(seen.start);
        let (run, after) = rest.split_at_mut(seen.len());
        before.fill(0.0);
        after.fill(0.0);
        run.iter_mut().for_each(|x| *x *= scale);
        *l = super::math::softmax_row_lse(run);
    }
    matmul(out, &p, v, nq, nk, hd, false, false, false);
}

/// Merges the partial result `(out_b, lse_b)` of another key block into `(out, lse)`: after
/// every block is merged, `out` is the attention over all their keys and `lse` its rows'
/// log-sum-exp. Merging in a fixed order gives the same bits on every run.
pub fn merge(out: &mut [f32], lse: &mut [f32], out_b: &[f32], lse_b: &[f32], hd: usize) {
    assert!(out.len() == lse.len() * hd && out_b.len() == out.len() && lse_b.len() == lse.len());
    for (i, (la, &lb)) in lse.iter_mut().zip(lse_b).enumerate() {
        if lb == f32::NEG_INFINITY {
            continue;
        }
        let row = &mut out[i * hd..(i + 1) * hd];
        let rb = &out_b[i * hd..(i + 1) * hd];
        if *la == f32::NEG_INFINITY {
            row.copy_from_slice(rb);
            *la = lb;
            continue;
        }
        let m = la.max(lb);
        let (wa, wb) = (super::math::exp(*la - m), super::math::exp(lb - m));
        let sum = wa + wb;
        let (wa, wb) = (wa / sum, wb / sum);
        for (x, &y) in row.iter_mut().zip(rb) {
            *x = wa * *x + wb * y;
        }
        *la = m + sum.ln();
    }
}

/// Each query row's `D = Σ dout ⊙ out` over the head dimension (of the merged output): what
/// every block's backward subtracts.
pub fn row_dots(dout: &[f32], out: &[f32], hd: usize) -> Vec<f32> {
    dout.chunks(hd).zip(out.chunks(hd)).map(|(a, b)| super::math::dot(a, b)).collect()
}

/// One key/value block's part of the backward, from the merged `lse` and `delta`
/// ([`row_dots`]): adds to `dq` (`[nq, hd]`), `dk` and `dv` (`[nk, hd]`).
#[allow(clippy::too_many_arguments)]
pub fn block_backward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    hd: usize,
    qs: Queries,
    kpos: &[u32],
    dout: &[f32],
    lse: &[f32],
    delta: &[f32],
    (dq, dk, dv): (&mut [f32], &mut [f32], &mut [f32]),
) {
    let (nq, nk) = (qs.pos.len(), kpos.len());
    assert!(dout.len() == nq * hd && lse.len() == nq && delta.len() == nq);
    assert!(dq.len() == nq * hd && dk.len() == nk * hd && dv.len() == nk * hd);
    if nk == 0 || nq == 0 {
        return;
    }
    assert!(kpos.is_sorted(), "a block's key positions ascend");
    let mut p = Vec::new();
    scores(q, k, hd, (nq, nk), &mut p);
    let scale = 1.0 / (hd as f32).sqrt();
    for (i, (row, &l)) in p.chunks_mut(nk).zip(lse).enumerate() {
        // the probabilities again, from the merged log-sum-exp; zero where the row sees nothing
        let seen = if l == f32::NEG_INFINITY { 0..0 } else { qs.seen(i, kpos) };
        let (before, rest) = row.split_at_mut(seen.start);
        let (run, after) = rest.split_at_mut(seen.len());
        before.fill(0.0);
        after.fill(0.0);
        run.iter_mut().for_each(|x| *x = super::math::exp(*x * scale - l));
    }
    // dV += Pᵀ·dO
    matmul(dv, &p, dout, nk, nq, hd, true, false, true);
    // dP = dO·Vᵀ, then dS = P ⊙ (dP − D), scaled
    let mut ds = vec![0f32; nq * nk];
    matmul(&mut ds, dout, v, nq, hd, nk, false, true, false);
    let scale = 1.0 / (hd as f32).sqrt();
    for ((drow, prow), &d) in ds.chunks_mut(nk).zip(p.chunks(nk)).zip(delta) {
        for (x, &pij) in drow.iter_mut().zip(prow) {
            *x = pij * (*x - d) * scale;
        }
    }
    // dQ += dS·K, dK += dSᵀ·Q
    matmul(dq, &ds, k, nq, nk, hd, false, false, true);
    matmul(dk, &ds, q, nk, nq, hd, true, false, true);
}

#[cfg(test)]
mod tests {
    //! Against attention written out in f64 over the whole sequence (the reference), and its
    //! finite differences: queries at a rank's zigzag chunks, keys in the ring's blocks, some
    //! rows inside packed documents, some blocks a row sees nothing of.
    use super::*;

    fn rand(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 33) as f64 / (1u64 << 31) as f64 * 2.0 - 1.0) as f32
            })
            .collect()
    }

    /// Attention of query rows `rows` (global positions) over keys 0..t, in f64.
    fn reference(q: &[f64], k: &[f64], v: &[f64], hd: usize, rows: &[usize], lo: &[usize]) -> Vec<f64> {
        let scale = 1.0 / (hd as f64).sqrt();
        let mut out = vec![0.0; rows.len() * hd];
        for (i, (&r, &l)) in rows.iter().zip(lo).enumerate() {
            let s: Vec<f64> =
                (l..=r).map(|j| (0..hd).map(|d| q[i * hd + d] * k[j * hd + d]).sum::<f64>() * scale).collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for (jj, j) in (l..=r).enumerate() {
                for d in 0..hd {
                    out[i * hd + d] += e[jj] / z * v[j * hd + d];
                }
            }
        }
        out
    }

    /// The case: t = 16, cp = 2, zigzag (rank 0 holds chunks 0 and 3), a document starting at 6.
    struct Case {
        t: usize,
        hd: usize,
        rows: Vec<usize>,
        lo: Vec<usize>,
        blocks: Vec<Vec<usize>>,
    }

    fn case() -> Case {
        let (t, hd) = (16, 8);
        let rows: Vec<usize> = (0..4).chain(12..16).collect();
        let lo: Vec<usize> = rows.iter().map(|&r| if r >= 6 { 6 } else { 0 }).collect();
        // the ring's blocks: rank 0's chunks, then rank 1's (chunks 1 and 2)
        let blocks = vec![(0..4).chain(12..16).collect(), (4..12).collect()];
        Case { t, hd, rows, lo, blocks }
    }

    fn pos(v: &[usize]) -> Vec<u32> {
        v.iter().map(|&x| x as u32).collect()
    }

    fn gather(x: &[f32], rows: &[usize], hd: usize) -> Vec<f32> {
        rows.iter().flat_map(|&r| x[r * hd..(r + 1) * hd].to_vec()).collect()
    }

    /// The blockwise result over the ring's blocks, merged in order.
    fn blockwise(c: &Case, q: &[f32], k: &[f32], v: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let (qp, ql) = (pos(&c.rows), pos(&c.lo));
        let qs = Queries { pos: &qp, lo: &ql };
        let n = c.rows.len();
        let (mut out, mut lse) = (vec![0f32; n * c.hd], vec![f32::NEG_INFINITY; n]);
        for b in &c.blocks {
            let (mut ob, mut lb) = (vec![0f32; n * c.hd], vec![0f32; n]);
            block_forward(q, &gather(k, b, c.hd), &gather(v, b, c.hd), c.hd, qs, &pos(b), &mut ob, &mut lb);
            merge(&mut out, &mut lse, &ob, &lb, c.hd);
        }
        (out, lse)
    }

    #[test]
    fn merged_blocks_equal_attention_over_the_whole_sequence() {
        let c = case();
        let q = rand(c.rows.len() * c.hd, 1);
        let (k, v) = (rand(c.t * c.hd, 2), rand(c.t * c.hd, 3));
        let f = |x: &[f32]| x.iter().map(|&a| a as f64).collect::<Vec<_>>();
        let want = reference(&f(&q), &f(&k), &f(&v), c.hd, &c.rows, &c.lo);
        let (out, lse) = blockwise(&c, &q, &k, &v);
        for (a, b) in out.iter().zip(&want) {
            assert!((*a as f64 - b).abs() < 1e-5, "{a} vs {b}");
        }
        assert!(lse.iter().all(|l| l.is_finite()));
        // the other order of blocks: the same result to rounding
        let mut rev = case();
        rev.blocks.reverse();
        let (out2, _) = blockwise(&rev, &q, &k, &v);
        for (a, b) in out.iter().zip(&out2) {
            assert!((a - b).abs() < 1e-6);
        }
        // a row that sees nothing of a block: -inf and a zero row, and merging it changes nothing
        let (qp, ql) = (pos(&[2]), pos(&[0]));
        let (mut o, mut l) = (vec![1f32; c.hd], vec![0f32]);
        let late = [8, 9];
        block_forward(
            &q[..c.hd],
            &gather(&k, &late, c.hd),
            &gather(&v, &late, c.hd),
            c.hd,
            Queries { pos: &qp, lo: &ql },
            &pos(&late),
            &mut o,
            &mut l,
        );
        assert_eq!((o, l[0]), (vec![0f32; c.hd], f32::NEG_INFINITY));
        // an empty block likewise
        let (mut o, mut l) = (vec![1f32; c.hd], vec![0f32]);
        block_forward(&q[..c.hd], &[], &[], c.hd, Queries { pos: &qp, lo: &ql }, &[], &mut o, &mut l);
        assert_eq!((o, l[0]), (vec![0f32; c.hd], f32::NEG_INFINITY));
    }

    #[test]
    fn the_backward_over_blocks_is_the_whole_attentions_gradient() {
        let c = case();
        let n = c.rows.len();
        let q = rand(n * c.hd, 4);
        let (k, v) = (rand(c.t * c.hd, 5), rand(c.t * c.hd, 6));
        let w = rand(n * c.hd, 7); // L = Σ out ⊙ w
        let (out, lse) = blockwise(&c, &q, &k, &v);
        let delta = row_dots(&w, &out, c.hd);
        let (qp, ql) = (pos(&c.rows), pos(&c.lo));
        let qs = Queries { pos: &qp, lo: &ql };
        let (mut dq, mut dk, mut dv) = (vec![0f32; n * c.hd], vec![0f32; c.t * c.hd], vec![0f32; c.t * c.hd]);
        for b in &c.blocks {
            let (mut dkb, mut dvb) = (vec![0f32; b.len() * c.hd], vec![0f32; b.len() * c.hd]);
            let (kb, vb) = (gather(&k, b, c.hd), gather(&v, b, c.hd));
            block_backward(&q, &kb, &vb, c.hd, qs, &pos(b), &w, &lse, &delta, (&mut dq, &mut dkb, &mut dvb));
            for (r, &g) in b.iter().enumerate() {
                for d in 0..c.hd {
                    dk[g * c.hd + d] += dkb[r * c.hd + d];
                    dv[g * c.hd + d] += dvb[r * c.hd + d];
                }
            }
        }
        // central differences of the f64 reference
        let f = |x: &[f32]| x.iter().map(|&a| a as f64).collect::<Vec<_>>();
        let (q64, k64, v64, w64) = (f(&q), f(&k), f(&v), f(&w));
        let loss = |q: &[f64], k: &[f64], v: &[f64]| -> f64 {
            reference(q, k, v, c.hd, &c.rows, &c.lo).iter().zip(&w64).map(|(a, b)| a * b).sum()
        };
        let eps = 1e-6;
        let check = |got: &[f32], which: usize| {
            for (i, &g) in got.iter().enumerate() {
                let (mut a, mut b, mut cc) = (q64.clone(), k64.clone(), v64.clone());
                let x = [&mut a, &mut b, &mut cc];
                let base = x[which][i];
                x[which][i] = base + eps;
                let up = loss(&a, &b, &cc);
                let x = [&mut a, &mut b, &mut cc];
                x[which][i] = base - eps;
                let down = loss(&a, &b, &cc);
                let want = (up - down) / (2.0 * eps);
                assert!(
                    (g as f64 - want).abs() < 1e-4 * (1.0 + want.abs()),
                    "input {which} element {i}: {g} vs {want}"
                );
            }
        };
        check(&dq, 0);
        check(&dk, 1);
        check(&dv, 2);
        // keys no query of these rows sees (positions 4, 5 are seen; 10, 11 by rows ≥ 12 within
        // the document from 6) — and key 13 only by rows 13..15: nothing is left out
        assert!(dk[13 * c.hd..14 * c.hd].iter().any(|&x| x != 0.0));
    }
}
