//! GPT-2 inference over the paged KV cache: one forward pass runs every scheduled token of
//! every sequence at once (a prefill chunk or one decode token each), packed end to end, so
//! the weights are read once per step for the whole batch.
//!
//! Every operation is row-local or reduces in a fixed order — the products through
//! `matmul_rows` (each element an `fma` chain over k in order), LayerNorm and GELU per row,
//! attention per token over its own sequence's cached positions in order — so a sequence's
//! numbers do not depend on what else is in the batch, on how its prompt was chunked, or on
//! whether its prefix came from the cache: batch invariance by construction.
//!
//! Tensor parallelism (`--tp N`): rank r holds its block of heads (q | k | v columns of
//! `c_attn`, cut as the training's column-parallel layer cuts them, and those heads' keys and
//! values in its KV cache), its block of output columns of every other product, and its block
//! of the vocabulary for the tied head. Megatron's row-parallel layers (`c_proj`, `mlp.c_proj`)
//! would sum partial products over k across ranks — a different order of additions than one
//! worker's, so tokens could change at near-ties. Here every product is split by output
//! columns instead and its input all-gathered, so each output element is the same `fma` chain
//! over the whole k as on one worker: `--tp N` gives the single worker's logits bit for bit.
//! Rank 0 schedules; each step it broadcasts the step's work to the others.

use crate::kv::KvCache;
use brigade::models::Gpt;
use brigade::params::Split;
use brigade::tensor::rowwise::{matmul_rows, Packed};
use brigade_comm::Comm;
use rayon::prelude::*;

/// One block's weights on one rank (`/tp`: this rank's block of columns).
struct Layer {
    ln1: (Vec<f32>, Vec<f32>),
    wqkv: Packed, // [C, 3C/tp]: q | k | v of this rank's heads
    bqkv: Vec<f32>,
    wproj: Packed, // [C, C/tp]
    bproj: Vec<f32>,
    ln2: (Vec<f32>, Vec<f32>),
    wfc: Packed, // [C, 4C/tp]
    bfc: Vec<f32>,
    wout: Packed, // [4C, C/tp]
    bout: Vec<f32>,
}

/// The weights of a GPT-2 (or one rank's share), arranged for inference.
pub struct Model {
    pub layers_n: usize,
    pub heads: usize,
    pub c: usize,
    pub vocab: usize,
    pub context: usize,
    /// The tensor-parallel group (none on a single worker).
    comm: Option<Comm>,
    tp: usize,
    wte: Vec<f32>, // [V, C] (embedding)
    head: Packed,  // this rank's vocabulary block of wteᵀ (padded to V/tp rounded up)
    wpe: Vec<f32>,
    layers: Vec<Layer>,
    lnf: (Vec<f32>, Vec<f32>),
}

/// A step's work as rank 0 sends it to the others.
struct OwnedWork {
    tokens: Vec<u32>,
    start: usize,
    blocks: Vec<usize>,
    logits: bool,
}

/// The message that ends a follower's loop (instead of a work count).
const STOP: u32 = u32::MAX;

/// One sequence's share of a step: its `tokens` at positions `start..start + tokens.len()`,
/// its block table, and whether the step must return its last token's logits.
pub struct Work<'a> {
    pub tokens: &'a [u32],
    pub start: usize,
    pub blocks: &'a [usize],
    pub logits: bool,
}

impl Model {
    /// From a whole (not tensor-sliced) model and its parameters, on a single worker.
    pub fn new(gpt: &Gpt, params: &[f32]) -> Model {
        Model::shard(gpt, params, None).expect("a single worker takes any model")
    }

    /// This rank's share of the model for the tensor-parallel group `comm` (`None`: all of it).
    pub fn shard(gpt: &Gpt, params: &[f32], comm: Option<Comm>) -> Result<Model, String> {
        let cfg = gpt.cfg;
        let (rank, tp) = comm.as_ref().map_or((0, 1), |c| (c.rank(), c.size()));
        let (c, v) = (cfg.n_embd, cfg.vocab_size);
        if !cfg.n_head.is_multiple_of(tp) {
            return Err(format!("--tp {tp} does not divide the model's {} attention heads", cfg.n_head));
        }
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
        let ln = |p: &str| (get(&format!("{p}.weight")), get(&format!("{p}.bias")));
        let wte = get("wte.weight");
        let vl = v.div_ceil(tp);
        let mut wte_block = vec![0f32; vl * c];
        Split::Vocab.slice(&wte, &[v, c], rank, tp, &mut wte_block);
        let head = Packed::from_transposed(&wte_block, vl, c);
        let layers = (0..cfg.n_layer)
            .map(|i| {
                let p = |s: &str| format!("h.{i}.{s}");
                Layer {
                    ln1: ln(&p("ln_1")),
                    wqkv: Packed::new(&cut(p("attn.c_attn.weight"), [c, 3 * c], 3), c, 3 * c / tp),
                    bqkv: cut(p("attn.c_attn.bias"), [1, 3 * c], 3),
                    wproj: Packed::new(&cut(p("attn.c_proj.weight"), [c, c], 1), c, c / tp),
                    bproj: get(&p("attn.c_proj.bias")),
                    ln2: ln(&p("ln_2")),
                    wfc: Packed::new(&cut(p("mlp.c_fc.weight"), [c, 4 * c], 1), c, 4 * c / tp),
                    bfc: cut(p("mlp.c_fc.bias"), [1, 4 * c], 1),
                    wout: Packed::new(&cut(p("mlp.c_proj.weight"), [4 * c, c], 1), 4 * c, c / tp),
                    bout: get(&p("mlp.c_proj.bias")),
                }
            })
            .collect();
        Ok(Model {
            layers_n: cfg.n_layer,
            heads: cfg.n_head,
            c,
            vocab: v,
            context: cfg.block_size,
            comm: comm.filter(|c| c.size() > 1),
            tp,
            wte,
            head,
            wpe: get("wpe.weight"),
            layers,
            lnf: ln("ln_f"),
        })
    }

    /// Floats of one token's keys (= its values) per layer in this rank's KV cache.
    pub fn kv_width(&self) -> usize {
        self.c / self.tp
    }

    /// Runs one step: writes every scheduled token's keys and values into `kv` and returns
    /// the logits `[vocab]` of the last token of each work item that asks for them, in order.
    /// On rank 0 of a tensor-parallel group, first sends the work to the other ranks.
    pub fn step(&self, kv: &mut KvCache, work: &[Work]) -> Vec<Vec<f32>> {
        if self.comm.is_some() {
            let mut msg = vec![work.len() as u32];
            for w in work {
                msg.extend([w.tokens.len() as u32, w.start as u32, w.blocks.len() as u32, w.logits as u32]);
                msg.extend_from_slice(w.tokens);
                msg.extend(w.blocks.iter().map(|&b| b as u32));
            }
            self.send(&msg);
        }
        self.forward(kv, work)
    }

    /// On a rank other than 0: takes the next step's work from rank 0 and runs it; false once
    /// rank 0 has stopped.
    pub fn follow(&self, kv: &mut KvCache) -> bool {
        let msg = self.receive();
        if msg[0] == STOP {
            return false;
        }
        let mut it = msg[1..].iter().map(|&v| v as usize);
        let mut owned = Vec::new();
        for _ in 0..msg[0] {
            let mut next = || it.next().expect("a whole work message");
            let (nt, start, nb, logits) = (next(), next(), next(), next() == 1);
            let tokens: Vec<u32> = (0..nt).map(|_| next() as u32).collect();
            let blocks: Vec<usize> = (0..nb).map(|_| next()).collect();
            owned.push(OwnedWork { tokens, start, blocks, logits });
        }
        let work: Vec<Work> = owned
            .iter()
            .map(|o| Work { tokens: &o.tokens, start: o.start, blocks: &o.blocks, logits: o.logits })
            .collect();
        self.forward(kv, &work);
        true
    }

    /// On rank 0: ends the other ranks' `follow` loops.
    pub fn stop_followers(&self) {
        if self.comm.is_some() {
            self.send(&[STOP]);
        }
    }

    /// Broadcasts a message of u32s from rank 0 (its length first), bit for bit in f32s.
    fn send(&self, msg: &[u32]) {
        let comm = self.comm.as_ref().expect("a group");
        let mut len = [f32::from_bits(msg.len() as u32)];
        comm.broadcast(&mut len, 0).expect("the tensor-parallel group is alive");
        let mut buf: Vec<f32> = msg.iter().map(|&v| f32::from_bits(v)).collect();
        comm.broadcast(&mut buf, 0).expect("the tensor-parallel group is alive");
    }

    fn receive(&self) -> Vec<u32> {
        let comm = self.comm.as_ref().expect("a follower has a group");
        let mut len = [0f32];
        comm.broadcast(&mut len, 0).expect("the tensor-parallel group is alive");
        let mut buf = vec![0f32; len[0].to_bits() as usize];
        comm.broadcast(&mut buf, 0).expect("the tensor-parallel group is alive");
        buf.iter().map(|v| v.to_bits()).collect()
    }

    /// `[n, full]` from every rank's `[n, w]` block of columns (rank r's are columns r·w…),
    /// dropping columns past `full` (the vocabulary's padding), in `out`; on one worker,
    /// `local` itself.
    fn gather_cols<'a>(&self, local: &'a [f32], n: usize, w: usize, full: usize, out: &'a mut Vec<f32>) -> &'a [f32] {
        let Some(comm) = &self.comm else { return local };
        let mut all = vec![0f32; self.tp * n * w];
        comm.all_gather(local, &mut all).expect("the tensor-parallel group is alive");
        out.resize(n * full, 0.0);
        for r in 0..self.tp {
            let cols = w.min(full.saturating_sub(r * w));
            for i in 0..n {
                out[i * full + r * w..i * full + r * w + cols]
                    .copy_from_slice(&all[(r * n + i) * w..(r * n + i) * w + cols]);
            }
        }
        out
    }

    fn forward(&self, kv: &mut KvCache, work: &[Work]) -> Vec<Vec<f32>> {
        let (c, tp) = (self.c, self.tp);
        let cl = c / tp;
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
        let mut qkv = vec![0f32; n * 3 * cl];
        let mut ctx = vec![0f32; n * cl];
        let mut y = vec![0f32; n * cl];
        let mut f = vec![0f32; n * 4 * cl];
        // the gathered (whole-width) inputs and outputs under tensor parallelism
        let (mut ctx_all, mut y_all, mut f_all) = (Vec::new(), Vec::new(), Vec::new());
        for (li, ly) in self.layers.iter().enumerate() {
            layernorm_rows(&mut h, &x, &ly.ln1, c);
            matmul_rows(&mut qkv, &h, &ly.wqkv, n);
            add_bias(&mut qkv, &ly.bqkv);
            for (r, &(wi, pos)) in rows.iter().enumerate() {
                let w = &work[wi];
                let (b, slot) = (w.blocks[pos / kv.block_size], pos % kv.block_size);
                kv.slot_mut(b, li, 0, slot).copy_from_slice(&qkv[r * 3 * cl + cl..r * 3 * cl + 2 * cl]);
                kv.slot_mut(b, li, 1, slot).copy_from_slice(&qkv[r * 3 * cl + 2 * cl..r * 3 * cl + 3 * cl]);
            }
            self.attention(&mut ctx, &qkv, &rows, work, kv, li);
            let ctx = self.gather_cols(&ctx, n, cl, c, &mut ctx_all);
            matmul_rows(&mut y, ctx, &ly.wproj, n);
            residual(&mut x, self.gather_cols(&y, n, cl, c, &mut y_all), &ly.bproj);
            layernorm_rows(&mut h, &x, &ly.ln2, c);
            matmul_rows(&mut f, &h, &ly.wfc, n);
            add_bias(&mut f, &ly.bfc);
            f.par_chunks_mut(4 * cl).for_each(|r| {
                for v in r.iter_mut() {
                    *v = brigade::tensor::elementwise::gelu_tanh(*v);
                }
            });
            matmul_rows(&mut y, self.gather_cols(&f, n, 4 * cl, 4 * c, &mut f_all), &ly.wout, n);
            residual(&mut x, self.gather_cols(&y, n, cl, c, &mut y_all), &ly.bout);
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
        let vl = self.head.n;
        let mut logits = vec![0f32; m * vl];
        matmul_rows(&mut logits, &hl, &self.head, m);
        let mut all = Vec::new();
        let logits = self.gather_cols(&logits, m, vl, self.vocab, &mut all);
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
        // this rank's heads: q, k and v rows of width c / tp
        let (c, heads) = (self.c / self.tp, self.heads / self.tp);
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
