//! A checkpoint (a Hugging Face folder of either family) as one GGUF file that llama.cpp and
//! Ollama run: the family's hyperparameters under llama.cpp's keys (`family::GgufArch`), every
//! tensor under llama.cpp's name (`blk.N.attn_q.weight`, …) stored `[out, in]` (GPT-2's
//! `[in, out]` transposed; the Llama architecture's q and k rows reordered for llama.cpp's
//! rotation of adjacent pairs, as its own converter does), Llama 3's frequency scaling as the
//! `rope_freqs.weight` factors, and the tokenizer (a byte-level BPE: tokens, their types,
//! merges, special ids, llama.cpp's name for its pre-tokenizer) with the chat template. The
//! file is written beside its destination and renamed into place when whole.

use super::file::{self, Tensor, TensorType, Value};
use crate::error::{Error, Result};
use crate::models::checkpoint::load_model;
use crate::models::family::{GgufNum, MlpSpec, NormKind, Orient, Positions, Qkv};
use crate::models::tokenizer::{special_token_text, Tokenizer};
use crate::models::Gpt;
use serde_json::Value as Json;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

/// How the file's matrices are stored (vectors are f32 always, as llama.cpp's converter keeps them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)] // ggml's names
pub enum FileType {
    F32,
    F16,
    /// Q8_0 where a row's length is a multiple of 32, else f16.
    Q8_0,
    /// Q4_0 for the blocks' matrices whose rows are multiples of 32 (else f16), the token table
    /// and the output layer at Q8_0 (as brigade's `--weights int4` keeps its head).
    Q4_0,
    /// Q4_K for the blocks' matrices whose rows are multiples of 256, Q5_0 for those of 32
    /// (llama.cpp's fallback for Q4_K), else f16; the token table and the output layer at Q8_0.
    Q4_K,
}

impl FileType {
    pub fn parse(s: &str) -> Result<FileType> {
        match s {
            "f32" => Ok(FileType::F32),
            "f16" => Ok(FileType::F16),
            "q8_0" => Ok(FileType::Q8_0),
            "q4_0" => Ok(FileType::Q4_0),
            "q4_k" => Ok(FileType::Q4_K),
            _ => Err(Error::Config(format!("unknown GGUF type '{s}'; use f32, f16, q8_0, q4_0 or q4_k"))),
        }
    }

    /// llama.cpp's `general.file_type` (`LLAMA_FTYPE_ALL_F32` 0, `MOSTLY_F16` 1, `MOSTLY_Q4_0`
    /// 2, `MOSTLY_Q8_0` 7, `MOSTLY_Q4_K_S` 14: its Q4_K without the mixture's 5- and 6-bit
    /// layers).
    fn id(self) -> u32 {
        match self {
            FileType::F32 => 0,
            FileType::F16 => 1,
            FileType::Q4_0 => 2,
            FileType::Q8_0 => 7,
            FileType::Q4_K => 14,
        }
    }

    /// The type tensor `name` of `shape` is stored as.
    fn tensor_type(self, name: &str, shape: &[usize]) -> TensorType {
        let row = shape[shape.len() - 1];
        let blocks = row.is_multiple_of(file::Q8_0_BLOCK);
        let k_blocks = row.is_multiple_of(super::quants::QK_K);
        let table = name == "token_embd.weight" || name == "output.weight";
        match (self, shape.len()) {
            (FileType::F32, _) | (_, 1) => TensorType::F32,
            (FileType::F16, _) => TensorType::F16,
            // llama-quantize leaves learned positions as they came (f32 here)
            _ if name == "position_embd.weight" => TensorType::F32,
            (FileType::Q4_0, _) if blocks && !table => TensorType::Q4_0,
            (FileType::Q4_K, _) if k_blocks && !table => TensorType::Q4_K,
            (FileType::Q4_K, _) if blocks && !table => TensorType::Q5_0,
            (FileType::Q8_0 | FileType::Q4_0 | FileType::Q4_K, _) if blocks => TensorType::Q8_0,
            (FileType::Q8_0 | FileType::Q4_0 | FileType::Q4_K, _) => TensorType::F16,
        }
    }
}

/// What an export wrote.
#[derive(Clone, Debug)]
pub struct Exported {
    pub arch: &'static str,
    /// llama.cpp's name of the tokenizer's pre-tokenizer.
    pub pre: &'static str,
    pub tensors: usize,
    pub bytes: u64,
}

/// A tensor's way from the checkpoint: its Hugging Face name, its GGUF name, and what is done
/// to it on the way.
pub(super) struct Route {
    pub(super) hf: String,
    pub(super) gguf: String,
    pub(super) change: Change,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Change {
    None,
    /// `[in, out]` (GPT-2's Conv1D) to `[out, in]`.
    Transpose,
    /// Rows of each of `heads` heads from halves to adjacent pairs (llama.cpp's `permute`).
    Interleave {
        heads: usize,
    },
}

/// Every tensor of `model` with its GGUF name, in llama.cpp's order.
pub(super) fn routes(model: &Gpt) -> Vec<Route> {
    let cfg = &model.cfg;
    let arch = cfg.gguf();
    let r = |hf: String, gguf: String, change| Route { hf, gguf, change };
    let mut out = vec![r(cfg.embedding_name().into(), "token_embd.weight".into(), Change::None)];
    if let Positions::Learned { name } = cfg.positions() {
        out.push(r(name, "position_embd.weight".into(), Change::None));
    }
    let norm = |out: &mut Vec<Route>, hf: &str, gguf: String, kind: NormKind| {
        out.push(r(format!("{hf}.weight"), format!("{gguf}.weight"), Change::None));
        if let NormKind::Layer { .. } = kind {
            out.push(r(format!("{hf}.bias"), format!("{gguf}.bias"), Change::None));
        }
    };
    for i in 0..cfg.n_layer {
        let b = cfg.block(i);
        let blk = |n: &str| format!("blk.{i}.{n}");
        norm(&mut out, &b.ln_1.name, blk("attn_norm"), b.ln_1.kind);
        let mut linears = Vec::new();
        match &b.attn.qkv {
            Qkv::Fused(l) => linears.push((l, "attn_qkv", None)),
            Qkv::Separate { q, k, v } => {
                let heads = |h| arch.interleave_qk.then_some(h);
                linears.push((q, "attn_q", heads(cfg.n_head)));
                linears.push((k, "attn_k", heads(cfg.kv_heads())));
                linears.push((v, "attn_v", None));
            }
        }
        linears.push((&b.attn.o, "attn_output", None));
        match &b.mlp {
            MlpSpec::Gelu { fc, proj } => linears.extend([(fc, "ffn_up", None), (proj, "ffn_down", None)]),
            MlpSpec::SwiGlu { gate, up, down } => {
                linears.extend([(gate, "ffn_gate", None), (up, "ffn_up", None), (down, "ffn_down", None)])
            }
            MlpSpec::Moe(_) => unreachable!("export_model refuses a mixture of experts"),
        }
        for (l, name, interleave) in linears {
            let change = match (l.orient, interleave) {
                (Orient::InOut, _) => Change::Transpose,
                (Orient::OutIn, Some(heads)) => Change::Interleave { heads },
                (Orient::OutIn, None) => Change::None,
            };
            out.push(r(l.weight(), blk(&format!("{name}.weight")), change));
            if l.bias {
                // a bias is a vector: its "rows" are its elements
                let change = if let Change::Interleave { .. } = change { change } else { Change::None };
                out.push(r(l.bias_name(), blk(&format!("{name}.bias")), change));
            }
        }
        norm(&mut out, &b.ln_2.name, blk("ffn_norm"), b.ln_2.kind);
    }
    let f = cfg.final_norm();
    norm(&mut out, &f.name, "output_norm".into(), f.kind);
    if !cfg.tied() {
        out.push(r(cfg.head_name().into(), "output.weight".into(), Change::None));
    }
    out
}

/// The tensor's values as GGUF stores them, with its row-major shape.
fn changed(x: &[f32], shape: &[usize], change: Change) -> (Vec<f32>, Vec<usize>) {
    match change {
        Change::None => (x.to_vec(), shape.to_vec()),
        Change::Transpose => {
            let (rows, cols) = (shape[0], shape[1]);
            let mut t = vec![0f32; x.len()];
            for i in 0..rows {
                for j in 0..cols {
                    t[j * rows + i] = x[i * cols + j];
                }
            }
            (t, vec![cols, rows])
        }
        Change::Interleave { heads } => {
            let cols = if shape.len() == 2 { shape[1] } else { 1 };
            let hd = shape[0] / heads;
            let mut t = vec![0f32; x.len()];
            for (r, row) in x.chunks_exact(cols).enumerate() {
                let to = gguf_row(r, hd);
                t[to * cols..(to + 1) * cols].copy_from_slice(row);
            }
            (t, shape.to_vec())
        }
    }
}

/// The GGUF row of checkpoint row `r` of a q or k matrix under `Change::Interleave`, its heads
/// `hd` rows each: within a head, row (s·half + j) goes to (2j + s) (llama.cpp's `permute`).
pub(super) fn gguf_row(r: usize, hd: usize) -> usize {
    let (head, within, half) = (r / hd, r % hd, hd / 2);
    head * hd + 2 * (within % half) + within / half
}

/// A tensor as GGUF stores it (`shape` GGUF's, row-major) back as the checkpoint holds it:
/// `changed` undone.
pub(super) fn inverse_change(x: Vec<f32>, shape: &[usize], change: Change) -> (Vec<f32>, Vec<usize>) {
    match change {
        Change::None => (x, shape.to_vec()),
        // a transpose is its own inverse
        Change::Transpose => changed(&x, shape, change),
        Change::Interleave { heads } => {
            let cols = if shape.len() == 2 { shape[1] } else { 1 };
            let hd = shape[0] / heads;
            let mut t = vec![0f32; x.len()];
            for (r, row) in t.chunks_exact_mut(cols).enumerate() {
                let from = gguf_row(r, hd);
                row.copy_from_slice(&x[from * cols..(from + 1) * cols]);
            }
            (t, shape.to_vec())
        }
    }
}

/// The text llama.cpp's converter encodes to tell pre-tokenizers apart (its
/// `get_vocab_base_pre`), and the hashes of the ids it gives for the pre-tokenizers of the
/// families brigade trains (sha256 of Python's `str(ids)`), with llama.cpp's names.
const CHECK_TEXT: &str = "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u{200d}🌫️ (multiple emojis concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL";
const PRE_TOKENIZERS: &[(&str, &str)] = &[
    ("3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454", "gpt-2"),
    ("0fe1cf6eda062318a1af7270f3331a85c539a01778ff948e24388e949c5282f4", "gpt-2"),
    ("0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5", "llama-bpe"),
    ("e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea", "qwen2"),
    ("d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c", "qwen2"),
    ("855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249", "smollm"),
];

/// llama.cpp's token types.
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

fn read_json(path: &Path) -> Result<Json> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::ckpt(path, format!("cannot read it: {e}")))?;
    serde_json::from_str(&text).map_err(|e| Error::ckpt(path, format!("is not valid JSON: {e}")))
}

/// The tokenizer's metadata for a vocabulary of `n_vocab` rows, and llama.cpp's name of its
/// pre-tokenizer.
fn tokenizer_metadata(dir: &Path, n_vocab: usize) -> Result<(Vec<(String, Value)>, &'static str)> {
    let path = dir.join("tokenizer.json");
    if !path.is_file() {
        return Err(Error::ckpt(
            dir,
            "holds no tokenizer.json (the model was trained on bytes); GGUF needs the Hugging Face tokenizer it was trained with",
        ));
    }
    let tj = read_json(&path)?;
    let model = &tj["model"];
    if model["type"] != "BPE" || !tj["pre_tokenizer"].to_string().contains("ByteLevel") {
        return Err(Error::ckpt(&path, "is not a byte-level BPE tokenizer (GPT-2's, Llama 3's, Qwen2's, SmolLM2's): llama.cpp's `gpt2` tokenizer could not read it"));
    }
    let mut tokens: Vec<Option<(String, i32)>> = vec![None; n_vocab];
    let mut place = |id: u64, text: &str, ty: i32| -> Result<()> {
        let slot = tokens.get_mut(id as usize).ok_or_else(|| {
            Error::ckpt(&path, format!("has token {id} ({text:?}), beyond the model's vocabulary of {n_vocab}"))
        })?;
        *slot = Some((text.to_string(), ty));
        Ok(())
    };
    for (text, id) in model["vocab"].as_object().into_iter().flatten() {
        place(id.as_u64().unwrap_or(u64::MAX), text, NORMAL)?;
    }
    for t in tj["added_tokens"].as_array().into_iter().flatten() {
        let text = t["content"].as_str().unwrap_or_default();
        let looks_special = (text.starts_with("<|") && text.ends_with("|>")) || ["<pad>", "<mask>"].contains(&text);
        let ty = if t["special"].as_bool() == Some(true) || looks_special { CONTROL } else { USER_DEFINED };
        place(t["id"].as_u64().unwrap_or(u64::MAX), text, ty)?;
    }
    let (texts, types): (Vec<String>, Vec<i32>) =
        tokens.into_iter().enumerate().map(|(i, t)| t.unwrap_or_else(|| (format!("[PAD{i}]"), UNUSED))).unzip();
    let merges: Vec<String> = model["merges"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| match m {
            Json::String(s) => s.clone(),
            Json::Array(p) => p.iter().filter_map(Json::as_str).collect::<Vec<_>>().join(" "),
            other => other.to_string(),
        })
        .collect();
    let loaded = Tokenizer::from_file(&path)?;
    let Tokenizer::Hf(tok, _, _, specials) = &loaded else {
        unreachable!("a tokenizer.json is a Hugging Face tokenizer")
    };
    let ids = tok.encode(CHECK_TEXT, true).map_err(|e| Error::ckpt(&path, format!("cannot encode: {e}")))?;
    let printed = format!("[{}]", ids.get_ids().iter().map(u32::to_string).collect::<Vec<_>>().join(", "));
    let hash: String = Sha256::digest(printed.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    let pre = PRE_TOKENIZERS.iter().find(|(h, _)| *h == hash).map(|p| p.1).ok_or_else(|| {
        Error::ckpt(
            &path,
            format!("splits text as no tokenizer llama.cpp knows by name does (check hash {hash}); GGUF export takes GPT-2's, Llama 3's, Qwen2's and SmolLM's"),
        )
    })?;
    let mut meta = vec![
        ("tokenizer.ggml.model".to_string(), Value::Str("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::Str(pre.into())),
        ("tokenizer.ggml.tokens".into(), Value::Strs(texts)),
        ("tokenizer.ggml.token_type".into(), Value::I32s(types)),
        ("tokenizer.ggml.merges".into(), Value::Strs(merges)),
    ];
    let config_path = dir.join("tokenizer_config.json");
    let config = if config_path.is_file() { read_json(&config_path)? } else { Json::Null };
    let id_of = |text: &str| tok.token_to_id(text);
    let ends = eos_and_sep(&tj, &config);
    let mut config = config;
    let mut keys = vec![("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"), ("pad_token", "padding")];
    if let Some(e) = &ends.new_eos {
        // gguf-py: the template's trailing token is the EOS, the configured one the end of turn
        config["eot_token"] = config["eos_token"].take();
        config["eos_token"] = Json::String(e.clone());
        keys.push(("eot_token", "eot"));
    }
    for (key, gguf) in keys {
        if let Some(id) = special_token_text(&config[key]).and_then(id_of) {
            meta.push((format!("tokenizer.ggml.{gguf}_token_id"), Value::U32(id)));
        }
    }
    meta.push(("tokenizer.ggml.add_bos_token".into(), Value::Bool(specials.add_bos)));
    for (what, on) in ends.flags {
        meta.push((format!("tokenizer.ggml.add_{what}_token"), Value::Bool(on)));
    }
    let jinja = dir.join(crate::models::tokenizer::CHAT_TEMPLATE_FILE);
    let template = if jinja.is_file() {
        Some(std::fs::read_to_string(&jinja).map_err(|e| Error::ckpt(&jinja, format!("cannot read it: {e}")))?)
    } else {
        config["chat_template"].as_str().map(str::to_string)
    };
    if let Some(t) = template {
        meta.push(("tokenizer.chat_template".into(), Value::Str(t)));
    }
    Ok((meta, pre))
}

/// What gguf-py's `SpecialVocab` makes of a tokenizer's ends, which llama.cpp's converter writes.
struct Ends {
    /// Whether the tokenizer appends an EOS (`add_eos_token`) and puts a separator between a
    /// pair's texts (`add_sep_token`), where anything says.
    flags: Vec<(&'static str, bool)>,
    /// A template's trailing special token that is not `tokenizer_config.json`'s EOS: gguf-py
    /// makes it the EOS (and the configured one the end of turn).
    new_eos: Option<String>,
}

/// [`Ends`] as gguf-py's `SpecialVocab` reads them: a byte-level post-processor adds neither; a
/// template whose single form ends in a special token appends it (it becomes the EOS); a pair
/// `A x B` separates when x is the separator or the EOS; `tokenizer_config.json`'s
/// `add_eos_token` / `add_sep_token` count only where the post-processor said nothing.
fn eos_and_sep(tj: &Json, config: &Json) -> Ends {
    let (mut eos, mut sep) = (None, None);
    let pp = &tj["post_processor"];
    let list = match pp["processors"].as_array() {
        Some(l) => l.clone(),
        None if pp.is_null() => Vec::new(),
        None => vec![pp.clone()],
    };
    let special = |x: &Json| x["SpecialToken"]["id"].as_str().map(str::to_string);
    let seq = |x: &Json| x["Sequence"]["id"].as_str().map(str::to_string);
    let mut eos_text = special_token_text(&config["eos_token"]).map(str::to_string);
    let mut new_eos = None;
    let sep_text = special_token_text(&config["sep_token"]).map(str::to_string);
    for p in &list {
        match p["type"].as_str() {
            Some("ByteLevel") => {
                eos.get_or_insert(false);
            }
            Some("TemplateProcessing") => {
                let single = p["single"].as_array().cloned().unwrap_or_default();
                let first = single.first().filter(|_| single.len() > 1).and_then(special);
                let last = single.last().filter(|_| single.len() > 1).and_then(special);
                if let Some(l) = &last {
                    if Some(l) != eos_text.as_ref() {
                        if config.is_object() {
                            new_eos = Some(l.clone());
                        }
                        eos_text = Some(l.clone());
                    }
                    eos = Some(true);
                }
                let mut pair = p["pair"].as_array().cloned().unwrap_or_default();
                if first.is_some() && pair.first().and_then(special) == first {
                    pair.remove(0);
                }
                if last.is_some() && pair.last().and_then(special) == last {
                    pair.pop();
                }
                if pair.len() > 2
                    && pair.first().and_then(seq).as_deref() == Some("A")
                    && pair.last().and_then(seq).as_deref() == Some("B")
                {
                    let middle = &pair[1..pair.len() - 1];
                    let separates = |x: &Json| {
                        special(x).is_some_and(|t| Some(&t) == sep_text.as_ref() || Some(&t) == eos_text.as_ref())
                    };
                    sep =
                        Some((separates(&middle[0]) && last.is_none()) || (middle.len() == 2 && separates(&middle[1])));
                }
            }
            _ => {}
        }
    }
    eos = eos.or(config["add_eos_token"].as_bool());
    sep = sep.or(config["add_sep_token"].as_bool());
    let flags = [("eos", eos), ("sep", sep)].into_iter().filter_map(|(w, v)| v.map(|v| (w, v))).collect();
    Ends { flags, new_eos }
}

/// Writes checkpoint `dir` as a GGUF file at `out` with matrices stored as `ty`.
pub fn export(dir: &Path, out: &Path, ty: FileType) -> Result<Exported> {
    let (model, params) = load_model(dir)?;
    let name = dir.canonicalize().ok().and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()));
    export_model((&model, &params), dir, name, out, ty)
}

/// `export` of a model already loaded (a GGUF file's, dequantized), its tokenizer files in
/// `meta_dir`, under `name`.
pub fn export_model(
    (model, params): (&Gpt, &[f32]),
    meta_dir: &Path,
    name: Option<String>,
    out: &Path,
    ty: FileType,
) -> Result<Exported> {
    let cfg = &model.cfg;
    if cfg.moe().is_some() {
        return Err(Error::Config(
            "GGUF export of a mixture-of-experts model is not built yet (llama.cpp's expert tensors); keep its Hugging Face folder".into(),
        ));
    }
    if cfg.block(0).attn.qk_norm.is_some() {
        return Err(Error::Config(
            "GGUF export of a model with q/k norms (Qwen3) is not built yet (llama.cpp's qwen3 architecture); keep its Hugging Face folder".into(),
        ));
    }
    let arch = cfg.gguf();
    let (tok_meta, pre) = tokenizer_metadata(meta_dir, cfg.vocab_size)?;
    let mut meta = vec![
        ("general.architecture".to_string(), Value::Str(arch.arch.into())),
        ("general.type".into(), Value::Str("model".into())),
        ("general.name".into(), Value::Str(name.unwrap_or_else(|| "brigade".into()))),
    ];
    for (k, v) in &arch.keys {
        let v = match *v {
            GgufNum::U32(x) => Value::U32(x),
            GgufNum::F32(x) => Value::F32(x),
        };
        meta.push((format!("{}.{k}", arch.arch), v));
    }
    meta.push(("general.file_type".into(), Value::U32(ty.id())));
    meta.push(("general.quantization_version".into(), Value::U32(2)));
    meta.extend(tok_meta);
    let specs: HashMap<&str, _> = model.layout.specs.iter().map(|s| (s.name.as_str(), s)).collect();
    let mut tensors = Vec::new();
    for r in routes(model) {
        let spec = specs
            .get(r.hf.as_str())
            .ok_or_else(|| Error::ckpt(meta_dir, format!("has no tensor {} for GGUF's {}", r.hf, r.gguf)))?;
        let (values, shape) = changed(spec.view.of(params), &spec.shape, r.change);
        let t = ty.tensor_type(&r.gguf, &shape);
        tensors.push(Tensor::new(r.gguf, &shape, t, &values));
    }
    if let Some(factors) = rope_factors(&cfg.positions(), cfg.head_dim()) {
        tensors.push(Tensor::new("rope_freqs.weight", &[factors.len()], TensorType::F32, &factors));
    }
    write_atomically(out, &meta, &tensors)?;
    let bytes = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    Ok(Exported { arch: arch.arch, pre, tensors: tensors.len(), bytes })
}

/// Llama 3's frequency scaling as llama.cpp stores it (`rope_freqs.weight`): the factor each of
/// a head's `head_dim / 2` rotary frequencies is divided by, none without that scaling —
/// computed as llama.cpp's converter computes it (`LlamaModel.generate_extra_tensors`: the
/// frequency in f32, the rest in f64, stored as f32), so the file holds the converter's bits.
pub fn rope_factors(positions: &Positions, head_dim: usize) -> Option<Vec<f32>> {
    let Positions::Rotary { theta, scaling: Some(s) } = positions else { return None };
    let (factor, low, high) = (s.factor, s.low_freq_factor, s.high_freq_factor);
    let orig = s.original_max_position_embeddings as f64;
    let factors = (0..head_dim / 2).map(|i| {
        let freq = 1.0 / (*theta as f32).powf((2 * i) as f32 / head_dim as f32);
        let wavelen = 2.0 * std::f64::consts::PI / freq as f64;
        (if wavelen < orig / high {
            1.0
        } else if wavelen > orig / low {
            factor
        } else {
            let smooth = (orig / wavelen - low) / (high - low);
            1.0 / ((1.0 - smooth) / factor + smooth)
        }) as f32
    });
    Some(factors.collect())
}

/// The file at a temporary name beside `out`, synced, then renamed: `out` is whole or absent.
fn write_atomically(out: &Path, meta: &[(String, Value)], tensors: &[Tensor]) -> Result<()> {
    let name = out.file_name().ok_or_else(|| Error::Config(format!("{} is not a file name", out.display())))?;
    let tmp = out.with_file_name(format!(".{}.partial", name.to_string_lossy()));
    let io = |e: std::io::Error| Error::Config(format!("cannot write {}: {e}", out.display()));
    let result = (|| -> std::io::Result<()> {
        let mut w = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        file::write(&mut w, meta, tensors)?;
        w.flush()?;
        w.get_ref().sync_all()?;
        drop(w);
        std::fs::rename(&tmp, out)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's `permute`: `w.reshape(heads, 2, hd/2, cols).swapaxes(1, 2)`, written out.
    #[test]
    fn q_and_k_rows_go_from_halves_to_pairs_as_llama_cpp_permutes_them() {
        let (heads, hd, cols) = (3, 8, 2);
        let x: Vec<f32> = (0..heads * hd * cols).map(|v| v as f32).collect();
        let (y, shape) = changed(&x, &[heads * hd, cols], Change::Interleave { heads });
        assert_eq!(shape, [heads * hd, cols]);
        for h in 0..heads {
            for j in 0..hd / 2 {
                for s in 0..2 {
                    for c in 0..cols {
                        let want = x[((h * hd) + s * hd / 2 + j) * cols + c];
                        assert_eq!(y[((h * hd) + j * 2 + s) * cols + c], want);
                    }
                }
            }
        }
        let (t, shape) = changed(&[1., 2., 3., 4., 5., 6.], &[2, 3], Change::Transpose);
        assert_eq!((t, shape), (vec![1., 4., 2., 5., 3., 6.], vec![3, 2]));
    }

    /// `add_eos_token` / `add_sep_token` as gguf-py's `SpecialVocab` decides them
    /// (`scripts/make_special_vocab_fixture.py`: every branch of its rule, from gguf-py itself).
    #[test]
    fn eos_and_sep_as_gguf_py_reads_them() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf_special_vocab.json");
        let f: Json = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let cases = f["cases"].as_array().unwrap();
        assert_eq!(cases.len(), 16);
        let mut wrong = Vec::new();
        for c in cases {
            let tj = serde_json::json!({"post_processor": c["post_processor"]});
            let got = eos_and_sep(&tj, &c["tokenizer_config"]);
            let find = |w: &str| got.flags.iter().find(|(x, _)| *x == w).map(|&(_, v)| v);
            let want = |w: &str| c[w].as_bool();
            // the EOS gguf-py names, where it is not the configured one
            let configured = c["tokenizer_config"]["eos_token"].as_str();
            let renamed = c["eos_token"].as_str().filter(|e| Some(*e) != configured);
            if (find("eos"), find("sep"), got.new_eos.as_deref()) != (want("eos"), want("sep"), renamed) {
                wrong.push(format!(
                    "{}: eos {:?} sep {:?} new EOS {:?}, gguf-py eos {:?} sep {:?} EOS {:?}",
                    c["name"],
                    find("eos"),
                    find("sep"),
                    got.new_eos,
                    want("eos"),
                    want("sep"),
                    c["eos_token"]
                ));
            }
            if renamed.is_some() {
                assert_eq!(c["eot_token"].as_str(), configured, "gguf-py makes the configured EOS the end of turn");
            }
        }
        assert!(wrong.is_empty(), "{wrong:#?}");
    }
}
