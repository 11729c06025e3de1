//! Rotary position embeddings (Su et al. 2021) in the Llama family's form: each head's
//! dimensions `i` and `i + hd/2` are a pair rotated by `pos · inv_freq[i]` (Hugging Face's
//! `rotate_half`), optionally with Llama 3's frequency scaling. The backward is the inverse
//! rotation, applied to the gradient.

use rayon::prelude::*;

/// The rotation frequencies of one head of width `hd`: `θ^(−2i/hd)`, and, with Llama 3's
/// scaling, long wavelengths divided by `factor`, short ones kept and those between
/// interpolated (as `transformers`' `_compute_llama3_parameters`).
pub fn inv_freq(hd: usize, theta: f64, llama3: Option<(f64, f64, f64, usize)>) -> Vec<f32> {
    (0..hd / 2)
        .map(|i| {
            // Hugging Face computes the frequencies in f32
            let f = (1.0 / theta.powf((2 * i) as f64 / hd as f64)) as f32 as f64;
            let Some((factor, low, high, orig)) = llama3 else { return f as f32 };
            let orig = orig as f64;
            let (low_wavelen, high_wavelen) = (orig / low, orig / high);
            let wavelen = 2.0 * std::f64::consts::PI / f;
            let scaled = if wavelen > low_wavelen {
                f / factor
            } else if wavelen < high_wavelen {
                f
            } else {
                let smooth = (orig / wavelen - low) / (high - low);
                (1.0 - smooth) * f / factor + smooth * f
            };
            scaled as f32
        })
        .collect()
}

/// `cos` and `sin` of every position's angles, `[positions, hd/2]` each.
#[derive(Clone, Debug, Default)]
pub struct RopeTable {
    pub half: usize,
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
}

impl RopeTable {
    /// The angles of positions `0..n` (each `pos · inv_freq` rounded to f32 first, as Hugging
    /// Face's f32 product is).
    pub fn new(inv_freq: &[f32], n: usize) -> RopeTable {
        let half = inv_freq.len();
        let (mut cos, mut sin) = (Vec::with_capacity(n * half), Vec::with_capacity(n * half));
        for p in 0..n {
            for &f in inv_freq {
                let a = ((p as f32) * f) as f64;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        RopeTable { half, cos, sin }
    }

    pub fn positions(&self) -> usize {
        self.cos.len() / self.half.max(1)
    }
}

/// Rotates, in place, every head of every row of `x` (`[rows, heads·hd]`, row stride
/// `heads·hd`) by its position `pos(row)` — or by minus it (`inverse`: the backward).
pub fn rope_rows(x: &mut [f32], heads: usize, tab: &RopeTable, pos: impl Fn(usize) -> usize + Sync, inverse: bool) {
    let w = heads * 2 * tab.half;
    assert!(x.len().is_multiple_of(w));
    let sign = if inverse { -1.0 } else { 1.0 };
    x.par_chunks_mut(w).enumerate().with_min_len(16).for_each(|(r, row)| rope_heads(row, tab, pos(r), sign));
}

/// Rotates every head of `heads` (a whole number of heads of width `2·tab.half`, side by
/// side) by position `p`, or by minus it with `sign` −1: the one rotation training and serving
/// share.
pub fn rope_heads(heads: &mut [f32], tab: &RopeTable, p: usize, sign: f32) {
    let half = tab.half;
    let (cos, sin) = (&tab.cos[p * half..][..half], &tab.sin[p * half..][..half]);
    for head in heads.chunks_exact_mut(2 * half) {
        let (a, b) = head.split_at_mut(half);
        for i in 0..half {
            let (c, s) = (cos[i], sign * sin[i]);
            let (x1, x2) = (a[i], b[i]);
            a[i] = x1 * c - x2 * s;
            b[i] = x2 * c + x1 * s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_inverse_undoes_the_rotation_and_norms_are_kept() {
        let tab = RopeTable::new(&inv_freq(8, 10_000.0, None), 5);
        let x: Vec<f32> = (0..5 * 16).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut y = x.clone();
        rope_rows(&mut y, 2, &tab, |r| r, false);
        // position 0 is the identity; others rotate
        assert_eq!(&y[..16], &x[..16]);
        assert!(y[16..].iter().zip(&x[16..]).any(|(a, b)| (a - b).abs() > 1e-3));
        let n = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>();
        assert!((n(&y) - n(&x)).abs() < 1e-4);
        rope_rows(&mut y, 2, &tab, |r| r, true);
        for (a, b) in y.iter().zip(&x) {
            assert!((a - b).abs() < 1e-6);
        }
    }

    /// Values of `transformers`' `_compute_llama3_parameters` for head_dim 8, θ 500000,
    /// factor 8, low 1, high 4, original 64 (computed by the formula written out here).
    #[test]
    fn llama3_scaling_keeps_short_and_divides_long_wavelengths() {
        let plain = inv_freq(8, 500_000.0, None);
        let scaled = inv_freq(8, 500_000.0, Some((8.0, 1.0, 4.0, 64)));
        for (i, (&p, &s)) in plain.iter().zip(&scaled).enumerate() {
            let wavelen = 2.0 * std::f64::consts::PI / p as f64;
            if wavelen < 16.0 {
                assert_eq!(p, s, "{i}: short wavelengths kept");
            } else if wavelen > 64.0 {
                assert!((s as f64 - p as f64 / 8.0).abs() < 1e-9, "{i}: long wavelengths divided");
            } else {
                assert!(s < p && s > p / 8.0, "{i}: interpolated");
            }
        }
    }

    /// A table knows the positions it holds (the attention rebuilds it only when a longer
    /// sequence comes), and its rows are the angles of those positions.
    #[test]
    fn a_table_holds_its_positions() {
        let inv = inv_freq(8, 10_000.0, None);
        let tab = RopeTable::new(&inv, 7);
        assert_eq!((tab.positions(), tab.half), (7, 4));
        assert_eq!(tab.cos.len(), 28);
        assert_eq!(tab.cos[3 * 4 + 1], ((3.0f32 * inv[1]) as f64).cos() as f32);
        assert_eq!(RopeTable::default().positions(), 0);
    }
}
