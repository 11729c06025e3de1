//! `--pp N` against the single worker: the same model cut into N pipeline stages (each a run
//! of the layers and their KV cache, the first with the embedding, the last with the head) on N
//! rank threads gives the single worker's logits bit for bit, step after step (prompt chunks
//! beside decodes, paged KV caches, a partial block copied for branches), and so the same
//! tokens through the engine — which keeps one step per stage in flight, in lanes, so every
//! request's tokens and log-probabilities equal the single worker's whichever lane ran it. A
//! model of 4 layers is cut into 2, 3 and 4 stages (3: 2 + 1 + 1 layers); more stages than
//! layers are refused. The cut itself is checked against every way of cutting.

mod common;

use brigade::models::{Gpt, GptConfig};
use brigade_serve::engine::{Engine, Limits};
use brigade_serve::model::forward::stage_layers;
use brigade_serve::model::weights::WeightFormat;
use brigade_serve::model::{KvDtype, KvStore, Model, ShardError, Work};
use common::Family;

/// The family's test model, with 4 layers.
fn model(f: Family) -> (Gpt, Vec<f32>) {
    let mut cfg = common::config(f, 101, 64);
    cfg.n_layer = 4;
    let gpt = Gpt::new(cfg).unwrap();
    let p = gpt.init_params(5);
    (gpt, p)
}

fn steps(model: &Model, kv: &mut KvStore) -> Vec<Vec<f32>> {
    let a: Vec<u32> = (0..9).map(|i| (i * 7 + 1) % 101).collect();
    let b: Vec<u32> = (0..14).map(|i| (i * 13 + 2) % 101).collect();
    let (ba, bb) = (vec![0, 1, 2], vec![3, 4, 5, 6]);
    let mut out = Vec::new();
    out.extend(model.step(
        kv,
        &[
            Work { tokens: &a, start: 0, blocks: &ba, logits: true },
            Work { tokens: &b[..6], start: 0, blocks: &bb, logits: false },
        ],
    ));
    out.extend(model.step(
        kv,
        &[
            Work { tokens: &[3], start: 9, blocks: &ba, logits: true },
            Work { tokens: &b[6..], start: 6, blocks: &bb, logits: true },
        ],
    ));
    out.extend(model.step(
        kv,
        &[
            Work { tokens: &[4], start: 10, blocks: &ba, logits: true },
            Work { tokens: &[5], start: 14, blocks: &bb, logits: true },
        ],
    ));
    out
}

/// Products' multiply-adds per token of stage `layers` (naively: every weight of its layers,
/// the head's on the last), ignoring attention.
fn stage_weights(cfg: &GptConfig, layers: &std::ops::Range<usize>) -> u128 {
    let head = if layers.end == cfg.n_layer { (cfg.vocab_size * cfg.n_embd) as u128 } else { 0 };
    layers.len() as u128 * cfg.block_matrices() + head
}

#[test]
fn stages_are_cut_by_cost_with_the_head_on_the_last() {
    let (gpt, _) = model(Family::Gpt2);
    assert_eq!(stage_layers(&gpt.cfg, 1, 0), 0..4);
    // the test model (a small vocabulary: the layers as even as they go), GPT-2 small (12
    // layers, a head over 50,257 tokens worth 5.5 layers) and a 24-layer model with a
    // 151,936-token head: the cut leaves the most loaded stage as light as any contiguous cut of
    // at least one layer a stage, counted naively
    let mut configs = vec![gpt.cfg, GptConfig::preset("gpt2-small").unwrap()];
    let mut qwen = GptConfig::preset("gpt2-small").unwrap();
    (qwen.n_layer, qwen.vocab_size) = (24, 151_936);
    configs.push(qwen);
    for cfg in configs {
        for pp in 2..=4.min(cfg.n_layer) {
            let cut: Vec<_> = (0..pp).map(|s| stage_layers(&cfg, pp, s)).collect();
            assert_eq!(cut[0].start, 0);
            assert_eq!(cut[pp - 1].end, cfg.n_layer);
            assert!(cut.windows(2).all(|w| w[0].end == w[1].start && !w[0].is_empty()), "{cut:?}");
            let worst = cut.iter().map(|r| stage_weights(&cfg, r)).max().unwrap();
            // every cut of n layers into pp non-empty runs
            let mut best = u128::MAX;
            let mut ends = vec![0usize; pp + 1];
            fn each(cfg: &GptConfig, k: usize, ends: &mut Vec<usize>, best: &mut u128) {
                let pp = ends.len() - 1;
                if k == pp {
                    if ends[pp] == cfg.n_layer {
                        let w = (0..pp).map(|s| stage_weights(cfg, &(ends[s]..ends[s + 1]))).max().unwrap();
                        *best = (*best).min(w);
                    }
                    return;
                }
                for e in ends[k] + 1..=cfg.n_layer {
                    ends[k + 1] = e;
                    each(cfg, k + 1, ends, best);
                }
            }
            each(&cfg, 0, &mut ends, &mut best);
            // attention and rank 0's own work (counted by the cut, not here) may move a cut by one
            // layer at most
            assert!(
                worst <= best + cfg.block_matrices(),
                "{} layers, pp {pp}: {cut:?} has a stage of {worst} weights; the best cut's heaviest has {best}",
                cfg.n_layer
            );
        }
    }
    let small = GptConfig::preset("gpt2-small").unwrap();
    // GPT-2 small's head is worth 5.5 layers, rank 0's own work about one: 8 + 4 (measured
    // faster than 9 + 3 and 7 + 5 in scripts/bench_serve_mpi.sh pp)
    assert_eq!((0..2).map(|s| stage_layers(&small, 2, s)).collect::<Vec<_>>(), [0..8, 8..12]);
}

#[test]
fn pipelined_logits_equal_the_single_workers_bit_for_bit() {
    common::for_each_family(|f| {
        let (gpt, p) = model(f);
        let one = Model::new(&gpt, &p);
        let mut kv = KvStore::new(16, 4, 4, one.kv_width());
        let want = steps(&one, &mut kv);
        assert_eq!(want.len(), 5);
        for pp in [2, 3, 4] {
            let got = brigade_comm::local::run(pp, |comm| -> Result<_, ShardError> {
                let rank = comm.rank();
                let m = Model::stage_as(&gpt, &p, comm, WeightFormat::F32)?;
                assert_eq!(m.layers_n, stage_layers(&gpt.cfg, pp, rank).len());
                let mut kv = KvStore::new(16, 4, m.layers_n, m.kv_width());
                if rank == 0 {
                    let out = steps(&m, &mut kv);
                    m.stop_followers();
                    Ok(out)
                } else {
                    while m.follow(&mut kv) {}
                    Ok(vec![])
                }
            })
            .unwrap();
            assert_eq!(got[0].len(), want.len(), "{} pp {pp}", f.name());
            for (i, (g, w)) in got[0].iter().zip(&want).enumerate() {
                let same = g.len() == w.len() && g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{} pp {pp}: logits row {i} differ from the single worker's", f.name());
            }
        }
        let e = brigade_comm::local::run(5, |comm| Model::stage_as(&gpt, &p, comm, WeightFormat::F32).map(|_| ()))
            .unwrap_err();
        assert!(
            e.to_string().contains("--pp 5 splits the model's 4 layers into more stages than there are layers"),
            "{e}"
        );
    });
}

#[test]
fn the_engine_on_a_pipeline_gives_the_same_tokens() {
    common::for_each_family(|f| {
        let (gpt, p) = model(f);
        let limits = Limits { max_running: 4, max_step_tokens: 12 };
        let drive = common::drive;
        let by_request = |mut out: Vec<brigade_serve::engine::Output>| {
            // lanes interleave requests differently: each request's tokens in order
            out.sort_by_key(|o| o.id);
            out
        };
        // each stage's cache in f32, then in f16 (each stage rounds its layers' keys and values
        // as one worker does)
        for dtype in [KvDtype::F32, KvDtype::F16] {
            let want = by_request(drive(&mut Engine::with_cache(Model::new(&gpt, &p), (40, 4, dtype), limits)));
            let got = brigade_comm::local::run(2, |comm| -> Result<_, ShardError> {
                let rank = comm.rank();
                let m = Model::stage_as(&gpt, &p, comm, WeightFormat::F32)?;
                if rank == 0 {
                    let mut e = Engine::with_cache(m, (40, 4, dtype), limits);
                    assert_eq!(e.lanes(), 2, "a lane per stage when each share holds a whole context");
                    let out = by_request(drive(&mut e));
                    e.model.stop_followers();
                    Ok(out)
                } else {
                    let mut kv = KvStore::with_dtype(40, 4, m.layers_n, m.kv_width(), dtype);
                    while m.follow(&mut kv) {}
                    Ok(vec![])
                }
            })
            .unwrap();
            assert_eq!(got[0], want, "{} on a pipeline of 2, {dtype} cache", f.name());
            assert_eq!(want.len(), 180);
        }
    });
}

#[test]
fn a_request_aborted_while_its_step_is_in_the_pipeline_leaves_the_others_unchanged() {
    use brigade_serve::engine::{Request, Sampling};
    let (gpt, p) = model(Family::ALL[1]);
    let limits = Limits { max_running: 4, max_step_tokens: 64 };
    let request = |id: u64| Request {
        id,
        prompt: (0..5 + id as u32).map(|i| (i * 7 + id as u32) % 101).collect(),
        sampling: Sampling {
            repetition_penalty: 1.0,
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
            max_tokens: 12,
            stop_tokens: vec![],
            top_logprobs: 0,
        },
    };
    let run = |e: &mut Engine| {
        for id in 0..4 {
            e.add(request(id)).unwrap();
        }
        // the first step launches both lanes and takes the oldest back: request 1 (lane 1) is
        // in flight when it is aborted
        let mut out = e.step();
        e.abort(1);
        while e.has_work() {
            out.extend(e.step());
        }
        let used = e.blocks().used;
        out.retain(|o| o.id != 1);
        out.sort_by_key(|o| o.id);
        (out, used)
    };
    let (want, _) = run(&mut Engine::new(Model::new(&gpt, &p), 40, 4, limits));
    let got = brigade_comm::local::run(2, |comm| -> Result<_, ShardError> {
        let rank = comm.rank();
        let m = Model::stage_as(&gpt, &p, comm, WeightFormat::F32)?;
        if rank == 0 {
            let mut e = Engine::new(m, 40, 4, limits);
            let out = run(&mut e);
            e.model.stop_followers();
            Ok(Some(out))
        } else {
            let mut kv = KvStore::new(40, 4, m.layers_n, m.kv_width());
            while m.follow(&mut kv) {}
            Ok(None)
        }
    })
    .unwrap();
    let (out, used) = got[0].clone().unwrap();
    assert_eq!(used, 0, "every block is free once the work is done");
    assert_eq!(out.len(), 3 * 12, "the three others run to their length");
    assert_eq!(out, want, "the others' tokens are the single worker's");
}
