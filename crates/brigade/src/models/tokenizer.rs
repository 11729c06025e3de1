//! Text ↔ token ids: bytes, or a Hugging Face `tokenizer.json` with the fingerprint of the
//! file it came from (so that a checkpoint can tell when it changed).

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Text ↔ token ids.
pub enum Tokenizer {
    /// One token per byte (vocabulary 256).
    Bytes,
    /// A Hugging Face tokenizer, the file it came from and that file's fingerprint.
    Hf(Box<tokenizers::Tokenizer>, PathBuf, Fingerprint),
}

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
    pub fn from_file(path: &Path) -> Result<Tokenizer> {
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
        Ok(Tokenizer::Hf(Box::new(t), path.to_path_buf(), Fingerprint::of(&bytes)))
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
            Tokenizer::Hf(t, ..) => t
                .encode(text, false)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| Error::Data(format!("tokenizer failed: {e}"))),
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
