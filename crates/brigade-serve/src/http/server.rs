//! `brigade serve`: the OpenAI-compatible HTTP API (axum on tokio) in front of the engine
//! thread — binding, loading in the background (`startup`), the routes, health and readiness,
//! and draining; completions are handled in `completions`. `/health` answers from the moment the port is bound; `/ready` and completions
//! answer 503 until the model is loaded and again while draining after SIGTERM.

use super::app::{unix_now, App};
use super::chat::chat_completions;
use super::completions::completions;
use super::embeddings::embeddings;
use super::programs::programs;
use crate::engine::embedder::Embedder;
use crate::error::{Result, ServeError};
use crate::metrics::Metrics;
use crate::source::Source;
use crate::startup::{engine_blocks, load, ServeOptions};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Binds, loads the model, serves until SIGTERM or Ctrl-C, then drains. `on_listen` gets the
/// bound address (the benchmark and tests start the server on port 0).
pub fn run(o: ServeOptions, on_listen: impl FnOnce(std::net::SocketAddr) + Send + 'static) -> Result<()> {
    if o.max_running == 0 || o.max_step_tokens == 0 || o.block_size == 0 || o.kv_cache_mib == 0 {
        return Err(ServeError::Setting(
            "--max-running, --max-step-tokens, --block-size and --kv-cache-mib must be at least 1".into(),
        ));
    }
    let l = o.layout;
    if (l.dp, l.v, l.zero, l.sp) != (1, 1, 0, false) {
        return Err(ServeError::Setting(format!(
            "serving splits the model over tensor-parallel ranks, pipeline stages or context-parallel ranks only; give --tp N, --pp N or --cp N, not the layout '{l}'"
        )));
    }
    let Some(source) = &o.source else {
        if o.embedding_model.is_none() {
            return Err(ServeError::Setting(
                "give a model to serve: --checkpoint DIR or --model PRESET, and/or --embedding-model DIR".into(),
            ));
        }
        let rt = runtime()?;
        return rt.block_on(serve(o, 0, on_listen));
    };
    let kv_blocks = engine_blocks(&o, source)?;
    runtime()?.block_on(serve(o, kv_blocks, on_listen))
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| ServeError::io("starting the HTTP runtime", e))
}

async fn serve(o: ServeOptions, kv_blocks: usize, on_listen: impl FnOnce(std::net::SocketAddr)) -> Result<()> {
    let addr = format!("{}:{}", o.host, o.port);
    let listener = tokio::net::TcpListener::bind(&addr).await.map_err(|e| {
        ServeError::io(
            format!("cannot listen on {addr}; is another server using the port? pick another with --port"),
            e,
        )
    })?;
    let local = listener.local_addr().map_err(|e| ServeError::io(format!("the address bound for {addr}"), e))?;
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
        .route("/v1/programs", post(programs))
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
            Err(e) => Err(ServeError::Load(e.to_string())),
        }
    };
    let timeout = async {
        draining.notified().await;
        tokio::time::sleep(o.shutdown_timeout).await;
    };
    tokio::select! {
        r = server => r.map_err(|e| ServeError::io("the HTTP server failed", e))?,
        r = load_failed => return r,
        _ = timeout => {
            eprintln!(
                "brigade serve: --shutdown-timeout passed with {} sequences unfinished; they were cut off",
                app.inflight.load(Ordering::SeqCst)
            );
        }
    }
    if let Some(l) = app.loaded.get() {
        // (its thread ends the other ranks' loops, if the model is split over processes)
        l.stop_engine(Duration::from_secs(10));
    }
    eprintln!("brigade serve: stopped");
    Ok(())
}

/// Until SIGTERM or Ctrl-C (the server's, and the router's, signal to stop).
pub(crate) async fn wait_for_signal() {
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
