//! Structured outputs: a sequence's tokens constrained to a JSON schema, a regex or a list of
//! choices, enforced at each decoding step by masking every token that would leave the
//! language — by `llguidance` (the engine llama.cpp and vLLM use) over a token trie of the
//! served tokenizer (`toktrie_hf_tokenizers`). The mask depends only on the sequence's own
//! tokens, so constrained outputs stay batch-invariant.

use crate::engine::Constrain;
use crate::metrics::GrammarCounters;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;

/// What a request constrains its output to.
#[derive(Clone, Debug, PartialEq)]
pub enum Spec {
    /// `response_format: {"type": "json_schema", "json_schema": {"schema": S}}`, or vLLM's
    /// `guided_json`.
    JsonSchema(Value),
    /// `response_format: {"type": "json_object"}`: any JSON object.
    JsonObject,
    /// vLLM's `guided_regex`.
    Regex(String),
    /// vLLM's `guided_choice`: exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark (a chat request's required tool calls).
    Lark(String),
}

impl Spec {
    fn grammar(&self) -> TopLevelGrammar {
        // JSON as Python's `json.dumps` writes it (", " and ": ", no other whitespace), unless
        // the schema sets llguidance's own options
        let compact = |mut s: Value| {
            if let Some(o) = s.as_object_mut() {
                o.entry("x-guidance").or_insert_with(
                    || serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
                );
            }
            TopLevelGrammar::from_json_schema(s)
        };
        match self {
            Spec::JsonSchema(s) => compact(s.clone()),
            Spec::JsonObject => compact(serde_json::json!({"type": "object"})),
            Spec::Regex(r) => TopLevelGrammar::from_regex(r),
            Spec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
            Spec::Choice(c) => {
                let alts: Vec<String> = c.iter().map(|s| regex_escape(s)).collect();
                TopLevelGrammar::from_regex(&format!("({})", alts.join("|")))
            }
        }
    }
}

fn regex_escape(s: &str) -> String {
    let mut out = String::new();
    for ch in s.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(ch) {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

/// Why a model cannot take structured outputs, or a constraint does not compile.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConstraintError {
    /// No token trie for this model: no `tokenizer.json`, or one it could not read.
    #[error("{0}")]
    Unavailable(String),
    #[error("the constraint does not compile: {0}")]
    Compile(String),
}

/// The served tokenizer's token trie and a parser factory over it (built once, shared), and the
/// grammars compiled so far: a request with the same constraint (the same tools, the same
/// schema) starts from a copy of the compiled parser instead of compiling it again.
pub struct Grammars {
    factory: Arc<ParserFactory>,
    compiled: std::sync::Mutex<std::collections::HashMap<String, llguidance::TokenParser>>,
    counters: GrammarCounters,
}

/// Compiled grammars kept (the oldest are not tracked: past this many, the cache starts over).
const KEPT: usize = 64;

impl Grammars {
    /// From the model's `tokenizer.json`, for a vocabulary of `vocab` (the model's: tokens past
    /// the tokenizer's are never allowed) ending generation with `eos`.
    pub fn load(tokenizer: &Path, vocab: usize, eos: &[u32]) -> Result<Grammars, ConstraintError> {
        let unavailable = |e: &dyn std::fmt::Display| ConstraintError::Unavailable(e.to_string());
        let mut bt = toktrie_hf_tokenizers::ByteTokenizer::from_file(tokenizer).map_err(|e| unavailable(&e))?;
        if !eos.is_empty() {
            bt.set_eos_tokens(eos);
        }
        let env = bt.into_tok_env(Some(vocab)).map_err(|e| unavailable(&e))?;
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| unavailable(&e))?;
        factory.set_stderr_log_level(0);
        Ok(Grammars { factory: Arc::new(factory), compiled: Default::default(), counters: Default::default() })
    }

    /// Counts compiles, their time and cache hits in `c` (the server's metrics).
    pub fn counted(mut self, c: GrammarCounters) -> Grammars {
        self.counters = c;
        self
    }

    /// A fresh constraint for one sequence; a spec that does not compile is an error naming why.
    pub fn constraint(&self, spec: &Spec) -> Result<Box<dyn Constrain>, ConstraintError> {
        let key = format!("{spec:?}");
        let cached = self.compiled.lock().unwrap_or_else(|p| p.into_inner()).get(&key).map(|p| p.deep_clone());
        let parser = match cached {
            Some(p) => {
                self.counters.cache_hits.inc();
                p
            }
            None => {
                let t0 = std::time::Instant::now();
                let p =
                    self.factory.create_parser(spec.grammar()).map_err(|e| ConstraintError::Compile(e.to_string()))?;
                self.counters.compiles.inc();
                self.counters.compile_seconds.inc_by(t0.elapsed().as_secs_f64());
                let mut c = self.compiled.lock().unwrap_or_else(|p| p.into_inner());
                if c.len() >= KEPT {
                    c.clear();
                }
                c.insert(key, p.deep_clone());
                p
            }
        };
        Ok(Box::new(Guided { m: Matcher::new(Ok(parser)) }))
    }
}

struct Guided {
    m: Matcher,
}

impl Constrain for Guided {
    fn mask(&mut self, row: &mut [f32]) -> bool {
        let Ok(mask) = self.m.compute_mask_or_eos() else { return false };
        let mut any = false;
        for (t, v) in row.iter_mut().enumerate() {
            if mask.is_allowed(t as u32) {
                any = true;
            } else {
                *v = f32::NEG_INFINITY;
            }
        }
        any
    }

    fn commit(&mut self, token: u32) -> bool {
        if self.m.is_stopped() {
            return true;
        }
        if self.m.consume_token(token).is_err() {
            return true;
        }
        self.m.is_stopped()
    }

    fn satisfied(&mut self) -> bool {
        self.m.is_stopped() || self.m.is_accepting().unwrap_or(false)
    }
}
