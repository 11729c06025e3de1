//! `brigade bench programs`: programs of generation calls run inside the engine
//! (`POST /v1/programs`) side by side, in one run on one server, with (a) the same calls sent
//! one at a time through `/v1/completions` and (b) the same graph driven by a client through
//! `/v1/completions` with unlimited concurrency (each node's calls sent together as soon as its
//! inputs are back, SGLang's frontend's way). Random weights of a preset shape, greedy with
//! `ignore_eos` (fixed output lengths), the GPT-2 tokenizer (programs are text). Every
//! baseline's tokens are checked equal to the program's. Also: the prompt tokens computed for
//! a fork of 8 over a 200-token prefix, and the ITL p99 of 16 background streams with the
//! program beside them at `max_parallel` auto and unbounded.

use super::loadgen::{self, Arrivals, Load};
use anyhow::{bail, Context, Result};
use brigade::models::checkpoint;
use brigade::models::{Gpt, GptConfig};
use brigade_serve::model::weights::WeightFormat;
use brigade_serve::program::{Fanout, Limits, Program};
use brigade_serve::source::Source;
use clap::Args;
use futures_util::stream::{FuturesUnordered, StreamExt};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct Flags {
    /// Model preset (random weights).
    #[arg(long, default_value = "gpt2-small")]
    model: String,
    /// The tokenizer.json to pair with it (default: ../shared/tokenizers/gpt2/tokenizer.json).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    #[arg(long, default_value_t = crate::threads::default_threads())]
    threads: usize,
    /// Runs of each side (the median is reported).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Skip the background-load comparison (the longest part).
    #[arg(long)]
    no_load: bool,
    #[arg(long)]
    json: bool,
}

fn gen(id: &str, prompt: &str, max_tokens: usize) -> Value {
    json!({"id": id, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true})
}

/// Skeleton-of-Thought: a 32-token outline of 8 points, each expanded to 48 tokens, a
/// 32-token join. (The points are given as items: random weights write no outline a split
/// could count on; the graph's timing is the same.)
fn skeleton_of_thought(width: Value) -> Value {
    let points: Vec<String> = (1..=8).map(|i| format!("point {i}")).collect();
    let mut expand = gen("expand", "{{outline}}\nExpand {{item}}:", 48);
    expand["map"] = json!({"items": points});
    json!({"max_parallel": width, "nodes": [
        gen("outline", "Question: how does a pipeline schedule hide its bubble?\nOutline:", 32),
        expand,
        gen("answer", "{{expand}}\nAnswer:", 32),
    ]})
}

/// A tool-calling DAG: a plan, 4 independent 64-token calls, follow-ups to 2 of them, a join.
fn tool_dag(width: Value) -> Value {
    json!({"max_parallel": width, "nodes": [
        gen("plan", "Task: compare three parallel layouts.\nPlan:", 32),
        gen("t1", "{{plan}}\nTool 1:", 64),
        gen("t2", "{{plan}}\nTool 2:", 64),
        gen("t3", "{{plan}}\nTool 3:", 64),
        gen("t4", "{{plan}}\nTool 4:", 64),
        gen("f1", "{{t1}}\nFollow-up:", 64),
        gen("f2", "{{t2}}\nFollow-up:", 64),
        gen("join", "{{f1}}\n{{f2}}\n{{t3}}\n{{t4}}\nAnswer:", 32),
    ]})
}

/// A fork of 8 over a prompt of about 200 tokens.
fn fork_of_8() -> Value {
    let prefix = "The pipeline splits the model into stages; each stage runs its layers on a micro-batch and hands the activations on. ".repeat(9);
    let mut n = gen("vote", &format!("{prefix}\nVerdict:"), 16);
    n["fork"] = json!(8);
    json!({"nodes": [n]})
}

async fn post(client: &reqwest::Client, url: &str, path: &str, body: &Value) -> Result<Value> {
    let r = client.post(format!("{url}{path}")).json(body).send().await?;
    let status = r.status();
    let v: Value = r.json().await?;
    if !status.is_success() {
        bail!("{path} answered {status}: {v}");
    }
    Ok(v)
}

/// The completions calls a node's branches stand for: (prompt, n), from the program's result.
fn calls(p: &Program, result: &Value, i: usize) -> Vec<(String, usize)> {
    let node = &p.nodes[i];
    let branches = result["nodes"][&node.id]["branches"].as_array().cloned().unwrap_or_default();
    match node.fanout {
        Fanout::Fork(k) => vec![(branches[0]["prompt"].as_str().unwrap_or_default().to_string(), k)],
        _ => branches.iter().map(|b| (b["prompt"].as_str().unwrap_or_default().to_string(), 1)).collect(),
    }
}

/// One completions call: its choices' token ids.
async fn call(client: &reqwest::Client, url: &str, node: &Value, prompt: &str, n: usize) -> Result<Vec<Value>> {
    let mut body = json!({"prompt": prompt, "n": n, "return_token_ids": true});
    for k in ["max_tokens", "temperature", "ignore_eos"] {
        body[k] = node[k].clone();
    }
    let v = post(client, url, "/v1/completions", &body).await?;
    Ok(v["choices"].as_array().context("no choices")?.iter().map(|c| c["token_ids"].clone()).collect())
}

fn spec_node<'a>(spec: &'a Value, id: &str) -> &'a Value {
    spec["nodes"].as_array().and_then(|a| a.iter().find(|n| n["id"] == id)).expect("a node of the spec")
}

/// Whether a node's calls gave the program's tokens.
fn same(result: &Value, id: &str, got: &[Value]) -> bool {
    let want: Vec<&Value> = result["nodes"][id]["branches"]
        .as_array()
        .map(|b| b.iter().map(|b| &b["token_ids"]).collect())
        .unwrap_or_default();
    want.len() == got.len() && want.iter().zip(got).all(|(a, b)| *a == b)
}

/// What a baseline replays: the program, its spec and result, and the server.
#[derive(Clone, Copy)]
struct Replay<'a> {
    client: &'a reqwest::Client,
    url: &'a str,
    spec: &'a Value,
    p: &'a Program,
    result: &'a Value,
}

/// (a): every call one at a time, in the program's order. Seconds, and whether every token
/// matched the program's.
async fn one_at_a_time(r: &Replay<'_>) -> Result<(f64, bool)> {
    let Replay { client, url, spec, p, result } = *r;
    let t0 = Instant::now();
    let mut ok = true;
    for (i, node) in p.nodes.iter().enumerate() {
        let mut got = Vec::new();
        for (prompt, n) in calls(p, result, i) {
            got.extend(call(client, url, spec_node(spec, &node.id), &prompt, n).await?);
        }
        ok &= same(result, &node.id, &got);
    }
    Ok((t0.elapsed().as_secs_f64(), ok))
}

/// (b): each node's calls all at once as soon as its inputs are back.
async fn client_driven(r: &Replay<'_>) -> Result<(f64, bool)> {
    let Replay { client, url, spec, p, result } = *r;
    let t0 = Instant::now();
    let mut done = vec![false; p.nodes.len()];
    let mut started = vec![false; p.nodes.len()];
    let mut running = FuturesUnordered::new();
    let mut ok = true;
    loop {
        for (i, node) in p.nodes.iter().enumerate() {
            if !started[i] && node.deps.iter().all(|&d| done[d]) {
                started[i] = true;
                let node = spec_node(spec, &node.id).clone();
                let cs = calls(p, result, i);
                running.push(async move {
                    let all =
                        futures_util::future::join_all(cs.iter().map(|(pr, n)| call(client, url, &node, pr, *n))).await;
                    let mut got = Vec::new();
                    for r in all {
                        got.extend(r?);
                    }
                    Ok::<_, anyhow::Error>((i, got))
                });
            }
        }
        let Some(r) = running.next().await else { break };
        let (i, got) = r?;
        ok &= same(result, &p.nodes[i].id, &got);
        done[i] = true;
    }
    Ok((t0.elapsed().as_secs_f64(), ok))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A checkpoint of the preset's shape with random weights and the tokenizer, in a temporary
/// directory.
fn checkpoint_dir(model: &str, tokenizer: &std::path::Path) -> Result<tempfile::TempDir> {
    let mut cfg = GptConfig::preset(model)?;
    let words = brigade::models::tokenizer::Tokenizer::from_file(tokenizer)?.vocab_size();
    if words > cfg.vocab_size {
        // a shape whose own tokenizer is not here: its vocabulary widened to the one given
        eprintln!(
            "bench programs: {model}'s vocabulary widened from {} to the tokenizer's {words} tokens",
            cfg.vocab_size
        );
        cfg.vocab_size = words;
    }
    let gpt = Gpt::new(cfg)?;
    let params = gpt.init_params(1);
    let d = tempfile::tempdir()?;
    checkpoint::write_json(&d.path().join("config.json"), &checkpoint::hf_config(&cfg))?;
    checkpoint::save_tensors(&d.path().join("model.safetensors"), &gpt.layout, &params, "", None)?;
    std::fs::copy(tokenizer, d.path().join("tokenizer.json"))
        .with_context(|| format!("cannot read the tokenizer {}", tokenizer.display()))?;
    Ok(d)
}

pub fn run(f: Flags) -> Result<()> {
    crate::threads::check_threads(f.threads, "--threads")?;
    if f.repeats == 0 || f.repeats > 100 {
        bail!("--repeats must be from 1 to 100, got {}", f.repeats);
    }
    let tokenizer = match &f.tokenizer {
        Some(t) => t.clone(),
        None => {
            let t = std::env::current_dir()?.join("../shared/tokenizers/gpt2/tokenizer.json");
            if !t.exists() {
                bail!("no tokenizer at {}: give --tokenizer FILE (a GPT-2 tokenizer.json)", t.display());
            }
            t
        }
    };
    let dir = checkpoint_dir(&f.model, &tokenizer)?;
    let url = super::serve::start_server(
        Source::Checkpoint(dir.path().to_path_buf()),
        f.threads,
        (1, WeightFormat::F32, brigade_serve::model::KvDtype::F32),
        64,
    )?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(measure(&f, &url))
}

async fn measure(f: &Flags, url: &str) -> Result<()> {
    let client = reqwest::Client::builder().pool_max_idle_per_host(1024).build()?;
    let limits = Limits::default();
    let mut rows = Vec::new();
    for (name, spec) in
        [("skeleton-of-thought", skeleton_of_thought(json!("auto"))), ("tool-dag", tool_dag(json!("auto")))]
    {
        let p = Program::from_value(&spec, &limits).map_err(anyhow::Error::msg)?;
        // a warm-up run (the engine measures its step times at the first program)
        let result = post(&client, url, "/v1/programs", &spec).await?;
        let (mut inside, mut seq, mut cli) = (Vec::new(), Vec::new(), Vec::new());
        let (mut seq_ok, mut cli_ok) = (true, true);
        let mut last = result.clone();
        for _ in 0..f.repeats {
            let t0 = Instant::now();
            last = post(&client, url, "/v1/programs", &spec).await?;
            inside.push(t0.elapsed().as_secs_f64());
            let replay = Replay { client: &client, url, spec: &spec, p: &p, result: &last };
            let (s, ok) = one_at_a_time(&replay).await?;
            seq.push(s);
            seq_ok &= ok;
            let (c, ok) = client_driven(&replay).await?;
            cli.push(c);
            cli_ok &= ok;
        }
        let (inside, seq, cli) = (median(inside), median(seq), median(cli));
        let row = json!({"shape": name, "program_s": inside, "one_at_a_time_s": seq, "client_driven_s": cli,
            "speedup_vs_one_at_a_time": seq / inside, "speedup_vs_client_driven": cli / inside,
            "tokens_match_one_at_a_time": seq_ok, "tokens_match_client_driven": cli_ok,
            "sequential_estimate_s": last["sequential_estimate_s"], "max_parallel": last["max_parallel"],
            "generated_tokens": last["generated_tokens"], "prefill_tokens_saved": last["prefill_tokens_saved"]});
        if !f.json {
            outln!(
                "{name}: program {inside:.2} s; one call at a time {seq:.2} s ({:.2}×); client-driven {cli:.2} s ({:.2}×); tokens equal: {seq_ok}/{cli_ok}; {} tokens, max_parallel {}, {} prompt tokens shared; predicted one at a time {:.2} s",
                seq / inside,
                cli / inside,
                last["generated_tokens"],
                last["max_parallel"],
                last["prefill_tokens_saved"],
                last["sequential_estimate_s"].as_f64().unwrap_or(0.0)
            );
        }
        rows.push(row);
    }
    // what bounds the speedups: the engine's own decode step time by batch size
    let profile = post(&client, url, "/v1/programs", &json!({"nodes": [gen("p", "x", 1)]})).await?;
    let curve: Vec<String> = profile["decode_step_s"]
        .as_array()
        .map(|a| a.iter().map(|d| format!("{} → {:.1} ms", d[0], 1e3 * d[1].as_f64().unwrap_or(0.0))).collect())
        .unwrap_or_default();
    if !f.json {
        outln!("the engine's decode step by batch size: {}", curve.join(", "));
    }
    // the fork's prompt tokens: computed by the engine against one branch's prompt
    let fork = post(&client, url, "/v1/programs", &fork_of_8()).await?;
    let branches = fork["nodes"]["vote"]["branches"].as_array().context("the fork's branches")?;
    let one = branches[0]["prompt_tokens"].as_f64().unwrap_or(0.0);
    let computed: f64 = branches.iter().map(|b| b["prompt_tokens_computed"].as_f64().unwrap_or(0.0)).sum();
    if !f.json {
        outln!(
            "fork of 8 over a {one:.0}-token prompt: {computed:.0} prompt tokens computed = {:.3}× one branch's (8 separate requests admitted together: 8×)",
            computed / one
        );
    }
    let fork_row = json!({"prompt_tokens": one, "computed": computed, "ratio": computed / one});
    let mut load_rows = Vec::new();
    if !f.no_load {
        // 16 background streams of 256 tokens; the program starts 1 s in
        let load = Load {
            url: url.to_string(),
            model: None,
            arrivals: Arrivals::Concurrency(16),
            requests: 16,
            prompt_len: 32,
            output_len: 256,
            vocab: 50_000,
            seed: 3,
            tools: None,
        };
        let alone = loadgen::run(&load).await?;
        if !f.json {
            outln!("16 background streams alone: ITL p50 {:.1} ms p99 {:.1} ms", alone.itl_p50_ms, alone.itl_p99_ms);
        }
        load_rows.push(json!({"with": "nothing", "itl_p99_ms": alone.itl_p99_ms, "itl_p50_ms": alone.itl_p50_ms}));
        for (what, width) in [("auto", json!("auto")), ("unbounded", json!(64))] {
            let spec = skeleton_of_thought(width);
            let program = async {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let t0 = Instant::now();
                let r = post(&client, url, "/v1/programs", &spec).await;
                (t0.elapsed().as_secs_f64(), r)
            };
            let (bg, (secs, r)) = tokio::join!(loadgen::run(&load), program);
            let (bg, r) = (bg?, r?);
            let rise = bg.itl_p99_ms / alone.itl_p99_ms;
            if !f.json {
                outln!(
                    "with skeleton-of-thought at max_parallel {what} ({}): program {secs:.2} s; background ITL p50 {:.1} ms p99 {:.1} ms ({:.2}× alone)",
                    r["max_parallel"],
                    bg.itl_p50_ms,
                    bg.itl_p99_ms,
                    rise
                );
            }
            load_rows.push(json!({"with": what, "max_parallel": r["max_parallel"], "program_s": secs,
                "itl_p99_ms": bg.itl_p99_ms, "itl_p50_ms": bg.itl_p50_ms, "itl_p99_vs_alone": rise}));
        }
    }
    if f.json {
        outln!(
            "{}",
            json!({"bench": "programs", "model": f.model, "threads": f.threads, "repeats": f.repeats,
                "shapes": rows, "fork": fork_row, "background": load_rows, "decode_step_s": profile["decode_step_s"]})
        );
    }
    Ok(())
}
