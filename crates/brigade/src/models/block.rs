//! One pre-norm transformer block of either family, cut across a tensor-parallel group:
//! attention by heads and the MLP by hidden units, the residual stream on this rank's rows.
//! GPT-2: LayerNorm, fused biased q|k|v, GELU. Llama family: RMSNorm, rotary grouped-query
//! attention, SwiGLU — the same two residual branches and the same collectives.

use super::config::{kv_copies, GptConfig};
use crate::error::Result;
use crate::nn::tp::Tp;
use crate::nn::{
    ensure, AttnScratch, AttnStash, CausalSelfAttention, Grads, Grouped, LayerNorm, LnStash, Mlp, MlpScratch,
};
use crate::nn::{MlpStash, Norm, RmsNorm};
use crate::params::ParamLayout;
use crate::tensor::elementwise::residual_bias_forward;

#[derive(Clone, Debug)]
pub struct Block {
    pub ln_1: Norm,
    pub attn: CausalSelfAttention,
    pub ln_2: Norm,
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

impl BlockStash {
    /// Bytes this stash holds for the block's backward.
    pub(crate) fn bytes(&self) -> usize {
        let ln = |l: &LnStash| l.out.len() + l.mean.len() + l.rstd.len();
        let a = &self.attn;
        4 * (ln(&self.ln1)
            + a.qkv.len()
            + a.probs.len()
            + a.att.len()
            + self.x2.len()
            + ln(&self.ln2)
            + self.mlp.floats())
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
}

impl Block {
    pub(crate) fn new(layout: &mut ParamLayout, i: usize, cfg: &GptConfig, tp: usize) -> Block {
        let c = cfg.n_embd;
        let std = 0.02;
        if let Some(a) = cfg.llama() {
            let pre = format!("model.layers.{i}");
            let rms = |layout: &mut ParamLayout, name: &str| {
                Norm::Rms(RmsNorm::new(layout, &format!("{pre}.{name}"), c, a.rms_eps))
            };
            let shape = Grouped {
                c,
                heads: cfg.n_head,
                kv_heads: a.n_kv_head,
                hd: a.head_dim,
                tp,
                copies: kv_copies(cfg, tp),
                qkv_bias: a.qkv_bias,
                o_bias: a.o_bias,
            };
            let scaling = a
                .rope_scaling
                .map(|r| (r.factor, r.low_freq_factor, r.high_freq_factor, r.original_max_position_embeddings));
            let inv_freq = crate::tensor::rope::inv_freq(a.head_dim, a.rope_theta, scaling);
            return Block {
                ln_1: rms(layout, "input_layernorm"),
                attn: CausalSelfAttention::grouped(layout, &format!("{pre}.self_attn"), shape, inv_freq, std),
                ln_2: rms(layout, "post_attention_layernorm"),
                mlp: Mlp::swiglu(layout, &format!("{pre}.mlp"), (c, a.intermediate), tp, std),
            };
        }
        // GPT-2 scales the projections into the residual stream by 1/sqrt(2·n_layer).
        let proj_std = 0.02 / (2.0 * cfg.n_layer as f32).sqrt();
        Block {
            ln_1: Norm::Layer(LayerNorm::new(layout, &format!("h.{i}.ln_1"), c)),
            attn: CausalSelfAttention::new(layout, &format!("h.{i}.attn"), (c, cfg.n_head), tp, (std, proj_std)),
            ln_2: Norm::Layer(LayerNorm::new(layout, &format!("h.{i}.ln_2"), c)),
            mlp: Mlp::new(layout, &format!("h.{i}.mlp"), c, tp, (std, proj_std)),
        }
    }

    /// `out = x2 + mlp(ln_2(x2))` with `x2 = x + attn(ln_1(x))`, on this rank's rows of `b`
    /// sequences of `t` tokens: two collectives forward (`g` after each row-parallel layer;
    /// under sp also two gathers).
    pub(crate) fn forward(
        &self,
        tp: &Tp,
        p: &[f32],
        (x, out): (&[f32], &mut [f32]),
        bt: (usize, usize),
        st: &mut BlockStash,
        sc: &mut Scratch,
    ) -> Result<()> {
        let Scratch { full, part, rows, drop_scores, .. } = sc;
        ensure(&mut st.x2, x.len());
        self.ln_1.forward(p, x, &mut st.ln1);
        let h = tp.enter(&st.ln1.out, full)?;
        self.attn.forward(p, h, bt, &mut st.attn, part, !*drop_scores);
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
    pub(crate) fn backward(&self, tp: &Tp, gr: &mut Grads, x: &[f32], st: &BlockStash, sc: &mut Scratch) -> Result<()> {
        let Scratch { dresid, dln, dpart, dfull, hfull, dh, dup, dx2, attn, .. } = sc;
        // The residual add passes dresid unchanged to both branches.
        self.mlp.c_proj.bias_backward(gr.g, dresid);
        let dy = tp.exit_backward(dresid.as_slice(), dfull)?;
        let h = tp.enter(&st.ln2.out, hfull)?;
        self.mlp.backward(gr, h, &st.mlp, dy, dpart, MlpScratch { dh, dup, dx2 });
        let d = tp.enter_backward(dpart.as_mut_slice(), dln)?;
        self.ln_2.backward(gr.p, gr.g, &st.x2, &st.ln2, d, dresid);
        self.attn.c_proj.bias_backward(gr.g, dresid);
        let dy = tp.exit_backward(dresid.as_slice(), dfull)?;
        let h = tp.enter(&st.ln1.out, hfull)?;
        self.attn.backward(gr, h, &st.attn, dy, dpart, attn);
        let d = tp.enter_backward(dpart.as_mut_slice(), dln)?;
        self.ln_1.backward(gr.p, gr.g, x, &st.ln1, d, dresid);
        Ok(())
    }
}
