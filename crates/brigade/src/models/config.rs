//! A decoder's shape — GPT-2 or the Llama family — named presets, the bounds a config must
//! keep, parameter and FLOP counts.

use crate::error::{Error, Result};
pub use crate::models::arch::{Arch, Llama, Llama3Rope};
use serde::{Deserialize, Serialize};

/// The shape both families share, and (`arch`) what the Llama family adds. `n_embd` is the
/// hidden size, `block_size` the longest sequence (GPT-2's position table, Llama's
/// `max_position_embeddings`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct GptConfig {
    pub n_layer: usize,
    pub n_head: usize,
    pub n_embd: usize,
    pub vocab_size: usize,
    pub block_size: usize,
    #[serde(default)]
    pub arch: Arch,
}

/// Bounds far beyond any model brigade trains, that keep every size computed from a config
/// (perhaps a corrupt or hostile `config.json`) clear of overflow.
pub const MAX_DIM: usize = 1 << 24;
pub const MAX_PARAMS: u128 = 1 << 40;

/// A Llama-family preset: (layers, heads, hidden, vocab, positions), key/value heads, head
/// width, MLP width, rope θ and scaling, RMSNorm ε, tied head, q/k/v biases.
#[allow(clippy::too_many_arguments)]
const fn llama(
    [n_layer, n_head, n_embd, vocab_size, block_size]: [usize; 5],
    n_kv_head: usize,
    head_dim: usize,
    intermediate: usize,
    (rope_theta, rope_scaling): (f64, Option<Llama3Rope>),
    rms_eps: f32,
    tied: bool,
    qkv_bias: bool,
) -> GptConfig {
    let a =
        Llama { n_kv_head, head_dim, intermediate, rms_eps, rope_theta, rope_scaling, tied, qkv_bias, o_bias: false };
    GptConfig { n_layer, n_head, n_embd, vocab_size, block_size, arch: Arch::Llama(a) }
}

/// Llama 3.1's long-context rope scaling (factor 8 over 8192 positions); Llama 3.2's is 32.
const LLAMA31_ROPE: Llama3Rope =
    Llama3Rope { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 8192 };
const LLAMA32_ROPE: Llama3Rope = Llama3Rope { factor: 32.0, ..LLAMA31_ROPE };

/// Named model sizes: `tiny` and `llama-tiny` for tests and the built-in task, the GPT-2 and
/// Llama families at their published shapes (from each model's `config.json` on the Hub) for
/// benchmarks and the planner.
#[rustfmt::skip]
pub const PRESETS: &[(&str, GptConfig)] = &[
    ("tiny", GptConfig { n_layer: 2, n_head: 4, n_embd: 128, vocab_size: 256, block_size: 64, arch: Arch::Gpt2 }),
    ("gpt2-small", GptConfig { n_layer: 12, n_head: 12, n_embd: 768, vocab_size: 50257, block_size: 1024, arch: Arch::Gpt2 }),
    ("gpt2-medium", GptConfig { n_layer: 24, n_head: 16, n_embd: 1024, vocab_size: 50257, block_size: 1024, arch: Arch::Gpt2 }),
    ("gpt2-large", GptConfig { n_layer: 36, n_head: 20, n_embd: 1280, vocab_size: 50257, block_size: 1024, arch: Arch::Gpt2 }),
    ("gpt2-xl", GptConfig { n_layer: 48, n_head: 25, n_embd: 1600, vocab_size: 50257, block_size: 1024, arch: Arch::Gpt2 }),
    // GQA 4:2 and an untied head: every part of the family in a model of 0.43M parameters
    ("llama-tiny", llama([2, 4, 128, 256, 64], 2, 32, 352, (10_000.0, None), 1e-5, false, false)),
    // HuggingFaceTB/SmolLM2-135M
    ("smollm2-135m", llama([30, 9, 576, 49152, 8192], 3, 64, 1536, (100_000.0, None), 1e-5, true, false)),
    // Qwen/Qwen2.5-0.5B
    ("qwen2.5-0.5b", llama([24, 14, 896, 151936, 32768], 2, 64, 4864, (1e6, None), 1e-6, true, true)),
    // meta-llama/Llama-3.2-1B
    ("llama3.2-1b", llama([16, 32, 2048, 128256, 131072], 8, 64, 8192, (500_000.0, Some(LLAMA32_ROPE)), 1e-5, true, false)),
    // meta-llama/Meta-Llama-3-8B, -70B, and Llama 3.1's 405B
    ("llama3-8b", llama([32, 32, 4096, 128256, 8192], 8, 128, 14336, (500_000.0, None), 1e-5, false, false)),
    ("llama3-70b", llama([80, 64, 8192, 128256, 8192], 8, 128, 28672, (500_000.0, None), 1e-5, false, false)),
    ("llama3-405b", llama([126, 128, 16384, 128256, 131072], 8, 128, 53248, (500_000.0, Some(LLAMA31_ROPE)), 1e-5, false, false)),
];

impl GptConfig {
    pub fn preset(name: &str) -> Result<GptConfig> {
        PRESETS.iter().find(|(n, _)| *n == name).map(|(_, c)| *c).ok_or_else(|| {
            let known: Vec<&str> = PRESETS.iter().map(|(n, _)| *n).collect();
            Error::Config(format!("unknown model preset '{name}'; known presets: {}", known.join(", ")))
        })
    }

    /// The Llama family's fields, when the config is of that family.
    pub fn llama(&self) -> Option<&Llama> {
        match &self.arch {
            Arch::Llama(a) => Some(a),
            Arch::Gpt2 => None,
        }
    }

    /// Key/value heads (GPT-2: one per query head).
    pub fn kv_heads(&self) -> usize {
        self.llama().map_or(self.n_head, |a| a.n_kv_head)
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.llama().map_or(self.n_embd / self.n_head.max(1), |a| a.head_dim)
    }

    /// Widths of all query heads and of all key (or value) heads.
    pub fn q_width(&self) -> usize {
        self.n_head * self.head_dim()
    }
    pub fn kv_width(&self) -> usize {
        self.kv_heads() * self.head_dim()
    }

    /// The MLP's hidden width (GPT-2: 4·C).
    pub fn mlp_width(&self) -> usize {
        self.llama().map_or(4 * self.n_embd, |a| a.intermediate)
    }

    /// Whether the LM head is the token table.
    pub fn tied(&self) -> bool {
        self.llama().is_none_or(|a| a.tied)
    }

    pub fn validate(&self) -> Result<()> {
        let mut z = vec![
            ("n_layer", self.n_layer),
            ("n_head", self.n_head),
            ("n_embd", self.n_embd),
            ("vocab_size", self.vocab_size),
            ("block_size", self.block_size),
        ];
        if let Some(a) = self.llama() {
            z.extend([
                ("num_key_value_heads", a.n_kv_head),
                ("head_dim", a.head_dim),
                ("intermediate_size", a.intermediate),
            ]);
        }
        if let Some((k, _)) = z.iter().find(|(_, v)| *v == 0) {
            return Err(Error::Config(format!("{k} must be at least 1")));
        }
        if let Some((k, v)) = z.iter().find(|(_, v)| *v > MAX_DIM) {
            return Err(Error::Config(format!("{k} = {v} is beyond any model; at most {MAX_DIM}")));
        }
        if self.num_params() > MAX_PARAMS {
            return Err(Error::Config(format!(
                "{} parameters is beyond what brigade can hold in one f32 buffer (at most {MAX_PARAMS})",
                self.num_params()
            )));
        }
        match self.llama() {
            None if !self.n_embd.is_multiple_of(self.n_head) => Err(Error::Config(format!(
                "n_embd ({}) must be divisible by n_head ({}); pick n_head among the divisors of n_embd",
                self.n_embd, self.n_head
            ))),
            Some(a) if !self.n_head.is_multiple_of(a.n_kv_head) => Err(Error::Config(format!(
                "num_attention_heads ({}) must be a multiple of num_key_value_heads ({}): each key/value head serves a whole group of query heads",
                self.n_head, a.n_kv_head
            ))),
            Some(a) if !a.head_dim.is_multiple_of(2) => Err(Error::Config(format!(
                "head_dim = {} is odd; rotary embeddings rotate pairs of a head's dimensions",
                a.head_dim
            ))),
            Some(a) if !(a.rms_eps > 0.0 && a.rope_theta > 1.0) => Err(Error::Config(format!(
                "rms_norm_eps ({}) must be positive and rope_theta ({}) above 1",
                a.rms_eps, a.rope_theta
            ))),
            _ => Ok(()),
        }
    }

    /// The weight matrices of one block (attention and MLP), counted without overflow.
    pub fn block_matrices(&self) -> u128 {
        let (c, q, kv, m) =
            (self.n_embd as u128, self.q_width() as u128, self.kv_width() as u128, self.mlp_width() as u128);
        let mlp = if self.llama().is_some() { 3 } else { 2 };
        c * (q + 2 * kv) + q * c + mlp * c * m
    }

    /// Every parameter (embeddings, blocks, final norm, an untied head), counted without overflow.
    pub fn num_params(&self) -> u128 {
        let (l, c, v) = (self.n_layer as u128, self.n_embd as u128, self.vocab_size as u128);
        match self.llama() {
            None => (v + self.block_size as u128) * c + l * (self.block_matrices() + 13 * c) + 2 * c,
            Some(a) => {
                let (q, kv) = (self.q_width() as u128, self.kv_width() as u128);
                let biases = if a.qkv_bias { q + 2 * kv } else { 0 } + if a.o_bias { c } else { 0 };
                let heads = if a.tied { 1 } else { 2 };
                heads * v * c + l * (self.block_matrices() + biases + 2 * c) + c
            }
        }
    }

    /// Parameters counted by the 6·N FLOP rule: the block matrices and the LM head.
    pub fn matmul_params(&self) -> usize {
        self.n_layer * self.block_matrices() as usize + self.vocab_size * self.n_embd
    }

    /// Training FLOPs per token: 6·N for the matmuls plus causal attention (q·kᵀ and P·v,
    /// half of the T×T square, forward and backward), as PaLM's appendix B counts it.
    pub fn train_flops_per_token(&self, seq: usize) -> f64 {
        6.0 * self.matmul_params() as f64 + 6.0 * (self.n_layer * seq * self.q_width()) as f64
    }
}

/// Refuses a tensor-parallel degree that does not divide the attention heads, or (Llama
/// family) fits neither of the two ways to place the key/value heads: tp divides them (each
/// rank holds its own), or tp is a multiple of them (each is replicated on tp / kv ranks).
pub fn check_tp(cfg: &GptConfig, tp: usize) -> Result<()> {
    let (h, kv) = (cfg.n_head, cfg.kv_heads());
    let mlp = cfg.mlp_width();
    let fits = |d: usize| {
        d > 0 && h.is_multiple_of(d) && mlp.is_multiple_of(d) && (kv.is_multiple_of(d) || d.is_multiple_of(kv))
    };
    if !fits(tp) {
        let ok: Vec<String> = (1..=h).filter(|&d| fits(d)).map(|d| d.to_string()).collect();
        let what = if cfg.llama().is_none() {
            format!("the model's {h} attention heads")
        } else {
            format!("the model's {h} query heads, {kv} key/value heads (or a multiple of them) and MLP width {mlp}")
        };
        return Err(Error::Layout(format!(
            "tp={tp} does not divide {what}; use tp among {} (or a model with more heads)",
            ok.join(", ")
        )));
    }
    Ok(())
}

/// How many ranks of a tensor-parallel group of `tp` hold each key/value head (1 when tp
/// divides them: each rank holds its own).
pub fn kv_copies(cfg: &GptConfig, tp: usize) -> usize {
    let kv = cfg.kv_heads();
    if tp > kv {
        tp / kv
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::Gpt;

    #[test]
    fn presets_resolve_and_unknown_names_are_listed() {
        assert_eq!(GptConfig::preset("gpt2-medium").unwrap().n_layer, 24);
        assert_eq!(GptConfig::preset("tiny").unwrap().n_embd, 128);
        let e = GptConfig::preset("gpt5").unwrap_err().to_string();
        assert!(e.contains("unknown model preset 'gpt5'") && e.contains("gpt2-xl"), "{e}");
    }

    #[test]
    fn parameter_and_flop_counts_match_the_published_figures() {
        let small = GptConfig::preset("gpt2-small").unwrap();
        // GPT-2 small has 124,439,808 parameters (Hugging Face's count of `gpt2`)
        assert_eq!(Gpt::new(small).unwrap().num_params(), 124_439_808);
        assert_eq!(small.num_params(), 124_439_808);
        // 12 layers of 12·768² plus the 50257×768 head, written out
        assert_eq!(small.matmul_params(), 84_934_656 + 38_597_376);
        // 6 per matmul parameter and 6·L·T·C of causal attention at T = 256
        assert_eq!(small.train_flops_per_token(256), 6.0 * 123_532_032.0 + 6.0 * 12.0 * 256.0 * 768.0);
    }

    #[test]
    fn llama_counts_match_the_published_figures() {
        // Hugging Face's counts of the models' parameters (their model cards and
        // `num_parameters()`): SmolLM2-135M 134,515,008; Qwen2.5-0.5B 494,032,768;
        // Llama-3.2-1B 1,235,814,400; Meta-Llama-3-8B 8,030,261,248
        for (name, want) in [
            ("smollm2-135m", 134_515_008u128),
            ("qwen2.5-0.5b", 494_032_768),
            ("llama3.2-1b", 1_235_814_400),
            ("llama3-8b", 8_030_261_248),
        ] {
            assert_eq!(GptConfig::preset(name).unwrap().num_params(), want, "{name}");
        }
        let tiny = GptConfig::preset("llama-tiny").unwrap();
        assert_eq!(Gpt::new(tiny).unwrap().num_params() as u128, tiny.num_params());
    }

    #[test]
    fn tp_must_fit_query_and_key_value_heads() {
        let mut cfg = GptConfig::preset("llama-tiny").unwrap();
        cfg.n_head = 8;
        assert!(check_tp(&cfg, 1).is_ok() && check_tp(&cfg, 2).is_ok());
        assert!(check_tp(&cfg, 4).is_ok(), "4 ranks replicate each of the 2 key/value heads twice");
        assert_eq!((kv_copies(&cfg, 4), kv_copies(&cfg, 2)), (2, 1));
        // 6 query heads on 3 key/value heads: 2 ranks can neither split nor replicate them
        cfg.n_head = 6;
        if let Arch::Llama(a) = &mut cfg.arch {
            (a.n_kv_head, a.intermediate) = (3, 360);
        }
        let e = check_tp(&cfg, 2).unwrap_err().to_string();
        assert!(e.contains("tp=2") && e.contains("among 1, 3, 6"), "{e}");
    }

    #[test]
    fn configs_beyond_reason_are_refused() {
        let ok = GptConfig { n_layer: 2, n_head: 2, n_embd: 8, vocab_size: 10, block_size: 4, arch: Arch::Gpt2 };
        assert!(ok.validate().is_ok());
        let edge = GptConfig { vocab_size: MAX_DIM, ..ok };
        assert!(edge.validate().is_ok(), "a dimension at the bound is allowed");
        for bad in [
            GptConfig { n_layer: 0, ..ok },
            GptConfig { n_head: 3, ..ok },
            GptConfig { vocab_size: MAX_DIM + 1, ..ok },
            GptConfig { block_size: MAX_DIM + 1, ..ok },
            GptConfig { n_layer: 1 << 20, n_embd: 4096, n_head: 32, ..ok },
        ] {
            assert!(bad.validate().is_err(), "{bad:?} accepted");
        }
        let at = GptConfig { n_layer: 1, n_head: 1, n_embd: 1, vocab_size: 1, block_size: 1, arch: Arch::Gpt2 };
        // (vocab 1 + positions 1)·1 + one block of 12·1² + 13·1 + ln_f 2
        assert_eq!(at.num_params(), 2 + 25 + 2);
    }
}
