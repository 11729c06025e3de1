//! The models' own chat templates through minijinja against `transformers`'
//! `apply_chat_template` (fixture made by scripts/make_chat_fixture.py with the real Llama 3
//! and Qwen2 tokenizer folders of ../shared/tokenizers): the same conversations give the same
//! text and the same token ids, with tools too (one tool, two, an assistant's calls, tool results,
//! a follow-up, parallel calls); the end of turn is the template's own token; a template that
//! raises, or one that does not parse, is an error of one line.

mod common;

use brigade::models::chat_template::ChatTemplate;
use brigade::models::tokenizer::Tokenizer;
use serde_json::{Map, Value};
use std::path::Path;

fn cases() -> Vec<Value> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_templates.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn template(name: &str) -> Option<(Tokenizer, ChatTemplate)> {
    let dir = common::shared(&format!("tokenizers/{name}"))?;
    let tok = Tokenizer::from_file(&dir).unwrap();
    let eos: Vec<u32> = tok.specials().eos.into_iter().collect();
    let t = ChatTemplate::load(&tok, &eos).unwrap().expect("the folder has a chat template");
    Some((tok, t))
}

#[test]
fn renders_and_tokenizes_as_transformers_does() {
    let cases = cases();
    let mut checked = 0;
    for name in ["llama3", "qwen2"] {
        let Some((tok, t)) = template(name) else { return };
        for c in cases.iter().filter(|c| c["tokenizer"] == name) {
            let gen = c["add_generation_prompt"].as_bool().unwrap();
            let text = t.render_with_tools(&c["messages"], c.get("tools"), gen, &Map::new()).unwrap();
            assert_eq!(text, c["text"].as_str().unwrap(), "{name}: {}", c["messages"]);
            let ids: Vec<u32> = c["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
            assert_eq!(tok.encode_plain(&text).unwrap(), ids, "{name}: ids of {}", c["messages"]);
            checked += 1;
        }
    }
    assert_eq!(checked, 17, "every fixture case was checked");
}

#[test]
fn the_turn_ends_at_the_templates_own_token() {
    for (name, end) in [("llama3", "<|eot_id|>"), ("qwen2", "<|im_end|>")] {
        let Some((tok, t)) = template(name) else { return };
        let Tokenizer::Hf(hf, ..) = &tok else { unreachable!() };
        let id = hf.token_to_id(end).unwrap();
        assert!(t.end_of_turn.contains(&id), "{name}: {end} ends a turn");
        // with an EOS that is not the turn's end: the EOS, then each end-of-turn token the
        // template writes, once each (this Llama 3 tokenizer has no <|eom_id|>, which its
        // template names)
        let of = |s: &str| hf.token_to_id(s).unwrap();
        let (eos, want) = match name {
            "llama3" => (of("<|end_of_text|>"), vec![of("<|end_of_text|>"), of("<|eot_id|>")]),
            _ => (of("<|endoftext|>"), vec![of("<|endoftext|>"), of("<|im_end|>")]),
        };
        assert_eq!(ChatTemplate::load(&tok, &[eos]).unwrap().unwrap().end_of_turn, want, "{name}");
        let mut once = want[1..].to_vec();
        once.dedup();
        assert_eq!(ChatTemplate::load(&tok, &[id]).unwrap().unwrap().end_of_turn, once, "{name}: no id twice");
        assert!(t.takes_tools(), "{name}'s template takes tools");
    }
}

#[test]
fn template_errors_are_one_line() {
    let d = tempfile::tempdir().unwrap();
    let Some(src) = common::shared("tokenizers/qwen2") else { return };
    std::fs::copy(src.join("tokenizer.json"), d.path().join("tokenizer.json")).unwrap();
    // a template that raises (as templates refuse what they cannot render)
    std::fs::write(
        d.path().join("chat_template.jinja"),
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversations must start with a user turn') }}{% endif %}{{ messages[0]['content'].strip() }}",
    )
    .unwrap();
    let tok = Tokenizer::from_file(d.path()).unwrap();
    let t = ChatTemplate::load(&tok, &[]).unwrap().unwrap();
    let ok = t.render(&serde_json::json!([{"role": "user", "content": "  hi  "}]), true, &Map::new()).unwrap();
    assert_eq!(ok, "hi", "Python's str.strip through pycompat");
    let e =
        t.render(&serde_json::json!([{"role": "system", "content": "x"}]), true, &Map::new()).unwrap_err().to_string();
    assert!(e.contains("Conversations must start with a user turn") && !e.contains('\n'), "{e}");
    // one that does not parse
    std::fs::write(d.path().join("chat_template.jinja"), "{% for m in messages %}{{ m.content }}").unwrap();
    let e = ChatTemplate::load(&tok, &[]).err().expect("refused").to_string();
    assert!(e.contains("does not parse") && e.contains("chat_template.jinja") && !e.contains('\n'), "{e}");
    // one that takes no tools (tools then go through the generic fallback)
    std::fs::write(d.path().join("chat_template.jinja"), "{% for m in messages %}{{ m.content }}{% endfor %}").unwrap();
    assert!(!ChatTemplate::load(&tok, &[]).unwrap().unwrap().takes_tools());
    // none at all
    std::fs::remove_file(d.path().join("chat_template.jinja")).unwrap();
    assert!(ChatTemplate::load(&tok, &[]).unwrap().is_none());
}
