//! brigade's Llama-family decoder against Hugging Face `transformers` (fixtures made by
//! scripts/make_llama_fixture.py): a Llama 3-style model (GQA 4:1, llama3 rope scaling,
//! head_dim × heads ≠ hidden, untied head) and a Qwen2-style one (q/k/v biases, tied head,
//! rope_theta 1e6, a sharded checkpoint). Same weights, same input → same logits, loss, every
//! parameter's gradient, and the same greedy continuation.

use brigade::models::checkpoint::load_model;
use brigade::models::units::Whole;
use brigade::models::{generate, Activations, Output, Pass, SampleOptions};
use brigade::nn::tp::Tp;
use brigade::tensor::loss::IGNORE;
use safetensors::SafeTensors;
use std::path::Path;

fn f32s(st: &SafeTensors, name: &str) -> Vec<f32> {
    let t = st.tensor(name).unwrap_or_else(|_| panic!("fixture lacks {name}"));
    t.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn ids(st: &SafeTensors, name: &str) -> (Vec<u32>, usize, usize) {
    let t = st.tensor(name).unwrap_or_else(|_| panic!("fixture lacks {name}"));
    let v = t.data().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32).collect();
    (v, t.shape()[0], t.shape()[1])
}

/// max |a − b| / max |b|
fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num = a.iter().zip(b).map(|(x, y)| (x - y).abs() as f64).fold(0.0, f64::max);
    let den = b.iter().map(|y| y.abs() as f64).fold(0.0, f64::max);
    num / den
}

fn matches_hugging_face(dir: &str) {
    let dir = Path::new(dir);
    let (model, params) = load_model(dir).expect("loads a Hugging Face save_pretrained directory");
    assert!(model.cfg.llama().is_some(), "read as the Llama family");
    let bytes = std::fs::read(dir.join("expected.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let (x, b, t) = ids(&st, "input_ids");
    // Hugging Face shifts labels inside: position i predicts token i+1, the last predicts nothing.
    let targets: Vec<i32> = (0..b * t).map(|i| if i % t == t - 1 { IGNORE } else { x[i + 1] as i32 }).collect();
    let count = targets.iter().filter(|&&y| y != IGNORE).count();

    let mut acts = Activations::default();
    model.logits(&params, &x, (b, t), &mut acts);
    let e = rel_err(&acts.logits, &f32s(&st, "logits"));
    assert!(e < 1e-4, "{dir:?}: logits differ from Hugging Face by {e:.2e} (relative)");
    let (sum, n) = model.loss(&Tp::SOLO, &targets, &mut acts).unwrap();
    assert_eq!(n, count);
    let (loss, want) = (sum / n as f64, f32s(&st, "loss")[0] as f64);
    assert!(((loss - want) / want).abs() < 1e-5, "{dir:?}: loss {loss} vs Hugging Face {want}");

    let mut grads = vec![0f32; model.layout.total];
    let mut store = Whole::new(&model.units, &params, &mut grads);
    let from = Output::Loss { targets: &targets, scale: 1.0 / count as f32 };
    model.backward(&mut Pass::new(&Tp::SOLO, &mut store), &x, from, &mut acts).unwrap();
    // every parameter of the model has its gradient in the fixture, and the reverse
    let theirs: Vec<&str> = st.names().into_iter().filter_map(|n| n.strip_prefix("grad.")).collect();
    assert_eq!(theirs.len(), model.layout.specs.len(), "{dir:?}: one gradient per parameter");
    for name in theirs {
        let spec = model.layout.get(name).unwrap_or_else(|| panic!("no parameter {name}"));
        let e = rel_err(spec.view.of(&grads), &f32s(&st, &format!("grad.{name}")));
        assert!(e < 1e-4, "{dir:?}: gradient of {name} differs from PyTorch by {e:.2e} (relative)");
    }

    // a prompt longer than one attention tile and than the original rope context
    let (long, b, t) = ids(&st, "long_input_ids");
    model.logits(&params, &long, (b, t), &mut acts);
    let e = rel_err(&acts.logits, &f32s(&st, "long_logits"));
    assert!(e < 1e-4, "{dir:?}: logits of a {t}-token prompt differ from Hugging Face by {e:.2e} (relative)");

    let (prompt, _, _) = ids(&st, "prompt_ids");
    let (want, _, n) = ids(&st, "greedy_ids");
    let opt = SampleOptions { max_new_tokens: n, temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0, stop: None };
    let got = generate(&model, &params, &[prompt], &opt);
    assert_eq!(got[0], want, "{dir:?}: greedy continuation differs from Hugging Face generate()");
}

#[test]
fn matches_hugging_face_llama3() {
    matches_hugging_face("tests/fixtures/llama3_hf");
}

#[test]
fn matches_hugging_face_qwen2_sharded() {
    matches_hugging_face("tests/fixtures/qwen2_hf");
}
