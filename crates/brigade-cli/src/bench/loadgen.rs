//! The load generator of `brigade bench serve`: streamed completions against an
//! OpenAI-compatible server (ours, or any other — llama.cpp's `llama-server`, vLLM), at a fixed
//! concurrency or with Poisson arrivals at a rate, and the figures vLLM's serving benchmark
//! reports: request and output-token throughput, time to first token and inter-token latency.

use anyhow::{bail, Context, Result};
use futures_util::StreamExt;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug)]
pub enum Arrivals {
    /// This many requests in flight at all times.
    Concurrency(usize),
    /// Poisson arrivals at this many requests a second.
    Rate(f64),
}

#[derive(Clone, Debug)]
pub struct Load {
    /// The server's base URL (`http://host:port`).
    pub url: String,
    pub model: Option<String>,
    pub arrivals: Arrivals,
    pub requests: usize,
    pub prompt_len: usize,
    pub output_len: usize,
    /// Prompts are random token ids below this.
    pub vocab: usize,
    pub seed: u64,
    /// Chat requests offering this many tools with this `tool_choice` instead of completions of
    /// random ids (`bench serve --tools N`).
    pub tools: Option<(usize, &'static str)>,
}

/// `n` functions as an agent offers them: a name, a description, a schema of a few arguments.
pub fn bench_tools(n: usize) -> Value {
    Value::Array(
        (0..n)
            .map(|k| {
                json!({"type": "function", "function": {"name": format!("lookup_{k}"),
                    "description": format!("Looks up fact {k} about a city: its weather, time or population."),
                    "parameters": {"type": "object", "properties": {
                        "city": {"type": "string", "description": "The city's name"},
                        "days": {"type": "integer", "description": "How many days ahead"},
                        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                    "required": ["city"]}}})
            })
            .collect(),
    )
}

/// The server's grammar counters (`brigade serve`'s `/metrics`): compiles, seconds compiling,
/// cache hits; `None` from a server without them.
pub async fn grammar_counts(url: &str) -> Option<(f64, f64, f64)> {
    let text = reqwest::get(format!("{url}/metrics")).await.ok()?.text().await.ok()?;
    let get = |name: &str| text.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse::<f64>().ok()));
    Some((
        get("brigade_grammar_compiles_total ")?,
        get("brigade_grammar_compile_seconds_total ")?,
        get("brigade_grammar_cache_hits_total ")?,
    ))
}

/// The request body of one request of `load` (a completion of `prompt`, or a chat with tools).
fn body_of(load: &Load, prompt: Vec<u32>) -> (Value, &'static str) {
    let mut body = match load.tools {
        None => json!({"prompt": prompt, "max_tokens": load.output_len, "temperature": 0, "stream": true,
            "ignore_eos": true}),
        // a chat ends where the model ends it (a call, or an answer): the tokens are counted by
        // the usage the server reports, not by its events (a call's arguments come in pieces)
        Some((n, choice)) => {
            json!({"messages": [{"role": "user", "content": "What will the weather be in Paris over the next 3 days, and what time is it there?"}],
            "tools": bench_tools(n), "tool_choice": choice, "max_tokens": load.output_len, "temperature": 0,
            "stream": true, "stream_options": {"include_usage": true}})
        }
    };
    if let Some(m) = &load.model {
        body["model"] = json!(m);
    }
    (body, if load.tools.is_some() { "/v1/chat/completions" } else { "/v1/completions" })
}

/// One load's figures.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Row {
    pub concurrency: Option<usize>,
    pub rate: Option<f64>,
    pub requests: usize,
    pub failed: usize,
    pub wall_s: f64,
    pub requests_per_s: f64,
    pub output_tokens_per_s: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    pub itl_p50_ms: f64,
    pub itl_p99_ms: f64,
}

struct Sample {
    ttft: f64,
    gaps: Vec<f64>,
    tokens: usize,
}

/// Nearest-rank percentile of sorted values (0 if none).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// One streamed request: the time to its first token and the gaps between the next ones.
async fn one(client: &reqwest::Client, load: &Load, prompt: Vec<u32>) -> Result<Sample> {
    let (body, path) = body_of(load, prompt);
    let mut t0 = Instant::now();
    let mut r = client.post(format!("{}{path}", load.url)).json(&body).send().await;
    for _ in 0..3 {
        if !r.as_ref().is_err_and(|e| e.is_request() || e.is_connect()) {
            break;
        }
        // a pooled keep-alive connection the server had closed (llama-server closes one after
        // a few requests): the request never reached it; send it again, timed afresh
        t0 = Instant::now();
        r = client.post(format!("{}{path}", load.url)).json(&body).send().await;
    }
    let r = r?;
    if !r.status().is_success() {
        bail!("HTTP {}: {}", r.status(), r.text().await.unwrap_or_default());
    }
    let mut stream = r.bytes_stream();
    let mut buf = Vec::new();
    let (mut last, mut ttft, mut gaps, mut tokens) = (t0, None, Vec::new(), 0);
    let mut usage = None;
    while let Some(chunk) = stream.next().await {
        buf.extend_from_slice(&chunk?);
        while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = buf.drain(..end + 2).collect();
            let line = String::from_utf8_lossy(&event);
            let Some(data) = line.trim().strip_prefix("data:") else { continue };
            let data = data.trim();
            if data == "[DONE]" {
                continue;
            }
            let v: Value = serde_json::from_str(data).with_context(|| format!("bad event {data}"))?;
            if v.get("error").is_some() {
                bail!("the server failed mid-stream: {data}");
            }
            if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
                usage = Some(n as usize);
            }
            let generated = v["choices"].as_array().is_some_and(|c| match load.tools {
                None => !c.is_empty(),
                // a chat's first event (its role, no text) is sent before any token
                Some(_) => c.iter().any(|c| {
                    c["delta"]["content"].as_str().is_some_and(|t| !t.is_empty())
                        || c["delta"].get("tool_calls").is_some()
                        || !c["finish_reason"].is_null()
                }),
            });
            if !generated {
                continue;
            }
            let now = Instant::now();
            match ttft {
                None => ttft = Some((now - t0).as_secs_f64()),
                Some(_) => gaps.push((now - last).as_secs_f64()),
            }
            last = now;
            tokens += 1;
        }
    }
    Ok(Sample { ttft: ttft.context("no token came back")?, gaps, tokens: usage.unwrap_or(tokens) })
}

fn prompt(rng: &mut ChaCha8Rng, load: &Load) -> Vec<u32> {
    (0..load.prompt_len).map(|_| rng.gen_range(0..load.vocab as u32)).collect()
}

/// Runs one load against the server and measures it.
pub async fn run(load: &Load) -> Result<Row> {
    let client = reqwest::Client::builder().pool_max_idle_per_host(1024).build()?;
    let mut rng = ChaCha8Rng::seed_from_u64(load.seed);
    let prompts: Vec<Vec<u32>> = (0..load.requests).map(|_| prompt(&mut rng, load)).collect();
    let prompts = Arc::new(prompts);
    let t0 = Instant::now();
    let results: Vec<Result<Sample>> = match load.arrivals {
        Arrivals::Concurrency(c) => {
            let next = Arc::new(AtomicUsize::new(0));
            let workers = (0..c.min(load.requests)).map(|_| {
                let (client, load, next, prompts) = (client.clone(), load.clone(), next.clone(), prompts.clone());
                tokio::spawn(async move {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        if i >= load.requests {
                            return out;
                        }
                        out.push(one(&client, &load, prompts[i].clone()).await);
                    }
                })
            });
            let mut all = Vec::new();
            for w in futures_util::future::join_all(workers).await {
                all.extend(w?);
            }
            all
        }
        Arrivals::Rate(rate) => {
            let mut tasks = Vec::new();
            let mut at = 0.0;
            for i in 0..load.requests {
                // exponential gaps: a Poisson process
                at += -(1.0 - rng.gen::<f64>()).ln() / rate;
                let (client, load, prompts) = (client.clone(), load.clone(), prompts.clone());
                let start = t0 + Duration::from_secs_f64(at);
                tasks.push(tokio::spawn(async move {
                    tokio::time::sleep_until(start.into()).await;
                    one(&client, &load, prompts[i].clone()).await
                }));
            }
            let mut all = Vec::new();
            for t in futures_util::future::join_all(tasks).await {
                all.push(t?);
            }
            all
        }
    };
    let wall = t0.elapsed().as_secs_f64();
    let mut failed = 0;
    let (mut ttft, mut itl, mut tokens, mut ok) = (Vec::new(), Vec::new(), 0, 0);
    let mut first_error = None;
    for r in results {
        match r {
            Ok(s) => {
                ttft.push(s.ttft);
                itl.extend(s.gaps);
                tokens += s.tokens;
                ok += 1;
            }
            Err(e) => {
                failed += 1;
                first_error.get_or_insert(e);
            }
        }
    }
    if ok == 0 {
        bail!("every request failed; the first: {:#}", first_error.expect("a failure"));
    }
    if let Some(e) = &first_error {
        eprintln!("warning: {failed} of {} requests failed; the first: {e:#}", failed + ok);
    }
    ttft.sort_by(f64::total_cmp);
    itl.sort_by(f64::total_cmp);
    let (concurrency, rate) = match load.arrivals {
        Arrivals::Concurrency(c) => (Some(c), None),
        Arrivals::Rate(r) => (None, Some(r)),
    };
    Ok(Row {
        concurrency,
        rate,
        requests: ok,
        failed,
        wall_s: wall,
        requests_per_s: ok as f64 / wall,
        output_tokens_per_s: tokens as f64 / wall,
        ttft_p50_ms: percentile(&ttft, 50.0) * 1e3,
        ttft_p99_ms: percentile(&ttft, 99.0) * 1e3,
        itl_p50_ms: percentile(&itl, 50.0) * 1e3,
        itl_p99_ms: percentile(&itl, 99.0) * 1e3,
    })
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&[3.0], 99.0), 3.0);
        assert_eq!(percentile(&[1.0, 2.0], 50.0), 1.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }
}
