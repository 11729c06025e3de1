//! An interrupted-and-resumed run computes bit-for-bit what an uninterrupted one does.

use brigade::train::{TrainConfig, Trainer};

fn cfg(data: Option<std::path::PathBuf>) -> TrainConfig {
    TrainConfig {
        steps: 14,
        batch: 8,
        micro_batch: Some(4),
        n_embd: Some(32),
        eval_every: 0,
        seq: data.as_ref().map(|_| 24),
        data,
        ..TrainConfig::default()
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn check_resume(c: TrainConfig) {
    let mut full = Trainer::new(c.clone()).unwrap();
    while !full.done() {
        full.train_step().unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let mut first = Trainer::new(c).unwrap();
    for _ in 0..5 {
        first.train_step().unwrap();
    }
    first.save(&ck).unwrap();
    drop(first);
    // --steps may extend the run or keep its length, never cut it below what was done
    assert!(Trainer::resume(&ck, Some(4)).is_err(), "resumed at step 5 of a 4-step run");
    assert_eq!(Trainer::resume(&ck, Some(5)).unwrap().step, 5);
    let mut second = Trainer::resume(&ck, None).unwrap();
    assert_eq!(second.step, 5);
    while !second.done() {
        second.train_step().unwrap();
    }
    assert_eq!(second.losses.len(), 14);
    assert_eq!(bits(&full.losses), bits(&second.losses), "loss sequences differ");
    assert_eq!(bits(&full.params), bits(&second.params), "final weights differ");
    // and the losses moved: the run really trained
    assert!(full.losses[13] < full.losses[0]);
}

#[test]
fn resumed_addition_run_is_bit_identical() {
    check_resume(cfg(None));
}

#[test]
fn resumed_text_run_is_bit_identical() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("text.txt");
    let text: String = (0..400).map(|i| format!("line {i}: the quick brown fox jumps over the lazy dog.\n")).collect();
    std::fs::write(&f, text).unwrap();
    check_resume(cfg(Some(f)));
}

#[test]
fn failed_checkpoint_write_keeps_the_previous_one() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let mut tr = Trainer::new(cfg(None)).unwrap();
    tr.train_step().unwrap();
    tr.save(&ck).unwrap();
    let before = std::fs::read(ck.join("model.safetensors")).unwrap();
    let err = brigade::models::checkpoint::write_atomically(&ck, |tmp| {
        std::fs::write(tmp.join("model.safetensors"), b"half").unwrap();
        Err(brigade::Error::Train("simulated crash".into()))
    });
    assert!(err.is_err());
    assert_eq!(std::fs::read(ck.join("model.safetensors")).unwrap(), before);
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 1, "temporary directories left behind: {names:?}");
}

#[test]
fn checkpoint_round_trips_weights_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let mut tr = Trainer::new(cfg(None)).unwrap();
    tr.train_step().unwrap();
    tr.save(&ck).unwrap();
    let (model, params) = brigade::models::checkpoint::load_model(&ck).unwrap();
    assert_eq!(model.cfg, tr.model.cfg);
    assert_eq!(bits(&params), bits(&tr.params));
}

#[test]
fn micro_batches_sum_to_the_full_batch_gradient() {
    // Same run with 1 and 4 micro-batches: the mean-over-tokens loss is the same function.
    let mut a = Trainer::new(TrainConfig { micro_batch: Some(8), ..cfg(None) }).unwrap();
    let mut b = Trainer::new(TrainConfig { micro_batch: Some(2), ..cfg(None) }).unwrap();
    for _ in 0..3 {
        let (la, lb) = (a.train_step().unwrap().loss, b.train_step().unwrap().loss);
        assert!(((la - lb) / la).abs() < 1e-5, "{la} vs {lb}");
    }
    let worst = a.params.iter().zip(&b.params).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(worst < 1e-5, "weights differ by {worst}");
}

#[test]
fn example_config_parses_and_validates() {
    let text = std::fs::read_to_string("../../examples/run.toml").unwrap();
    let c = TrainConfig::from_toml(&text, "examples/run.toml").unwrap();
    c.validate().unwrap();
    assert_eq!(c.micro_batch(), 32);
    assert!(TrainConfig::from_toml("steps = -3", "inline").is_err());
}
