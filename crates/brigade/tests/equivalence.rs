//! The one invariant: for any layout of dp × tp ranks, ZeRO stage, sequence parallelism,
//! number of micro-batches and bucket size, the loss at every step and the final weights
//! equal the single worker's on the same global batch (relative 1e-5), and a checkpoint saved
//! under one layout resumes under another on the single worker's loss sequence.

use brigade::parallel::data::DataParallel;
use brigade::parallel::{Mesh, MeshShape, Settings};
use brigade::params::Split;
use brigade::train::{TrainConfig, Trainer};

const STEPS: usize = 5;

/// A tiny model with 8 heads (so tp = 8 splits it) and a vocabulary of 259, which no tp > 1
/// divides, so the padded vocabulary shards are exercised. The learning rate is a realistic
/// one: at 1e-2 five Adam steps move each weight by several times its initial scale with
/// sign-like steps, so the final weights mostly measure how Adam amplifies the rounding of
/// near-zero gradients (measured: 1e-5 even between micro-batch counts on one worker), not
/// the layout.
fn cfg(micro_batch: usize) -> TrainConfig {
    TrainConfig {
        steps: STEPS,
        batch: 16,
        micro_batch: Some(micro_batch),
        n_embd: Some(32),
        n_head: Some(8),
        vocab_size: Some(259),
        lr: 1e-3,
        eval_every: 0,
        ..TrainConfig::default()
    }
}

/// What a run is compared on: the loss of every step, the final weights, and the gradient norm
/// (before clipping) of each step this process took.
struct Run {
    losses: Vec<f32>,
    weights: Vec<f32>,
    norms: Vec<(usize, f32)>,
}

fn norms(tr: &Trainer) -> Vec<(usize, f32)> {
    tr.history.iter().map(|s| (s.step, s.grad_norm)).collect()
}

fn single_worker() -> Run {
    let mut tr = Trainer::new(cfg(16)).unwrap();
    while !tr.done() {
        tr.train_step().unwrap();
    }
    Run { losses: tr.losses.clone(), weights: tr.params.clone(), norms: norms(&tr) }
}

/// One layout of the matrix.
#[derive(Clone, Copy, Debug)]
struct Case {
    dp: usize,
    tp: usize,
    zero: u8,
    sp: bool,
    mb: usize,
    bucket: usize,
}

impl Case {
    fn settings(&self) -> Settings {
        Settings { data: DataParallel { zero: self.zero, bucket_elems: self.bucket }, sp: self.sp }
    }
}

/// Runs every rank of the case's mesh until step `until` (optionally resuming `from`),
/// optionally saving to `to`; returns the losses and the full weights, after checking that
/// every rank agrees: replicas hold the same slices, replicated parameters are bitwise equal
/// across each tensor-parallel group, and every rank gathers the same full model.
fn run(c: Case, from: Option<&std::path::Path>, to: Option<&std::path::Path>, until: usize) -> Run {
    let shape = MeshShape::new(c.dp, 1, c.tp).unwrap();
    let out = brigade_comm::local::run(shape.world(), |world| {
        let mesh = Mesh::new(&world, shape)?;
        let mut tr = match from {
            Some(dir) => Trainer::resume_on(dir, None, mesh, c.settings())?,
            None => Trainer::on_mesh(cfg(c.mb), mesh, c.settings())?,
        };
        // each rank runs on one thread, as a worker of a real run would
        brigade::with_threads(1, || -> brigade::Result<()> {
            while tr.step < until {
                tr.train_step()?;
            }
            Ok(())
        })??;
        if let Some(dir) = to {
            tr.save(dir)?;
        }
        let local = tr.local_params()?.into_owned();
        let full = tr.full_params()?.unwrap_or_else(|| local.clone());
        Ok::<_, brigade::Error>((tr.losses.clone(), full, local, tr.model.layout.clone(), norms(&tr)))
    })
    .unwrap();
    for (r, o) in out.iter().enumerate() {
        assert_eq!(o.0, out[0].0, "{c:?}: rank {r}'s losses differ from rank 0's");
        assert_eq!(o.1, out[0].1, "{c:?}: rank {r}'s full weights differ from rank 0's");
        let same_slice = &out[r % c.tp];
        assert_eq!(o.2, same_slice.2, "{c:?}: rank {r} and its replica {} hold different slices", r % c.tp);
        for s in o.3.specs.iter().filter(|s| s.split == Split::Replicated) {
            assert_eq!(s.view.of(&o.2), s.view.of(&out[0].2), "{c:?}: replicated {} differs on rank {r}", s.name);
        }
    }
    let (losses, weights, _, _, norms) = out.into_iter().next().unwrap();
    Run { losses, weights, norms }
}

/// ‖a − b‖ / ‖b‖ over one parameter tensor. Adam divides each gradient by its own running
/// magnitude, so a coordinate whose gradient is a near-total cancellation (relative rounding
/// error far above f32's) moves by a visibly different step under another summation order;
/// the tensor as a whole agrees to rounding.
fn rel(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-60)).sqrt()
}

fn assert_equivalent(what: &str, got: &Run, want: &Run) {
    assert_eq!(got.losses.len(), want.losses.len(), "{what}: steps");
    for (s, (g, w)) in got.losses.iter().zip(&want.losses).enumerate() {
        let e = ((g - w) / w).abs();
        assert!(e < 1e-5, "{what}: loss at step {} is {g}, single worker {w} ({e:.1e})", s + 1);
    }
    // the global gradient norm (what clipping scales by), from shards, slices and replicas
    assert!(!got.norms.is_empty(), "{what}: no steps taken");
    for &(step, g) in &got.norms {
        let w = want.norms[step - 1].1;
        let e = ((g - w) / w).abs();
        assert!(e < 1e-5, "{what}: gradient norm at step {step} is {g}, single worker {w} ({e:.1e})");
    }
    let model = Trainer::new(cfg(16)).unwrap().model;
    let mut worst = (0f64, String::new());
    for spec in &model.layout.specs {
        let e = rel(spec.view.of(&got.weights), spec.view.of(&want.weights));
        if e > worst.0 {
            worst = (e, spec.name.clone());
        }
    }
    println!("{what}: worst weight error {:.2e} ({})", worst.0, worst.1);
    assert!(worst.0 < 1e-5, "{what}: {} differs from the single worker by {:.2e}", worst.1, worst.0);
}

const SMALL: usize = 1000; // splits every layer's matrices over several buckets
const BIG: usize = 25_000_000 / 4; // the whole model in one bucket

/// Every factorisation of 1, 2, 4 and 8 ranks into (dp, tp); each dp > 1 meets every ZeRO
/// stage, ZeRO-2 and -3 meet tp and sp, each tp > 1 meets sp on and off, micro-batches per
/// rank from 1 to 8, both bucket regimes.
#[rustfmt::skip]
const MATRIX: &[Case] = &[
    Case { dp: 1, tp: 1, zero: 0, sp: false, mb: 16, bucket: BIG },
    Case { dp: 1, tp: 1, zero: 1, sp: false, mb: 4, bucket: SMALL },
    Case { dp: 1, tp: 1, zero: 3, sp: false, mb: 8, bucket: BIG },
    Case { dp: 2, tp: 1, zero: 1, sp: false, mb: 2, bucket: SMALL },
    Case { dp: 2, tp: 1, zero: 0, sp: false, mb: 4, bucket: 7919 },
    Case { dp: 2, tp: 1, zero: 2, sp: false, mb: 4, bucket: BIG },
    Case { dp: 2, tp: 1, zero: 3, sp: false, mb: 2, bucket: SMALL },
    Case { dp: 1, tp: 2, zero: 0, sp: false, mb: 16, bucket: BIG },
    Case { dp: 1, tp: 2, zero: 1, sp: true, mb: 4, bucket: SMALL },
    Case { dp: 4, tp: 1, zero: 0, sp: false, mb: 1, bucket: SMALL },
    Case { dp: 4, tp: 1, zero: 1, sp: false, mb: 4, bucket: BIG },
    Case { dp: 4, tp: 1, zero: 3, sp: false, mb: 1, bucket: BIG },
    Case { dp: 2, tp: 2, zero: 1, sp: true, mb: 2, bucket: 7919 },
    Case { dp: 2, tp: 2, zero: 0, sp: false, mb: 4, bucket: SMALL },
    Case { dp: 2, tp: 2, zero: 2, sp: true, mb: 2, bucket: SMALL },
    Case { dp: 2, tp: 2, zero: 3, sp: false, mb: 8, bucket: BIG },
    Case { dp: 1, tp: 4, zero: 0, sp: false, mb: 8, bucket: BIG },
    Case { dp: 1, tp: 4, zero: 0, sp: true, mb: 2, bucket: SMALL },
    Case { dp: 8, tp: 1, zero: 1, sp: false, mb: 2, bucket: BIG },
    Case { dp: 8, tp: 1, zero: 0, sp: false, mb: 1, bucket: SMALL },
    Case { dp: 8, tp: 1, zero: 2, sp: false, mb: 1, bucket: BIG },
    Case { dp: 8, tp: 1, zero: 3, sp: false, mb: 2, bucket: SMALL },
    Case { dp: 4, tp: 2, zero: 0, sp: true, mb: 2, bucket: SMALL },
    Case { dp: 4, tp: 2, zero: 1, sp: false, mb: 1, bucket: BIG },
    Case { dp: 4, tp: 2, zero: 3, sp: true, mb: 2, bucket: BIG },
    Case { dp: 2, tp: 4, zero: 1, sp: false, mb: 4, bucket: BIG },
    Case { dp: 2, tp: 4, zero: 0, sp: true, mb: 2, bucket: 7919 },
    Case { dp: 2, tp: 4, zero: 2, sp: false, mb: 2, bucket: SMALL },
    Case { dp: 1, tp: 8, zero: 0, sp: true, mb: 4, bucket: BIG },
    Case { dp: 1, tp: 8, zero: 1, sp: false, mb: 2, bucket: SMALL },
];

#[test]
fn every_layout_equals_the_single_worker() {
    let want = single_worker();
    for &c in MATRIX {
        let got = run(c, None, None, STEPS);
        assert_equivalent(&format!("{c:?}"), &got, &want);
    }
}

#[test]
fn a_checkpoint_resumes_under_another_layout() {
    let want = single_worker();
    let d = tempfile::tempdir().unwrap();
    let ck = d.path().join("ck");
    let from = Case { dp: 2, tp: 2, zero: 1, sp: true, mb: 2, bucket: SMALL };
    run(from, None, Some(&ck), 3);
    for to in [
        Case { dp: 1, tp: 4, zero: 0, sp: false, mb: 4, bucket: BIG },
        Case { dp: 4, tp: 1, zero: 1, sp: false, mb: 2, bucket: SMALL },
        Case { dp: 2, tp: 2, zero: 1, sp: false, mb: 8, bucket: 7919 },
        Case { dp: 4, tp: 1, zero: 3, sp: false, mb: 4, bucket: BIG },
        Case { dp: 2, tp: 2, zero: 2, sp: true, mb: 2, bucket: SMALL },
    ] {
        let got = run(to, Some(&ck), None, STEPS);
        assert_equivalent(&format!("{from:?} → {to:?}"), &got, &want);
    }
    // and the single worker resumes it too
    let mut tr = Trainer::resume(&ck, None).unwrap();
    while !tr.done() {
        tr.train_step().unwrap();
    }
    let got = Run { losses: tr.losses.clone(), weights: tr.params.clone(), norms: norms(&tr) };
    assert_equivalent("→ single worker", &got, &want);
}

/// Every rank of a `shape` mesh builds a trainer for `c`; the first rank's result.
fn build(shape: MeshShape, c: TrainConfig, settings: Settings) -> Result<usize, String> {
    brigade_comm::local::run(shape.world(), |world| {
        Trainer::on_world(c.clone(), &world, shape, settings).map(|t| t.micro_batch())
    })
    .map(|v| v[0])
    .map_err(|e| e.failures[0].1.clone())
}

#[test]
fn an_unset_micro_batch_is_the_rank_share_and_impossible_layouts_are_refused() {
    let unset = TrainConfig { micro_batch: None, ..cfg(1) };
    let plain = Settings::default();
    let shape = |dp, pp, tp| MeshShape::new(dp, pp, tp).unwrap();
    assert_eq!(build(shape(2, 1, 1), unset.clone(), plain), Ok(8));
    assert_eq!(build(shape(4, 1, 1), unset.clone(), plain), Ok(4));
    assert_eq!(build(shape(2, 1, 2), unset.clone(), plain), Ok(8), "tp ranks share their data shard");
    let e = build(shape(3, 1, 1), unset.clone(), plain).unwrap_err();
    assert!(e.contains("does not split into dp=3 shards"), "{e}");
    let e = build(shape(2, 1, 1), TrainConfig { micro_batch: Some(3), ..cfg(1) }, plain).unwrap_err();
    assert!(e.contains("multiple of micro_batch (3)"), "{e}");
    let e = build(shape(1, 1, 3), unset.clone(), plain).unwrap_err();
    assert!(e.contains("tp=3 does not divide the model's 8 attention heads; use tp among 1, 2, 4, 8"), "{e}");
    let e = build(shape(1, 2, 1), unset.clone(), plain).unwrap_err();
    assert!(e.contains("pp=2: pipeline parallelism is not implemented yet"), "{e}");
    // sequence parallelism cuts a micro-batch's 1 × 12 tokens into 8 blocks: it does not divide
    let sp = Settings { sp: true, ..plain };
    let e = build(shape(1, 1, 8), TrainConfig { micro_batch: Some(1), ..cfg(1) }, sp).unwrap_err();
    assert!(e.contains("into tp=8 blocks of rows, which does not divide"), "{e}");
    assert_eq!(build(shape(1, 1, 8), TrainConfig { micro_batch: Some(2), ..cfg(1) }, sp), Ok(2));
    let e = brigade::parallel::training_layout("dp=2,sp=1", 1).unwrap_err().to_string();
    assert!(e.contains("has tp=1"), "{e}");
    assert!(DataParallel { zero: 3, ..DataParallel::default() }.validate().is_ok());
    assert!(DataParallel { zero: 4, ..DataParallel::default() }.validate().is_err());
    assert!(DataParallel { bucket_elems: 0, ..DataParallel::default() }.validate().is_err());
}
