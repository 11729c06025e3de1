//! `POST /v1/embeddings` from a sentence-transformers folder (`--embedding-model DIR`): the
//! request read field by field (`input` a string, a list of strings, token ids or lists of
//! them; `encoding_format` float or base64; `dimensions` only equal to the model's), its texts
//! tokenized and handed to the embedder thread (`embedder.rs`). The encoder's products are
//! row-invariant, so each vector is `brigade embed`'s for the same text bit for bit, whatever
//! it was batched with.

use super::app::{error, unavailable, App};
use crate::engine::embedder::Job;
use crate::request::completion::{self, field, type_name};
use crate::request::ApiError;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use brigade::embed::Tokenized;
use serde_json::{json, Value};
use std::sync::Arc;

/// Inputs one request may carry (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

const FIELDS: &[&str] = &["model", "input", "encoding_format", "dimensions", "user"];

/// What a request asks for.
struct Request {
    model: Option<String>,
    input: Vec<Input>,
    base64: bool,
}

enum Input {
    Text(String),
    Ids(Vec<u32>),
}

fn parse(body: &[u8], dim: usize) -> Result<Request, ApiError> {
    let o = completion::object_of(body, &[FIELDS])?;
    let model = match field(&o, "model") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => return Err(ApiError::bad("model", format!("'model' must be a string, got {}", type_name(v)))),
    };
    let what = "'input' must be a string, a list of strings, a list of token ids or a list of lists of token ids";
    let ids = |v: &[Value]| -> Option<Vec<u32>> {
        v.iter().map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok())).collect()
    };
    let input = match field(&o, "input") {
        None => return Err(ApiError::bad("input", "'input' is required")),
        Some(Value::String(s)) => vec![Input::Text(s.clone())],
        Some(Value::Array(a)) if a.is_empty() => return Err(ApiError::bad("input", "'input' is an empty list")),
        Some(Value::Array(a)) => match &a[0] {
            Value::String(_) => a
                .iter()
                .map(|s| s.as_str().map(|s| Input::Text(s.to_string())).ok_or_else(|| ApiError::bad("input", what)))
                .collect::<Result<_, _>>()?,
            Value::Number(_) => vec![Input::Ids(ids(a).ok_or_else(|| ApiError::bad("input", what))?)],
            Value::Array(_) => a
                .iter()
                .map(|p| match p {
                    Value::Array(p) if !p.is_empty() => {
                        ids(p).map(Input::Ids).ok_or_else(|| ApiError::bad("input", what))
                    }
                    _ => Err(ApiError::bad("input", what)),
                })
                .collect::<Result<_, _>>()?,
            _ => return Err(ApiError::bad("input", what)),
        },
        Some(_) => return Err(ApiError::bad("input", what)),
    };
    if input.len() > MAX_INPUTS {
        return Err(ApiError::bad("input", format!("'input' holds {} items; at most {MAX_INPUTS}", input.len())));
    }
    let base64 = match field(&o, "encoding_format") {
        None => false,
        Some(Value::String(s)) if s == "float" => false,
        Some(Value::String(s)) if s == "base64" => true,
        Some(_) => return Err(ApiError::bad("encoding_format", "'encoding_format' must be \"float\" or \"base64\"")),
    };
    match field(&o, "dimensions") {
        None => {}
        Some(Value::Number(n)) if n.as_u64() == Some(dim as u64) => {}
        Some(v) => {
            return Err(ApiError::bad(
                "dimensions",
                format!("'dimensions' {v} is not supported: this model's vectors have {dim} dimensions; leave it out or give {dim}"),
            ))
        }
    }
    if let Some(u) = field(&o, "user") {
        if !u.is_string() {
            return Err(ApiError::bad("user", format!("'user' must be a string, got {}", type_name(u))));
        }
    }
    Ok(Request { model, input, base64 })
}

pub(crate) async fn embeddings(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let r = match answer(&app, &body).await {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => error(e),
    };
    app.metrics.count_status(r.status().as_u16());
    r
}

async fn answer(app: &App, body: &[u8]) -> Result<Value, ApiError> {
    let Some(slot) = &app.embedder else {
        return Err(ApiError::bad(
            "model",
            "this server has no embedding model; start it with --embedding-model DIR (a sentence-transformers folder)",
        ));
    };
    let Some(e) = slot.get() else { return Err(unavailable("the embedding model is still loading; retry shortly")) };
    if app.draining.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(unavailable("the server is shutting down"));
    }
    let req = parse(body, e.dim)?;
    if let Some(m) = &req.model {
        if *m != e.name {
            return Err(ApiError::model_not_found(m, "embeds with", &e.name));
        }
    }
    let mut seqs = Vec::with_capacity(req.input.len());
    for (i, inp) in req.input.iter().enumerate() {
        let ids = match inp {
            Input::Text(t) => {
                let Tokenized { ids, .. } =
                    e.encoder.tokenize(t).map_err(|err| ApiError::bad("input", format!("input {i}: {err}")))?;
                ids
            }
            Input::Ids(ids) => {
                if let Some(&t) = ids.iter().find(|&&t| t as usize >= e.vocab) {
                    return Err(ApiError::bad(
                        "input",
                        format!("input {i}: token {t} is outside the vocabulary (0..{})", e.vocab),
                    ));
                }
                if ids.len() > e.max_len {
                    return Err(ApiError::bad(
                        "input",
                        format!("input {i} has {} tokens; this model takes at most {}", ids.len(), e.max_len),
                    ));
                }
                ids.clone()
            }
        };
        seqs.push(ids);
    }
    let tokens: usize = seqs.iter().map(Vec::len).sum();
    let n = seqs.len();
    let (reply, rx) = tokio::sync::oneshot::channel();
    e.tx.send(Job { seqs, reply }).map_err(|_| unavailable("the embedding thread stopped"))?;
    let vectors = rx.await.map_err(|_| unavailable("the embedding thread stopped"))?;
    let data: Vec<Value> = vectors
        .chunks_exact(e.dim)
        .take(n)
        .enumerate()
        .map(|(i, v)| {
            let embedding = if req.base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(json!({"object": "list", "data": data, "model": e.name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(input: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({"input": input})).unwrap()
    }

    /// OpenAI's limit, at its edge: 2048 inputs are one request, 2049 a 400 naming both counts;
    /// lists of strings and of token lists alike.
    #[test]
    fn at_most_max_inputs_at_its_edge() {
        for item in [json!("a"), json!([1, 2])] {
            let at = parse(&body(Value::Array(vec![item.clone(); MAX_INPUTS])), 8).map(|r| r.input.len());
            assert_eq!(at.ok(), Some(MAX_INPUTS), "{item}");
            let Err(e) = parse(&body(Value::Array(vec![item.clone(); MAX_INPUTS + 1])), 8) else {
                panic!("{} inputs of {item} accepted", MAX_INPUTS + 1)
            };
            assert_eq!((e.status, e.param.as_deref()), (400, Some("input")));
            assert!(e.message.contains("2049 items") && e.message.contains("2048"), "{}", e.message);
        }
    }

    /// Each accepted form read as what it is, and the malformed ones refused naming `input` /
    /// `user`.
    #[test]
    fn every_form_of_input_and_user() {
        let kinds = |v: Value| {
            parse(&serde_json::to_vec(&v).unwrap(), 8).map(|r| {
                r.input
                    .iter()
                    .map(|i| match i {
                        Input::Text(t) => format!("text {t}"),
                        Input::Ids(ids) => format!("ids {ids:?}"),
                    })
                    .collect::<Vec<_>>()
            })
        };
        assert_eq!(kinds(json!({"input": "hi"})).ok().unwrap(), ["text hi"]);
        assert_eq!(kinds(json!({"input": ["a", "b"]})).ok().unwrap(), ["text a", "text b"]);
        assert_eq!(kinds(json!({"input": [1, 2, 3]})).ok().unwrap(), ["ids [1, 2, 3]"]);
        assert_eq!(kinds(json!({"input": [[1], [2, 3]]})).ok().unwrap(), ["ids [1]", "ids [2, 3]"]);
        assert_eq!(kinds(json!({"input": "hi", "user": "alice"})).ok().unwrap(), ["text hi"]);
        for (bad, param) in [
            (json!({"input": [[1], []]}), "input"),
            (json!({"input": [1, "a"]}), "input"),
            (json!({"input": ["a", 1]}), "input"),
            (json!({"input": [[1], 2]}), "input"),
            (json!({"input": [-1]}), "input"),
            (json!({"input": "hi", "user": 5}), "user"),
        ] {
            let Err(e) = kinds(bad.clone()) else { panic!("{bad} accepted") };
            assert_eq!((e.status, e.param.as_deref()), (400, Some(param)), "{bad}: {}", e.message);
        }
    }
}
