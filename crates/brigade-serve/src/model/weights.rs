//! A model's weights arranged for batched inference, on one rank of a tensor-parallel group:
//! each product packed once for `matmul_rows`, cut by output columns (query heads with their
//! key/value heads, MLP units, output features, the vocabulary), for both families.
//!
//! GPT-2 keeps its `[in, out]` weights (`c_attn`, `c_fc`, …) and its fused q|k|v; the Llama
//! family's `[out, in]` weights (Hugging Face's layout) are packed from their rows, q|k|v and
//! gate|up each fused into one product of this rank's rows. Key/value heads are this rank's
//! own when tp divides them, or (tp above them) the one head its query heads read, held by
//! `tp / kv_heads` ranks — as the training's `Split::Shared` holds them.

use brigade::models::{Gpt, GptConfig};
use brigade::params::Split;
use brigade::tensor::rope::{inv_freq, RopeTable};
use brigade::tensor::rowwise::Packed;

/// A normalisation's weights.
pub(crate) enum Norm {
    /// GPT-2's LayerNorm (eps 1e-5): scale and shift.
    Layer(Vec<f32>, Vec<f32>),
    /// The Llama family's RMSNorm: scale and epsilon.
    Rms(Vec<f32>, f32),
}

impl Norm {
    pub(crate) fn row(&self, out: &mut [f32], x: &[f32]) {
        match self {
            Norm::Layer(w, b) => {
                out.copy_from_slice(x);
                brigade::tensor::layernorm::layernorm_row(out, w, b, brigade::tensor::layernorm::EPS);
            }
            Norm::Rms(w, eps) => {
                brigade::tensor::rmsnorm::rmsnorm_row(out, x, w, *eps);
            }
        }
    }
}

/// One block's weights on one rank.
pub(crate) struct Layer {
    pub(crate) norm1: Norm,
    /// `[C, qw + 2·kvw]`: q | k | v of this rank's heads.
    pub(crate) wqkv: Packed,
    pub(crate) bqkv: Option<Vec<f32>>,
    /// `[Q, C/tp]`: this rank's output features of the attention's projection.
    pub(crate) wproj: Packed,
    /// The whole projection's bias (added after the gather).
    pub(crate) bproj: Option<Vec<f32>>,
    pub(crate) norm2: Norm,
    /// GPT-2: `[C, 4C/tp]`; Llama: `[C, 2·M/tp]`, gate | up of this rank's units.
    pub(crate) wfc: Packed,
    pub(crate) bfc: Option<Vec<f32>>,
    /// `[M, C/tp]`.
    pub(crate) wout: Packed,
    pub(crate) bout: Option<Vec<f32>>,
}

/// The shapes a rank's forward works in.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub(crate) c: usize,
    /// Query heads and key/value heads on this rank, and the head width.
    pub(crate) heads: usize,
    pub(crate) kv_heads: usize,
    pub(crate) hd: usize,
    /// All query heads' width `Q` (the projection's input, gathered).
    pub(crate) q_all: usize,
    /// MLP units of the whole model, and this rank's.
    pub(crate) mlp: usize,
    pub(crate) mlp_local: usize,
    /// GELU on `c_fc` (GPT-2) or SwiGLU on gate | up (Llama).
    pub(crate) swiglu: bool,
}

impl Dims {
    pub(crate) fn q_width(&self) -> usize {
        self.heads * self.hd
    }

    pub(crate) fn kv_width(&self) -> usize {
        self.kv_heads * self.hd
    }
}

/// A rank's share of the whole model.
pub(crate) struct Weights {
    pub(crate) dims: Dims,
    /// `[V, C]`: the token embedding (whole: any token may come).
    pub(crate) embed: Vec<f32>,
    /// GPT-2's learned positions `[context, C]`; the Llama family rotates instead (`rope`).
    pub(crate) wpe: Option<Vec<f32>>,
    pub(crate) rope: Option<RopeTable>,
    pub(crate) layers: Vec<Layer>,
    pub(crate) norm_f: Norm,
    /// This rank's block of the vocabulary (`V/tp` rounded up, padded): the tied embedding's
    /// or the untied `lm_head`'s rows, transposed.
    pub(crate) head: Packed,
}

/// How the products' weights are held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightFormat {
    #[default]
    F32,
    /// 8 bits, a scale per output column and per group of 32 rows of k.
    Int8,
    /// 8 bits, one scale per output column.
    Int8Channel,
}

impl WeightFormat {
    /// The rows of k that share a scale (`None`: f32).
    fn group(self) -> Option<usize> {
        match self {
            WeightFormat::F32 => None,
            WeightFormat::Int8 => Some(32),
            WeightFormat::Int8Channel => Some(usize::MAX),
        }
    }
}

/// Floats of one token's keys (= its values) per layer in one rank's KV cache.
pub fn kv_width(cfg: &GptConfig, tp: usize) -> usize {
    cfg.kv_heads().max(tp) / tp * cfg.head_dim()
}

/// Whether `tp` ranks can serve `cfg`: the training's rule (heads, key/value heads, MLP) and
/// whole output features on each rank.
pub fn check_tp(cfg: &GptConfig, tp: usize) -> Result<(), String> {
    match brigade::models::config::check_tp(cfg, tp) {
        Ok(()) => {}
        Err(brigade::error::Error::Layout(m)) => return Err(m),
        Err(e) => return Err(e.to_string()),
    }
    if !cfg.n_embd.is_multiple_of(tp) {
        return Err(format!("--tp {tp} does not divide the model's hidden size {}", cfg.n_embd));
    }
    Ok(())
}

/// Rows `r0..r1` of a row-major `[_, k]` matrix.
fn rows(w: &[f32], k: usize, r: std::ops::Range<usize>) -> &[f32] {
    &w[r.start * k..r.end * k]
}

fn quantize(p: &mut Packed, group: usize) {
    let f32s = std::mem::replace(p, Packed::new(&[], 0, 0));
    *p = f32s.quantized_int8(group);
}

impl Weights {
    /// Rank `rank` of `tp`'s share of `gpt` (a whole, unsliced model) with parameters
    /// `params`, its products' weights held as `format` says (every matrix of the blocks and
    /// the head; the embedding table, read a row a token, stays f32).
    pub(crate) fn shard(
        gpt: &Gpt,
        params: &[f32],
        (rank, tp): (usize, usize),
        format: WeightFormat,
    ) -> Result<Weights, String> {
        let mut w = Self::shard_f32(gpt, params, rank, tp)?;
        if let Some(g) = format.group() {
            for l in &mut w.layers {
                for p in [&mut l.wqkv, &mut l.wproj, &mut l.wfc, &mut l.wout] {
                    quantize(p, g);
                }
            }
            quantize(&mut w.head, g);
        }
        Ok(w)
    }

    /// Bytes of the products' weights (what a step reads), and of all the weights.
    pub(crate) fn bytes(&self) -> (usize, usize) {
        let products: usize = self
            .layers
            .iter()
            .map(|l| l.wqkv.bytes() + l.wproj.bytes() + l.wfc.bytes() + l.wout.bytes())
            .sum::<usize>()
            + self.head.bytes();
        (products, products + 4 * (self.embed.len() + self.wpe.as_ref().map_or(0, Vec::len)))
    }

    fn shard_f32(gpt: &Gpt, params: &[f32], rank: usize, tp: usize) -> Result<Weights, String> {
        let cfg = &gpt.cfg;
        check_tp(cfg, tp)?;
        let get = |name: &str| -> Vec<f32> {
            gpt.layout.get(name).unwrap_or_else(|| panic!("a whole model has {name}")).view.of(params).to_vec()
        };
        let (c, v) = (cfg.n_embd, cfg.vocab_size);
        let vl = v.div_ceil(tp);
        let vocab_block = |table: &[f32]| {
            let mut block = vec![0f32; vl * c];
            Split::Vocab.slice(table, &[v, c], rank, tp, &mut block);
            Packed::from_transposed(&block, vl, c)
        };
        let Some(a) = cfg.llama() else {
            return Ok(Self::gpt2(gpt, params, rank, tp, &vocab_block));
        };
        let (heads, kv, hd) = (cfg.n_head, a.n_kv_head, a.head_dim);
        let (hl, m) = (heads / tp, a.intermediate);
        let ml = m / tp;
        // this rank's key/value heads: its own block, or the one its query heads share
        let kv_range = if tp <= kv {
            rank * kv / tp..(rank + 1) * kv / tp
        } else {
            (rank * hl) / (heads / kv)..(rank * hl) / (heads / kv) + 1
        };
        let kvl = kv_range.len();
        let (q_rows, kv_rows) = (rank * hl * hd..(rank + 1) * hl * hd, kv_range.start * hd..kv_range.end * hd);
        let cl = c / tp;
        let layers = (0..cfg.n_layer)
            .map(|i| {
                let p = |s: &str| get(&format!("model.layers.{i}.{s}"));
                let at = |s: &str| p(&format!("self_attn.{s}"));
                let mut qkv = Vec::with_capacity((hl + 2 * kvl) * hd * c);
                qkv.extend_from_slice(rows(&at("q_proj.weight"), c, q_rows.clone()));
                qkv.extend_from_slice(rows(&at("k_proj.weight"), c, kv_rows.clone()));
                qkv.extend_from_slice(rows(&at("v_proj.weight"), c, kv_rows.clone()));
                let bqkv = a.qkv_bias.then(|| {
                    let mut b = at("q_proj.bias")[q_rows.clone()].to_vec();
                    b.extend_from_slice(&at("k_proj.bias")[kv_rows.clone()]);
                    b.extend_from_slice(&at("v_proj.bias")[kv_rows.clone()]);
                    b
                });
                let mut gate_up = rows(&p("mlp.gate_proj.weight"), c, rank * ml..(rank + 1) * ml).to_vec();
                gate_up.extend_from_slice(rows(&p("mlp.up_proj.weight"), c, rank * ml..(rank + 1) * ml));
                let norm = |s: &str| Norm::Rms(p(&format!("{s}.weight")), a.rms_eps);
                Layer {
                    norm1: norm("input_layernorm"),
                    wqkv: Packed::from_transposed(&qkv, (hl + 2 * kvl) * hd, c),
                    bqkv,
                    wproj: Packed::from_transposed(
                        rows(&at("o_proj.weight"), heads * hd, rank * cl..(rank + 1) * cl),
                        cl,
                        heads * hd,
                    ),
                    bproj: a.o_bias.then(|| at("o_proj.bias")),
                    norm2: norm("post_attention_layernorm"),
                    wfc: Packed::from_transposed(&gate_up, 2 * ml, c),
                    bfc: None,
                    wout: Packed::from_transposed(
                        rows(&p("mlp.down_proj.weight"), m, rank * cl..(rank + 1) * cl),
                        cl,
                        m,
                    ),
                    bout: None,
                }
            })
            .collect();
        let embed = get("model.embed_tokens.weight");
        let head = if a.tied { vocab_block(&embed) } else { vocab_block(&get("lm_head.weight")) };
        let scaling = a
            .rope_scaling
            .map(|r| (r.factor, r.low_freq_factor, r.high_freq_factor, r.original_max_position_embeddings));
        let rope = RopeTable::new(&inv_freq(hd, a.rope_theta, scaling), cfg.block_size);
        Ok(Weights {
            dims: Dims { c, heads: hl, kv_heads: kvl, hd, q_all: heads * hd, mlp: m, mlp_local: ml, swiglu: true },
            embed,
            wpe: None,
            rope: Some(rope),
            layers,
            norm_f: Norm::Rms(get("model.norm.weight"), a.rms_eps),
            head,
        })
    }

    fn gpt2(gpt: &Gpt, params: &[f32], rank: usize, tp: usize, vocab_block: &dyn Fn(&[f32]) -> Packed) -> Weights {
        let cfg = &gpt.cfg;
        let c = cfg.n_embd;
        let get = |name: &str| -> Vec<f32> {
            gpt.layout.get(name).unwrap_or_else(|| panic!("a whole GPT-2 has {name}")).view.of(params).to_vec()
        };
        // this rank's block of columns, cut as the training's column-parallel layers cut them
        let cut = |name: String, shape: [usize; 2], parts: usize| -> Vec<f32> {
            let full = get(&name);
            let split = Split::Cols { parts };
            let mut out = vec![0f32; split.local_shape(&shape, tp).iter().product()];
            split.slice(&full, &shape, rank, tp, &mut out);
            out
        };
        let ln = |p: &str| Norm::Layer(get(&format!("{p}.weight")), get(&format!("{p}.bias")));
        let layers = (0..cfg.n_layer)
            .map(|i| {
                let p = |s: &str| format!("h.{i}.{s}");
                Layer {
                    norm1: ln(&p("ln_1")),
                    wqkv: Packed::new(&cut(p("attn.c_attn.weight"), [c, 3 * c], 3), c, 3 * c / tp),
                    bqkv: Some(cut(p("attn.c_attn.bias"), [1, 3 * c], 3)),
                    wproj: Packed::new(&cut(p("attn.c_proj.weight"), [c, c], 1), c, c / tp),
                    bproj: Some(get(&p("attn.c_proj.bias"))),
                    norm2: ln(&p("ln_2")),
                    wfc: Packed::new(&cut(p("mlp.c_fc.weight"), [c, 4 * c], 1), c, 4 * c / tp),
                    bfc: Some(cut(p("mlp.c_fc.bias"), [1, 4 * c], 1)),
                    wout: Packed::new(&cut(p("mlp.c_proj.weight"), [4 * c, c], 1), 4 * c, c / tp),
                    bout: Some(get(&p("mlp.c_proj.bias"))),
                }
            })
            .collect();
        let embed = get("wte.weight");
        let head = vocab_block(&embed);
        let hl = cfg.n_head / tp;
        Weights {
            dims: Dims {
                c,
                heads: hl,
                kv_heads: hl,
                hd: c / cfg.n_head,
                q_all: c,
                mlp: 4 * c,
                mlp_local: 4 * c / tp,
                swiglu: false,
            },
            embed,
            wpe: Some(get("wpe.weight")),
            rope: None,
            layers,
            norm_f: ln("ln_f"),
            head,
        }
    }
}
