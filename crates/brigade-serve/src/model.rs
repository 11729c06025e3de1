//! GPT-2 inference over the paged KV cache: one forward pass runs every scheduled token of
//! every sequence at once (a prefill chunk or one decode token each), packed end to end, so
//! the weights are read once per step for the whole batch.
//!
//! Every operation is row-local or reduces in a fixed order — the products through
//! `matmul_rows` (each element an `fma` chain over k in order), LayerNorm and GELU per row,
//! attention per token over its own sequence's cached positions in order — so a sequence's
//! numbers do not depend on what else is in the batch, on how its prompt was chunked, or on
//! whether its prefix came from the cache: batch invariance by construction.

use crate::kv::KvCache;
use brigade::models::Gpt;
use brigade::tensor::rowwise::{matmul_rows, Packed};
use rayon::prelude::*;

struct Layer {
    ln1: (Vec<f32>, Vec<f32>),
    wqkv: Packed, // [C, 3C]
    bqkv: Vec<f32>,
    wproj: Packed, // [C, C]
    bproj: Vec<f32>,
    ln2: (Vec<f32>, Vec<f32>),
    wfc: Packed, // [C, 4C]
    bfc: Vec<f32>,
    wout: Packed, // [4C, C]
    bout: Vec<f32>,
}

/// The weights of a GPT-2, arranged for inference.
pub struct Model {
    pub layers_n: usize,
    pub heads: usize,
    pub c: usize,
    pub vocab: usize,
    pub context: usize,
    wte: Vec<f32>, // [V, C] (embedding)
    head: Packed,  // wteᵀ: the tied head as a product's right operand
    wpe: Vec<f32>,
    layers: Vec<Layer>,
    lnf: (Vec<f32>, Vec<f32>),
}

/// One sequence's share of a step: its `tokens` at positions `start..start + tokens.len()`,
/// its block table, and whether the step must return its last token's logits.
pub struct Work<'a> {
    pub tokens: &'a [u32],
    pub start: usize,
    pub blocks: &'a [usize],
    pub logits: bool,
}

impl Model {
    /// From a whole (not tensor-sliced) model and its parameters.
    pub fn new(gpt: &Gpt, params: &[f32]) -> Model {
        let cfg = gpt.cfg;
        let get = |name: &str| -> Vec<f32> {
            gpt.layout.get(name).unwrap_or_else(|| panic!("a whole GPT-2 has {name}")).view.of(params).to_vec()
        };
        let ln = |p: &str| (get(&format!("{p}.weight")), get(&format!("{p}.bias")));
        let (c, v) = (cfg.n_embd, cfg.vocab_size);
        let wte = get("wte.weight");
        let head = Packed::from_transposed(&wte, v, c);
        let pack = |name: String, k: usize, n: usize| Packed::new(&get(&name), k, n);
        let layers = (0..cfg.n_layer)
            .map(|i| Layer {
                ln1: ln(&format!("h.{i}.ln_1")),
                wqkv: pack(format!("h.{i}.attn.c_attn.weight"), c, 3 * c),
                bqkv: get(&format!("h.{i}.attn.c_attn.bias")),
                wproj: pack(format!("h.{i}.attn.c_proj.weight"), c, c),
                bproj: get(&format!("h.{i}.attn.c_proj.bias")),
                ln2: ln(&format!("h.{i}.ln_2")),
                wfc: pack(format!("h.{i}.mlp.c_fc.weight"), c, 4 * c),
                bfc: get(&format!("h.{i}.mlp.c_fc.bias")),
                wout: pack(format!("h.{i}.mlp.c_proj.weight"), 4 * c, c),
                bout: get(&format!("h.{i}.mlp.c_proj.bias")),
            })
            .collect();
        Model {
            layers_n: cfg.n_layer,
            heads: cfg.n_head,
            c,
            vocab: v,
            context: cfg.block_size,
            wte,
            head,
            wpe: get("wpe.weight"),
            layers,
            lnf: ln("ln_f"),
        }
    }

    /// Runs one step: writes every scheduled token's keys and values into `kv` and returns
    /// the logits `[vocab]` of the last token of each work item that asks for them, in order.
    pub fn step(&self, kv: &mut KvCache, work: &[Work]) -> Vec<Vec<f32>> {
        let c = self.c;
        let n: usize = work.iter().map(|w| w.tokens.len()).sum();
        // (work item, position) of every packed row
        let rows: Vec<(usize, usize)> =
            work.iter().enumerate().flat_map(|(i, w)| (0..w.tokens.len()).map(move |p| (i, w.start + p))).collect();
        let mut x = vec![0f32; n * c];
        for ((wi, pos), xr) in rows.iter().zip(x.chunks_exact_mut(c)) {
            let tok = work[*wi].tokens[pos - work[*wi].start] as usize;
            for ((o, &a), &b) in
                xr.iter_mut().zip(&self.wte[tok * c..(tok + 1) * c]).zip(&self.wpe[pos * c..(pos + 1) * c])
            {
                *o = a + b;
            }
        }
        let mut h = vec![0f32; n * c];
        let mut qkv = vec![0f32; n * 3 * c];
        let mut ctx = vec![0f32; n * c];
        let mut y = vec![0f32; n * c];
        let mut f = vec![0f32; n * 4 * c];
        for (li, ly) in self.layers.iter().enumerate() {
            layernorm_rows(&mut h, &x, &ly.ln1, c);
            matmul_rows(&mut qkv, &h, &ly.wqkv, n);
            add_bias(&mut qkv, &ly.bqkv);
            for (r, &(wi, pos)) in rows.iter().enumerate() {
                let w = &work[wi];
                let (b, slot) = (w.blocks[pos / kv.block_size], pos % kv.block_size);
                kv.slot_mut(b, li, 0, slot).copy_from_slice(&qkv[r * 3 * c + c..r * 3 * c + 2 * c]);
                kv.slot_mut(b, li, 1, slot).copy_from_slice(&qkv[r * 3 * c + 2 * c..r * 3 * c + 3 * c]);
            }
            self.attention(&mut ctx, &qkv, &rows, work, kv, li);
            matmul_rows(&mut y, &ctx, &ly.wproj, n);
            residual(&mut x, &y, &ly.bproj);
            layernorm_rows(&mut h, &x, &ly.ln2, c);
            matmul_rows(&mut f, &h, &ly.wfc, n);
            add_bias(&mut f, &ly.bfc);
            f.par_chunks_mut(4 * c).for_each(|r| {
                for v in r.iter_mut() {
                    *v = brigade::tensor::elementwise::gelu_tanh(*v);
                }
            });
            matmul_rows(&mut y, &f, &ly.wout, n);
            residual(&mut x, &y, &ly.bout);
        }
        // the last row of each work item that wants logits
        let mut last = Vec::new();
        let mut row = 0;
        for w in work {
            row += w.tokens.len();
            if w.logits {
                last.extend_from_slice(&x[(row - 1) * c..row * c]);
            }
        }
        let m = last.len() / c;
        let mut hl = vec![0f32; m * c];
        layernorm_rows(&mut hl, &last, &self.lnf, c);
        let mut logits = vec![0f32; m * self.vocab];
        matmul_rows(&mut logits, &hl, &self.head, m);
        logits.chunks_exact(self.vocab).map(<[f32]>::to_vec).collect()
    }

    /// Causal attention of each packed row over its sequence's cached positions 0..=pos.
    fn attention(
        &self,
        ctx: &mut [f32],
        qkv: &[f32],
        rows: &[(usize, usize)],
        work: &[Work],
        kv: &KvCache,
        layer: usize,
    ) {
        let (c, heads) = (self.c, self.heads);
        let hd = c / heads;
        let scale = 1.0 / (hd as f32).sqrt();
        ctx.par_chunks_mut(c).zip(rows.par_iter()).enumerate().for_each_init(
            || (Vec::new(), vec![0f32; heads]),
            |(sc, inv), (r, (out, &(wi, pos)))| {
                let w = &work[wi];
                let q = &qkv[r * 3 * c..r * 3 * c + c];
                let np = pos + 1;
                // scores [head][position]: each cached key row is read once, for every head
                sc.resize(heads * np, 0.0);
                for p in 0..np {
                    let k = kv.slot(w.blocks[p / kv.block_size], layer, 0, p % kv.block_size);
                    for h in 0..heads {
                        sc[h * np + p] = dot(&q[h * hd..(h + 1) * hd], &k[h * hd..(h + 1) * hd]) * scale;
                    }
                }
                for (h, s) in sc.chunks_exact_mut(np).enumerate() {
                    let mx = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                    let mut sum = 0f32;
                    for v in s.iter_mut() {
                        *v = brigade::tensor::math::exp(*v - mx);
                        sum += *v;
                    }
                    inv[h] = sum;
                }
                // out[h] = Σ_p (s[h][p] / sum[h]) · v_p[h], over p in order: each value row read once
                out.fill(0.0);
                for p in 0..np {
                    let v = kv.slot(w.blocks[p / kv.block_size], layer, 1, p % kv.block_size);
                    for h in 0..heads {
                        let wgt = sc[h * np + p] / inv[h];
                        for (o, &vv) in out[h * hd..(h + 1) * hd].iter_mut().zip(&v[h * hd..(h + 1) * hd]) {
                            *o = wgt.mul_add(vv, *o);
                        }
                    }
                }
            },
        );
    }
}

/// A dot product in a fixed order: 8 lanes, then the lanes in order.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for t in 0..8 {
            acc[t] = x[t].mul_add(y[t], acc[t]);
        }
    }
    let mut s = acc.iter().sum::<f32>();
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        s = x.mul_add(*y, s);
    }
    s
}

fn add_bias(x: &mut [f32], b: &[f32]) {
    x.par_chunks_mut(b.len()).for_each(|r| r.iter_mut().zip(b).for_each(|(v, &bb)| *v += bb));
}

fn residual(x: &mut [f32], y: &[f32], b: &[f32]) {
    let c = b.len();
    x.par_chunks_mut(c).zip(y.par_chunks(c)).for_each(|(x, y)| {
        for ((x, &y), &bb) in x.iter_mut().zip(y).zip(b) {
            *x += y + bb;
        }
    });
}

/// GPT-2's LayerNorm (eps 1e-5) of each row of `x` into `out`.
fn layernorm_rows(out: &mut [f32], x: &[f32], (w, b): &(Vec<f32>, Vec<f32>), c: usize) {
    out.par_chunks_mut(c).zip(x.par_chunks(c)).for_each(|(o, x)| {
        o.copy_from_slice(x);
        brigade::tensor::layernorm::layernorm_row(o, w, b, brigade::tensor::layernorm::EPS);
    });
}
