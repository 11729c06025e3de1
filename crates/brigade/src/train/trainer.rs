//! The training loop: batch → micro-batches → forward/backward → clip → AdamW.

use super::addition::Addition;
use super::checkpoint::{self, OPTIMIZER_FILE, STATE_FILE, TOKENIZER_FILE};
use super::config::TrainConfig;
use super::data::{Dataset, Fingerprint, TextData, Tokenizer};
use super::optimizer::{clip_to, grad_sq_norm, AdamW, LrSchedule};
use super::state::{Fingerprints, RunState};
use super::timeline::Timeline;
use crate::error::{Error, Result};
use crate::models::{generate, Activations, Gpt, SampleOptions};
use crate::parallel::data::{self, DataParallel};
use crate::parallel::{Mesh, MeshShape};
use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
use std::time::Instant;

#[derive(Clone, Copy, Debug)]
pub struct StepStats {
    /// 1-based number of the step just taken.
    pub step: usize,
    pub loss: f32,
    pub lr: f32,
    pub grad_norm: f32,
    pub tokens: usize,
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

pub struct Trainer {
    pub cfg: TrainConfig,
    pub model: Gpt,
    pub params: Vec<f32>,
    grads: Vec<f32>,
    opt: AdamW,
    /// Optimizer steps completed.
    pub step: usize,
    pub data: Dataset,
    pub tokenizer: Tokenizer,
    pub seq: usize,
    /// Loss of every step taken so far (including those before a resume).
    pub losses: Vec<f32>,
    /// Gradient norm (before clipping) of every step taken in this process.
    pub grad_norms: Vec<f32>,
    acts: Activations,
    sched: LrSchedule,
    /// Set to record a Chrome trace of the run (`brigade train --trace`).
    pub timeline: Option<Timeline>,
    /// This rank's place in the mesh (the single worker: 1×1×1).
    pub mesh: Mesh,
    dpc: DataParallel,
    /// The slice of the flat buffers this rank's optimizer updates (all of it without ZeRO).
    shard: Range<usize>,
    /// Sequences per forward pass on this rank.
    micro: usize,
}

impl Trainer {
    /// The single worker: the same trainer on the 1×1×1 mesh.
    pub fn new(cfg: TrainConfig) -> Result<Trainer> {
        Trainer::on_mesh(cfg, Mesh::solo()?, DataParallel::default())
    }

    /// One rank of a parallel run: every rank of the mesh calls this with the same `cfg`.
    pub fn on_mesh(mut cfg: TrainConfig, mesh: Mesh, dpc: DataParallel) -> Result<Trainer> {
        cfg.validate()?;
        dpc.validate()?;
        let MeshShape { dp, pp, tp } = mesh.shape;
        if pp > 1 || tp > 1 {
            return Err(Error::Config(format!(
                "pp={pp}, tp={tp}: pipeline and tensor parallelism are not implemented yet; use data parallelism (dp)"
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
        let model = Gpt::new(mcfg)?;
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
        let need = super::memory::training_memory(&mcfg, mb, seq);
        super::memory::check_fits(&need, &format!("training {} at micro-batch {mb} × seq {seq}", cfg.model))?;
        let params = model.layout.init(cfg.seed);
        let shard = dpc.shard(&mesh.dp, model.layout.total);
        let opt = AdamW::over(cfg.adamw, &model.layout, shard.clone());
        let sched = LrSchedule {
            max_lr: cfg.lr,
            min_lr: cfg.min_lr.unwrap_or(cfg.lr / 10.0),
            warmup: cfg.warmup.unwrap_or(cfg.steps / 20).max(1),
            total: cfg.steps,
        };
        Ok(Trainer {
            grads: vec![0.0; model.layout.total],
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
            shard,
            micro: mb,
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
        self.step_on(&x, &y)
    }

    /// One optimizer step on the given global batch (`batch` sequences of equal length):
    /// accumulate the gradient over micro-batches, clip it, AdamW.
    pub fn step_on(&mut self, x: &[u32], y: &[i32]) -> Result<StepStats> {
        let step = self.step + 1;
        let lr = self.sched.at(self.step);
        let (loss_sum, count) = self.accumulate_gradients(x, y)?;
        let loss = (loss_sum / count as f64) as f32;
        if !loss.is_finite() {
            return Err(Error::Train(self.explain_nonfinite_loss(loss, step)));
        }
        let t0 = Instant::now();
        let shard = self.shard.clone();
        let sq = data::global_sq_norm(&self.mesh.dp, grad_sq_norm(&self.grads[shard.clone()]), &self.dpc)?;
        let grad_norm = sq.sqrt() as f32;
        clip_to(&mut self.grads[shard.clone()], grad_norm, self.cfg.grad_clip);
        self.trace("clip", "optimizer", step, t0);
        let t0 = Instant::now();
        self.opt.step(&mut self.params[shard.clone()], &self.grads[shard], lr);
        data::gather_shards(&self.mesh.dp, &mut self.params, &self.dpc)?;
        self.trace("adamw", "optimizer", step, t0);
        self.step = step;
        self.losses.push(loss);
        self.grad_norms.push(grad_norm);
        Ok(StepStats { step, loss, lr, grad_norm, tokens: x.len() })
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
        for (i, (xm, ym)) in x.chunks(mb * t).zip(y.chunks(mb * t)).enumerate() {
            let t0 = Instant::now();
            self.model.forward(&self.params, xm, mb, t, &mut self.acts);
            loss_sum += self.model.loss(ym, &mut self.acts).0;
            self.trace(format!("forward mb{i}"), "compute", step, t0);
            let t0 = Instant::now();
            if overlap && i + 1 == n_micro {
                // The last micro-batch completes each layer's gradient: its buckets are
                // all-reduced while the earlier layers run backward.
                let mut reducer = data::BucketReducer::new(&self.mesh.dp, self.grads.len(), &self.dpc);
                self.model.backward_with(
                    &self.params,
                    &mut self.grads,
                    xm,
                    ym,
                    scale,
                    &mut self.acts,
                    &mut |g, from| reducer.ready(g, from),
                );
                let t1 = Instant::now();
                reducer.finish(&mut self.grads)?;
                if let Some(tl) = self.timeline.as_mut() {
                    tl.record_until(format!("backward mb{i}"), "compute", step, t0, t1);
                }
                self.trace("gradient reduction (exposed)", "comm", step, t1);
            } else {
                self.model.backward(&self.params, &mut self.grads, xm, ym, scale, &mut self.acts);
                self.trace(format!("backward mb{i}"), "compute", step, t0);
            }
        }
        let t0 = Instant::now();
        if !overlap {
            data::reduce_gradients(&self.mesh.dp, &mut self.grads, &self.dpc)?;
        }
        let loss_sum = data::sum_scalar(&self.mesh.dp, loss_sum)?;
        self.trace("gradient reduction", "comm", step, t0);
        Ok((loss_sum, count))
    }

    /// The gradient left by the last `accumulate_gradients` (or, after a step, clipped). With
    /// ZeRO-1 only this rank's shard (`shard()`) holds the summed gradient.
    pub fn grads(&self) -> &[f32] {
        &self.grads
    }

    /// The slice of the flat buffers this rank's optimizer owns.
    pub fn shard(&self) -> Range<usize> {
        self.shard.clone()
    }

    /// A non-finite loss, with what most likely caused it.
    fn explain_nonfinite_loss(&self, loss: f32, step: usize) -> String {
        let bad_param = self.model.layout.specs.iter().find(|s| s.view.of(&self.params).iter().any(|v| !v.is_finite()));
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
        if let Some(tl) = self.timeline.as_mut() {
            tl.record(name, cat, step, start);
        }
    }

    /// Held-out accuracy (addition) or validation loss (text).
    pub fn evaluate(&mut self) -> EvalReport {
        match &self.data {
            Dataset::Addition(a) => {
                let a = *a;
                let problems = a.eval_set(1000);
                let answers = solve_addition(&self.model, &self.params, &a, &problems);
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
                    self.model.forward(&self.params, xm, bm, t, &mut self.acts);
                    sum += self.model.loss(ym, &mut self.acts).0;
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

    /// Writes a complete checkpoint to `dir` (atomically).
    /// Every rank of the mesh calls it (ZeRO shards of the moments are gathered first); the
    /// first rank writes. The files hold the full model whatever the layout.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let total = self.model.layout.total;
        let (mut m, mut v) = (vec![0f32; total], vec![0f32; total]);
        m[self.shard.clone()].copy_from_slice(&self.opt.m);
        v[self.shard.clone()].copy_from_slice(&self.opt.v);
        data::gather_shards(&self.mesh.dp, &mut m, &self.dpc)?;
        data::gather_shards(&self.mesh.dp, &mut v, &self.dpc)?;
        if self.mesh.dp.rank() != 0 {
            return Ok(());
        }
        checkpoint::write_atomically(dir, |tmp| {
            let layout = &self.model.layout;
            checkpoint::save_tensors(&tmp.join(checkpoint::MODEL_FILE), layout, &self.params, "", None)?;
            checkpoint::write_json(&tmp.join(checkpoint::CONFIG_FILE), &checkpoint::hf_config(&self.model.cfg))?;
            let meta = HashMap::from([("step".to_string(), self.opt.t.to_string())]);
            m.extend_from_slice(&v);
            checkpoint::save_tensors(&tmp.join(OPTIMIZER_FILE), &moments_layout(layout), &m, "", Some(meta))?;
            let state = RunState {
                config: self.cfg.clone(),
                step: self.step,
                losses: self.losses.clone(),
                fingerprints: self.fingerprints(),
            };
            checkpoint::write_json(&tmp.join(STATE_FILE), &state.to_json())?;
            if let Tokenizer::Hf(_, src, _) = &self.tokenizer {
                let dst = tmp.join(TOKENIZER_FILE);
                std::fs::copy(src, &dst).map_err(|e| Error::io(&dst, e))?;
            }
            Ok(())
        })
    }

    /// Fingerprints of the data file and the tokenizer this run reads (null where none).
    pub fn fingerprints(&self) -> Fingerprints {
        Fingerprints {
            data: match &self.data {
                Dataset::Text(d) => Some(d.fingerprint.clone()),
                Dataset::Addition(_) => None,
            },
            tokenizer: match &self.tokenizer {
                Tokenizer::Hf(_, _, f) => Some(f.clone()),
                Tokenizer::Bytes => None,
            },
        }
    }

    /// Continues the run saved in `dir`; `steps` may extend it. Everything the checkpoint says
    /// is cross-checked first: its format, its step against its losses and the optimizer's
    /// step, and the data and tokenizer against their recorded fingerprints.
    pub fn resume(dir: &Path, steps: Option<usize>) -> Result<Trainer> {
        Trainer::resume_on(dir, steps, Mesh::solo()?, DataParallel::default())
    }

    /// `resume` as one rank of a mesh: a checkpoint holds no layout, so any layout resumes it.
    pub fn resume_on(dir: &Path, steps: Option<usize>, mesh: Mesh, dpc: DataParallel) -> Result<Trainer> {
        let RunState { config: mut cfg, step, losses, fingerprints: saved_fp } = RunState::read(dir)?;
        if cfg.tokenizer.is_some() {
            cfg.tokenizer = Some(dir.join(TOKENIZER_FILE));
        }
        if let Some(s) = steps {
            if s < step {
                return Err(Error::Train(format!(
                    "--steps {s} is below the {step} steps this checkpoint has already taken; give --steps {step} or more"
                )));
            }
            cfg.steps = s;
        }
        let mut tr = Trainer::on_mesh(cfg, mesh, dpc)?;
        let now = tr.fingerprints();
        for (what, was, is, file) in [
            ("data", &saved_fp.data, &now.data, tr.cfg.data.clone()),
            ("tokenizer", &saved_fp.tokenizer, &now.tokenizer, tr.cfg.tokenizer.clone()),
        ] {
            if was != is {
                let show = |f: &Option<Fingerprint>| f.as_ref().map_or("none".to_string(), |f| f.to_string());
                return Err(Error::ckpt(
                    dir,
                    format!(
                        "the {what} file {} changed since this checkpoint was written (was {}, now {}); resume with the run's own {what}",
                        file.map_or("-".into(), |p| p.display().to_string()),
                        show(was),
                        show(is)
                    ),
                ));
            }
        }
        let saved = checkpoint::read_model_config(dir)?;
        if saved != tr.model.cfg {
            return Err(Error::ckpt(dir, "config.json does not match the run's model settings"));
        }
        tr.params = checkpoint::load_tensors(&dir.join(checkpoint::MODEL_FILE), &tr.model.layout, "")?.0;
        load_moments(dir, &tr.model.layout, &mut tr.opt, tr.shard.clone())?;
        if tr.opt.t != step as u64 {
            return Err(Error::ckpt(
                dir.join(OPTIMIZER_FILE),
                format!("holds the optimizer state of step {} but the run is at step {step}; the checkpoint is inconsistent", tr.opt.t),
            ));
        }
        tr.step = step;
        tr.losses = losses;
        Ok(tr)
    }
}

/// The settings of the run that wrote checkpoint `dir`.
pub fn saved_config(dir: &Path) -> Result<TrainConfig> {
    Ok(RunState::read(dir)?.config)
}

/// Reads the full moments and keeps this rank's `shard` of them.
fn load_moments(dir: &Path, layout: &crate::params::ParamLayout, opt: &mut AdamW, shard: Range<usize>) -> Result<()> {
    let path = dir.join(OPTIMIZER_FILE);
    let layout2 = moments_layout(layout);
    let (buf, meta) = checkpoint::load_tensors(&path, &layout2, "")?;
    let n = layout.total;
    opt.m.copy_from_slice(&buf[shard.clone()]);
    opt.v.copy_from_slice(&buf[n + shard.start..n + shard.end]);
    opt.t = meta
        .get("step")
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| Error::ckpt(&path, "missing the optimizer step in the metadata"))?;
    Ok(())
}

/// The optimizer file's layout: `exp_avg.<name>` for every parameter, then `exp_avg_sq.<name>`.
fn moments_layout(layout: &crate::params::ParamLayout) -> crate::params::ParamLayout {
    let mut l = crate::params::ParamLayout::default();
    for prefix in ["exp_avg.", "exp_avg_sq."] {
        for s in &layout.specs {
            l.add(&format!("{prefix}{}", s.name), &s.shape, s.init, s.decay);
        }
    }
    l
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
