//! `brigade bench train --breakdown`: where a single-worker training step's time goes, kernel
//! by kernel. Each kernel runs alone at the step's shapes (median of three), times the number of
//! calls a step makes, and is reported with its rate: GFLOP/s for the matrix products and
//! attention, GB/s of memory traffic for the memory-bound passes. Their sum is compared with
//! the step as it really runs.

use super::machine::time_it;
use crate::models::family::{BlockSpec, MlpSpec, NormKind, Orient, Positions, Qkv};
use crate::models::GptConfig;
use crate::nn::{LayerNorm, LnStash};
use crate::params::ParamLayout;
use crate::tensor::attention::{attention_backward, attention_forward, AttnShape};
use crate::tensor::docs::Docs;
use crate::tensor::elementwise::{gelu_backward, gelu_forward, residual_bias_forward};
use crate::tensor::loss::{cross_entropy_backward, cross_entropy_forward, VocabWindow};
use crate::tensor::matmul;
use crate::train::optimizer::{grad_norm, AdamW, AdamWConfig};
use serde::Serialize;

/// One kernel's share of a step.
#[derive(Clone, Debug, Serialize)]
pub struct KernelRow {
    pub kernel: String,
    /// Calls per step.
    pub calls: usize,
    /// Seconds per step, all calls.
    pub seconds: f64,
    /// GFLOP/s (matrix products, attention) or GB/s (memory-bound passes).
    pub rate: f64,
    pub unit: &'static str,
}

fn row(kernel: impl Into<String>, calls: usize, once: f64, work: f64, unit: &'static str) -> KernelRow {
    KernelRow { kernel: kernel.into(), calls, seconds: calls as f64 * once, rate: work / once / 1e9, unit }
}

/// The three products of an `n × d_in → d_out` layer: forward, weight gradient, input gradient,
/// with the weight stored `[in, out]` (GPT-2's Conv1D, its forward accumulating onto the
/// broadcast bias) or `[out, in]` (`torch.nn.Linear`, the Llama family, no bias).
fn linear_rows(name: &str, calls: usize, n: usize, (d_in, d_out): (usize, usize), out_in: bool) -> Vec<KernelRow> {
    let x = vec![0.5f32; n * d_in];
    let w = vec![0.25f32; d_in * d_out];
    let mut y = vec![0f32; n * d_out];
    let mut dw = vec![0f32; d_in * d_out];
    let mut dx = vec![0f32; n * d_in];
    let flops = 2.0 * (n * d_in * d_out) as f64;
    let (fwd, wgrad, dgrad) = if out_in {
        (
            time_it(|| matmul(&mut y, &x, &w, n, d_in, d_out, false, true, false)),
            time_it(|| matmul(&mut dw, &y, &x, d_out, n, d_in, true, false, true)),
            time_it(|| matmul(&mut dx, &y, &w, n, d_out, d_in, false, false, false)),
        )
    } else {
        (
            time_it(|| matmul(&mut y, &x, &w, n, d_in, d_out, false, false, true)),
            time_it(|| matmul(&mut dw, &x, &y, d_in, n, d_out, true, false, true)),
            time_it(|| matmul(&mut dx, &y, &w, n, d_out, d_in, false, true, false)),
        )
    };
    let (shape, wg, dg) = if out_in {
        (format!("[{n}×{d_in}]·[{d_out}×{d_in}]ᵀ"), "dyᵀ·x", "dy·W")
    } else {
        (format!("[{n}×{d_in}]·[{d_in}×{d_out}]"), "xᵀ·dy", "dy·Wᵀ")
    };
    vec![
        row(format!("{name} forward {shape}"), calls, fwd, flops, "GFLOP/s"),
        row(format!("{name} weight grad ({wg})"), calls, wgrad, flops, "GFLOP/s"),
        row(format!("{name} input grad ({dg})"), calls, dgrad, flops, "GFLOP/s"),
    ]
}

/// The block's memory-bound kernels, by its kinds: the norms, the rotation (rotary
/// positions), the activation, the residual adds, and the input gradients added where several
/// products read one input.
fn memory_bound_rows(cfg: &GptConfig, block: &BlockSpec, n: usize, seq: usize) -> Vec<KernelRow> {
    use crate::tensor::rmsnorm::{rmsnorm_backward, rmsnorm_forward};
    use crate::tensor::rope::{inv_freq, rope_rows, RopeTable};
    let (c, l, m) = (cfg.n_embd, cfg.n_layer, cfg.mlp_width());
    let mut rows = Vec::new();
    let x: Vec<f32> = (0..n * c).map(|i| (i % 17) as f32 * 0.1).collect();
    let (mut out, mut dx) = (vec![0f32; n * c], vec![0f32; n * c]);
    let bytes = 4.0 * (n * c) as f64;
    match block.ln_1.kind {
        NormKind::Layer { .. } => {
            let mut layout = ParamLayout::default();
            let ln = LayerNorm::new(&mut layout, "ln", c);
            let p = layout.init(0);
            let mut g = vec![0f32; layout.total];
            let mut st = LnStash::default();
            let f = time_it(|| ln.forward(&p, &x, &mut st));
            rows.push(row("LayerNorm forward", 2 * l + 1, f, 2.0 * bytes, "GB/s"));
            let b = time_it(|| ln.backward(&p, &mut g, &x, &st, &x, &mut dx));
            rows.push(row("LayerNorm backward", 2 * l + 1, b, 4.0 * bytes, "GB/s"));
        }
        NormKind::Rms { .. } => {
            let w = vec![1f32; c];
            let (mut rstd, mut dw) = (vec![0f32; n], vec![0f32; c]);
            let f = time_it(|| rmsnorm_forward(&mut out, &mut rstd, &x, &w, c, 1e-5));
            rows.push(row("RMSNorm forward", 2 * l + 1, f, 2.0 * bytes, "GB/s"));
            let b = time_it(|| rmsnorm_backward(&mut dx, &mut dw, &x, &x, &rstd, &w, c));
            rows.push(row("RMSNorm backward", 2 * l + 1, b, 4.0 * bytes, "GB/s"));
        }
    }
    if let Positions::Rotary { .. } = cfg.positions() {
        let tab = RopeTable::new(&inv_freq(cfg.head_dim(), 10_000.0, None), seq);
        let mut q = vec![0.5f32; n * cfg.q_width()];
        let mut k = vec![0.5f32; n * cfg.kv_width()];
        let qk = 4.0 * (q.len() + k.len()) as f64;
        let r = time_it(|| {
            rope_rows(&mut q, cfg.n_head, &tab, |r| r % seq, false);
            rope_rows(&mut k, cfg.kv_heads(), &tab, |r| r % seq, false);
        });
        rows.push(row("rotary q, k (forward; the backward alike)", 2 * l, r, 2.0 * qk, "GB/s"));
    }
    match block.mlp {
        MlpSpec::Gelu { .. } => {
            let h: Vec<f32> = (0..n * m).map(|i| (i % 19) as f32 * 0.1 - 0.9).collect();
            let mut act = vec![0f32; n * m];
            let mb = 4.0 * (n * m) as f64;
            let f = time_it(|| gelu_forward(&mut act, &h));
            rows.push(row("GELU forward", l, f, 2.0 * mb, "GB/s"));
            let b = time_it(|| gelu_backward(&mut act, &h));
            rows.push(row("GELU backward", l, b, 3.0 * mb, "GB/s"));
        }
        MlpSpec::SwiGlu { .. } | MlpSpec::Moe(_) => {
            let gate: Vec<f32> = (0..n * m).map(|i| (i % 19) as f32 * 0.1 - 0.9).collect();
            let (mut act, mut dup) = (vec![0f32; n * m], vec![0f32; n * m]);
            let mb = 4.0 * (n * m) as f64;
            let f = time_it(|| crate::tensor::elementwise::swiglu_forward(&mut act, &gate, &gate));
            rows.push(row("SwiGLU forward", l, f, 3.0 * mb, "GB/s"));
            let b = time_it(|| crate::tensor::elementwise::swiglu_backward(&mut act, &mut dup, &gate, &gate));
            rows.push(row("SwiGLU backward", l, b, 5.0 * mb, "GB/s"));
        }
    }
    if block.attn.o.bias {
        let bias = vec![0.1f32; c];
        let r = time_it(|| residual_bias_forward(&mut out, &x, &dx, &bias));
        rows.push(row("residual + bias", 2 * l, r, 3.0 * bytes, "GB/s"));
    } else {
        let res = time_it(|| residual_bias_forward(&mut out, &x, &dx, &[]));
        rows.push(row("residual", 2 * l, res, 3.0 * bytes, "GB/s"));
    }
    // every product after the first reading one input (the attention's, the MLP's) adds its
    // input gradient into the first's
    let attn_in = match &block.attn.qkv {
        Qkv::Fused(l) => vec![l],
        Qkv::Separate { q, k, v } => vec![q, k, v],
    };
    let mlp_in = match &block.mlp {
        MlpSpec::Gelu { fc, .. } => vec![fc],
        MlpSpec::SwiGlu { gate, up, .. } => vec![gate, up],
        MlpSpec::Moe(m) => vec![&m.experts[0][0], &m.experts[0][1]],
    };
    let extra: Vec<&str> = [attn_in, mlp_in]
        .into_iter()
        .flat_map(|ls| ls.into_iter().skip(1).map(|lin| lin.name.rsplit('.').next().unwrap_or("")))
        .map(|name| name.strip_suffix("_proj").unwrap_or(name))
        .collect();
    if !extra.is_empty() {
        let add = time_it(|| crate::tensor::elementwise::add_into(&mut dx, &x));
        let what = format!("input gradients added ({})", extra.join(", "));
        rows.push(row(what, extra.len() * l, add, 3.0 * bytes, "GB/s"));
    }
    rows
}

/// A step of these kernels with every product (the attention included) at the `matmul`
/// GFLOP/s of a 2048³ product and the memory-bound passes as measured, then (second) those
/// passes at most at the streaming copy's `mem_gbps` (a pass that ran faster, from cache, keeps
/// its time): the step's time if its products ran exactly at the rate its fraction is measured
/// against, so the ceiling of that fraction while the passes stay (a product that beats the
/// 2048³ rate, as small ones can from cache, lifts a step past it).
pub fn ceiling_s(rows: &[KernelRow], matmul: f64, mem_gbps: f64) -> (f64, f64) {
    let (mut products, mut passes, mut streamed) = (0.0, 0.0, 0.0);
    for r in rows {
        let work = r.rate * r.seconds; // GFLOP or GB a step
        if r.unit == "GB/s" {
            passes += r.seconds;
            streamed += r.seconds.min(work / mem_gbps);
        } else {
            products += work / matmul;
        }
    }
    (products + passes, products + streamed)
}

/// Every kernel of a training step of `cfg` at `batch × seq`, on the current pool.
pub fn breakdown(cfg: &GptConfig, batch: usize, seq: usize) -> Vec<KernelRow> {
    let (n, c, v, l) = (batch * seq, cfg.n_embd, cfg.vocab_size, cfg.n_layer);
    let mut rows = Vec::new();
    let block = cfg.block(0);
    if let Some(group) = block.product_groups().first() {
        // the first products on the fresh pool's threads, once untimed: timed first, SmolLM2's
        // q_proj forward read 67–71% of the rate its identical o_proj reads (96%), and 98% after
        let first = group[0].0;
        linear_rows("warm", 1, n, (first.d_in, first.d_out), first.orient == Orient::OutIn);
    }
    for group in block.product_groups() {
        let first = group[0].0;
        let mut label = block.local(&first.name).to_string();
        for (lin, _) in &group[1..] {
            label = format!("{label} + {}", lin.name.rsplit('.').next().unwrap_or(""));
        }
        let out_in = first.orient == Orient::OutIn;
        rows.extend(linear_rows(&label, group.len() * l, n, (first.d_in, first.d_out), out_in));
    }
    rows.extend(memory_bound_rows(cfg, &block, n, seq));
    // the tied LM head: logits = h·wteᵀ, dwte += dlogitsᵀ·h, dh = dlogits·wte
    {
        let h = vec![0.5f32; n * c];
        let wte = vec![0.25f32; v * c];
        let mut logits = vec![0f32; n * v];
        let mut dwte = vec![0f32; v * c];
        let mut dh = vec![0f32; n * c];
        let flops = 2.0 * (n * c * v) as f64;
        let f = time_it(|| matmul(&mut logits, &h, &wte, n, c, v, false, true, false));
        rows.push(row(format!("lm_head forward [{n}×{c}]·[{c}×{v}]"), 1, f, flops, "GFLOP/s"));
        let w = time_it(|| matmul(&mut dwte, &logits, &h, v, n, c, true, false, true));
        rows.push(row("lm_head weight grad (dlogitsᵀ·h)", 1, w, flops, "GFLOP/s"));
        let d = time_it(|| matmul(&mut dh, &logits, &wte, n, v, c, false, false, false));
        rows.push(row("lm_head input grad (dlogits·wte)", 1, d, flops, "GFLOP/s"));
        // softmax cross-entropy over the vocabulary: about two passes over the logits forward,
        // a read and a write backward
        let targets: Vec<i32> = (0..n).map(|i| (i * 7 % v) as i32).collect();
        let (mut losses, mut lse) = (vec![0f32; n], vec![0f32; n]);
        logits.iter_mut().enumerate().for_each(|(i, x)| *x = (i % 13) as f32 * 0.1);
        let bytes = 4.0 * (n * v) as f64;
        let f = time_it(|| cross_entropy_forward(&mut losses, &mut lse, &logits, &targets, v));
        rows.push(row("cross-entropy forward", 1, f, 2.0 * bytes, "GB/s"));
        let mut dl = logits.clone();
        let b = time_it(|| cross_entropy_backward(&mut dl, &lse, &targets, VocabWindow::whole(v), 1.0 / n as f32));
        rows.push(row("cross-entropy backward", 1, b, 2.0 * bytes, "GB/s"));
    }
    let s = match block.attn.qkv {
        Qkv::Fused(_) => AttnShape::fused(batch, seq, c, cfg.n_head),
        Qkv::Separate { .. } => AttnShape::grouped(batch, seq, cfg.n_head, cfg.kv_heads(), cfg.head_dim()),
    };
    {
        let qkv = vec![0.1f32; s.qkv_len()];
        let mut out = vec![0f32; s.out_len()];
        let mut probs = vec![0f32; s.probs_len()];
        let mut dqkv = vec![0f32; s.qkv_len()];
        // q·kᵀ and p·v over the causal half of the t×t square
        let flops = 2.0 * (batch * seq * seq * cfg.q_width()) as f64;
        let f = time_it(|| attention_forward(&mut out, &mut probs, &qkv, s, Docs::WHOLE));
        rows.push(row("attention forward (causal)", l, f, flops, "GFLOP/s"));
        let b = time_it(|| attention_backward(&mut dqkv, &out, &qkv, &probs, s));
        rows.push(row("attention backward", l, b, 2.0 * flops, "GFLOP/s"));
    }
    {
        let model = crate::models::Gpt::new(*cfg).expect("a valid preset");
        let mut p = model.layout.init(0);
        let mut g = vec![0.001f32; p.len()];
        let mut opt = AdamW::new(AdamWConfig::default(), &model.layout);
        let bytes = 4.0 * p.len() as f64;
        let z = time_it(|| crate::tensor::elementwise::zero(&mut g));
        rows.push(row("zero the gradients", 1, z, bytes, "GB/s"));
        let k = time_it(|| {
            grad_norm(&g);
        });
        rows.push(row("clip (the gradient's norm)", 1, k, bytes, "GB/s"));
        let a = time_it(|| opt.step(&mut p, &g, 0.5, 3e-4));
        rows.push(row("AdamW, clipped (p, g, m, v in; p, m, v out)", 1, a, 7.0 * bytes, "GB/s"));
    }
    rows.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ceiling_runs_products_at_the_matmul_rate_and_passes_at_most_at_the_streaming_rate() {
        let rows = [
            row("a product at half the rate", 2, 0.5, 100e9, "GFLOP/s"), // 200 GFLOP at 200/s
            row("a slow pass", 1, 0.3, 3e9, "GB/s"),                     // 3 GB at 10 GB/s
            row("a pass from cache", 1, 0.01, 1e9, "GB/s"),              // 1 GB at 100 GB/s
        ];
        let (measured, streamed) = ceiling_s(&rows, 400.0, 30.0);
        // 200 GFLOP at 400/s = 0.5 s; passes 0.3 + 0.01 as measured, 0.1 + 0.01 streamed
        assert!((measured - 0.81).abs() < 1e-12, "{measured}");
        assert!((streamed - 0.61).abs() < 1e-12, "{streamed}");
    }
}
