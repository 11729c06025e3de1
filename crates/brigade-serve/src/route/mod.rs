//! `brigade route`: one OpenAI-compatible front door over several `brigade serve` replicas
//! (or any OpenAI-compatible servers of one model). Each request goes to a replica chosen by the
//! policy (`policy.rs`) among those that answer; the replica's answer — streamed or whole — is
//! passed back as it is.
//!
//! Health: every replica's `/ready` is asked every [`HEALTH_EVERY`] (answering within
//! [`HEALTH_TIMEOUT`]); one that does not is taken out until it answers again, and one that
//! refuses a connection is taken out at once. A request that has sent nothing to its client yet
//! — every non-streamed one, and a stream whose replica failed before its first byte — is retried
//! on another replica (also when a replica answers 503: draining or full); a stream already
//! started whose replica dies ends with an error event. Because brigade's engine is batch
//! invariant, a request's tokens do not depend on which replica serves it.

pub mod policy;

use crate::error::ServeError;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::StreamExt;
use policy::{block_hashes, choose, Candidate, Policy, PrefixIndex};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often each replica's readiness is asked, and how long an answer may take.
pub const HEALTH_EVERY: Duration = Duration::from_millis(1000);
pub const HEALTH_TIMEOUT: Duration = Duration::from_millis(1500);

#[derive(Clone, Debug)]
pub struct RouteOptions {
    /// The replicas' base URLs (`http://host:port`).
    pub replicas: Vec<String>,
    pub policy: Policy,
    pub host: String,
    /// 0: any free port (the one chosen is printed).
    pub port: u16,
    /// Wait (up to 5 minutes) for every replica to answer before starting, instead of starting
    /// with those that answer now (replicas this process has just started, still loading).
    pub wait_for_models: bool,
}

/// One replica as the router sees it.
struct Replica {
    url: String,
    up: AtomicBool,
    in_flight: AtomicUsize,
    requests: AtomicU64,
    failures: AtomicU64,
    /// Blocks of prompts sent here that its index had seen, and all blocks sent (the estimated
    /// prefix-cache hit rate).
    matched_blocks: AtomicU64,
    sent_blocks: AtomicU64,
    index: Mutex<PrefixIndex>,
    /// Woken when the replica is taken out: its requests in flight stop waiting for it (a
    /// replica whose link went down answers nothing, not even a reset).
    gone: tokio::sync::Notify,
}

impl Replica {
    /// Takes the replica out (once), waking whatever waits on it.
    fn take_out(&self, why: &str) {
        if self.up.swap(false, Ordering::SeqCst) {
            eprintln!("brigade route: replica {} {why}; taken out", self.url);
        }
        self.gone.notify_waiters();
    }
}

struct Router {
    replicas: Vec<Replica>,
    policy: Policy,
    model: String,
    client: reqwest::Client,
    turn: AtomicUsize,
    retries: AtomicU64,
    lost: AtomicU64,
}

/// Counts a request in flight on a replica until dropped (a stream's end included).
struct InFlight(Arc<Router>, usize);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.replicas[self.1].in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

fn io(what: &str, e: std::io::Error) -> ServeError {
    ServeError::io(what, e)
}

/// Starts the router: checks the replicas (those that answer must serve one model; none
/// answering is an error), binds, and serves until SIGTERM or Ctrl-C.
pub fn run(o: RouteOptions, on_listen: impl FnOnce(std::net::SocketAddr) + Send + 'static) -> Result<(), ServeError> {
    if o.replicas.is_empty() {
        return Err(ServeError::Setting("give at least one --replica URL".into()));
    }
    for u in &o.replicas {
        if !(u.starts_with("http://") || u.starts_with("https://")) {
            return Err(ServeError::Setting(format!("--replica {u}: expected a URL such as http://127.0.0.1:8001")));
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| io("starting the HTTP runtime", e))?;
    rt.block_on(serve(o, on_listen))
}

/// The model a replica serves (the first of `/v1/models`), or why it does not answer.
/// Whether the replica at `url` answers its `/ready` with 200 (its model loaded).
async fn is_ready(client: &reqwest::Client, url: &str) -> bool {
    let r = client.get(format!("{url}/ready")).timeout(HEALTH_TIMEOUT).send().await;
    r.is_ok_and(|r| r.status().is_success())
}

async fn model_of(client: &reqwest::Client, url: &str) -> Result<String, String> {
    let r = client.get(format!("{url}/v1/models")).timeout(Duration::from_secs(5)).send().await;
    let r = r.map_err(|e| e.to_string())?;
    if !r.status().is_success() {
        return Err(format!("GET /v1/models answered {}", r.status()));
    }
    let v: Value = r.json().await.map_err(|e| e.to_string())?;
    v["data"][0]["id"].as_str().map(str::to_string).ok_or_else(|| "its /v1/models lists no model".to_string())
}

async fn serve(o: RouteOptions, on_listen: impl FnOnce(std::net::SocketAddr)) -> Result<(), ServeError> {
    let client = reqwest::Client::builder()
        .pool_idle_timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| ServeError::Setting(format!("the HTTP client: {e}")))?;
    let mut models: Vec<(String, String)> = Vec::new();
    let mut replicas = Vec::new();
    if o.wait_for_models {
        let t0 = std::time::Instant::now();
        for url in &o.replicas {
            let url = url.trim_end_matches('/');
            // (replicas this process started: each has loaded its model, not just named it)
            while !is_ready(&client, url).await && t0.elapsed() < Duration::from_secs(300) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    for url in &o.replicas {
        let url = url.trim_end_matches('/').to_string();
        let up = match model_of(&client, &url).await {
            Ok(m) => {
                models.push((url.clone(), m));
                // a replica still loading its model names it already: it takes requests once
                // its /ready says so (the health checks bring it in)
                is_ready(&client, &url).await
            }
            Err(e) => {
                eprintln!("brigade route: replica {url} does not answer ({e}); starting without it — it joins once it answers");
                false
            }
        };
        replicas.push(Replica {
            url,
            up: AtomicBool::new(up),
            in_flight: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            matched_blocks: AtomicU64::new(0),
            sent_blocks: AtomicU64::new(0),
            index: Mutex::new(PrefixIndex::default()),
            gone: tokio::sync::Notify::new(),
        });
    }
    let Some((_, model)) = models.first().cloned() else {
        return Err(ServeError::Setting(format!(
            "no replica answers ({}); start them first, or check the URLs",
            o.replicas.join(", ")
        )));
    };
    if let Some((u, m)) = models.iter().find(|(_, m)| *m != model) {
        return Err(ServeError::Setting(format!(
            "the replicas serve different models: {} serves {model}, {u} serves {m}; route one model's replicas",
            models[0].0
        )));
    }
    let router = Arc::new(Router {
        replicas,
        policy: o.policy,
        model,
        client,
        turn: AtomicUsize::new(0),
        retries: AtomicU64::new(0),
        lost: AtomicU64::new(0),
    });
    tokio::spawn(health(router.clone()));
    let app = axum::Router::new()
        .route("/v1/completions", post(forward))
        .route("/v1/chat/completions", post(forward))
        .route("/v1/embeddings", post(forward))
        .route("/v1/programs", post(forward))
        .route("/v1/models", get(models_route))
        .route("/health", get(|| async { "ok" }))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .with_state(router.clone());
    let listener = tokio::net::TcpListener::bind((o.host.as_str(), o.port))
        .await
        .map_err(|e| io(&format!("binding {}:{}", o.host, o.port), e))?;
    let addr = listener.local_addr().map_err(|e| io("reading the bound address", e))?;
    on_listen(addr);
    eprintln!(
        "brigade route: {} over {} replicas ({}), policy {}",
        router.model,
        router.replicas.len(),
        router.replicas.iter().map(|r| r.url.as_str()).collect::<Vec<_>>().join(", "),
        router.policy.name()
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(crate::http::server::wait_for_signal())
        .await
        .map_err(|e| io("the HTTP server failed", e))?;
    eprintln!("brigade route: stopped");
    Ok(())
}

/// Asks every replica's `/ready` every `HEALTH_EVERY`: down when it does not answer 200 (or
/// serves another model when it comes back), up when it does.
async fn health(r: Arc<Router>) {
    loop {
        tokio::time::sleep(HEALTH_EVERY).await;
        let checks = r.replicas.iter().map(|rep| {
            let r = r.clone();
            async move {
                let ok = match r.client.get(format!("{}/ready", rep.url)).timeout(HEALTH_TIMEOUT).send().await {
                    Ok(resp) if resp.status().is_success() => {
                        // a replica coming back must serve the router's model
                        rep.up.load(Ordering::SeqCst) || model_of(&r.client, &rep.url).await.is_ok_and(|m| m == r.model)
                    }
                    _ => false,
                };
                if ok {
                    if !rep.up.swap(true, Ordering::SeqCst) {
                        eprintln!("brigade route: replica {} is back", rep.url);
                    }
                } else if rep.up.load(Ordering::SeqCst) {
                    rep.take_out("stopped answering");
                }
            }
        });
        futures_util::future::join_all(checks).await;
    }
}

/// OpenAI's error body.
fn error(status: StatusCode, message: String, kind: &str) -> Response {
    let body = json!({"error": {"message": message, "type": kind, "param": null, "code": null}});
    (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// What a request's cache-aware key is: the text of its prompt (completions), its messages
/// (chat), its input (embeddings), or the body itself (programs).
fn prompt_key(v: &Value) -> Vec<u8> {
    let text = |x: &Value| match x {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if let Some(p) = v.get("prompt") {
        return text(p).into_bytes();
    }
    if let Some(Value::Array(ms)) = v.get("messages") {
        let mut s = String::new();
        for m in ms {
            s.push_str(m["role"].as_str().unwrap_or(""));
            s.push('\n');
            s.push_str(&text(&m["content"]));
            s.push('\n');
        }
        return s.into_bytes();
    }
    if let Some(i) = v.get("input") {
        return text(i).into_bytes();
    }
    v.to_string().into_bytes()
}

async fn forward(State(r): State<Arc<Router>>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("the body is not JSON: {e}"), "invalid_request_error"),
    };
    if let Some(m) = v.get("model").and_then(Value::as_str) {
        if m != r.model {
            return error(
                StatusCode::NOT_FOUND,
                format!("the model '{m}' is not served here; the replicas serve '{}'", r.model),
                "invalid_request_error",
            );
        }
    }
    let stream = v.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let hashes = block_hashes(&prompt_key(&v));
    let path = uri.path().to_string();
    let content_type = headers.get(header::CONTENT_TYPE).cloned();
    let mut tried = vec![false; r.replicas.len()];
    loop {
        let Some(i) = pick(&r, &hashes, &tried) else {
            r.lost.fetch_add(1, Ordering::Relaxed);
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "no replica is available; retry shortly".into(),
                "service_unavailable",
            );
        };
        tried[i] = true;
        let rep = &r.replicas[i];
        let guard = InFlight(r.clone(), i);
        let mut req = r.client.post(format!("{}{path}", rep.url)).body(body.clone());
        if let Some(ct) = &content_type {
            req = req.header(header::CONTENT_TYPE, ct);
        }
        // (a replica taken out while this waits for it fails the attempt: see `Replica::gone`)
        let gone = rep.gone.notified();
        tokio::pin!(gone);
        let sent = tokio::select! {
            s = req.send() => s.map_err(Some),
            () = &mut gone => Err(None),
        };
        let resp = match sent {
            Ok(resp) => resp,
            Err(e) => {
                // nothing reached the client: take the replica out and try another
                rep.failures.fetch_add(1, Ordering::Relaxed);
                if e.as_ref().is_some_and(reqwest::Error::is_connect) {
                    rep.take_out("refused a connection");
                }
                r.retries.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        let status = resp.status();
        if status == StatusCode::SERVICE_UNAVAILABLE && tried.iter().any(|t| !t) {
            // draining or full: another replica may take it
            r.retries.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let ct = resp.headers().get(header::CONTENT_TYPE).cloned();
        let mut out = Response::builder().status(status);
        if let Some(ct) = ct {
            out = out.header(header::CONTENT_TYPE, ct);
        }
        if stream && status.is_success() {
            // passed on as it comes; a replica that fails (or is taken out) before the stream's
            // end ends it with an error event
            let r2 = r.clone();
            let until_gone = async move { r2.replicas[i].gone.notified().await };
            let chunks = resp
                .bytes_stream()
                .map(Some)
                .take_until(until_gone)
                .chain(futures_util::stream::once(async { None }))
                .scan((false, false, guard), |(finished, failed, _in_flight), item| {
                    if *failed {
                        return futures_util::future::ready(None);
                    }
                    let out = match item {
                        Some(Ok(b)) => {
                            *finished |= b.windows(6).any(|w| w == b"[DONE]");
                            b
                        }
                        Some(Err(e)) => {
                            *failed = true;
                            error_event(&format!("the replica serving this stream failed: {e}"))
                        }
                        None if !*finished => {
                            *failed = true;
                            error_event("the replica serving this stream stopped answering")
                        }
                        None => Bytes::new(),
                    };
                    futures_util::future::ready(Some(Ok::<Bytes, std::io::Error>(out)))
                });
            return out
                .body(Body::from_stream(chunks))
                .unwrap_or_else(|e| error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string(), "server_error"));
        }
        let whole = tokio::select! {
            b = resp.bytes() => b.ok(),
            () = &mut gone => None,
        };
        match whole {
            Some(b) => {
                drop(guard);
                return out
                    .body(Body::from(b))
                    .unwrap_or_else(|e| error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string(), "server_error"));
            }
            None => {
                // the replica died (or was taken out) before its answer was whole: nothing was
                // sent to the client, so another replica takes the request
                rep.failures.fetch_add(1, Ordering::Relaxed);
                rep.take_out("failed mid-answer");
                r.retries.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        }
    }
}

/// An SSE event carrying OpenAI's error body.
fn error_event(message: &str) -> Bytes {
    let body = json!({"error": {"message": message, "type": "server_error", "param": null, "code": null}});
    Bytes::from(format!("data: {body}\n\n"))
}

/// The replica for a request of these block hashes, among those up and not tried; counts it.
fn pick(r: &Router, hashes: &[u64], tried: &[bool]) -> Option<usize> {
    let cands: Vec<Candidate> = r
        .replicas
        .iter()
        .enumerate()
        .filter(|(i, rep)| !tried[*i] && rep.up.load(Ordering::SeqCst))
        .map(|(i, rep)| {
            let ix = rep.index.lock().unwrap_or_else(|p| p.into_inner());
            Candidate {
                index: i,
                in_flight: rep.in_flight.load(Ordering::SeqCst),
                matched: if r.policy == Policy::CacheAware { ix.matched(hashes) } else { 0 },
                indexed: ix.len(),
            }
        })
        .collect();
    let turn = r.turn.fetch_add(1, Ordering::Relaxed);
    let i = choose(r.policy, &cands, hashes.len(), turn)?;
    let rep = &r.replicas[i];
    rep.in_flight.fetch_add(1, Ordering::SeqCst);
    rep.requests.fetch_add(1, Ordering::Relaxed);
    let mut ix = rep.index.lock().unwrap_or_else(|p| p.into_inner());
    rep.matched_blocks.fetch_add(ix.matched(hashes) as u64, Ordering::Relaxed);
    rep.sent_blocks.fetch_add(hashes.len() as u64, Ordering::Relaxed);
    ix.insert(hashes);
    Some(i)
}

async fn models_route(State(r): State<Arc<Router>>) -> Response {
    let body = json!({"object": "list", "data": [{"id": r.model, "object": "model", "owned_by": "brigade"}]});
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// Ready once a replica is.
async fn ready(State(r): State<Arc<Router>>) -> Response {
    let up = r.replicas.iter().filter(|x| x.up.load(Ordering::SeqCst)).count();
    if up > 0 {
        (StatusCode::OK, format!("ready: {up} of {} replicas", r.replicas.len())).into_response()
    } else {
        error(StatusCode::SERVICE_UNAVAILABLE, "no replica is ready".into(), "service_unavailable")
    }
}

/// A per-replica series of `/metrics`: its name, its kind, and its value on a replica.
type Series = (&'static str, &'static str, fn(&Replica) -> u64);

/// Prometheus text: per replica whether it is up, its requests in flight and in all, its
/// failures, and the prefix blocks it was sent that its index had seen (the estimated cache hit
/// rate); the router's retries and the requests it could place nowhere.
async fn metrics(State(r): State<Arc<Router>>) -> Response {
    let mut s = String::new();
    let series: [Series; 6] = [
        ("brigade_route_replica_up", "gauge", |x| x.up.load(Ordering::SeqCst) as u64),
        ("brigade_route_replica_in_flight", "gauge", |x| x.in_flight.load(Ordering::SeqCst) as u64),
        ("brigade_route_replica_requests_total", "counter", |x| x.requests.load(Ordering::Relaxed)),
        ("brigade_route_replica_failures_total", "counter", |x| x.failures.load(Ordering::Relaxed)),
        ("brigade_route_replica_prefix_blocks_matched_total", "counter", |x| x.matched_blocks.load(Ordering::Relaxed)),
        ("brigade_route_replica_prefix_blocks_total", "counter", |x| x.sent_blocks.load(Ordering::Relaxed)),
    ];
    for (name, kind, f) in series {
        s.push_str(&format!("# TYPE {name} {kind}\n"));
        for rep in &r.replicas {
            s.push_str(&format!("{name}{{replica=\"{}\"}} {}\n", rep.url, f(rep)));
        }
    }
    s.push_str(&format!(
        "# TYPE brigade_route_retries_total counter\nbrigade_route_retries_total {}\n",
        r.retries.load(Ordering::Relaxed)
    ));
    s.push_str(&format!(
        "# TYPE brigade_route_unplaced_total counter\nbrigade_route_unplaced_total {}\n",
        r.lost.load(Ordering::Relaxed)
    ));
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; version=0.0.4")], s).into_response()
}
