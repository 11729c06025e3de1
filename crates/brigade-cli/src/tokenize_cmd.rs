//! `brigade tokenize`: a corpus turned into token shards once (Megatron indexed datasets and a
//! manifest) for `brigade train --data DIR`, split across workers (threads here, or MPI ranks),
//! resumable; `--verify DIR` re-checks a finished output.

use crate::embed_cmd::OnErrorArg;
use crate::shard_job::{self, BackendArg};
use anyhow::{bail, Result};
use brigade::models::tokenizer::Tokenizer;
use brigade::shards::input::{Format, InputSpec};
use brigade::shards::tokens::{self, Manifest};
use brigade::shards::work::{Progress, Report, Settings};
use clap::{Args, ValueEnum};
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DocFormatArg {
    /// JSONL for `*.jsonl` files, Parquet for `*.parquet`, otherwise a whole file is one document.
    Auto,
    /// A whole file is one document.
    Document,
    /// One document a line.
    Lines,
    /// One JSON object a line, its text in --text-field.
    Jsonl,
    /// Apache Parquet: a row a document, its text in the string column --text-field.
    Parquet,
}

#[derive(Args, Debug)]
pub struct TokenizeArgs {
    /// Hugging Face tokenizer: a folder (tokenizer.json and tokenizer_config.json, e.g. a
    /// model's) or a tokenizer.json. Documents get its BOS first where it adds one, its EOS last.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Input files, read in this order (a folder: its files in name order).
    #[arg(long, num_args = 1..)]
    input: Vec<PathBuf>,
    /// Output directory: shard-NNNNN.bin / .idx (Megatron indexed datasets) and manifest.json.
    #[arg(long)]
    output: Option<PathBuf>,
    /// Workers with the local backend (default: one per core).
    #[arg(long)]
    workers: Option<usize>,
    #[arg(long, value_enum, default_value = "local")]
    backend: BackendArg,
    /// Threads of each worker.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    #[arg(long, value_enum, default_value = "auto")]
    format: DocFormatArg,
    /// JSONL field (or Parquet column) holding a document's text.
    #[arg(long, default_value = "text")]
    text_field: String,
    /// Documents per shard (the unit of work, of output files and of resumption).
    #[arg(long, default_value_t = 1000)]
    shard_size: usize,
    /// What to do with a malformed document (invalid UTF-8, bad JSON, missing field).
    #[arg(long, value_enum, default_value = "fail")]
    on_error: OnErrorArg,
    /// Replace another job's output in --output (never mixed with this job's).
    #[arg(long)]
    overwrite: bool,
    /// Re-check a finished output directory (checksums, indexes, counts) instead of tokenizing.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["tokenizer", "input", "output"])]
    verify: Option<PathBuf>,
    /// Print the summary as one JSON object.
    #[arg(long)]
    json: bool,
}

impl TokenizeArgs {
    /// The input files: each file given, and each folder's files in name order.
    fn files(&self) -> Result<Vec<PathBuf>> {
        let mut files = Vec::new();
        for p in &self.input {
            if p.is_dir() {
                let inside = brigade::shards::input::folder_files(p)?;
                if inside.is_empty() {
                    bail!("input folder {} holds no files", p.display());
                }
                files.extend(inside);
            } else {
                files.push(p.clone());
            }
        }
        Ok(files)
    }

    fn spec(&self) -> Result<InputSpec> {
        let files = self.files()?;
        let format = match self.format {
            DocFormatArg::Auto => None,
            DocFormatArg::Document => Some(Format::Document),
            DocFormatArg::Lines => Some(Format::Text),
            DocFormatArg::Jsonl => Some(Format::Jsonl),
            DocFormatArg::Parquet => Some(Format::Parquet),
        };
        // auto: JSON Lines and Parquet by their extensions, any other file a whole document
        let structured = |f: &PathBuf| matches!(Format::of(f), Format::Jsonl | Format::Parquet);
        let format = match format {
            Some(f) => Some(f),
            None if files.iter().all(structured) => None,
            None if !files.iter().any(structured) => Some(Format::Document),
            None => bail!(
                "the input mixes JSON Lines or Parquet files with other files; give --format jsonl, parquet, document or lines, or tokenize them in separate jobs"
            ),
        };
        Ok(InputSpec {
            files,
            format,
            id_field: None,
            text_field: self.text_field.clone(),
            on_error: self.on_error.into(),
        })
    }
}

pub fn run(a: TokenizeArgs) -> Result<()> {
    if let Some(dir) = &a.verify {
        let m = tokens::verify(dir)?;
        outln!(
            "{}: verified {} documents, {} tokens in {} shards ({} tokens, checksums, indexes, counts)",
            dir.display(),
            m.totals.documents,
            m.totals.tokens,
            m.shards.len(),
            m.job.dtype
        );
        return Ok(());
    }
    let (Some(tok_path), Some(output)) = (&a.tokenizer, &a.output) else {
        bail!("brigade tokenize needs --tokenizer DIR, --input FILE… and --output DIR (or --verify DIR)");
    };
    if a.input.is_empty() {
        bail!("no input files; give one or more with --input FILE…");
    }
    crate::threads::check_threads(a.threads, "--threads")?;
    if a.shard_size == 0 || a.shard_size > 10_000_000 {
        bail!("--shard-size {} is out of range: give 1 to 10000000 documents", a.shard_size);
    }
    let tok = Tokenizer::from_file(tok_path)?;
    let spec = a.spec()?;
    let stop = shard_job::stop_flag()?;
    let s = Settings { shard_size: a.shard_size, threads: a.threads, stop: Some(stop) };
    let job = |comm: &brigade_comm::Comm, bar: &dyn Progress| {
        brigade::tokenize::run(comm, &spec, &tok, output, &s, a.overwrite, bar)
    };
    match shard_job::drive(a.backend, a.workers, a.threads, !a.json, "tokenize", job)? {
        Some(report) => summary(&a, output, &report),
        None => Ok(()),
    }
}

fn summary(a: &TokenizeArgs, out: &Path, r: &Report<Manifest>) -> Result<()> {
    let t = &r.manifest.totals;
    let done: u64 = r.workers.iter().map(|w| w.documents).sum();
    let tokens: u64 = r.workers.iter().map(|w| w.tokens).sum();
    if a.json {
        let v = serde_json::json!({
            "output": out.display().to_string(),
            "already_complete": r.already_complete,
            "resumed_shards": r.resumed_shards,
            "shards": r.manifest.shards.len(),
            "totals": t,
            "dtype": r.manifest.job.dtype,
            "tokenized_now": done,
            "wall_s": r.wall_s,
            "documents_per_s": done as f64 / r.wall_s,
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
        "tokenized {} documents into {} ({} shards, {} tokens as {}; train on them with --data {})",
        t.documents,
        out.display(),
        r.manifest.shards.len(),
        t.tokens,
        r.manifest.job.dtype,
        out.display()
    );
    if r.resumed_shards > 0 {
        outln!(
            "resumed: {} shards were finished by an earlier run and kept; {done} documents tokenized now",
            r.resumed_shards
        );
    }
    outln!("{:.2} s: {:.0} tokens/s, {} documents skipped", r.wall_s, tokens as f64 / r.wall_s, t.skipped);
    for w in &r.workers {
        outln!(
            "  worker {}: {} shards, {} documents, {} tokens in {:.2} s busy",
            w.rank,
            w.shards,
            w.documents,
            w.tokens,
            w.busy_s
        );
    }
    for s in r.manifest.skipped.iter().take(10) {
        outln!("  skipped {}:{}: {}", s.file, s.line, s.reason);
    }
    Ok(())
}
