//! `brigade serve`: the OpenAI-compatible HTTP API (axum on tokio) in front of the engine
//! thread — startup, the routes, health and readiness, and draining; completions are handled
//! in `completions`. `/health` answers from the moment the port is bound; `/ready` and completions
//! answer 503 until the model is loaded and again while draining after SIGTERM.

use crate::app::{unix_now, App, Loaded};
use crate::chat::chat_completions;
use crate::completions::completions;
use crate::embedder::Embedder;
use crate::embeddings::embeddings;
use crate::engine::Limits;
use crate::kv::KvCache;
use crate::metrics::Metrics;
use crate::served::{Served, Source};
use crate::worker::{EngineHandle, EngineSetup};
use anyhow::{bail, Context, Result};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use brigade::layout::Layout;
use brigade::models::chat_template::ChatTemplate;
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
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
    /// How the model is split: over `layout.tp` tensor-parallel ranks (threads); serving takes
    /// no other axis.
    pub layout: Layout,
    pub max_running: usize,
    pub max_queued: usize,
    pub max_step_tokens: usize,
    pub kv_cache_mib: usize,
    pub block_size: usize,
    pub shutdown_timeout: Duration,
    /// How the products' weights are held: f32, or quantized to 8 bits at load.
    pub weights: crate::weights::WeightFormat,
}

/// Binds, loads the model, serves until SIGTERM or Ctrl-C, then drains. `on_listen` gets the
/// bound address (the benchmark and tests start the server on port 0).
pub fn run(o: ServeOptions, on_listen: impl FnOnce(std::net::SocketAddr) + Send + 'static) -> Result<()> {
    if o.max_running == 0 || o.max_step_tokens == 0 || o.block_size == 0 || o.kv_cache_mib == 0 {
        bail!("--max-running, --max-step-tokens, --block-size and --kv-cache-mib must be at least 1");
    }
    let l = o.layout;
    if (l.dp, l.pp, l.v, l.zero, l.sp) != (1, 1, 1, 0, false) {
        bail!("serving splits the model over tensor-parallel ranks only; give --tp N, not the layout '{l}'");
    }
    let Some(source) = &o.source else {
        if o.embedding_model.is_none() {
            bail!("give a model to serve: --checkpoint DIR or --model PRESET, and/or --embedding-model DIR");
        }
        let rt = runtime()?;
        return rt.block_on(serve(o, 0, on_listen));
    };
    let kv_blocks = engine_blocks(&o, source)?;
    runtime()?.block_on(serve(o, kv_blocks, on_listen))
}

/// Checks the engine's settings against the model (`--tp`, `--threads`, the cache) and
/// returns the KV blocks the cache holds.
pub(crate) fn engine_blocks(o: &ServeOptions, source: &Source) -> Result<usize> {
    let tp = o.layout.tp;
    let cfg = source.config()?;
    if tp == 0 {
        bail!("--tp must be at least 1");
    }
    // each rank is a thread: past --threads, the thread count binds as well as the heads
    let threads = o.threads;
    if let Err(m) = crate::weights::check_tp(&cfg, tp) {
        if tp > threads {
            bail!("{m}; a --tp above {threads} also needs --threads at least as large (one thread per rank; --threads is {threads})");
        }
        bail!("{m}");
    }
    if tp > threads {
        bail!("--tp {tp} needs at least as many --threads (one thread per rank), got {threads}; give --threads {tp}");
    }
    // each rank holds its key/value heads: the cache's MiB are per rank
    let width = crate::weights::kv_width(&cfg, tp);
    let block_mib = (o.block_size * cfg.n_layer * 2 * width * 4) as f64 / (1 << 20) as f64;
    let kv_blocks = KvCache::blocks_for_bytes(o.kv_cache_mib << 20, o.block_size, cfg.n_layer, width);
    if kv_blocks == 0 {
        bail!(
            "--kv-cache-mib {} holds no block of {} tokens for this model; raise it (a block needs {:.1} MiB)",
            o.kv_cache_mib,
            o.block_size,
            block_mib
        );
    }
    Ok(kv_blocks)
}

/// Loads the model and starts its engine: what handlers (or `brigade run`) use.
pub(crate) fn load(o: &ServeOptions, source: &Source, kv_blocks: usize, metrics: &Metrics) -> Result<Loaded> {
    let Served { gpt, params, tokenizer, eos } = source.load()?;
    let (context, vocab) = (gpt.cfg.block_size, gpt.cfg.vocab_size);
    let limits = Limits { max_running: o.max_running, max_step_tokens: o.max_step_tokens };
    let setup = EngineSetup {
        kv_blocks,
        block_size: o.block_size,
        limits,
        tp: o.layout.tp,
        threads: o.threads,
        weights: o.weights,
    };
    let (handle, _join) = EngineHandle::start_model(gpt, params, setup, metrics.clone());
    let chat = chat_template(tokenizer.as_ref(), &eos, source);
    Ok(Loaded {
        engine: handle,
        tokenizer,
        eos,
        chat,
        context,
        vocab,
        kv_blocks,
        block_size: o.block_size,
        max_running: o.max_running,
        grammars: std::sync::OnceLock::new(),
    })
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the HTTP runtime")
}

async fn serve(o: ServeOptions, kv_blocks: usize, on_listen: impl FnOnce(std::net::SocketAddr)) -> Result<()> {
    let addr = format!("{}:{}", o.host, o.port);
    let listener = tokio::net::TcpListener::bind(&addr).await.with_context(|| {
        format!("cannot listen on {addr}; is another server using the port? pick another with --port")
    })?;
    let local = listener.local_addr()?;
    let app = Arc::new(App {
        name: o.name.clone().or_else(|| o.source.as_ref().map(Source::default_name)).unwrap_or_default(),
        generates: o.source.is_some(),
        loaded: OnceLock::new(),
        embedder: o.embedding_model.as_ref().map(|_| OnceLock::new()),
        draining: AtomicBool::new(false),
        metrics: Metrics::new(),
        inflight: AtomicUsize::new(0),
        capacity: o.max_running + o.max_queued,
        next_id: AtomicU64::new(1),
    });
    on_listen(local);
    // load in the background: /health answers meanwhile, /ready says 503
    let loader = {
        let (app, o) = (app.clone(), o.clone());
        tokio::task::spawn_blocking(move || -> Result<()> {
            if let Some(dir) = &o.embedding_model {
                let e = Embedder::start(dir, o.threads)?;
                eprintln!("brigade serve: embedding model {} loaded", e.name);
                let _ = app.embedder.as_ref().expect("a slot for it").set(e);
            }
            let Some(source) = &o.source else { return Ok(()) };
            let loaded = load(&o, source, kv_blocks, &app.metrics)?;
            // a preset has no tokenizer by design; a checkpoint without a template is worth a line
            if let (Err(why), Source::Checkpoint(_)) = (&loaded.chat, source) {
                eprintln!("brigade serve: no chat API for this model: {why}");
            }
            let _ = app.loaded.set(loaded);
            eprintln!("brigade serve: {} loaded; ready", app.name);
            Ok(())
        })
    };
    let router = Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/programs", post(crate::programs::programs))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { "ok" }))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .fallback(unknown_route)
        .with_state(app.clone());
    let draining = Arc::new(tokio::sync::Notify::new());
    let signal = {
        let (app, draining) = (app.clone(), draining.clone());
        async move {
            wait_for_signal().await;
            app.draining.store(true, Ordering::SeqCst);
            eprintln!(
                "brigade serve: draining — no new requests; {} sequences in flight, up to {:?}",
                app.inflight.load(Ordering::SeqCst),
                o.shutdown_timeout
            );
            draining.notify_one();
            // keep accepting (answering /ready and new requests 503) until the sequences in
            // flight are done; only then does the listener close
            while app.inflight.load(Ordering::SeqCst) > 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let server = axum::serve(listener, router).with_graceful_shutdown(signal);
    let load_failed = async {
        match loader.await {
            Ok(Ok(())) => std::future::pending::<Result<()>>().await,
            Ok(Err(e)) => Err(e),
            Err(e) => Err(anyhow::anyhow!("loading the model failed: {e}")),
        }
    };
    let timeout = async {
        draining.notified().await;
        tokio::time::sleep(o.shutdown_timeout).await;
    };
    tokio::select! {
        r = server => r.context("the HTTP server failed")?,
        r = load_failed => return r,
        _ = timeout => {
            eprintln!(
                "brigade serve: --shutdown-timeout passed with {} sequences unfinished; they were cut off",
                app.inflight.load(Ordering::SeqCst)
            );
        }
    }
    if let Some(l) = app.loaded.get() {
        l.engine.stop();
    }
    eprintln!("brigade serve: stopped");
    Ok(())
}

/// The chat template of the served model's tokenizer, or why chat requests get 400.
fn chat_template(
    tokenizer: Option<&brigade::models::tokenizer::Tokenizer>,
    eos: &[u32],
    source: &Source,
) -> Result<ChatTemplate, String> {
    let Some(tok) = tokenizer else {
        return Err(format!(
            "{} has no tokenizer.json, so no chat template; send token ids to /v1/completions",
            source.default_name()
        ));
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
            Err(format!(
                "this model has no chat template: {dir}/tokenizer_config.json has no chat_template and there is no {dir}/chat_template.jinja; add one, or send the conversation as a prompt to /v1/completions"
            ))
        }
    }
}

async fn wait_for_signal() {
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("a SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// Any other route: 404 with OpenAI's error body, naming the route (and, for the chat API,
/// that brigade does not serve it yet).
async fn unknown_route(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let path = uri.path();
    let hint =
        "; it serves POST /v1/completions, POST /v1/chat/completions, POST /v1/embeddings, POST /v1/programs, GET /v1/models, /health, /ready and /metrics";
    let body = json!({"error": {
        "message": format!("no route {method} {path}{hint}"),
        "type": "invalid_request_error", "param": null, "code": "unknown_url",
    }});
    (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}

async fn ready(State(app): State<Arc<App>>) -> Response {
    let embedder_loading = app.embedder.as_ref().is_some_and(|e| e.get().is_none());
    if (app.generates && app.loaded.get().is_none()) || embedder_loading {
        (StatusCode::SERVICE_UNAVAILABLE, "loading the model").into_response()
    } else if app.draining.load(Ordering::SeqCst) {
        (StatusCode::SERVICE_UNAVAILABLE, "draining").into_response()
    } else {
        "ready".into_response()
    }
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], app.metrics.render())
        .into_response()
}

async fn models(State(app): State<Arc<App>>) -> Response {
    let mut data = Vec::new();
    if app.generates {
        let max = app.loaded.get().map(|l| l.context);
        data.push(json!({"id": app.name, "object": "model", "created": unix_now(), "owned_by": "brigade", "max_model_len": max}));
    }
    if let Some(e) = app.embedder.as_ref().and_then(|e| e.get()) {
        data.push(json!({"id": e.name, "object": "model", "created": unix_now(), "owned_by": "brigade"}));
    }
    axum::Json(json!({"object": "list", "data": data})).into_response()
}
