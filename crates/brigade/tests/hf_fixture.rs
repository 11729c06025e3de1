//! brigade's GPT-2 against Hugging Face `transformers` (fixture made by
//! scripts/make_gpt2_fixture.py): same weights, same input → same logits, loss and gradients.

mod common;
use brigade::models::checkpoint::load_model;
use brigade::models::units::Whole;
use brigade::models::Activations;
use brigade::models::{Output, Pass};
use brigade::nn::tp::Tp;
use brigade::tensor::loss::IGNORE;
use common::fixture::{f32s, gradients_match, rel_err};
use safetensors::SafeTensors;
use std::path::Path;

const DIR: &str = "tests/fixtures/gpt2_hf";

#[test]
fn matches_hugging_face_gpt2() {
    let dir = Path::new(DIR);
    let (model, params) = load_model(dir).expect("loads a Hugging Face save_pretrained directory");
    let bytes = std::fs::read(dir.join("expected.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let ids_t = st.tensor("input_ids").unwrap();
    let (b, t) = (ids_t.shape()[0], ids_t.shape()[1]);
    let ids: Vec<u32> =
        ids_t.data().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32).collect();
    // Hugging Face shifts labels inside: position i predicts token i+1, the last predicts nothing.
    let targets: Vec<i32> = (0..b * t).map(|i| if i % t == t - 1 { IGNORE } else { ids[i + 1] as i32 }).collect();
    let count = targets.iter().filter(|&&x| x != IGNORE).count();

    let mut acts = Activations::default();
    model.logits(&params, &ids, (b, t), &mut acts);
    let logits = acts.logits.clone();
    let e = rel_err(&logits, &f32s(&st, "logits"));
    assert!(e < 1e-4, "logits differ from Hugging Face by {e:.2e} (relative)");

    let (sum, n) = model.loss(&Tp::SOLO, &targets, &mut acts).unwrap();
    assert_eq!(n, count);
    let loss = sum / n as f64;
    let want = f32s(&st, "loss")[0] as f64;
    assert!(((loss - want) / want).abs() < 1e-5, "loss {loss} vs Hugging Face {want}");

    let mut grads = vec![0f32; model.layout.total];
    let mut store = Whole::new(&model.units, &params, &mut grads);
    let from = Output::Loss { targets: &targets, scale: 1.0 / count as f32 };
    model.backward(&mut Pass::new(&Tp::SOLO, &mut store), &ids, from, &mut acts).unwrap();
    // every parameter's gradient (scripts/make_gpt2_fixture.py saves them all)
    gradients_match(&model.layout, &grads, &st, "GPT-2");

    // A prompt longer than one attention tile: full logits, and the last position alone.
    let long = st.tensor("long_input_ids").unwrap();
    let (b, t) = (long.shape()[0], long.shape()[1]);
    assert!(t > 64);
    let ids: Vec<u32> = long.data().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32).collect();
    let want = f32s(&st, "long_logits");
    model.logits(&params, &ids, (b, t), &mut acts);
    let e = rel_err(&acts.logits, &want);
    assert!(e < 1e-4, "logits of a {t}-token prompt differ from Hugging Face by {e:.2e} (relative)");
    let last = model.forward_last(&params, &ids, b, t, &mut acts);
    let v = model.cfg.vocab_size;
    let want_last: Vec<f32> = (0..b).flat_map(|i| want[((i + 1) * t - 1) * v..][..v].to_vec()).collect();
    let e = rel_err(&last, &want_last);
    assert!(e < 1e-4, "last-position logits of a {t}-token prompt differ from Hugging Face by {e:.2e}");
}
