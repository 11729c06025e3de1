//! The training loop: batch → micro-batches → forward/backward → clip → AdamW.

use super::addition::Addition;
use super::config::TrainConfig;
use super::data::{Dataset, TextData, Tokenizer};
use super::optimizer::{clip_to, AdamW, LrSchedule};
use super::timeline::Timeline;
use crate::error::{Error, Result};
use crate::models::{generate, Activations, Gpt, SampleOptions};
use crate::parallel::data::store::ShardStore;
use crate::parallel::data::zero::Shards;
use crate::parallel::data::{self, DataParallel};
use crate::parallel::tensor::{state as tp_state, Tp};
use crate::parallel::{Mesh, MeshShape, Settings};
use std::time::Instant;

pub use super::persist::saved_config;

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
    /// The rest of the step: data, bookkeeping.
    pub idle_s: f64,
}

/// Where this step's time went so far on this rank, in seconds.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct StepClock {
    compute: f64,
    comm: f64,
}

/// Adds the span `start..end` to the timeline (if one is recorded) and to the step's clock.
fn note(
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

#[derive(Clone, Debug)]
pub enum EvalReport {
    /// Exact-match accuracy on held-out problems, with a few (prompt, expected, model) rows.
    Addition { correct: usize, total: usize, examples: Vec<(String, String, String)> },
    /// Mean loss on the held-out tail of the text.
    Text { val_loss: f32 },
}

impl std::fmt::Display for EvalReport {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            EvalReport::Addition { correct, total, .. } => {
                write!(f, "held-out accuracy {:.1}% ({correct}/{total})", 100.0 * *correct as f64 / *total as f64)
            }
            EvalReport::Text { val_loss } => write!(f, "validation loss {val_loss:.4}"),
        }
    }
}

/// A run checked before any rank communicates (see `Trainer::prepare`).
struct Prepared {
    cfg: TrainConfig,
    tokenizer: Tokenizer,
    mcfg: crate::models::GptConfig,
    data: Dataset,
    seq: usize,
    mb: usize,
    settings: Settings,
}

pub struct Trainer {
    pub cfg: TrainConfig,
    pub model: Gpt,
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
    pub(crate) acts: Activations,
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
    /// Sequence parallelism inside the tensor-parallel group.
    pub(crate) sp: bool,
    /// The single-worker model (the full layout), for evaluation and checkpoints.
    pub(crate) full_model: Gpt,
    /// Sequences per forward pass on this rank.
    pub(crate) micro: usize,
    pub(crate) clock: StepClock,
    /// Every step taken (also before a resume, as the checkpoint's metrics recorded them).
    pub history: Vec<StepStats>,
}

impl Trainer {
    /// The single worker: the same trainer on the 1×1×1 mesh.
    pub fn new(cfg: TrainConfig) -> Result<Trainer> {
        Trainer::on_mesh(cfg, Mesh::solo()?, Settings::default())
    }

    /// One rank of a parallel run: every rank of the mesh calls this with the same `cfg`.
    pub fn on_mesh(cfg: TrainConfig, mesh: Mesh, settings: Settings) -> Result<Trainer> {
        let run = Trainer::prepare(cfg, mesh.shape, settings)?;
        Trainer::build(run, mesh)
    }

    /// `on_mesh` from the world communicator: the run's settings, data and layout are checked
    /// before the mesh's groups are built, so that a bad setting starts no collective.
    pub fn on_world(
        cfg: TrainConfig,
        world: &brigade_comm::Comm,
        shape: MeshShape,
        settings: Settings,
    ) -> Result<Trainer> {
        let run = Trainer::prepare(cfg, shape, settings)?;
        Trainer::build(run, Mesh::new(world, shape)?)
    }

    /// Everything about a run that needs no peer: settings, tokenizer, data, the layout
    /// against the model and the batch.
    fn prepare(mut cfg: TrainConfig, shape: MeshShape, settings: Settings) -> Result<Prepared> {
        cfg.validate()?;
        let Settings { data: dpc, sp } = settings;
        dpc.validate()?;
        let MeshShape { dp, pp, tp } = shape;
        if pp > 1 {
            return Err(Error::Config(format!(
                "pp={pp}: pipeline parallelism is not implemented yet; use data (dp) and tensor (tp) parallelism"
            )));
        }
        // Sequences per forward pass on one rank; unset: the rank's whole share of the batch.
        let mb = cfg.micro_batch.unwrap_or(cfg.batch / dp).max(1);
        if !cfg.batch.is_multiple_of(dp * mb) {
            return Err(Error::Config(format!(
                "the global batch of {} sequences does not split into dp={dp} shards of whole micro-batches of {mb}; make batch a multiple of dp × micro_batch = {}",
                cfg.batch,
                dp * mb
            )));
        }
        // The checkpoint records where the data came from: absolute, so that a resume from
        // another directory reads the same file.
        if let Some(p) = &cfg.data {
            cfg.data = Some(std::path::absolute(p).map_err(|e| Error::io(p, e))?);
        }
        let tokenizer = match &cfg.tokenizer {
            Some(p) => Tokenizer::from_file(p)?,
            None => Tokenizer::Bytes,
        };
        let mcfg = cfg.model_config(tokenizer.vocab_size())?;
        crate::models::gpt::check_tp(&mcfg, tp)?;
        let (data, seq) = match &cfg.data {
            None => {
                let a = cfg.addition().expect("no data file: the addition task");
                let natural = a.seq_len() - 1;
                if cfg.seq.is_some_and(|s| s != natural) {
                    return Err(Error::Train(format!(
                        "the addition task with {} digits has sequences of {natural} tokens; drop --seq or set it to {natural}",
                        cfg.digits
                    )));
                }
                (Dataset::Addition(a), natural)
            }
            Some(path) => {
                let seq = cfg.seq.unwrap_or(mcfg.block_size.min(256));
                (Dataset::Text(TextData::load(path, &tokenizer, seq)?), seq)
            }
        };
        if seq == 0 || seq > mcfg.block_size {
            return Err(Error::Train(format!(
                "sequence length {seq} must be between 1 and the model's block_size {}; lower --seq or raise block_size",
                mcfg.block_size
            )));
        }
        if sp && !(mb * seq).is_multiple_of(tp) {
            return Err(Error::Config(format!(
                "sp=1 splits each micro-batch's {} tokens (micro-batch {mb} × seq {seq}) into tp={tp} blocks of rows, which does not divide; pick a micro-batch or seq whose product is a multiple of {tp}, or drop sp",
                mb * seq
            )));
        }
        let need = super::memory::training_memory(&mcfg, mb, seq);
        super::memory::check_fits(&need, &format!("training {} at micro-batch {mb} × seq {seq}", cfg.model))?;
        Ok(Prepared { cfg, tokenizer, mcfg, data, seq, mb, settings })
    }

    /// This rank's trainer for a prepared run.
    fn build(run: Prepared, mesh: Mesh) -> Result<Trainer> {
        let Prepared { cfg, tokenizer, mcfg, data, seq, mb, settings: Settings { data: dpc, sp } } = run;
        let model = Gpt::shard(mcfg, mesh.coords.tp, mesh.shape.tp)?;
        // tensor-parallel collectives run inside forward and backward: timed from their trace
        mesh.tp.enable_tracing(mesh.tp.size() > 1);
        let mut params = model.init_params(cfg.seed);
        let shards = Shards::new(&model.units, mesh.dp.size(), mesh.dp.rank(), dpc.zero > 0);
        let opt = AdamW::over(cfg.adamw, &model.layout, &shards.pieces);
        // what each ZeRO stage keeps whole, and what only in pieces
        let pshard = if dpc.zero >= 3 { shards.compact(&std::mem::take(&mut params)) } else { Vec::new() };
        let gshard = if dpc.zero >= 1 { vec![0.0; shards.len] } else { Vec::new() };
        let grads = if dpc.zero >= 2 { Vec::new() } else { vec![0.0; model.layout.total] };
        let sched = LrSchedule {
            max_lr: cfg.lr,
            min_lr: cfg.min_lr.unwrap_or(cfg.lr / 10.0),
            warmup: cfg.warmup.unwrap_or(cfg.steps / 20).max(1),
            total: cfg.steps,
        };
        Ok(Trainer {
            grads,
            model,
            params,
            opt,
            step: 0,
            data,
            tokenizer,
            seq,
            losses: Vec::new(),
            grad_norms: Vec::new(),
            acts: Activations::default(),
            sched,
            timeline: None,
            cfg,
            mesh,
            dpc,
            sp,
            full_model: Gpt::new(mcfg)?,
            shards,
            pshard,
            gshard,
            micro: mb,
            clock: StepClock::default(),
            history: Vec::new(),
        })
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
        let (x, y) = self.data.batch(self.cfg.seed, self.step, self.cfg.batch, self.seq);
        self.trace("data", "data", self.step + 1, t0);
        let data_s = t0.elapsed().as_secs_f64();
        let mut s = self.step_on(&x, &y)?;
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
        let started = Instant::now();
        self.clock = StepClock::default();
        let step = self.step + 1;
        let lr = self.sched.at(self.step);
        let (loss_sum, count) = self.accumulate_gradients(x, y)?;
        let loss = (loss_sum / count as f64) as f32;
        if !loss.is_finite() {
            return Err(Error::Train(self.explain_nonfinite_loss(loss, step)));
        }
        let t0 = Instant::now();
        let tp = Tp::new(&self.mesh.tp, self.sp);
        let layout = &self.model.layout;
        let (cut, replicated) = (self.shards.compact_ranges(layout, false), self.shards.compact_ranges(layout, true));
        // the summed gradient this rank updates from: the whole one, or its ZeRO pieces
        let g = if self.dpc.zero == 0 { &mut self.grads } else { &mut self.gshard };
        let sq = tp_state::grad_sq_norm(&tp, g, &cut, &replicated)?;
        let sq = data::sum_sharded(&self.mesh.dp, sq, &self.dpc)?;
        let grad_norm = sq.sqrt() as f32;
        clip_to(g, grad_norm, self.cfg.grad_clip);
        self.trace("clip", "optimizer", step, t0);
        let t0 = Instant::now();
        match self.dpc.zero {
            0 => self.opt.step(&mut self.params, &self.grads, lr),
            1 | 2 => {
                let mut mine = self.shards.compact(&self.params);
                self.opt.step(&mut mine, &self.gshard, lr);
                self.trace("adamw", "optimizer", step, t0);
                let t0 = Instant::now();
                self.shards.gather(&self.mesh.dp, &mine, &mut self.params)?;
                self.trace("parameter all-gather (ZeRO)", "comm", step, t0);
            }
            _ => self.opt.step(&mut self.pshard, &self.gshard, lr),
        }
        if self.dpc.zero != 1 && self.dpc.zero != 2 {
            self.trace("adamw", "optimizer", step, t0);
        }
        self.step = step;
        self.losses.push(loss);
        self.grad_norms.push(grad_norm);
        // the tensor-parallel collectives ran inside forward and backward: count them as comm
        let events = self.mesh.tp.take_trace();
        let tp_s: f64 = events.iter().map(|e| (e.end - e.start).as_secs_f64()).sum();
        if let Some(tl) = self.timeline.as_mut() {
            tl.add_comm(self.mesh.tp.trace_epoch(), &events, step);
        }
        let wall = started.elapsed().as_secs_f64();
        let (compute_s, comm_s) = ((self.clock.compute - tp_s).max(0.0), self.clock.comm + tp_s);
        let s = StepStats {
            step,
            loss,
            lr,
            grad_norm,
            tokens: x.len(),
            tokens_per_s: x.len() as f64 / wall,
            compute_s,
            comm_s,
            idle_s: (wall - compute_s - comm_s).max(0.0),
        };
        self.history.push(s);
        Ok(s)
    }

    /// The gradient of the mean loss over every counted target of the global batch, summed
    /// over its micro-batches (each scaled by 1 / the batch's count, not its own), into
    /// `self.grads`. Returns (sum of token losses, counted targets).
    pub fn accumulate_gradients(&mut self, x: &[u32], y: &[i32]) -> Result<(f64, usize)> {
        let b = self.cfg.batch;
        if x.len() != y.len() || x.is_empty() || !x.len().is_multiple_of(b) {
            return Err(Error::Train(format!(
                "a batch of {} tokens and {} targets does not split into {b} equal sequences",
                x.len(),
                y.len()
            )));
        }
        let t = x.len() / b;
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
        let step = self.step + 1;
        self.grads.fill(0.0);
        self.gshard.fill(0.0);
        let mb = self.micro;
        // Every target of the global batch counts once: the gradients of the dp ranks then sum
        // to the single worker's.
        let scale = 1.0 / count as f32;
        let mut loss_sum = 0f64;
        // This rank's share of the global batch: a contiguous block of whole sequences.
        let per_rank = (b / self.mesh.shape.dp) * t;
        let mine = self.mesh.coords.dp * per_rank..(self.mesh.coords.dp + 1) * per_rank;
        let (x, y) = (&x[mine.clone()], &y[mine]);
        let n_micro = x.len() / (mb * t);
        let overlap = data::overlaps(&self.mesh.dp, &self.dpc);
        let tp = Tp::new(&self.mesh.tp, self.sp);
        let (dp, zero) = (&self.mesh.dp, self.dpc.zero);
        for (i, (xm, ym)) in x.chunks(mb * t).zip(y.chunks(mb * t)).enumerate() {
            let t0 = Instant::now();
            let (model, acts) = (&self.model, &mut self.acts);
            if zero >= 2 {
                // each unit's gradient reduce-scattered into this rank's pieces as backward
                // finishes it; under ZeRO-3 each unit's parameters gathered when needed
                let full = (zero == 2).then_some(&self.params[..]);
                let mut store = ShardStore::new(&self.shards, dp, full, &self.pshard, &mut self.gshard);
                model.forward_units(&tp, &mut store, xm, mb, t, acts)?;
                loss_sum += model.loss_tp(&tp, ym, acts)?.0;
                let t1 = Instant::now();
                model.backward_units(&tp, &mut store, xm, ym, scale, acts)?;
                let t2 = Instant::now();
                store.finish()?;
                let (tl, clock) = (&mut self.timeline, &mut self.clock);
                note(tl, clock, format!("forward mb{i}"), "compute", step, (t0, t1));
                note(tl, clock, format!("backward mb{i}"), "compute", step, (t1, t2));
                note(tl, clock, "gradient reduce-scatter (exposed)", "comm", step, (t2, Instant::now()));
                continue;
            }
            model.forward_tp(&tp, &self.params, xm, mb, t, acts)?;
            loss_sum += model.loss_tp(&tp, ym, acts)?.0;
            note(&mut self.timeline, &mut self.clock, format!("forward mb{i}"), "compute", step, (t0, Instant::now()));
            let t0 = Instant::now();
            let (params, grads) = (&self.params, &mut self.grads);
            if overlap && i + 1 == n_micro {
                // The last micro-batch completes each layer's gradient: its buckets are
                // all-reduced while the earlier layers run backward.
                let mut reducer = data::BucketReducer::new(dp, grads.len(), &self.dpc);
                model.backward_tp(&tp, params, grads, xm, ym, scale, acts, &mut |g, from| reducer.ready(g, from))?;
                let t1 = Instant::now();
                reducer.finish(grads)?;
                let (tl, clock) = (&mut self.timeline, &mut self.clock);
                note(tl, clock, format!("backward mb{i}"), "compute", step, (t0, t1));
                note(tl, clock, "gradient reduction (exposed)", "comm", step, (t1, Instant::now()));
            } else {
                model.backward_tp(&tp, params, grads, xm, ym, scale, acts, &mut |_, _| {})?;
                let span = (t0, Instant::now());
                note(&mut self.timeline, &mut self.clock, format!("backward mb{i}"), "compute", step, span);
            }
        }
        let t0 = Instant::now();
        if zero == 1 {
            self.shards.reduce_scatter(dp, &self.grads, &mut self.gshard, false)?;
        }
        let g = if zero == 0 { &mut self.grads } else { &mut self.gshard };
        tp_state::sum_replicated_grads(&tp, g, &self.shards.compact_ranges(&self.model.layout, true))?;
        let loss_sum = data::sum_scalar(dp, loss_sum)?;
        note(&mut self.timeline, &mut self.clock, "gradient reduction", "comm", step, (t0, Instant::now()));
        Ok((loss_sum, count))
    }

    /// The gradient left by the last `accumulate_gradients` (or, after a step, clipped), on a
    /// rank without ZeRO (with ZeRO it is summed only in this rank's pieces).
    pub fn grads(&self) -> &[f32] {
        &self.grads
    }

    /// This rank's whole (tensor-parallel-local) parameters: its own, or under ZeRO-3 gathered
    /// from the dp group's pieces (every rank of the group must call it then).
    pub fn local_params(&self) -> Result<std::borrow::Cow<'_, [f32]>> {
        if self.dpc.zero < 3 {
            return Ok(std::borrow::Cow::Borrowed(&self.params));
        }
        let mut full = vec![0f32; self.model.layout.total];
        self.shards.gather(&self.mesh.dp, &self.pshard, &mut full)?;
        Ok(std::borrow::Cow::Owned(full))
    }

    /// Sequences per forward pass on this rank.
    pub fn micro_batch(&self) -> usize {
        self.micro
    }

    /// A non-finite loss, with what most likely caused it.
    fn explain_nonfinite_loss(&self, loss: f32, step: usize) -> String {
        // (under ZeRO-3 this rank holds only pieces: no parameter is named)
        let bad_param = match self.params.len() == self.model.layout.total {
            true => self.model.layout.specs.iter().find(|s| s.view.of(&self.params).iter().any(|v| !v.is_finite())),
            false => None,
        };
        let lr = self.cfg.lr;
        if self.grad_norms.is_empty() {
            // Nothing was updated in this process: the weights or the data are at fault.
            return match bad_param {
                Some(p) => format!("loss is {loss} at step {step}, before any update in this run: parameter '{}' holds non-finite values; the checkpoint is corrupt, resume from an earlier one", p.name),
                None => format!("loss is {loss} at step {step}, before any update in this run: the weights or the data overflow the forward pass (check the checkpoint and the data), not the learning rate"),
            };
        }
        let first = self.grad_norms[0];
        let last = self.grad_norms[self.grad_norms.len() - 1];
        let grew = !last.is_finite() || last > 100.0 * first.max(1e-12);
        let largest = self.params.iter().fold(0f32, |m, v| m.max(v.abs()));
        match bad_param {
            None if largest > 1e3 => format!("loss became {loss} at step {step}: the weights grew to {largest:.1e} (they start below 1): training diverged; lower --lr (now {lr:.2e})"),
            Some(p) => format!("loss became {loss} at step {step}: the weights overflowed during training ('{}' is no longer finite; gradient norm {first:.3e} at the first step, {last:.3e} at the last); lower --lr (now {lr:.2e})", p.name),
            None if grew => format!("loss became {loss} at step {step} after the gradient norm grew from {first:.3e} to {last:.3e}: training diverged; lower --lr (now {lr:.2e}) or set grad_clip (now {})", self.cfg.grad_clip),
            None => format!("loss became {loss} at step {step} with a steady gradient norm ({last:.3e}): an overflow in the activations, likely from the data of this step or too high a --lr (now {lr:.2e})"),
        }
    }

    /// Adds a span to the timeline, if one is being recorded.
    pub fn trace(&mut self, name: impl Into<String>, cat: &'static str, step: usize, start: Instant) {
        note(&mut self.timeline, &mut self.clock, name, cat, step, (start, Instant::now()));
    }

    /// The full model's parameters gathered over the tensor-parallel group (and under ZeRO-3
    /// the data-parallel one; every member must call it); `None` when this rank holds the whole
    /// model already.
    pub fn full_params(&self) -> Result<Option<Vec<f32>>> {
        if self.holds_whole_model() {
            return Ok(None);
        }
        tp_state::gather_full(&self.mesh.tp, &self.model.layout, &self.local_params()?).map(Some)
    }

    /// Whether `params` is the whole model (not cut across a tensor-parallel group, not left in
    /// ZeRO-3 pieces).
    fn holds_whole_model(&self) -> bool {
        !self.model.layout.is_sharded() && self.dpc.zero < 3
    }

    /// The single-worker model and its parameters: this rank's own, or `full` from
    /// `full_params` when the model is cut across ranks.
    pub fn whole_model<'a>(&'a self, full: Option<&'a [f32]>) -> (&'a Gpt, &'a [f32]) {
        match full {
            Some(f) => (&self.full_model, f),
            None => {
                assert!(self.holds_whole_model(), "a model cut across ranks is evaluated from full_params");
                (&self.model, &self.params)
            }
        }
    }

    /// Held-out accuracy (addition) or validation loss (text) of a model this rank holds whole.
    pub fn evaluate(&mut self) -> EvalReport {
        self.evaluate_with(None)
    }

    /// `evaluate` of the full parameters from `full_params` (or this rank's, when `None`).
    pub fn evaluate_with(&mut self, full: Option<&[f32]>) -> EvalReport {
        let (model, params) = match full {
            Some(f) => (&self.full_model, f),
            None => {
                assert!(self.holds_whole_model(), "a model cut across ranks is evaluated from full_params");
                (&self.model, &self.params[..])
            }
        };
        match &self.data {
            Dataset::Addition(a) => {
                let a = *a;
                let problems = a.eval_set(1000);
                let answers = solve_addition(model, params, &a, &problems);
                let mut correct = 0;
                let mut examples = Vec::new();
                for (&(x, y), got) in problems.iter().zip(&answers) {
                    let ok = a.parse_answer(got) == Some(x + y);
                    correct += ok as usize;
                    if examples.len() < 8 {
                        let shown = a.parse_answer(got).map(|v| v.to_string()).unwrap_or_else(|| format!("{got:?}"));
                        examples.push((format!("{x}+{y}"), (x + y).to_string(), shown));
                    }
                }
                EvalReport::Addition { correct, total: problems.len(), examples }
            }
            Dataset::Text(d) => {
                let t = self.seq;
                let n = 16;
                let (x, y) = d.val_batch(n, t);
                let mb = self.micro.min(n);
                let mut sum = 0f64;
                for (xm, ym) in x.chunks(mb * t).zip(y.chunks(mb * t)) {
                    let bm = xm.len() / t;
                    model.forward(params, xm, bm, t, &mut self.acts);
                    sum += model.loss(ym, &mut self.acts).0;
                }
                EvalReport::Text { val_loss: (sum / y.len() as f64) as f32 }
            }
        }
    }

    /// The start of the validation text, used as a prompt to show what the model learned.
    pub fn data_prompt(&self) -> String {
        match &self.data {
            Dataset::Text(d) => self.tokenizer.decode(&d.tokens[d.split..(d.split + 8).min(d.tokens.len())]),
            Dataset::Addition(a) => a.prompt(482, 139),
        }
    }
}

/// Greedy answers of the model to addition problems, as text (reversed digits + newline).
pub fn solve_addition(model: &Gpt, params: &[f32], a: &Addition, problems: &[(u64, u64)]) -> Vec<String> {
    let prompts: Vec<Vec<u32>> =
        problems.iter().map(|&(x, y)| a.prompt(x, y).bytes().map(u32::from).collect()).collect();
    let opt =
        SampleOptions { max_new_tokens: a.digits + 2, temperature: 0.0, top_k: 0, seed: 0, stop: Some(b'\n' as u32) };
    generate(model, params, &prompts, &opt)
        .iter()
        .map(|ids| ids.iter().map(|&i| i.min(255) as u8 as char).collect::<String>())
        .map(|s| match s.find('\n') {
            Some(k) => s[..=k].to_string(),
            None => s,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evaluation_reports_read_as_the_cli_prints_them() {
        let a = EvalReport::Addition { correct: 999, total: 1000, examples: vec![] };
        assert_eq!(a.to_string(), "held-out accuracy 99.9% (999/1000)");
        assert_eq!(EvalReport::Text { val_loss: 1.23456 }.to_string(), "validation loss 1.2346");
    }

    /// What the README promises for unset settings and what it refuses, checked in the library.
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

    /// Each diagnosis of a non-finite loss, from the state that leads to it.
    #[test]
    fn a_nonfinite_loss_is_explained_by_what_the_run_saw() {
        let mut tr = Trainer::new(TrainConfig { n_embd: Some(16), n_head: Some(2), ..TrainConfig::default() }).unwrap();
        let says = |tr: &Trainer, needle: &str| {
            let m = tr.explain_nonfinite_loss(f32::NAN, 3);
            assert!(m.contains(needle), "expected '{needle}' in: {m}");
        };
        says(&tr, "before any update in this run: the weights or the data overflow");
        tr.grad_norms = vec![1.0, 2.0, 99.0];
        says(&tr, "with a steady gradient norm (9.900e1)");
        tr.grad_norms = vec![1.0, 100.0];
        says(&tr, "with a steady gradient norm (1.000e2)");
        tr.grad_norms = vec![2.0, 150.0];
        says(&tr, "with a steady gradient norm (1.500e2)");
        tr.grad_norms = vec![1.0, 2.0, 101.0];
        says(&tr, "after the gradient norm grew from 1.000e0 to 1.010e2");
        tr.grad_norms = vec![1.0, f32::INFINITY];
        says(&tr, "after the gradient norm grew");
        tr.grad_norms = vec![1.0, 1.0];
        tr.params[5] = 1000.0;
        says(&tr, "with a steady gradient norm");
        tr.params[5] = 1001.0;
        says(&tr, "the weights grew to 1.0e3");
        tr.params[5] = f32::NAN;
        says(&tr, "the weights overflowed during training ('wte.weight' is no longer finite");
        tr.grad_norms.clear();
        says(&tr, "before any update in this run: parameter 'wte.weight' holds non-finite values");
    }
}
