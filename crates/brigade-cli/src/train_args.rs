//! The flags of `brigade train`, and the run settings they make.

use anyhow::{Context, Result};
use brigade::train::config::Mixed;
use brigade::train::TrainConfig;
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct TrainArgs {
    /// TOML file with any of the settings below (flags override it).
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    /// Model preset: tiny, gpt2-small, gpt2-medium, gpt2-large, gpt2-xl; the Llama family's
    /// llama-tiny, smollm2-135m, qwen2.5-0.5b, llama3.2-1b, llama3-8b, llama3-70b, llama3-405b.
    #[arg(long)]
    pub(crate) model: Option<String>,
    /// Start from a published model: a Hugging Face folder (config.json, safetensors weights,
    /// tokenizer.json) of either family, or a GGUF file (its weights dequantized). Its
    /// config.json (a GGUF's metadata) gives the family and shape (--model is then optional
    /// and must match); each rank keeps only its own slices of the weights; its tokenizer is
    /// --data's unless --tokenizer is given.
    #[arg(long, value_name = "DIR|FILE.gguf")]
    pub(crate) init: Option<PathBuf>,
    /// What to train on (default: the built-in addition task): a UTF-8 text file, an llm.c /
    /// nanoGPT token file (.bin with llm.c's header), a Megatron dataset (PREFIX or PREFIX.bin,
    /// with PREFIX.idx), or with --chat a .jsonl of conversations. Several corpora mix by weight:
    /// `--data a.bin:0.7 b.bin:0.3`. Corpora are read memory-mapped; a share of their documents
    /// (chosen by hash) is held out for validation.
    #[arg(long, num_args = 1.., value_parser = weighted)]
    pub(crate) data: Option<Vec<(PathBuf, Option<f64>)>>,
    /// Validate on this corpus (any --data form but a single text file; every document of it)
    /// instead of a held-out share of --data's documents.
    #[arg(long, value_name = "PATH")]
    pub(crate) val_data: Option<PathBuf>,
    /// --data holds conversations, one `{"messages": [...]}` a line (OpenAI's format), rendered
    /// with the tokenizer's chat template; the loss is on the assistant's turns only.
    #[arg(long)]
    pub(crate) chat: bool,
    /// Keep the documents packed into a sequence apart (as Llama 3 trained): each token attends
    /// only to its own document and is at its position in it. Needs documents: a folder of text
    /// files, a token corpus or --chat conversations.
    #[arg(long)]
    pub(crate) doc_mask: bool,
    /// Hugging Face tokenizer for --data: a tokenizer.json, or a folder holding one with its
    /// tokenizer_config.json (special tokens, BOS) (default: byte-level tokens).
    #[arg(long)]
    pub(crate) tokenizer: Option<PathBuf>,
    /// Digits per operand of the built-in addition task.
    #[arg(long, allow_negative_numbers = true, value_parser = whole)]
    pub(crate) digits: Option<usize>,
    /// Optimizer steps of the run (default 3000).
    #[arg(long, allow_negative_numbers = true, value_parser = whole)]
    pub(crate) steps: Option<usize>,
    /// Sequences per optimizer step.
    #[arg(long, allow_negative_numbers = true, value_parser = whole)]
    pub(crate) batch: Option<usize>,
    /// Sequences per forward/backward pass (gradient accumulation).
    #[arg(long, allow_negative_numbers = true, value_parser = whole)]
    pub(crate) micro_batch: Option<usize>,
    /// Tokens per sequence.
    #[arg(long, allow_negative_numbers = true, value_parser = whole)]
    pub(crate) seq: Option<usize>,
    /// The longest sequence the model takes (its position table for GPT-2; default the
    /// preset's, 64 for tiny and llama-tiny).
    #[arg(long, allow_negative_numbers = true, value_parser = whole)]
    pub(crate) block_size: Option<usize>,
    /// Peak learning rate.
    #[arg(long)]
    pub(crate) lr: Option<f32>,
    /// A mixture of experts' capacity factor: each expert takes at most factor · seq · k / E
    /// of a sequence's tokens (those it weighs most), the rest pass it by; 0: dropless (default).
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) moe_capacity_factor: Option<f32>,
    /// A mixture of experts' auxiliary-loss-free balancing (DeepSeek-V3): a per-expert bias on
    /// the router's choice moved by this rate after each step towards the even load; 0: off.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) moe_bias_update_rate: Option<f32>,
    /// Seed of the initial weights and the data order (default 1337).
    #[arg(long)]
    pub(crate) seed: Option<u64>,
    /// Evaluate every N steps (0: only at the end).
    #[arg(long, allow_negative_numbers = true, value_parser = whole)]
    pub(crate) eval_every: Option<usize>,
    /// Intra-op threads of each rank (default: this machine's cores divided among the ranks
    /// that share it, at least 1).
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// Directory for the final checkpoint (and periodic ones with --save-every).
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// Save a checkpoint every N steps (500) or every so much time (90s, 15m, 2h; rank 0's
    /// clock), needs --out. The state is copied at the step's end and written in the background
    /// while training goes on (at most one save in flight).
    #[arg(long, allow_negative_numbers = true, value_parser = save_interval)]
    pub(crate) save_every: Option<brigade::train::run::SaveEvery>,
    /// Write each periodic checkpoint before the next step starts instead of in the background
    /// (the step waits for the files; for comparison).
    #[arg(long)]
    pub(crate) save_in_foreground: bool,
    /// Continue the run saved in this checkpoint directory (may extend it with --steps).
    #[arg(long)]
    pub(crate) resume: Option<PathBuf>,
    /// Write a Chrome trace-event timeline of the run to this file (open in Perfetto).
    #[arg(long)]
    pub(crate) trace: Option<PathBuf>,
    /// Parallel layout, as `brigade plan --layout`: dp=2,pp=2,tp=2,zero=1,sp=1 (unnamed axes
    /// are 1); with a pipeline also schedule=gpipe|1f1b|interleaved|zb (default 1f1b, or
    /// interleaved when v > 1), v= model chunks per rank, recompute=none|selective|full, mb= the
    /// micro-batch; cp=N splits each sequence over N ranks (context parallelism), with
    /// cp_comm=allgather|ring (default allgather) and cp_order=zigzag|contiguous (default zigzag).
    /// With the local backend the ranks are threads of this process, each with --threads threads.
    #[arg(long)]
    pub(crate) layout: Option<String>,
    /// local (rank threads in this process) or mpi (this process is one rank; run under
    /// mpirun; needs a build with --features mpi).
    #[arg(long, default_value = "local")]
    pub(crate) backend: String,
    /// Data-parallel gradient bucket size in MB (all-reduced as soon as it is complete).
    #[arg(long, default_value_t = 25.0)]
    pub(crate) bucket_mb: f64,
    /// Print the pipeline schedule of --layout (pp > 1; `schedule=gpipe|1f1b|interleaved|zb`,
    /// `v=` chunks per rank) as a chart of each rank's actions, with its simulated bubble, and
    /// exit.
    #[arg(long)]
    pub(crate) print_schedule: bool,
    /// Leave out the text sample printed at the end of a run on text (a 64-token generation).
    #[arg(long)]
    pub(crate) no_sample: bool,
    /// Stop after this many steps in this process, saving a checkpoint (to test resuming).
    #[arg(long, hide = true)]
    pub(crate) stop_after: Option<usize>,
}

/// The flags a resumed run takes over from the first one (`--resume` refuses the others:
/// they change what the run computes, and the checkpoint holds them).
pub(crate) const KEPT_ON_RESUME: &[&str] = &[
    "--steps",
    "--threads",
    "--layout",
    "--out",
    "--save-every",
    "--backend",
    "--bucket-mb",
    "--trace",
    "--eval-every",
];
/// The switches (flags without a value) a resumed run takes over.
pub(crate) const KEPT_SWITCHES: &[&str] = &["--save-in-foreground", "--no-sample"];

/// A count flag's value: a whole number (a negative one is named as such, not taken for a flag).
fn whole(s: &str) -> std::result::Result<usize, String> {
    s.parse::<usize>().map_err(|_| format!("must be a whole number, 0 or more, got {s}"))
}

impl TrainArgs {
    /// `--threads`, or this machine's cores divided among the `ranks` that share it.
    pub(crate) fn threads_for(&self, ranks: usize) -> usize {
        self.threads.unwrap_or_else(|| (crate::threads::default_threads() / ranks.max(1)).max(1))
    }

    /// The threads of each rank, once `train_cmd::run` has resolved `--threads` with
    /// [`TrainArgs::threads_for`].
    pub(crate) fn rank_threads(&self) -> usize {
        self.threads.unwrap_or(1)
    }

    /// Flags that change what the run computes, with their names (refused on --resume).
    pub(crate) fn numeric_overrides(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        let mut on = |set: bool, n: &'static str| {
            if set {
                v.push(n)
            }
        };
        on(self.config.is_some(), "--config");
        on(self.model.is_some(), "--model");
        on(self.init.is_some(), "--init");
        on(self.data.is_some(), "--data");
        on(self.chat, "--chat");
        on(self.doc_mask, "--doc-mask");
        on(self.val_data.is_some(), "--val-data");
        on(self.tokenizer.is_some(), "--tokenizer");
        on(self.digits.is_some(), "--digits");
        on(self.batch.is_some(), "--batch");
        on(self.micro_batch.is_some(), "--micro-batch");
        on(self.seq.is_some(), "--seq");
        on(self.block_size.is_some(), "--block-size");
        on(self.lr.is_some(), "--lr");
        on(self.moe_capacity_factor.is_some(), "--moe-capacity-factor");
        on(self.moe_bias_update_rate.is_some(), "--moe-bias-update-rate");
        on(self.seed.is_some(), "--seed");
        v
    }

    pub(crate) fn config(&self) -> Result<TrainConfig> {
        let mut c = match &self.config {
            Some(p) => {
                let text =
                    std::fs::read_to_string(p).with_context(|| format!("cannot read config file {}", p.display()))?;
                TrainConfig::from_toml(&text, &p.display().to_string())?
            }
            None => TrainConfig::default(),
        };
        if let Some(v) = &self.model {
            c.model = v.clone();
        }
        if let Some(dir) = &self.init {
            c.init = Some(dir.clone());
            if self.model.is_none() {
                // named for the folder (a preset's name would be checked against it)
                let name = dir.file_name().map_or("init".into(), |n| n.to_string_lossy().into_owned());
                c.model = match brigade::models::GptConfig::preset(&name) {
                    Ok(_) => format!("{name} (--init)"),
                    Err(_) => name,
                };
            }
        }
        if let Some(list) = &self.data {
            c.data = Some(list[0].0.clone());
            c.mix = match list.len() {
                1 if list[0].1.is_none() => Vec::new(),
                _ => list.iter().map(|(p, w)| Mixed { path: p.clone(), weight: w.unwrap_or(1.0) }).collect(),
            };
        }
        if self.chat {
            c.chat = true;
        }
        if self.doc_mask {
            c.doc_mask = true;
        }
        if self.val_data.is_some() {
            c.val_data = self.val_data.clone();
        }
        if self.tokenizer.is_some() {
            c.tokenizer = self.tokenizer.clone();
        }
        if let Some(v) = self.digits {
            c.digits = v;
        }
        if let Some(v) = self.steps {
            c.steps = v;
        }
        if let Some(v) = self.batch {
            c.batch = v;
        }
        if self.micro_batch.is_some() {
            c.micro_batch = self.micro_batch;
        }
        if self.seq.is_some() {
            c.seq = self.seq;
        }
        if self.block_size.is_some() {
            c.block_size = self.block_size;
        }
        if let Some(v) = self.lr {
            c.lr = v;
        }
        if self.moe_capacity_factor.is_some() {
            c.moe_capacity_factor = self.moe_capacity_factor;
        }
        if self.moe_bias_update_rate.is_some() {
            c.moe_bias_update_rate = self.moe_bias_update_rate;
        }
        if let Some(v) = self.seed {
            c.seed = v;
        }
        if let Some(v) = self.eval_every {
            c.eval_every = v;
        }
        Ok(c)
    }
}

/// `PATH` or `PATH:WEIGHT` (a corpus and its weight in the mix).
fn weighted(s: &str) -> Result<(PathBuf, Option<f64>), String> {
    if let Some((p, w)) = s.rsplit_once(':') {
        if !std::path::Path::new(s).exists() && !w.contains('/') {
            let weight: f64 =
                w.parse().map_err(|_| format!("the weight after ':' in {s} must be a number, got '{w}'"))?;
            if !(weight.is_finite() && weight > 0.0) {
                return Err(format!("the weight of {p} must be a positive number, got {w}"));
            }
            return Ok((PathBuf::from(p), Some(weight)));
        }
    }
    Ok((PathBuf::from(s), None))
}

fn save_interval(s: &str) -> Result<brigade::train::run::SaveEvery, String> {
    brigade::train::run::SaveEvery::parse(s)
}
