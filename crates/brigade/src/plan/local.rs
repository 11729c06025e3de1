//! `brigade plan --local`: the step time of a `brigade train` configuration on this machine,
//! predicted from what `bench::machine` measured of it (a pure cost model: it measures
//! nothing itself).
//!
//! The parts stay separate (matrix products, attention, memory-bound kernels, optimizer) so
//! that parallel layouts add collective, point-to-point and bubble terms from the same
//! measurements.

use crate::models::GptConfig;
use serde::Serialize;

/// What was measured on this machine (on the caller's thread pool).
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    pub threads: usize,
    /// The tensor-parallel degree whose rank's shapes were measured (1: the whole model).
    pub tp: usize,
    /// Seconds of each matrix product of one training step, by layer kind, measured.
    pub matmul_s: Vec<(String, f64)>,
    /// One block's matrix products on one micro-batch: forward, weight gradients, input
    /// gradients (what a zero-bubble W and B each run).
    pub block_matmul_s: [f64; 3],
    /// The LM head's, likewise.
    pub head_matmul_s: [f64; 3],
    /// Seconds of one layer's attention core, forward and backward, measured.
    pub attention_layer_s: f64,
    pub attention_fwd_s: f64,
    pub attention_bwd_s: f64,
    /// Memory bandwidth of a streaming copy on this pool, GB/s.
    pub mem_gbps: f64,
    /// f32 matmul rate at 2048³, GFLOP/s (for reference).
    pub matmul_gflops: f64,
}

/// brigade-comm's all-reduce between rank threads of this machine.
#[derive(Clone, Debug, Serialize)]
pub struct Collectives {
    pub ranks: usize,
    /// Time of an 8-byte all-reduce, µs (the α of the α–β model).
    pub latency_us: f64,
    /// Bus bandwidth of a 64 MiB all-reduce, GB/s (the β).
    pub busbw_gbps: f64,
}

impl Collectives {
    /// Predicted time of an all-reduce of `bytes` (α–β with the measured figures).
    pub fn all_reduce_s(&self, bytes: f64) -> f64 {
        if self.ranks <= 1 {
            return 0.0;
        }
        let bus = 2.0 * (self.ranks - 1) as f64 / self.ranks as f64;
        self.latency_us * 1e-6 + bus * bytes / (self.busbw_gbps * 1e9)
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct LocalPrediction {
    pub step_s: f64,
    pub matmul_s: f64,
    pub attention_s: f64,
    pub elementwise_s: f64,
    pub optimizer_s: f64,
    /// Zero for one worker; parallel layouts fill these from brigade-comm's measurements.
    pub collective_s: f64,
    pub bubble_s: f64,
}

/// Bytes the memory-bound kernels of one step move per token: LayerNorms, GELU, residual adds
/// and bias broadcasts per layer (forward and backward), embedding, and the softmax
/// cross-entropy over the vocabulary (four passes over the logits).
fn elementwise_bytes_per_token(cfg: &GptConfig) -> f64 {
    let c = cfg.n_embd as f64;
    // by the block's kinds: a GELU MLP with biased Conv1D products (GPT-2), or SwiGLU with
    // separate, rotated projections (the Llama family)
    let per_layer = match cfg.block(0).mlp {
        crate::models::family::MlpSpec::Gelu { .. } => {
            2.0 * 6.0 * c // two LayerNorms: x, out forward; x, dout, dx backward
        + 20.0 * c // GELU on 4C: read/write forward, two reads and a write backward
        + 6.0 * c // two residual adds
        + 9.0 * c // bias broadcasts into 3C, C, 4C, C outputs
        + 8.0 * c // bias gradients and the activation-gradient accumulations
        }
        crate::models::family::MlpSpec::SwiGlu { .. } | crate::models::family::MlpSpec::Moe(_) => {
            let (q, kv, m) = (cfg.q_width() as f64, cfg.kv_width() as f64, cfg.mlp_width() as f64);
            2.0 * 6.0 * c // two RMSNorms
            + 4.0 * (q + kv) // rotating q and k in place, forward and (inverse) backward
            + 8.0 * m // SwiGLU: two reads and a write forward, three reads and two writes back
            + 6.0 * c // two residual adds
            + 9.0 * c // the k, v and up projections' input gradients added into x's
        }
    };
    4.0 * (cfg.n_layer as f64 * per_layer + 4.0 * cfg.vocab_size as f64 + 4.0 * c)
}

pub fn predict(cfg: &GptConfig, batch: usize, seq: usize, m: &Machine) -> LocalPrediction {
    let tokens = (batch * seq) as f64;
    let matmul_s: f64 = m.matmul_s.iter().map(|(_, s)| s).sum();
    let attention_s = cfg.n_layer as f64 * m.attention_layer_s;
    let bw = m.mem_gbps * 1e9;
    let elementwise_s = tokens * elementwise_bytes_per_token(cfg) / bw;
    // AdamW reads p, g, m, v and writes p, m, v; clipping reads g twice and scales it; the
    // gradient buffer is zeroed: about 48 bytes per parameter.
    let params = crate::models::Gpt::new(*cfg).map(|g| g.num_params()).unwrap_or(0) as f64;
    let optimizer_s = 48.0 * params / bw;
    LocalPrediction {
        step_s: matmul_s + attention_s + elementwise_s + optimizer_s,
        matmul_s,
        attention_s,
        elementwise_s,
        optimizer_s,
        collective_s: 0.0,
        bubble_s: 0.0,
    }
}

/// A parallel run on this machine: its layout and gradient bucket, batch shape, and the cores
/// its rank threads share.
#[derive(Clone, Copy, Debug)]
pub struct LocalRun {
    pub layout: crate::layout::Layout,
    /// Gradient elements per data-parallel all-reduce bucket.
    pub bucket_elems: usize,
    /// Global batch and micro-batch in sequences, and their length.
    pub batch: usize,
    pub micro_batch: usize,
    pub seq: usize,
    /// Threads per rank, and the machine's cores.
    pub threads: usize,
    pub cores: usize,
}

/// A parallel layout's step on this machine, predicted from one rank's measured work.
#[derive(Clone, Debug, Serialize)]
pub struct ParallelPrediction {
    pub step_s: f64,
    /// The slowest stage's forward, backward (its input-gradient part) and weight-gradient part
    /// on one micro-batch, tensor-parallel collectives included.
    pub stage_s: [f64; 3],
    /// The slowest stage's tensor-parallel collectives over the step.
    pub tp_comm_s: f64,
    /// From the first forward to the last backward: the micro-batches' work and the bubble.
    pub pipeline_s: f64,
    pub bubble_s: f64,
    /// The bubble's share of the pipeline's time.
    pub bubble: f64,
    /// One activation's transfer between stages.
    pub p2p_s: f64,
    pub dp_exposed_s: f64,
    pub optimizer_s: f64,
    /// With more rank threads than cores, the step is at least the work of all ranks over the
    /// cores.
    pub cores_floor_s: f64,
}

/// Forward, input-gradient and weight-gradient seconds of one unit on one micro-batch.
type Work = [f64; 3];

/// Bytes of memory-bound traffic per token of one block on a tensor-parallel rank: the
/// LayerNorms and residual adds over whole rows, GELU and biases over its slice.
fn block_bytes_per_token(c: f64, tp: f64) -> f64 {
    4.0 * (2.0 * 6.0 * c + 6.0 * c + (20.0 * c + 9.0 * c + 8.0 * c) / tp)
}

/// Each slot's work (`models::gpt::slots`: the embedding, each block's attention and MLP
/// halves, the head) on one micro-batch of `n` tokens.
fn slot_work(cfg: &GptConfig, m: &Machine, n: f64, tp: &Collectives) -> Vec<Work> {
    let (c, bw, tpn) = (cfg.n_embd as f64, m.mem_gbps * 1e9, m.tp as f64);
    let mm = m.block_matmul_s;
    let e = n * block_bytes_per_token(c, tpn) / bw;
    // a block's two all-reduces (or all-gather / reduce-scatter pairs) forward, two backward
    let ar = tp.all_reduce_s(4.0 * n * c);
    let hm = m.head_matmul_s;
    // softmax cross-entropy: four passes over this rank's logits; its row max and sums, and the
    // head's input gradient summed over the group
    let ce = 16.0 * n * cfg.vocab_size as f64 / tpn / bw;
    let head = [hm[0] + ce / 2.0 + 2.0 * tp.all_reduce_s(8.0 * n), hm[2] + ce / 2.0 + ar, hm[1]];
    let embed = [n * 8.0 * c / bw, n * 8.0 * c / bw, 0.0];
    let mut out = vec![embed];
    // a block's halves: its products split by their FLOPs (each layer's own: dense and mixture
    // layers split apart), attention's core in the first, the memory-bound passes alike, one
    // all-reduce each way in each
    let half = |k: f64| [k * mm[0] + e / 6.0 + ar, k * mm[2] + e / 3.0 + ar, k * mm[1]];
    for i in 0..cfg.n_layer {
        let (am, fm) = cfg.block(i).half_matrices();
        let share = am as f64 / (am + fm).max(1) as f64;
        let mut attn = half(share);
        attn[0] += m.attention_fwd_s;
        attn[1] += m.attention_bwd_s;
        out.extend([attn, half(1.0 - share)]);
    }
    out.push(head);
    out
}

/// The step of `run` predicted from `m` (one rank's work at its micro-batch and tensor slice,
/// measured) and the all-reduces of its tensor- and data-parallel groups.
pub fn predict_parallel(
    cfg: &GptConfig,
    run: &LocalRun,
    m: &Machine,
    tp: &Collectives,
    dp: &Collectives,
) -> crate::Result<ParallelPrediction> {
    use crate::parallel::pipeline::{self, stages};
    let l = run.layout;
    let (ndp, pp, ntp) = (l.dp, l.pp, l.tp);
    let n = (run.micro_batch * run.seq) as f64;
    let micro = run.batch / (ndp * run.micro_batch);
    let bw = m.mem_gbps * 1e9;
    let work = slot_work(cfg, m, n, tp);
    let executor = l.runs_executor();
    // the stages the trainer cuts (by FLOPs), each with its slots' work
    let cuts = match executor {
        true => stages::stage_slots(cfg, pp, l.v, run.seq)?,
        false => std::iter::once(0..crate::models::gpt::slots(cfg)).collect(),
    };
    let full = l.recompute == crate::layout::Recompute::Full;
    let stage_work: Vec<Work> = cuts
        .iter()
        .map(|r| {
            let mut w = [0.0; 3];
            for u in r.clone() {
                w.iter_mut().zip(work[u]).for_each(|(a, b)| *a += b);
            }
            // full recompute runs each forward again before its backward
            if full {
                w[1] += w[0];
            }
            w
        })
        .collect();
    let at = (0..stage_work.len())
        .max_by(|&a, &b| stage_work[a].iter().sum::<f64>().total_cmp(&stage_work[b].iter().sum()))
        .unwrap_or(0);
    let slowest = stage_work[at];
    // (each half of a block has one all-reduce forward and one backward)
    let blocks = cuts[at].clone().filter(|&u| u >= 1 && u <= 2 * cfg.n_layer).count() as f64 / 2.0;
    let per_mb: f64 = slowest.iter().sum();
    let sp = l.sp;
    let p2p_s = 5e-6 + 4.0 * n * cfg.n_embd as f64 / if sp { ntp as f64 } else { 1.0 } / bw;
    let pipeline_s = match executor {
        false => micro as f64 * per_mb,
        true => {
            let costs = pipeline::Costs {
                forward: slowest[0],
                backward: slowest[1] + slowest[2],
                backward_input: slowest[1],
                backward_weight: slowest[2],
                transfer: p2p_s,
            };
            // (the lists the trainer fits to measured times: ZB-H1's to these)
            let plan = pipeline::build_for(l.schedule, pp, micro, l.v, &costs)?;
            pipeline::simulate(&plan, &costs).map_err(crate::Error::Train)?.makespan
        }
    };
    let busy = micro as f64 * per_mb;
    // each rank's parameters; the data-parallel reduction and the optimizer of the largest
    let params = (0..pp)
        .map(|r| match executor {
            true => stages::RankModel::stage(*cfg, (0, ntp), (r, pp), l.v, run.seq, (0, 1)).map(|p| p.layout.total),
            false => crate::models::Gpt::shard(*cfg, 0, ntp).map(|g| g.num_params()),
        })
        .collect::<crate::Result<Vec<_>>>()?
        .into_iter()
        .max()
        .unwrap_or(0) as f64;
    let zero = l.zero;
    let grads = dp.all_reduce_s(4.0 * params);
    let bucket = dp.all_reduce_s((4.0 * params).min(4.0 * run.bucket_elems as f64));
    // without a pipeline the last micro-batch's backward hides the reduction (ZeRO-1: the
    // reduce-scatter, half an all-reduce's traffic; its all-gather after the step is exposed)
    let window = if executor { 0.0 } else { work.iter().map(|w| w[1] + w[2]).sum::<f64>() };
    let dp_exposed_s = match (ndp, zero) {
        (1, _) => 0.0,
        (_, 0) => (grads - window).max(bucket),
        _ => (grads / 2.0 - window).max(bucket / 2.0) + grads / 2.0,
    };
    let optimizer_s = if zero >= 1 { (28.0 / ndp as f64 + 20.0) * params / bw } else { 48.0 * params / bw };
    let critical = pipeline_s + dp_exposed_s + optimizer_s;
    // every rank's work, on `threads` threads each, over the machine's cores
    let all_work: f64 = stage_work.iter().map(|w| micro as f64 * w.iter().sum::<f64>()).sum::<f64>()
        * (ndp * ntp) as f64
        + (ndp * pp * ntp) as f64 * optimizer_s;
    let cores_floor_s = all_work * run.threads as f64 / run.cores as f64;
    let tp_comm_s = micro as f64 * 4.0 * blocks * tp.all_reduce_s(4.0 * n * cfg.n_embd as f64);
    Ok(ParallelPrediction {
        step_s: critical.max(cores_floor_s),
        stage_s: slowest,
        tp_comm_s,
        pipeline_s,
        bubble_s: pipeline_s - busy,
        bubble: if pipeline_s > 0.0 { 1.0 - busy / pipeline_s } else { 0.0 },
        p2p_s,
        dp_exposed_s,
        optimizer_s,
        cores_floor_s,
    })
}
