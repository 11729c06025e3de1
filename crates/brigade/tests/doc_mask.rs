//! `--doc-mask`: documents packed into one sequence and kept apart compute exactly what each
//! document computes alone — the independent reference is the model run on each document as a
//! sequence of its own (no mask, positions from 0). Per-token losses and every parameter's
//! gradient agree, for every family (GPT-2's learned positions restart, Llama's rotation
//! restarts), with documents spanning the attention kernel's 6-row panels and 16-key strips.
//! Without the mask the packed run differs (the test can fail).

mod common;

use brigade::models::units::Whole;
use brigade::models::{Activations, Gpt, GptConfig, Input, Output, Pass};
use brigade::nn::tp::Tp;
use brigade::tensor::docs::positions_from_starts;
use brigade::tensor::loss::IGNORE;
use common::for_each_family;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Per-token losses (`acts`' order) and the gradient of their sum, of `b` sequences of `t`.
fn run(model: &Gpt, params: &[f32], (x, y): (&[u32], &[i32]), pos: Option<&[u32]>, t: usize) -> (Vec<f64>, Vec<f32>) {
    let b = x.len() / t;
    let mut grads = vec![0f32; model.layout.total];
    let mut acts = Activations::default();
    let mut store = Whole::new(&model.units, params, &mut grads);
    let mut pass = Pass::new(&Tp::SOLO, &mut store).with_docs(pos);
    model.forward(&mut pass, Input::Tokens(x), (b, t), &mut acts).unwrap();
    // per-token losses: the loss of each token alone, from the logits the forward left
    let v = model.cfg.vocab_size;
    let losses = y
        .iter()
        .enumerate()
        .map(|(r, &tg)| {
            if tg == IGNORE {
                return 0.0;
            }
            let row = &acts.logits[r * v..][..v];
            let mx = row.iter().cloned().fold(f32::MIN, f32::max) as f64;
            let lse = mx + row.iter().map(|&z| (z as f64 - mx).exp()).sum::<f64>().ln();
            lse - row[tg as usize] as f64
        })
        .collect();
    model.loss(&Tp::SOLO, y, &mut acts).unwrap();
    model.backward(&mut pass, x, Output::Loss { targets: y, scale: 1.0 }, &mut acts).unwrap();
    drop(pass);
    (losses, grads)
}

fn max_rel(a: &[f32], b: &[f32]) -> f64 {
    let num = a.iter().zip(b).map(|(x, y)| (x - y).abs() as f64).fold(0.0, f64::max);
    num / b.iter().map(|y| y.abs() as f64).fold(1e-30, f64::max)
}

#[test]
fn a_packed_sequence_computes_what_its_documents_compute_alone() {
    for_each_family(|f| {
        let (vocab, t) = (50, 48);
        let cfg = GptConfig::example(f, vocab, 64);
        let model = Gpt::new(cfg).unwrap();
        let params = model.layout.init(3);
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        // two sequences of 48: documents of 7, 17, 1, 23 tokens | 30, 18
        let lens = [vec![7, 17, 1, 23], vec![30, 18]];
        let docs: Vec<Vec<u32>> =
            lens.iter().flatten().map(|&l| (0..l).map(|_| rng.gen_range(0..vocab as u32)).collect()).collect();
        // each token predicts the next of its document; a document's last token nothing
        let targets = |d: &[u32]| -> Vec<i32> {
            (0..d.len()).map(|i| d.get(i + 1).map_or(IGNORE, |&n| n as i32)).collect::<Vec<_>>()
        };
        let x: Vec<u32> = docs.concat();
        let y: Vec<i32> = docs.iter().flat_map(|d| targets(d)).collect();
        let starts: Vec<Vec<usize>> =
            lens.iter().map(|ls| ls.iter().scan(0, |at, &l| Some(std::mem::replace(at, *at + l))).collect()).collect();
        let pos = positions_from_starts(t, &starts);
        let (packed_losses, packed_grads) = run(&model, &params, (&x, &y), Some(&pos), t);
        // the reference: each document alone, its gradients summed
        let mut alone_losses = Vec::new();
        let mut alone_grads = vec![0f32; model.layout.total];
        for d in &docs {
            let (l, g) = run(&model, &params, (d, &targets(d)), None, d.len());
            alone_losses.extend(l);
            alone_grads.iter_mut().zip(&g).for_each(|(a, b)| *a += b);
        }
        for (r, (p, a)) in packed_losses.iter().zip(&alone_losses).enumerate() {
            assert!((p - a).abs() <= 1e-5 * a.abs().max(1.0), "token {r}: packed loss {p} vs alone {a}");
        }
        let e = max_rel(&packed_grads, &alone_grads);
        assert!(e < 1e-5, "gradients of the packed sequence and of its documents alone differ by {e:.1e}");
        // without the mask the same packed sequence is attended to as one text: not the same
        let (plain, _) = run(&model, &params, (&x, &y), None, t);
        let worst = plain.iter().zip(&alone_losses).map(|(p, a)| (p - a).abs()).fold(0.0, f64::max);
        assert!(worst > 1e-3, "the mask changed nothing ({worst:.1e}): the test could not fail");
    });
}
