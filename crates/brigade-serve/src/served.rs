//! What `brigade serve` serves: a GPT-2 from a checkpoint directory (brigade's own, or a
//! Hugging Face GPT-2 folder) or a preset shape with random weights (for benchmarks), and the
//! tokenizer that goes with it.

use anyhow::{bail, Context, Result};
use brigade::models::checkpoint::{load_model, read_model_config, trained_with_tokenizer_file, TOKENIZER_FILE};
use brigade::models::tokenizer::Tokenizer;
use brigade::models::{Gpt, GptConfig};
use std::path::{Path, PathBuf};

#[derive(Clone, Debug)]
pub enum Source {
    Checkpoint(PathBuf),
    /// A preset shape (`gpt2-small`, …) with random weights: token ids in and out.
    Preset(String),
}

pub struct Served {
    pub gpt: Gpt,
    pub params: Vec<f32>,
    /// `None`: prompts must be token ids; responses carry token ids and empty text.
    pub tokenizer: Option<Tokenizer>,
    /// Ends generation unless a request sets `ignore_eos`.
    pub eos: Option<u32>,
}

impl Source {
    /// The model's shape, read without loading weights (to refuse a bad path at once).
    pub fn config(&self) -> Result<GptConfig> {
        let cfg = match self {
            Source::Checkpoint(dir) => read_model_config(dir)?,
            Source::Preset(name) => GptConfig::preset(name)?,
        };
        if cfg.llama().is_some() {
            bail!(
                "this is a Llama-family model; brigade serve runs GPT-2 models so far (train, sample and plan take the Llama family)"
            );
        }
        Ok(cfg)
    }

    /// The name `/v1/models` lists: the directory's name or the preset's.
    pub fn default_name(&self) -> String {
        match self {
            Source::Checkpoint(dir) => {
                dir.canonicalize().ok().and_then(|d| d.file_name().map(|f| f.to_string_lossy().into_owned()))
            }
            Source::Preset(name) => Some(name.clone()),
        }
        .unwrap_or_else(|| "model".into())
    }

    pub fn load(&self) -> Result<Served> {
        self.config()?;
        match self {
            Source::Preset(name) => {
                let gpt = Gpt::new(GptConfig::preset(name)?)?;
                let params = gpt.init_params(1);
                Ok(Served { gpt, params, tokenizer: None, eos: None })
            }
            Source::Checkpoint(dir) => {
                let (gpt, params) = load_model(dir)?;
                let tokenizer = tokenizer_of(dir, gpt.cfg.vocab_size)?;
                let eos = match &tokenizer {
                    Some(Tokenizer::Hf(t, ..)) => t.token_to_id("<|endoftext|>"),
                    _ => None,
                };
                Ok(Served { gpt, params, tokenizer, eos })
            }
        }
    }
}

/// The checkpoint's `tokenizer.json`; bytes for a brigade checkpoint trained without one; none
/// for a Hugging Face folder that lacks it.
fn tokenizer_of(dir: &Path, vocab: usize) -> Result<Option<Tokenizer>> {
    let path = dir.join(TOKENIZER_FILE);
    if path.exists() {
        let t = Tokenizer::from_file(&path)?;
        if t.vocab_size() > vocab {
            bail!(
                "{} has {} tokens but the model only {vocab}; use the tokenizer the model was trained with",
                path.display(),
                t.vocab_size()
            );
        }
        return Ok(Some(t));
    }
    match trained_with_tokenizer_file(dir).context("reading the checkpoint's training state")? {
        Some(true) => bail!(
            "{} is missing: this checkpoint was trained with a Hugging Face tokenizer; copy that tokenizer.json into the checkpoint directory",
            path.display()
        ),
        Some(false) => Ok(Some(Tokenizer::Bytes)),
        None => Ok(None),
    }
}
