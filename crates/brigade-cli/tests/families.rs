//! `brigade serve`'s cache and batch settings keep their promises on every family, with the
//! settings away from their defaults: GPT-2, Llama 3 with grouped-query attention 4:1 (and
//! llama3 rope scaling), Qwen2 with 3:1 and a sharded checkpoint, and a Qwen2 mixture of
//! experts (the Hugging Face fixtures of crates/brigade/tests/fixtures, served as token ids).
//! `--kv-cache-mib 1 --block-size 16` holds exactly the blocks that one MiB gives at this
//! model's key/value width (its key/value heads × head width, not its hidden width: a server
//! that sized by the query heads would hold fewer); `--max-running 20` never runs more than 20
//! sequences at once; a crowd of 24 full-context requests that cannot all fit is served by
//! preempting (counted), every answer the same tokens as the request alone, every block given
//! back at the end.

mod common;

use common::server::{start, Server};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

const BLOCK: usize = 16;
const RUNNING: usize = 20;
const CROWD: usize = 24;

/// (layers, key/value width, context) from a Hugging Face config.json, read here on its own.
fn shape(config: &Value) -> (usize, usize, usize) {
    let n = |a: &str, b: &str| config.get(a).or_else(|| config.get(b)).and_then(Value::as_u64).map(|x| x as usize);
    let layers = n("num_hidden_layers", "n_layer").unwrap();
    let heads = n("num_attention_heads", "n_head").unwrap();
    let kv = n("num_key_value_heads", "num_attention_heads").unwrap_or(heads);
    let head_dim = n("head_dim", "head_dim").unwrap_or(n("hidden_size", "n_embd").unwrap() / heads);
    (layers, kv * head_dim, n("max_position_embeddings", "n_positions").unwrap())
}

async fn greedy(s: &Server, prompt: &[u32], max_tokens: usize) -> Vec<u64> {
    let body = json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true,
        "return_token_ids": true});
    let (st, r) = s.post(body).await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["choices"][0]["finish_reason"], "length", "{r}");
    r["choices"][0]["token_ids"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cache_and_batch_settings_keep_their_promises_on_every_family() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../brigade/tests/fixtures");
    // every family with the f32 cache, and one with the f16 cache (numbers of 2 bytes: twice
    // the blocks in the MiB)
    let runs =
        [("gpt2_hf", "f32"), ("llama3_hf", "f32"), ("qwen2_hf", "f32"), ("qwen2_moe_hf", "f32"), ("llama3_hf", "f16")];
    for (name, dtype) in runs {
        // (the GPT-2 fixture's generation_config.json names GPT-2's EOS, 50256, beyond its 67
        // tokens: a server refuses it, so the folder is served without it)
        let copy = tempfile::tempdir().unwrap();
        let dir = match name {
            "gpt2_hf" => {
                for f in ["config.json", "model.safetensors"] {
                    std::fs::copy(fixtures.join(name).join(f), copy.path().join(f)).unwrap();
                }
                copy.path().to_path_buf()
            }
            _ => fixtures.join(name),
        };
        let config: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
        let (layers, width, context) = shape(&config);
        let vocab = config["vocab_size"].as_u64().unwrap() as u32;
        let s = Arc::new(start(&[
            "--checkpoint",
            dir.to_str().unwrap(),
            "--kv-cache-mib",
            "1",
            "--block-size",
            &BLOCK.to_string(),
            "--max-running",
            &RUNNING.to_string(),
            "--max-step-tokens",
            "64",
            "--kv-cache-dtype",
            dtype,
        ]));
        s.wait_ready().await;
        // the blocks one MiB holds: 2 (keys, values) × layers × block × width numbers of 4
        // bytes (f32) or 2 (f16)
        let bytes = if dtype == "f16" { 2 } else { 4 };
        let blocks = (1 << 20) / (2 * layers * BLOCK * width * bytes);
        let name = format!("{name} ({dtype} cache)");
        assert_eq!(s.metric("brigade_kv_blocks").await, blocks as f64, "{name}: blocks of 1 MiB");
        // every request runs to the context's end: the running ones need more than the cache
        let need = RUNNING * context.div_ceil(BLOCK);
        assert!(need > blocks, "{name}: the crowd ({need} blocks) was meant not to fit in {blocks}");
        let prompts: Vec<Vec<u32>> =
            (0..CROWD as u32).map(|j| (0..8).map(|i| (i * 7 + j * 13 + 1) % vocab).collect()).collect();
        let max_tokens = context - 8;
        // the running batch, watched while the crowd is served
        let (done, most) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
        let watch = {
            let (s, done, most) = (s.clone(), done.clone(), most.clone());
            tokio::spawn(async move {
                while !done.load(Ordering::Relaxed) {
                    let r = s.metric("brigade_running_sequences").await;
                    most.fetch_max(r as usize, Ordering::Relaxed);
                    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                }
            })
        };
        let crowd: Vec<_> = prompts
            .iter()
            .map(|p| {
                let (s, p) = (s.clone(), p.clone());
                tokio::spawn(async move { greedy(&s, &p, max_tokens).await })
            })
            .collect();
        let mut crowded = Vec::new();
        for c in crowd {
            crowded.push(c.await.unwrap());
        }
        done.store(true, Ordering::Relaxed);
        watch.await.unwrap();
        let most = most.load(Ordering::Relaxed);
        assert!(most <= RUNNING, "{name}: {most} sequences ran at once under --max-running {RUNNING}");
        assert!(
            s.metric("brigade_preemptions_total").await > 0.0,
            "{name}: the crowd did not fit, yet nothing was preempted"
        );
        assert_eq!(s.metric("brigade_kv_blocks_used").await, 0.0, "{name}: blocks still held after every answer");
        // each answer is the request's own, alone
        for (p, got) in prompts.iter().zip(&crowded).step_by(5) {
            assert_eq!(got.len(), max_tokens, "{name}");
            assert_eq!(&greedy(&s, p, max_tokens).await, got, "{name}: prompt {p:?} crowded and preempted vs alone");
        }
    }
}
