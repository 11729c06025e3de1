//! The grammars tool calls are held to (llguidance over the real Qwen2.5 and Llama 3
//! tokenizers): each text is fed token by token as the tokenizer cuts it, and must be allowed
//! at every step and complete at its end — or be stopped at some token. `required`: only calls,
//! each one of the functions with arguments its schema allows; `auto`: free text, or text and
//! then calls that parse — a call that strays from its schema is stopped where it strays;
//! `parallel_tool_calls: false`: one call.

mod common;

use brigade::models::tokenizer::Tokenizer;
use brigade_serve::constraint::{Grammars, Spec};
use brigade_serve::request::tools::{self, Syntax};
use serde_json::json;

fn tools(choice: serde_json::Value, parallel: bool) -> tools::Tools {
    let weather = json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"], "additionalProperties": false}}});
    let time = json!({"type": "function", "function": {"name": "get-time", "parameters": {"type": "object",
        "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}});
    tools::parse(Some(&json!([weather, time])), Some(&choice), Some(&json!(parallel))).unwrap().unwrap()
}

/// Whether the grammar lets the tokenizer's tokens of `text` through, one by one, and is complete
/// after them.
fn allows(g: &Grammars, tok: &Tokenizer, grammar: &str, text: &str) -> bool {
    let mut c = g.constraint(&Spec::Lark(grammar.to_string())).unwrap();
    for id in tok.encode_plain(text).unwrap() {
        let mut row = vec![0f32; tok.vocab_size()];
        if !c.mask(&mut row) || row[id as usize] == f32::NEG_INFINITY {
            return false;
        }
        c.commit(id);
    }
    c.satisfied()
}

fn load(name: &str) -> Option<(Tokenizer, Grammars)> {
    let dir = common::shared(&format!("tokenizers/{name}"))?;
    let tok = Tokenizer::from_file(&dir).unwrap();
    let eos: Vec<u32> = tok.specials().eos.into_iter().collect();
    let g = Grammars::load(&dir.join("tokenizer.json"), tok.vocab_size(), &eos).unwrap();
    Some((tok, g))
}

#[test]
fn hermes_calls_parse_in_every_mode() {
    let Some((tok, g)) = load("qwen2") else { return };
    let call =
        |name: &str, args: &str| format!("<tool_call>\n{{\"name\": \"{name}\", \"arguments\": {args}}}\n</tool_call>");
    let w = call("get_weather", r#"{"city": "Paris", "days": 2}"#);
    let t = call("get-time", r#"{"zone": "UTC"}"#);
    let required = tools::grammar(&tools(json!("required"), true), Syntax::Hermes).unwrap();
    assert!(allows(&g, &tok, &required, &w));
    assert!(allows(&g, &tok, &required, &format!("{w}\n{t}")), "parallel calls");
    assert!(!allows(&g, &tok, &required, "Sure! "), "required: no text");
    assert!(!allows(&g, &tok, &required, &call("get_weather", r#"{"town": "Paris"}"#)), "an argument the schema lacks");
    assert!(!allows(&g, &tok, &required, &call("get_weather", r#"{"city": 5}"#)), "a number for a string");
    assert!(!allows(&g, &tok, &required, &call("rm_rf", r#"{}"#)), "an unknown function");
    // get-time's schema does not say additionalProperties: a call still takes only what it declares
    assert!(allows(&g, &tok, &required, &call("get-time", r#"{"zone": "UTC"}"#)));
    assert!(
        !allows(&g, &tok, &required, &call("get-time", r#"{"zone": "UTC", "format": "24h"}"#)),
        "an argument get-time does not declare"
    );
    assert!(!allows(&g, &tok, &required, &call("get_weather", r#"{ "city":"Paris"}"#)), "free whitespace");
    let one = tools::grammar(&tools(json!("required"), false), Syntax::Hermes).unwrap();
    assert!(allows(&g, &tok, &one, &w) && !allows(&g, &tok, &one, &format!("{w}\n{t}")), "one call without parallel");
    let named =
        tools::grammar(&tools(json!({"type": "function", "function": {"name": "get-time"}}), true), Syntax::Hermes)
            .unwrap();
    assert!(allows(&g, &tok, &named, &t) && !allows(&g, &tok, &named, &w), "the named function only");
    let auto = tools::grammar(&tools(json!("auto"), true), Syntax::Hermes).unwrap();
    assert!(allows(&g, &tok, &auto, "It is sunny in Paris, I think."), "auto: free text");
    assert!(allows(&g, &tok, &auto, &format!("Let me look.\n{w}\n{t}")), "auto: text, then calls");
    assert!(allows(&g, &tok, &auto, &w), "auto: a call at once");
    assert!(
        !allows(&g, &tok, &auto, &format!("Let me look.\n{}", call("get_weather", r#"{"city": 5}"#))),
        "auto: a stray call"
    );
    assert!(!allows(&g, &tok, &auto, "<tool_call>\nnot json"), "auto: a call that is not JSON");
    assert!(tools::grammar(&tools(json!("none"), true), Syntax::Hermes).is_none());
}

#[test]
fn llama3_and_generic_calls_parse() {
    let Some((tok, g)) = load("llama3") else { return };
    let w = r#"{"name": "get_weather", "parameters": {"city": "Paris"}}"#;
    let required = tools::grammar(&tools(json!("required"), true), Syntax::Llama3).unwrap();
    assert!(allows(&g, &tok, &required, w));
    assert!(
        !allows(&g, &tok, &required, r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#),
        "Llama's key is parameters"
    );
    let auto = tools::grammar(&tools(json!("auto"), true), Syntax::Llama3).unwrap();
    assert!(allows(&g, &tok, &auto, "Paris is sunny.") && allows(&g, &tok, &auto, w));
    assert!(!allows(&g, &tok, &auto, r#"{"name": "get_weather", "parameters": {"city": 1}}"#), "auto: a stray call");
    let generic = tools::grammar(&tools(json!("auto"), false), Syntax::Generic).unwrap();
    assert!(allows(&g, &tok, &generic, r#"{"tool_calls": [{"name": "get-time", "arguments": {"zone": "UTC"}}]}"#));
    assert!(allows(&g, &tok, &generic, r#"{"response": "It is noon."}"#));
    assert!(
        !allows(
            &g,
            &tok,
            &generic,
            r#"{"tool_calls": [{"name": "get-time", "arguments": {"zone": "UTC"}}, {"name": "get-time", "arguments": {"zone": "CET"}}]}"#
        ),
        "one call without parallel"
    );
    assert!(!allows(&g, &tok, &generic, "It is noon."), "generic: JSON only");
}

#[test]
fn constraints_of_one_compiled_grammar_keep_their_own_state() {
    let Some((tok, g)) = load("qwen2") else { return };
    let grammar = tools::grammar(&tools(json!("required"), false), Syntax::Hermes).unwrap();
    let w = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    // a first sequence walks a whole call; the next ones (from the cached parser) start afresh
    let mut first = g.constraint(&Spec::Lark(grammar.clone())).unwrap();
    for id in tok.encode_plain(w).unwrap() {
        first.commit(id);
    }
    assert!(first.satisfied());
    let mut second = g.constraint(&Spec::Lark(grammar.clone())).unwrap();
    assert!(!second.satisfied(), "a fresh constraint has emitted nothing yet");
    let mut row = vec![0f32; tok.vocab_size()];
    assert!(second.mask(&mut row));
    let lt = tok.encode_plain("<tool_call>").unwrap()[0] as usize;
    assert!(row[lt].is_finite(), "the second starts at the beginning of a call");
    for _ in 0..3 {
        assert!(allows(&g, &tok, &grammar, w), "every copy accepts the whole call");
    }
}

/// Compiled grammars are kept and reused — a spec seen before starts from its compiled copy —
/// up to 64 of them; the 65th starts the cache over, so the first must then compile again.
#[test]
fn up_to_64_compiled_grammars_are_kept() {
    let Some(dir) = common::shared("tokenizers/gpt2") else { return };
    let tok = Tokenizer::from_file(&dir).unwrap();
    let c = brigade_serve::metrics::GrammarCounters::default();
    let g = Grammars::load(&dir.join("tokenizer.json"), tok.vocab_size(), &[]).unwrap().counted(c.clone());
    let spec = |i: usize| Spec::Regex(format!("x{i}[a-z]*"));
    let counts = || (c.compiles.get(), c.cache_hits.get());
    g.constraint(&spec(0)).unwrap();
    g.constraint(&spec(1)).unwrap();
    g.constraint(&spec(0)).unwrap();
    assert_eq!(counts(), (2, 1), "the first spec again is a hit");
    for i in 2..64 {
        g.constraint(&spec(i)).unwrap();
    }
    g.constraint(&spec(0)).unwrap();
    g.constraint(&spec(63)).unwrap();
    assert_eq!(counts(), (64, 3), "64 kept");
    g.constraint(&spec(64)).unwrap();
    g.constraint(&spec(0)).unwrap();
    assert_eq!(counts(), (66, 3), "the 65th starts the cache over");
}

/// The model's end-of-sequence ids are what a finished constraint allows — not the tokenizer's
/// own (GPT-2's 50256): here an ordinary token, 13 ('.'), stands as the model's EOS.
#[test]
fn a_finished_constraint_allows_only_the_models_eos() {
    let Some(dir) = common::shared("tokenizers/gpt2") else { return };
    let tok = Tokenizer::from_file(&dir).unwrap();
    for eos in [vec![13u32], vec![]] {
        let g = Grammars::load(&dir.join("tokenizer.json"), tok.vocab_size(), &eos).unwrap();
        let mut c = g.constraint(&Spec::Regex("ab".into())).unwrap();
        for id in tok.encode_plain("ab").unwrap() {
            c.commit(id);
        }
        let mut row = vec![0f32; tok.vocab_size()];
        assert!(c.mask(&mut row));
        let allowed: Vec<u32> = (0..row.len() as u32).filter(|&t| row[t as usize] == 0.0).collect();
        let want = if eos.is_empty() { vec![50256] } else { eos };
        assert_eq!(allowed, want);
    }
}
