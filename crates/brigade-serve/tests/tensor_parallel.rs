//! `--tp N` against the single worker: the same model sharded over N rank threads gives the
//! single worker's logits bit for bit, step after step (prompt chunks and decodes of several
//! sequences, paged KV caches), and so the same tokens through the engine.

mod common;

use brigade::models::family::{MlpSpec, Qkv};
use brigade::models::GptConfig;
use brigade_serve::engine::{Engine, Limits};
use brigade_serve::model::{KvDtype, KvStore};
use brigade_serve::model::{Model, ShardError};
use common::Family;

/// Whether a group of `tp` ranks can serve `cfg`, from its description alone: `tp` divides the
/// query heads, the MLP and the hidden size, and either divides the key/value heads (each rank
/// holds its own) or is a multiple of them (each is held by tp / kv ranks).
/// A mixture's experts (and shared expert) must split by their units too.
fn fits(cfg: &GptConfig, tp: usize) -> bool {
    let (h, kv) = (cfg.n_head, cfg.kv_heads());
    let experts = (0..cfg.n_layer).flat_map(|i| match cfg.block(i).mlp {
        MlpSpec::Moe(m) => vec![m.width(), m.shared.map_or(0, |(s, _)| s[0].d_out)],
        _ => vec![],
    });
    [h, cfg.mlp_width(), cfg.n_embd].into_iter().chain(experts).all(|d| d.is_multiple_of(tp))
        && (kv.is_multiple_of(tp) || tp.is_multiple_of(kv))
}

#[test]
fn experts_that_do_not_split_are_refused_with_the_sizes_that_do() {
    use brigade::models::family::{llama, Llama, LlamaMoe};
    let moe = LlamaMoe { width: 20, ..llama::MOE_EXAMPLE };
    let f = Family::Llama(Llama { moe: Some(moe), ..llama::EXAMPLE });
    let gpt = brigade::models::Gpt::new(common::config(f, 97, 64)).unwrap();
    let p = gpt.init_params(1);
    // 8 heads on 2 key/value heads take 8 ranks; the experts' 20 units do not
    let e = brigade_comm::local::run(8, |comm| Model::shard(&gpt, &p, Some(comm)).map(|_| ()))
        .expect_err("20 units over 8 ranks")
        .to_string();
    assert!(e.contains("--tp 8 does not divide the experts' width 20; use --tp among 1, 2, 4, 5, 10, 20"), "{e}");
    assert!(brigade_comm::local::run(4, |comm| Model::shard(&gpt, &p, Some(comm)).map(|_| ())).is_ok());
}

/// The group sizes a family's test model takes: every `tp` > 1 that fits it (GPT-2's 4 heads
/// take 2 and 4; the Llama model's 8 query heads on 2 key/value heads take 2, 4 and 8, which
/// hold each key/value head once, twice and four times).
fn sizes(cfg: &GptConfig) -> Vec<usize> {
    let sizes: Vec<usize> = (2..=cfg.n_head).filter(|&tp| fits(cfg, tp)).collect();
    assert!(!sizes.is_empty(), "{}: no group size fits the test model", cfg.family.name());
    println!("{}: tp {sizes:?}", cfg.family.name());
    sizes
}

/// Floats of one token's keys on a rank of `tp`: its share of the key/value heads, or one head
/// when the heads are fewer than the ranks.
fn kv_width(cfg: &GptConfig, tp: usize) -> usize {
    let heads = if tp <= cfg.kv_heads() { cfg.kv_heads() / tp } else { 1 };
    heads * cfg.head_dim()
}

#[test]
fn sharded_logits_equal_the_single_workers_bit_for_bit() {
    common::for_each_family(sharded_logits);
}

fn sharded_logits(f: Family) {
    // vocabulary 101: not a multiple of the group size (the head's padding is dropped)
    let (gpt, p) = common::model(f, 101, 64, 5);
    let one = Model::new(&gpt, &p);
    let mut kv = KvStore::new(16, 4, 2, one.kv_width());
    let want = common::steps(&one, &mut kv);
    let name = f.name();
    assert_eq!(want.len(), 7, "{name}");
    for tp in sizes(&gpt.cfg) {
        let got = brigade_comm::local::run(tp, |comm| -> Result<_, ShardError> {
            let rank = comm.rank();
            let m = Model::shard(&gpt, &p, Some(comm))?;
            let mut kv = KvStore::new(16, 4, 2, m.kv_width());
            // GPT-2: its heads' share of 64; Llama: one of the 2 key/value heads of 8 (its own
            // at tp 2, shared by 2 or 4 ranks at tp 4 or 8)
            assert_eq!(m.kv_width(), kv_width(&gpt.cfg, tp), "{name} tp {tp}: floats of a token's keys");
            if rank == 0 {
                let out = common::steps(&m, &mut kv);
                m.stop_followers();
                Ok(out)
            } else {
                while m.follow(&mut kv) {}
                Ok(vec![])
            }
        })
        .unwrap();
        for (i, (g, w)) in got[0].iter().zip(&want).enumerate() {
            assert_eq!(g.len(), 101, "{name} tp {tp}");
            let same = g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{name} tp {tp}: logits row {i} differ from the single worker's");
        }
        assert_eq!(got[0].len(), want.len(), "{name} tp {tp}");
    }
    // a group that does not divide the heads (the smallest: 3 for both families) is refused,
    // naming GPT-2's fused heads, or the query and key/value heads
    let (h, kv) = (gpt.cfg.n_head, gpt.cfg.kv_heads());
    let bad = (2..).find(|&tp| !fits(&gpt.cfg, tp)).unwrap();
    let err = brigade_comm::local::run(bad, |comm| Model::shard(&gpt, &p, Some(comm)).map(|_| ())).unwrap_err();
    let want = match gpt.cfg.block(0).attn.qkv {
        Qkv::Fused(_) => format!("tp={bad} does not divide the model's {h} attention heads"),
        Qkv::Separate { .. } => format!("tp={bad} does not divide the model's {h} query heads, {kv} key/value heads"),
    };
    assert!(err.to_string().contains(&want), "{name}: {err}");
}

#[test]
fn the_engine_on_several_ranks_gives_the_same_tokens() {
    common::for_each_family(|f| {
        for tp in sizes(&common::config(f, 101, 64)) {
            engine_on_ranks(f, tp, KvDtype::F32);
        }
    });
}

/// The same with each rank's cache in f16: a rank rounds its key/value heads as one worker
/// rounds them.
#[test]
fn the_engine_on_several_ranks_gives_the_same_tokens_with_an_f16_cache() {
    common::for_each_family(|f| {
        for tp in sizes(&common::config(f, 101, 64)) {
            engine_on_ranks(f, tp, KvDtype::F16);
        }
    });
}

fn engine_on_ranks(f: Family, tp: usize, dtype: KvDtype) {
    let (gpt, p) = common::model(f, 101, 64, 5);
    let limits = Limits { max_running: 4, max_step_tokens: 12 };
    let drive = common::drive;
    let want = drive(&mut Engine::with_cache(Model::new(&gpt, &p), (40, 4, dtype), limits));
    let got = brigade_comm::local::run(tp, |comm| -> Result<_, ShardError> {
        let rank = comm.rank();
        let m = Model::shard(&gpt, &p, Some(comm))?;
        if rank == 0 {
            let mut e = Engine::with_cache(m, (40, 4, dtype), limits);
            let out = drive(&mut e);
            e.model.stop_followers();
            Ok(out)
        } else {
            let mut kv = KvStore::with_dtype(40, 4, 2, m.kv_width(), dtype);
            while m.follow(&mut kv) {}
            Ok(vec![])
        }
    })
    .unwrap();
    let name = f.name();
    assert_eq!(got[0], want, "{name} on {tp} ranks, {dtype} cache");
    assert_eq!(want.len(), 180, "{name}");
    // the branches were computed from the copied blocks: each ran only its last prompt token
    assert!(want.iter().filter(|o| o.id >= 10).all(|o| o.prompt_computed == 1), "{name}");
}
