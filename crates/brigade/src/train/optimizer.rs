//! AdamW with decoupled weight decay (Loshchilov & Hutter), as `torch.optim.AdamW` computes it.

use crate::params::ParamLayout;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::ops::Range;

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdamWConfig {
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig { beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1 }
    }
}

impl AdamWConfig {
    pub fn validate(&self) -> Result<(), String> {
        for (k, b) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&b) {
                return Err(format!("adamw.{k} must be in [0, 1), got {b}"));
            }
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return Err(format!("adamw.eps must be a positive number, got {}", self.eps));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return Err(format!("adamw.weight_decay must be 0 or a positive number, got {}", self.weight_decay));
        }
        Ok(())
    }
}

/// Optimizer state over a flat parameter range (the whole model, or one ZeRO shard).
pub struct AdamW {
    pub cfg: AdamWConfig,
    pub m: Vec<f32>,
    pub v: Vec<f32>,
    /// Steps taken (for bias correction).
    pub t: u64,
    /// Ranges of the flat buffer and whether weight decay applies to them.
    groups: Vec<(Range<usize>, bool)>,
}

const CHUNK: usize = 1 << 14;

impl AdamW {
    pub fn new(cfg: AdamWConfig, layout: &ParamLayout) -> AdamW {
        let whole = std::iter::once(0..layout.total).collect::<Vec<_>>();
        AdamW::over(cfg, layout, &whole)
    }

    /// State for the `pieces` of the flat buffer (a ZeRO shard), laid end to end: `step` then
    /// takes the same pieces of the parameters and gradients, laid end to end.
    pub fn over(cfg: AdamWConfig, layout: &ParamLayout, pieces: &[Range<usize>]) -> AdamW {
        let mut groups = Vec::new();
        let mut at = 0;
        for range in pieces {
            for s in &layout.specs {
                let (lo, hi) = (s.view.offset.max(range.start), (s.view.offset + s.view.len).min(range.end));
                if lo < hi {
                    groups.push((at + lo - range.start..at + hi - range.start, s.decay));
                }
            }
            at += range.len();
        }
        AdamW { cfg, m: crate::alloc::zeroed_huge(at), v: crate::alloc::zeroed_huge(at), t: 0, groups }
    }

    /// One AdamW step from `grads · grad_scale`: the clipping factor (`clip_factor`) is applied
    /// here, as each gradient is read, instead of in a pass of its own over the gradient
    /// (the same products, so the same bits as scaling first).
    pub fn step(&mut self, params: &mut [f32], grads: &[f32], grad_scale: f32, lr: f32) {
        self.t += 1;
        let c = self.cfg;
        let bc1 = 1.0 - (c.beta1 as f64).powi(self.t as i32);
        let bc2 = 1.0 - (c.beta2 as f64).powi(self.t as i32);
        let step_size = (lr as f64 / bc1) as f32;
        let bc2_sqrt = bc2.sqrt() as f32;
        for (r, decay) in &self.groups {
            let shrink = if *decay { 1.0 - lr * c.weight_decay } else { 1.0 };
            params[r.clone()]
                .par_chunks_mut(CHUNK)
                .zip(grads[r.clone()].par_chunks(CHUNK))
                .zip(self.m[r.clone()].par_chunks_mut(CHUNK).zip(self.v[r.clone()].par_chunks_mut(CHUNK)))
                .for_each(|((p, g), (m, v))| {
                    for i in 0..p.len() {
                        let g = g[i] * grad_scale;
                        m[i] = c.beta1 * m[i] + (1.0 - c.beta1) * g;
                        v[i] = c.beta2 * v[i] + (1.0 - c.beta2) * g * g;
                        let denom = v[i].sqrt() / bc2_sqrt + c.eps;
                        p[i] = p[i] * shrink - step_size * m[i] / denom;
                    }
                });
        }
    }
}

pub use crate::tensor::math::grad_sq_norm;

/// Global L2 norm of the gradient.
pub fn grad_norm(grads: &[f32]) -> f32 {
    grad_sq_norm(grads).sqrt() as f32
}

/// The factor a gradient of global `norm` is scaled by so that its norm is at most
/// `max_norm` (0: no clipping), as `torch.nn.utils.clip_grad_norm_` computes it: 1 at or
/// below the threshold, `max_norm / (norm + 1e-6)` above. `AdamW::step` applies it.
pub fn clip_factor(norm: f32, max_norm: f32) -> f32 {
    if max_norm > 0.0 && norm > max_norm {
        max_norm / (norm + 1e-6)
    } else {
        1.0
    }
}

/// Linear warmup to `max_lr`, then cosine decay toward `min_lr` — torchtitan's rule
/// (`LRSchedulersContainer`, cosine, no stable phase): warmup counts from 1 (step 0 already
/// trains at `max_lr / warmup`), the peak is held one more step, and `min_lr` is reached one step
/// past the last, so a floor of 0 never wastes the last step.
#[derive(Clone, Copy, Debug)]
pub struct LrSchedule {
    pub max_lr: f32,
    pub min_lr: f32,
    pub warmup: usize,
    pub total: usize,
}

impl LrSchedule {
    /// The schedule of a run's settings: linear warmup (`warmup`, default 5% of the steps,
    /// rounded down; 0 is none) to `lr`, then cosine toward `min_lr` (default lr / 10).
    pub fn of(cfg: &super::TrainConfig) -> LrSchedule {
        LrSchedule {
            max_lr: cfg.lr,
            min_lr: cfg.min_lr.unwrap_or(cfg.lr / 10.0),
            warmup: cfg.warmup.unwrap_or(cfg.steps / 20),
            total: cfg.steps,
        }
    }

    pub fn at(&self, step: usize) -> f32 {
        if step < self.warmup {
            return self.max_lr * (step + 1) as f32 / self.warmup as f32;
        }
        let span = self.total.saturating_sub(self.warmup).max(1);
        let progress = ((step - self.warmup) as f32 / span as f32).min(1.0);
        let cos = 0.5 * (1.0 + (std::f32::consts::PI * progress).cos());
        self.min_lr + cos * (self.max_lr - self.min_lr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As `torch.nn.utils.clip_grad_norm_`: off at 0, untouched at or below the threshold,
    /// above it scaled by max_norm / (norm + 1e-6).
    #[test]
    fn clipping_follows_torch() {
        assert_eq!(grad_norm(&[3.0, 4.0]), 5.0);
        assert_eq!(clip_factor(5.0, 0.0), 1.0, "max_norm 0 turns clipping off");
        assert_eq!(clip_factor(1.0, 1.0), 1.0, "a norm equal to the threshold is not clipped");
        let norm = grad_norm(&[0.006, 0.008]);
        assert!((norm - 0.01).abs() < 1e-9);
        let want = 0.005f64 / (norm as f64 + 1e-6);
        assert!((clip_factor(norm, 0.005) as f64 - want).abs() < 3e-7 * want);
    }

    /// The factor applied inside the step gives the bits of a step on the gradient scaled first.
    #[test]
    fn a_step_with_the_clip_factor_equals_one_on_clipped_gradients() {
        let mut layout = ParamLayout::default();
        layout.add("w", &[7, 5], crate::params::Init::Normal(0.5), true);
        layout.add("b", &[5], crate::params::Init::Zeros, false);
        let p0 = layout.init(3);
        let g: Vec<f32> = (0..layout.total).map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.173).collect();
        let s = clip_factor(grad_norm(&g), 0.5);
        assert!(s < 1.0, "the test gradient is clipped");
        let scaled: Vec<f32> = g.iter().map(|x| x * s).collect();
        let (mut a, mut b) = (p0.clone(), p0);
        let (mut oa, mut ob) =
            (AdamW::new(AdamWConfig::default(), &layout), AdamW::new(AdamWConfig::default(), &layout));
        for _ in 0..3 {
            oa.step(&mut a, &g, s, 1e-2);
            ob.step(&mut b, &scaled, 1.0, 1e-2);
        }
        assert_eq!(a, b);
        assert_eq!((oa.m, oa.v), (ob.m, ob.v));
    }

    #[test]
    fn adamw_settings_outside_their_domain_are_refused() {
        let ok = AdamWConfig::default();
        assert!(ok.validate().is_ok());
        assert!(AdamWConfig { beta1: 0.0, beta2: 0.0, eps: 1e-30, weight_decay: 0.0 }.validate().is_ok());
        let bad = [
            AdamWConfig { beta1: 1.0, ..ok },
            AdamWConfig { beta1: -0.1, ..ok },
            AdamWConfig { beta2: 1.0, ..ok },
            AdamWConfig { beta2: f32::NAN, ..ok },
            AdamWConfig { eps: 0.0, ..ok },
            AdamWConfig { eps: -1e-8, ..ok },
            AdamWConfig { eps: f32::INFINITY, ..ok },
            AdamWConfig { eps: f32::NAN, ..ok },
            AdamWConfig { weight_decay: -0.1, ..ok },
            AdamWConfig { weight_decay: f32::INFINITY, ..ok },
            AdamWConfig { weight_decay: f32::NAN, ..ok },
        ];
        for c in bad {
            assert!(c.validate().is_err(), "{c:?} accepted");
        }
    }
}
