//! Layers built from `tensor` kernels. A layer holds views into the flat parameter buffer;
//! `forward` reads parameters and fills a caller-owned stash, `backward` reads the stash and
//! accumulates into the flat gradient buffer. Layers own no per-micro-batch state.

pub mod attention;
pub mod layernorm;
pub mod linear;
pub mod mlp;
pub mod tp;
pub mod wgrad;

pub use attention::{AttnStash, CausalSelfAttention};
pub use layernorm::{LayerNorm, LnStash};
pub use linear::Linear;
pub use mlp::{Mlp, MlpStash};
pub use wgrad::{Deferred, Spare, WeightGrads};

/// Grows `v` to `n` elements (never shrinks, so stashes are reused across steps).
pub fn ensure(v: &mut Vec<f32>, n: usize) {
    if v.len() != n {
        v.resize(n, 0.0);
    }
}
