//! Setting up one rank's trainer: everything that needs no peer is checked first (settings,
//! tokenizer, data, the layout against the model and the batch), so that a bad setting starts
//! no collective; then the rank builds its part of the model, its ZeRO pieces and optimizer.

use super::config::TrainConfig;
use super::data::{Dataset, Tokenizer};
use super::metrics::StepClock;
use super::optimizer::{AdamW, LrSchedule};
use super::trainer::Trainer;
use crate::error::{Error, Result};
use crate::layout::{Layout, Schedule};
use crate::models::gguf::import::is_gguf;
use crate::models::shard_load::MappedWeights;
use crate::models::Gpt;
use crate::parallel::data::zero::Shards;
use crate::parallel::data::{DataParallel, REPLICAS};
use crate::parallel::pipeline::{self, stages::stage_slots, RankModel};
use crate::parallel::{Axis, Mesh};

/// A run checked before any rank communicates (see `Trainer::prepare`).
pub(crate) struct Prepared {
    cfg: TrainConfig,
    tokenizer: Tokenizer,
    mcfg: crate::models::GptConfig,
    data: Dataset,
    seq: usize,
    mb: usize,
    layout: Layout,
    /// The lists every step runs: the pipeline's, or one stage's 1F1B over the micro-batches.
    list: pipeline::Plan,
}

impl Trainer {
    /// Everything about a run that needs no peer: settings, tokenizer, data, the layout
    /// against the model and the batch.
    pub(crate) fn prepare(mut cfg: TrainConfig, layout: &Layout) -> Result<Prepared> {
        cfg.validate()?;
        layout.check_training()?;
        let Layout { pp, tp, sp, .. } = *layout;
        // the layout's `mb=` names the micro-batch as well as --micro-batch does
        if layout.mb.is_some() {
            cfg.micro_batch = layout.mb;
        }
        // Sequences per forward pass on one rank; unset: the rank's whole share of the batch.
        let mb = layout.micro_batch(cfg.batch, cfg.micro_batch)?;
        // The checkpoint records where the data came from: absolute, so that a resume from
        // another directory reads the same file.
        if let Some(p) = &cfg.data {
            cfg.data = Some(std::path::absolute(p).map_err(|e| Error::io(p, e))?);
        }
        if let Some(p) = &cfg.val_data {
            cfg.val_data = Some(std::path::absolute(p).map_err(|e| Error::io(p, e))?);
        }
        for m in &mut cfg.mix {
            m.path = std::path::absolute(&m.path).map_err(|e| Error::io(&m.path, e))?;
        }
        if let Some(p) = &cfg.init {
            if !p.is_dir() && !is_gguf(p) {
                return Err(Error::Config(format!(
                    "--init {}: no such folder or GGUF file; give a Hugging Face model folder (config.json, model.safetensors, tokenizer.json) or a .gguf file",
                    p.display()
                )));
            }
            cfg.init = Some(std::path::absolute(p).map_err(|e| Error::io(p, e))?);
            // a published model is trained with its own tokenizer unless told otherwise (a GGUF
            // file's, unpacked from its metadata)
            let dir = crate::models::open::metadata_folder(&cfg.init.clone().unwrap_or_default())?;
            if cfg.tokenizer.is_none() && cfg.data.is_some() && dir.join("tokenizer.json").is_file() {
                cfg.tokenizer = Some(dir);
            }
        }
        let tokenizer = match &cfg.tokenizer {
            Some(p) => Tokenizer::from_file(p)?,
            None => Tokenizer::Bytes,
        };
        // a token corpus read without a tokenizer is checked against the model's vocabulary
        // as it is opened; text is tokenized here, by the tokenizer whose vocabulary must fit
        let tokenized =
            cfg.tokenizer.is_none() && cfg.data.as_ref().is_some_and(|p| Dataset::is_tokenized(p, cfg.chat));
        let mcfg = cfg.model_config(if tokenized { 0 } else { tokenizer.vocab_size() })?;
        crate::models::gpt::check_tp(&mcfg, tp)?;
        let m = layout.micro_batches(cfg.batch, mb);
        let list = match layout.runs_executor() {
            true => pipeline::build(layout.schedule, pp, m, layout.v)?,
            false => pipeline::build(Schedule::OneFOneB, 1, m, 1)?,
        };
        pipeline::executor::check_tags(&list)?;
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
            Some(_) => {
                let seq = cfg.seq.unwrap_or(mcfg.block_size.min(256));
                (
                    Dataset::open(&cfg.corpora(), cfg.val_data.as_deref(), cfg.chat, &tokenizer, seq, mcfg.vocab_size)?,
                    seq,
                )
            }
        };
        if cfg.doc_mask && !data.has_documents() {
            return Err(Error::Data(format!(
                "--doc-mask keeps documents apart, and {} is one text file (one document); give a folder of text files (a document each), a token corpus or --chat conversations, or drop --doc-mask",
                cfg.data.as_deref().map_or("the data".into(), |p| p.display().to_string())
            )));
        }
        if seq == 0 || seq > mcfg.block_size {
            return Err(Error::Train(format!(
                "sequence length {seq} must be between 1 and the model's block_size {}; lower --seq or raise --block-size",
                mcfg.block_size
            )));
        }
        layout.check_seq(seq)?;
        match (layout.ep, mcfg.experts()) {
            (1, _) => {}
            (ep, None) => {
                return Err(Error::Layout(format!(
                    "ep={ep} spreads a mixture's experts over ranks, and this model has none (dense MLPs); drop ep, or train a mixture of experts (--model moe-tiny, or --init a Qwen2-MoE or Mixtral folder)"
                )))
            }
            (ep, Some(e)) if !e.is_multiple_of(ep) => {
                let fits: Vec<String> = (1..=e).filter(|d| e.is_multiple_of(*d)).map(|d| d.to_string()).collect();
                return Err(Error::Layout(format!(
                    "ep={ep} does not divide the model's {e} experts per layer; use ep among {}",
                    fits.join(", ")
                )));
            }
            _ => {}
        }
        if mcfg.moe().is_some() && sp {
            return Err(Error::Layout(format!(
                "sp=1 with a mixture of experts: sequence parallelism cuts a micro-batch's rows across the tp={tp} ranks, and the routers' per-sequence statistics need a sequence's rows together; drop sp (tp alone runs the mixture whole on every rank)"
            )));
        }
        let capacity = match mcfg.family {
            crate::models::family::Family::Llama(a) => a.moe.map_or(0.0, |m| m.capacity),
            crate::models::family::Family::Gpt2 => 0.0,
        };
        if capacity > 0.0 && layout.cp > 1 {
            return Err(Error::Layout(format!(
                "cp={} with an expert capacity factor ({capacity}): which rows an expert drops is decided over a whole sequence, which no rank holds under cp; use dp, ep or pp, or train dropless",
                layout.cp
            )));
        }
        // a rank's rows of a micro-batch: all of them, or its share of each sequence under cp
        let local = seq / layout.cp;
        if sp && !(mb * local).is_multiple_of(tp) {
            return Err(Error::Layout(format!(
                "sp=1 splits each micro-batch's {} tokens on a rank (micro-batch {mb} × seq {seq} / cp={}) into tp={tp} blocks of rows, which does not divide; pick a micro-batch or seq whose product is a multiple of {tp}, or drop sp",
                mb * local,
                layout.cp
            )));
        }
        if layout.runs_executor() {
            stage_slots(&mcfg, pp, layout.v, seq)?;
        }
        let need = super::memory::training_memory_cp(&mcfg, mb, seq, layout.cp, layout.cp_comm);
        let what = format!("training {} at micro-batch {mb} × seq {seq}", cfg.model);
        super::memory::check_fits(&need, &what).map_err(|e| {
            // name the longest sequence this layout trains in the memory there is
            let chunks = if layout.cp > 1 { layout.cp_order.chunks(layout.cp) } else { 1 };
            let longest = super::memory::available_bytes().and_then(|avail| {
                super::memory::longest_seq(&mcfg, mb, (layout.cp, layout.cp_comm, chunks), avail, mcfg.block_size)
            });
            match longest {
                Some(n) => Error::Train(format!("{e}; at this layout the longest sequence that fits is {n} (cp=2 or more splits each sequence's activations across ranks)")),
                None => e,
            }
        })?;
        Ok(Prepared { cfg, tokenizer, mcfg, data, seq, mb, layout: *layout, list })
    }

    /// Whether `layout` can train `cfg` (every check a rank makes before it communicates), and
    /// if so the model it trains and the sequence length: what a planner needs to rank it.
    pub fn check_layout(cfg: &TrainConfig, layout: &Layout) -> Result<(crate::models::GptConfig, usize)> {
        let p = Trainer::prepare(cfg.clone(), layout)?;
        Ok((p.mcfg, p.seq))
    }

    /// This rank's trainer for a prepared run.
    pub(crate) fn build(run: Prepared, mesh: Mesh) -> Result<Trainer> {
        let Prepared { cfg, tokenizer, mcfg, data, seq, mb, layout, list } = run;
        let dpc = DataParallel { zero: layout.zero, ..DataParallel::default() };
        let on = |a: Axis| (mesh.coords[a], mesh.shape.degree(a));
        let (tp, pp) = (on(Axis::Tp), on(Axis::Pp));
        // a mixture's experts: this rank's expert group's block, or all of them
        let ep = mesh.group(&[Axis::Ep]);
        let experts = if layout.divides_experts() { (ep.rank(), ep.size()) } else { (0, 1) };
        let mut parts = match layout.runs_executor() {
            true => RankModel::stage(mcfg, tp, pp, layout.v, seq, experts)?,
            false => RankModel::whole(Gpt::part_of(mcfg, tp, 0..mcfg.n_layer + 2, experts)?),
        };
        // a mixture's auxiliary losses are a mean over the global batch's sequences, whichever
        // rank and micro-batch holds them
        parts.chunks.iter_mut().for_each(|c| c.moe_sequences = cfg.batch);
        let model = parts.first().clone();
        // tensor-parallel collectives and the context group's exchanges run inside forward and
        // backward: timed from their trace
        for axis in [Axis::Tp, Axis::Cp] {
            let comm = mesh.group(&[axis]);
            comm.enable_tracing(comm.size() > 1);
        }
        let full_model = Gpt::new(mcfg)?;
        let mut params = match (&cfg.init, &cfg.shape_from) {
            // a published model's weights: this rank reads its own tensors and slices only
            (Some(file), None) if is_gguf(file) => gguf_local(file, &parts.layout, tp)?,
            (Some(dir), None) => MappedWeights::open(dir)?.read_local(&parts.layout, tp.0, tp.1, &full_model.layout)?,
            _ => parts.layout.init_shard(cfg.seed, tp.0, tp.1),
        };
        // ZeRO cuts its pieces across the ranks a gradient is summed over
        let replicas = mesh.group(REPLICAS);
        let shards = Shards::new(&parts.units, replicas.size(), replicas.rank(), dpc.zero > 0);
        let opt = AdamW::over(cfg.adamw, &parts.layout, &shards.pieces);
        // what each ZeRO stage keeps whole, and what only in pieces
        let pshard = if dpc.zero >= 3 { shards.compact(&std::mem::take(&mut params)) } else { Vec::new() };
        let gshard = if dpc.zero >= 1 { vec![0.0; shards.len] } else { Vec::new() };
        let grads = if dpc.zero >= 2 { Vec::new() } else { vec![0.0; parts.layout.total] };
        let sched = LrSchedule::of(&cfg);
        Ok(Trainer {
            grads,
            // the routed experts counted apart when each rank holds only its block of them
            norm_layout: match layout.divides_experts() {
                true => parts.counted_layout().experts(false),
                false => parts.counted_layout(),
            },
            parts,
            list,
            measured_actions: None,
            fitted: None,
            pool: Default::default(),
            model,
            params,
            opt,
            step: 0,
            data,
            tokenizer,
            seq,
            losses: Vec::new(),
            grad_norms: Vec::new(),
            sched,
            timeline: None,
            cfg,
            mesh,
            dpc,
            layout,
            full_model,
            shards,
            pshard,
            gshard,
            micro: mb,
            clock: StepClock::default(),
            pipeline: None,
            history: Vec::new(),
            attend_clock: Default::default(),
            moe_tally: Vec::new(),
        })
    }
}

/// This rank's share (`layout`, rank `tp.0` of `tp.1`) of a GGUF file's weights, dequantized.
fn gguf_local(file: &std::path::Path, layout: &crate::params::ParamLayout, tp: (usize, usize)) -> Result<Vec<f32>> {
    let (whole, params) = crate::models::open::open_model(file)?;
    let mut out = vec![0f32; layout.total];
    for s in &layout.specs {
        let full = whole.layout.get(&s.name).ok_or_else(|| {
            Error::ckpt(file, format!("has no tensor {} for the model its metadata describes", s.name))
        })?;
        s.split.slice(full.view.of(&params), &s.full_shape, tp.0, tp.1, s.view.of_mut(&mut out));
    }
    Ok(out)
}
