//! One rank's optimizer step on any layout: its share of the global batch → the gradient
//! (`gradients.rs`: micro-batches through the executor, the layout's sums) → the global norm
//! and clipping factor → AdamW on what this rank holds (whole, or its ZeRO pieces). The job
//! that repeats it is `run.rs`.
//!
//! `Trainer` is one struct with one `impl Trainer` block per file of `train/`, by what it does:
//!
//! - `setup.rs`: `prepare` (every check that needs no peer), `check_layout`, `build` (this
//!   rank's model part, its ZeRO pieces, the optimizer);
//! - `trainer.rs` (here): `new`, `on_mesh`, `on_world`; `train_step`, `step_on` (the norm,
//!   clipping, AdamW), `accumulate_gradients` (this rank's share of the batch); `grads`,
//!   `local_grads`, `local_params`; settings and counters (`set_bucket_elems`,
//!   `pipeline_plan`, `micro_batch`, `done`, `tokens_per_step`, `trace`);
//! - `gradients.rs`: `accumulate_share`, the share through the executor and the sums over the
//!   mesh's groups;
//! - `persist.rs`: `save`, `snapshot`, `snapshot_into`, `fingerprints`; `resume`, `resume_on`,
//!   `resume_on_world`; `full_of_local`, `local_of_full` (the whole model ↔ this rank's buffer);
//! - `evaluate.rs`: `evaluate`, `evaluate_with`, `full_params`, `whole_model`, `sample_text`,
//!   `data_prompt`;
//! - `diagnose.rs`: `explain_nonfinite_loss`.

use super::config::TrainConfig;
use super::data::{Dataset, Tokenizer};
use super::metrics::{note, note_comm, Part, PipelineStats, StepClock, StepStats};
use super::optimizer::{clip_factor, grad_sq_norm, AdamW, LrSchedule};
use super::timeline::Timeline;
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::models::config::kv_copies;
use crate::models::Gpt;
use crate::nn::context::SeqSplit;
use crate::nn::tp::{state as tp_state, Tp};
use crate::parallel::data::zero::{Cut, Shards};
use crate::parallel::data::{self, DataParallel, REPLICAS};
use crate::parallel::pipeline::executor::Reuse;
use crate::parallel::pipeline::{self, Costs, Plan, RankModel};
use crate::parallel::{Axis, Mesh, MeshShape};
use crate::params::ParamLayout;
use brigade_comm::ReduceOp;
use std::time::Instant;

pub struct Trainer {
    pub cfg: TrainConfig,
    /// This rank's first model chunk: without a pipeline its whole model (cut for its
    /// tensor-parallel slice); `parts` holds every chunk a pipeline rank runs.
    pub model: Gpt,
    /// This rank's model chunks, their parameters end to end in `params`.
    pub parts: RankModel,
    /// `parts.layout` without the head's copy of the tied token table (for the gradient norm).
    pub(crate) norm_layout: ParamLayout,
    /// The lists every step runs: the pipeline's when the layout runs one (`pipeline_plan`),
    /// else one stage's 1F1B over the micro-batches.
    pub(crate) list: Plan,
    /// ZB-H1: this rank's mean forward, input- and weight-gradient seconds in the last step
    /// (taken by `fit_lists`), and the costs the lists were last fitted to.
    pub(crate) measured_actions: Option<[f32; 3]>,
    pub(crate) fitted: Option<Costs>,
    /// Activations of the micro-batches in flight, kept for the next step.
    pub(crate) pool: Reuse,
    pub params: Vec<f32>,
    pub(crate) grads: Vec<f32>,
    pub(crate) opt: AdamW,
    /// Optimizer steps completed.
    pub step: usize,
    pub data: Dataset,
    pub tokenizer: Tokenizer,
    pub seq: usize,
    /// Loss of every step taken so far (including those before a resume).
    pub losses: Vec<f32>,
    /// Gradient norm (before clipping) of every step taken in this process.
    pub grad_norms: Vec<f32>,
    pub(crate) sched: LrSchedule,
    /// Set to record a Chrome trace of the run (`brigade train --trace`).
    pub timeline: Option<Timeline>,
    /// This rank's place in the mesh (the single worker: 1×1×1).
    pub mesh: Mesh,
    pub(crate) dpc: DataParallel,
    /// This rank's ZeRO pieces of every unit (whole units without ZeRO).
    pub(crate) shards: Shards,
    /// ZeRO-3: this rank's pieces of the parameters (`params` is then empty).
    pub(crate) pshard: Vec<f32>,
    /// ZeRO ≥ 1: this rank's pieces of the summed gradient (ZeRO ≥ 2: `grads` is empty).
    pub(crate) gshard: Vec<f32>,
    /// How this run splits its work over ranks.
    pub layout: Layout,
    /// The single-worker model (the full layout), for evaluation and checkpoints.
    pub(crate) full_model: Gpt,
    /// Sequences per forward pass on this rank.
    pub(crate) micro: usize,
    pub(crate) clock: StepClock,
    /// What the last step's pipeline did on this rank (pipeline ranks only).
    pub pipeline: Option<PipelineStats>,
    /// Every step taken (also before a resume, as the checkpoint's metrics recorded them).
    pub history: Vec<StepStats>,
    /// Context parallelism: this step's seconds in blockwise attention.
    pub(crate) attend_clock: crate::nn::context::AttendClock,
    /// A mixture's tally of the last step, summed over every rank (`[layer][rows of each
    /// expert…, balancing losses]`; empty for a dense model).
    pub(crate) moe_tally: Vec<f32>,
}

impl Trainer {
    /// The single worker: the same trainer on the 1×1×1 mesh.
    pub fn new(cfg: TrainConfig) -> Result<Trainer> {
        Trainer::on_mesh(cfg, Mesh::solo()?, &Layout::default())
    }

    /// One rank of a parallel run: every rank of the mesh calls this with the same `cfg` and
    /// `layout` (whose degrees are the mesh's).
    pub fn on_mesh(cfg: TrainConfig, mesh: Mesh, layout: &Layout) -> Result<Trainer> {
        if MeshShape::of(layout) != mesh.shape {
            return Err(Error::Layout(format!("the layout '{layout}' is not the mesh's {}", mesh.shape)));
        }
        let run = Trainer::prepare(cfg, layout)?;
        Trainer::build(run, mesh)
    }

    /// `on_mesh` from the world communicator: the run's settings, data and layout are checked
    /// before the mesh's groups are built, so that a bad setting starts no collective.
    pub fn on_world(cfg: TrainConfig, world: &brigade_comm::Comm, layout: &Layout) -> Result<Trainer> {
        let run = Trainer::prepare(cfg, layout)?;
        Trainer::build(run, Mesh::new(world, MeshShape::of(layout))?)
    }

    /// Gradient elements per data-parallel all-reduce bucket (ZeRO-0; default 25 MB of f32,
    /// as PyTorch DDP's).
    pub fn set_bucket_elems(&mut self, elems: usize) -> Result<()> {
        let dpc = DataParallel { bucket_elems: elems, ..self.dpc };
        dpc.validate()?;
        self.dpc = dpc;
        Ok(())
    }

    /// The pipeline's lists, when the layout runs a pipeline (pp > 1, model chunks, or
    /// recompute).
    pub fn pipeline_plan(&self) -> Option<&Plan> {
        self.layout.runs_executor().then_some(&self.list)
    }

    /// The pipeline's bubble on paper: its lists on the costs they were fitted to (ZB-H1 after
    /// a step), else on balanced unit costs (`simulate::bubble_theory`).
    pub fn pipeline_theory(&self) -> Option<f64> {
        let plan = self.pipeline_plan()?;
        Some(match &self.fitted {
            Some(c) => pipeline::simulate(plan, c).map_or(f64::NAN, |r| r.bubble),
            None => pipeline::simulate::bubble_theory(plan),
        })
    }

    /// ZB-H1's lists rebuilt after each step for the actions' measured times: each kind's mean
    /// over the step, the slowest rank's (a max over every rank — every rank takes part in each
    /// step, restarted or not — so that all build the same lists). Its W's cost less than its
    /// B's (attention's and the norms' backward are all input gradient), and the lists built
    /// for equal costs idle more on such (`schedule::zero_bubble_h1`). Any lists sum the
    /// gradients alike: micro-batches in order within the B's and within the W's.
    fn fit_lists(&mut self) -> Result<()> {
        let Some(mut secs) = self.measured_actions.take() else { return Ok(()) };
        if self.list.pp == 1 {
            return Ok(());
        }
        let world = self.mesh.group(&Axis::RANKS);
        let err = |e| Error::Train(format!("agreeing on the pipeline's measured action times failed: {e}"));
        world.all_reduce(&mut secs, ReduceOp::Max).map_err(err)?;
        let [f, b, w] = secs.map(f64::from);
        let costs = Costs { forward: f, backward: b + w, backward_input: b, backward_weight: w, transfer: 0.0 };
        let l = &self.list;
        self.list = pipeline::build_for(l.kind, l.pp, l.m, l.v, &costs)?;
        self.fitted = Some(costs);
        Ok(())
    }

    pub fn done(&self) -> bool {
        self.step >= self.cfg.steps
    }

    pub fn tokens_per_step(&self) -> usize {
        self.cfg.batch * self.seq
    }

    /// Takes the next optimizer step on the run's own batch (a pure function of seed and step).
    pub fn train_step(&mut self) -> Result<StepStats> {
        let t0 = Instant::now();
        let batch = self.data.batch(self.cfg.seed, self.step, self.cfg.batch, self.seq);
        self.trace("data", Part::Other("data"), self.step + 1, t0);
        let data_s = t0.elapsed().as_secs_f64();
        let pos = if self.cfg.doc_mask { batch.pos.as_deref() } else { None };
        let mut s = self.step_on_docs(&batch.x, &batch.y, pos)?;
        s.idle_s += data_s;
        s.tokens_per_s = s.tokens as f64 / (s.tokens as f64 / s.tokens_per_s + data_s);
        if let Some(last) = self.history.last_mut() {
            *last = s;
        }
        Ok(s)
    }

    /// One optimizer step on the given global batch (`batch` sequences of equal length):
    /// accumulate the gradient over micro-batches, clip it, AdamW.
    pub fn step_on(&mut self, x: &[u32], y: &[i32]) -> Result<StepStats> {
        self.step_on_docs(x, y, None)
    }

    /// `step_on` a batch of packed documents kept apart: `pos` (one per token) is each token's
    /// position in its document (`tensor::docs`); `None`, one document a sequence.
    pub fn step_on_docs(&mut self, x: &[u32], y: &[i32], pos: Option<&[u32]>) -> Result<StepStats> {
        let started = Instant::now();
        self.clock = StepClock::default();
        let step = self.step + 1;
        let lr = self.sched.at(self.step);
        let (loss_sum, count) = self.accumulate_gradients_docs(x, y, pos)?;
        let moe = self.moe_load()?;
        let loss = (loss_sum / count as f64) as f32;
        if !loss.is_finite() {
            return Err(Error::Train(self.explain_nonfinite_loss(loss, step)));
        }
        let t0 = Instant::now();
        let tp = Tp::new(self.mesh.group(&[Axis::Tp]), self.layout.sp);
        // every parameter once: the head's copy of the tied table left out
        let layout = &self.norm_layout;
        let ranges = |which| self.shards.compact_ranges(layout, which);
        let (cut, replicated, shared) = (ranges(Cut::Cut), ranges(Cut::Replicated), ranges(Cut::Shared));
        let copies = kv_copies(&self.parts.first().cfg, tp.size());
        // the summed gradient this rank updates from: the whole one, or its ZeRO pieces
        let g = if self.dpc.zero == 0 { &mut self.grads } else { &mut self.gshard };
        let mut sq = tp_state::local_sq_norm(&tp, g, (&cut, &replicated), (&shared, copies));
        if self.layout.divides_experts() {
            // (`norm_layout` then leaves the routed experts out) each expert once: this rank's
            // block of them, summed over the expert group — on the tensor-parallel group's first
            // rank only (every rank of it holds the experts whole, and the sum below adds them)
            let mine: f64 = self.parts.layout.expert_ranges().into_iter().map(|r| grad_sq_norm(&g[r])).sum();
            let mine = data::sum_scalar(self.mesh.group(&[Axis::Ep]), mine)?;
            sq += if tp.rank() == 0 { mine } else { 0.0 };
        }
        self.trace("gradient norm", Part::Optimizer, step, t0);
        // the sums of the squares over the groups: tp's slices, the replicas' ZeRO pieces, pp's
        // stages
        for (axes, sharded) in [(&[Axis::Tp][..], false), (REPLICAS, true), (&[Axis::Pp], false)] {
            let t0 = Instant::now();
            let group = self.mesh.group(axes);
            sq = if sharded { data::sum_sharded(group, sq, &self.dpc)? } else { data::sum_scalar(group, sq)? };
            note_comm((&mut self.timeline, &mut self.clock), &self.mesh, "gradient norm sum", axes, step, t0);
        }
        let grad_norm = sq.sqrt() as f32;
        // clipping is the factor AdamW applies as it reads each gradient
        let clip = clip_factor(grad_norm, self.cfg.grad_clip);
        let t0 = Instant::now();
        match self.dpc.zero {
            0 => self.opt.step(&mut self.params, &self.grads, clip, lr),
            1 | 2 => {
                let mut mine = self.shards.compact(&self.params);
                self.opt.step(&mut mine, &self.gshard, clip, lr);
                self.trace("adamw", Part::Optimizer, step, t0);
                let t0 = Instant::now();
                self.shards.gather(self.mesh.group(REPLICAS), &mine, &mut self.params)?;
                note_comm(
                    (&mut self.timeline, &mut self.clock),
                    &self.mesh,
                    "parameter all-gather (ZeRO)",
                    REPLICAS,
                    step,
                    t0,
                );
            }
            _ => self.opt.step(&mut self.pshard, &self.gshard, clip, lr),
        }
        if self.dpc.zero != 1 && self.dpc.zero != 2 {
            self.trace("adamw", Part::Optimizer, step, t0);
        }
        self.update_expert_bias()?;
        self.fit_lists()?;
        self.step = step;
        self.losses.push(loss);
        self.grad_norms.push(grad_norm);
        // (the spans above counted the norm's tensor-parallel sum: off the trace)
        self.mesh.group(&[Axis::Tp]).take_trace();
        let wall = started.elapsed().as_secs_f64();
        let c = self.clock;
        let on = |a: Axis| c.comm[a as usize];
        let (tp_comm_s, dp_comm_s, pp_comm_s, cp_comm_s) = (on(Axis::Tp), on(Axis::Dp), on(Axis::Pp), on(Axis::Cp));
        let compute_s = c.compute.max(0.0);
        let comm_s = tp_comm_s + cp_comm_s + dp_comm_s + pp_comm_s;
        let s = StepStats {
            step,
            loss,
            lr,
            grad_norm,
            tokens: x.len(),
            tokens_per_s: x.len() as f64 / wall,
            compute_s,
            optimizer_s: c.optimizer,
            comm_s,
            tp_comm_s,
            dp_comm_s,
            pp_comm_s,
            cp_comm_s,
            attention_s: c.attend,
            pipeline_wait_s: c.wait,
            idle_s: (wall - compute_s - c.optimizer - comm_s - c.wait).max(0.0),
            bubble: self.pipeline.map_or(0.0, |p| p.bubble()),
            moe_load_max_over_mean: moe.0,
            moe_balance_loss: moe.1,
            dp_overlapped: c.dp_reductions.0,
            dp_reductions: c.dp_reductions.1,
        };
        self.history.push(s);
        Ok(s)
    }

    /// The gradient of the mean loss over every counted target of the global batch, summed
    /// over its micro-batches (each scaled by 1 / the batch's count, not its own), into
    /// `self.grads`. Returns (sum of token losses, counted targets).
    pub fn accumulate_gradients(&mut self, x: &[u32], y: &[i32]) -> Result<(f64, usize)> {
        self.accumulate_gradients_docs(x, y, None)
    }

    /// `accumulate_gradients` over packed documents at positions `pos` (as `step_on_docs`).
    pub fn accumulate_gradients_docs(&mut self, x: &[u32], y: &[i32], pos: Option<&[u32]>) -> Result<(f64, usize)> {
        let b = self.cfg.batch;
        if x.len() != y.len() || x.is_empty() || !x.len().is_multiple_of(b) {
            return Err(Error::Train(format!(
                "a batch of {} tokens and {} targets does not split into {b} equal sequences",
                x.len(),
                y.len()
            )));
        }
        let t = x.len() / b;
        if !crate::tensor::docs::Docs::of(pos).fits(x.len(), t) {
            return Err(Error::Train(format!(
                "document positions must be one per token, each at most its position in its sequence of {t}"
            )));
        }
        self.model.check_input(x, b, t)?;
        let vocab = self.model.cfg.vocab_size;
        if let Some(&bad) =
            y.iter().find(|&&v| v != crate::tensor::loss::IGNORE && !(0..vocab as i64).contains(&(v as i64)))
        {
            return Err(Error::Data(format!("target {bad} is outside the vocabulary of {vocab}")));
        }
        let count = y.iter().filter(|&&v| v != crate::tensor::loss::IGNORE).count();
        if count == 0 {
            return Err(Error::Data("a batch has no target tokens".into()));
        }
        crate::tensor::elementwise::zero(&mut self.grads);
        crate::tensor::elementwise::zero(&mut self.gshard);
        // a mixture's expert load counts this step's backwards only
        self.parts.chunks.iter().for_each(|c| drop(c.take_moe_tally()));
        // Every target of the global batch counts once: the gradients of the dp ranks then sum
        // to the single worker's.
        let scale = 1.0 / count as f32;
        // This rank's share of the global batch: a contiguous block of whole sequences.
        let (replica, replicas) = (self.mesh.coords[Axis::Dp], self.mesh.shape.degree(Axis::Dp));
        let per_rank = (b / replicas) * t;
        let mine = replica * per_rank..(replica + 1) * per_rank;
        let pos = pos.map(|p| &p[mine.clone()]);
        let (x, y) = (&x[mine.clone()], &y[mine]);
        let loss_sum = match self.context_split(t)? {
            None => self.accumulate_share((x, y, pos), (t, None), scale)?,
            Some(split) => {
                // and of each of its sequences, the rows this rank of the context group holds:
                // each token with its own target (the next token's id, wherever that token is)
                let rows = split.positions(self.mesh.coords[Axis::Cp]);
                let pick = |n: usize| (0..n / t).flat_map(|s| rows.iter().map(move |&r| s * t + r as usize));
                let x: Vec<u32> = pick(x.len()).map(|i| x[i]).collect();
                let y: Vec<i32> = pick(y.len()).map(|i| y[i]).collect();
                let pos: Option<Vec<u32>> = pos.map(|p| pick(p.len()).map(|i| p[i]).collect());
                self.accumulate_share((&x, &y, pos.as_deref()), (split.local(), Some(split)), scale)?
            }
        };
        let t0 = Instant::now();
        let loss_sum = data::sum_scalar(self.mesh.group(REPLICAS), loss_sum)?;
        note_comm((&mut self.timeline, &mut self.clock), &self.mesh, "loss sum", REPLICAS, self.step + 1, t0);
        Ok((loss_sum, count))
    }

    /// A mixture's load over the global batch of the step just accumulated: (the busiest
    /// expert's rows over the mean, the largest over layers; the balancing loss's mean over
    /// layers and sequences) — (0, 0) for a dense model. Every rank of the mesh must call it.
    /// Also keeps the summed tally for `update_expert_bias`.
    fn moe_load(&mut self) -> Result<(f64, f64)> {
        let Some(e) = self.parts.first().cfg.experts() else { return Ok((0.0, 0.0)) };
        let mut t = vec![0f64; self.parts.first().cfg.n_layer * (e + 1)];
        for c in &self.parts.chunks {
            t.iter_mut().zip(c.take_moe_tally()).for_each(|(a, b)| *a += b);
        }
        // summed over the replicas (their own sequences) and the stages (their own layers),
        // in f32: counts are exact below 2²⁴
        let mut buf: Vec<f32> = t.iter().map(|&x| x as f32).collect();
        for axes in [REPLICAS, &[Axis::Pp][..]] {
            self.mesh
                .group(axes)
                .all_reduce(&mut buf, brigade_comm::ReduceOp::Sum)
                .map_err(|e| Error::Train(format!("expert load sum: {e}")))?;
        }
        let (mut worst, mut balance) = (0f64, 0f64);
        for layer in buf.chunks(e + 1) {
            let rows: f64 = layer[..e].iter().map(|&x| x as f64).sum();
            if rows > 0.0 {
                let max = layer[..e].iter().fold(0f32, |m, &x| m.max(x)) as f64;
                worst = worst.max(max / (rows / e as f64));
            }
            balance += layer[e] as f64;
        }
        let layers = self.parts.first().cfg.moe_layers().max(1);
        self.moe_tally = buf;
        Ok((worst, balance / (layers * self.cfg.batch) as f64))
    }

    /// The auxiliary-loss-free balancing's step (DeepSeek-V3) of every mixture with a bias this
    /// rank holds, from the step's load over the global batch — the same counts on every rank,
    /// so every copy of a bias moves alike. After the optimizer step.
    fn update_expert_bias(&mut self) -> Result<()> {
        let biased = match self.parts.first().cfg.family {
            crate::models::family::Family::Llama(a) => a.moe.is_some_and(|m| m.bias_rate > 0.0),
            crate::models::family::Family::Gpt2 => false,
        };
        if self.moe_tally.is_empty() || !biased {
            return Ok(());
        }
        if self.dpc.zero >= 3 {
            // the biases live in ZeRO-3 pieces: the parameters gathered, moved, cut again (a
            // whole all-gather a step: what a per-tensor placement of the pieces would save)
            let mut full = vec![0f32; self.parts.layout.total];
            self.shards.gather(self.mesh.group(REPLICAS), &self.pshard, &mut full)?;
            for (c, chunk) in self.parts.chunks.iter().enumerate() {
                chunk.update_expert_bias(&mut full[self.parts.spans[c].clone()], &self.moe_tally);
            }
            self.pshard = self.shards.compact(&full);
            return Ok(());
        }
        for (c, chunk) in self.parts.chunks.iter().enumerate() {
            chunk.update_expert_bias(&mut self.params[self.parts.spans[c].clone()], &self.moe_tally);
        }
        Ok(())
    }

    /// The gradient left by the last `accumulate_gradients` (a step leaves it as it was: the
    /// clipping factor is applied inside AdamW), on a rank without ZeRO (with ZeRO it is summed only in this rank's pieces).
    pub fn grads(&self) -> &[f32] {
        &self.grads
    }

    /// The summed gradient of the last `accumulate_gradients` over this rank's whole
    /// (tensor-parallel-local) parameters, in `parts.layout`, before clipping: its own, or under
    /// ZeRO ≥ 1 gathered from the dp group's pieces (every rank of the group must call it then).
    pub fn local_grads(&self) -> Result<std::borrow::Cow<'_, [f32]>> {
        if self.dpc.zero == 0 {
            return Ok(std::borrow::Cow::Borrowed(&self.grads));
        }
        let mut full = vec![0f32; self.parts.layout.total];
        self.shards.gather(self.mesh.group(REPLICAS), &self.gshard, &mut full)?;
        Ok(std::borrow::Cow::Owned(full))
    }

    /// This rank's whole (tensor-parallel-local) parameters: its own, or under ZeRO-3 gathered
    /// from the dp group's pieces (every rank of the group must call it then).
    pub fn local_params(&self) -> Result<std::borrow::Cow<'_, [f32]>> {
        if self.dpc.zero < 3 {
            return Ok(std::borrow::Cow::Borrowed(&self.params));
        }
        let mut full = vec![0f32; self.parts.layout.total];
        self.shards.gather(self.mesh.group(REPLICAS), &self.pshard, &mut full)?;
        Ok(std::borrow::Cow::Owned(full))
    }

    /// How a context group splits sequences of `t` tokens (`None` without context
    /// parallelism).
    pub(crate) fn context_split(&self, t: usize) -> Result<Option<SeqSplit>> {
        let cp = self.mesh.shape.degree(Axis::Cp);
        (cp > 1).then(|| SeqSplit::new(cp, t, self.layout.cp_order)).transpose()
    }

    /// Sequences per forward pass on this rank.
    pub fn micro_batch(&self) -> usize {
        self.micro
    }

    /// Adds a span to the timeline, if one is being recorded.
    pub fn trace(&mut self, name: impl Into<String>, part: Part, step: usize, start: Instant) {
        note(&mut self.timeline, &mut self.clock, name, part, step, (start, Instant::now()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What docs/training.md promises for unset settings and what it refuses, checked in the library.
    #[test]
    fn defaults_and_refusals_of_a_run() {
        let base = TrainConfig { n_embd: Some(16), n_head: Some(2), steps: 100, lr: 1e-2, ..TrainConfig::default() };
        let tr = Trainer::new(base.clone()).unwrap();
        // "482+139=" and the reversed 4-digit sum with its newline: 13 tokens, 12 predicted
        assert_eq!(tr.seq, 12);
        // warmup 5% of steps, cosine down to lr / 10
        assert_eq!(tr.sched.warmup, 5);
        assert!((tr.sched.min_lr - 1e-3).abs() < 1e-9, "{}", tr.sched.min_lr);
        assert!((tr.sched.at(0) - 2e-3).abs() < 1e-9, "{}", tr.sched.at(0));
        assert!(Trainer::new(TrainConfig { seq: Some(12), ..base.clone() }).is_ok());
        assert!(Trainer::new(TrainConfig { seq: Some(13), ..base.clone() }).is_err());
        assert!(Trainer::new(TrainConfig { block_size: Some(11), ..base.clone() }).is_err());
        assert!(Trainer::new(TrainConfig { block_size: Some(12), ..base.clone() }).is_ok());
        // a batch that is not `batch` whole sequences of tokens with targets
        let mut tr = Trainer::new(TrainConfig { batch: 2, ..base }).unwrap();
        let x = vec![1u32; 24];
        assert!(tr.step_on(&x, &[1i32; 23]).is_err(), "targets shorter than tokens");
        assert!(tr.step_on(&x[..23], &[1i32; 23]).is_err(), "not whole sequences");
        assert!(tr.step_on(&[], &[]).is_err(), "empty");
        assert!(tr.step_on(&x, &[1i32; 24]).is_ok());
    }
}
