//! `/v1/completions`: a request parsed and validated (a 4xx names the field), its prompts
//! tokenized and admitted to the engine, the engine's outputs assembled into one response or
//! streamed as server-sent events, aborted if the client goes away.

use crate::api::{self, ApiError, Completion, Prompt};
use crate::app::{error, event_stream, unavailable, unix_now, App, InFlight, Loaded};
use crate::engine::{Admit, Finish, Output, Request, Sampling};
use crate::metrics::Metrics;
use crate::text::{token_text, Detok};
use anyhow::Result;
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
    let r = match api::parse(&body) {
        Ok(req) => respond(app.clone(), req, Kind::Text, started).await,
        Err(e) => error(e),
    };
    app.metrics.count_status(r.status().as_u16());
    r
}

/// Which API a request came through: it sets the response's shape and the tokens that end
/// a sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `/v1/completions`: text, ended by the model's EOS.
    Text,
    /// `/v1/chat/completions`: an assistant message, ended by the template's end of turn.
    Chat,
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

/// A prompt as tokens, and how many tokens to generate for it (`max_tokens`, or its default).
pub(crate) struct Prompted {
    pub(crate) ids: Vec<u32>,
    pub(crate) max_tokens: usize,
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

/// A prompt as token ids: text through the model's tokenizer (400 without one).
pub(crate) fn prompt_ids(l: &Loaded, p: &Prompt) -> Result<Vec<u32>, ApiError> {
    Ok(match p {
        Prompt::Ids(ids) => ids.clone(),
        Prompt::Text(t) => match &l.tokenizer {
            Some(tok) => tok.encode(t).map_err(|e| ApiError::bad("prompt", e.to_string()))?,
            None => {
                return Err(ApiError::bad(
                    "prompt",
                    "this model has no tokenizer.json; send the prompt as token ids (a list of integers)",
                ))
            }
        },
    })
}

/// Checks a prompt's tokens against the model, the context and the cache, with the tokens to
/// generate for it (`max_tokens`, or its default).
pub(crate) fn prompted(l: &Loaded, req: &Completion, ids: Vec<u32>) -> Result<Prompted, ApiError> {
    if ids.is_empty() {
        return Err(ApiError::bad("prompt", "the prompt is empty (no tokens)"));
    }
    if let Some(&t) = ids.iter().find(|&&t| t as usize >= l.vocab) {
        return Err(ApiError::bad("prompt", format!("token {t} is outside the vocabulary (0..{})", l.vocab)));
    }
    if ids.len() >= l.context {
        return Err(ApiError::bad(
            "prompt",
            format!(
                "the prompt has {} tokens; this model's maximum context length is {} tokens, prompt and at least one generated token; shorten the prompt",
                ids.len(),
                l.context
            ),
        ));
    }
    let want = req.max_tokens.unwrap_or(16.min(l.context - ids.len()));
    if ids.len() + want > l.context {
        return Err(ApiError::bad(
            if req.max_tokens.is_some() { "max_tokens" } else { "prompt" },
            format!(
                "this model's maximum context length is {} tokens; the request asks for {} ({} in the prompt, {want} to generate); shorten the prompt or lower max_tokens",
                l.context,
                ids.len() + want,
                ids.len()
            ),
        ));
    }
    // what the engine asks of a sequence: its blocks at the end, and at admission the
    // prompt's blocks and one more
    let blocks = (ids.len() + want).div_ceil(l.block_size).max(ids.len().div_ceil(l.block_size) + 1);
    if blocks > l.kv_blocks {
        return Err(ApiError::bad(
            "max_tokens",
            format!(
                "the request needs {blocks} KV-cache blocks; the server holds {} (restart it with a larger --kv-cache-mib)",
                l.kv_blocks
            ),
        ));
    }
    Ok(Prompted { ids, max_tokens: want })
}

/// The field a request's constraint came in (for its 400).
fn constraint_param(req: &Completion) -> &'static str {
    match req.constraint {
        Some(crate::constraint::Spec::Regex(_)) => "guided_regex",
        Some(crate::constraint::Spec::Choice(_)) => "guided_choice",
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
    l.constraint(&req).map_err(|e| ApiError::bad(param, e))?;
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

/// A generated token, its log-probability, and its alternatives with theirs.
type TokenLogprobs = (u32, f32, Vec<(u32, f32)>);

/// One choice being generated.
pub(crate) struct Choice<'a> {
    pub(crate) detok: Detok<'a>,
    pub(crate) tokens: Vec<u32>,
    pub(crate) finish: Option<&'static str>,
    /// Each generated token's log-probability and its alternatives (when asked for).
    lp: Vec<TokenLogprobs>,
    /// Where each of those tokens' text starts, in characters (OpenAI's `text_offset`), and
    /// where the next one's will.
    lp_offsets: Vec<usize>,
    offset: usize,
    last: Option<Instant>,
}

/// How choice `j` of a request is sampled: its settings, its seed (choice j of `seed: S` is
/// seeded `S + j·φ`, so choice j of `n: N` is the same whatever N), and the tokens that end it.
pub(crate) fn sampling(l: &Loaded, req: &Completion, kind: Kind, max_tokens: usize, j: usize) -> Sampling {
    Sampling {
        temperature: req.temperature,
        top_k: req.top_k,
        top_p: req.top_p,
        seed: req.seed.unwrap_or(0).wrapping_add((j as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
        max_tokens,
        stop_tokens: match (req.ignore_eos, kind) {
            (true, _) => vec![],
            (false, Kind::Text) => l.eos.clone(),
            (false, Kind::Chat) => l.chat.as_ref().map_or_else(|_| l.eos.clone(), |t| t.end_of_turn.clone()),
        },
        top_logprobs: req.logprobs.unwrap_or(0),
    }
}

/// Sends the sequences to the engine; returns the receiver of their tokens.
fn submit(
    l: &Loaded,
    req: &Completion,
    kind: Kind,
    prompts: &[Prompted],
    guard: &InFlight,
    app: &App,
) -> UnboundedReceiver<Result<Output, String>> {
    let (tx, rx) = unbounded_channel();
    let mut ids = guard.ids.iter();
    for p in prompts {
        app.metrics.prompt_tokens.inc_by(p.ids.len() as u64);
        for j in 0..req.n {
            let id = *ids.next().expect("an id per sequence");
            let sampling = sampling(l, req, kind, p.max_tokens, j);
            // choices after the first share its prompt's keys and values
            let constraint = match l.constraint(req) {
                Ok(c) => c,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    continue;
                }
            };
            let admit = Admit { follows: (j > 0).then_some(id - j as u64), constraint, ..Default::default() };
            l.engine.add_with(Request { id, prompt: p.ids.clone(), sampling }, admit, tx.clone());
        }
    }
    rx
}

/// The choices of one request (sequence ids `base..`), as their tokens arrive.
pub(crate) struct Choices<'a> {
    pub(crate) list: Vec<Choice<'a>>,
    /// Choices not finished yet.
    pub(crate) open: usize,
    base: u64,
    l: &'a Loaded,
    /// The request's `logprobs`.
    logprobs: Option<usize>,
    kind: Kind,
    started: Instant,
}

impl<'a> Choices<'a> {
    /// The choices of `req`, whose sequences are `ids` (consecutive).
    pub(crate) fn new(l: &'a Loaded, req: &Completion, kind: Kind, ids: &[u64], started: Instant) -> Choices<'a> {
        let list: Vec<Choice> = ids
            .iter()
            .map(|_| Choice {
                detok: Detok::new(l.tokenizer.as_ref(), &req.stop),
                tokens: Vec::new(),
                finish: None,
                lp: Vec::new(),
                lp_offsets: Vec::new(),
                offset: 0,
                last: None,
            })
            .collect();
        Choices { open: list.len(), list, base: ids[0], l, logprobs: req.logprobs, kind, started }
    }

    /// Takes one engine output into its choice: the choice's index and the text that became
    /// final, or `None` for a choice that already ended (at a stop string). A choice that ends
    /// here before the engine finished it is aborted in the engine.
    pub(crate) fn take(&mut self, o: &Output, metrics: &Metrics) -> Option<(usize, String)> {
        let l = self.l;
        let i = (o.id - self.base) as usize;
        let c = &mut self.list[i];
        if c.finish.is_some() {
            return None;
        }
        let now = Instant::now();
        match c.last {
            None => metrics.ttft.observe((now - self.started).as_secs_f64()),
            Some(t) => metrics.itl.observe((now - t).as_secs_f64()),
        }
        c.last = Some(now);
        c.tokens.push(o.token);
        if self.logprobs.is_some() {
            c.lp.push((o.token, o.logprob, o.top.clone()));
            if self.kind == Kind::Text {
                // OpenAI counts offsets in characters, not bytes
                c.lp_offsets.push(c.offset);
                c.offset += token_text(l.tokenizer.as_ref(), o.token).chars().count();
            }
        }
        // the end-of-text token ends the text; it is not part of it
        let eos = o.finished == Some(Finish::Stop);
        let mut piece = if eos { String::new() } else { c.detok.push(o.token) };
        if c.detok.stopped {
            c.finish = Some("stop");
        } else if let Some(f) = o.finished {
            piece.push_str(&c.detok.finish());
            c.finish = Some(if matches!(f, Finish::Stop | Finish::Done) { "stop" } else { "length" });
        }
        if c.finish.is_some() {
            self.open -= 1;
            if o.finished.is_none() {
                l.engine.abort(o.id);
            }
        }
        Some((i, piece))
    }

    /// Log-probabilities of choice `i`'s tokens from `from` on, in OpenAI's layout of the API.
    fn logprobs(&self, i: usize, from: usize) -> Value {
        if self.logprobs.is_none() {
            return Value::Null;
        }
        let tok = self.l.tokenizer.as_ref();
        let (lp, offsets) = (&self.list[i].lp, &self.list[i].lp_offsets);
        match self.kind {
            Kind::Text => {
                let tokens: Vec<String> = lp[from..].iter().map(|&(t, ..)| token_text(tok, t)).collect();
                let offsets = &offsets[from..];
                let top: Vec<Value> = lp[from..]
                    .iter()
                    .map(|(_, _, top)| {
                        // keyed by text, as OpenAI's legacy API is: where two tokens show the
                        // same text (pieces of one character both decode to U+FFFD), the more
                        // likely one, listed first, keeps the key
                        let mut m = serde_json::Map::new();
                        for &(t, l) in top {
                            m.entry(token_text(tok, t)).or_insert_with(|| json!(l));
                        }
                        Value::Object(m)
                    })
                    .collect();
                let values: Vec<f32> = lp[from..].iter().map(|&(_, l, _)| l).collect();
                json!({"tokens": tokens, "token_logprobs": values, "top_logprobs": top, "text_offset": offsets})
            }
            Kind::Chat => {
                let entry = |t: u32, l: f32| {
                    let text = token_text(tok, t);
                    json!({"token": text, "logprob": l, "bytes": text.as_bytes()})
                };
                let content: Vec<Value> = lp[from..]
                    .iter()
                    .map(|(t, l, top)| {
                        let mut e = entry(*t, *l);
                        e["top_logprobs"] = top.iter().map(|&(t, l)| entry(t, l)).collect();
                        e
                    })
                    .collect();
                json!({"content": content})
            }
        }
    }

    /// Prompt tokens (each prompt once, whatever n) and generated tokens.
    fn usage(&self, prompts: &[Prompted]) -> Value {
        let completion_tokens: usize = self.list.iter().map(|c| c.tokens.len()).sum();
        let prompt_tokens: usize = prompts.iter().map(|p| p.ids.len()).sum();
        json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens})
    }
}

fn engine_failed(e: String) -> ApiError {
    ApiError {
        status: 500,
        message: format!("the engine refused the request: {e}"),
        kind: "server_error",
        param: None,
        code: None,
    }
}

fn engine_stopped() -> ApiError {
    engine_failed("the engine stopped before the request finished".into())
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
    let mut rx = submit(l, &req, kind, &prompts, &guard, app);
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
        let mut engine_rx = submit(l, &req, kind, &prompts, &guard, &app);
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
