//! Conversations to fine-tune on: OpenAI-style `{"messages": [...]}` records, one a line,
//! each rendered with the model's own chat template (the renderer serving uses) and trained
//! with the loss on the assistant's turns only. An assistant turn is the text the template
//! adds between the conversation up to it with the generation prompt, and the conversation
//! through it (what the model is asked to write after the prompt, its end-of-turn token
//! included); the tokens whose text starts there are marked as trained.

use super::corpus::{Corpus, Doc, Documents, Packing};
use super::tokens::Source;
use crate::error::{Error, Result};
use crate::models::chat_template::ChatTemplate;
use crate::models::tokenizer::{Fingerprint, Tokenizer};
use serde_json::{Map, Value};
use std::path::Path;

/// One rendered conversation: its tokens and which are trained on.
pub struct Rendered {
    pub tokens: Vec<u32>,
    pub trained: Vec<bool>,
}

/// Renders `messages` with `template` and marks the assistant's tokens (`what` names the record
/// in errors).
pub fn render(template: &ChatTemplate, tok: &Tokenizer, messages: &Value, what: &str) -> Result<Rendered> {
    let list =
        messages.as_array().ok_or_else(|| Error::Data(format!("{what}: \"messages\" is not a list of messages")))?;
    let none = Map::new();
    let fail = |e: crate::models::chat_template::ChatTemplateError| Error::Data(format!("{what}: {e}"));
    let full = template.render(messages, false, &none).map_err(fail)?;
    let mut spans = Vec::new();
    for (i, m) in list.iter().enumerate() {
        match m.get("role").and_then(Value::as_str) {
            Some("assistant") => {}
            Some(_) => continue,
            None => return Err(Error::Data(format!("{what}: message {i} has no \"role\""))),
        }
        let before = Value::Array(list[..i].to_vec());
        let through = Value::Array(list[..=i].to_vec());
        let prompt = template.render(&before, true, &none).map_err(fail)?;
        let upto = template.render(&through, false, &none).map_err(fail)?;
        if !upto.starts_with(&prompt) || !full.starts_with(&upto) {
            return Err(Error::Data(format!(
                "{what}: the chat template does not write the conversation up to message {i} as the start of the whole, so its assistant turn cannot be found; this template cannot be fine-tuned on"
            )));
        }
        spans.push((prompt.len(), upto.len()));
    }
    if spans.is_empty() {
        return Err(Error::Data(format!("{what}: the conversation has no assistant turn, nothing to train on")));
    }
    let (tokens, offsets) = tok.encode_plain_offsets(&full)?;
    let trained = offsets.iter().map(|&(s, _)| spans.iter().any(|&(a, b)| s >= a && s < b)).collect();
    Ok(Rendered { tokens, trained })
}

/// A JSON Lines file of conversations as a corpus of whole conversations.
pub fn load(path: &Path, tok: &Tokenizer) -> Result<Corpus> {
    let template = ChatTemplate::load(tok, &tok.specials().eos.into_iter().collect::<Vec<_>>())
        .map_err(|e| Error::Data(e.0))?
        .ok_or_else(|| {
            Error::Data(format!(
                "--chat renders conversations with the tokenizer's chat template, and the tokenizer of {} has none; give a tokenizer folder with one (tokenizer_config.json or chat_template.jinja)",
                path.display()
            ))
        })?;
    let bytes = std::fs::read(path).map_err(|e| Error::Data(format!("cannot read {}: {e}", path.display())))?;
    let fingerprint = Fingerprint::of(&bytes);
    let text = String::from_utf8(bytes).map_err(|e| Error::Data(format!("{} is not UTF-8 ({e})", path.display())))?;
    let (mut tokens, mut trained, mut docs) = (Vec::new(), Vec::new(), Documents::default());
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let what = format!("{} line {}", path.display(), i + 1);
        let v: Value = serde_json::from_str(line).map_err(|e| {
            Error::Data(format!("{what} is not valid JSON ({e}); each line is one {{\"messages\": [...]}}"))
        })?;
        let messages = v.get("messages").ok_or_else(|| Error::Data(format!("{what} has no \"messages\" field")))?;
        let r = render(&template, tok, messages, &what)?;
        docs.push([Doc { src: 0, start: tokens.len() as u64, len: r.tokens.len() as u32 }]);
        tokens.extend(r.tokens);
        trained.extend(r.trained);
    }
    let source = Source::Memory { tokens, trained: Some(trained) };
    Corpus::new(path.display().to_string(), vec![source], docs, Packing::Whole, fingerprint)
}
