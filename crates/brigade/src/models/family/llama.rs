//! The Llama family (Llama 2/3, Qwen2/2.5, Mistral without a sliding window, SmolLM2,
//! TinyLlama): RMSNorm, rotary positions (optionally with Llama 3's frequency scaling), a
//! SwiGLU MLP, grouped-query attention with separate q/k/v projections stored `[out, in]`,
//! biases on q/k/v only (Qwen2) or on all four (Llama's `attention_bias`), a tied or untied
//! head — read from and written as a Hugging Face `config.json`. Tensor names as
//! `LlamaForCausalLM`'s (`model.layers.0.self_attn.q_proj.weight`).

use super::spec::{
    AttnSpec, BlockSpec, Describe, GgufArch, GgufNum, Linear, Llama3Rope, MlpSpec, NormKind, NormSpec, Orient,
    Overrides, Positions, Qkv, Shape,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What a Llama-family model has beyond the shared shape.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Llama {
    /// Key/value heads (grouped-query attention: each serves n_head / n_kv_head query heads).
    pub n_kv_head: usize,
    /// Width of one head (need not be hidden / heads).
    pub head_dim: usize,
    /// The SwiGLU MLP's hidden width.
    pub intermediate: usize,
    pub rms_eps: f32,
    pub rope_theta: f64,
    pub rope_scaling: Option<Llama3Rope>,
    /// Whether the LM head is the token table (else `lm_head.weight`, its own parameters).
    pub tied: bool,
    /// Biases on q, k, v (Qwen2; Llama's `attention_bias`).
    pub qkv_bias: bool,
    /// A bias on the output projection (Llama's `attention_bias`; Qwen2 has none).
    pub o_bias: bool,
}

/// The fields the presets share unless they say otherwise.
const BASE: Llama = Llama {
    n_kv_head: 8,
    head_dim: 64,
    intermediate: 0,
    rms_eps: 1e-5,
    rope_theta: 500_000.0,
    rope_scaling: None,
    tied: false,
    qkv_bias: false,
    o_bias: false,
};

/// Llama 3.1's long-context rope scaling (factor 8 over 8192 positions); Llama 3.2's is 32.
const LLAMA31_ROPE: Llama3Rope =
    Llama3Rope { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 8192 };
const LLAMA32_ROPE: Llama3Rope = Llama3Rope { factor: 32.0, ..LLAMA31_ROPE };

/// Named Llama-family shapes `[layers, heads, hidden, vocab, positions]` and fields: `llama-tiny`
/// for tests, then published models (from each one's `config.json` on the Hub).
#[rustfmt::skip]
pub const PRESETS: &[(&str, [usize; 5], Llama)] = &[
    // GQA 4:2 and an untied head: every part of the family in a model of 0.43M parameters
    ("llama-tiny", [2, 4, 128, 256, 64], Llama { n_kv_head: 2, head_dim: 32, intermediate: 352, rope_theta: 10_000.0, ..BASE }),
    // HuggingFaceTB/SmolLM2-135M
    ("smollm2-135m", [30, 9, 576, 49152, 8192], Llama { n_kv_head: 3, intermediate: 1536, rope_theta: 100_000.0, tied: true, ..BASE }),
    // Qwen/Qwen2.5-0.5B
    ("qwen2.5-0.5b", [24, 14, 896, 151936, 32768], Llama { n_kv_head: 2, intermediate: 4864, rope_theta: 1e6, rms_eps: 1e-6, tied: true, qkv_bias: true, ..BASE }),
    // meta-llama/Llama-3.2-1B
    ("llama3.2-1b", [16, 32, 2048, 128256, 131072], Llama { intermediate: 8192, rope_scaling: Some(LLAMA32_ROPE), tied: true, ..BASE }),
    // meta-llama/Meta-Llama-3-8B, -70B, and Llama 3.1's 405B
    ("llama3-8b", [32, 32, 4096, 128256, 8192], Llama { head_dim: 128, intermediate: 14336, ..BASE }),
    ("llama3-70b", [80, 64, 8192, 128256, 8192], Llama { head_dim: 128, intermediate: 28672, ..BASE }),
    ("llama3-405b", [126, 128, 16384, 128256, 131072], Llama { head_dim: 128, intermediate: 53248, rope_scaling: Some(LLAMA31_ROPE), ..BASE }),
];

/// The fields of the small model the tests run for this family, with every part of it: GQA
/// 8:2 with head width 8, q/k/v and output biases, Llama 3 rope scaling over 32 original
/// positions, an untied head.
pub const EXAMPLE: Llama = Llama {
    n_kv_head: 2,
    head_dim: 8,
    intermediate: 96,
    rms_eps: 1e-5,
    rope_theta: 500_000.0,
    rope_scaling: Some(Llama3Rope {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 32,
    }),
    tied: false,
    qkv_bias: true,
    o_bias: true,
};

/// The shape of that model: 8 query heads in 64.
pub fn example(vocab: usize, context: usize) -> Shape {
    Shape::of([2, 8, 64, vocab, context])
}

fn linear(name: String, (d_in, d_out): (usize, usize), bias: bool) -> Linear {
    Linear { name, d_in, d_out, bias, orient: Orient::OutIn }
}

impl Describe for Llama {
    fn kv_heads(&self, _: &Shape) -> usize {
        self.n_kv_head
    }

    fn head_dim(&self, _: &Shape) -> usize {
        self.head_dim
    }

    fn mlp_width(&self, _: &Shape) -> usize {
        self.intermediate
    }

    fn tied(&self) -> bool {
        self.tied
    }

    fn sizes(&self) -> Vec<(&'static str, usize)> {
        vec![
            ("num_key_value_heads", self.n_kv_head),
            ("head_dim", self.head_dim),
            ("intermediate_size", self.intermediate),
        ]
    }

    fn check(&self, s: &Shape) -> Result<(), String> {
        if !s.n_head.is_multiple_of(self.n_kv_head) {
            return Err(format!(
                "num_attention_heads ({}) must be a multiple of num_key_value_heads ({}): each key/value head serves a whole group of query heads",
                s.n_head, self.n_kv_head
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(format!(
                "head_dim = {} is odd; rotary embeddings rotate pairs of a head's dimensions",
                self.head_dim
            ));
        }
        if !(self.rms_eps > 0.0 && self.rope_theta > 1.0) {
            return Err(format!(
                "rms_norm_eps ({}) must be positive and rope_theta ({}) above 1",
                self.rms_eps, self.rope_theta
            ));
        }
        Ok(())
    }

    fn block(&self, s: &Shape, i: usize) -> BlockSpec {
        let (c, m) = (s.n_embd, self.intermediate);
        let (q, kv) = (s.n_head * self.head_dim, self.n_kv_head * self.head_dim);
        let prefix = format!("model.layers.{i}");
        let rms = |n: &str| NormSpec { kind: NormKind::Rms { eps: self.rms_eps }, name: format!("{prefix}.{n}") };
        let at = |n: &str| format!("{prefix}.self_attn.{n}");
        let mlp = |n: &str| format!("{prefix}.mlp.{n}");
        BlockSpec {
            ln_1: rms("input_layernorm"),
            attn: AttnSpec {
                qkv: Qkv::Separate {
                    q: linear(at("q_proj"), (c, q), self.qkv_bias),
                    k: linear(at("k_proj"), (c, kv), self.qkv_bias),
                    v: linear(at("v_proj"), (c, kv), self.qkv_bias),
                },
                o: linear(at("o_proj"), (q, c), self.o_bias),
            },
            ln_2: rms("post_attention_layernorm"),
            mlp: MlpSpec::SwiGlu {
                gate: linear(mlp("gate_proj"), (c, m), false),
                up: linear(mlp("up_proj"), (c, m), false),
                down: linear(mlp("down_proj"), (m, c), false),
            },
            std: 0.02,
            proj_std: 0.02,
            prefix,
        }
    }

    fn positions(&self, _: &Shape) -> Positions {
        Positions::Rotary { theta: self.rope_theta, scaling: self.rope_scaling }
    }

    fn embedding(&self) -> &'static str {
        "model.embed_tokens.weight"
    }

    fn final_norm(&self) -> NormSpec {
        NormSpec { kind: NormKind::Rms { eps: self.rms_eps }, name: "model.norm".into() }
    }

    fn hf_config(&self, s: &Shape) -> Value {
        to_json(s, self, (None, None))
    }

    /// llama.cpp's `llama` architecture, or `qwen2` for Qwen2's biases on q/k/v alone (which
    /// rotates halves, as Hugging Face does: its q and k rows stay in order).
    fn gguf(&self, s: &Shape) -> GgufArch {
        let u = |v: usize| GgufNum::U32(v as u32);
        let qwen2 = self.qkv_bias && !self.o_bias;
        GgufArch {
            arch: if qwen2 { "qwen2" } else { "llama" },
            keys: vec![
                ("block_count", u(s.n_layer)),
                ("context_length", u(s.block_size)),
                ("embedding_length", u(s.n_embd)),
                ("feed_forward_length", u(self.intermediate)),
                ("attention.head_count", u(s.n_head)),
                ("attention.head_count_kv", u(self.n_kv_head)),
                ("rope.freq_base", GgufNum::F32(self.rope_theta as f32)),
                ("attention.layer_norm_rms_epsilon", GgufNum::F32(self.rms_eps)),
                ("attention.key_length", u(self.head_dim)),
                ("attention.value_length", u(self.head_dim)),
                ("vocab_size", u(s.vocab_size)),
                ("rope.dimension_count", u(self.head_dim)),
            ],
            interleave_qk: !qwen2,
        }
    }

    fn reshape(&mut self, s: &Shape, o: Overrides, _: &str) -> Result<(), String> {
        // a changed width or head count keeps the heads of hidden / heads
        if o.reshaped {
            self.head_dim = s.n_embd / s.n_head.max(1);
            self.n_kv_head = self.n_kv_head.min(s.n_head);
        }
        self.n_kv_head = o.n_kv_head.unwrap_or(self.n_kv_head);
        self.intermediate = o.intermediate.unwrap_or(self.intermediate);
        Ok(())
    }
}

/// The refusal for a config key brigade does not implement.
fn unsupported(key: &str, got: &Value, supported: &str) -> String {
    format!("{key} = {got} is not supported; brigade implements {supported}")
}

fn uint(v: &Value, k: &str) -> Result<Option<usize>, String> {
    match v.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x.as_u64().map(|x| Some(x as usize)).ok_or_else(|| format!("'{k}' must be a whole number, got {x}")),
    }
}

fn float(v: &Value, k: &str) -> Result<Option<f64>, String> {
    match v.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x.as_f64().map(Some).ok_or_else(|| format!("'{k}' must be a number, got {x}")),
    }
}

fn need(v: &Value, k: &str) -> Result<usize, String> {
    uint(v, k)?.ok_or_else(|| format!("missing integer field '{k}'; is this a Llama-family config?"))
}

/// (n_layer, n_head, n_embd, vocab_size, max positions, the family's own fields) from a Hugging
/// Face `config.json` of the Llama family, in the Hub's form (`rope_theta`, `rope_scaling`) or
/// transformers 5's (`rope_parameters`). Any value brigade does not implement is refused
/// naming its key.
pub fn parse(v: &Value) -> Result<(Shape, Llama), String> {
    let ty = v.get("model_type").and_then(Value::as_str).unwrap_or("llama");
    let act = v.get("hidden_act").or_else(|| v.get("hidden_activation"));
    if let Some(a) = act.filter(|a| a.as_str() != Some("silu")) {
        return Err(unsupported("hidden_act", a, "\"silu\" (SwiGLU)"));
    }
    for k in ["num_experts", "num_local_experts", "moe_intermediate_size", "num_experts_per_tok"] {
        if let Some(x) = v.get(k).filter(|x| !x.is_null() && x.as_u64() != Some(0)) {
            return Err(unsupported(k, x, "dense MLPs only (no mixture of experts)"));
        }
    }
    let sliding = match ty {
        "qwen2" => v.get("use_sliding_window").filter(|x| x.as_bool() == Some(true)),
        _ => v.get("sliding_window").filter(|x| !x.is_null()),
    };
    if let Some(x) = sliding {
        let key = if ty == "qwen2" { "use_sliding_window" } else { "sliding_window" };
        return Err(unsupported(key, x, "full causal attention (no sliding window)"));
    }
    if let Some(x) = v.get("mlp_bias").filter(|x| x.as_bool() == Some(true)) {
        return Err(unsupported("mlp_bias", x, "an MLP without biases"));
    }
    if let Some(x) = v.get("rope_interleaved").filter(|x| x.as_bool() == Some(true)) {
        return Err(unsupported(
            "rope_interleaved",
            x,
            "rotary pairs (i, i + head_dim/2), as transformers' rotate_half",
        ));
    }
    if let Some(x) = v.get("use_mrope").filter(|x| x.as_bool() == Some(true)) {
        return Err(unsupported("use_mrope", x, "one-dimensional rotary positions"));
    }
    let (layers, heads, hidden) =
        (need(v, "num_hidden_layers")?, need(v, "num_attention_heads")?, need(v, "hidden_size")?);
    let kv = uint(v, "num_key_value_heads")?.unwrap_or(heads);
    // the shape's own rules (heads a multiple of the key/value heads, an even head_dim, no
    // zero) are `GptConfig::validate`'s, which every parsed config goes through
    let head_dim = match uint(v, "head_dim")? {
        Some(d) => d,
        None if heads > 0 && hidden.is_multiple_of(heads) => hidden / heads,
        None => {
            return Err(format!(
                "hidden_size ({hidden}) is not a multiple of num_attention_heads ({heads}) and no head_dim is given"
            ))
        }
    };
    // transformers 5 writes one `rope_parameters` object; the Hub's files `rope_theta` and
    // `rope_scaling` (null, or an object naming its type)
    let params = v.get("rope_parameters").filter(|x| !x.is_null());
    let scaling = params.or_else(|| v.get("rope_scaling").filter(|x| !x.is_null()));
    let key = if params.is_some() { "rope_parameters" } else { "rope_scaling" };
    let theta = match params {
        Some(p) => float(p, "rope_theta")?.or(float(v, "rope_theta")?),
        None => float(v, "rope_theta")?,
    }
    .unwrap_or(10_000.0);
    let rope_scaling = match scaling {
        None => None,
        Some(s) => {
            let kind = s.get("rope_type").or_else(|| s.get("type")).and_then(Value::as_str).unwrap_or("default");
            match kind {
                "default" => None,
                "llama3" => {
                    let f = |k: &str| float(s, k)?.ok_or_else(|| format!("{key} of type llama3 lacks '{k}'"));
                    let orig = uint(s, "original_max_position_embeddings")?
                        .ok_or_else(|| format!("{key} of type llama3 lacks 'original_max_position_embeddings'"))?;
                    let r = Llama3Rope {
                        factor: f("factor")?,
                        low_freq_factor: f("low_freq_factor")?,
                        high_freq_factor: f("high_freq_factor")?,
                        original_max_position_embeddings: orig,
                    };
                    if r.factor <= 0.0 || r.high_freq_factor <= r.low_freq_factor || orig == 0 {
                        return Err(format!("{key}: llama3 scaling needs factor > 0, high_freq_factor > low_freq_factor and original_max_position_embeddings > 0"));
                    }
                    Some(r)
                }
                other => {
                    return Err(unsupported(
                        &format!("{key}.rope_type"),
                        &Value::from(other),
                        "\"default\" and \"llama3\" rotary embeddings",
                    ))
                }
            }
        }
    };
    let bias = v.get("attention_bias").and_then(Value::as_bool).unwrap_or(false);
    let arch = Llama {
        n_kv_head: kv,
        head_dim,
        intermediate: need(v, "intermediate_size")?,
        rms_eps: float(v, "rms_norm_eps")?.unwrap_or(1e-6) as f32,
        rope_theta: theta,
        rope_scaling,
        tied: v.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(false),
        // Qwen2's attention always has q/k/v biases and none on o_proj; Llama's
        // `attention_bias` puts one on all four
        qkv_bias: ty == "qwen2" || bias,
        o_bias: ty != "qwen2" && bias,
    };
    let positions = uint(v, "max_position_embeddings")?.unwrap_or(2048);
    Ok((Shape::of([layers, heads, hidden, need(v, "vocab_size")?, positions]), arch))
}

/// A Hugging Face `config.json` for a Llama-family model (Qwen2's class when it has q/k/v
/// biases only, else Llama's), in the Hub's form, which transformers 4 and 5 both read.
pub fn to_json(s: &Shape, a: &Llama, bos_eos: (Option<u32>, Option<u32>)) -> Value {
    let Shape { n_layer: layers, n_head: heads, n_embd: hidden, vocab_size: vocab, block_size: positions } = *s;
    let qwen = a.qkv_bias && !a.o_bias;
    let scaling = a.rope_scaling.map(|r| {
        serde_json::json!({
            "rope_type": "llama3",
            "factor": r.factor,
            "low_freq_factor": r.low_freq_factor,
            "high_freq_factor": r.high_freq_factor,
            "original_max_position_embeddings": r.original_max_position_embeddings,
        })
    });
    let mut v = serde_json::json!({
        "model_type": if qwen { "qwen2" } else { "llama" },
        "architectures": [if qwen { "Qwen2ForCausalLM" } else { "LlamaForCausalLM" }],
        "hidden_size": hidden,
        "intermediate_size": a.intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": a.n_kv_head,
        "head_dim": a.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": a.rms_eps,
        "rope_theta": a.rope_theta,
        "rope_scaling": scaling,
        "max_position_embeddings": positions,
        "vocab_size": vocab,
        "tie_word_embeddings": a.tied,
        "torch_dtype": "float32",
        "bos_token_id": bos_eos.0,
        "eos_token_id": bos_eos.1,
    });
    if qwen {
        v["use_sliding_window"] = Value::Bool(false);
    } else {
        v["attention_bias"] = Value::Bool(a.o_bias);
        v["mlp_bias"] = Value::Bool(false);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn llama3() -> Value {
        json!({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
            "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 8,
            "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
            "max_position_embeddings": 256, "vocab_size": 99, "tie_word_embeddings": false,
            "hidden_act": "silu"})
    }

    #[test]
    fn hub_and_transformers5_forms_read_alike() {
        let (shape, a) = parse(&llama3()).unwrap();
        assert_eq!(shape, Shape::of([2, 8, 64, 99, 256]));
        assert_eq!((a.n_kv_head, a.head_dim, a.intermediate, a.tied, a.qkv_bias), (2, 8, 160, false, false));
        assert_eq!(a.rope_theta, 500000.0);
        assert_eq!(a.rope_scaling.unwrap().factor, 8.0);
        let mut v5 = llama3();
        let o = v5.as_object_mut().unwrap();
        let mut p = o.remove("rope_scaling").unwrap();
        o.remove("rope_theta");
        p["rope_theta"] = json!(500000.0);
        o.insert("rope_parameters".into(), p);
        assert_eq!(parse(&v5).unwrap(), (shape, a));
        // written back and read again: the same model
        let back = to_json(&shape, &a, (None, None));
        assert_eq!(parse(&back).unwrap(), (shape, a));
    }

    #[test]
    fn qwen2_has_qkv_biases_and_defaults_apply() {
        let v = json!({"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 50, "tie_word_embeddings": true, "rope_theta": 1e6,
            "sliding_window": 4096, "use_sliding_window": false, "rope_scaling": null});
        let (_, a) = parse(&v).unwrap();
        assert!(a.qkv_bias && !a.o_bias && a.tied && a.rope_scaling.is_none());
        assert_eq!((a.head_dim, a.rope_theta), (8, 1e6));
        assert_eq!(parse(&to_json(&Shape::of([1, 4, 32, 50, 2048]), &a, (None, None))).unwrap().1, a);
    }

    /// A config as `checkpoint::parse_model_config` reads it: parsed, then validated.
    fn refused(v: &Value) -> String {
        let path = std::path::Path::new("config.json");
        crate::models::checkpoint::parse_model_config(&v.to_string(), path).unwrap_err().to_string()
    }

    #[test]
    fn what_is_not_implemented_is_refused_naming_the_key() {
        let cases: Vec<(&str, Value, &str)> = vec![
            ("hidden_act", json!("gelu"), "hidden_act"),
            ("num_local_experts", json!(8), "num_local_experts"),
            ("sliding_window", json!(4096), "sliding_window"),
            ("rope_scaling", json!({"rope_type": "yarn", "factor": 4.0}), "rope_scaling.rope_type"),
            ("num_key_value_heads", json!(3), "num_key_value_heads"),
            ("head_dim", json!(7), "head_dim"),
            ("mlp_bias", json!(true), "mlp_bias"),
        ];
        for (k, val, named) in cases {
            let mut v = llama3();
            v[k] = val;
            let e = refused(&v);
            assert!(e.contains(named), "{k}: {e}");
        }
        let mut v = llama3();
        v["model_type"] = json!("mixtral");
        assert!(super::super::read_hf(&v).unwrap_err().contains("mixtral"));
    }
}
