//! brigade's Llama-family decoder against Hugging Face `transformers` (fixtures made by
//! scripts/make_llama_fixture.py): a Llama 3-style model (GQA 4:1, llama3 rope scaling,
//! head_dim × heads ≠ hidden, untied head) and a Qwen2-style one (q/k/v biases, tied head,
//! rope_theta 1e6, a sharded checkpoint). Same weights, same input → same logits, loss, every
//! parameter's gradient, and the same greedy continuation.

mod common;
use brigade::models::checkpoint::load_model;
use brigade::models::units::Whole;
use brigade::models::{generate, Activations, Output, Pass, SampleOptions};
use brigade::nn::tp::Tp;
use brigade::tensor::loss::IGNORE;
use common::fixture::{f32s, gradients_match, ids, rel_err};
use safetensors::SafeTensors;
use std::path::Path;

fn matches_hugging_face(dir: &str) {
    let dir = Path::new(dir);
    let (model, params) = load_model(dir).expect("loads a Hugging Face save_pretrained directory");
    assert_eq!(model.cfg.family.name(), "Llama", "read as the Llama family");
    let bytes = std::fs::read(dir.join("expected.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let (x, b, t) = ids(&st, "input_ids");
    // Hugging Face shifts labels inside: position i predicts token i+1, the last predicts nothing.
    let targets: Vec<i32> = (0..b * t).map(|i| if i % t == t - 1 { IGNORE } else { x[i + 1] as i32 }).collect();
    let count = targets.iter().filter(|&&y| y != IGNORE).count();

    let mut acts = Activations::default();
    model.logits(&params, &x, (b, t), &mut acts);
    let e = rel_err(&acts.logits, &f32s(&st, "logits"));
    assert!(e < 1e-4, "{dir:?}: logits differ from Hugging Face by {e:.2e} (relative)");
    let (sum, n) = model.loss(&Tp::SOLO, &targets, &mut acts).unwrap();
    assert_eq!(n, count);
    let (loss, want) = (sum / n as f64, f32s(&st, "loss")[0] as f64);
    assert!(((loss - want) / want).abs() < 1e-5, "{dir:?}: loss {loss} vs Hugging Face {want}");

    let mut grads = vec![0f32; model.layout.total];
    let mut store = Whole::new(&model.units, &params, &mut grads);
    let from = Output::Loss { targets: &targets, scale: 1.0 / count as f32 };
    model.backward(&mut Pass::new(&Tp::SOLO, &mut store), &x, from, &mut acts).unwrap();
    gradients_match(&model.layout, &grads, &st, &format!("{dir:?}"));

    // a prompt longer than one attention tile and than the original rope context
    let (long, b, t) = ids(&st, "long_input_ids");
    model.logits(&params, &long, (b, t), &mut acts);
    let e = rel_err(&acts.logits, &f32s(&st, "long_logits"));
    assert!(e < 1e-4, "{dir:?}: logits of a {t}-token prompt differ from Hugging Face by {e:.2e} (relative)");

    let (prompt, _, _) = ids(&st, "prompt_ids");
    let (want, _, n) = ids(&st, "greedy_ids");
    let opt = SampleOptions { max_new_tokens: n, temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0, stop: Vec::new() };
    let got = generate(&model, &params, &[prompt], &opt);
    assert_eq!(got[0], want, "{dir:?}: greedy continuation differs from Hugging Face generate()");
}

#[test]
fn matches_hugging_face_llama3() {
    matches_hugging_face("tests/fixtures/llama3_hf");
}

#[test]
fn matches_hugging_face_qwen2_sharded() {
    matches_hugging_face("tests/fixtures/qwen2_hf");
}

/// A copy of the Llama 3 fixture folder in a temporary directory, for damaging.
fn copy_fixture(name: &str) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(Path::new("tests/fixtures").join(name)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), d.path().join(e.file_name())).unwrap();
    }
    d
}

fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, serde_json::to_string(&v).unwrap()).unwrap();
}

fn refusal(dir: &Path) -> String {
    let Err(e) = load_model(dir) else { panic!("{dir:?} was accepted") };
    let e = e.to_string();
    assert!(!e.contains('\n'), "one line: {e}");
    e
}

#[test]
fn bad_llama_folders_are_refused_with_one_line() {
    let cases: Vec<(&str, serde_json::Value, &str)> = vec![
        ("sliding_window", serde_json::json!(64), "sliding_window = 64 is not supported"),
        ("num_key_value_heads", serde_json::json!(3), "must be a multiple of num_key_value_heads (3)"),
        ("hidden_act", serde_json::json!("gelu"), "hidden_act = \"gelu\" is not supported"),
        ("rope_parameters", serde_json::json!({"rope_type": "yarn", "factor": 2.0}), "rope_parameters.rope_type"),
        ("num_local_experts", serde_json::json!(8), "num_local_experts = 8"),
        // head_dim × heads no longer the weights' shape: the tensor is named with both shapes
        (
            "head_dim",
            serde_json::json!(8),
            "model.layers.0.self_attn.q_proj.weight' has shape [128, 64], the model expects [64, 64]",
        ),
    ];
    for (key, value, want) in cases {
        let d = copy_fixture("llama3_hf");
        edit_config(d.path(), |v| v[key] = value);
        let e = refusal(d.path());
        assert!(e.contains(want), "{key}: {e}");
    }
    // no head_dim, and a hidden size the heads do not divide
    let d = copy_fixture("llama3_hf");
    edit_config(d.path(), |v| {
        v.as_object_mut().unwrap().remove("head_dim");
        v["hidden_size"] = serde_json::json!(66);
    });
    let e = refusal(d.path());
    assert!(e.contains("hidden_size (66) is not a multiple of num_attention_heads (8)"), "{e}");
    // a missing weight, named
    let d = copy_fixture("llama3_hf");
    let bytes = std::fs::read(d.path().join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<(String, safetensors::tensor::TensorView)> =
        st.tensors().into_iter().filter(|(n, _)| n != "model.layers.1.mlp.up_proj.weight").collect();
    safetensors::serialize_to_file(kept, None, &d.path().join("model.safetensors")).unwrap();
    let e = refusal(d.path());
    assert!(e.contains("'model.layers.1.mlp.up_proj.weight' is missing"), "{e}");
    // an index naming a shard that is not there
    let d = copy_fixture("qwen2_hf");
    std::fs::remove_file(d.path().join("model-00003-of-00005.safetensors")).unwrap();
    let e = refusal(d.path());
    assert!(e.contains("names shard 'model-00003-of-00005.safetensors'") && e.contains("incomplete"), "{e}");
}

/// BF16 and F16 copies of the fixture's weights load converted to f32 (each value the f32
/// nearest its 16-bit one, written out here), and a BF16 file cut short is refused.
#[test]
fn bf16_and_f16_weights_load_converted() {
    let dir = Path::new("tests/fixtures/llama3_hf");
    let (_, want) = load_model(dir).unwrap();
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    type Conv = fn(f32) -> (u16, f32);
    // round to nearest even, and back
    let bf16: Conv = |x| {
        let b = x.to_bits();
        let r = ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16;
        (r, f32::from_bits((r as u32) << 16))
    };
    let f16: Conv = |x| {
        let h = half_bits(x);
        (h, half_value(h))
    };
    for (dtype, conv) in [(safetensors::Dtype::BF16, bf16), (safetensors::Dtype::F16, f16)] {
        let d = copy_fixture("llama3_hf");
        let mut data: Vec<(String, Vec<u8>, Vec<usize>)> = Vec::new();
        let mut rounded = Vec::new();
        for (name, t) in st.tensors() {
            let vals: Vec<f32> = t.data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
            let mut b = Vec::new();
            for v in vals {
                let (h, back) = conv(v);
                b.extend_from_slice(&h.to_le_bytes());
                rounded.push((name.clone(), back));
            }
            data.push((name, b, t.shape().to_vec()));
        }
        let views: Vec<(String, safetensors::tensor::TensorView)> = data
            .iter()
            .map(|(n, b, s)| (n.clone(), safetensors::tensor::TensorView::new(dtype, s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, &d.path().join("model.safetensors")).unwrap();
        let (model, got) = load_model(d.path()).unwrap();
        let mut at = 0;
        for (name, t) in st.tensors() {
            let spec = model.layout.get(&name).unwrap();
            let n = t.data().len() / 4;
            let expect: Vec<f32> = rounded[at..at + n].iter().map(|r| r.1).collect();
            assert_eq!(spec.view.of(&got), &expect[..], "{dtype:?} {name}");
            at += n;
        }
        // and close to the f32 weights (16-bit rounding only)
        let e = rel_err(&got, &want);
        assert!(e > 0.0 && e < 1e-2, "{dtype:?}: {e}");
        // cut short: refused with one line
        let p = d.path().join("model.safetensors");
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() - 10]).unwrap();
        let e = refusal(d.path());
        assert!(e.contains("model.safetensors"), "{e}");
    }
}

/// The value of IEEE half bits, from the definition (f64).
fn half_value(h: u16) -> f32 {
    let s = if h >> 15 == 1 { -1.0 } else { 1.0 };
    let (e, m) = (((h >> 10) & 0x1f) as i32, (h & 0x3ff) as f64);
    let v = if e == 0 { m * 2f64.powi(-24) } else { (1.0 + m / 1024.0) * 2f64.powi(e - 15) };
    (s * v) as f32
}

/// f32 to IEEE half bits (round to nearest even; subnormals rounded to the nearest multiple of
/// 2⁻²⁴), for the finite values of the fixture.
fn half_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
    if exp <= 0 {
        return sign | (x.abs() as f64 * 2f64.powi(24)).round() as u16;
    }
    assert!(exp < 31, "{x} overflows f16");
    let man = b & 0x7f_ffff;
    let mut h = ((exp as u32) << 10) | (man >> 13);
    let rest = man & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && h & 1 == 1) {
        h += 1;
    }
    sign | h as u16
}

/// Published models' `config.json` (Hub form, tests/fixtures/hub_configs) read as the presets
/// of the same shape; and the keys that would change the model's function beyond what brigade
/// implements (interleaved rotary pairs, multimodal rope) are refused.
#[test]
fn hub_configs_read_as_the_presets() {
    use brigade::models::checkpoint::parse_model_config;
    use brigade::models::GptConfig;
    let dir = Path::new("tests/fixtures/hub_configs");
    for (file, preset) in [
        ("Llama-3.2-1B.json", "llama3.2-1b"),
        ("Qwen2.5-0.5B.json", "qwen2.5-0.5b"),
        ("SmolLM2-135M.json", "smollm2-135m"),
    ] {
        let p = dir.join(file);
        let text = std::fs::read_to_string(&p).unwrap();
        let cfg = parse_model_config(&text, &p).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(cfg, GptConfig::preset(preset).unwrap(), "{file}");
        for (key, value, named) in
            [("rope_interleaved", "true", "rope_interleaved"), ("use_mrope", "true", "use_mrope")]
        {
            let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
            v[key] = serde_json::from_str(value).unwrap();
            let e = parse_model_config(&v.to_string(), &p).unwrap_err().to_string();
            assert!(e.contains(named), "{file} {key}: {e}");
        }
        // Qwen's switch is use_sliding_window (its sliding_window is set, and off)
        if file.starts_with("Qwen") {
            let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
            v["use_sliding_window"] = serde_json::json!(true);
            let e = parse_model_config(&v.to_string(), &p).unwrap_err().to_string();
            assert!(e.contains("use_sliding_window = true is not supported"), "{file}: {e}");
        }
    }
}

/// The published Instruct models' files (tests/fixtures/hub_configs/published: Llama 3.1 8B
/// and 3.2 1B, Qwen2.5 0.5B, SmolLM2 135M, Mistral 7B v0.3 — config.json,
/// generation_config.json and tokenizer_config.json as the Hub has them).
fn published() -> Vec<(String, std::path::PathBuf)> {
    let root = Path::new("tests/fixtures/hub_configs/published");
    let mut out: Vec<_> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), p))
        .collect();
    out.sort();
    let names: Vec<&str> = out.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "Llama-3.1-8B-Instruct",
            "Llama-3.2-1B-Instruct",
            "Mistral-7B-Instruct-v0.3",
            "Qwen2.5-0.5B-Instruct",
            "SmolLM2-135M-Instruct"
        ]
    );
    out
}

fn json_at(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap_or_else(|e| panic!("{p:?}: {e}"))
}

/// Each published config.json read as the model it describes, every field that changes the
/// function taking effect: the shape, grouped-query heads, head width, norm epsilon, tied head,
/// Qwen2's q/k/v biases, the context, and the rotary frequencies equal to those `transformers`
/// computes from the same file (scripts/make_hub_rope_fixture.py) — Llama 3's scaling with
/// every one of its bands reached, and each of its five parameters changed in turn giving
/// transformers' frequencies for that change (so none is read and then ignored).
#[test]
fn published_configs_take_effect() {
    use brigade::models::checkpoint::parse_model_config;
    use brigade::models::family::Family;
    let rope = json_at(Path::new("tests/fixtures/hub_configs/published/rope_inv_freq.json"));
    let close = |got: &[f32], want: &serde_json::Value, what: &str| {
        let want: Vec<f64> = want.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        assert_eq!(got.len(), want.len(), "{what}: rotary pairs");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(((*g as f64 - w) / w).abs() < 1e-6, "{what}: inv_freq[{i}] {g} vs transformers' {w}");
        }
    };
    let read = |text: &str, p: &Path| parse_model_config(text, p).unwrap_or_else(|e| panic!("{p:?}: {e}"));
    for (name, dir) in published() {
        let p = dir.join("config.json");
        let text = std::fs::read_to_string(&p).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let cfg = read(&text, &p);
        let n = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{name}: {k}")) as usize;
        assert_eq!(
            (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.vocab_size, cfg.block_size),
            (
                n("num_hidden_layers"),
                n("num_attention_heads"),
                n("hidden_size"),
                n("vocab_size"),
                n("max_position_embeddings")
            ),
            "{name}"
        );
        let Family::Llama(a) = cfg.family else { panic!("{name}: read as {}", cfg.family.name()) };
        let head_dim = v.get("head_dim").map_or(n("hidden_size") / n("num_attention_heads"), |_| n("head_dim"));
        assert_eq!(
            (a.n_kv_head, a.head_dim, a.intermediate),
            (n("num_key_value_heads"), head_dim, n("intermediate_size")),
            "{name}"
        );
        assert!(a.n_kv_head < cfg.n_head, "{name}: grouped-query attention");
        assert_eq!(a.rms_eps, v["rms_norm_eps"].as_f64().unwrap() as f32, "{name}: rms_norm_eps");
        assert_eq!(a.rope_theta, v["rope_theta"].as_f64().unwrap(), "{name}: rope_theta");
        assert_eq!(a.tied, v["tie_word_embeddings"].as_bool().unwrap(), "{name}: tie_word_embeddings");
        assert_eq!((a.qkv_bias, a.o_bias), (v["model_type"] == "qwen2", false), "{name}: biases");
        assert!(a.moe.is_none() && !a.qk_norm, "{name}");
        let got = cfg.positions().inv_freq(a.head_dim).unwrap();
        close(&got, &rope["models"][&name], &name);
        // Llama 3's scaling: frequencies kept, divided and interpolated (wavelengths below
        // orig/high, above orig/low, between) — every band is reached by these files
        if let Some(r) = a.rope_scaling {
            let s = &v["rope_scaling"];
            assert_eq!(
                (r.factor, r.low_freq_factor, r.high_freq_factor, r.original_max_position_embeddings),
                (
                    s["factor"].as_f64().unwrap(),
                    s["low_freq_factor"].as_f64().unwrap(),
                    s["high_freq_factor"].as_f64().unwrap(),
                    s["original_max_position_embeddings"].as_u64().unwrap() as usize
                ),
                "{name}"
            );
            let orig = r.original_max_position_embeddings as f64;
            let base = Positions::Rotary { theta: a.rope_theta, scaling: None }.inv_freq(a.head_dim).unwrap();
            let wavelen: Vec<f64> = base.iter().map(|f| 2.0 * std::f64::consts::PI / *f as f64).collect();
            let bands = [
                wavelen.iter().filter(|w| **w < orig / r.high_freq_factor).count(),
                wavelen.iter().filter(|w| **w > orig / r.low_freq_factor).count(),
            ];
            let between = wavelen.len() - bands[0] - bands[1];
            assert!(bands[0] > 0 && bands[1] > 0 && between > 0, "{name}: bands {bands:?} and {between} between");
        } else {
            assert!(v["rope_scaling"].is_null() || v.get("rope_scaling").is_none(), "{name}");
        }
    }
    // each rope parameter of Llama 3.1's file changed in turn: transformers' frequencies, and
    // not the unchanged file's
    let base_path = Path::new("tests/fixtures/hub_configs/published/Llama-3.1-8B-Instruct/config.json");
    let base: serde_json::Value = json_at(base_path);
    let unchanged = read(&base.to_string(), base_path).positions().inv_freq(128).unwrap();
    let cases = rope["llama3_1_varied"].as_array().unwrap();
    assert_eq!(cases.len(), 5);
    for case in cases {
        let key = case["key"].as_str().unwrap();
        let mut v = base.clone();
        match key {
            "rope_theta" => v[key] = case["value"].clone(),
            _ => v["rope_scaling"][key] = case["value"].clone(),
        }
        let got = read(&v.to_string(), base_path).positions().inv_freq(128).unwrap();
        close(&got, &case["inv_freq"], &format!("Llama 3.1 with {key} {}", case["value"]));
        assert_ne!(got, unchanged, "{key}: changing it changed nothing");
    }
}

use brigade::models::family::spec::Positions;

/// Each published generation_config.json as serving reads it: every end-of-sequence id in the
/// file's order, and the sampling defaults the authors set (none where they set none).
#[test]
fn published_generation_configs_read_whole() {
    use brigade::models::generation_config::read;
    for (name, dir) in published() {
        let v = json_at(&dir.join("generation_config.json"));
        let vocab = json_at(&dir.join("config.json"))["vocab_size"].as_u64().unwrap() as usize;
        let g = read(&dir, vocab).unwrap_or_else(|e| panic!("{name}: {e}"));
        let ids: Vec<u32> = match &v["eos_token_id"] {
            serde_json::Value::Array(a) => a.iter().map(|x| x.as_u64().unwrap() as u32).collect(),
            x => vec![x.as_u64().unwrap() as u32],
        };
        assert_eq!(g.eos, ids, "{name}");
        let f = |k: &str| v.get(k).and_then(serde_json::Value::as_f64);
        assert_eq!(
            (g.temperature, g.top_p, g.repetition_penalty),
            (f("temperature"), f("top_p"), f("repetition_penalty")),
            "{name}"
        );
        assert_eq!(g.top_k, v.get("top_k").map(|k| k.as_u64().unwrap() as usize), "{name}");
        assert!(g.not_applied.is_empty() && g.max_new_tokens.is_none(), "{name}");
        // one more id than the model has is refused, naming the file
        let small = ids.iter().max().copied().unwrap() as usize;
        let e = read(&dir, small).unwrap_err().to_string();
        assert!(e.contains("generation_config.json") && e.contains("eos_token_id"), "{name}: {e}");
    }
    // what the Instruct models' authors set, as published
    let g = read(Path::new("tests/fixtures/hub_configs/published/Qwen2.5-0.5B-Instruct"), 151936).unwrap();
    assert_eq!(
        (g.eos, g.temperature, g.top_p, g.top_k, g.repetition_penalty),
        (vec![151645, 151643], Some(0.7), Some(0.8), Some(20), Some(1.1))
    );
    let g = read(Path::new("tests/fixtures/hub_configs/published/Llama-3.2-1B-Instruct"), 128256).unwrap();
    assert_eq!((g.eos, g.temperature, g.top_p, g.top_k), (vec![128001, 128008, 128009], Some(0.6), Some(0.9), None));
}

/// The memory-mapped reader of `train --init` (`shard_load`) on a sharded folder: Hugging
/// Face's buffers (a rotary `inv_freq`; a tied model's `lm_head.weight`) beside the weights are
/// passed over and the same numbers read as the whole-file reader's; a tensor the model has not,
/// in any one shard, is refused naming it and that shard.
#[test]
fn the_mapped_reader_refuses_tensors_the_model_has_not() {
    use brigade::models::shard_load::MappedWeights;
    let add = |path: &Path, extra: &[(&str, Vec<f32>)]| {
        let bytes = std::fs::read(path).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let raw: Vec<(String, Vec<u8>, usize)> = extra
            .iter()
            .map(|(n, v)| (n.to_string(), v.iter().flat_map(|x| x.to_le_bytes()).collect(), v.len()))
            .collect();
        let mut views: Vec<(String, safetensors::tensor::TensorView)> = st.tensors();
        for (n, b, len) in &raw {
            views.push((
                n.clone(),
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![*len], b).unwrap(),
            ));
        }
        safetensors::serialize_to_file(views, None, path).unwrap();
    };
    let d = copy_fixture("qwen2_hf");
    let (model, params) = load_model(d.path()).unwrap();
    let tied = !model.layout.specs.iter().any(|s| s.name == "lm_head.weight");
    let mut buffers = vec![("model.layers.0.self_attn.rotary_emb.inv_freq", vec![1.0, 0.5])];
    if tied {
        buffers.push(("lm_head.weight", vec![0.0; 4]));
    }
    add(&d.path().join("model-00002-of-00005.safetensors"), &buffers);
    let read = |dir: &Path| MappedWeights::open(dir).unwrap().read_local(&model.layout, 0, 1, &model.layout);
    assert!(read(d.path()).unwrap() == params, "the buffers changed what was read");
    add(&d.path().join("model-00004-of-00005.safetensors"), &[("model.layers.0.mlp.extra.weight", vec![1.0])]);
    let e = read(d.path()).unwrap_err().to_string();
    assert!(
        e.contains("unexpected tensor 'model.layers.0.mlp.extra.weight'") && e.contains("model-00004-of-00005"),
        "{e}"
    );
}
