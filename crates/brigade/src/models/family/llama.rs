//! The Llama family (Llama 2/3, Qwen2/2.5, Mistral without a sliding window, SmolLM2,
//! TinyLlama): RMSNorm, rotary positions (optionally with Llama 3's frequency scaling), a
//! SwiGLU MLP, grouped-query attention with separate q/k/v projections stored `[out, in]`,
//! biases on q/k/v only (Qwen2) or on all four (Llama's `attention_bias`), a tied or untied
//! head — read from and written as a Hugging Face `config.json`. Tensor names as
//! `LlamaForCausalLM`'s (`model.layers.0.self_attn.q_proj.weight`).

use super::spec::{
    AttnSpec, BlockSpec, Describe, GgufArch, GgufNum, Linear, Llama3Rope, MlpSpec, MoeLosses, MoeSpec, NormKind,
    NormSpec, Orient, Overrides, Positions, Qkv, Shape,
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
    /// A mixture of experts in place of the MLP (in the layers it names).
    #[serde(default)]
    pub moe: Option<LlamaMoe>,
    /// An RMSNorm over each query and key head before the rotation (Qwen3's `q_norm`, `k_norm`:
    /// one weight of head_dim shared by the heads).
    #[serde(default)]
    pub qk_norm: bool,
    /// With `qk_norm`: the norms span all the heads at once (OLMoE's, weights of the whole q
    /// and k widths) rather than each head.
    #[serde(default)]
    pub qk_norm_whole: bool,
}

/// How a mixture-of-experts model of the family (Qwen2-MoE, Mixtral) replaces its MLPs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LlamaMoe {
    pub experts: usize,
    /// Experts each token goes to (`num_experts_per_tok`).
    pub top_k: usize,
    /// Each expert's hidden width (Qwen2-MoE's `moe_intermediate_size`, Mixtral's
    /// `intermediate_size`).
    pub width: usize,
    /// The shared expert's width (Qwen2-MoE's `shared_expert_intermediate_size`; 0: none).
    pub shared_width: usize,
    /// Whether the k chosen probabilities are renormalised (`norm_topk_prob`; Mixtral always).
    pub norm_topk: bool,
    /// Every `sparse_step`-th layer is a mixture (`decoder_sparse_step`), except those in
    /// `dense` (a bit per layer, `mlp_only_layers`), which keep a dense MLP of `intermediate`.
    pub sparse_step: usize,
    pub dense: u64,
    /// `router_aux_loss_coef`, and whether it counts (`output_router_logits`, as in
    /// transformers).
    pub aux_coef: f32,
    pub aux_on: bool,
    /// The router z-loss's coefficient (`router_z_loss_coef`; 0: off).
    pub z_coef: f32,
    pub naming: MoeNaming,
    /// Each expert takes at most `capacity · seq · k / E` (rounded up) of a sequence's rows,
    /// those it weighs most; the rest of its rows pass it by (Megatron-Core's
    /// `moe_expert_capacity_factor`; 0: dropless).
    #[serde(default)]
    pub capacity: f32,
    /// DeepSeek-V3's auxiliary-loss-free balancing: a per-expert bias added to the router's
    /// probabilities for choosing only (`{router}.e_score_correction_bias`, no gradient), moved
    /// by this rate after each step towards the even load: `b += rate · sign(mean − load)`
    /// (Megatron-Core's `moe_router_bias_update_rate`; 0: off).
    #[serde(default)]
    pub bias_rate: f32,
}

/// Whose tensor names and config the mixture is written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MoeNaming {
    /// `Qwen2MoeForCausalLM`: `mlp.gate`, `mlp.experts.N.{gate,up,down}_proj`, `mlp.shared_expert*`.
    Qwen2Moe,
    /// `MixtralForCausalLM`: `block_sparse_moe.gate`, `block_sparse_moe.experts.N.w1/w3/w2`.
    Mixtral,
    /// `Qwen3MoeForCausalLM`: Qwen2-MoE's tensor names, no shared expert (and q/k norms).
    Qwen3Moe,
    /// `OlmoeForCausalLM`: Qwen2-MoE's tensor names, experts `intermediate_size` wide, no
    /// shared expert (and q/k norms over all heads).
    Olmoe,
}

impl LlamaMoe {
    /// Whether layer `i` is a mixture (else a dense MLP).
    pub fn sparse(&self, i: usize) -> bool {
        let dense = i < 64 && self.dense >> i & 1 == 1;
        !dense && (i + 1).is_multiple_of(self.sparse_step)
    }
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
    moe: None,
    qk_norm: false,
    qk_norm_whole: false,
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
    // a Qwen2-MoE of 2.5M parameters: 8 experts, 2 a token, a shared expert
    ("moe-tiny", [2, 4, 128, 256, 64], Llama { n_kv_head: 2, head_dim: 32, intermediate: 352, rope_theta: 10_000.0, qkv_bias: true, moe: Some(MOE_TINY), ..BASE }),
    // Qwen/Qwen1.5-MoE-A2.7B (Qwen2MoeForCausalLM): 60 experts, 4 a token, a shared expert
    ("qwen1.5-moe-a2.7b", [24, 16, 2048, 151936, 8192], Llama { n_kv_head: 16, head_dim: 128, intermediate: 5632, rope_theta: 1e6, rms_eps: 1e-6, qkv_bias: true, moe: Some(QWEN15_MOE), ..BASE }),
    // mistralai/Mixtral-8x7B-v0.1
    ("mixtral-8x7b", [32, 32, 4096, 32000, 32768], Llama { head_dim: 128, intermediate: 14336, rope_theta: 1e6, moe: Some(MIXTRAL_8X7B), ..BASE }),
    // a Qwen3-MoE of moe-tiny's size: q/k norms, 8 experts, 2 a token renormalised, no shared expert
    ("qwen3-moe-tiny", [2, 4, 128, 256, 64], Llama { n_kv_head: 2, head_dim: 32, intermediate: 352, rope_theta: 10_000.0, qk_norm: true, moe: Some(QWEN3_MOE_TINY), ..BASE }),
    // Qwen/Qwen3-0.6B
    ("qwen3-0.6b", [28, 16, 1024, 151936, 40960], Llama { head_dim: 128, intermediate: 3072, rope_theta: 1e6, rms_eps: 1e-6, tied: true, qk_norm: true, ..BASE }),
    // allenai/OLMoE-1B-7B-0924 (OlmoeForCausalLM): 64 experts, 8 a token, q/k norms over all heads
    ("olmoe-1b-7b", [16, 16, 2048, 50304, 4096], Llama { n_kv_head: 16, head_dim: 128, intermediate: 1024, rope_theta: 10_000.0, qk_norm: true, qk_norm_whole: true, moe: Some(OLMOE_1B_7B), ..BASE }),
    // Qwen/Qwen3-30B-A3B (Qwen3MoeForCausalLM): 128 experts, 8 a token
    ("qwen3-30b-a3b", [48, 32, 2048, 151936, 40960], Llama { n_kv_head: 4, head_dim: 128, intermediate: 6144, rope_theta: 1e6, rms_eps: 1e-6, qk_norm: true, moe: Some(QWEN3_30B_A3B), ..BASE }),
];

/// The preset of the tests' Qwen3-MoE (q/k norms with experts).
pub const QWEN3_MOE_TINY_PRESET: &str = "qwen3-moe-tiny";
const QWEN3_MOE_TINY: LlamaMoe = LlamaMoe { shared_width: 0, norm_topk: true, naming: MoeNaming::Qwen3Moe, ..MOE_TINY };
const OLMOE_1B_7B: LlamaMoe =
    LlamaMoe { experts: 64, top_k: 8, width: 1024, aux_coef: 0.01, naming: MoeNaming::Olmoe, ..QWEN2_MOE };
const QWEN3_30B_A3B: LlamaMoe = LlamaMoe {
    experts: 128,
    top_k: 8,
    width: 768,
    shared_width: 0,
    norm_topk: true,
    aux_coef: 0.001,
    naming: MoeNaming::Qwen3Moe,
    ..QWEN2_MOE
};

/// The tiny mixture-of-experts preset (tests, the README's tour).
pub const MOE_TINY_PRESET: &str = "moe-tiny";

/// The mixture every Qwen2-MoE preset starts from.
const QWEN2_MOE: LlamaMoe = LlamaMoe {
    experts: 8,
    top_k: 2,
    width: 0,
    shared_width: 0,
    norm_topk: false,
    sparse_step: 1,
    dense: 0,
    aux_coef: 0.001,
    aux_on: false,
    z_coef: 0.0,
    naming: MoeNaming::Qwen2Moe,
    capacity: 0.0,
    bias_rate: 0.0,
};
// the auxiliary losses on and heavier than a real run's, so that tests see them
const MOE_TINY: LlamaMoe =
    LlamaMoe { width: 96, shared_width: 192, aux_on: true, aux_coef: 0.01, z_coef: 0.001, ..QWEN2_MOE };
const QWEN15_MOE: LlamaMoe = LlamaMoe { experts: 60, top_k: 4, width: 1408, shared_width: 5632, ..QWEN2_MOE };
const MIXTRAL_8X7B: LlamaMoe =
    LlamaMoe { width: 14336, norm_topk: true, aux_coef: 0.02, naming: MoeNaming::Mixtral, ..QWEN2_MOE };

/// A mixture of the tests' size for `EXAMPLE`'s shape: 4 experts, 2 a token, a shared expert,
/// the first layer dense (Qwen2-MoE's `mlp_only_layers`), the auxiliary losses on.
pub const MOE_EXAMPLE: LlamaMoe = LlamaMoe {
    experts: 4,
    top_k: 2,
    width: 24,
    shared_width: 40,
    dense: 0b1,
    aux_on: true,
    aux_coef: 0.05,
    z_coef: 0.01,
    ..QWEN2_MOE
};

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
    moe: None,
    qk_norm: false,
    qk_norm_whole: false,
};

/// The shape of that model: 8 query heads in 64.
pub fn example(vocab: usize, context: usize) -> Shape {
    Shape::of([2, 8, 64, vocab, context])
}

fn linear(name: String, (d_in, d_out): (usize, usize), bias: bool) -> Linear {
    Linear { name, d_in, d_out, bias, orient: Orient::OutIn }
}

/// The mixture of block `prefix` under its naming's tensor names.
fn moe_spec(moe: &LlamaMoe, prefix: &str, c: usize) -> MoeSpec {
    let (m, ms) = (moe.width, moe.shared_width);
    let swiglu = |[g, u, d]: [String; 3], m: usize| {
        [linear(g, (c, m), false), linear(u, (c, m), false), linear(d, (m, c), false)]
    };
    let (router, experts, shared) = match moe.naming {
        MoeNaming::Qwen2Moe | MoeNaming::Qwen3Moe | MoeNaming::Olmoe => {
            let at = |n: &str| format!("{prefix}.mlp.{n}");
            let proj = |e: &str| ["gate_proj", "up_proj", "down_proj"].map(|n| at(&format!("{e}.{n}")));
            let shared =
                (ms > 0).then(|| (swiglu(proj("shared_expert"), ms), linear(at("shared_expert_gate"), (c, 1), false)));
            let experts = (0..moe.experts).map(|e| swiglu(proj(&format!("experts.{e}")), m)).collect();
            (linear(at("gate"), (c, moe.experts), false), experts, shared)
        }
        MoeNaming::Mixtral => {
            let at = |n: &str| format!("{prefix}.block_sparse_moe.{n}");
            // w1 the gate, w3 the up projection, w2 the down
            let w = |e: usize| ["w1", "w3", "w2"].map(|n| at(&format!("experts.{e}.{n}")));
            let experts = (0..moe.experts).map(|e| swiglu(w(e), m)).collect();
            (linear(at("gate"), (c, moe.experts), false), experts, None)
        }
    };
    let bias = (moe.bias_rate > 0.0).then(|| format!("{}.e_score_correction_bias", router.name));
    MoeSpec {
        router,
        experts,
        shared,
        top_k: moe.top_k,
        norm_topk: moe.norm_topk,
        capacity: moe.capacity,
        bias: bias.map(|b| (b, moe.bias_rate)),
    }
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
        let mut out = vec![
            ("num_key_value_heads", self.n_kv_head),
            ("head_dim", self.head_dim),
            ("intermediate_size", self.intermediate),
        ];
        if let Some(m) = self.moe {
            out.extend([
                ("num_experts", m.experts),
                ("num_experts_per_tok", m.top_k),
                ("moe_intermediate_size", m.width),
            ]);
        }
        out
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
        if let Some(m) = self.moe.filter(|m| m.top_k > m.experts) {
            return Err(format!("num_experts_per_tok ({}) exceeds the {} experts", m.top_k, m.experts));
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
        let mlp_name = |n: &str| format!("{prefix}.mlp.{n}");
        BlockSpec {
            ln_1: rms("input_layernorm"),
            attn: AttnSpec {
                qkv: Qkv::Separate {
                    q: linear(at("q_proj"), (c, q), self.qkv_bias),
                    k: linear(at("k_proj"), (c, kv), self.qkv_bias),
                    v: linear(at("v_proj"), (c, kv), self.qkv_bias),
                },
                o: linear(at("o_proj"), (q, c), self.o_bias),
                qk_norm: self.qk_norm.then(|| {
                    let widths = if self.qk_norm_whole { [q, kv] } else { [self.head_dim; 2] };
                    ([rms("self_attn.q_norm"), rms("self_attn.k_norm")], widths)
                }),
            },
            ln_2: rms("post_attention_layernorm"),
            mlp: match self.moe.filter(|moe| moe.sparse(i)) {
                Some(moe) => MlpSpec::Moe(moe_spec(&moe, &prefix, c)),
                None => MlpSpec::SwiGlu {
                    gate: linear(mlp_name("gate_proj"), (c, m), false),
                    up: linear(mlp_name("up_proj"), (c, m), false),
                    down: linear(mlp_name("down_proj"), (m, c), false),
                },
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

    fn experts_in(&self, i: usize) -> Option<usize> {
        self.moe.filter(|m| m.sparse(i)).map(|m| m.experts)
    }

    fn moe_losses(&self) -> Option<MoeLosses> {
        self.moe.map(|m| MoeLosses { balance: if m.aux_on { m.aux_coef } else { 0.0 }, z: m.z_coef })
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
    // without a model_type, the class names it
    let class = v.get("architectures").and_then(|a| a.get(0)).and_then(Value::as_str);
    let ty = v.get("model_type").and_then(Value::as_str).unwrap_or(match class {
        Some("Qwen2ForCausalLM") => "qwen2",
        Some("Qwen2MoeForCausalLM") => "qwen2_moe",
        Some("Qwen3ForCausalLM") => "qwen3",
        Some("Qwen3MoeForCausalLM") => "qwen3_moe",
        Some("OlmoeForCausalLM") => "olmoe",
        Some("MixtralForCausalLM") => "mixtral",
        _ => "llama",
    });
    let act = v.get("hidden_act").or_else(|| v.get("hidden_activation"));
    if let Some(a) = act.filter(|a| a.as_str() != Some("silu")) {
        return Err(unsupported("hidden_act", a, "\"silu\" (SwiGLU)"));
    }
    // Qwen2's q/k/v biases; Qwen3 has Llama's `attention_bias` and a norm on each q and k head
    let qwen = ty == "qwen2" || ty == "qwen2_moe";
    let qwen3 = ty == "qwen3" || ty == "qwen3_moe";
    let olmoe = ty == "olmoe";
    if let Some(x) = v.get("clip_qkv").filter(|x| !x.is_null()) {
        return Err(unsupported("clip_qkv", x, "q, k and v unclipped (clip_qkv null)"));
    }
    let layers = need(v, "num_hidden_layers")?;
    let moe = parse_moe(v, ty, layers)?;
    let sliding = match qwen || qwen3 {
        true => v.get("use_sliding_window").filter(|x| x.as_bool() == Some(true)),
        false => v.get("sliding_window").filter(|x| !x.is_null()),
    };
    if let Some(x) = sliding {
        let key = if qwen || qwen3 { "use_sliding_window" } else { "sliding_window" };
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
    let (heads, hidden) = (need(v, "num_attention_heads")?, need(v, "hidden_size")?);
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
        // transformers 5 writes Qwen2-MoE's `qkv_bias` (true unless said)
        qkv_bias: (qwen && flag(v, "qkv_bias", true)?) || bias,
        o_bias: !qwen && bias,
        moe,
        qk_norm: qwen3 || olmoe,
        qk_norm_whole: olmoe,
    };
    let positions = uint(v, "max_position_embeddings")?.unwrap_or(2048);
    Ok((Shape::of([layers, heads, hidden, need(v, "vocab_size")?, positions]), arch))
}

fn flag(v: &Value, k: &str, default: bool) -> Result<bool, String> {
    match v.get(k) {
        None | Some(Value::Null) => Ok(default),
        Some(x) => x.as_bool().ok_or_else(|| format!("'{k}' must be true or false, got {x}")),
    }
}

/// The mixture of a Qwen2-MoE or Mixtral `config.json` (`None` for a dense model; experts in
/// any other model type refused naming the key). Both spellings of the expert count are read.
fn parse_moe(v: &Value, ty: &str, layers: usize) -> Result<Option<LlamaMoe>, String> {
    let experts = match uint(v, "num_experts")? {
        Some(e) => Some(("num_experts", e)),
        None => uint(v, "num_local_experts")?.map(|e| ("num_local_experts", e)),
    };
    let naming = match ty {
        "qwen2_moe" => MoeNaming::Qwen2Moe,
        "qwen3_moe" => MoeNaming::Qwen3Moe,
        "olmoe" => MoeNaming::Olmoe,
        "mixtral" => MoeNaming::Mixtral,
        _ => {
            for k in ["num_experts", "num_local_experts", "moe_intermediate_size", "num_experts_per_tok"] {
                if let Some(x) = v.get(k).filter(|x| !x.is_null() && x.as_u64() != Some(0)) {
                    return Err(unsupported(
                        k,
                        x,
                        "mixtures of experts as qwen2_moe, qwen3_moe, olmoe and mixtral models (this config's model_type has dense MLPs)",
                    ));
                }
            }
            return Ok(None);
        }
    };
    let Some((key, experts)) = experts.filter(|(_, e)| *e > 0) else {
        return Err(format!("a {ty} config needs its number of experts (num_experts or num_local_experts)"));
    };
    let top_k = uint(v, "num_experts_per_tok")?.ok_or_else(|| {
        format!("a {ty} config with {key} = {experts} must say how many are active (num_experts_per_tok)")
    })?;
    if top_k == 0 || top_k > experts {
        return Err(format!("num_experts_per_tok = {top_k} must be between 1 and {key} ({experts})"));
    }
    let mut moe = LlamaMoe {
        experts,
        top_k,
        width: 0,
        shared_width: 0,
        norm_topk: true,
        sparse_step: 1,
        dense: 0,
        aux_coef: float(v, "router_aux_loss_coef")?.unwrap_or(0.001) as f32,
        aux_on: flag(v, "output_router_logits", false)?,
        z_coef: float(v, "router_z_loss_coef")?.unwrap_or(0.0) as f32,
        naming,
        capacity: float(v, "moe_expert_capacity_factor")?.unwrap_or(0.0) as f32,
        bias_rate: float(v, "moe_router_bias_update_rate")?.unwrap_or(0.0) as f32,
    };
    if !(moe.bias_rate >= 0.0 && moe.bias_rate.is_finite()) {
        return Err(format!("moe_router_bias_update_rate = {} must be 0 (off) or positive", moe.bias_rate));
    }
    if !(moe.capacity >= 0.0 && moe.capacity.is_finite()) {
        return Err(format!("moe_expert_capacity_factor = {} must be 0 (dropless) or positive", moe.capacity));
    }
    match naming {
        MoeNaming::Qwen2Moe | MoeNaming::Qwen3Moe => {
            moe.width = need(v, "moe_intermediate_size")?;
            if naming == MoeNaming::Qwen2Moe {
                moe.shared_width = uint(v, "shared_expert_intermediate_size")?.unwrap_or(0);
            }
            moe.norm_topk = flag(v, "norm_topk_prob", false)?;
            moe.sparse_step = uint(v, "decoder_sparse_step")?.unwrap_or(1);
            if moe.sparse_step == 0 {
                return Err("decoder_sparse_step = 0: it must be at least 1 (every layer a mixture)".into());
            }
            if let Some(list) = v.get("mlp_only_layers").filter(|x| !x.is_null()) {
                let bad = || {
                    format!("mlp_only_layers = {list} must list layers below num_hidden_layers ({layers}, at most 64)")
                };
                for l in list.as_array().ok_or_else(bad)? {
                    let i = l.as_u64().filter(|&i| (i as usize) < layers.min(64)).ok_or_else(bad)?;
                    moe.dense |= 1 << i;
                }
            }
        }
        // Mixtral's experts are `intermediate_size` wide; its weights renormalise over the k
        MoeNaming::Mixtral => moe.width = need(v, "intermediate_size")?,
        // OLMoE's too, every layer a mixture, renormalised only when said
        MoeNaming::Olmoe => {
            moe.width = need(v, "intermediate_size")?;
            moe.norm_topk = flag(v, "norm_topk_prob", false)?;
        }
    }
    Ok(Some(moe))
}

/// A Hugging Face `config.json` for a Llama-family model (Qwen2's class when it has q/k/v
/// biases only, else Llama's), in the Hub's form, which transformers 4 and 5 both read.
pub fn to_json(s: &Shape, a: &Llama, bos_eos: (Option<u32>, Option<u32>)) -> Value {
    let Shape { n_layer: layers, n_head: heads, n_embd: hidden, vocab_size: vocab, block_size: positions } = *s;
    // (Qwen3's q/k norms name its classes; its biases are Llama's `attention_bias`)
    let qwen = a.qkv_bias && !a.o_bias && !a.qk_norm;
    let (model_type, class) = match (a.moe.map(|m| m.naming), qwen, a.qk_norm) {
        (Some(MoeNaming::Qwen2Moe), _, _) => ("qwen2_moe", "Qwen2MoeForCausalLM"),
        (Some(MoeNaming::Qwen3Moe), _, _) => ("qwen3_moe", "Qwen3MoeForCausalLM"),
        (Some(MoeNaming::Olmoe), _, _) => ("olmoe", "OlmoeForCausalLM"),
        (Some(MoeNaming::Mixtral), _, _) => ("mixtral", "MixtralForCausalLM"),
        (None, _, true) => ("qwen3", "Qwen3ForCausalLM"),
        (None, true, _) => ("qwen2", "Qwen2ForCausalLM"),
        (None, false, _) => ("llama", "LlamaForCausalLM"),
    };
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
        "model_type": model_type,
        "architectures": [class],
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
    } else if a.qk_norm_whole {
        v["attention_bias"] = Value::Bool(a.o_bias);
        v["clip_qkv"] = Value::Null;
    } else if a.qk_norm {
        v["use_sliding_window"] = Value::Bool(false);
        v["attention_bias"] = Value::Bool(a.o_bias);
    } else {
        v["attention_bias"] = Value::Bool(a.o_bias);
        v["mlp_bias"] = Value::Bool(false);
    }
    if let Some(m) = a.moe {
        let o = v.as_object_mut().expect("an object");
        o.insert("num_experts_per_tok".into(), m.top_k.into());
        o.insert("router_aux_loss_coef".into(), m.aux_coef.into());
        o.insert("output_router_logits".into(), m.aux_on.into());
        if m.z_coef != 0.0 {
            o.insert("router_z_loss_coef".into(), m.z_coef.into());
        }
        if m.capacity > 0.0 {
            o.insert("moe_expert_capacity_factor".into(), m.capacity.into());
        }
        if m.bias_rate > 0.0 {
            o.insert("moe_router_bias_update_rate".into(), m.bias_rate.into());
        }
        match m.naming {
            MoeNaming::Qwen2Moe | MoeNaming::Qwen3Moe => {
                o.insert("num_experts".into(), m.experts.into());
                o.insert("moe_intermediate_size".into(), m.width.into());
                if m.naming == MoeNaming::Qwen2Moe {
                    o.insert("shared_expert_intermediate_size".into(), m.shared_width.into());
                }
                o.insert("norm_topk_prob".into(), m.norm_topk.into());
                o.insert("decoder_sparse_step".into(), m.sparse_step.into());
                let dense: Vec<usize> = (0..64).filter(|i| m.dense >> i & 1 == 1).collect();
                o.insert("mlp_only_layers".into(), dense.into());
            }
            MoeNaming::Olmoe => {
                o.insert("num_experts".into(), m.experts.into());
                // OLMoE's experts are its intermediate_size
                o.insert("intermediate_size".into(), m.width.into());
                o.insert("norm_topk_prob".into(), m.norm_topk.into());
            }
            MoeNaming::Mixtral => {
                o.insert("num_local_experts".into(), m.experts.into());
                // Mixtral's experts are its intermediate_size
                o.insert("intermediate_size".into(), m.width.into());
                o.insert("sliding_window".into(), Value::Null);
                o.remove("mlp_bias");
            }
        }
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
        v["model_type"] = json!("deepseek_v3");
        assert!(super::super::read_hf(&v).unwrap_err().contains("deepseek_v3"));
        let mut v = llama3();
        v["model_type"] = json!("olmoe");
        v["clip_qkv"] = json!(8.0);
        assert!(refused(&v).contains("clip_qkv"));
    }

    fn qwen2_moe() -> Value {
        json!({"model_type": "qwen2_moe", "hidden_size": 32, "intermediate_size": 48,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 50, "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
            "shared_expert_intermediate_size": 24, "norm_topk_prob": false, "decoder_sparse_step": 2,
            "mlp_only_layers": [3], "output_router_logits": true, "router_aux_loss_coef": 0.05,
            "use_sliding_window": false})
    }

    #[test]
    fn mixtures_of_experts_read_and_write_back() {
        let mut with_capacity = qwen2_moe();
        with_capacity["moe_expert_capacity_factor"] = json!(1.25);
        let (shape, a) = parse(&with_capacity).unwrap();
        assert_eq!(a.moe.unwrap().capacity, 1.25);
        assert_eq!(parse(&to_json(&shape, &a, (None, None))).unwrap(), (shape, a));
        let (shape, a) = parse(&qwen2_moe()).unwrap();
        let m = a.moe.unwrap();
        assert_eq!((m.experts, m.top_k, m.width, m.shared_width, m.capacity), (6, 2, 16, 24, 0.0));
        assert_eq!((m.norm_topk, m.aux_on, m.aux_coef, m.naming), (false, true, 0.05, MoeNaming::Qwen2Moe));
        // every second layer a mixture, but layer 3 kept dense
        assert_eq!((0..4).map(|i| m.sparse(i)).collect::<Vec<_>>(), [false, true, false, false]);
        assert!(a.qkv_bias && !a.o_bias);
        assert_eq!(parse(&to_json(&shape, &a, (None, None))).unwrap(), (shape, a));
        let spec = a.block(&shape, 1);
        let MlpSpec::Moe(moe) = &spec.mlp else { panic!("layer 1 is a mixture") };
        assert_eq!(moe.experts[5][2].name, "model.layers.1.mlp.experts.5.down_proj");
        assert_eq!(moe.shared.as_ref().unwrap().1.name, "model.layers.1.mlp.shared_expert_gate");
        assert!(matches!(a.block(&shape, 3).mlp, MlpSpec::SwiGlu { .. }));
        // Mixtral: num_local_experts, its intermediate_size the experts', renormalised
        let mix = json!({"model_type": "mixtral", "hidden_size": 32, "intermediate_size": 24,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1, "vocab_size": 50,
            "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": null});
        let (shape, a) = parse(&mix).unwrap();
        let m = a.moe.unwrap();
        assert_eq!((m.experts, m.width, m.norm_topk, m.aux_on, m.naming), (4, 24, true, false, MoeNaming::Mixtral));
        assert_eq!(parse(&to_json(&shape, &a, (None, None))).unwrap(), (shape, a));
        let MlpSpec::Moe(moe) = &a.block(&shape, 0).mlp else { panic!("a mixture") };
        assert_eq!(moe.experts[3][1].name, "model.layers.0.block_sparse_moe.experts.3.w3");
        // Qwen3-MoE as transformers 5 writes it (num_local_experts), and Qwen3: q/k norms,
        // Llama's attention_bias, no shared expert
        let q3 = json!({"model_type": "qwen3_moe", "hidden_size": 32, "intermediate_size": 40,
            "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "vocab_size": 50, "num_local_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
            "norm_topk_prob": true, "mlp_only_layers": [1], "attention_bias": false, "use_sliding_window": false});
        let (shape, a) = parse(&q3).unwrap();
        let m = a.moe.unwrap();
        assert_eq!((m.experts, m.width, m.shared_width, m.norm_topk, m.naming), (6, 16, 0, true, MoeNaming::Qwen3Moe));
        assert!(a.qk_norm && !a.qkv_bias && !a.o_bias);
        let back = to_json(&shape, &a, (None, None));
        assert_eq!(
            (back["model_type"].as_str(), back["architectures"][0].as_str()),
            (Some("qwen3_moe"), Some("Qwen3MoeForCausalLM"))
        );
        assert_eq!(parse(&back).unwrap(), (shape, a));
        let spec = a.block(&shape, 0);
        assert_eq!(spec.attn.qk_norm.as_ref().unwrap().0[1].name, "model.layers.0.self_attn.k_norm");
        let MlpSpec::Moe(moe) = &spec.mlp else { panic!("layer 0 is a mixture") };
        assert!(moe.shared.is_none() && moe.norm_topk);
        let mut dense = q3.clone();
        dense["model_type"] = json!("qwen3");
        for k in ["num_local_experts", "num_experts_per_tok", "moe_intermediate_size"] {
            dense.as_object_mut().unwrap().remove(k);
        }
        let (shape, a) = parse(&dense).unwrap();
        assert!(a.qk_norm && a.moe.is_none());
        assert_eq!(to_json(&shape, &a, (None, None))["architectures"][0], "Qwen3ForCausalLM");
        assert_eq!(parse(&to_json(&shape, &a, (None, None))).unwrap(), (shape, a));
    }

    #[test]
    fn mixtures_that_cannot_run_are_refused_naming_the_key() {
        let cases: Vec<(&str, Value, &str)> = vec![
            ("num_experts_per_tok", Value::Null, "num_experts_per_tok"),
            ("num_experts_per_tok", json!(7), "num_experts_per_tok"),
            ("num_experts", json!(0), "num_experts"),
            ("mlp_only_layers", json!([4]), "mlp_only_layers"),
            ("decoder_sparse_step", json!(0), "decoder_sparse_step"),
            ("moe_intermediate_size", Value::Null, "moe_intermediate_size"),
        ];
        for (k, val, named) in cases {
            let mut v = qwen2_moe();
            v[k] = val;
            let e = refused(&v);
            assert!(e.contains(named) && !e.contains('\n'), "{k}: {e}");
        }
    }

    /// `mlp_only_layers` is a bit per layer for the first 64; a layer past them is never
    /// taken for dense (a shift by 64 would wrap to bit 0).
    #[test]
    fn dense_layers_past_the_64th_are_sparse() {
        let m = LlamaMoe { dense: 1, sparse_step: 1, ..QWEN2_MOE };
        assert!(!m.sparse(0) && m.sparse(1) && m.sparse(63) && m.sparse(64) && m.sparse(65));
        let m = LlamaMoe { dense: 1 << 63, sparse_step: 2, ..QWEN2_MOE };
        assert!(!m.sparse(63) && m.sparse(65) && !m.sparse(64) && m.sparse(127));
    }

    /// The published presets' rotary bases, as their config.json files give them
    /// (allenai/OLMoE-1B-7B-0924 10000, Qwen/Qwen3-30B-A3B 1e6, mistralai/Mixtral-8x7B 1e6).
    #[test]
    fn presets_keep_their_published_rope_theta() {
        for (name, theta) in [("olmoe-1b-7b", 10_000.0), ("qwen3-30b-a3b", 1e6), ("mixtral-8x7b", 1e6)] {
            let cfg = crate::models::GptConfig::preset(name).unwrap();
            let Positions::Rotary { theta: got, .. } = cfg.positions() else { panic!("{name}: rotary") };
            assert_eq!(got, theta, "{name}");
        }
    }
}
