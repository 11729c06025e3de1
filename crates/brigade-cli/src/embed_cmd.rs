//! `brigade embed`: a corpus through a sentence-transformers model, split across workers
//! (threads here, or MPI ranks), resumable; `--verify DIR` re-checks a finished output.

use crate::shard_job::{self, BackendArg};
use anyhow::{bail, Result};
use brigade::embed::corpus::{Format, InputSpec, OnError};
use brigade::embed::job::{self, Progress, Report, Settings};
use brigade::embed::Encoder;
use clap::{Args, ValueEnum};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum FormatArg {
    /// JSONL for `*.jsonl` files, plain text (one document a line) otherwise.
    Auto,
    Text,
    Jsonl,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum OnErrorArg {
    /// Stop at the first bad line, naming its file and line.
    Fail,
    /// Leave bad lines out and list them in the manifest.
    Skip,
}

impl From<OnErrorArg> for OnError {
    fn from(a: OnErrorArg) -> OnError {
        match a {
            OnErrorArg::Fail => OnError::Fail,
            OnErrorArg::Skip => OnError::Skip,
        }
    }
}

#[derive(Args, Debug)]
pub struct EmbedArgs {
    /// sentence-transformers model folder (config.json, model.safetensors, tokenizer.json,
    /// modules.json, 1_Pooling/config.json).
    #[arg(long)]
    pub(crate) model: Option<PathBuf>,
    /// Input files, read in this order: plain text (one document a line, id = line number
    /// across the files) or JSONL.
    #[arg(long, num_args = 1..)]
    pub(crate) input: Vec<PathBuf>,
    /// Output directory: shard-NNNNN.npy / .ids per shard and manifest.json.
    #[arg(long)]
    pub(crate) output: Option<PathBuf>,
    /// Workers with the local backend (default: one per core).
    #[arg(long)]
    pub(crate) workers: Option<usize>,
    #[arg(long, value_enum, default_value = "local")]
    pub(crate) backend: BackendArg,
    /// Threads of each worker.
    #[arg(long, default_value_t = 1)]
    pub(crate) threads: usize,
    #[arg(long, value_enum, default_value = "auto")]
    pub(crate) format: FormatArg,
    /// JSONL field holding a document's id (a string or an integer).
    #[arg(long, default_value = "id")]
    pub(crate) id_field: String,
    /// JSONL field holding a document's text.
    #[arg(long, default_value = "text")]
    pub(crate) text_field: String,
    /// Documents per shard (the unit of work, of output files and of resumption).
    #[arg(long, default_value_t = 10_000)]
    pub(crate) shard_size: usize,
    /// Tokens per forward pass at most (documents are packed without padding). 2048 keeps a
    /// pass's activations in cache (measured 1–2% faster than 8192 with two workers).
    #[arg(long, default_value_t = brigade::embed::job::DEFAULT_MAX_BATCH_TOKENS)]
    pub(crate) max_batch_tokens: usize,
    /// What to do with a malformed line (invalid UTF-8, bad JSON, missing field).
    #[arg(long, value_enum, default_value = "fail")]
    pub(crate) on_error: OnErrorArg,
    /// Replace another job's output in --output (never mixed with this job's).
    #[arg(long)]
    pub(crate) overwrite: bool,
    /// Re-check a finished output directory (checksums, shapes, ids) instead of embedding.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["model", "input", "output"])]
    pub(crate) verify: Option<PathBuf>,
    /// Print the summary as one JSON object.
    #[arg(long)]
    pub(crate) json: bool,
}

impl EmbedArgs {
    pub(crate) fn spec(&self) -> InputSpec {
        InputSpec {
            files: self.input.clone(),
            format: match self.format {
                FormatArg::Auto => None,
                FormatArg::Text => Some(Format::Text),
                FormatArg::Jsonl => Some(Format::Jsonl),
            },
            id_field: Some(self.id_field.clone()),
            text_field: self.text_field.clone(),
            on_error: self.on_error.into(),
        }
    }

    pub(crate) fn settings(&self, stop: Option<Arc<AtomicBool>>) -> Settings {
        Settings {
            shard_size: self.shard_size,
            max_batch_tokens: self.max_batch_tokens,
            threads: self.threads,
            overwrite: self.overwrite,
            stop,
        }
    }
}

pub fn run(a: EmbedArgs) -> Result<()> {
    if let Some(dir) = &a.verify {
        let m = brigade::embed::output::verify(dir)?;
        outln!(
            "{}: verified {} documents in {} shards ({}×{} float32, checksums, shapes, no id missing or twice)",
            dir.display(),
            m.totals.documents,
            m.shards.len(),
            m.totals.documents,
            m.job.model.dimension
        );
        return Ok(());
    }
    let (Some(model), Some(output)) = (&a.model, &a.output) else {
        bail!("brigade embed needs --model DIR, --input FILE… and --output DIR (or --verify DIR)");
    };
    if a.input.is_empty() {
        bail!("no input files; give one or more with --input FILE…");
    }
    crate::threads::check_threads(a.threads, "--threads")?;
    if a.shard_size == 0 || a.shard_size > 10_000_000 {
        bail!("--shard-size {} is out of range: give 1 to 10000000 documents", a.shard_size);
    }
    if a.max_batch_tokens == 0 {
        bail!("--max-batch-tokens must be at least 1");
    }
    let enc = Encoder::load(model)?;
    let stop = shard_job::stop_flag()?;
    let (spec, s) = (a.spec(), a.settings(Some(stop)));
    let job = |comm: &brigade_comm::Comm, bar: &dyn Progress| job::run(comm, &spec, &enc, output, &s, bar);
    match shard_job::drive(a.backend, a.workers, a.threads, !a.json, "embed", job)? {
        Some(report) => summary(&a, output, &report),
        None => Ok(()),
    }
}

fn summary(a: &EmbedArgs, out: &Path, r: &Report) -> Result<()> {
    let t = &r.manifest.totals;
    let embedded: u64 = r.workers.iter().map(|w| w.documents).sum();
    let tokens: u64 = r.workers.iter().map(|w| w.tokens).sum();
    if a.json {
        let v = serde_json::json!({
            "output": out.display().to_string(),
            "already_complete": r.already_complete,
            "resumed_shards": r.resumed_shards,
            "shards": r.manifest.shards.len(),
            "totals": t,
            "padding_fraction": 0.0,
            "embedded_now": embedded,
            "wall_s": r.wall_s,
            "documents_per_s": embedded as f64 / r.wall_s,
            "tokens_per_s": tokens as f64 / r.wall_s,
            "workers": r.workers,
        });
        outln!("{v}");
        return Ok(());
    }
    if r.already_complete {
        outln!("{} already holds this job's complete output ({} documents); nothing to do", out.display(), t.documents);
        return Ok(());
    }
    outln!(
        "embedded {} documents into {} ({} shards, {}-dimensional {}{}, model {})",
        t.documents,
        out.display(),
        r.manifest.shards.len(),
        r.manifest.job.model.dimension,
        r.manifest.job.model.pooling,
        if r.manifest.job.model.normalize { ", normalised" } else { "" },
        r.manifest.job.model.name
    );
    if r.resumed_shards > 0 {
        outln!(
            "resumed: {} shards were finished by an earlier run and kept; {embedded} documents embedded now",
            r.resumed_shards
        );
    }
    outln!(
        "{} tokens; padding 0% (documents packed end to end, attention per document); {} truncated at {} tokens; {} empty; {} lines skipped",
        t.tokens,
        t.truncated,
        r.manifest.job.model.max_seq_length,
        t.empty,
        t.skipped
    );
    outln!(
        "{:.1} s: {:.1} documents/s, {:.0} tokens/s",
        r.wall_s,
        embedded as f64 / r.wall_s,
        tokens as f64 / r.wall_s
    );
    for w in &r.workers {
        outln!(
            "  worker {}: {} shards, {} documents in {:.1} s busy ({:.1} documents/s)",
            w.rank,
            w.shards,
            w.documents,
            w.busy_s,
            if w.busy_s > 0.0 { w.documents as f64 / w.busy_s } else { 0.0 }
        );
    }
    for s in r.manifest.skipped.iter().take(10) {
        outln!("  skipped {}:{}: {}", s.file, s.line, s.reason);
    }
    if r.manifest.skipped.len() > 10 {
        outln!("  … and {} more skipped lines (listed in manifest.json)", r.manifest.skipped.len() - 10);
    }
    Ok(())
}
