//! A pipeline rank's share of a step: its micro-batches through its list of the plan (the
//! executor), then the gradient sums the pipeline adds to data and tensor parallelism — the
//! tied token table's two copies over the pipeline, the replicas over dp (all-reduce, or
//! ZeRO-1's reduce-scatter), the replicated parameters over tp under sequence parallelism.

use super::metrics::note;
pub use super::metrics::PipelineStats;
use super::trainer::Trainer;
use crate::error::{Error, Result};
use crate::nn::tp::{state as tp_state, Tp};
use crate::parallel::data::{self, zero::UnitReducer};
use crate::parallel::pipeline::executor::{run_step_with, MicroBatches};
use crate::parallel::pipeline::Action;
use brigade_comm::ReduceOp;
use std::time::Instant;

fn label(a: &Action) -> (String, &'static str) {
    match *a {
        Action::Forward { mb, chunk } => (format!("forward mb{mb} c{chunk}"), "compute"),
        Action::Backward { mb, chunk } => (format!("backward mb{mb} c{chunk}"), "compute"),
        Action::BackwardInput { mb, chunk } => (format!("backward (input) mb{mb} c{chunk}"), "compute"),
        Action::BackwardWeight { mb, chunk } => (format!("backward (weight) mb{mb} c{chunk}"), "compute"),
        Action::SendActivation { mb, .. } => (format!("send activation mb{mb}"), "comm"),
        Action::SendGrad { mb, .. } => (format!("send gradient mb{mb}"), "comm"),
        Action::RecvActivation { mb, .. } => (format!("wait for activation mb{mb}"), "bubble"),
        Action::RecvGrad { mb, .. } => (format!("wait for gradient mb{mb}"), "bubble"),
    }
}

impl Trainer {
    /// This rank's share `x`, `y` of the batch (sequences of `t` tokens) through the pipeline;
    /// leaves the summed gradient in `grads` (ZeRO-1: this rank's pieces in `gshard`) and
    /// returns the sum of the token losses of this data-parallel replica.
    pub(crate) fn accumulate_pipelined(&mut self, x: &[u32], y: &[i32], t: usize, scale: f32) -> Result<f64> {
        let step = self.step + 1;
        let mb = self.micro;
        let tokens: Vec<Vec<u32>> = x.chunks(mb * t).map(<[u32]>::to_vec).collect();
        let targets: Vec<Vec<i32>> = y.chunks(mb * t).map(<[i32]>::to_vec).collect();
        let plan = self.plan.as_ref().expect("a pipeline rank has a plan");
        let tp = Tp::new(&self.mesh.tp, self.layout.sp);
        let data = MicroBatches { tokens: &tokens, targets: &targets, b: mb, t, scale };
        let started = Instant::now();
        let mut chunks = self.parts.views(&self.params, &mut self.grads);
        // without ZeRO each chunk's gradient is all-reduced over dp as soon as the list has
        // finished it, while the rest of the list runs (the tied table's two copies are summed
        // after: a sum over dp of each copy, then of the two, is the same sum)
        let dp = &self.mesh.dp;
        let overlap = self.dpc.zero == 0 && dp.size() > 1;
        let mut pending = Vec::new();
        let mut done = |c: usize, g: &[f32]| {
            if overlap {
                pending.push((c, dp.all_reduce_async(g.to_vec(), ReduceOp::Sum)));
            }
        };
        let ran = run_step_with(plan, &self.mesh.pp, &tp, &mut chunks, &data, self.layout.recompute, &mut done)?;
        let wall_s = started.elapsed().as_secs_f64();
        for (a, s, e) in &ran.spans {
            let (name, cat) = label(a);
            note(&mut self.timeline, &mut self.clock, name, cat, step, (*s, *e));
        }
        self.pipeline = Some(PipelineStats {
            wall_s,
            compute_s: ran.compute_s(),
            peak_stashed: ran.peak,
            peak_stash_bytes: ran.peak_bytes,
        });
        let t0 = Instant::now();
        for (c, h) in pending {
            let sum = h.wait().map_err(|e| Error::Train(format!("data-parallel communication failed: {e}")))?;
            self.grads[self.parts.spans[c].clone()].copy_from_slice(&sum);
        }
        self.parts.tie_grads(&self.mesh.pp, &mut self.grads)?;
        let dp = &self.mesh.dp;
        if self.dpc.zero >= 1 {
            UnitReducer::new(&self.shards, dp).finish(&self.grads, &mut self.gshard)?;
        }
        let g = if self.dpc.zero == 0 { &mut self.grads } else { &mut self.gshard };
        tp_state::sum_replicated_grads(&tp, g, &self.shards.compact_ranges(&self.parts.layout, true))?;
        // the last stage's losses, to every stage
        let loss = data::sum_scalar(&self.mesh.pp, ran.loss)?;
        note(&mut self.timeline, &mut self.clock, "gradient reduction", "comm", step, (t0, Instant::now()));
        Ok(loss)
    }
}
