//! Gradient accumulation, compared on the gradient itself before any optimizer step: the
//! trainer's gradient of one global batch split into m micro-batches equals the gradient of the
//! whole batch in one pass (computed directly by the model, not by the trainer), for m = 1, 2, 4,
//! with a different number of ignored targets in every sequence.

use brigade::models::Activations;
use brigade::tensor::loss::IGNORE;
use brigade::train::{TrainConfig, Trainer};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// max |a − b| / max |b| over one parameter tensor.
fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let num = a.iter().zip(b).map(|(x, y)| (x - y).abs() as f64).fold(0.0, f64::max);
    let den = b.iter().map(|y| y.abs() as f64).fold(0.0, f64::max);
    num / den.max(1e-30)
}

#[test]
fn accumulated_gradient_equals_the_one_batch_gradient() {
    let batch = 8;
    let base = TrainConfig { batch, n_embd: Some(32), n_head: Some(4), eval_every: 0, ..TrainConfig::default() };
    let probe = Trainer::new(base.clone()).unwrap();
    let t = probe.seq;
    assert_eq!(probe.tokens_per_step(), batch * t);
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let x: Vec<u32> = (0..batch * t).map(|_| rng.gen_range(0..256)).collect();
    // Ragged: sequence i ignores its first i targets (0 … 7 of 11), so every micro-batch
    // holds a different number of counted targets.
    let y: Vec<i32> = (0..batch * t).map(|k| if k % t < k / t { IGNORE } else { rng.gen_range(0..256) }).collect();
    let count = y.iter().filter(|&&v| v != IGNORE).count();

    // Reference: the model's gradient of the batch mean, one pass over all 8 sequences.
    let model = &probe.model;
    let mut want = vec![0f32; model.layout.total];
    let mut acts = Activations::default();
    let (sum, n) =
        model.forward_backward((&probe.params, &mut want), (&x, &y), (batch, t), 1.0 / count as f32, &mut acts);
    assert_eq!(n, count);

    for m in [1, 2, 4] {
        let mut tr = Trainer::new(TrainConfig { micro_batch: Some(batch / m), ..base.clone() }).unwrap();
        assert_eq!(tr.params, probe.params, "same seed, same initial weights");
        let (loss_sum, got_count) = tr.accumulate_gradients(&x, &y).unwrap();
        assert_eq!(got_count, count);
        assert!((loss_sum - sum).abs() <= 1e-6 * sum.abs(), "m={m}: loss sum {loss_sum} vs {sum}");
        for spec in &model.layout.specs {
            let e = rel_err(spec.view.of(tr.grads()), spec.view.of(&want));
            assert!(e < 1e-6, "m={m}: gradient of {} differs from the one-batch gradient by {e:.2e}", spec.name);
        }
    }
}
