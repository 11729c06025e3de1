//! A trainer's checkpoint: written from any layout as the full model (ZeRO shards gathered),
//! and resumed under any layout after everything the checkpoint says is cross-checked.

use super::config::TrainConfig;
use super::data::{Dataset, Fingerprint, Tokenizer};
use super::metrics::StepStats;
use super::state::{Fingerprints, RunState};
use super::trainer::Trainer;
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::models::checkpoint::{self, OPTIMIZER_FILE, STATE_FILE, TOKENIZER_FILE};
use crate::nn::tp::state::gather_full;
use crate::parallel::data::REPLICAS;
use crate::parallel::{Axis, Mesh};
use crate::params::ParamLayout;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Everything a checkpoint holds, copied out of the trainer at a step boundary: written
/// afterwards (on another thread while training goes on, or at once) to the same bytes.
pub struct Snapshot {
    /// Whether this rank writes it (the first rank of the mesh).
    writes: bool,
    step: usize,
    layout: ParamLayout,
    params: Vec<f32>,
    /// The first moments, then the second.
    moments: Vec<f32>,
    optimizer_step: u64,
    hf_config: serde_json::Value,
    state: RunState,
    history: Vec<StepStats>,
    title: String,
    /// The tokenizer's file, its `tokenizer_config.json` and its own chat template, where any.
    tokenizer_files: Vec<(PathBuf, &'static str)>,
}

impl Snapshot {
    /// The optimizer step the snapshot was taken after.
    pub fn step(&self) -> usize {
        self.step
    }

    /// Whether this rank writes the checkpoint (the first rank of the mesh).
    pub fn writes(&self) -> bool {
        self.writes
    }

    /// Writes the checkpoint to `dir` (atomically: the previous one stays whole until the
    /// rename).
    pub fn write(&self, dir: &Path) -> Result<()> {
        checkpoint::write_atomically(dir, |tmp| {
            checkpoint::save_tensors(&tmp.join(checkpoint::MODEL_FILE), &self.layout, &self.params, "", None)?;
            super::fault::at(super::fault::Point::Writing, self.step, 0);
            checkpoint::write_json(&tmp.join(checkpoint::CONFIG_FILE), &self.hf_config)?;
            let meta = HashMap::from([("step".to_string(), self.optimizer_step.to_string())]);
            let moments = moments_layout(&self.layout);
            checkpoint::save_tensors(&tmp.join(OPTIMIZER_FILE), &moments, &self.moments, "", Some(meta))?;
            checkpoint::write_json(&tmp.join(STATE_FILE), &self.state.to_json())?;
            let mut lines = String::new();
            for s in &self.history {
                lines += &serde_json::to_string(s).expect("numbers serialise");
                lines.push('\n');
            }
            let path = tmp.join(checkpoint::METRICS_FILE);
            std::fs::write(&path, lines).map_err(|e| Error::io(&path, e))?;
            super::plot::loss_curve(&tmp.join(checkpoint::LOSS_PLOT_FILE), &self.state.losses, &self.title)?;
            for (src, name) in &self.tokenizer_files {
                let dst = tmp.join(name);
                std::fs::copy(src, &dst).map_err(|e| Error::io(&dst, e))?;
            }
            Ok(())
        })?;
        super::fault::at(super::fault::Point::Renamed, self.step, 0);
        Ok(())
    }
}

impl Trainer {
    /// Writes a complete checkpoint to `dir` (atomically).
    /// Every rank of the mesh calls it (ZeRO shards of the moments are gathered first); the
    /// first rank writes. The files hold the full model whatever the layout.
    pub fn save(&self, dir: &Path) -> Result<()> {
        match self.snapshot()? {
            Some(s) => s.write(dir),
            None => Ok(()),
        }
    }

    /// The checkpoint's contents, copied now: every rank of the mesh calls it (the ZeRO
    /// pieces, tensor-parallel slices and pipeline stages are gathered); the first rank gets
    /// the snapshot, the others `None`.
    pub fn snapshot(&self) -> Result<Option<Snapshot>> {
        let s = self.snapshot_into(None)?;
        Ok(s.writes.then_some(s))
    }

    /// `snapshot` into the buffers of an earlier snapshot (`reuse`), so that a job's periodic
    /// saves copy the state without allocating it again. Every rank gets one; only the first
    /// rank's `writes`.
    pub fn snapshot_into(&self, reuse: Option<Snapshot>) -> Result<Snapshot> {
        let local = &self.parts.layout;
        let total = self.full_model.layout.total;
        let writes = self.mesh.rank() == 0;
        let (mut params, mut moments) = reuse.map(|s| (s.params, s.moments)).unwrap_or_default();
        let dp = self.mesh.group(REPLICAS);
        let alone = |a: Axis| self.mesh.group(&[a]).size() == 1;
        let divided = self.layout.divides_experts();
        if alone(Axis::Tp) && alone(Axis::Pp) && self.parts.chunks.len() == 1 && !divided {
            // this rank's layout is the whole model's: the ZeRO pieces straight into place
            assert_eq!(local.total, total, "one chunk, no tp: the whole model");
            params.resize(total, 0.0);
            moments.resize(2 * total, 0.0);
            match self.dpc.zero >= 3 {
                true => self.shards.gather(dp, &self.pshard, &mut params)?,
                false => params.copy_from_slice(&self.params),
            }
            let (m, v) = moments.split_at_mut(total);
            self.shards.gather(dp, &self.opt.m, m)?;
            self.shards.gather(dp, &self.opt.v, v)?;
        } else {
            // ZeRO pieces gathered over the dp group, then the full tensors from the slices of
            // the tensor-parallel group and the stages of the pipeline — by the ranks on the
            // way to the first rank only: the other replicas, and the other tensor-parallel
            // ranks once their slices are sent, build no full copy
            let (mut m, mut v) = (vec![0f32; local.total], vec![0f32; local.total]);
            self.shards.gather(dp, &self.opt.m, &mut m)?;
            self.shards.gather(dp, &self.opt.v, &mut v)?;
            let p = self.local_params()?;
            // (experts divided: every expert group gathers its blocks, so every rank takes part)
            if self.mesh.coords[Axis::Dp] == 0 || divided {
                let full_p = self.full_to_first(&p)?;
                let full_m = self.full_to_first(&m)?;
                let full_v = self.full_to_first(&v)?;
                if let (Some(fp), Some(fm), Some(fv)) = (full_p, full_m, full_v) {
                    params.resize(total, 0.0);
                    moments.resize(2 * total, 0.0);
                    params.copy_from_slice(&fp);
                    moments[..total].copy_from_slice(&fm);
                    moments[total..].copy_from_slice(&fv);
                }
            }
        }
        let mut tokenizer_files = Vec::new();
        if let Tokenizer::Hf(_, src, _, sp) = &self.tokenizer {
            tokenizer_files.push((src.clone(), TOKENIZER_FILE));
            // its special tokens and chat template, so that the directory loads alone
            if let Some(cfg) = &sp.config {
                tokenizer_files.push((cfg.clone(), crate::models::tokenizer::TOKENIZER_CONFIG_FILE));
            }
            // a template of its own file (transformers 5 saves it so) wins over the config's
            let jinja = src.with_file_name(crate::models::tokenizer::CHAT_TEMPLATE_FILE);
            if jinja.is_file() {
                tokenizer_files.push((jinja, crate::models::tokenizer::CHAT_TEMPLATE_FILE));
            }
        }
        Ok(Snapshot {
            writes,
            step: self.step,
            layout: self.full_model.layout.clone(),
            params,
            moments,
            optimizer_step: self.opt.t,
            hf_config: checkpoint::hf_config(&self.model.cfg),
            state: RunState {
                config: self.cfg.clone(),
                step: self.step,
                losses: self.losses.clone(),
                fingerprints: self.fingerprints(),
            },
            history: self.history.clone(),
            title: format!("{} · {} steps", self.cfg.model, self.step),
            tokenizer_files,
        })
    }

    /// Fingerprints of the data file and the tokenizer this run reads (null where none).
    pub fn fingerprints(&self) -> Fingerprints {
        Fingerprints {
            data: match &self.data {
                Dataset::Text(d) => Some(d.fingerprint.clone()),
                Dataset::Corpus(c) => Some(c.fingerprint()),
                Dataset::Addition(_) => None,
            },
            tokenizer: match &self.tokenizer {
                Tokenizer::Hf(_, _, f, _) => Some(f.clone()),
                Tokenizer::Bytes => None,
            },
        }
    }

    /// Continues the run saved in `dir`; `steps` may extend it. Everything the checkpoint says
    /// is cross-checked first: its format, its step against its losses and the optimizer's
    /// step, and the data and tokenizer against their recorded fingerprints.
    pub fn resume(dir: &Path, steps: Option<usize>) -> Result<Trainer> {
        Trainer::resume_on(dir, steps, Mesh::solo()?, &Layout::default())
    }

    /// `resume` as one rank of a mesh: a checkpoint holds no layout, so any layout resumes it.
    pub fn resume_on(dir: &Path, steps: Option<usize>, mesh: Mesh, layout: &Layout) -> Result<Trainer> {
        let (cfg, state) = resumed_config(dir, steps)?;
        let tr = Trainer::on_mesh(cfg, mesh, layout)?;
        tr.continue_from(dir, state)
    }

    /// `resume_on` from the world communicator: the checkpoint and the layout are checked
    /// before the mesh's groups are built.
    pub fn resume_on_world(
        dir: &Path,
        steps: Option<usize>,
        world: &brigade_comm::Comm,
        layout: &Layout,
    ) -> Result<Trainer> {
        let (cfg, state) = resumed_config(dir, steps)?;
        let tr = Trainer::on_world(cfg, world, layout)?;
        tr.continue_from(dir, state)
    }

    /// A fresh trainer for the checkpoint's run takes on its weights, moments and history,
    /// after everything the checkpoint says is cross-checked.
    fn continue_from(self, dir: &Path, state: RunState) -> Result<Trainer> {
        let RunState { step, losses, fingerprints: saved_fp, .. } = state;
        let mut tr = self;
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
        let full = checkpoint::load_tensors(&dir.join(checkpoint::MODEL_FILE), &tr.full_model.layout, "")?.0;
        let local = tr.local_of_full(&full);
        if tr.dpc.zero >= 3 {
            tr.pshard = tr.shards.compact(&local);
        } else {
            tr.params = local;
        }
        load_moments(dir, &mut tr)?;
        if tr.opt.t != step as u64 {
            return Err(Error::ckpt(
                dir.join(OPTIMIZER_FILE),
                format!("holds the optimizer state of step {} but the run is at step {step}; the checkpoint is inconsistent", tr.opt.t),
            ));
        }
        tr.step = step;
        tr.losses = losses;
        tr.history = read_metrics(dir, step);
        Ok(tr)
    }
}

impl Trainer {
    /// A buffer of the whole model (the single worker's layout) from this rank's `local` one
    /// (in `parts.layout`): gathered over the tensor-parallel group, and over the pipeline's
    /// stages. Every rank of both groups calls it and gets the whole buffer.
    pub(crate) fn full_of_local(&self, local: &[f32]) -> Result<Vec<f32>> {
        Ok(self.whole_from(local, true)?.expect("every rank gets the whole model"))
    }

    /// `full_of_local` where only the first rank of the mesh needs the result (a checkpoint):
    /// the ranks of the first replica call it; the tensor-parallel group gathers its slices,
    /// and only its first rank's pipeline group (the first rank's) sums the stages. The first
    /// rank gets the whole model; the others `None`, having built no full copy past the
    /// tensor-parallel gather.
    pub(crate) fn full_to_first(&self, local: &[f32]) -> Result<Option<Vec<f32>>> {
        self.whole_from(local, false)
    }

    /// The whole model from `local`, for every rank (`everyone`) or for the first only.
    fn whole_from(&self, local: &[f32], everyone: bool) -> Result<Option<Vec<f32>>> {
        let mine = gather_full(self.mesh.group(&[Axis::Tp]), &self.parts.layout, local)?;
        if !everyone && self.mesh.coords[Axis::Tp] != 0 {
            return Ok(None);
        }
        let stages = self.mesh.group(&[Axis::Pp]);
        let divided = self.layout.divides_experts();
        let full = if stages.size() == 1 && self.parts.chunks.len() == 1 && !divided {
            mine
        } else {
            let mut full = self.parts.place_in(&self.full_model.layout, &mine);
            if divided {
                // each expert lives on one rank of the expert group, the rest on all of them:
                // the first keeps the rest, and the sum is the model
                let ep = self.mesh.group(&[Axis::Ep]);
                if ep.rank() > 0 {
                    for s in self.full_model.layout.specs.iter().filter(|s| !s.expert) {
                        s.view.of_mut(&mut full).fill(0.0);
                    }
                }
                ep.all_reduce(&mut full, brigade_comm::ReduceOp::Sum)
                    .map_err(|e| Error::Train(format!("gathering the experts across the expert group failed: {e}")))?;
            }
            if stages.size() > 1 {
                // each tensor lives on one stage, zeros elsewhere: the sum is the model
                stages.all_reduce(&mut full, brigade_comm::ReduceOp::Sum).map_err(|e| {
                    Error::Train(format!("gathering the model across the pipeline's stages failed: {e}"))
                })?;
            }
            full
        };
        Ok((everyone || self.mesh.rank() == 0).then_some(full))
    }

    /// This rank's buffer (in `parts.layout`) from one of the whole model: its stages'
    /// tensors, each cut to its tensor-parallel slice (both copies of a tied table filled).
    pub fn local_of_full(&self, full: &[f32]) -> Vec<f32> {
        let mine = self.parts.pick_from(&self.full_model.layout, full);
        self.parts.layout.slice_full(&mine, self.model.tp_rank, self.model.tp)
    }
}

/// The run's settings from checkpoint `dir` (its tokenizer file, `steps` if given), and
/// what else it recorded.
fn resumed_config(dir: &Path, steps: Option<usize>) -> Result<(TrainConfig, RunState)> {
    let state = RunState::read(dir)?;
    let mut cfg = state.config.clone();
    if cfg.tokenizer.is_some() {
        cfg.tokenizer = Some(dir.join(TOKENIZER_FILE));
    }
    if cfg.init.is_some() {
        // the checkpoint's weights replace the published ones: its own config.json is the shape
        cfg.shape_from = Some(dir.to_path_buf());
    }
    if let Some(s) = steps {
        if s < state.step {
            return Err(Error::Train(format!(
                "--steps {s} is below the {} steps this checkpoint has already taken; give --steps {} or more",
                state.step, state.step
            )));
        }
        cfg.steps = s;
    }
    Ok((cfg, state))
}

/// The metrics of the steps up to `step` a checkpoint recorded (none from a checkpoint written
/// before brigade kept them; a line that does not parse ends the history there).
fn read_metrics(dir: &Path, step: usize) -> Vec<StepStats> {
    let text = std::fs::read_to_string(dir.join(checkpoint::METRICS_FILE)).unwrap_or_default();
    text.lines().map_while(|l| serde_json::from_str::<StepStats>(l).ok()).take_while(|s| s.step <= step).collect()
}

/// The settings of the run that wrote checkpoint `dir`.
pub fn saved_config(dir: &Path) -> Result<TrainConfig> {
    Ok(RunState::read(dir)?.config)
}

/// Reads the full moments and keeps this rank's slice (tensor-parallel rank `rank` of `tp`)
/// and its ZeRO pieces of them.
fn load_moments(dir: &Path, tr: &mut Trainer) -> Result<()> {
    let path = dir.join(OPTIMIZER_FILE);
    let full = &tr.full_model.layout;
    let (buf, meta) = checkpoint::load_tensors(&path, &moments_layout(full), "")?;
    let (m, v) = buf.split_at(full.total);
    tr.opt.m = tr.shards.compact(&tr.local_of_full(m));
    tr.opt.v = tr.shards.compact(&tr.local_of_full(v));
    tr.opt.t = meta
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
