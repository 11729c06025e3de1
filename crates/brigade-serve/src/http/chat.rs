//! `/v1/chat/completions`: a conversation parsed (`request::chat`), rendered by the model's own
//! chat template (`chat_template`), tokenized as it stands (the template writes the special
//! tokens), and answered by the same admission, engine and streaming as completions, in the
//! chat shape, ending at the template's end of turn. With tools: rendered as the template takes
//! them (or the generic fallback), required calls constrained, calls read back out.

use super::app::{error, App};
use super::completions::{respond, serving};
use crate::request::chat;
use crate::request::shape::{chat_prompt, Kind};
use crate::request::{ApiError, Completion};
use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use std::sync::Arc;
use std::time::Instant;

pub(crate) async fn chat_completions(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let started = Instant::now();
    let r = match prepare(&app, &body) {
        Ok(req) => respond(app.clone(), req, Kind::Chat, started).await,
        Err(e) => error(e),
    };
    app.metrics.count_status(r.status().as_u16());
    r
}

/// The request as a completion of the rendered conversation's token ids.
fn prepare(app: &App, body: &[u8]) -> Result<Completion, ApiError> {
    let chat = chat::parse_with(body, &super::completions::defaults(app))?;
    chat_prompt(serving(app)?, chat)
}
