//! A mixture of experts in the serving forward: each row's router logits, softmax in f32
//! (training's `softmax_in_place`) and
//! top k (training's rule, `brigade::nn::moe::top_k`: ties to the lower expert), then every
//! expert run once on the rows that chose it — its rows gathered into one block, so its weights
//! are read once a step for the whole batch — and each row's chosen outputs weighted and summed
//! in expert order, the shared expert's (scaled by its sigmoid gate) last.
//!
//! Every product goes through `matmul_rows` on the rows of one expert, and `matmul_rows` computes
//! each row alone, so a row's result does not depend on which other rows chose the same experts:
//! batch invariance holds as for a dense model. Under tensor parallelism each rank holds every
//! expert's block of units (as the dense MLP is cut): it computes its units of every pair, the
//! units are all-gathered once for the layer, and each rank computes its own output features of
//! every expert's down projection over the whole width — each output element the single
//! worker's `fma` chain, so `--tp N` gives one worker's logits bit for bit.

use super::weights::MoeLayer;
use brigade::tensor::elementwise::silu;
use brigade::tensor::rowwise::{matmul_rows, Packed};
use rayon::prelude::*;

/// All-gathers `[n, w]` blocks of columns from every rank into `[n, full]`: `(local, n, w, full)`.
pub(super) type Gather<'a> = &'a dyn Fn(&[f32], usize, usize, usize) -> Vec<f32>;

/// `[n, C/tp]`: this rank's output features of the mixture on the rows `h` (`[n, C]`).
pub(super) fn mixture(m: &MoeLayer, h: &[f32], (n, c, cl): (usize, usize, usize), gather: Gather) -> Vec<f32> {
    let (ne, k) = (m.experts.len(), m.top_k);
    let mut logits = vec![0f32; n * ne];
    matmul_rows(&mut logits, h, &m.router, n);
    // each row's chosen experts and their weights, in expert order
    let chosen: Vec<Vec<(usize, f32)>> = logits
        .par_chunks(ne)
        .map(|row| {
            let mut p = row.to_vec();
            brigade::nn::moe::softmax_in_place(&mut p);
            let mut order = Vec::with_capacity(ne);
            match &m.bias {
                // chosen by the biased scores (the balancing bias), weighted by the probabilities
                Some(b) => {
                    let biased: Vec<f32> = p.iter().zip(b).map(|(p, b)| p + b).collect();
                    brigade::nn::moe::top_k(&biased, k, &mut order);
                }
                None => brigade::nn::moe::top_k(&p, k, &mut order),
            }
            let sum: f32 = order.iter().map(|&e| p[e as usize]).sum();
            let mut picked: Vec<(usize, f32)> = order
                .iter()
                .map(|&e| (e as usize, if m.norm_topk { p[e as usize] / sum } else { p[e as usize] }))
                .collect();
            picked.sort_by_key(|&(e, _)| e);
            picked
        })
        .collect();
    // each expert's rows, ascending
    let mut rows: Vec<Vec<usize>> = vec![Vec::new(); ne];
    for (t, picked) in chosen.iter().enumerate() {
        picked.iter().for_each(|&(e, _)| rows[e].push(t));
    }
    let (w, tp) = (m.width, c / cl);
    let wl = w / tp;
    // this rank's units of every (expert, row) pair, experts one after another
    // (the experts run side by side, each product split over the pool inside: one parallel
    // region for all of them rather than one per expert, so no thread idles between experts;
    // each expert's rows are computed as they would be alone)
    let pairs: usize = rows.iter().map(Vec::len).sum();
    let used: Vec<(usize, &Vec<usize>)> = rows.iter().enumerate().filter(|(_, rs)| !rs.is_empty()).collect();
    let mut first = vec![0usize; ne];
    let mut at = 0;
    for &(e, rs) in &used {
        first[e] = at;
        at += rs.len();
    }
    let mut act = vec![0f32; pairs * wl];
    split_by_rows(&mut act, &used, wl).into_par_iter().zip(&used).for_each(|(out, &(e, rs))| {
        let x: Vec<f32> = rs.iter().flat_map(|&t| h[t * c..(t + 1) * c].iter().copied()).collect();
        swiglu_units(&m.experts[e].0, &x, rs.len(), out);
    });
    let act = gather(&act, pairs, wl, w);
    // each expert's down projection on its rows, then each row's sum in expert order
    let mut outs = vec![0f32; pairs * cl];
    split_by_rows(&mut outs, &used, cl).into_par_iter().zip(&used).for_each(|(o, &(e, rs))| {
        let a = &act[first[e] * w..(first[e] + rs.len()) * w];
        matmul_rows(o, a, &m.experts[e].1, rs.len());
    });
    let mut y = vec![0f32; n * cl];
    let mut next = first;
    for (t, picked) in chosen.iter().enumerate() {
        let yr = &mut y[t * cl..(t + 1) * cl];
        for &(e, p) in picked {
            let o = &outs[next[e] * cl..(next[e] + 1) * cl];
            next[e] += 1;
            yr.iter_mut().zip(o).for_each(|(y, &o)| *y += p * o);
        }
    }
    if let Some((gu, down, sw, gate)) = &m.shared {
        let swl = sw / tp;
        let mut a = vec![0f32; n * swl];
        swiglu_units(gu, h, n, &mut a);
        let a = gather(&a, n, swl, *sw);
        let mut o = vec![0f32; n * cl];
        matmul_rows(&mut o, &a, down, n);
        y.par_chunks_mut(cl).zip(o.par_chunks(cl)).zip(h.par_chunks(c)).for_each(|((y, o), h)| {
            let g = 1.0 / (1.0 + (-dot(h, gate)).exp());
            y.iter_mut().zip(o).for_each(|(y, &o)| *y += g * o);
        });
    }
    y
}

/// `buf` cut into each used expert's block of rows (`width` values a row), in order.
fn split_by_rows<'a>(mut buf: &'a mut [f32], used: &[(usize, &Vec<usize>)], width: usize) -> Vec<&'a mut [f32]> {
    let mut out = Vec::with_capacity(used.len());
    for (_, rs) in used {
        let (head, rest) = std::mem::take(&mut buf).split_at_mut(rs.len() * width);
        out.push(head);
        buf = rest;
    }
    out
}

/// `silu(x·gate) ⊙ (x·up)` of this rank's units: `gu` holds gate | up side by side.
fn swiglu_units(gu: &Packed, x: &[f32], n: usize, out: &mut [f32]) {
    let wl = gu.n / 2;
    let mut f = vec![0f32; n * 2 * wl];
    matmul_rows(&mut f, x, gu, n);
    out.par_chunks_mut(wl).zip(f.par_chunks(2 * wl)).for_each(|(o, f)| {
        let (g, u) = f.split_at(wl);
        o.iter_mut().zip(g).zip(u).for_each(|((o, &g), &u)| *o = silu(g) * u);
    });
}

/// A dot product in order.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0f32, |s, (&x, &y)| x.mul_add(y, s))
}
