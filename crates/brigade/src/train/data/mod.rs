//! Training data: the built-in addition task, a text file tokenized at start, or a corpus of
//! documents (a folder of text files, one document each, tokenized at start; an llm.c or nanoGPT
//! `.bin` or a Megatron dataset, read memory-mapped) or conversations to fine-tune on
//! (`--chat`), several mixed by weight. Batch `s` is a pure function of (seed, s) on every rank,
//! so every layout and a resumed run see exactly the batches the single uninterrupted worker
//! would have.

pub mod chat;
pub mod corpus;
pub mod formats;
pub mod text;
pub mod tokens;

use super::addition::Addition;
use crate::error::{Error, Result};
pub use crate::models::tokenizer::{Fingerprint, Tokenizer};
pub use corpus::Corpora;
use corpus::Corpus;
use formats::Format;
use std::path::{Path, PathBuf};
pub use text::TextData;

/// One batch: the tokens `x` and targets `y` (`IGNORE` where there is none) of its sequences,
/// and, where the data knows its documents, each token's position in its document — from the
/// sequence's start for a document that began before it (`tensor::docs`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch {
    pub x: Vec<u32>,
    pub y: Vec<i32>,
    pub pos: Option<Vec<u32>>,
}

impl Batch {
    fn of((x, y): (Vec<u32>, Vec<i32>)) -> Batch {
        Batch { x, y, pos: None }
    }

    fn with_capacity(n: usize) -> Batch {
        Batch { x: Vec::with_capacity(n), y: Vec::with_capacity(n), pos: None }
    }
}

pub enum Dataset {
    Addition(Addition),
    Text(TextData),
    Corpus(Corpora),
}

/// How many tokens of each source are checked against the vocabulary at start (the rest as
/// each window is read would cost a pass over the corpus).
const CHECKED_TOKENS: u64 = 1 << 20;

impl Dataset {
    /// The sequence length this data is trained at by default.
    pub fn default_seq(&self, block_size: usize) -> usize {
        match self {
            Dataset::Addition(a) => a.seq_len() - 1,
            Dataset::Text(_) | Dataset::Corpus(_) => block_size.min(256),
        }
    }

    /// Batch `step` of `b` sequences of `t` tokens: a pure function of (seed, step).
    pub fn batch(&self, seed: u64, step: usize, b: usize, t: usize) -> Batch {
        match self {
            Dataset::Addition(a) => Batch::of(a.batch(seed, step, b)),
            Dataset::Text(d) => Batch::of(d.batch(seed, step, b, t)),
            Dataset::Corpus(c) => c.batch(seed, step, b, t),
        }
    }

    /// Whether the data knows where its documents begin (what `--doc-mask` needs): corpora
    /// do; one text file is one document, the addition task one problem a sequence.
    pub fn has_documents(&self) -> bool {
        matches!(self, Dataset::Corpus(_))
    }

    /// The data at `paths` (with their weights) for sequences of `seq` tokens of a model of
    /// `vocab` tokens: one text file as before, or corpora; `val`: a corpus to validate on
    /// instead of the corpora's held-out documents.
    pub fn open(
        paths: &[(PathBuf, f64)],
        val: Option<&Path>,
        chat: bool,
        tok: &Tokenizer,
        seq: usize,
        vocab: usize,
    ) -> Result<Dataset> {
        let mut list = Vec::new();
        for (path, w) in paths {
            let format = formats::detect(path, chat)?;
            if paths.len() == 1 && val.is_none() && format == Format::Text {
                return Ok(Dataset::Text(TextData::load(path, tok, seq)?));
            }
            let mut corpus = Dataset::corpus(path, format, tok, vocab)?;
            if val.is_some() {
                corpus = corpus.all_for_training();
            }
            corpus.check_length(seq, true, val.is_none())?;
            list.push((corpus, *w));
        }
        let held = match val {
            Some(p) => {
                let c = Dataset::corpus(p, formats::detect(p, chat)?, tok, vocab)?.all_for_validation();
                c.check_length(seq, false, true)?;
                Some(c)
            }
            None => None,
        };
        Ok(Dataset::Corpus(Corpora { list, held }))
    }

    /// One corpus of `format`, its first tokens checked against the model's vocabulary.
    fn corpus(path: &Path, format: Format, tok: &Tokenizer, vocab: usize) -> Result<Corpus> {
        let corpus = match format {
            Format::Text => {
                return Err(Error::Data(format!(
                    "{} is a text file; mixing corpora, or validating on one, takes corpora: put it in a folder of its own (a folder of text files is a corpus, a document a file)",
                    path.display()
                )))
            }
            Format::LlmC => formats::llmc(path)?,
            Format::NanoGpt => formats::nanogpt(path)?,
            Format::Megatron(prefix) => formats::megatron(&prefix)?,
            Format::ChatJsonl => chat::load(path, tok)?,
            Format::TextFolder => text::folder(path, tok)?,
            Format::TokenShards => formats::token_shards(path, tok)?,
        };
        for s in &corpus.sources {
            let n = s.len().min(CHECKED_TOKENS);
            let top = match s {
                tokens::Source::File(f) => (0..n).map(|i| f.get(i)).max().unwrap_or(0),
                tokens::Source::Memory { tokens, .. } => tokens.iter().copied().max().unwrap_or(0),
            };
            if top as usize >= vocab {
                return Err(Error::Data(format!(
                    "{} holds token id {top}, beyond the model's vocabulary of {vocab}; it was tokenized for another model",
                    corpus.name
                )));
            }
        }
        Ok(corpus)
    }

    /// Whether a path holds tokens already (no tokenizer reads it).
    pub fn is_tokenized(path: &Path, chat: bool) -> bool {
        matches!(
            formats::detect(path, chat),
            Ok(Format::LlmC | Format::NanoGpt | Format::Megatron(_) | Format::TokenShards)
        )
    }
}
