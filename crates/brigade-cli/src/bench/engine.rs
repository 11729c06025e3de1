//! `brigade bench engine`: the serving engine in this process (no HTTP) on a GPT-2 shape with
//! random weights — N requests at once, fixed prompt and output lengths, greedy or sampled
//! (`--temperature`, `--top-k`, `--top-p`), every token generated (stop tokens off) — output
//! tokens/s and time per step, for each concurrency.

use super::args::LoadArgs;
use anyhow::{bail, Result};
use brigade::models::{Gpt, GptConfig};
use brigade_serve::engine::{Engine, Limits, Request, Sampling};
use brigade_serve::model::weights::WeightFormat;
use brigade_serve::model::{KvDtype, Model};
use clap::Args;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct Flags {
    #[command(flatten)]
    pub(crate) load: LoadArgs,
    /// How the engine holds the matrices (as `brigade serve --weights`; `stored` is f32 here).
    #[arg(long, value_enum, default_value_t = crate::serve_cmd::Weights::F32)]
    pub(crate) weights: crate::serve_cmd::Weights,
    /// What the KV cache holds keys and values as (as `brigade serve --kv-cache-dtype`).
    #[arg(long, value_enum, default_value_t = crate::serve_cmd::KvCacheDtype::F32)]
    pub(crate) kv_cache_dtype: crate::serve_cmd::KvCacheDtype,
    /// Sample every token at this temperature (each request seeded by its number); 0: greedy.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) temperature: f32,
    /// Sample from the k most likely tokens only (0: all).
    #[arg(long, default_value_t = 0)]
    pub(crate) top_k: usize,
    /// Sample from the most likely tokens holding this much of the probability (1: all).
    #[arg(long, default_value_t = 1.0)]
    pub(crate) top_p: f32,
}

pub fn run(f: Flags) -> Result<()> {
    let l = f.load;
    crate::threads::check_threads(l.threads, "--threads")?;
    if !(f.temperature >= 0.0 && f.temperature.is_finite()) {
        bail!("--temperature {} must be 0 (greedy) or a positive number", f.temperature);
    }
    if !(f.top_p > 0.0 && f.top_p <= 1.0) {
        bail!("--top-p {} must lie in (0, 1]", f.top_p);
    }
    // every request's sampling but its seed (its number) and length (--output-len)
    let pick = Sampling { temperature: f.temperature, top_k: f.top_k, top_p: f.top_p, ..Sampling::greedy(0) };
    let held = (f.weights.format(), f.kv_cache_dtype.dtype());
    measure(&l.model, &l.concurrency, (l.prompt_len, l.output_len), l.threads, held, &pick, l.json)
}

fn measure(
    model: &str,
    concurrency: &[usize],
    (prompt_len, output_len): (usize, usize),
    threads: usize,
    (weights, kv_dtype): (WeightFormat, KvDtype),
    pick: &Sampling,
    json: bool,
) -> Result<()> {
    let cfg = GptConfig::preset(model)?;
    if concurrency.is_empty() || concurrency.iter().any(|&n| n == 0 || n > 4096) {
        bail!("--concurrency takes request counts from 1 to 4096, e.g. 1,8,32");
    }
    if prompt_len == 0 || prompt_len + output_len > cfg.block_size {
        bail!("--prompt-len {prompt_len} + --output-len {output_len} must fit the context of {} tokens (and the prompt be non-empty)", cfg.block_size);
    }
    let gpt = Gpt::new(cfg)?;
    let params = gpt.init_params(1);
    let m = Model::shard_as(&gpt, &params, None, weights.clone())?;
    drop(params);
    let mut engine = Engine::with_cache(m, (1, 16, kv_dtype), Limits { max_running: 1, max_step_tokens: 1 });
    let mut rows = Vec::new();
    for &n in concurrency {
        let blocks = n * (prompt_len + output_len).div_ceil(16) + 1;
        engine.reset(blocks, Limits { max_running: n.max(1), max_step_tokens: (n * prompt_len).max(512) });
        let t0 = Instant::now();
        let mut first = None;
        let made = brigade::with_threads(threads, || {
            for i in 0..n {
                let prompt: Vec<u32> =
                    (0..prompt_len).map(|j| ((i * 7919 + j * 104_729) % cfg.vocab_size) as u32).collect();
                let sampling = Sampling { seed: i as u64, max_tokens: output_len, ..pick.clone() };
                engine.add(Request { id: i as u64, prompt, sampling }).expect("fits");
            }
            let mut made = 0usize;
            while engine.has_work() {
                made += engine.step().len();
                first.get_or_insert(t0.elapsed().as_secs_f64());
            }
            made
        })?;
        let wall = t0.elapsed().as_secs_f64();
        let decode_steps = output_len.saturating_sub(1).max(1);
        let tps = made as f64 / wall;
        let per_step = (wall - first.unwrap_or(0.0)) / decode_steps as f64;
        if !json {
            outln!(
                "{model} ({weights:?}, {kv_dtype} cache), {n} concurrent, prompt {prompt_len}, output {output_len}, {threads} threads, {}: {tps:.1} output tokens/s; first token after {:.3} s (prefill of all), then {:.1} ms a step",
                if pick.temperature > 0.0 {
                    format!("sampled (temperature {}, top-k {}, top-p {})", pick.temperature, pick.top_k, pick.top_p)
                } else {
                    "greedy".to_string()
                },
                first.unwrap_or(0.0),
                per_step * 1e3
            );
        }
        rows.push(serde_json::json!({"concurrency": n, "output_tokens_per_s": tps, "first_step_s": first, "decode_step_ms": per_step * 1e3, "wall_s": wall}));
    }
    if json {
        outln!(
            "{}",
            serde_json::json!({"bench": "engine", "model": model, "threads": threads, "weights": format!("{weights:?}"), "kv_cache_dtype": kv_dtype.to_string(), "prompt_len": prompt_len, "output_len": output_len, "temperature": pick.temperature, "top_k": pick.top_k, "top_p": pick.top_p, "rows": rows})
        );
    }
    Ok(())
}
