//! What each step reports: its loss and learning rate, and where its time went on this rank.

use super::timeline::Timeline;
use crate::parallel::{Axis, Mesh};
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
    /// This rank's seconds in forward and backward (recomputation included), the collectives
    /// inside them excluded.
    pub compute_s: f64,
    /// This rank's seconds in the gradient norm, clipping and AdamW (their sums over the groups
    /// excluded).
    #[serde(default)]
    pub optimizer_s: f64,
    /// This rank's seconds in collectives and messages nothing overlapped, every group:
    /// `tp_comm_s + cp_comm_s + dp_comm_s + pp_comm_s`.
    pub comm_s: f64,
    /// Of `comm_s`: the tensor-parallel collectives (inside forward and backward, and the
    /// gradient's sums over the group).
    #[serde(default)]
    pub tp_comm_s: f64,
    /// Of `comm_s`: the data-parallel ones (gradient reductions left exposed, ZeRO's parameter
    /// gathers, ZeRO-3's waits for a unit's parameters inside forward and backward, scalar sums).
    #[serde(default)]
    pub dp_comm_s: f64,
    /// Of `comm_s`: the pipeline's sends, the tied table's sum, the loss and norm sums over stages.
    #[serde(default)]
    pub pp_comm_s: f64,
    /// Of `comm_s`: the context group's exchanges of keys and values left exposed (the
    /// all-gathers and reduce-scatters, or a ring's waits for the next block).
    #[serde(default)]
    pub cp_comm_s: f64,
    /// Of `compute_s`, under context parallelism: the blockwise attention over the group's
    /// blocks (what zigzag balances across the ranks).
    #[serde(default)]
    pub attention_s: f64,
    /// Seconds waiting for another pipeline stage's activation or gradient.
    #[serde(default)]
    pub pipeline_wait_s: f64,
    /// The rest of the step: drawing the batch, bookkeeping.
    pub idle_s: f64,
    /// The share of the pipeline's time this rank waited for another stage (0 without one).
    #[serde(default)]
    pub bubble: f64,
    /// A mixture of experts' load this step, over the global batch: the largest, over MoE
    /// layers, of the busiest expert's rows over the mean (1: perfectly balanced; 0 for a
    /// dense model), and the balancing loss (its mean over layers and sequences, before the
    /// coefficient).
    #[serde(default)]
    pub moe_load_max_over_mean: f64,
    #[serde(default)]
    pub moe_balance_loss: f64,
    /// This rank's data-parallel gradient reductions (buckets, ZeRO-1 units, or pipeline chunks)
    /// launched while its forwards and backwards ran, each as its gradients became final: the
    /// ones the backward can hide. Of `dp_reductions`; the rest start after the list, exposed.
    /// Both 0 with nothing to reduce, and under ZeRO-2/3, whose stores reduce-scatter inside
    /// each backward.
    #[serde(default)]
    pub dp_overlapped: usize,
    #[serde(default)]
    pub dp_reductions: usize,
}

/// What a span of a step is: its line in the step's accounting and its category on the timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// Forward and backward passes.
    Compute,
    /// The gradient norm, clipping, AdamW.
    Optimizer,
    /// A collective or message that nothing overlapped, counted under a mesh axis (a group of
    /// several axes under its outermost: the dp × cp gradient sum under dp).
    Comm(Axis),
    /// Waiting for another pipeline stage.
    Wait,
    /// Outside the step's own parts (drawing the batch, a checkpoint, an evaluation): the
    /// timeline's category.
    Other(&'static str),
}

impl Part {
    /// The span's category on the timeline.
    pub fn category(self) -> &'static str {
        match self {
            Part::Compute => "compute",
            Part::Optimizer => "optimizer",
            Part::Comm(_) => "comm",
            Part::Wait => "bubble",
            Part::Other(cat) => cat,
        }
    }
}

/// Where this step's time went so far on this rank, in seconds.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct StepClock {
    pub(crate) compute: f64,
    pub(crate) optimizer: f64,
    /// By axis (`Axis as usize`).
    pub(crate) comm: [f64; 5],
    pub(crate) wait: f64,
    /// Context parallelism's blockwise attention (within `compute`).
    pub(crate) attend: f64,
    /// Data-parallel gradient reductions: (launched during the list, all).
    pub(crate) dp_reductions: (usize, usize),
}

impl StepClock {
    pub(crate) fn comm_mut(&mut self, a: Axis) -> &mut f64 {
        &mut self.comm[a as usize]
    }

    /// Moves `secs` counted as compute (a wait inside a forward or backward) to axis `a`.
    pub(crate) fn reclaim(&mut self, secs: f64, a: Axis) {
        self.compute -= secs;
        *self.comm_mut(a) += secs;
    }
}

/// Adds the span `start..end` to the timeline (if one is recorded) and to the step's clock.
pub(crate) fn note(
    timeline: &mut Option<Timeline>,
    clock: &mut StepClock,
    name: impl Into<String>,
    part: Part,
    step: usize,
    (start, end): (Instant, Instant),
) {
    let secs = (end - start).as_secs_f64();
    match part {
        Part::Compute => clock.compute += secs,
        Part::Optimizer => clock.optimizer += secs,
        Part::Comm(g) => *clock.comm_mut(g) += secs,
        Part::Wait => clock.wait += secs,
        Part::Other(_) => {}
    }
    if let Some(tl) = timeline.as_mut() {
        tl.record_until(name, part.category(), step, start, end);
    }
}

/// `note` for a span of communication over the group of `axes` (counted under the outermost),
/// left out where the group is one rank (nothing was sent: the span held only bookkeeping).
pub(crate) fn note_comm(
    (timeline, clock): (&mut Option<Timeline>, &mut StepClock),
    mesh: &Mesh,
    name: &str,
    axes: &[Axis],
    step: usize,
    start: Instant,
) {
    let outer = *axes.iter().min().expect("a group spans at least one axis");
    if mesh.group(axes).size() > 1 {
        note(timeline, clock, name, Part::Comm(outer), step, (start, Instant::now()));
    }
}

/// What the last step's pipeline did on this rank.
#[derive(Clone, Copy, Debug, Default)]
pub struct PipelineStats {
    /// Seconds from the first action of the list to its last.
    pub wall_s: f64,
    /// Seconds waiting for another stage's activation or gradient.
    pub wait_s: f64,
    /// The most micro-batch chunks holding their stash at once, and their bytes.
    pub peak_stashed: usize,
    pub peak_stash_bytes: usize,
}

impl PipelineStats {
    /// The share of the pipeline's time this rank waited for another stage: wait / wall
    /// (its own sends and collectives are communication, not bubble).
    pub fn bubble(&self) -> f64 {
        if self.wall_s <= 0.0 {
            return 0.0;
        }
        (self.wait_s / self.wall_s).clamp(0.0, 1.0)
    }
}
