//! A matrix product whose every output row is computed the same way whatever the other rows
//! are: element (i, j) is `fma` over k = 0, 1, …, K−1 in that order, from 0, in every tile
//! shape and thread split. A request's tokens then come out bit-identical alone or inside any
//! batch (batch invariance), which general gemm kernels do not promise (their blocking and
//! split of the inner dimension depend on the matrix sizes).
//!
//! Layout: `c[m, n] = a[m, k] · w[k, n]`, all row-major. Columns are cut into strips of 16;
//! each strip of `w` (k × 16 floats) is read from memory once and reused from cache by every
//! group of 4 rows, whose 4 × 16 sums stay in registers over k.

use super::SendPtr;
use rayon::prelude::*;

const COLS: usize = 16;
const ROWS: usize = 4;

/// `c = a · w` (overwritten).
pub fn matmul_rows(c: &mut [f32], a: &[f32], w: &[f32], m: usize, k: usize, n: usize) {
    assert!(a.len() == m * k && w.len() == k * n && c.len() == m * n);
    let strips = n.div_ceil(COLS);
    // each task computes whole column strips for every row: results do not depend on the split
    let cp = SendPtr(c.as_mut_ptr());
    (0..strips).into_par_iter().with_min_len(4).for_each(|s| {
        let j0 = s * COLS;
        let width = COLS.min(n - j0);
        let mut i = 0;
        while i < m {
            let rows = ROWS.min(m - i);
            let mut acc = [[0f32; COLS]; ROWS];
            if width == COLS && rows == ROWS {
                for kk in 0..k {
                    let wv: &[f32; COLS] = w[kk * n + j0..kk * n + j0 + COLS].try_into().unwrap();
                    for (r, accr) in acc.iter_mut().enumerate() {
                        let av = a[(i + r) * k + kk];
                        for t in 0..COLS {
                            accr[t] = av.mul_add(wv[t], accr[t]);
                        }
                    }
                }
            } else {
                for kk in 0..k {
                    let wrow = &w[kk * n + j0..kk * n + j0 + width];
                    for (r, accr) in acc.iter_mut().enumerate().take(rows) {
                        let av = a[(i + r) * k + kk];
                        for (t, &wt) in wrow.iter().enumerate() {
                            accr[t] = av.mul_add(wt, accr[t]);
                        }
                    }
                }
            }
            for (r, accr) in acc.iter().enumerate().take(rows) {
                // SAFETY: strip s writes columns j0..j0+width of each row; strips are disjoint
                // and `c` outlives the parallel loop.
                let dst = unsafe { std::slice::from_raw_parts_mut(cp.at((i + r) * n + j0), width) };
                dst.copy_from_slice(&accr[..width]);
            }
            i += rows;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn every_row_is_bitwise_the_same_alone_or_in_any_batch() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        for &(k, n) in &[(7, 5), (64, 48), (33, 100)] {
            let w: Vec<f32> = (0..k * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let a: Vec<f32> = (0..40 * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let alone: Vec<Vec<f32>> = (0..40)
                .map(|i| {
                    let mut c = vec![0f32; n];
                    matmul_rows(&mut c, &a[i * k..(i + 1) * k], &w, 1, k, n);
                    c
                })
                .collect();
            for m in [2, 3, 4, 5, 17, 40] {
                let mut c = vec![0f32; m * n];
                matmul_rows(&mut c, &a[..m * k], &w, m, k, n);
                for i in 0..m {
                    assert_eq!(c[i * n..(i + 1) * n], alone[i][..], "k {k} n {n}: row {i} of {m} differs from alone");
                }
            }
            // and the numbers are the product (f64 reference)
            for i in 0..40 {
                for j in 0..n {
                    let want: f64 = (0..k).map(|kk| a[i * k + kk] as f64 * w[kk * n + j] as f64).sum();
                    assert!((alone[i][j] as f64 - want).abs() < 1e-4, "({i}, {j})");
                }
            }
        }
    }
}
