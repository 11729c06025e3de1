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

/// A constraint on a sequence's tokens (structured outputs): which tokens may come next.
pub trait Constrain: Send {
    /// Sets every token the constraint forbids next to −∞; false when it allows none.
    fn mask(&mut self, row: &mut [f32]) -> bool;
    /// Takes the token emitted; true when the output is complete (nothing may follow).
    fn commit(&mut self, token: u32) -> bool;
    /// Whether the output so far is complete.
    fn satisfied(&mut self) -> bool;
}

/// How a request shares work with another, has its tokens given, or is constrained: what a
/// program's branches, a select's scoring and structured outputs ask of the engine beyond a
/// plain request.
#[derive(Default)]
pub struct Admit {
    /// A sibling whose prompt shares this one's leading tokens (a fork's or a map's branch 0):
    /// this request waits until the sibling has computed the shared tokens, then takes their
    /// keys and values — whole blocks through the prefix cache, the partial last one copied —
    /// instead of computing them again. A sibling that is gone shares only what is cached.
    pub follows: Option<u64>,
    /// Tokens emitted in this order in place of sampled ones, each reported with its
    /// log-probability under the model (a select scoring its choices); the request ends after
    /// the last of them.
    pub forced: Vec<u32>,
    /// Only tokens this constraint allows are sampled; the request ends when its output is
    /// complete.
    pub constraint: Option<Box<dyn Constrain>>,
}

impl std::fmt::Debug for Admit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admit")
            .field("follows", &self.follows)
            .field("forced", &self.forced)
            .field("constrained", &self.constraint.is_some())
            .finish()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// `max_tokens` generated.
    Length,
    /// A stop token was emitted.
    Stop,
    /// The model's context is full.
    Context,
    /// The constraint's output is complete (its last token is part of the text).
    Done,
}

/// A token generated for a request in a step. Two are equal when they carry the same token,
/// scores and finish, however much of the prompt came from the cache (`prompt_computed`).
#[derive(Clone, Debug)]
pub struct Output {
    pub id: u64,
    pub token: u32,
    /// Natural log of the token's probability under the model (before temperature).
    pub logprob: f32,
    /// The `top_logprobs` most likely tokens and their log-probabilities, best first.
    pub top: Vec<(u32, f32)>,
    pub finished: Option<Finish>,
    /// Prompt tokens the engine computed for this request so far (the rest came from the cache
    /// or a sibling).
    pub prompt_computed: usize,
    /// A constrained request that ended (by length or context) before its output was complete.
    pub unmet: bool,
}

impl PartialEq for Output {
    fn eq(&self, o: &Output) -> bool {
        (self.id, self.token, self.logprob, &self.top, self.finished) == (o.id, o.token, o.logprob, &o.top, o.finished)
    }
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
    follows: Option<u64>,
    forced: Vec<u32>,
    prompt_computed: usize,
    constraint: Option<Box<dyn Constrain>>,
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
    /// Prompt tokens whose keys and values were copied from a sibling's partial block.
    pub prompt_tokens_copied: u64,
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

enum Sibling {
    None,
    Pending,
    Ready(usize),
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Step times measured on the engine's own model and threads.
#[derive(Clone, Debug, PartialEq)]
pub struct StepProfile {
    /// `(b, seconds)`: a decode step of b sequences, b = 1, 2, 4, … up to the running limit.
    pub decode: Vec<(usize, f64)>,
    /// Seconds per token of a 64-token prompt chunk.
    pub prefill_per_token: f64,
}

impl StepProfile {
    /// The widest measured batch whose decode step costs at most 1.5× one sequence's: up to
    /// there the step is still bound by reading the weights.
    pub fn knee(&self) -> usize {
        let one = self.decode_one();
        self.decode.iter().filter(|d| d.1 <= 1.5 * one).map(|d| d.0).max().unwrap_or(1)
    }

    /// A decode step's seconds for a batch of 1.
    pub fn decode_one(&self) -> f64 {
        self.decode.first().map_or(0.0, |d| d.1)
    }

    /// A decode step's seconds at batch `b`: the measured points joined by straight lines,
    /// the last two's line past them.
    pub fn step_at(&self, b: f64) -> f64 {
        let d = &self.decode;
        match d.len() {
            0 => 0.0,
            1 => d[0].1 * b.max(1.0),
            _ => {
                let k = d.windows(2).position(|w| b <= w[1].0 as f64).unwrap_or(d.len() - 2);
                let ((b0, t0), (b1, t1)) = (d[k], d[k + 1]);
                t0 + (t1 - t0) * (b - b0 as f64) / (b1 - b0) as f64
            }
        }
        .max(0.0)
    }

    /// How many more sequences a program may add beside `busy` others, at most `max`: with
    /// nothing else running, as many as still raise the step's throughput (tokens a second,
    /// the measured batches); beside others, as many as keep their step — their inter-token
    /// latency — within 20% of what it is without them: the branches ride on a step that is
    /// still bound by reading the weights.
    pub fn width(&self, busy: usize, max: usize) -> usize {
        let max = max.max(1);
        if self.decode.len() < 2 {
            return max;
        }
        if busy == 0 {
            let best =
                self.decode.iter().max_by(|a, b| (a.0 as f64 / a.1).total_cmp(&(b.0 as f64 / b.1))).map_or(1, |d| d.0);
            return best.min(max);
        }
        let base = self.step_at(busy as f64);
        let mut w = 1;
        while w < max && self.step_at((busy + w + 1) as f64) <= 1.2 * base {
            w += 1;
        }
        w
    }
}

pub struct Engine {
    pub model: Model,
    pub kv: KvCache,
    pub limits: Limits,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    pub stats: Stats,
    profile: Option<StepProfile>,
}

impl Engine {
    pub fn new(model: Model, kv_blocks: usize, block_size: usize, limits: Limits) -> Engine {
        let kv = KvCache::new(kv_blocks, block_size, model.layers_n, model.kv_width());
        Engine {
            model,
            kv,
            limits,
            waiting: VecDeque::new(),
            running: Vec::new(),
            stats: Stats::default(),
            profile: None,
        }
    }

    /// Measures (once; later calls return the first measurement) a decode step of b
    /// sequences for b = 1, 2, 4, … up to the running limit and the free blocks, each the
    /// fastest of 3, and a 64-token prompt chunk — on scratch blocks taken from the free queue
    /// and given back. Running sequences wait for it (well under a second on gpt2-small).
    pub fn profile(&mut self) -> StepProfile {
        if let Some(p) = &self.profile {
            return p.clone();
        }
        let bs = self.kv.block_size;
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
        while b <= self.limits.max_running.max(1) {
            let blocks: Vec<usize> = (0..b).map_while(|_| self.kv.allocate()).collect();
            if blocks.len() < b {
                self.kv.release(&blocks);
                break;
            }
            let work: Vec<_> = blocks.iter().map(|&k| (vec![0u32], bs - 1, vec![k])).collect();
            decode.push((b, time(self, &work)));
            self.kv.release(&blocks);
            b *= 2;
        }
        let n = 64.min(self.model.context - 1).min(self.limits.max_step_tokens);
        let blocks: Vec<usize> = (0..n.div_ceil(bs)).map_while(|_| self.kv.allocate()).collect();
        let prefill_per_token =
            if blocks.len() * bs >= n { time(self, &[(vec![0u32; n], 0, blocks.clone())]) / n as f64 } else { 0.0 };
        self.kv.release(&blocks);
        let p = StepProfile { decode, prefill_per_token };
        self.profile = Some(p.clone());
        p
    }

    /// Queues a request; refused (with the reason) if it can never run.
    pub fn add(&mut self, r: Request) -> Result<(), String> {
        self.add_with(r, Admit::default())
    }

    /// Queues a request that shares a sibling's prompt or has its tokens given (see [`Admit`]).
    pub fn add_with(&mut self, r: Request, admit: Admit) -> Result<(), String> {
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
        if let Some(&t) = admit.forced.iter().find(|&&t| t as usize >= self.model.vocab) {
            return Err(format!("forced token {t} is outside the vocabulary (0..{})", self.model.vocab));
        }
        let rng = ChaCha8Rng::seed_from_u64(r.sampling.seed);
        self.waiting.push_back(Seq {
            id: r.id,
            prompt_computed: 0,
            follows: admit.follows,
            forced: admit.forced,
            constraint: admit.constraint,
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

    /// Where a waiting sequence's sibling stands: still to compute their shared prompt (the
    /// sequence waits), running with it computed (index in `running`), or gone (no sibling).
    fn sibling(&self, s: &Seq) -> Sibling {
        let Some(f) = s.follows else { return Sibling::None };
        if self.waiting.iter().any(|x| x.id == f) {
            return Sibling::Pending;
        }
        let Some(d) = self.running.iter().position(|x| x.id == f) else { return Sibling::None };
        let shared = common_prefix(&self.running[d].tokens, &s.tokens).min(s.tokens.len() - 1);
        if self.running[d].computed < shared && self.running[d].generated == 0 {
            Sibling::Pending
        } else {
            Sibling::Ready(d)
        }
    }

    /// Gives `s` (its cached full blocks taken) the rest of the prompt it shares with running
    /// sequence `d`, up to its last token (which must run for its logits): whole blocks of
    /// `d`'s taken as they are, a partial one copied into a new block. False when the cache is
    /// out of blocks.
    fn copy_from(&mut self, d: usize, s: &mut Seq) -> bool {
        let bs = self.kv.block_size;
        let donor = &self.running[d];
        let shared = common_prefix(&donor.tokens, &s.tokens).min(s.tokens.len() - 1).min(donor.computed);
        let mut copies = Vec::new();
        while s.computed < shared {
            let at = s.computed / bs;
            let src = donor.blocks[at];
            let n = (shared - s.computed).min(bs);
            if n == bs {
                // a whole block (not yet in the prefix cache's reach): shared as it is
                self.kv.take(src);
                s.blocks.push(src);
            } else {
                let Some(dst) = self.kv.allocate() else { return false };
                copies.push((src, dst, n));
                s.blocks.push(dst);
                self.stats.prompt_tokens_copied += n as u64;
            }
            s.computed += n;
        }
        self.model.copy_rows(&mut self.kv, &copies);
        true
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
        // 3. new sequences while there is room, in order; a branch whose sibling has not yet
        // computed their shared prompt waits for it (the sequences behind it do not)
        let mut w = 0;
        while budget > 0 && self.running.len() < self.limits.max_running && w < self.waiting.len() {
            let donor = match self.sibling(&self.waiting[w]) {
                Sibling::Pending => {
                    w += 1;
                    continue;
                }
                Sibling::Ready(d) => Some(d),
                Sibling::None => None,
            };
            let mut s = self.waiting.remove(w).expect("an index in the queue");
            let (hit, parent) = self.kv.match_prefix_keyed(&s.tokens);
            s.computed = hit.len() * self.kv.block_size;
            s.published = hit.len();
            s.parent = parent;
            s.blocks = hit;
            if let Some(d) = donor {
                if !self.copy_from(d, &mut s) {
                    s.uncache(&mut self.kv);
                    self.waiting.insert(w, s);
                    break;
                }
            }
            let n = (s.tokens.len() - s.computed).min(budget);
            let upto = s.computed + n;
            if !Self::grow(&mut self.kv, &mut s, upto) {
                s.uncache(&mut self.kv);
                self.waiting.insert(w, s);
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
                s.prompt_computed += n;
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
            let masked = s.constraint.as_mut().map(|c| {
                let mut m = row.clone();
                let any = c.mask(&mut m);
                (m, any)
            });
            let tok = match (s.forced.get(s.generated), &masked) {
                (Some(&t), _) => t,
                (None, Some((m, true))) => pick(m, &opt, &mut s.rng),
                (None, _) => pick(&row, &opt, &mut s.rng),
            };
            // a constraint that allows nothing more (it cannot be met from here) ends it
            let dead = matches!(masked, Some((_, false)));
            let complete = !dead && s.constraint.as_mut().is_some_and(|c| c.commit(tok));
            let lse = log_sum_exp(&row);
            s.tokens.push(tok);
            s.generated += 1;
            self.stats.generated += 1;
            let fin = if s.sampling.stop_tokens.contains(&tok) {
                Some(Finish::Stop)
            } else if complete {
                Some(Finish::Done)
            } else if dead
                || s.generated >= s.sampling.max_tokens
                || (!s.forced.is_empty() && s.generated == s.forced.len())
            {
                Some(Finish::Length)
            } else if s.tokens.len() >= self.model.context {
                Some(Finish::Context)
            } else {
                None
            };
            let top =
                top_tokens(&row, s.sampling.top_logprobs).into_iter().map(|t| (t, row[t as usize] - lse)).collect();
            out.push(Output {
                id: s.id,
                token: tok,
                logprob: row[tok as usize] - lse,
                top,
                finished: fin,
                prompt_computed: s.prompt_computed,
                unmet: fin.is_some()
                    && fin != Some(Finish::Done)
                    && s.constraint.as_mut().is_some_and(|c| !c.satisfied()),
            });
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

#[cfg(test)]
mod tests {
    use super::StepProfile;

    /// The step times measured on this machine's gpt2-small (2 threads): flat to 4, then
    /// about 1.4 ms a sequence.
    fn measured() -> StepProfile {
        let decode = vec![(1, 0.0139), (2, 0.0174), (4, 0.0179), (8, 0.0252), (16, 0.0347), (32, 0.0573), (64, 0.0999)];
        StepProfile { decode, prefill_per_token: 0.001 }
    }

    #[test]
    fn the_step_between_and_past_the_measured_batches_is_a_straight_line() {
        let p = measured();
        assert!((p.step_at(16.0) - 0.0347).abs() < 1e-12);
        assert!((p.step_at(24.0) - (0.0347 + 0.0573) / 2.0).abs() < 1e-12);
        assert!((p.step_at(96.0) - (0.0999 + (0.0999 - 0.0573))).abs() < 1e-12);
        assert_eq!(p.knee(), 4);
    }

    #[test]
    fn auto_width_fills_an_idle_engine_and_spares_a_busy_one() {
        let p = measured();
        // alone: the batch of best throughput (64 here), capped by the running limit
        assert_eq!(p.width(0, 128), 64);
        assert_eq!(p.width(0, 16), 16);
        // beside 16 others: t(16 + w) ≤ 1.2 t(16) = 41.6 ms, 1.41 ms a sequence past 16 → 4
        assert_eq!(p.width(16, 128), 4);
        assert!(p.step_at(16.0 + 4.0) <= 1.2 * p.step_at(16.0));
        assert!(p.step_at(16.0 + 5.0) > 1.2 * p.step_at(16.0));
        // beside 2 others: the flat part of the curve (2 to 4, then 1.8 ms a sequence) is free:
        // t(5) = 19.7 ms ≤ 1.2 × 17.4, t(6) = 21.5 ms is not
        assert_eq!(p.width(2, 128), 3);
        // never above the limit, never below one
        assert_eq!(p.width(2, 2), 2);
        let steep = StepProfile { decode: vec![(1, 0.01), (2, 0.03)], prefill_per_token: 0.0 };
        assert_eq!(steep.width(1, 64), 1);
    }
}
