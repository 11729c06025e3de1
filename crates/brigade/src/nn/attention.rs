//! Causal self-attention, split by heads across a tensor-parallel group: the q, k, v
//! projections are column-parallel (each rank computes its heads), the output projection
//! row-parallel (each rank's heads give a partial output, summed by `g`). GPT-2 projects q | k
//! | v with one fused, biased `c_attn`; the Llama family with separate `q_proj`, `k_proj`,
//! `v_proj` (grouped-query: fewer key/value heads), rotating q and k by their positions.
//! Under context parallelism (`Some(Context)`) the rows are this rank's part of each sequence
//! and the attention core is `nn::context`'s, which exchanges keys and values with the group.

use super::context::{self, Context, CpStash, Heads};
use super::norm::RmsNorm;
use super::{ensure, Grads};
use crate::error::Result;
use crate::nn::tp::{ColumnParallelLinear, RowParallelLinear};
use crate::params::ParamLayout;
use crate::tensor::attention::{attention_backward, attention_forward, AttnShape};
use crate::tensor::docs::Docs;
use crate::tensor::rmsnorm::{rmsnorm_backward, rmsnorm_forward};
use crate::tensor::rope::{rope_rows, RopeTable};

/// The backward's working space, reused across layers and steps: the gradients of the
/// attention output and of q, k, v, (selective recompute) the probabilities again, and a
/// second input gradient (separate projections).
#[derive(Default)]
pub struct AttnScratch {
    pub datt: Vec<f32>,
    pub dqkv: Vec<f32>,
    pub probs: Vec<f32>,
    pub dx2: Vec<f32>,
}

/// How q, k and v are projected.
#[derive(Clone, Debug)]
pub enum Qkv {
    /// GPT-2's `c_attn`: rows `q | k | v`.
    Fused(ColumnParallelLinear),
    /// The Llama family's three projections, into the blocks `q`, then `k`, then `v`.
    Separate { q: ColumnParallelLinear, k: ColumnParallelLinear, v: ColumnParallelLinear },
}

#[derive(Clone, Debug)]
pub struct CausalSelfAttention {
    pub qkv: Qkv,
    pub c_proj: RowParallelLinear,
    /// Query heads and key/value heads on this rank, and the width of one.
    pub heads: usize,
    pub kv_heads: usize,
    pub hd: usize,
    /// Width of this rank's q (and of the attention output): heads × head width.
    pub c: usize,
    /// Rotary frequencies (the Llama family), `hd / 2` of them.
    pub rope: Option<Vec<f32>>,
    /// RMSNorms over each query head and each key head before the rotation (Qwen3: weights of
    /// `hd`, shared by the heads), or over all the heads' q and all their k (OLMoE: weights of
    /// the whole widths): each norm's width is its `c`.
    pub qk_norm: Option<[RmsNorm; 2]>,
}

#[derive(Default)]
pub struct AttnStash {
    /// Sequences and their length, as the forward ran.
    pub bt: (usize, usize),
    /// q, k, v as attention read them (rotated, for the Llama family).
    pub qkv: Vec<f32>,
    pub probs: Vec<f32>,
    pub att: Vec<f32>,
    /// The rotation angles of positions 0..t (the whole sequence's under context parallelism).
    pub rope: RopeTable,
    /// Under context parallelism, each sequence's stash of the exchange (none otherwise).
    pub cp: Vec<CpStash>,
    /// Under q/k norms: q | k before them, and each normalised row's `1 / rms` (q's, then k's).
    pub qk_raw: Vec<f32>,
    pub qk_rstd: Vec<f32>,
}

impl AttnStash {
    /// Floats held for the backward.
    pub fn floats(&self) -> usize {
        self.qkv.len()
            + self.probs.len()
            + self.att.len()
            + self.cp.iter().map(CpStash::floats).sum::<usize>()
            + self.qk_raw.len()
            + self.qk_rstd.len()
    }
}

/// The shape of a Llama-family attention layer on one rank.
#[derive(Clone, Copy, Debug)]
pub struct Grouped {
    /// Hidden size, query heads, key/value heads (all of the model), head width.
    pub c: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub hd: usize,
    pub tp: usize,
    /// Ranks holding each key/value head (1 when tp divides them).
    pub copies: usize,
    pub qkv_bias: bool,
    pub o_bias: bool,
}

impl CausalSelfAttention {
    /// A fused, biased q | k | v (`c_attn`, stored `[in, out]`) and output projection
    /// (`c_proj`), named as the family's spec names them; `std` and `proj_std` their initial
    /// scales.
    pub fn new(
        layout: &mut ParamLayout,
        (c_attn, c_proj): (&str, &str),
        (c, heads): (usize, usize),
        tp: usize,
        (std, proj_std): (f32, f32),
    ) -> Self {
        let c_attn = ColumnParallelLinear::new(layout, c_attn, c, 3 * c, 3, tp, std);
        let c_proj = RowParallelLinear::new(layout, c_proj, c, c, tp, proj_std);
        let (heads, hd) = (heads / tp, c / heads);
        CausalSelfAttention {
            qkv: Qkv::Fused(c_attn),
            c_proj,
            heads,
            kv_heads: heads,
            hd,
            c: c / tp,
            rope: None,
            qk_norm: None,
        }
    }

    /// Separate q, k, v and output projections (weights `[out, in]`, named `[q, k, v, o]` as
    /// the family's spec names them), with rotary frequencies `rope` (none: positions were
    /// added to the input). Key/value heads are cut across the group with their query heads,
    /// or (tp above them) each held by `copies` ranks.
    pub fn grouped(
        layout: &mut ParamLayout,
        [q, k, v, o]: [&str; 4],
        s: Grouped,
        rope: Option<Vec<f32>>,
        std: f32,
    ) -> Self {
        let (qw, kvw) = (s.heads * s.hd, s.kv_heads * s.hd);
        let col = |layout: &mut ParamLayout, name: &str, w: usize, copies: usize| {
            ColumnParallelLinear::out_in(layout, name, (s.c, w), s.tp, copies, std, s.qkv_bias)
        };
        let q = col(layout, q, qw, 1);
        let k = col(layout, k, kvw, s.copies);
        let v = col(layout, v, kvw, s.copies);
        let c_proj = RowParallelLinear::out_in(layout, o, (qw, s.c), s.tp, std, s.o_bias);
        CausalSelfAttention {
            qkv: Qkv::Separate { q, k, v },
            c_proj,
            heads: s.heads / s.tp,
            kv_heads: s.kv_heads * s.copies / s.tp,
            hd: s.hd,
            c: qw / s.tp,
            rope,
            qk_norm: None,
        }
    }

    /// The same attention with RMSNorms (named `[q_norm, k_norm]`) over rows of q and of k of
    /// `widths` before the rotation: each head (Qwen3), or all of this rank's heads (OLMoE).
    pub fn with_qk_norm(mut self, layout: &mut ParamLayout, [q, k]: [&str; 2], widths: [usize; 2], eps: f32) -> Self {
        let [wq, wk] = widths;
        assert!(self.c.is_multiple_of(wq) && (self.kv_heads * self.hd).is_multiple_of(wk));
        self.qk_norm = Some([RmsNorm::new(layout, q, wq, eps), RmsNorm::new(layout, k, wk, eps)]);
        self
    }

    fn shape(&self, b: usize, t: usize) -> AttnShape {
        match self.qkv {
            Qkv::Fused(_) => AttnShape::fused(b, t, self.c, self.heads),
            Qkv::Separate { .. } => AttnShape::grouped(b, t, self.heads, self.kv_heads, self.hd),
        }
    }

    /// The q, k and v blocks of a separate projection's buffer of `n` rows.
    fn blocks(&self, n: usize) -> [std::ops::Range<usize>; 3] {
        let (qw, kvw) = (self.c, self.kv_heads * self.hd);
        [0..n * qw, n * qw..n * (qw + kvw), n * (qw + kvw)..n * (qw + 2 * kvw)]
    }

    /// `part = attention(c_attn(x))·W_proj` for this rank's heads (no bias: added after `g`),
    /// each row attending within its document and rotated by its position (`docs`).
    /// With `keep_scores` false (selective recompute) the softmax probabilities are not kept:
    /// the backward computes them again from q and k. Under context parallelism (`cp`) the
    /// `t` rows of each sequence are this rank's part of it, `docs` their positions (explicit).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        p: &[f32],
        x: &[f32],
        (b, t): (usize, usize),
        (docs, cp): (Docs, Option<Context>),
        st: &mut AttnStash,
        part: &mut Vec<f32>,
        keep_scores: bool,
    ) -> Result<()> {
        st.bt = (b, t);
        let s = self.shape(b, t);
        let n = b * t;
        ensure(&mut st.qkv, s.qkv_len());
        ensure(&mut st.att, n * self.c);
        // the rotation table reaches the sequence's last position
        let positions = cp.map_or(t, |cx| cx.split.t);
        ensure(part, n * self.c_proj.d_out);
        match &self.qkv {
            Qkv::Fused(c_attn) => c_attn.forward(p, x, &mut st.qkv),
            Qkv::Separate { q, k, v } => {
                let [rq, rk, rv] = self.blocks(n);
                q.forward(p, x, &mut st.qkv[rq.clone()]);
                k.forward(p, x, &mut st.qkv[rk.clone()]);
                v.forward(p, x, &mut st.qkv[rv]);
                if let Some([qn, kn]) = &self.qk_norm {
                    // each head's rows normalised: rows of hd, q's heads then k's
                    st.qk_raw.clear();
                    st.qk_raw.extend_from_slice(&st.qkv[rq.start..rk.end]);
                    ensure(&mut st.qk_rstd, rq.len() / qn.c + rk.len() / kn.c);
                    let (raw_q, raw_k) = st.qk_raw.split_at(rq.len());
                    let (rs_q, rs_k) = st.qk_rstd.split_at_mut(rq.len() / qn.c);
                    rmsnorm_forward(&mut st.qkv[rq.clone()], rs_q, raw_q, qn.w.of(p), qn.c, qn.eps);
                    rmsnorm_forward(&mut st.qkv[rk.clone()], rs_k, raw_k, kn.w.of(p), kn.c, kn.eps);
                }
                let inv = self.rope.as_deref().expect("separate projections rotate");
                if st.rope.positions() < positions || st.rope.half != inv.len() {
                    st.rope = RopeTable::new(inv, positions);
                }
                rope_rows(&mut st.qkv[rq], self.heads, &st.rope, |r| docs.pos(r, t), false);
                rope_rows(&mut st.qkv[rk], self.kv_heads, &st.rope, |r| docs.pos(r, t), false);
            }
        }
        match cp {
            None => {
                ensure(&mut st.probs, s.probs_len());
                attention_forward(&mut st.att, &mut st.probs, &st.qkv, s, docs);
            }
            Some(cx) => {
                st.probs = Vec::new();
                st.cp.resize_with(b, CpStash::default);
                for (i, cs) in st.cp.iter_mut().enumerate() {
                    let (q, k, v) = self.sequence(&st.qkv, (b, t), i);
                    let lo = first_keys(&cx, docs, (i, t));
                    let out = &mut st.att[i * t * self.c..(i + 1) * t * self.c];
                    context::forward(cx, self.heads_of(), (&q, &k, &v), &lo, out, cs)?;
                }
            }
        }
        self.c_proj.forward_partial(p, &st.att, part);
        if !keep_scores {
            st.probs = Vec::new();
        }
        Ok(())
    }

    fn heads_of(&self) -> Heads {
        Heads { heads: self.heads, kv_heads: self.kv_heads, hd: self.hd }
    }

    /// Sequence `i`'s rows of q, k and v (of `b` sequences of `t` rows), each `[t, width]`.
    fn sequence(&self, qkv: &[f32], bt: (usize, usize), i: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        (self.sequence_part(qkv, bt, i, 0), self.sequence_part(qkv, bt, i, 1), self.sequence_part(qkv, bt, i, 2))
    }

    /// Sequence `i`'s rows of q (`part` 0), k (1) or v (2), `[t, width]`.
    fn sequence_part(&self, qkv: &[f32], (b, t): (usize, usize), i: usize, part: usize) -> Vec<f32> {
        let (qw, kvw) = (self.c, self.kv_heads * self.hd);
        let rows = i * t..(i + 1) * t;
        let (at, width) = [(0, qw), (qw, kvw), (qw + kvw, kvw)][part];
        match self.qkv {
            Qkv::Fused(_) => {
                let w = qw + 2 * kvw;
                qkv[rows.start * w..rows.end * w].chunks(w).flat_map(|r| r[at..at + width].iter().copied()).collect()
            }
            Qkv::Separate { .. } => {
                let block = self.blocks(b * t)[part].clone();
                qkv[block][rows.start * width..rows.end * width].to_vec()
            }
        }
    }

    /// Writes sequence `i`'s gradients of q, k and v into `dqkv` (the inverse of `sequence`).
    fn put_sequence(&self, dqkv: &mut [f32], (b, t): (usize, usize), i: usize, (dq, dk, dv): (&[f32], &[f32], &[f32])) {
        let (qw, kvw) = (self.c, self.kv_heads * self.hd);
        let rows = i * t..(i + 1) * t;
        match self.qkv {
            Qkv::Fused(_) => {
                let w = qw + 2 * kvw;
                for (j, r) in dqkv[rows.start * w..rows.end * w].chunks_mut(w).enumerate() {
                    r[..qw].copy_from_slice(&dq[j * qw..(j + 1) * qw]);
                    r[qw..qw + kvw].copy_from_slice(&dk[j * kvw..(j + 1) * kvw]);
                    r[qw + kvw..].copy_from_slice(&dv[j * kvw..(j + 1) * kvw]);
                }
            }
            Qkv::Separate { .. } => {
                let [rq, rk, rv] = self.blocks(b * t);
                for (r, w, d) in [(rq, qw, dq), (rk, kvw, dk), (rv, kvw, dv)] {
                    dqkv[r][rows.start * w..rows.end * w].copy_from_slice(d);
                }
            }
        }
    }

    /// From the output gradient `dout` (all rows), overwrites `dx` with this rank's part of
    /// the input gradient (`docs` and `cp` as the forward had them).
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        gr: &mut Grads,
        x: &[f32],
        (docs, cp): (Docs, Option<Context>),
        st: &AttnStash,
        dout: &[f32],
        dx: &mut Vec<f32>,
        sc: &mut AttnScratch,
    ) -> Result<()> {
        let (b, t) = st.bt;
        let AttnScratch { datt, dqkv, probs, dx2 } = sc;
        let Grads { p, g, dw } = gr;
        let (p, g) = (*p, &mut **g);
        let n = b * t;
        let s = self.shape(b, t);
        ensure(datt, n * self.c);
        ensure(dqkv, s.qkv_len());
        ensure(dx, x.len());
        match cp {
            None => {
                let probs: &[f32] = if st.probs.is_empty() {
                    // selective recompute: the attention core again (its output lands in
                    // `datt`, which the projection's backward then overwrites)
                    ensure(probs, s.probs_len());
                    attention_forward(datt, probs, &st.qkv, s, docs);
                    probs
                } else {
                    &st.probs
                };
                self.c_proj.backward(p, g, &st.att, dout, datt, dw);
                attention_backward(dqkv, datt, &st.qkv, probs, s);
            }
            Some(cx) => {
                // (no scores kept: the blockwise backward recomputes them block by block)
                self.c_proj.backward(p, g, &st.att, dout, datt, dw);
                let qw = self.c;
                let kvw = self.kv_heads * self.hd;
                for (i, cs) in st.cp.iter().enumerate().take(b) {
                    let q = self.sequence_part(&st.qkv, (b, t), i, 0);
                    let lo = first_keys(&cx, docs, (i, t));
                    let rows = i * t * qw..(i + 1) * t * qw;
                    let (mut dq, mut dk, mut dv) = (vec![0f32; t * qw], vec![0f32; t * kvw], vec![0f32; t * kvw]);
                    let o = (&st.att[rows.clone()], &datt[rows]);
                    context::backward(cx, self.heads_of(), &q, &lo, o, cs, (&mut dq, &mut dk, &mut dv))?;
                    self.put_sequence(dqkv, (b, t), i, (&dq, &dk, &dv));
                }
            }
        }
        match &self.qkv {
            Qkv::Fused(c_attn) => {
                c_attn.backward(p, g, x, dqkv, dx, dw);
                // The key bias adds q·b_k to every score of a row, which softmax ignores: its
                // gradient is zero in exact arithmetic. Computed, it is rounding noise that Adam
                // would scale up to a ±lr step of arbitrary sign, different for every summation
                // order (micro-batches, data-parallel ranks); so it is set to its exact value.
                // (Not so under rotary positions, which turn the key bias differently at every
                // position.)
                c_attn.local.b.of_mut(g)[self.c..2 * self.c].fill(0.0);
            }
            Qkv::Separate { q, k, v } => {
                let [rq, rk, rv] = self.blocks(n);
                // the rotation's backward is the inverse rotation
                rope_rows(&mut dqkv[rq.clone()], self.heads, &st.rope, |r| docs.pos(r, t), true);
                rope_rows(&mut dqkv[rk.clone()], self.kv_heads, &st.rope, |r| docs.pos(r, t), true);
                if let Some([qn, kn]) = &self.qk_norm {
                    // through each head's norm, to the projections' outputs
                    let (raw_q, raw_k) = st.qk_raw.split_at(rq.len());
                    let (rs_q, rs_k) = st.qk_rstd.split_at(rq.len() / qn.c);
                    for (r, raw, rs, n) in [(rq.clone(), raw_q, rs_q, qn), (rk.clone(), raw_k, rs_k, kn)] {
                        ensure(dx2, r.len());
                        dx2.fill(0.0);
                        rmsnorm_backward(dx2, n.w.of_mut(g), &dqkv[r.clone()], raw, rs, n.w.of(p), n.c);
                        dqkv[r].copy_from_slice(dx2);
                    }
                }
                ensure(dx2, x.len());
                q.backward(p, g, x, &dqkv[rq], dx, dw);
                k.backward(p, g, x, &dqkv[rk], dx2, dw);
                crate::tensor::elementwise::add_into(dx, dx2);
                v.backward(p, g, x, &dqkv[rv], dx2, dw);
                crate::tensor::elementwise::add_into(dx, dx2);
            }
        }
        Ok(())
    }
}

/// The first global position each row of sequence `i` (of `t` rows here) may see: its own
/// global position less its position in its document (`docs`, explicit under context
/// parallelism).
fn first_keys(cx: &Context, docs: Docs, (i, t): (usize, usize)) -> Vec<u32> {
    cx.positions().iter().enumerate().map(|(j, &g)| g - docs.pos(i * t + j, t) as u32).collect()
}
