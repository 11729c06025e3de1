//! Starting to serve, as `brigade serve` and `brigade run` share it: the options, the
//! engine's sizing checked against the model (`engine_blocks`: `--tp`, `--threads`, the KV
//! cache), and `load` — the model read, its engine started, its tokenizer, end tokens and
//! chat template at hand ([`Loaded`]). No transport here: the HTTP server and the program
//! runner both start from it.

use crate::constraint::{ConstraintError, Grammars, Spec};
use crate::engine::{Constrain, EngineHandle, EngineSetup, Limits};
use crate::error::ServeError;
use crate::metrics::Metrics;
use crate::model::KvStore;
use crate::request::completion::Defaults;
use crate::source::{Served, Source};
use brigade::layout::Layout;
use brigade::models::chat_template::{ChatTemplate, ChatTemplateError};
use std::sync::OnceLock;
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The generation model (none: embeddings only).
    pub source: Option<Source>,
    /// A sentence-transformers folder served at `/v1/embeddings`.
    pub embedding_model: Option<std::path::PathBuf>,
    pub name: Option<String>,
    pub host: String,
    /// 0: any free port (the one chosen is printed).
    pub port: u16,
    pub threads: usize,
    /// How the model is split: over `layout.tp` tensor-parallel ranks, `layout.pp` pipeline
    /// stages or `layout.cp` context-parallel ranks (one of them); serving takes no other axis.
    pub layout: Layout,
    pub max_running: usize,
    pub max_queued: usize,
    pub max_step_tokens: usize,
    pub kv_cache_mib: usize,
    pub block_size: usize,
    /// What the KV cache holds keys and values as (`--kv-cache-dtype`: f32, or f16).
    pub kv_dtype: crate::model::KvDtype,
    pub shutdown_timeout: Duration,
    /// How the products' weights are held: f32, or quantized to 8 bits at load.
    pub weights: crate::model::weights::WeightFormat,
    /// Whether a request's left-out sampling fields take the model's `generation_config.json`
    /// values (`--generation-config auto`, vLLM's default) or OpenAI's (`none`).
    pub generation_defaults: bool,
    /// The tensor-parallel group when its ranks are processes (`--backend mpi`): this process is
    /// its rank 0 and `layout.tp` its size; none, the ranks are threads of this process.
    pub group: Option<RankGroup>,
}

/// A communicator over processes handed to the engine (taken once, when it starts).
#[derive(Clone)]
pub struct RankGroup(std::sync::Arc<std::sync::Mutex<Option<brigade_comm::Comm>>>);

impl RankGroup {
    pub fn new(comm: brigade_comm::Comm) -> RankGroup {
        RankGroup(std::sync::Arc::new(std::sync::Mutex::new(Some(comm))))
    }

    /// The communicator, the first time only.
    pub fn take(&self) -> Option<brigade_comm::Comm> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

impl std::fmt::Debug for RankGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("RankGroup(processes)")
    }
}

/// Checks the engine's settings against the model (`--tp`, `--threads`, the cache) and
/// returns the KV blocks the cache holds.
pub fn engine_blocks(o: &ServeOptions, source: &Source) -> Result<usize, ServeError> {
    let (tp, pp, cp) = (o.layout.tp, o.layout.pp, o.layout.cp);
    let cfg = source.config()?;
    if tp == 0 || pp == 0 || cp == 0 {
        return Err(ServeError::Setting("--tp, --pp and --cp must be at least 1".into()));
    }
    if cp > 1 {
        if tp > 1 || pp > 1 {
            return Err(ServeError::Setting(format!(
                "--cp {cp} with --tp {tp} --pp {pp}: serving splits a model one way at a time yet; give one of --tp, --pp, --cp"
            )));
        }
        if cp > o.threads && o.group.is_none() {
            return Err(ServeError::Setting(format!(
                "--cp {cp} needs at least as many --threads (one thread per rank), got {}; give --threads {cp}",
                o.threads
            )));
        }
    }
    if pp > 1 {
        if tp > 1 {
            return Err(ServeError::Setting(format!(
                "--tp {tp} with --pp {pp}: serving splits a model one way at a time yet; give --tp or --pp"
            )));
        }
        if pp > cfg.n_layer {
            return Err(ServeError::Setting(format!(
                "--pp {pp} splits the model's {} layers into more stages than there are layers; use --pp at most {}",
                cfg.n_layer, cfg.n_layer
            )));
        }
        if pp > o.threads && o.group.is_none() {
            return Err(ServeError::Setting(format!(
                "--pp {pp} needs at least as many --threads (one thread per stage), got {}; give --threads {pp}",
                o.threads
            )));
        }
        // each stage holds its layers' keys and values: the cache's MiB are per stage, sized
        // by the stage with the most layers (every stage keeps the same blocks)
        let layers = (0..pp).map(|s| crate::model::forward::stage_layers(&cfg, pp, s).len()).max().unwrap_or(1);
        let width = crate::model::weights::kv_width(&cfg, 1);
        let kv_blocks = KvStore::blocks_for_bytes(o.kv_cache_mib << 20, o.block_size, layers, width, o.kv_dtype);
        if kv_blocks == 0 {
            return Err(ServeError::Setting(format!(
                "--kv-cache-mib {} holds no block of {} tokens for this model's stage; raise it",
                o.kv_cache_mib, o.block_size
            )));
        }
        return Ok(kv_blocks);
    }
    // each rank is a thread: past --threads, the thread count binds as well as the heads
    let threads = o.threads;
    if let Err(m) = crate::model::weights::check_tp(&cfg, tp) {
        if tp > threads {
            return Err(ServeError::Setting(format!("{m}; a --tp above {threads} also needs --threads at least as large (one thread per rank; --threads is {threads})")));
        }
        return Err(ServeError::Setting(m.to_string()));
    }
    // (ranks that are processes bring their own threads)
    if tp > threads && o.group.is_none() {
        return Err(ServeError::Setting(format!(
            "--tp {tp} needs at least as many --threads (one thread per rank), got {threads}; give --threads {tp}"
        )));
    }
    // each rank holds its key/value heads: the cache's MiB are per rank
    let width = crate::model::weights::kv_width(&cfg, tp);
    let block_mib = (o.block_size * cfg.n_layer * 2 * width * o.kv_dtype.bytes()) as f64 / (1 << 20) as f64;
    let kv_blocks = KvStore::blocks_for_bytes(o.kv_cache_mib << 20, o.block_size, cfg.n_layer, width, o.kv_dtype);
    if kv_blocks == 0 {
        return Err(ServeError::Setting(format!(
            "--kv-cache-mib {} holds no block of {} tokens for this model; raise it (a block needs {:.1} MiB)",
            o.kv_cache_mib, o.block_size, block_mib
        )));
    }
    Ok(kv_blocks)
}

/// On a rank other than 0 of a tensor-parallel group of processes: loads the model, builds
/// this rank's share and KV cache, and runs the steps rank 0 sends until it stops.
pub fn follow(o: &ServeOptions, source: &Source, kv_blocks: usize, comm: brigade_comm::Comm) -> Result<(), ServeError> {
    let Served { gpt, params, .. } = source.load()?;
    let split = (o.layout.pp, o.layout.cp);
    let weights = source.held(&o.weights, &gpt)?;
    crate::engine::follow_group(gpt, params, comm, ((kv_blocks, o.block_size, o.kv_dtype), o.threads, weights), split)
}

/// Loads the model and starts its engine: what handlers (or `brigade run`) use.
pub fn load(o: &ServeOptions, source: &Source, kv_blocks: usize, metrics: &Metrics) -> Result<Loaded, ServeError> {
    let Served { gpt, params, tokenizer, eos, generation } = source.load()?;
    let (context, vocab) = (gpt.cfg.block_size, gpt.cfg.vocab_size);
    let limits = Limits { max_running: o.max_running, max_step_tokens: o.max_step_tokens };
    let setup = EngineSetup {
        kv_blocks,
        block_size: o.block_size,
        kv_dtype: o.kv_dtype,
        limits,
        tp: o.layout.tp,
        pp: o.layout.pp,
        cp: o.layout.cp,
        threads: o.threads,
        weights: source.held(&o.weights, &gpt)?,
    };
    let group = o.group.as_ref().and_then(RankGroup::take);
    let (handle, join) = match group {
        Some(comm) => EngineHandle::start_on_group(gpt, params, comm, setup, metrics.clone())
            .map_err(|e| ServeError::Setting(e.to_string()))?,
        None => EngineHandle::start_model(gpt, params, setup, metrics.clone()),
    };
    let chat = chat_template(tokenizer.as_ref(), &eos, source);
    let defaults = match o.generation_defaults {
        true => Defaults::from_generation(&generation),
        false => Defaults::default(),
    };
    if o.generation_defaults && !generation.defaults_text().is_empty() {
        eprintln!(
            "brigade serve: generation_config.json sets the defaults of requests that leave them out: {} (--generation-config none for OpenAI's)",
            generation.defaults_text()
        );
    }
    if !generation.not_applied.is_empty() {
        eprintln!(
            "brigade serve: generation_config.json sets what this server does not apply: {}",
            generation.not_applied.join(", ")
        );
    }
    Ok(Loaded {
        defaults,
        engine: handle,
        engine_thread: std::sync::Mutex::new(Some(join)),
        tokenizer,
        eos,
        chat,
        context,
        vocab,
        // what one sequence may hold: under --cp, every rank's blocks (striped over them)
        kv_blocks: kv_blocks * o.layout.cp,
        block_size: o.block_size,
        max_running: o.max_running,
        grammars: std::sync::OnceLock::new(),
        grammar_counters: metrics.grammars.clone(),
    })
}

/// The loaded model, as handlers see it.
pub struct Loaded {
    pub(crate) engine: EngineHandle,
    /// The engine's thread, joined when the server stops (a tensor-parallel group's rank 0
    /// ends its followers' loops there, after its last step).
    engine_thread: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
    pub(crate) tokenizer: Option<brigade::models::tokenizer::Tokenizer>,
    pub(crate) eos: Vec<u32>,
    /// What a request that leaves a sampling field out gets.
    pub(crate) defaults: Defaults,
    /// The model's chat template, or why there is none (the 400 a chat request gets).
    pub(crate) chat: Result<ChatTemplate, NoChat>,
    pub(crate) context: usize,
    pub(crate) vocab: usize,
    pub(crate) kv_blocks: usize,
    pub(crate) block_size: usize,
    /// Sequences in the engine's running batch.
    pub(crate) max_running: usize,
    /// The structured-output engine over the tokenizer, built at the first constrained request.
    pub(crate) grammars: OnceLock<Result<Grammars, ConstraintError>>,
    /// Where the grammars count their compiles and cache hits (the server's metrics).
    grammar_counters: crate::metrics::GrammarCounters,
}

impl Loaded {
    /// Stops the engine after the commands sent before, and waits for its thread (at most
    /// `limit`): its last step done, its followers (other ranks) told to stop.
    pub fn stop_engine(&self, limit: Duration) {
        self.engine.stop();
        let join = self.engine_thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(j) = join {
            let t0 = std::time::Instant::now();
            while !j.is_finished() && t0.elapsed() < limit {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }

    /// The structured-output engine, or why this model has none.
    pub(crate) fn grammars(&self) -> Result<&Grammars, ConstraintError> {
        self.grammars
            .get_or_init(|| match &self.tokenizer {
                Some(brigade::models::tokenizer::Tokenizer::Hf(_, path, ..)) => {
                    Grammars::load(path, self.vocab, &self.eos).map(|g| g.counted(self.grammar_counters.clone()))
                }
                _ => Err(ConstraintError::Unavailable(
                    "structured outputs need the model's tokenizer.json; this model has none".into(),
                )),
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// A fresh constraint for one sequence of a request whose constraint is `spec`, if any.
    pub(crate) fn constraint(&self, spec: Option<&Spec>) -> Result<Option<Box<dyn Constrain>>, ConstraintError> {
        match spec {
            None => Ok(None),
            Some(spec) => self.grammars()?.constraint(spec).map(Some),
        }
    }
}

/// Why the served model takes no chat requests (the message of the 400 they get).
#[derive(Debug, thiserror::Error)]
pub enum NoChat {
    #[error("{model} has no tokenizer.json, so no chat template; send token ids to /v1/completions")]
    NoTokenizer { model: String },
    #[error(
        "this model has no chat template: {dir}/tokenizer_config.json has no chat_template and there is no {dir}/chat_template.jinja; add one, or send the conversation as a prompt to /v1/completions"
    )]
    NoTemplate { dir: String },
    /// A template that is there but cannot be read or compiled.
    #[error(transparent)]
    Template(#[from] ChatTemplateError),
}

/// The chat template of the served model's tokenizer, or why chat requests get 400.
fn chat_template(
    tokenizer: Option<&brigade::models::tokenizer::Tokenizer>,
    eos: &[u32],
    source: &Source,
) -> Result<ChatTemplate, NoChat> {
    let Some(tok) = tokenizer else {
        return Err(NoChat::NoTokenizer { model: source.default_name() });
    };
    match ChatTemplate::load(tok, eos)? {
        Some(t) => Ok(t),
        None => {
            let dir = match tok {
                brigade::models::tokenizer::Tokenizer::Hf(_, path, ..) => {
                    path.parent().map_or_else(|| ".".into(), |d| d.display().to_string())
                }
                _ => ".".into(),
            };
            Err(NoChat::NoTemplate { dir })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::KvDtype;

    fn options(kv_cache_mib: usize, kv_dtype: KvDtype, tp: usize) -> ServeOptions {
        ServeOptions {
            source: None,
            embedding_model: None,
            name: None,
            host: String::new(),
            port: 0,
            threads: 2,
            layout: Layout { tp, ..Default::default() },
            max_running: 8,
            max_queued: 0,
            max_step_tokens: 64,
            kv_cache_mib,
            block_size: 16,
            kv_dtype,
            shutdown_timeout: Duration::ZERO,
            weights: crate::model::weights::WeightFormat::F32,
            generation_defaults: false,
            group: None,
        }
    }

    /// The cache's MiB hold blocks of 16 tokens × 12 layers × keys and values × 768 numbers
    /// (gpt2-small): 1.125 MiB of f32 a block, 0.5625 MiB of f16 — twice the tokens in f16; a
    /// cache too small for one block is refused with the block's size.
    #[test]
    fn an_f16_cache_holds_twice_the_blocks_in_the_same_memory() {
        let src = Source::Preset("gpt2-small".into());
        let blocks = |mib, dtype, tp| engine_blocks(&options(mib, dtype, tp), &src);
        assert_eq!(blocks(90, KvDtype::F32, 1).unwrap(), 80);
        assert_eq!(blocks(90, KvDtype::F16, 1).unwrap(), 160);
        // each of 2 ranks holds half the heads: the MiB are a rank's
        assert_eq!(blocks(90, KvDtype::F16, 2).unwrap(), 320);
        let e = blocks(1, KvDtype::F32, 1).unwrap_err().to_string();
        assert!(e.contains("--kv-cache-mib 1 holds no block of 16 tokens") && e.contains("1.1 MiB"), "{e}");
        assert_eq!(blocks(1, KvDtype::F16, 1).unwrap(), 1, "0.5625 MiB fits in 1");
    }
}
