//! Scalar math written so that LLVM vectorises loops calling it (libm's `expf` does not).

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;

/// 1.5·2²³: adding it to a float of magnitude below 2²² rounds that float to the nearest
/// integer (ties to even), which then sits in the low bits of the sum's mantissa.
const ROUNDER: f32 = 12_582_912.0;

/// `e^x` to about 2 ulp (Cephes `expf` polynomial), branch-free so it vectorises. The power of
/// two is built from the rounded exponent's bits with integer operations: a float-to-int `as`
/// cast would saturate and map NaN to 0 lane by lane, which LLVM does not vectorise.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.0);
    // n = round_ties_even(x·log2 e), |n| ≤ 127, as a float and as an integer
    let shifted = x * LOG2E + ROUNDER;
    let n = shifted - ROUNDER;
    let ni = (shifted.to_bits() as i32).wrapping_sub(ROUNDER.to_bits() as i32);
    let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    let z = r * r;
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 5.0e-1);
    let y = p.mul_add(z, r) + 1.0;
    let scale = f32::from_bits((ni.wrapping_add(127) as u32) << 23);
    y * scale
}

/// Softmax of a row in place. Max and sum run over 8 lanes, so LLVM vectorises them (a plain
/// float reduction stays scalar: its order may not change without fast-math), and the
/// exponentials in a loop of their own.
pub fn softmax_row(row: &mut [f32]) {
    softmax_max_sum(row);
}

/// `softmax_row`, returning the row's log-sum-exp `max + ln Σ exp(x − max)` (of a non-empty
/// row of finite values).
pub fn softmax_row_lse(row: &mut [f32]) -> f32 {
    let (mx, sum) = softmax_max_sum(row);
    mx + sum.ln()
}

/// The softmax in place; returns the row's max and `Σ exp(x − max)`.
#[inline(always)]
fn softmax_max_sum(row: &mut [f32]) -> (f32, f32) {
    let mx = max_in_lanes(row);
    for x in row.iter_mut() {
        *x = exp(*x - mx);
    }
    let mut s = [0f32; 8];
    let mut chunks = row.chunks_exact(8);
    for c in &mut chunks {
        for t in 0..8 {
            s[t] += c[t];
        }
    }
    let sum = s.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>();
    let inv = 1.0 / sum;
    row.iter_mut().for_each(|x| *x *= inv);
    (mx, sum)
}

/// The largest of `x` (−∞ when empty; NaNs passed over as `f32::max` does), taken lane by
/// lane over 8 lanes and then over the lanes, so LLVM vectorises it: the value a fold in order
/// gives, since a maximum does not round (a zero's sign aside, which no `exp(x − max)` sees).
pub fn max_in_lanes(x: &[f32]) -> f32 {
    let (c, rest) = x.as_chunks::<8>();
    let mut lanes = [f32::NEG_INFINITY; 8];
    for v in c {
        for t in 0..8 {
            lanes[t] = lanes[t].max(v[t]);
        }
    }
    lanes.iter().chain(rest).fold(f32::NEG_INFINITY, |a, &b| a.max(b))
}

/// The index a scan in order that keeps the first strictly larger value gives (greedy
/// decoding's pick): the first position of the largest value, NaNs passed over — but 0 when
/// `x` is empty or starts with a NaN, which no later value compares above. In two vectorised
/// passes (the maximum lane by lane, then whole chunks tested for it side by side) where the
/// scan's every step waits on the last: a 50257-token row in ~10 µs instead of ~47.
pub fn argmax(x: &[f32]) -> usize {
    if x.first().is_none_or(|v| v.is_nan()) {
        return 0;
    }
    // not NaN: x[0] is a number. Every value equal to it (±0 alike) stands where the scan
    // would keep the first of them
    let mx = max_in_lanes(x);
    let (chunks, _) = x.as_chunks::<16>();
    let from = chunks
        .iter()
        .position(|c| c.iter().fold(false, |hit, &v| hit | (v == mx)))
        .map_or(chunks.len() * 16, |c| c * 16);
    from + x[from..].iter().position(|&v| v == mx).expect("the maximum is one of the values")
}

/// `Σ a[i]·b[i]` over 8 lanes (vectorised, the same rounding on every call).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let mut s = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for t in 0..8 {
            s[t] = x[t].mul_add(y[t], s[t]);
        }
    }
    s.iter().sum::<f32>() + tail
}

/// `Σ f(x[i])` in f64 over 8 lanes (LLVM keeps an in-order float sum scalar), the lanes then
/// the tail added in a fixed order: the same rounding on every call.
#[inline(always)]
pub fn sum8_f64(x: &[f32], f: impl Fn(f32) -> f64) -> f64 {
    let mut s = [0f64; 8];
    let chunks = x.chunks_exact(8);
    let tail: f64 = chunks.remainder().iter().map(|&v| f(v)).sum();
    for ch in chunks {
        for k in 0..8 {
            s[k] += f(ch[k]);
        }
    }
    s.iter().sum::<f64>() + tail
}

/// `tanh(x)` via `exp`, accurate to a few ulp of 1 (enough for GELU, whose output is
/// dominated by the `0.5·x` term where tanh is small).
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    1.0 - 2.0 / (exp(2.0 * x) + 1.0)
}

/// `erf(x)` as a rational function of x (the float approximation Eigen and XLA use), accurate
/// to 3.3e-7 absolute (measured against libm) and branch-free so it vectorises; beyond |x| = 4, erf is ±1 in f32.
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = x2.mul_add(-2.726_142_3e-10, 2.770_681_4e-8);
    p = x2.mul_add(p, -2.101_024e-6);
    p = x2.mul_add(p, -5.692_506_4e-5);
    p = x2.mul_add(p, -7.349_906_3e-4);
    p = x2.mul_add(p, -2.954_6e-3);
    p = x2.mul_add(p, -1.609_603_3e-2);
    let mut q = x2.mul_add(-1.456_607_2e-5, -2.133_740_6e-4);
    q = x2.mul_add(q, -1.682_827e-3);
    q = x2.mul_add(q, -7.373_329e-3);
    q = x2.mul_add(q, -1.426_473_9e-2);
    x * p / q
}

/// Squared L2 norm of a gradient (or of one shard of it), accumulated in f64 over chunks of
/// 2^14 in a fixed order (the same sum for any thread count).
pub fn grad_sq_norm(grads: &[f32]) -> f64 {
    use rayon::prelude::*;
    let parts: Vec<f64> = grads.par_chunks(1 << 14).map(|c| sum8_f64(c, |g| g as f64 * g as f64)).collect();
    parts.iter().sum::<f64>()
}

#[cfg(test)]
mod tests {

    /// The lanes' maximum against a fold in order (equal; a zero's sign may differ): every length to 40, with
    /// NaNs, −∞, and both zeros among the values.
    #[test]
    fn max_in_lanes_is_the_fold_in_order() {
        for n in 0..=40usize {
            for seed in 0..4usize {
                let x: Vec<f32> = (0..n)
                    .map(|i| match (i * 7 + seed * 13) % 11 {
                        0 => f32::NAN,
                        1 => f32::NEG_INFINITY,
                        2 => -0.0,
                        3 => 0.0,
                        r => (r as f32 - 6.0) * (1.0 + (i * seed) as f32 / 17.0),
                    })
                    .collect();
                let want = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                let got = super::max_in_lanes(&x);
                assert!(got == want || (got.is_nan() && want.is_nan()), "n {n} seed {seed}: {got} vs {want}");
            }
        }
    }
    /// `argmax` against the scan in order it replaces: every length to 70 and a vocabulary's,
    /// with ties, NaNs (first and later), infinities of both signs, both zeros, and rows with
    /// one value only.
    #[test]
    fn argmax_is_the_first_strictly_larger_scan() {
        let scan = |x: &[f32]| {
            let mut best = 0;
            for (i, &v) in x.iter().enumerate() {
                if v > x[best] {
                    best = i;
                }
            }
            best
        };
        let mut checked = 0;
        for n in (0..=70usize).chain([50257]) {
            for seed in 0..12usize {
                let x: Vec<f32> = (0..n)
                    .map(|i| match (i * 7 + seed * 13 + i * i * seed) % 23 {
                        0 if seed % 3 == 0 => f32::NAN,
                        1 => f32::NEG_INFINITY,
                        2 if seed % 4 == 1 => f32::INFINITY,
                        3 => -0.0,
                        4 => 0.0,
                        r => ((r % 5) as f32 - 6.0) * if seed % 2 == 0 { 1.0 } else { -1.0 },
                    })
                    .collect();
                assert_eq!(super::argmax(&x), scan(&x), "n {n} seed {seed}: {x:?}");
                checked += 1;
            }
        }
        let cases: [&[f32]; 7] = [
            &[f32::NAN, 1.0, 2.0],
            &[-0.0, 0.0],
            &[0.0, -0.0, 0.0],
            &[-1.0, -0.0, 0.0],
            &[f32::NEG_INFINITY; 20],
            &[1.0, f32::NAN, 3.0, 3.0],
            &[-5.0],
        ];
        for x in cases {
            assert_eq!(super::argmax(x), scan(x), "{x:?}");
        }
        // the maximum in every position of a long row (chunk boundaries, the tail)
        for at in [0, 1, 15, 16, 17, 31, 32, 50240, 50255, 50256] {
            let mut x = vec![-1.0f32; 50257];
            x[at] = 2.0;
            x[50256.min(at + 3)] = 2.0;
            assert_eq!(super::argmax(&x), at);
        }
        assert_eq!(checked, 71 * 12 + 12);
    }

    #[test]
    fn exp_matches_std() {
        let mut worst = 0f64;
        let mut x = -80.0f32;
        while x < 80.0 {
            let want = (x as f64).exp();
            let got = super::exp(x) as f64;
            worst = worst.max(((got - want) / want).abs());
            x += 0.0137;
        }
        assert!(worst < 3e-7, "exp relative error {worst}");
    }

    #[test]
    fn exp_rounds_its_exponent_as_round_ties_even() {
        // the integer trick must pick the same power of two as rounding x·log2 e
        let mut x = -90.0f32;
        while x < 90.0 {
            let c = x.clamp(-87.0, 88.0);
            let n = (c * super::LOG2E).round_ties_even();
            let shifted = c * super::LOG2E + super::ROUNDER;
            assert_eq!(shifted - super::ROUNDER, n, "x = {x}");
            assert_eq!((shifted.to_bits() as i32).wrapping_sub(super::ROUNDER.to_bits() as i32), n as i32, "x = {x}");
            x += 0.000_37;
        }
    }

    #[test]
    fn tanh_matches_std() {
        let mut x = -12.0f32;
        while x < 12.0 {
            let d = (super::tanh(x) as f64 - (x as f64).tanh()).abs();
            assert!(d < 2e-7, "tanh({x}) off by {d}");
            x += 0.0071;
        }
    }

    #[test]
    fn erf_matches_libm() {
        let mut worst = 0f64;
        let mut x = -6.0f32;
        while x < 6.0 {
            let d = (super::erf(x) as f64 - libm::erf(x as f64)).abs();
            worst = worst.max(d);
            x += 0.00093;
        }
        eprintln!("erf worst {worst:e}");
        assert!(worst < 4e-7, "erf absolute error {worst}");
    }
}
