//! Inference over the paged KV cache, for GPT-2 and the Llama family (weights in
//! `weights.rs`): one forward pass runs every scheduled token of every sequence at once (a
//! prefill chunk or one decode token each), packed end to end, so the weights are read once
//! per step for the whole batch. The Llama family's queries and keys are rotated at each
//! token's own position before its keys go into the cache; the cache holds only the key/value
//! heads (grouped-query attention shrinks it by heads / kv_heads).
//!
//! Every operation is row-local or reduces in a fixed order — the products through
//! `matmul_rows` (each element an `fma` chain over k in order), the norms, rotations and
//! activations per row,
//! attention per token over its own sequence's cached positions in order — so a sequence's
//! numbers do not depend on what else is in the batch, on how its prompt was chunked, or on
//! whether its prefix came from the cache: batch invariance by construction.
//!
//! Tensor parallelism (`--tp N`): rank r holds its block of query heads with their key/value
//! heads (cut as the training's column-parallel layers cut them; key/value heads held by
//! several ranks when tp exceeds them), those keys and values in its KV cache, its block of
//! output columns of every other product, and its block of the vocabulary for the head. Megatron's row-parallel layers (the attention's and the MLP's output projections)
//! would sum partial products over k across ranks — a different order of additions than one
//! worker's, so tokens could change at near-ties. Here every product is split by output
//! columns instead and its input all-gathered, so each output element is the same `fma` chain
//! over the whole k as on one worker: `--tp N` gives the single worker's logits bit for bit.
//! Rank 0 schedules; each step it broadcasts the step's work to the others.
//!
//! Pipeline parallelism (`--pp N`): stage s holds a contiguous run of the layers (`stage_layers`:
//! cut by cost, as training's partitioner cuts them — the last stage's head counts as the layers
//! its product is worth, the first stage's scheduling and sampling as what they were measured to
//! take, so on GPT-2 small 2 stages hold 8 and 4 layers) with their KV cache, the
//! first stage the embedding, the last the final norm and head. Each step's work travels down the
//! pipeline ahead of its rows (each stage passes it on before it computes); the first stage
//! embeds the tokens and runs its layers, each next stage takes the rows from the one before,
//! and the last sends the logits back to rank 0. Every message goes point to point and returns at
//! once, so rank 0 can `launch` the next step while the later stages work on the last one, and
//! `collect` their logits in order: the engine keeps one step per stage in flight. Every
//! operation is the single worker's on the same rows, so `--pp N` gives its logits bit for bit.
//!
//! Context parallelism (`--cp N`): every rank holds the whole model and a KV cache of its own;
//! a sequence's blocks are striped over the ranks (its j-th block on rank j mod N, the
//! scheduler's `BlockPool::allocate_at`), and each rank computes the rows whose block it holds —
//! a long prompt's prefill split along the sequence, about evenly even under the causal mask.
//! Attention passes the queries (`context_attention`): each rank attends every row of the step
//! over the keys and values it holds, and each row's owner merges the ranks' partial results
//! by their log-sum-exps, in rank order. Decoding reads the cache where it lies the same way.
//! The merge adds a row's weighted values in another order than one worker's single chain over
//! the positions, so logits are not bit-identical to one worker's (within float rounding;
//! greedy tokens equal in the tests); they are batch- and chunk-invariant as ever.

use super::kv_store::KvStore;
use super::weights::{Dims, ShardError, WeightFormat, Weights};
use brigade::models::{Gpt, GptConfig};
use brigade::tensor::rowwise::matmul_rows;
use brigade_comm::Comm;
use rayon::prelude::*;

/// The weights of a model (or one rank's share), arranged for inference.
pub struct Model {
    pub layers_n: usize,
    pub vocab: usize,
    pub context: usize,
    /// The tensor-parallel group (none on a single worker).
    comm: Option<Comm>,
    tp: usize,
    /// The pipeline this rank is a stage of (none without one).
    pipe: Option<Pipe>,
    /// The context-parallel group (none without one): block `b` of the cache is rank `b % N`'s,
    /// its slot `b / N` there.
    pub(super) cp: Option<Comm>,
    pub(super) w: Weights,
}

/// A pipeline-parallel rank: its group (rank r is stage r) and its stage.
struct Pipe {
    comm: Comm,
    stage: usize,
    stages: usize,
}

/// Message tags of the pipeline: a step's rows to the next stage, the logits to rank 0, a
/// step's work (and every other message of rank 0's) down the pipeline.
const TAG_ROWS: u32 = 1;
const TAG_LOGITS: u32 = 2;
const TAG_WORK: u32 = 3;

/// Work rank 0 does for each token beside its layers — scheduling, sampling, the HTTP side —
/// in FLOPs of the products it displaces: measured on gpt2-small served at 32 concurrent
/// streams over two MPI processes (rank 0 busy 94% against the last stage's 75% with 9 + 3
/// layers; 8 + 4 balanced them, 6% more tokens/s).
const HOST_FLOPS_PER_TOKEN: f64 = 1.5e7;

/// The layers stage `s` of `stages` holds among `cfg`'s layers: contiguous runs balanced by
/// inference FLOPs per token (training's partitioner, `partition`), each layer's products and
/// attention over half the context, the first layer with the embedding's lookup and rank 0's
/// own work ([`HOST_FLOPS_PER_TOKEN`]), the last with the final norm and the head's product over
/// the vocabulary — every stage at least one layer. `stages` must not exceed the layers.
pub fn stage_layers(cfg: &GptConfig, stages: usize, s: usize) -> std::ops::Range<usize> {
    let (c, v) = (cfg.n_embd as f64, cfg.vocab_size as f64);
    let layer = 2.0 * cfg.block_matrices() as f64 + 2.0 * (cfg.block_size / 2) as f64 * cfg.q_width() as f64;
    let mut costs = vec![layer; cfg.n_layer];
    costs[0] += c + HOST_FLOPS_PER_TOKEN;
    costs[cfg.n_layer - 1] += 2.0 * v * c + 10.0 * c;
    let cuts = brigade::parallel::pipeline::partition::partition(&costs, stages)
        .expect("at most as many stages as layers (checked by the caller)");
    cuts[s].clone()
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
/// A message of block copies: `(src, dst, slots)` triples follow.
const COPY: u32 = u32::MAX - 1;

/// The logits of a step: one row of `vocab` per work item that asked for them, in order, in
/// one buffer.
pub struct Logits {
    data: Vec<f32>,
    vocab: usize,
}

impl Logits {
    /// Rows of `vocab` laid end to end in `data`.
    pub fn new(data: Vec<f32>, vocab: usize) -> Logits {
        assert!(vocab > 0 && data.len().is_multiple_of(vocab), "logits of whole rows of {vocab}");
        Logits { data, vocab }
    }

    /// Equal rows laid end to end (a test's made-up logits).
    pub fn from_rows(rows: &[Vec<f32>], vocab: usize) -> Logits {
        Logits::new(
            rows.iter()
                .flat_map(|r| {
                    assert_eq!(r.len(), vocab, "a row of the vocabulary's width");
                    r.iter().copied()
                })
                .collect(),
            vocab,
        )
    }

    pub fn rows(&self) -> std::slice::ChunksExact<'_, f32> {
        self.data.chunks_exact(self.vocab)
    }

    pub fn par_rows(&self) -> rayon::slice::ChunksExact<'_, f32> {
        use rayon::prelude::*;
        self.data.par_chunks_exact(self.vocab)
    }
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
    /// From a whole (not tensor-sliced) model and its parameters, on a single worker.
    pub fn new(gpt: &Gpt, params: &[f32]) -> Model {
        Model::shard(gpt, params, None).expect("a single worker takes any model")
    }

    /// This rank's share of the model for the tensor-parallel group `comm` (`None`: all of it).
    pub fn shard(gpt: &Gpt, params: &[f32], comm: Option<Comm>) -> Result<Model, ShardError> {
        Model::shard_as(gpt, params, comm, WeightFormat::F32)
    }

    /// `shard` with the products' weights held as `format` says (f32 or 8 bits).
    pub fn shard_as(gpt: &Gpt, params: &[f32], comm: Option<Comm>, format: WeightFormat) -> Result<Model, ShardError> {
        let cfg = gpt.cfg;
        let (rank, tp) = comm.as_ref().map_or((0, 1), |c| (c.rank(), c.size()));
        let w = Weights::shard(gpt, params, (rank, tp), &format)?;
        Ok(Model {
            layers_n: cfg.n_layer,
            vocab: cfg.vocab_size,
            context: cfg.block_size,
            comm: comm.filter(|c| c.size() > 1),
            tp,
            pipe: None,
            cp: None,
            w,
        })
    }

    /// This rank's stage of the pipeline `comm` (rank r is stage r): its run of the layers
    /// (`stage_layers`), their KV cache, the embedding on the first stage and the head on the
    /// last. Refuses more stages than layers.
    pub fn stage_as(gpt: &Gpt, params: &[f32], comm: Comm, format: WeightFormat) -> Result<Model, ShardError> {
        let cfg = gpt.cfg;
        let (stage, stages) = (comm.rank(), comm.size());
        if stages > cfg.n_layer {
            return Err(ShardError::Layout(format!(
                "--pp {stages} splits the model's {} layers into more stages than there are layers; use --pp at most {}",
                cfg.n_layer, cfg.n_layer
            )));
        }
        let layers = stage_layers(&cfg, stages, stage);
        let mut w = Weights::shard(gpt, params, (0, 1), &format)?;
        w.keep_stage(layers.clone(), (stage == 0, stage + 1 == stages));
        Ok(Model {
            layers_n: layers.len(),
            vocab: cfg.vocab_size,
            context: cfg.block_size,
            comm: None,
            tp: 1,
            pipe: (stages > 1).then_some(Pipe { comm, stage, stages }),
            cp: None,
            w,
        })
    }

    /// A rank of the context-parallel group `comm`: the whole model, its cache holding the
    /// blocks `b` with `b % N` = its rank.
    pub fn context_as(gpt: &Gpt, params: &[f32], comm: Comm, format: WeightFormat) -> Result<Model, ShardError> {
        let mut m = Model::shard_as(gpt, params, None, format)?;
        m.cp = (comm.size() > 1).then_some(comm);
        Ok(m)
    }

    /// The group rank 0 sends each step's work to: the tensor-parallel group, the pipeline or
    /// the context-parallel group.
    fn group(&self) -> Option<&Comm> {
        self.comm.as_ref().or(self.pipe.as_ref().map(|p| &p.comm)).or(self.cp.as_ref())
    }

    /// The ranks the cache's blocks are striped over (1 without context parallelism).
    pub fn kv_shards(&self) -> usize {
        self.cp.as_ref().map_or(1, Comm::size)
    }

    /// Whether block `b` is this rank's, and its slot in this rank's cache.
    fn holds(&self, b: usize) -> Option<usize> {
        match &self.cp {
            None => Some(b),
            Some(c) => (b % c.size() == c.rank()).then_some(b / c.size()),
        }
    }

    /// The pipeline's stages (1 without one).
    pub fn stages(&self) -> usize {
        self.pipe.as_ref().map_or(1, |p| p.stages)
    }

    /// Bytes of this rank's products' weights (read once a step), and of all its weights.
    pub fn weight_bytes(&self) -> (usize, usize) {
        self.w.bytes()
    }

    /// Floats of one token's keys (= its values) per layer in this rank's KV cache.
    pub fn kv_width(&self) -> usize {
        self.w.dims.kv_width()
    }

    /// Runs one step: writes every scheduled token's keys and values into `kv` and returns
    /// the logits `[vocab]` of the last token of each work item that asks for them, in order.
    /// On rank 0 of a tensor-parallel group, first sends the work to the other ranks.
    pub fn step(&self, kv: &mut KvStore, work: &[Work]) -> Vec<Vec<f32>> {
        self.step_logits(kv, work).rows().map(<[f32]>::to_vec).collect()
    }

    /// [`Model::step`], the logits as one buffer (what the engine samples from: no row copied).
    pub fn step_logits(&self, kv: &mut KvStore, work: &[Work]) -> Logits {
        if self.pipe.is_some() {
            self.launch(kv, work);
            return self.collect(work.iter().filter(|w| w.logits).count());
        }
        self.send_work(work);
        self.forward(kv, work)
    }

    /// On rank 0 of a pipeline: starts a step — its work sent down the pipeline, the first
    /// stage's layers run, its rows sent on — without waiting for its logits, which
    /// [`Model::collect`] takes (steps come back in the order they were launched).
    pub fn launch(&self, kv: &mut KvStore, work: &[Work]) {
        assert!(self.pipe.as_ref().is_some_and(|p| p.stage == 0), "launch on the first stage of a pipeline");
        self.send_work(work);
        self.forward(kv, work);
    }

    /// On rank 0 of a pipeline: the logits (`rows` of them) of the oldest step launched, from
    /// the last stage.
    pub fn collect(&self, rows: usize) -> Logits {
        let p = self.pipe.as_ref().expect("collect on a pipeline");
        let mut logits = vec![0f32; rows * self.vocab];
        p.comm.recv(&mut logits, p.stages - 1, TAG_LOGITS).expect("the pipeline is alive");
        Logits::new(logits, self.vocab)
    }

    /// Sends a step's work to the other ranks (nothing without a group).
    fn send_work(&self, work: &[Work]) {
        if self.group().is_none() {
            return;
        }
        let mut msg = vec![work.len() as u32];
        for w in work {
            msg.extend([w.tokens.len() as u32, w.start as u32, w.blocks.len() as u32, w.logits as u32]);
            msg.extend_from_slice(w.tokens);
            msg.extend(w.blocks.iter().map(|&b| b as u32));
        }
        self.send(&msg);
    }

    /// Copies the first `slots` slots of block `src` into block `dst` for each `(src, dst,
    /// slots)`: a branch taking its sibling's partial block. Every rank copies its own heads.
    pub fn copy_rows(&self, kv: &mut KvStore, copies: &[(usize, usize, usize)]) {
        if copies.is_empty() {
            return;
        }
        if self.group().is_some() {
            let mut msg = vec![COPY];
            msg.extend(copies.iter().flat_map(|&(s, d, n)| [s as u32, d as u32, n as u32]));
            self.send(&msg);
        }
        for &(s, d, n) in copies {
            self.copy_held(kv, s, d, n);
        }
    }

    /// A copy of `n` slots from block `s` to `d` (of one rank: a sequence's same place) on the
    /// rank that holds them.
    fn copy_held(&self, kv: &mut KvStore, s: usize, d: usize, n: usize) {
        if let (Some(s), Some(d)) = (self.holds(s), self.holds(d)) {
            kv.copy_slots(s, d, n);
        }
    }

    /// On a rank other than 0: takes the next step's work from rank 0 and runs it; false once
    /// rank 0 has stopped.
    pub fn follow(&self, kv: &mut KvStore) -> bool {
        let msg = self.receive();
        if msg[0] == STOP {
            return false;
        }
        if msg[0] == COPY {
            for c in msg[1..].chunks_exact(3) {
                self.copy_held(kv, c[0] as usize, c[1] as usize, c[2] as usize);
            }
            return true;
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
        if self.group().is_some() {
            self.send(&[STOP]);
        }
    }

    /// Sends a message of u32s from rank 0 (its length first), bit for bit in f32s: broadcast
    /// to a tensor-parallel group, or to the second stage of a pipeline, which passes it on.
    fn send(&self, msg: &[u32]) {
        let mut len = [f32::from_bits(msg.len() as u32)];
        let mut buf: Vec<f32> = msg.iter().map(|&v| f32::from_bits(v)).collect();
        if let Some(p) = &self.pipe {
            p.comm.send(&len, 1, TAG_WORK).expect("the pipeline is alive");
            p.comm.send(&buf, 1, TAG_WORK).expect("the pipeline is alive");
            return;
        }
        let comm = self.group().expect("a group");
        comm.broadcast(&mut len, 0).expect("the tensor-parallel group is alive");
        comm.broadcast(&mut buf, 0).expect("the tensor-parallel group is alive");
    }

    /// Rank 0's next message; in a pipeline, from the stage before, passed on to the next one
    /// before this stage acts on it.
    fn receive(&self) -> Vec<u32> {
        let mut len = [0f32];
        if let Some(p) = &self.pipe {
            p.comm.recv(&mut len, p.stage - 1, TAG_WORK).expect("the pipeline is alive");
            let mut buf = vec![0f32; len[0].to_bits() as usize];
            p.comm.recv(&mut buf, p.stage - 1, TAG_WORK).expect("the pipeline is alive");
            if p.stage + 1 < p.stages {
                p.comm.send(&len, p.stage + 1, TAG_WORK).expect("the pipeline is alive");
                p.comm.send(&buf, p.stage + 1, TAG_WORK).expect("the pipeline is alive");
            }
            return buf.iter().map(|v| v.to_bits()).collect();
        }
        let comm = self.group().expect("a follower has a group");
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

    fn forward(&self, kv: &mut KvStore, work: &[Work]) -> Logits {
        let Dims { c, hd: _, q_all, mlp, mlp_local: ml, swiglu, .. } = self.w.dims;
        let cl = c / self.tp;
        let (qw, kvw) = (self.w.dims.q_width(), self.w.dims.kv_width());
        let qkvw = qw + 2 * kvw;
        // (work item, position) of every packed row; under context parallelism, of the rows
        // whose block this rank holds
        let all: Vec<(usize, usize)> =
            work.iter().enumerate().flat_map(|(i, w)| (0..w.tokens.len()).map(move |p| (i, w.start + p))).collect();
        let bs = kv.block_size;
        let held: Option<Vec<(usize, usize)>> = self.cp.as_ref().map(|_| {
            all.iter().copied().filter(|&(wi, pos)| self.holds(work[wi].blocks[pos / bs]).is_some()).collect()
        });
        let rows: &[(usize, usize)] = held.as_deref().unwrap_or(&all);
        let n = rows.len();
        let tables: Vec<&[usize]> = work.iter().map(|w| w.blocks).collect();
        let mut x = vec![0f32; n * c];
        let stage = self.pipe.as_ref().map(|p| (p.stage, p.stages));
        if let Some((s, _)) = stage.filter(|&(s, _)| s > 0) {
            // a later stage: the rows as the stage before left them
            let p = self.pipe.as_ref().expect("a stage");
            p.comm.recv(&mut x, s - 1, TAG_ROWS).expect("the pipeline is alive");
        }
        for ((wi, pos), xr) in rows.iter().zip(x.chunks_exact_mut(c)).filter(|_| stage.is_none_or(|(s, _)| s == 0)) {
            let tok = work[*wi].tokens[pos - work[*wi].start] as usize;
            let e = &self.w.embed[tok * c..(tok + 1) * c];
            match &self.w.wpe {
                Some(wpe) => {
                    for ((o, &a), &b) in xr.iter_mut().zip(e).zip(&wpe[pos * c..(pos + 1) * c]) {
                        *o = a + b;
                    }
                }
                None => xr.copy_from_slice(e),
            }
        }
        let mut h = vec![0f32; n * c];
        let mut qkv = vec![0f32; n * qkvw];
        let mut ctx = vec![0f32; n * qw];
        let mut y = vec![0f32; n * cl];
        let mut f = vec![0f32; n * if swiglu { 2 * ml } else { ml }];
        let mut act = vec![0f32; if swiglu { n * ml } else { 0 }];
        // the gathered (whole-width) inputs and outputs under tensor parallelism
        let (mut ctx_all, mut y_all, mut f_all) = (Vec::new(), Vec::new(), Vec::new());
        for (li, ly) in self.w.layers.iter().enumerate() {
            norm_rows(&mut h, &x, &ly.norm1, c);
            matmul_rows(&mut qkv, &h, &ly.wqkv, n);
            if let Some(b) = &ly.bqkv {
                add_bias(&mut qkv, b);
            }
            if let Some([qn, kn]) = &ly.qk_norm {
                // each query and key head (or all of them, OLMoE) normalised before rotation
                qkv.par_chunks_mut(qkvw).for_each(|r| {
                    let (q, k) = r[..qw + kvw].split_at_mut(qw);
                    for (heads, n) in [(q, qn), (k, kn)] {
                        for h in heads.chunks_exact_mut(n.width()) {
                            let x = h.to_vec();
                            n.row(h, &x);
                        }
                    }
                });
            }
            if let Some(rope) = &self.w.rope {
                // queries and keys at their positions; values as they are
                qkv.par_chunks_mut(qkvw)
                    .zip(rows.par_iter())
                    .for_each(|(r, &(_, pos))| brigade::tensor::rope::rope_heads(&mut r[..qw + kvw], rope, pos, 1.0));
            }
            for (r, &(wi, pos)) in rows.iter().enumerate() {
                let w = &work[wi];
                let b = self.holds(w.blocks[pos / bs]).expect("a row of a block this rank holds");
                let slot = pos % bs;
                let at = r * qkvw + qw;
                kv.write(b, li, 0, slot, &qkv[at..at + kvw]);
                kv.write(b, li, 1, slot, &qkv[at + kvw..at + 2 * kvw]);
            }
            match &self.cp {
                None => super::paged_attention::attention(&mut ctx, &qkv, rows, &tables, kv, li, self.w.dims),
                Some(cp) => {
                    super::context_attention::attention(cp, &mut ctx, &qkv, (rows, &all), &tables, kv, li, self.w.dims)
                }
            }
            let ctx = self.gather_cols(&ctx, n, qw, q_all, &mut ctx_all);
            matmul_rows(&mut y, ctx, &ly.wproj, n);
            residual(&mut x, self.gather_cols(&y, n, cl, c, &mut y_all), ly.bproj.as_deref(), c);
            norm_rows(&mut h, &x, &ly.norm2, c);
            if let Some(moe) = &ly.moe {
                let gather = |l: &[f32], n: usize, w: usize, full: usize| {
                    let mut out = Vec::new();
                    self.gather_cols(l, n, w, full, &mut out).to_vec()
                };
                let y = super::experts::mixture(moe, &h, (n, c, cl), &gather);
                residual(&mut x, self.gather_cols(&y, n, cl, c, &mut y_all), None, c);
                continue;
            }
            matmul_rows(&mut f, &h, &ly.wfc, n);
            if let Some(b) = &ly.bfc {
                add_bias(&mut f, b);
            }
            let hidden: &[f32] = if swiglu {
                act.par_chunks_mut(ml).zip(f.par_chunks(2 * ml)).for_each(|(o, gu)| {
                    let (g, u) = gu.split_at(ml);
                    for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
                        *o = brigade::tensor::elementwise::silu(g) * u;
                    }
                });
                &act
            } else {
                f.par_chunks_mut(ml).for_each(|r| {
                    for v in r.iter_mut() {
                        *v = brigade::tensor::elementwise::gelu_tanh(*v);
                    }
                });
                &f
            };
            matmul_rows(&mut y, self.gather_cols(hidden, n, ml, mlp, &mut f_all), &ly.wout, n);
            residual(&mut x, self.gather_cols(&y, n, cl, c, &mut y_all), ly.bout.as_deref(), c);
        }
        let logit_rows = work.iter().filter(|w| w.logits).count();
        if let Some((s, stages)) = stage {
            let p = self.pipe.as_ref().expect("a stage");
            if s + 1 < stages {
                // rank 0 (the first stage) takes the logits from the last in `collect`
                p.comm.send(&x, s + 1, TAG_ROWS).expect("the pipeline is alive");
                return Logits::new(Vec::new(), self.vocab);
            }
        }
        // the last row of each work item that wants logits (among this rank's rows)
        let is_last =
            |&(wi, pos): &(usize, usize)| work[wi].logits && pos + 1 == work[wi].start + work[wi].tokens.len();
        let mut last = Vec::new();
        for (r, _) in rows.iter().enumerate().filter(|(_, row)| is_last(row)) {
            last.extend_from_slice(&x[r * c..(r + 1) * c]);
        }
        let m = last.len() / c;
        let mut hl = vec![0f32; m * c];
        norm_rows(&mut hl, &last, &self.w.norm_f, c);
        let vl = self.w.head.n;
        let mut logits_own = vec![0f32; m * vl];
        matmul_rows(&mut logits_own, &hl, &self.w.head, m);
        let mut gathered = Vec::new();
        let logits = self.gather_cols(&logits_own, m, vl, self.vocab, &mut gathered);
        if let Some(p) = self.pipe.as_ref() {
            // the last stage: the logits go to rank 0, which samples
            debug_assert_eq!(m, logit_rows);
            p.comm.send(logits, 0, TAG_LOGITS).expect("the pipeline is alive");
            return Logits::new(Vec::new(), self.vocab);
        }
        if let Some(cp) = &self.cp {
            // each row's logits from the rank that holds it, to rank 0 in the work's order
            let owner = |&(wi, pos): &(usize, usize)| work[wi].blocks[pos / bs] % cp.size();
            let lasts: Vec<usize> = all.iter().filter(|r| is_last(r)).map(owner).collect();
            if cp.rank() > 0 {
                if m > 0 {
                    cp.send(logits, 0, TAG_LOGITS).expect("the context-parallel group is alive");
                }
                return Logits::new(Vec::new(), self.vocab);
            }
            let mut from: Vec<Vec<f32>> = vec![Vec::new(); cp.size()];
            from[0] = logits.to_vec();
            for (r, f) in from.iter_mut().enumerate().skip(1) {
                let k = lasts.iter().filter(|&&o| o == r).count();
                if k > 0 {
                    *f = vec![0f32; k * self.vocab];
                    cp.recv(f, r, TAG_LOGITS).expect("the context-parallel group is alive");
                }
            }
            let mut next = vec![0usize; cp.size()];
            let mut rows = Vec::with_capacity(lasts.len() * self.vocab);
            for &o in &lasts {
                next[o] += 1;
                rows.extend_from_slice(&from[o][(next[o] - 1) * self.vocab..next[o] * self.vocab]);
            }
            return Logits::new(rows, self.vocab);
        }
        if self.comm.is_none() {
            // this rank's own buffer, handed over whole
            return Logits::new(logits_own, self.vocab);
        }
        Logits::new(logits.to_vec(), self.vocab)
    }
}

pub(super) fn add_bias(x: &mut [f32], b: &[f32]) {
    x.par_chunks_mut(b.len()).for_each(|r| r.iter_mut().zip(b).for_each(|(v, &bb)| *v += bb));
}

/// `x += y (+ b)`, rows of `c`.
fn residual(x: &mut [f32], y: &[f32], b: Option<&[f32]>, c: usize) {
    x.par_chunks_mut(c).zip(y.par_chunks(c)).for_each(|(x, y)| match b {
        Some(b) => {
            for ((x, &y), &bb) in x.iter_mut().zip(y).zip(b) {
                *x += y + bb;
            }
        }
        None => {
            for (x, &y) in x.iter_mut().zip(y) {
                *x += y;
            }
        }
    });
}

/// Each row of `x` normalised into `out`.
fn norm_rows(out: &mut [f32], x: &[f32], norm: &super::weights::Norm, c: usize) {
    out.par_chunks_mut(c).zip(x.par_chunks(c)).for_each(|(o, x)| norm.row(o, x));
}
