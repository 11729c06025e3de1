//! Layers built from `tensor` kernels. A layer holds views into the flat parameter buffer;
//! `forward` reads parameters and fills a caller-owned stash, `backward` reads the stash and
//! accumulates into the flat gradient buffer. Layers own no per-micro-batch state.

pub mod attention;
pub mod context;
pub mod layernorm;
pub mod linear;
pub mod mlp;
pub mod moe;
pub mod norm;
pub mod tp;
pub mod wgrad;

pub use attention::{AttnScratch, AttnStash, CausalSelfAttention, Grouped, Qkv};
pub use layernorm::{LayerNorm, LnStash};
pub use linear::Linear;
pub use mlp::{Mlp, MlpScratch, MlpStash};
pub use norm::{Norm, RmsNorm};
pub use wgrad::{Deferred, Spare, WeightGrads};

/// What a layer's backward reads and writes beside its activations: the unit's parameters,
/// the buffer their gradients accumulate into, and where the weight matrices' gradients go
/// (now, or deferred to a zero-bubble schedule's W).
pub struct Grads<'a> {
    pub p: &'a [f32],
    pub g: &'a mut [f32],
    pub dw: &'a mut WeightGrads,
}

/// Grows `v` to `n` elements (never shrinks, so stashes are reused across steps).
pub fn ensure(v: &mut Vec<f32>, n: usize) {
    if v.len() != n {
        v.resize(n, 0.0);
    }
}
