//! The training job, as `brigade train` runs it on every rank: steps until the run is done or
//! asked to stop, evaluation and checkpoints at their cadence, the ranks' agreement to stop
//! after the same step, a checkpoint on the way out, each rank's times, the timeline, and the
//! final evaluation. An [`Observer`] hears the progress; the caller prints.

use super::evaluate::EvalReport;
use super::metrics::{Part, StepStats};
use super::trainer::Trainer;
use crate::error::{Error, Result};
use brigade_comm::{Comm, ReduceOp};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// What the job does beside stepping.
#[derive(Clone, Debug, Default)]
pub struct JobOptions {
    /// Where checkpoints go (the last one when the job ends or is stopped).
    pub out: Option<PathBuf>,
    /// A checkpoint every this many steps (needs `out`).
    pub save_every: Option<usize>,
    /// Stop after this step, as if asked to (for tests of an interrupted run).
    pub stop_after: Option<usize>,
    /// Write every rank's Chrome trace-event timeline here (the trainer must record one).
    pub trace: Option<PathBuf>,
}

/// Told what happens, to show progress (rank 0's; the other ranks get [`Quiet`]).
pub trait Observer {
    /// The job starts at the trainer's current step.
    fn start(&mut self, _tr: &Trainer) {}
    /// A step was taken; `tokens_per_s` over the steps of this job so far.
    fn step(&mut self, _s: &StepStats, _tokens_per_s: f64) {}
    /// The periodic evaluation after `step` (rank 0 only).
    fn evaluated(&mut self, _s: &StepStats, _report: &EvalReport) {}
    /// The steps are over (finished or stopped): before the summary.
    fn stepped(&mut self) {}
}

/// Hears nothing.
pub struct Quiet;
impl Observer for Quiet {}

/// One rank's seconds over this job's steps, and its mean pipeline bubble.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RankTimes {
    /// Forward and backward.
    pub compute_s: f64,
    /// Gradient norm, clipping, AdamW.
    pub optimizer_s: f64,
    /// Exposed communication, every group.
    pub comm_s: f64,
    /// Waiting for another pipeline stage.
    pub wait_s: f64,
    pub idle_s: f64,
    pub bubble: f64,
}

/// How the job ended, on rank 0 (the other ranks get the same outcome without the report's
/// rank-0-only parts).
#[derive(Debug)]
pub enum Outcome {
    /// The steps the job was asked for were taken.
    Finished(Box<JobReport>),
    /// A rank was asked to stop (SIGINT, SIGTERM) before the run was done; the checkpoint
    /// written on the way out, if the job had somewhere to write it.
    Interrupted { step: usize, steps: usize, saved: Option<PathBuf> },
}

impl Outcome {
    /// The message a person reads when the job was stopped.
    pub fn interrupted_message(&self) -> Option<String> {
        match self {
            Outcome::Finished(_) => None,
            Outcome::Interrupted { step, steps, saved: Some(dir) } => Some(format!(
                "interrupted after step {step} of {steps}; checkpoint written to {}: continue with --resume {}",
                dir.display(),
                dir.display()
            )),
            Outcome::Interrupted { step, steps, saved: None } => {
                Some(format!("interrupted after step {step} of {steps}; nothing saved (no --out)"))
            }
        }
    }
}

#[derive(Debug)]
pub struct JobReport {
    /// Steps taken by this job, their seconds and tokens per second.
    pub steps: usize,
    pub secs: f64,
    pub tokens_per_s: f64,
    pub final_loss: f32,
    /// Where the final checkpoint went.
    pub saved: Option<PathBuf>,
    /// Every rank's times, by rank.
    pub ranks: Vec<RankTimes>,
    /// With a pipeline: the bubble measured (mean over ranks) and the schedule's on paper.
    pub bubble: Option<(f64, f64)>,
    /// Where the timeline was written, and its spans.
    pub trace: Option<(PathBuf, usize)>,
    /// The final evaluation and, for a text run, a sample from the validation text's start
    /// (rank 0, when the run reached its last step).
    pub eval: Option<EvalReport>,
    pub sample: Option<String>,
}

/// Whether any rank was asked to stop: every rank must stop after the same step.
fn any_rank_stopping(world: &Comm, stop: &AtomicBool) -> Result<bool> {
    let mut v = [stop.load(Ordering::Relaxed) as u8 as f32];
    if world.size() > 1 {
        world.all_reduce(&mut v, ReduceOp::Max).map_err(comm_err)?;
    }
    Ok(v[0] > 0.0)
}

fn comm_err(e: brigade_comm::CommError) -> Error {
    Error::Train(format!("the training job's communication failed: {e}"))
}

/// Every rank's times over the steps after `start`, gathered on every rank.
fn rank_times(tr: &Trainer, start: usize, world: &Comm) -> Result<Vec<RankTimes>> {
    const N: usize = 6;
    let mut mine = [0f32; N];
    let taken: Vec<&StepStats> = tr.history.iter().filter(|s| s.step > start).collect();
    let steps = taken.len().max(1);
    for s in taken {
        mine[0] += s.compute_s as f32;
        mine[1] += s.optimizer_s as f32;
        mine[2] += s.comm_s as f32;
        mine[3] += s.pipeline_wait_s as f32;
        mine[4] += s.idle_s as f32;
        mine[5] += s.bubble as f32 / steps as f32;
    }
    let mut all = vec![0f32; N * world.size()];
    if world.size() > 1 {
        world.all_gather(&mine, &mut all).map_err(comm_err)?;
    } else {
        all.copy_from_slice(&mine);
    }
    Ok(all
        .chunks_exact(N)
        .map(|c| RankTimes {
            compute_s: c[0] as f64,
            optimizer_s: c[1] as f64,
            comm_s: c[2] as f64,
            wait_s: c[3] as f64,
            idle_s: c[4] as f64,
            bubble: c[5] as f64,
        })
        .collect())
}

fn save(tr: &mut Trainer, dir: &Path, step: usize) -> Result<()> {
    let t0 = Instant::now();
    tr.save(dir)?;
    tr.trace("checkpoint", Part::Other("io"), step, t0);
    Ok(())
}

/// Runs the job as this rank of `world`: every rank of the run calls it with the same options.
/// `stop` is this rank's request to stop (a signal handler's flag).
pub fn run(
    tr: &mut Trainer,
    opts: &JobOptions,
    stop: &AtomicBool,
    world: &Comm,
    obs: &mut dyn Observer,
) -> Result<Outcome> {
    let lead = world.rank() == 0;
    obs.start(tr);
    let t0 = Instant::now();
    let start_step = tr.step;
    let steps = tr.cfg.steps;
    let stop_at = opts.stop_after.map_or(steps, |s| s.min(steps));
    while tr.step < stop_at {
        let s = tr.train_step()?;
        let rate = (tr.step - start_step) as f64 * tr.tokens_per_step() as f64 / t0.elapsed().as_secs_f64();
        obs.step(&s, rate);
        if tr.cfg.eval_every > 0 && s.step.is_multiple_of(tr.cfg.eval_every) && s.step < steps {
            // the model cut across a tensor-parallel group is gathered by its ranks; rank 0 evaluates
            let full = tr.full_params()?;
            if lead {
                let t0 = Instant::now();
                let r = tr.evaluate_with(full.as_deref());
                tr.trace("evaluate", Part::Other("eval"), s.step, t0);
                obs.evaluated(&s, &r);
            }
        }
        if let (Some(dir), Some(every)) = (&opts.out, opts.save_every) {
            if every > 0 && s.step.is_multiple_of(every) {
                save(tr, dir, s.step)?;
            }
        }
        if any_rank_stopping(world, stop)? && tr.step < steps {
            obs.stepped();
            if let Some(dir) = &opts.out {
                tr.save(dir)?;
            }
            return Ok(Outcome::Interrupted { step: tr.step, steps, saved: opts.out.clone() });
        }
    }
    obs.stepped();
    let secs = t0.elapsed().as_secs_f64();
    if let Some(dir) = &opts.out {
        tr.save(dir)?;
    }
    let full = if tr.step < steps { None } else { tr.full_params()? };
    let trace = match &tr.timeline {
        Some(tl) => tl.gather(world)?,
        None => None,
    };
    let ranks = rank_times(tr, start_step, world)?;
    let taken = tr.step - start_step;
    let mut report = JobReport {
        steps: taken,
        secs,
        tokens_per_s: taken as f64 * tr.tokens_per_step() as f64 / secs,
        final_loss: tr.losses.last().copied().unwrap_or(f32::NAN),
        saved: opts.out.clone(),
        bubble: tr.pipeline_plan().map(|plan| {
            let mean = ranks.iter().map(|t| t.bubble).sum::<f64>() / ranks.len() as f64;
            (mean, crate::parallel::pipeline::simulate::bubble_theory(plan))
        }),
        ranks,
        trace: None,
        eval: None,
        sample: None,
    };
    if !lead {
        return Ok(Outcome::Finished(Box::new(report)));
    }
    if let (Some(path), Some(trace)) = (&opts.trace, &trace) {
        super::timeline::write_trace(path, trace)?;
        report.trace = Some((path.clone(), trace["traceEvents"].as_array().map_or(0, |e| e.len())));
    }
    if tr.step >= steps {
        let eval = tr.evaluate_with(full.as_deref());
        if matches!(eval, EvalReport::Text { .. }) {
            report.sample = Some(tr.sample_text(full.as_deref())?);
        }
        report.eval = Some(eval);
    }
    Ok(Outcome::Finished(Box::new(report)))
}
