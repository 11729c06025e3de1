//! A decoder's shape: the numbers every family shares and (`family`) what its family adds —
//! named presets, the bounds a config must keep, parameter and FLOP counts, the tensor-parallel
//! degrees it takes. What a family is lives in `family/`; this file asks it.

use crate::error::{Error, Result};
use crate::models::family::{self as fam, Cut, Linear, NormSpec, Qkv};
pub use crate::models::family::{BlockSpec, Family, Llama, Llama3Rope, Positions, Shape};
use serde::{Deserialize, Serialize};

/// The shape every family shares, and (`family`) what the family adds. `n_embd` is the hidden
/// size, `block_size` the longest sequence (GPT-2's position table, Llama's
/// `max_position_embeddings`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct GptConfig {
    pub n_layer: usize,
    pub n_head: usize,
    pub n_embd: usize,
    pub vocab_size: usize,
    pub block_size: usize,
    #[serde(default)]
    pub family: Family,
}

/// Bounds far beyond any model brigade trains, that keep every size computed from a config
/// (perhaps a corrupt or hostile `config.json`) clear of overflow.
pub const MAX_DIM: usize = 1 << 24;
pub const MAX_PARAMS: u128 = 1 << 40;

/// Named model sizes: each family's (`family::PRESETS`): `tiny` and `llama-tiny` for tests and
/// the built-in task, GPT-2 and the Llama family at their published shapes for benchmarks and
/// the planner.
pub const PRESETS: &[(&str, GptConfig)] = &presets();

const fn presets() -> [(&'static str, GptConfig); fam::PRESETS.len()] {
    let mut out = [("", GptConfig::new(Shape::of([0; 5]), Family::Gpt2)); fam::PRESETS.len()];
    let mut i = 0;
    while i < out.len() {
        let (name, s, f) = fam::PRESETS[i];
        out[i] = (name, GptConfig::new(s, f));
        i += 1;
    }
    out
}

impl GptConfig {
    /// A config of `family` at shape `s`.
    pub const fn new(s: Shape, family: Family) -> GptConfig {
        let Shape { n_layer, n_head, n_embd, vocab_size, block_size } = s;
        GptConfig { n_layer, n_head, n_embd, vocab_size, block_size, family }
    }

    /// The small model the tests run for `family` (`Family::ALL` lists them).
    pub fn example(family: Family, vocab: usize, context: usize) -> GptConfig {
        GptConfig::new(family.example(vocab, context), family)
    }

    pub fn preset(name: &str) -> Result<GptConfig> {
        PRESETS.iter().find(|(n, _)| *n == name).map(|(_, c)| *c).ok_or_else(|| {
            let known: Vec<&str> = PRESETS.iter().map(|(n, _)| *n).collect();
            Error::Config(format!("unknown model preset '{name}'; known presets: {}", known.join(", ")))
        })
    }

    /// The numbers every family shares.
    pub fn shape(&self) -> Shape {
        Shape::of([self.n_layer, self.n_head, self.n_embd, self.vocab_size, self.block_size])
    }

    fn ask(&self) -> &dyn fam::Describe {
        self.family.describe()
    }

    /// Key/value heads (GPT-2: one per query head).
    pub fn kv_heads(&self) -> usize {
        self.ask().kv_heads(&self.shape())
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.ask().head_dim(&self.shape())
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
        self.ask().mlp_width(&self.shape())
    }

    /// A mixture of experts' auxiliary-loss coefficients (`None`: a dense model).
    pub fn moe(&self) -> Option<fam::MoeLosses> {
        self.ask().moe_losses()
    }

    /// Experts in each mixture layer (`None`: a dense model).
    pub fn experts(&self) -> Option<usize> {
        (0..self.n_layer).find_map(|i| self.ask().experts_in(i))
    }

    /// How many blocks are mixtures of experts.
    pub fn moe_layers(&self) -> usize {
        (0..self.n_layer).filter(|&i| self.ask().experts_in(i).is_some()).count()
    }

    /// Whether the LM head is the token table.
    pub fn tied(&self) -> bool {
        self.ask().tied()
    }

    /// Block `i`'s spec: its norms, products and tensor names.
    pub fn block(&self, i: usize) -> BlockSpec {
        self.ask().block(&self.shape(), i)
    }

    /// How positions enter: a learned table or rotary frequencies.
    pub fn positions(&self) -> Positions {
        self.ask().positions(&self.shape())
    }

    /// The token table's tensor name.
    pub fn embedding_name(&self) -> &'static str {
        self.ask().embedding()
    }

    /// The final norm before the head.
    pub fn final_norm(&self) -> NormSpec {
        self.ask().final_norm()
    }

    /// An untied LM head's tensor name.
    pub fn head_name(&self) -> &'static str {
        self.ask().head_name()
    }

    /// A Hugging Face `config.json` of the model.
    pub fn hf_config(&self) -> serde_json::Value {
        self.ask().hf_config(&self.shape())
    }

    /// The model in llama.cpp's words (GGUF): architecture, hyperparameters, q/k row order.
    pub fn gguf(&self) -> fam::GgufArch {
        self.ask().gguf(&self.shape())
    }

    pub fn validate(&self) -> Result<()> {
        let mut z = vec![
            ("n_layer", self.n_layer),
            ("n_head", self.n_head),
            ("n_embd", self.n_embd),
            ("vocab_size", self.vocab_size),
            ("block_size", self.block_size),
        ];
        z.extend(self.ask().sizes());
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
        self.ask().check(&self.shape()).map_err(Error::Config)
    }

    /// The weight matrices a token passes through in one block, on average over the blocks
    /// (attention and MLP; of a mixture, the router and the k experts a token uses), counted
    /// without overflow.
    pub fn block_matrices(&self) -> u128 {
        self.active_block_matrices() / self.n_layer.max(1) as u128
    }

    /// Every block's active matrices (as `block_matrices`), summed. Dense blocks alike are
    /// counted once.
    fn active_block_matrices(&self) -> u128 {
        match self.moe() {
            None => self.n_layer as u128 * self.block(0).matrices(),
            Some(_) => (0..self.n_layer).map(|i| self.block(i).active_matrices()).sum(),
        }
    }

    /// Every parameter (embeddings, blocks — every expert of a mixture —, final norm, an
    /// untied head), counted without overflow.
    pub fn num_params(&self) -> u128 {
        let (l, c, v) = (self.n_layer as u128, self.n_embd as u128, self.vocab_size as u128);
        let positions = match self.positions() {
            Positions::Learned { .. } => self.block_size as u128 * c,
            Positions::Rotary { .. } => 0,
        };
        let heads = if self.tied() { 1 } else { 2 };
        let per = |b: BlockSpec| b.matrices() + b.vectors(self.n_embd);
        let blocks = match self.moe() {
            None => l * per(self.block(0)),
            Some(_) => (0..self.n_layer).map(|i| per(self.block(i))).sum(),
        };
        heads * v * c + positions + blocks + self.final_norm().params(self.n_embd)
    }

    /// Parameters counted by the 6·N FLOP rule: the block matrices a token passes through (a
    /// mixture's active ones) and the LM head.
    pub fn matmul_params(&self) -> usize {
        self.active_block_matrices() as usize + self.vocab_size * self.n_embd
    }

    /// Training FLOPs per token: 6·N for the matmuls plus causal attention (q·kᵀ and P·v,
    /// half of the T×T square, forward and backward), as PaLM's appendix B counts it.
    pub fn train_flops_per_token(&self, seq: usize) -> f64 {
        6.0 * self.matmul_params() as f64 + 6.0 * (self.n_layer * seq * self.q_width()) as f64
    }
}

/// Refuses a tensor-parallel degree that does not divide the attention heads, or (separate
/// key/value heads) fits neither of the two ways to place them: tp divides them (each rank
/// holds its own), or tp is a multiple of them (each is replicated on tp / kv ranks).
/// Training's rule also refuses tp with per-head q/k norms (serving takes them: `check_heads`);
/// a mixture's experts are not cut by tp (each rank of the group runs them whole).
pub fn check_tp(cfg: &GptConfig, tp: usize) -> Result<()> {
    if tp > 1 && cfg.block(0).attn.qk_norm.is_some() {
        return Err(Error::Layout(format!(
            "tp={tp} with per-head q/k norms (Qwen3): brigade's training does not sum their gradients over the heads' ranks yet; use dp, pp or ZeRO"
        )));
    }
    check_heads(cfg, tp)
}

/// `check_tp` without training's refusal of experts: the heads, key/value heads and MLP width.
pub fn check_heads(cfg: &GptConfig, tp: usize) -> Result<()> {
    let (h, kv) = (cfg.n_head, cfg.kv_heads());
    let mlp = cfg.mlp_width();
    let fits = |d: usize| {
        d > 0 && h.is_multiple_of(d) && mlp.is_multiple_of(d) && (kv.is_multiple_of(d) || d.is_multiple_of(kv))
    };
    if !fits(tp) {
        let ok: Vec<String> = (1..=h).filter(|&d| fits(d)).map(|d| d.to_string()).collect();
        let what = if matches!(cfg.block(0).attn.qkv, Qkv::Fused(_)) {
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

/// Product `l` of `block` (cut `cut`) on one rank of a tensor-parallel group of `tp`: its
/// `(d_in, d_out)` there (key/value heads counted with their copies).
pub fn local_dims(cfg: &GptConfig, block: &BlockSpec, (l, cut): (&Linear, Cut), tp: usize) -> (usize, usize) {
    match cut {
        Cut::Cols if block.is_kv(l) => (l.d_in, l.d_out * kv_copies(cfg, tp) / tp),
        Cut::Cols => (l.d_in, l.d_out / tp),
        Cut::Rows => (l.d_in / tp, l.d_out),
    }
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
            // Qwen3-0.6B and Qwen3-30B-A3B (`num_parameters()` of the Hub's models): q/k norms
            // of 128 a layer each; 128 experts of 768 in every layer of the second
            ("qwen3-0.6b", 596_049_920),
            ("qwen3-30b-a3b", 30_532_122_624),
            // OLMoE-1B-7B: 64 experts of 1024 in each of 16 layers, q/k norms of 2048 each
            ("olmoe-1b-7b", 6_919_161_856),
        ] {
            assert_eq!(GptConfig::preset(name).unwrap().num_params(), want, "{name}");
        }
        for f in Family::ALL {
            let tiny = GptConfig::preset(f.tiny_preset()).unwrap();
            assert_eq!(Gpt::new(tiny).unwrap().num_params() as u128, tiny.num_params(), "{}", f.name());
        }
    }

    /// Every family: each preset written as a Hugging Face `config.json` reads back as itself.
    #[test]
    fn every_preset_round_trips_through_its_hf_config() {
        let path = std::path::Path::new("config.json");
        for (name, cfg) in PRESETS {
            let text = cfg.hf_config().to_string();
            let back = crate::models::checkpoint::parse_model_config(&text, path).unwrap();
            assert_eq!(back, *cfg, "{name}");
        }
        for f in Family::ALL {
            assert!(PRESETS.iter().any(|(_, c)| c.family.name() == f.name()), "{} has presets", f.name());
        }
    }

    /// Every family: the tensors a model holds are exactly those its description names (the
    /// names serving and checkpoints read), in the description's order, with its widths.
    #[test]
    fn every_familys_tensors_are_the_ones_its_description_names() {
        for f in Family::ALL {
            let cfg = GptConfig::example(f, 97, 32);
            let gpt = Gpt::new(cfg).unwrap();
            let mut want: Vec<(String, Vec<usize>)> = vec![(cfg.embedding_name().into(), vec![97, cfg.n_embd])];
            if let Positions::Learned { name } = cfg.positions() {
                want.push((name, vec![32, cfg.n_embd]));
            }
            let norm = |n: &NormSpec, want: &mut Vec<(String, Vec<usize>)>| {
                want.push((format!("{}.weight", n.name), vec![cfg.n_embd]));
                if let crate::models::family::NormKind::Layer { .. } = n.kind {
                    want.push((format!("{}.bias", n.name), vec![cfg.n_embd]));
                }
            };
            for i in 0..cfg.n_layer {
                let b = cfg.block(i);
                let lin = |(l, _): (&Linear, Cut), want: &mut Vec<(String, Vec<usize>)>| {
                    let shape = match l.orient {
                        crate::models::family::Orient::InOut => vec![l.d_in, l.d_out],
                        crate::models::family::Orient::OutIn => vec![l.d_out, l.d_in],
                    };
                    want.push((l.weight(), shape));
                    if l.bias {
                        want.push((l.bias_name(), vec![l.d_out]));
                    }
                };
                norm(&b.ln_1, &mut want);
                let ls = b.linears();
                let attn_end = ls.iter().position(|(l, _)| *l == &b.attn.o).unwrap() + 1;
                ls[..attn_end].iter().for_each(|&x| lin(x, &mut want));
                norm(&b.ln_2, &mut want);
                ls[attn_end..].iter().for_each(|&x| lin(x, &mut want));
            }
            norm(&cfg.final_norm(), &mut want);
            if !cfg.tied() {
                want.push((cfg.head_name().into(), vec![97, cfg.n_embd]));
            }
            let got: Vec<(String, Vec<usize>)> =
                gpt.layout.specs.iter().map(|s| (s.name.clone(), s.shape.clone())).collect();
            assert_eq!(got, want, "{}", f.name());
        }
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
        let more = crate::models::family::Overrides { reshaped: false, n_kv_head: Some(3), intermediate: Some(360) };
        cfg.family.reshape(&cfg.shape(), more, "llama-tiny").unwrap();
        let e = check_tp(&cfg, 2).unwrap_err().to_string();
        assert!(e.contains("tp=2") && e.contains("among 1, 3, 6"), "{e}");
    }

    #[test]
    fn configs_beyond_reason_are_refused() {
        let ok = GptConfig { n_layer: 2, n_head: 2, n_embd: 8, vocab_size: 10, block_size: 4, family: Family::Gpt2 };
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
        let at = GptConfig { n_layer: 1, n_head: 1, n_embd: 1, vocab_size: 1, block_size: 1, family: Family::Gpt2 };
        // (vocab 1 + positions 1)·1 + one block of 12·1² + 13·1 + ln_f 2
        assert_eq!(at.num_params(), 2 + 25 + 2);
    }
}
