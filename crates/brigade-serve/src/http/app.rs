//! The server's state as its handlers share it: the loaded model (once loaded), whether it is
//! draining, its metrics, the requests in flight; and the error responses every handler gives.

use crate::engine::embedder::Embedder;
use crate::metrics::Metrics;
use crate::request::ApiError;
use crate::startup::Loaded;
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

pub(crate) struct App {
    /// The generation model's name.
    pub(crate) name: String,
    /// Whether a generation model is served (else embeddings only).
    pub(crate) generates: bool,
    pub(crate) loaded: OnceLock<Loaded>,
    /// The embedding model, once loaded (`None`: none is served).
    pub(crate) embedder: Option<OnceLock<Embedder>>,
    pub(crate) draining: AtomicBool,
    pub(crate) metrics: Metrics,
    /// Sequences accepted and not finished (running and waiting).
    pub(crate) inflight: AtomicUsize,
    /// `max_running + max_queued`: more in flight is refused with 503.
    pub(crate) capacity: usize,
    pub(crate) next_id: AtomicU64,
}

pub(crate) fn error(e: ApiError) -> Response {
    let mut r =
        (StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST), axum::Json(e.body())).into_response();
    if e.status == 503 {
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

pub(crate) fn unavailable(message: &str) -> ApiError {
    ApiError { status: 503, message: message.into(), kind: "service_unavailable", param: None, code: None }
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Gives back a request's place in flight and aborts what is still running of it, however
/// the handler ends (finished, error, or dropped because its client went away).
pub(crate) struct InFlight {
    pub(crate) app: Arc<App>,
    pub(crate) ids: Vec<u64>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(l) = self.app.loaded.get() {
            for &id in &self.ids {
                l.engine.abort(id);
            }
        }
        self.app.inflight.fetch_sub(self.ids.len(), Ordering::SeqCst);
    }
}

/// Events sent on a channel as a server-sent-events response: each item is one whole event.
pub(crate) fn event_stream(rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::convert::Infallible>>) -> Response {
    let body =
        Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) }));
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(body)
        .expect("a valid response")
}
