//! Causal attention of each packed row over its own sequence's cached keys and values (the
//! paged KV cache), in a fixed order: scores position by position, the softmax in order, the
//! weighted values summed over positions in order — a row's result does not depend on the
//! other rows of the step. Grouped-query attention: each key/value head serves its group of
//! `heads / kv_heads` query heads (GPT-2: groups of one), and each cached row is read once
//! for all of them.

use super::kv_store::KvStore;
use super::weights::Dims;
use rayon::prelude::*;

/// `ctx[r] = softmax(q_r · K / √hd) · V` for every packed row `r` at its `(sequence,
/// position)` in `rows` (`tables[sequence]`: its block table), with `q_r` the first `heads · hd` floats of row `r` of `qkv`
/// (row width `(heads + 2·kv_heads) · hd`) and K, V its sequence's positions `0..=pos` of
/// layer `layer` in `kv`.
pub(crate) fn attention(
    ctx: &mut [f32],
    qkv: &[f32],
    rows: &[(usize, usize)],
    tables: &[&[usize]],
    kv: &KvStore,
    layer: usize,
    d: Dims,
) {
    let (heads, hd) = (d.heads, d.hd);
    let (qw, qkvw) = (d.q_width(), d.q_width() + 2 * d.kv_width());
    let group = heads / d.kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    ctx.par_chunks_mut(qw).zip(rows.par_iter()).enumerate().for_each_init(
        || (Vec::new(), vec![0f32; heads]),
        |(sc, inv), (r, (out, &(wi, pos)))| {
            let table = tables[wi];
            let q = &qkv[r * qkvw..r * qkvw + qw];
            let np = pos + 1;
            // scores [head][position]: each cached key row is read once, for every head
            sc.resize(heads * np, 0.0);
            for p in 0..np {
                let k = kv.slot(table[p / kv.block_size], layer, 0, p % kv.block_size);
                for h in 0..heads {
                    let g = h / group;
                    sc[h * np + p] = dot(&q[h * hd..(h + 1) * hd], &k[g * hd..(g + 1) * hd]) * scale;
                }
            }
            for (h, s) in sc.chunks_exact_mut(np).enumerate() {
                let mx = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                let mut sum = 0f32;
                for v in s.iter_mut() {
                    *v = brigade::tensor::math::exp(*v - mx);
                    sum += *v;
                }
                inv[h] = sum;
            }
            // out[h] = Σ_p (s[h][p] / sum[h]) · v_p[g(h)], over p in order: each value row read once
            out.fill(0.0);
            for p in 0..np {
                let v = kv.slot(table[p / kv.block_size], layer, 1, p % kv.block_size);
                for h in 0..heads {
                    let g = h / group;
                    let wgt = sc[h * np + p] / inv[h];
                    for (o, &vv) in out[h * hd..(h + 1) * hd].iter_mut().zip(&v[g * hd..(g + 1) * hd]) {
                        *o = wgt.mul_add(vv, *o);
                    }
                }
            }
        },
    );
}

/// A dot product in a fixed order: 8 lanes, then the lanes in order.
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for t in 0..8 {
            acc[t] = x[t].mul_add(y[t], acc[t]);
        }
    }
    let mut s = acc.iter().sum::<f32>();
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        s = x.mul_add(*y, s);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every row against attention written out in f64 from the same numbers: two sequences
    /// whose blocks lie out of order in the cache, grouped-query heads (4 over 2), and scores
    /// from small to past exp's range (q·k/√hd up to ~300: a softmax that does not subtract its
    /// maximum overflows).
    #[test]
    fn rows_match_attention_written_out() {
        let (heads, kv_heads, hd, bs, layers) = (4, 2, 8, 2, 2);
        let d = Dims { c: heads * hd, heads, kv_heads, hd, q_all: heads * hd, mlp: 0, mlp_local: 0, swiglu: false };
        let kvw = kv_heads * hd;
        let mut kv = KvStore::new(8, bs, layers, kvw);
        let tables: Vec<Vec<usize>> = vec![vec![5, 1, 6], vec![2, 7]];
        let lens = [5usize, 3];
        let val = |i: usize, scale: f32| ((i * 2654435761 % 1000) as f32 / 500.0 - 1.0) * scale;
        let layer = 1;
        for scale in [0.3f32, 20.0] {
            // keys and values of every cached position
            let mut keys = vec![vec![]; 2];
            let mut vals = vec![vec![]; 2];
            for (s, table) in tables.iter().enumerate() {
                for p in 0..lens[s] {
                    let k: Vec<f32> = (0..kvw).map(|j| val(7 * s + 31 * p + j, scale)).collect();
                    let v: Vec<f32> = (0..kvw).map(|j| val(11 * s + 17 * p + 3 * j + 1, 1.0)).collect();
                    kv.slot_mut(table[p / bs], layer, 0, p % bs).copy_from_slice(&k);
                    kv.slot_mut(table[p / bs], layer, 1, p % bs).copy_from_slice(&v);
                    keys[s].push(k);
                    vals[s].push(v);
                }
            }
            // rows: each sequence at a few positions
            let rows = vec![(0, 4), (1, 2), (0, 0), (1, 1), (0, 2)];
            let qkvw = heads * hd + 2 * kvw;
            let qkv: Vec<f32> = (0..rows.len() * qkvw).map(|i| val(i + 5, scale)).collect();
            let refs: Vec<&[usize]> = tables.iter().map(|t| t.as_slice()).collect();
            let mut ctx = vec![0f32; rows.len() * heads * hd];
            attention(&mut ctx, &qkv, &rows, &refs, &kv, layer, d);
            for (r, &(s, pos)) in rows.iter().enumerate() {
                for h in 0..heads {
                    let g = h / (heads / kv_heads);
                    let q = &qkv[r * qkvw + h * hd..r * qkvw + (h + 1) * hd];
                    let scores: Vec<f64> = (0..=pos)
                        .map(|p| {
                            let k = &keys[s][p][g * hd..(g + 1) * hd];
                            q.iter().zip(k).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() / (hd as f64).sqrt()
                        })
                        .collect();
                    let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let w: Vec<f64> = scores.iter().map(|x| (x - mx).exp()).collect();
                    let sum: f64 = w.iter().sum();
                    for i in 0..hd {
                        let want: f64 = (0..=pos).map(|p| w[p] / sum * vals[s][p][g * hd + i] as f64).sum();
                        let got = ctx[r * heads * hd + h * hd + i] as f64;
                        assert!(
                            (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                            "scale {scale}, row {r} head {h} [{i}]: {got} vs {want} (largest score {mx:.1})"
                        );
                    }
                }
            }
        }
    }
}
