//! `brigade bench serve`: starts `brigade serve` in this process on loopback (or drives the
//! server at `--url`) and its load generator: streamed completions of fixed prompt and output
//! lengths (random token ids, `ignore_eos`, greedy), at each concurrency or a Poisson rate.
//! A row per load — requests/s, output tokens/s, TTFT and ITL p50/p99 — and the achieved
//! fraction of the two limits measured in the same run: reading the weights once per step
//! (one request) and the matmul rate (many).

use super::args::LoadArgs;
use super::loadgen::{self, Arrivals, Load};
use anyhow::{bail, Context, Result};
use brigade::models::GptConfig;
use brigade_serve::http;
use brigade_serve::model::weights::WeightFormat;
use brigade_serve::model::KvDtype;
use brigade_serve::source::Source;
use brigade_serve::startup::ServeOptions;
use clap::Args;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct Flags {
    #[command(flatten)]
    pub(crate) load: LoadArgs,
    /// Checkpoint directory to serve (default: --model's shape with random weights).
    #[arg(long, conflicts_with = "model")]
    pub(crate) checkpoint: Option<std::path::PathBuf>,
    /// Drive this OpenAI-compatible server instead (e.g. http://127.0.0.1:8080 for
    /// llama-server); the model shape still sets prompt token ids and the limits.
    #[arg(long)]
    pub(crate) url: Option<String>,
    /// Poisson arrivals at this many requests a second instead of --concurrency.
    #[arg(long, conflicts_with = "concurrency")]
    pub(crate) rate: Option<f64>,
    /// Requests per load (default: 4 × concurrency, at least 8; 30 s of arrivals at --rate).
    #[arg(long)]
    pub(crate) requests: Option<usize>,
    /// Tensor-parallel ranks of the server (threads split evenly over them).
    #[arg(long, default_value_t = 1)]
    pub(crate) tp: usize,
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// How the server holds the matrices (as `brigade serve --weights`).
    #[arg(long, value_enum, default_value_t = crate::serve_cmd::Weights::Stored)]
    pub(crate) weights: crate::serve_cmd::Weights,
    /// What the server's KV cache holds (as `brigade serve --kv-cache-dtype`); with --url, what
    /// the weight-read limit takes that server's cache to hold.
    #[arg(long, value_enum, default_value_t = crate::serve_cmd::KvCacheDtype::F32)]
    pub(crate) kv_cache_dtype: crate::serve_cmd::KvCacheDtype,
    /// Chat requests offering N tools instead: each load runs with `tool_choice: "none"` and
    /// then `"required"` (the calls held to their schemas), their output tokens/s side by side,
    /// and the grammar's compile time the first time and cached after (needs a --checkpoint
    /// with a chat template, or --url).
    #[arg(long, default_value_t = 0)]
    pub(crate) tools: usize,
}

pub fn run(f: Flags) -> Result<()> {
    let Flags { load: l, checkpoint, url, rate, requests, tp, seed, weights, kv_cache_dtype, tools } = f;

    crate::threads::check_threads(l.threads, "--threads")?;
    measure(Run {
        tp,
        weights: weights.format(),
        kv_dtype: kv_cache_dtype.dtype(),
        checkpoint,
        model: l.model,
        url,
        concurrency: if rate.is_some() { vec![] } else { l.concurrency },
        rate,
        requests,
        prompt_len: l.prompt_len,
        output_len: l.output_len,
        threads: l.threads,
        seed,
        json: l.json,
        tools,
    })
}

/// One `bench serve` run, its flags checked.
struct Run {
    checkpoint: Option<PathBuf>,
    model: String,
    url: Option<String>,
    concurrency: Vec<usize>,
    rate: Option<f64>,
    requests: Option<usize>,
    prompt_len: usize,
    output_len: usize,
    threads: usize,
    tp: usize,
    weights: WeightFormat,
    kv_dtype: KvDtype,
    seed: u64,
    json: bool,
    tools: usize,
}

/// Weight bytes read per step and floating-point operations per generated token.
fn costs(cfg: &GptConfig, context: usize, weights: WeightFormat) -> (f64, f64) {
    let (l, c, v) = (cfg.n_layer as f64, cfg.n_embd as f64, cfg.vocab_size as f64);
    let matrices = l * cfg.block_matrices() as f64 + v * c;
    // a byte a weight and a 4-byte scale per 32 (int8) or per column (int8-channel)
    let bytes = match weights {
        // a GGUF's matrices as stored: what the file holds of them (`stored_bytes`)
        WeightFormat::StoredIn(_) => unreachable!("the bytes of stored matrices are the file's"),
        WeightFormat::F32 | WeightFormat::Stored => 4.0,
        WeightFormat::Int8 => 1.0 + 4.0 / 32.0,
        WeightFormat::Int8Channel => 1.0,
        // the blocks at 4.5 bits a weight; the head (v × c of `matrices`) at 8 + a scale per 32
        WeightFormat::Int4 => {
            let head = v * c;
            return (
                (matrices - head) * (0.5 + 4.0 / 32.0) + head * (1.0 + 4.0 / 32.0),
                2.0 * matrices + 4.0 * l * cfg.q_width() as f64 * context as f64,
            );
        }
    };
    // the products, then attention over `context` positions (q·k and p·v of the key/value
    // heads each query head reads)
    (matrices * bytes, 2.0 * matrices + 4.0 * l * cfg.q_width() as f64 * context as f64)
}

/// The products and attention of a prompt's rows before its last, which a step computes
/// without logits (the last row's pass gives the first output token: `costs` counts it): the
/// work a bound on output tokens alone leaves out. Every row is counted: the load's prompts are
/// random tokens, which the prefix cache does not hold.
fn prompt_flops(cfg: &GptConfig, prompt_len: usize) -> f64 {
    let (l, rows) = (cfg.n_layer as f64, prompt_len.saturating_sub(1) as f64);
    // row p attends over p + 1 positions
    rows * 2.0 * l * cfg.block_matrices() as f64 + 4.0 * l * cfg.q_width() as f64 * rows * (rows + 1.0) / 2.0
}

/// A GGUF file's matrices as it stores them, read per step when served as stored (every
/// two-dimensional tensor: the tied embedding counted once, as the head; `None` for a folder).
fn stored_matrix_bytes(path: &std::path::Path) -> Result<Option<f64>> {
    use brigade::models::gguf::{import::is_gguf, read::Gguf};
    if !is_gguf(path) {
        return Ok(None);
    }
    let g = Gguf::open(path)?;
    Ok(Some(g.tensors.iter().filter(|t| t.dims.len() == 2).map(|t| t.bytes() as f64).sum()))
}

fn measure(a: Run) -> Result<()> {
    if a.concurrency.is_empty() && a.rate.is_none() || a.concurrency.iter().any(|&c| c == 0 || c > 4096) {
        bail!("--concurrency takes request counts from 1 to 4096, e.g. 1,8,32");
    }
    if a.rate.is_some_and(|r| !(r > 0.0 && r <= 1e4)) {
        bail!("--rate must be above 0 and at most 10000 requests a second");
    }
    if a.requests == Some(0) {
        bail!("--requests must be at least 1");
    }
    let source = match &a.checkpoint {
        Some(d) => Source::Checkpoint(d.clone()),
        None => Source::Preset(a.model.clone()),
    };
    if a.tools > 0 && a.checkpoint.is_none() && a.url.is_none() {
        bail!("--tools sends chat requests: give --checkpoint DIR with a chat template (e.g. SmolLM2-135M-Instruct's folder) or --url");
    }
    if a.tools > 128 {
        bail!("--tools takes at most 128 tools, got {}", a.tools);
    }
    let cfg = source.config()?;
    if a.prompt_len == 0 || a.output_len == 0 || a.prompt_len + a.output_len > cfg.block_size {
        bail!(
            "--prompt-len {} + --output-len {} must fit the context of {} tokens (both at least 1)",
            a.prompt_len,
            a.output_len,
            cfg.block_size
        );
    }
    // the limits, measured on a pool of the server's size before it starts
    // the weight-read rate: the best of reading 1–16 streams side by side a core (one stream a
    // core reads half of what memory gives on some machines)
    let probe = || {
        brigade::with_threads(a.threads, || {
            (brigade::bench::machine::read_rates(512 << 20), brigade::bench::matmul_gflops(2048, 2048, 2048, 3))
        })
    };
    let (read_rates, matmul_before) = probe()?;
    // the load's mean context: a prompt and half its output
    let context = a.prompt_len + a.output_len / 2;
    let (mut weight_bytes, flops_per_token) = costs(&cfg, context, a.weights.clone());
    if let (Some(p), WeightFormat::Stored) = (&a.checkpoint, &a.weights) {
        if let Some(bytes) = stored_matrix_bytes(p)? {
            weight_bytes = bytes;
        }
    }
    // a decode step also reads its sequence's cached keys and values (at the load's mean
    // context): every byte of the step counts against the read limit
    let cache_bytes =
        (2 * cfg.n_layer * brigade_serve::model::weights::kv_width(&cfg, 1) * context * a.kv_dtype.bytes()) as f64;
    let per_prompt = prompt_flops(&cfg, a.prompt_len);
    let max_c = a.concurrency.iter().copied().max().unwrap_or(64);
    let url = match &a.url {
        Some(u) => u.trim_end_matches('/').to_string(),
        None => start_server(source, a.threads, (a.tp, a.weights.clone(), a.kv_dtype), max_c)?,
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let model = if a.url.is_some() { None } else { Some(model_name(&a)) };
    let base = Load {
        url: url.clone(),
        model,
        arrivals: Arrivals::Concurrency(1),
        requests: 1,
        prompt_len: a.prompt_len,
        output_len: a.output_len.min(8),
        vocab: cfg.vocab_size,
        seed: a.seed,
        tools: None,
    };
    rt.block_on(loadgen::run(&base)).context("the warm-up request failed")?;
    // with tools: the grammar compiled by the first required request, and cached for the next
    let mut grammar = serde_json::Value::Null;
    if a.tools > 0 {
        let first = Load { tools: Some((a.tools, "required")), ..base.clone() };
        let c0 = rt.block_on(loadgen::grammar_counts(&url));
        rt.block_on(loadgen::run(&first)).context("the first request with tools failed")?;
        let c1 = rt.block_on(loadgen::grammar_counts(&url));
        rt.block_on(loadgen::run(&first)).context("the second request with tools failed")?;
        let c2 = rt.block_on(loadgen::grammar_counts(&url));
        if let (Some(c0), Some(c1), Some(c2)) = (c0, c1, c2) {
            let compile_ms = 1e3 * (c1.1 - c0.1) / (c1.0 - c0.0).max(1.0);
            let (again, hits) = (c2.0 - c1.0, c2.2 - c1.2);
            if !a.json {
                outln!(
                    "grammar of {} tools (required): compiled in {compile_ms:.1} ms the first time; the same request again: {again} compiles, {hits} cache hits",
                    a.tools
                );
            }
            grammar =
                serde_json::json!({"first_compile_ms": compile_ms, "compiles_again": again, "cache_hits_again": hits});
        }
    }
    let mut loads: Vec<Arrivals> = a.concurrency.iter().map(|&c| Arrivals::Concurrency(c)).collect();
    if let Some(r) = a.rate {
        loads = vec![Arrivals::Rate(r)];
    }
    let mut runs = Vec::new();
    for (i, arrivals) in loads.into_iter().enumerate() {
        let requests = a.requests.unwrap_or(match arrivals {
            Arrivals::Concurrency(c) => (4 * c).max(8),
            Arrivals::Rate(r) => ((r * 30.0) as usize).clamp(8, 1000),
        });
        let load = Load { arrivals, requests, output_len: a.output_len, seed: a.seed + 1 + i as u64, ..base.clone() };
        let choices: &[Option<(usize, &'static str)>] =
            if a.tools > 0 { &[Some((a.tools, "none")), Some((a.tools, "required"))] } else { &[None] };
        let mut per_choice = Vec::new();
        for &tools in choices {
            let load = Load { tools, ..load.clone() };
            per_choice.push((tools, rt.block_on(loadgen::run(&load))?));
        }
        if let [(_, none), (_, required)] = &per_choice[..] {
            let ratio = required.output_tokens_per_s / none.output_tokens_per_s;
            if !a.json {
                outln!(
                    "{} tools at {}: required {:.1} against none {:.1} output tokens/s: {ratio:.2}×",
                    a.tools,
                    match arrivals {
                        Arrivals::Concurrency(c) => format!("{c} concurrent"),
                        Arrivals::Rate(r) => format!("{r} requests/s"),
                    },
                    required.output_tokens_per_s,
                    none.output_tokens_per_s
                );
            }
        }
        runs.extend(per_choice.into_iter().map(|(tools, row)| (arrivals, tools, row)));
    }
    // the read rate again after the loads (this machine's memory has moved between 35 and
    // 52 GB/s within minutes): the bound is the best the run measured
    // and the product rate likewise (on a shared host its 2048³ probe has read anywhere from
    // 88 to 215 GFLOP/s within the hour: a probe that reads low would flatter every fraction)
    let (read_rates_after, matmul_after) = probe()?;
    let read_gbps = read_rates.iter().chain(&read_rates_after).map(|r| r.1).fold(0.0, f64::max);
    let read_limit = read_gbps * 1e9 / (weight_bytes + cache_bytes);
    let matmul_gflops = matmul_before.max(matmul_after);
    let compute_limit = matmul_gflops * 1e9 / flops_per_token;
    let mut rows: Vec<serde_json::Value> = Vec::new();
    for (arrivals, tools, row) in runs {
        let (fr, fc) = (row.output_tokens_per_s / read_limit, row.output_tokens_per_s / compute_limit);
        // the same with the prompts' rows counted: every product the run computed
        let all_flops = row.output_tokens_per_s * flops_per_token + row.requests_per_s * per_prompt;
        let fc_all = all_flops / (matmul_gflops * 1e9);
        // a decode step reads every weight once, whatever the batch: the rate the typical
        // step read them at (the output-token fraction above also carries the prompts' time)
        // (and each running sequence's cache: the sequences a typical step ran, its output
        // tokens — tokens/s × the step's time, at least one)
        let seqs = (row.output_tokens_per_s * row.itl_p50_ms / 1e3).max(1.0);
        let step_gbps = (weight_bytes + seqs * cache_bytes) / (row.itl_p50_ms / 1e3) / 1e9;
        if !a.json {
            let what = match arrivals {
                Arrivals::Concurrency(c) => format!("{c} concurrent"),
                Arrivals::Rate(r) => format!("{r} requests/s (Poisson)"),
            };
            let what = match tools {
                Some((_, choice)) => format!("{what}, tool_choice {choice}"),
                None => what,
            };
            outln!(
                "{what}: {} requests ({} failed) in {:.1} s: {:.2} requests/s, {:.1} output tokens/s; TTFT p50 {:.0} ms p99 {:.0} ms; ITL p50 {:.1} ms p99 {:.1} ms (p99/p50 {:.2}); {:.0}% of the weight-read limit (a step of ITL p50 reads the weights and caches at {:.1} GB/s, {:.0}% of the read rate), {:.0}% of the matmul limit ({:.0}% counting the prompts' rows)",
                row.requests,
                row.failed,
                row.wall_s,
                row.requests_per_s,
                row.output_tokens_per_s,
                row.ttft_p50_ms,
                row.ttft_p99_ms,
                row.itl_p50_ms,
                row.itl_p99_ms,
                row.itl_p99_ms / row.itl_p50_ms,
                100.0 * fr,
                step_gbps,
                100.0 * step_gbps / read_gbps,
                100.0 * fc,
                100.0 * fc_all
            );
        }
        let mut v = serde_json::to_value(&row)?;
        v["weight_read_limit_fraction"] = serde_json::json!(fr);
        v["step_weight_read_gbps"] = serde_json::json!(step_gbps);
        v["matmul_limit_fraction"] = serde_json::json!(fc);
        v["matmul_limit_fraction_with_prompts"] = serde_json::json!(fc_all);
        v["tool_choice"] = serde_json::json!(tools.map(|t| t.1));
        rows.push(v);
    }
    let limits = serde_json::json!({"read_gbps": read_gbps, "read_gbps_by_streams": read_rates,
        "read_gbps_by_streams_after": read_rates_after, "weight_bytes": weight_bytes, "cache_bytes": cache_bytes,
        "weight_read_limit_tokens_per_s": read_limit, "matmul_gflops": matmul_gflops,
        "matmul_gflops_before": matmul_before, "matmul_gflops_after": matmul_after,
        "flops_per_token": flops_per_token, "prompt_flops": per_prompt, "matmul_limit_tokens_per_s": compute_limit});
    if a.json {
        outln!(
            "{}",
            serde_json::json!({"bench": "serve", "model": model_name(&a), "url": a.url, "threads": a.threads, "tp": a.tp, "weights": format!("{:?}", a.weights),
                "kv_cache_dtype": a.kv_dtype.to_string(), "prompt_len": a.prompt_len, "output_len": a.output_len, "limits": limits, "rows": rows, "tools": a.tools, "grammar": grammar})
        );
    } else {
        outln!(
            "limits ({} threads): weights {:.2} GB and one sequence's {} cache {:.1} MB read at {read_gbps:.1} GB/s → {read_limit:.0} tokens/s for one sequence; {:.2} GFLOP a token at {matmul_gflops:.0} GFLOP/s → {compute_limit:.0} tokens/s",
            a.threads,
            weight_bytes / 1e9,
            a.kv_dtype,
            cache_bytes / 1e6,
            flops_per_token / 1e9
        );
        let by_streams =
            |r: &[(usize, f64)]| r.iter().map(|(s, r)| format!("{s}: {r:.1}")).collect::<Vec<_>>().join(", ");
        outln!(
            "  the read rate is the best the run measured, reading streams side by side a task (streams: GB/s) before the loads {}; after them {}",
            by_streams(&read_rates),
            by_streams(&read_rates_after)
        );
        outln!("  the product rate is the better of 2048³ before the loads ({matmul_before:.0} GFLOP/s) and after them ({matmul_after:.0})");
    }
    Ok(())
}

fn model_name(a: &Run) -> String {
    match &a.checkpoint {
        Some(d) => Source::Checkpoint(d.clone()).default_name(),
        None => a.model.clone(),
    }
}

/// `brigade serve` on a free loopback port, in this process; returns its URL once ready.
pub(crate) fn start_server(
    source: Source,
    threads: usize,
    (tp, weights, kv_dtype): (usize, WeightFormat, KvDtype),
    max_c: usize,
) -> Result<String> {
    let o = ServeOptions {
        source: Some(source),
        embedding_model: None,
        name: None,
        host: "127.0.0.1".into(),
        port: 0,
        threads,
        layout: brigade::layout::Layout { tp, ..Default::default() },
        max_running: max_c.max(64),
        max_queued: 4096,
        max_step_tokens: 512,
        kv_cache_mib: 2048,
        block_size: 16,
        kv_dtype,
        shutdown_timeout: Duration::from_secs(1),
        weights,
        // the requests it sends say what they sample; nothing from generation_config.json
        generation_defaults: false,
        group: None,
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        if let Err(e) = http::run(o, move |addr| {
            let _ = tx.send(addr);
        }) {
            eprintln!("error: the server failed: {e:#}");
            std::process::exit(1);
        }
    });
    let addr = rx.recv_timeout(Duration::from_secs(60)).context("the server did not start")?;
    let url = format!("http://{addr}");
    let t0 = Instant::now();
    loop {
        let ready = std::net::TcpStream::connect(addr).ok().and_then(|mut s| {
            use std::io::{Read, Write};
            s.write_all(b"GET /ready HTTP/1.0\r\n\r\n").ok()?;
            let mut r = String::new();
            s.read_to_string(&mut r).ok()?;
            Some(r.starts_with("HTTP/1.0 200") || r.starts_with("HTTP/1.1 200"))
        });
        if ready == Some(true) {
            return Ok(url);
        }
        if t0.elapsed() > Duration::from_secs(600) {
            bail!("the server was not ready after 600 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A prompt's rows before its last, one by one: each a decode's work at its position
    /// (`costs`) less the head's product, which no row of a prompt but its last computes.
    #[test]
    fn a_prompts_work_is_its_rows_passes_without_the_head() {
        for model in ["gpt2-small", "qwen2.5-0.5b"] {
            let cfg = GptConfig::preset(model).unwrap();
            let head = 2.0 * (cfg.vocab_size * cfg.n_embd) as f64;
            for prompt_len in [1, 2, 32, 100] {
                let rows: f64 = (0..prompt_len - 1).map(|p| costs(&cfg, p + 1, WeightFormat::F32).1 - head).sum();
                let got = prompt_flops(&cfg, prompt_len);
                assert!((got - rows).abs() <= 1e-9 * rows.max(1.0), "{model} at {prompt_len}: {got} vs {rows}");
            }
        }
    }
}
