//! Every kernel's and layer's backward against central finite differences.
//!
//! The scalar probed is `L = Σ yᵢ·rᵢ` (r fixed random), summed in f64 so that the only f32
//! rounding is in the kernels. The check compares the vector of sampled partial derivatives:
//! ‖fd − analytic‖ / ‖fd‖ must be below a tolerance set near the measured error (see below).

use brigade::models::units::Whole;
use brigade::models::{Activations, Gpt, GptConfig, Input, Output, Pass};
use brigade::nn::tp::Tp;
use brigade::tensor::attention::{attention_backward, attention_forward, AttnShape};
use brigade::tensor::docs::{positions_from_starts, Docs};
use brigade::tensor::elementwise::{gelu_backward, gelu_forward, swiglu_backward, swiglu_forward};
use brigade::tensor::embedding::{
    position_backward, position_forward, token_embedding_backward, token_embedding_forward,
};
use brigade::tensor::layernorm::{layernorm_backward, layernorm_forward};
use brigade::tensor::loss::{cross_entropy_backward, cross_entropy_forward, VocabWindow, IGNORE};
use brigade::tensor::matmul::{matmul, matmul_reference};
use brigade::tensor::rmsnorm::{rmsnorm_backward, rmsnorm_forward};
use brigade::tensor::rope::{inv_freq, rope_rows, RopeTable};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod common;
use common::for_each_family;

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
    attention_gradcheck(4, AttnShape::fused(2, 7, 12, 3));
    attention_gradcheck(40, AttnShape::fused(1, 150, 8, 2));
    // a head wider than one 16-column strip of the kernel, with a ragged one (hd = 20)
    attention_gradcheck(41, AttnShape::fused(1, 23, 40, 2));
    // grouped-query attention: 6 query heads on 2 key/value heads, and on 1 (MQA), heads of
    // width 8 and 20, across several causal blocks
    attention_gradcheck(42, AttnShape::grouped(2, 9, 6, 2, 8));
    attention_gradcheck(43, AttnShape::grouped(1, 70, 4, 1, 20));
    // documents packed into each sequence (--doc-mask): each row attends within its own
    for (seed, s) in [(44, AttnShape::fused(2, 9, 12, 3)), (45, AttnShape::grouped(2, 70, 4, 2, 8))] {
        let docs = packed(s.b, s.t, seed);
        attention_gradcheck_docs(seed, s, Docs::packed(&docs));
    }
}

/// Positions of documents of random lengths (1 to 40 tokens) packed into `b` sequences of `t`;
/// the first of each sequence is the tail of one that began before it.
fn packed(b: usize, t: usize, seed: u64) -> Vec<u32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let starts: Vec<Vec<usize>> = (0..b)
        .map(|_| {
            let mut at = rng.gen_range(1..20);
            let mut v = Vec::new();
            while at < t {
                v.push(at);
                at += rng.gen_range(1..=40);
            }
            v
        })
        .collect();
    positions_from_starts(t, &starts)
}

fn attention_gradcheck(seed: u64, s: AttnShape) {
    attention_gradcheck_docs(seed, s, Docs::WHOLE)
}

fn attention_gradcheck_docs(seed: u64, s: AttnShape, docs: Docs) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let qkv = randn(&mut rng, s.qkv_len(), 1.5);
    let r = randn(&mut rng, s.out_len(), 1.0);
    let fwd = |qkv: &[f32]| {
        let mut o = vec![0f32; s.out_len()];
        let mut p = vec![0f32; s.probs_len()];
        attention_forward(&mut o, &mut p, qkv, s, docs);
        (o, p)
    };
    let (_, p) = fwd(&qkv);
    let mut d = vec![0f32; qkv.len()];
    attention_backward(&mut d, &r, &qkv, &p, s);
    check("attention", &qkv, &d, 1e-2, 1200, KERNEL_TOL, |q| dot(&fwd(q).0, &r));
}

#[test]
fn attention_forward_matches_naive_reference() {
    attention_reference(AttnShape::fused(2, 6, 8, 2));
    attention_reference(AttnShape::fused(1, 137, 8, 2));
    // GPT-2's head width (64: four strips of the kernel), rows past 256, a ragged last panel
    attention_reference(AttnShape::fused(2, 263, 128, 2));
    attention_reference(AttnShape::grouped(2, 70, 4, 2, 16));
    attention_reference(AttnShape::grouped(1, 9, 3, 1, 6));
    // packed documents (--doc-mask), with documents that start past the first 16-key strip
    for (seed, s) in [(7, AttnShape::fused(2, 263, 128, 2)), (8, AttnShape::grouped(3, 70, 4, 2, 16))] {
        let docs = packed(s.b, s.t, seed);
        attention_reference_docs(s, Docs::packed(&docs));
    }
}

/// Element `d` of head `h` of part `part` (0 q, 1 k, 2 v) at row `i` of sequence `b`: GPT-2's
/// fused rows, or the separate q, k, v blocks.
fn qkv_at(s: &AttnShape, qkv: &[f32], b: usize, i: usize, part: usize, h: usize, d: usize) -> f64 {
    let (n, hd, row) = (s.b * s.t, s.hd, b * s.t + i);
    let (qw, kvw) = (s.heads * hd, s.kv_heads * hd);
    let at = if s.fused {
        row * 3 * qw + part * qw + h * hd + d
    } else {
        match part {
            0 => row * qw + h * hd + d,
            1 => n * qw + row * kvw + h * hd + d,
            _ => n * (qw + kvw) + row * kvw + h * hd + d,
        }
    };
    qkv[at] as f64
}

fn attention_reference(s: AttnShape) {
    attention_reference_docs(s, Docs::WHOLE)
}

/// The forward against the definition in f64, each row over the keys of its document (from
/// `first` to itself), written out without the kernel's blocking.
fn attention_reference_docs(s: AttnShape, docs: Docs) {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let qkv = randn(&mut rng, s.qkv_len(), 1.5);
    let mut o = vec![0f32; s.out_len()];
    let mut p = vec![0f32; s.probs_len()];
    attention_forward(&mut o, &mut p, &qkv, s, docs);
    let first = |b: usize, i: usize| docs.positions().map_or(0, |pos| i - pos[b * s.t + i] as usize);
    let (t, c, hd) = (s.t, s.heads * s.hd, s.hd);
    let at = |b: usize, i: usize, part: usize, h: usize, d: usize| qkv_at(&s, &qkv, b, i, part, h, d);
    for b in 0..s.b {
        for h in 0..s.heads {
            // the key/value head this query head reads, written out
            let kvh = h * s.kv_heads / s.heads;
            for i in 0..t {
                let f = first(b, i);
                let sc: Vec<f64> = (f..=i)
                    .map(|j| (0..hd).map(|d| at(b, i, 0, h, d) * at(b, j, 1, kvh, d)).sum::<f64>() / (hd as f64).sqrt())
                    .collect();
                let mx = sc.iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = sc.iter().map(|v| (v - mx).exp()).sum();
                for d in 0..hd {
                    let want: f64 = (f..=i).map(|j| (sc[j - f] - mx).exp() / z * at(b, j, 2, kvh, d)).sum();
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
        position_forward(&mut o, &e, wpe, (row0, Docs::WHOLE), t, c);
        o
    };
    let (mut dte, mut dpe) = (vec![0f32; rows * c], vec![0f32; t * c]);
    token_embedding_backward(&mut dte, &r, &tokens, lo, c);
    position_backward(&mut dpe, &r, (row0, Docs::WHOLE), t, c);
    check("embedding wte", &wte, &dte, 1e-2, 400, KERNEL_TOL, |w| dot(&fwd(w, &wpe), &r));
    check("embedding wpe", &wpe, &dpe, 1e-2, 400, KERNEL_TOL, |w| dot(&fwd(&wte, w), &r));
    // a token outside the window has a zero row
    let o = fwd(&wte, &vec![0f32; t * c]);
    assert!(o[..c].iter().all(|&x| x == 0.0), "token {} is outside rows {lo}..{}", tokens[0], lo + rows);
}

#[test]
fn swiglu_backward_matches_finite_differences() {
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    let n = 300;
    let (gate, up, r) = (randn(&mut rng, n, 4.0), randn(&mut rng, n, 2.0), randn(&mut rng, n, 1.0));
    let fwd = |g: &[f32], u: &[f32]| {
        let mut o = vec![0f32; n];
        swiglu_forward(&mut o, g, u);
        dot(&o, &r)
    };
    let (mut dg, mut du) = (r.clone(), vec![0f32; n]);
    swiglu_backward(&mut dg, &mut du, &gate, &up);
    check("swiglu gate", &gate, &dg, 1e-2, n, KERNEL_TOL, |g| fwd(g, &up));
    check("swiglu up", &up, &du, 1e-2, n, KERNEL_TOL, |u| fwd(&gate, u));
}

#[test]
fn rmsnorm_backward_matches_finite_differences() {
    let mut rng = ChaCha8Rng::seed_from_u64(22);
    let (n, c) = (37, 24);
    let (x, w, r) = (randn(&mut rng, n * c, 2.0), randn(&mut rng, c, 1.5), randn(&mut rng, n * c, 1.0));
    let fwd = |x: &[f32], w: &[f32]| {
        let (mut o, mut rs) = (vec![0f32; n * c], vec![0f32; n]);
        rmsnorm_forward(&mut o, &mut rs, x, w, c, 1e-5);
        (o, rs)
    };
    let (_, rs) = fwd(&x, &w);
    let (mut dx, mut dw) = (vec![0f32; n * c], vec![0f32; c]);
    rmsnorm_backward(&mut dx, &mut dw, &r, &x, &rs, &w, c);
    check("rmsnorm x", &x, &dx, 1e-2, 600, KERNEL_TOL, |x| dot(&fwd(x, &w).0, &r));
    check("rmsnorm w", &w, &dw, 1e-2, c, KERNEL_TOL, |w| dot(&fwd(&x, w).0, &r));
}

/// The rotation is linear in x: its backward (the inverse rotation of the gradient) against
/// finite differences, with Llama 3 scaling, at positions of two sequences.
#[test]
fn rope_backward_matches_finite_differences() {
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    let (heads, hd, t, b) = (3, 12, 40, 2);
    let tab = RopeTable::new(&inv_freq(hd, 500_000.0, Some((8.0, 1.0, 4.0, 16))), t);
    let n = b * t * heads * hd;
    let (x, r) = (randn(&mut rng, n, 1.0), randn(&mut rng, n, 1.0));
    let fwd = |x: &[f32]| {
        let mut y = x.to_vec();
        rope_rows(&mut y, heads, &tab, |row| row % t, false);
        dot(&y, &r)
    };
    let mut d = r.clone();
    rope_rows(&mut d, heads, &tab, |row| row % t, true);
    check("rope", &x, &d, 1e-2, 800, KERNEL_TOL, fwd);
}

/// The whole model, for every family: its test model (`Family::example`, every part of the
/// family) with 23 tokens and 8 positions; every parameter tensor gets sampled coordinates
/// checked, and a failure names the family.
#[test]
fn every_family_gradient_matches_finite_differences() {
    for_each_family(|f| model_gradient_matches_finite_differences(GptConfig::example(f, 23, 8)));
}

/// Documents packed into each sequence and kept apart (`--doc-mask`): positions restart at
/// each document (GPT-2's table, Llama's rotation) and attention stays inside it.
#[test]
fn every_family_gradient_over_packed_documents_matches_finite_differences() {
    let pos = positions_from_starts(6, &[vec![2, 4], vec![3]]);
    for_each_family(|f| model_gradient_check(GptConfig::example(f, 23, 8), Some(&pos)));
}

/// GPT-2 at two heads of 8.
#[test]
fn gpt_gradient_matches_finite_differences() {
    let cfg =
        GptConfig { n_layer: 2, n_head: 2, n_embd: 16, vocab_size: 23, block_size: 8, family: Default::default() };
    model_gradient_matches_finite_differences(cfg);
}

/// The Llama family: GQA 4:2, head_dim × heads ≠ hidden, q/k/v and o biases, untied head, and
/// (second) MQA with a tied head and llama3 rope scaling, and Qwen3's and OLMoE's q/k norms.
#[test]
fn llama_gradient_matches_finite_differences() {
    use brigade::models::family::{Llama, Llama3Rope};
    let a = Llama {
        n_kv_head: 2,
        head_dim: 6,
        intermediate: 20,
        rms_eps: 1e-5,
        rope_theta: 10_000.0,
        rope_scaling: None,
        tied: false,
        qkv_bias: true,
        o_bias: true,
        moe: None,
        qk_norm: false,
        qk_norm_whole: false,
    };
    let cfg = GptConfig { n_layer: 2, n_head: 4, n_embd: 16, vocab_size: 23, block_size: 8, family: a.into() };
    model_gradient_matches_finite_differences(cfg);
    let scaling = Some(Llama3Rope {
        factor: 4.0,
        low_freq_factor: 1.0,
        high_freq_factor: 2.0,
        original_max_position_embeddings: 4,
    });
    let mqa =
        Llama { n_kv_head: 1, head_dim: 8, tied: true, qkv_bias: false, o_bias: false, rope_scaling: scaling, ..a };
    model_gradient_matches_finite_differences(GptConfig { family: mqa.into(), ..cfg });
    // Qwen3's RMSNorm over each query and key head before the rotation
    let qk = Llama { qk_norm: true, qkv_bias: false, o_bias: false, ..a };
    model_gradient_matches_finite_differences(GptConfig { family: qk.into(), ..cfg });
    // OLMoE's, over all of q and all of k at once
    let whole = Llama { qk_norm_whole: true, ..qk };
    model_gradient_matches_finite_differences(GptConfig { family: whole.into(), ..cfg });
}

fn model_gradient_matches_finite_differences(cfg: GptConfig) {
    model_gradient_check(cfg, None)
}

fn model_gradient_check(cfg: GptConfig, pos: Option<&[u32]>) {
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
        model.logits_docs(p, &tokens, pos, (b, t), &mut acts);
        model.loss(&Tp::SOLO, &targets, &mut acts).unwrap().0 / count as f64
    };
    let mut grads = vec![0f32; model.layout.total];
    let mut acts = Activations::default();
    let mut store = Whole::new(&model.units, &params, &mut grads);
    let mut pass = Pass::new(&Tp::SOLO, &mut store).with_docs(pos);
    model.forward(&mut pass, Input::Tokens(&tokens), (b, t), &mut acts).unwrap();
    model.loss(&Tp::SOLO, &targets, &mut acts).unwrap();
    let from = Output::Loss { targets: &targets, scale: 1.0 / count as f32 };
    model.backward(&mut pass, &tokens, from, &mut acts).unwrap();
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

mod moe {
    use super::*;
    use brigade::nn::moe::{AuxWeights, Moe, MoeNames, MoeScratch, MoeShape, MoeStash};
    use brigade::nn::{Grads, WeightGrads};
    use brigade::params::ParamLayout;

    fn layer(shape: MoeShape) -> (Moe, ParamLayout) {
        let mut layout = ParamLayout::default();
        let names = MoeNames {
            router: "mlp.gate".into(),
            experts: (0..shape.experts)
                .map(|e| ["gate_proj", "up_proj", "down_proj"].map(|n| format!("mlp.experts.{e}.{n}")))
                .collect(),
            shared: (shape.shared_width > 0).then(|| {
                (
                    ["gate_proj", "up_proj", "down_proj"].map(|n| format!("mlp.shared_expert.{n}")),
                    "mlp.shared_expert_gate".into(),
                )
            }),
            bias: (shape.bias_rate > 0.0).then(|| "mlp.gate.e_score_correction_bias".into()),
        };
        let moe = Moe::new(&mut layout, &names, shape, 0.3, 0..shape.experts);
        (moe, layout)
    }

    const AUX: AuxWeights = AuxWeights { balance: 0.7, z: 0.3 };

    /// The tests' mixture: 4 experts of 6 units, 2 a row, renormalised, dropless, no bias.
    const BASE: MoeShape = MoeShape {
        c: 8,
        experts: 4,
        top_k: 2,
        width: 6,
        shared_width: 0,
        norm_topk: true,
        capacity: 0.0,
        bias_rate: 0.0,
    };

    /// `L = Σ out·r + 0.7·Σ balance + 0.3·Σ z` over the sequences, in f64.
    fn loss(moe: &Moe, p: &[f32], h: &[f32], seq: usize, r: &[f32]) -> f64 {
        let (mut st, mut out) = (MoeStash::default(), Vec::new());
        let aux = moe.forward(p, (h, seq), (None, None), &mut st, &mut out, &mut MoeScratch::default()).unwrap();
        dot(&out, r) + AUX.balance as f64 * aux.balance + AUX.z as f64 * aux.z
    }

    fn gradcheck(shape: MoeShape, seed: u64) {
        let (moe, layout) = layer(shape);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let p = layout.init(seed);
        let (n, seq) = (12, 6);
        let h = randn(&mut rng, n * shape.c, 1.0);
        let r = randn(&mut rng, n * shape.c, 1.0);
        let (mut st, mut out) = (MoeStash::default(), Vec::new());
        moe.forward(&p, (&h, seq), (None, None), &mut st, &mut out, &mut MoeScratch::default()).unwrap();
        if shape.capacity > 0.0 {
            assert!(st.pairs.len() < n * shape.top_k, "the capacity drops some rows");
        }
        let mut g = vec![0f32; p.len()];
        let mut dw = WeightGrads::Now;
        let mut dx = Vec::new();
        let mut gr = Grads { p: &p, g: &mut g, dw: &mut dw };
        moe.backward(&mut gr, &h, None, &st, &r, &mut dx, AUX, &mut MoeScratch::default()).unwrap();
        let tag = format!(
            "moe E{} k{} shared {} norm {} capacity {}",
            shape.experts, shape.top_k, shape.shared_width, shape.norm_topk, shape.capacity
        );
        check(&format!("{tag}: input"), &h, &dx, 1e-3, 200, KERNEL_TOL, |x| loss(&moe, &p, x, seq, &r));
        // every tensor, the router's first
        for spec in &layout.specs {
            let v = spec.view;
            let sub = |q: &[f32]| {
                let mut full = p.clone();
                full[v.offset..v.offset + v.len].copy_from_slice(q);
                loss(&moe, &full, &h, seq, &r)
            };
            check(&format!("{tag}: {}", spec.name), v.of(&p), v.of(&g), 1e-3, 60, KERNEL_TOL, sub);
        }
    }

    #[test]
    fn moe_backward_matches_finite_differences() {
        let base = BASE;
        gradcheck(base, 31);
        gradcheck(MoeShape { norm_topk: false, ..base }, 32);
        gradcheck(MoeShape { shared_width: 10, norm_topk: false, ..base }, 33);
        gradcheck(MoeShape { top_k: 1, experts: 3, ..base }, 34);
        // with a capacity of 2 rows an expert in each sequence of 6 (factor 0.5): dropped rows
        // pass their expert by, and their weight on it gets no gradient
        gradcheck(MoeShape { capacity: 0.5, ..base }, 35);
        gradcheck(MoeShape { capacity: 0.5, shared_width: 10, norm_topk: false, ..base }, 36);
    }

    /// DeepSeek-V3's auxiliary-loss-free balancing: the bias picks the experts (a large one on
    /// expert 3 puts it among every row's k) but the weights are the probabilities, renormalised
    /// over the chosen; a step moves each bias by the rate towards the even load.
    #[test]
    fn the_balancing_bias_chooses_but_does_not_weigh_and_moves_towards_the_even_load() {
        let shape = MoeShape { bias_rate: 0.25, ..BASE };
        let (moe, layout) = layer(shape);
        let mut rng = ChaCha8Rng::seed_from_u64(61);
        let mut p = layout.init(61);
        let b = layout.get("mlp.gate.e_score_correction_bias").expect("the bias tensor").view;
        assert!(b.of(&p).iter().all(|&x| x == 0.0), "it starts at zero");
        b.of_mut(&mut p).copy_from_slice(&[0.0, 0.0, 0.0, 2.0]);
        let n = 9;
        let h = randn(&mut rng, n * shape.c, 1.0);
        let (mut st, mut out) = (MoeStash::default(), Vec::new());
        moe.forward(&p, (&h, n), (None, None), &mut st, &mut out, &mut MoeScratch::default()).unwrap();
        for t in 0..n {
            let probs = &st.probs[t * 4..(t + 1) * 4];
            // the other expert: the most probable of the first three
            let best = (0..3).max_by(|&a, &b| probs[a].partial_cmp(&probs[b]).unwrap().then(b.cmp(&a))).unwrap();
            let mut want = [best as u32, 3];
            want.sort();
            let mut got: Vec<u32> = st.chosen[t * 2..t * 2 + 2].to_vec();
            got.sort();
            assert_eq!(got, want, "row {t}");
            let sum = probs[best] + probs[3];
            for &(row, e, w) in st.pairs.iter().filter(|q| q.0 as usize == t) {
                assert_eq!(row as usize, t);
                assert!((w - probs[e as usize] / sum).abs() < 1e-6, "row {t} expert {e}: weight {w}");
            }
        }
        // loads 5, 1, 2, 0 (mean 2): the busy expert's bias falls, the idle ones' rise
        moe.update_bias(&mut p, &[5.0, 1.0, 2.0, 0.0]);
        assert_eq!(b.of(&p), &[-0.25, 0.25, 0.0, 2.25]);
    }

    /// Under a capacity factor each expert keeps the rows of a sequence it weighs most (ties to
    /// the earlier row), chosen here from the dropless forward's own pairs, and a row's output
    /// is the sum over the pairs it kept of the dropless forward's expert outputs.
    #[test]
    fn a_capacity_keeps_each_experts_heaviest_rows_of_a_sequence() {
        let base = BASE;
        let (dropless, layout) = layer(base);
        let (capped, _) = layer(MoeShape { capacity: 0.5, ..base });
        let mut rng = ChaCha8Rng::seed_from_u64(51);
        let p = layout.init(51);
        let (n, seq, c) = (18, 6, base.c);
        let cap = 2; // ⌈0.5 · 6 · 2 / 4⌉
        assert_eq!(capped.shape.expert_capacity(seq), cap);
        let h = randn(&mut rng, n * c, 1.0);
        let (mut st0, mut out0) = (MoeStash::default(), Vec::new());
        dropless.forward(&p, (&h, seq), (None, None), &mut st0, &mut out0, &mut MoeScratch::default()).unwrap();
        let (mut st, mut out) = (MoeStash::default(), Vec::new());
        capped.forward(&p, (&h, seq), (None, None), &mut st, &mut out, &mut MoeScratch::default()).unwrap();
        // the pairs each (expert, sequence) keeps, from the dropless pairs
        let mut want: Vec<(u32, u32, f32, usize)> = Vec::new();
        for e in 0..base.experts as u32 {
            for s in 0..n / seq {
                let mut mine: Vec<(u32, u32, f32, usize)> = st0
                    .pairs
                    .iter()
                    .enumerate()
                    .filter(|(_, q)| q.1 == e && q.0 as usize / seq == s)
                    .map(|(i, q)| (q.0, q.1, q.2, i))
                    .collect();
                mine.sort_by(|a, b| b.2.partial_cmp(&a.2).unwrap().then(a.0.cmp(&b.0)));
                mine.truncate(cap);
                mine.sort_by_key(|q| q.0);
                want.extend(mine);
            }
        }
        let kept: Vec<(u32, u32, f32)> = want.iter().map(|q| (q.0, q.1, q.2)).collect();
        assert_eq!(st.pairs, kept, "the kept pairs");
        assert!(kept.len() < st0.pairs.len(), "some rows were dropped");
        let mut sum = vec![0f64; n * c];
        for &(t, _, w, i) in &want {
            for j in 0..c {
                sum[t as usize * c + j] += w as f64 * st0.y[i * c + j] as f64;
            }
        }
        for (i, (&got, &w)) in out.iter().zip(&sum).enumerate() {
            assert!((got as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()), "output {i}: {got} vs {w}");
        }
        // the balancing loss still counts what the router chose, not what the experts kept
        assert_eq!(st.chosen, st0.chosen);
        assert_eq!(st.aux, st0.aux);
    }

    /// What a forward stashes for the backward, counted from the shapes: `n` rows of `c`, `E`
    /// experts of width `m`, `k` a row, a shared expert of width `s` — what the pipeline's
    /// peak stash bytes add up.
    #[test]
    fn moe_stash_counts_every_value_it_holds() {
        for (shared_width, top_k) in [(7, 2), (0, 1), (5, 3)] {
            let shape = MoeShape { experts: 5, shared_width, top_k, ..BASE };
            let (moe, layout) = layer(shape);
            let mut rng = ChaCha8Rng::seed_from_u64(43);
            let p = layout.init(43);
            let n = 9;
            let h = randn(&mut rng, n * shape.c, 1.0);
            let (mut st, mut out) = (MoeStash::default(), Vec::new());
            moe.forward(&p, (&h, n), (None, None), &mut st, &mut out, &mut MoeScratch::default()).unwrap();
            let (c, e, k, m, s) = (shape.c, shape.experts, top_k, shape.width, shared_width);
            let pairs = n * k; // dropless: every row reaches its k experts
            let routing = n * e + n + n * k + 3 * pairs + pairs * c; // probs, lse, chosen, pairs, y
            let experts = pairs * (2 * c + 3 * m); // rows in and out, gate/up/act of each
            let shared = if s > 0 { n * 3 * s + n * c + n } else { 0 }; // its MLP, output, gate
            assert_eq!(st.floats(), routing + experts + shared, "shared {s}, k {k}");
        }
    }

    /// The layer against a row-at-a-time reference written from the definition: each row's
    /// softmax, its k best experts, each expert's SwiGLU on that row alone.
    #[test]
    fn moe_forward_matches_a_row_by_row_reference() {
        let shape = MoeShape { experts: 5, shared_width: 7, ..BASE };
        let (moe, layout) = layer(shape);
        let mut rng = ChaCha8Rng::seed_from_u64(41);
        let p = layout.init(41);
        let n = 10;
        let h = randn(&mut rng, n * shape.c, 1.0);
        let (mut st, mut out) = (MoeStash::default(), Vec::new());
        moe.forward(&p, (&h, n), (None, None), &mut st, &mut out, &mut MoeScratch::default()).unwrap();
        let get = |name: &str| layout.get(name).unwrap().view.of(&p).to_vec();
        let c = shape.c;
        // y = W_down · (silu(W_gate x) ⊙ W_up x), weights [out, in]
        let swiglu = |x: &[f64], pre: &str, m: usize| -> Vec<f64> {
            let (wg, wu, wd) = (
                get(&format!("{pre}.gate_proj.weight")),
                get(&format!("{pre}.up_proj.weight")),
                get(&format!("{pre}.down_proj.weight")),
            );
            let a: Vec<f64> = (0..m)
                .map(|j| {
                    let g: f64 = (0..c).map(|i| wg[j * c + i] as f64 * x[i]).sum();
                    let u: f64 = (0..c).map(|i| wu[j * c + i] as f64 * x[i]).sum();
                    g / (1.0 + (-g).exp()) * u
                })
                .collect();
            (0..c).map(|o| (0..m).map(|j| wd[o * m + j] as f64 * a[j]).sum()).collect()
        };
        let wr = get("mlp.gate.weight");
        let wsg = get("mlp.shared_expert_gate.weight");
        for t in 0..n {
            let x: Vec<f64> = h[t * c..(t + 1) * c].iter().map(|&v| v as f64).collect();
            let logits: Vec<f64> =
                (0..shape.experts).map(|e| (0..c).map(|i| wr[e * c + i] as f64 * x[i]).sum()).collect();
            let max = logits.iter().cloned().fold(f64::MIN, f64::max);
            let z: f64 = logits.iter().map(|l| (l - max).exp()).sum();
            let probs: Vec<f64> = logits.iter().map(|l| (l - max).exp() / z).collect();
            let mut order: Vec<usize> = (0..shape.experts).collect();
            order.sort_by(|&a, &b| probs[b].partial_cmp(&probs[a]).unwrap());
            let chosen = &order[..shape.top_k];
            let sum: f64 = chosen.iter().map(|&e| probs[e]).sum();
            let mut want = vec![0f64; c];
            for &e in chosen {
                let y = swiglu(&x, &format!("mlp.experts.{e}"), shape.width);
                want.iter_mut().zip(&y).for_each(|(w, y)| *w += probs[e] / sum * y);
            }
            let s = swiglu(&x, "mlp.shared_expert", shape.shared_width);
            let gz: f64 = (0..c).map(|i| wsg[i] as f64 * x[i]).sum();
            want.iter_mut().zip(&s).for_each(|(w, s)| *w += s / (1.0 + (-gz).exp()));
            for i in 0..c {
                let got = out[t * c + i] as f64;
                assert!((got - want[i]).abs() <= 1e-5 * (1.0 + want[i].abs()), "row {t} col {i}: {got} vs {}", want[i]);
            }
        }
        // and each row alone gives its own result (the grouping does not enter)
        for t in [0, 7] {
            let (mut st1, mut one) = (MoeStash::default(), Vec::new());
            moe.forward(&p, (&h[t * c..(t + 1) * c], 1), (None, None), &mut st1, &mut one, &mut MoeScratch::default())
                .unwrap();
            for i in 0..c {
                assert!((one[i] - out[t * c + i]).abs() <= 1e-6, "row {t} alone");
            }
        }
    }
}
