//! The models the serving tests run: one of each family, with weights larger than the
//! init's so that logits are far from uniform and ties are rare.
#![allow(dead_code)]

use brigade::models::arch::{Arch, Llama, Llama3Rope};
use brigade::models::{Gpt, GptConfig};
use std::path::{Path, PathBuf};

/// The families the engine serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// 4 heads of 16.
    Gpt2,
    /// GQA 8:2 with head width 8, q/k/v and output biases, Llama 3 rope scaling over 32
    /// original positions, an untied head: every part of the family.
    Llama,
}

pub const FAMILIES: [Family; 2] = [Family::Gpt2, Family::Llama];

pub fn config(f: Family, vocab: usize, context: usize) -> GptConfig {
    let mut cfg =
        GptConfig { n_layer: 2, n_head: 4, n_embd: 64, vocab_size: vocab, block_size: context, arch: Arch::Gpt2 };
    if f == Family::Llama {
        cfg.n_head = 8;
        let rope = Llama3Rope {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 32,
        };
        cfg.arch = Arch::Llama(Llama {
            n_kv_head: 2,
            head_dim: 8,
            intermediate: 96,
            rms_eps: 1e-5,
            rope_theta: 500_000.0,
            rope_scaling: Some(rope),
            tied: false,
            qkv_bias: true,
            o_bias: true,
        });
    }
    cfg
}

/// A model of family `f` and its parameters (drawn from `seed`, scaled by 4).
pub fn model(f: Family, vocab: usize, context: usize, seed: u64) -> (Gpt, Vec<f32>) {
    let gpt = Gpt::new(config(f, vocab, context)).unwrap();
    let mut p = gpt.init_params(seed);
    p.iter_mut().for_each(|v| *v *= 4.0);
    (gpt, p)
}

/// `../shared/REL` (beside the checkout), or `None` with a printed reason when it is absent;
/// under `BRIGADE_REQUIRE_SHARED` (CI) its absence fails the test instead.
pub fn shared(rel: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared").join(rel);
    if p.exists() {
        return Some(p);
    }
    assert!(
        std::env::var_os("BRIGADE_REQUIRE_SHARED").is_none(),
        "{} not found and BRIGADE_REQUIRE_SHARED is set",
        p.display()
    );
    eprintln!("skipping: {} is absent", p.display());
    None
}
