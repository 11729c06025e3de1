//! A model's weights arranged for batched inference, on one rank of a tensor-parallel group:
//! each product packed once for `matmul_rows`, cut by output columns (query heads with their
//! key/value heads, MLP units, output features, the vocabulary), for every family — read from
//! the family's description (`brigade::models::family`: each product's tensor name, widths,
//! bias and storage order), never from its name.
//!
//! Weights stored `[in, out]` (GPT-2's Conv1D) keep that layout, cut by columns (a fused
//! q|k|v by columns of each part); weights stored `[out, in]` (`torch.nn.Linear`) are packed
//! from their rows, q|k|v and gate|up each fused into one product of this rank's rows.
//! Key/value heads are cut by the training's own rule (`Split::kv_heads`): this rank's own
//! when tp divides them, or (tp above them) the one head its query heads read, held by
//! `tp / kv_heads` ranks.

use brigade::models::config::kv_copies;
use brigade::models::family::{BlockSpec, Linear, MlpSpec, MoeSpec, NormKind, NormSpec, Orient, Positions, Qkv};
use brigade::models::gguf::import::Stored;
use brigade::models::{Gpt, GptConfig};
use brigade::params::Split;
use brigade::tensor::quant_rows::QuantRows;
use brigade::tensor::rope::RopeTable;
use brigade::tensor::rowwise::Packed;
use std::sync::Arc;

/// Why a model cannot be cut for a tensor-parallel group (or held at all).
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    /// The training's rule for the group size (heads, key/value heads, MLP), in its words.
    #[error("{0}")]
    Layout(String),
    /// Another of the model's checks of the group size.
    #[error(transparent)]
    Model(brigade::Error),
    #[error("--tp {tp} does not divide the model's hidden size {hidden}")]
    HiddenSize { tp: usize, hidden: usize },
    #[error("{name}: key/value heads stored [in, out] cannot be replicated")]
    ReplicatedInOut { name: String },
    #[error("{name}: some products reading one input have biases, others not")]
    MixedBiases { name: String },
    #[error("products stored [in, out] are served one at a time")]
    MixedOrient,
    #[error("--tp {tp} does not divide the experts' width {width}; use --tp among {ok}")]
    ExpertWidth { tp: usize, width: usize, ok: String },
    #[error("{name}: experts with biases are not served")]
    ExpertBias { name: String },
}

/// A normalisation's weights.
pub(crate) enum Norm {
    /// LayerNorm: scale, shift and epsilon.
    Layer(Vec<f32>, Vec<f32>, f32),
    /// RMSNorm: scale and epsilon.
    Rms(Vec<f32>, f32),
}

impl Norm {
    /// The width of the rows it normalises.
    pub(crate) fn width(&self) -> usize {
        match self {
            Norm::Layer(w, _, _) | Norm::Rms(w, _) => w.len(),
        }
    }

    pub(crate) fn row(&self, out: &mut [f32], x: &[f32]) {
        match self {
            Norm::Layer(w, b, eps) => {
                out.copy_from_slice(x);
                brigade::tensor::layernorm::layernorm_row(out, w, b, *eps);
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
    /// RMSNorms over each query head and each key head before the rotation (Qwen3).
    pub(crate) qk_norm: Option<[Norm; 2]>,
    /// `[Q, C/tp]`: this rank's output features of the attention's projection.
    pub(crate) wproj: Packed,
    /// The whole projection's bias (added after the gather).
    pub(crate) bproj: Option<Vec<f32>>,
    pub(crate) norm2: Norm,
    /// GELU: `[C, M/tp]`; SwiGLU: `[C, 2·M/tp]`, gate | up of this rank's units.
    pub(crate) wfc: Packed,
    pub(crate) bfc: Option<Vec<f32>>,
    /// `[M, C/tp]`.
    pub(crate) wout: Packed,
    pub(crate) bout: Option<Vec<f32>>,
    /// A mixture of experts in place of the MLP (`wfc` and `wout` then empty).
    pub(crate) moe: Option<MoeLayer>,
}

/// A mixture of experts on one rank: the router (and the shared expert's gate) whole, every
/// expert's SwiGLU cut by its units as the dense MLP is — gate | up by this rank's units, the
/// down projection by this rank's output features (`nn::moe` is training's block).
pub(crate) struct MoeLayer {
    /// `[C, E]`: one logit per expert.
    pub(crate) router: Packed,
    /// Per expert: gate | up `[C, 2·W/tp]` and down `[W, C/tp]`.
    pub(crate) experts: Vec<(Packed, Packed)>,
    /// Each expert's whole width `W`.
    pub(crate) width: usize,
    /// The shared expert (gate | up, down, its whole width) and its sigmoid gate's `[C]`.
    pub(crate) shared: Option<(Packed, Packed, usize, Vec<f32>)>,
    pub(crate) top_k: usize,
    pub(crate) norm_topk: bool,
    /// The auxiliary-loss-free balancing's bias `[E]`, added to the probabilities for choosing.
    pub(crate) bias: Option<Vec<f32>>,
}

impl MoeLayer {
    /// Every product of the layer, to quantize.
    fn products(&mut self) -> impl Iterator<Item = &mut Packed> {
        let shared = self.shared.iter_mut().flat_map(|(gu, d, _, _)| [gu, d]);
        self.experts.iter_mut().flat_map(|(gu, d)| [gu, d]).chain(shared)
    }

    /// Bytes of the routed experts, and of what every token reads (the shared expert, its gate
    /// and the router).
    fn expert_bytes(&self) -> (usize, usize) {
        let routed = self.experts.iter().map(|(gu, d)| gu.bytes() + d.bytes()).sum();
        let shared = self.shared.as_ref().map_or(0, |(gu, d, _, g)| gu.bytes() + d.bytes() + 4 * g.len());
        (routed, shared + self.router.bytes())
    }

    /// Bytes a token reads: its k experts (of the average size), the shared expert, the router.
    fn bytes_read(&self) -> usize {
        let (routed, always) = self.expert_bytes();
        routed * self.top_k / self.experts.len() + always
    }

    /// Bytes of all its weights.
    fn bytes(&self) -> usize {
        let (routed, always) = self.expert_bytes();
        routed + always
    }
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
    /// GELU on one product, or SwiGLU on gate | up.
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
    /// A learned position table `[context, C]`; rotary positions rotate instead (`rope`).
    pub(crate) wpe: Option<Vec<f32>>,
    pub(crate) rope: Option<RopeTable>,
    pub(crate) layers: Vec<Layer>,
    pub(crate) norm_f: Norm,
    /// This rank's block of the vocabulary (`V/tp` rounded up, padded): the tied embedding's
    /// or the untied `lm_head`'s rows, transposed.
    pub(crate) head: Packed,
}

/// How the products' weights are held.
#[derive(Clone, Debug, Default)]
pub enum WeightFormat {
    /// As the model's file holds them (asked for; `Source::held` makes it `StoredIn` for a
    /// GGUF file): every float tensor, and a checkpoint folder's weights, in f32.
    #[default]
    Stored,
    /// A GGUF file's block-quantized matrices in their own types (`Packed::from_quant_rows`),
    /// its float tensors in f32.
    StoredIn(Arc<Stored>),
    F32,
    /// 8 bits, a scale per output column and per group of 32 rows of k.
    Int8,
    /// 8 bits, one scale per output column.
    Int8Channel,
    /// 4 bits as llama.cpp's Q4_0 (a scale per output column and per 32 rows of k) for the
    /// blocks' matrices; the head at 8 bits (`Int8`), as llama.cpp keeps its output layer.
    Int4,
}

impl WeightFormat {
    /// The rows of k that share a scale (`None`: f32).
    fn group(&self) -> Option<usize> {
        match self {
            WeightFormat::F32 | WeightFormat::Stored | WeightFormat::StoredIn(_) => None,
            WeightFormat::Int8 | WeightFormat::Int4 => Some(32),
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
pub fn check_tp(cfg: &GptConfig, tp: usize) -> Result<(), ShardError> {
    match brigade::models::config::check_heads(cfg, tp) {
        Ok(()) => {}
        Err(brigade::error::Error::Layout(m)) => return Err(ShardError::Layout(m)),
        Err(e) => return Err(ShardError::Model(e)),
    }
    if !cfg.n_embd.is_multiple_of(tp) {
        return Err(ShardError::HiddenSize { tp, hidden: cfg.n_embd });
    }
    if let Some((_, [wq, _])) = cfg.block(0).attn.qk_norm.filter(|(_, [wq, _])| tp > 1 && *wq != cfg.head_dim()) {
        return Err(ShardError::Layout(format!(
            "--tp {tp}: this model's q/k norms span all {wq} of q's features (OLMoE's), which no rank holds whole under tensor parallelism; serve it with --tp 1 (or --pp / --cp)"
        )));
    }
    // every mixture's experts (and shared expert) cut by their units
    for i in 0..cfg.n_layer {
        if let MlpSpec::Moe(m) = cfg.block(i).mlp {
            let widths = [Some(m.width()), m.shared.as_ref().map(|(s, _)| s[0].d_out)];
            if let Some(width) = widths.into_iter().flatten().find(|w| !w.is_multiple_of(tp)) {
                let ok: Vec<String> = (1..=width).filter(|d| width.is_multiple_of(*d)).map(|d| d.to_string()).collect();
                return Err(ShardError::ExpertWidth { tp, width, ok: ok.join(", ") });
            }
        }
    }
    Ok(())
}

fn quantize(p: &mut Packed, group: usize) {
    let f32s = std::mem::replace(p, Packed::new(&[], 0, 0));
    *p = f32s.quantized_int8(group);
}

impl Weights {
    /// Rank `rank` of `tp`'s share of `gpt` (a whole, unsliced model) with parameters
    /// `params`, its products' weights held as `format` says (every matrix of the blocks and
    /// the head — at 8 bits under `Int4`; the embedding table, read a row a token, stays f32).
    pub(crate) fn shard(
        gpt: &Gpt,
        params: &[f32],
        (rank, tp): (usize, usize),
        format: &WeightFormat,
    ) -> Result<Weights, ShardError> {
        let stored = match format {
            WeightFormat::StoredIn(s) => Some(&**s),
            _ => None,
        };
        let mut w = Self::shard_f32(gpt, params, rank, tp, stored)?;
        if let Some(g) = format.group() {
            for l in &mut w.layers {
                let experts = l.moe.iter_mut().flat_map(MoeLayer::products);
                let all = [&mut l.wqkv, &mut l.wproj, &mut l.wfc, &mut l.wout].into_iter().chain(experts);
                // (a mixture's layer holds no dense MLP)
                for p in all.filter(|p| p.k > 0) {
                    if matches!(format, WeightFormat::Int4) {
                        let f32s = std::mem::replace(p, Packed::new(&[], 0, 0));
                        *p = f32s.quantized_int4();
                    } else {
                        quantize(p, g);
                    }
                }
            }
            quantize(&mut w.head, g);
        }
        Ok(w)
    }

    /// Keeps only the layers `layers` (a pipeline stage's), the embedding only on the first
    /// stage and the final norm and head only on the last.
    pub(crate) fn keep_stage(&mut self, layers: std::ops::Range<usize>, (first, last): (bool, bool)) {
        self.layers = self.layers.drain(layers).collect();
        if !first {
            self.embed = Vec::new();
            self.wpe = self.wpe.as_ref().map(|_| Vec::new());
        }
        if !last {
            self.head = Packed::new(&[], 0, 0);
        }
    }

    /// Bytes of the products' weights (what a step reads), and of all the weights.
    pub(crate) fn bytes(&self) -> (usize, usize) {
        let products: usize = self
            .layers
            .iter()
            .map(|l| l.wqkv.bytes() + l.wproj.bytes() + l.wfc.bytes() + l.wout.bytes())
            .sum::<usize>()
            + self.head.bytes();
        // a mixture's token reads its own experts; all of them are held
        let read: usize = self.layers.iter().filter_map(|l| l.moe.as_ref()).map(MoeLayer::bytes_read).sum();
        let held: usize = self.layers.iter().filter_map(|l| l.moe.as_ref()).map(MoeLayer::bytes).sum();
        let floats = 4 * (self.embed.len() + self.wpe.as_ref().map_or(0, Vec::len));
        (products + read, products + held + floats)
    }

    /// The weights in f32, or the products `stored` holds in their file's types.
    fn shard_f32(
        gpt: &Gpt,
        params: &[f32],
        rank: usize,
        tp: usize,
        stored: Option<&Stored>,
    ) -> Result<Weights, ShardError> {
        let cfg = &gpt.cfg;
        check_tp(cfg, tp)?;
        let cut = Cutter { gpt, params, rank, tp, copies: kv_copies(cfg, tp), stored };
        let (c, v) = (cfg.n_embd, cfg.vocab_size);
        let vl = v.div_ceil(tp);
        let head_name = if cfg.tied() { cfg.embedding_name() } else { cfg.head_name() };
        let vocab_block = |table: &[f32]| {
            if let Some(rows) = cut.stored_rows(head_name) {
                let idx = cut.indices(v, [v, 1], Split::Vocab);
                return Packed::from_quant_rows(&rows.select(&idx));
            }
            let mut block = vec![0f32; vl * c];
            Split::Vocab.slice(table, &[v, c], rank, tp, &mut block);
            Packed::from_transposed(&block, vl, c)
        };
        let norm = |n: &NormSpec| match n.kind {
            NormKind::Layer { eps } => {
                Norm::Layer(cut.whole(&format!("{}.weight", n.name)), cut.whole(&format!("{}.bias", n.name)), eps)
            }
            NormKind::Rms { eps } => Norm::Rms(cut.whole(&format!("{}.weight", n.name)), eps),
        };
        let mut swiglu = false;
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            let b = cfg.block(i);
            let (wqkv, bqkv) = match &b.attn.qkv {
                Qkv::Fused(l) => cut.columns(&b, &[l], 3)?,
                Qkv::Separate { q, k, v } => cut.columns(&b, &[q, k, v], 1)?,
            };
            let (wproj, bproj) = cut.outputs(&b.attn.o)?;
            let empty = || (Packed::new(&[], 0, 0), None);
            let (wfc, bfc) = match &b.mlp {
                MlpSpec::Gelu { fc, .. } => cut.columns(&b, &[fc], 1)?,
                MlpSpec::SwiGlu { gate, up, .. } => cut.columns(&b, &[gate, up], 1)?,
                MlpSpec::Moe(_) => empty(),
            };
            let (wout, bout) = match &b.mlp {
                MlpSpec::Gelu { proj: l, .. } | MlpSpec::SwiGlu { down: l, .. } => cut.outputs(l)?,
                MlpSpec::Moe(_) => empty(),
            };
            let moe = match &b.mlp {
                MlpSpec::Moe(m) => Some(cut.experts(&b, m)?),
                _ => None,
            };
            // a mixture's dense layers are SwiGLU (the family's)
            swiglu |= !matches!(b.mlp, MlpSpec::Gelu { .. });
            layers.push(Layer {
                norm1: norm(&b.ln_1),
                wqkv,
                bqkv,
                qk_norm: b.attn.qk_norm.as_ref().map(|([q, k], _)| [norm(q), norm(k)]),
                wproj,
                bproj,
                norm2: norm(&b.ln_2),
                wfc,
                bfc,
                wout,
                bout,
                moe,
            });
        }
        let embed = cut.whole(cfg.embedding_name());
        let head = if cfg.tied() { vocab_block(&embed) } else { vocab_block(&cut.whole(cfg.head_name())) };
        let hd = cfg.head_dim();
        let positions = cfg.positions();
        let (wpe, rope) = match &positions {
            Positions::Learned { name } => (Some(cut.whole(name)), None),
            Positions::Rotary { .. } => {
                let inv_freq = positions.inv_freq(hd).expect("rotary positions have frequencies");
                (None, Some(RopeTable::new(&inv_freq, cfg.block_size)))
            }
        };
        let (m, heads) = (cfg.mlp_width(), cfg.n_head);
        Ok(Weights {
            dims: Dims {
                c,
                heads: heads / tp,
                kv_heads: cfg.kv_heads() * cut.copies / tp,
                hd,
                q_all: cfg.q_width(),
                mlp: m,
                mlp_local: m / tp,
                swiglu,
            },
            embed,
            wpe,
            rope,
            layers,
            norm_f: norm(&cfg.final_norm()),
            head,
        })
    }
}

/// Cuts a whole model's tensors for one rank of a tensor-parallel group.
struct Cutter<'a> {
    gpt: &'a Gpt,
    params: &'a [f32],
    rank: usize,
    tp: usize,
    /// Ranks holding each key/value head.
    copies: usize,
    /// The file's block-quantized matrices, kept in their types.
    stored: Option<&'a Stored>,
}

impl Cutter<'_> {
    fn stored_rows(&self, name: &str) -> Option<QuantRows> {
        self.stored.and_then(|s| s.rows(name))
    }

    /// The output features (of `d_out`) this rank holds under `split` of a tensor of `shape`
    /// (`[d_out, 1]` or `[1, d_out]`), in its order; `None` a padding row.
    fn indices(&self, d_out: usize, shape: [usize; 2], split: Split) -> Vec<Option<usize>> {
        // each feature's number + 1 cut as the values are (a padding row comes out 0)
        let numbers: Vec<f32> = (1..=d_out).map(|i| i as f32).collect();
        self.piece(&numbers, &shape, split).iter().map(|&x| (x > 0.0).then(|| x as usize - 1)).collect()
    }

    /// The products `ls` (reading one input) in their file's types, this rank's output
    /// features side by side, if the file stores every one of them block-quantized.
    fn stored_columns(&self, ls: &[(&Linear, Split)]) -> Option<Packed> {
        let mut parts = Vec::with_capacity(ls.len());
        for &(l, split) in ls {
            let rows = self.stored_rows(&l.weight())?;
            let shape = match l.orient {
                Orient::OutIn => [l.d_out, 1],
                Orient::InOut => [1, l.d_out],
            };
            parts.push(rows.select(&self.indices(l.d_out, shape, split)));
        }
        Some(Packed::from_quant_rows(&QuantRows::concat(parts)))
    }

    /// A mixture's router whole, and its experts' SwiGLUs (and the shared expert's) cut by
    /// their units: gate | up as `columns` cuts a dense SwiGLU, down by `outputs`.
    fn experts(&self, b: &BlockSpec, m: &MoeSpec) -> Result<MoeLayer, ShardError> {
        let swiglu = |[gate, up, down]: &[Linear; 3]| -> Result<(Packed, Packed), ShardError> {
            let (gu, gb) = self.columns(b, &[gate, up], 1)?;
            let (d, db) = self.outputs(down)?;
            match gb.or(db) {
                Some(_) => Err(ShardError::ExpertBias { name: gate.name.clone() }),
                None => Ok((gu, d)),
            }
        };
        let router = self.whole(&m.router.weight());
        let shared = match &m.shared {
            Some((s, g)) => {
                let (gu, d) = swiglu(s)?;
                Some((gu, d, s[0].d_out, self.whole(&g.weight())))
            }
            None => None,
        };
        Ok(MoeLayer {
            router: Packed::from_transposed(&router, m.router.d_out, m.router.d_in),
            experts: m.experts.iter().map(swiglu).collect::<Result<_, _>>()?,
            width: m.width(),
            shared,
            top_k: m.top_k,
            norm_topk: m.norm_topk,
            bias: m.bias.as_ref().map(|(b, _)| self.whole(b)),
        })
    }

    fn whole(&self, name: &str) -> Vec<f32> {
        let spec = self.gpt.layout.get(name).unwrap_or_else(|| panic!("a whole model has {name}"));
        spec.view.of(self.params).to_vec()
    }

    /// This rank's piece of `full` (shape `shape`) as `split` cuts it.
    fn piece(&self, full: &[f32], shape: &[usize], split: Split) -> Vec<f32> {
        let mut out = vec![0f32; split.local_shape(shape, self.tp).iter().product()];
        split.slice(full, shape, self.rank, self.tp, &mut out);
        out
    }

    /// This rank's output columns of the products `ls` (which read one input), side by side
    /// in one packed product, and their biases; a product stored `[in, out]` whose outputs
    /// are `parts` segments (a fused q|k|v) is cut in each. The key/value heads' products are
    /// cut by `Split::kv_heads`, as training cuts them.
    fn columns(&self, b: &BlockSpec, ls: &[&Linear], parts: usize) -> Result<(Packed, Option<Vec<f32>>), ShardError> {
        let d_in = ls[0].d_in;
        let mut b_pieces = Vec::with_capacity(ls.len());
        let mut splits = Vec::with_capacity(ls.len());
        for &l in ls {
            let split = match l.orient {
                Orient::OutIn if b.is_kv(l) => Split::kv_heads(self.copies),
                Orient::OutIn => Split::Rows,
                Orient::InOut if b.is_kv(l) && self.copies > 1 => {
                    return Err(ShardError::ReplicatedInOut { name: l.name.clone() })
                }
                Orient::InOut => Split::Cols { parts },
            };
            splits.push((l, split));
            b_pieces.push(l.bias.then(|| self.piece(&self.whole(&l.bias_name()), &[l.d_out], split)));
        }
        let bias = match b_pieces.iter().filter(|b| b.is_some()).count() {
            0 => None,
            n if n == ls.len() => Some(b_pieces.into_iter().flatten().flatten().collect()),
            _ => return Err(ShardError::MixedBiases { name: ls[0].name.clone() }),
        };
        if let Some(p) = self.stored_columns(&splits) {
            return Ok((p, bias));
        }
        let w_pieces: Vec<(Orient, Vec<f32>)> = splits
            .iter()
            .map(|&(l, split)| {
                let shape = match l.orient {
                    Orient::OutIn => [l.d_out, l.d_in],
                    Orient::InOut => [l.d_in, l.d_out],
                };
                (l.orient, self.piece(&self.whole(&l.weight()), &shape, split))
            })
            .collect();
        Ok((pack(&w_pieces, d_in)?, bias))
    }

    /// A product cut by its outputs into `tp` blocks (serving's output projections: every
    /// output element the whole `fma` chain over its input), with its whole bias (added after
    /// the gather).
    fn outputs(&self, l: &Linear) -> Result<(Packed, Option<Vec<f32>>), ShardError> {
        let (split, shape) = match l.orient {
            Orient::OutIn => (Split::Rows, [l.d_out, l.d_in]),
            Orient::InOut => (Split::Cols { parts: 1 }, [l.d_in, l.d_out]),
        };
        if let Some(p) = self.stored_columns(&[(l, split)]) {
            return Ok((p, l.bias.then(|| self.whole(&l.bias_name()))));
        }
        let w = self.piece(&self.whole(&l.weight()), &shape, split);
        Ok((pack(&[(l.orient, w)], l.d_in)?, l.bias.then(|| self.whole(&l.bias_name()))))
    }
}

/// Pieces of products reading `d_in` inputs, side by side in one packed product: pieces
/// stored `[out, in]` one after another (rows), or one piece stored `[in, out]`.
fn pack(pieces: &[(Orient, Vec<f32>)], d_in: usize) -> Result<Packed, ShardError> {
    match pieces {
        [(Orient::InOut, w)] => Ok(Packed::new(w, d_in, w.len() / d_in)),
        ps if ps.iter().all(|(o, _)| *o == Orient::OutIn) => {
            let rows: Vec<f32> = ps.iter().flat_map(|(_, w)| w.iter().copied()).collect();
            Ok(Packed::from_transposed(&rows, rows.len() / d_in, d_in))
        }
        _ => Err(ShardError::MixedOrient),
    }
}
