//! A rank's share of a step's gradient, the same path for every layout: its micro-batches
//! through its list of the plan (the executor; without a pipeline the list is one stage, 1F1B
//! over the micro-batches), each pass on the store its data parallelism asks for, then the
//! sums the layout adds, each over the group of the mesh axes it names — the replicas over
//! dp × cp ([`REPLICAS`]: all-reduce by buckets during the last backward, or chunk by chunk;
//! ZeRO-1's reduce-scatter; ZeRO-2/3's per-unit reduce-scatter in every backward), the tied
//! token table's two copies over the pipeline (pp), the replicated parameters over tp under
//! sequence parallelism.

use super::fault;
use super::metrics::{note, note_comm, Part, PipelineStats};
use super::trainer::Trainer;
use crate::error::{Error, Result};
use crate::layout::Schedule;
use crate::models::config::kv_copies;
use crate::models::units::Whole;
use crate::models::Gpt;
use crate::nn::context::{Context, SeqSplit};
use crate::nn::tp::{state as tp_state, Tp};
use crate::parallel::data::store::ShardStore;
use crate::parallel::data::zero::{Cut, Shards, UnitReducer};
use crate::parallel::data::{self, BucketReducer, OnReady, REPLICAS};
use crate::parallel::pipeline::executor::{run_step, ChunkStores, MicroBatches, OnStore, Stage};
use crate::parallel::pipeline::{Action, RankModel};
use crate::parallel::Axis;
use brigade_comm::{Comm, Handle, ReduceOp};
use std::time::Instant;

/// A span's name on the timeline: a pipeline's names its chunk (`forward mb3 c0`), the one
/// stage without a pipeline does not (`forward mb3`).
fn label(a: &Action, pipelined: bool) -> (String, Part) {
    let c = |chunk: usize| if pipelined { format!(" c{chunk}") } else { String::new() };
    match *a {
        Action::Forward { mb, chunk } => (format!("forward mb{mb}{}", c(chunk)), Part::Compute),
        Action::Backward { mb, chunk } => (format!("backward mb{mb}{}", c(chunk)), Part::Compute),
        Action::BackwardInput { mb, chunk } => (format!("backward (input) mb{mb}{}", c(chunk)), Part::Compute),
        Action::BackwardWeight { mb, chunk } => (format!("backward (weight) mb{mb}{}", c(chunk)), Part::Compute),
        Action::SendActivation { mb, .. } => (format!("send activation mb{mb}"), Part::Comm(Axis::Pp)),
        Action::SendGrad { mb, .. } => (format!("send gradient mb{mb}"), Part::Comm(Axis::Pp)),
        Action::RecvActivation { mb, .. } => (format!("wait for activation mb{mb}"), Part::Wait),
        Action::RecvGrad { mb, .. } => (format!("wait for gradient mb{mb}"), Part::Wait),
    }
}

/// How a rank's gradients reach the rest of its dp group.
enum Sync<'a> {
    /// Nothing to reduce (dp = 1 without ZeRO), or ZeRO-1 reduce-scattered after the list.
    After,
    /// ZeRO-0, one chunk: buckets all-reduced as the last backward finishes them.
    Buckets(BucketReducer<'a>),
    /// ZeRO-0, several chunks: each chunk all-reduced as soon as it is final.
    Chunks(Vec<(usize, Handle<Vec<f32>>)>),
    /// ZeRO-1, one chunk and no tied copy to sum first: each unit reduce-scattered as the
    /// last backward finishes it.
    Units(UnitReducer<'a>),
    /// ZeRO-2/3: a store per micro-batch reduce-scatters each unit's gradient into this rank's
    /// pieces (ZeRO-3: and gathers each unit's parameters) — `open` from a forward to the end of
    /// its backward.
    Sharded { open: Option<ShardStore<'a>>, full: Option<&'a [f32]>, pshard: &'a [f32] },
}

impl Sync<'_> {
    /// The reductions launched so far, and all there will be (0, 0: none, or inside the stores).
    fn launched(&self) -> (usize, usize) {
        match self {
            Sync::Buckets(r) => r.launched(),
            Sync::Units(r) => r.launched(),
            Sync::Chunks(pending) => (pending.len(), pending.len()),
            Sync::After | Sync::Sharded { .. } => (0, 0),
        }
    }

    /// The reduction that overlaps the chunk's last backward, if this rank has one.
    fn overlapped(&mut self) -> Option<&mut dyn OnReady> {
        match self {
            Sync::Buckets(r) => Some(r),
            Sync::Units(r) => Some(r),
            _ => None,
        }
    }
}

/// The stores of a data-parallel rank's chunks.
struct RankStores<'a, 'b> {
    parts: &'a RankModel,
    params: &'a [f32],
    grads: &'b mut [f32],
    /// ZeRO ≥ 2: this rank's pieces of the summed gradient.
    gshard: &'b mut [f32],
    shards: &'a Shards,
    dp: &'a Comm,
    sync: Sync<'a>,
    /// Seconds ZeRO-2/3 stores waited inside the forwards and backwards: for gathered
    /// parameters, and finishing each backward's reduce-scatters (communication nothing hid).
    exposed_s: f64,
    /// The step being taken, this rank of the world and the step's micro-batches (for the
    /// recovery tests' planted faults).
    step: usize,
    rank: usize,
    micro_batches: usize,
}

impl ChunkStores for RankStores<'_, '_> {
    fn part(&self, c: usize) -> &Gpt {
        &self.parts.chunks[c]
    }

    fn with(&mut self, c: usize, mb: usize, stage: Stage, f: OnStore) -> Result<()> {
        if mb + 1 == self.micro_batches {
            let point = if stage == Stage::Forward { fault::Point::Forward } else { fault::Point::Backward };
            fault::at(point, self.step, self.rank);
        }
        let part = &self.parts.chunks[c];
        let span = self.parts.spans[c].clone();
        match (&mut self.sync, stage) {
            (Sync::Sharded { open, full, pshard }, _) => {
                if stage == Stage::Forward {
                    *open = Some(ShardStore::new(self.shards, self.dp, *full, pshard));
                }
                let store = open.as_mut().expect("a backward after its forward");
                f(part, store)?;
                self.exposed_s += std::mem::take(&mut store.waited_s);
                if stage != Stage::Forward {
                    let t0 = Instant::now();
                    open.take().expect("opened by the forward").finish(self.gshard)?;
                    self.exposed_s += t0.elapsed().as_secs_f64();
                }
                Ok(())
            }
            (_, Stage::Forward) => f(part, &mut Whole::reading(&part.units, &self.params[span])),
            (sync, Stage::Backward { last }) => {
                let mut store = Whole::new(&part.units, &self.params[span.clone()], &mut self.grads[span]);
                // the chunk's last backward launches each piece's reduction as it is final
                match sync.overlapped().filter(|_| last) {
                    Some(r) => f(part, &mut store.on_ready(&mut |g: &[f32], from: usize| r.ready(g, from))),
                    None => f(part, &mut store),
                }
            }
        }
    }

    fn grads(&mut self, c: usize) -> &mut [f32] {
        &mut self.grads[self.parts.spans[c].clone()]
    }

    fn done(&mut self, c: usize) -> Result<()> {
        // (ZeRO-2/3 keep no whole gradient buffer: their stores reduced everything already)
        let span = self.parts.spans[c].clone();
        let g = || &self.grads[span.clone()];
        if let Sync::Chunks(pending) = &mut self.sync {
            pending.push((c, self.dp.all_reduce_async(g().to_vec(), ReduceOp::Sum)));
        } else if let Some(r) = self.sync.overlapped() {
            // what the last backward did not launch (a zero-bubble W finished the chunk)
            r.ready(g(), 0);
        }
        Ok(())
    }
}

/// The mean seconds of a step's forwards, input-gradient and weight-gradient halves.
fn mean_action_secs(spans: &[(Action, Instant, Instant)]) -> [f32; 3] {
    let (mut sum, mut n) = ([0f64; 3], [0usize; 3]);
    for (a, s, e) in spans {
        let k = match a {
            Action::Forward { .. } => 0,
            Action::BackwardInput { .. } => 1,
            Action::BackwardWeight { .. } => 2,
            _ => continue,
        };
        sum[k] += (*e - *s).as_secs_f64();
        n[k] += 1;
    }
    std::array::from_fn(|k| (sum[k] / n[k].max(1) as f64) as f32)
}

fn dp_err(e: brigade_comm::CommError) -> Error {
    Error::Train(format!("data-parallel communication failed: {e}"))
}

impl Trainer {
    /// This rank's share `x`, `y` of the batch (sequences of `t` tokens; under context
    /// parallelism, split by `split`, this rank's `t` rows of each) through its list;
    /// leaves the summed gradient in `grads` (ZeRO ≥ 1: this rank's pieces in `gshard`) and
    /// returns the sum of the token losses of this data-parallel replica.
    pub(crate) fn accumulate_share(
        &mut self,
        (x, y, pos): (&[u32], &[i32], Option<&[u32]>),
        (t, split): (usize, Option<SeqSplit>),
        scale: f32,
    ) -> Result<f64> {
        let step = self.step + 1;
        let mb = self.micro;
        let tokens: Vec<Vec<u32>> = x.chunks(mb * t).map(<[u32]>::to_vec).collect();
        let targets: Vec<Vec<i32>> = y.chunks(mb * t).map(<[i32]>::to_vec).collect();
        let tp = Tp::new(self.mesh.group(&[Axis::Tp]), self.layout.sp);
        let positions: Vec<Vec<u32>> = pos.map_or(Vec::new(), |p| p.chunks(mb * t).map(<[u32]>::to_vec).collect());
        let data = MicroBatches { tokens: &tokens, targets: &targets, b: mb, t, scale, positions: &positions };
        let (dp, zero) = (self.mesh.group(REPLICAS), self.dpc.zero);
        // the context group holding the rest of each sequence
        let cp = split.map(|split| Context {
            comm: self.mesh.group(&[Axis::Cp]),
            split,
            kind: self.layout.cp_comm,
            clock: Some(&self.attend_clock),
        });
        let one_chunk = self.parts.chunks.len() == 1;
        // the tied table's copies are summed over the pipeline before ZeRO-1 cuts the sum
        let untied = self.mesh.group(&[Axis::Pp]).size() == 1 && one_chunk;
        let sync = match zero {
            // experts divided over the expert group: summed after the backward, each set over
            // its own group
            _ if self.layout.divides_experts() => Sync::After,
            _ if zero >= 2 => {
                Sync::Sharded { open: None, full: (zero == 2).then_some(&self.params[..]), pshard: &self.pshard }
            }
            0 if dp.size() == 1 => Sync::After,
            0 if one_chunk => Sync::Buckets(BucketReducer::new(dp, self.grads.len(), &self.dpc)),
            0 => Sync::Chunks(Vec::new()),
            _ if untied => Sync::Units(UnitReducer::new(&self.shards, dp)),
            _ => Sync::After,
        };
        let mut stores = RankStores {
            parts: &self.parts,
            params: &self.params,
            grads: &mut self.grads,
            gshard: &mut self.gshard,
            shards: &self.shards,
            dp,
            sync,
            exposed_s: 0.0,
            step,
            rank: self.mesh.rank(),
            micro_batches: tokens.len(),
        };
        let started = Instant::now();
        // the expert group a mixture's experts are spread over
        let ep = (self.mesh.shape.degree(Axis::Ep) > 1).then(|| self.mesh.group(&[Axis::Ep]));
        let comms = (self.mesh.group(&[Axis::Pp]), &tp, cp, ep);
        let ran = run_step(&self.list, comms, &mut stores, &data, self.layout.recompute, &mut self.pool)?;
        let wall_s = started.elapsed().as_secs_f64();
        let RankStores { sync, exposed_s, .. } = stores;
        let mut wait_s = 0.0;
        for (a, s, e) in &ran.spans {
            let (name, part) = label(a, self.layout.runs_executor());
            if part == Part::Wait {
                wait_s += (*e - *s).as_secs_f64();
            }
            note(&mut self.timeline, &mut self.clock, name, part, step, (*s, *e));
        }
        if self.list.kind == Schedule::ZeroBubble {
            self.measured_actions = Some(mean_action_secs(&ran.spans));
        }
        // what the forwards' and backwards' spans hold that is not compute: ZeRO-2/3's waits for
        // a unit's parameters and for the reduce-scatters (dp), the tensor-parallel collectives
        self.clock.reclaim(exposed_s, Axis::Dp);
        // (and the context group's exchanges of keys and values, inside attention)
        for axis in [Axis::Tp, Axis::Cp] {
            let comm = self.mesh.group(&[axis]);
            let events = comm.take_trace();
            let secs: f64 = events.iter().map(|e| (e.end - e.start).as_secs_f64()).sum();
            self.clock.reclaim(secs, axis);
            if let Some(tl) = self.timeline.as_mut() {
                tl.add_comm(comm.trace_epoch(), &events, step);
            }
        }
        self.clock.attend = self.attend_clock.take();
        if self.layout.runs_executor() {
            self.pipeline =
                Some(PipelineStats { wall_s, wait_s, peak_stashed: ran.peak, peak_stash_bytes: ran.peak_bytes });
        }
        fault::at(fault::Point::Reduce, step, self.mesh.rank());
        self.clock.dp_reductions = sync.launched();
        let t0 = Instant::now();
        let exposed = match sync {
            Sync::Buckets(r) => {
                r.finish(&mut self.grads)?;
                Some("gradient reduction (exposed)")
            }
            Sync::Units(r) => {
                r.finish(&self.grads, &mut self.gshard)?;
                Some("gradient reduce-scatter (exposed)")
            }
            Sync::Chunks(pending) => {
                for (c, h) in pending {
                    let sum = h.wait().map_err(dp_err)?;
                    self.grads[self.parts.spans[c].clone()].copy_from_slice(&sum);
                }
                Some("gradient reduction (exposed)")
            }
            Sync::After | Sync::Sharded { .. } => None,
        };
        if let Some(name) = exposed {
            note_comm((&mut self.timeline, &mut self.clock), &self.mesh, name, REPLICAS, step, t0);
        }
        if self.layout.divides_experts() {
            // the routed experts' gradients over the ranks holding the same experts, the rest
            // over every data × context rank
            let experts = self.parts.layout.expert_ranges();
            let dense = data::complement(self.grads.len(), &experts);
            data::sum_ranges(dp, &mut self.grads, &dense)?;
            note_comm((&mut self.timeline, &mut self.clock), &self.mesh, "gradient reduction", REPLICAS, step, t0);
            let t0 = Instant::now();
            data::sum_ranges(self.mesh.expert_data(), &mut self.grads, &experts)?;
            note_comm(
                (&mut self.timeline, &mut self.clock),
                &self.mesh,
                "expert gradient reduction",
                REPLICAS,
                step,
                t0,
            );
        }
        let t0 = Instant::now();
        self.parts.tie_grads(self.mesh.group(&[Axis::Pp]), &mut self.grads)?;
        note_comm(
            (&mut self.timeline, &mut self.clock),
            &self.mesh,
            "tied table's gradient sum",
            &[Axis::Pp],
            step,
            t0,
        );
        let t0 = Instant::now();
        if zero == 1 && !untied {
            let r = UnitReducer::new(&self.shards, dp);
            self.clock.dp_reductions = r.launched();
            r.finish(&self.grads, &mut self.gshard)?;
            note_comm(
                (&mut self.timeline, &mut self.clock),
                &self.mesh,
                "gradient reduce-scatter (exposed)",
                REPLICAS,
                step,
                t0,
            );
        }
        let t0 = Instant::now();
        let g = if zero == 0 { &mut self.grads } else { &mut self.gshard };
        tp_state::sum_replicated_grads(&tp, g, &self.shards.compact_ranges(&self.parts.layout, Cut::Replicated))?;
        let copies = kv_copies(&self.parts.first().cfg, tp.size());
        tp_state::sum_shared_grads(&tp, g, &self.shards.compact_ranges(&self.parts.layout, Cut::Shared), copies)?;
        note_comm(
            (&mut self.timeline, &mut self.clock),
            &self.mesh,
            "replicated gradients' sum",
            &[Axis::Tp],
            step,
            t0,
        );
        // the last stage's losses, to every stage
        let t0 = Instant::now();
        let loss = data::sum_scalar(self.mesh.group(&[Axis::Pp]), ran.loss)?;
        note_comm((&mut self.timeline, &mut self.clock), &self.mesh, "loss sum", &[Axis::Pp], step, t0);
        // (the spans above already count the collectives' time: off the trace)
        self.mesh.group(&[Axis::Tp]).take_trace();
        Ok(loss)
    }
}
