//! A GGUF file served as it stores its matrices (`--weights stored`, the default): each
//! block-quantized matrix in its own type, in the kernels that dequantize in registers. The
//! served tokens and log-probabilities are bit for bit those of serving the file dequantized to
//! f32 — alone, in a batch, and under tensor parallelism — while the products read a fraction
//! of the bytes. Files: brigade's own exports (`FileType::Q4_0`, `Q8_0`, `Q4_K`) of small Qwen2 and
//! Llama 3 models (the Llama architecture's q/k rows stored in llama.cpp's pair order, undone
//! for the blocks too), with the shared tokenizers.

mod common;

use brigade::models::gguf::{export, FileType};
use brigade::models::open::open_model;
use brigade_serve::engine::{Engine, Limits};
use brigade_serve::model::weights::WeightFormat;
use brigade_serve::model::{KvStore, Model, ShardError};
use brigade_serve::source::Source;
use std::path::Path;

fn checkpoint(dir: &Path, cfg: brigade::models::GptConfig, tok: &Path) {
    use brigade::models::checkpoint::{hf_config, save_tensors, write_json};
    std::fs::create_dir_all(dir).unwrap();
    let model = brigade::models::Gpt::new(cfg).unwrap();
    let mut params = model.layout.init(5);
    params.iter_mut().for_each(|p| *p *= 4.0);
    save_tensors(&dir.join("model.safetensors"), &model.layout, &params, "", None).unwrap();
    write_json(&dir.join("config.json"), &hf_config(&cfg)).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(tok.join(f), dir.join(f)).unwrap();
    }
}

fn engine(m: Model) -> Engine {
    Engine::new(m, 48, 4, Limits { max_running: 8, max_step_tokens: 20 })
}

/// One cache of unpacked GGUF metadata for the whole test binary: its tests run as threads of one
/// process and `BRIGADE_CACHE` is the process's, so each test pointing it at its own folder
/// raced (one test's second lookup read another's folder, or a folder already deleted).
fn one_cache() {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let d = tempfile::tempdir().unwrap();
        std::env::set_var("BRIGADE_CACHE", d.path());
        d
    });
}

#[test]
fn a_gguf_served_as_stored_gives_its_dequantized_weights_tokens_bit_for_bit() {
    use brigade::models::family::Family;
    let tmp = tempfile::tempdir().unwrap();
    one_cache();
    let Family::Llama(with_all) = Family::ALL[1] else { panic!("the second family is Llama's") };
    // an MLP of 256 so that Q4_K (blocks of 256) holds the down projection; rows of 64 are Q5_0
    let with_all = brigade::models::family::Llama { intermediate: 256, ..with_all };
    let qwen = brigade::models::family::Llama { o_bias: false, rope_scaling: None, tied: true, ..with_all };
    for (name, family) in [("qwen2", qwen), ("llama3", with_all)] {
        let Some(tok) = common::shared(&format!("tokenizers/{name}")) else { return };
        let vocab = brigade::models::tokenizer::Tokenizer::from_file(&tok).unwrap().vocab_size();
        let cfg = brigade::models::GptConfig {
            vocab_size: vocab,
            family: family.into(),
            ..brigade::models::GptConfig::example(Family::ALL[1], vocab, 64)
        };
        let ck = tmp.path().join(name);
        checkpoint(&ck, cfg, &tok);
        for ty in [FileType::Q4_0, FileType::Q8_0, FileType::Q4_K] {
            let file = tmp.path().join(format!("{name}-{ty:?}.gguf"));
            export(&ck, &file, ty).unwrap();
            let (gpt, params) = open_model(&file).unwrap();
            let stored = Source::Checkpoint(file.clone()).held(&WeightFormat::Stored, &gpt).unwrap();
            assert!(matches!(stored, WeightFormat::StoredIn(_)), "{name} {ty:?}: a GGUF is held as stored");
            let f32s = Model::shard_as(&gpt, &params, None, WeightFormat::F32).unwrap();
            let held = Model::shard_as(&gpt, &params, None, stored.clone()).unwrap();
            let (fb, hb) = (f32s.weight_bytes().0, held.weight_bytes().0);
            assert!(hb * 3 < fb, "{name} {ty:?}: the products read {hb} bytes as stored, {fb} in f32");
            let want = common::drive(&mut engine(f32s));
            let got = common::drive(&mut engine(held));
            assert_eq!(got, want, "{name} {ty:?}: stored differs from the dequantized f32");
            // two ranks, each cutting the stored blocks by output rows (and the vocabulary)
            let tp = brigade_comm::local::run(2, |comm| -> Result<_, ShardError> {
                let rank = comm.rank();
                let m = Model::shard_as(&gpt, &params, Some(comm), stored.clone())?;
                if rank == 0 {
                    let mut e = engine(m);
                    let out = common::drive(&mut e);
                    e.model.stop_followers();
                    Ok(out)
                } else {
                    let mut kv = KvStore::new(48, 4, m.layers_n, m.kv_width());
                    while m.follow(&mut kv) {}
                    Ok(Vec::new())
                }
            })
            .unwrap();
            assert_eq!(tp[0], want, "{name} {ty:?}: --tp 2 as stored differs from one worker");
        }
    }
}

/// The real SmolLM2-135M-Instruct as published (Q4_1 blocks, a Q8_0 token table as the tied
/// head) served as stored: the same tokens and log-probabilities as its dequantized f32, at a
/// quarter of the bytes. Needs `$BRIGADE_SMOLLM2` (the folder `get.sh` fills; `.ci/run` sets
/// it); skipped, saying so, without it.
#[test]
fn the_real_smollm2_q4_1_served_as_stored_equals_its_dequantized_weights() {
    let Some(dir) = std::env::var_os("BRIGADE_SMOLLM2").map(std::path::PathBuf::from) else {
        eprintln!("skipped: set BRIGADE_SMOLLM2 to the folder get.sh filled (.ci/run does)");
        return;
    };
    one_cache();
    let file = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    let (gpt, params) = open_model(&file).unwrap();
    let stored = Source::Checkpoint(file).held(&WeightFormat::Stored, &gpt).unwrap();
    let f32s = Model::shard_as(&gpt, &params, None, WeightFormat::F32).unwrap();
    let held = Model::shard_as(&gpt, &params, None, stored).unwrap();
    let (fb, hb) = (f32s.weight_bytes().0, held.weight_bytes().0);
    println!("SmolLM2-135M-Instruct: products read {hb} bytes as stored, {fb} in f32");
    assert!(hb * 4 < fb, "held as stored: {hb} bytes against {fb}");
    let want = common::drive(&mut engine(f32s));
    assert_eq!(common::drive(&mut engine(held)), want, "the Q4_1 file as stored differs from its f32");
}
