//! Named models and accelerators the planner knows. Figures are the vendors' and papers'.

use crate::error::{Error, Result};
use serde::Serialize;

/// A decoder-only transformer's shape (dense, or with mixtures of experts).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ModelShape {
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    /// Key/value heads (grouped-query attention); `heads` for multi-head attention.
    pub kv_heads: usize,
    /// One head's width (`hidden / heads` unless the model says otherwise, as Qwen3 does).
    pub head_dim: usize,
    /// The mixtures of experts in place of some layers' MLPs (`None`: dense).
    pub moe: Option<ExpertShape>,
    /// MLP width.
    pub ffn: usize,
    /// Gated MLP (SwiGLU): three matrices instead of two.
    pub swiglu: bool,
    pub seq: usize,
    pub vocab: usize,
    /// Whether the LM head is the token table (else its own `vocab × hidden` parameters).
    pub tied: bool,
}

/// A model's mixtures of experts, as the planner costs them.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ExpertShape {
    /// Routed experts per mixture layer, and how many a token goes to.
    pub experts: usize,
    pub top_k: usize,
    /// Each routed expert's SwiGLU width, and a shared expert's (0: none).
    pub width: usize,
    pub shared: usize,
    /// Layers that are mixtures (the others keep a dense MLP of `ffn`).
    pub layers: usize,
}

impl ModelShape {
    /// The shape of one of brigade's model configs (GPT-2 or the Llama family) at `seq`.
    pub fn of(cfg: &crate::models::GptConfig, seq: usize) -> ModelShape {
        use crate::models::family::MlpSpec;
        let moe = (0..cfg.n_layer).find_map(|i| match cfg.block(i).mlp {
            MlpSpec::Moe(m) => Some(ExpertShape {
                experts: m.experts.len(),
                top_k: m.top_k,
                width: m.width(),
                shared: m.shared.as_ref().map_or(0, |(s, _)| s[0].d_out),
                layers: cfg.moe_layers(),
            }),
            _ => None,
        });
        ModelShape {
            layers: cfg.n_layer,
            hidden: cfg.n_embd,
            heads: cfg.n_head,
            kv_heads: cfg.kv_heads(),
            head_dim: cfg.head_dim(),
            moe,
            ffn: cfg.mlp_width(),
            swiglu: !matches!(cfg.block(0).mlp, MlpSpec::Gelu { .. }),
            seq,
            vocab: cfg.vocab_size,
            tied: cfg.tied(),
        }
    }
}

/// A GPT decoder: multi-head attention, a GELU MLP 4·hidden wide, a tied head.
pub const fn gpt(layers: usize, hidden: usize, heads: usize, seq: usize, vocab: usize) -> ModelShape {
    ModelShape {
        layers,
        hidden,
        heads,
        kv_heads: heads,
        head_dim: hidden / heads,
        moe: None,
        ffn: 4 * hidden,
        swiglu: false,
        seq,
        vocab,
        tied: true,
    }
}

/// A Llama-family decoder: `(heads, kv)` query and key/value heads, a SwiGLU MLP `ffn` wide,
/// an untied head (as Llama 2 and 3 have).
const fn llama(
    layers: usize,
    (hidden, ffn): (usize, usize),
    (heads, kv): (usize, usize),
    seq: usize,
    vocab: usize,
) -> ModelShape {
    ModelShape {
        layers,
        hidden,
        heads,
        kv_heads: kv,
        head_dim: hidden / heads,
        moe: None,
        ffn,
        swiglu: true,
        seq,
        vocab,
        tied: false,
    }
}

pub const MODELS: &[(&str, ModelShape)] = &[
    ("gpt2-small", gpt(12, 768, 12, 1024, 50257)),
    ("gpt2-medium", gpt(24, 1024, 16, 1024, 50257)),
    ("gpt2-large", gpt(36, 1280, 20, 1024, 50257)),
    ("gpt2-xl", gpt(48, 1600, 25, 1024, 50257)),
    // GPT-3 (Brown et al. 2020, Table 2.1; 1.3B with 16 heads of 128 so heads divide the width)
    ("gpt3-125m", gpt(12, 768, 12, 2048, 50257)),
    ("gpt3-350m", gpt(24, 1024, 16, 2048, 50257)),
    ("gpt3-760m", gpt(24, 1536, 16, 2048, 50257)),
    ("gpt3-1.3b", gpt(24, 2048, 16, 2048, 50257)),
    ("gpt3-2.7b", gpt(32, 2560, 32, 2048, 50257)),
    ("gpt3-6.7b", gpt(32, 4096, 32, 2048, 50257)),
    ("gpt3-13b", gpt(40, 5120, 40, 2048, 50257)),
    ("gpt3-175b", gpt(96, 12288, 96, 2048, 50257)),
    // Megatron-LM paper (Narayanan et al. 2021, Table 1)
    ("megatron-1.7b", gpt(24, 2304, 24, 2048, 51200)),
    ("megatron-3.6b", gpt(30, 3072, 32, 2048, 51200)),
    ("megatron-7.5b", gpt(36, 4096, 32, 2048, 51200)),
    ("megatron-18.4b", gpt(40, 6144, 48, 2048, 51200)),
    ("megatron-39.1b", gpt(48, 8192, 64, 2048, 51200)),
    ("megatron-76.1b", gpt(60, 10240, 80, 2048, 51200)),
    ("megatron-145.6b", gpt(80, 12288, 96, 2048, 51200)),
    ("megatron-310.1b", gpt(96, 16384, 128, 2048, 51200)),
    ("megatron-529.6b", gpt(105, 20480, 128, 2048, 51200)),
    ("megatron-1t", gpt(128, 25600, 160, 2048, 51200)),
    // Llama 2 (Touvron et al. 2023) and Llama 3 (Dubey et al. 2024)
    ("llama2-7b", llama(32, (4096, 11008), (32, 32), 4096, 32000)),
    ("llama2-13b", llama(40, (5120, 13824), (40, 40), 4096, 32000)),
    ("llama2-70b", llama(80, (8192, 28672), (64, 8), 4096, 32000)),
    ("llama3-8b", llama(32, (4096, 14336), (32, 8), 8192, 128256)),
    ("llama3-70b", llama(80, (8192, 28672), (64, 8), 8192, 128256)),
    ("llama3-405b", llama(126, (16384, 53248), (128, 8), 8192, 128256)),
];

/// One accelerator and the node it sits in.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Accelerator {
    /// Dense 16-bit (bf16/fp16) peak, TFLOP/s.
    pub peak_tflops: f64,
    /// Dense TF32 tensor-core peak (what fp32 training runs at), TFLOP/s.
    pub tf32_tflops: f64,
    pub hbm_gib: f64,
    /// HBM bandwidth, TB/s.
    pub hbm_tbps: f64,
    /// NVLink/NVSwitch bandwidth per GPU per direction, GB/s.
    pub nvlink_gbps: f64,
    /// Network (InfiniBand/RoCE) bandwidth per GPU per direction, GB/s.
    pub net_gbps: f64,
    pub gpus_per_node: usize,
    /// Fraction of peak that large matrix products reach (cuBLAS-class kernels), and that the
    /// attention core reaches; calibrated once per GPU generation against published runs.
    pub gemm_efficiency: f64,
    pub attention_efficiency: f64,
}

const A100: Accelerator = Accelerator {
    peak_tflops: 312.0,
    tf32_tflops: 156.0,
    hbm_gib: 80.0,
    hbm_tbps: 2.039,
    nvlink_gbps: 300.0,
    net_gbps: 25.0,
    gpus_per_node: 8,
    gemm_efficiency: 0.70,
    attention_efficiency: 0.50,
};

const H100: Accelerator = Accelerator {
    peak_tflops: 989.0,
    tf32_tflops: 494.7,
    hbm_gib: 80.0,
    hbm_tbps: 3.35,
    nvlink_gbps: 450.0,
    net_gbps: 50.0,
    gpus_per_node: 8,
    gemm_efficiency: 0.80,
    attention_efficiency: 0.40,
};

pub const ACCELERATORS: &[(&str, Accelerator)] = &[
    ("a100-40gb", Accelerator { hbm_gib: 40.0, hbm_tbps: 1.555, ..A100 }),
    ("a100-80gb", A100),
    ("h100-sxm", H100),
    ("h200", Accelerator { hbm_gib: 141.0, hbm_tbps: 4.8, ..H100 }),
    // B200: 2.25 PFLOP/s dense bf16, NVLink 5; efficiencies assumed as H100's (no published anchor yet).
    (
        "b200",
        Accelerator {
            peak_tflops: 2250.0,
            tf32_tflops: 1100.0,
            hbm_gib: 180.0,
            hbm_tbps: 8.0,
            nvlink_gbps: 900.0,
            ..H100
        },
    ),
];

fn lookup<T: Copy>(table: &[(&str, T)], name: &str, what: &str) -> Result<T> {
    table.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| *v).ok_or_else(|| {
        let known: Vec<&str> = table.iter().map(|(n, _)| *n).collect();
        Error::Config(format!("unknown {what} '{name}'; known: {}", known.join(", ")))
    })
}

/// A model of the catalog, or one of brigade's presets (`smollm2-135m`, `qwen2.5-0.5b`,
/// `llama3.2-1b`, …) at its own context length.
pub fn model(name: &str) -> Result<ModelShape> {
    lookup(MODELS, name, "model").or_else(|e| {
        let cfg = crate::models::GptConfig::preset(name).map_err(|_| {
            let presets: Vec<&str> = crate::models::PRESETS.iter().map(|(n, _)| *n).collect();
            Error::Config(format!("{e}; or a brigade preset: {}", presets.join(", ")))
        })?;
        Ok(ModelShape::of(&cfg, cfg.block_size.min(8192)))
    })
}

pub fn accelerator(name: &str) -> Result<Accelerator> {
    lookup(ACCELERATORS, name, "accelerator")
}
