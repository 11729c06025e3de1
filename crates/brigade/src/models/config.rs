//! GPT-2's shape: named presets, the bounds a config must keep, parameter and FLOP counts.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GptConfig {
    pub n_layer: usize,
    pub n_head: usize,
    pub n_embd: usize,
    pub vocab_size: usize,
    pub block_size: usize,
}

/// Bounds far beyond any model brigade trains, that keep every size computed from a config
/// (perhaps a corrupt or hostile `config.json`) clear of overflow.
pub const MAX_DIM: usize = 1 << 24;
pub const MAX_PARAMS: u128 = 1 << 36;

/// Named model sizes: `tiny` for tests and the built-in task, the GPT-2 family for benchmarks.
pub const PRESETS: &[(&str, GptConfig)] = &[
    ("tiny", GptConfig { n_layer: 2, n_head: 4, n_embd: 128, vocab_size: 256, block_size: 64 }),
    ("gpt2-small", GptConfig { n_layer: 12, n_head: 12, n_embd: 768, vocab_size: 50257, block_size: 1024 }),
    ("gpt2-medium", GptConfig { n_layer: 24, n_head: 16, n_embd: 1024, vocab_size: 50257, block_size: 1024 }),
    ("gpt2-large", GptConfig { n_layer: 36, n_head: 20, n_embd: 1280, vocab_size: 50257, block_size: 1024 }),
    ("gpt2-xl", GptConfig { n_layer: 48, n_head: 25, n_embd: 1600, vocab_size: 50257, block_size: 1024 }),
];

impl GptConfig {
    pub fn preset(name: &str) -> Result<GptConfig> {
        PRESETS.iter().find(|(n, _)| *n == name).map(|(_, c)| *c).ok_or_else(|| {
            let known: Vec<&str> = PRESETS.iter().map(|(n, _)| *n).collect();
            Error::Config(format!("unknown model preset '{name}'; known presets: {}", known.join(", ")))
        })
    }

    pub fn validate(&self) -> Result<()> {
        let z = [
            ("n_layer", self.n_layer),
            ("n_head", self.n_head),
            ("n_embd", self.n_embd),
            ("vocab_size", self.vocab_size),
            ("block_size", self.block_size),
        ];
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
        if !self.n_embd.is_multiple_of(self.n_head) {
            return Err(Error::Config(format!(
                "n_embd ({}) must be divisible by n_head ({}); pick n_head among the divisors of n_embd",
                self.n_embd, self.n_head
            )));
        }
        Ok(())
    }

    /// Every parameter (embeddings, blocks, final LayerNorm), counted without overflow.
    pub fn num_params(&self) -> u128 {
        let (l, c) = (self.n_layer as u128, self.n_embd as u128);
        (self.vocab_size as u128 + self.block_size as u128) * c + l * (12 * c * c + 13 * c) + 2 * c
    }

    /// Parameters counted by the 6·N FLOP rule: the block matrices and the (tied) LM head.
    pub fn matmul_params(&self) -> usize {
        self.n_layer * 12 * self.n_embd * self.n_embd + self.vocab_size * self.n_embd
    }

    /// Training FLOPs per token: 6·N for the matmuls plus causal attention (q·kᵀ and P·v,
    /// half of the T×T square, forward and backward), as PaLM's appendix B counts it.
    pub fn train_flops_per_token(&self, seq: usize) -> f64 {
        6.0 * self.matmul_params() as f64 + 6.0 * (self.n_layer * seq * self.n_embd) as f64
    }
}

/// Refuses a tensor-parallel degree that does not divide the attention heads.
pub fn check_tp(cfg: &GptConfig, tp: usize) -> Result<()> {
    if tp == 0 || !cfg.n_head.is_multiple_of(tp) {
        let fits: Vec<String> =
            (1..=cfg.n_head).filter(|d| cfg.n_head.is_multiple_of(*d)).map(|d| d.to_string()).collect();
        return Err(Error::Layout(format!(
            "tp={tp} does not divide the model's {} attention heads; use tp among {} (or a model with more heads)",
            cfg.n_head,
            fits.join(", ")
        )));
    }
    Ok(())
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
    fn configs_beyond_reason_are_refused() {
        let ok = GptConfig { n_layer: 2, n_head: 2, n_embd: 8, vocab_size: 10, block_size: 4 };
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
        let at = GptConfig { n_layer: 1, n_head: 1, n_embd: 1, vocab_size: 1, block_size: 1 };
        // (vocab 1 + positions 1)·1 + one block of 12·1² + 13·1 + ln_f 2
        assert_eq!(at.num_params(), 2 + 25 + 2);
    }
}
