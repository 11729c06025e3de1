//! The words a family is described in: the shape every decoder shares, and a block as a list
//! of parts — two norms, the q/k/v and output projections, the MLP's products — each with its
//! Hugging Face tensor name, widths, bias and storage order; the positions (a learned table or
//! rotary frequencies). Both executors (training's `models::gpt`, serving's weights and
//! forward), the checkpoint code, the planner and the benchmarks read these values, never a
//! family's name.

use serde::{Deserialize, Serialize};

/// The five numbers every decoder family has: layers, query heads, hidden size, vocabulary and
/// longest sequence (GPT-2's position table, Llama's `max_position_embeddings`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub n_layer: usize,
    pub n_head: usize,
    pub n_embd: usize,
    pub vocab_size: usize,
    pub block_size: usize,
}

impl Shape {
    /// From `[layers, heads, hidden, vocab, positions]`.
    pub const fn of([n_layer, n_head, n_embd, vocab_size, block_size]: [usize; 5]) -> Shape {
        Shape { n_layer, n_head, n_embd, vocab_size, block_size }
    }
}

/// A normalisation: LayerNorm (scale and shift) or RMSNorm (scale only), with its epsilon.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum NormKind {
    Layer { eps: f32 },
    Rms { eps: f32 },
}

/// A norm and its tensors' prefix: `{name}.weight` (and, for LayerNorm, `{name}.bias`).
#[derive(Clone, Debug, PartialEq)]
pub struct NormSpec {
    pub kind: NormKind,
    pub name: String,
}

impl NormSpec {
    /// Its parameters over a hidden size of `c`.
    pub fn params(&self, c: usize) -> u128 {
        match self.kind {
            NormKind::Layer { .. } => 2 * c as u128,
            NormKind::Rms { .. } => c as u128,
        }
    }
}

/// How a product's weight is stored: `[in, out]` (GPT-2's Conv1D) or `[out, in]`
/// (`torch.nn.Linear`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Orient {
    InOut,
    OutIn,
}

/// One product `d_in → d_out` of a block (whole, before any tensor-parallel cut): its
/// tensors `{name}.weight` (and `{name}.bias` when `bias`).
#[derive(Clone, Debug, PartialEq)]
pub struct Linear {
    pub name: String,
    pub d_in: usize,
    pub d_out: usize,
    pub bias: bool,
    pub orient: Orient,
}

impl Linear {
    pub fn weight(&self) -> String {
        format!("{}.weight", self.name)
    }
    pub fn bias_name(&self) -> String {
        format!("{}.bias", self.name)
    }
}

/// How q, k and v are projected.
#[derive(Clone, Debug, PartialEq)]
pub enum Qkv {
    /// One product whose outputs are `q | k | v` side by side (GPT-2's `c_attn`).
    Fused(Linear),
    /// Three products; k and v may have fewer heads than q (grouped-query attention).
    Separate { q: Linear, k: Linear, v: Linear },
}

/// The attention's products: q/k/v (column-parallel under tp) and the output projection
/// (row-parallel).
#[derive(Clone, Debug, PartialEq)]
pub struct AttnSpec {
    pub qkv: Qkv,
    pub o: Linear,
    /// RMSNorms over each query head and each key head before the rotation (`[head_dim]`
    /// weights shared by the heads: Qwen3's `q_norm`, `k_norm`), and the widths each normalises
    /// (q's, k's: the head width, or the whole q and k widths for OLMoE's norms over all heads).
    pub qk_norm: Option<([NormSpec; 2], [usize; 2])>,
}

/// The MLP: GELU (tanh) between two products, SwiGLU (`silu(gate) · up`, then `down`), or a
/// mixture of SwiGLU experts.
#[derive(Clone, Debug, PartialEq)]
pub enum MlpSpec {
    Gelu { fc: Linear, proj: Linear },
    SwiGlu { gate: Linear, up: Linear, down: Linear },
    Moe(MoeSpec),
}

/// A mixture of experts (`nn::moe`): a router `C → E`, each row sent to its `top_k` most
/// probable experts (their probabilities renormalised over the k when `norm_topk`), each
/// expert a SwiGLU `[gate, up, down]`; optionally a shared expert every row passes through,
/// scaled by a sigmoid gate `C → 1`.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeSpec {
    pub router: Linear,
    pub experts: Vec<[Linear; 3]>,
    pub shared: Option<([Linear; 3], Linear)>,
    pub top_k: usize,
    pub norm_topk: bool,
    /// The capacity factor (0: dropless; see `LlamaMoe::capacity`).
    pub capacity: f32,
    /// The auxiliary-loss-free balancing's bias tensor `[E]` and its update rate
    /// (`LlamaMoe::bias_rate`).
    pub bias: Option<(String, f32)>,
}

impl MoeSpec {
    /// Each expert's hidden width.
    pub fn width(&self) -> usize {
        self.experts[0][0].d_out
    }

    /// Weight-matrix parameters a row passes through: the router, its k experts and the shared
    /// expert (the FLOPs of a token; `BlockSpec::matrices` counts every expert).
    pub fn active_matrices(&self) -> u128 {
        let m = |l: &Linear| l.d_in as u128 * l.d_out as u128;
        let expert: u128 = self.experts[0].iter().map(m).sum();
        let shared: u128 = self.shared.iter().map(|(s, g)| s.iter().map(m).sum::<u128>() + m(g)).sum();
        m(&self.router) + self.top_k as u128 * expert + shared
    }
}

/// One pre-norm block: `x + attn(ln_1(x))`, then `+ mlp(ln_2(·))`; `std` and `proj_std` the
/// initial scales of the products (the second for those writing into the residual stream).
#[derive(Clone, Debug, PartialEq)]
pub struct BlockSpec {
    /// The prefix of every tensor of the block (`h.3`, `model.layers.3`).
    pub prefix: String,
    pub ln_1: NormSpec,
    pub attn: AttnSpec,
    pub ln_2: NormSpec,
    pub mlp: MlpSpec,
    pub std: f32,
    pub proj_std: f32,
}

/// A product's place in a tensor-parallel block: cut by its outputs (column-parallel) or by
/// its inputs (row-parallel).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    Cols,
    Rows,
}

impl BlockSpec {
    /// The block's products in the order they run, with how tensor parallelism cuts each.
    pub fn linears(&self) -> Vec<(&Linear, Cut)> {
        let mut out = match &self.attn.qkv {
            Qkv::Fused(l) => vec![(l, Cut::Cols)],
            Qkv::Separate { q, k, v } => vec![(q, Cut::Cols), (k, Cut::Cols), (v, Cut::Cols)],
        };
        out.push((&self.attn.o, Cut::Rows));
        match &self.mlp {
            MlpSpec::Gelu { fc, proj } => out.extend([(fc, Cut::Cols), (proj, Cut::Rows)]),
            MlpSpec::SwiGlu { gate, up, down } => out.extend([(gate, Cut::Cols), (up, Cut::Cols), (down, Cut::Rows)]),
            MlpSpec::Moe(m) => {
                // in the order the parameters are laid out (`nn::moe::Moe::new`)
                out.push((&m.router, Cut::Cols));
                for [gate, up, down] in m.experts.iter().chain(m.shared.iter().map(|(s, _)| s)) {
                    out.extend([(gate, Cut::Cols), (up, Cut::Cols), (down, Cut::Rows)]);
                }
                if let Some((_, gate)) = &m.shared {
                    out.push((gate, Cut::Cols));
                }
            }
        }
        out
    }

    /// The weight-matrix parameters of the attention half (its projections, up to the output
    /// projection) and the active ones of the MLP half (as `active_matrices`).
    pub fn half_matrices(&self) -> (u128, u128) {
        let linears = self.linears();
        let attn_end = linears.iter().position(|(l, _)| *l == &self.attn.o).unwrap() + 1;
        let attn: u128 = linears[..attn_end].iter().map(|(l, _)| l.d_in as u128 * l.d_out as u128).sum();
        let mlp = match &self.mlp {
            MlpSpec::Moe(m) => m.active_matrices(),
            _ => self.matrices() - attn,
        };
        (attn, mlp)
    }

    /// Weight-matrix parameters a token passes through (all of them, but for a mixture of
    /// experts only its k experts').
    pub fn active_matrices(&self) -> u128 {
        let (attn, mlp) = self.half_matrices();
        attn + mlp
    }

    /// Groups of products that read the same input at the same shape, in order (k with v,
    /// gate with up): a benchmark times one of each group.
    pub fn product_groups(&self) -> Vec<Vec<(&Linear, Cut)>> {
        let mut groups: Vec<Vec<(&Linear, Cut)>> = Vec::new();
        let paired = |a: &Linear, b: &Linear| match (&self.attn.qkv, &self.mlp) {
            (Qkv::Separate { k, v, .. }, _) if a == k && b == v => true,
            (_, MlpSpec::SwiGlu { gate, up, .. }) => a == gate && b == up,
            (_, MlpSpec::Moe(m)) => m.experts.iter().any(|[gate, up, _]| a == gate && b == up),
            _ => false,
        };
        for (l, cut) in self.linears() {
            match groups.last_mut() {
                Some(g) if paired(g[0].0, l) => g.push((l, cut)),
                _ => groups.push(vec![(l, cut)]),
            }
        }
        groups
    }

    /// Whether `l` projects the key/value heads (which tensor parallelism may replicate).
    pub fn is_kv(&self, l: &Linear) -> bool {
        matches!(&self.attn.qkv, Qkv::Separate { k, v, .. } if l == k || l == v)
    }

    /// A tensor's name without the block's prefix (`attn.c_attn`, `self_attn.q_proj`).
    pub fn local<'a>(&self, name: &'a str) -> &'a str {
        name.strip_prefix(&self.prefix).and_then(|n| n.strip_prefix('.')).unwrap_or(name)
    }

    /// Weight matrices' parameters.
    pub fn matrices(&self) -> u128 {
        self.linears().iter().map(|(l, _)| l.d_in as u128 * l.d_out as u128).sum()
    }

    /// Biases', norms' parameters (hidden size `c`).
    pub fn vectors(&self, c: usize) -> u128 {
        let biases: u128 = self.linears().iter().filter(|(l, _)| l.bias).map(|(l, _)| l.d_out as u128).sum();
        let qk = self.attn.qk_norm.as_ref().map_or(0, |([q, k], [wq, wk])| q.params(*wq) + k.params(*wk));
        let bias = match &self.mlp {
            MlpSpec::Moe(m) if m.bias.is_some() => m.experts.len() as u128,
            _ => 0,
        };
        let qk = qk + bias;
        biases + self.ln_1.params(c) + self.ln_2.params(c) + qk
    }
}

/// Llama 3's `rope_scaling` (`rope_type: "llama3"`): long wavelengths divided by `factor`,
/// short ones kept, those between interpolated.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Llama3Rope {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: usize,
}

/// How a token's position enters.
#[derive(Clone, Debug, PartialEq)]
pub enum Positions {
    /// A learned table `[block_size, C]` added to the token embedding.
    Learned { name: String },
    /// Queries and keys rotated by their position (rotate-half pairs), at base `theta`,
    /// perhaps with Llama 3's frequency scaling.
    Rotary { theta: f64, scaling: Option<Llama3Rope> },
}

impl Positions {
    /// The rotary frequencies of a head `hd` wide (none for a learned table).
    pub fn inv_freq(&self, hd: usize) -> Option<Vec<f32>> {
        match self {
            Positions::Learned { .. } => None,
            Positions::Rotary { theta, scaling } => {
                let scaling = scaling
                    .map(|r| (r.factor, r.low_freq_factor, r.high_freq_factor, r.original_max_position_embeddings));
                Some(crate::tensor::rope::inv_freq(hd, *theta, scaling))
            }
        }
    }
}

/// What a `brigade train` config may change of a preset's family fields.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Overrides {
    /// Whether the width or the head count changed (heads then keep hidden / heads).
    pub reshaped: bool,
    pub n_kv_head: Option<usize>,
    pub intermediate: Option<usize>,
}

/// A number under a GGUF key.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GgufNum {
    U32(u32),
    F32(f32),
}

/// How llama.cpp knows a family (GGUF, `brigade export --gguf`): its architecture, its
/// hyperparameters under `{arch}.` keys, and whether the rows of q and k are reordered for
/// llama.cpp's rotation of adjacent pairs (Hugging Face's Llama rotates halves; its `qwen2`
/// architecture rotates halves too).
#[derive(Clone, Debug, PartialEq)]
pub struct GgufArch {
    pub arch: &'static str,
    pub keys: Vec<(&'static str, GgufNum)>,
    pub interleave_qk: bool,
}

/// What every family answers. A family is one file in `models/family/` implementing this.
pub trait Describe {
    /// Key/value heads.
    fn kv_heads(&self, s: &Shape) -> usize;
    /// Width of one attention head.
    fn head_dim(&self, s: &Shape) -> usize;
    /// The MLP's hidden width.
    fn mlp_width(&self, s: &Shape) -> usize;
    /// Whether the LM head is the token table (else `head_name`, its own parameters).
    fn tied(&self) -> bool;
    /// The family's own sizes, under their config names, checked like the shape's (at least
    /// 1, within bounds).
    fn sizes(&self) -> Vec<(&'static str, usize)>;
    /// The family's own rules on a shape (after the sizes are checked).
    fn check(&self, s: &Shape) -> Result<(), String>;
    /// Block `i`.
    fn block(&self, s: &Shape, i: usize) -> BlockSpec;
    fn positions(&self, s: &Shape) -> Positions;
    /// The token table's tensor name.
    fn embedding(&self) -> &'static str;
    fn final_norm(&self) -> NormSpec;
    /// An untied LM head's tensor name.
    fn head_name(&self) -> &'static str {
        "lm_head.weight"
    }
    /// A Hugging Face `config.json` of the model.
    fn hf_config(&self, s: &Shape) -> serde_json::Value;
    /// The family in llama.cpp's words (GGUF).
    fn gguf(&self, s: &Shape) -> GgufArch;
    /// A `brigade train` config's changes to a preset of this family (`preset` names it in
    /// errors).
    fn reshape(&mut self, s: &Shape, o: Overrides, preset: &str) -> Result<(), String>;
    /// The auxiliary losses' coefficients of a mixture-of-experts model (`None`: dense).
    fn moe_losses(&self) -> Option<MoeLosses> {
        None
    }
    /// The experts of block `i` if it is a mixture (`None`: a dense MLP), without building the
    /// block's spec.
    fn experts_in(&self, _i: usize) -> Option<usize> {
        None
    }
}

/// The coefficients of a mixture's auxiliary losses (0: off): the load-balancing loss and the
/// router z-loss, each the mean over MoE layers and sequences of the batch.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MoeLosses {
    pub balance: f32,
    pub z: f32,
}
