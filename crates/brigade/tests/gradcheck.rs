//! Every kernel's and layer's backward against central finite differences.
//!
//! The scalar probed is `L = Σ yᵢ·rᵢ` (r fixed random), summed in f64 so that the only f32
//! rounding is in the kernels. The check compares the vector of sampled partial derivatives:
//! ‖fd − analytic‖ / ‖fd‖ must be below a tolerance set near the measured error (see below).

use brigade::models::{Activations, Gpt, GptConfig};
use brigade::nn::tp::Tp;
use brigade::tensor::attention::{attention_backward, attention_forward, AttnShape};
use brigade::tensor::elementwise::{gelu_backward, gelu_forward};
use brigade::tensor::embedding::{
    position_backward, position_forward, token_embedding_backward, token_embedding_forward,
};
use brigade::tensor::layernorm::{layernorm_backward, layernorm_forward};
use brigade::tensor::loss::{cross_entropy_backward, cross_entropy_forward, VocabWindow, IGNORE};
use brigade::tensor::matmul::{matmul, matmul_reference};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Tolerances a few times above the errors measured with central differences in f32 kernels
/// (kernels: at most 1.0e-4, attention over 150 positions; the whole model: at most 7.4e-4, the
/// position embedding). A wrong backward is off by O(1); a subtly wrong one (a missing term of
/// one row, a scale slightly off) by far more than these.
const KERNEL_TOL: f64 = 5e-4;
const MODEL_TOL: f64 = 3e-3;

fn randn(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| (rng.gen::<f32>() * 2.0 - 1.0) * scale).collect()
}

fn dot(y: &[f32], r: &[f32]) -> f64 {
    y.iter().zip(r).map(|(&a, &b)| a as f64 * b as f64).sum()
}

/// Central differences of `f` at up to `samples` coordinates of `x`, compared to `analytic`.
fn check(name: &str, x: &[f32], analytic: &[f32], eps: f32, samples: usize, tol: f64, f: impl Fn(&[f32]) -> f64) {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let idx: Vec<usize> = if x.len() <= samples {
        (0..x.len()).collect()
    } else {
        (0..samples).map(|_| rng.gen_range(0..x.len())).collect()
    };
    let (mut num, mut den) = (0f64, 0f64);
    let mut xp = x.to_vec();
    for &i in &idx {
        let orig = xp[i];
        xp[i] = orig + eps;
        let lp = f(&xp);
        xp[i] = orig - eps;
        let lm = f(&xp);
        xp[i] = orig;
        let fd = (lp - lm) / (2.0 * eps as f64);
        num += (fd - analytic[i] as f64).powi(2);
        den += fd.powi(2);
    }
    let rel = (num / den.max(1e-30)).sqrt();
    assert!(den > 0.0, "{name}: all sampled derivatives are zero, the check proves nothing");
    println!("{name}: relative gradient error {rel:.3e} over {} coordinates", idx.len());
    assert!(rel < tol, "{name}: relative gradient error {rel:.3e} (tolerance {tol:.0e})");
}

#[test]
fn matmul_matches_naive_reference() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    // down to single elements, past 256 rows with ragged sizes, and across the blocks of
    // brigade's kernel (more than 144 rows, 256 deep, 4080 wide)
    for &(m, k, n) in &[
        (1, 1, 1),
        (3, 5, 7),
        (17, 33, 9),
        (64, 80, 96),
        (130, 70, 65),
        (256, 16, 16),
        (263, 77, 101),
        (300, 129, 40),
        (151, 530, 37),
        (7, 21, 4100),
    ] {
        for ta in [false, true] {
            for tb in [false, true] {
                let a = randn(&mut rng, m * k, 1.0);
                let b = randn(&mut rng, k * n, 1.0);
                let want = matmul_reference(&a, &b, m, k, n, ta, tb);
                let mut got = vec![0.5f32; m * n];
                matmul(&mut got, &a, &b, m, k, n, ta, tb, false);
                let mut acc = vec![0.5f32; m * n];
                matmul(&mut acc, &a, &b, m, k, n, ta, tb, true);
                for i in 0..m * n {
                    let tol = 1e-5 * (k as f32).sqrt() * 4.0;
                    assert!((got[i] - want[i]).abs() < tol, "({m},{k},{n},{ta},{tb}) [{i}]");
                    assert!((acc[i] - 0.5 - want[i]).abs() < tol, "accumulate ({m},{k},{n})");
                }
            }
        }
    }
}

#[test]
fn layernorm_backward_matches_finite_differences() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let (n, c) = (37, 24);
    let x = randn(&mut rng, n * c, 2.0);
    let w = randn(&mut rng, c, 1.0);
    let b = randn(&mut rng, c, 1.0);
    let r = randn(&mut rng, n * c, 1.0);
    let fwd = |x: &[f32], w: &[f32], b: &[f32]| {
        let (mut o, mut m, mut s) = (vec![0f32; n * c], vec![0f32; n], vec![0f32; n]);
        layernorm_forward(&mut o, &mut m, &mut s, x, w, b, c);
        (o, m, s)
    };
    let (_, m, s) = fwd(&x, &w, &b);
    let (mut dx, mut dw, mut db) = (vec![0f32; n * c], vec![0f32; c], vec![0f32; c]);
    layernorm_backward(&mut dx, &mut dw, &mut db, &r, &x, &m, &s, &w, c);
    check("layernorm dx", &x, &dx, 1e-2, 240, KERNEL_TOL, |x| dot(&fwd(x, &w, &b).0, &r));
    check("layernorm dw", &w, &dw, 1e-2, 240, KERNEL_TOL, |w| dot(&fwd(&x, w, &b).0, &r));
    check("layernorm db", &b, &db, 1e-2, 240, KERNEL_TOL, |b| dot(&fwd(&x, &w, b).0, &r));
}

#[test]
fn gelu_backward_matches_finite_differences() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let x = randn(&mut rng, 500, 4.0);
    let r = randn(&mut rng, 500, 1.0);
    let fwd = |x: &[f32]| {
        let mut o = vec![0f32; x.len()];
        gelu_forward(&mut o, x);
        o
    };
    let mut d = r.clone();
    gelu_backward(&mut d, &x);
    check("gelu", &x, &d, 1e-2, 800, KERNEL_TOL, |x| dot(&fwd(x), &r));
    // and the forward against the formula in f64
    let y = fwd(&x);
    for (&x, &y) in x.iter().zip(&y) {
        let x = x as f64;
        let want = 0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh());
        assert!((y as f64 - want).abs() < 1e-6 * (1.0 + want.abs()));
    }
}

#[test]
fn attention_backward_matches_finite_differences() {
    // short sequences, and one spanning several causal blocks of 64 rows (with a ragged end)
    attention_gradcheck(4, AttnShape { b: 2, t: 7, c: 12, heads: 3 });
    attention_gradcheck(40, AttnShape { b: 1, t: 150, c: 8, heads: 2 });
    // a head wider than one 16-column strip of the kernel, with a ragged one (hd = 20)
    attention_gradcheck(41, AttnShape { b: 1, t: 23, c: 40, heads: 2 });
}

fn attention_gradcheck(seed: u64, s: AttnShape) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let qkv = randn(&mut rng, s.b * s.t * 3 * s.c, 1.5);
    let r = randn(&mut rng, s.b * s.t * s.c, 1.0);
    let fwd = |qkv: &[f32]| {
        let mut o = vec![0f32; s.b * s.t * s.c];
        let mut p = vec![0f32; s.probs_len()];
        attention_forward(&mut o, &mut p, qkv, s);
        (o, p)
    };
    let (_, p) = fwd(&qkv);
    let mut d = vec![0f32; qkv.len()];
    attention_backward(&mut d, &r, &qkv, &p, s);
    check("attention", &qkv, &d, 1e-2, 1200, KERNEL_TOL, |q| dot(&fwd(q).0, &r));
}

#[test]
fn attention_forward_matches_naive_reference() {
    attention_reference(AttnShape { b: 2, t: 6, c: 8, heads: 2 });
    attention_reference(AttnShape { b: 1, t: 137, c: 8, heads: 2 });
    // GPT-2's head width (64: four strips of the kernel), rows past 256, a ragged last panel
    attention_reference(AttnShape { b: 2, t: 263, c: 128, heads: 2 });
}

fn attention_reference(s: AttnShape) {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let qkv = randn(&mut rng, s.b * s.t * 3 * s.c, 1.5);
    let mut o = vec![0f32; s.b * s.t * s.c];
    let mut p = vec![0f32; s.probs_len()];
    attention_forward(&mut o, &mut p, &qkv, s);
    let (t, c, hd) = (s.t, s.c, s.c / s.heads);
    let at = |b: usize, i: usize, j: usize| qkv[(b * t + i) * 3 * c + j] as f64;
    for b in 0..s.b {
        for h in 0..s.heads {
            for i in 0..t {
                let sc: Vec<f64> = (0..=i)
                    .map(|j| {
                        (0..hd).map(|d| at(b, i, h * hd + d) * at(b, j, c + h * hd + d)).sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let mx = sc.iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = sc.iter().map(|v| (v - mx).exp()).sum();
                for d in 0..hd {
                    let want: f64 = (0..=i).map(|j| (sc[j] - mx).exp() / z * at(b, j, 2 * c + h * hd + d)).sum();
                    let got = o[(b * t + i) * c + h * hd + d] as f64;
                    assert!((got - want).abs() < 1e-5, "b{b} h{h} i{i} d{d}: {got} vs {want}");
                }
            }
        }
    }
}

#[test]
fn cross_entropy_backward_matches_finite_differences() {
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let (n, v) = (9, 13);
    let logits = randn(&mut rng, n * v, 3.0);
    let targets: Vec<i32> = (0..n).map(|i| if i == 4 { IGNORE } else { rng.gen_range(0..v as i32) }).collect();
    let count = targets.iter().filter(|&&t| t != IGNORE).count();
    let mean_loss = |l: &[f32]| {
        let (mut lo, mut lse) = (vec![0f32; n], vec![0f32; n]);
        cross_entropy_forward(&mut lo, &mut lse, l, &targets, v);
        lo.iter().map(|&x| x as f64).sum::<f64>() / count as f64
    };
    let (mut lo, mut lse) = (vec![0f32; n], vec![0f32; n]);
    cross_entropy_forward(&mut lo, &mut lse, &logits, &targets, v);
    // forward against a direct f64 computation
    for i in 0..n {
        let row = &logits[i * v..(i + 1) * v];
        let z: f64 = row.iter().map(|&x| (x as f64).exp()).sum::<f64>();
        let want = if targets[i] == IGNORE { 0.0 } else { z.ln() - row[targets[i] as usize] as f64 };
        assert!((lo[i] as f64 - want).abs() < 1e-5, "row {i}");
    }
    let mut d = logits.clone();
    cross_entropy_backward(&mut d, &lse, &targets, VocabWindow::whole(v), 1.0 / count as f32);
    check("cross-entropy", &logits, &d, 1e-2, 800, KERNEL_TOL, mean_loss);
}

/// A window of the token table (rows 3..8 of a vocabulary of 11, as a tensor-parallel rank
/// holds it: other tokens give zero rows) and positions of rows that start mid-batch.
#[test]
fn embedding_backward_matches_finite_differences() {
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let (lo, rows, t, c, n, row0) = (3, 5, 5, 6, 14, 2);
    let wte = randn(&mut rng, rows * c, 1.0);
    let wpe = randn(&mut rng, t * c, 1.0);
    let tokens: Vec<u32> = (0..n).map(|i| (i as u32 * 7) % 11).collect(); // repeats on purpose
    let r = randn(&mut rng, n * c, 1.0);
    let fwd = |wte: &[f32], wpe: &[f32]| {
        let mut e = vec![0f32; n * c];
        token_embedding_forward(&mut e, wte, &tokens, lo, c);
        let mut o = vec![0f32; n * c];
        position_forward(&mut o, &e, wpe, row0, t, c);
        o
    };
    let (mut dte, mut dpe) = (vec![0f32; rows * c], vec![0f32; t * c]);
    token_embedding_backward(&mut dte, &r, &tokens, lo, c);
    position_backward(&mut dpe, &r, row0, t, c);
    check("embedding wte", &wte, &dte, 1e-2, 400, KERNEL_TOL, |w| dot(&fwd(w, &wpe), &r));
    check("embedding wpe", &wpe, &dpe, 1e-2, 400, KERNEL_TOL, |w| dot(&fwd(&wte, w), &r));
    // a token outside the window has a zero row
    let o = fwd(&wte, &vec![0f32; t * c]);
    assert!(o[..c].iter().all(|&x| x == 0.0), "token {} is outside rows {lo}..{}", tokens[0], lo + rows);
}

/// The whole model: every parameter tensor gets sampled coordinates checked.
#[test]
fn gpt_gradient_matches_finite_differences() {
    let cfg = GptConfig { n_layer: 2, n_head: 2, n_embd: 16, vocab_size: 23, block_size: 8 };
    let model = Gpt::new(cfg).unwrap();
    let mut params = model.layout.init(11);
    // Larger weights than GPT-2's 0.02 so that every path carries a visible signal.
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    for (p, r) in params.iter_mut().zip(randn(&mut rng, model.layout.total, 0.3)) {
        *p += r;
    }
    let (b, t) = (2, 6);
    let tokens: Vec<u32> = (0..b * t).map(|_| rng.gen_range(0..cfg.vocab_size as u32)).collect();
    let mut targets: Vec<i32> = (0..b * t).map(|_| rng.gen_range(0..cfg.vocab_size as i32)).collect();
    targets[3] = IGNORE;
    let count = targets.iter().filter(|&&x| x != IGNORE).count();
    let loss = |p: &[f32]| {
        let mut acts = Activations::default();
        model.logits(p, &tokens, (b, t), &mut acts);
        model.loss(&Tp::SOLO, &targets, &mut acts).unwrap().0 / count as f64
    };
    let mut grads = vec![0f32; model.layout.total];
    let mut acts = Activations::default();
    model.forward_backward((&params, &mut grads), (&tokens, &targets), (b, t), 1.0 / count as f32, &mut acts);
    for spec in &model.layout.specs {
        let v = spec.view;
        let sub_p = v.of(&params).to_vec();
        let sub_g = v.of(&grads).to_vec();
        let full = params.clone();
        check(&spec.name, &sub_p, &sub_g, 1e-2, 48, MODEL_TOL, |x| {
            let mut p = full.clone();
            v.of_mut(&mut p).copy_from_slice(x);
            loss(&p)
        });
    }
}
