//! Text ↔ token ids: bytes, or a Hugging Face `tokenizer.json` with the fingerprint of the
//! file it came from (so that a checkpoint can tell when it changed).

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Text ↔ token ids.
pub enum Tokenizer {
    /// One token per byte (vocabulary 256).
    Bytes,
    /// A Hugging Face tokenizer, the file it came from, that file's fingerprint, and what its
    /// `tokenizer_config.json` (beside it) says of its special tokens.
    Hf(Box<tokenizers::Tokenizer>, PathBuf, Fingerprint, Specials),
}

/// The special tokens a Hugging Face tokenizer folder names in `tokenizer_config.json`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Specials {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// Whether a text's ids begin with `bos` (`add_bos_token`, or else what the tokenizer's
    /// post-processor does with `add_special_tokens`, as `transformers` encodes by default).
    pub add_bos: bool,
    /// The `tokenizer_config.json` read, if any (a checkpoint carries it with tokenizer.json).
    pub config: Option<PathBuf>,
}

/// A token's byte range in the text it was read from.
pub type Span = (usize, usize);

/// The name of the file beside `tokenizer.json` that holds its special tokens and template.
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";

/// The file beside `tokenizer.json` that holds a chat template of its own (transformers 5
/// writes it; it wins over `tokenizer_config.json`'s `chat_template`).
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

/// Size and hash of a file's bytes: a checkpoint records those of its data and tokenizer, so
/// that a resume refuses files that changed (or a different file at the same path).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    pub bytes: u64,
    pub blake3: String,
}

impl Fingerprint {
    pub fn of(data: &[u8]) -> Fingerprint {
        Fingerprint { bytes: data.len() as u64, blake3: blake3::hash(data).to_hex().to_string() }
    }
}

impl std::fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "{} bytes, blake3 {}", self.bytes, &self.blake3[..16.min(self.blake3.len())])
    }
}

impl Tokenizer {
    /// A Hugging Face tokenizer from its `tokenizer.json`, or from a folder holding one (with
    /// its `tokenizer_config.json`, read too when beside the file).
    pub fn from_file(path: &Path) -> Result<Tokenizer> {
        if path.is_dir() {
            let file = path.join("tokenizer.json");
            if !file.is_file() {
                return Err(Error::Data(format!(
                    "tokenizer folder {} holds no tokenizer.json; give a Hugging Face tokenizer folder or file",
                    path.display()
                )));
            }
            return Tokenizer::from_file(&file);
        }
        if !path.is_file() {
            return Err(Error::Data(format!("tokenizer file {} not found", path.display())));
        }
        let bytes = std::fs::read(path)
            .map_err(|e| Error::Data(format!("cannot read tokenizer file {}: {e}", path.display())))?;
        let mut t = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| Error::Data(format!("{} is not a valid Hugging Face tokenizer.json: {e}", path.display())))?;
        // A tokenizer.json may carry a model's truncation/padding (BERT's cuts at 512 or 128
        // tokens): a training corpus is tokenized whole.
        t.with_truncation(None).map_err(|e| Error::Data(format!("{}: {e}", path.display())))?;
        t.with_padding(None);
        let specials = read_specials(&t, path)?;
        Ok(Tokenizer::Hf(Box::new(t), path.to_path_buf(), Fingerprint::of(&bytes), specials))
    }

    /// The special tokens (none for bytes).
    pub fn specials(&self) -> Specials {
        match self {
            Tokenizer::Bytes => Specials::default(),
            Tokenizer::Hf(.., s) => s.clone(),
        }
    }

    pub fn vocab_size(&self) -> usize {
        match self {
            Tokenizer::Bytes => 256,
            Tokenizer::Hf(t, ..) => t.get_vocab_size(true),
        }
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match self {
            Tokenizer::Bytes => Ok(text.bytes().map(|b| b as u32).collect()),
            Tokenizer::Hf(t, .., sp) => {
                let ids = t.encode(text, false).map_err(|e| Error::Data(format!("tokenizer failed: {e}")))?;
                match sp.bos.filter(|_| sp.add_bos) {
                    Some(bos) => Ok(std::iter::once(bos).chain(ids.get_ids().iter().copied()).collect()),
                    None => Ok(ids.get_ids().to_vec()),
                }
            }
        }
    }

    /// A document as a corpus holds it: its ids (BOS first where the tokenizer adds one) and
    /// the tokenizer's EOS last. A folder of text files read at start and `brigade tokenize`'s
    /// shards both close documents so.
    pub fn encode_document(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = self.encode(text)?;
        ids.extend(self.specials().eos);
        Ok(ids)
    }

    /// blake3 of the vocabulary: every token's id and text (specials included) in id order.
    /// Two tokenizer files with equal vocabularies give the same ids.
    pub fn vocab_blake3(&self) -> String {
        let mut h = blake3::Hasher::new();
        match self {
            Tokenizer::Bytes => {
                h.update(b"bytes");
            }
            Tokenizer::Hf(t, ..) => {
                let mut v: Vec<(u32, String)> = t.get_vocab(true).into_iter().map(|(s, i)| (i, s)).collect();
                v.sort();
                for (i, s) in v {
                    h.update(&i.to_le_bytes());
                    h.update(s.as_bytes());
                    h.update(&[0]);
                }
            }
        }
        h.finalize().to_hex().to_string()
    }

    /// What token shards record of the tokenizer that made them (`brigade tokenize`), and
    /// what training compares them with.
    pub fn identity(&self) -> crate::shards::tokens::TokenizerInfo {
        let sp = self.specials();
        crate::shards::tokens::TokenizerInfo {
            path: self.path().map(|p| p.display().to_string()).unwrap_or_else(|| "bytes".into()),
            vocab_blake3: self.vocab_blake3(),
            vocab_size: self.vocab_size(),
            bos: sp.bos.filter(|_| sp.add_bos),
            eos: sp.eos,
        }
    }

    /// The file it was read from (none for bytes).
    pub fn path(&self) -> Option<&Path> {
        match self {
            Tokenizer::Bytes => None,
            Tokenizer::Hf(_, p, ..) => Some(p),
        }
    }

    /// Encodes a text that already holds its special tokens (a rendered chat template): no
    /// BOS is added, special tokens written in the text become their ids (as `transformers`
    /// tokenizes `apply_chat_template`'s text, with `add_special_tokens=False`).
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        match self {
            Tokenizer::Bytes => Ok(text.bytes().map(|b| b as u32).collect()),
            Tokenizer::Hf(t, ..) => {
                Ok(t.encode(text, false).map_err(|e| Error::Data(format!("tokenizer failed: {e}")))?.get_ids().to_vec())
            }
        }
    }

    /// `encode_plain`, with each token's byte range in `text`.
    pub fn encode_plain_offsets(&self, text: &str) -> Result<(Vec<u32>, Vec<Span>)> {
        match self {
            Tokenizer::Bytes => {
                Ok((text.bytes().map(|b| b as u32).collect(), (0..text.len()).map(|i| (i, i + 1)).collect()))
            }
            Tokenizer::Hf(t, ..) => {
                let e = t.encode(text, false).map_err(|e| Error::Data(format!("tokenizer failed: {e}")))?;
                Ok((e.get_ids().to_vec(), e.get_offsets().to_vec()))
            }
        }
    }

    /// Decodes; byte sequences that are not UTF-8 come out with replacement characters.
    pub fn decode(&self, ids: &[u32]) -> String {
        match self {
            Tokenizer::Bytes => {
                let bytes: Vec<u8> = ids.iter().map(|&i| i.min(255) as u8).collect();
                String::from_utf8_lossy(&bytes).into_owned()
            }
            Tokenizer::Hf(t, ..) => t.decode(ids, false).unwrap_or_default(),
        }
    }
}

/// A special token's text in `tokenizer_config.json`: a string, or `{"content": …}`.
pub fn special_token_text(v: &serde_json::Value) -> Option<&str> {
    v.as_str().or_else(|| v.get("content").and_then(|c| c.as_str()))
}

/// The special tokens from the `tokenizer_config.json` beside `path`, if there is one.
fn read_specials(t: &tokenizers::Tokenizer, path: &Path) -> Result<Specials> {
    let cfg_path = path.with_file_name(TOKENIZER_CONFIG_FILE);
    if !cfg_path.is_file() {
        return Ok(Specials::default());
    }
    let text = std::fs::read_to_string(&cfg_path).map_err(|e| Error::io(&cfg_path, e))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::Data(format!("{} is not valid JSON: {e}", cfg_path.display())))?;
    let id = |key: &str| -> Result<Option<u32>> {
        match v.get(key).filter(|x| !x.is_null()) {
            None => Ok(None),
            Some(x) => {
                let name = special_token_text(x).ok_or_else(|| {
                    Error::Data(format!("{}: {key} must be a string or an object with content", cfg_path.display()))
                })?;
                t.token_to_id(name).map(Some).ok_or_else(|| {
                    Error::Data(format!("{}: {key} {name:?} is not in the tokenizer's vocabulary", cfg_path.display()))
                })
            }
        }
    };
    let (bos, eos) = (id("bos_token")?, id("eos_token")?);
    // transformers encodes with add_special_tokens: the post-processor decides, unless the
    // config says so itself
    let added = t.encode("", true).map(|e| e.get_ids().first().copied()).unwrap_or(None);
    let add_bos = match v.get("add_bos_token").and_then(|x| x.as_bool()) {
        Some(b) => b,
        None => bos.is_some() && added == bos,
    };
    Ok(Specials { bos, eos, add_bos: add_bos && bos.is_some(), config: Some(cfg_path) })
}
