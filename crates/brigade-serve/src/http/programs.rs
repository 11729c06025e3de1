//! `POST /v1/programs`: a program of generation calls (JSON; see `program`) checked whole
//! before anything runs (400 naming the node and the problem), then run inside the engine by
//! `program::run` — one response with every node's output, or, with `"stream": true`,
//! server-sent events: each node's result as it ends, the whole result, `[DONE]`. A client
//! that goes away aborts the program and frees every branch's blocks.

use super::app::{error, event_stream, unavailable, App};
use super::completions::serving;
use crate::program::run::{check, run, Ctx};
use crate::program::{Limits, Program, Width};
use crate::request::ApiError;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub(crate) async fn programs(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let r = match accept(&app, &body) {
        Ok((p, slots)) => respond(app.clone(), p, slots).await,
        Err(e) => error(e),
    };
    app.metrics.count_status(r.status().as_u16());
    r
}

fn bad(message: String) -> ApiError {
    ApiError { status: 400, message, kind: "invalid_request_error", param: Some("nodes".into()), code: None }
}

/// The checked program and the places in flight it holds (its width; 1 for `auto`, which
/// narrows to what the running batch leaves).
fn accept(app: &Arc<App>, body: &[u8]) -> Result<(Program, usize), ApiError> {
    let l = serving(app)?;
    let text = std::str::from_utf8(body).map_err(|_| bad("the request body is not UTF-8".into()))?;
    let p = Program::from_json(text, &Limits::default()).map_err(|e| bad(e.0))?;
    if let Some(m) = &p.model {
        if *m != app.name {
            return Err(ApiError::model_not_found(m, "serves", &app.name));
        }
    }
    check(&p, l).map_err(|e| bad(e.to_string()))?;
    let slots = match p.max_parallel {
        Width::Max(n) => n.min(app.capacity),
        Width::Auto => 1,
    };
    let taken = app
        .inflight
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |f| (f + slots <= app.capacity).then_some(f + slots));
    if taken.is_err() {
        return Err(unavailable("the server is at its limit of running and queued requests; retry shortly"));
    }
    Ok((p, slots))
}

/// Gives back a program's places in flight however its handler ends.
struct Slots {
    app: Arc<App>,
    n: usize,
}

impl Drop for Slots {
    fn drop(&mut self) {
        self.app.inflight.fetch_sub(self.n, Ordering::SeqCst);
    }
}

async fn respond(app: Arc<App>, p: Program, slots: usize) -> Response {
    let slots = Slots { app: app.clone(), n: slots };
    if !p.stream {
        let l = app.loaded.get().expect("accepted only once loaded");
        let ctx = Ctx { l, metrics: &app.metrics, next_id: &app.next_id, max_branches: Limits::default().max_branches };
        let v = run(&ctx, &p, |_| {}).await;
        drop(slots);
        return axum::Json(v).into_response();
    }
    // at most one event per node and the result: the channel never fills
    let (tx, rx) =
        tokio::sync::mpsc::channel::<Result<Bytes, std::convert::Infallible>>(Limits::default().max_nodes + 2);
    tokio::spawn(async move {
        let l = app.loaded.get().expect("accepted only once loaded");
        let ctx = Ctx { l, metrics: &app.metrics, next_id: &app.next_id, max_branches: Limits::default().max_branches };
        let event = |v: &serde_json::Value| Ok(Bytes::from(format!("data: {v}\n\n")));
        let events = tx.clone();
        let whole = tokio::select! {
            v = run(&ctx, &p, |v| { let _ = events.try_send(event(&v)); }) => v,
            // the client went away: dropping the run aborts every branch
            _ = tx.closed() => return,
        };
        let _ = tx.send(event(&whole)).await;
        let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
        drop(slots);
    });
    event_stream(rx)
}
