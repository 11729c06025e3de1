//! RMSNorm over the last dimension (Zhang & Sennrich 2019), as the Llama family normalises:
//! `out = x / sqrt(mean(x²) + eps) · w`, no mean subtracted, no shift.

use super::math::sum8_f64;
use super::ROW_CHUNK;
use rayon::prelude::*;

/// `1/sqrt(mean(x²) + eps)` of a row, summed in f64.
#[inline]
pub fn row_rstd(x: &[f32], eps: f32) -> f32 {
    let ms = sum8_f64(x, |v| (v as f64) * (v as f64)) / x.len() as f64;
    (1.0 / (ms + eps as f64).sqrt()) as f32
}

/// `out = x · rstd · w` per row; saves `rstd` for backward.
pub fn rmsnorm_forward(out: &mut [f32], rstd: &mut [f32], x: &[f32], w: &[f32], c: usize, eps: f32) {
    let n = x.len() / c;
    assert!(out.len() == x.len() && rstd.len() == n && w.len() == c);
    out.par_chunks_mut(c)
        .zip(x.par_chunks(c))
        .zip(rstd.par_iter_mut())
        .with_min_len(ROW_CHUNK)
        .for_each(|((o, x), r)| *r = rmsnorm_row(o, x, w, eps));
}

/// One row: `out = w · (x · rstd)`; returns `rstd`.
#[inline]
pub fn rmsnorm_row(out: &mut [f32], x: &[f32], w: &[f32], eps: f32) -> f32 {
    let rs = row_rstd(x, eps);
    for ((o, &x), &w) in out.iter_mut().zip(x).zip(w) {
        // Hugging Face's order: normalise (in f32), then scale
        *o = w * (x * rs);
    }
    rs
}

/// Accumulates into `dx` (the residual stream's gradient) and `dw`. With `x̂ = x·r`:
/// `dw += Σ_rows dout ⊙ x̂`, `dx += r · (dout⊙w − x̂ · mean(dout⊙w⊙x̂))`.
pub fn rmsnorm_backward(dx: &mut [f32], dw: &mut [f32], dout: &[f32], x: &[f32], rstd: &[f32], w: &[f32], c: usize) {
    let n = x.len() / c;
    assert!(dx.len() == x.len() && dout.len() == x.len() && rstd.len() == n && dw.len() == c && w.len() == c);
    // fixed blocks of rows, each with its own partial dw, summed in block order: the result
    // does not depend on the thread count
    let partials: Vec<Vec<f32>> = dx
        .par_chunks_mut(ROW_CHUNK * c)
        .zip(dout.par_chunks(ROW_CHUNK * c).zip(x.par_chunks(ROW_CHUNK * c)))
        .enumerate()
        .map(|(blk, (dxb, (db, xb)))| {
            let mut pw = vec![0f32; c];
            for (r, ((dx, d), x)) in dxb.chunks_mut(c).zip(db.chunks(c)).zip(xb.chunks(c)).enumerate() {
                let rs = rstd[blk * ROW_CHUNK + r];
                let dot: f64 = d.iter().zip(x).zip(w).map(|((&d, &x), &w)| (d * w) as f64 * (x * rs) as f64).sum();
                let mean = (dot / c as f64) as f32;
                for ((((dx, &d), &x), &w), pw) in dx.iter_mut().zip(d).zip(x).zip(w).zip(pw.iter_mut()) {
                    let xh = x * rs;
                    *pw += d * xh;
                    *dx += rs * (d * w - xh * mean);
                }
            }
            pw
        })
        .collect();
    for p in partials {
        for (dw, p) in dw.iter_mut().zip(p) {
            *dw += p;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The backward against central differences of `Σ dout ⊙ forward(x)`, in f64.
    #[test]
    fn backward_matches_finite_differences() {
        let (n, c, eps) = (3, 7, 1e-5f32);
        let x: Vec<f32> = (0..n * c).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.3).collect();
        let w: Vec<f32> = (0..c).map(|i| 0.5 + i as f32 * 0.1).collect();
        let dout: Vec<f32> = (0..n * c).map(|i| ((i * 13 % 7) as f32 - 3.0) * 0.2).collect();
        let f = |x: &[f32], w: &[f32]| -> f64 {
            let mut out = vec![0f32; n * c];
            let mut r = vec![0f32; n];
            rmsnorm_forward(&mut out, &mut r, x, w, c, eps);
            out.iter().zip(&dout).map(|(&o, &d)| o as f64 * d as f64).sum()
        };
        let mut out = vec![0f32; n * c];
        let mut r = vec![0f32; n];
        rmsnorm_forward(&mut out, &mut r, &x, &w, c, eps);
        let (mut dx, mut dw) = (vec![0f32; n * c], vec![0f32; c]);
        rmsnorm_backward(&mut dx, &mut dw, &dout, &x, &r, &w, c);
        let h = 1e-2f32;
        for i in 0..n * c {
            let (mut a, mut b) = (x.clone(), x.clone());
            a[i] += h;
            b[i] -= h;
            let fd = (f(&a, &w) - f(&b, &w)) / (2.0 * h as f64);
            assert!((fd - dx[i] as f64).abs() < 2e-3 * (1.0 + fd.abs()), "dx[{i}]: {} vs {fd}", dx[i]);
        }
        for i in 0..c {
            let (mut a, mut b) = (w.clone(), w.clone());
            a[i] += h;
            b[i] -= h;
            let fd = (f(&x, &a) - f(&x, &b)) / (2.0 * h as f64);
            assert!((fd - dw[i] as f64).abs() < 2e-3 * (1.0 + fd.abs()), "dw[{i}]: {} vs {fd}", dw[i]);
        }
    }
}
