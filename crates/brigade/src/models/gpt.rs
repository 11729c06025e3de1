//! GPT-2: token + position embedding, pre-LayerNorm blocks, final LayerNorm, LM head tied to
//! the token embedding. Parameter names follow Hugging Face's GPT-2 (`h.0.attn.c_attn.weight`).

use crate::error::{Error, Result};
use crate::nn::{ensure, AttnStash, CausalSelfAttention, LayerNorm, LnStash, Mlp, MlpStash};
use crate::params::{Init, ParamLayout, View};
use crate::tensor::elementwise::residual_forward;
use crate::tensor::embedding::{embedding_backward, embedding_forward};
use crate::tensor::loss::{cross_entropy_backward, cross_entropy_forward, IGNORE};
use crate::tensor::matmul;
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

#[derive(Clone, Debug)]
pub struct Block {
    pub ln_1: LayerNorm,
    pub attn: CausalSelfAttention,
    pub ln_2: LayerNorm,
    pub mlp: Mlp,
}

#[derive(Default)]
pub struct BlockStash {
    ln1: LnStash,
    attn: AttnStash,
    /// The residual stream after attention (input of ln_2).
    x2: Vec<f32>,
    ln2: LnStash,
    mlp: MlpStash,
}

/// Scratch for backward: activation gradients, reused across blocks and steps.
#[derive(Default)]
struct Scratch {
    dresid: Vec<f32>,
    dln: Vec<f32>,
    dh: Vec<f32>,
    datt: Vec<f32>,
    dqkv: Vec<f32>,
    tmp: Vec<f32>,
}

impl Block {
    /// Where the block's parameters start in the flat buffer (they are contiguous).
    pub fn first_offset(&self) -> usize {
        self.ln_1.w.offset
    }

    fn new(layout: &mut ParamLayout, i: usize, cfg: &GptConfig) -> Block {
        let c = cfg.n_embd;
        let std = 0.02;
        // GPT-2 scales the projections into the residual stream by 1/sqrt(2·n_layer).
        let proj_std = 0.02 / (2.0 * cfg.n_layer as f32).sqrt();
        Block {
            ln_1: LayerNorm::new(layout, &format!("h.{i}.ln_1"), c),
            attn: CausalSelfAttention::new(layout, &format!("h.{i}.attn"), c, cfg.n_head, std, proj_std),
            ln_2: LayerNorm::new(layout, &format!("h.{i}.ln_2"), c),
            mlp: Mlp::new(layout, &format!("h.{i}.mlp"), c, std, proj_std),
        }
    }

    /// `out = x2 + mlp(ln_2(x2))` with `x2 = x + attn(ln_1(x))`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        p: &[f32],
        x: &[f32],
        b: usize,
        t: usize,
        st: &mut BlockStash,
        out: &mut [f32],
        tmp: &mut Vec<f32>,
    ) {
        ensure(tmp, x.len());
        ensure(&mut st.x2, x.len());
        self.ln_1.forward(p, x, &mut st.ln1);
        self.attn.forward(p, &st.ln1.out, b, t, &mut st.attn, tmp);
        residual_forward(&mut st.x2, x, tmp);
        self.ln_2.forward(p, &st.x2, &mut st.ln2);
        self.mlp.forward(p, &st.ln2.out, &mut st.mlp, tmp);
        residual_forward(out, &st.x2, tmp);
    }

    /// On entry `dresid` is the gradient of the block output; on return, of the block input.
    #[allow(clippy::too_many_arguments)]
    fn backward(&self, p: &[f32], g: &mut [f32], x: &[f32], b: usize, t: usize, st: &BlockStash, sc: &mut Scratch) {
        let Scratch { dresid, dln, dh, datt, dqkv, .. } = sc;
        ensure(dln, x.len());
        // The residual add passes dresid unchanged to both branches.
        self.mlp.backward(p, g, &st.ln2.out, &st.mlp, dresid, dln, dh);
        self.ln_2.backward(p, g, &st.x2, &st.ln2, dln, dresid);
        self.attn.backward(p, g, &st.ln1.out, b, t, &st.attn, dresid, dln, datt, dqkv);
        self.ln_1.backward(p, g, x, &st.ln1, dln, dresid);
    }
}

/// Everything one forward pass keeps for its backward, owned by the caller (one per
/// micro-batch in flight) and reused across steps.
#[derive(Default)]
pub struct Activations {
    b: usize,
    t: usize,
    /// `resid[l]` is the input of block l; `resid[n_layer]` the input of ln_f.
    resid: Vec<Vec<f32>>,
    blocks: Vec<BlockStash>,
    lnf: LnStash,
    /// Logits `[b·t, vocab]`; turned into their gradient in place by backward.
    pub logits: Vec<f32>,
    lse: Vec<f32>,
    losses: Vec<f32>,
    scratch: Scratch,
}

#[derive(Clone, Debug)]
pub struct Gpt {
    pub cfg: GptConfig,
    pub layout: ParamLayout,
    pub wte: View,
    pub wpe: View,
    pub blocks: Vec<Block>,
    pub ln_f: LayerNorm,
}

impl Gpt {
    pub fn new(cfg: GptConfig) -> Result<Gpt> {
        cfg.validate()?;
        let mut layout = ParamLayout::default();
        let wte = layout.add("wte.weight", &[cfg.vocab_size, cfg.n_embd], Init::Normal(0.02), true);
        let wpe = layout.add("wpe.weight", &[cfg.block_size, cfg.n_embd], Init::Normal(0.02), true);
        let blocks = (0..cfg.n_layer).map(|i| Block::new(&mut layout, i, &cfg)).collect();
        let ln_f = LayerNorm::new(&mut layout, "ln_f", cfg.n_embd);
        Ok(Gpt { cfg, layout, wte, wpe, blocks, ln_f })
    }

    pub fn num_params(&self) -> usize {
        self.layout.total
    }

    /// Checks what a user can get wrong: sequence length and token ids.
    pub fn check_input(&self, tokens: &[u32], b: usize, t: usize) -> Result<()> {
        if t == 0 || t > self.cfg.block_size {
            return Err(Error::Train(format!(
                "sequence length {t} must be between 1 and the model's block_size {}",
                self.cfg.block_size
            )));
        }
        if tokens.len() != b * t {
            return Err(Error::Train(format!("expected {b}×{t} tokens, got {}", tokens.len())));
        }
        if let Some(&bad) = tokens.iter().find(|&&x| x as usize >= self.cfg.vocab_size) {
            return Err(Error::Data(format!(
                "token id {bad} is outside the model's vocabulary of {}; use a larger vocab_size or the matching tokenizer",
                self.cfg.vocab_size
            )));
        }
        Ok(())
    }

    /// Runs the blocks and the final LayerNorm; the hidden states are in `acts.lnf.out`.
    fn forward_hidden(&self, p: &[f32], tokens: &[u32], b: usize, t: usize, acts: &mut Activations) {
        let (c, l) = (self.cfg.n_embd, self.cfg.n_layer);
        let n = b * t;
        acts.b = b;
        acts.t = t;
        acts.resid.resize_with(l + 1, Vec::new);
        acts.blocks.resize_with(l, BlockStash::default);
        for r in &mut acts.resid {
            ensure(r, n * c);
        }
        embedding_forward(&mut acts.resid[0], self.wte.of(p), self.wpe.of(p), tokens, t, c);
        for (i, blk) in self.blocks.iter().enumerate() {
            let (done, rest) = acts.resid.split_at_mut(i + 1);
            blk.forward(p, &done[i], b, t, &mut acts.blocks[i], &mut rest[0], &mut acts.scratch.tmp);
        }
        self.ln_f.forward(p, &acts.resid[l], &mut acts.lnf);
    }

    /// Full forward to logits `[b·t, vocab]` in `acts.logits`.
    pub fn forward(&self, p: &[f32], tokens: &[u32], b: usize, t: usize, acts: &mut Activations) {
        self.forward_hidden(p, tokens, b, t, acts);
        let (c, v, n) = (self.cfg.n_embd, self.cfg.vocab_size, b * t);
        ensure(&mut acts.logits, n * v);
        // LM head tied to the token embedding: logits = h·wteᵀ.
        matmul(&mut acts.logits, &acts.lnf.out, self.wte.of(p), n, c, v, false, true, false);
    }

    /// Logits of the last position of each sequence only (`[b, vocab]`), for generation.
    pub fn forward_last(&self, p: &[f32], tokens: &[u32], b: usize, t: usize, acts: &mut Activations) -> Vec<f32> {
        self.forward_hidden(p, tokens, b, t, acts);
        let (c, v) = (self.cfg.n_embd, self.cfg.vocab_size);
        let mut h = Vec::with_capacity(b * c);
        for i in 0..b {
            h.extend_from_slice(&acts.lnf.out[((i + 1) * t - 1) * c..][..c]);
        }
        let mut out = vec![0f32; b * v];
        matmul(&mut out, &h, self.wte.of(p), b, c, v, false, true, false);
        out
    }

    /// Mean cross-entropy over targets that are not `IGNORE`, after `forward`.
    /// Returns (sum of token losses in f64, number of counted tokens).
    pub fn loss(&self, targets: &[i32], acts: &mut Activations) -> (f64, usize) {
        let n = targets.len();
        ensure(&mut acts.lse, n);
        ensure(&mut acts.losses, n);
        cross_entropy_forward(&mut acts.losses, &mut acts.lse, &acts.logits, targets, self.cfg.vocab_size);
        let sum = acts.losses.iter().map(|&x| x as f64).sum();
        (sum, targets.iter().filter(|&&x| x != IGNORE).count())
    }

    /// Backward from the loss, accumulating into `g`. `scale` is 1 / (counted tokens of the
    /// whole global batch), so that micro-batches sum to the gradient of the batch mean.
    pub fn backward(
        &self,
        p: &[f32],
        g: &mut [f32],
        tokens: &[u32],
        targets: &[i32],
        scale: f32,
        acts: &mut Activations,
    ) {
        self.backward_with(p, g, tokens, targets, scale, acts, &mut |_, _| {})
    }

    /// `backward`, calling `ready(g, from)` each time the gradients of `g[from..]` are final
    /// (after ln_f, after each block, from the last block down, and 0 at the end), so that
    /// data-parallel buckets can be reduced while the earlier layers still run backward.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_with(
        &self,
        p: &[f32],
        g: &mut [f32],
        tokens: &[u32],
        targets: &[i32],
        scale: f32,
        acts: &mut Activations,
        ready: &mut dyn FnMut(&[f32], usize),
    ) {
        let (b, t) = (acts.b, acts.t);
        let (c, v, l, n) = (self.cfg.n_embd, self.cfg.vocab_size, self.cfg.n_layer, b * t);
        cross_entropy_backward(&mut acts.logits, &acts.lse, targets, v, scale);
        let sc = &mut acts.scratch;
        ensure(&mut sc.dln, n * c);
        ensure(&mut sc.dresid, n * c);
        // LM head: dh = dlogits·wte, dwte += dlogitsᵀ·h
        matmul(&mut sc.dln, &acts.logits, self.wte.of(p), n, v, c, false, false, false);
        matmul(self.wte.of_mut(g), &acts.logits, &acts.lnf.out, v, n, c, true, false, true);
        sc.dresid.fill(0.0);
        self.ln_f.backward(p, g, &acts.resid[l], &acts.lnf, &sc.dln, &mut sc.dresid);
        ready(g, self.ln_f.w.offset.min(self.ln_f.b.offset));
        for (i, blk) in self.blocks.iter().enumerate().rev() {
            blk.backward(p, g, &acts.resid[i], b, t, &acts.blocks[i], sc);
            ready(g, blk.first_offset());
        }
        let (wo, po) = (self.wte, self.wpe);
        assert_eq!(po.offset, wo.offset + wo.len, "wte and wpe are adjacent in the layout");
        let (dwte, dwpe) = g[wo.offset..po.offset + po.len].split_at_mut(wo.len);
        embedding_backward(dwte, dwpe, &sc.dresid, tokens, t, c);
        ready(g, 0);
    }

    /// Forward, loss and backward of one micro-batch; returns (loss sum, counted tokens).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_backward(
        &self,
        p: &[f32],
        g: &mut [f32],
        tokens: &[u32],
        targets: &[i32],
        b: usize,
        t: usize,
        scale: f32,
        acts: &mut Activations,
    ) -> (f64, usize) {
        self.forward(p, tokens, b, t, acts);
        let out = self.loss(targets, acts);
        self.backward(p, g, tokens, targets, scale, acts);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn inputs_are_checked() {
        let m = Gpt::new(GptConfig { n_layer: 1, n_head: 2, n_embd: 8, vocab_size: 10, block_size: 4 }).unwrap();
        assert!(m.check_input(&[1, 2, 3, 4], 1, 4).is_ok());
        assert!(m.check_input(&[], 1, 0).is_err(), "empty sequence");
        assert!(m.check_input(&[1; 5], 1, 5).is_err(), "longer than block_size");
        assert!(m.check_input(&[1, 2, 3], 1, 4).is_err(), "wrong token count");
        let e = m.check_input(&[1, 2, 10, 3], 1, 4).unwrap_err().to_string();
        assert!(e.contains("token id 10 is outside the model's vocabulary of 10"), "{e}");
    }
}
