//! What each step reports: its loss and learning rate, and where its time went on this rank.

use super::timeline::Timeline;
use std::time::Instant;

#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize)]
pub struct StepStats {
    /// 1-based number of the step just taken.
    pub step: usize,
    pub loss: f32,
    pub lr: f32,
    pub grad_norm: f32,
    pub tokens: usize,
    /// Tokens of the global batch per second of this step (wall clock, on this rank).
    pub tokens_per_s: f64,
    /// This rank's seconds in forward, backward and the optimizer, collectives excluded.
    pub compute_s: f64,
    /// This rank's seconds in collectives nothing overlapped (tensor-parallel ones, waits for
    /// gradient buckets, ZeRO gathers, scalar sums).
    pub comm_s: f64,
    /// The rest of the step: data, bookkeeping, waiting for another pipeline stage.
    pub idle_s: f64,
    /// The share of the pipeline's time this rank waited for another stage (0 without one).
    #[serde(default)]
    pub bubble: f64,
}

/// Where this step's time went so far on this rank, in seconds.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct StepClock {
    pub(crate) compute: f64,
    pub(crate) comm: f64,
}

/// Adds the span `start..end` to the timeline (if one is recorded) and to the step's clock.
pub(crate) fn note(
    timeline: &mut Option<Timeline>,
    clock: &mut StepClock,
    name: impl Into<String>,
    cat: &'static str,
    step: usize,
    (start, end): (Instant, Instant),
) {
    let secs = (end - start).as_secs_f64();
    match cat {
        "compute" | "optimizer" => clock.compute += secs,
        "comm" => clock.comm += secs,
        _ => {}
    }
    if let Some(tl) = timeline.as_mut() {
        tl.record_until(name, cat, step, start, end);
    }
}

/// What the last step's pipeline did on this rank.
#[derive(Clone, Copy, Debug, Default)]
pub struct PipelineStats {
    /// Seconds from the first action of the list to its last.
    pub wall_s: f64,
    /// Seconds in forwards and backwards.
    pub compute_s: f64,
    /// The most micro-batch chunks holding their stash at once, and their bytes.
    pub peak_stashed: usize,
    pub peak_stash_bytes: usize,
}

impl PipelineStats {
    /// The share of the pipeline's time this rank sat idle: 1 − compute / wall.
    pub fn bubble(&self) -> f64 {
        if self.wall_s <= 0.0 {
            return 0.0;
        }
        (1.0 - self.compute_s / self.wall_s).max(0.0)
    }
}
