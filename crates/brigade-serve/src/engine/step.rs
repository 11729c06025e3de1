//! The engine: one step is the scheduler's `schedule()` (a [`Batch`]: decodes, prompt chunks,
//! admissions, preemptions), one forward pass of the model over it, and `advance` (sampling,
//! stops, finishing). The engine owns the model and the floats of its KV cache (`KvStore`);
//! the scheduler owns the queue, the running batch and the blocks (`BlockPool`).
//!
//! A pipelined model (`--pp N`) runs N **lanes** (vLLM's virtual engines): each its own
//! scheduler over its own range of the KV cache's blocks, requests spread over them by load
//! (a program's branch joins its sibling's lane). A lane's step is launched into the pipeline
//! and the next lane's right after it, so every stage has a batch to work on; a lane's
//! sequences take their next step once its last one has left the last stage (its logits are
//! back). Every sequence's numbers are the single worker's (the forward pass is row-invariant),
//! whichever lane it ran in and whatever ran beside it.

use super::batch::Batch;
use super::block_pool::BlockPool;
use super::profile::StepProfile;
use super::request::{Admit, Output, Refused, Request};
use super::scheduler::{Limits, Scheduler, Stats};
use crate::model::{KvDtype, KvStore, Model, Work};
use std::collections::{HashMap, VecDeque};

pub struct Engine {
    pub model: Model,
    pub kv: KvStore,
    lanes: Vec<Lane>,
    /// Lanes whose step is in the pipeline, oldest first (their logits come back in this order).
    in_flight: VecDeque<usize>,
    /// The lane of each request it holds.
    lane_of: HashMap<u64, usize>,
    profile: Option<StepProfile>,
}

/// One lane: a scheduler over blocks `base..base + its pool's blocks` of the cache, its step in
/// the pipeline (with the number of logit rows it returns), and aborts that wait for that step
/// to come back.
struct Lane {
    sched: Scheduler,
    base: usize,
    in_flight: Option<(Batch, usize)>,
    aborts: Vec<u64>,
}

/// Blocks of the whole cache: all, in use, and prefix-cache hits so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockCounts {
    pub total: usize,
    pub used: usize,
    pub hits: u64,
}

impl Engine {
    /// An engine over `kv_blocks` blocks of `block_size` tokens (on each rank of a
    /// context-parallel group: the scheduler numbers them all). A pipelined model gets one lane
    /// per stage, each with an equal share of the blocks and of `limits.max_running` — fewer
    /// lanes if a share would not hold one sequence of the whole context.
    pub fn new(model: Model, kv_blocks: usize, block_size: usize, limits: Limits) -> Engine {
        Engine::with_cache(model, (kv_blocks, block_size, KvDtype::F32), limits)
    }

    /// `new` with a cache of `dtype` numbers (f32 or f16).
    pub fn with_cache(model: Model, (kv_blocks, block_size, dtype): (usize, usize, KvDtype), limits: Limits) -> Engine {
        let kv = KvStore::with_dtype(kv_blocks, block_size, model.layers_n, model.kv_width(), dtype);
        let per_seq = model.context.div_ceil(block_size);
        let n = (1..=model.stages()).rev().find(|&n| kv_blocks / n >= per_seq).unwrap_or(1);
        let mut engine =
            Engine { model, kv, lanes: Vec::new(), in_flight: VecDeque::new(), lane_of: HashMap::new(), profile: None };
        engine.make_lanes(n, kv_blocks, limits);
        engine
    }

    fn make_lanes(&mut self, n: usize, kv_blocks: usize, limits: Limits) {
        let bs = self.kv.block_size;
        let share = Limits { max_running: limits.max_running.div_ceil(n), ..limits };
        self.lanes = (0..n)
            .map(|v| Lane {
                sched: Scheduler::new(
                    BlockPool::striped(kv_blocks / n, self.model.kv_shards(), bs),
                    share,
                    self.model.context,
                    self.model.vocab,
                ),
                base: v * (kv_blocks / n),
                in_flight: None,
                aborts: Vec::new(),
            })
            .collect();
    }

    /// A fresh cache of `kv_blocks` blocks (of the same size) and new limits, for an engine
    /// with no work (a benchmark's next row).
    pub fn reset(&mut self, kv_blocks: usize, limits: Limits) {
        assert!(!self.has_work(), "reset with sequences in flight");
        let bs = self.kv.block_size;
        let n = self.lanes.len();
        self.kv = KvStore::with_dtype(kv_blocks, bs, self.model.layers_n, self.model.kv_width(), self.kv.dtype());
        self.make_lanes(n, kv_blocks, limits);
    }

    /// Lanes: 1, or the pipeline's stages (see [`Engine::new`]).
    pub fn lanes(&self) -> usize {
        self.lanes.len()
    }

    /// The first lane's blocks: counts, the free queue, the prefix cache and its hits (the
    /// whole cache but for a pipelined model; [`Engine::blocks`] counts every lane).
    pub fn pool(&self) -> &BlockPool {
        &self.lanes[0].sched.pool
    }

    /// Blocks of every lane together.
    pub fn blocks(&self) -> BlockCounts {
        let mut c = BlockCounts::default();
        for l in &self.lanes {
            c.total += l.sched.pool.total_blocks();
            c.used += l.sched.pool.used_blocks();
            c.hits += l.sched.pool.hits;
        }
        c
    }

    /// Every lane's counters, summed.
    pub fn stats(&self) -> Stats {
        let mut t = Stats::default();
        for s in self.lanes.iter().map(|l| l.sched.stats) {
            t.steps += s.steps;
            t.preemptions += s.preemptions;
            t.prompt_tokens_computed += s.prompt_tokens_computed;
            t.generated += s.generated;
            t.prompt_tokens_copied += s.prompt_tokens_copied;
        }
        t
    }

    /// Measures (once; later calls return the first measurement) a decode step of b
    /// sequences for b = 1, 2, 4, … up to the running limit and the free blocks, each the
    /// fastest of 3, and a 64-token prompt chunk — on scratch blocks taken from the first lane's
    /// free queue and given back, one step in the pipeline at a time. Running sequences wait for
    /// it (well under a second on gpt2-small); steps in flight must be collected first
    /// ([`Engine::drain`]).
    pub fn profile(&mut self) -> StepProfile {
        if let Some(p) = &self.profile {
            return p.clone();
        }
        assert!(self.in_flight.is_empty(), "profile with steps in the pipeline: drain first");
        let bs = self.kv.block_size;
        let time = |engine: &mut Engine, work: &[(Vec<u32>, usize, Vec<usize>)]| {
            let w: Vec<Work> =
                work.iter().map(|(t, start, blocks)| Work { tokens: t, start: *start, blocks, logits: true }).collect();
            (0..3)
                .map(|_| {
                    let t0 = std::time::Instant::now();
                    engine.model.step_logits(&mut engine.kv, &w);
                    t0.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min)
        };
        let mut decode = Vec::new();
        let mut b = 1;
        while b <= self.lanes[0].sched.limits.max_running.max(1) {
            let pool = &mut self.lanes[0].sched.pool;
            let blocks: Vec<usize> = (0..b).map_while(|_| pool.allocate()).collect();
            if blocks.len() < b {
                pool.release(&blocks);
                break;
            }
            let work: Vec<_> = blocks.iter().map(|&k| (vec![0u32], bs - 1, vec![k])).collect();
            decode.push((b, time(self, &work)));
            self.lanes[0].sched.pool.release(&blocks);
            b *= 2;
        }
        let n = 64.min(self.model.context - 1).min(self.lanes[0].sched.limits.max_step_tokens);
        let pool = &mut self.lanes[0].sched.pool;
        let blocks: Vec<usize> = (0..n.div_ceil(bs)).map_while(|_| pool.allocate()).collect();
        let prefill_per_token =
            if blocks.len() * bs >= n { time(self, &[(vec![0u32; n], 0, blocks.clone())]) / n as f64 } else { 0.0 };
        self.lanes[0].sched.pool.release(&blocks);
        let p = StepProfile { decode, prefill_per_token };
        self.profile = Some(p.clone());
        p
    }

    /// Queues a request; refused (with the reason) if it can never run.
    pub fn add(&mut self, r: Request) -> Result<(), Refused> {
        self.add_with(r, Admit::default())
    }

    /// Queues a request that shares a sibling's prompt or has its tokens given (see [`Admit`]):
    /// in its sibling's lane, or the least loaded one (the first of equals).
    pub fn add_with(&mut self, r: Request, admit: Admit) -> Result<(), Refused> {
        let id = r.id;
        let lane = admit.follows.and_then(|f| self.lane_of.get(&f).copied()).unwrap_or_else(|| {
            (0..self.lanes.len())
                .min_by_key(|&v| {
                    let s = &self.lanes[v].sched;
                    s.running() + s.waiting()
                })
                .expect("at least one lane")
        });
        self.lanes[lane].sched.add_with(r, admit)?;
        self.lane_of.insert(id, lane);
        Ok(())
    }

    pub fn has_work(&self) -> bool {
        !self.in_flight.is_empty() || self.lanes.iter().any(|l| l.sched.has_work())
    }

    pub fn waiting(&self) -> usize {
        self.lanes.iter().map(|l| l.sched.waiting()).sum()
    }

    pub fn running(&self) -> usize {
        self.lanes.iter().map(|l| l.sched.running()).sum()
    }

    /// Drops a request (its client went away): its blocks are free for its lane's next step
    /// (once the step in the pipeline, if any, is back).
    pub fn abort(&mut self, id: u64) {
        let Some(v) = self.lane_of.remove(&id) else { return };
        let lane = &mut self.lanes[v];
        if lane.in_flight.is_some() {
            lane.aborts.push(id);
        } else {
            lane.sched.abort(id);
        }
    }

    /// One iteration: schedules, runs one forward pass, samples. Returns the tokens made.
    /// Pipelined: launches a step for every lane that has none in the pipeline, then takes the
    /// oldest step's logits and samples its tokens.
    pub fn step(&mut self) -> Vec<Output> {
        if self.lanes.len() == 1 {
            let batch = self.lanes[0].sched.schedule();
            if batch.is_empty() {
                return Vec::new();
            }
            let logits = self.forward(&batch);
            let out = self.lanes[0].sched.advance(&batch, logits);
            return self.forget_finished(out);
        }
        for v in 0..self.lanes.len() {
            if self.lanes[v].in_flight.is_some() {
                continue;
            }
            let batch = self.lanes[v].sched.schedule();
            if batch.is_empty() {
                continue;
            }
            self.launch(v, &batch);
            let rows = batch.seqs.iter().filter(|s| s.logits).count();
            self.lanes[v].in_flight = Some((batch, rows));
            self.in_flight.push_back(v);
        }
        self.collect()
    }

    /// Takes every step in the pipeline back (their tokens), launching no new one.
    pub fn drain(&mut self) -> Vec<Output> {
        let mut out = Vec::new();
        while !self.in_flight.is_empty() {
            out.extend(self.collect());
        }
        out
    }

    /// The oldest step in the pipeline: its logits back, its tokens sampled, the aborts that
    /// waited for it made.
    fn collect(&mut self) -> Vec<Output> {
        let Some(v) = self.in_flight.pop_front() else { return Vec::new() };
        let (batch, rows) = self.lanes[v].in_flight.take().expect("a lane in flight has a step");
        let logits = self.model.collect(rows);
        let lane = &mut self.lanes[v];
        let out = lane.sched.advance(&batch, logits);
        for id in std::mem::take(&mut lane.aborts) {
            lane.sched.abort(id);
        }
        self.forget_finished(out)
    }

    fn forget_finished(&mut self, out: Vec<Output>) -> Vec<Output> {
        for o in out.iter().filter(|o| o.finished.is_some()) {
            self.lane_of.remove(&o.id);
        }
        out
    }

    /// The step's forward pass: a branch's copies of its sibling's partial blocks first, then
    /// every scheduled token; the logits of each sequence that asked for them, in order.
    pub fn forward(&mut self, batch: &Batch) -> crate::model::Logits {
        let sched = &mut self.lanes[0].sched;
        self.model.copy_rows(&mut self.kv, &batch.copies);
        let work = sched.work(batch);
        let logits = self.model.step_logits(&mut self.kv, &work);
        sched.stats.steps += 1;
        logits
    }

    /// Lane `v`'s step into the pipeline: its copies and work with the lane's blocks placed in
    /// the cache (`base` on), the first stage's layers run, its rows sent on.
    fn launch(&mut self, v: usize, batch: &Batch) {
        let lane = &mut self.lanes[v];
        let base = lane.base;
        let copies: Vec<_> = batch.copies.iter().map(|&(s, d, n)| (s + base, d + base, n)).collect();
        self.model.copy_rows(&mut self.kv, &copies);
        let work = lane.sched.work(batch);
        let tables: Vec<Vec<usize>> = work.iter().map(|w| w.blocks.iter().map(|b| b + base).collect()).collect();
        let placed: Vec<Work> = work
            .iter()
            .zip(&tables)
            .map(|(w, blocks)| Work { tokens: w.tokens, start: w.start, blocks, logits: w.logits })
            .collect();
        self.model.launch(&mut self.kv, &placed);
        lane.sched.stats.steps += 1;
    }
}
