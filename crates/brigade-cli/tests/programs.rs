//! `POST /v1/programs` and `brigade run` from outside. The reference is the completions API
//! itself: every node's output must equal what `/v1/completions` returns for the node's
//! rendered prompt and settings (a fork as `n`, a map item as its own request), the calls sent
//! one at a time — alone, and again inside a crowd of other requests with chunked prompts and
//! preemption. A select's scores are held to an independent full forward's log-softmax.

mod common;

use common::server::{chat_model_of, checkpoint, fixture_tokenizer, start, Server};
use common::{fails_with, ok};
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

/// Every shape: an outline constrained to 3–5 words (so that the map over its words has
/// several items whatever the tiny model writes), a map over them (seeded), a fork (seeded,
/// top-k), a select, a map over given items, a join with a stop string, a regex-constrained
/// node.
fn every_shape() -> Value {
    json!({"nodes": [
        {"id": "answer", "prompt": "{{expand[0]}} {{pick}} {{vote[2]}}", "max_tokens": 8, "temperature": 0.0, "stop": ["e "]},
        {"id": "outline", "prompt": "The mesh", "max_tokens": 30, "temperature": 1.0, "seed": 5, "top_k": 40,
            "guided_regex": "[a-z]{2,6}( [a-z]{2,6}){2,4}"},
        {"id": "expand", "map": {"over": "outline", "split": {"regex": " "}}, "prompt": "Expand {{item}}:", "max_tokens": 8, "temperature": 0.7, "seed": 3},
        {"id": "vote", "fork": 3, "prompt": "{{outline}} so", "seed": 11, "temperature": 1.0, "top_k": 40, "max_tokens": 8},
        {"id": "pick", "prompt": "{{vote[1]}} is", "choices": [" good", " bad", " the mesh"]},
        {"id": "list", "map": {"items": ["alpha", "beta"]}, "prompt": "{{outline}} {{item}}", "max_tokens": 6, "temperature": 0},
        {"id": "code", "prompt": "{{outline}} code:", "max_tokens": 8, "temperature": 0.9, "seed": 2, "guided_regex": "[0-9]{3}-[a-z]{2}"}
    ]})
}

fn node<'a>(p: &'a Value, id: &str) -> &'a Value {
    let n = &p["nodes"][id];
    assert!(n.is_object(), "no node {id} in {p}");
    assert!(n["error"].is_null(), "node {id} failed: {}", n["error"]);
    n
}

/// The completions request a node's branch stands for: the node's settings, the rendered
/// prompt, a fork's `n`.
fn completion_of(spec: &Value, id: &str, prompt: &str) -> Value {
    let s = spec["nodes"].as_array().unwrap().iter().find(|n| n["id"] == id).unwrap();
    let mut body = json!({"prompt": prompt, "return_token_ids": true});
    for (k, v) in s.as_object().unwrap() {
        if !["id", "prompt", "fork", "map", "choices", "deadline_s"].contains(&k.as_str()) {
            body[k] = v.clone();
        }
    }
    if let Some(n) = s.get("fork") {
        body["n"] = n.clone();
    }
    body
}

/// Each node's branches against `/v1/completions`, one call at a time in topological order.
async fn check_against_completions(s: &Server, spec: &Value, got: &Value) {
    for id in ["outline", "expand", "vote", "list", "answer", "code"] {
        let n = node(got, id);
        let branches = n["branches"].as_array().unwrap();
        let forked = spec["nodes"].as_array().unwrap().iter().any(|x| x["id"] == id && x.get("fork").is_some());
        if forked {
            let (st, r) = s.post(completion_of(spec, id, branches[0]["prompt"].as_str().unwrap())).await;
            assert_eq!(st, 200, "{r}");
            let choices = r["choices"].as_array().unwrap();
            assert_eq!(choices.len(), branches.len(), "{id}: a fork of N is n: N");
            for (j, (b, c)) in branches.iter().zip(choices).enumerate() {
                assert_eq!(b["prompt"], branches[0]["prompt"]);
                assert_eq!(b["token_ids"], c["token_ids"], "{id}[{j}]: tokens differ from choice {j}");
                assert_eq!(b["text"], c["text"], "{id}[{j}]");
                assert_eq!(b["finish_reason"], c["finish_reason"], "{id}[{j}]");
            }
        } else {
            for (j, b) in branches.iter().enumerate() {
                let (st, r) = s.post(completion_of(spec, id, b["prompt"].as_str().unwrap())).await;
                assert_eq!(st, 200, "{r}");
                let c = &r["choices"][0];
                assert_eq!(b["token_ids"], c["token_ids"], "{id}[{j}]: tokens differ from the completion");
                assert_eq!(b["text"], c["text"], "{id}[{j}]");
                assert_eq!(b["finish_reason"], c["finish_reason"], "{id}[{j}]");
            }
        }
    }
}

/// `{{X}}` is X's branches joined by newlines, `{{X[i]}}` one branch, `{{item}}` the item.
fn check_rendering(got: &Value) {
    let text = |id: &str, j: usize| node(got, id)["branches"][j]["text"].as_str().unwrap().to_string();
    let outline = text("outline", 0);
    let words: Vec<&str> = outline.split(' ').filter(|w| !w.is_empty()).collect();
    let expand = node(got, "expand")["branches"].as_array().unwrap();
    assert!((3..=5).contains(&words.len()), "the outline {outline:?} is not 3 to 5 words");
    assert_eq!(expand.len(), words.len(), "one branch per item of {outline:?}");
    for (b, w) in expand.iter().zip(&words) {
        assert_eq!(b["prompt"], format!("Expand {w}:"));
    }
    assert_eq!(node(got, "vote")["branches"][0]["prompt"], format!("{outline} so"));
    assert_eq!(node(got, "list")["branches"][1]["prompt"], format!("{outline} beta"));
    let pick = node(got, "pick")["choice"].as_str().unwrap().to_string();
    assert_eq!(
        node(got, "answer")["branches"][0]["prompt"],
        format!("{} {pick} {}", text("expand", 0), text("vote", 2))
    );
}

/// A select's scores: the mean log-probability of each choice's tokens after the prompt, by
/// the full forward of the checkpoint (no cache, no batching) in f64; the pick is the best.
fn check_select(got: &Value) {
    let tok = brigade::models::tokenizer::Tokenizer::from_file(&fixture_tokenizer()).unwrap();
    let (model, params) = brigade::models::checkpoint::load_model(checkpoint()).unwrap();
    let n = node(got, "pick");
    let prompt = tok.encode(n["branches"][0]["prompt"].as_str().unwrap()).unwrap();
    let mut best = (f64::NEG_INFINITY, String::new());
    for (j, choice) in [" good", " bad", " the mesh"].iter().enumerate() {
        let c = tok.encode(choice).unwrap();
        let ids: Vec<u32> = prompt.iter().chain(&c).copied().collect();
        let mut acts = brigade::models::Activations::default();
        model.logits(&params, &ids, (1, ids.len()), &mut acts);
        let rows: Vec<&[f32]> = acts.logits.chunks(model.cfg.vocab_size).collect();
        let mut sum = 0.0;
        for t in prompt.len()..ids.len() {
            let row = rows[t - 1];
            let m = row.iter().fold(f64::MIN, |m, &x| m.max(x as f64));
            let lse = m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
            sum += row[ids[t] as usize] as f64 - lse;
        }
        let want = sum / c.len() as f64;
        let score = n["scores"][j].as_f64().unwrap();
        assert!((score - want).abs() < 1e-4, "choice {choice:?}: score {score}, the full forward's {want}");
        assert_eq!(n["branches"][j]["token_ids"], json!(c), "a choice's tokens are forced");
        if want > best.0 + 1e-9 {
            best = (want, choice.to_string());
        }
    }
    assert_eq!(n["choice"], best.1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_node_equals_the_completions_api_alone_and_in_a_crowd() {
    // chunked prompts (16 tokens a step), 2-token blocks, a 1 MiB cache (256 blocks): a crowd
    // preempts
    let s = start(&[
        "--checkpoint",
        checkpoint().to_str().unwrap(),
        "--max-step-tokens",
        "16",
        "--block-size",
        "2",
        "--kv-cache-mib",
        "1",
    ]);
    s.wait_ready().await;
    let spec = every_shape();
    let (st, alone) = s.post_to("/v1/programs", spec.clone()).await;
    assert_eq!(st, 200, "{alone}");
    check_rendering(&alone);
    check_select(&alone);
    check_against_completions(&s, &spec, &alone).await;
    // the branches shared their prompts: a fork's branches after the first computed one token
    for b in node(&alone, "vote")["branches"].as_array().unwrap()[1..].iter() {
        assert_eq!(b["prompt_tokens_computed"], 1, "{b}");
    }
    // what was saved, exactly: every branch's prompt tokens it did not compute (the vote's later
    // branches all but one of theirs, at least)
    let branches: Vec<Value> =
        alone["nodes"].as_object().unwrap().values().flat_map(|n| n["branches"].as_array().unwrap().clone()).collect();
    let n = |b: &Value, k: &str| b[k].as_u64().unwrap();
    let saved: u64 = branches
        .iter()
        .filter(|b| !b["token_ids"].as_array().unwrap().is_empty())
        .map(|b| n(b, "prompt_tokens") - n(b, "prompt_tokens_computed"))
        .sum();
    let vote: u64 =
        node(&alone, "vote")["branches"].as_array().unwrap()[1..].iter().map(|b| n(b, "prompt_tokens") - 1).sum();
    assert_eq!(alone["prefill_tokens_saved"].as_u64(), Some(saved));
    assert!(saved >= vote && vote > 0, "saved {saved}, the vote's branches alone {vote}");
    let generated: usize = alone["nodes"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|n| n["branches"].as_array().unwrap().clone())
        .map(|b| b["token_ids"].as_array().unwrap().len())
        .sum();
    assert_eq!(alone["generated_tokens"], generated);
    // the same calls one at a time, from the reported step times: each branch's whole prompt,
    // then a decode step of one sequence per token it generated
    let (prefill, decode_one) =
        (alone["prefill_s_per_token"].as_f64().unwrap(), alone["decode_step_s"][0][1].as_f64().unwrap());
    assert_eq!(alone["decode_step_s"][0][0], 1);
    let sequential: f64 = branches
        .iter()
        .map(|b| (n(b, "prompt_tokens") as f64, b["token_ids"].as_array().unwrap().len() as f64))
        .filter(|&(_, t)| t > 0.0)
        .map(|(p, t)| p * prefill + t * decode_one)
        .sum();
    let got = alone["sequential_estimate_s"].as_f64().unwrap();
    assert!(prefill > 0.0 && (got - sequential).abs() <= 1e-9 * sequential, "{got} vs {sequential}");
    assert!(alone["failed"].as_array().unwrap().is_empty());
    // the critical path ends at the node that ended last and walks back through inputs
    let path: Vec<String> = serde_json::from_value(alone["critical_path"].clone()).unwrap();
    assert_eq!(path.first().map(String::as_str), Some("outline"));
    // in a crowd: 24 long completions beside it (24 × 58 tokens against a cache of 512), and the
    // program twice more at once
    let before = s.metric("brigade_preemptions_total").await;
    let crowd = (0..24).map(|i| {
        let prompt = ["The planner", "A pipeline", "x"][i % 3];
        s.post(json!({"prompt": prompt, "max_tokens": 55, "temperature": 0.9, "seed": i, "ignore_eos": true}))
    });
    let programs = (0..2).map(|_| s.post_to("/v1/programs", spec.clone()));
    let (others, again) = tokio::join!(futures_util::future::join_all(crowd), futures_util::future::join_all(programs));
    assert!(others.iter().all(|(st, _)| *st == 200));
    assert!(s.metric("brigade_preemptions_total").await > before, "the crowd was meant to preempt");
    for (st, r) in again {
        assert_eq!(st, 200, "{r}");
        for (id, n) in alone["nodes"].as_object().unwrap() {
            let strip = |n: &Value| {
                n["branches"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|b| (b["prompt"].clone(), b["token_ids"].clone(), b["text"].clone()))
                    .collect::<Vec<_>>()
            };
            assert_eq!(strip(&r["nodes"][id]), strip(n), "node {id} changed in the crowd");
        }
    }
}

/// Plan → a branch per tool call → join, on a model with a real chat template: the plan's calls
/// are what `/v1/chat/completions` returns for the same conversation and tools; the map has a
/// branch per call, its prompt filled from the call's fields, each branch what the chat API
/// returns for it; the join what `/v1/completions` returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_map_over_tool_calls_runs_a_branch_per_call_each_equal_to_the_chat_api() {
    let city = json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}}, "required": ["city"], "additionalProperties": false}}});
    let zone = json!({"type": "function", "function": {"name": "get-time", "parameters": {"type": "object",
        "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"], "additionalProperties": false}}});
    for name in ["qwen2", "llama3"] {
        let Some(model) = chat_model_of(name, 1024) else { return };
        let s = start(&["--checkpoint", model.path().to_str().unwrap()]);
        s.wait_ready().await;
        let mut several = false;
        for seed in 0..3 {
            let spec = json!({"nodes": [
                {"id": "plan", "system": "You plan.", "prompt": "Weather and time in Paris?", "tools": [city, zone],
                    "tool_choice": "required", "parallel_tool_calls": true, "max_tokens": 120, "temperature": 1.0, "seed": seed},
                {"id": "act", "map": {"over": "plan", "split": "tool_calls"}, "chat": true,
                    "prompt": "Run {{item.name}} on {{item.arguments}} ({{item.arguments.city}}{{item.name}})", "max_tokens": 6, "temperature": 0.0},
                {"id": "join", "prompt": "{{act}}\nSo:", "max_tokens": 5, "temperature": 0.0}
            ]});
            // `{{item.arguments.city}}` exists on get_weather's calls only: a get-time call fails the
            // map (naming the field), so the spec is run as written and, where it fails, without it
            let (st, mut got) = s.post_to("/v1/programs", spec.clone()).await;
            assert_eq!(st, 200, "{got}");
            let mut spec = spec;
            if !got["nodes"]["act"]["error"].is_null() {
                let e = got["nodes"]["act"]["error"].as_str().unwrap();
                assert!(e.contains("no field 'city'"), "{e}: {got}");
                assert_eq!(got["nodes"]["join"]["error"], "it depends on 'act', which failed");
                spec["nodes"][1]["prompt"] = json!("Run {{item.name}} on {{item.arguments}}");
                let (st, again) = s.post_to("/v1/programs", spec.clone()).await;
                assert_eq!(st, 200, "{again}");
                got = again;
            }
            let plan = node(&got, "plan")["branches"][0].clone();
            let want = json!({"messages": [{"role": "system", "content": "You plan."}, {"role": "user", "content": "Weather and time in Paris?"}],
                "tools": [city, zone], "tool_choice": "required", "parallel_tool_calls": true, "max_tokens": 120,
                "temperature": 1.0, "seed": seed, "return_token_ids": true});
            let (st, alone) = s.post_to("/v1/chat/completions", want).await;
            assert_eq!(st, 200, "{alone}");
            let c = &alone["choices"][0];
            assert_eq!(plan["token_ids"], c["token_ids"], "{name}: the plan differs from the chat API's answer");
            let fields = |calls: &Value| -> Vec<(Value, Value)> {
                calls
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|k| (k["function"]["name"].clone(), k["function"]["arguments"].clone()))
                    .collect()
            };
            let calls = fields(&c["message"]["tool_calls"]);
            assert!(!calls.is_empty());
            assert_eq!(fields(&plan["tool_calls"]), calls, "{name}");
            assert_eq!(plan["content"], c["message"]["content"].as_str().unwrap_or(""));
            several |= calls.len() > 1;
            // a branch per call, in order, each the chat API's answer to its filled prompt
            let act = node(&got, "act")["branches"].as_array().unwrap().clone();
            assert_eq!(act.len(), calls.len(), "{name}: one branch per call");
            for (b, (fname, args)) in act.iter().zip(&calls) {
                let a: Value = serde_json::from_str(args.as_str().unwrap()).unwrap();
                let mut prompt = format!("Run {} on {}", fname.as_str().unwrap(), a);
                if spec["nodes"][1]["prompt"].as_str().unwrap().contains("city") {
                    prompt += &format!(" ({}{})", a["city"].as_str().unwrap(), fname.as_str().unwrap());
                }
                assert_eq!(b["prompt"], prompt.as_str());
                let (st, one) = s
                    .post_to(
                        "/v1/chat/completions",
                        json!({"messages": [{"role": "user", "content": prompt}],
                        "max_tokens": 6, "temperature": 0.0, "return_token_ids": true}),
                    )
                    .await;
                assert_eq!(st, 200, "{one}");
                assert_eq!(b["token_ids"], one["choices"][0]["token_ids"], "{name}: {prompt}");
                assert_eq!(b["text"], one["choices"][0]["message"]["content"]);
            }
            let texts: Vec<&str> = act.iter().map(|b| b["text"].as_str().unwrap()).collect();
            let join = &node(&got, "join")["branches"][0];
            let (st, one) = s
                .post(json!({"prompt": format!("{}\nSo:", texts.join("\n")), "max_tokens": 5, "temperature": 0.0,
                    "return_token_ids": true}))
                .await;
            assert_eq!(st, 200);
            assert_eq!(join["token_ids"], one["choices"][0]["token_ids"]);
        }
        assert!(several || name == "llama3", "{name}: no seed made parallel calls; the map was never wider than 1");
        // what a tool node may not be, refused before anything runs
        let weather = json!([city]);
        for (body, want) in [
            (
                json!({"nodes": [{"id": "a", "prompt": "x"}, {"id": "b", "map": {"over": "a", "split": "tool_calls"}, "prompt": "{{item}}"}]}),
                "maps over the tool calls of 'a', which offers no tools",
            ),
            (json!({"nodes": [{"id": "a", "prompt": "x", "tools": weather, "chat": false}]}), "only a chat node takes"),
            (
                json!({"nodes": [{"id": "a", "prompt": "x", "tools": [{"type": "function", "function": {"name": "a b"}}]}]}),
                "node 'a': 'tools[0].function.name' is 'a b'",
            ),
            (json!({"nodes": [{"id": "a", "prompt": "x", "tool_choice": "required"}]}), "node 'a'"),
            (
                json!({"nodes": [{"id": "a", "prompt": "x", "tools": weather, "choices": ["y"]}]}),
                "cannot be a chat node",
            ),
            (json!({"nodes": [{"id": "a", "prompt": "x", "chat": true, "messages": []}]}), "set by the program"),
        ] {
            let (st, r) = s.post_to("/v1/programs", body.clone()).await;
            assert_eq!(st, 400, "{body}: {r}");
            let m = r["error"]["message"].as_str().unwrap();
            assert!(m.contains(want), "{body}: {m}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_node_fails_its_dependents_and_no_other() {
    let s = start(&["--checkpoint", checkpoint().to_str().unwrap()]);
    s.wait_ready().await;
    // the tiny model's context is 64 tokens: far more than that, whatever the tokenizer merges
    let long = format!("{{{{a}}}} {}", "The mesh of ranks, 42 pipelines; ".repeat(30));
    // a select's prompt and choice fill the context exactly, or overfill it by a token
    let tok = brigade::models::tokenizer::Tokenizer::from_file(&fixture_tokenizer()).unwrap();
    let room = 64 - tok.encode("The mesh").unwrap().len();
    let count = |c: &str| tok.encode(c).unwrap().len() - tok.encode("").unwrap().len();
    let fill =
        |n: usize| (1..200).map(|j| " a".repeat(j)).find(|c| count(c) == n).expect("a choice of that many tokens");
    let (exact, over) = (fill(room), fill(room + 1));
    let spec = json!({"nodes": [
        {"id": "a", "prompt": "The mesh", "max_tokens": 10, "temperature": 0},
        {"id": "too_long", "prompt": long, "max_tokens": 4},
        {"id": "after_long", "prompt": "{{too_long}} and", "max_tokens": 4},
        {"id": "not_json", "map": {"over": "a", "split": "json"}, "prompt": "{{item}}", "max_tokens": 4},
        {"id": "late", "prompt": "{{a}}", "max_tokens": 40, "ignore_eos": true, "deadline_s": 0.000001},
        {"id": "after_late", "prompt": "{{late}}", "max_tokens": 4},
        {"id": "fine", "prompt": "{{a}} too", "max_tokens": 4, "temperature": 0},
        {"id": "unmet", "prompt": "{{a}}", "max_tokens": 2, "guided_regex": "[a-z]{10}"},
        {"id": "after_unmet", "prompt": "{{unmet}}", "max_tokens": 2},
        // cut by max_tokens where the language could end: met
        {"id": "met", "prompt": "{{a}}", "max_tokens": 2, "ignore_eos": true, "guided_regex": "[a-z]+"},
        {"id": "fills", "prompt": "The mesh", "choices": [exact, " mesh"]},
        {"id": "overfills", "prompt": "The mesh", "choices": [" mesh", over]}
    ]});
    let (st, r) = s.post_to("/v1/programs", spec).await;
    assert_eq!(st, 200, "{r}");
    let err =
        |id: &str| r["nodes"][id]["error"].as_str().unwrap_or_else(|| panic!("{id} did not fail: {r}")).to_string();
    assert!(err("too_long").contains("context"), "{}", err("too_long"));
    assert!(err("after_long").contains("'too_long', which failed"), "{}", err("after_long"));
    assert!(err("not_json").contains("not a JSON array"), "{}", err("not_json"));
    assert!(err("late").contains("deadline"), "{}", err("late"));
    assert!(err("after_late").contains("'late', which failed"));
    assert!(err("unmet").contains("did not meet its constraint within max_tokens (2)"), "{}", err("unmet"));
    assert!(err("after_unmet").contains("'unmet', which failed"));
    assert!(err("overfills").contains("the model's context is 64"), "{}", err("overfills"));
    for ok in ["a", "fine", "met", "fills"] {
        assert!(r["nodes"][ok]["error"].is_null(), "{ok}: {r}");
    }
    let mut failed: Vec<String> = serde_json::from_value(r["failed"].clone()).unwrap();
    failed.sort();
    assert_eq!(
        failed,
        ["after_late", "after_long", "after_unmet", "late", "not_json", "overfills", "too_long", "unmet"]
    );
    // nothing is left running or holding blocks (within a bound a loaded machine meets)
    let t0 = std::time::Instant::now();
    while s.metric("brigade_running_sequences").await > 0.0 || s.metric("brigade_kv_blocks_used").await > 0.0 {
        assert!(t0.elapsed() < Duration::from_secs(2), "sequences or blocks still held 2 s after the program");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_programs_are_refused_before_anything_runs() {
    let s = start(&["--checkpoint", checkpoint().to_str().unwrap()]);
    s.wait_ready().await;
    for (body, status, want) in [
        (json!({"nodes": [{"id": "a", "prompt": "{{b}}"}, {"id": "b", "prompt": "{{a}}"}]}), 400, "cycle"),
        (json!({"nodes": [{"id": "a", "prompt": "{{nope}}"}]}), 400, "'nope'"),
        (
            json!({"nodes": [{"id": "a", "prompt": "x", "temperature": 5}]}),
            400,
            "node 'a': 'temperature' must be from 0 to 2",
        ),
        (
            json!({"nodes": [{"id": "a", "prompt": "x", "frobnicate": 1}]}),
            400,
            "node 'a': unsupported parameter 'frobnicate'",
        ),
        (json!({"nodes": [{"id": "a", "prompt": "x", "stream": true}]}), 400, "set by the program"),
        (json!({"model": "other", "nodes": [{"id": "a", "prompt": "x"}]}), 404, "does not exist"),
        (json!({"nodes": [{"id": "a", "prompt": "x", "fork": 1000}]}), 400, "fork"),
        (json!([1, 2]), 400, "object"),
        (
            json!({"nodes": [{"id": "a", "prompt": "x", "guided_regex": "("}]}),
            400,
            "node 'a': the constraint does not compile",
        ),
    ] {
        let (st, r) = s.post_to("/v1/programs", body.clone()).await;
        assert_eq!(st, status, "{body}: {r}");
        let m = r["error"]["message"].as_str().unwrap();
        assert!(m.contains(want), "{body}: {m}");
    }
    assert_eq!(s.metric("brigade_generation_tokens_total").await, 0.0, "nothing ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_streamed_program_sends_each_node_as_it_ends_then_the_result() {
    let s = start(&["--checkpoint", checkpoint().to_str().unwrap()]);
    s.wait_ready().await;
    let mut spec = every_shape();
    let (_, whole) = s.post_to("/v1/programs", spec.clone()).await;
    spec["stream"] = json!(true);
    let events = s.stream_to("/v1/programs", spec).await;
    let (nodes, last) = events.split_at(events.len() - 1);
    assert_eq!(nodes.len(), 7, "an event per node");
    let mut ends = Vec::new();
    for e in nodes {
        let id = e["node"].as_str().unwrap();
        assert_eq!(e["branches"].as_array().unwrap().len(), whole["nodes"][id]["branches"].as_array().unwrap().len());
        // greedy and seeded nodes: the same tokens as the unstreamed run
        for (a, b) in e["branches"].as_array().unwrap().iter().zip(whole["nodes"][id]["branches"].as_array().unwrap()) {
            assert_eq!(a["token_ids"], b["token_ids"], "{id}");
        }
        ends.push(e["end_s"].as_f64().unwrap());
    }
    assert!(ends.windows(2).all(|w| w[0] <= w[1]), "events in the order the nodes ended: {ends:?}");
    assert_eq!(last[0]["object"], "program.result");
    assert_eq!(last[0]["nodes"].as_object().unwrap().len(), 7);
}

/// The chain's forks are as wide and long as the program limits and the test model's 64
/// positions allow, so that a loaded machine cannot finish half of it before a client's
/// departure is noticed (at 32 × 30 it sometimes did).
const CHAIN_FORK: usize = 64;
const CHAIN_TOKENS: usize = 50;

/// A chain of 31 forks of 64 × 50 tokens, each after a select on the one before: ≥ 1,550 steps
/// one after another, far longer than the few hundred milliseconds the tests wait.
fn chain() -> Vec<Value> {
    let fork = |i: usize, prompt: String| json!({"id": format!("n{i}"), "prompt": prompt, "fork": CHAIN_FORK, "max_tokens": CHAIN_TOKENS, "ignore_eos": true, "seed": 1, "temperature": 1.0});
    let mut nodes = vec![fork(0, "The mesh".into())];
    for i in 1..31 {
        nodes.push(json!({"id": format!("s{i}"), "prompt": format!("{{{{n{}[0]}}}}", i - 1), "choices": [" a", " b"]}));
        nodes.push(fork(i, format!("The mesh{{{{s{i}}}}}")));
    }
    nodes
}

/// A program takes places in flight like requests do (its `max_parallel`): past the server's
/// limit a program or a completion gets 503 with Retry-After, and the places come back after.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overload_refuses_programs_with_503() {
    let s = start(&[
        "--checkpoint",
        checkpoint().to_str().unwrap(),
        "--max-running",
        "2",
        "--max-queued",
        "0",
        "--threads",
        "1",
    ]);
    s.wait_ready().await;
    let client = reqwest::Client::new();
    let long = client.post(format!("{}/v1/programs", s.url)).json(&json!({"max_parallel": 2, "nodes": chain()})).send();
    let probe = async {
        // once the long program runs (a bound a loaded machine meets)
        let t0 = std::time::Instant::now();
        while s.metric("brigade_running_sequences").await == 0.0 {
            assert!(t0.elapsed() < Duration::from_secs(10), "the long program did not start");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let r = client
            .post(format!("{}/v1/programs", s.url))
            .json(&json!({"nodes": [{"id": "a", "prompt": "x", "max_tokens": 2}]}))
            .send()
            .await
            .unwrap();
        let retry = r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string());
        let (st, body): (u16, Value) = (r.status().as_u16(), r.json().await.unwrap());
        let (st2, _) = s.post(json!({"prompt": "x", "max_tokens": 2})).await;
        (st, body, retry, st2)
    };
    let (first, (st, body, retry, st2)) = tokio::join!(long, probe);
    assert_eq!((st, retry.as_deref()), (503, Some("1")), "{body}");
    assert_eq!(st2, 503, "a completion past the limit too");
    assert_eq!(first.unwrap().status(), 200);
    let (st, r) = s.post_to("/v1/programs", json!({"nodes": [{"id": "a", "prompt": "x", "max_tokens": 2}]})).await;
    assert_eq!(st, 200, "the places came back: {r}");
}

/// A client that goes away mid-program aborts all of it: generation stops long before the
/// program's tokens are made, and every block is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_goes_away_aborts_the_whole_program() {
    let s = start(&["--checkpoint", checkpoint().to_str().unwrap(), "--threads", "1"]);
    s.wait_ready().await;
    let nodes = chain();
    let total = (31 * CHAIN_FORK * CHAIN_TOKENS) as f64;
    let client = reqwest::Client::new();
    let send = client.post(format!("{}/v1/programs", s.url)).json(&json!({"nodes": nodes})).send();
    assert!(tokio::time::timeout(Duration::from_millis(300), send).await.is_err(), "the program ended within 300 ms");
    // idle and making nothing for 200 ms on end (a chain's node may end a moment before the
    // next one is admitted: one idle reading alone does not show the program gone)
    let t0 = Instant::now();
    let mut idle_since: Option<(Instant, f64)> = None;
    loop {
        let idle = s.metric("brigade_running_sequences").await == 0.0
            && s.metric("brigade_kv_blocks_used").await == 0.0
            && s.metric("brigade_queue_depth").await == 0.0;
        let tokens = s.metric("brigade_generation_tokens_total").await;
        idle_since = match idle_since {
            Some((since, at)) if idle && at == tokens => {
                if since.elapsed() >= Duration::from_millis(200) {
                    break;
                }
                Some((since, at))
            }
            _ if idle => Some((Instant::now(), tokens)),
            _ => None,
        };
        assert!(t0.elapsed() < Duration::from_secs(5), "the program's sequences still run 5 s after the client left");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let made = s.metric("brigade_generation_tokens_total").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(s.metric("brigade_generation_tokens_total").await, made, "generation went on");
    assert!(made < total / 2.0, "{made} of {total} tokens: the program was not cut short");
}

/// `brigade run` runs the same program (TOML here) with the same runner: the same outputs as
/// the server's; a bad program or file ends with one line and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn brigade_run_gives_the_servers_result_without_a_server() {
    let d = tempfile::tempdir().unwrap();
    let toml = r#"
[[nodes]]
id = "outline"
prompt = "The mesh"
max_tokens = 10
temperature = 0

[[nodes]]
id = "vote"
prompt = "{{outline}} so"
fork = 3
seed = 11
temperature = 1.0
max_tokens = 8

[[nodes]]
id = "pick"
prompt = "{{vote[1]}} is"
choices = [" good", " bad"]
"#;
    std::fs::write(d.path().join("p.toml"), toml).unwrap();
    let ck = checkpoint().to_str().unwrap();
    ok(&["run", "p.toml", "--checkpoint", ck, "--threads", "1", "--out", "r.json"], d.path());
    let local: Value = serde_json::from_slice(&std::fs::read(d.path().join("r.json")).unwrap()).unwrap();
    let s = start(&["--checkpoint", ck]);
    s.wait_ready().await;
    let spec = json!({"nodes": [
        {"id": "outline", "prompt": "The mesh", "max_tokens": 10, "temperature": 0},
        {"id": "vote", "prompt": "{{outline}} so", "fork": 3, "seed": 11, "temperature": 1.0, "max_tokens": 8},
        {"id": "pick", "prompt": "{{vote[1]}} is", "choices": [" good", " bad"]}]});
    let (_, served) = s.post_to("/v1/programs", spec).await;
    for id in ["outline", "vote", "pick"] {
        for (a, b) in local["nodes"][id]["branches"]
            .as_array()
            .unwrap()
            .iter()
            .zip(served["nodes"][id]["branches"].as_array().unwrap())
        {
            assert_eq!((&a["prompt"], &a["token_ids"]), (&b["prompt"], &b["token_ids"]), "{id}");
        }
    }
    assert_eq!(local["nodes"]["pick"]["choice"], served["nodes"]["pick"]["choice"]);
    // bad input: one line, nothing written
    std::fs::write(d.path().join("cycle.json"), r#"{"nodes": [{"id": "a", "prompt": "{{a}}"}]}"#).unwrap();
    fails_with(&["run", "cycle.json", "--checkpoint", ck, "--out", "c.json"], d.path(), "names itself");
    fails_with(&["run", "missing.json", "--checkpoint", ck], d.path(), "cannot read the program");
    std::fs::write(d.path().join("bad.toml"), "nodes = 3").unwrap();
    fails_with(&["run", "bad.toml", "--checkpoint", ck], d.path(), "nodes");
    assert!(!Path::new(&d.path().join("c.json")).exists());
}

/// `[0-9]{3}-[a-z]{2}`, checked by hand.
fn is_code(t: &str) -> bool {
    let b = t.as_bytes();
    b.len() == 6 && b[..3].iter().all(u8::is_ascii_digit) && b[3] == b'-' && b[4..].iter().all(u8::is_ascii_lowercase)
}

/// Structured outputs through `/v1/completions`: a regex, a choice and a JSON schema, each
/// output in its language and ended by it ("stop"), sampled (the constraint masks, the
/// sampler still draws); alone and in a crowd, the same tokens; bad constraints get 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn structured_outputs_parse_and_stay_batch_invariant() {
    let s = start(&["--checkpoint", checkpoint().to_str().unwrap(), "--max-step-tokens", "16", "--block-size", "2"]);
    s.wait_ready().await;
    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
        "required": ["ok", "n"], "additionalProperties": false});
    let bodies = [
        json!({"prompt": "The mesh", "max_tokens": 10, "temperature": 0.9, "seed": 1, "n": 3, "guided_regex": "[0-9]{3}-[a-z]{2}"}),
        json!({"prompt": "The mesh", "max_tokens": 10, "temperature": 1.0, "seed": 2, "n": 4, "guided_choice": ["alpha", "beta gamma", "delta"]}),
        json!({"prompt": "The mesh", "max_tokens": 40, "temperature": 0.9, "seed": 3,
            "response_format": {"type": "json_schema", "json_schema": {"name": "v", "schema": schema}}}),
        json!({"prompt": "A pipeline", "max_tokens": 40, "temperature": 0.9, "seed": 4, "guided_json": schema}),
    ];
    let mut alone = Vec::new();
    for b in &bodies {
        let mut b = b.clone();
        b["return_token_ids"] = json!(true);
        let (st, r) = s.post(b.clone()).await;
        assert_eq!(st, 200, "{b}: {r}");
        for c in r["choices"].as_array().unwrap() {
            let t = c["text"].as_str().unwrap();
            assert_eq!(c["finish_reason"], "stop", "{b}: {t:?}");
            if b.get("guided_regex").is_some() {
                assert!(is_code(t), "{t:?} is not [0-9]{{3}}-[a-z]{{2}}");
            } else if b.get("guided_choice").is_some() {
                assert!(["alpha", "beta gamma", "delta"].contains(&t), "{t:?}");
            } else {
                let v: Value = serde_json::from_str(t).unwrap_or_else(|e| panic!("{t:?} is not JSON: {e}"));
                assert!(v["ok"].is_boolean() && [1, 2, 3].contains(&v["n"].as_i64().unwrap_or(0)), "{v}");
                assert_eq!(v.as_object().unwrap().len(), 2, "{v}");
            }
        }
        alone.push(r["choices"].clone());
    }
    // the choices of one request were sampled, not all forced alike
    let texts: Vec<&str> = alone[1].as_array().unwrap().iter().map(|c| c["text"].as_str().unwrap()).collect();
    assert!(texts.iter().any(|t| *t != texts[0]), "4 seeded choices all gave {texts:?}");
    // in a crowd: the same tokens
    let crowd = (0..8).map(|i| {
        s.post(json!({"prompt": "x y", "max_tokens": 30 + i, "temperature": 0.8, "seed": i, "ignore_eos": true}))
    });
    let again = bodies.iter().map(|b| {
        let mut b = b.clone();
        b["return_token_ids"] = json!(true);
        s.post(b)
    });
    let (_, again) = tokio::join!(futures_util::future::join_all(crowd), futures_util::future::join_all(again));
    for (i, (st, r)) in again.into_iter().enumerate() {
        assert_eq!(st, 200);
        assert_eq!(r["choices"], alone[i], "request {i} changed in the crowd");
    }
    // bad constraints: 400 naming the field, before anything runs
    for (body, param) in [
        (json!({"prompt": "x", "guided_regex": "("}), "guided_regex"),
        (json!({"prompt": "x", "guided_regex": "a", "guided_choice": ["b"]}), "guided_choice"),
        (json!({"prompt": "x", "guided_choice": []}), "guided_choice"),
        (json!({"prompt": "x", "response_format": {"type": "json_schema"}}), "response_format"),
        (json!({"prompt": "x", "guided_json": "not json"}), "guided_json"),
    ] {
        let (st, e) = s.post(body.clone()).await;
        assert_eq!((st, e["error"]["param"].as_str()), (400, Some(param)), "{body}: {e}");
    }
}

/// Characters with a meaning in the constraint languages stay literal: choices holding regex
/// operators, quotes, a backslash and non-ASCII come back exactly as written (an unescaped
/// `a.b` would allow `axb`, `(x|y)*` the empty string); a JSON schema whose property name and
/// enum strings hold quotes and backslashes gives JSON with exactly those; a regex with
/// escaped operators matches them literally.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn special_characters_in_constraints_are_taken_literally() {
    let s = start(&["--checkpoint", checkpoint().to_str().unwrap()]);
    s.wait_ready().await;
    let choices = ["a.b", "(x|y)*", "$1.00 [sale]", "back\\slash", "ünï \"q\"", "^~&#-"];
    let (st, r) = s
        .post(json!({"prompt": "The mesh", "max_tokens": 24, "temperature": 1.0, "seed": 5, "n": 12,
            "guided_choice": choices}))
        .await;
    assert_eq!(st, 200, "{r}");
    let texts: Vec<&str> = r["choices"].as_array().unwrap().iter().map(|c| c["text"].as_str().unwrap()).collect();
    for t in &texts {
        assert!(choices.contains(t), "{t:?} is none of the choices");
    }
    assert!(texts.iter().any(|t| *t != texts[0]), "12 seeded choices all gave {texts:?}");
    let key = "we\"ird\\key";
    let schema = json!({"type": "object", "properties": {key: {"enum": ["x\\y", "\"q\"", "a\nb"]}},
        "required": [key], "additionalProperties": false});
    let (st, r) = s
        .post(json!({"prompt": "A pipeline", "max_tokens": 40, "temperature": 1.0, "seed": 6, "n": 6, "guided_json": schema}))
        .await;
    assert_eq!(st, 200, "{r}");
    for c in r["choices"].as_array().unwrap() {
        let t = c["text"].as_str().unwrap();
        let v: Value = serde_json::from_str(t).unwrap_or_else(|e| panic!("{t:?} is not JSON: {e}"));
        let o = v.as_object().unwrap();
        assert_eq!(o.keys().collect::<Vec<_>>(), [key], "{t}");
        assert!(["x\\y", "\"q\"", "a\nb"].contains(&o[key].as_str().unwrap()), "{t}");
    }
    let (st, r) = s
        .post(json!({"prompt": "x", "max_tokens": 12, "temperature": 1.0, "seed": 7, "n": 6,
            "guided_regex": "\\$[0-9]\\.[0-9]{2} \\(net\\)"}))
        .await;
    assert_eq!(st, 200, "{r}");
    for c in r["choices"].as_array().unwrap() {
        let t = c["text"].as_str().unwrap();
        let b = t.as_bytes();
        let ok = b.len() == 11
            && b[0] == b'$'
            && b[1].is_ascii_digit()
            && b[2] == b'.'
            && b[3..5].iter().all(u8::is_ascii_digit)
            && &t[5..] == " (net)";
        assert!(ok, "{t:?} is not $D.DD (net)");
    }
}
