//! GELU (tanh approximation, as GPT-2) and the residual add.

use rayon::prelude::*;

const CHUNK: usize = 1 << 14;
const GELU_K: f32 = 0.797_884_6; // sqrt(2/pi)
const GELU_C: f32 = 0.044_715;

/// GELU's tanh approximation of one value (GPT-2's `gelu_new`).
#[inline(always)]
pub fn gelu_tanh(x: f32) -> f32 {
    let u = GELU_K * (x + GELU_C * x * x * x);
    0.5 * x * (1.0 + super::math::tanh(u))
}

pub fn gelu_forward(out: &mut [f32], x: &[f32]) {
    assert_eq!(out.len(), x.len());
    out.par_chunks_mut(CHUNK).zip(x.par_chunks(CHUNK)).for_each(|(o, x)| {
        for (o, &x) in o.iter_mut().zip(x) {
            *o = gelu_tanh(x);
        }
    });
}

/// In place: `d` holds `dout` on entry and `dx = dout · gelu'(x)` on return.
pub fn gelu_backward(d: &mut [f32], x: &[f32]) {
    assert!(d.len() == x.len());
    d.par_chunks_mut(CHUNK).zip(x.par_chunks(CHUNK)).for_each(|(d, x)| {
        for (d, &x) in d.iter_mut().zip(x) {
            let x2 = x * x;
            let u = GELU_K * (x + GELU_C * x2 * x);
            let t = super::math::tanh(u);
            let du = GELU_K * (1.0 + 3.0 * GELU_C * x2);
            *d *= 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du;
        }
    });
}

/// `out = a + b`. Its backward is the identity into both inputs, so the model passes the
/// residual gradient through unchanged and has no `residual_backward` to call.
pub fn residual_forward(out: &mut [f32], a: &[f32], b: &[f32]) {
    assert!(out.len() == a.len() && a.len() == b.len());
    out.par_chunks_mut(CHUNK).zip(a.par_chunks(CHUNK).zip(b.par_chunks(CHUNK))).for_each(|(o, (a, b))| {
        for ((o, &a), &b) in o.iter_mut().zip(a).zip(b) {
            *o = a + b;
        }
    });
}

/// `out[i,:] = a[i,:] + (b[i,:] + bias)`: a residual add of a layer's output whose bias is
/// added only now (after a row-parallel layer's partial outputs were summed).
pub fn residual_bias_forward(out: &mut [f32], a: &[f32], b: &[f32], bias: &[f32]) {
    if bias.is_empty() {
        assert!(out.len() == a.len() && a.len() == b.len());
        out.par_chunks_mut(CHUNK).zip(a.par_chunks(CHUNK).zip(b.par_chunks(CHUNK))).for_each(|(o, (a, b))| {
            for ((o, &a), &b) in o.iter_mut().zip(a).zip(b) {
                *o = a + b;
            }
        });
        return;
    }
    let c = bias.len();
    assert!(out.len() == a.len() && a.len() == b.len() && out.len().is_multiple_of(c));
    out.par_chunks_mut(c).zip(a.par_chunks(c).zip(b.par_chunks(c))).with_min_len(super::ROW_CHUNK).for_each(
        |(o, (a, b))| {
            for (((o, &a), &b), &bi) in o.iter_mut().zip(a).zip(b).zip(bias) {
                *o = a + (b + bi);
            }
        },
    );
}

/// `acc[j] += Σ_i rows[i, j]` (a bias gradient), the rows added in order for each column, so
/// the result does not depend on the thread count; threads take blocks of columns.
pub fn add_column_sums(acc: &mut [f32], rows: &[f32]) {
    let w = acc.len();
    assert!(w > 0 && rows.len().is_multiple_of(w));
    const COLS: usize = 64;
    acc.par_chunks_mut(COLS).enumerate().for_each(|(blk, a)| {
        for row in rows.chunks_exact(w) {
            for (x, &d) in a.iter_mut().zip(&row[blk * COLS..]) {
                *x += d;
            }
        }
    });
}

/// σ(x) through the vectorising `exp` (libm's `expf` keeps the loop scalar).
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + super::math::exp(-x))
}

/// SiLU, `x·σ(x)`.
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// SwiGLU's gate: `out = silu(gate) ⊙ up`.
pub fn swiglu_forward(out: &mut [f32], gate: &[f32], up: &[f32]) {
    assert!(out.len() == gate.len() && up.len() == gate.len());
    out.par_chunks_mut(CHUNK).zip(gate.par_chunks(CHUNK).zip(up.par_chunks(CHUNK))).for_each(|(o, (g, u))| {
        for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
            *o = silu(g) * u;
        }
    });
}

/// From `d = dout` (overwritten with `dgate`), writes `dup = dout ⊙ silu(gate)`; with
/// `σ = σ(gate)`, `dgate = dout ⊙ up ⊙ σ·(1 + gate·(1 − σ))`.
pub fn swiglu_backward(d: &mut [f32], dup: &mut [f32], gate: &[f32], up: &[f32]) {
    assert!(d.len() == gate.len() && dup.len() == gate.len() && up.len() == gate.len());
    d.par_chunks_mut(CHUNK)
        .zip(dup.par_chunks_mut(CHUNK))
        .zip(gate.par_chunks(CHUNK).zip(up.par_chunks(CHUNK)))
        .for_each(|((d, du), (g, u))| {
            for (((d, du), &g), &u) in d.iter_mut().zip(du).zip(g).zip(u) {
                let s = sigmoid(g);
                *du = *d * g * s;
                *d *= u * s * (1.0 + g * (1.0 - s));
            }
        });
}

/// `acc += x`.
pub fn add_into(acc: &mut [f32], x: &[f32]) {
    assert_eq!(acc.len(), x.len());
    acc.par_chunks_mut(CHUNK).zip(x.par_chunks(CHUNK)).for_each(|(a, x)| {
        for (a, &x) in a.iter_mut().zip(x) {
            *a += x;
        }
    });
}

/// `x = 0` on the pool's threads: a gradient buffer of a few hundred MB cleared by one thread
/// runs at one core's store bandwidth (SmolLM2-135M's 538 MB: 59 ms on one thread of a 2-core
/// Xeon, 31 ms on two).
pub fn zero(x: &mut [f32]) {
    x.par_chunks_mut(CHUNK).for_each(|c| c.fill(0.0));
}

#[cfg(test)]
mod tests {
    #[test]
    fn zero_clears_every_element_on_any_pool() {
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("a pool");
            for len in [0, 1, super::CHUNK - 1, 3 * super::CHUNK + 5] {
                let mut x = vec![1.5f32; len];
                pool.install(|| super::zero(&mut x));
                assert!(x.iter().all(|&v| v.to_bits() == 0), "{len} values on {threads} threads");
            }
        }
    }
}
