//! What `brigade serve` serves: a model from a checkpoint directory (brigade's own, or a
//! Hugging Face folder), a GGUF file (dequantized), or a preset shape with random weights (for
//! benchmarks), and the tokenizer that goes with it.

use crate::error::{Result, ServeError};
use crate::model::weights::WeightFormat;
use brigade::models::checkpoint::{trained_with_tokenizer_file, TOKENIZER_FILE};
use brigade::models::generation_config::{self, GenerationConfig};
use brigade::models::open::{metadata_folder, open_config, open_model, open_stored};
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
    /// End generation unless a request sets `ignore_eos`: the tokenizer's end-of-sequence
    /// token (`eos_token` of `tokenizer_config.json`, or GPT-2's `<|endoftext|>`) and those
    /// `generation_config.json` names (`eos_token_id`, one or a list, as `generate()` stops).
    pub eos: Vec<u32>,
    /// The folder's `generation_config.json` (its sampling defaults; empty for a preset).
    pub generation: GenerationConfig,
}

impl Source {
    /// The model's shape, read without loading weights (to refuse a bad path at once).
    pub fn config(&self) -> Result<GptConfig> {
        Ok(match self {
            Source::Checkpoint(dir) => open_config(dir)?,
            Source::Preset(name) => GptConfig::preset(name)?,
        })
    }

    /// The name `/v1/models` lists: the directory's name or the preset's.
    pub fn default_name(&self) -> String {
        match self {
            // a folder's name, or a file's without its extension (`x.gguf` serves as `x`)
            Source::Checkpoint(dir) => dir.canonicalize().ok().and_then(|d| {
                let name = if d.is_file() { d.file_stem() } else { d.file_name() };
                name.map(|f| f.to_string_lossy().into_owned())
            }),
            Source::Preset(name) => Some(name.clone()),
        }
        .unwrap_or_else(|| "model".into())
    }

    /// How the products are held: `Stored` becomes a GGUF file's matrices in their own types
    /// (other sources hold floats, served in f32); other formats as they are.
    pub fn held(&self, format: &WeightFormat, gpt: &Gpt) -> Result<WeightFormat> {
        Ok(match (format, self) {
            (WeightFormat::Stored, Source::Checkpoint(path)) => match open_stored(path, gpt)? {
                Some(s) => WeightFormat::StoredIn(std::sync::Arc::new(s)),
                None => WeightFormat::Stored,
            },
            _ => format.clone(),
        })
    }

    pub fn load(&self) -> Result<Served> {
        self.config()?;
        match self {
            Source::Preset(name) => {
                let gpt = Gpt::new(GptConfig::preset(name)?)?;
                let params = gpt.init_params(1);
                Ok(Served { gpt, params, tokenizer: None, eos: Vec::new(), generation: GenerationConfig::default() })
            }
            Source::Checkpoint(dir) => {
                let (gpt, params) = open_model(dir)?;
                // a GGUF file's tokenizer and generation config, unpacked from its metadata
                let meta = metadata_folder(dir)?;
                let tokenizer = tokenizer_of(&meta, gpt.cfg.vocab_size)?;
                let generation = generation_config::read(&meta, gpt.cfg.vocab_size)?;
                let eos = generation_config::end_ids(tokenizer.as_ref(), &generation);
                Ok(Served { gpt, params, tokenizer, eos, generation })
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
            return Err(ServeError::ModelFile(format!(
                "{} has {} tokens but the model only {vocab}; use the tokenizer the model was trained with",
                path.display(),
                t.vocab_size()
            )));
        }
        return Ok(Some(t));
    }
    let trained = trained_with_tokenizer_file(dir)
        .map_err(|e| ServeError::ModelFile(format!("reading the checkpoint's training state: {e}")))?;
    match trained {
        Some(true) => Err(ServeError::ModelFile(format!(
            "{} is missing: this checkpoint was trained with a Hugging Face tokenizer; copy that tokenizer.json into the checkpoint directory",
            path.display()
        ))),
        Some(false) => Ok(Some(Tokenizer::Bytes)),
        None => Ok(None),
    }
}
