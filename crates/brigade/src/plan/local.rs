//! `brigade plan --local`: this machine, measured through brigade's own kernels, and the step
//! time of a single-worker `brigade train` configuration predicted from those measurements.
//!
//! The parts stay separate (matrix products, attention, memory-bound kernels, optimizer) so
//! that parallel layouts can add collective and bubble terms from the same measurements.

use crate::bench::median;
use crate::models::GptConfig;
use crate::tensor::attention::{attention_backward, attention_forward, AttnShape};
use crate::tensor::matmul;
use serde::Serialize;
use std::time::Instant;

/// What was measured on this machine (on the caller's thread pool).
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    pub threads: usize,
    /// Seconds of each matrix product of one training step, by layer kind, measured.
    pub matmul_s: Vec<(String, f64)>,
    /// Seconds of one layer's attention core, forward and backward, measured.
    pub attention_layer_s: f64,
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

/// Measures all-reduce latency and bandwidth among `ranks` rank threads.
pub fn measure_collectives(ranks: usize) -> crate::Result<Collectives> {
    use brigade_comm::bench::{sweep, Op};
    let rows = |lo, hi| {
        brigade_comm::local::run(ranks, |c| sweep(&c, Op::AllReduce, lo, hi, None))
            .map_err(|e| crate::Error::Train(format!("collective measurement failed: {e}")))
    };
    // Latency: the fastest small all-reduce (8 B – 4 KiB) of one sweep, since the first calls
    // of freshly started rank threads run cold.
    let small = rows(8, 4096)?;
    let large = rows(64 << 20, 64 << 20)?;
    let latency_us = small[0].iter().map(|r| r.time_us).fold(f64::INFINITY, f64::min);
    Ok(Collectives { ranks, latency_us, busbw_gbps: large[0][0].busbw_gbps })
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

fn time_it(mut f: impl FnMut()) -> f64 {
    f();
    let v: Vec<f64> = (0..3)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed().as_secs_f64()
        })
        .collect();
    median(&v)
}

/// Forward, weight-gradient and input-gradient products of an `n × d_in → d_out` layer.
fn linear_step_s(n: usize, d_in: usize, d_out: usize) -> f64 {
    let x = vec![0.5f32; n * d_in];
    let w = vec![0.25f32; d_in * d_out];
    let mut y = vec![0f32; n * d_out];
    let mut dw = vec![0f32; d_in * d_out];
    let mut dx = vec![0f32; n * d_in];
    time_it(|| matmul(&mut y, &x, &w, n, d_in, d_out, false, false, true))
        + time_it(|| matmul(&mut dw, &x, &y, d_in, n, d_out, true, false, true))
        + time_it(|| matmul(&mut dx, &y, &w, n, d_out, d_in, false, true, false))
}

/// Bytes per second of a streaming copy of `bytes`, split over the pool.
pub fn copy_gbps(bytes: usize) -> f64 {
    use rayon::prelude::*;
    let src = vec![1f32; bytes / 4];
    let mut dst = vec![0f32; bytes / 4];
    let s =
        time_it(|| dst.par_chunks_mut(1 << 16).zip(src.par_chunks(1 << 16)).for_each(|(d, s)| d.copy_from_slice(s)));
    bytes as f64 / s / 1e9
}

/// Measures the parts of a training step of `cfg` at `batch × seq` on the current pool.
pub fn measure(cfg: &GptConfig, batch: usize, seq: usize) -> Machine {
    let n = batch * seq;
    let c = cfg.n_embd;
    let mut matmul_s = vec![
        ("attn.c_attn".to_string(), cfg.n_layer as f64 * linear_step_s(n, c, 3 * c)),
        ("attn.c_proj".to_string(), cfg.n_layer as f64 * linear_step_s(n, c, c)),
        ("mlp.c_fc".to_string(), cfg.n_layer as f64 * linear_step_s(n, c, 4 * c)),
        ("mlp.c_proj".to_string(), cfg.n_layer as f64 * linear_step_s(n, 4 * c, c)),
    ];
    // the tied LM head: h·wteᵀ, dwte += dlogitsᵀ·h, dh = dlogits·wte
    let v = cfg.vocab_size;
    let h = vec![0.5f32; n * c];
    let wte = vec![0.25f32; v * c];
    let mut logits = vec![0f32; n * v];
    let mut dwte = vec![0f32; v * c];
    let mut dh = vec![0f32; n * c];
    let head = time_it(|| matmul(&mut logits, &h, &wte, n, c, v, false, true, false))
        + time_it(|| matmul(&mut dwte, &logits, &h, v, n, c, true, false, true))
        + time_it(|| matmul(&mut dh, &logits, &wte, n, v, c, false, false, false));
    matmul_s.push(("lm_head".to_string(), head));
    drop((logits, dwte));
    let s = AttnShape { b: batch, t: seq, c, heads: cfg.n_head };
    let qkv = vec![0.1f32; 3 * n * c];
    let mut out = vec![0f32; n * c];
    let mut probs = vec![0f32; s.probs_len()];
    let mut dqkv = vec![0f32; 3 * n * c];
    let att = time_it(|| attention_forward(&mut out, &mut probs, &qkv, s))
        + time_it(|| attention_backward(&mut dqkv, &out, &qkv, &probs, s));
    Machine {
        threads: rayon::current_num_threads(),
        matmul_s,
        attention_layer_s: att,
        mem_gbps: copy_gbps(256 << 20),
        matmul_gflops: crate::bench::matmul_gflops(2048, 2048, 2048, 3),
    }
}

/// Bytes the memory-bound kernels of one step move per token: LayerNorms, GELU, residual adds
/// and bias broadcasts per layer (forward and backward), embedding, and the softmax
/// cross-entropy over the vocabulary (four passes over the logits).
fn elementwise_bytes_per_token(cfg: &GptConfig) -> f64 {
    let c = cfg.n_embd as f64;
    let per_layer = 2.0 * 6.0 * c // two LayerNorms: x, out forward; x, dout, dx backward
        + 20.0 * c // GELU on 4C: read/write forward, two reads and a write backward
        + 6.0 * c // two residual adds
        + 9.0 * c // bias broadcasts into 3C, C, 4C, C outputs
        + 8.0 * c; // bias gradients and the activation-gradient accumulations
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
