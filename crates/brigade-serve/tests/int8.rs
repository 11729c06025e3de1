//! 8- and 4-bit weights (`--weights int8`, `int8-channel`, `int4`) against f32 on the Hugging Face fixtures
//! of the Llama family (and a GPT-2): batch invariance holds bit for bit (a request alone and
//! in a crowd), tensor parallelism gives the single worker's int8 tokens, and the error
//! against f32 — max |Δlogit| after a 100-token prompt, and the fraction of greedy tokens
//! equal over 64 prompts × 64 tokens — is printed (`--nocapture`) and bounded loosely enough
//! that only a broken quantizer fails it.

mod common;

use brigade::models::checkpoint::load_model;
use brigade::models::Gpt;
use brigade_serve::engine::{Engine, Limits, Output, Request, Sampling};
use brigade_serve::model::weights::WeightFormat;
use brigade_serve::model::KvStore;
use brigade_serve::model::{Model, ShardError, Work};
use std::collections::HashMap;
use std::path::Path;

const FORMATS: [WeightFormat; 3] = [WeightFormat::Int8, WeightFormat::Int8Channel, WeightFormat::Int4];

fn greedy(max_tokens: usize) -> Sampling {
    Sampling { top_logprobs: 2, ..Sampling::greedy(max_tokens) }
}

fn run(e: &mut Engine, requests: &[Request]) -> HashMap<u64, Vec<Output>> {
    for r in requests {
        e.add(r.clone()).unwrap();
    }
    let mut out: HashMap<u64, Vec<Output>> = HashMap::new();
    while e.has_work() {
        for o in e.step() {
            out.entry(o.id).or_default().push(o);
        }
    }
    out
}

fn prompts(vocab: u32, n: u64, len: u32) -> Vec<Request> {
    (0..n)
        .map(|j| Request {
            id: j,
            prompt: (0..len + (j as u32 % 5)).map(|i| (i * 17 + j as u32 * 31 + 7) % vocab).collect(),
            sampling: if j % 2 == 0 { greedy(64) } else { Sampling { temperature: 0.8, seed: j, ..greedy(64) } },
        })
        .collect()
}

#[test]
fn int8_outputs_do_not_depend_on_the_batch_or_the_ranks() {
    for f in common::FAMILIES {
        let (gpt, p) = common::model(f, 101, 96, 4);
        for fmt in FORMATS {
            let model = || Model::shard_as(&gpt, &p, None, fmt.clone()).unwrap();
            let reqs = prompts(101, 12, 6);
            let crowd = run(&mut Engine::new(model(), 40, 4, Limits { max_running: 8, max_step_tokens: 20 }), &reqs);
            for r in &reqs {
                let alone = run(
                    &mut Engine::new(model(), 64, 4, Limits { max_running: 8, max_step_tokens: 512 }),
                    std::slice::from_ref(r),
                );
                assert_eq!(crowd[&r.id], alone[&r.id], "{f:?} {fmt:?}: request {} changed inside a batch", r.id);
            }
            // two ranks: the single worker's int8 tokens and log-probabilities
            let got = brigade_comm::local::run(2, |comm| -> Result<_, ShardError> {
                let rank = comm.rank();
                let m = Model::shard_as(&gpt, &p, Some(comm), fmt.clone())?;
                if rank == 0 {
                    let mut e = Engine::new(m, 40, 4, Limits { max_running: 8, max_step_tokens: 20 });
                    let out = run(&mut e, &reqs);
                    e.model.stop_followers();
                    Ok(out)
                } else {
                    let mut kv = KvStore::new(40, 4, m.layers_n, m.kv_width());
                    while m.follow(&mut kv) {}
                    Ok(HashMap::new())
                }
            })
            .unwrap();
            assert_eq!(got[0], crowd, "{f:?} {fmt:?}: tp 2 differs from one worker");
        }
    }
}

/// max |Δlogit| of the next token after `t` tokens, relative to the f32 logits' largest.
fn logit_error(gpt: &Gpt, p: &[f32], tokens: &[u32], fmt: WeightFormat) -> (f32, f32) {
    let logits = |fmt| {
        let m = Model::shard_as(gpt, p, None, fmt).unwrap();
        let mut kv = KvStore::new(tokens.len().div_ceil(4) + 1, 4, m.layers_n, m.kv_width());
        let blocks: Vec<usize> = (0..tokens.len().div_ceil(4)).collect();
        m.step(&mut kv, &[Work { tokens, start: 0, blocks: &blocks, logits: true }]).remove(0)
    };
    let (a, b) = (logits(WeightFormat::F32), logits(fmt));
    let max = a.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = a.iter().zip(&b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    (d, d / max)
}

/// Over 64 prompts × 64 greedy tokens of the f32 model: the fraction of positions where the
/// 8-bit model's most likely next token, given the f32 sequence so far, is f32's (top-1
/// agreement); and the fraction of tokens the 8-bit model's own greedy continuations share
/// with f32's before their first difference (everything after a flip counted as differing).
fn greedy_agreement(gpt: &Gpt, p: &[f32], fmt: WeightFormat) -> (f64, f64) {
    let v = gpt.cfg.vocab_size as u32;
    let reqs: Vec<Request> = prompts(v, 64, 8).into_iter().map(|r| Request { sampling: greedy(64), ..r }).collect();
    let limits = Limits { max_running: 64, max_step_tokens: 1024 };
    let f32s = run(&mut Engine::new(Model::new(gpt, p), 2048, 16, limits), &reqs);
    let q = Model::shard_as(gpt, p, None, fmt.clone()).unwrap();
    let own = run(&mut Engine::new(Model::shard_as(gpt, p, None, fmt).unwrap(), 2048, 16, limits), &reqs);
    let (mut top1, mut prefix) = (0, 0);
    for r in &reqs {
        let gen: Vec<u32> = f32s[&r.id].iter().map(|o| o.token).collect();
        prefix += gen.iter().zip(&own[&r.id]).take_while(|(a, b)| **a == b.token).count();
        // one step: the prompt, then each generated token as its own item over the same
        // blocks (every row's keys are written before any row attends), each with its logits
        let mut kv = KvStore::new(16, 16, q.layers_n, q.kv_width());
        let blocks: Vec<usize> = (0..16).collect();
        let l = r.prompt.len();
        let mut work = vec![Work { tokens: &r.prompt, start: 0, blocks: &blocks, logits: true }];
        for (i, t) in gen[..63].iter().enumerate() {
            work.push(Work { tokens: std::slice::from_ref(t), start: l + i, blocks: &blocks, logits: true });
        }
        for (row, want) in q.step(&mut kv, &work).iter().zip(&gen) {
            let best = row.iter().enumerate().fold(0, |b, (i, &x)| if x > row[b] { i } else { b });
            top1 += usize::from(best as u32 == *want);
        }
    }
    (top1 as f64 / 4096.0, prefix as f64 / 4096.0)
}

#[test]
fn int8_error_against_f32_on_the_fixtures() {
    for name in ["llama3_hf", "qwen2_hf", "gpt2_hf", "qwen2_moe_hf", "mixtral_hf"] {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../brigade/tests/fixtures").join(name);
        let (gpt, p) = load_model(&dir).unwrap();
        let v = gpt.cfg.vocab_size as u32;
        let long: Vec<u32> = (0..100).map(|i| (i * 37 + 11) % v).collect();
        for fmt in FORMATS {
            let (d, rel) = logit_error(&gpt, &p, &long, fmt.clone());
            let (top1, prefix) = greedy_agreement(&gpt, &p, fmt.clone());
            println!(
                "{name} {fmt:?}: max |Δlogit| {d:.4} ({:.2}% of the largest logit); greedy top-1 equal to f32's at {:.1}% of positions; {:.1}% of tokens before the first difference",
                rel * 100.0,
                top1 * 100.0,
                prefix * 100.0
            );
            // a broken quantizer (a wrong scale or column) is far outside these; 4 bits on these
            // small random-weight models (16 levels a group, no trained structure to keep) move
            // the logits much more, and a wrong nibble or scale still lands at chance (~1%)
            let (max_rel, min_top1) = if matches!(fmt, WeightFormat::Int4) { (0.6, 0.4) } else { (0.05, 0.8) };
            assert!(rel < max_rel, "{name} {fmt:?}: logits {:.1}% off", rel * 100.0);
            assert!(top1 > min_top1, "{name} {fmt:?}: top-1 agreement {:.1}%", top1 * 100.0);
        }
    }
}

/// Perplexity of a trained checkpoint (the README's addition model, byte tokens) on held-out
/// problems — the answer's digits and newline, what it was trained to write — in f32 and in
/// 8 bits, printed; a broken quantizer would be far off.
#[test]
fn int8_perplexity_of_a_trained_checkpoint_on_held_out_problems() {
    use brigade::train::addition::Addition;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../brigade/tests/fixtures/addition_ckpt");
    let (gpt, p) = load_model(&dir).unwrap();
    let task = Addition { digits: 3, reverse: true, carry_chains: 0.0 };
    let problems: Vec<(u64, u64)> = (0..4000u64)
        .map(|i| ((i * 7919) % 1000, (i * 104_729 + 13) % 1000))
        .filter(|&(a, b)| task.held_out(a, b))
        .take(64)
        .collect();
    assert_eq!(problems.len(), 64);
    let ppl = |fmt: WeightFormat| {
        let m = Model::shard_as(&gpt, &p, None, fmt).unwrap();
        let (mut nll, mut n) = (0f64, 0usize);
        for &(a, b) in &problems {
            let sum: String = format!("{:04}", a + b).chars().rev().collect();
            let text = format!("{a:03}+{b:03}={sum}\n");
            let toks: Vec<u32> = text.bytes().map(u32::from).collect();
            let l = task.prompt_len();
            let mut kv = KvStore::new(4, 4, m.layers_n, m.kv_width());
            let blocks: Vec<usize> = (0..4).collect();
            // the prompt, then each answer token but the last as its own item (teacher forcing)
            let mut work = vec![Work { tokens: &toks[..l], start: 0, blocks: &blocks, logits: true }];
            for i in l..toks.len() - 1 {
                work.push(Work { tokens: &toks[i..i + 1], start: i, blocks: &blocks, logits: true });
            }
            for (row, &want) in m.step(&mut kv, &work).iter().zip(&toks[l..]) {
                let mx = row.iter().fold(f32::NEG_INFINITY, |x, &y| x.max(y)) as f64;
                let lse = mx + row.iter().map(|&v| (v as f64 - mx).exp()).sum::<f64>().ln();
                nll += lse - row[want as usize] as f64;
                n += 1;
            }
        }
        (nll / n as f64).exp()
    };
    let f32s = ppl(WeightFormat::F32);
    for fmt in FORMATS {
        let q = ppl(fmt.clone());
        println!("addition checkpoint, 64 held-out problems: perplexity of the answers f32 {f32s:.4}, {fmt:?} {q:.4} ({:+.2}%)", (q / f32s - 1.0) * 100.0);
        assert!(q < 1.5 * f32s, "{fmt:?}: perplexity {q} against f32's {f32s}");
    }
}

/// The weight bytes a rank reports (what a step reads, what it holds: the `bench serve` bound
/// and `brigade_rank_weight_bytes`) counted from each fixture's config.json: every product in
/// its format (f32, or 8 bits with a 4-byte scale per column per group of k rows; columns held
/// in strips of 16), the router and the shared expert's gate in f32, the embedding table as
/// floats, a token reading `top_k` of the `E` experts — and the KV width by tp.
#[test]
fn weight_bytes_count_every_tensor() {
    use brigade_serve::model::weights::kv_width;
    let round = |n: usize| n.div_ceil(16) * 16;
    for name in ["llama3_hf", "qwen2_moe_hf", "gpt2_hf", "mixtral_hf"] {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../brigade/tests/fixtures").join(name);
        let c: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
        let u = |k: &str| c[k].as_u64().map(|v| v as usize);
        let gpt2 = name == "gpt2_hf";
        let hidden = u("hidden_size").or(u("n_embd")).unwrap();
        let heads = u("num_attention_heads").or(u("n_head")).unwrap();
        let kv = u("num_key_value_heads").unwrap_or(heads);
        let hd = u("head_dim").unwrap_or(hidden / heads);
        let vocab = u("vocab_size").unwrap();
        let layers = u("num_hidden_layers").or(u("n_layer")).unwrap();
        let experts = u("num_experts").or(u("num_local_experts"));
        let (gpt, params) = load_model(&dir).unwrap();
        for format in [WeightFormat::F32, WeightFormat::Int8, WeightFormat::Int8Channel] {
            let group = match format {
                WeightFormat::Int8 => Some(32),
                WeightFormat::Int8Channel => Some(usize::MAX),
                _ => None,
            };
            let product = |k: usize, n: usize| match group {
                None => 4 * k * round(n),
                Some(g) => k * round(n) + 4 * round(n) * k.div_ceil(g.min(k)),
            };
            let attn = product(hidden, (heads + 2 * kv) * hd) + product(heads * hd, hidden);
            let head = product(hidden, vocab);
            let floats = 4 * vocab * hidden + if gpt2 { 4 * u("n_positions").unwrap() * hidden } else { 0 };
            let (read, held) = match experts {
                None => {
                    let width = if gpt2 { 4 * hidden } else { u("intermediate_size").unwrap() };
                    let up = if gpt2 { width } else { 2 * width };
                    let products = layers * (attn + product(hidden, up) + product(width, hidden)) + head;
                    (products, products + floats)
                }
                Some(e) => {
                    let w = u("moe_intermediate_size").unwrap_or_else(|| u("intermediate_size").unwrap());
                    let routed = e * (product(hidden, 2 * w) + product(w, hidden));
                    let shared = match u("shared_expert_intermediate_size") {
                        Some(s) => product(hidden, 2 * s) + product(s, hidden) + 4 * hidden,
                        None => 0,
                    };
                    let always = shared + 4 * hidden * round(e);
                    let k = u("num_experts_per_tok").unwrap();
                    // Qwen2-MoE's dense layers: `mlp_only_layers`, and those off `decoder_sparse_step`
                    let only: Vec<usize> = c["mlp_only_layers"]
                        .as_array()
                        .map_or(vec![], |a| a.iter().map(|v| v.as_u64().unwrap() as usize).collect());
                    let step = u("decoder_sparse_step").unwrap_or(1);
                    let sparse = (0..layers).filter(|i| !only.contains(i) && (i + 1) % step == 0).count();
                    let dense = (layers - sparse)
                        * (product(hidden, 2 * u("intermediate_size").unwrap())
                            + product(u("intermediate_size").unwrap(), hidden));
                    let base = layers * attn + head + dense;
                    (base + sparse * (routed * k / e + always), base + sparse * (routed + always) + floats)
                }
            };
            let model = Model::shard_as(&gpt, &params, None, format.clone()).unwrap();
            assert_eq!(model.weight_bytes(), (read, held), "{name} {format:?}: (read, held)");
        }
        for (tp, want) in [(1, kv * hd), (2, kv.max(2) / 2 * hd), (4, kv.max(4) / 4 * hd)] {
            assert_eq!(kv_width(&gpt.cfg, tp), want, "{name}: KV width at tp {tp}");
        }
    }
}
