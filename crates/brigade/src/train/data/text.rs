//! A text file tokenized at start by bytes or by a Hugging Face `tokenizer.json`. Batch `s` is a pure function of (seed, s), so a resumed run
//! sees exactly the batches the uninterrupted run would have.

use crate::error::{Error, Result};
use crate::models::tokenizer::{Fingerprint, Tokenizer};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::Path;

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

/// A folder of UTF-8 text files, one document each (in name order), tokenized at start as the
/// tokenizer's config says a document is (its BOS first where it adds one, its EOS last), as a
/// corpus whose held-out documents are whole files.
pub fn folder(dir: &Path, tok: &Tokenizer) -> Result<super::corpus::Corpus> {
    use super::corpus::{Corpus, Doc, Documents, Packing};
    use rayon::prelude::*;
    let files = crate::shards::input::folder_files(dir)?;
    if files.is_empty() {
        return Err(Error::Data(format!(
            "folder {} holds no files; give a folder of text files, one document each",
            dir.display()
        )));
    }
    let docs: Vec<(Vec<u32>, Fingerprint)> = files
        .par_iter()
        .map(|p| {
            let bytes = std::fs::read(p).map_err(|e| Error::Data(format!("cannot read {}: {e}", p.display())))?;
            let fp = Fingerprint::of(&bytes);
            let text = String::from_utf8(bytes).map_err(|e| {
                Error::Data(format!("{} is not UTF-8 text ({e}); a folder of documents holds text files", p.display()))
            })?;
            Ok((tok.encode_document(&text)?, fp))
        })
        .collect::<Result<_>>()?;
    let mut h = blake3::Hasher::new();
    let (mut tokens, mut spans, mut bytes) = (Vec::new(), Documents::default(), 0);
    for (f, (ids, fp)) in files.iter().zip(docs) {
        h.update(f.file_name().unwrap_or_default().to_string_lossy().as_bytes());
        h.update(fp.blake3.as_bytes());
        bytes += fp.bytes;
        spans.push([Doc { src: 0, start: tokens.len() as u64, len: ids.len() as u32 }]);
        tokens.extend(ids);
    }
    let fingerprint = Fingerprint { bytes, blake3: h.finalize().to_hex().to_string() };
    let source = super::tokens::Source::Memory { tokens, trained: None };
    Corpus::new(dir.display().to_string(), vec![source], spans, Packing::Windows, fingerprint)
}
