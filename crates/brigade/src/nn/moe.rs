//! A mixture-of-experts feed-forward block (Qwen2-MoE, Qwen3-MoE, OLMoE, Mixtral): a router
//! (a linear layer to one logit per expert, softmax in f32, the top k), SwiGLU experts each
//! run on the rows routed to it (dropless: groups of uneven size), the chosen experts' outputs
//! weighted by their probabilities (renormalised over the k when `norm_topk`, which is also
//! Mixtral's softmax over the chosen logits) and summed in expert order — so a row's result
//! does not depend on which other rows share its experts — and an optional shared expert
//! scaled by a sigmoid gate (Qwen2-MoE). Forward and backward by hand
//! (`tests/gradcheck.rs` checks them against finite differences and a row-by-row reference).
//!
//! The load-balancing loss is the Switch/Mixtral form `E · Σᵢ fᵢ·Pᵢ` (fᵢ: the share of rows
//! that chose expert i among their k, Pᵢ: its mean probability), and the router z-loss the mean
//! of `logsumexp(logits)²`, each taken over the rows of one sequence (DeepSeek-V3's
//! sequence-wise form: a sequence's statistics do not depend on which rank or micro-batch holds
//! the others, so every data-parallel layout and micro-batching computes the same loss).
//! transformers pools the statistics over its whole forward batch and every layer; the two agree
//! for one sequence and one MoE layer.

use super::{ensure, Grads, Mlp, MlpScratch, MlpStash};
use crate::error::{Error, Result};
use crate::params::{Init, ParamLayout, View};
use crate::tensor::matmul;
use brigade_comm::Comm;

/// The router's and experts' sizes and rules.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeShape {
    /// Hidden size.
    pub c: usize,
    pub experts: usize,
    /// Experts each row goes to.
    pub top_k: usize,
    /// Each expert's SwiGLU width.
    pub width: usize,
    /// The shared expert's width (0: none).
    pub shared_width: usize,
    /// Whether the k chosen probabilities are renormalised to sum to 1.
    pub norm_topk: bool,
    /// The auxiliary-loss-free balancing's rate (0: no bias; see `Moe::bias`).
    pub bias_rate: f32,
    /// Capacity factor: each expert takes at most `⌈capacity · seq · k / E⌉` of a sequence's
    /// rows — those it weighs most, ties to the earlier row — and the others pass it by (their
    /// weight on it gets no output and no gradient); 0: dropless.
    pub capacity: f32,
}

impl MoeShape {
    /// The rows an expert takes from a sequence of `seq` (`usize::MAX`: dropless).
    pub fn expert_capacity(&self, seq: usize) -> usize {
        if self.capacity <= 0.0 {
            return usize::MAX;
        }
        // megatron-core's `get_capacity`: ⌈(tokens·k / E) · factor⌉ in f64, the factor as it was
        // written (1.2, not the f32 nearest it: 1.2f32 · 5 would ceil to 7, not 6)
        let factor: f64 = self.capacity.to_string().parse().unwrap_or(self.capacity as f64);
        (((seq * self.top_k) as f64 / self.experts as f64 * factor).ceil() as usize).max(1)
    }
}

/// The tensor names: `{prefix}.gate` (router), `{prefix}.experts.{e}.{gate,up,down}_proj`,
/// `{prefix}.shared_expert.{…}` and `{prefix}.shared_expert_gate` — Qwen2-MoE's; Mixtral's
/// `block_sparse_moe.experts.{e}.w1/w3/w2` are mapped to these by the family.
#[derive(Clone, Debug)]
pub struct MoeNames {
    pub router: String,
    /// Per expert: gate, up, down.
    pub experts: Vec<[String; 3]>,
    /// gate, up, down, and the sigmoid gate's `[1, C]`.
    pub shared: Option<([String; 3], String)>,
    /// The balancing bias `[E]` (DeepSeek-V3's `e_score_correction_bias`), if any.
    pub bias: Option<String>,
}

#[derive(Clone, Debug)]
pub struct Moe {
    pub shape: MoeShape,
    /// `[E, C]`, stored `[out, in]`.
    pub router: View,
    /// The experts this rank holds: all of them, or (expert parallelism with the experts
    /// divided) its group's block `first..first + E/P`.
    pub experts: Vec<Mlp>,
    pub first: usize,
    pub shared: Option<(Mlp, View)>,
    /// DeepSeek-V3's auxiliary-loss-free balancing: a bias `[E]` added to the probabilities
    /// for choosing the k experts only (their weights are the probabilities themselves); no
    /// gradient, moved after each step by `update_bias`.
    pub bias: Option<View>,
    /// What this rank's backwards routed since the tally was last taken (shared by the
    /// layer's clones).
    pub tally: std::sync::Arc<Tally>,
}

/// Rows routed to each expert and the balancing losses, summed over a step's backwards (one a
/// micro-batch, whatever the recompute), for the step's metrics.
#[derive(Debug, Default)]
pub struct Tally(std::sync::Mutex<Vec<f64>>);

impl Tally {
    fn add(&self, st: &MoeStash, experts: usize) {
        let mut t = self.0.lock().unwrap_or_else(|p| p.into_inner());
        t.resize(experts + 1, 0.0);
        st.pairs.iter().for_each(|&(_, e, _)| t[e as usize] += 1.0);
        t[experts] += st.aux.balance;
    }

    /// `[rows of each expert…, balancing losses summed]`, zeroed.
    pub fn take(&self, experts: usize) -> Vec<f64> {
        let mut t = self.0.lock().unwrap_or_else(|p| p.into_inner());
        t.resize(experts + 1, 0.0);
        std::mem::replace(&mut *t, vec![0.0; experts + 1])
    }
}

/// One of this rank's experts in a forward: the rows it received (from each rank of the group
/// in turn) and its stash.
#[derive(Default)]
pub struct ExpertStash {
    pub x: Vec<f32>,
    pub y: Vec<f32>,
    pub mlp: MlpStash,
}

#[derive(Default)]
pub struct MoeStash {
    /// `[n, E]` probabilities, and each row's `log Σ exp(logits)`.
    pub probs: Vec<f32>,
    pub lse: Vec<f32>,
    /// `[n, k]` chosen experts (best first).
    pub chosen: Vec<u32>,
    /// Every (row, expert, weight) pair this rank routed, in expert order (rows ascending
    /// within an expert): the order they are sent in and combined in.
    pub pairs: Vec<(u32, u32, f32)>,
    /// The experts' outputs for the pairs, `[pairs, C]`.
    pub y: Vec<f32>,
    /// Rows received from each rank of the expert group for each local expert (`[P][E/P]`).
    pub recv: Vec<Vec<usize>>,
    /// This rank's experts.
    pub experts: Vec<ExpertStash>,
    /// The shared expert's output and its gate's sigmoid.
    pub shared: MlpStash,
    pub shared_out: Vec<f32>,
    pub shared_gate: Vec<f32>,
    /// Rows per sequence on this rank (the aux losses' statistics are per sequence), and of the
    /// whole sequence (more under context parallelism).
    pub seq: usize,
    pub rows: usize,
    /// Each sequence's share of rows choosing each expert (`[sequences, E]`), over the whole
    /// sequence: what the balancing loss's gradient holds.
    pub f: Vec<f64>,
    /// The forward's auxiliary losses, summed over its sequences.
    pub aux: AuxLosses,
}

impl MoeStash {
    pub fn floats(&self) -> usize {
        let e: usize = self.experts.iter().map(|s| s.x.len() + s.y.len() + s.mlp.floats()).sum();
        self.probs.len()
            + self.lse.len()
            + self.chosen.len()
            + 3 * self.pairs.len()
            + self.y.len()
            + e
            + self.shared.floats()
            + self.shared_out.len()
            + self.shared_gate.len()
    }

    /// Tokens this rank routed to each of the `experts` in the last forward.
    pub fn load(&self, experts: usize) -> Vec<usize> {
        let mut n = vec![0; experts];
        self.pairs.iter().for_each(|&(_, e, _)| n[e as usize] += 1);
        n
    }
}

/// The weights of the auxiliary losses' gradients in a backward (0: off).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AuxWeights {
    /// Multiplies each sequence's load-balancing loss.
    pub balance: f32,
    /// Multiplies each sequence's z-loss.
    pub z: f32,
}

/// Each sequence's auxiliary losses from a forward, summed over sequences.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AuxLosses {
    pub balance: f64,
    pub z: f64,
}

/// The backward's scratch.
#[derive(Default)]
pub struct MoeScratch {
    pub send: Vec<f32>,
    pub got: Vec<f32>,
    pub dy: Vec<f32>,
    pub dx: Vec<f32>,
    pub dlogits: Vec<f32>,
    pub dh: Vec<f32>,
    pub dup: Vec<f32>,
    pub dx2: Vec<f32>,
}

impl Moe {
    /// The mixture with the experts `held` (all of them, or a rank's block under expert
    /// parallelism): the others are not in `layout`.
    pub fn new(
        layout: &mut ParamLayout,
        names: &MoeNames,
        shape: MoeShape,
        std: f32,
        held: std::ops::Range<usize>,
    ) -> Moe {
        assert_eq!(names.experts.len(), shape.experts);
        assert!(held.end <= shape.experts && !held.is_empty());
        assert!(shape.top_k >= 1 && shape.top_k <= shape.experts);
        let c = shape.c;
        let first_spec = layout.specs.len();
        let router = layout.add(&format!("{}.weight", names.router), &[shape.experts, c], Init::Normal(std), true);
        let swiglu = |layout: &mut ParamLayout, n: &[String; 3], m| {
            Mlp::swiglu(layout, [n[0].as_str(), n[1].as_str(), n[2].as_str()], (c, m), 1, std)
        };
        let before = layout.specs.len();
        let experts = names.experts[held.clone()].iter().map(|n| swiglu(layout, n, shape.width)).collect();
        layout.specs[before..].iter_mut().for_each(|s| s.expert = true);
        let shared = names.shared.as_ref().map(|(n, gate)| {
            let mlp = swiglu(layout, n, shape.shared_width);
            (mlp, layout.add(&format!("{gate}.weight"), &[1, c], Init::Normal(std), true))
        });
        let bias = names.bias.as_ref().map(|b| layout.add(b, &[shape.experts], Init::Zeros, false));
        // whole on every rank of a tensor-parallel group (the experts' products were built for
        // a group of one): their slices are the tensors themselves
        layout.specs[first_spec..].iter_mut().for_each(|s| s.split = crate::params::Split::Replicated);
        Moe { shape, router, experts, first: held.start, shared, bias, tally: Default::default() }
    }

    /// `out[n, C]` (overwritten) for the rows `h[n, C]`, sequences of `seq` rows, the experts
    /// spread over `ep`; returns each sequence's auxiliary losses summed.
    /// Under context parallelism (`cp`: the ranks holding the rest of each sequence) the
    /// auxiliary losses' statistics are summed over the group, and each rank returns its share
    /// of the losses (1/cp of them).
    pub fn forward(
        &self,
        p: &[f32],
        (h, seq): (&[f32], usize),
        (ep, cp): (Experts, Option<&Comm>),
        st: &mut MoeStash,
        out: &mut Vec<f32>,
        sc: &mut MoeScratch,
    ) -> Result<AuxLosses> {
        let MoeShape { c, experts: ne, top_k: k, norm_topk, .. } = self.shape;
        let n = h.len() / c;
        assert!(seq > 0 && n.is_multiple_of(seq), "{n} rows are not whole sequences of {seq}");
        st.seq = seq;
        ensure(&mut st.probs, n * ne);
        st.lse.resize(n, 0.0);
        if n > 0 {
            matmul(&mut st.probs, h, self.router.of(p), n, c, ne, false, true, false);
        }
        for (row, lse) in st.probs.chunks_exact_mut(ne).zip(st.lse.iter_mut()) {
            *lse = softmax_in_place(row);
        }
        st.chosen.clear();
        let mut order: Vec<u32> = Vec::with_capacity(ne);
        let mut weights = vec![0f32; n * k];
        let bias = self.bias.map(|b| b.of(p));
        let mut biased = vec![0f32; ne];
        for (t, row) in st.probs.chunks_exact(ne).enumerate() {
            match bias {
                // chosen by the biased scores, weighted by the probabilities
                Some(b) => {
                    biased.iter_mut().zip(row).zip(b).for_each(|((o, &p), &b)| *o = p + b);
                    top_k(&biased, k, &mut order);
                }
                None => top_k(row, k, &mut order),
            }
            let sum: f32 = order.iter().map(|&e| row[e as usize]).sum();
            for (w, &e) in weights[t * k..(t + 1) * k].iter_mut().zip(&order) {
                *w = if norm_topk { row[e as usize] / sum } else { row[e as usize] };
            }
            st.chosen.extend_from_slice(&order);
        }
        // the pairs in expert order, rows ascending within each; past its capacity an expert
        // keeps a sequence's rows it weighs most (the sequence alone decides: every layout keeps
        // the same)
        st.pairs.clear();
        let cap = self.shape.expert_capacity(seq);
        let mut mine: Vec<(u32, u32, f32)> = Vec::new();
        for e in 0..ne as u32 {
            for s in 0..n / seq {
                mine.clear();
                for t in s * seq..(s + 1) * seq {
                    if let Some(j) = st.chosen[t * k..(t + 1) * k].iter().position(|&x| x == e) {
                        mine.push((t as u32, e, weights[t * k + j]));
                    }
                }
                if mine.len() > cap {
                    mine.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(&b.0)));
                    mine.truncate(cap);
                    mine.sort_by_key(|p| p.0);
                }
                st.pairs.extend_from_slice(&mine);
            }
        }
        // out to the experts' ranks, through them, and back
        let (q, groups) = group(ep);
        let local = ne / groups;
        let per_rank = |e: u32| e as usize / local;
        let mut send_rows = vec![0usize; groups];
        let mut counts = vec![0f32; groups * local];
        for &(_, e, _) in &st.pairs {
            send_rows[per_rank(e)] += 1;
            counts[e as usize] += 1.0;
        }
        // how many rows of each local expert each rank sends here (exact in f32 below 2²⁴)
        let mut got = Vec::new();
        exchange(ep, &counts, &vec![local; groups], &vec![local; groups], &mut got)?;
        st.recv = got.chunks(local).map(|c| c.iter().map(|&x| x as usize).collect()).collect();
        let rows_in: Vec<usize> = st.recv.iter().map(|r| r.iter().sum()).collect();
        sc.send.clear();
        for &(t, _, _) in &st.pairs {
            sc.send.extend_from_slice(&h[t as usize * c..(t as usize + 1) * c]);
        }
        let (cs, cr): (Vec<usize>, Vec<usize>) =
            (send_rows.iter().map(|r| r * c).collect(), rows_in.iter().map(|r| r * c).collect());
        exchange(ep, &sc.send, &cs, &cr, &mut sc.got)?;
        st.experts.resize_with(local, ExpertStash::default);
        for (j, s) in st.experts.iter_mut().enumerate() {
            gather_expert(&sc.got, &st.recv, j, c, &mut s.x);
            if s.x.is_empty() {
                s.y.clear();
                continue;
            }
            self.expert(q * local + j).forward(p, &s.x, &mut s.mlp, &mut s.y);
        }
        let outs: Vec<&[f32]> = st.experts.iter().map(|s| s.y.as_slice()).collect();
        scatter_experts(&outs, &st.recv, c, &mut sc.send);
        exchange(ep, &sc.send, &cr, &cs, &mut st.y)?;
        ensure(out, n * c);
        out.fill(0.0);
        // the combine: each row's experts in expert order (a fixed order whatever the grouping)
        for (i, &(t, _, w)) in st.pairs.iter().enumerate() {
            let (o, y) = (&mut out[t as usize * c..(t as usize + 1) * c], &st.y[i * c..(i + 1) * c]);
            o.iter_mut().zip(y).for_each(|(o, y)| *o += w * y);
        }
        if let Some((mlp, gate)) = &self.shared {
            mlp.forward(p, h, &mut st.shared, &mut st.shared_out);
            st.shared_gate.resize(n, 0.0);
            let gw = gate.of(p);
            for t in 0..n {
                let z: f32 = h[t * c..(t + 1) * c].iter().zip(gw).map(|(a, b)| a * b).sum();
                let sg = crate::tensor::elementwise::sigmoid(z);
                st.shared_gate[t] = sg;
                let (o, s) = (&mut out[t * c..(t + 1) * c], &st.shared_out[t * c..(t + 1) * c]);
                o.iter_mut().zip(s).for_each(|(o, s)| *o += sg * s);
            }
        }
        st.aux = self.aux_losses(st, cp)?;
        Ok(st.aux)
    }

    /// The auxiliary-loss-free balancing's step: each expert's bias moves by the rate towards
    /// the even load, `b += rate · sign(mean − load)`, from `load` (the rows each expert took
    /// over the global batch, `[E]`). Every rank holding the layer applies the same counts.
    pub fn update_bias(&self, p: &mut [f32], load: &[f32]) {
        let Some(b) = self.bias else { return };
        let mean = load.iter().map(|&x| x as f64).sum::<f64>() / load.len() as f64;
        for (b, &l) in b.of_mut(p).iter_mut().zip(load) {
            let d = mean - l as f64;
            *b += if d > 0.0 {
                self.shape.bias_rate
            } else if d < 0.0 {
                -self.shape.bias_rate
            } else {
                0.0
            };
        }
    }

    /// Expert `e`, which this rank must hold.
    fn expert(&self, e: usize) -> &Mlp {
        assert!(
            (self.first..self.first + self.experts.len()).contains(&e),
            "expert {e} is not among this rank's {}..{}: the expert group is not the one the layout was cut for",
            self.first,
            self.first + self.experts.len()
        );
        &self.experts[e - self.first]
    }

    /// Each sequence's load-balancing loss and z-loss, summed over sequences: each expert's
    /// count of rows choosing it, its summed probability and the rows' `lse²`, over the whole
    /// sequence (summed over the context group `cp`, in f32 there: the counts exact); keeps each
    /// sequence's shares `f` for the backward. Under cp, this rank's 1/cp of the losses.
    fn aux_losses(&self, st: &mut MoeStash, cp: Option<&Comm>) -> Result<AuxLosses> {
        let (ne, k) = (self.shape.experts, self.shape.top_k);
        let (n, seq) = (st.lse.len(), st.seq);
        let seqs = n / seq;
        let w = 2 * ne + 1;
        let mut stats = vec![0f64; seqs * w];
        for (t, lse) in st.lse.iter().enumerate() {
            let s = &mut stats[t / seq * w..(t / seq + 1) * w];
            st.chosen[t * k..(t + 1) * k].iter().for_each(|&e| s[e as usize] += 1.0);
            s[ne..2 * ne].iter_mut().zip(&st.probs[t * ne..(t + 1) * ne]).for_each(|(a, &p)| *a += p as f64);
            s[2 * ne] += (*lse as f64) * (*lse as f64);
        }
        let group = cp.map_or(1, Comm::size);
        if let Some(c) = cp.filter(|c| c.size() > 1) {
            let mut buf: Vec<f32> = stats.iter().map(|&x| x as f32).collect();
            c.all_reduce(&mut buf, brigade_comm::ReduceOp::Sum)
                .map_err(|e| Error::Train(format!("a mixture's statistics over the context group: {e}")))?;
            stats = buf.iter().map(|&x| x as f64).collect();
        }
        st.rows = seq * group;
        let total = st.rows as f64;
        st.f = stats.chunks(w).flat_map(|s| s[..ne].iter().map(move |c| c / total)).collect();
        let mut out = AuxLosses::default();
        for (s, f) in stats.chunks(w).zip(st.f.chunks(ne.max(1))) {
            out.balance += ne as f64 * f.iter().zip(&s[ne..2 * ne]).map(|(a, p)| a * p / total).sum::<f64>();
            out.z += s[2 * ne] / total;
        }
        out.balance /= group as f64;
        out.z /= group as f64;
        Ok(out)
    }

    /// Accumulates the parameters' gradients; overwrites `dx` with the input rows' gradient.
    /// `aux` weighs each sequence's auxiliary losses (as `forward` summed them).
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        gr: &mut Grads,
        h: &[f32],
        ep: Experts,
        st: &MoeStash,
        dout: &[f32],
        dx: &mut Vec<f32>,
        aux: AuxWeights,
        sc: &mut MoeScratch,
    ) -> Result<()> {
        let MoeShape { c, experts: ne, top_k: k, norm_topk, .. } = self.shape;
        let n = h.len() / c;
        self.tally.add(st, ne);
        ensure(dx, n * c);
        dx.fill(0.0);
        // d(weight) of each (row, chosen expert), in the row's chosen order; the pairs'
        // output gradients out to the experts' ranks
        let mut dweight = vec![0f32; n * k];
        let slot = |t: usize, e: u32| st.chosen[t * k..(t + 1) * k].iter().position(|&x| x == e).unwrap();
        sc.send.clear();
        for (i, &(t, e, w)) in st.pairs.iter().enumerate() {
            let t = t as usize;
            let (d, y) = (&dout[t * c..(t + 1) * c], &st.y[i * c..(i + 1) * c]);
            dweight[t * k + slot(t, e)] = d.iter().zip(y).map(|(a, b)| a * b).sum();
            sc.send.extend(d.iter().map(|d| w * d));
        }
        let (q, groups) = group(ep);
        let local = ne / groups;
        let mut send_rows = vec![0usize; groups];
        st.pairs.iter().for_each(|&(_, e, _)| send_rows[e as usize / local] += 1);
        let cs: Vec<usize> = send_rows.iter().map(|r| r * c).collect();
        let cr: Vec<usize> = st.recv.iter().map(|r| r.iter().sum::<usize>() * c).collect();
        exchange(ep, &sc.send, &cs, &cr, &mut sc.got)?;
        let mut dxs: Vec<Vec<f32>> = Vec::with_capacity(local);
        for (j, s) in st.experts.iter().enumerate() {
            gather_expert(&sc.got, &st.recv, j, c, &mut sc.dy);
            let mut dxj = Vec::new();
            if !s.x.is_empty() {
                let scratch = MlpScratch { dh: &mut sc.dh, dup: &mut sc.dup, dx2: &mut sc.dx2 };
                self.expert(q * local + j).backward(gr, &s.x, &s.mlp, &sc.dy, &mut dxj, scratch);
            }
            dxs.push(dxj);
        }
        let parts: Vec<&[f32]> = dxs.iter().map(Vec::as_slice).collect();
        scatter_experts(&parts, &st.recv, c, &mut sc.send);
        exchange(ep, &sc.send, &cr, &cs, &mut sc.got)?;
        // the input gradients added in expert order, as the outputs were
        for (i, &(t, _, _)) in st.pairs.iter().enumerate() {
            let t = t as usize;
            let (o, d) = (&mut dx[t * c..(t + 1) * c], &sc.got[i * c..(i + 1) * c]);
            o.iter_mut().zip(d).for_each(|(o, d)| *o += d);
        }
        if let Some((mlp, gate)) = &self.shared {
            let gw = gate.of(gr.p).to_vec();
            ensure(&mut sc.dy, n * c);
            let mut dz = vec![0f32; n];
            for t in 0..n {
                let (d, s) = (&dout[t * c..(t + 1) * c], &st.shared_out[t * c..(t + 1) * c]);
                let sg = st.shared_gate[t];
                dz[t] = d.iter().zip(s).map(|(a, b)| a * b).sum::<f32>() * sg * (1.0 - sg);
                sc.dy[t * c..(t + 1) * c].iter_mut().zip(d).for_each(|(o, d)| *o = sg * d);
            }
            let scratch = MlpScratch { dh: &mut sc.dh, dup: &mut sc.dup, dx2: &mut sc.dx2 };
            mlp.backward(gr, h, &st.shared, &sc.dy, &mut sc.dx, scratch);
            crate::tensor::elementwise::add_into(dx, &sc.dx);
            let g = gate.of_mut(gr.g);
            for t in 0..n {
                let x = &h[t * c..(t + 1) * c];
                g.iter_mut().zip(x).for_each(|(g, x)| *g += dz[t] * x);
                dx[t * c..(t + 1) * c].iter_mut().zip(&gw).for_each(|(o, w)| *o += dz[t] * w);
            }
        }
        // the router: d(probabilities), then through the softmax to the logits
        ensure(&mut sc.dlogits, n * ne);
        // (the statistics over whole sequences of `st.rows`, from the forward)
        let (seq, rows) = (st.seq.max(1), st.rows.max(1));
        let mut dp = vec![0f32; ne];
        for t in 0..n {
            let f = &st.f[t / seq * ne..(t / seq + 1) * ne];
            let p = &st.probs[t * ne..(t + 1) * ne];
            let chosen = &st.chosen[t * k..(t + 1) * k];
            dp.fill(0.0);
            let dw = &dweight[t * k..(t + 1) * k];
            if norm_topk {
                let sum: f32 = chosen.iter().map(|&e| p[e as usize]).sum();
                let mean: f32 = chosen.iter().zip(dw).map(|(&e, d)| d * p[e as usize] / sum).sum();
                for (&e, d) in chosen.iter().zip(dw) {
                    dp[e as usize] = (d - mean) / sum;
                }
            } else {
                for (&e, d) in chosen.iter().zip(dw) {
                    dp[e as usize] = *d;
                }
            }
            let dl = &mut sc.dlogits[t * ne..(t + 1) * ne];
            if aux.balance != 0.0 {
                // d/dp_ti of E·Σ fᵢ·(1/T)Σ_t p_ti, f held (counts have no gradient)
                for (d, fi) in dp.iter_mut().zip(f) {
                    *d += aux.balance * ne as f32 * *fi as f32 / rows as f32;
                }
            }
            let dot: f32 = dp.iter().zip(p).map(|(a, b)| a * b).sum();
            for ((o, &d), &pi) in dl.iter_mut().zip(&dp).zip(p) {
                *o = pi * (d - dot);
            }
            if aux.z != 0.0 {
                // d/dlogits of lse² / T is 2·lse·p / T
                let w = aux.z * 2.0 * st.lse[t] / rows as f32;
                dl.iter_mut().zip(p).for_each(|(o, pi)| *o += w * pi);
            }
        }
        if n > 0 {
            gr.dw.add(gr.g, self.router, &sc.dlogits, h, (ne, n, c));
            matmul(dx, &sc.dlogits, self.router.of(gr.p), n, ne, c, false, false, true);
        }
        Ok(())
    }
}

/// The expert group a layer's experts are spread over (expert parallelism): rank q of P holds
/// experts `q·E/P .. (q+1)·E/P`; `None`: one rank holds them all.
pub type Experts<'a> = Option<&'a Comm>;

/// (this rank's place, ranks) in the expert group.
fn group(ep: Experts) -> (usize, usize) {
    ep.map_or((0, 1), |c| (c.rank(), c.size()))
}

/// `input`'s pieces of `send[r]` elements to each rank r of the group, `recv[r]` from each
/// into `out` (one rank: a copy).
fn exchange(ep: Experts, input: &[f32], send: &[usize], recv: &[usize], out: &mut Vec<f32>) -> Result<()> {
    out.resize(recv.iter().sum(), 0.0);
    match ep {
        None => out.copy_from_slice(input),
        Some(comm) => comm
            .all_to_all_v(input, send, out, recv)
            .map_err(|e| Error::Train(format!("expert-parallel dispatch: {e}")))?,
    }
    Ok(())
}

/// Local expert `j`'s rows out of what the group sent (`recv[r][j]` rows from each rank r, the
/// rank's pieces in expert order), in rank order.
fn gather_expert(got: &[f32], recv: &[Vec<usize>], j: usize, c: usize, out: &mut Vec<f32>) {
    out.clear();
    let mut at = 0;
    for r in recv {
        let before: usize = r[..j].iter().sum();
        out.extend_from_slice(&got[(at + before) * c..(at + before + r[j]) * c]);
        at += r.iter().sum::<usize>();
    }
}

/// The inverse of `gather_expert` for every local expert: each expert's rows (`per[j]`) laid
/// out as the group sent them, rank by rank, to go back.
fn scatter_experts(per: &[&[f32]], recv: &[Vec<usize>], c: usize, out: &mut Vec<f32>) {
    out.clear();
    let mut taken = vec![0usize; per.len()];
    for r in recv {
        for (j, &rows) in r.iter().enumerate() {
            out.extend_from_slice(&per[j][taken[j] * c..(taken[j] + rows) * c]);
            taken[j] += rows;
        }
    }
}

/// Softmax of `row` in place (f32, max subtracted); returns `log Σ exp(row)`. The router's, in
/// training and serving.
pub fn softmax_in_place(row: &mut [f32]) -> f32 {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let mut sum = 0f32;
    for x in row.iter_mut() {
        *x = (*x - max).exp();
        sum += *x;
    }
    row.iter_mut().for_each(|x| *x /= sum);
    max + sum.ln()
}

/// The `k` largest of `row` (ties to the lower index), best first.
pub fn top_k(row: &[f32], k: usize, out: &mut Vec<u32>) {
    out.clear();
    out.extend(0..row.len() as u32);
    out.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
    out.truncate(k);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rows an expert takes, against megatron-core's `get_capacity(num_tokens=tokens·k,
    /// num_experts=E, capacity_factor=F)` = `math.ceil((tokens·k / E) · F)` evaluated in Python:
    /// (5, 1, 1, 1.2) → 6, (10, 2, 4, 1.2) → 6, (8, 2, 4, 0.5) → 2, (7, 1, 3, 1.1) → 3; at
    /// least 1 (0.01 of 10 rows); 0 is dropless.
    #[test]
    fn capacity_as_megatron_computes_it() {
        let shape = |experts, top_k, capacity| MoeShape {
            c: 8,
            experts,
            top_k,
            width: 4,
            shared_width: 0,
            norm_topk: false,
            bias_rate: 0.0,
            capacity,
        };
        for (seq, k, e, f, want) in [(5, 1, 1, 1.2, 6), (10, 2, 4, 1.2, 6), (8, 2, 4, 0.5, 2), (7, 1, 3, 1.1, 3)] {
            assert_eq!(shape(e, k, f).expert_capacity(seq), want, "{seq} rows, k {k}, {e} experts, factor {f}");
        }
        assert_eq!(shape(4, 2, 0.01).expert_capacity(10), 1);
        assert_eq!(shape(4, 2, 0.0).expert_capacity(10), usize::MAX);
    }
}
