//! The engine: iteration-level (continuous) scheduling over the paged KV cache, as Orca and
//! vLLM do it. Each step runs one forward pass over every running sequence: decodes first (one
//! token each), then prompt chunks within the step's token budget, then new requests while
//! there is room. A new request joins at the next step; a finished one leaves at once. When
//! blocks run out, the newest running sequence is preempted — its blocks released, its tokens
//! kept — and later recomputed (its prefix likely still cached), never dropped.

use crate::kv::{BlockKey, KvCache};
use crate::model::{Model, Work};
use brigade::models::generate::{pick, SampleOptions};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::collections::VecDeque;

/// How a request is sampled and when it stops.
#[derive(Clone, Debug)]
pub struct Sampling {
    /// 0: greedy.
    pub temperature: f32,
    /// 0: all tokens.
    pub top_k: usize,
    /// 1: all tokens.
    pub top_p: f32,
    pub seed: u64,
    pub max_tokens: usize,
    /// Generation ends after emitting one of these.
    pub stop_tokens: Vec<u32>,
    /// How many of the most likely tokens to report with each generated one (0: none).
    pub top_logprobs: usize,
}

#[derive(Clone, Debug)]
pub struct Request {
    pub id: u64,
    pub prompt: Vec<u32>,
    pub sampling: Sampling,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// `max_tokens` generated.
    Length,
    /// A stop token was emitted.
    Stop,
    /// The model's context is full.
    Context,
}

/// A token generated for a request in a step.
#[derive(Clone, Debug, PartialEq)]
pub struct Output {
    pub id: u64,
    pub token: u32,
    /// Natural log of the token's probability under the model (before temperature).
    pub logprob: f32,
    /// The `top_logprobs` most likely tokens and their log-probabilities, best first.
    pub top: Vec<(u32, f32)>,
    pub finished: Option<Finish>,
}

struct Seq {
    id: u64,
    tokens: Vec<u32>,
    generated: usize,
    /// Tokens whose keys and values are in the cache.
    computed: usize,
    blocks: Vec<usize>,
    /// Leading blocks registered in the prefix cache, and the last one's key.
    published: usize,
    parent: Option<BlockKey>,
    sampling: Sampling,
    rng: ChaCha8Rng,
}

impl Seq {
    /// Gives back every block: nothing of the sequence is in the cache any more (its tokens
    /// and sampler state stay), as for a sequence that never ran.
    fn uncache(&mut self, kv: &mut KvCache) {
        kv.release(&self.blocks);
        self.blocks.clear();
        self.computed = 0;
        self.published = 0;
        self.parent = None;
    }
}

/// Prompt tokens a step may take beside its decodes, at the least.
pub const MIN_PREFILL: usize = 32;
/// Prompt tokens a step may take per decode in it.
pub const PREFILL_PER_DECODE: usize = 2;

/// Bounds on one step.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Sequences in the running batch.
    pub max_running: usize,
    /// Tokens in one forward pass (decodes and prompt chunks together).
    pub max_step_tokens: usize,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    pub steps: u64,
    pub preemptions: u64,
    pub prompt_tokens_computed: u64,
    pub generated: u64,
}

/// `ln Σ exp(x)` over a row of logits, in a fixed order (8 lanes, then the lanes in order)
/// with the vectorised `exp`: the log-probabilities are as batch-invariant as the logits.
fn log_sum_exp(x: &[f32]) -> f32 {
    let mx = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let mut acc = [0f32; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for t in 0..8 {
            acc[t] += brigade::tensor::math::exp(c[t] - mx);
        }
    }
    let tail: f32 = chunks.remainder().iter().map(|&v| brigade::tensor::math::exp(v - mx)).sum();
    mx + (acc.iter().sum::<f32>() + tail).ln()
}

/// The `n` largest entries' indices, largest first (ties: lower index first).
fn top_tokens(row: &[f32], n: usize) -> Vec<u32> {
    if n == 0 {
        return Vec::new();
    }
    let mut idx: Vec<u32> = (0..row.len() as u32).collect();
    let cmp = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
    let n = n.min(idx.len());
    if n < idx.len() {
        idx.select_nth_unstable_by(n - 1, cmp);
        idx.truncate(n);
    }
    idx.sort_by(cmp);
    idx
}

pub struct Engine {
    pub model: Model,
    pub kv: KvCache,
    pub limits: Limits,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    pub stats: Stats,
}

impl Engine {
    pub fn new(model: Model, kv_blocks: usize, block_size: usize, limits: Limits) -> Engine {
        let kv = KvCache::new(kv_blocks, block_size, model.layers_n, model.kv_width());
        Engine { model, kv, limits, waiting: VecDeque::new(), running: Vec::new(), stats: Stats::default() }
    }

    /// Queues a request; refused (with the reason) if it can never run.
    pub fn add(&mut self, r: Request) -> Result<(), String> {
        if r.prompt.is_empty() {
            return Err("the prompt is empty".into());
        }
        if r.prompt.len() >= self.model.context {
            return Err(format!(
                "the prompt has {} tokens; this model's context is {} (prompt and at least one generated token)",
                r.prompt.len(),
                self.model.context
            ));
        }
        if let Some(&t) = r.prompt.iter().find(|&&t| t as usize >= self.model.vocab) {
            return Err(format!("token {t} is outside the vocabulary (0..{})", self.model.vocab));
        }
        let need = r.prompt.len().div_ceil(self.kv.block_size) + 1;
        if need > self.kv.total_blocks() {
            return Err(format!("the prompt needs {need} KV blocks; the cache holds {}", self.kv.total_blocks()));
        }
        let rng = ChaCha8Rng::seed_from_u64(r.sampling.seed);
        self.waiting.push_back(Seq {
            id: r.id,
            tokens: r.prompt,
            generated: 0,
            computed: 0,
            blocks: Vec::new(),
            published: 0,
            parent: None,
            sampling: r.sampling,
            rng,
        });
        Ok(())
    }

    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Drops a request (its client went away): its blocks are free for the next step.
    pub fn abort(&mut self, id: u64) {
        if let Some(i) = self.running.iter().position(|s| s.id == id) {
            let s = self.running.remove(i);
            self.kv.release(&s.blocks);
        }
        self.waiting.retain(|s| s.id != id);
    }

    /// Gives sequence `s` blocks for tokens up to `upto`; false when the cache is out.
    fn grow(kv: &mut KvCache, s: &mut Seq, upto: usize) -> bool {
        while s.blocks.len() * kv.block_size < upto {
            match kv.allocate() {
                Some(b) => s.blocks.push(b),
                None => return false,
            }
        }
        true
    }

    /// Preempts the newest running sequence: its blocks go back, it waits first in line.
    fn preempt_newest(&mut self) {
        let mut s = self.running.pop().expect("a running sequence to preempt");
        s.uncache(&mut self.kv);
        self.waiting.push_front(s);
        self.stats.preemptions += 1;
    }

    /// One iteration: schedules, runs one forward pass, samples. Returns the tokens made.
    pub fn step(&mut self) -> Vec<Output> {
        let mut budget = self.limits.max_step_tokens;
        // 1. decodes, oldest first; preempt the newest when blocks run out. `plan[i]`: tokens
        // sequence `running[i]` runs in this step.
        let mut plan = vec![0usize; self.running.len()];
        let mut i = 0;
        while i < self.running.len() {
            let s = &mut self.running[i];
            if s.tokens.len() - s.computed == 1 && budget > 0 {
                let upto = s.computed + 1;
                if !Self::grow(&mut self.kv, s, upto) {
                    self.preempt_newest();
                    plan.truncate(self.running.len());
                    continue;
                }
                plan[i] = 1;
                budget -= 1;
            }
            i += 1;
        }
        // Stall-free batching (as Sarathi-Serve): while sequences decode, a step takes at most
        // PREFILL_PER_DECODE prompt tokens per decode (at least MIN_PREFILL), so a step with
        // prompt work costs at most a few decode-only ones and running sequences' inter-token
        // latency stays bounded; with nothing decoding, prompts get the whole budget.
        let decodes: usize = plan.iter().sum();
        if decodes > 0 {
            budget = budget.min((PREFILL_PER_DECODE * decodes).max(MIN_PREFILL));
        }
        // 2. prompt chunks of running sequences
        for (i, s) in self.running.iter_mut().enumerate() {
            let todo = s.tokens.len() - s.computed;
            if todo > 1 && budget > 0 {
                let n = todo.min(budget);
                let upto = s.computed + n;
                if Self::grow(&mut self.kv, s, upto) {
                    plan[i] = n;
                    budget -= n;
                }
            }
        }
        // 3. new sequences while there is room
        while budget > 0 && self.running.len() < self.limits.max_running {
            let Some(mut s) = self.waiting.pop_front() else { break };
            let (hit, parent) = self.kv.match_prefix_keyed(&s.tokens);
            s.computed = hit.len() * self.kv.block_size;
            s.published = hit.len();
            s.parent = parent;
            s.blocks = hit;
            let n = (s.tokens.len() - s.computed).min(budget);
            let upto = s.computed + n;
            if !Self::grow(&mut self.kv, &mut s, upto) {
                s.uncache(&mut self.kv);
                self.waiting.push_front(s);
                break;
            }
            budget -= n;
            self.running.push(s);
            plan.push(n);
        }
        if plan.iter().all(|&n| n == 0) {
            return Vec::new();
        }
        // 4. one forward pass over every scheduled token
        let work: Vec<Work> = self
            .running
            .iter()
            .zip(&plan)
            .filter(|(_, &n)| n > 0)
            .map(|(s, &n)| Work {
                tokens: &s.tokens[s.computed..s.computed + n],
                start: s.computed,
                blocks: &s.blocks,
                logits: s.computed + n == s.tokens.len(),
            })
            .collect();
        let logits = self.model.step(&mut self.kv, &work);
        self.stats.steps += 1;
        // 5. advance, publish full blocks, sample
        let mut out = Vec::new();
        let mut li = logits.into_iter();
        let mut finished = Vec::new();
        for (i, s) in self.running.iter_mut().enumerate() {
            let n = plan[i];
            if n == 0 {
                continue;
            }
            if s.generated == 0 {
                self.stats.prompt_tokens_computed += n as u64;
            }
            s.computed += n;
            let bs = self.kv.block_size;
            while (s.published + 1) * bs <= s.computed {
                let b = s.blocks[s.published];
                s.parent = Some(self.kv.publish(b, s.parent, &s.tokens[s.published * bs..(s.published + 1) * bs]));
                s.published += 1;
            }
            if s.computed < s.tokens.len() {
                continue;
            }
            let row = li.next().expect("logits for every finished chunk");
            let opt = SampleOptions {
                max_new_tokens: 0,
                temperature: s.sampling.temperature,
                top_k: s.sampling.top_k,
                top_p: s.sampling.top_p,
                seed: 0,
                stop: None,
            };
            let tok = pick(&row, &opt, &mut s.rng);
            let lse = log_sum_exp(&row);
            s.tokens.push(tok);
            s.generated += 1;
            self.stats.generated += 1;
            let fin = if s.sampling.stop_tokens.contains(&tok) {
                Some(Finish::Stop)
            } else if s.generated >= s.sampling.max_tokens {
                Some(Finish::Length)
            } else if s.tokens.len() >= self.model.context {
                Some(Finish::Context)
            } else {
                None
            };
            let top =
                top_tokens(&row, s.sampling.top_logprobs).into_iter().map(|t| (t, row[t as usize] - lse)).collect();
            out.push(Output { id: s.id, token: tok, logprob: row[tok as usize] - lse, top, finished: fin });
            if fin.is_some() {
                finished.push(i);
            }
        }
        for &i in finished.iter().rev() {
            let s = self.running.remove(i);
            self.kv.release(&s.blocks);
        }
        out
    }
}
