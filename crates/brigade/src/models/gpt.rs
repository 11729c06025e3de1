//! Training's decoder, for every family, built from its description (`family/`): the token
//! embedding (plus a learned position table, or rotary positions inside attention), the
//! pre-norm blocks, the final norm, an LM head tied to the token table or its own. Parameter
//! names are the family's Hugging Face names (`h.0.attn.c_attn.weight`,
//! `model.layers.0.self_attn.q_proj.weight`).

use super::block::{Block, BlockStash, Halves, Scratch};
pub use super::config::{check_tp, GptConfig, MAX_DIM, MAX_PARAMS, PRESETS};
use super::family::{NormKind, Positions};
pub use super::pass::{Input, Output, Pass};
use super::units::Whole;
use crate::error::{Error, Result};
use crate::nn::moe::{AuxLosses, AuxWeights};
use crate::nn::tp::{vocab, Tp, VocabShard};
use crate::nn::{ensure, Grads, LayerNorm, LnStash, Norm, RmsNorm, WeightGrads};
use crate::params::{Init, ParamLayout, Split, View};
use crate::tensor::docs::Docs;
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
    /// The rows' positions in their packed documents, as the forward ran (none: one document
    /// a sequence).
    docs: Option<Vec<u32>>,
    scratch: Scratch,
}

impl Activations {
    /// A stage's output rows, after its forward (the next stage's input).
    pub fn output(&self) -> &[f32] {
        self.resid.last().expect("after a forward")
    }

    /// Selective recompute (Korthikanti et al. 2022): forwards keep no attention scores, and
    /// backwards compute them again.
    pub fn set_selective(&mut self, on: bool) {
        self.scratch.drop_scores = on;
    }

    /// Bytes held for the backward (not the scratch space every pass reuses).
    pub fn bytes(&self) -> usize {
        let rows: usize = self.resid.iter().map(Vec::len).sum();
        let lnf = self.lnf.out.len() + self.lnf.mean.len() + self.lnf.rstd.len();
        let tail = self.logits.len() + self.lse.len() + self.losses.len();
        4 * (rows + lnf + tail) + self.blocks.iter().map(BlockStash::bytes).sum::<usize>()
    }

    /// The gradient of a stage's input rows, after its backward (the previous stage's).
    pub fn input_grad(&self) -> &[f32] {
        &self.scratch.dresid
    }
}

/// The slots of `cfg` a pipeline may be cut between: the embedding, each block's attention and
/// MLP halves, the head (`Gpt::holds`).
pub fn slots(cfg: &GptConfig) -> usize {
    2 * cfg.n_layer + 2
}

/// The whole model's index of the first block (whole or half) of a part holding `slots`: block
/// i's halves are slots 2i + 1 and 2i + 2.
fn first_block(slots: &std::ops::Range<usize>) -> usize {
    slots.start.saturating_sub(1) / 2
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
    pub ln_f: Norm,
    /// The LM head's matrix `[vocab rows, C]`: the token table (tied; in `table_unit`) or
    /// `lm_head.weight` (untied; in the final unit), in unit `head_unit`.
    pub head: View,
    pub head_unit: usize,
    /// Where each unit's parameters lie in the flat buffer: the embedding (wte, wpe) if held,
    /// each held block (whole, or the half a stage cut inside it holds), the final LayerNorm if
    /// held. Layers address parameters from their unit's start.
    pub units: Vec<std::ops::Range<usize>>,
    /// Which slots of the whole model this part holds (a pipeline stage; all of them when
    /// there is no pipeline; `slots`: 0 the embedding, 2i + 1 and 2i + 2 block i's attention
    /// and MLP halves, 2L + 1 the head): whether it embeds the tokens and whether it ends in
    /// the final LayerNorm, LM head and loss. The last stage without the embedding holds its
    /// own copy of the tied token table in its final unit.
    pub holds: std::ops::Range<usize>,
    pub has_embedding: bool,
    pub has_head: bool,
    /// The local unit whose parameters hold the token table `wte` (and, with the embedding,
    /// `wpe`).
    pub table_unit: usize,
    /// Ranks in the tensor-parallel group this model part is cut for, and this part's rank.
    pub tp: usize,
    pub tp_rank: usize,
    pub vocab: VocabShard,
    /// The sequences a mixture's auxiliary losses are averaged over: the global batch's, set
    /// by the trainer so that every micro-batch and rank weighs its sequences alike (0: those
    /// of each backward).
    pub moe_sequences: usize,
}

impl Gpt {
    pub fn new(cfg: GptConfig) -> Result<Gpt> {
        Gpt::shard(cfg, 0, 1)
    }

    /// Rank `rank`'s part of the model cut across a tensor-parallel group of `tp` ranks:
    /// attention by heads, the MLP by hidden units, the vocabulary by rows (padded to a
    /// multiple of tp). Refuses a `tp` that does not divide the heads.
    pub fn shard(cfg: GptConfig, rank: usize, tp: usize) -> Result<Gpt> {
        Gpt::part(cfg, rank, tp, 0..cfg.n_layer + 2)
    }

    /// The units `holds` of the whole model (0 the embedding, 1…L the blocks, L + 1 the final
    /// LayerNorm with the LM head), as a pipeline stage holds them, cut for tensor-parallel
    /// rank `rank` of `tp`.
    pub fn part(cfg: GptConfig, rank: usize, tp: usize, holds: std::ops::Range<usize>) -> Result<Gpt> {
        Gpt::part_of(cfg, (rank, tp), holds, (0, 1))
    }

    /// `part`, a mixture's routed experts divided over an expert group: rank `q` of `ep` holds
    /// experts `q·E/ep .. (q+1)·E/ep` of each mixture layer (`(0, 1)`: all of them).
    pub fn part_of(
        cfg: GptConfig,
        tp: (usize, usize),
        holds: std::ops::Range<usize>,
        experts: (usize, usize),
    ) -> Result<Gpt> {
        let last = cfg.n_layer + 1;
        if holds.is_empty() || holds.end > last + 1 {
            return Err(Error::Layout(format!("units {holds:?} of a model with units 0..={last}")));
        }
        let slot = |u: usize| (2 * u).saturating_sub(1).min(slots(&cfg));
        Gpt::part_at(cfg, tp, slot(holds.start)..slot(holds.end), experts)
    }

    /// `part_of` by slots (`slots`), so that a pipeline stage may begin or end between a
    /// block's attention and MLP halves.
    pub fn part_at(
        cfg: GptConfig,
        (rank, tp): (usize, usize),
        holds: std::ops::Range<usize>,
        (q, ep): (usize, usize),
    ) -> Result<Gpt> {
        cfg.validate()?;
        if let Some(e) = cfg.experts().filter(|e| !e.is_multiple_of(ep)) {
            return Err(Error::Layout(format!("ep={ep} does not divide the model's {e} experts per layer")));
        }
        check_tp(&cfg, tp)?;
        let all = slots(&cfg);
        if holds.is_empty() || holds.end > all {
            return Err(Error::Layout(format!("slots {holds:?} of a model with slots 0..{all}")));
        }
        let (has_embedding, has_head) = (holds.start == 0, holds.end == all);
        let table_name = cfg.embedding_name();
        let positions = cfg.positions();
        let table = |unit: &mut ParamLayout, name: &str| {
            let shape = [cfg.vocab_size, cfg.n_embd];
            unit.add_split(name, &shape, Split::Vocab, tp, Init::Normal(0.02), true)
        };
        let mut layout = ParamLayout::default();
        let mut units = Vec::new();
        let (mut wte, mut wpe) = (View { offset: 0, len: 0 }, View { offset: 0, len: 0 });
        if has_embedding {
            let mut unit = ParamLayout::default();
            wte = table(&mut unit, table_name);
            wpe = match &positions {
                // rotary positions: no table (an empty view just after the token table)
                Positions::Rotary { .. } => View { offset: wte.offset + wte.len, len: 0 },
                Positions::Learned { name } => unit.add(name, &[cfg.block_size, cfg.n_embd], Init::Normal(0.02), true),
            };
            units.push(layout.append(&unit));
        }
        let mut blocks = Vec::new();
        for i in first_block(&holds)..cfg.n_layer {
            let halves = Halves { attn: holds.contains(&(2 * i + 1)), mlp: holds.contains(&(2 * i + 2)) };
            if !halves.attn && !halves.mlp {
                break;
            }
            let mut unit = ParamLayout::default();
            blocks.push(Block::new(&mut unit, i, &cfg, tp, (q, ep), halves));
            units.push(layout.append(&unit));
        }
        let mut unit = ParamLayout::default();
        let final_norm = cfg.final_norm();
        let ln_f = match final_norm.kind {
            NormKind::Rms { eps } => Norm::Rms(RmsNorm::new(&mut unit, &final_norm.name, cfg.n_embd, eps)),
            NormKind::Layer { .. } => Norm::Layer(LayerNorm::new(&mut unit, &final_norm.name, cfg.n_embd)),
        };
        let mut head = View { offset: 0, len: 0 };
        if has_head {
            if !cfg.tied() {
                head = table(&mut unit, cfg.head_name());
            } else if !has_embedding {
                wte = table(&mut unit, table_name);
            }
            units.push(layout.append(&unit));
        }
        let table_unit = if has_embedding { 0 } else { units.len().saturating_sub(1) };
        let head_unit = if cfg.tied() { table_unit } else { units.len().saturating_sub(1) };
        if cfg.tied() {
            head = wte;
        }
        Ok(Gpt {
            cfg,
            layout,
            units,
            wte,
            wpe,
            blocks,
            ln_f,
            head,
            head_unit,
            holds,
            has_embedding,
            has_head,
            table_unit,
            tp,
            tp_rank: rank,
            vocab: VocabShard::of(cfg.vocab_size, rank, tp),
            moe_sequences: 0,
        })
    }

    /// The weight of each sequence's auxiliary losses in each mixture layer of a backward over
    /// `b` sequences: the coefficient over (MoE layers × the batch's sequences), so that the
    /// loss is the coefficient times their mean.
    fn aux_weights(&self, b: usize) -> AuxWeights {
        let Some(c) = self.cfg.moe() else { return AuxWeights::default() };
        let seqs = if self.moe_sequences > 0 { self.moe_sequences } else { b };
        let n = (self.cfg.moe_layers() * seqs).max(1) as f32;
        AuxWeights { balance: c.balance / n, z: c.z / n }
    }

    /// This part's mixtures' auxiliary losses in the last forward, each summed over its
    /// sequences and layers (with `aux_weights`' scaling, the terms the backward adds).
    pub fn aux_losses(&self, acts: &Activations) -> AuxLosses {
        let sum =
            |a: AuxLosses, s: &BlockStash| AuxLosses { balance: a.balance + s.moe.aux.balance, z: a.z + s.moe.aux.z };
        acts.blocks.iter().fold(AuxLosses::default(), sum)
    }

    /// What this part's mixtures routed in the backwards since last asked, laid out over the
    /// whole model's layers (`[layer][rows of each expert…, balancing losses]`, zeros for the
    /// layers it does not hold or that are dense): summed over ranks, a step's expert load.
    pub fn take_moe_tally(&self) -> Vec<f64> {
        let Some(e) = self.cfg.experts() else { return Vec::new() };
        let mut out = vec![0.0; self.cfg.n_layer * (e + 1)];
        let first = first_block(&self.holds);
        for (i, blk) in self.blocks.iter().enumerate() {
            if let Some(t) = blk.take_tally() {
                out[(first + i) * (e + 1)..(first + i + 1) * (e + 1)].copy_from_slice(&t);
            }
        }
        out
    }

    /// The auxiliary-loss-free balancing's step of every mixture this part holds, in `params`
    /// (this part's), from `tally`: the step's tally over the whole model's layers summed over
    /// every rank (`[layer][rows of each expert…, balancing losses]`, as `take_moe_tally`).
    pub fn update_expert_bias(&self, params: &mut [f32], tally: &[f32]) {
        let Some(e) = self.cfg.experts() else { return };
        let first = first_block(&self.holds);
        for (i, blk) in self.blocks.iter().enumerate() {
            let at = (first + i) * (e + 1);
            // (a block's views are into its unit)
            let unit = self.units[self.block_unit(i)].clone();
            blk.update_bias(&mut params[unit], &tally[at..at + e]);
        }
    }

    /// The local unit of this part's `k`-th block.
    fn block_unit(&self, k: usize) -> usize {
        usize::from(self.has_embedding) + k
    }

    /// The local unit of the final LayerNorm (and the head's copy of the token table).
    fn final_unit(&self) -> usize {
        self.units.len() - 1
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

    /// Runs this part: the embedding of `input`'s tokens (or, on a later stage, its hidden
    /// rows), the blocks, and the final LayerNorm when the part ends the model (this rank's rows
    /// of the hidden states are then in `acts.lnf.out`; otherwise the part's output is
    /// `acts.output()`).
    fn forward_hidden(
        &self,
        pass: &mut Pass,
        input: Input,
        (b, t): (usize, usize),
        acts: &mut Activations,
    ) -> Result<()> {
        let (tp, store) = (pass.tp, &mut *pass.store);
        self.check_group(tp);
        let (c, l) = (self.cfg.n_embd, self.blocks.len());
        let rows = tp.rows(b * t).len();
        acts.b = b;
        acts.t = t;
        let cp = pass.cp;
        match (pass.docs.positions(), cp) {
            (Some(p), _) => {
                let kept = acts.docs.get_or_insert_with(Vec::new);
                kept.clear();
                kept.extend_from_slice(p);
            }
            // this rank's rows of whole sequences: at their global positions
            (None, Some(cx)) => acts.docs = Some(cx.positions().repeat(b)),
            (None, None) => acts.docs = None,
        }
        let docs = Docs::of(acts.docs.as_deref());
        match cp {
            None => docs.check(b * t, t),
            Some(cx) => {
                assert_eq!(cx.split.local(), t, "a context group's rank holds t / cp rows of each sequence");
                let global = cx.positions();
                let fits = (0..b * t).all(|r| docs.pos(r, t) <= global[r % t] as usize);
                assert!(fits, "positions past their rows' global positions");
            }
        }
        acts.resid.resize_with(l + 1, Vec::new);
        acts.blocks.resize_with(l, BlockStash::default);
        for r in &mut acts.resid {
            ensure(r, rows * c);
        }
        let sc = &mut acts.scratch;
        match input {
            Input::Tokens(tokens) => {
                assert!(self.has_embedding, "a part without the embedding takes hidden rows");
                let p = store.params(0)?;
                let tables = (self.wte.of(p), self.wpe.of(p));
                let out = &mut acts.resid[0];
                let bufs = (&mut sc.part, &mut sc.rows);
                vocab::embedding_forward(tp, out, tables, (tokens, docs), self.vocab, (t, c), bufs)?;
            }
            Input::Hidden(x) => acts.resid[0].copy_from_slice(x),
        }
        for (i, blk) in self.blocks.iter().enumerate() {
            let (done, rest) = acts.resid.split_at_mut(i + 1);
            let p = store.params(self.block_unit(i))?;
            blk.forward((tp, pass.ep), p, (&done[i], &mut rest[0]), (b, t), (docs, cp), &mut acts.blocks[i], sc)?;
        }
        if self.has_head {
            self.ln_f.forward(store.params(self.final_unit())?, &acts.resid[l], &mut acts.lnf);
        }
        Ok(())
    }

    /// Forward of this part over `b` sequences of `t` tokens, from `input`: on the last stage
    /// to this rank's vocabulary block of the logits, `[b·t, vocab.rows]` in `acts.logits`,
    /// else to the stage's output rows, `acts.output()`.
    pub fn forward(&self, pass: &mut Pass, input: Input, (b, t): (usize, usize), acts: &mut Activations) -> Result<()> {
        self.forward_hidden(pass, input, (b, t), acts)?;
        if !self.has_head {
            return Ok(());
        }
        let (c, v, n) = (self.cfg.n_embd, self.vocab.rows, b * t);
        ensure(&mut acts.logits, n * v);
        // LM head (the token table when tied): logits = h·Wᵀ, on this rank's vocabulary block.
        let h = pass.tp.enter(&acts.lnf.out, &mut acts.scratch.full)?;
        matmul(&mut acts.logits, h, self.head.of(pass.store.params(self.head_unit)?), n, c, v, false, true, false);
        Ok(())
    }

    /// Logits of the last position of each sequence only (`[b, vocab]`), for generation on a
    /// single worker.
    pub fn forward_last(&self, p: &[f32], tokens: &[u32], b: usize, t: usize, acts: &mut Activations) -> Vec<f32> {
        let mut store = Whole::reading(&self.units, p);
        let mut pass = Pass::new(&Tp::SOLO, &mut store);
        self.forward_hidden(&mut pass, Input::Tokens(tokens), (b, t), acts).expect(SOLO);
        let (c, v) = (self.cfg.n_embd, self.cfg.vocab_size);
        let mut h = Vec::with_capacity(b * c);
        for i in 0..b {
            h.extend_from_slice(&acts.lnf.out[((i + 1) * t - 1) * c..][..c]);
        }
        let mut out = vec![0f32; b * v];
        matmul(&mut out, &h, self.head.of(&p[self.units[self.head_unit].clone()]), b, c, v, false, true, false);
        out
    }

    /// The cross-entropy of the targets that are not `IGNORE`, after a forward of the last
    /// stage, from this rank's block of the logits (every rank of the group gets the loss).
    /// Returns (sum of token losses in f64, number of counted tokens).
    pub fn loss(&self, tp: &Tp, targets: &[i32], acts: &mut Activations) -> Result<(f64, usize)> {
        let n = targets.len();
        ensure(&mut acts.lse, n);
        ensure(&mut acts.losses, n);
        vocab::cross_entropy_forward(tp, &mut acts.losses, &mut acts.lse, &acts.logits, targets, self.vocab)?;
        let sum = acts.losses.iter().map(|&x| x as f64).sum();
        Ok((sum, targets.iter().filter(|&&x| x != IGNORE).count()))
    }

    /// Backward of this part after its forward: from the loss on the last stage (`scale` is 1
    /// / the counted tokens of the whole global batch, so that micro-batches sum to the
    /// gradient of the batch mean), else from the gradient of the stage's output rows. The
    /// pass's store hears as each unit's gradients become final (the last unit first); a
    /// stage without the embedding leaves the gradient of its input rows in
    /// `acts.input_grad()`. The weight matrices' gradients go to `pass.dw` (biases,
    /// LayerNorms and the embedding take theirs here either way: they are cheap). Under
    /// sequence parallelism the gradients of the replicated parameters are partial sums over
    /// the group (`nn::tp::state::sum_replicated_grads`).
    pub fn backward(&self, pass: &mut Pass, tokens: &[u32], from: Output, acts: &mut Activations) -> Result<()> {
        let Pass { tp, store, dw, cp, ep, .. } = pass;
        let ep = *ep;
        let (tp, cp): (&Tp, _) = (tp, *cp);
        self.check_group(tp);
        let (b, t) = (acts.b, acts.t);
        let docs = Docs::of(acts.docs.as_deref());
        let (c, v, l, n) = (self.cfg.n_embd, self.vocab.rows, self.blocks.len(), b * t);
        let sc = &mut acts.scratch;
        ensure(&mut sc.dresid, tp.rows(n).len() * c);
        match from {
            Output::Loss { targets, scale } => {
                assert!(self.has_head, "only the last stage has a loss");
                cross_entropy_backward(&mut acts.logits, &acts.lse, targets, self.vocab.window(), scale);
                ensure(&mut sc.dpart, n * c);
                // LM head: dh = dlogits·wte (this block's part, summed by f), dwte += dlogitsᵀ·h
                let h = tp.enter(&acts.lnf.out, &mut sc.hfull)?;
                let (p, g) = store.params_grads(self.head_unit)?;
                matmul(&mut sc.dpart, &acts.logits, self.head.of(p), n, v, c, false, false, false);
                dw.set_unit(self.head_unit);
                // a deferred W takes the logits' gradient as it is (no copy of n × vocab)
                match dw {
                    WeightGrads::Later { .. } => {
                        dw.add_owned(g, self.head, std::mem::take(&mut acts.logits), h, (v, n, c))
                    }
                    WeightGrads::Now => dw.add(g, self.head, &acts.logits, h, (v, n, c)),
                }
                let d = tp.enter_backward(&mut sc.dpart, &mut sc.dln)?;
                sc.dresid.fill(0.0);
                let (p, g) = store.params_grads(self.final_unit())?;
                self.ln_f.backward(p, g, &acts.resid[l], &acts.lnf, d, &mut sc.dresid);
                store.grads_done(self.final_unit())?;
            }
            Output::Grad(dy) => sc.dresid.copy_from_slice(dy),
        }
        let aux = self.aux_weights(b);
        for (i, blk) in self.blocks.iter().enumerate().rev() {
            let (p, g) = store.params_grads(self.block_unit(i))?;
            dw.set_unit(self.block_unit(i));
            let at = (acts.resid[i].as_slice(), (docs, cp));
            blk.backward((tp, ep), &mut Grads { p, g, dw }, at, &acts.blocks[i], sc, aux)?;
            store.grads_done(self.block_unit(i))?;
        }
        if !self.has_embedding {
            return Ok(());
        }
        let (_, g) = store.params_grads(0)?;
        let (wo, po) = (self.wte, self.wpe);
        assert_eq!(po.offset, wo.offset + wo.len, "wte and wpe are adjacent in the layout");
        let tables = g[wo.offset..po.offset + po.len].split_at_mut(wo.len);
        vocab::embedding_backward(tp, tables, &sc.dresid, (tokens, docs), self.vocab, (t, c), &mut sc.dfull)?;
        store.grads_done(0)
    }

    /// The single worker's forward, loss and backward of `b` sequences of `t` tokens over the
    /// whole buffers, accumulating into `g` (`scale` as in `backward`); returns (loss sum,
    /// counted tokens).
    pub fn forward_backward(
        &self,
        (p, g): (&[f32], &mut [f32]),
        (tokens, targets): (&[u32], &[i32]),
        (b, t): (usize, usize),
        scale: f32,
        acts: &mut Activations,
    ) -> (f64, usize) {
        let mut store = Whole::new(&self.units, p, g);
        let mut pass = Pass::new(&Tp::SOLO, &mut store);
        self.forward(&mut pass, Input::Tokens(tokens), (b, t), acts).expect(SOLO);
        let out = self.loss(&Tp::SOLO, targets, acts).expect(SOLO);
        self.backward(&mut pass, tokens, Output::Loss { targets, scale }, acts).expect(SOLO);
        out
    }

    /// The single worker's forward to logits `[b·t, vocab]` in `acts.logits`.
    pub fn logits(&self, p: &[f32], tokens: &[u32], (b, t): (usize, usize), acts: &mut Activations) {
        self.logits_docs(p, tokens, None, (b, t), acts)
    }

    /// `logits` of packed documents kept apart, the tokens at positions `pos` in theirs
    /// (`None`: one document a sequence).
    pub fn logits_docs(
        &self,
        p: &[f32],
        tokens: &[u32],
        pos: Option<&[u32]>,
        (b, t): (usize, usize),
        acts: &mut Activations,
    ) {
        let mut store = Whole::reading(&self.units, p);
        let mut pass = Pass::new(&Tp::SOLO, &mut store).with_docs(pos);
        self.forward(&mut pass, Input::Tokens(tokens), (b, t), acts).expect(SOLO)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_checked() {
        let cfg =
            GptConfig { n_layer: 1, n_head: 2, n_embd: 8, vocab_size: 10, block_size: 4, family: Default::default() };
        let m = Gpt::new(cfg).unwrap();
        assert!(m.check_input(&[1, 2, 3, 4], 1, 4).is_ok());
        assert!(m.check_input(&[], 1, 0).is_err(), "empty sequence");
        assert!(m.check_input(&[1; 5], 1, 5).is_err(), "longer than block_size");
        assert!(m.check_input(&[1, 2, 3], 1, 4).is_err(), "wrong token count");
        let e = m.check_input(&[1, 2, 10, 3], 1, 4).unwrap_err().to_string();
        assert!(e.contains("token id 10 is outside the model's vocabulary of 10"), "{e}");
    }
}
