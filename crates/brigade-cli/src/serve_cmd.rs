//! `brigade serve`: the OpenAI-compatible completions server.

use anyhow::{bail, Result};
use brigade_serve::http;
use brigade_serve::model::weights::WeightFormat;
use brigade_serve::source::Source;
use brigade_serve::startup::ServeOptions;
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Checkpoint directory: brigade's or a Hugging Face GPT-2 or Llama-family folder
    /// (config.json, model.safetensors, tokenizer.json if prompts are text).
    #[arg(long, conflicts_with = "model", required_unless_present_any = ["model", "embedding_model"])]
    checkpoint: Option<PathBuf>,
    /// A preset shape with random weights instead (gpt2-small, …): prompts as token ids only.
    #[arg(long)]
    model: Option<String>,
    /// A sentence-transformers folder to serve at POST /v1/embeddings (alone, or beside the
    /// generation model).
    #[arg(long)]
    embedding_model: Option<PathBuf>,
    /// The model name clients send (default: the checkpoint directory's name, or the preset).
    #[arg(long)]
    served_model_name: Option<String>,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// 0 picks a free port (printed at start).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Sequences waiting beyond the running batch; past them requests get 503 + Retry-After.
    #[arg(long, default_value_t = 256)]
    max_queued: usize,
    #[command(flatten)]
    engine: EngineArgs,
    /// Seconds to finish in-flight requests after SIGTERM before exiting.
    #[arg(long, default_value_t = 30.0)]
    shutdown_timeout: f64,
    /// local (the --tp ranks are threads of this process) or mpi (this process is one rank of
    /// the tensor-parallel group: start --tp processes under mpirun; rank 0 serves HTTP; needs a
    /// build with --features mpi).
    #[arg(long, default_value = "local")]
    backend: String,
    /// Start this many replicas of the server (processes of this binary, each with these
    /// settings and --threads) behind a cache-aware router on --host/--port (`brigade route`).
    #[arg(long, default_value_t = 1)]
    replicas: usize,
}

/// The engine's flags, as `serve` and `run` take them.
#[derive(Args, Debug)]
pub(crate) struct EngineArgs {
    /// Threads for the model's arithmetic, split evenly over the --tp ranks (default: all
    /// cores, and at least one a rank).
    #[arg(long)]
    threads: Option<usize>,
    /// Shard the model over this many tensor-parallel ranks (threads): the same tokens as 1.
    #[arg(long, default_value_t = 1)]
    tp: usize,
    /// Cut the model's layers into this many pipeline stages (threads, or processes with
    /// --backend mpi): the same tokens as 1; a step per stage in flight.
    #[arg(long, default_value_t = 1)]
    pp: usize,
    /// Split each sequence over this many context-parallel ranks (threads, or processes with
    /// --backend mpi): its KV cache striped over their caches, a long prompt's prefill and its
    /// attention shared; greedy tokens as 1's (logits within float rounding).
    #[arg(long, default_value_t = 1)]
    cp: usize,
    /// Sequences in the running batch.
    #[arg(long, default_value_t = 64)]
    max_running: usize,
    /// Tokens in one forward pass (decodes first, then prompt chunks).
    #[arg(long, default_value_t = 512)]
    max_step_tokens: usize,
    /// Memory for the paged KV cache.
    #[arg(long, default_value_t = 2048)]
    kv_cache_mib: usize,
    /// Tokens per KV-cache block.
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// What the KV cache holds keys and values as: f32 (every bit as computed), or f16 (each
    /// rounded to the nearest half, as llama.cpp's cache holds them: twice the tokens in the
    /// same --kv-cache-mib, and half the bytes each decode step's attention reads).
    #[arg(long, value_enum, default_value_t = KvCacheDtype::F32)]
    kv_cache_dtype: KvCacheDtype,
    /// How the matrices are held: stored (as the file holds them: a GGUF's quantized matrices
    /// in their own types, floats in f32), f32 (a GGUF dequantized), or quantized at load
    /// (int8: 8 bits, a scale per output column and group of 32 inputs; int8-channel: one per
    /// output column; int4: the blocks' matrices as llama.cpp's Q4_0, 4 bits and a scale per 32
    /// inputs, the head at int8).
    #[arg(long, value_enum, default_value_t = Weights::Stored)]
    weights: Weights,
    /// Where a request's left-out sampling fields (temperature, top_p, top_k,
    /// repetition_penalty, max_tokens) come from: auto, the model's generation_config.json
    /// (vLLM's default); none, OpenAI's defaults (temperature 1, no cut, 16 tokens).
    #[arg(long, value_enum, default_value_t = GenerationDefaults::Auto)]
    generation_config: GenerationDefaults,
}

/// `--generation-config`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum GenerationDefaults {
    Auto,
    None,
}

impl ServeArgs {
    /// The processes a server of these settings runs on under mpirun (--tp · --pp · --cp), and
    /// the replicas it asks for.
    pub(crate) fn ranks(&self) -> (usize, usize) {
        (self.engine.tp * self.engine.pp * self.engine.cp, self.replicas)
    }

    /// Seconds it takes to drain after SIGTERM.
    pub(crate) fn shutdown_timeout(&self) -> f64 {
        self.shutdown_timeout
    }
}

impl EngineArgs {
    /// Checks the flags; the options with the model's source and the server's settings
    /// left at their defaults (no server: no port, no queue, no drain).
    pub(crate) fn options(&self, source: Option<Source>) -> Result<ServeOptions> {
        let threads =
            self.threads.unwrap_or_else(|| crate::threads::default_threads().max(self.tp * self.pp * self.cp));
        crate::threads::check_threads(threads, "--threads")?;
        if self.tp == 0 || self.tp > 64 {
            bail!("--tp must be from 1 to 64, got {}", self.tp);
        }
        if self.pp == 0 || self.pp > 64 {
            bail!("--pp must be from 1 to 64, got {}", self.pp);
        }
        if self.cp == 0 || self.cp > 64 {
            bail!("--cp must be from 1 to 64, got {}", self.cp);
        }
        if self.max_running == 0 || self.max_running > 4096 {
            bail!("--max-running must be from 1 to 4096, got {}", self.max_running);
        }
        if self.block_size == 0 || self.block_size > 1024 {
            bail!("--block-size must be from 1 to 1024 tokens, got {}", self.block_size);
        }
        if self.max_step_tokens == 0 || self.max_step_tokens > 1 << 16 {
            bail!("--max-step-tokens must be from 1 to 65536, got {}", self.max_step_tokens);
        }
        if self.kv_cache_mib == 0 || self.kv_cache_mib > 1 << 20 {
            bail!("--kv-cache-mib must be from 1 to 1048576, got {}", self.kv_cache_mib);
        }
        Ok(ServeOptions {
            source,
            embedding_model: None,
            name: None,
            host: String::new(),
            port: 0,
            threads,
            layout: brigade::layout::Layout { tp: self.tp, pp: self.pp, cp: self.cp, ..Default::default() },
            max_running: self.max_running,
            max_queued: 0,
            max_step_tokens: self.max_step_tokens,
            kv_cache_mib: self.kv_cache_mib,
            block_size: self.block_size,
            kv_dtype: self.kv_cache_dtype.dtype(),
            shutdown_timeout: Duration::ZERO,
            weights: self.weights.format(),
            generation_defaults: self.generation_config == GenerationDefaults::Auto,
            group: None,
        })
    }
}

/// `--weights`: the choices clap lists when the value is not one of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Weights {
    Stored,
    F32,
    Int8,
    Int8Channel,
    Int4,
}

/// `--kv-cache-dtype`: the choices clap lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum KvCacheDtype {
    F32,
    F16,
}

impl KvCacheDtype {
    pub(crate) fn dtype(self) -> brigade_serve::model::KvDtype {
        match self {
            KvCacheDtype::F32 => brigade_serve::model::KvDtype::F32,
            KvCacheDtype::F16 => brigade_serve::model::KvDtype::F16,
        }
    }
}

impl Weights {
    pub(crate) fn format(self) -> WeightFormat {
        match self {
            Weights::Stored => WeightFormat::Stored,
            Weights::F32 => WeightFormat::F32,
            Weights::Int8 => WeightFormat::Int8,
            Weights::Int8Channel => WeightFormat::Int8Channel,
            Weights::Int4 => WeightFormat::Int4,
        }
    }
}

pub fn options(a: ServeArgs) -> Result<ServeOptions> {
    if !(a.shutdown_timeout >= 0.0 && a.shutdown_timeout <= 86_400.0) {
        bail!("--shutdown-timeout must be from 0 to 86400 seconds, got {}", a.shutdown_timeout);
    }
    if a.max_queued > 1 << 20 {
        bail!("--max-queued must be at most {}, got {}", 1 << 20, a.max_queued);
    }
    let source = match (a.checkpoint, a.model) {
        (Some(dir), None) => Some(Source::Checkpoint(dir)),
        (None, Some(m)) => Some(Source::Preset(m)),
        (None, None) if a.embedding_model.is_some() => None,
        _ => bail!("give --checkpoint DIR or --model PRESET (and/or --embedding-model DIR)"),
    };
    if let Some(d) = &a.embedding_model {
        if !d.is_dir() {
            bail!("--embedding-model {} is not a folder; give a sentence-transformers model folder", d.display());
        }
    }
    Ok(ServeOptions {
        embedding_model: a.embedding_model,
        name: a.served_model_name,
        host: a.host,
        port: a.port,
        max_queued: a.max_queued,
        shutdown_timeout: Duration::from_secs_f64(a.shutdown_timeout),
        ..a.engine.options(source)?
    })
}

pub fn run(a: ServeArgs) -> Result<()> {
    if a.replicas == 0 || a.replicas > 64 {
        bail!("--replicas must be from 1 to 64, got {}", a.replicas);
    }
    if a.replicas > 1 {
        if a.backend != "local" {
            bail!("--replicas starts local replicas; give it without --backend mpi");
        }
        let (host, port, n) = (a.host.clone(), a.port, a.replicas);
        options(a)?; // every setting checked before a replica starts
        return run_replicas(n, host, port);
    }
    let backend = a.backend.clone();
    let o = options(a)?;
    match backend.as_str() {
        "local" => {}
        "mpi" => return run_mpi(o),
        other => bail!("unknown --backend '{other}'; use local or mpi"),
    }
    // a client that hangs up must not end the server: writes to its socket fail instead
    #[cfg(unix)]
    // SAFETY: sets one signal's disposition; no handler code runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    http::run(o, |addr| {
        // one line that scripts (and the tests) read for the port
        println!("brigade serve: listening on http://{addr}");
    })?;
    Ok(())
}

/// `--backend mpi`: this process is one rank of the tensor-parallel group; rank 0 serves HTTP
/// and schedules, the others follow its steps until it stops.
#[cfg(feature = "mpi")]
fn run_mpi(mut o: ServeOptions) -> Result<()> {
    if std::env::var_os("OMPI_COMM_WORLD_SIZE").is_none() && std::env::var_os("PMI_SIZE").is_none() {
        bail!(
            "--backend mpi needs to be started by mpirun or srun (e.g. mpirun -n {} brigade serve --backend mpi --tp {} …)",
            o.layout.tp * o.layout.pp * o.layout.cp,
            o.layout.tp
        );
    }
    // an idle server's followers wait for its next step as long as it has none
    let world = brigade_comm::mpi::world(Duration::from_secs(365 * 24 * 3600))?;
    let world = brigade_comm::Comm::new(Box::new(world));
    let r = serve_rank(&mut o, world);
    brigade_comm::mpi::finalize();
    r
}

#[cfg(feature = "mpi")]
fn serve_rank(o: &mut ServeOptions, world: brigade_comm::Comm) -> Result<()> {
    let (rank, ranks, tp, pp, cp) = (world.rank(), world.size(), o.layout.tp, o.layout.pp, o.layout.cp);
    // every rank checks the same things, so that all of them stop on a bad setting
    if ranks != tp * pp * cp {
        let (flag, n) = if pp > 1 {
            ("--pp", pp)
        } else if cp > 1 {
            ("--cp", cp)
        } else {
            ("--tp", tp)
        };
        bail!(
            "{flag} {n} needs {} processes but mpirun started {ranks}; start mpirun -n {} or give {flag} {ranks}",
            tp * pp * cp,
            tp * pp * cp
        );
    }
    if o.embedding_model.is_some() && ranks > 1 {
        bail!("--embedding-model is served by one process; serve it without --backend mpi");
    }
    let source = o
        .source
        .clone()
        .ok_or_else(|| anyhow::anyhow!("--backend mpi serves a generation model: give --checkpoint or --model"))?;
    o.group = Some(brigade_serve::startup::RankGroup::new(world));
    let kv_blocks = brigade_serve::startup::engine_blocks(o, &source)?;
    if rank > 0 {
        // rank 0 decides when to stop (it drains its requests first, then ends every rank's
        // loop): a follower ignores the signals mpirun passes on to every process
        #[cfg(unix)]
        // SAFETY: sets two signals' dispositions; no handler code runs.
        unsafe {
            libc::signal(libc::SIGTERM, libc::SIG_IGN);
            libc::signal(libc::SIGINT, libc::SIG_IGN);
        }
        let comm = o.group.as_ref().and_then(|g| g.take()).expect("set above");
        brigade_serve::startup::follow(o, &source, kv_blocks, comm)?;
        return Ok(());
    }
    #[cfg(unix)]
    // SAFETY: sets one signal's disposition; no handler code runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    http::run(o.clone(), move |addr| {
        println!("brigade serve: listening on http://{addr} (rank 0 of {} processes)", tp * pp * cp);
        // under `brigade launch`: the server is up (a rank lost from now on is a death to
        // restart after, not a setting to report)
        if let Some(p) = std::env::var_os(crate::train_cmd::PROGRESS_ENV) {
            let _ = std::fs::write(p, "listening\n");
        }
    })?;
    Ok(())
}

#[cfg(not(feature = "mpi"))]
fn run_mpi(_: ServeOptions) -> Result<()> {
    bail!("this brigade was built without MPI; rebuild with `cargo build --release --features mpi` (needs libopenmpi-dev) and start it under mpirun")
}

/// `--replicas N`: N servers of this binary with this command line's settings (on free ports of
/// the loopback), and a cache-aware router over them on `host:port` in this process; the
/// replicas are stopped (SIGTERM: they drain) when the router stops.
fn run_replicas(n: usize, host: String, port: u16) -> Result<()> {
    use std::io::BufRead;
    // this command line without --replicas, --host and --port (each replica picks a free port)
    let mut args: Vec<String> = Vec::new();
    let mut it = std::env::args().skip(1);
    while let Some(x) = it.next() {
        match x.as_str() {
            "--replicas" | "--host" | "--port" => {
                it.next();
            }
            _ if ["--replicas=", "--host=", "--port="].iter().any(|p| x.starts_with(p)) => {}
            _ => args.push(x),
        }
    }
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    let mut urls = Vec::new();
    let stop = |children: &mut Vec<std::process::Child>| {
        for c in children.iter() {
            // SAFETY: sends a signal to a child process this process started
            unsafe {
                libc::kill(c.id() as i32, libc::SIGTERM);
            }
        }
        for c in children.iter_mut() {
            let _ = c.wait();
        }
    };
    for i in 0..n {
        let mut c = std::process::Command::new(&exe)
            .args(&args)
            .args(["--host", "127.0.0.1", "--port", "0"])
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        let mut line = String::new();
        let out = c.stdout.take().expect("piped");
        std::io::BufReader::new(out).read_line(&mut line)?;
        children.push(c);
        let Some(url) = line.trim().rsplit(' ').next().filter(|u| u.starts_with("http://")) else {
            stop(&mut children);
            bail!("replica {i} did not start (its error is above)");
        };
        urls.push(url.to_string());
    }
    // the router waits for nobody: replicas still loading join once they answer /ready
    let o = brigade_serve::route::RouteOptions {
        replicas: urls,
        policy: brigade_serve::route::policy::Policy::CacheAware,
        host,
        port,
        wait_for_models: true,
    };
    let r = brigade_serve::route::run(o, move |addr| {
        println!("brigade serve: {n} replicas behind a router, listening on http://{addr}")
    });
    stop(&mut children);
    r?;
    Ok(())
}
