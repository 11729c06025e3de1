//! `--tp N` against the single worker: the same model sharded over N rank threads gives the
//! single worker's logits bit for bit, step after step (prompt chunks and decodes of several
//! sequences, paged KV caches), and so the same tokens through the engine.

use brigade::models::{Gpt, GptConfig};
use brigade_serve::engine::{Engine, Limits, Output, Request, Sampling};
use brigade_serve::kv::KvCache;
use brigade_serve::model::{Model, Work};

fn model() -> (Gpt, Vec<f32>) {
    // vocabulary 101: not a multiple of the group size (the head's padding is dropped)
    let cfg =
        GptConfig { n_layer: 2, n_head: 4, n_embd: 64, vocab_size: 101, block_size: 64, arch: Default::default() };
    let gpt = Gpt::new(cfg).unwrap();
    let mut p = gpt.init_params(5);
    p.iter_mut().for_each(|v| *v *= 4.0);
    (gpt, p)
}

/// Three sequences over three steps: whole prompts, then a chunk beside decodes, then decodes.
fn steps(model: &Model, kv: &mut KvCache) -> Vec<Vec<f32>> {
    let a: Vec<u32> = (0..9).map(|i| (i * 7 + 1) % 101).collect();
    let b: Vec<u32> = (0..14).map(|i| (i * 13 + 2) % 101).collect();
    let c: Vec<u32> = (0..5).map(|i| (i * 3 + 50) % 101).collect();
    let (ba, bb, bc) = (vec![0, 1, 2], vec![3, 4, 5, 6], vec![7, 8]);
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
            Work { tokens: &c, start: 0, blocks: &bc, logits: true },
        ],
    ));
    out.extend(model.step(
        kv,
        &[
            Work { tokens: &[4], start: 10, blocks: &ba, logits: true },
            Work { tokens: &[5], start: 14, blocks: &bb, logits: true },
            Work { tokens: &[6], start: 5, blocks: &bc, logits: true },
        ],
    ));
    out
}

#[test]
fn sharded_logits_equal_the_single_workers_bit_for_bit() {
    let (gpt, p) = model();
    let one = Model::new(&gpt, &p);
    let mut kv = KvCache::new(16, 4, 2, one.kv_width());
    let want = steps(&one, &mut kv);
    assert_eq!(want.len(), 7);
    for tp in [2, 4] {
        let got = brigade_comm::local::run(tp, |comm| -> Result<_, String> {
            let rank = comm.rank();
            let m = Model::shard(&gpt, &p, Some(comm))?;
            let mut kv = KvCache::new(16, 4, 2, m.kv_width());
            assert_eq!(m.kv_width(), 64 / tp);
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
        for (i, (g, w)) in got[0].iter().zip(&want).enumerate() {
            assert_eq!(g.len(), 101);
            let same = g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "tp {tp}: logits row {i} differ from the single worker's");
        }
        assert_eq!(got[0].len(), want.len());
    }
    // a group that does not divide the heads is refused
    let err = brigade_comm::local::run(3, |comm| Model::shard(&gpt, &p, Some(comm)).map(|_| ())).unwrap_err();
    assert!(err.to_string().contains("does not divide the model's 4 attention heads"), "{err}");
}

#[test]
fn the_engine_on_two_ranks_gives_the_same_tokens() {
    let (gpt, p) = model();
    let requests: Vec<Request> = (0..6u64)
        .map(|j| Request {
            id: j,
            prompt: (0..(3 + j * 5)).map(|i| ((i * 11 + j * 3) % 101) as u32).collect(),
            sampling: Sampling {
                temperature: if j % 2 == 0 { 0.0 } else { 0.9 },
                top_k: 0,
                top_p: 1.0,
                seed: j,
                max_tokens: 20,
                stop_tokens: vec![],
                top_logprobs: 2,
            },
        })
        .collect();
    let limits = Limits { max_running: 4, max_step_tokens: 12 };
    let drive = |e: &mut Engine| -> Vec<Output> {
        for r in &requests {
            e.add(r.clone()).unwrap();
        }
        let mut out = Vec::new();
        while e.has_work() {
            out.extend(e.step());
        }
        out
    };
    let want = drive(&mut Engine::new(Model::new(&gpt, &p), 40, 4, limits));
    let got = brigade_comm::local::run(2, |comm| -> Result<_, String> {
        let rank = comm.rank();
        let m = Model::shard(&gpt, &p, Some(comm))?;
        if rank == 0 {
            let mut e = Engine::new(m, 40, 4, limits);
            let out = drive(&mut e);
            e.model.stop_followers();
            Ok(out)
        } else {
            let mut kv = KvCache::new(40, 4, 2, m.kv_width());
            while m.follow(&mut kv) {}
            Ok(vec![])
        }
    })
    .unwrap();
    assert_eq!(got[0], want);
    assert_eq!(want.len(), 120);
}
