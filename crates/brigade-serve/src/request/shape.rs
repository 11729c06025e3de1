//! A request shaped for the engine, however it came (`/v1/completions`, the chat API, a
//! program's node): its prompts as checked token ids, how many tokens each may generate, and
//! how each choice is sampled. No transport here: the HTTP handlers and the program runner
//! both call it, so a program's node is sampled exactly as the same completions request.

use super::chat::Chat;
use super::completion::{Completion, Prompt};
use super::error::ApiError;
use super::tools;
use crate::engine::Sampling;
use crate::startup::Loaded;

/// Which API a request came through: it sets the response's shape and the tokens that end
/// a sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `/v1/completions`: text, ended by the model's EOS.
    Text,
    /// `/v1/chat/completions`: an assistant message, ended by the template's end of turn.
    Chat,
}

/// A prompt as tokens, and how many tokens to generate for it (`max_tokens`, or its default).
pub(crate) struct Prompted {
    pub(crate) ids: Vec<u32>,
    pub(crate) max_tokens: usize,
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
    // a default from generation_config.json is cut to what the context leaves, as 16 is
    let given = req.max_tokens;
    let want = given.unwrap_or(l.defaults.max_tokens.unwrap_or(16).min(l.context - ids.len()));
    if ids.len() + want > l.context {
        return Err(ApiError::bad(
            if given.is_some() { "max_tokens" } else { "prompt" },
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

/// How choice `j` of a request is sampled: its settings, its seed (choice j of `seed: S` is
/// seeded `S + j·φ`, so choice j of `n: N` is the same whatever N), and the tokens that end it.
pub(crate) fn sampling(l: &Loaded, req: &Completion, kind: Kind, max_tokens: usize, j: usize) -> Sampling {
    Sampling {
        repetition_penalty: req.repetition_penalty,
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

/// A chat request as a completion of its rendered conversation's token ids: rendered by the
/// model's own chat template (with the tools as it takes them, or the generic fallback),
/// tokenized as it stands (the template writes the special tokens); with tools offered, the
/// call syntax to read calls back and the grammar that makes a call parse.
pub(crate) fn chat_prompt(l: &Loaded, chat: Chat) -> Result<Completion, ApiError> {
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
