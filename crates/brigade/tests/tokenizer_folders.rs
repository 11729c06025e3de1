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
