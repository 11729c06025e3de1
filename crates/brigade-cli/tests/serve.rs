//! `brigade serve` from outside, over HTTP, as a client would: a tiny model trained for a few
//! steps with a byte-level BPE tokenizer (the fixture `bpe-tokenizer.json`), and the
//! gpt2-small shape with random weights where a request must take a while (draining).
//! References: the tokenizer's own decoding of the returned token ids, each request run alone
//! (batch invariance), `brigade sample` (the full-recompute generator).

mod common;

use common::server::{chat_model_of, checkpoint, fixture_tokenizer, start};
use common::stream::assert_stream_is_whole;
use common::{fails_with, ok};
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The reference the served log-probabilities are held to: the full forward of `ids` (no KV
/// cache, no batching) with a log-softmax in f64; row j is the distribution of token j + 1.
fn reference_logprobs(dir: &Path, ids: &[u32]) -> Vec<Vec<f64>> {
    let (model, params) = brigade::models::checkpoint::load_model(dir).unwrap();
    let mut acts = brigade::models::Activations::default();
    model.logits(&params, ids, (1, ids.len()), &mut acts);
    acts.logits
        .chunks(model.cfg.vocab_size)
        .map(|row| {
            let m = row.iter().fold(f64::MIN, |m, &x| m.max(x as f64));
            let lse = m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
            row.iter().map(|&x| x as f64 - lse).collect()
        })
        .collect()
}

/// The `n` most likely tokens of a reference row, best first.
fn reference_top(row: &[f64], n: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..row.len() as u32).collect();
    idx.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
    idx.truncate(n);
    idx
}

fn ids(v: &Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn completions_are_the_tokenizers_text_whole_or_streamed() {
    let s = start(&["--checkpoint", checkpoint().to_str().unwrap()]);
    s.wait_ready().await;
    let tok = brigade::models::tokenizer::Tokenizer::from_file(&fixture_tokenizer()).unwrap();
    let prompt = "Data parallelism: every worker — naïve or not — 🚀";
    // seeded sampling at temperature 1.2 wanders over the vocabulary, byte tokens included
    let mut invalid = 0;
    for seed in 0..4 {
        let body = json!({"model": "tiny-bpe", "prompt": prompt, "max_tokens": 20, "temperature": 1.2, "seed": seed,
            "return_token_ids": true, "logprobs": 3});
        let (st, whole) = s.post(body.clone()).await;
        assert_eq!(st, 200, "{whole}");
        let c = &whole["choices"][0];
        let gen = ids(&c["token_ids"]);
        assert_eq!(ids(&c["prompt_token_ids"]), tok.encode(prompt).unwrap());
        // the text is the tokenizer's decoding of the tokens, less a final end-of-text
        let eos = gen.last() == Some(&0);
        let upto = if eos { gen.len() - 1 } else { gen.len() };
        assert_eq!(c["text"].as_str().unwrap(), tok.decode(&gen[..upto]), "seed {seed}");
        assert_eq!(c["finish_reason"], if eos { "stop" } else { "length" });
        let lp = &c["logprobs"];
        assert_eq!(lp["tokens"].as_array().unwrap().len(), gen.len());
        // text_offset: where each token's text starts, in characters (as OpenAI counts)
        let mut at = 0;
        for (k, t) in lp["tokens"].as_array().unwrap().iter().enumerate() {
            assert_eq!(lp["text_offset"][k], at, "token {k}");
            at += t.as_str().unwrap().chars().count();
        }
        // every log-probability against the full forward's log-softmax: the chosen token's,
        // and the top 3 keyed by text (where two show the same text, the likelier one's)
        let prompt_ids = tok.encode(prompt).unwrap();
        let all: Vec<u32> = prompt_ids.iter().chain(&gen).copied().collect();
        let reference = reference_logprobs(checkpoint(), &all[..all.len() - 1]);
        for (k, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
            let row = &reference[prompt_ids.len() + k - 1];
            let chosen = lp["token_logprobs"][k].as_f64().unwrap();
            assert!((chosen - row[gen[k] as usize]).abs() < 1e-4, "token {k}: {chosen} vs {}", row[gen[k] as usize]);
            let mut want = serde_json::Map::new();
            for t in reference_top(row, 3) {
                want.entry(tok.decode(&[t])).or_insert(json!(row[t as usize]));
            }
            let top = top.as_object().unwrap();
            assert_eq!(top.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>(), "token {k}: top 3");
            for (text, v) in top {
                let (got, w) = (v.as_f64().unwrap(), want[text].as_f64().unwrap());
                assert!((got - w).abs() < 1e-4, "token {k}: top {text:?} {got} vs {w}");
            }
        }
        assert_eq!(whole["usage"]["completion_tokens"], gen.len());
        assert_eq!(whole["usage"]["prompt_tokens"], tok.encode(prompt).unwrap().len());
        // the same request streamed: the same tokens, the pieces add up to the same text
        let mut sb = body.clone();
        sb["stream"] = json!(true);
        sb["stream_options"] = json!({"include_usage": true});
        let events = s.stream(sb).await;
        // every field: text, token ids, the prompt's ids, the four log-probability lists, finish, usage
        assert_stream_is_whole(&whole, &events, true, &format!("seed {seed}"));
        let (usage, chunks) = events.split_last().unwrap();
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"], whole["usage"]);
        let streamed: Vec<u32> = chunks.iter().flat_map(|e| ids(&e["choices"][0]["token_ids"])).collect();
        assert_eq!(streamed, gen, "seed {seed}");
        let text: String = chunks.iter().map(|e| e["choices"][0]["text"].as_str().unwrap()).collect();
        assert_eq!(text, c["text"].as_str().unwrap());
        // a character split over tokens never comes out as a replacement character (the
        // model may also write invalid UTF-8, which the decoder itself replaces)
        if !text.contains('\u{FFFD}') {
            assert!(chunks.iter().all(|e| !e["choices"][0]["text"].as_str().unwrap().contains('\u{FFFD}')));
        } else {
            invalid += 1;
        }
        assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], c["finish_reason"]);
        assert!(chunks[..chunks.len() - 1].iter().all(|e| e["choices"][0]["finish_reason"].is_null()));
    }
    assert!(invalid < 4, "every sample was invalid UTF-8: the check above never ran");
    // greedy: what the full-recompute sampler writes
    let (_, g) = s.post(json!({"prompt": "Tensor parallelism", "max_tokens": 12, "temperature": 0})).await;
    let out = ok(
        &[
            "sample",
            "--checkpoint",
            checkpoint().to_str().unwrap(),
            "--prompt",
            "Tensor parallelism",
            "--max-tokens",
            "12",
        ],
        checkpoint(),
    );
    let sampled = String::from_utf8(out.stdout).unwrap();
    assert_eq!(format!("Tensor parallelism{}\n", g["choices"][0]["text"].as_str().unwrap()), sampled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stop_strings_n_and_seeds() {
    let s = start(&["--checkpoint", checkpoint().to_str().unwrap()]);
    s.wait_ready().await;
    let tok = brigade::models::tokenizer::Tokenizer::from_file(&fixture_tokenizer()).unwrap();
    let base = json!({"prompt": ["The mesh", "A pipeline"], "max_tokens": 25, "temperature": 1.0, "seed": 5, "n": 3, "return_token_ids": true});
    let (st, r) = s.post(base.clone()).await;
    assert_eq!(st, 200, "{r}");
    let ch = r["choices"].as_array().unwrap();
    assert_eq!(ch.len(), 6);
    for (i, c) in ch.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(ids(&c["prompt_token_ids"]), tok.encode(["The mesh", "A pipeline"][i / 3]).unwrap());
    }
    // the choices of one prompt differ (their own seeds); the same request gives the same again
    assert!(ch[0]["token_ids"] != ch[1]["token_ids"] || ch[1]["token_ids"] != ch[2]["token_ids"]);
    assert_eq!(s.post(base.clone()).await.1["choices"], r["choices"]);
    // a stop string: the text ends before its first occurrence in the unstopped text
    let full = ch[0]["text"].as_str().unwrap().to_string();
    // (a text without such a character would leave the checks below unrun: fail instead)
    let stop = full
        .chars()
        .skip(3)
        .find(|c| !c.is_whitespace())
        .map(|c| c.to_string())
        .unwrap_or_else(|| panic!("no character to stop at in {full:?}"));
    let mut b = base.clone();
    b["n"] = json!(1);
    b["stop"] = json!([stop.clone(), "@@never@@"]);
    let (_, r2) = s.post(b.clone()).await;
    let c = &r2["choices"][0];
    let cut = full.find(&stop).unwrap();
    assert_eq!(c["text"].as_str().unwrap(), &full[..cut], "stop {stop:?} in {full:?}");
    assert_eq!(c["finish_reason"], "stop");
    // streamed, every field equal to the whole answers: n = 3 over two prompts (their choices
    // interleaved in the stream), with and without log-probabilities and usage; a stop string
    for (mut body, what) in [(base.clone(), "n 3, two prompts"), (b, "a stop string")] {
        for (logprobs, usage) in [(None, false), (Some(2), true)] {
            if let Some(k) = logprobs {
                body["logprobs"] = json!(k);
            }
            let (_, whole) = s.post(body.clone()).await;
            let mut sb = body.clone();
            sb["stream"] = json!(true);
            if usage {
                sb["stream_options"] = json!({"include_usage": true});
            }
            let events = s.stream(sb).await;
            assert_stream_is_whole(&whole, &events, usage, &format!("{what}, logprobs {logprobs:?}"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_gives_the_same_tokens_alone_and_in_a_crowd() {
    let s = start(&["--checkpoint", checkpoint().to_str().unwrap(), "--max-step-tokens", "16", "--block-size", "2"]);
    s.wait_ready().await;
    let bodies: Vec<Value> = (0..16)
        .map(|i| {
            let prompt = ["The planner predicts", "The planner", "Inference batching shares", "x"][i % 4];
            let t = if i % 2 == 0 { 0.0 } else { 0.9 };
            json!({"prompt": prompt, "max_tokens": 10 + i * 2, "temperature": t, "seed": i, "top_k": 50, "top_p": 0.95,
                "ignore_eos": true, "return_token_ids": true})
        })
        .collect();
    let mut alone = Vec::new();
    for b in &bodies {
        alone.push(s.post(b.clone()).await.1["choices"][0]["token_ids"].clone());
    }
    let crowd = futures_util::future::join_all(bodies.iter().map(|b| s.post(b.clone()))).await;
    for (i, (st, r)) in crowd.iter().enumerate() {
        assert_eq!(*st, 200);
        assert_eq!(r["choices"][0]["token_ids"], alone[i], "request {i} changed in the crowd");
        assert_eq!(ids(&r["choices"][0]["token_ids"]).len(), 10 + i * 2, "ignore_eos: all max_tokens");
    }
    assert!(s.metric("brigade_prefix_cache_hits_total").await > 0.0);
    assert_eq!(s.metric("brigade_requests_total").await, 32.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tp_2_serves_the_same_tokens_and_logprobs_as_tp_1() {
    let ck = checkpoint().to_str().unwrap();
    let one = start(&["--checkpoint", ck, "--tp", "1", "--threads", "2"]);
    let two = start(&["--checkpoint", ck, "--tp", "2", "--threads", "2"]);
    one.wait_ready().await;
    two.wait_ready().await;
    // the server really runs two ranks, each holding its own share, reported by the rank
    let (w1, w2) = (one.per_rank("brigade_rank_weight_bytes").await, two.per_rank("brigade_rank_weight_bytes").await);
    assert_eq!(w1.keys().copied().collect::<Vec<_>>(), [0], "{w1:?}");
    assert_eq!(w2.keys().copied().collect::<Vec<_>>(), [0, 1], "{w2:?}");
    let whole = w1[&0];
    assert!(w2[&0] == w2[&1] && w2[&0] < whole && w2[&0] + w2[&1] >= whole, "tp 2 {w2:?}, tp 1 {whole}");
    let kv = two.per_rank("brigade_rank_kv_blocks").await;
    assert!(kv.len() == 2 && kv[&0] > 0.0 && kv[&0] == kv[&1], "{kv:?}");
    let bodies: Vec<Value> = (0..8)
        .map(|i| {
            let prompt = ["The planner", "Tensor parallelism splits", "x"][i % 3];
            json!({"prompt": prompt, "max_tokens": 12 + i,
                "temperature": if i % 2 == 0 { 0.0 } else { 1.0 }, "seed": i, "logprobs": 2, "return_token_ids": true})
        })
        .collect();
    let a = futures_util::future::join_all(bodies.iter().map(|b| one.post(b.clone()))).await;
    let b = futures_util::future::join_all(bodies.iter().map(|b| two.post(b.clone()))).await;
    for (i, ((sa, ra), (sb, rb))) in a.iter().zip(&b).enumerate() {
        assert_eq!((*sa, *sb), (200, 200));
        assert_eq!(ra["choices"], rb["choices"], "request {i}: --tp 2 differs from --tp 1");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_requests_get_openai_errors() {
    let s = start(&["--checkpoint", checkpoint().to_str().unwrap()]);
    s.wait_ready().await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/completions", s.url);
    for (body, status, param) in [
        ("{not json", 400, None),
        (r#"{"prompt": "x", "max_tokens": -1}"#, 400, Some("max_tokens")),
        (r#"{"prompt": "x", "max_tokens": 1000000000000}"#, 400, Some("max_tokens")),
        (r#"{"prompt": "x", "max_tokens": "many"}"#, 400, Some("max_tokens")),
        (r#"{"prompt": "x", "temperature": "hot"}"#, 400, Some("temperature")),
        (r#"{"prompt": [5, 100000]}"#, 400, Some("prompt")),
        (r#"{"prompt": ""}"#, 400, Some("prompt")),
        (r#"{"prompt": "x", "frequency_penalty": 1}"#, 400, Some("frequency_penalty")),
        (r#"{"prompt": "x", "model": "gpt-4"}"#, 404, Some("model")),
    ] {
        let r = client.post(&url).header("content-type", "application/json").body(body).send().await.unwrap();
        assert_eq!(r.status().as_u16(), status, "{body}");
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["error"]["param"].as_str(), param, "{body}: {e}");
        assert!(e["error"]["message"].as_str().unwrap().len() > 10);
    }
    // a prompt longer than the context (64 tokens)
    let long = "the model and the mesh ".repeat(40);
    let (st, e) = s.post(json!({"prompt": long})).await;
    assert_eq!(st, 400);
    assert!(e["error"]["message"].as_str().unwrap().contains("maximum context length is 64"), "{e}");
    assert_eq!(reqwest::get(format!("{}/health", s.url)).await.unwrap().status(), 200);
    let models: Value = reqwest::get(format!("{}/v1/models", s.url)).await.unwrap().json().await.unwrap();
    assert_eq!(models["data"][0]["id"], "tiny-bpe");
    // unknown routes: 404 with OpenAI's error body naming the route
    let client = reqwest::Client::new();
    for (path, says) in [("/v1/edits", "POST /v1/chat/completions"), ("/v2/nothing", "it serves POST /v1/completions")]
    {
        let r = client.post(format!("{}{path}", s.url)).json(&json!({})).send().await.unwrap();
        assert_eq!(r.status(), 404, "{path}");
        let e: Value = r.json().await.unwrap();
        let m = e["error"]["message"].as_str().unwrap();
        assert!(m.contains(&format!("no route POST {path}")) && m.contains(says), "{path}: {e}");
        assert_eq!(e["error"]["code"], "unknown_url");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overload_is_refused_with_503_and_a_disconnect_frees_the_sequence() {
    // one running, one queued: of four concurrent long requests at least two are refused
    let s = start(&["--model", "gpt2-small", "--max-running", "1", "--max-queued", "1", "--threads", "2"]);
    s.wait_ready().await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/completions", s.url);
    // long enough that finishing naturally (1000 decode steps of gpt2-small, tens of seconds)
    // cannot meet the time bound below: only the abort frees them in time
    let body = json!({"prompt": [1, 2, 3], "max_tokens": 1000, "temperature": 0, "stream": true});
    let mut streams = Vec::new();
    let mut refused = 0;
    for _ in 0..4 {
        let r = client.post(&url).json(&body).send().await.unwrap();
        if r.status() == 503 {
            assert_eq!(r.headers()["retry-after"], "1");
            let e: Value = r.json().await.unwrap();
            assert!(e["error"]["message"].as_str().unwrap().contains("limit"));
            refused += 1;
        } else {
            assert_eq!(r.status(), 200);
            streams.push(r);
        }
    }
    assert_eq!((streams.len(), refused), (2, 2));
    // read one token of the first, then hang up on both
    let mut first = streams.remove(0).bytes_stream();
    first.next().await.unwrap().unwrap();
    drop(first);
    drop(streams);
    let t0 = Instant::now();
    while s.metric("brigade_running_sequences").await > 0.0
        || s.metric("brigade_queue_depth").await > 0.0
        || s.metric("brigade_kv_blocks_used").await > 0.0
    {
        assert!(t0.elapsed() < Duration::from_secs(12), "hung-up requests still hold the engine");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // (a bound a loaded machine meets; the two streams' 2000 steps would take far longer)
    assert!(t0.elapsed() < Duration::from_secs(6), "took {:?} to free", t0.elapsed());
    // and the server takes new work
    let (st, r) = s.post(json!({"prompt": [7, 8], "max_tokens": 3, "temperature": 0})).await;
    assert_eq!(st, 200, "{r}");
    // every request counted once, by its status: the two streams and the last 200, two 503
    let text = reqwest::get(format!("{}/metrics", s.url)).await.unwrap().text().await.unwrap();
    let count = |status: &str| {
        let line = format!("brigade_requests_total{{status=\"{status}\"}} ");
        text.lines().find_map(|l| l.strip_prefix(&line)).map(|v| v.parse::<f64>().unwrap())
    };
    assert_eq!((count("200"), count("503")), (Some(3.0), Some(2.0)), "{text}");
    assert_eq!(s.metric("brigade_requests_total").await, 5.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_drains_in_flight_requests_and_exits_0() {
    let mut s = start(&["--model", "gpt2-small", "--threads", "2", "--shutdown-timeout", "60"]);
    // not ready while gpt2-small loads (over a second), though alive
    assert_eq!(reqwest::get(format!("{}/health", s.url)).await.unwrap().status(), 200);
    assert_eq!(reqwest::get(format!("{}/ready", s.url)).await.unwrap().status(), 503);
    s.wait_ready().await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/completions", s.url);
    let r = client
        .post(&url)
        .json(
            &json!({"prompt": [1, 2, 3], "max_tokens": 150, "temperature": 0, "stream": true, "return_token_ids": true}),
        )
        .send()
        .await
        .unwrap();
    let mut body = r.bytes_stream();
    let mut text = String::from_utf8(body.next().await.unwrap().unwrap().to_vec()).unwrap();
    let pid = s.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    // while the stream finishes, the server still answers: /ready says it drains (once the
    // signal is seen), and new requests get 503
    let fresh = reqwest::Client::builder().timeout(Duration::from_secs(2)).build().unwrap();
    let t0 = Instant::now();
    loop {
        let r = fresh.get(format!("{}/ready", s.url)).send().await;
        let r = r.expect("/ready while draining was not answered");
        if r.status() == 503 {
            assert_eq!(r.text().await.unwrap(), "draining");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "/ready still {} 10 s after SIGTERM", r.status());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = fresh.post(&url).json(&json!({"prompt": [1], "max_tokens": 2})).send().await;
    assert_eq!(r.expect("a request while draining was not answered").status(), 503);
    while let Some(b) = body.next().await {
        text.push_str(std::str::from_utf8(&b.unwrap()).unwrap());
    }
    assert!(text.ends_with("data: [DONE]\n\n"), "the in-flight stream was cut: {text}");
    assert_eq!(text.matches("\"token_ids\"").count(), 150);
    let status = s.child.wait().unwrap();
    assert!(status.success(), "exit status {status}");

    // with a short --shutdown-timeout, a long request is cut off and the server still exits 0
    let mut s = start(&["--model", "gpt2-small", "--threads", "2", "--shutdown-timeout", "0.3"]);
    s.wait_ready().await;
    let r = client
        .post(format!("{}/v1/completions", s.url))
        .json(&json!({"prompt": [1, 2, 3], "max_tokens": 900, "temperature": 0, "stream": true}))
        .send()
        .await
        .unwrap();
    let mut body = r.bytes_stream();
    body.next().await.unwrap().unwrap();
    let t0 = Instant::now();
    assert!(Command::new("kill").args(["-TERM", &s.child.id().to_string()]).status().unwrap().success());
    let status = s.child.wait().unwrap();
    assert!(status.success(), "exit status {status}");
    assert!(t0.elapsed() < Duration::from_secs(5), "took {:?} to stop", t0.elapsed());
}

#[test]
fn bad_serve_flags_fail_cleanly() {
    let d = tempfile::tempdir().unwrap();
    common::fails_with(&["serve", "--checkpoint", "/no/such/dir"], d.path(), "no such checkpoint");
    common::fails_with(&["serve", "--model", "gpt2-huge"], d.path(), "gpt2-huge");
    common::fails_with(&["serve", "--model", "tiny", "--max-running", "0"], d.path(), "--max-running");
    common::fails_with(&["serve", "--model", "tiny", "--shutdown-timeout=-1"], d.path(), "--shutdown-timeout");
    common::fails_with(&["serve", "--model", "tiny", "--kv-cache-mib", "0"], d.path(), "--kv-cache-mib");
    common::fails_with(
        &["serve", "--model", "tiny", "--tp", "3", "--threads", "3"],
        d.path(),
        "tp=3 does not divide the model's 4 attention heads",
    );
    common::fails_with(&["serve", "--model", "tiny", "--tp", "2", "--threads", "1"], d.path(), "--tp 2 needs");
    common::fails_with(&["serve", "--model", "tiny", "--tp", "4", "--threads", "2"], d.path(), "give --threads 4");
    // unset, --threads covers the ranks: --tp 5 is refused for the heads alone
    let err = common::fails_with(&["serve", "--model", "tiny", "--tp", "5"], d.path(), "use tp among 1, 2, 4");
    assert!(!err.contains("--threads"), "{err}");
    // a tp that fits neither: both limits named
    common::fails_with(
        &["serve", "--model", "tiny", "--tp", "5", "--threads", "2"],
        d.path(),
        "use tp among 1, 2, 4 (or a model with more heads); a --tp above 2 also needs --threads at least as large",
    );
    // the port taken by another server
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port().to_string();
    common::fails_with(&["serve", "--model", "tiny", "--port", &port], d.path(), "cannot listen");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_addition_checkpoint_answers_as_brigade_sample_does() {
    // the README's checkpoint (byte tokens): served in one batch, each answer equals the one
    // the full-recompute sampler gives for the problem alone
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../brigade/tests/fixtures/addition_ckpt");
    let s = start(&["--checkpoint", dir.to_str().unwrap()]);
    s.wait_ready().await;
    // problems held out of its training (the task's own evaluation set: its hash says so)
    let task = brigade::train::addition::Addition { digits: 3, reverse: true, carry_chains: 0.0 };
    let problems = task.eval_set(12);
    assert!(problems.iter().all(|&(a, b)| task.held_out(a, b)));
    let prompts: Vec<String> = problems.iter().map(|(a, b)| format!("{a:03}+{b:03}=")).collect();
    let (st, r) = s.post(json!({"prompt": prompts, "max_tokens": 6, "temperature": 0, "stop": "\n"})).await;
    assert_eq!(st, 200, "{r}");
    let mut right = 0;
    for (i, (a, b)) in problems.iter().enumerate() {
        let c = &r["choices"][i];
        assert_eq!(c["finish_reason"], "stop", "{a}+{b}: {c}");
        // the model writes the sum's 4 digits least significant first
        let served: String = c["text"].as_str().unwrap().chars().rev().collect();
        let out = ok(&["sample", "--checkpoint", dir.to_str().unwrap(), "--prompt", &format!("{a}+{b}")], &dir);
        let sampled = String::from_utf8(out.stdout).unwrap();
        let sampled = sampled.trim().rsplit('=').next().unwrap().to_string();
        assert_eq!(
            served.parse::<u64>().ok(),
            sampled.parse::<u64>().ok(),
            "{a}+{b}: served {served}, sampled {sampled}"
        );
        // the whole text: the sum's four digits reversed and nothing else
        right += usize::from(c["text"].as_str().unwrap() == task.answer(*a, *b).trim_end());
    }
    // the checkpoint answers 999 of the task's 1000 held-out problems right; these 12 all
    assert_eq!(right, 12, "not the trained model's answers");
}

/// A random-weight Llama-family folder in Hugging Face's form (config.json, model.safetensors)
/// with the real tokenizer folder `../shared/tokenizers/NAME` copied in (its chat template).
fn chat_model(name: &str) -> Option<tempfile::TempDir> {
    chat_model_of(name, 256)
}

/// The fixture's conversations as `transformers` renders and tokenizes them.
fn chat_cases(name: &str) -> Vec<Value> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../brigade/tests/fixtures/chat_templates.json");
    let all: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    all.into_iter()
        .filter(|c| c["tokenizer"] == name && c["add_generation_prompt"] == true && c.get("tools").is_none())
        .collect()
}

/// The fixture's conversations with tools, as the API takes them (each call's arguments a JSON
/// string).
fn tool_cases(name: &str) -> Vec<Value> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../brigade/tests/fixtures/chat_templates.json");
    let all: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    let mut out: Vec<Value> = all.into_iter().filter(|c| c["tokenizer"] == name && c.get("tools").is_some()).collect();
    for c in &mut out {
        for m in c["messages"].as_array_mut().unwrap() {
            for call in m.get_mut("tool_calls").and_then(Value::as_array_mut).into_iter().flatten() {
                let args = call["function"]["arguments"].to_string();
                call["function"]["arguments"] = json!(args);
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tools_reach_the_template_and_required_calls_always_parse() {
    for name in ["qwen2", "llama3"] {
        let Some(model) = chat_model_of(name, 1024) else { return };
        let s = start(&["--checkpoint", model.path().to_str().unwrap(), "--served-model-name", "chat"]);
        s.wait_ready().await;
        // the rendered prompt (tools, calls with their arguments, tool results) is transformers'
        let cases = tool_cases(name);
        assert_eq!(cases.len(), if name == "qwen2" { 5 } else { 4 });
        for case in &cases {
            let body = json!({"model": "chat", "messages": case["messages"], "tools": case["tools"], "max_tokens": 1,
                "return_token_ids": true, "tool_choice": "none"});
            let (st, r) = s.post_to("/v1/chat/completions", body).await;
            assert_eq!(st, 200, "{r}");
            assert_eq!(r["prompt_token_ids"], case["ids"], "{name}: {}", case["messages"]);
        }
        // required calls from random weights: every call parses against its function's schema
        let city = json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}}, "required": ["city"], "additionalProperties": false}}});
        let zone = json!({"type": "function", "function": {"name": "get-time", "parameters": {"type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"], "additionalProperties": false}}});
        // (odd seeds ask for log-probabilities too: the stream must carry every token's)
        let ask = |choice: Value, parallel: bool, seed: u64| {
            let mut b = json!({"model": "chat", "messages": [{"role": "user", "content": "Weather and time in Paris?"}],
                "tools": [city, zone], "tool_choice": choice, "parallel_tool_calls": parallel, "max_tokens": 120,
                "temperature": 1.0, "seed": seed});
            if seed % 2 == 1 {
                b["logprobs"] = json!(true);
                b["top_logprobs"] = json!(2);
            }
            b
        };
        for seed in 0..4 {
            for (choice, parallel) in [
                (json!("required"), false),
                (json!("required"), true),
                (json!({"type": "function", "function": {"name": "get-time"}}), false),
            ] {
                let (st, r) = s.post_to("/v1/chat/completions", ask(choice.clone(), parallel, seed)).await;
                assert_eq!(st, 200, "{r}");
                let c = &r["choices"][0];
                assert_eq!(c["finish_reason"], "tool_calls", "{name} {choice} seed {seed}: {r}");
                let calls = c["message"]["tool_calls"].as_array().unwrap();
                assert!(!calls.is_empty() && (parallel || calls.len() == 1), "{name}: {r}");
                for call in calls {
                    assert_eq!(call["type"], "function");
                    assert!(call["id"].as_str().unwrap().starts_with("call_"));
                    let f = &call["function"];
                    let args: Value = serde_json::from_str(f["arguments"].as_str().unwrap()).unwrap();
                    match f["name"].as_str().unwrap() {
                        "get_weather" => assert!(["Paris", "Oslo"].contains(&args["city"].as_str().unwrap()), "{args}"),
                        "get-time" => assert!(["UTC", "CET"].contains(&args["zone"].as_str().unwrap()), "{args}"),
                        other => panic!("{name}: a call to {other}"),
                    }
                    if choice.is_object() {
                        assert_eq!(f["name"], "get-time");
                    }
                }
                // streamed: each call's index, id and name once, its arguments in pieces that add up
                let mut sb = ask(choice.clone(), parallel, seed);
                sb["stream"] = json!(true);
                let events = s.stream_to("/v1/chat/completions", sb).await;
                assert_stream_is_whole(&r, &events, false, &format!("{name} {choice} seed {seed}"));
                let mut got: Vec<(String, String, String)> = Vec::new();
                let mut finish = Value::Null;
                let mut content = String::new();
                for e in &events {
                    let ch = &e["choices"][0];
                    assert!(finish.is_null(), "nothing after the finish: {e}");
                    if !ch["finish_reason"].is_null() {
                        finish = ch["finish_reason"].clone();
                    }
                    content.push_str(ch["delta"]["content"].as_str().unwrap_or(""));
                    for d in ch["delta"]["tool_calls"].as_array().into_iter().flatten() {
                        let k = d["index"].as_u64().unwrap() as usize;
                        if k == got.len() {
                            got.push((
                                d["id"].as_str().unwrap().into(),
                                d["function"]["name"].as_str().unwrap().into(),
                                String::new(),
                            ));
                        } else {
                            assert!(
                                d.get("id").is_none() && d["function"].get("name").is_none(),
                                "id and name once: {d}"
                            );
                        }
                        got[k].2.push_str(d["function"]["arguments"].as_str().unwrap());
                    }
                }
                assert_eq!(finish, "tool_calls");
                assert_eq!(content, c["message"]["content"].as_str().unwrap_or(""), "{name}: streamed content");
                let want: Vec<(String, String, String)> = calls
                    .iter()
                    .map(|c| {
                        (
                            c["id"].as_str().unwrap().into(),
                            c["function"]["name"].as_str().unwrap().into(),
                            c["function"]["arguments"].as_str().unwrap().into(),
                        )
                    })
                    .collect();
                assert_eq!(
                    got.iter().map(|g| (&g.1, &g.2)).collect::<Vec<_>>(),
                    want.iter().map(|w| (&w.1, &w.2)).collect::<Vec<_>>(),
                    "{name}: streamed calls differ from the whole response's"
                );
            }
        }
        // bad tools: 400 naming the field, nothing reaches the engine
        for (body, param) in [
            (json!({"messages": [{"role": "user", "content": "x"}], "tools": [city, city]}), "tools[1].function.name"),
            (json!({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}), "tool_choice"),
            (
                json!({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "zz", "content": "1"}]}),
                "messages[1].tool_call_id",
            ),
        ] {
            let (st, r) = s.post_to("/v1/chat/completions", body).await;
            assert_eq!((st, r["error"]["param"].as_str()), (400, Some(param)), "{r}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chat_completions_render_the_models_template() {
    for name in ["qwen2", "llama3"] {
        let Some(model) = chat_model(name) else { return };
        let s = start(&["--checkpoint", model.path().to_str().unwrap(), "--served-model-name", "chat"]);
        s.wait_ready().await;
        let tok = brigade::models::tokenizer::Tokenizer::from_file(model.path()).unwrap();
        let cases = chat_cases(name);
        assert_eq!(cases.len(), 2, "{name}: the fixture's conversations with a generation prompt");
        for case in &cases {
            let body = json!({"model": "chat", "messages": case["messages"], "max_tokens": 9, "temperature": 0.9,
                "seed": 3, "return_token_ids": true, "logprobs": true, "top_logprobs": 2, "ignore_eos": true});
            let (st, r) = s.post_to("/v1/chat/completions", body.clone()).await;
            assert_eq!(st, 200, "{r}");
            assert_eq!(r["object"], "chat.completion");
            // the prompt is the template's rendering as transformers tokenizes it
            assert_eq!(r["prompt_token_ids"], case["ids"], "{name}");
            let c = &r["choices"][0];
            let gen = ids(&c["token_ids"]);
            assert_eq!(gen.len(), 9);
            assert_eq!(c["message"]["role"], "assistant");
            assert_eq!(c["message"]["content"].as_str().unwrap(), tok.decode(&gen), "{name}");
            let lp = c["logprobs"]["content"].as_array().unwrap();
            assert_eq!(lp.len(), 9);
            // against the full forward's log-softmax: the chosen token and the top 2, in order
            let prompt_ids = ids(&case["ids"]);
            let all: Vec<u32> = prompt_ids.iter().chain(&gen).copied().collect();
            let reference = reference_logprobs(model.path(), &all[..all.len() - 1]);
            for (k, e) in lp.iter().enumerate() {
                let row = &reference[prompt_ids.len() + k - 1];
                let got = e["logprob"].as_f64().unwrap();
                assert!(
                    (got - row[gen[k] as usize]).abs() < 1e-4,
                    "{name} token {k}: {got} vs {}",
                    row[gen[k] as usize]
                );
                assert_eq!(e["token"], tok.decode(&[gen[k]]));
                let top = e["top_logprobs"].as_array().unwrap();
                let want = reference_top(row, 2);
                assert_eq!(top.len(), 2);
                for (t, w) in top.iter().zip(&want) {
                    assert_eq!(t["token"], tok.decode(&[*w]), "{name} token {k}");
                    let got = t["logprob"].as_f64().unwrap();
                    assert!((got - row[*w as usize]).abs() < 1e-4, "{name} token {k}: {got} vs {}", row[*w as usize]);
                }
                assert_eq!(e["bytes"], json!(e["token"].as_str().unwrap().as_bytes()));
            }
            assert_eq!(r["usage"]["prompt_tokens"], case["ids"].as_array().unwrap().len());
            // the same tokens as a completion of the rendered ids
            let (_, plain) = s
                .post(json!({"prompt": case["ids"], "max_tokens": 9, "temperature": 0.9, "seed": 3,
                    "return_token_ids": true, "ignore_eos": true}))
                .await;
            assert_eq!(plain["choices"][0]["token_ids"], c["token_ids"], "{name}: chat and completions differ");
            // streamed: the role first, then pieces that add up to the whole message
            let mut sb = body.clone();
            sb["stream"] = json!(true);
            sb["stream_options"] = json!({"include_usage": true});
            let events = s.stream_to("/v1/chat/completions", sb).await;
            assert_stream_is_whole(&r, &events, true, &format!("{name} chat"));
            assert!(events.iter().all(|e| e["object"] == "chat.completion.chunk"));
            assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
            let (usage, chunks) = events.split_last().unwrap();
            assert_eq!(usage["usage"], r["usage"]);
            let text: String =
                chunks.iter().map(|e| e["choices"][0]["delta"]["content"].as_str().unwrap_or("")).collect();
            assert_eq!(text, c["message"]["content"].as_str().unwrap());
            let streamed: Vec<u32> = chunks[1..].iter().flat_map(|e| ids(&e["choices"][0]["token_ids"])).collect();
            assert_eq!(streamed, gen);
            assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "length");
        }
        // n and max_completion_tokens
        let (st, r) = s
            .post_to(
                "/v1/chat/completions",
                json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "n": 3,
                    "max_completion_tokens": 4, "seed": 1, "ignore_eos": true}),
            )
            .await;
        assert_eq!(st, 200, "{r}");
        assert_eq!(r["choices"].as_array().unwrap().len(), 3);
        assert_eq!(r["usage"]["completion_tokens"], 12);
        // streamed, n = 3 with log-probabilities and token ids: every field of every choice
        let body = json!({"messages": [{"role": "user", "content": "hi"}], "n": 3, "max_completion_tokens": 4,
            "seed": 1, "ignore_eos": true, "logprobs": true, "top_logprobs": 3, "return_token_ids": true});
        let (_, whole) = s.post_to("/v1/chat/completions", body.clone()).await;
        let mut sb = body;
        sb["stream"] = json!(true);
        let events = s.stream_to("/v1/chat/completions", sb).await;
        assert_stream_is_whole(&whole, &events, false, &format!("{name} chat n 3"));
        // bad requests: 400 naming the field, and the server goes on serving
        for (body, param) in [
            (json!({"messages": []}), "messages"),
            (json!({"messages": [{"role": "robot", "content": "x"}]}), "messages[0].role"),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
                "messages[0].content[0].type",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f g"}}]}),
                "tools[0].function.name",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}),
                "response_format",
            ),
            (json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 100000}), "max_tokens"),
        ] {
            let (st, e) = s.post_to("/v1/chat/completions", body.clone()).await;
            assert_eq!((st, e["error"]["param"].as_str()), (400, Some(param)), "{body}: {e}");
        }
        let (st, _) = s
            .post_to("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}))
            .await;
        assert_eq!(st, 200);
        // structured output through the chat API: the message parses and follows the schema
        let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
            "required": ["ok", "n"], "additionalProperties": false});
        let body = json!({"messages": [{"role": "user", "content": "Answer in JSON"}], "max_tokens": 40, "temperature": 0.9, "seed": 4,
            "response_format": {"type": "json_schema", "json_schema": {"name": "v", "schema": schema}}});
        let (st, r) = s.post_to("/v1/chat/completions", body).await;
        assert_eq!(st, 200, "{r}");
        let content = r["choices"][0]["message"]["content"].as_str().unwrap();
        let v: Value = serde_json::from_str(content).unwrap_or_else(|e| panic!("{name}: {content:?} is not JSON: {e}"));
        assert!(v["ok"].is_boolean() && [1, 2, 3].contains(&v["n"].as_i64().unwrap_or(0)), "{name}: {v}");
        assert_eq!(v.as_object().unwrap().len(), 2, "{name}: {v}");
        assert_eq!(r["choices"][0]["finish_reason"], "stop");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_model_without_a_chat_template_gets_400_naming_the_file() {
    // the trained checkpoint's tokenizer has no tokenizer_config.json, so no template
    let s = start(&["--checkpoint", checkpoint().to_str().unwrap()]);
    s.wait_ready().await;
    let (st, e) = s.post_to("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "hi"}]})).await;
    assert_eq!(st, 400, "{e}");
    let m = e["error"]["message"].as_str().unwrap();
    assert!(
        m.contains("no chat template") && m.contains("tokenizer_config.json") && m.contains("chat_template.jinja"),
        "{m}"
    );
    // completions still work
    let (st, _) = s.post(json!({"prompt": "x", "max_tokens": 2})).await;
    assert_eq!(st, 200);
}

/// `/v1/embeddings` from the real all-MiniLM-L6-v2: concurrent requests of 1–3 texts each get
/// the vectors `brigade embed`'s encoder gives each text alone, bit for bit (float and base64),
/// whatever they were batched with; bad requests get 400 naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn embeddings_equal_brigade_embeds_bit_for_bit() {
    use base64::Engine as _;
    let Some(model) = common::shared("models/all-MiniLM-L6-v2") else { return };
    let s = start(&["--embedding-model", model.to_str().unwrap(), "--threads", "2"]);
    s.wait_ready().await;
    let enc = brigade::embed::Encoder::load(&model).unwrap();
    let texts: Vec<String> = (0..24)
        .map(|i| match i % 4 {
            0 => format!("Document {i}: data parallelism averages gradients."),
            1 => format!("  naïve café {i} — tensor parallel heads  "),
            2 => "x".repeat(1 + i),
            _ => format!("The planner predicts step time {i} times over before anyone rents a cluster of {i} nodes."),
        })
        .collect();
    let mut tasks = Vec::new();
    for (j, chunk) in texts.chunks(3).enumerate() {
        let (url, chunk) = (s.url.clone(), chunk.to_vec());
        tasks.push(tokio::spawn(async move {
            let body = if j % 3 == 0 {
                json!({"input": chunk[0], "model": "all-MiniLM-L6-v2"})
            } else {
                json!({"input": chunk, "encoding_format": if j % 2 == 0 { "base64" } else { "float" }})
            };
            let r = reqwest::Client::new().post(format!("{url}/v1/embeddings")).json(&body).send().await.unwrap();
            (j, r.status().as_u16(), r.json::<Value>().await.unwrap())
        }));
    }
    let mut checked = 0;
    for t in tasks {
        let (j, st, r) = t.await.unwrap();
        assert_eq!(st, 200, "{r}");
        assert_eq!(r["object"], "list");
        let chunk = &texts[j * 3..(j * 3 + 3).min(texts.len())];
        let data = r["data"].as_array().unwrap();
        let n = if j % 3 == 0 { 1 } else { chunk.len() };
        assert_eq!(data.len(), n);
        let mut tokens = 0;
        for (i, d) in data.iter().enumerate() {
            assert_eq!(d["index"], i);
            let got: Vec<f32> = match &d["embedding"] {
                Value::String(b64) => base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .unwrap()
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
                v => v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect(),
            };
            let want = enc.embed(&[chunk[i].as_str()]).unwrap();
            assert_eq!(got.len(), 384);
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "request {j} input {i}");
            tokens += enc.tokenize(&chunk[i]).unwrap().ids.len();
            checked += 1;
        }
        assert_eq!(r["usage"]["prompt_tokens"], tokens);
    }
    // three requests of one text (j = 0, 3, 6), five of three
    assert_eq!(checked, 3 + 5 * 3, "every input was checked");
    // token ids as given, and the models list
    let ids = enc.tokenize("hello world").unwrap().ids;
    let (st, r) = s.post_to("/v1/embeddings", json!({"input": [ids.clone()]})).await;
    assert_eq!(st, 200, "{r}");
    let want = enc.embed_tokens(&[&ids]);
    let got: Vec<f32> =
        r["data"][0]["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
    assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
    // the model's length at its edge: max_len ids embedded, one more refused naming both
    let at = vec![ids[1]; enc.max_len];
    let (st, r) = s.post_to("/v1/embeddings", json!({"input": [at.clone()]})).await;
    assert_eq!((st, r["usage"]["prompt_tokens"].as_u64()), (200, Some(enc.max_len as u64)), "{r}");
    let over = [at, vec![ids[1]]].concat();
    let (st, e) = s.post_to("/v1/embeddings", json!({"input": [over]})).await;
    let m = e["error"]["message"].as_str().unwrap_or_default();
    assert_eq!(st, 400, "{e}");
    assert!(
        m.contains(&format!("{} tokens", enc.max_len + 1)) && m.contains(&format!("at most {}", enc.max_len)),
        "{m}"
    );
    let models: Value = reqwest::get(format!("{}/v1/models", s.url)).await.unwrap().json().await.unwrap();
    assert_eq!(models["data"][0]["id"], "all-MiniLM-L6-v2");
    for (body, param) in [
        (json!({"input": []}), "input"),
        (json!({}), "input"),
        (json!({"input": 5}), "input"),
        (json!({"input": "x", "dimensions": 100}), "dimensions"),
        (json!({"input": "x", "encoding_format": "int8"}), "encoding_format"),
        (json!({"input": [[999999]]}), "input"),
        (json!({"input": "x", "temperature": 1}), "temperature"),
    ] {
        let (st, e) = s.post_to("/v1/embeddings", body.clone()).await;
        assert_eq!((st, e["error"]["param"].as_str()), (400, Some(param)), "{body}: {e}");
    }
    let (st, _) = s.post_to("/v1/embeddings", json!({"input": "x", "dimensions": 384})).await;
    assert_eq!(st, 200);
    // no generation model here, and no embedding model on a generation server
    let (st, e) = s.post(json!({"prompt": "x"})).await;
    assert_eq!((st, e["error"]["param"].as_str()), (400, Some("model")), "{e}");
    let g = start(&["--checkpoint", checkpoint().to_str().unwrap()]);
    g.wait_ready().await;
    let (st, e) = g.post_to("/v1/embeddings", json!({"input": "x"})).await;
    assert_eq!((st, e["error"]["param"].as_str()), (400, Some("model")), "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("--embedding-model"));
}

/// `bench serve --tools N`: each load with `tool_choice` none and required, and the grammar's
/// compile counted once — the same tools again start from the cached grammar.
#[test]
fn bench_serve_with_tools_compiles_the_grammar_once() {
    let Some(model) = chat_model_of("qwen2", 1024) else { return };
    let cwd = std::env::temp_dir();
    fails_with(&["bench", "serve", "--tools", "3", "--concurrency", "1"], &cwd, "--tools sends chat requests");
    let args = [
        "bench",
        "serve",
        "--checkpoint",
        model.path().to_str().unwrap(),
        "--tools",
        "3",
        "--concurrency",
        "2",
        "--requests",
        "2",
        "--output-len",
        "24",
        "--threads",
        "2",
        "--json",
    ];
    let out = ok(&args, &cwd);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["tools"], 3);
    let g = &v["grammar"];
    assert!(g["first_compile_ms"].as_f64().unwrap() > 0.0, "{g}");
    // (a request looks its grammar up when it is checked and again when it is admitted)
    assert_eq!(g["compiles_again"].as_f64(), Some(0.0), "{g}");
    assert!(g["cache_hits_again"].as_f64().unwrap() >= 1.0, "{g}");
    let rows = v["rows"].as_array().unwrap();
    let choices: Vec<&str> = rows.iter().map(|r| r["tool_choice"].as_str().unwrap()).collect();
    assert_eq!(choices, ["none", "required"]);
    for r in rows {
        assert_eq!((r["requests"].as_u64(), r["failed"].as_u64()), (Some(2), Some(0)), "{r}");
        assert!(r["output_tokens_per_s"].as_f64().unwrap() > 0.0);
    }
}

/// `brigade eval kld` on a small trained checkpoint: the model against itself is KL 0 and full
/// agreement exactly (the two forwards run in lockstep on the same positions), 8 and 4 bits
/// are above 0 (4 bits further), every chunk's second half is scored, and perplexity is the
/// mean next-token likelihood's.
#[test]
fn eval_kld_measures_a_model_against_its_reference() {
    let ck = checkpoint();
    let d = tempfile::tempdir().unwrap();
    let text = d.path().join("held_out.txt");
    std::fs::write(&text, common::server::prose_corpus()).unwrap();
    let run = |w: &str| -> Value {
        let args = [
            "eval",
            "kld",
            "--reference",
            ck.to_str().unwrap(),
            "--weights",
            w,
            "--text",
            text.to_str().unwrap(),
            "--ctx",
            "32",
            "--chunks",
            "3",
            "--threads",
            "1",
            "--json",
        ];
        serde_json::from_slice(&ok(&args, d.path()).stdout).unwrap()
    };
    let same = run("f32");
    assert_eq!(same["tokens_scored"], 3 * 15, "positions 16..30 of each chunk of 32");
    assert_eq!((same["mean_kld"].as_f64(), same["top1_agreement"].as_f64()), (Some(0.0), Some(1.0)), "{same}");
    assert_eq!(same["ppl_model"], same["ppl_reference"]);
    let (q8, q4) = (run("int8"), run("int4"));
    let (k8, k4) = (q8["mean_kld"].as_f64().unwrap(), q4["mean_kld"].as_f64().unwrap());
    assert!(k8 > 0.0 && k4 > k8, "int8 {k8}, int4 {k4}");
    // perplexity, exactly: exp of the mean negative log-likelihood of positions 16..30 of the
    // text's first three 32-token chunks, each predicting the next, from one full forward a chunk
    let tok = brigade::models::tokenizer::Tokenizer::from_file(&ck.join("tokenizer.json")).unwrap();
    let ids = tok.encode(&common::server::prose_corpus()).unwrap();
    let mut nll = 0.0;
    for chunk in ids.chunks_exact(32).take(3) {
        let lp = reference_logprobs(ck, chunk);
        nll -= (16..31).map(|j| lp[j][chunk[j + 1] as usize]).sum::<f64>();
    }
    let ppl = (nll / 45.0).exp();
    let got = same["ppl_reference"].as_f64().unwrap();
    assert!((got / ppl - 1.0).abs() < 1e-4, "perplexity {got}, computed here {ppl}");
    fails_with(
        &[
            "eval",
            "kld",
            "--reference",
            ck.to_str().unwrap(),
            "--text",
            text.to_str().unwrap(),
            "--ctx",
            "32",
            "--chunks",
            "100000",
        ],
        d.path(),
        "chunks of 32 fit",
    );
}
