//! `/v1/completions`: a request parsed and validated (a 4xx names the field), its prompts
//! tokenized and admitted to the engine, the engine's outputs assembled into one response or
//! streamed as server-sent events, aborted if the client goes away.

use super::app::{error, event_stream, unavailable, unix_now, App, InFlight};
use crate::constraint::ConstraintError;
use crate::engine::{Admit, Output, Refused, Request};
use crate::request::choices::Choices;
use crate::request::completion::{self, Completion};
use crate::request::shape::{prompt_ids, prompted, sampling, Kind, Prompted};
use crate::request::{tools, ApiError};
use crate::startup::Loaded;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

pub(crate) async fn completions(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let started = Instant::now();
    let r = match completion::parse_with(&body, &defaults(&app)) {
        Ok(req) => respond(app.clone(), req, Kind::Text, started).await,
        Err(e) => error(e),
    };
    app.metrics.count_status(r.status().as_u16());
    r
}

/// What a request's left-out sampling fields get: the loaded model's defaults (OpenAI's
/// while it loads; such a request is refused as not ready anyway).
pub(crate) fn defaults(app: &App) -> completion::Defaults {
    app.loaded.get().map(|l| l.defaults.clone()).unwrap_or_default()
}

/// Admits a parsed request and answers it: one response, or server-sent events.
pub(crate) async fn respond(app: Arc<App>, req: Completion, kind: Kind, started: Instant) -> Response {
    match accept(&app, req) {
        Ok((req, prompts, guard)) => {
            if req.stream {
                stream(app.clone(), req, kind, prompts, guard, started)
            } else {
                whole(&app, req, kind, prompts, guard, started).await
            }
        }
        Err(e) => error(e),
    }
}

/// Whether the server takes requests now (loaded, not draining), and the model if so.
pub(crate) fn serving(app: &App) -> Result<&Loaded, ApiError> {
    if !app.generates {
        return Err(ApiError::bad(
            "model",
            "this server has no generation model (it serves /v1/embeddings only); start it with --checkpoint DIR or --model PRESET",
        ));
    }
    let Some(l) = app.loaded.get() else { return Err(unavailable("the model is still loading; retry shortly")) };
    if app.draining.load(Ordering::SeqCst) {
        return Err(unavailable("the server is shutting down"));
    }
    Ok(l)
}

/// The field a request's constraint came in (for its 400).
fn constraint_param(req: &Completion) -> &'static str {
    match req.constraint {
        Some(crate::constraint::Spec::Regex(_)) => "guided_regex",
        Some(crate::constraint::Spec::Choice(_)) => "guided_choice",
        Some(crate::constraint::Spec::Lark(_)) => "tools",
        _ => "response_format",
    }
}

/// Checks a request against the model and the limits and queues its sequences.
fn accept(app: &Arc<App>, mut req: Completion) -> Result<(Completion, Vec<Prompted>, InFlight), ApiError> {
    let l = serving(app)?;
    if let Some(m) = &req.model {
        if *m != app.name {
            return Err(ApiError::model_not_found(m, "serves", &app.name));
        }
    }
    let param = if req.constraint.is_some() { constraint_param(&req) } else { "" };
    l.constraint(req.constraint.as_ref()).map_err(|e| ApiError::bad(param, e.to_string()))?;
    let mut prompts = Vec::new();
    for p in &req.prompts {
        let ids = prompt_ids(l, p)?;
        prompts.push(prompted(l, &req, ids)?);
    }
    let seqs = prompts.len() * req.n;
    if seqs > app.capacity {
        return Err(ApiError::bad(
            "n",
            format!("the request asks for {seqs} sequences; this server holds at most {} at once", app.capacity),
        ));
    }
    let taken = app
        .inflight
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |f| (f + seqs <= app.capacity).then_some(f + seqs));
    if taken.is_err() {
        return Err(unavailable("the server is at its limit of running and queued requests; retry shortly"));
    }
    let base = app.next_id.fetch_add(seqs as u64, Ordering::SeqCst);
    let guard = InFlight { app: app.clone(), ids: (base..base + seqs as u64).collect() };
    if req.seed.is_none() && req.temperature > 0.0 {
        req.seed = Some(rand::random());
    }
    Ok((req, prompts, guard))
}

/// Sends the sequences to the engine; returns the receiver of their tokens, or (none sent)
/// why a sequence's constraint could not be built.
fn submit(
    l: &Loaded,
    req: &Completion,
    kind: Kind,
    prompts: &[Prompted],
    guard: &InFlight,
    app: &App,
) -> Result<UnboundedReceiver<Result<Output, Refused>>, ConstraintError> {
    let constraints =
        (0..prompts.len() * req.n).map(|_| l.constraint(req.constraint.as_ref())).collect::<Result<Vec<_>, _>>()?;
    let (tx, rx) = unbounded_channel();
    let mut ids = guard.ids.iter();
    let mut constraints = constraints.into_iter();
    for p in prompts {
        app.metrics.prompt_tokens.inc_by(p.ids.len() as u64);
        for j in 0..req.n {
            let id = *ids.next().expect("an id per sequence");
            let sampling = sampling(l, req, kind, p.max_tokens, j);
            let constraint = constraints.next().expect("a constraint per sequence");
            // choices after the first share its prompt's keys and values
            let admit = Admit { follows: (j > 0).then_some(id - j as u64), constraint, ..Default::default() };
            l.engine.add_with(Request { id, prompt: p.ids.clone(), sampling }, admit, tx.clone());
        }
    }
    Ok(rx)
}

fn engine_failed(e: impl std::fmt::Display) -> ApiError {
    ApiError {
        status: 500,
        message: format!("the engine refused the request: {e}"),
        kind: "server_error",
        param: None,
        code: None,
    }
}

fn engine_stopped() -> ApiError {
    engine_failed("the engine stopped before the request finished")
}

/// The response's id and object name of the API.
fn names(kind: Kind, base: u64, stream: bool) -> (String, &'static str) {
    match (kind, stream) {
        (Kind::Text, _) => (format!("cmpl-{base}"), "text_completion"),
        (Kind::Chat, false) => (format!("chatcmpl-{base}"), "chat.completion"),
        (Kind::Chat, true) => (format!("chatcmpl-{base}"), "chat.completion.chunk"),
    }
}

async fn whole(
    app: &Arc<App>,
    req: Completion,
    kind: Kind,
    prompts: Vec<Prompted>,
    guard: InFlight,
    started: Instant,
) -> Response {
    let l = app.loaded.get().expect("accepted only once loaded");
    let mut rx = match submit(l, &req, kind, &prompts, &guard, app) {
        Ok(rx) => rx,
        Err(e) => return error(engine_failed(e)),
    };
    let mut choices = Choices::new(l, &req, kind, &guard.ids, started);
    while choices.open > 0 {
        match rx.recv().await {
            Some(Ok(o)) => {
                choices.take(&o, &app.metrics);
            }
            Some(Err(e)) => return error(engine_failed(e)),
            None => return error(engine_stopped()),
        }
    }
    let out: Vec<Value> = choices
        .list
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut v = match kind {
                Kind::Text => json!({"index": i, "text": c.detok.text()}),
                Kind::Chat => json!({"index": i, "message": {"role": "assistant", "content": c.detok.text()}}),
            };
            v["finish_reason"] = json!(c.finish);
            if let (Kind::Chat, Some((syntax, names))) = (kind, &req.tool_calls) {
                let (content, calls) = tools::read_calls(c.detok.text(), *syntax, names);
                if !calls.is_empty() {
                    v["message"]["content"] = if content.is_empty() { Value::Null } else { json!(content) };
                    v["message"]["tool_calls"] = tools::api_calls(&calls, &format!("{}_{i}", choices.base));
                    v["finish_reason"] = json!("tool_calls");
                }
            }
            v["logprobs"] = choices.logprobs(i, 0);
            if req.return_token_ids {
                v["token_ids"] = json!(c.tokens);
                if kind == Kind::Text {
                    v["prompt_token_ids"] = json!(prompts[i / req.n].ids);
                }
            }
            v
        })
        .collect();
    let (id, object) = names(kind, choices.base, false);
    let mut body = json!({
        "id": id, "object": object, "created": unix_now(), "model": app.name,
        "choices": out, "usage": choices.usage(&prompts),
    });
    if req.return_token_ids && kind == Kind::Chat {
        // vLLM's place for the rendered template's ids
        body["prompt_token_ids"] = json!(prompts[0].ids);
    }
    drop(guard);
    axum::Json(body).into_response()
}

/// Server-sent events: a chunk per generated token (the text that became final, its token id
/// and log-probabilities as asked), the finish reason with the last, usage if asked, `[DONE]`.
/// A chat stream opens each choice with a chunk whose delta carries the role.
fn stream(
    app: Arc<App>,
    req: Completion,
    kind: Kind,
    prompts: Vec<Prompted>,
    guard: InFlight,
    started: Instant,
) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::convert::Infallible>>(256);
    tokio::spawn(async move {
        let l = app.loaded.get().expect("accepted only once loaded");
        let submitted = submit(l, &req, kind, &prompts, &guard, &app);
        let mut choices = Choices::new(l, &req, kind, &guard.ids, started);
        let (id, object) = names(kind, choices.base, true);
        let created = unix_now();
        let event = |v: &Value| Ok(Bytes::from(format!("data: {v}\n\n")));
        let chunk_of = |choice: Value| {
            let mut chunk =
                json!({"id": id, "object": object, "created": created, "model": app.name, "choices": [choice]});
            if req.include_usage {
                chunk["usage"] = Value::Null;
            }
            chunk
        };
        if kind == Kind::Chat {
            for i in 0..choices.list.len() {
                let mut first = json!({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null});
                if req.return_token_ids && i == 0 {
                    first["prompt_token_ids"] = json!(prompts[0].ids);
                }
                if tx.send(event(&chunk_of(first))).await.is_err() {
                    return;
                }
            }
        }
        // with tools, each chat choice is read for calls as it streams
        let mut streams: Vec<Option<tools::Stream>> = match (kind, &req.tool_calls) {
            (Kind::Chat, Some((syntax, names))) => {
                (0..choices.list.len()).map(|_| Some(tools::Stream::new(*syntax, names.clone()))).collect()
            }
            _ => Vec::new(),
        };
        let mut called_any = vec![false; choices.list.len()];
        // with tools, how many of a choice's tokens have had their log-probabilities sent
        let mut lp_sent = vec![0usize; choices.list.len()];
        let mut engine_rx = match submitted {
            Ok(rx) => rx,
            Err(e) => {
                let _ = tx.send(event(&engine_failed(e).body())).await;
                return;
            }
        };
        while choices.open > 0 {
            let msg = tokio::select! {
                m = engine_rx.recv() => m,
                // the client went away (even before its first token): the guard aborts
                _ = tx.closed() => return,
            };
            let o = match msg {
                Some(Ok(o)) => o,
                Some(Err(e)) => {
                    let _ = tx.send(event(&engine_failed(e).body())).await;
                    return;
                }
                None => {
                    let _ = tx.send(event(&engine_stopped().body())).await;
                    return;
                }
            };
            let from = choices.list[(o.id - choices.base) as usize].lp.len();
            let Some((i, piece)) = choices.take(&o, &app.metrics) else { continue };
            let c = &choices.list[i];
            if let Some(stream) = streams.get_mut(i).and_then(Option::as_mut) {
                // with tools: the text before the first call as it comes, each call once it is
                // whole (its index, id and name once, its arguments in pieces), then the finish
                let mut chunks = Vec::new();
                let mut called = false;
                for d in stream.feed(c.detok.text(), c.finish.is_some()) {
                    match d {
                        tools::Delta::Content(text) => chunks.push(
                            json!({"index": i, "delta": {"content": text}, "logprobs": null, "finish_reason": null}),
                        ),
                        tools::Delta::Call(k, call) => {
                            called = true;
                            let id = tools::call_id(&format!("{}_{i}", choices.base), k);
                            chunks.push(json!({"index": i, "delta": {"tool_calls": [{"index": k, "id": id, "type": "function",
                                "function": {"name": call.name, "arguments": ""}}]}, "logprobs": null, "finish_reason": null}));
                            let args: Vec<char> = call.arguments.chars().collect();
                            for piece in args.chunks(16) {
                                let piece: String = piece.iter().collect();
                                chunks.push(json!({"index": i, "delta": {"tool_calls": [{"index": k, "function": {"arguments": piece}}]},
                                    "logprobs": null, "finish_reason": null}));
                            }
                        }
                    }
                }
                called_any[i] |= called;
                if c.finish.is_some() {
                    let finish = if called_any[i] { json!("tool_calls") } else { json!(c.finish) };
                    chunks.push(json!({"index": i, "delta": {}, "logprobs": null, "finish_reason": finish}));
                }
                // the tokens' log-probabilities ride on the first chunk sent after them (a
                // choice's last chunk at the latest)
                if let Some(first) = chunks.first_mut().filter(|_| lp_sent[i] < c.lp.len()) {
                    first["logprobs"] = choices.logprobs(i, lp_sent[i]);
                    lp_sent[i] = c.lp.len();
                }
                for ch in chunks {
                    if tx.send(event(&chunk_of(ch))).await.is_err() {
                        return;
                    }
                }
                continue;
            }
            let mut ch = match kind {
                Kind::Text => json!({"index": i, "text": piece}),
                Kind::Chat => json!({"index": i, "delta": {"content": piece}}),
            };
            ch["finish_reason"] = json!(c.finish);
            ch["logprobs"] = choices.logprobs(i, from);
            if req.return_token_ids {
                ch["token_ids"] = json!([o.token]);
                if c.tokens.len() == 1 && kind == Kind::Text {
                    ch["prompt_token_ids"] = json!(prompts[i / req.n].ids);
                }
            }
            if tx.send(event(&chunk_of(ch))).await.is_err() {
                return; // the client went away: the guard aborts what is left
            }
        }
        if req.include_usage {
            let chunk = json!({"id": id, "object": object, "created": created, "model": app.name,
                "choices": [], "usage": choices.usage(&prompts)});
            let _ = tx.send(event(&chunk)).await;
        }
        let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
        drop(guard);
    });
    event_stream(rx)
}
