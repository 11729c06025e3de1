//! A GGUF file as a checkpoint: its metadata as the Hugging Face `config.json` of the model it
//! describes (the `llama` and `qwen2` architectures), its tokenizer (a byte-level BPE:
//! `tokenizer.ggml.tokens`, `merges`, `token_type`, its pre-tokenizer by llama.cpp's name) as a
//! `tokenizer.json` with the `tokenizer_config.json` of its special tokens and chat template,
//! and its tensors dequantized to f32 under their Hugging Face names — the inverse of
//! `export`, through the same routes. The metadata files are unpacked once into a folder of
//! the cache named by the file's header (`folder_of`), so everything that reads a Hugging Face
//! folder reads them; the weights are read from the GGUF itself.

use super::export::{gguf_row, inverse_change, routes, Change};
use super::read::{Gguf, Meta};
use crate::error::{Error, Result};
use crate::models::checkpoint::parse_model_config;
use crate::models::Gpt;
use crate::tensor::quant_rows::QuantRows;
use serde_json::{json, Value as Json};
use std::path::{Path, PathBuf};

/// Whether `path` is a GGUF file (by its first four bytes).
pub fn is_gguf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    path.is_file() && std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && &magic == b"GGUF"
}

/// The Hugging Face `config.json` of the model the file describes.
pub fn hf_config(g: &Gguf) -> Result<Json> {
    let arch = g.need_str("general.architecture")?;
    let class = match arch {
        "llama" => "LlamaForCausalLM",
        "qwen2" => "Qwen2ForCausalLM",
        other => {
            return Err(Error::ckpt(
                &g.path,
                format!("general.architecture is '{other}'; brigade reads the 'llama' and 'qwen2' architectures"),
            ))
        }
    };
    let k = |name: &str| format!("{arch}.{name}");
    let heads = g.need_u64(&k("attention.head_count"))?;
    let hidden = g.need_u64(&k("embedding_length"))?;
    let n_vocab = match g.get(&k("vocab_size")).and_then(Meta::as_u64) {
        Some(v) => v,
        None => g.need("tokenizer.ggml.tokens")?.as_array().map_or(0, |a| a.len() as u64),
    };
    let f = |name: &str| g.get(&k(name)).and_then(Meta::as_f64);
    let mut c = json!({
        "architectures": [class],
        "model_type": arch,
        "hidden_size": hidden,
        "num_hidden_layers": g.need_u64(&k("block_count"))?,
        "num_attention_heads": heads,
        "num_key_value_heads": g.get(&k("attention.head_count_kv")).and_then(Meta::as_u64).unwrap_or(heads),
        "intermediate_size": g.need_u64(&k("feed_forward_length"))?,
        "max_position_embeddings": g.need_u64(&k("context_length"))?,
        "rms_norm_eps": f("attention.layer_norm_rms_epsilon").ok_or_else(|| {
            Error::ckpt(&g.path, format!("the metadata key '{}' is missing", k("attention.layer_norm_rms_epsilon")))
        })? as f32,
        "rope_theta": f("rope.freq_base").unwrap_or(10000.0),
        "vocab_size": n_vocab,
        "tie_word_embeddings": g.tensor("output.weight").is_none(),
        "hidden_act": "silu",
    });
    if let Some(hd) = g.get(&k("attention.key_length")).and_then(Meta::as_u64) {
        c["head_dim"] = json!(hd);
    }
    if arch == "llama" {
        c["attention_bias"] = json!(g.tensor("blk.0.attn_q.bias").is_some());
    }
    if let Some(t) = g.get(&k("rope.scaling.type")).and_then(Meta::as_str).filter(|t| *t != "none") {
        return Err(Error::ckpt(
            &g.path,
            format!("{} is '{t}'; brigade reads no rope scaling but Llama 3's", k("rope.scaling.type")),
        ));
    }
    if let Some(t) = g.tensor("rope_freqs.weight") {
        c["rope_scaling"] = llama3_rope(g, t, &c)?;
    }
    Ok(c)
}

/// Llama 3's frequency scaling from the `rope_freqs.weight` factors llama.cpp stores (it keeps
/// no parameters): the parameters whose factors these are — `factor` the largest, the
/// original context a power of two, the frequency bands' factors among 0.5 … 8 — else refused.
fn llama3_rope(g: &Gguf, t: &super::read::TensorInfo, c: &Json) -> Result<Json> {
    let have = g.dequantize(t);
    let theta = c["rope_theta"].as_f64().unwrap_or(10000.0);
    let hd = match c["head_dim"].as_u64() {
        Some(h) => h,
        None => c["hidden_size"].as_u64().unwrap_or(0) / c["num_attention_heads"].as_u64().unwrap_or(1).max(1),
    } as usize;
    let factor = have.iter().copied().fold(0f32, f32::max) as f64;
    if have.len() == hd / 2 && factor >= 1.0 {
        // the published bands (1 and 4) and context (8192) first: several parameter sets give
        // the same few factors of a small head, and any two with the same `orig / low` and
        // `orig / high` give the same factors at every size; then the published one is named
        let bands = [1.0, 4.0, 0.5, 2.0, 8.0];
        let origs = std::iter::once(8192.0).chain((4..=20).map(|k| (1u64 << k) as f64));
        for orig in origs {
            for &low in &bands {
                for &high in bands.iter().filter(|&&h| h > low) {
                    let rope = crate::models::family::Llama3Rope {
                        factor,
                        low_freq_factor: low,
                        high_freq_factor: high,
                        original_max_position_embeddings: orig as usize,
                    };
                    let positions = crate::models::family::Positions::Rotary { theta, scaling: Some(rope) };
                    let want = super::export::rope_factors(&positions, hd).expect("scaled rope has factors");
                    if want.iter().zip(&have).all(|(a, &b)| (a - b).abs() <= 1e-6 * a.abs()) {
                        return Ok(json!({"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                            "high_freq_factor": high, "original_max_position_embeddings": orig as u64}));
                    }
                }
            }
        }
    }
    Err(Error::ckpt(
        &g.path,
        "rope_freqs.weight holds frequency factors of no Llama 3 scaling brigade can name; it cannot read them",
    ))
}

/// llama.cpp's pre-tokenizer names and what each is as a `tokenizer.json` (the normalizer, the
/// pre-tokenizer, and whether a whole word in the vocabulary skips the merges), as the
/// published tokenizers of those families have them.
fn pre_tokenizer(pre: &str) -> Option<(Json, Json, bool)> {
    let byte_level = |regex: bool, trim: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": trim, "use_regex": regex});
    let split = |re: &str| json!({"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated", "invert": false});
    Some(match pre {
        "gpt-2" | "default" => (Json::Null, byte_level(true, true), false),
        "smollm" => (
            Json::Null,
            json!({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": true}, byte_level(true, true)]}),
            false,
        ),
        "llama-bpe" | "llama3" => (
            Json::Null,
            json!({"type": "Sequence", "pretokenizers": [split(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"), byte_level(false, true)]}),
            true,
        ),
        "qwen2" => (
            json!({"type": "NFC"}),
            json!({"type": "Sequence", "pretokenizers": [split(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"), byte_level(false, false)]}),
            false,
        ),
        _ => return None,
    })
}

/// The pre-tokenizers `pre_tokenizer` knows.
const PRES: &str = "gpt-2, smollm, llama-bpe, qwen2";

/// The file's tokenizer as `tokenizer.json`, `tokenizer_config.json` and (its end-of-sequence
/// ids) `generation_config.json`.
pub fn tokenizer_files(g: &Gguf) -> Result<(Json, Json, Json)> {
    let bad = |m: String| Error::ckpt(&g.path, m);
    let model = g.need_str("tokenizer.ggml.model")?;
    if model != "gpt2" {
        return Err(bad(format!(
            "tokenizer.ggml.model is '{model}'; brigade reads byte-level BPE tokenizers ('gpt2'), not SentencePiece ('llama') ones"
        )));
    }
    let strings = |key: &str| -> Result<Vec<String>> {
        let a = g.need(key)?.as_array().ok_or_else(|| bad(format!("'{key}' is not a list")))?;
        a.iter()
            .map(|m| m.as_str().map(str::to_string).ok_or_else(|| bad(format!("'{key}' holds a non-string"))))
            .collect()
    };
    let tokens = strings("tokenizer.ggml.tokens")?;
    let merges = strings("tokenizer.ggml.merges")?;
    let types: Vec<i64> = match g.get("tokenizer.ggml.token_type").and_then(Meta::as_array) {
        Some(a) => a.iter().map(|m| m.as_u64().map_or(1, |v| v as i64)).collect(),
        None => vec![1; tokens.len()],
    };
    let pre = g.get("tokenizer.ggml.pre").and_then(Meta::as_str).unwrap_or("default");
    let (normalizer, pre_tok, ignore_merges) = pre_tokenizer(pre)
        .ok_or_else(|| bad(format!("tokenizer.ggml.pre is '{pre}'; brigade builds the pre-tokenizers {PRES}")))?;
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        // a token spelled twice keeps its first id (llama.cpp's table keeps both; ids past the
        // first are never produced by the merges)
        if !vocab.contains_key(t) {
            vocab.insert(t.clone(), json!(i));
        }
        // control (3) and user-defined (4) tokens are matched whole, before the merges
        let ty = types.get(i).copied().unwrap_or(1);
        if ty == 3 || ty == 4 {
            added.push(json!({"id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": ty == 3}));
        }
    }
    let id = |key: &str| g.get(key).and_then(Meta::as_u64).filter(|&i| (i as usize) < tokens.len());
    let (bos, eos) = (id("tokenizer.ggml.bos_token_id"), id("tokenizer.ggml.eos_token_id"));
    let add_bos = g.get("tokenizer.ggml.add_bos_token").and_then(Meta::as_bool).unwrap_or(false) && bos.is_some();
    let post = match (add_bos, bos) {
        (true, Some(b)) => {
            let name = &tokens[b as usize];
            json!({"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": name, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": name, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                    {"SpecialToken": {"id": name, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {name: {"id": name, "ids": [b], "tokens": [name]}}})
        }
        _ => Json::Null,
    };
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": normalizer, "pre_tokenizer": pre_tok, "post_processor": post,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": ignore_merges,
            "vocab": vocab, "merges": merges},
    });
    let name = |i: Option<u64>| i.map(|i| json!(tokens[i as usize])).unwrap_or(Json::Null);
    let mut config = json!({"bos_token": name(bos), "eos_token": name(eos), "add_bos_token": add_bos,
        "tokenizer_class": "PreTrainedTokenizerFast"});
    if let Some(t) = g.get("tokenizer.chat_template").and_then(Meta::as_str) {
        config["chat_template"] = json!(t);
    }
    // a turn ends at end-of-sequence, end-of-turn or end-of-message (llama.cpp stops at each)
    let mut stops: Vec<u64> = Vec::new();
    for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        if let Some(i) = id(key).filter(|i| !stops.contains(i)) {
            stops.push(i);
        }
    }
    let generation = json!({"bos_token_id": bos, "eos_token_id": stops});
    Ok((tokenizer, config, generation))
}

/// The folder of a checkpoint's metadata files: the directory itself, or, for a GGUF file, its
/// metadata unpacked (config.json, tokenizer.json, tokenizer_config.json,
/// generation_config.json) into the cache, once, under a name given by the file's header.
pub fn folder_of(path: &Path) -> Result<PathBuf> {
    if !is_gguf(path) {
        return Ok(path.to_path_buf());
    }
    let g = Gguf::open(path)?;
    let dir = cache_dir().join(format!("gguf-{}", g.header_hash()));
    if dir.join("tokenizer.json").is_file() {
        return Ok(dir);
    }
    let config = hf_config(&g)?;
    let (tokenizer, tokenizer_config, generation) = tokenizer_files(&g)?;
    std::fs::create_dir_all(cache_dir()).map_err(|e| Error::io(cache_dir(), e))?;
    // written whole beside its place, then renamed there: a reader never sees half of it
    // (named for this process and this call: two threads unpacking the same file each write
    // their own)
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = cache_dir().join(format!(".gguf-{}-{}-{call}", g.header_hash(), std::process::id()));
    std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    for (name, v) in [
        ("config.json", &config),
        ("tokenizer.json", &tokenizer),
        ("tokenizer_config.json", &tokenizer_config),
        (crate::models::generation_config::GENERATION_CONFIG_FILE, &generation),
    ] {
        let text = serde_json::to_string(v).expect("JSON values serialise");
        std::fs::write(tmp.join(name), text).map_err(|e| Error::io(tmp.join(name), e))?;
    }
    if std::fs::rename(&tmp, &dir).is_err() {
        // another process unpacked it first
        let _ = std::fs::remove_dir_all(&tmp);
        if !dir.join("tokenizer.json").is_file() {
            return Err(Error::ckpt(&dir, "could not unpack the GGUF file's metadata here"));
        }
    }
    Ok(dir)
}

/// Where unpacked metadata is kept: `$BRIGADE_CACHE`, else `$XDG_CACHE_HOME/brigade`, else
/// `~/.cache/brigade`, else the system's temporary directory.
fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("BRIGADE_CACHE") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("brigade");
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".cache").join("brigade"),
        None => std::env::temp_dir().join("brigade-cache"),
    }
}

/// The model of a GGUF file, its tensors dequantized to f32 under their Hugging Face names (the
/// Llama architecture's q and k rows back from llama.cpp's adjacent pairs to halves).
pub fn load(path: &Path) -> Result<(Gpt, Vec<f32>)> {
    let g = Gguf::open(path)?;
    let config = hf_config(&g)?;
    let cfg = parse_model_config(&config.to_string(), path)?;
    let model = Gpt::new(cfg)?;
    let mut params = vec![0f32; model.layout.total];
    let mut used = std::collections::HashSet::new();
    for r in routes(&model) {
        let spec = model
            .layout
            .specs
            .iter()
            .find(|s| s.name == r.hf)
            .unwrap_or_else(|| panic!("a route names a parameter of the model: {}", r.hf));
        let t = g.tensor(&r.gguf).ok_or_else(|| {
            Error::ckpt(
                path,
                format!("the tensor '{}' ({}) is missing; the metadata describes a model that has it", r.gguf, r.hf),
            )
        })?;
        let (values, shape) = inverse_change(g.dequantize(t), &t.shape(), r.change);
        if shape != spec.shape {
            return Err(Error::ckpt(
                path,
                format!(
                    "tensor '{}' has shape {:?}; the metadata's model has {:?} there",
                    r.gguf,
                    t.shape(),
                    spec.shape
                ),
            ));
        }
        spec.view.of_mut(&mut params).copy_from_slice(&values);
        used.insert(r.gguf);
    }
    // llama.cpp's frequency factors are read into the config; nothing else may be left over
    if let Some(t) = g.tensors.iter().find(|t| !used.contains(&t.name) && t.name != "rope_freqs.weight") {
        return Err(Error::ckpt(
            path,
            format!("the tensor '{}' belongs to no part of the model brigade builds from the metadata", t.name),
        ));
    }
    Ok((model, params))
}

/// A GGUF file's block-quantized matrices as the file stores them, under their Hugging Face
/// names, for serving them in their own types (`QuantRows`: bit for bit the values `load`
/// dequantizes). The file stays memory-mapped; a matrix's rows are decoded when asked for.
pub struct Stored {
    g: Gguf,
    routes: std::collections::HashMap<String, (String, Change)>,
}

impl std::fmt::Debug for Stored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stored({} tensors)", self.routes.len())
    }
}

impl Stored {
    /// The stored matrices of the GGUF file `path` (whose model is `model`, as `load` built it).
    pub fn open(path: &Path, model: &Gpt) -> Result<Stored> {
        let g = Gguf::open(path)?;
        let routes = routes(model).into_iter().map(|r| (r.hf, (r.gguf, r.change))).collect();
        Ok(Stored { g, routes })
    }

    /// The matrix `hf` as output rows (an output feature a row, its inputs along it), if the
    /// file stores it block-quantized; `None` for float tensors and vectors.
    pub fn rows(&self, hf: &str) -> Option<QuantRows> {
        let (name, change) = self.routes.get(hf)?;
        let t = self.g.tensor(name)?;
        let shape = t.shape();
        let [rows, k] = shape[..] else { return None };
        let q = t.ty.quant_rows(self.g.data(t), rows, k)?;
        match *change {
            // GGUF's rows are the outputs either way (a Conv1D `[in, out]` is stored transposed)
            Change::None | Change::Transpose => Some(q),
            Change::Interleave { heads } => {
                let idx: Vec<Option<usize>> = (0..rows).map(|r| Some(gguf_row(r, rows / heads))).collect();
                Some(q.select(&idx))
            }
        }
    }
}
