//! A sentence-transformers model: tokenizer → BERT → pooling → optional normalisation, read
//! from its folder (`modules.json`, `sentence_bert_config.json`, `1_Pooling/config.json`,
//! `config.json`, `model.safetensors`, `tokenizer.json`).

use super::pooling::{normalize, Pooling};
use crate::models::bert::{Bert, BertConfig};
use crate::{Error, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};
use tokenizers::{TruncationDirection, TruncationParams, TruncationStrategy};

/// A text's tokens as the model sees them, [CLS] and [SEP] included.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tokenized {
    pub ids: Vec<u32>,
    /// Tokens were cut at the model's maximum length.
    pub truncated: bool,
}

pub struct Encoder {
    /// The folder's name (e.g. `all-MiniLM-L6-v2`).
    pub name: String,
    /// blake3 of `model.safetensors`: which weights made a set of vectors.
    pub weights_hash: String,
    pub bert: Bert,
    pub pooling: Pooling,
    pub normalize: bool,
    /// Tokens per text at most, special tokens included (sentence-transformers' max_seq_length).
    pub max_len: usize,
    /// Tokens the tokenizer adds to every text ([CLS] and [SEP] for BERT): a text with no
    /// more than these is empty to the model.
    pub special_tokens: usize,
    lowercase: bool,
    tokenizer: tokenizers::Tokenizer,
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::Config(format!("{}: not valid JSON ({e})", path.display())))
}

const TRANSFORMER: &str = "sentence_transformers.models.Transformer";
const POOLING: &str = "sentence_transformers.models.Pooling";
const NORMALIZE: &str = "sentence_transformers.models.Normalize";

/// Python's `str.strip()`: sentence-transformers strips every text before tokenizing it.
fn py_strip(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_whitespace() || ('\x1c'..='\x1f').contains(&c))
}

impl Encoder {
    pub fn load(dir: &Path) -> Result<Encoder> {
        if !dir.is_dir() {
            return Err(Error::Config(format!(
                "model folder {} not found; give a sentence-transformers folder (config.json, model.safetensors, tokenizer.json, modules.json)",
                dir.display()
            )));
        }
        let (pool_dir, normalize) = Encoder::modules(dir)?;
        let cfg = BertConfig::from_file(&dir.join("config.json"))?;
        let pooling = match &pool_dir {
            Some(p) => {
                let path = p.join("config.json");
                Pooling::from_json(&read_json(&path)?, cfg.hidden)
                    .map_err(|m| Error::Config(format!("{}: {m}", path.display())))?
            }
            None => Pooling::mean(),
        };
        let st_cfg = dir.join("sentence_bert_config.json");
        let (mut max_len, mut lowercase) = (cfg.max_positions, false);
        if st_cfg.exists() {
            let v = read_json(&st_cfg)?;
            if let Some(n) = v["max_seq_length"].as_u64() {
                max_len = (n as usize).min(cfg.max_positions);
            }
            lowercase = v["do_lower_case"].as_bool().unwrap_or(false);
        }
        if max_len < 2 {
            return Err(Error::Config(format!("{}: max_seq_length must be at least 2", st_cfg.display())));
        }
        let tok_path = dir.join("tokenizer.json");
        let mut tokenizer = tokenizers::Tokenizer::from_file(&tok_path)
            .map_err(|e| Error::Config(format!("{}: not a Hugging Face tokenizer.json ({e})", tok_path.display())))?;
        // tokenizer.json may carry its own cut (128 for MiniLM) and padding: use the model's.
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: max_len,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
                direction: TruncationDirection::Right,
            }))
            .map_err(|e| Error::Config(format!("{}: {e}", tok_path.display())))?;
        tokenizer.with_padding(None);
        let vocab = tokenizer.get_vocab_size(true);
        if vocab > cfg.vocab {
            return Err(Error::Config(format!(
                "{} has {vocab} tokens but the model's vocab_size is {}; the tokenizer belongs to another model",
                tok_path.display(),
                cfg.vocab
            )));
        }
        let weights = dir.join("model.safetensors");
        let bytes = std::fs::read(&weights).map_err(|e| Error::io(&weights, e))?;
        let weights_hash = blake3::hash(&bytes).to_hex().to_string();
        let bert = Bert::from_safetensors(cfg, &bytes, &weights)?;
        let name = std::fs::canonicalize(dir)
            .ok()
            .and_then(|p| p.file_name().map(|s| s.to_string_lossy().into_owned()))
            .unwrap_or_else(|| dir.display().to_string());
        let mut enc =
            Encoder { name, weights_hash, bert, pooling, normalize, max_len, special_tokens: 0, lowercase, tokenizer };
        enc.special_tokens = enc.tokenize("")?.ids.len();
        if enc.special_tokens == 0 {
            return Err(Error::Config(format!(
                "{} adds no special tokens to a text, so an empty one has nothing to pool; brigade embed runs BERT tokenizers ([CLS] … [SEP])",
                tok_path.display()
            )));
        }
        Ok(enc)
    }

    /// Reads `modules.json`: the pooling folder and whether vectors are normalised. Without a
    /// modules.json (a plain Hugging Face BERT) pooling is mean and vectors are not normalised,
    /// as sentence-transformers does for such a folder.
    fn modules(dir: &Path) -> Result<(Option<PathBuf>, bool)> {
        let path = dir.join("modules.json");
        if !path.exists() {
            return Ok((None, false));
        }
        let v = read_json(&path)?;
        let list = v.as_array().ok_or_else(|| Error::Config(format!("{}: not a JSON list", path.display())))?;
        let (mut pool, mut norm, mut transformer) = (None, false, false);
        for m in list {
            let kind = m["type"].as_str().unwrap_or("");
            match kind {
                TRANSFORMER => transformer = true,
                POOLING => pool = Some(dir.join(m["path"].as_str().unwrap_or("1_Pooling"))),
                NORMALIZE => norm = true,
                other => {
                    return Err(Error::Config(format!(
                        "{}: module '{other}' is not supported; brigade embed runs Transformer → Pooling → Normalize pipelines",
                        path.display()
                    )))
                }
            }
        }
        if !transformer {
            return Err(Error::Config(format!(
                "{}: no sentence_transformers.models.Transformer module",
                path.display()
            )));
        }
        Ok((pool, norm))
    }

    pub fn dim(&self) -> usize {
        self.pooling.dim(self.bert.cfg.hidden)
    }

    /// Tokens of one text, prepared as sentence-transformers does (stripped, lowercased if
    /// the model says so, cut at `max_len`).
    pub fn tokenize(&self, text: &str) -> Result<Tokenized> {
        let text = py_strip(text);
        let lowered;
        let text = if self.lowercase {
            lowered = text.to_lowercase();
            lowered.as_str()
        } else {
            text
        };
        let enc = self.tokenizer.encode(text, true).map_err(|e| Error::Data(format!("tokenizer failed: {e}")))?;
        let ids = enc.get_ids().to_vec();
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= self.bert.cfg.vocab) {
            return Err(Error::Data(format!("tokenizer produced token {bad}, outside the model's vocabulary")));
        }
        Ok(Tokenized { ids, truncated: !enc.get_overflowing().is_empty() })
    }

    /// Vectors `[seqs.len(), dim]` of token sequences, all in one packed forward pass.
    pub fn embed_tokens(&self, seqs: &[&[u32]]) -> Vec<f32> {
        let lens: Vec<usize> = seqs.iter().map(|s| s.len()).collect();
        let tokens: Vec<u32> = seqs.concat();
        let c = self.bert.cfg.hidden;
        let h = self.bert.forward(&tokens, &lens);
        let dim = self.dim();
        let mut out = vec![0f32; seqs.len() * dim];
        let mut row = 0;
        for (o, &l) in out.chunks_exact_mut(dim).zip(&lens) {
            self.pooling.pool(o, &h[row * c..(row + l) * c], c);
            if self.normalize {
                normalize(o);
            }
            row += l;
        }
        out
    }

    /// Vectors of texts (tokenized, then one forward pass).
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<f32>> {
        let toks: Vec<Tokenized> = texts.iter().map(|t| self.tokenize(t)).collect::<Result<_>>()?;
        let seqs: Vec<&[u32]> = toks.iter().map(|t| t.ids.as_slice()).collect();
        Ok(self.embed_tokens(&seqs))
    }
}
