//! `/v1/chat/completions`: a conversation parsed (`request::chat`), rendered by the model's own
//! chat template (`chat_template`), tokenized as it stands (the template writes the special
//! tokens), and answered by the same admission, engine and streaming as completions, in the
//! chat shape, ending at the template's end of turn. With tools: rendered as the template takes
//! them (or the generic fallback), required calls constrained, calls read back out.

use super::app::{error, App};
use super::completions::{respond, serving};
use crate::request::shape::Kind;
use crate::request::{chat, tools};
use crate::request::{ApiError, Completion, Prompt};
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
    let chat = chat::parse(body)?;
    let l = serving(app)?;
    let template = l.chat.as_ref().map_err(|why| ApiError::bad("messages", why.to_string()))?;
    let tok = l.tokenizer.as_ref().expect("a chat template comes with its tokenizer");
    let mut req = chat.completion;
    let text = match &chat.tools {
        // (a conversation may still hold calls and results when no tools are offered now)
        None => template.render(&chat.messages, chat.add_generation_prompt, &chat.template_kwargs),
        Some(t) => {
            let syntax = tools::syntax_of(template.takes_tools(), |s| template.mentions(s));
            if t.choice != tools::Choice::None {
                req.tool_calls = Some((syntax, tools::names(t)));
                req.constraint = tools::grammar(t, syntax).map(crate::constraint::Spec::Lark);
            }
            match syntax {
                tools::Syntax::Generic => {
                    let messages = tools::generic_messages(&chat.messages, t);
                    template.render(&messages, chat.add_generation_prompt, &chat.template_kwargs)
                }
                _ => template.render_with_tools(
                    &chat.messages,
                    Some(&t.list),
                    chat.add_generation_prompt,
                    &chat.template_kwargs,
                ),
            }
        }
    }
    .map_err(|e| ApiError::bad("messages", e))?;
    let ids = tok.encode_plain(&text).map_err(|e| ApiError::bad("messages", e.to_string()))?;
    req.prompts = vec![Prompt::Ids(ids)];
    Ok(req)
}
