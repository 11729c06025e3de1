//! Elastic resumption: when a run has lost ranks, the layout it resumes on. Any layout reads
//! any checkpoint, so the planner is free to pick: of the layouts of the remaining world that
//! keep the run's global batch (and its micro-batch, when the run fixed one), the fastest the
//! cost model predicts on the given accelerator that fits and that the trainer accepts.

use super::catalog::{Accelerator, ModelShape};
use super::cost::{Estimate, Precision, Training};
use super::search::rank_all;
use crate::error::{Error, Result};
use crate::layout::{Layout, Spec};
use crate::train::{TrainConfig, Trainer};

/// The layout of `world` ranks a run of `cfg` resumes on, with the planner's estimate of it.
pub fn relayout(cfg: &TrainConfig, world: usize, acc: &Accelerator) -> Result<Estimate> {
    if world == 0 {
        return Err(Error::Config("no ranks left to resume on".into()));
    }
    let (mcfg, seq) = Trainer::check_layout(cfg, &Layout::default())?;
    let shape = ModelShape::of(&mcfg, seq);
    // brigade trains in f32 with its own attention kernel
    let t =
        Training { global_batch: cfg.batch, flash_attention: false, precision: Precision::Fp32, ..Training::default() };
    let fixed = Spec { mb: cfg.micro_batch, ..Spec::default() };
    // fastest first: the first that fits and that the trainer takes is the pick
    let mut why = None;
    for e in rank_all(&shape, acc, world, &t, &fixed) {
        match Trainer::check_layout(cfg, &e.layout) {
            Ok(_) if e.fits => return Ok(e),
            Ok(_) => why = why.or(Some(format!("{} needs {:.1} GiB per rank", e.layout, e.memory_gib_per_gpu))),
            Err(err) => why = why.or(Some(format!("{}: {err}", e.layout))),
        }
    }
    Err(Error::Config(format!(
        "no layout of {world} ranks can train this run with its global batch of {} ({}); resume on another number of ranks",
        cfg.batch,
        why.unwrap_or_else(|| format!("dp must divide the batch, tp the {} heads, pp the {} layers", mcfg.n_head, mcfg.n_layer))
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> TrainConfig {
        TrainConfig {
            model: "tiny".into(),
            n_layer: Some(2),
            n_head: Some(2),
            n_embd: Some(32),
            batch: 6,
            steps: 4,
            ..TrainConfig::default()
        }
    }

    #[test]
    fn the_pick_has_the_world_and_the_batch_and_is_the_fastest_the_trainer_takes() {
        let acc = super::super::catalog::accelerator("h100-sxm").unwrap();
        let cfg = tiny();
        let t = Training { global_batch: 6, flash_attention: false, precision: Precision::Fp32, ..Training::default() };
        let (m, seq) = Trainer::check_layout(&cfg, &Layout::default()).unwrap();
        let shape = ModelShape::of(&m, seq);
        for world in 1..=6 {
            let all = rank_all(&shape, &acc, world, &t, &Spec::default());
            let Ok(e) = relayout(&cfg, world, &acc) else {
                // a world no layout can train: none of its layouts is accepted
                assert!(all.iter().all(|e| Trainer::check_layout(&cfg, &e.layout).is_err()), "world {world}");
                continue;
            };
            assert_eq!(e.layout.world(), world);
            assert!(e.fits);
            Trainer::check_layout(&cfg, &e.layout).unwrap();
            // estimated as brigade trains (f32, its own attention), not at the planner's defaults
            let same = all.iter().find(|o| o.layout == e.layout).expect("the pick is one of the world's layouts");
            assert_eq!((e.step_time_s, e.memory_gib_per_gpu), (same.step_time_s, same.memory_gib_per_gpu));
            // no accepted, fitting layout of the world is predicted faster
            for o in all {
                if o.fits && Trainer::check_layout(&cfg, &o.layout).is_ok() {
                    assert!(o.step_time_s >= e.step_time_s, "{} beats the pick {}", o.layout, e.layout);
                }
            }
        }
    }

    #[test]
    fn a_world_that_cannot_split_the_batch_is_refused_naming_it() {
        let acc = super::super::catalog::accelerator("h100-sxm").unwrap();
        // 5 ranks: dp=5 does not divide 6, tp=5 not the 2 heads, pp=5 not 2 layers
        let err = relayout(&tiny(), 5, &acc).unwrap_err().to_string();
        assert!(err.contains("no layout of 5 ranks"), "{err}");
        assert!(relayout(&tiny(), 0, &acc).is_err());
    }

    #[test]
    fn a_fixed_micro_batch_is_kept() {
        let acc = super::super::catalog::accelerator("h100-sxm").unwrap();
        let cfg = TrainConfig { micro_batch: Some(1), ..tiny() };
        let e = relayout(&cfg, 3, &acc).unwrap();
        assert_eq!(e.layout.mb, Some(1));
    }
}
