//! BERT, the encoder of sentence-transformers models: token + position + token-type
//! embeddings, then post-LayerNorm blocks (attention, residual, LayerNorm; GELU MLP, residual,
//! LayerNorm). Inference only. The products go through the row-invariant kernel
//! (`tensor::rowwise`): a text's vector is the same bits whatever other texts share its
//! forward pass, so `brigade embed` and the server's `/v1/embeddings` agree bit for bit.
//!
//! Loaded from a Hugging Face folder (`config.json`, `model.safetensors`). Weights are stored
//! transposed and packed once at load (`[in, out]`, q | k | v fused), so every product of the
//! forward is a plain row-major `x · W` over all the tokens of a batch.

use crate::tensor::encoder::{attention_packed, bias_gelu_inplace, residual_layernorm_inplace};
use crate::tensor::layernorm::layernorm_row;
use crate::tensor::rowwise::{matmul_rows, Packed};
use crate::tensor::ROW_CHUNK;
use crate::{Error, Result};
use rayon::prelude::*;
use safetensors::{Dtype, SafeTensors};
use std::path::Path;

/// What `config.json` says about the architecture.
#[derive(Clone, Debug, PartialEq)]
pub struct BertConfig {
    pub vocab: usize,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub intermediate: usize,
    pub max_positions: usize,
    pub type_vocab: usize,
    pub eps: f32,
    /// GELU's tanh approximation (`gelu_new`) instead of the exact erf form (`gelu`).
    pub gelu_tanh: bool,
}

fn cfg_err(path: &Path, msg: impl std::fmt::Display) -> Error {
    Error::Config(format!("{}: {msg}", path.display()))
}

impl BertConfig {
    pub fn from_file(path: &Path) -> Result<BertConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| cfg_err(path, format!("not valid JSON ({e})")))?;
        BertConfig::from_json(&v).map_err(|m| cfg_err(path, m))
    }

    /// Reads the fields BERT needs; anything it cannot run is refused by name.
    pub fn from_json(v: &serde_json::Value) -> std::result::Result<BertConfig, String> {
        let kind = v["model_type"].as_str().unwrap_or("");
        if kind != "bert" {
            return Err(format!(
                "model_type '{kind}' is not supported; brigade embed runs BERT encoders (model_type \"bert\", e.g. all-MiniLM-L6-v2, bge, e5)"
            ));
        }
        let num = |k: &str| -> std::result::Result<usize, String> {
            match v[k].as_u64() {
                Some(n) if n > 0 && n < (1 << 31) => Ok(n as usize),
                _ => Err(format!("'{k}' must be a positive integer")),
            }
        };
        let act = v["hidden_act"].as_str().unwrap_or("gelu");
        let gelu_tanh = match act {
            "gelu" => false,
            "gelu_new" | "gelu_pytorch_tanh" => true,
            other => {
                return Err(format!("hidden_act '{other}' is not supported; use gelu, gelu_new or gelu_pytorch_tanh"))
            }
        };
        let pos = v["position_embedding_type"].as_str().unwrap_or("absolute");
        if pos != "absolute" {
            return Err(format!("position_embedding_type '{pos}' is not supported; only absolute"));
        }
        let cfg = BertConfig {
            vocab: num("vocab_size")?,
            hidden: num("hidden_size")?,
            layers: num("num_hidden_layers")?,
            heads: num("num_attention_heads")?,
            intermediate: num("intermediate_size")?,
            max_positions: num("max_position_embeddings")?,
            type_vocab: num("type_vocab_size")?,
            eps: v["layer_norm_eps"].as_f64().unwrap_or(1e-12) as f32,
            gelu_tanh,
        };
        if !cfg.hidden.is_multiple_of(cfg.heads) {
            return Err(format!("hidden_size {} is not a multiple of num_attention_heads {}", cfg.hidden, cfg.heads));
        }
        Ok(cfg)
    }

    /// Parameters of the encoder (pooler excluded).
    pub fn params(&self) -> usize {
        let (c, i) = (self.hidden, self.intermediate);
        (self.vocab + self.max_positions + self.type_vocab + 2) * c
            + self.layers * (4 * c * c + 4 * c + 2 * c * i + i + c + 4 * c)
    }

    /// Multiply-adds ×2 of the matrix products per token (attention's excluded).
    pub fn matmul_flops_per_token(&self) -> f64 {
        let (c, i) = (self.hidden as f64, self.intermediate as f64);
        self.layers as f64 * 2.0 * (4.0 * c * c + 2.0 * c * i)
    }

    /// Attention's products for one sequence of `len` tokens.
    pub fn attention_flops(&self, len: usize) -> f64 {
        self.layers as f64 * 4.0 * (len * len) as f64 * self.hidden as f64
    }
}

struct Layer {
    wqkv: Packed, // [C, 3C]
    bqkv: Vec<f32>,
    wo: Packed, // [C, C]
    bo: Vec<f32>,
    ln1: (Vec<f32>, Vec<f32>),
    w1: Packed, // [C, I]
    b1: Vec<f32>,
    w2: Packed, // [I, C]
    b2: Vec<f32>,
    ln2: (Vec<f32>, Vec<f32>),
}

/// A loaded BERT encoder.
pub struct Bert {
    pub cfg: BertConfig,
    wte: Vec<f32>,
    wpe: Vec<f32>,
    /// Row 0 of the token-type table: every token is of type 0 for single texts.
    tt0: Vec<f32>,
    ln: (Vec<f32>, Vec<f32>),
    layers: Vec<Layer>,
}

/// Named f32 tensors of a safetensors file, with or without the `bert.` prefix.
struct Tensors<'a> {
    st: SafeTensors<'a>,
    path: &'a Path,
    prefix: &'static str,
}

impl Tensors<'_> {
    fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let full = format!("{}{name}", self.prefix);
        let t = self.st.tensor(&full).map_err(|_| {
            Error::ckpt(
                self.path,
                format!("tensor '{full}' is missing; is this a BERT model of the shape config.json gives?"),
            )
        })?;
        if t.dtype() != Dtype::F32 {
            return Err(Error::ckpt(
                self.path,
                format!("tensor '{full}' is {:?}; brigade loads F32 weights", t.dtype()),
            ));
        }
        if t.shape() != shape {
            return Err(Error::ckpt(
                self.path,
                format!("tensor '{full}' has shape {:?}, config.json implies {shape:?}", t.shape()),
            ));
        }
        Ok(t.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
    }

    /// A `[out, in]` linear weight stored as `[in, out]`.
    fn linear_t(&self, name: &str, out: usize, inp: usize) -> Result<Vec<f32>> {
        let w = self.get(name, &[out, inp])?;
        let mut t = vec![0f32; w.len()];
        for o in 0..out {
            for i in 0..inp {
                t[i * out + o] = w[o * inp + i];
            }
        }
        Ok(t)
    }
}

/// Puts `[in, out_k]` matrices side by side into one `[in, Σ out_k]`.
fn side_by_side(parts: &[Vec<f32>], inp: usize) -> Vec<f32> {
    let widths: Vec<usize> = parts.iter().map(|p| p.len() / inp).collect();
    let total: usize = widths.iter().sum();
    let mut out = Vec::with_capacity(inp * total);
    for i in 0..inp {
        for (p, &w) in parts.iter().zip(&widths) {
            out.extend_from_slice(&p[i * w..(i + 1) * w]);
        }
    }
    out
}

impl Bert {
    /// Loads `dir/config.json` and `dir/model.safetensors`.
    pub fn load(dir: &Path) -> Result<Bert> {
        let cfg = BertConfig::from_file(&dir.join("config.json"))?;
        let path = dir.join("model.safetensors");
        if !path.exists() {
            return Err(Error::ckpt(
                &path,
                "not found; brigade reads safetensors weights (convert pytorch_model.bin with the safetensors library)",
            ));
        }
        let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
        Bert::from_safetensors(cfg, &bytes, &path)
    }

    pub fn from_safetensors(cfg: BertConfig, bytes: &[u8], path: &Path) -> Result<Bert> {
        let st = SafeTensors::deserialize(bytes)
            .map_err(|e| Error::ckpt(path, format!("not a valid safetensors file ({e})")))?;
        let prefix = if st.tensor("bert.embeddings.word_embeddings.weight").is_ok() { "bert." } else { "" };
        let t = Tensors { st, path, prefix };
        let (c, i) = (cfg.hidden, cfg.intermediate);
        let ln = |name: &str| -> Result<(Vec<f32>, Vec<f32>)> {
            Ok((t.get(&format!("{name}.weight"), &[c])?, t.get(&format!("{name}.bias"), &[c])?))
        };
        let mut layers = Vec::with_capacity(cfg.layers);
        for l in 0..cfg.layers {
            let p = format!("encoder.layer.{l}");
            let a = format!("{p}.attention.self");
            let qkv: Vec<Vec<f32>> = ["query", "key", "value"]
                .iter()
                .map(|n| t.linear_t(&format!("{a}.{n}.weight"), c, c))
                .collect::<Result<_>>()?;
            let bqkv: Vec<f32> = ["query", "key", "value"]
                .iter()
                .map(|n| t.get(&format!("{a}.{n}.bias"), &[c]))
                .collect::<Result<Vec<_>>>()?
                .concat();
            layers.push(Layer {
                wqkv: Packed::new(&side_by_side(&qkv, c), c, 3 * c),
                bqkv,
                wo: Packed::new(&t.linear_t(&format!("{p}.attention.output.dense.weight"), c, c)?, c, c),
                bo: t.get(&format!("{p}.attention.output.dense.bias"), &[c])?,
                ln1: ln(&format!("{p}.attention.output.LayerNorm"))?,
                w1: Packed::new(&t.linear_t(&format!("{p}.intermediate.dense.weight"), i, c)?, c, i),
                b1: t.get(&format!("{p}.intermediate.dense.bias"), &[i])?,
                w2: Packed::new(&t.linear_t(&format!("{p}.output.dense.weight"), c, i)?, i, c),
                b2: t.get(&format!("{p}.output.dense.bias"), &[c])?,
                ln2: ln(&format!("{p}.output.LayerNorm"))?,
            });
        }
        let tt = t.get("embeddings.token_type_embeddings.weight", &[cfg.type_vocab, c])?;
        Ok(Bert {
            wte: t.get("embeddings.word_embeddings.weight", &[cfg.vocab, c])?,
            wpe: t.get("embeddings.position_embeddings.weight", &[cfg.max_positions, c])?,
            tt0: tt[..c].to_vec(),
            ln: ln("embeddings.LayerNorm")?,
            layers,
            cfg,
        })
    }

    /// The last hidden states `[Σ lens, C]` of sequences packed end to end (`tokens` holds
    /// them one after another; `lens[i]` tokens each). Each sequence attends only to itself.
    ///
    /// Panics if a token is outside the vocabulary or a sequence longer than the position
    /// table: callers check both (the encoder does, with an error naming the document).
    pub fn forward(&self, tokens: &[u32], lens: &[usize]) -> Vec<f32> {
        let cfg = &self.cfg;
        let (c, inter) = (cfg.hidden, cfg.intermediate);
        let n = tokens.len();
        assert_eq!(lens.iter().sum::<usize>(), n, "bert: lens do not add up to the token count");
        assert!(lens.iter().all(|&l| l <= cfg.max_positions), "bert: sequence longer than the position table");
        let mut x = vec![0f32; n * c];
        let mut row = 0;
        for &l in lens {
            for p in 0..l {
                let tok = tokens[row] as usize;
                assert!(tok < cfg.vocab, "bert: token {tok} outside the vocabulary");
                let out = &mut x[row * c..(row + 1) * c];
                let (we, pe) = (&self.wte[tok * c..(tok + 1) * c], &self.wpe[p * c..(p + 1) * c]);
                for (((o, &a), &b), &t) in out.iter_mut().zip(we).zip(pe).zip(&self.tt0) {
                    *o = a + b + t;
                }
                layernorm_row(out, &self.ln.0, &self.ln.1, cfg.eps);
                row += 1;
            }
        }
        let mut qkv = vec![0f32; n * 3 * c];
        let mut ctx = vec![0f32; n * c];
        let mut y = vec![0f32; n * c];
        let mut h = vec![0f32; n * inter];
        for ly in &self.layers {
            matmul_rows(&mut qkv, &x, &ly.wqkv, n);
            qkv.par_chunks_mut(3 * c).with_min_len(ROW_CHUNK).for_each(|r| {
                for (v, &b) in r.iter_mut().zip(&ly.bqkv) {
                    *v += b;
                }
            });
            attention_packed(&mut ctx, &qkv, lens, c, cfg.heads);
            matmul_rows(&mut y, &ctx, &ly.wo, n);
            residual_layernorm_inplace(&mut x, &y, &ly.bo, &ly.ln1.0, &ly.ln1.1, cfg.eps);
            matmul_rows(&mut h, &x, &ly.w1, n);
            bias_gelu_inplace(&mut h, &ly.b1, cfg.gelu_tanh);
            matmul_rows(&mut y, &h, &ly.w2, n);
            residual_layernorm_inplace(&mut x, &y, &ly.b2, &ly.ln2.0, &ly.ln2.1, cfg.eps);
        }
        x
    }
}
