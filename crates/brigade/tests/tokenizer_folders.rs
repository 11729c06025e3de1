//! Hugging Face tokenizer folders (../shared/tokenizers: real Llama 3, Qwen2.5 and GPT-2
//! tokenizers): the special tokens come from `tokenizer_config.json`, and a text's ids are what
//! `transformers` gives by default (`add_special_tokens=True`): Llama 3 puts `<|begin_of_text|>`
//! first, Qwen2 and GPT-2 add nothing. The reference is the `tokenizers` crate running the
//! folder's own post-processor. Skips with a message when ../shared is absent.

use brigade::models::tokenizer::Tokenizer;

mod common;
use common::shared;

const TEXT: &str = "Hello world! 12345 bottles, naïve café — 日本語.";

#[test]
fn folders_carry_their_special_tokens_and_bos_handling() {
    for (name, bos, eos, adds) in [
        ("llama3", Some("<|begin_of_text|>"), Some("<|eot_id|>"), true),
        ("qwen2", None, Some("<|im_end|>"), false),
        ("gpt2", Some("<|endoftext|>"), Some("<|endoftext|>"), false),
    ] {
        let Some(dir) = shared(&format!("tokenizers/{name}")) else { return };
        let reference = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
        let id = |t: Option<&str>| t.map(|t| reference.token_to_id(t).unwrap());
        // the folder, and its tokenizer.json (whose tokenizer_config.json is beside it)
        for path in [dir.clone(), dir.join("tokenizer.json")] {
            let tok = Tokenizer::from_file(&path).unwrap();
            let sp = tok.specials();
            assert_eq!((sp.bos, sp.eos, sp.add_bos), (id(bos), id(eos), adds), "{name} {path:?}");
            let want = reference.encode(TEXT, true).unwrap().get_ids().to_vec();
            let got = tok.encode(TEXT).unwrap();
            assert_eq!(got, want, "{name}: ids as transformers encodes by default");
            assert_eq!(got.first() == id(bos).as_ref() && adds, adds, "{name}: BOS first iff it adds one");
            let body = if adds { &got[1..] } else { &got[..] };
            assert_eq!(tok.decode(body), TEXT, "{name}: decodes back");
        }
    }
}

#[test]
fn a_folder_without_tokenizer_json_is_refused_with_one_line() {
    let d = tempfile::tempdir().unwrap();
    let Err(e) = Tokenizer::from_file(d.path()) else { panic!("an empty folder was accepted") };
    let e = e.to_string();
    assert!(e.contains("holds no tokenizer.json") && !e.contains('\n'), "{e}");
}

/// The published Instruct models' `tokenizer_config.json` (tests/fixtures/hub_configs/published)
/// beside the real tokenizer they go with: the special tokens it names, and BOS as it
/// configures it — Llama 3.x's post-processor adds `<|begin_of_text|>` (no `add_bos_token`),
/// Qwen2.5 says `add_bos_token: false` and has no BOS, SmolLM2's BOS `<|im_start|>` is not added,
/// Mistral's `add_bos_token: true` adds `<s>` (a word-level stand-in for its SentencePiece
/// vocabulary, with its three special ids). Each flipped the other way flips BOS.
#[test]
fn published_tokenizer_configs_set_specials_and_bos() {
    let published = std::path::Path::new("tests/fixtures/hub_configs/published");
    let smollm2 = std::env::var_os("BRIGADE_SMOLLM2").map(|d| std::path::PathBuf::from(d).join("hf/tokenizer.json"));
    let mistral = tempfile::tempdir().unwrap();
    let mistral_tok = mistral.path().join("tokenizer.json");
    std::fs::write(&mistral_tok, MISTRAL_STAND_IN).unwrap();
    let Some(llama3) = shared("tokenizers/llama3") else { return };
    let Some(qwen2) = shared("tokenizers/qwen2") else { return };
    // (model, its tokenizer.json, BOS, EOS, whether BOS is added)
    type Case<'a> = (&'a str, Option<std::path::PathBuf>, Option<u32>, u32, bool);
    let cases: Vec<Case> = vec![
        ("Llama-3.1-8B-Instruct", Some(llama3.join("tokenizer.json")), Some(128000), 128009, true),
        ("Llama-3.2-1B-Instruct", Some(llama3.join("tokenizer.json")), Some(128000), 128009, true),
        ("Qwen2.5-0.5B-Instruct", Some(qwen2.join("tokenizer.json")), None, 151645, false),
        ("SmolLM2-135M-Instruct", smollm2, Some(1), 2, false),
        ("Mistral-7B-Instruct-v0.3", Some(mistral_tok), Some(1), 2, true),
    ];
    for (name, tok, bos, eos, adds) in cases {
        let Some(tok) = tok else {
            eprintln!("{name}: skipped, set BRIGADE_SMOLLM2 to the folder get.sh --hf filled (.ci/run does)");
            continue;
        };
        let config = published.join(name).join("tokenizer_config.json");
        for flip in [false, true] {
            let d = tempfile::tempdir().unwrap();
            std::fs::copy(&tok, d.path().join("tokenizer.json")).unwrap();
            let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
            if flip {
                v["add_bos_token"] = (!adds).into();
            }
            std::fs::write(d.path().join("tokenizer_config.json"), v.to_string()).unwrap();
            let t = Tokenizer::from_file(d.path()).unwrap_or_else(|e| panic!("{name}: {e}"));
            let sp = t.specials();
            let adds = adds != flip;
            assert_eq!((sp.bos, sp.eos, sp.add_bos), (bos, Some(eos), adds && bos.is_some()), "{name} flipped {flip}");
            let ids = t.encode("hello world").unwrap();
            assert_eq!(
                ids.first().copied() == bos && bos.is_some(),
                adds && bos.is_some(),
                "{name} flipped {flip}: {ids:?}"
            );
            assert_eq!(t.encode_document("hello world").unwrap().last(), Some(&eos), "{name}: a document ends in EOS");
        }
    }
}

/// Mistral's three special tokens at its ids (`<unk>` 0, `<s>` 1, `</s>` 2) and two words: its
/// tokenizer_config.json decides BOS, as transformers' LlamaTokenizerFast does.
const MISTRAL_STAND_IN: &str = r#"{"version": "1.0", "truncation": null, "padding": null,
 "added_tokens": [
  {"id": 0, "content": "<unk>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
  {"id": 1, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
  {"id": 2, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
 "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
 "model": {"type": "WordLevel", "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "hello": 3, "world": 4}, "unk_token": "<unk>"}}"#;

/// Each token's byte range (what the chat fine-tuning mask cuts by): the ids without special
/// tokens, one range per id, in order, ranges that tile the text as the `tokenizers` crate's
/// offsets give them; and the byte tokenizer's one byte each.
#[test]
fn token_offsets_are_the_tokenizers() {
    let (ids, spans) = Tokenizer::Bytes.encode_plain_offsets("hé!").unwrap();
    assert_eq!((ids, spans), (vec![104, 195, 169, 33], vec![(0, 1), (1, 2), (2, 3), (3, 4)]));
    for name in ["llama3", "qwen2", "gpt2"] {
        let Some(dir) = shared(&format!("tokenizers/{name}")) else { return };
        let reference = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
        let want = reference.encode(TEXT, false).unwrap();
        let tok = Tokenizer::from_file(&dir).unwrap();
        let (ids, spans) = tok.encode_plain_offsets(TEXT).unwrap();
        assert_eq!(ids, want.get_ids(), "{name}");
        assert_eq!(spans, want.get_offsets(), "{name}");
        assert_eq!(ids, tok.encode_plain(TEXT).unwrap(), "{name}");
        assert!(spans.len() > 10 && spans.last().unwrap().1 == TEXT.len(), "{name}: {spans:?}");
    }
}
