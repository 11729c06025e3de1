//! Published models' files served as the Hub has them (crates/brigade/tests/fixtures/
//! hub_configs/published): every end-of-sequence id of a generation_config.json ends a
//! completion (and, absent the file, the ids only it names do not); its sampling defaults
//! reach the requests that leave them out, each one taking effect, and `--generation-config
//! none` gives OpenAI's. Models with random weights and the real tokenizers in
//! ../shared/tokenizers; and the real SmolLM2-135M-Instruct (`$BRIGADE_SMOLLM2`, as
//! `.ci/run` sets it) ending its turns where transformers' generate() does, without
//! `ignore_eos`, after the prompt its own chat template makes (fixtures/smollm2_chat.json,
//! scripts/make_smollm2_chat_fixture.py).

mod common;

use common::server::{chat_model_with, start};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

fn published(model: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../brigade/tests/fixtures/hub_configs/published").join(model)
}

const WIDTH: usize = 16;

/// A model whose greedy token is always `token`: attention and MLP outputs zeroed (the
/// residual is the token's embedding), every embedding's first coordinate 1, the final norm's
/// weights 1, and an untied head whose only non-zero row is `token`'s, reading that coordinate
/// — its logit is positive, every other one 0.
fn forced(tokenizer: &str, token: usize) -> Option<tempfile::TempDir> {
    chat_model_with(tokenizer, 256, false, |gpt, p| {
        for s in &gpt.layout.specs {
            let v = s.view.of_mut(p);
            if s.name.ends_with("o_proj.weight") || s.name.ends_with("down_proj.weight") {
                v.fill(0.0);
            }
            if s.name == "model.embed_tokens.weight" {
                v.chunks_mut(WIDTH).for_each(|row| row[0] = 1.0);
            }
            if s.name == "model.norm.weight" {
                v.fill(1.0);
            }
            if s.name == "lm_head.weight" {
                v.fill(0.0);
                v[token * WIDTH] = 1.0;
            }
        }
    })
}

/// (finish_reason, completion tokens) of a greedy completion of at most 4 tokens.
async fn finish(s: &common::server::Server, path: &str, extra: Value) -> (String, u64) {
    let mut body = match path {
        "/v1/completions" => json!({"prompt": "Hello", "max_tokens": 4, "temperature": 0}),
        _ => json!({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4, "temperature": 0}),
    };
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    let (st, r) = s.post_to(path, body).await;
    assert_eq!(st, 200, "{r}");
    (r["choices"][0]["finish_reason"].as_str().unwrap().to_string(), r["usage"]["completion_tokens"].as_u64().unwrap())
}

/// Every id of Llama 3.2 Instruct's and Qwen2.5 Instruct's `eos_token_id` list ends a
/// completion and a chat turn after one token (the tokenizer's own EOS is only one of them);
/// `ignore_eos` runs past it; a token not on the list does not end it; and without the file the
/// ids only it names do not end it either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_end_of_sequence_ids_end_a_completion() {
    for (tokenizer, model, tokenizer_eos, other) in
        [("llama3", "Llama-3.2-1B-Instruct", 128009, 128002), ("qwen2", "Qwen2.5-0.5B-Instruct", 151645, 100)]
    {
        let gc = published(model).join("generation_config.json");
        let listed: Vec<usize> = serde_json::from_str::<Value>(&std::fs::read_to_string(&gc).unwrap()).unwrap()
            ["eos_token_id"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as usize)
            .collect();
        assert!(listed.len() >= 2 && listed.contains(&tokenizer_eos), "{model}: {listed:?}");
        for &token in listed.iter().chain([&other]) {
            let Some(dir) = forced(tokenizer, token) else { return };
            let checkpoint = dir.path().to_str().unwrap();
            std::fs::copy(&gc, dir.path().join("generation_config.json")).unwrap();
            let s = start(&["--checkpoint", checkpoint]);
            s.wait_ready().await;
            let ends = listed.contains(&token);
            let want = if ends { ("stop".to_string(), 1) } else { ("length".to_string(), 4) };
            for path in ["/v1/completions", "/v1/chat/completions"] {
                assert_eq!(finish(&s, path, json!({})).await, want, "{model}: token {token} at {path}");
            }
            let run_on = finish(&s, "/v1/completions", json!({"ignore_eos": true})).await;
            assert_eq!(run_on, ("length".to_string(), 4), "{model}: token {token} with ignore_eos");
            drop(s);
            // without generation_config.json only the tokenizer's EOS ends it
            std::fs::remove_file(dir.path().join("generation_config.json")).unwrap();
            let s = start(&["--checkpoint", checkpoint]);
            s.wait_ready().await;
            let want = if token == tokenizer_eos { ("stop".to_string(), 1) } else { ("length".to_string(), 4) };
            assert_eq!(finish(&s, "/v1/completions", json!({})).await, want, "{model}: token {token}, no file");
        }
    }
}

/// (token ids, log-probabilities) of a seeded completion of 8 tokens.
async fn sampled(s: &common::server::Server, extra: &Value) -> (Value, Value) {
    let mut body = json!({"prompt": "Hello there, how", "max_tokens": 8, "seed": 11, "logprobs": 1,
        "return_token_ids": true, "ignore_eos": true});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    let (st, r) = s.post(body).await;
    assert_eq!(st, 200, "{r}");
    let c = &r["choices"][0];
    (c["token_ids"].clone(), c["logprobs"]["token_logprobs"].clone())
}

/// Llama 3.2 Instruct's defaults (temperature 0.6, top_p 0.9) and Qwen2.5 Instruct's
/// (temperature 0.7, top_p 0.8, top_k 20, repetition_penalty 1.1) reach a request that leaves
/// them out: it samples exactly as one that sends them, and differently from one that sends
/// any one of them at OpenAI's value (so each takes effect); under `--generation-config none`
/// it samples as one that sends OpenAI's values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_sampling_defaults_reach_requests_that_leave_them_out() {
    for (tokenizer, model) in [("llama3", "Llama-3.2-1B-Instruct"), ("qwen2", "Qwen2.5-0.5B-Instruct")] {
        let gc: Value =
            serde_json::from_str(&std::fs::read_to_string(published(model).join("generation_config.json")).unwrap())
                .unwrap();
        // logits of spread about 2 (the tied table scaled): neither uniform nor one-hot, so
        // that each setting moves the draw
        let scaled = |gpt: &brigade::models::Gpt, p: &mut [f32]| {
            let s = gpt.layout.specs.iter().find(|s| s.name == "model.embed_tokens.weight").unwrap();
            s.view.of_mut(p).iter_mut().for_each(|v| *v *= 25.0);
        };
        let Some(dir) = chat_model_with(tokenizer, 256, true, scaled) else { return };
        std::fs::copy(published(model).join("generation_config.json"), dir.path().join("generation_config.json"))
            .unwrap();
        let checkpoint = dir.path().to_str().unwrap();
        let neutral = [
            ("temperature", json!(1.0)),
            ("top_p", json!(1.0)),
            ("top_k", json!(-1)),
            ("repetition_penalty", json!(1.0)),
        ];
        let set: Vec<&str> = neutral.iter().map(|(k, _)| *k).filter(|k| gc.get(*k).is_some()).collect();
        assert!(set.len() >= 2, "{model}: {gc}");
        let explicit = Value::Object(set.iter().map(|k| (k.to_string(), gc[*k].clone())).collect());
        let openai = Value::Object(neutral.iter().map(|(k, v)| (k.to_string(), v.clone())).collect());
        let s = start(&["--checkpoint", checkpoint]);
        s.wait_ready().await;
        let left_out = sampled(&s, &json!({})).await;
        assert_eq!(sampled(&s, &explicit).await, left_out, "{model}: the file's values sent explicitly");
        let as_openai = sampled(&s, &openai).await;
        assert_ne!(as_openai.0, left_out.0, "{model}: OpenAI's values sample as the file's");
        for k in &set {
            let one = json!({ *k: neutral.iter().find(|(n, _)| n == k).unwrap().1.clone() });
            assert_ne!(sampled(&s, &one).await.0, left_out.0, "{model}: {k} at OpenAI's value changed nothing");
        }
        drop(s);
        let s = start(&["--checkpoint", checkpoint, "--generation-config", "none"]);
        s.wait_ready().await;
        assert_eq!(sampled(&s, &json!({})).await, as_openai, "{model}: --generation-config none");
    }
}

/// The real SmolLM2-135M-Instruct, served from its Hugging Face folder: each conversation's
/// prompt is the ids its chat template gives in transformers, and the greedy answer is
/// generate()'s, ending its turn with `<|im_end|>` (finish_reason stop, the end token counted
/// and not in the text) without `ignore_eos` or a length limit reached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_smollm2_ends_its_turn_where_transformers_does() {
    let Some(root) = std::env::var_os("BRIGADE_SMOLLM2").map(PathBuf::from) else {
        eprintln!("skipped: set BRIGADE_SMOLLM2 to the folder get.sh --hf filled (.ci/run does)");
        return;
    };
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/smollm2_chat.json");
    let cases: Value = serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    let cases = cases["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 3);
    let s = start(&["--checkpoint", root.join("hf").to_str().unwrap(), "--threads", "2"]);
    s.wait_ready().await;
    for case in cases {
        assert_eq!(case["ended"], true, "the fixture's answers end their turn");
        let body = json!({"messages": case["messages"], "temperature": 0, "max_tokens": 64, "return_token_ids": true});
        let (st, r) = s.post_to("/v1/chat/completions", body).await;
        assert_eq!(st, 200, "{r}");
        assert_eq!(r["prompt_token_ids"], case["prompt_ids"], "{}: the template's prompt", case["messages"]);
        let c = &r["choices"][0];
        assert_eq!(c["finish_reason"], "stop", "{}: {c}", case["messages"]);
        assert_eq!(c["message"]["content"], case["text"], "{}", case["messages"]);
        let n = case["generated_ids"].as_array().unwrap().len() as u64;
        assert_eq!(r["usage"]["completion_tokens"], n, "{}: the end of turn counted", case["messages"]);
        let ids = c["token_ids"].as_array().unwrap();
        assert_eq!(ids[..], case["generated_ids"].as_array().unwrap()[..ids.len()], "{}", case["messages"]);
    }
}
