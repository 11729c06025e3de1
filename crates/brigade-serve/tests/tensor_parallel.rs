//! `--tp N` against the single worker: the same model sharded over N rank threads gives the
//! single worker's logits bit for bit, step after step (prompt chunks and decodes of several
//! sequences, paged KV caches), and so the same tokens through the engine.

mod common;

use brigade_serve::engine::{Admit, Engine, Limits, Output, Request, Sampling};
use brigade_serve::model::KvStore;
use brigade_serve::model::{Model, ShardError, Work};
use common::{Family, FAMILIES};

/// Three sequences over three steps: whole prompts, then a chunk beside decodes, then decodes.
fn steps(model: &Model, kv: &mut KvStore) -> Vec<Vec<f32>> {
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

/// The group sizes each family's test model takes: GPT-2's 4 heads; the Llama model's 8
/// query heads on 2 key/value heads, which 4 and 8 ranks hold twice and four times.
fn sizes(f: Family) -> &'static [usize] {
    if f == Family::Gpt2 {
        &[2, 4]
    } else {
        &[2, 4, 8]
    }
}

#[test]
fn sharded_logits_equal_the_single_workers_bit_for_bit() {
    for f in FAMILIES {
        sharded_logits(f);
    }
}

fn sharded_logits(f: Family) {
    // vocabulary 101: not a multiple of the group size (the head's padding is dropped)
    let (gpt, p) = common::model(f, 101, 64, 5);
    let one = Model::new(&gpt, &p);
    let mut kv = KvStore::new(16, 4, 2, one.kv_width());
    let want = steps(&one, &mut kv);
    assert_eq!(want.len(), 7);
    for &tp in sizes(f) {
        let got = brigade_comm::local::run(tp, |comm| -> Result<_, ShardError> {
            let rank = comm.rank();
            let m = Model::shard(&gpt, &p, Some(comm))?;
            let mut kv = KvStore::new(16, 4, 2, m.kv_width());
            // GPT-2: its heads' share of 64; Llama: one of the 2 key/value heads of 8 (its own
            // at tp 2, shared by 2 or 4 ranks at tp 4 or 8)
            let want = if f == Family::Gpt2 { 64 / tp } else { 8 };
            assert_eq!(m.kv_width(), want);
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
            assert!(same, "{f:?} tp {tp}: logits row {i} differ from the single worker's");
        }
        assert_eq!(got[0].len(), want.len());
    }
    // a group that does not divide the heads is refused
    let err = brigade_comm::local::run(3, |comm| Model::shard(&gpt, &p, Some(comm)).map(|_| ())).unwrap_err();
    let want = if f == Family::Gpt2 {
        "does not divide the model's 4 attention heads"
    } else {
        "8 query heads, 2 key/value heads"
    };
    assert!(err.to_string().contains(want), "{err}");
}

#[test]
fn the_engine_on_several_ranks_gives_the_same_tokens() {
    for f in FAMILIES {
        for &tp in sizes(f) {
            engine_on_ranks(f, tp);
        }
    }
}

fn engine_on_ranks(f: Family, tp: usize) {
    let (gpt, p) = common::model(f, 101, 64, 5);
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
        // three branches sharing request 5's prompt: its partial block copied on every rank
        for k in 0..3u64 {
            let mut r = requests[5].clone();
            r.id = 10 + k;
            r.sampling.seed = 100 + k;
            e.add_with(r, Admit { follows: Some(5), ..Default::default() }).unwrap();
        }
        let mut out = Vec::new();
        while e.has_work() {
            out.extend(e.step());
        }
        out
    };
    let want = drive(&mut Engine::new(Model::new(&gpt, &p), 40, 4, limits));
    let got = brigade_comm::local::run(tp, |comm| -> Result<_, ShardError> {
        let rank = comm.rank();
        let m = Model::shard(&gpt, &p, Some(comm))?;
        if rank == 0 {
            let mut e = Engine::new(m, 40, 4, limits);
            let out = drive(&mut e);
            e.model.stop_followers();
            Ok(out)
        } else {
            let mut kv = KvStore::new(40, 4, 2, m.kv_width());
            while m.follow(&mut kv) {}
            Ok(vec![])
        }
    })
    .unwrap();
    assert_eq!(got[0], want, "{f:?} on {tp} ranks");
    assert_eq!(want.len(), 180);
    // the branches were computed from the copied blocks: each ran only its last prompt token
    assert!(want.iter().filter(|o| o.id >= 10).all(|o| o.prompt_computed == 1));
}
