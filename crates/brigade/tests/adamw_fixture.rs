//! The whole optimizer step against PyTorch (fixture made by scripts/make_adamw_fixture.py):
//! `torch.optim.AdamW` with decay on matrices and embeddings only, `clip_grad_norm_` (clipping
//! on some steps, not on others), warmup + cosine learning rate and two micro-batches per step
//! with ragged ignored targets. From the same weights and batches, brigade's trainer must give
//! the same learning rate, gradient norm, loss and weights after every one of six steps.

use brigade::models::checkpoint::load_model;
use brigade::tensor::loss::IGNORE;
use brigade::train::optimizer::AdamWConfig;
use brigade::train::{TrainConfig, Trainer};
use safetensors::SafeTensors;
use std::path::Path;

const DIR: &str = "tests/fixtures/adamw_hf";

fn tensor<'a>(st: &'a SafeTensors, name: &str) -> safetensors::tensor::TensorView<'a> {
    st.tensor(name).unwrap_or_else(|_| panic!("fixture lacks {name}"))
}
fn f32s(st: &SafeTensors, name: &str) -> Vec<f32> {
    tensor(st, name).data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}
fn f64_scalar(st: &SafeTensors, name: &str) -> f64 {
    f64::from_le_bytes(tensor(st, name).data()[..8].try_into().unwrap())
}
fn i64s(st: &SafeTensors, name: &str) -> Vec<i64> {
    tensor(st, name).data().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect()
}

#[test]
fn trainer_matches_torch_adamw_step_by_step() {
    let dir = Path::new(DIR);
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("settings.json")).unwrap()).unwrap();
    let num = |k: &str| s[k].as_f64().unwrap_or_else(|| panic!("settings.json lacks {k}"));
    let (hf_model, hf_params) = load_model(dir).unwrap();
    let m = hf_model.cfg;
    let cfg = TrainConfig {
        n_layer: Some(m.n_layer),
        n_head: Some(m.n_head),
        n_embd: Some(m.n_embd),
        vocab_size: Some(m.vocab_size),
        block_size: Some(m.block_size),
        steps: num("steps") as usize,
        batch: num("batch") as usize,
        micro_batch: Some(num("micro_batch") as usize),
        lr: num("lr") as f32,
        min_lr: Some(num("min_lr") as f32),
        warmup: Some(num("warmup") as usize),
        grad_clip: num("grad_clip") as f32,
        adamw: AdamWConfig {
            beta1: num("beta1") as f32,
            beta2: num("beta2") as f32,
            eps: num("eps") as f32,
            weight_decay: num("weight_decay") as f32,
        },
        eval_every: 0,
        ..TrainConfig::default()
    };
    let mut tr = Trainer::new(cfg.clone()).unwrap();
    assert_eq!(tr.model.cfg, m);
    tr.params = hf_params;

    let bytes = std::fs::read(dir.join("expected.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut clipped = 0;
    let mut worst = 0f64;
    for step in 0..cfg.steps {
        let x: Vec<u32> = i64s(&st, &format!("step{step}.x")).iter().map(|&v| v as u32).collect();
        let y: Vec<i32> =
            i64s(&st, &format!("step{step}.y")).iter().map(|&v| if v == -100 { IGNORE } else { v as i32 }).collect();
        let stats = tr.step_on(&x, &y).unwrap();

        let lr = f64_scalar(&st, &format!("step{step}.lr"));
        let e = (stats.lr as f64 - lr).abs() / lr;
        assert!(e < 1e-6, "step {step}: lr {} vs torch {lr} ({e:.1e})", stats.lr);
        let norm = f64_scalar(&st, &format!("step{step}.grad_norm"));
        let e = (stats.grad_norm as f64 - norm).abs() / norm;
        assert!(e < 1e-5, "step {step}: gradient norm {} vs torch {norm} ({e:.1e})", stats.grad_norm);
        clipped += (norm > cfg.grad_clip as f64) as usize;
        let loss = f64_scalar(&st, &format!("step{step}.loss"));
        let e = (stats.loss as f64 - loss).abs() / loss;
        assert!(e < 1e-5, "step {step}: loss {} vs torch {loss} ({e:.1e})", stats.loss);

        for spec in &tr.model.layout.specs {
            let want = f32s(&st, &format!("step{step}.{}", spec.name));
            let got = spec.view.of(&tr.params);
            let num = got.iter().zip(&want).map(|(a, b)| (a - b).abs() as f64).fold(0.0, f64::max);
            let den = want.iter().map(|b| b.abs() as f64).fold(0.0, f64::max);
            worst = worst.max(num / den);
            assert!(num / den < 1e-5, "step {step}: {} differs from torch by {:.2e} (relative)", spec.name, num / den);
        }
    }
    println!("worst relative weight error over {} steps: {worst:.2e}", cfg.steps);
    assert!(clipped > 0 && clipped < cfg.steps, "the fixture must clip on some steps only ({clipped} clipped)");
}

/// The learning-rate schedule against torchtitan's own (`LRSchedulersContainer`, warmup +
/// cosine, driving a torch optimizer: `scripts/make_lr_schedule_fixture.py`), every step of
/// runs that reach each regime — no warmup, one step of it, warmup filling the whole run, the
/// 5% default (0 below 20 steps), a floor of 0 and the lr / 10 default.
#[test]
fn lr_schedule_matches_torchtitan() {
    use brigade::train::optimizer::LrSchedule;
    let text = std::fs::read_to_string("tests/fixtures/lr_schedule.json").unwrap();
    let f: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cases = f["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 11, "the fixture's cases");
    for c in cases {
        let cfg = TrainConfig {
            steps: c["steps"].as_u64().unwrap() as usize,
            lr: c["lr"].as_f64().unwrap() as f32,
            min_lr: c["min_lr"].as_f64().map(|v| v as f32),
            warmup: c["warmup"].as_u64().map(|v| v as usize),
            ..TrainConfig::default()
        };
        let sched = LrSchedule::of(&cfg);
        let want: Vec<f64> = c["lrs"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        assert_eq!(want.len(), cfg.steps);
        for (step, &w) in want.iter().enumerate() {
            let got = sched.at(step) as f64;
            let e = (got - w).abs() / w;
            assert!(e < 1e-6, "{} steps, warmup {:?}: step {step} at {got}, torchtitan {w}", cfg.steps, cfg.warmup);
        }
    }
}
