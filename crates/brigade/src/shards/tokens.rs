//! `brigade tokenize`'s output: a corpus as token shards, each a Megatron indexed dataset
//! (`shard-NNNNN.bin` + `shard-NNNNN.idx`, one sequence a document, the `.idx` committing the
//! shard), and `manifest.json` with the tokenizer, the input, the counts and every shard's
//! checksums. Training reads such a folder as a corpus (`--data DIR`), each shard memory-mapped.

use super::dir::{self, sha256, Layout, Start};
use super::input::{FileInfo, Format, InputSpec, OnError, Skipped};
use super::megatron::{self, MegatronIndex, Width};
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fs;
use std::path::Path;

pub const FORMAT: &str = "brigade-tokens/1";

/// Token shards: the tokens (`.bin`) then Megatron's index (`.idx`), which commits the shard.
pub const LAYOUT: Layout = Layout {
    tool: "brigade tokenize",
    what: "tokens",
    format: FORMAT,
    parts: &[".bin", ".idx"],
    crash_env: "BRIGADE_TOKENIZE_CRASH",
};

/// The tokenizer that made the tokens, and how a document was closed. Two are equal when
/// they give the same ids and close documents alike, wherever their files are.
#[derive(Clone, Debug, Eq, Serialize, Deserialize)]
pub struct TokenizerInfo {
    /// Where it was read (for people; not compared).
    pub path: String,
    /// blake3 of the vocabulary (every token's id and text, specials included): two tokenizer
    /// files with the same vocabulary give the same ids.
    pub vocab_blake3: String,
    pub vocab_size: usize,
    /// The token put first in every document, where the tokenizer adds one.
    pub bos: Option<u32>,
    /// The token put last in every document.
    pub eos: Option<u32>,
}

impl PartialEq for TokenizerInfo {
    fn eq(&self, o: &TokenizerInfo) -> bool {
        (&self.vocab_blake3, self.vocab_size, self.bos, self.eos) == (&o.vocab_blake3, o.vocab_size, o.bos, o.eos)
    }
}

/// Everything that decides the shards: two runs with equal `Job`s write identical bytes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub tokenizer: TokenizerInfo,
    pub input: Vec<FileInfo>,
    pub format: Option<Format>,
    pub text_field: String,
    pub on_error: OnError,
    pub shard_size: usize,
    /// Megatron's dtype: uint16 below 65500 tokens of vocabulary, int32 above.
    pub dtype: String,
}

impl Job {
    pub fn new(tokenizer: TokenizerInfo, input: Vec<FileInfo>, spec: &InputSpec, shard_size: usize) -> Job {
        let dtype = match Width::for_vocab(tokenizer.vocab_size) {
            Width::U16 => "uint16",
            Width::U32 => "int32",
        };
        Job {
            tokenizer,
            input,
            format: spec.format,
            text_field: spec.text_field.clone(),
            on_error: spec.on_error,
            shard_size,
            dtype: dtype.into(),
        }
    }

    pub fn width(&self) -> Width {
        Width::for_vocab(self.tokenizer.vocab_size)
    }

    /// What differs from another job, in words.
    fn differences(&self, other: &Job) -> Vec<&'static str> {
        let mut d = Vec::new();
        if self.tokenizer != other.tokenizer {
            d.push("tokenizer");
        }
        if self.input != other.input {
            d.push("input files");
        }
        if (&self.format, &self.text_field, self.on_error, self.shard_size)
            != (&other.format, &other.text_field, other.on_error, other.shard_size)
        {
            d.push("settings");
        }
        d
    }
}

/// What one shard holds, written beside it until the manifest takes it over.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardStats {
    pub documents: usize,
    pub tokens: u64,
    pub sha256: String,
    pub idx_sha256: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardEntry {
    pub index: usize,
    /// The Megatron dataset's prefix (`shard-NNNNN`: its `.bin` and `.idx`).
    pub prefix: String,
    pub documents: usize,
    pub tokens: u64,
    pub sha256: String,
    pub idx_sha256: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    pub documents: u64,
    pub tokens: u64,
    pub skipped: u64,
}

pub type Manifest = dir::Manifest<Job, Totals, ShardEntry>;

pub fn prefix(i: usize) -> String {
    LAYOUT.name(i, "")
}

/// Whether `dir` is a token-shard folder (its manifest says so).
pub fn is_tokens_dir(dir: &Path) -> bool {
    let Ok(text) = fs::read_to_string(dir.join(dir::MANIFEST)) else { return false };
    serde_json::from_str::<serde_json::Value>(&text).is_ok_and(|v| v["format"] == FORMAT)
}

pub fn read_manifest(dir: &Path) -> Result<Manifest> {
    dir::read_manifest(dir, &LAYOUT)
}

/// Readies `dir` for `job` (see [`dir::prepare`]).
pub fn prepare(dir: &Path, job: &Job, overwrite: bool) -> Result<Start> {
    let started = Manifest::of(&LAYOUT, job.clone(), false, &[]);
    dir::prepare(dir, &LAYOUT, job, Job::differences, &started, overwrite)
}

pub fn claim(dir: &Path, i: usize) -> Result<bool> {
    dir::claim(dir, &LAYOUT, i)
}

/// Writes shard `i`, its documents' tokens in input order, and commits it.
pub fn commit_shard(dir: &Path, i: usize, docs: &[Vec<u32>], width: Width) -> Result<ShardStats> {
    let (bin, idx) = megatron::write(docs, width);
    let stats = ShardStats {
        documents: docs.len(),
        tokens: docs.iter().map(|d| d.len() as u64).sum(),
        sha256: sha256(&bin),
        idx_sha256: sha256(&idx),
    };
    dir::commit(dir, &LAYOUT, i, &[&bin, &idx], &stats)?;
    Ok(stats)
}

/// Once every shard is committed: the final manifest, then the statistics files go.
pub fn finish(dir: &Path, job: &Job, shards: usize, skipped: &[Skipped]) -> Result<Manifest> {
    let mut m = Manifest::of(&LAYOUT, job.clone(), true, skipped);
    m.totals.skipped = skipped.len() as u64;
    for (i, s) in dir::shard_stats::<ShardStats>(dir, &LAYOUT, shards)?.into_iter().enumerate() {
        m.totals.documents += s.documents as u64;
        m.totals.tokens += s.tokens;
        m.shards.push(ShardEntry {
            index: i,
            prefix: prefix(i),
            documents: s.documents,
            tokens: s.tokens,
            sha256: s.sha256,
            idx_sha256: s.idx_sha256,
        });
    }
    dir::finish(dir, &LAYOUT, &m, shards)?;
    Ok(m)
}

/// Re-checks a finished output: every shard's checksums, its index against its tokens and the
/// manifest's counts, the totals, every document of the input accounted for, no stray file.
/// Returns the manifest, or every problem found, one a line.
pub fn verify(dir: &Path) -> Result<Manifest> {
    let m = read_manifest(dir)?;
    let mut problems = Vec::new();
    if !m.complete {
        problems.push(
            "the job has not finished (manifest says complete: false); run the same command again to finish it".into(),
        );
    }
    let (mut documents, mut tokens) = (0u64, 0u64);
    let width = m.job.width();
    for s in &m.shards {
        let (bin_name, idx_name) = (format!("{}.bin", s.prefix), format!("{}.idx", s.prefix));
        let (Ok(bin), Ok(idx)) = (fs::read(dir.join(&bin_name)), fs::read(dir.join(&idx_name))) else {
            problems.push(format!("shard {}: {bin_name} or {idx_name} is missing", s.index));
            continue;
        };
        if sha256(&bin) != s.sha256 {
            problems.push(format!("shard {}: {bin_name} does not match its sha256 (changed or corrupt)", s.index));
        }
        if sha256(&idx) != s.idx_sha256 {
            problems.push(format!("shard {}: {idx_name} does not match its sha256 (changed or corrupt)", s.index));
        }
        match MegatronIndex::parse(idx, &dir.join(&idx_name)) {
            Err(e) => problems.push(format!("shard {}: {e}", s.index)),
            Ok(ix) => {
                let held: u64 = ix.lengths.iter().map(|&l| l as u64).sum();
                if ix.width != width || ix.doc_idx.len() != s.documents + 1 || held != s.tokens {
                    problems.push(format!(
                        "shard {}: {idx_name} holds {} documents, {held} tokens of {} bytes; the manifest says {}, {} of {}",
                        s.index,
                        ix.doc_idx.len().saturating_sub(1),
                        ix.width.bytes(),
                        s.documents,
                        s.tokens,
                        width.bytes()
                    ));
                } else if held * width.bytes() as u64 != bin.len() as u64 {
                    problems.push(format!(
                        "shard {}: {bin_name} holds {} bytes, its index {held} tokens",
                        s.index,
                        bin.len()
                    ));
                }
            }
        }
        documents += s.documents as u64;
        tokens += s.tokens;
    }
    if (documents, tokens) != (m.totals.documents, m.totals.tokens) {
        problems.push(format!(
            "shards hold {documents} documents and {tokens} tokens, the manifest's totals {} and {}",
            m.totals.documents, m.totals.tokens
        ));
    }
    // every line (or file) of plain input that was not skipped is a document
    if m.complete && m.job.input.iter().all(|f| f.format != Format::Jsonl) {
        let want = m.job.input.iter().map(|f| f.lines).sum::<u64>().saturating_sub(m.skipped.len() as u64);
        if want != documents {
            problems.push(format!("the input had {want} documents (not skipped), the shards hold {documents}"));
        }
    }
    let listed: std::collections::HashSet<String> =
        m.shards.iter().flat_map(|s| [format!("{}.bin", s.prefix), format!("{}.idx", s.prefix)]).collect();
    for n in dir::strays(dir, &listed)? {
        problems.push(format!("{n} is not part of the output (left by an interrupted run, or added)"));
    }
    if problems.is_empty() {
        Ok(m)
    } else {
        Err(Error::Data(format!("{} failed verification:\n  {}", dir.display(), problems.join("\n  "))))
    }
}
