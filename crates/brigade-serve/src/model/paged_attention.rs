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
