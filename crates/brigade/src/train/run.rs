//! The training job, as `brigade train` runs it on every rank: steps until the run is done or
//! asked to stop, evaluation and checkpoints at their cadence, the ranks' agreement to stop
//! after the same step, a checkpoint on the way out, each rank's times, the timeline, and the
//! final evaluation. An [`Observer`] hears the progress; the caller prints.

use super::evaluate::EvalReport;
use super::metrics::{Part, StepStats};
use super::persist::Snapshot;
use super::trainer::Trainer;
use crate::error::{Error, Result};
use brigade_comm::{Comm, ReduceOp};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Instant;

/// How often a job writes a checkpoint: every N steps, or every so many seconds of its wall
/// clock (rank 0's clock decides for every rank).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SaveEvery {
    Steps(usize),
    Secs(f64),
}

impl SaveEvery {
    /// `500` (steps), `500steps`, `90s`, `15m` / `15min`, `2h`.
    pub fn parse(text: &str) -> std::result::Result<SaveEvery, String> {
        let t = text.trim();
        let split = t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let bad = || format!("'{text}' is not a save interval; give steps (500) or a time (90s, 15m, 2h)");
        let secs = match unit.trim() {
            "" | "steps" | "step" => {
                let n: usize = num.parse().map_err(|_| bad())?;
                if n == 0 {
                    return Err(format!("'{text}': save every 1 step or more"));
                }
                return Ok(SaveEvery::Steps(n));
            }
            "s" | "sec" | "secs" => 1.0,
            "m" | "min" | "mins" => 60.0,
            "h" | "hour" | "hours" => 3600.0,
            _ => return Err(bad()),
        };
        let x: f64 = num.parse().map_err(|_| bad())?;
        if !(x.is_finite() && x > 0.0 && x * secs <= 1e7) {
            return Err(format!("'{text}': give a time above 0 and at most 1e7 seconds"));
        }
        Ok(SaveEvery::Secs(x * secs))
    }
}

impl std::fmt::Display for SaveEvery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SaveEvery::Steps(n) => write!(f, "{n} steps"),
            SaveEvery::Secs(s) => write!(f, "{s} s"),
        }
    }
}

/// One checkpoint the job wrote: how long its step waited for it (the state copied, and in
/// the foreground the files written; with a background save still writing, the wait for it),
/// and how long the files took to write.
#[derive(Clone, Debug, PartialEq)]
pub struct SaveRecord {
    pub step: usize,
    pub stall_s: f64,
    /// `None` on the ranks that do not write (every rank but the first).
    pub write_s: Option<f64>,
    /// The CPU seconds the writing took (in the background: a core training did not get).
    pub write_cpu_s: Option<f64>,
    pub background: bool,
}

/// A background write: its wall and CPU seconds, and the snapshot's buffers back.
type Writer = JoinHandle<(Result<(f64, f64)>, Snapshot)>;

/// The job's checkpoints: the state copied at the step boundary, the files written on a
/// thread of their own while the next steps run (at most one save in flight: a second waits
/// for the first), or at once in the foreground.
struct Saver {
    dir: PathBuf,
    background: bool,
    /// The record's index and the writer, which hands back the seconds and the buffers.
    inflight: Option<(usize, Writer)>,
    /// The buffers of the last snapshot, for the next (allocated once for the job).
    spare: Option<Snapshot>,
    records: Vec<SaveRecord>,
    /// When the last save began (or the job, before one).
    last: Instant,
    /// The step of the last checkpoint that is (or is being) written.
    saved_step: Option<usize>,
}

impl Saver {
    fn new(dir: PathBuf, background: bool) -> Saver {
        Saver {
            dir,
            background,
            inflight: None,
            spare: None,
            records: Vec::new(),
            last: Instant::now(),
            saved_step: None,
        }
    }

    /// Saves the trainer's state after `step` (every rank calls it).
    fn save(&mut self, tr: &mut Trainer, background: bool) -> Result<()> {
        let step = tr.step;
        let t0 = Instant::now();
        self.last = t0;
        // the save in flight gives its buffers back (a disk slower than the steps waits here)
        self.wait()?;
        let snap = tr.snapshot_into(self.spare.take())?;
        let write_s = if !snap.writes() {
            self.spare = Some(snap);
            None
        } else if background {
            let dir = self.dir.clone();
            let h = std::thread::Builder::new()
                .name("brigade-save".into())
                .spawn(move || (timed_write(&snap, &dir), snap))
                .map_err(|e| Error::Train(format!("cannot start the checkpoint writer: {e}")))?;
            self.inflight = Some((self.records.len(), h));
            None
        } else {
            let w = timed_write(&snap, &self.dir).map_err(|e| save_failed(step, &self.dir, e))?;
            self.spare = Some(snap);
            Some(w)
        };
        tr.trace("checkpoint", Part::Other("io"), step, t0);
        let (write_s, write_cpu_s) = (write_s.map(|w: (f64, f64)| w.0), write_s.map(|w| w.1));
        self.records.push(SaveRecord { step, stall_s: t0.elapsed().as_secs_f64(), write_s, write_cpu_s, background });
        self.saved_step = Some(step);
        Ok(())
    }

    /// Waits for the save in flight, if any; its failure is this job's.
    fn wait(&mut self) -> Result<()> {
        let Some((k, h)) = self.inflight.take() else { return Ok(()) };
        let step = self.records[k].step;
        let (written, snap) =
            h.join().map_err(|_| Error::Train(format!("the writer of step {step}'s checkpoint panicked")))?;
        self.spare = Some(snap);
        let (wall, cpu) = written.map_err(|e| save_failed(step, &self.dir, e))?;
        (self.records[k].write_s, self.records[k].write_cpu_s) = (Some(wall), Some(cpu));
        Ok(())
    }
}

/// Writes `snap`: its wall seconds and the CPU seconds of the writing thread.
fn timed_write(snap: &Snapshot, dir: &Path) -> Result<(f64, f64)> {
    let (t0, cpu0) = (Instant::now(), thread_cpu_s());
    snap.write(dir)?;
    Ok((t0.elapsed().as_secs_f64(), thread_cpu_s() - cpu0))
}

/// CPU seconds (user and system) the calling thread has used.
fn thread_cpu_s() -> f64 {
    // SAFETY: getrusage fills the struct it is given; RUSAGE_THREAD is the calling thread
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) } != 0 {
        return f64::NAN;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    secs(ru.ru_utime) + secs(ru.ru_stime)
}

fn save_failed(step: usize, dir: &Path, e: Error) -> Error {
    Error::Train(format!(
        "the checkpoint of step {step} could not be written to {} ({e}); the previous checkpoint there is intact",
        dir.display()
    ))
}

/// What the job does beside stepping.
#[derive(Clone, Debug, Default)]
pub struct JobOptions {
    /// Where checkpoints go (the last one when the job ends or is stopped).
    pub out: Option<PathBuf>,
    /// A checkpoint every this many steps or seconds (needs `out`).
    pub save_every: Option<SaveEvery>,
    /// Write each periodic checkpoint before the next step (as brigade did before background
    /// saves; for comparison): the step waits for the files.
    pub save_in_foreground: bool,
    /// Stop after this step, as if asked to (for tests of an interrupted run).
    pub stop_after: Option<usize>,
    /// Write every rank's Chrome trace-event timeline here (the trainer must record one).
    pub trace: Option<PathBuf>,
    /// Leave out the final text sample (a generation from the start of the held-out text).
    pub no_sample: bool,
}

/// Told what happens, to show progress (rank 0's; the other ranks get [`Quiet`]).
pub trait Observer {
    /// The job starts at the trainer's current step.
    fn start(&mut self, _tr: &Trainer) {}
    /// A step was taken; `tokens_per_s` over the steps of this job so far.
    fn step(&mut self, _s: &StepStats, _tokens_per_s: f64) {}
    /// The periodic evaluation after `step` (rank 0 only).
    fn evaluated(&mut self, _s: &StepStats, _report: &EvalReport) {}
    /// The evaluation of a published model a run starts from (`--init`), before its first step.
    fn evaluated_start(&mut self, _report: &EvalReport) {}
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
    /// Every checkpoint this job wrote, the final one last.
    pub saves: Vec<SaveRecord>,
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

/// What the ranks decide together after a step: whether any rank was asked to stop, and
/// whether a save is due on any (every rank must stop, and save, after the same step).
fn agree(world: &Comm, stop: &AtomicBool, save_due: bool) -> Result<(bool, bool)> {
    let mut v = [stop.load(Ordering::Relaxed) as u8 as f32, save_due as u8 as f32];
    if world.size() > 1 {
        world.all_reduce(&mut v, ReduceOp::Max).map_err(comm_err)?;
    }
    Ok((v[0] > 0.0, v[1] > 0.0))
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

/// The save in flight finished, then the final checkpoint written in the foreground (unless
/// the last save was of this very step).
fn finish_saves(sv: &mut Saver, tr: &mut Trainer) -> Result<()> {
    sv.wait()?;
    if sv.saved_step != Some(tr.step) {
        sv.save(tr, false)?;
    }
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
    let mut saver = opts.out.clone().map(|dir| Saver::new(dir, !opts.save_in_foreground));
    if tr.cfg.init.is_some() && tr.step == 0 && tr.cfg.eval_every > 0 {
        // where the published model stands on the held-out data, for the run to improve on
        let full = tr.full_params_to_first()?;
        if lead {
            let r = tr.evaluate_with(full.as_deref());
            obs.evaluated_start(&r);
        }
    }
    while tr.step < stop_at {
        let s = tr.train_step()?;
        let rate = (tr.step - start_step) as f64 * tr.tokens_per_step() as f64 / t0.elapsed().as_secs_f64();
        obs.step(&s, rate);
        if tr.cfg.eval_every > 0 && s.step.is_multiple_of(tr.cfg.eval_every) && s.step < steps {
            // the model cut across a tensor-parallel group is gathered by its ranks; rank 0 evaluates
            let full = tr.full_params_to_first()?;
            if lead {
                let t0 = Instant::now();
                let r = tr.evaluate_with(full.as_deref());
                tr.trace("evaluate", Part::Other("eval"), s.step, t0);
                obs.evaluated(&s, &r);
            }
        }
        let due = match (&saver, opts.save_every) {
            (Some(_), Some(SaveEvery::Steps(n))) => n > 0 && s.step.is_multiple_of(n),
            (Some(sv), Some(SaveEvery::Secs(x))) => lead && sv.last.elapsed().as_secs_f64() >= x,
            _ => false,
        };
        let (stopping, due) = agree(world, stop, due)?;
        let stopping = stopping && tr.step < steps;
        // the last step's checkpoint is the final one, written below
        if let Some(sv) = saver.as_mut().filter(|_| due && !stopping && tr.step < stop_at) {
            sv.save(tr, sv.background)?;
        }
        if stopping {
            obs.stepped();
            if let Some(sv) = saver.as_mut() {
                finish_saves(sv, tr)?;
            }
            return Ok(Outcome::Interrupted { step: tr.step, steps, saved: opts.out.clone() });
        }
    }
    obs.stepped();
    let secs = t0.elapsed().as_secs_f64();
    if let Some(sv) = saver.as_mut() {
        finish_saves(sv, tr)?;
    }
    let full = if tr.step < steps { None } else { tr.full_params_to_first()? };
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
        saves: saver.map(|sv| sv.records).unwrap_or_default(),
        bubble: tr.pipeline_theory().map(|theory| {
            let mean = ranks.iter().map(|t| t.bubble).sum::<f64>() / ranks.len() as f64;
            (mean, theory)
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
        // conversations are shown by serving the model, not by continuing a template's header
        if matches!(eval, EvalReport::Text { .. }) && !tr.cfg.chat && !opts.no_sample {
            report.sample = Some(tr.sample_text(full.as_deref())?);
        }
        report.eval = Some(eval);
    }
    Ok(Outcome::Finished(Box::new(report)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_intervals_parse_as_steps_or_times_and_nonsense_is_refused() {
        let ok = [
            ("500", SaveEvery::Steps(500)),
            ("3steps", SaveEvery::Steps(3)),
            ("1 step", SaveEvery::Steps(1)),
            ("90s", SaveEvery::Secs(90.0)),
            ("15m", SaveEvery::Secs(900.0)),
            ("1.5min", SaveEvery::Secs(90.0)),
            ("2h", SaveEvery::Secs(7200.0)),
        ];
        for (text, want) in ok {
            assert_eq!(SaveEvery::parse(text), Ok(want), "{text}");
        }
        for bad in ["", "0", "-3", "0s", "15x", "m", "1e9h", "nan s", "1.5"] {
            assert!(SaveEvery::parse(bad).is_err(), "{bad} accepted");
        }
    }
}
