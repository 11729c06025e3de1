//! GPT-2: token + position embedding, pre-LayerNorm blocks, final LayerNorm, LM head tied to
//! the token embedding. Parameter names follow Hugging Face's GPT-2 (`h.0.attn.c_attn.weight`).

use super::block::{Block, BlockStash, Scratch};
pub use super::config::{check_tp, GptConfig, MAX_DIM, MAX_PARAMS, PRESETS};
use super::units::{UnitStore, Whole};
use crate::error::{Error, Result};
use crate::nn::{ensure, LayerNorm, LnStash};
use crate::parallel::tensor::{vocab, Tp, VocabShard};
use crate::params::{Init, ParamLayout, Split, View};
use crate::tensor::loss::{cross_entropy_backward, IGNORE};
use crate::tensor::matmul;

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
