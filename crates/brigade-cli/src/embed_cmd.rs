//! `brigade embed`: a corpus through a sentence-transformers model, split across workers
//! (threads here, or MPI ranks), resumable; `--verify DIR` re-checks a finished output.

use anyhow::{bail, Result};
use brigade::embed::corpus::{Format, InputSpec, OnError};
use brigade::embed::job::{self, Progress, Report, Settings};
use brigade::embed::Encoder;
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
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

#[derive(Clone, Copy, Debug, PartialEq, ValueEnum)]
pub enum BackendArg {
    /// Workers are threads of this process.
    Local,
    /// Every rank started by mpirun is one worker (build with --features mpi).
    Mpi,
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
            on_error: match self.on_error {
                OnErrorArg::Fail => OnError::Fail,
                OnErrorArg::Skip => OnError::Skip,
            },
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

/// How long a rank waits for its peers: rank 0's scan of the corpus, or the last shard of a
/// slower rank, can take minutes; a rank that dies fails its peers at once all the same.
const PEER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(6 * 3600);

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
    let stop = crate::interrupt::flag(
        "\nbrigade: interrupted — finishing the shards in progress, then stopping (finished shards are kept: run the same command again to resume); interrupt again to quit at once\n",
        "\nbrigade: interrupted again: quit at once; the finished shards are kept, and the ones in progress are redone when the same command runs again\n",
    )?;
    let bar = Bar::new(!a.json);
    let report = match a.backend {
        BackendArg::Local => {
            let workers = a.workers.unwrap_or_else(crate::threads::default_threads);
            crate::threads::check_threads(workers, "--workers")?;
            crate::threads::check_threads(workers * a.threads, "--workers × --threads")?;
            run_local(&a, &enc, output, workers, &bar, stop)?
        }
        BackendArg::Mpi => {
            if a.workers.is_some() {
                bail!("--workers is for the local backend; under mpirun every rank is one worker (mpirun -n N)");
            }
            match run_mpi(&a, &enc, output, &bar, stop)? {
                Some(r) => r,
                None => return Ok(()),
            }
        }
    };
    bar.0.finish_and_clear();
    summary(&a, output, &report)
}

fn run_local(
    a: &EmbedArgs,
    enc: &Encoder,
    out: &Path,
    workers: usize,
    bar: &Bar,
    stop: Arc<AtomicBool>,
) -> Result<Report> {
    let (spec, s) = (a.spec(), a.settings(Some(stop)));
    let cfg = brigade_comm::local::LocalConfig { timeout: PEER_TIMEOUT, ..Default::default() };
    let mut res = brigade_comm::local::run_with(cfg, workers, |comm| job::run(&comm, &spec, enc, out, &s, bar))
        .map_err(|e| {
            let first = e.failures[0].1.clone();
            if first.starts_with("interrupted") {
                bar.0.abandon();
                crate::interrupt::Interrupted(first).into()
            } else if e.failures.iter().all(|(_, m)| *m == first) {
                anyhow::anyhow!("{first}")
            } else {
                anyhow::anyhow!("{e}")
            }
        })?;
    Ok(res.swap_remove(0).expect("rank 0 reports"))
}

#[cfg(feature = "mpi")]
fn run_mpi(a: &EmbedArgs, enc: &Encoder, out: &Path, bar: &Bar, stop: Arc<AtomicBool>) -> Result<Option<Report>> {
    if std::env::var_os("OMPI_COMM_WORLD_SIZE").is_none() && std::env::var_os("PMI_SIZE").is_none() {
        bail!("--backend mpi needs to be started by mpirun or srun (e.g. mpirun -n 4 brigade embed --backend mpi …)");
    }
    let world = brigade_comm::Comm::new(Box::new(brigade_comm::mpi::world(PEER_TIMEOUT)?));
    let quiet = Bar(ProgressBar::hidden());
    let res =
        job::run(&world, &a.spec(), enc, out, &a.settings(Some(stop)), if world.rank() == 0 { bar } else { &quiet });
    let rank = world.rank();
    drop(world);
    brigade_comm::mpi::finalize();
    match res {
        // rank 0 says what went wrong; the others' copy of its message would only repeat it
        Err(brigade::Error::Relayed(_)) if rank != 0 => std::process::exit(1),
        Err(brigade::Error::Interrupted(_)) if rank != 0 => std::process::exit(130),
        Err(brigade::Error::Interrupted(m)) => {
            bar.0.abandon();
            Err(crate::interrupt::Interrupted(m).into())
        }
        r => Ok(r?),
    }
}

#[cfg(not(feature = "mpi"))]
fn run_mpi(_: &EmbedArgs, _: &Encoder, _: &Path, _: &Bar, _: Arc<AtomicBool>) -> Result<Option<Report>> {
    bail!("this brigade was built without MPI; rebuild with `cargo build --release --features mpi` (needs libopenmpi-dev) and start it under mpirun")
}

/// The progress bar: documents, documents/s and ETA (on a terminal only).
struct Bar(ProgressBar);

impl Bar {
    fn new(show: bool) -> Bar {
        let b = if show { ProgressBar::new(0) } else { ProgressBar::hidden() };
        b.set_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} documents  {per_sec}  [{elapsed_precise} eta {eta}]")
                .expect("valid template"),
        );
        Bar(b)
    }
}

impl Progress for Bar {
    fn start(&self, total: u64, done: u64) {
        self.0.set_length(total);
        self.0.set_position(done);
        self.0.reset_eta();
    }
    fn documents(&self, n: u64) {
        self.0.inc(n);
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
