//! `brigade export --gguf`, read back by a reader written here from the GGUF specification
//! (not the writer's code): for each family, a checkpoint with a real tokenizer becomes a file
//! whose tensors are llama.cpp's names and layouts of the checkpoint's — GPT-2's `[in, out]`
//! weights transposed, the Llama architecture's q/k rows in llama.cpp's pair order (its
//! converter's `permute`, written out here), Llama 3's rope factors — with the tokenizer's
//! tokens and llama.cpp's name for its pre-tokenizer; Q8_0 and f16 decode to within their
//! rounding; bad requests fail with one line and leave no file. (`scripts/check_gguf_export.py`
//! compares with llama.cpp's own converter, byte for byte.)

mod common;

use brigade::models::checkpoint::{hf_config, save_tensors, write_json};
use brigade::models::family::Family;
use brigade::models::gguf::{export, FileType};
use brigade::models::{Gpt, GptConfig};
use std::collections::HashMap;
use std::path::Path;

/// A metadata value, as much of it as the checks read.
#[derive(Debug, Clone, PartialEq)]
enum V {
    Num(f64),
    Bool(bool),
    Str(String),
    Arr(usize),
}

struct Gguf {
    meta: HashMap<String, V>,
    /// name → (dims innermost first, type, bytes)
    tensors: HashMap<String, (Vec<u64>, u32, Vec<u8>)>,
    order: Vec<String>,
}

fn read(path: &Path) -> Gguf {
    let b = std::fs::read(path).unwrap();
    let mut at = 0usize;
    let mut take = |n: usize| {
        at += n;
        &b[at - n..at]
    };
    let u32_ = |s: &[u8]| u32::from_le_bytes(s.try_into().unwrap());
    let u64_ = |s: &[u8]| u64::from_le_bytes(s.try_into().unwrap());
    assert_eq!(take(4), b"GGUF");
    assert_eq!(u32_(take(4)), 3);
    let (nt, nkv) = (u64_(take(8)) as usize, u64_(take(8)) as usize);
    let mut meta = HashMap::new();
    fn scalar(ty: u32, take: &mut dyn FnMut(usize) -> Vec<u8>) -> V {
        let mut f = |n| take(n);
        match ty {
            0 | 1 | 7 => {
                let v = f(1)[0];
                if ty == 7 {
                    V::Bool(v != 0)
                } else {
                    V::Num(v as f64)
                }
            }
            2 | 3 => V::Num(u16::from_le_bytes(f(2).try_into().unwrap()) as f64),
            4 => V::Num(u32::from_le_bytes(f(4).try_into().unwrap()) as f64),
            5 => V::Num(i32::from_le_bytes(f(4).try_into().unwrap()) as f64),
            6 => V::Num(f32::from_le_bytes(f(4).try_into().unwrap()) as f64),
            8 => {
                let n = u64::from_le_bytes(f(8).try_into().unwrap()) as usize;
                V::Str(String::from_utf8(f(n)).unwrap())
            }
            10..=12 => V::Num(u64::from_le_bytes(f(8).try_into().unwrap()) as f64),
            _ => panic!("value type {ty}"),
        }
    }
    let mut owned = |n: usize| take(n).to_vec();
    for _ in 0..nkv {
        let kl = u64::from_le_bytes(owned(8).try_into().unwrap()) as usize;
        let key = String::from_utf8(owned(kl)).unwrap();
        let ty = u32::from_le_bytes(owned(4).try_into().unwrap());
        let v = if ty == 9 {
            let et = u32::from_le_bytes(owned(4).try_into().unwrap());
            let n = u64::from_le_bytes(owned(8).try_into().unwrap()) as usize;
            for _ in 0..n {
                scalar(et, &mut owned);
            }
            V::Arr(n)
        } else {
            scalar(ty, &mut owned)
        };
        meta.insert(key, v);
    }
    let mut infos = Vec::new();
    for _ in 0..nt {
        let nl = u64::from_le_bytes(owned(8).try_into().unwrap()) as usize;
        let name = String::from_utf8(owned(nl)).unwrap();
        let nd = u32::from_le_bytes(owned(4).try_into().unwrap()) as usize;
        let dims: Vec<u64> = (0..nd).map(|_| u64::from_le_bytes(owned(8).try_into().unwrap())).collect();
        let ty = u32::from_le_bytes(owned(4).try_into().unwrap());
        let off = u64::from_le_bytes(owned(8).try_into().unwrap()) as usize;
        infos.push((name, dims, ty, off));
    }
    let data = at.next_multiple_of(32);
    let mut tensors = HashMap::new();
    let mut order = Vec::new();
    for (name, dims, ty, off) in infos {
        let n: u64 = dims.iter().product();
        let bytes = match ty {
            0 => 4 * n,
            1 => 2 * n,
            2 => n / 32 * 18,
            6 => n / 32 * 22,
            8 => n / 32 * 34,
            12 => n / 256 * 144,
            _ => panic!("type {ty}"),
        } as usize;
        assert_eq!(off % 32, 0, "{name} aligned");
        tensors.insert(name.clone(), (dims, ty, b[data + off..data + off + bytes].to_vec()));
        order.push(name);
    }
    Gguf { meta, tensors, order }
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// A checkpoint folder of `cfg` with random weights and the shared tokenizer `tok`.
fn checkpoint(dir: &Path, cfg: GptConfig, tok: &Path) -> (Gpt, Vec<f32>) {
    std::fs::create_dir_all(dir).unwrap();
    let model = Gpt::new(cfg).unwrap();
    let mut params = model.layout.init(5);
    // distinct values everywhere (norms too), so that a misplaced row shows
    for (i, p) in params.iter_mut().enumerate() {
        *p += (i % 977) as f32 * 1e-4;
    }
    save_tensors(&dir.join("model.safetensors"), &model.layout, &params, "", None).unwrap();
    write_json(&dir.join("config.json"), &hf_config(&cfg)).unwrap();
    for f in std::fs::read_dir(tok).unwrap() {
        let f = f.unwrap().path();
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("tokenizer") {
            std::fs::copy(&f, dir.join(name)).unwrap();
        }
    }
    (model, params)
}

fn tensor<'a>(model: &Gpt, params: &'a [f32], name: &str) -> (&'a [f32], Vec<usize>) {
    let s = model.layout.specs.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no {name}"));
    (s.view.of(params), s.shape.clone())
}

#[test]
fn gpt2_exports_with_its_weights_transposed_and_its_tokenizer() {
    let Some(tok) = common::shared("tokenizers/gpt2") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let cfg = GptConfig { n_layer: 2, n_head: 2, n_embd: 64, vocab_size: 50257, block_size: 32, family: Family::Gpt2 };
    let (model, params) = checkpoint(&tmp.path().join("ck"), cfg, &tok);
    let out = tmp.path().join("m.gguf");
    let e = export(&tmp.path().join("ck"), &out, FileType::F32).unwrap();
    assert_eq!((e.arch, e.pre), ("gpt2", "gpt-2"));
    let g = read(&out);
    assert_eq!(g.meta["general.architecture"], V::Str("gpt2".into()));
    assert_eq!(g.meta["gpt2.block_count"], V::Num(2.0));
    assert_eq!(g.meta["gpt2.context_length"], V::Num(32.0));
    assert_eq!(g.meta["tokenizer.ggml.tokens"], V::Arr(50257));
    assert_eq!(g.meta["tokenizer.ggml.merges"], V::Arr(50000));
    assert_eq!(g.meta["tokenizer.ggml.eos_token_id"], V::Num(50256.0));
    assert_eq!(g.order.len(), 4 + 2 * 12, "embeddings, output norm, and 12 tensors a block");
    // c_attn stored [in 64, out 192]: GGUF's attn_qkv is [out, in], dims [64, 192]
    let (w, shape) = tensor(&model, &params, "h.1.attn.c_attn.weight");
    assert_eq!(shape, [64, 192]);
    let (dims, ty, data) = &g.tensors["blk.1.attn_qkv.weight"];
    assert_eq!((dims.as_slice(), *ty), (&[64u64, 192][..], 0));
    let got = f32s(data);
    for i in 0..64 {
        for o in 0..192 {
            assert_eq!(got[o * 64 + i], w[i * 192 + o], "row {o} col {i}");
        }
    }
    let (wte, _) = tensor(&model, &params, "wte.weight");
    assert_eq!(f32s(&g.tensors["token_embd.weight"].2), wte);
    assert_eq!(g.tensors["position_embd.weight"].0, [64, 32]);
    assert_eq!(f32s(&g.tensors["output_norm.bias"].2), tensor(&model, &params, "ln_f.bias").0);
    assert!(!g.tensors.contains_key("output.weight"), "the head is tied");
}

#[test]
fn llama_exports_with_q_and_k_in_llama_cpps_pair_order_and_rope_factors() {
    let Some(tok) = common::shared("tokenizers/llama3") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let f = Family::ALL[1];
    let cfg = GptConfig { vocab_size: 128256, ..GptConfig::example(f, 128256, 64) };
    let (model, params) = checkpoint(&tmp.path().join("ck"), cfg, &tok);
    for (ty, file_type) in [(FileType::F32, 0.0), (FileType::Q8_0, 7.0), (FileType::F16, 1.0)] {
        let out = tmp.path().join("m.gguf");
        let e = export(&tmp.path().join("ck"), &out, ty).unwrap();
        assert_eq!(e.pre, "llama-bpe");
        let g = read(&out);
        assert_eq!(g.meta["general.file_type"], V::Num(file_type));
        // the example has q/k/v and o biases: llama.cpp's llama architecture, q/k reordered
        assert_eq!(g.meta["general.architecture"], V::Str("llama".into()));
        assert_eq!(g.meta["llama.attention.head_count_kv"], V::Num(cfg.kv_heads() as f64));
        assert_eq!(g.meta["tokenizer.ggml.add_bos_token"], V::Bool(true));
        let (q, shape) = tensor(&model, &params, "model.layers.0.self_attn.q_proj.weight");
        let (rows, cols, hd) = (shape[0], shape[1], cfg.head_dim());
        let (dims, t, data) = &g.tensors["blk.0.attn_q.weight"];
        assert_eq!(dims, &[cols as u64, rows as u64]);
        let got: Vec<f32> = match *t {
            0 => f32s(data),
            1 => data.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            8 => data
                .chunks_exact(34)
                .flat_map(|b| {
                    let d = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
                    b[2..].iter().map(move |&x| x as i8 as f32 * d)
                })
                .collect(),
            _ => panic!("type {t}"),
        };
        // llama.cpp's permute: w.reshape(heads, 2, hd/2, cols).swapaxes(1, 2)
        for h in 0..rows / hd {
            for j in 0..hd / 2 {
                for s in 0..2 {
                    for c in 0..cols {
                        let want = q[(h * hd + s * hd / 2 + j) * cols + c];
                        let have = got[(h * hd + 2 * j + s) * cols + c];
                        let tol = if *t == 0 { 0.0 } else { 0.02 * want.abs().max(0.05) };
                        assert!((have - want).abs() <= tol, "{ty:?} head {h} pair {j}.{s} col {c}: {have} vs {want}");
                    }
                }
            }
        }
        // vectors stay f32 whatever the type; the rope factors are Llama 3's
        assert_eq!(g.tensors["blk.0.attn_norm.weight"].1, 0);
        let factors = f32s(&g.tensors["rope_freqs.weight"].2);
        assert_eq!(factors.len(), hd / 2);
        assert!((factors[0] - 1.0).abs() < 1e-6 && (factors[hd / 2 - 1] - 8.0).abs() < 1e-4, "{factors:?}");
    }
}

/// `--type q4_k`: llama.cpp's Q4_K where a row is whole blocks of 256, its fallback Q5_0 where
/// it is whole blocks of 32, the token table (and an untied head) at Q8_0, vectors f32; every
/// matrix's values within its quantization step of the checkpoint's.
#[test]
fn q4_k_exports_each_matrix_in_the_type_its_rows_allow() {
    use brigade::models::gguf::quants::GgmlType;
    let Some(tok) = common::shared("tokenizers/gpt2") else { return };
    let tmp = tempfile::tempdir().unwrap();
    // rows of 64 (q|k|v, the MLP's up) and of 256 (the MLP's down)
    let cfg = GptConfig { n_layer: 2, n_head: 2, n_embd: 64, vocab_size: 50257, block_size: 32, family: Family::Gpt2 };
    let (model, params) = checkpoint(&tmp.path().join("ck"), cfg, &tok);
    let out = tmp.path().join("m.gguf");
    export(&tmp.path().join("ck"), &out, FileType::Q4_K).unwrap();
    let g = read(&out);
    assert_eq!(g.meta["general.file_type"], V::Num(14.0));
    let mut seen = HashMap::new();
    for (name, (dims, ty, data)) in &g.tensors {
        let want = match (dims.len(), dims[0]) {
            (1, _) => 0,
            // as llama-quantize: learned positions are not quantized
            _ if name == "position_embd.weight" => 0,
            _ if name == "token_embd.weight" || name == "output.weight" => 8,
            (_, row) if row % 256 == 0 => 12,
            (_, row) if row % 32 == 0 => 6,
            _ => 1,
        };
        assert_eq!(*ty, want, "{name} {dims:?}");
        *seen.entry(want).or_insert(0) += 1;
        let hf = match name.as_str() {
            "blk.0.ffn_down.weight" => "h.0.mlp.c_proj.weight",
            "blk.0.ffn_up.weight" => "h.0.mlp.c_fc.weight",
            _ => continue,
        };
        // GPT-2's Conv1D is [in, out]; GGUF's rows are the outputs
        let (w, shape) = tensor(&model, &params, hf);
        let (k, n) = (shape[0], shape[1]);
        let mut got = Vec::new();
        GgmlType::from_id(*ty).unwrap().dequantize_into(data, &mut got);
        assert_eq!(got.len(), k * n);
        let amax = w.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = (0..n * k).map(|j| (got[j] - w[(j % k) * n + j / k]).abs()).fold(0f32, f32::max);
        // 4 or 5 bits: within a step, a fifteenth of a group's range at most
        assert!(worst <= amax / 8.0 && worst > 0.0, "{name}: worst {worst} of {amax}");
    }
    assert_eq!((seen.get(&12), seen.get(&6)), (Some(&cfg.n_layer), Some(&(3 * cfg.n_layer))), "{seen:?}");
}

#[test]
fn bad_exports_fail_with_one_line_and_write_nothing() {
    let Some(tok) = common::shared("tokenizers/gpt2") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let cfg = GptConfig { n_layer: 1, n_head: 2, n_embd: 32, vocab_size: 50257, block_size: 16, family: Family::Gpt2 };
    checkpoint(&tmp.path().join("ck"), cfg, &tok);
    // into a folder that does not exist
    let e = export(&tmp.path().join("ck"), &tmp.path().join("no/such/m.gguf"), FileType::F32).unwrap_err().to_string();
    assert!(e.contains("cannot write") && !e.contains('\n'), "{e}");
    // a model trained on bytes has no tokenizer to give llama.cpp
    std::fs::remove_file(tmp.path().join("ck/tokenizer.json")).unwrap();
    let out = tmp.path().join("m.gguf");
    let e = export(&tmp.path().join("ck"), &out, FileType::F32).unwrap_err().to_string();
    assert!(e.contains("no tokenizer.json"), "{e}");
    assert!(!out.exists());
    assert!(FileType::parse("q5_k").unwrap_err().to_string().contains("f32, f16, q8_0, q4_0 or q4_k"));
    assert_eq!(FileType::parse("q4_0").unwrap(), FileType::Q4_0);
    assert_eq!(FileType::parse("q4_k").unwrap(), FileType::Q4_K);
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left.len(), 1, "nothing but the checkpoint: {left:?}");
}

/// Llama 3's rope factors as llama.cpp's own converter writes them
/// (`scripts/make_gguf_rope_fixture.py`: the published Llama 3.1 8B and 3.2 1B parameters and a
/// set no published model uses, each reaching the unscaled band, the scaled band and the
/// interpolation between): brigade's export writes those factors, and its import, given the
/// converter's factors in a file, names exactly the parameters they came from.
#[test]
fn rope_factors_as_llama_cpp_writes_them() {
    use brigade::models::family::{Llama3Rope, Positions};
    use brigade::models::gguf::file::{write, Tensor, TensorType, Value};
    let text = std::fs::read_to_string("tests/fixtures/gguf_rope_factors.json").unwrap();
    let f: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cases = f["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 3);
    let tmp = tempfile::tempdir().unwrap();
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let hd = c["head_dim"].as_u64().unwrap() as usize;
        let theta = c["rope_theta"].as_f64().unwrap();
        let s = &c["rope_scaling"];
        let scaling = Llama3Rope {
            factor: s["factor"].as_f64().unwrap(),
            low_freq_factor: s["low_freq_factor"].as_f64().unwrap(),
            high_freq_factor: s["high_freq_factor"].as_f64().unwrap(),
            original_max_position_embeddings: s["original_max_position_embeddings"].as_u64().unwrap() as usize,
        };
        let theirs: Vec<f32> = c["factors"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        assert_eq!(theirs.len(), hd / 2, "{name}");
        let ours =
            brigade::models::gguf::export::rope_factors(&Positions::Rotary { theta, scaling: Some(scaling) }, hd)
                .expect("scaled rope has factors");
        // within one unit in the last place: the converter takes the frequency from torch's
        // f32 `pow` (SLEEF, ≤ 1 ulp), brigade from Rust's `powf` (factor 29 of Llama 3.1's differs
        // by 1 ulp)
        let ulps = |a: f32, b: f32| (a.to_bits() as i64 - b.to_bits() as i64).abs();
        for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
            assert!(ulps(*a, *b) <= 1, "{name}: factor {i}: brigade {a}, llama.cpp {b}");
        }
        assert_eq!(brigade::models::gguf::export::rope_factors(&Positions::Rotary { theta, scaling: None }, hd), None);

        // the converter's factors in a file of that head size: the parameters named from them
        let heads = 2usize;
        let u = |x: usize| Value::U32(x as u32);
        let meta: Vec<(String, Value)> = vec![
            ("general.architecture".into(), Value::Str("llama".into())),
            ("llama.attention.head_count".into(), u(heads)),
            ("llama.attention.head_count_kv".into(), u(1)),
            ("llama.embedding_length".into(), u(heads * hd)),
            ("llama.block_count".into(), u(1)),
            ("llama.feed_forward_length".into(), u(32)),
            ("llama.context_length".into(), u(131072)),
            ("llama.vocab_size".into(), u(16)),
            ("llama.attention.layer_norm_rms_epsilon".into(), Value::F32(1e-5)),
            ("llama.rope.freq_base".into(), Value::F32(theta as f32)),
        ];
        let tensors = [Tensor::new("rope_freqs.weight", &[theirs.len()], TensorType::F32, &theirs)];
        let path = tmp.path().join(format!("{name}.gguf"));
        write(&mut std::fs::File::create(&path).unwrap(), &meta, &tensors).unwrap();
        let g = brigade::models::gguf::read::Gguf::open(&path).unwrap();
        let cfg = brigade::models::gguf::import::hf_config(&g).unwrap();
        let named = &cfg["rope_scaling"];
        let num = |k: &str| named[k].as_f64().unwrap_or_else(|| panic!("{name}: no {k} in {named}"));
        let read = Llama3Rope {
            factor: num("factor"),
            low_freq_factor: num("low_freq_factor"),
            high_freq_factor: num("high_freq_factor"),
            original_max_position_embeddings: num("original_max_position_embeddings") as usize,
        };
        // any parameters with the same two band edges (original context / each band factor)
        // give the same factors; the published ones are named as published
        let again = brigade::models::gguf::export::rope_factors(&Positions::Rotary { theta, scaling: Some(read) }, hd)
            .expect("scaled rope has factors");
        assert!(again.iter().zip(&theirs).all(|(a, b)| ulps(*a, *b) <= 1), "{name}: {named} gives other factors");
        if name != "unpublished" {
            let mut want = s.clone();
            want["rope_type"] = serde_json::json!("llama3");
            assert_eq!(named, &want, "{name}");
        }
    }
}
