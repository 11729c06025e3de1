//! A `/v1/completions` body: parsed and checked, never a panic; when it parses, its prompt's
//! bytes go through the incremental detokenizer with its stop strings (slicing at character
//! boundaries, held-back stop prefixes), and the pieces must add up to the final text.
#![no_main]

use brigade::train::data::Tokenizer;
use brigade_serve::api::{parse, Prompt};
use brigade_serve::text::Detok;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(req) = parse(data) else { return };
    let tok = Tokenizer::Bytes;
    for p in &req.prompts {
        let ids: Vec<u32> = match p {
            Prompt::Text(t) => t.bytes().map(u32::from).collect(),
            Prompt::Ids(ids) => ids.iter().map(|&i| i % 256).collect(),
        };
        let mut d = Detok::new(Some(&tok), &req.stop);
        let mut text = String::new();
        for &id in &ids {
            text.push_str(&d.push(id));
        }
        text.push_str(&d.finish());
        let whole = tok.decode(&ids);
        if !d.stopped {
            assert_eq!(text, whole);
        } else {
            assert!(whole.starts_with(&text));
            assert!(req.stop.iter().any(|s| whole[text.len()..].starts_with(s.as_str())));
        }
    }
});
