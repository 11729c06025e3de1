//! The engine: one step is the scheduler's `schedule()` (a [`Batch`]: decodes, prompt chunks,
//! admissions, preemptions), one forward pass of the model over it, and `advance` (sampling,
//! stops, finishing). The engine owns the model and the floats of its KV cache (`KvStore`);
//! the scheduler owns the queue, the running batch and the blocks (`BlockPool`).

use super::batch::Batch;
use super::block_pool::BlockPool;
use super::profile::StepProfile;
use super::request::{Admit, Output, Refused, Request};
use super::scheduler::{Limits, Scheduler, Stats};
use crate::model::{KvStore, Model, Work};

pub struct Engine {
    pub model: Model,
    pub kv: KvStore,
    pub sched: Scheduler,
    profile: Option<StepProfile>,
}

impl Engine {
    pub fn new(model: Model, kv_blocks: usize, block_size: usize, limits: Limits) -> Engine {
        let kv = KvStore::new(kv_blocks, block_size, model.layers_n, model.kv_width());
        let sched = Scheduler::new(BlockPool::new(kv_blocks, block_size), limits, model.context, model.vocab);
        Engine { model, kv, sched, profile: None }
    }

    /// A fresh cache of `kv_blocks` blocks (of the same size) and new limits, for an engine
    /// with no work (a benchmark's next row).
    pub fn reset(&mut self, kv_blocks: usize, limits: Limits) {
        assert!(!self.has_work(), "reset with sequences in flight");
        let bs = self.kv.block_size;
        self.kv = KvStore::new(kv_blocks, bs, self.model.layers_n, self.model.kv_width());
        self.sched = Scheduler::new(BlockPool::new(kv_blocks, bs), limits, self.model.context, self.model.vocab);
    }

    /// The blocks: counts, the free queue, the prefix cache and its hits.
    pub fn pool(&self) -> &BlockPool {
        &self.sched.pool
    }

    pub fn stats(&self) -> Stats {
        self.sched.stats
    }

    /// Measures (once; later calls return the first measurement) a decode step of b
    /// sequences for b = 1, 2, 4, … up to the running limit and the free blocks, each the
    /// fastest of 3, and a 64-token prompt chunk — on scratch blocks taken from the free queue
    /// and given back. Running sequences wait for it (well under a second on gpt2-small).
    pub fn profile(&mut self) -> StepProfile {
        if let Some(p) = &self.profile {
            return p.clone();
        }
        let bs = self.sched.pool.block_size;
        let time = |engine: &mut Engine, work: &[(Vec<u32>, usize, Vec<usize>)]| {
            let w: Vec<Work> =
                work.iter().map(|(t, start, blocks)| Work { tokens: t, start: *start, blocks, logits: true }).collect();
            (0..3)
                .map(|_| {
                    let t0 = std::time::Instant::now();
                    engine.model.step(&mut engine.kv, &w);
                    t0.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min)
        };
        let mut decode = Vec::new();
        let mut b = 1;
        while b <= self.sched.limits.max_running.max(1) {
            let blocks: Vec<usize> = (0..b).map_while(|_| self.sched.pool.allocate()).collect();
            if blocks.len() < b {
                self.sched.pool.release(&blocks);
                break;
            }
            let work: Vec<_> = blocks.iter().map(|&k| (vec![0u32], bs - 1, vec![k])).collect();
            decode.push((b, time(self, &work)));
            self.sched.pool.release(&blocks);
            b *= 2;
        }
        let n = 64.min(self.model.context - 1).min(self.sched.limits.max_step_tokens);
        let blocks: Vec<usize> = (0..n.div_ceil(bs)).map_while(|_| self.sched.pool.allocate()).collect();
        let prefill_per_token =
            if blocks.len() * bs >= n { time(self, &[(vec![0u32; n], 0, blocks.clone())]) / n as f64 } else { 0.0 };
        self.sched.pool.release(&blocks);
        let p = StepProfile { decode, prefill_per_token };
        self.profile = Some(p.clone());
        p
    }

    /// Queues a request; refused (with the reason) if it can never run.
    pub fn add(&mut self, r: Request) -> Result<(), Refused> {
        self.add_with(r, Admit::default())
    }

    /// Queues a request that shares a sibling's prompt or has its tokens given (see [`Admit`]).
    pub fn add_with(&mut self, r: Request, admit: Admit) -> Result<(), Refused> {
        self.sched.add_with(r, admit)
    }

    pub fn has_work(&self) -> bool {
        self.sched.has_work()
    }

    pub fn waiting(&self) -> usize {
        self.sched.waiting()
    }

    pub fn running(&self) -> usize {
        self.sched.running()
    }

    /// Drops a request (its client went away): its blocks are free for the next step.
    pub fn abort(&mut self, id: u64) {
        self.sched.abort(id);
    }

    /// One iteration: schedules, runs one forward pass, samples. Returns the tokens made.
    pub fn step(&mut self) -> Vec<Output> {
        let batch = self.sched.schedule();
        if batch.is_empty() {
            return Vec::new();
        }
        let logits = self.forward(&batch);
        self.sched.advance(&batch, logits)
    }

    /// The step's forward pass: a branch's copies of its sibling's partial blocks first, then
    /// every scheduled token; the logits of each sequence that asked for them, in order.
    pub fn forward(&mut self, batch: &Batch) -> Vec<Vec<f32>> {
        self.model.copy_rows(&mut self.kv, &batch.copies);
        let work = self.sched.work(batch);
        let logits = self.model.step(&mut self.kv, &work);
        self.sched.stats.steps += 1;
        logits
    }
}
