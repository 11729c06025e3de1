//! `--pp N` against the single worker: the same model cut into N pipeline stages (each a run
//! of the layers and their KV cache, the first with the embedding, the last with the head) on N
//! rank threads gives the single worker's logits bit for bit, step after step (prompt chunks
//! beside decodes, paged KV caches, a partial block copied for branches), and so the same
//! tokens through the engine. A model of 4 layers is cut into 2, 3 and 4 stages (3: 2 + 1 + 1
//! layers); more stages than layers are refused.

mod common;

use brigade::models::Gpt;
use brigade_serve::engine::{Engine, Limits};
use brigade_serve::model::forward::stage_layers;
use brigade_serve::model::weights::WeightFormat;
use brigade_serve::model::{KvStore, Model, ShardError, Work};
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

#[test]
fn stages_hold_runs_of_layers_as_even_as_they_go() {
    assert_eq!((0..3).map(|s| stage_layers(4, 3, s)).collect::<Vec<_>>(), [0..2, 2..3, 3..4]);
    assert_eq!((0..2).map(|s| stage_layers(5, 2, s)).collect::<Vec<_>>(), [0..3, 3..5]);
    assert_eq!(stage_layers(4, 1, 0), 0..4);
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
                assert_eq!(m.layers_n, stage_layers(4, pp, rank).len());
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
        let want = drive(&mut Engine::new(Model::new(&gpt, &p), 40, 4, limits));
        let got = brigade_comm::local::run(2, |comm| -> Result<_, ShardError> {
            let rank = comm.rank();
            let m = Model::stage_as(&gpt, &p, comm, WeightFormat::F32)?;
            if rank == 0 {
                let mut e = Engine::new(m, 40, 4, limits);
                let out = drive(&mut e);
                e.model.stop_followers();
                Ok(out)
            } else {
                let mut kv = KvStore::new(40, 4, m.layers_n, m.kv_width());
                while m.follow(&mut kv) {}
                Ok(vec![])
            }
        })
        .unwrap();
        assert_eq!(got[0], want, "{} on a pipeline of 2", f.name());
        assert_eq!(want.len(), 180);
    });
}
