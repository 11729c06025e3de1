//! LayerNorm over the last dimension.

use super::math::sum8_f64;
use super::ROW_CHUNK;
use rayon::prelude::*;

pub const EPS: f32 = 1e-5;

/// `out = (x - mean) / sqrt(var + eps) · w + b` per row; saves `mean` and `rstd` for backward.
pub fn layernorm_forward(
    out: &mut [f32],
    mean: &mut [f32],
    rstd: &mut [f32],
    x: &[f32],
    w: &[f32],
    b: &[f32],
    c: usize,
) {
    let n = x.len() / c;
    assert!(out.len() == x.len() && mean.len() == n && rstd.len() == n && w.len() == c && b.len() == c);
    out.par_chunks_mut(c)
        .zip(x.par_chunks(c))
        .zip(mean.par_iter_mut().zip(rstd.par_iter_mut()))
        .with_min_len(ROW_CHUNK)
        .for_each(|((o, x), (m, r))| {
            let (mu, rs) = row_stats(x, EPS);
            for (((o, &x), &w), &b) in o.iter_mut().zip(x).zip(w).zip(b) {
                *o = (x - mu) * rs * w + b;
            }
            *m = mu;
            *r = rs;
        });
}

/// Mean and `1/sqrt(var + eps)` of a row, summed in f64.
#[inline]
pub fn row_stats(x: &[f32], eps: f32) -> (f32, f32) {
    let c = x.len() as f64;
    let mu = sum8_f64(x, |v| v as f64) / c;
    let var = sum8_f64(x, |v| (v as f64 - mu).powi(2)) / c;
    (mu as f32, (1.0 / (var + eps as f64).sqrt()) as f32)
}

/// LayerNorm of one row in place, keeping no statistics (inference).
pub fn layernorm_row(x: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
    let (mu, rs) = row_stats(x, eps);
    for ((x, &w), &b) in x.iter_mut().zip(w).zip(b) {
        *x = (*x - mu) * rs * w + b;
    }
}

/// Accumulates into `dx` (the residual stream's gradient), `dw` and `db`.
#[allow(clippy::too_many_arguments)]
pub fn layernorm_backward(
    dx: &mut [f32],
    dw: &mut [f32],
    db: &mut [f32],
    dout: &[f32],
    x: &[f32],
    mean: &[f32],
    rstd: &[f32],
    w: &[f32],
    c: usize,
) {
    let n = x.len() / c;
    assert!(dx.len() == x.len() && dout.len() == x.len() && mean.len() == n && rstd.len() == n);
    // Each fixed-size block of rows returns its own partial dw/db; the partials are summed
    // in block order, so the result does not depend on the thread count.
    let partials: Vec<(Vec<f32>, Vec<f32>)> = dx
        .par_chunks_mut(ROW_CHUNK * c)
        .zip(dout.par_chunks(ROW_CHUNK * c).zip(x.par_chunks(ROW_CHUNK * c)))
        .enumerate()
        .map(|(blk, (dxb, (db_, xb)))| {
            let mut pw = vec![0f32; c];
            let mut pb = vec![0f32; c];
            for (r, ((dx, d), x)) in dxb.chunks_mut(c).zip(db_.chunks(c)).zip(xb.chunks(c)).enumerate() {
                let row = blk * ROW_CHUNK + r;
                let (mu, rs) = (mean[row], rstd[row]);
                // the row sums over 8 lanes (vectorised), the lanes then the tail in order
                let (mut sum_g, mut sum_gx) = ([0f32; 9], [0f32; 9]);
                let mut each = |j: usize, lane: usize| {
                    let xhat = (x[j] - mu) * rs;
                    let g = d[j] * w[j];
                    sum_g[lane] += g;
                    sum_gx[lane] += g * xhat;
                    pw[j] += d[j] * xhat;
                    pb[j] += d[j];
                };
                for j0 in (0..c / 8 * 8).step_by(8) {
                    for k in 0..8 {
                        each(j0 + k, k);
                    }
                }
                for j in c / 8 * 8..c {
                    each(j, 8);
                }
                let mg = sum_g.iter().sum::<f32>() / c as f32;
                let mgx = sum_gx.iter().sum::<f32>() / c as f32;
                for j in 0..c {
                    let xhat = (x[j] - mu) * rs;
                    dx[j] += rs * (d[j] * w[j] - mg - xhat * mgx);
                }
            }
            (pw, pb)
        })
        .collect();
    for (pw, pb) in partials {
        for j in 0..c {
            dw[j] += pw[j];
            db[j] += pb[j];
        }
    }
}
