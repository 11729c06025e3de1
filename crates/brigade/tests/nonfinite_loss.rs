//! A non-finite loss says what most likely caused it, not always "lower --lr".

use brigade::train::{TrainConfig, Trainer};

fn cfg(lr: f32) -> TrainConfig {
    TrainConfig { steps: 50, batch: 8, n_embd: Some(32), lr, grad_clip: 0.0, eval_every: 0, ..TrainConfig::default() }
}

#[test]
fn corrupt_weights_are_blamed_before_any_update() {
    let mut tr = Trainer::new(cfg(1e-3)).unwrap();
    let spec = tr.model.layout.get("h.1.mlp.c_fc.weight").unwrap().view;
    spec.of_mut(&mut tr.params)[3] = f32::NAN;
    let e = tr.train_step().unwrap_err().to_string();
    assert!(e.contains("before any update") && e.contains("h.1.mlp.c_fc.weight") && !e.contains("--lr"), "{e}");
}

#[test]
fn a_diverging_run_is_told_to_lower_the_learning_rate() {
    let mut tr = Trainer::new(cfg(1e12)).unwrap();
    let e = loop {
        match tr.train_step() {
            Ok(_) if tr.done() => panic!("lr 1e12 trained 50 steps without a non-finite loss"),
            Ok(_) => {}
            Err(e) => break e.to_string(),
        }
    };
    assert!(e.contains("lower --lr") && !e.contains("before any update"), "{e}");
}
