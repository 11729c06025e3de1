//! One pre-norm transformer block as its family's spec (`family::BlockSpec`) describes it, cut
//! across a tensor-parallel group: attention by heads and the MLP by hidden units, the
//! residual stream on this rank's rows. LayerNorm or RMSNorm; a fused biased q|k|v or
//! separate (grouped-query, rotary) projections; GELU, SwiGLU or a mixture of SwiGLU experts
//! (`nn::moe`, whole on each rank: not cut by tp) — the same two residual branches and the
//! same collectives.

use super::config::{kv_copies, GptConfig};
use super::family::{MlpSpec, NormKind, NormSpec, Qkv};
use crate::error::Result;
use crate::nn::context::Context;
use crate::nn::moe::{AuxWeights, Experts, Moe, MoeNames, MoeScratch, MoeShape, MoeStash};
use crate::nn::tp::Tp;
use crate::nn::{
    ensure, AttnScratch, AttnStash, CausalSelfAttention, Grads, Grouped, LayerNorm, LnStash, Mlp, MlpScratch,
};
use crate::nn::{MlpStash, Norm, RmsNorm};
use crate::params::ParamLayout;
use crate::tensor::docs::Docs;
use crate::tensor::elementwise::residual_bias_forward;

/// A block, or one of its halves where a pipeline stage is cut inside it: the attention
/// half (`ln_1` and attention, the first residual branch) and the MLP half (`ln_2` and the
/// feed-forward, the second). A stage ending after the attention half hands the residual
/// stream between the branches to the next stage, which starts with the MLP half.
#[derive(Clone, Debug)]
pub struct Block {
    pub attn: Option<AttnHalf>,
    pub mlp: Option<MlpHalf>,
}

#[derive(Clone, Debug)]
pub struct AttnHalf {
    pub ln_1: Norm,
    pub attn: CausalSelfAttention,
}

#[derive(Clone, Debug)]
pub struct MlpHalf {
    pub ln_2: Norm,
    pub mlp: FeedForward,
}

/// Which halves of a block a model part holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Halves {
    pub attn: bool,
    pub mlp: bool,
}

/// The second residual branch: a dense MLP (cut by tp) or a mixture of experts.
#[derive(Clone, Debug)]
pub enum FeedForward {
    Dense(Mlp),
    Moe(Moe),
}

#[derive(Default)]
pub struct BlockStash {
    ln1: LnStash,
    attn: AttnStash,
    /// The residual stream after attention (input of ln_2).
    x2: Vec<f32>,
    ln2: LnStash,
    mlp: MlpStash,
    pub(crate) moe: MoeStash,
}

impl BlockStash {
    /// Bytes this stash holds for the block's backward.
    pub(crate) fn bytes(&self) -> usize {
        let ln = |l: &LnStash| l.out.len() + l.mean.len() + l.rstd.len();
        let a = &self.attn;
        4 * (ln(&self.ln1) + a.floats() + self.x2.len() + ln(&self.ln2) + self.mlp.floats() + self.moe.floats())
    }
}

/// Scratch reused across blocks and steps. Residual-stream buffers hold this rank's rows
/// (all of them, or a block under sequence parallelism); `full`/`hfull`/`dfull` all rows.
#[derive(Default)]
pub(crate) struct Scratch {
    /// A layer input gathered across the group (forward), and again in backward.
    pub(crate) full: Vec<f32>,
    pub(crate) hfull: Vec<f32>,
    /// A row-parallel layer's partial output, and its sum on this rank's rows.
    pub(crate) part: Vec<f32>,
    pub(crate) rows: Vec<f32>,
    pub(crate) dresid: Vec<f32>,
    pub(crate) dln: Vec<f32>,
    /// A column-parallel layer's partial input gradient (all rows).
    pub(crate) dpart: Vec<f32>,
    /// An output gradient gathered across the group.
    pub(crate) dfull: Vec<f32>,
    pub(crate) dh: Vec<f32>,
    /// SwiGLU's second hidden gradient and second input gradient.
    pub(crate) dup: Vec<f32>,
    pub(crate) dx2: Vec<f32>,
    /// Selective recompute: the softmax probabilities are not kept by the forward, and are
    /// computed again by the backward (in `attn`).
    pub(crate) drop_scores: bool,
    pub(crate) attn: AttnScratch,
    pub(crate) moe: MoeScratch,
}

impl Block {
    /// A mixture's tally since it was last taken (`[rows of each expert…, balancing losses]`);
    /// `None` for a dense block.
    pub(crate) fn take_tally(&self) -> Option<Vec<f64>> {
        match self.mlp.as_ref().map(|h| &h.mlp) {
            Some(FeedForward::Moe(m)) => Some(m.tally.take(m.shape.experts)),
            _ => None,
        }
    }

    /// A mixture's auxiliary-loss-free balancing step from the rows each expert took (`[E]`).
    pub(crate) fn update_bias(&self, p: &mut [f32], load: &[f32]) {
        if let Some(MlpHalf { mlp: FeedForward::Moe(m), .. }) = &self.mlp {
            m.update_bias(p, load);
        }
    }

    /// Block `i` (its `halves`) as the family's spec describes it, cut for a group of `tp`; a
    /// mixture holding rank `q`'s block of its experts when they are divided over `ep` ranks
    /// (`experts` = (q, ep)). The parameters are laid out in the whole block's order.
    pub(crate) fn new(
        layout: &mut ParamLayout,
        i: usize,
        cfg: &GptConfig,
        tp: usize,
        (q, ep): (usize, usize),
        halves: Halves,
    ) -> Block {
        let c = cfg.n_embd;
        let spec = cfg.block(i);
        let (std, proj_std) = (spec.std, spec.proj_std);
        let norm = |layout: &mut ParamLayout, n: &NormSpec| match n.kind {
            NormKind::Layer { .. } => Norm::Layer(LayerNorm::new(layout, &n.name, c)),
            NormKind::Rms { eps } => Norm::Rms(RmsNorm::new(layout, &n.name, c, eps)),
        };
        let attn = halves.attn.then(|| {
            let ln_1 = norm(layout, &spec.ln_1);
            let attn = match &spec.attn.qkv {
                Qkv::Fused(qkv) => {
                    let names = (qkv.name.as_str(), spec.attn.o.name.as_str());
                    CausalSelfAttention::new(layout, names, (c, cfg.n_head), tp, (std, proj_std))
                }
                Qkv::Separate { q, k, v } => {
                    let shape = Grouped {
                        c,
                        heads: cfg.n_head,
                        kv_heads: cfg.kv_heads(),
                        hd: cfg.head_dim(),
                        tp,
                        copies: kv_copies(cfg, tp),
                        qkv_bias: q.bias,
                        o_bias: spec.attn.o.bias,
                    };
                    let names = [q.name.as_str(), &k.name, &v.name, &spec.attn.o.name];
                    let attn = CausalSelfAttention::grouped(
                        layout,
                        names,
                        shape,
                        cfg.positions().inv_freq(cfg.head_dim()),
                        std,
                    );
                    match &spec.attn.qk_norm {
                        Some(([qn, kn], widths)) => {
                            let NormKind::Rms { eps } = qn.kind else { panic!("q/k norms are RMSNorms") };
                            attn.with_qk_norm(layout, [&qn.name, &kn.name], *widths, eps)
                        }
                        None => attn,
                    }
                }
            };
            AttnHalf { ln_1, attn }
        });
        let mlp = halves.mlp.then(|| {
            let ln_2 = norm(layout, &spec.ln_2);
            let mlp = match &spec.mlp {
                MlpSpec::Gelu { fc, proj } => {
                    FeedForward::Dense(Mlp::new(layout, (&fc.name, &proj.name), (c, fc.d_out), tp, (std, proj_std)))
                }
                MlpSpec::SwiGlu { gate, up, down } => FeedForward::Dense(Mlp::swiglu(
                    layout,
                    [&gate.name, &up.name, &down.name],
                    (c, gate.d_out),
                    tp,
                    std,
                )),
                MlpSpec::Moe(m) => {
                    // (not cut by tp: every rank of a tensor-parallel group runs the whole mixture
                    // on the group's rows)
                    let names = MoeNames {
                        router: m.router.name.clone(),
                        experts: m.experts.iter().map(|e| e.clone().map(|l| l.name)).collect(),
                        shared: m.shared.as_ref().map(|(e, g)| (e.clone().map(|l| l.name), g.name.clone())),
                        bias: m.bias.as_ref().map(|(b, _)| b.clone()),
                    };
                    let shape = MoeShape {
                        c,
                        experts: m.experts.len(),
                        top_k: m.top_k,
                        width: m.width(),
                        shared_width: m.shared.as_ref().map_or(0, |(e, _)| e[0].d_out),
                        norm_topk: m.norm_topk,
                        capacity: m.capacity,
                        bias_rate: m.bias.as_ref().map_or(0.0, |(_, r)| *r),
                    };
                    let local = shape.experts / ep;
                    FeedForward::Moe(Moe::new(layout, &names, shape, std, q * local..(q + 1) * local))
                }
            };
            MlpHalf { ln_2, mlp }
        });
        Block { attn, mlp }
    }

    /// `out = x2 + mlp(ln_2(x2))` with `x2 = x + attn(ln_1(x))`, on this rank's rows of `b`
    /// sequences of `t` tokens (`docs`: the positions of all rows; `cp`: the context group
    /// holding the sequences' other rows): a collective forward in each half (`g` after its
    /// row-parallel layer; under sp also a gather), attention's exchange under cp, and a
    /// mixture's dispatch to its experts' ranks under ep. The attention half alone ends at
    /// `out = x2`; the MLP half alone starts from `x` as its `x2`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
        &self,
        (tp, ep): (&Tp, Experts),
        p: &[f32],
        (x, out): (&[f32], &mut [f32]),
        bt: (usize, usize),
        docs: (Docs, Option<Context>),
        st: &mut BlockStash,
        sc: &mut Scratch,
    ) -> Result<()> {
        let Scratch { full, part, rows, drop_scores, moe, .. } = sc;
        if let Some(AttnHalf { ln_1, attn }) = &self.attn {
            ln_1.forward(p, x, &mut st.ln1);
            let h = tp.enter(&st.ln1.out, full)?;
            attn.forward(p, h, bt, docs, &mut st.attn, part, !*drop_scores)?;
            let y = tp.exit(part, rows)?;
            // the residual stream between the branches: kept for the MLP half, or this part's output
            let x2 = match self.mlp {
                Some(_) => {
                    ensure(&mut st.x2, x.len());
                    &mut st.x2[..]
                }
                None => &mut *out,
            };
            residual_bias_forward(x2, x, y, attn.c_proj.bias(p));
        }
        let Some(MlpHalf { ln_2, mlp }) = &self.mlp else {
            // (a stash another chunk's mixture left: no auxiliary losses from this half)
            st.moe.aux = Default::default();
            return Ok(());
        };
        let x2 = if self.attn.is_some() { &st.x2[..] } else { x };
        ln_2.forward(p, x2, &mut st.ln2);
        match mlp {
            FeedForward::Dense(mlp) => {
                let h = tp.enter(&st.ln2.out, full)?;
                mlp.forward(p, h, &mut st.mlp, part);
                let y = tp.exit(part, rows)?;
                residual_bias_forward(out, x2, y, mlp.c_proj.bias(p));
            }
            FeedForward::Moe(m) => {
                // this rank's t rows of each sequence — under tp (without sp) every rank of the
                // group has them all and runs the whole mixture alike, so neither a gather nor a
                // reduction; under cp the auxiliary losses' statistics are summed over the group
                m.forward(p, (&st.ln2.out, bt.1), (ep, docs.1.map(|c| c.comm)), &mut st.moe, part, moe)?;
                residual_bias_forward(out, x2, part, &[]);
            }
        }
        Ok(())
    }

    /// On entry `dresid` is the gradient of the block output; on return, of the block input
    /// (`x`, the input its forward had). One collective backward in each half (`f` before its
    /// column-parallel layer). `aux` weighs a mixture's auxiliary losses.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn backward(
        &self,
        (tp, ep): (&Tp, Experts),
        gr: &mut Grads,
        (x, docs): (&[f32], (Docs, Option<Context>)),
        st: &BlockStash,
        sc: &mut Scratch,
        aux: AuxWeights,
    ) -> Result<()> {
        let Scratch { dresid, dln, dpart, dfull, hfull, dh, dup, dx2, attn, moe, .. } = sc;
        // The residual add passes dresid unchanged to both branches.
        if let Some(MlpHalf { ln_2, mlp }) = &self.mlp {
            let x2 = if self.attn.is_some() { &st.x2[..] } else { x };
            match mlp {
                FeedForward::Dense(mlp) => {
                    mlp.c_proj.bias_backward(gr.g, dresid);
                    let dy = tp.exit_backward(dresid.as_slice(), dfull)?;
                    let h = tp.enter(&st.ln2.out, hfull)?;
                    mlp.backward(gr, h, &st.mlp, dy, dpart, MlpScratch { dh, dup, dx2 });
                    let d = tp.enter_backward(dpart.as_mut_slice(), dln)?;
                    ln_2.backward(gr.p, gr.g, x2, &st.ln2, d, dresid);
                }
                FeedForward::Moe(m) => {
                    m.backward(gr, &st.ln2.out, ep, &st.moe, dresid, dpart, aux, moe)?;
                    ln_2.backward(gr.p, gr.g, x2, &st.ln2, dpart, dresid);
                }
            }
        }
        let Some(AttnHalf { ln_1, attn: layer }) = &self.attn else { return Ok(()) };
        layer.c_proj.bias_backward(gr.g, dresid);
        let dy = tp.exit_backward(dresid.as_slice(), dfull)?;
        let h = tp.enter(&st.ln1.out, hfull)?;
        layer.backward(gr, h, docs, &st.attn, dy, dpart, attn)?;
        let d = tp.enter_backward(dpart.as_mut_slice(), dln)?;
        ln_1.backward(gr.p, gr.g, x, &st.ln1, d, dresid);
        Ok(())
    }
}
