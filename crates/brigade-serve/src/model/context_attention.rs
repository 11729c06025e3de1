//! Attention under context parallelism (`--cp N`), passing the queries: a sequence's cached
//! keys and values lie striped over the ranks (block `b` on rank `b % N`), each rank computes
//! the rows of the blocks it holds. For one layer:
//! 1. every rank's queries are all-gathered, so each rank has every row of the step;
//! 2. each rank attends every row over the positions it holds (up to the row's own): a partial
//!    result normalised over those positions, and their log-sum-exp per head;
//! 3. the partials are all-gathered and each row's owner merges them, weighted by
//!    `exp(lse_r − max lse)`, in rank order.
//!
//! Decode steps and prompt chunks take the same path: a query's keys may lie on any rank, and
//! only queries and partial results travel (not the cache). Every row's result depends only on
//! its own sequence and the group's size, never on the rest of the batch or on how its prompt
//! was chunked.

use super::kv_store::KvStore;
use super::weights::Dims;
use brigade_comm::Comm;
use rayon::prelude::*;

/// A packed row of a step: its sequence (work item) and position.
type Row = (usize, usize);

/// `ctx[k]` (this rank's k-th row, `rows[k]`) = attention of its query over its sequence's
/// positions `0..=pos` wherever they lie. `all` is every row of the step as `(sequence,
/// position)`, in packed order (`rows` is this rank's share of it, in the same order); `qkv`
/// holds this rank's rows; `tables[sequence]` is the sequence's block table in the striped
/// numbering.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    cp: &Comm,
    ctx: &mut [f32],
    qkv: &[f32],
    (rows, all): (&[Row], &[Row]),
    tables: &[&[usize]],
    kv: &KvStore,
    layer: usize,
    d: Dims,
) {
    let (ranks, rank) = (cp.size(), cp.rank());
    let (heads, qw) = (d.heads, d.q_width());
    let qkvw = qw + 2 * d.kv_width();
    let bs = kv.block_size;
    let owner = |&(wi, pos): &Row| tables[wi][pos / bs] % ranks;
    // 1. every row's query: each rank's rows padded to the most any rank has
    let mut counts = vec![0usize; ranks];
    let place: Vec<(usize, usize)> = all
        .iter()
        .map(|r| {
            let o = owner(r);
            counts[o] += 1;
            (o, counts[o] - 1)
        })
        .collect();
    debug_assert_eq!(counts[rank], rows.len());
    let most = counts.iter().copied().max().unwrap_or(0);
    let mut mine = vec![0f32; most * qw];
    for (k, q) in mine.chunks_exact_mut(qw).zip(qkv.chunks_exact(qkvw)) {
        k.copy_from_slice(&q[..qw]);
    }
    let mut queries = vec![0f32; ranks * most * qw];
    cp.all_gather(&mine, &mut queries).expect("the context-parallel group is alive");
    // 2. every row over the positions this rank holds: [ctx (qw) | lse (heads)] a row
    let width = qw + heads;
    let mut part = vec![0f32; all.len() * width];
    part.par_chunks_mut(width).zip(all.par_iter().zip(&place)).for_each_init(
        Vec::new,
        |sc, (out, (&(wi, pos), &(o, k)))| {
            let q = &queries[(o * most + k) * qw..(o * most + k + 1) * qw];
            partial(out, sc, q, tables[wi], pos, (rank, ranks), kv, layer, d);
        },
    );
    let mut parts = vec![0f32; ranks * all.len() * width];
    cp.all_gather(&part, &mut parts).expect("the context-parallel group is alive");
    // 3. this rank's rows merged over the ranks, in rank order
    let hd = d.hd;
    let mine_at: Vec<usize> = (0..all.len()).filter(|&i| place[i].0 == rank).collect();
    ctx.par_chunks_mut(qw).zip(mine_at.par_iter()).for_each_init(Vec::new, |wts, (out, &i)| {
        let of = |r: usize| &parts[(r * all.len() + i) * width..(r * all.len() + i + 1) * width];
        for h in 0..heads {
            let top = (0..ranks).map(|r| of(r)[qw + h]).fold(f32::NEG_INFINITY, f32::max);
            wts.clear();
            wts.extend((0..ranks).map(|r| brigade::tensor::math::exp(of(r)[qw + h] - top)));
            let total: f32 = wts.iter().sum();
            let o = &mut out[h * hd..(h + 1) * hd];
            o.fill(0.0);
            for (r, &w) in wts.iter().enumerate() {
                if w == 0.0 {
                    continue;
                }
                let wgt = w / total;
                for (o, &v) in o.iter_mut().zip(&of(r)[h * hd..(h + 1) * hd]) {
                    *o = wgt.mul_add(v, *o);
                }
            }
        }
    });
}

/// One row's attention over the positions `0..=pos` of its sequence (block table `table`) that
/// rank `rank` of `ranks` holds: `out[..qw]` normalised over them, `out[qw + h]` head h's
/// log-sum-exp of the scaled scores (−∞ when the rank holds none of them).
#[allow(clippy::too_many_arguments)]
fn partial(
    out: &mut [f32],
    sc: &mut Vec<f32>,
    q: &[f32],
    table: &[usize],
    pos: usize,
    (rank, ranks): (usize, usize),
    kv: &KvStore,
    layer: usize,
    d: Dims,
) {
    let (heads, hd, qw) = (d.heads, d.hd, d.q_width());
    let group = heads / d.kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let bs = kv.block_size;
    // the (local block, slots) this rank holds among the row's positions, in order
    let held: Vec<(usize, usize)> = (0..=pos / bs)
        .filter(|&j| table[j] % ranks == rank)
        .map(|j| (table[j] / ranks, if j == pos / bs { pos % bs + 1 } else { bs }))
        .collect();
    let np: usize = held.iter().map(|&(_, n)| n).sum();
    let slots = || held.iter().flat_map(|&(b, n)| (0..n).map(move |s| (b, s)));
    let (ctx, lse) = out.split_at_mut(qw);
    ctx.fill(0.0);
    if np == 0 {
        lse.fill(f32::NEG_INFINITY);
        return;
    }
    sc.resize(heads * np, 0.0);
    // a row of an f16 cache converted (each half exactly)
    let mut buf = Vec::new();
    for (p, (b, s)) in slots().enumerate() {
        let k = kv.read(b, layer, 0, s, &mut buf);
        for h in 0..heads {
            let g = h / group;
            sc[h * np + p] = dot(&q[h * hd..(h + 1) * hd], &k[g * hd..(g + 1) * hd]) * scale;
        }
    }
    let mut sums = vec![0f32; heads];
    for (h, s) in sc.chunks_exact_mut(np).enumerate() {
        let mx = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let mut sum = 0f32;
        for v in s.iter_mut() {
            *v = brigade::tensor::math::exp(*v - mx);
            sum += *v;
        }
        sums[h] = sum;
        lse[h] = mx + sum.ln();
    }
    for (p, (b, s)) in slots().enumerate() {
        let v = kv.read(b, layer, 1, s, &mut buf);
        for h in 0..heads {
            let g = h / group;
            let wgt = sc[h * np + p] / sums[h];
            for (o, &vv) in ctx[h * hd..(h + 1) * hd].iter_mut().zip(&v[g * hd..(g + 1) * hd]) {
                *o = wgt.mul_add(vv, *o);
            }
        }
    }
}

/// A dot product in a fixed order (the single worker's: 8 lanes, then the lanes in order).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    super::paged_attention::dot::<f32>(a, b)
}
