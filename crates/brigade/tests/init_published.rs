//! `--init`: a run starts from a published Hugging Face folder (the fixtures of
//! scripts/make_gpt2_fixture.py and make_llama_fixture.py: GPT-2, a Llama 3-style model with
//! an untied head, a Qwen2-style one with a tied head and a sharded checkpoint). On every
//! layout, each rank reads its own slices, and the first step's loss on Hugging Face's batch
//! equals the cross-entropy of the logits `transformers` computed for it (relative 1e-4); the
//! weights the ranks hold, gathered, are the folder's exactly.

use brigade::layout::Layout;
use brigade::models::checkpoint::load_model;
use brigade::parallel::{Mesh, MeshShape};
use brigade::tensor::loss::IGNORE;
use brigade::train::{TrainConfig, Trainer};
use safetensors::SafeTensors;
use std::path::{Path, PathBuf};

const FIXTURES: [&str; 3] = ["gpt2_hf", "llama3_hf", "qwen2_hf"];
const LAYOUTS: [&str; 8] =
    ["dp=1", "dp=2", "tp=2", "pp=2,mb=1", "dp=2,zero=3", "pp=2,tp=2,mb=1", "dp=2,tp=2,sp=1", "pp=2,dp=2,zero=1,mb=1"];

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// Hugging Face's long batch ([2, 100] ids) and the mean cross-entropy of its logits for it,
/// computed here in f64 from `transformers`' logits (position i predicts token i + 1).
fn reference(dir: &Path) -> (Vec<u32>, Vec<i32>, f64) {
    let bytes = std::fs::read(dir.join("expected.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let ids = st.tensor("long_input_ids").unwrap();
    let (b, t) = (ids.shape()[0], ids.shape()[1]);
    let x: Vec<u32> = ids.data().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32).collect();
    let lg = st.tensor("long_logits").unwrap();
    let v = lg.shape()[2];
    let logits: Vec<f32> = lg.data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    let y: Vec<i32> = (0..b * t).map(|i| if i % t == t - 1 { IGNORE } else { x[i + 1] as i32 }).collect();
    let (mut sum, mut n) = (0f64, 0usize);
    for (i, &target) in y.iter().enumerate() {
        if target == IGNORE {
            continue;
        }
        let row = &logits[i * v..(i + 1) * v];
        let mx = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
        let lse = mx + row.iter().map(|&z| (z as f64 - mx).exp()).sum::<f64>().ln();
        sum += lse - row[target as usize] as f64;
        n += 1;
    }
    (x, y, sum / n as f64)
}

/// A Megatron dataset of `n` tokens below `vocab` in documents of 50 (the run's data: it only
/// sets the sequence length here; the step is taken on Hugging Face's batch).
fn token_file(dir: &Path, vocab: usize, n: usize) -> PathBuf {
    let prefix = dir.join(format!("tokens{vocab}"));
    let bin: Vec<u8> = (0..n).flat_map(|i| (((i * 7 + i / 13) % vocab) as u16).to_le_bytes()).collect();
    let docs = n.div_ceil(50);
    let mut idx = b"MMIDIDX\x00\x00".to_vec();
    idx.extend_from_slice(&1u64.to_le_bytes());
    idx.push(8);
    idx.extend_from_slice(&(docs as u64).to_le_bytes());
    idx.extend_from_slice(&(docs as u64 + 1).to_le_bytes());
    let len = |d: usize| 50.min(n - d * 50);
    for d in 0..docs {
        idx.extend_from_slice(&(len(d) as i32).to_le_bytes());
    }
    for d in 0..docs {
        idx.extend_from_slice(&((d * 100) as i64).to_le_bytes());
    }
    for d in 0..=docs {
        idx.extend_from_slice(&(d as i64).to_le_bytes());
    }
    std::fs::write(prefix.with_extension("bin"), bin).unwrap();
    std::fs::write(prefix.with_extension("idx"), idx).unwrap();
    prefix
}

fn config(init: &Path, data: PathBuf) -> TrainConfig {
    TrainConfig {
        model: String::new(),
        init: Some(init.to_path_buf()),
        data: Some(data),
        steps: 2,
        batch: 2,
        seq: Some(100),
        eval_every: 0,
        ..TrainConfig::default()
    }
}

#[test]
fn every_layout_starts_from_the_published_weights_with_transformers_loss() {
    let tmp = tempfile::tempdir().unwrap();
    for name in FIXTURES {
        let dir = fixture(name);
        let (model, weights) = load_model(&dir).unwrap();
        let data = token_file(tmp.path(), model.cfg.vocab_size, 4000);
        let (x, y, want) = reference(&dir);
        for spec in LAYOUTS {
            let layout = Layout::parse(spec).unwrap();
            let cfg = config(&dir, data.clone());
            let out = brigade_comm::local::run(layout.world(), |world| {
                let mesh = Mesh::new(&world, MeshShape::of(&layout))?;
                let mut tr = Trainer::on_mesh(cfg.clone(), mesh, &layout)?;
                let local = tr.local_params()?.into_owned();
                let full = tr.full_params()?.unwrap_or(local);
                let s = brigade::with_threads(1, || tr.step_on(&x, &y))??;
                Ok::<_, brigade::Error>((full, s.loss))
            })
            .unwrap_or_else(|e| panic!("{name} on {spec}: {e}"));
            for (rank, (full, loss)) in out.iter().enumerate() {
                assert_eq!(full, &weights, "{name} on {spec}: rank {rank}'s gathered weights are not the folder's");
                let rel = ((*loss as f64 - want) / want).abs();
                assert!(
                    rel < 1e-4,
                    "{name} on {spec}: rank {rank}'s first loss {loss} vs transformers' {want} ({rel:.1e})"
                );
            }
        }
    }
}

#[test]
fn a_folder_of_another_family_or_shape_than_model_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixture("llama3_hf");
    let data = token_file(tmp.path(), 101, 4000);
    let mut cfg = config(&dir, data.clone());
    cfg.model = "gpt2-small".into();
    let e = Trainer::new(cfg).err().expect("a GPT-2 preset over a Llama folder").to_string();
    assert!(e.contains("Llama") && e.contains("drop --model"), "{e}");
    let mut cfg = config(&dir, data.clone());
    cfg.model = "llama-tiny".into();
    let e = Trainer::new(cfg).err().expect("another shape").to_string();
    assert!(e.contains("layers") && e.contains("drop --model"), "{e}");
    let mut cfg = config(&dir, data.clone());
    cfg.n_layer = Some(4);
    let e = Trainer::new(cfg).err().expect("a shape override").to_string();
    assert!(e.contains("n_layer"), "{e}");
    // a corpus whose ids the model's vocabulary does not hold
    let big = token_file(tmp.path(), 500, 4000);
    let e = Trainer::new(config(&dir, big)).err().expect("ids beyond the vocabulary").to_string();
    assert!(e.contains("beyond the model's vocabulary of 101"), "{e}");
    // a folder whose weights are not its config's
    let bad = tmp.path().join("mixed");
    std::fs::create_dir(&bad).unwrap();
    std::fs::copy(dir.join("config.json"), bad.join("config.json")).unwrap();
    std::fs::copy(fixture("gpt2_hf").join("model.safetensors"), bad.join("model.safetensors")).unwrap();
    let e = Trainer::new(config(&bad, data)).err().expect("weights of another model").to_string();
    assert!(e.contains("unexpected tensor") || e.contains("none of the files"), "{e}");
}
