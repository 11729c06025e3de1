//! The choices of one request as the engine's tokens arrive: each choice's text (through
//! its detokenizer and stop strings), its tokens, its finish reason and log-probabilities, in
//! the shape of either API; latency metrics as tokens come. Shared by the HTTP handlers and
//! the program runner.

use super::completion::Completion;
use super::shape::{Kind, Prompted};
use super::text::{token_text, Detok};
use crate::engine::{Finish, Output};
use crate::metrics::Metrics;
use crate::startup::Loaded;
use serde_json::{json, Value};
use std::time::Instant;

/// A generated token, its log-probability, and its alternatives with theirs.
type TokenLogprobs = (u32, f32, Vec<(u32, f32)>);

/// One choice being generated.
pub(crate) struct Choice<'a> {
    pub(crate) detok: Detok<'a>,
    pub(crate) tokens: Vec<u32>,
    pub(crate) finish: Option<&'static str>,
    /// Each generated token's log-probability and its alternatives (when asked for).
    pub(crate) lp: Vec<TokenLogprobs>,
    /// Where each of those tokens' text starts, in characters (OpenAI's `text_offset`), and
    /// where the next one's will.
    lp_offsets: Vec<usize>,
    offset: usize,
    last: Option<Instant>,
}

/// The choices of one request (sequence ids `base..`), as their tokens arrive.
pub(crate) struct Choices<'a> {
    pub(crate) list: Vec<Choice<'a>>,
    /// Choices not finished yet.
    pub(crate) open: usize,
    pub(crate) base: u64,
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
    pub(crate) fn logprobs(&self, i: usize, from: usize) -> Value {
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
    pub(crate) fn usage(&self, prompts: &[Prompted]) -> Value {
        let completion_tokens: usize = self.list.iter().map(|c| c.tokens.len()).sum();
        let prompt_tokens: usize = prompts.iter().map(|p| p.ids.len()).sum();
        json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens})
    }
}
