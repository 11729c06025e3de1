//! Training data: the built-in addition task, or a text file tokenized by bytes or by a
//! Hugging Face `tokenizer.json`. Batch `s` is a pure function of (seed, s), so a resumed run
//! sees exactly the batches the uninterrupted run would have.

use super::addition::Addition;
use crate::error::{Error, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
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

/// A tokenized text corpus: the first 90% trains, the last 10% validates.
pub struct TextData {
    pub tokens: Vec<u32>,
    pub split: usize,
    /// Of the file's bytes.
    pub fingerprint: Fingerprint,
}

impl TextData {
    pub fn load(path: &Path, tok: &Tokenizer, seq: usize) -> Result<TextData> {
        let bytes =
            std::fs::read(path).map_err(|e| Error::Data(format!("cannot read data file {}: {e}", path.display())))?;
        if bytes.is_empty() {
            return Err(Error::Data(format!("data file {} is empty; give a UTF-8 text file", path.display())));
        }
        let fingerprint = Fingerprint::of(&bytes);
        let text = String::from_utf8(bytes)
            .map_err(|e| Error::Data(format!("data file {} is not UTF-8 text ({e})", path.display())))?;
        let tokens = tok.encode(&text)?;
        let split = tokens.len() * 9 / 10;
        let need = 10 * (seq + 1);
        if tokens.len() < need {
            return Err(Error::Data(format!(
                "data file {} has {} tokens; training with sequence length {seq} needs at least {need} (or use a shorter --seq)",
                path.display(),
                tokens.len()
            )));
        }
        Ok(TextData { tokens, split, fingerprint })
    }

    fn window(&self, rng: &mut ChaCha8Rng, lo: usize, hi: usize, t: usize, x: &mut Vec<u32>, y: &mut Vec<i32>) {
        let start = rng.gen_range(lo..hi - t);
        x.extend_from_slice(&self.tokens[start..start + t]);
        y.extend(self.tokens[start + 1..start + t + 1].iter().map(|&v| v as i32));
    }

    pub fn batch(&self, seed: u64, step: usize, b: usize, t: usize) -> (Vec<u32>, Vec<i32>) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (step as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
        let (mut x, mut y) = (Vec::new(), Vec::new());
        for _ in 0..b {
            self.window(&mut rng, 0, self.split, t, &mut x, &mut y);
        }
        (x, y)
    }

    /// `n` fixed validation windows from the held-out tail.
    pub fn val_batch(&self, n: usize, t: usize) -> (Vec<u32>, Vec<i32>) {
        let mut rng = ChaCha8Rng::seed_from_u64(0x7a1);
        let (mut x, mut y) = (Vec::new(), Vec::new());
        let lo = self.split.min(self.tokens.len() - t - 2);
        for _ in 0..n {
            self.window(&mut rng, lo, self.tokens.len(), t, &mut x, &mut y);
        }
        (x, y)
    }
}

pub enum Dataset {
    Addition(Addition),
    Text(TextData),
}

impl Dataset {
    /// The sequence length this data is trained at by default.
    pub fn default_seq(&self, block_size: usize) -> usize {
        match self {
            Dataset::Addition(a) => a.seq_len() - 1,
            Dataset::Text(_) => block_size.min(256),
        }
    }

    pub fn batch(&self, seed: u64, step: usize, b: usize, t: usize) -> (Vec<u32>, Vec<i32>) {
        match self {
            Dataset::Addition(a) => a.batch(seed, step, b),
            Dataset::Text(d) => d.batch(seed, step, b, t),
        }
    }
}
