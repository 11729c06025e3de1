//! GPT-2: token + position embedding, pre-LayerNorm blocks, final LayerNorm, LM head tied to
//! the token embedding. Parameter names follow Hugging Face's GPT-2 (`h.0.attn.c_attn.weight`).

use super::units::{UnitStore, Whole};
use crate::error::{Error, Result};
use crate::nn::{ensure, AttnStash, CausalSelfAttention, LayerNorm, LnStash, Mlp, MlpStash};
use crate::parallel::tensor::{vocab, Tp, VocabShard};
use crate::params::{Init, ParamLayout, Split, View};
use crate::tensor::elementwise::residual_bias_forward;
use crate::tensor::loss::{cross_entropy_backward, IGNORE};
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

/// Refuses a tensor-parallel degree that does not divide the attention heads.
pub fn check_tp(cfg: &GptConfig, tp: usize) -> Result<()> {
    if tp == 0 || !cfg.n_head.is_multiple_of(tp) {
        let fits: Vec<String> =
            (1..=cfg.n_head).filter(|d| cfg.n_head.is_multiple_of(*d)).map(|d| d.to_string()).collect();
        return Err(Error::Config(format!(
            "tp={tp} does not divide the model's {} attention heads; use tp among {} (or a model with more heads)",
            cfg.n_head,
            fits.join(", ")
        )));
    }
    Ok(())
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

/// Scratch reused across blocks and steps. Residual-stream buffers hold this rank's rows
/// (all of them, or a block under sequence parallelism); `full`/`hfull`/`dfull` all rows.
#[derive(Default)]
struct Scratch {
    /// A layer input gathered across the group (forward), and again in backward.
    full: Vec<f32>,
    hfull: Vec<f32>,
    /// A row-parallel layer's partial output, and its sum on this rank's rows.
    part: Vec<f32>,
    rows: Vec<f32>,
    dresid: Vec<f32>,
    dln: Vec<f32>,
    /// A column-parallel layer's partial input gradient (all rows).
    dpart: Vec<f32>,
    /// An output gradient gathered across the group.
    dfull: Vec<f32>,
    dh: Vec<f32>,
    datt: Vec<f32>,
    dqkv: Vec<f32>,
}

impl Block {
    fn new(layout: &mut ParamLayout, i: usize, cfg: &GptConfig, tp: usize) -> Block {
        let c = cfg.n_embd;
        let std = 0.02;
        // GPT-2 scales the projections into the residual stream by 1/sqrt(2·n_layer).
        let proj_std = 0.02 / (2.0 * cfg.n_layer as f32).sqrt();
        Block {
            ln_1: LayerNorm::new(layout, &format!("h.{i}.ln_1"), c),
            attn: CausalSelfAttention::new(layout, &format!("h.{i}.attn"), c, cfg.n_head, tp, std, proj_std),
            ln_2: LayerNorm::new(layout, &format!("h.{i}.ln_2"), c),
            mlp: Mlp::new(layout, &format!("h.{i}.mlp"), c, tp, std, proj_std),
        }
    }

    /// `out = x2 + mlp(ln_2(x2))` with `x2 = x + attn(ln_1(x))`, on this rank's rows: two
    /// collectives forward (`g` after each row-parallel layer; under sp also two gathers).
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        tp: &Tp,
        p: &[f32],
        x: &[f32],
        (b, t): (usize, usize),
        st: &mut BlockStash,
        out: &mut [f32],
        sc: &mut Scratch,
    ) -> Result<()> {
        let Scratch { full, part, rows, .. } = sc;
        ensure(&mut st.x2, x.len());
        self.ln_1.forward(p, x, &mut st.ln1);
        let h = tp.enter(&st.ln1.out, full)?;
        self.attn.forward(p, h, b, t, &mut st.attn, part);
        let y = tp.exit(part, rows)?;
        residual_bias_forward(&mut st.x2, x, y, self.attn.c_proj.bias(p));
        self.ln_2.forward(p, &st.x2, &mut st.ln2);
        let h = tp.enter(&st.ln2.out, full)?;
        self.mlp.forward(p, h, &mut st.mlp, part);
        let y = tp.exit(part, rows)?;
        residual_bias_forward(out, &st.x2, y, self.mlp.c_proj.bias(p));
        Ok(())
    }

    /// On entry `dresid` is the gradient of the block output; on return, of the block input.
    /// Two collectives backward (`f` before each column-parallel layer).
    #[allow(clippy::too_many_arguments)]
    fn backward(
        &self,
        tp: &Tp,
        p: &[f32],
        g: &mut [f32],
        x: &[f32],
        (b, t): (usize, usize),
        st: &BlockStash,
        sc: &mut Scratch,
    ) -> Result<()> {
        let Scratch { dresid, dln, dpart, dfull, hfull, dh, datt, dqkv, .. } = sc;
        // The residual add passes dresid unchanged to both branches.
        self.mlp.c_proj.bias_backward(g, dresid);
        let dy = tp.exit_backward(dresid.as_slice(), dfull)?;
        let h = tp.enter(&st.ln2.out, hfull)?;
        self.mlp.backward(p, g, h, &st.mlp, dy, dpart, dh);
        let d = tp.enter_backward(dpart.as_mut_slice(), dln)?;
        self.ln_2.backward(p, g, &st.x2, &st.ln2, d, dresid);
        self.attn.c_proj.bias_backward(g, dresid);
        let dy = tp.exit_backward(dresid.as_slice(), dfull)?;
        let h = tp.enter(&st.ln1.out, hfull)?;
        self.attn.backward(p, g, h, b, t, &st.attn, dy, dpart, datt, dqkv);
        let d = tp.enter_backward(dpart.as_mut_slice(), dln)?;
        self.ln_1.backward(p, g, x, &st.ln1, d, dresid);
        Ok(())
    }
}

/// Everything one forward pass keeps for its backward, owned by the caller (one per
/// micro-batch in flight) and reused across steps.
#[derive(Default)]
pub struct Activations {
    b: usize,
    t: usize,
    /// `resid[l]` is the input of block l; `resid[n_layer]` the input of ln_f (this rank's rows).
    resid: Vec<Vec<f32>>,
    blocks: Vec<BlockStash>,
    lnf: LnStash,
    /// Logits `[b·t, vocab rows of this rank]`; turned into their gradient in place by backward.
    pub logits: Vec<f32>,
    lse: Vec<f32>,
    losses: Vec<f32>,
    scratch: Scratch,
}

/// The one error a single worker's forward or backward cannot have: a collective failing.
const SOLO: &str = "a single worker runs no collectives, which alone can fail";

#[derive(Clone, Debug)]
pub struct Gpt {
    pub cfg: GptConfig,
    /// This rank's parameters (all of them on a single worker).
    pub layout: ParamLayout,
    /// This rank's block of the token table (the whole table on one rank), tied to the LM head.
    pub wte: View,
    pub wpe: View,
    pub blocks: Vec<Block>,
    pub ln_f: LayerNorm,
    /// Where each unit's parameters lie in the flat buffer: 0 the embedding (wte, wpe), 1…L
    /// the blocks, L + 1 the final LayerNorm. Layers address parameters from their unit's start.
    pub units: Vec<std::ops::Range<usize>>,
    /// Ranks in the tensor-parallel group this model part is cut for, and this part's rank.
    pub tp: usize,
    pub tp_rank: usize,
    pub vocab: VocabShard,
}

impl Gpt {
    pub fn new(cfg: GptConfig) -> Result<Gpt> {
        Gpt::shard(cfg, 0, 1)
    }

    /// Rank `rank`'s part of the model cut across a tensor-parallel group of `tp` ranks:
    /// attention by heads, the MLP by hidden units, the vocabulary by rows (padded to a
    /// multiple of tp). Refuses a `tp` that does not divide the heads.
    pub fn shard(cfg: GptConfig, rank: usize, tp: usize) -> Result<Gpt> {
        cfg.validate()?;
        check_tp(&cfg, tp)?;
        let mut layout = ParamLayout::default();
        let mut units = Vec::new();
        let mut unit = ParamLayout::default();
        let wte =
            unit.add_split("wte.weight", &[cfg.vocab_size, cfg.n_embd], Split::Vocab, tp, Init::Normal(0.02), true);
        let wpe = unit.add("wpe.weight", &[cfg.block_size, cfg.n_embd], Init::Normal(0.02), true);
        units.push(layout.append(&unit));
        let mut blocks = Vec::new();
        for i in 0..cfg.n_layer {
            let mut unit = ParamLayout::default();
            blocks.push(Block::new(&mut unit, i, &cfg, tp));
            units.push(layout.append(&unit));
        }
        let mut unit = ParamLayout::default();
        let ln_f = LayerNorm::new(&mut unit, "ln_f", cfg.n_embd);
        units.push(layout.append(&unit));
        Ok(Gpt {
            cfg,
            layout,
            units,
            wte,
            wpe,
            blocks,
            ln_f,
            tp,
            tp_rank: rank,
            vocab: VocabShard::of(cfg.vocab_size, rank, tp),
        })
    }

    /// This rank's parameters at initialisation: the full tensors drawn from (seed, name) and
    /// sliced, so every layout starts from the single worker's weights.
    pub fn init_params(&self, seed: u64) -> Vec<f32> {
        self.layout.init_shard(seed, self.tp_rank, self.tp)
    }

    /// Parameters on this rank.
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

    fn check_group(&self, tp: &Tp) {
        assert_eq!(tp.size(), self.tp, "the model part is cut for tp={}, run on a group of {}", self.tp, tp.size());
    }

    /// Runs the blocks and the final LayerNorm; this rank's rows of the hidden states are in
    /// `acts.lnf.out`.
    fn forward_hidden(
        &self,
        tp: &Tp,
        store: &mut dyn UnitStore,
        tokens: &[u32],
        (b, t): (usize, usize),
        acts: &mut Activations,
    ) -> Result<()> {
        self.check_group(tp);
        let (c, l) = (self.cfg.n_embd, self.cfg.n_layer);
        let rows = tp.rows(b * t).len();
        acts.b = b;
        acts.t = t;
        acts.resid.resize_with(l + 1, Vec::new);
        acts.blocks.resize_with(l, BlockStash::default);
        for r in &mut acts.resid {
            ensure(r, rows * c);
        }
        let sc = &mut acts.scratch;
        let p = store.params(0)?;
        let (wte, wpe) = (self.wte.of(p), self.wpe.of(p));
        vocab::embedding_forward(
            tp,
            &mut acts.resid[0],
            wte,
            wpe,
            tokens,
            self.vocab,
            (t, c),
            &mut sc.part,
            &mut sc.rows,
        )?;
        for (i, blk) in self.blocks.iter().enumerate() {
            let (done, rest) = acts.resid.split_at_mut(i + 1);
            let p = store.params(i + 1)?;
            blk.forward(tp, p, &done[i], (b, t), &mut acts.blocks[i], &mut rest[0], sc)?;
        }
        self.ln_f.forward(store.params(l + 1)?, &acts.resid[l], &mut acts.lnf);
        Ok(())
    }

    /// Full forward to logits `[b·t, vocab]` in `acts.logits` (single worker).
    pub fn forward(&self, p: &[f32], tokens: &[u32], b: usize, t: usize, acts: &mut Activations) {
        self.forward_tp(&Tp::SOLO, p, tokens, b, t, acts).expect(SOLO)
    }

    /// Forward as one rank of a tensor-parallel group, from the whole parameter buffer.
    pub fn forward_tp(
        &self,
        tp: &Tp,
        p: &[f32],
        tokens: &[u32],
        b: usize,
        t: usize,
        acts: &mut Activations,
    ) -> Result<()> {
        let mut ready = |_: &[f32], _: usize| {};
        let mut store = Whole { units: &self.units, params: p, grads: &mut [], ready: &mut ready };
        self.forward_units(tp, &mut store, tokens, b, t, acts)
    }

    /// Forward as one rank of a tensor-parallel group, each unit's parameters from `store`:
    /// this rank's vocabulary block of the logits, `[b·t, vocab.rows]`, in `acts.logits`.
    pub fn forward_units(
        &self,
        tp: &Tp,
        store: &mut dyn UnitStore,
        tokens: &[u32],
        b: usize,
        t: usize,
        acts: &mut Activations,
    ) -> Result<()> {
        self.forward_hidden(tp, store, tokens, (b, t), acts)?;
        let (c, v, n) = (self.cfg.n_embd, self.vocab.rows, b * t);
        ensure(&mut acts.logits, n * v);
        // LM head tied to the token embedding: logits = h·wteᵀ, on this rank's vocabulary block.
        let h = tp.enter(&acts.lnf.out, &mut acts.scratch.full)?;
        matmul(&mut acts.logits, h, self.wte.of(store.params(0)?), n, c, v, false, true, false);
        Ok(())
    }

    /// Logits of the last position of each sequence only (`[b, vocab]`), for generation on a
    /// single worker.
    pub fn forward_last(&self, p: &[f32], tokens: &[u32], b: usize, t: usize, acts: &mut Activations) -> Vec<f32> {
        let mut ready = |_: &[f32], _: usize| {};
        let mut store = Whole { units: &self.units, params: p, grads: &mut [], ready: &mut ready };
        self.forward_hidden(&Tp::SOLO, &mut store, tokens, (b, t), acts).expect(SOLO);
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
        self.loss_tp(&Tp::SOLO, targets, acts).expect(SOLO)
    }

    /// `loss` from this rank's block of the logits (every rank of the group gets the loss).
    pub fn loss_tp(&self, tp: &Tp, targets: &[i32], acts: &mut Activations) -> Result<(f64, usize)> {
        let n = targets.len();
        ensure(&mut acts.lse, n);
        ensure(&mut acts.losses, n);
        vocab::cross_entropy_forward(tp, &mut acts.losses, &mut acts.lse, &acts.logits, targets, self.vocab)?;
        let sum = acts.losses.iter().map(|&x| x as f64).sum();
        Ok((sum, targets.iter().filter(|&&x| x != IGNORE).count()))
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
        self.backward_tp(&Tp::SOLO, p, g, tokens, targets, scale, acts, &mut |_, _| {}).expect(SOLO)
    }

    /// `backward` as one rank of a tensor-parallel group, calling `ready(g, from)` each time
    /// the gradients of `g[from..]` are final (after ln_f, after each block, from the last
    /// block down, and 0 at the end), so that data-parallel buckets can be reduced while the
    /// earlier layers still run backward.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_tp(
        &self,
        tp: &Tp,
        p: &[f32],
        g: &mut [f32],
        tokens: &[u32],
        targets: &[i32],
        scale: f32,
        acts: &mut Activations,
        ready: &mut dyn FnMut(&[f32], usize),
    ) -> Result<()> {
        let mut store = Whole { units: &self.units, params: p, grads: g, ready };
        self.backward_units(tp, &mut store, tokens, targets, scale, acts)
    }

    /// Backward from the loss as one rank of a tensor-parallel group, each unit's parameters
    /// and gradient buffer from `store`, which hears when each unit's gradients are final.
    /// Under sequence parallelism the gradients of the replicated parameters are partial sums
    /// over the group (`tensor::state::sum_replicated_grads`).
    pub fn backward_units(
        &self,
        tp: &Tp,
        store: &mut dyn UnitStore,
        tokens: &[u32],
        targets: &[i32],
        scale: f32,
        acts: &mut Activations,
    ) -> Result<()> {
        self.check_group(tp);
        let (b, t) = (acts.b, acts.t);
        let (c, v, l, n) = (self.cfg.n_embd, self.vocab.rows, self.cfg.n_layer, b * t);
        cross_entropy_backward(&mut acts.logits, &acts.lse, targets, self.vocab.window(), scale);
        let sc = &mut acts.scratch;
        ensure(&mut sc.dpart, n * c);
        ensure(&mut sc.dresid, tp.rows(n).len() * c);
        // LM head: dh = dlogits·wte (this block's part, summed by f), dwte += dlogitsᵀ·h
        let h = tp.enter(&acts.lnf.out, &mut sc.hfull)?;
        let (p, g) = store.params_grads(0)?;
        matmul(&mut sc.dpart, &acts.logits, self.wte.of(p), n, v, c, false, false, false);
        matmul(self.wte.of_mut(g), &acts.logits, h, v, n, c, true, false, true);
        let d = tp.enter_backward(&mut sc.dpart, &mut sc.dln)?;
        sc.dresid.fill(0.0);
        let (p, g) = store.params_grads(l + 1)?;
        self.ln_f.backward(p, g, &acts.resid[l], &acts.lnf, d, &mut sc.dresid);
        store.grads_done(l + 1)?;
        for (i, blk) in self.blocks.iter().enumerate().rev() {
            let (p, g) = store.params_grads(i + 1)?;
            blk.backward(tp, p, g, &acts.resid[i], (b, t), &acts.blocks[i], sc)?;
            store.grads_done(i + 1)?;
        }
        let (_, g) = store.params_grads(0)?;
        let (wo, po) = (self.wte, self.wpe);
        assert_eq!(po.offset, wo.offset + wo.len, "wte and wpe are adjacent in the layout");
        let (dwte, dwpe) = g[wo.offset..po.offset + po.len].split_at_mut(wo.len);
        vocab::embedding_backward(tp, dwte, dwpe, &sc.dresid, tokens, self.vocab, (t, c), &mut sc.dfull)?;
        store.grads_done(0)
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
