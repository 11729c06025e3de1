//! The engine against independent references: greedy tokens and logits of the full-recompute
//! generator (`brigade::models::generate`, gemm forward); and batch invariance — a request
//! alone and inside a crowded engine (32 requests of other lengths arriving mid-generation,
//! shared prefixes hitting the cache, chunked prompts, preemption) gives bit-identical tokens
//! and log-probabilities, greedy and seeded sampling alike.

mod common;

use brigade::models::{Activations, Gpt, GptConfig};
use brigade_serve::engine::{Engine, Limits, Output, Request, Sampling};
use brigade_serve::model::{KvDtype, Model};
use common::{Family, FAMILIES};
use std::collections::HashMap;

fn run(engine: &mut Engine, arrivals: Vec<(usize, Request)>) -> HashMap<u64, Vec<Output>> {
    let mut out: HashMap<u64, Vec<Output>> = HashMap::new();
    let mut pending = arrivals;
    pending.sort_by_key(|(step, _)| *step);
    let mut step = 0;
    while engine.has_work() || !pending.is_empty() {
        while pending.first().is_some_and(|(s, _)| *s <= step) {
            let (_, r) = pending.remove(0);
            engine.add(r).unwrap();
        }
        for o in engine.step() {
            out.entry(o.id).or_default().push(o);
        }
        step += 1;
        assert!(step < 10_000, "the engine does not finish");
    }
    out
}

#[test]
fn greedy_tokens_match_the_full_recompute_generator() {
    for f in FAMILIES {
        greedy_against_the_generator(f);
    }
}

fn greedy_against_the_generator(f: Family) {
    let (gpt, p) = common::model(f, 97, 96, 3);
    greedy_against_the_training_forward(&gpt, &p, f);
}

/// A mixture balanced by DeepSeek-V3's bias chooses its experts in the engine as training's
/// forward does: the biases set far from zero (a trained model's), every choice through them.
#[test]
fn a_balancing_bias_chooses_the_experts_as_training_does() {
    use brigade::models::family::{llama, Llama, LlamaMoe};
    let f = Family::Llama(Llama { moe: Some(LlamaMoe { bias_rate: 0.01, ..llama::MOE_EXAMPLE }), ..llama::EXAMPLE });
    let (gpt, mut p) = common::model(f, 97, 96, 3);
    let mut biases = 0;
    for s in gpt.layout.specs.iter().filter(|s| s.name.ends_with("e_score_correction_bias")) {
        s.view.of_mut(&mut p).iter_mut().enumerate().for_each(|(e, b)| *b = [0.3, -0.2, 0.1, -0.25][e % 4]);
        biases += 1;
    }
    assert_eq!(biases, gpt.cfg.moe_layers(), "a bias a mixture layer");
    greedy_against_the_training_forward(&gpt, &p, f);
}

fn greedy_against_the_training_forward(gpt: &brigade::models::Gpt, p: &[f32], f: Family) {
    let (gpt, p) = (gpt.clone(), p.to_vec());
    let prompt: Vec<u32> = (0..11).map(|i| (i * 7 + 3) % 97).collect();
    let mut engine = Engine::new(Model::new(&gpt, &p), 64, 4, Limits { max_running: 8, max_step_tokens: 64 });
    let got = run(&mut engine, vec![(0, Request { id: 1, prompt: prompt.clone(), sampling: Sampling::greedy(30) })]);
    let tokens: Vec<u32> = got[&1].iter().map(|o| o.token).collect();
    // the reference: the whole sequence through the training forward, position by position
    let mut seq = prompt.clone();
    let mut acts = Activations::default();
    for (k, o) in got[&1].iter().enumerate() {
        let logits = gpt.forward_last(&p, &seq, 1, seq.len(), &mut acts);
        let mx = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let best = logits.iter().position(|&v| v == mx).unwrap() as u32;
        assert_eq!(o.token, best, "{f:?} token {k}: engine {} vs reference {best}", o.token);
        let lse = mx + logits.iter().map(|&v| ((v - mx) as f64).exp()).sum::<f64>().ln() as f32;
        assert!((o.logprob - (logits[best as usize] - lse)).abs() < 1e-4, "{f:?} logprob of token {k}");
        seq.push(best);
    }
    assert_eq!(tokens.len(), 30);
    assert_eq!(engine.pool().free_blocks(), engine.pool().total_blocks(), "a finished request frees its blocks");
}

fn want_seeded_sampling() -> Sampling {
    Sampling {
        repetition_penalty: 1.0,
        temperature: 0.8,
        top_k: 20,
        top_p: 0.9,
        seed: 42,
        max_tokens: 40,
        stop_tokens: vec![],
        top_logprobs: 3,
    }
}

#[test]
fn outputs_do_not_depend_on_the_batch() {
    for f in FAMILIES {
        batch_invariance(f, KvDtype::F32);
    }
}

/// The same with the cache in f16 (each key and value rounded to a half as it is written).
#[test]
fn outputs_do_not_depend_on_the_batch_with_an_f16_cache() {
    for f in FAMILIES {
        batch_invariance(f, KvDtype::F16);
    }
}

/// An f16 cache against the f32 one on the same requests: each request's first token comes
/// from the same prompt through caches holding the same keys and values but for their rounding
/// to halves, so its log-probability moves by that rounding (f16's unit roundoff, 2⁻¹¹ ≈ 4.9e-4,
/// relative to the logits' scale: within 1e-2 here) and not by nothing (the f16 path is taken).
/// A cache made again by `reset` keeps its kind.
#[test]
fn an_f16_cache_moves_the_log_probabilities_by_its_rounding() {
    for f in FAMILIES {
        let (gpt, p) = common::model(f, 97, 96, 3);
        let limits = Limits { max_running: 8, max_step_tokens: 256 };
        let requests: Vec<(usize, Request)> = (0..6u64)
            .map(|j| {
                let prompt = (0..20 + 5 * j as u32).map(|i| (i * 13 + 5 + j as u32) % 97).collect();
                (0, Request { id: j, prompt, sampling: Sampling::greedy(4) })
            })
            .collect();
        let mut f32s = Engine::with_cache(Model::new(&gpt, &p), (64, 4, KvDtype::F32), limits);
        let mut f16s = Engine::with_cache(Model::new(&gpt, &p), (64, 4, KvDtype::F16), limits);
        let (a, b) = (run(&mut f32s, requests.clone()), run(&mut f16s, requests.clone()));
        let mut moved = 0;
        for j in 0..6u64 {
            let (x, y) = (a[&j][0].logprob, b[&j][0].logprob);
            assert_eq!(a[&j][0].token, b[&j][0].token, "{f:?}: request {j}'s first token");
            assert!((x - y).abs() <= 1e-2, "{f:?}: request {j}: f16 {y} vs f32 {x}");
            moved += (x != y) as usize;
        }
        assert!(moved > 0, "{f:?}: the f16 cache changed no log-probability");
        f16s.reset(32, limits);
        assert_eq!(f16s.kv.dtype(), KvDtype::F16, "reset keeps the cache's kind");
        assert_eq!(run(&mut f16s, requests.clone()), b, "{f:?}: the same after reset");
    }
}

fn batch_invariance(f: Family, dtype: KvDtype) {
    let (gpt, p) = common::model(f, 97, 96, 3);
    let shared: Vec<u32> = (0..20).map(|i| (i * 13 + 5) % 97).collect();
    let probe = |id: u64, sampling: Sampling| {
        let mut prompt = shared.clone();
        prompt.extend([1, 2, 3]);
        Request { id, prompt, sampling }
    };
    let seeded = want_seeded_sampling();
    // alone, roomy engine, whole prompts in one step
    let alone = |r: Request| {
        let mut e = Engine::with_cache(
            Model::new(&gpt, &p),
            (256, 4, dtype),
            Limits { max_running: 64, max_step_tokens: 4096 },
        );
        run(&mut e, vec![(0, r)])
    };
    let want_greedy = alone(probe(1, Sampling::greedy(40)))[&1].clone();
    let want_seeded = alone(probe(2, seeded.clone()))[&2].clone();
    // crowded: 30 others of other lengths, many sharing the probe's prefix, arriving over time;
    // a 24-token step budget (chunked prompts) and a cache small enough to preempt
    let mut arrivals = Vec::new();
    for j in 0..30u64 {
        let len = 3 + (j as usize * 7) % 40;
        let mut prompt: Vec<u32> = if j % 3 == 0 { shared.clone() } else { vec![] };
        prompt.extend((0..len).map(|i| ((i as u64 * 31 + j * 17) % 97) as u32));
        let sampling =
            if j % 2 == 0 { Sampling::greedy(10 + j as usize) } else { Sampling { seed: j, ..seeded.clone() } };
        arrivals.push(((j as usize) * 2, Request { id: 100 + j, prompt, sampling }));
    }
    arrivals.push((7, probe(1, Sampling::greedy(40))));
    arrivals.push((13, probe(2, seeded)));
    // the last arrivals are the newest, so they are the ones preempted
    arrivals.push((60, probe(3, Sampling::greedy(40))));
    arrivals.push((60, probe(4, Sampling { seed: 9, ..want_seeded_sampling() })));
    let mut e =
        Engine::with_cache(Model::new(&gpt, &p), (40, 4, dtype), Limits { max_running: 32, max_step_tokens: 24 });
    let got = run(&mut e, arrivals.clone());
    assert!(e.stats().preemptions > 0, "the test meant to preempt");
    assert!(e.pool().hits > 0, "the test meant to hit the prefix cache");
    assert_eq!(e.kv.dtype(), dtype);
    assert_eq!(got[&1], want_greedy, "{f:?}: greedy output changed inside a batch");
    assert_eq!(got[&2], want_seeded, "{f:?}: seeded sampling changed inside a batch");
    // every request, each run alone, gives what it gave in the crowd
    for (_, r) in arrivals {
        let id = r.id;
        assert_eq!(got[&id], alone(r)[&id], "{f:?}: request {id} changed inside a batch");
    }
    assert_eq!(got.len(), 34, "every request finished");
    assert_eq!(e.pool().free_blocks(), e.pool().total_blocks());
}

#[test]
fn prompts_beside_running_decodes_come_in_bounded_chunks() {
    use brigade_serve::engine::{MIN_PREFILL, PREFILL_PER_DECODE};
    let cfg =
        GptConfig { n_layer: 1, n_head: 2, n_embd: 32, vocab_size: 50, block_size: 512, family: Default::default() };
    let gpt = Gpt::new(cfg).unwrap();
    let p = gpt.init_params(1);
    let mut e = Engine::new(Model::new(&gpt, &p), 512, 4, Limits { max_running: 64, max_step_tokens: 400 });
    // distinct prompts: no prefix-cache hits
    let req = |id: u64, len: u64| Request {
        id,
        prompt: (0..len).map(|i| ((i * (id + 3) + id) % 50) as u32).collect(),
        sampling: Sampling::greedy(200),
    };
    // nothing decoding: a long prompt takes the whole budget
    e.add(req(1, 300)).unwrap();
    e.step();
    assert_eq!(e.stats().prompt_tokens_computed, 300);
    // 1 decoding: another long prompt gets MIN_PREFILL a step, then 2 per decode as they grow
    e.add(req(2, 300)).unwrap();
    let mut before = e.stats().prompt_tokens_computed;
    let mut steps = 0;
    while e.stats().prompt_tokens_computed < 600 {
        e.step();
        let (took, left) = (e.stats().prompt_tokens_computed - before, 600 - before);
        before = e.stats().prompt_tokens_computed;
        assert_eq!(took as usize, (left as usize).min(MIN_PREFILL.max(PREFILL_PER_DECODE)));
        steps += 1;
    }
    assert_eq!(steps, 300usize.div_ceil(MIN_PREFILL));
    // 20 decoding: chunks of 2 × 20
    for id in 10..30 {
        e.add(req(id, 3)).unwrap();
    }
    e.step();
    e.step();
    e.add(req(3, 200)).unwrap();
    let before = e.stats().prompt_tokens_computed;
    e.step();
    assert_eq!((e.stats().prompt_tokens_computed - before) as usize, PREFILL_PER_DECODE * 22);
}

/// `top_logprobs` (every family): the n most likely tokens of each step, best first, with their
/// log-probabilities — against an independent log-softmax of the full-recompute logits.
#[test]
fn top_logprobs_are_the_most_likely_tokens_of_the_full_recompute() {
    common::for_each_family(|f| {
        let (gpt, p) = common::model(f, 97, 96, 5);
        let prompt: Vec<u32> = (0..9).map(|i| (i * 11 + 2) % 97).collect();
        let mut engine = Engine::new(Model::new(&gpt, &p), 64, 4, Limits { max_running: 8, max_step_tokens: 64 });
        let sampling = Sampling { top_logprobs: 5, ..Sampling::greedy(6) };
        let got = run(&mut engine, vec![(0, Request { id: 1, prompt: prompt.clone(), sampling })]);
        let mut seq = prompt;
        let mut acts = Activations::default();
        for (k, o) in got[&1].iter().enumerate() {
            let logits = gpt.forward_last(&p, &seq, 1, seq.len(), &mut acts);
            let mx = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
            let lse = mx + logits.iter().map(|&v| (v as f64 - mx).exp()).sum::<f64>().ln();
            let mut order: Vec<usize> = (0..logits.len()).collect();
            order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
            assert_eq!(o.top.len(), 5, "step {k}");
            for (j, &(t, lp)) in o.top.iter().enumerate() {
                assert_eq!(t as usize, order[j], "step {k}: rank {j} of the top tokens");
                assert!((lp as f64 - (logits[t as usize] as f64 - lse)).abs() < 1e-4, "step {k}: logprob of rank {j}");
            }
            assert_eq!(o.top[0].0, o.token, "greedy takes the most likely token");
            seq.push(o.token);
        }
    });
}

/// Why each request ends (a stop token, its length, the context), what `add` refuses, and an
/// aborted request — running or waiting — freeing its blocks without touching the others.
#[test]
fn requests_end_for_their_reasons_and_aborts_free_their_blocks() {
    common::for_each_family(|f| {
        use brigade_serve::engine::Finish;
        let (gpt, p) = common::model(f, 97, 24, 7);
        let new = |blocks| Engine::new(Model::new(&gpt, &p), blocks, 4, Limits { max_running: 2, max_step_tokens: 64 });
        let prompt: Vec<u32> = (0..8).map(|i| (i * 5 + 1) % 97).collect();
        let req = |id, sampling| Request { id, prompt: prompt.clone(), sampling };
        // the free run: its third token becomes the stop token of the next one
        let free = run(&mut new(64), vec![(0, req(1, Sampling::greedy(10)))])[&1].clone();
        assert_eq!(free.len(), 10);
        assert_eq!(free.last().unwrap().finished, Some(Finish::Length));
        assert!(free[..9].iter().all(|o| o.finished.is_none()));
        let stop = free[2].token;
        let first_stop = free.iter().position(|o| o.token == stop).unwrap();
        let stopped =
            run(&mut new(64), vec![(0, req(2, Sampling { stop_tokens: vec![stop], ..Sampling::greedy(10) }))])[&2]
                .clone();
        assert_eq!(stopped.len(), first_stop + 1);
        assert_eq!(stopped.last().unwrap().finished, Some(Finish::Stop));
        // the context (24) ends a request that asks for more: 8 prompt tokens + 16 generated
        let long = run(&mut new(64), vec![(0, req(3, Sampling::greedy(100)))])[&3].clone();
        assert_eq!(long.len(), 16);
        assert_eq!(long.last().unwrap().finished, Some(Finish::Context));
        // refused before it runs, each naming why
        let mut e = new(3);
        let refuse = |e: &mut Engine, prompt: Vec<u32>| {
            e.add(Request { id: 9, prompt, sampling: Sampling::greedy(1) }).unwrap_err().to_string()
        };
        assert!(refuse(&mut e, vec![]).contains("empty"));
        assert!(refuse(&mut e, vec![1; 24]).contains("context is 24"));
        assert!(refuse(&mut e, vec![1, 97]).contains("token 97"));
        assert!(refuse(&mut e, vec![1; 9]).contains("needs 4 KV blocks; the cache holds 3"));
        e.add(Request { id: 10, prompt: vec![1; 8], sampling: Sampling::greedy(1) }).unwrap();
        assert_eq!(e.waiting(), 1);
        // an 8-token prompt fills 2 blocks of 4, no more
        let mut e = new(64);
        e.add(req(1, Sampling::greedy(10))).unwrap();
        e.step();
        assert_eq!(e.pool().used_blocks(), 2);
        // aborts: one running, one of two still waiting (max_running 2)
        let mut e = new(64);
        for id in [1, 4, 5, 6] {
            e.add(req(id, Sampling::greedy(10))).unwrap();
        }
        e.step();
        assert_eq!((e.running(), e.waiting()), (2, 2));
        e.abort(4);
        e.abort(5);
        assert_eq!((e.running(), e.waiting()), (1, 1));
        let mut rest: HashMap<u64, Vec<u32>> = HashMap::new();
        while e.has_work() {
            for o in e.step() {
                rest.entry(o.id).or_default().push(o.token);
            }
        }
        let want: Vec<u32> = free.iter().map(|o| o.token).collect();
        assert_eq!(rest.len(), 2, "only the requests left run");
        assert_eq!(rest[&1], want[1..], "the aborts changed another request");
        assert_eq!(rest[&6], want, "the request left waiting runs as alone");
        assert_eq!(e.pool().free_blocks(), e.pool().total_blocks(), "every block is back");
    });
}

/// The step's token budget binds decodes and prompt chunks together: a prompt alone comes in
/// chunks of the whole budget, and decodes take their tokens out of it before any prompt.
#[test]
fn the_step_budget_counts_every_token() {
    common::for_each_family(|f| {
        let (gpt, p) = common::model(f, 97, 96, 9);
        let mut e = Engine::new(Model::new(&gpt, &p), 64, 4, Limits { max_running: 8, max_step_tokens: 10 });
        let req = |id: u64, len: u64| Request {
            id,
            prompt: (0..len).map(|i| ((i * (id + 2) + id) % 97) as u32).collect(),
            sampling: Sampling::greedy(40),
        };
        let taken = |e: &mut Engine| {
            let before = e.stats().prompt_tokens_computed;
            let out = e.step();
            (e.stats().prompt_tokens_computed - before, out.len())
        };
        e.add(req(1, 30)).unwrap();
        // 30 prompt tokens, 10 a step; the last chunk samples the first token
        assert_eq!([taken(&mut e), taken(&mut e), taken(&mut e)], [(10, 0), (10, 0), (10, 1)]);
        // 3 short prompts beside 1 decode: 9 tokens left, 2 each
        for id in 2..5 {
            e.add(req(id, 2)).unwrap();
        }
        assert_eq!(taken(&mut e), (6, 4));
        // 4 decodes leave 6 tokens of the 10 for a new prompt
        e.add(req(5, 20)).unwrap();
        assert_eq!(taken(&mut e), (6, 4));
        assert_eq!(taken(&mut e), (6, 4));
        assert_eq!(e.stats().steps, 6, "forward passes counted");
        assert_eq!(e.stats().generated, 1 + 4 + 4 + 4, "tokens generated counted");
        // 4 prompts of 6 and nothing decoding: the budget of 10 admits two (the second with 4 of
        // its tokens) and no one with nothing to run; then 1 decode, the rest of the second's
        // prompt, the third's whole and 1 token of the fourth's
        let mut e = Engine::new(Model::new(&gpt, &p), 64, 4, Limits { max_running: 8, max_step_tokens: 10 });
        for id in 10..14 {
            e.add(req(id, 6)).unwrap();
        }
        assert_eq!(taken(&mut e), (10, 1));
        assert_eq!((e.running(), e.waiting()), (2, 2));
        assert_eq!(taken(&mut e), (2 + 6 + 1, 3));
        assert_eq!((e.running(), e.waiting()), (4, 0));
        // a prompt whose first 8 tokens (2 blocks of 4) are cached computes only the rest
        let mut e = Engine::new(Model::new(&gpt, &p), 64, 4, Limits { max_running: 8, max_step_tokens: 64 });
        let first = req(20, 11);
        let mut again = first.clone();
        again.id = 21;
        again.prompt.truncate(8);
        again.prompt.extend([1, 2, 3, 4, 5]);
        e.add(first).unwrap();
        assert_eq!(taken(&mut e), (11, 1));
        e.add(again).unwrap();
        assert_eq!(taken(&mut e).0, 13 - 8);
        assert_eq!(e.pool().hits, 2);
    });
}

/// Branches that share a prompt (a fork of 8 over a 203-token prompt; map-like branches that
/// share a prefix and then differ) computed with `follows`: each branch's tokens and
/// log-probabilities are bit-identical to the same request alone, while the shared prompt is
/// computed once — whole blocks through the prefix cache, the partial last one copied. Also
/// crowded and preempted, and for both families.
#[test]
fn branches_share_their_prompt_and_give_what_each_gives_alone() {
    use brigade_serve::engine::Admit;
    for f in FAMILIES {
        let (gpt, p) = common::model(f, 97, 256, 11);
        let prompt: Vec<u32> = (0..203).map(|i| (i * 29 + 7) % 97).collect();
        let seeded = |j: u64| Sampling { seed: 7 + j, max_tokens: 12, ..want_seeded_sampling() };
        let alone = |r: Request| {
            let mut e = Engine::new(Model::new(&gpt, &p), 256, 4, Limits { max_running: 64, max_step_tokens: 4096 });
            run(&mut e, vec![(0, r)])
        };
        // the fork: 8 branches of one prompt, arriving together
        let mut e = Engine::new(Model::new(&gpt, &p), 256, 4, Limits { max_running: 64, max_step_tokens: 4096 });
        for j in 0..8u64 {
            let admit = Admit { follows: (j > 0).then_some(100), ..Default::default() };
            e.add_with(Request { id: 100 + j, prompt: prompt.clone(), sampling: seeded(j) }, admit).unwrap();
        }
        let mut got: HashMap<u64, Vec<Output>> = HashMap::new();
        while e.has_work() {
            for o in e.step() {
                got.entry(o.id).or_default().push(o);
            }
        }
        for j in 0..8u64 {
            let want = alone(Request { id: 100 + j, prompt: prompt.clone(), sampling: seeded(j) });
            let strip = |v: &[Output]| v.iter().map(|o| (o.token, o.logprob, o.finished)).collect::<Vec<_>>();
            assert_eq!(strip(&got[&(100 + j)]), strip(&want[&(100 + j)]), "{f:?}: branch {j} changed by sharing");
        }
        // one branch computes 203; each of the others only its last token (202 = 50 blocks
        // of 4 and 2 slots, copied)
        assert_eq!(e.stats().prompt_tokens_computed, 203 + 7, "{f:?}");
        assert_eq!(e.stats().prompt_tokens_copied, 7 * 2, "{f:?}");
        assert_eq!(got[&101][0].prompt_computed, 1);
        assert_eq!(got[&100][0].prompt_computed, 203);
        assert_eq!(e.pool().free_blocks(), e.pool().total_blocks(), "{f:?}: shared blocks all given back");
        e.pool().check();
        // map-like branches: a shared 50-token head, then each its own item; crowded with
        // others, a small cache (preemption), a 24-token step budget (chunked prompts)
        let head: Vec<u32> = (0..50).map(|i| (i * 13 + 3) % 97).collect();
        let item = |j: u64| {
            let mut t = head.clone();
            t.extend((0..3 + j).map(|i| ((i * 7 + j * 5) % 97) as u32));
            t
        };
        let mut arrivals = Vec::new();
        for j in 0..6u64 {
            arrivals.push((3, Request { id: 200 + j, prompt: item(j), sampling: seeded(j) }, j > 0));
        }
        for j in 0..12u64 {
            let prompt: Vec<u32> = (0..5 + j * 3).map(|i| ((i * 31 + j * 17) % 97) as u32).collect();
            arrivals.push((j as usize, Request { id: 300 + j, prompt, sampling: Sampling::greedy(20) }, false));
        }
        let mut e = Engine::new(Model::new(&gpt, &p), 60, 4, Limits { max_running: 16, max_step_tokens: 24 });
        let mut got: HashMap<u64, Vec<Output>> = HashMap::new();
        let mut step = 0;
        while e.has_work() || arrivals.iter().any(|a| a.0 >= step) {
            for (s, r, follows) in &arrivals {
                if *s == step {
                    let admit = Admit { follows: follows.then_some(200), ..Default::default() };
                    e.add_with(r.clone(), admit).unwrap();
                }
            }
            for o in e.step() {
                got.entry(o.id).or_default().push(o);
            }
            step += 1;
            assert!(step < 10_000);
        }
        assert!(e.stats().preemptions > 0, "{f:?}: the test meant to preempt");
        assert!(e.stats().prompt_tokens_copied > 0, "{f:?}: the test meant to copy a partial block");
        for (_, r, _) in arrivals {
            let id = r.id;
            let strip = |v: &[Output]| v.iter().map(|o| (o.token, o.logprob, o.finished)).collect::<Vec<_>>();
            assert_eq!(strip(&got[&id]), strip(&alone(r)[&id]), "{f:?}: request {id} changed by sharing");
        }
        assert_eq!(e.pool().free_blocks(), e.pool().total_blocks());
        e.pool().check();
    }
}

/// Forced tokens (a select scoring a choice): emitted in order whatever the sampler would
/// pick, each with its log-probability under the model — against an independent log-softmax
/// of the full-recompute logits — and the request ends after the last.
#[test]
fn forced_tokens_are_scored_by_the_full_recompute() {
    common::for_each_family(|f| {
        use brigade_serve::engine::{Admit, Finish};
        let (gpt, p) = common::model(f, 97, 96, 5);
        let prompt: Vec<u32> = (0..9).map(|i| (i * 11 + 2) % 97).collect();
        let forced = vec![5u32, 60, 60, 1];
        let mut e = Engine::new(Model::new(&gpt, &p), 64, 4, Limits { max_running: 8, max_step_tokens: 64 });
        let admit = Admit { forced: forced.clone(), ..Default::default() };
        e.add_with(
            Request { id: 1, prompt: prompt.clone(), sampling: Sampling { seed: 3, ..want_seeded_sampling() } },
            admit,
        )
        .unwrap();
        let mut got = Vec::new();
        while e.has_work() {
            got.extend(e.step());
        }
        assert_eq!(got.iter().map(|o| o.token).collect::<Vec<_>>(), forced);
        assert_eq!(got.last().unwrap().finished, Some(Finish::Length));
        let mut seq = prompt;
        let mut acts = Activations::default();
        for (k, o) in got.iter().enumerate() {
            let logits = gpt.forward_last(&p, &seq, 1, seq.len(), &mut acts);
            let mx = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
            let lse = mx + logits.iter().map(|&v| (v as f64 - mx).exp()).sum::<f64>().ln();
            let want = logits[forced[k] as usize] as f64 - lse;
            assert!((o.logprob as f64 - want).abs() < 1e-4, "token {k}: {} vs {want}", o.logprob);
            seq.push(forced[k]);
        }
        // a forced token outside the vocabulary is refused
        let bad = Admit { forced: vec![97], ..Default::default() };
        assert!(e
            .add_with(Request { id: 2, prompt: vec![1, 2], sampling: Sampling::greedy(2) }, bad)
            .unwrap_err()
            .to_string()
            .contains("outside"));
    });
}
