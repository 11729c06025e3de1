//! What a periodic checkpoint costs the training it interrupts: the same job run without
//! saves, with each save written in the foreground (the step waits for the files), and with
//! each written in the background (the step waits for the state's copy), side by side.

use super::median;
use crate::error::Result;
use crate::train::run::{run, JobOptions, Outcome, Quiet, SaveEvery};
use crate::train::{TrainConfig, Trainer};
use serde::Serialize;
use std::path::Path;
use std::sync::atomic::AtomicBool;

/// One way of saving, over the job's steps.
#[derive(Clone, Debug, Serialize)]
pub struct SaveMode {
    /// `none`, `foreground` or `background`.
    pub mode: &'static str,
    pub steps: usize,
    /// The job's seconds over its steps (the final checkpoint left out).
    pub job_s: f64,
    /// Median seconds a step waited for a periodic save.
    pub stall_s: f64,
    /// Median seconds the files took to write.
    pub write_s: f64,
    /// Median CPU seconds of the writing.
    pub write_cpu_s: f64,
    /// Seconds the job took longer than without saves, per save.
    pub cost_per_save_s: f64,
    /// Each periodic save's wait and write, in order (the first one allocates the copy).
    pub stalls_s: Vec<f64>,
    pub writes_s: Vec<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct CheckpointBench {
    pub params: usize,
    /// Bytes of one checkpoint (weights and moments).
    pub bytes: u64,
    pub saves: usize,
    pub modes: Vec<SaveMode>,
}

/// Runs `cfg` for `saves + 1` steps three times (no saves; a save after each of the first
/// `saves` steps in the foreground; the same in the background), each checkpoint to a
/// directory under `dir`.
pub fn save_stall(cfg: TrainConfig, saves: usize, dir: &Path) -> Result<CheckpointBench> {
    let world = brigade_comm::local::solo();
    let never = AtomicBool::new(false);
    let steps = saves + 1;
    let cfg = TrainConfig { steps, eval_every: 0, ..cfg };
    let mut modes: Vec<SaveMode> = Vec::new();
    let (mut params, mut bytes) = (0, 0);
    for (mode, out) in [("none", None), ("foreground", Some(true)), ("background", Some(false))] {
        let ck = dir.join(format!("ck-{mode}"));
        let opts = JobOptions {
            out: out.map(|_| ck.clone()),
            save_every: out.map(|_| SaveEvery::Steps(1)),
            save_in_foreground: out == Some(true),
            ..JobOptions::default()
        };
        let mut tr = Trainer::new(cfg.clone())?;
        params = tr.model.num_params();
        let Outcome::Finished(r) = run(&mut tr, &opts, &never, &world, &mut Quiet)? else {
            unreachable!("nothing stops the job")
        };
        let periodic = &r.saves[..r.saves.len().saturating_sub(1)];
        let stall = median(&periodic.iter().map(|s| s.stall_s).collect::<Vec<_>>());
        let write = median(&periodic.iter().filter_map(|s| s.write_s).collect::<Vec<_>>());
        let cpu = median(&periodic.iter().filter_map(|s| s.write_cpu_s).collect::<Vec<_>>());
        if out.is_some() {
            bytes = ["model.safetensors", "optimizer.safetensors"]
                .iter()
                .map(|f| std::fs::metadata(ck.join(f)).map_or(0, |m| m.len()))
                .sum();
        }
        let base = modes.first().map_or(r.secs, |m| m.job_s);
        modes.push(SaveMode {
            mode,
            steps: r.steps,
            job_s: r.secs,
            stall_s: if out.is_some() { stall } else { 0.0 },
            write_s: if out.is_some() { write } else { 0.0 },
            write_cpu_s: if out.is_some() { cpu } else { 0.0 },
            cost_per_save_s: if out.is_some() { (r.secs - base) / saves as f64 } else { 0.0 },
            stalls_s: periodic.iter().map(|s| s.stall_s).collect(),
            writes_s: periodic.iter().filter_map(|s| s.write_s).collect(),
        });
        let _ = std::fs::remove_dir_all(&ck);
    }
    Ok(CheckpointBench { params, bytes, saves, modes })
}
