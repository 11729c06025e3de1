//! The cost model: FLOPs, memory and step time of one layout. Pure functions, one formula
//! for every model, cluster and layout; the constants below are global (not per run).

use super::catalog::{Accelerator, ModelShape};
use crate::layout::{CpComm, CpOrder, Schedule};
pub use crate::layout::{Layout, Recompute};
use crate::parallel::pipeline::{schedule, simulate, Plan};
use serde::Serialize;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// Matrix products whose smallest per-GPU dimension is `x` run at `x / (x + SHAPE_X0)` of the
/// large-matrix efficiency: slicing the hidden size over many tensor-parallel GPUs costs.
const SHAPE_X0: f64 = 128.0;
/// Bytes of memory traffic of the non-matmul operations (LayerNorm, activations, residuals,
/// dropout, softmax bookkeeping) per byte of stored activation, forward pass.
const ELEMENTWISE_TRAFFIC: f64 = 8.0;
/// Latency of one collective or message step (α of the α–β model), seconds.
const ALPHA_S: f64 = 5e-6;
/// Framework overhead per GPU (CUDA context, workspaces, fragmentation), GiB.
const RESERVED_GIB: f64 = 2.0;

/// Number format of the run's matrix products, activations and communication.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// bf16/fp16 mixed precision with fp32 master weights and Adam moments (the default).
    Bf16,
    /// fp32 throughout, matrix products on TF32 tensor cores.
    Fp32,
}

impl Precision {
    pub fn parse(s: &str) -> Option<Precision> {
        match s {
            "bf16" | "fp16" => Some(Precision::Bf16),
            "fp32" | "tf32" => Some(Precision::Fp32),
            _ => None,
        }
    }
    /// Bytes of one activation, gradient or communicated element.
    pub fn bytes(self) -> f64 {
        match self {
            Precision::Bf16 => 2.0,
            Precision::Fp32 => 4.0,
        }
    }
}

/// The run: global batch in sequences, number format, and whether attention is a fused
/// (flash) kernel that keeps no s×s scores.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Training {
    pub global_batch: usize,
    pub flash_attention: bool,
    pub precision: Precision,
    /// A mixture's busiest expert's tokens over the mean (1: perfectly balanced; brigade's
    /// training reports it per step as `moe_load_max_over_mean`): the expert-parallel rank
    /// holding it computes and exchanges that much more, and the others wait for it.
    pub expert_imbalance: f64,
}

impl Default for Training {
    fn default() -> Self {
        Training { global_batch: 1, flash_attention: true, precision: Precision::Bf16, expert_imbalance: 1.0 }
    }
}

impl Training {
    /// Peak matrix rate of `a` in this run's format, FLOP/s.
    fn peak(&self, a: &Accelerator) -> f64 {
        (match self.precision {
            Precision::Bf16 => a.peak_tflops,
            Precision::Fp32 => a.tf32_tflops,
        }) * 1e12
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Breakdown {
    /// Forward, backward and recomputation on the busiest stage, all micro-batches.
    pub compute_s: f64,
    pub tp_comm_s: f64,
    /// Context parallelism's exchange of keys and values that attention does not hide.
    pub cp_comm_s: f64,
    /// Expert parallelism's all-to-alls (tokens to their experts' ranks and back).
    pub ep_comm_s: f64,
    pub pp_bubble_s: f64,
    pub p2p_s: f64,
    /// Data-parallel gradient reduction not hidden behind the last backward.
    pub dp_exposed_s: f64,
    pub optimizer_s: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Estimate {
    pub layout: Layout,
    pub step_time_s: f64,
    pub breakdown: Breakdown,
    /// TFLOP/s per GPU counting the model's FLOPs (no recomputation).
    pub model_tflops_per_gpu: f64,
    /// TFLOP/s per GPU counting what the hardware executes (recomputation included).
    pub hw_tflops_per_gpu: f64,
    pub mfu: f64,
    pub memory_gib_per_gpu: f64,
    pub fits: bool,
}

/// The layout's micro-batch; unset, a dp replica's whole share of the global batch (the rule
/// `Layout::micro_batch` applies to a run).
fn micro_batch(t: &Training, l: &Layout) -> usize {
    l.mb.unwrap_or(t.global_batch / l.dp).max(1)
}

/// Tokens of one micro-batch on one rank: its sequences, each cut over the context group.
fn rank_tokens(m: &ModelShape, t: &Training, l: &Layout) -> f64 {
    (micro_batch(t, l) * m.seq) as f64 / l.cp as f64
}

/// The busiest context rank's share of a sequence's attention work, over the even share `1/cp`:
/// zigzag chunks give every rank the same work; contiguous ones give the last rank
/// (2·cp − 1)/cp² of it.
fn cp_imbalance(l: &Layout) -> f64 {
    match l.cp_order {
        CpOrder::Zigzag => 1.0,
        CpOrder::Contiguous => (2 * l.cp - 1) as f64 / l.cp as f64,
    }
}

/// The widths of one layer's queries (all heads) and of its keys (= its values).
fn attn_widths(m: &ModelShape) -> (f64, f64) {
    ((m.heads * m.head_dim) as f64, (m.kv_heads * m.head_dim) as f64)
}

/// Parameters of one layer, averaged over the layers: (the matrices a token passes through —
/// attention, the dense MLP or its k experts, a shared expert and the router —, every matrix —
/// every expert —, the routed experts' alone).
fn layer_matrices(m: &ModelShape) -> (f64, f64, f64) {
    let h = m.hidden as f64;
    let (q, kv) = attn_widths(m);
    let attn = h * (q + 2.0 * kv) + q * h;
    let per_mlp = if m.swiglu { 3.0 } else { 2.0 };
    let dense = h * m.ffn as f64 * per_mlp;
    let Some(e) = m.moe else { return (attn + dense, attn + dense, 0.0) };
    let (l, lm) = (m.layers as f64, e.layers as f64);
    let expert = 3.0 * h * e.width as f64;
    // the router, and a shared expert with its one-logit gate
    let always = h * e.experts as f64 + if e.shared > 0 { 3.0 * h * e.shared as f64 + h } else { 0.0 };
    let avg = |moe: f64| ((l - lm) * dense + lm * moe) / l;
    let routed = lm * expert * e.experts as f64 / l;
    (attn + avg(always + e.top_k as f64 * expert), attn + avg(always) + routed, routed)
}

/// FLOPs per token of one layer's forward pass (averaged over the layers): (matrix products,
/// attention core). A mixture counts the k experts a token goes to, not the others.
pub fn layer_flops_per_token(m: &ModelShape) -> (f64, f64) {
    let (active, _, _) = layer_matrices(m);
    // q·kᵀ and p·v over the full s×s square, as the Megatron-LM paper counts
    (2.0 * active, 4.0 * m.seq as f64 * attn_widths(m).0)
}

/// Parameters: per layer (every expert of a mixture), and the embedding (the LM head's too
/// when tied; an untied head is as many again, see `head_params`).
pub fn params(m: &ModelShape) -> (f64, f64) {
    (layer_matrices(m).1, (m.vocab * m.hidden) as f64)
}

/// Of `params`' per layer, the routed experts' (spread over the expert-parallel ranks).
pub fn expert_params(m: &ModelShape) -> f64 {
    layer_matrices(m).2
}

/// The routed experts' share of a token's matrix-product FLOPs in a layer (what the busiest
/// expert-parallel rank does `expert_imbalance` times as much of).
fn expert_flop_share(m: &ModelShape) -> f64 {
    let Some(e) = m.moe else { return 0.0 };
    let (active, _, _) = layer_matrices(m);
    let routed = e.layers as f64 * e.top_k as f64 * 3.0 * (m.hidden * e.width) as f64 / m.layers as f64;
    routed / active
}

/// Training FLOPs of one step: (model FLOPs, hardware FLOPs incl. recomputation).
/// For GPT shapes the first is 72·B·s·l·h²·(1 + s/6h + V/12lh) and, with full recomputation,
/// the second is the Megatron-LM paper's 96·B·s·l·h²·(1 + s/6h + V/16lh).
/// Parameters of an untied LM head (0 when tied to the embedding).
pub fn head_params(m: &ModelShape) -> f64 {
    if m.tied {
        0.0
    } else {
        (m.vocab * m.hidden) as f64
    }
}

pub fn step_flops(m: &ModelShape, batch: usize, rec: Recompute) -> (f64, f64) {
    let (lin, att) = layer_flops_per_token(m);
    let l = m.layers as f64;
    let tokens = (batch * m.seq) as f64;
    let head = 2.0 * (m.hidden * m.vocab) as f64;
    let model = 3.0 * tokens * (l * (lin + att) + head);
    let extra = match rec {
        Recompute::None => 0.0,
        Recompute::Selective => l * att,
        Recompute::Full => l * (lin + att),
    };
    (model, model + tokens * extra)
}

/// Bytes of activations one layer stores per token (16-bit, Korthikanti et al. 2022,
/// generalised to grouped-query attention and any MLP width), before tensor parallelism.
fn activation_bytes_per_token(m: &ModelShape, t: &Training, rec: Recompute) -> f64 {
    let h = m.hidden as f64;
    let hkv = attn_widths(m).1;
    // a mixture's token passes through k experts (and a shared one): their widths, averaged
    let f = match m.moe {
        None => m.ffn as f64,
        Some(e) => {
            let moe = (e.top_k * e.width + e.shared) as f64;
            ((m.layers - e.layers) as f64 * m.ffn as f64 + e.layers as f64 * moe) / m.layers as f64
        }
    };
    let attention = 7.0 * h + 4.0 * hkv; // qkv input, q, k, v, projection input, dropout mask
    let mlp = if m.swiglu { 3.0 * h + 6.0 * f } else { 3.0 * h + 4.0 * f };
    let norms = 4.0 * h;
    let scores = if t.flash_attention || rec != Recompute::None { 0.0 } else { 5.0 * (m.heads * m.seq) as f64 };
    (attention + mlp + norms + scores) * t.precision.bytes() / 2.0
}

/// Layers on the busiest pipeline rank.
fn layers_per_stage(m: &ModelShape, l: &Layout) -> usize {
    layers_per_rank(m, l).into_iter().max().unwrap_or(0)
}

/// Layers on each pipeline rank: the model's layers over pp·v stages as evenly as they go; when
/// they do not divide, the first and last stages (which also hold the embedding and the LM
/// head) take the fewer, as Llama 3 405B's 126 layers on 16 stages were split 7, 8 × 14, 7.
/// Rank r holds stages r, r + pp, … (interleaving).
pub fn layers_per_rank(m: &ModelShape, l: &Layout) -> Vec<usize> {
    let stages = l.pp * l.v;
    let mut per_stage = vec![m.layers / stages; stages];
    let order: Vec<usize> = match stages {
        1 => vec![0],
        _ => (1..stages - 1).chain([stages - 1, 0]).collect(),
    };
    for &s in order.iter().take(m.layers % stages) {
        per_stage[s] += 1;
    }
    (0..l.pp).map(|r| (0..l.v).map(|c| per_stage[c * l.pp + r]).sum()).collect()
}

/// Whether the layout's groups leave a node, with ranks ordered tp (innermost), dp, pp.
fn spans(group_stride: usize, group_size: usize, gpn: usize) -> bool {
    group_stride * group_size > gpn
}

/// All-reduce time over `n` ranks by the α–β model, whichever of ring and tree is faster:
/// a ring takes 2(n−1) steps and moves `factor`·(n−1)/n of the bytes (bandwidth-optimal); a
/// double binary tree takes 2·log₂n steps and moves the bytes twice (latency-optimal).
fn all_reduce_time(n: usize, bytes: f64, bw_gbps: f64, factor: f64) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let bw = bw_gbps * 1e9;
    let ring = 2.0 * (n - 1) as f64 * ALPHA_S + factor * (n - 1) as f64 / n as f64 * bytes / bw;
    let tree = 2.0 * (n as f64).log2().ceil() * ALPHA_S + factor * bytes / bw;
    ring.min(tree)
}

/// Micro-batches whose activations the first stage holds at once, in units of a whole stage's
/// layers: GPipe all `m`; 1F1B min(pp, m); interleaved 1F1B (Megatron's warm-up of
/// 2(pp − 1) + (v − 1)·pp chunks, plus one) (pp·v + pp − 1) / v chunks of 1/v of the stage.
/// The schedule simulator measures the same (`tests/pipeline_schedules.rs`).
pub fn in_flight(l: &Layout, micro_batches: usize) -> f64 {
    in_flight_at(l, micro_batches, 0)
}

/// `in_flight` of pipeline rank `r`: GPipe `m`; 1F1B min(pp − r, m); interleaved
/// min(2(pp − r − 1) + (v − 1)·pp + 1, m·v) chunks of 1/v of the rank's layers; ZB-H1 at most
/// min(pp, m) on every rank (a micro-batch is held until its deferred weight gradients run).
pub fn in_flight_at(l: &Layout, micro_batches: usize, r: usize) -> f64 {
    let (pp, m, v, r) = (l.pp as f64, micro_batches as f64, l.v as f64, r as f64);
    match (l.pp, l.v) {
        (1, _) => 1.0,
        _ if l.schedule == Schedule::GPipe => m,
        _ if l.schedule == Schedule::ZeroBubble => pp.min(m),
        (_, 1) => (pp - r).min(m),
        _ => ((2.0 * (pp - r - 1.0) + (v - 1.0) * pp + 1.0).min(m * v)) / v,
    }
}

/// Memory per GPU (GiB) on the most loaded pipeline rank: each rank's layers, its in-flight
/// micro-batches (the first rank holds the most), and the embedding (first stage) or the LM
/// head with its logits (last stage) where it holds them.
pub fn memory_gib(m: &ModelShape, t: &Training, l: &Layout) -> f64 {
    let layers = layers_per_rank(m, l);
    (0..l.pp).map(|r| rank_memory_gib(m, t, l, r, layers[r])).fold(0.0, f64::max)
}

fn rank_memory_gib(m: &ModelShape, t: &Training, l: &Layout, r: usize, layers: usize) -> f64 {
    let (per_layer, embed) = params(m);
    let lps = layers as f64;
    // rank 0 runs the first stage (embedding), rank pp − 1 the last (the tied head's copy)
    let (first, last) = (r == 0, r == l.pp - 1);
    let tp = l.tp as f64;
    // the last stage holds the head: the table's copy when tied, or lm_head; one stage holding
    // both ends keeps one table when tied
    let ends = match (first, last) {
        (true, true) => embed + head_params(m),
        (false, false) => 0.0,
        _ => embed,
    };
    // the routed experts spread over the expert group, the rest whole on each rank
    let experts = lps * expert_params(m) / tp;
    let p = (lps * per_layer + ends) / tp - experts;
    // ZeRO cuts its pieces over every rank holding the same parameters: data × context, and
    // for the experts the dp · cp / ep ranks holding the same ones
    let dp = (l.dp * l.cp) as f64;
    let ep = l.ep.max(1) as f64;
    // 16 bytes/param either way: mixed precision keeps bf16 weights and grads (2 + 2) and
    // fp32 master weights and moments (12); fp32 keeps weights and grads (4 + 4) and moments (8).
    let (w, g) = (t.precision.bytes(), t.precision.bytes());
    let per_param = |dp: f64| match l.zero {
        0 => 16.0,
        1 => w + g + (16.0 - w - g) / dp,
        2 => w + (16.0 - w) / dp,
        _ => 16.0 / dp,
    };
    let state = per_param(dp) * p + per_param(dp / ep) * experts / ep;
    let tokens = rank_tokens(m, t, l);
    let per_layer_act = tokens * activation_bytes_per_token(m, t, l.recompute) / tp; // sequence parallel
    let stored = match l.recompute {
        Recompute::Full => t.precision.bytes() * tokens * m.hidden as f64 / tp, // the layer input only
        _ => per_layer_act,
    };
    let in_flight = in_flight_at(l, t.global_batch / (l.dp * micro_batch(t, l)), r);
    let recompute_working_set = if l.recompute == Recompute::Full { per_layer_act } else { 0.0 };
    // logits + fp32 softmax, on the last stage
    let logits = if last { tokens * m.vocab as f64 / tp * (t.precision.bytes() + 4.0) } else { 0.0 };
    // context parallelism: the keys and values a layer's attention reads from the group (all
    // of the sequence's, all-gathered; a ring holds two blocks)
    let hkv = attn_widths(m).1;
    let kv = 2.0 * tokens * hkv * t.precision.bytes() / tp;
    let exchanged = match (l.cp, l.cp_comm) {
        (1, _) => 0.0,
        (cp, CpComm::AllGather) => kv * cp as f64,
        (_, CpComm::Ring) => 2.0 * kv,
    };
    let act = lps * stored * in_flight + recompute_working_set + logits + exchanged;
    (state + act) / (1u64 << 30) as f64 + RESERVED_GIB
}

/// Expert parallelism's all-to-alls in one layer of one micro-batch, averaged over the layers
/// (the mixtures' share of them): each rank sends its `tokens` (cut over tp, as sequence
/// parallelism holds them) × k copies to their experts' ranks and takes the outputs back, in
/// the forward and twice so in the backward (and once more forward under full recompute); the
/// (ep − 1)/ep that leave the rank cross NVLink inside a node or the network across nodes, the
/// busiest rank's share `expert_imbalance` times the mean.
fn all_to_all_per_layer(m: &ModelShape, a: &Accelerator, t: &Training, l: &Layout, tokens: f64) -> f64 {
    let (Some(e), ep) = (m.moe, l.ep.max(1)) else { return 0.0 };
    if ep == 1 {
        return 0.0;
    }
    let bw = if spans(l.tp, ep, a.gpus_per_node) { a.net_gbps } else { a.nvlink_gbps } * 1e9;
    let bytes = tokens / l.tp as f64 * e.top_k as f64 * m.hidden as f64 * t.precision.bytes();
    let one = (ep - 1) as f64 * ALPHA_S + bytes * (ep - 1) as f64 / ep as f64 * t.expert_imbalance / bw;
    let n = if l.recompute == Recompute::Full { 6.0 } else { 4.0 };
    n * one * e.layers as f64 / m.layers as f64
}

/// One micro-batch's work on a pipeline stage, seconds: its forward, its whole backward, and
/// the weight-gradient half of that backward (what ZB-H1 defers).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Work {
    pub forward: f64,
    pub backward: f64,
    pub weight: f64,
}

/// ZB-H1 plans by (pp, micro-batches) (None: it does not build).
type Plans = HashMap<(usize, usize), Option<Rc<Plan>>>;
/// ZB-H1's idle seconds by (pp, micro-batches, the bits of F, B, W).
type Idle = HashMap<(usize, usize, [u64; 3]), Option<f64>>;

/// The busiest pipeline rank's idle seconds in a step of `micro` micro-batches of `work` each
/// (split evenly over its v chunks). GPipe, 1F1B and interleaved 1F1B idle
/// (pp − 1)/v · (F + B) — what the simulator gives their plans with equal chunks
/// (`tests/planner_formulas.rs` checks it). ZB-H1's bubble is what the trainer's own plan
/// takes: the simulator's makespan of `schedule::build(ZeroBubble, pp, micro)` with these
/// costs, less the rank's work; its deferred W halves fill part of 1F1B's bubble (Qi et al.
/// 2023 bound the rest by (pp − 1)(F + B − W), which is the fallback should the plan not build).
pub fn pipeline_bubble(l: &Layout, micro: usize, w: Work) -> f64 {
    let (pp, v) = (l.pp as f64, l.v as f64);
    if l.pp == 1 {
        return 0.0;
    }
    if l.schedule != Schedule::ZeroBubble {
        return (pp - 1.0) / v * (w.forward + w.backward);
    }
    let costs = simulate::Costs {
        forward: w.forward,
        backward: w.backward,
        backward_input: w.backward - w.weight,
        backward_weight: w.weight,
        transfer: 0.0,
    };
    // a search asks for the same plan (pp, m) thousands of times, and for the same costs once
    // per ZeRO stage: both are kept for the thread's later calls
    thread_local! {
        static PLANS: RefCell<Plans> = RefCell::default();
        static IDLE: RefCell<Idle> = RefCell::default();
    }
    let key = (l.pp, micro, [w.forward.to_bits(), w.backward.to_bits(), w.weight.to_bits()]);
    let idle = IDLE.with(|c| c.borrow().get(&key).copied()).unwrap_or_else(|| {
        let plan = PLANS.with(|c| {
            let mut c = c.borrow_mut();
            let built = || schedule::build(Schedule::ZeroBubble, l.pp, micro, 1).ok().map(Rc::new);
            c.entry((l.pp, micro)).or_insert_with(built).clone()
        });
        let idle = plan
            .and_then(|p| simulate::simulate(&p, &costs).ok())
            .map(|r| (r.makespan - micro as f64 * (w.forward + w.backward)).max(0.0));
        IDLE.with(|c| c.borrow_mut().insert(key, idle));
        idle
    });
    idle.unwrap_or((pp - 1.0) * (w.forward + w.backward - 2.0 * w.weight).max(0.0))
}

/// Seconds per layer and micro-batch that context parallelism's exchange of keys and values
/// adds, forward and backward (and again for a recomputed forward), given the attention's own
/// forward seconds `t_att` on a rank. All-gather: the group's keys and values gathered before
/// attention, their gradients reduce-scattered after, nothing hidden. Ring: cp − 1 hops of one
/// block forward (keys and values) and cp of two backward (with their gradients), each hidden
/// behind the attention of the block in hand.
fn cp_exposed_per_layer(
    m: &ModelShape,
    a: &Accelerator,
    t: &Training,
    l: &Layout,
    (t_att, recomputed): (f64, bool),
) -> f64 {
    if l.cp == 1 {
        return 0.0;
    }
    let cp = l.cp as f64;
    // the group's stride is tp: it leaves the node when tp·cp ranks do not fit in one
    let bw = if spans(l.tp, l.cp, a.gpus_per_node) { a.net_gbps } else { a.nvlink_gbps } * 1e9;
    let hkv = attn_widths(m).1;
    let block = 2.0 * rank_tokens(m, t, l) * hkv * t.precision.bytes() / l.tp as f64;
    let forwards = if recomputed { 2.0 } else { 1.0 };
    match l.cp_comm {
        CpComm::AllGather => {
            let gather = (cp - 1.0) * (ALPHA_S + block / bw);
            (forwards + 1.0) * gather
        }
        CpComm::Ring => {
            let hop = ALPHA_S + block / bw;
            let step_att = t_att / cp;
            let fwd = (cp - 1.0) * (hop - step_att).max(0.0);
            let bwd = cp * (2.0 * hop - 2.0 * step_att).max(0.0);
            forwards * fwd + bwd
        }
    }
}

/// Step time and utilisation of one layout (the layout must be valid: see `search`).
pub fn estimate(m: &ModelShape, a: &Accelerator, t: &Training, l: &Layout) -> Estimate {
    let (lin, att) = layer_flops_per_token(m);
    let peak = t.peak(a);
    let tp = l.tp as f64;
    let tokens = rank_tokens(m, t, l);
    let x = m.hidden as f64 / tp;
    let gemm_eff = a.gemm_efficiency * x / (x + SHAPE_X0);
    // the busiest expert-parallel rank computes its experts' share `expert_imbalance` times over
    let imbalance = 1.0 + expert_flop_share(m) * (t.expert_imbalance - 1.0);
    let t_lin = tokens * lin * imbalance / tp / (peak * gemm_eff);
    // each rank's queries attend over the whole sequence: its share of the work, balanced or not
    let t_att = tokens * att * cp_imbalance(l) / tp / (peak * a.attention_efficiency);
    let stored = tokens * activation_bytes_per_token(m, t, Recompute::Full) / tp;
    let t_mem = ELEMENTWISE_TRAFFIC * stored / (a.hbm_tbps * 1e12);
    let fwd = t_lin + t_att + t_mem;
    let bwd = 2.0 * fwd;
    let rec = match l.recompute {
        Recompute::None => 0.0,
        Recompute::Selective => t_att,
        Recompute::Full => fwd,
    };
    // Tensor parallel: 2 all-reduces (or reduce-scatter + all-gather) forward, 2 backward,
    // 2 more when the forward is recomputed, of the layer's activations.
    let gpn = a.gpus_per_node;
    let act_bytes = tokens * m.hidden as f64 * t.precision.bytes();
    let tp_bw = if spans(1, l.tp, gpn) { a.net_gbps } else { a.nvlink_gbps };
    let n_tp = if l.recompute == Recompute::Full { 6.0 } else { 4.0 };
    let tp_per_layer = n_tp * all_reduce_time(l.tp, act_bytes, tp_bw, 2.0);
    let lps = layers_per_stage(m, l) as f64;
    let head = 3.0 * tokens * 2.0 * (m.hidden * m.vocab) as f64 / tp / (peak * gemm_eff);
    let compute_mb = lps * (fwd + bwd + rec) + head;
    let tp_mb = lps * tp_per_layer;
    let cp_mb = lps * cp_exposed_per_layer(m, a, t, l, (t_att, rec > 0.0));
    let ep_mb = lps * all_to_all_per_layer(m, a, t, l, tokens);
    let stage_mb = compute_mb + tp_mb + cp_mb + ep_mb;
    let micro = t.global_batch / (l.dp * micro_batch(t, l));
    // a micro-batch on the busiest stage: its forward with the forward's two tensor-parallel
    // collectives, its backward (recomputation and the other collectives), and the backward's
    // weight-gradient half (the matrix products' weight side, no communication)
    let forward = lps * (fwd + 2.0 * tp_per_layer / n_tp) + head / 3.0;
    let work = Work { forward, backward: stage_mb - forward, weight: lps * bwd / 2.0 + head / 3.0 };
    let bubble = pipeline_bubble(l, micro, work);
    let micro = micro as f64;
    // Pipeline point-to-point: activations forward and gradients back, per chunk and micro-batch.
    let pp_bw = if l.tp * l.cp * l.dp >= gpn { a.net_gbps } else { a.nvlink_gbps };
    let p2p = if l.pp > 1 { 2.0 * l.v as f64 * micro * (ALPHA_S + act_bytes / tp / (pp_bw * 1e9)) } else { 0.0 };
    // Data parallel: gradients of this GPU's parameters, hidden behind the last backward.
    let (per_layer, embed) = params(m);
    let ep = l.ep.max(1);
    let experts = lps * expert_params(m) / tp;
    let p_gpu = (lps * per_layer + embed + head_params(m)) / tp - experts;
    // (summed over the data × context ranks, which hold the same parameters; a rank's experts
    // over the dp · cp / ep of them holding the same experts)
    let replicas = l.dp * l.cp;
    let dp_bw = if spans(l.tp, replicas, gpn) { a.net_gbps } else { a.nvlink_gbps };
    let edp_bw = if spans(l.tp * ep, replicas / ep, gpn) { a.net_gbps } else { a.nvlink_gbps };
    let zero_factor = if l.zero >= 3 { 1.5 } else { 1.0 };
    let bytes = t.precision.bytes();
    let expert_time = match m.moe {
        Some(_) => all_reduce_time(replicas / ep, bytes * experts / ep as f64, edp_bw, 2.0),
        None => 0.0,
    };
    let dp_time = zero_factor * (all_reduce_time(replicas, bytes * p_gpu, dp_bw, 2.0) + expert_time);
    let dp_exposed = (dp_time - lps * bwd).max(0.0);
    let opt_params = match l.zero {
        0 => p_gpu + experts / ep as f64,
        _ => p_gpu / replicas as f64 + experts / replicas as f64,
    };
    let optimizer = 16.0 * opt_params / (a.hbm_tbps * 1e12);
    let breakdown = Breakdown {
        compute_s: micro * compute_mb,
        tp_comm_s: micro * tp_mb,
        cp_comm_s: micro * cp_mb,
        ep_comm_s: micro * ep_mb,
        pp_bubble_s: bubble,
        p2p_s: p2p,
        dp_exposed_s: dp_exposed,
        optimizer_s: optimizer,
    };
    let step = micro * stage_mb + bubble + p2p + dp_exposed + optimizer;
    let gpus = (l.tp * l.pp * l.dp * l.cp) as f64;
    let (fm, fh) = step_flops(m, t.global_batch, l.recompute);
    let mem = memory_gib(m, t, l);
    Estimate {
        layout: *l,
        step_time_s: step,
        breakdown,
        model_tflops_per_gpu: fm / gpus / step / 1e12,
        hw_tflops_per_gpu: fh / gpus / step / 1e12,
        mfu: fm / gpus / step / peak,
        memory_gib_per_gpu: mem,
        fits: mem <= a.hbm_gib,
    }
}
