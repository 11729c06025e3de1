//! A training run's settings: defaults, overridden by a TOML file, overridden by flags.

use super::optimizer::AdamWConfig;
use crate::error::{Error, Result};
use crate::models::GptConfig;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// A bound on tokens per optimizer step, far beyond any single machine, that keeps every size
/// computed from it clear of overflow.
pub const MAX_TOKENS_PER_BATCH: usize = 1 << 40;

/// A corpus and its weight in the mix.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mixed {
    pub path: PathBuf,
    pub weight: f64,
}

/// Everything that determines the run's numbers. Threads and output paths are not here:
/// they change how fast a run goes, never what it computes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// Model preset (`tiny`, `gpt2-small`, …); the fields below override it.
    pub model: String,
    pub n_layer: Option<usize>,
    pub n_head: Option<usize>,
    pub n_embd: Option<usize>,
    pub block_size: Option<usize>,
    pub vocab_size: Option<usize>,
    /// Llama family only: key/value heads (grouped-query attention) and the SwiGLU width.
    pub n_kv_head: Option<usize>,
    pub intermediate_size: Option<usize>,
    /// A mixture of experts' capacity factor (`LlamaMoe::capacity`; 0: dropless), over the
    /// preset's or the folder's.
    pub moe_capacity_factor: Option<f32>,
    /// A mixture of experts' auxiliary-loss-free balancing rate (`LlamaMoe::bias_rate`; 0: off).
    pub moe_bias_update_rate: Option<f32>,
    /// A Hugging Face folder whose weights the run starts from (its `config.json` gives the
    /// family and shape); absent: random weights of the preset's shape. The checkpoint
    /// records it: where the run came from.
    pub init: Option<PathBuf>,
    /// Resuming: the checkpoint whose `config.json` gives the shape (its weights replace the
    /// starting ones), so that the `init` folder need not be there any more.
    #[serde(skip)]
    pub shape_from: Option<PathBuf>,
    /// What to train on: a UTF-8 text file, an llm.c `.bin`, a Megatron dataset (`PREFIX` or
    /// `PREFIX.bin`), or with `chat` a JSON Lines file of conversations; absent: the built-in
    /// addition task. With `mix`, the first of them.
    pub data: Option<PathBuf>,
    /// Several corpora drawn from by weight (`data` is the first's path); empty: `data` alone.
    pub mix: Vec<Mixed>,
    /// A corpus to validate on (all its documents) instead of a held-out share of `data`'s.
    pub val_data: Option<PathBuf>,
    /// `data` holds conversations (`{"messages": [...]}` a line) rendered with the tokenizer's
    /// chat template, trained with the loss on the assistant's turns only.
    pub chat: bool,
    /// Documents packed into a sequence are kept apart (Llama 3 trained so): each token attends
    /// only to its own document's tokens and is at its position in that document. Needs a
    /// corpus (documents); off: a packed sequence is attended to as one text.
    #[serde(default)]
    pub doc_mask: bool,
    /// Hugging Face tokenizer.json; absent: byte-level tokens.
    pub tokenizer: Option<PathBuf>,
    /// Digits per operand of the built-in addition task.
    pub digits: usize,
    /// Addition task: write the sum least significant digit first.
    pub reverse: bool,
    /// Addition task: the fraction of training problems drawn with carry chains (digit pairs
    /// summing to 9, which pass a carry on); the rest, and every held-out problem, uniform.
    pub carry_chains: f32,
    pub steps: usize,
    /// Sequences per optimizer step.
    pub batch: usize,
    /// Sequences per forward/backward pass; `batch` must be a multiple. Absent: `batch`.
    pub micro_batch: Option<usize>,
    /// Tokens per sequence; absent: the data's natural length.
    pub seq: Option<usize>,
    pub lr: f32,
    /// Floor of the cosine decay; absent: lr / 10.
    pub min_lr: Option<f32>,
    /// Warmup steps; absent: 5% of steps.
    pub warmup: Option<usize>,
    pub grad_clip: f32,
    pub adamw: AdamWConfig,
    pub seed: u64,
    /// Evaluate every this many steps (0: only at the end).
    pub eval_every: usize,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            model: "tiny".into(),
            n_layer: None,
            n_head: None,
            n_embd: None,
            block_size: None,
            vocab_size: None,
            n_kv_head: None,
            intermediate_size: None,
            init: None,
            shape_from: None,
            moe_capacity_factor: None,
            moe_bias_update_rate: None,
            data: None,
            mix: Vec::new(),
            val_data: None,
            chat: false,
            doc_mask: false,
            tokenizer: None,
            digits: 3,
            reverse: true,
            carry_chains: 0.25,
            steps: 3000,
            batch: 64,
            micro_batch: None,
            seq: None,
            lr: 1e-3,
            min_lr: None,
            warmup: None,
            grad_clip: 1.0,
            adamw: AdamWConfig { weight_decay: 0.1, ..AdamWConfig::default() },
            seed: 1337,
            eval_every: 500,
        }
    }
}

impl TrainConfig {
    pub fn from_toml(text: &str, origin: &str) -> Result<TrainConfig> {
        toml::from_str(text).map_err(|e| {
            let at = e.span().map(|sp| {
                let before = &text[..sp.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
                format!(" at line {line}, column {col}")
            });
            Error::Train(format!("config {origin}{}: {}", at.unwrap_or_default(), e.message().trim_end()))
        })
    }

    /// The model shape: the preset with this config's overrides; `data_vocab` is the
    /// tokenizer's vocabulary, which the model's must cover.
    pub fn model_config(&self, data_vocab: usize) -> Result<GptConfig> {
        let mut cfg = match self.shape_from.as_ref().or(self.init.as_ref()) {
            Some(dir) => self.published_config(dir)?,
            None => self.preset_config(data_vocab)?,
        };
        type Set = fn(&mut crate::models::family::LlamaMoe, f32);
        let options: [(&str, Option<f32>, &str, Set); 2] = [
            (
                "--moe-capacity-factor",
                self.moe_capacity_factor,
                "0 (dropless) or positive (1.0: each expert takes its even share)",
                |m, f| m.capacity = f,
            ),
            (
                "--moe-bias-update-rate",
                self.moe_bias_update_rate,
                "0 (off) or positive (DeepSeek-V3 used 0.001)",
                |m, f| m.bias_rate = f,
            ),
        ];
        for (flag, value, rule, set) in options {
            let Some(f) = value else { continue };
            let moe = match &mut cfg.family {
                crate::models::family::Family::Llama(a) => a.moe.as_mut(),
                crate::models::family::Family::Gpt2 => None,
            };
            let Some(m) = moe else {
                return Err(Error::Config(format!(
                    "{flag} {f}: {} is a dense model (no experts); drop the flag or train a mixture (moe-tiny)",
                    self.model
                )));
            };
            if !(f >= 0.0 && f.is_finite()) {
                return Err(Error::Config(format!("{flag} {f} must be {rule}")));
            }
            set(m, f);
        }
        if cfg.vocab_size < data_vocab {
            return Err(Error::Config(match &self.init {
                Some(dir) => format!(
                    "the tokenizer has {data_vocab} tokens but the model in {} has a vocabulary of {}; give the model's own tokenizer",
                    dir.display(),
                    cfg.vocab_size
                ),
                None => format!(
                    "vocab_size {} is smaller than the tokenizer's vocabulary of {data_vocab}; raise vocab_size",
                    cfg.vocab_size
                ),
            }));
        }
        Ok(cfg)
    }

    /// The shape of the published model in `dir` (its `config.json`); `model`, if a preset,
    /// must be of its family and shape, and no shape override may be set.
    fn published_config(&self, dir: &std::path::Path) -> Result<GptConfig> {
        // a GGUF file's config.json is its metadata, unpacked
        let cfg = crate::models::open::open_config(dir)?;
        let overrides = [
            ("n_layer", self.n_layer.is_some()),
            ("n_head", self.n_head.is_some()),
            ("n_embd", self.n_embd.is_some()),
            ("block_size", self.block_size.is_some()),
            ("vocab_size", self.vocab_size.is_some()),
            ("n_kv_head", self.n_kv_head.is_some()),
            ("intermediate_size", self.intermediate_size.is_some()),
        ];
        if let Some((name, _)) = overrides.iter().find(|(_, set)| *set) {
            return Err(Error::Config(format!(
                "--init {} takes the model's shape from its config.json; drop the {name} setting",
                dir.display()
            )));
        }
        if let Ok(p) = GptConfig::preset(&self.model) {
            if p.family.name() != cfg.family.name() {
                return Err(Error::Config(format!(
                    "--init {} holds a {} model but --model {} is of the {} family; drop --model (the folder's config.json says what it is)",
                    dir.display(),
                    cfg.family.name(),
                    self.model,
                    p.family.name()
                )));
            }
            let (a, b) = (p.shape(), cfg.shape());
            if (a.n_layer, a.n_head, a.n_embd) != (b.n_layer, b.n_head, b.n_embd) {
                return Err(Error::Config(format!(
                    "--init {} holds a model of {} layers, {} heads, width {}, but --model {} has {} layers, {} heads, width {}; drop --model",
                    dir.display(),
                    b.n_layer,
                    b.n_head,
                    b.n_embd,
                    self.model,
                    a.n_layer,
                    a.n_head,
                    a.n_embd
                )));
            }
        }
        Ok(cfg)
    }

    fn preset_config(&self, data_vocab: usize) -> Result<GptConfig> {
        let p = GptConfig::preset(&self.model)?;
        let mut cfg = GptConfig {
            n_layer: self.n_layer.unwrap_or(p.n_layer),
            n_head: self.n_head.unwrap_or(p.n_head),
            n_embd: self.n_embd.unwrap_or(p.n_embd),
            block_size: self.block_size.unwrap_or(p.block_size),
            vocab_size: self.vocab_size.unwrap_or(p.vocab_size.max(data_vocab)),
            family: p.family,
        };
        let changes = crate::models::family::Overrides {
            reshaped: self.n_embd.is_some() || self.n_head.is_some(),
            n_kv_head: self.n_kv_head,
            intermediate: self.intermediate_size,
        };
        cfg.family.reshape(&cfg.shape(), changes, &self.model).map_err(Error::Config)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The corpora to train on with their weights (`data` alone: weight 1).
    pub fn corpora(&self) -> Vec<(PathBuf, f64)> {
        match (&self.data, self.mix.is_empty()) {
            (Some(d), true) => vec![(d.clone(), 1.0)],
            (_, false) => self.mix.iter().map(|m| (m.path.clone(), m.weight)).collect(),
            (None, true) => vec![],
        }
    }

    /// The built-in addition task this run trains on, if it has no data file.
    pub fn addition(&self) -> Option<super::addition::Addition> {
        self.data.is_none().then_some(super::addition::Addition {
            digits: self.digits,
            reverse: self.reverse,
            carry_chains: self.carry_chains,
        })
    }

    pub fn micro_batch(&self) -> usize {
        self.micro_batch.unwrap_or(self.batch)
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Train(m));
        if self.steps == 0 {
            return bad("steps must be at least 1".into());
        }
        if self.batch == 0 {
            return bad("batch must be at least 1".into());
        }
        let mb = self.micro_batch();
        if mb == 0 || !self.batch.is_multiple_of(mb) {
            return bad(format!("batch ({}) must be a positive multiple of micro_batch ({mb})", self.batch));
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad(format!("lr must be a positive number, got {}", self.lr));
        }
        if let Some(m) = self.min_lr {
            if !(m.is_finite() && m >= 0.0 && m <= self.lr) {
                return bad(format!("min_lr must be between 0 and lr ({}), got {m}", self.lr));
            }
        }
        if !(self.grad_clip.is_finite() && self.grad_clip >= 0.0) {
            return bad(format!("grad_clip must be 0 (off) or a positive number, got {}", self.grad_clip));
        }
        if self.warmup.is_some_and(|w| w > self.steps) {
            return bad(format!("warmup ({}) must not exceed steps ({})", self.warmup.unwrap_or(0), self.steps));
        }
        self.adamw.validate().map_err(Error::Train)?;
        if self.batch.checked_mul(self.seq.unwrap_or(1)).is_none_or(|n| n > MAX_TOKENS_PER_BATCH) {
            return bad(format!(
                "batch × seq = {} × {} is beyond any machine (at most {MAX_TOKENS_PER_BATCH} tokens per step)",
                self.batch,
                self.seq.unwrap_or(1)
            ));
        }
        if !(0.0..=1.0).contains(&self.carry_chains) {
            return bad(format!("carry_chains is a fraction of the problems: give 0 to 1, got {}", self.carry_chains));
        }
        if self.digits == 0 || self.digits > 9 {
            return bad(format!("digits must be between 1 and 9, got {}", self.digits));
        }
        if !self.mix.is_empty() {
            if self.mix.first().map(|m| &m.path) != self.data.as_ref() {
                return bad("mix lists every corpus, the first being data's; set data to the first path of mix".into());
            }
            if let Some(m) = self.mix.iter().find(|m| !(m.weight.is_finite() && m.weight > 0.0)) {
                return bad(format!("the weight of {} must be a positive number, got {}", m.path.display(), m.weight));
            }
        }
        if self.val_data.is_some() && self.data.is_none() {
            return bad("--val-data needs --data (the built-in task holds out its own problems)".into());
        }
        if self.doc_mask && self.data.is_none() {
            return bad("--doc-mask needs --data with documents (a folder of text files, a token corpus, or --chat conversations); the built-in task is one problem a sequence".into());
        }
        if self.chat && self.data.is_none() {
            return bad("--chat needs --data FILE.jsonl (conversations, one {\"messages\": [...]} a line)".into());
        }
        if self.tokenizer.is_some() && self.data.is_none() {
            return bad("--tokenizer needs --data FILE (the built-in task uses bytes)".into());
        }
        Ok(())
    }
}
