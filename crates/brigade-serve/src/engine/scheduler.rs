//! Iteration-level (continuous) scheduling over the paged KV cache's blocks, as Orca and vLLM
//! do it: each step, `schedule` decides what one forward pass runs — decodes first (one token
//! each), then prompt chunks within the step's token budget, then new requests while there is
//! room — and returns it as a [`Batch`]. A new request joins at the next step; a finished one
//! leaves at once (`advance`). When blocks run out, the newest running sequence is preempted —
//! its blocks released, its tokens kept — and later recomputed (its prefix likely still
//! cached), never dropped. Nothing here touches the model: the rules are tested on their own.

use super::batch::{Batch, Scheduled};
use super::block_pool::{BlockKey, BlockPool};
use super::request::{Admit, Constrain, Refused, Request, Sampling};
use crate::model::Work;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::collections::VecDeque;

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

pub(super) struct Seq {
    pub(super) id: u64,
    pub(super) tokens: Vec<u32>,
    pub(super) generated: usize,
    /// Tokens whose keys and values are in the cache.
    pub(super) computed: usize,
    pub(super) blocks: Vec<usize>,
    /// Leading blocks registered in the prefix cache, and the last one's key.
    pub(super) published: usize,
    pub(super) parent: Option<BlockKey>,
    pub(super) sampling: Sampling,
    pub(super) rng: ChaCha8Rng,
    pub(super) follows: Option<u64>,
    pub(super) forced: Vec<u32>,
    pub(super) prompt_computed: usize,
    pub(super) constraint: Option<Box<dyn Constrain>>,
}

impl Seq {
    /// Gives back every block: nothing of the sequence is in the cache any more (its tokens
    /// and sampler state stay), as for a sequence that never ran.
    fn uncache(&mut self, pool: &mut BlockPool) {
        pool.release(&self.blocks);
        self.blocks.clear();
        self.computed = 0;
        self.published = 0;
        self.parent = None;
    }
}

enum Sibling {
    None,
    Pending,
    Ready(usize),
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The queue, the running batch and the blocks they hold.
pub struct Scheduler {
    pub pool: BlockPool,
    pub limits: Limits,
    pub stats: Stats,
    /// The model's context and vocabulary, which requests are checked against.
    pub(super) context: usize,
    pub(super) vocab: usize,
    pub(super) waiting: VecDeque<Seq>,
    pub(super) running: Vec<Seq>,
}

impl Scheduler {
    pub fn new(pool: BlockPool, limits: Limits, context: usize, vocab: usize) -> Scheduler {
        Scheduler {
            pool,
            limits,
            stats: Stats::default(),
            context,
            vocab,
            waiting: VecDeque::new(),
            running: Vec::new(),
        }
    }

    /// Queues a request that shares a sibling's prompt or has its tokens given (see [`Admit`]);
    /// refused (with the reason) if it can never run.
    pub fn add_with(&mut self, r: Request, admit: Admit) -> Result<(), Refused> {
        if r.prompt.is_empty() {
            return Err(Refused::EmptyPrompt);
        }
        if r.prompt.len() >= self.context {
            return Err(Refused::PromptTooLong { len: r.prompt.len(), context: self.context });
        }
        if let Some(&t) = r.prompt.iter().find(|&&t| t as usize >= self.vocab) {
            return Err(Refused::OutsideVocabulary { token: t, vocab: self.vocab });
        }
        let need = r.prompt.len().div_ceil(self.pool.block_size) + 1;
        // striped over the ranks of a context-parallel group: the first rank takes the most
        let shards = self.pool.shards();
        if need.div_ceil(shards) > self.pool.total_blocks() / shards {
            return Err(Refused::CacheTooSmall { need, total: self.pool.total_blocks() });
        }
        if let Some(&t) = admit.forced.iter().find(|&&t| t as usize >= self.vocab) {
            return Err(Refused::ForcedOutsideVocabulary { token: t, vocab: self.vocab });
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
            self.pool.release(&s.blocks);
        }
        self.waiting.retain(|s| s.id != id);
    }

    /// Gives sequence `s` blocks for tokens up to `upto`; false when the cache is out.
    fn grow(pool: &mut BlockPool, s: &mut Seq, upto: usize) -> bool {
        while s.blocks.len() * pool.block_size < upto {
            match pool.allocate_at(s.blocks.len()) {
                Some(b) => s.blocks.push(b),
                None => return false,
            }
        }
        true
    }

    /// Preempts the newest running sequence: its blocks go back, it waits first in line.
    fn preempt_newest(&mut self, batch: &mut Batch) {
        let mut s = self.running.pop().expect("a running sequence to preempt");
        s.uncache(&mut self.pool);
        batch.preempted.push(s.id);
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
    /// `d`'s taken as they are, a partial one to be copied into a new block (the copies it
    /// returns, `(src, dst, slots)`). `None` when the cache is out of blocks.
    fn copy_from(&mut self, d: usize, s: &mut Seq) -> Option<Vec<(usize, usize, usize)>> {
        let bs = self.pool.block_size;
        let donor = &self.running[d];
        let shared = common_prefix(&donor.tokens, &s.tokens).min(s.tokens.len() - 1).min(donor.computed);
        let mut copies = Vec::new();
        while s.computed < shared {
            let at = s.computed / bs;
            let src = donor.blocks[at];
            let n = (shared - s.computed).min(bs);
            if n == bs {
                // a whole block (not yet in the prefix cache's reach): shared as it is
                self.pool.take(src);
                s.blocks.push(src);
            } else {
                let dst = self.pool.allocate_at(at)?;
                copies.push((src, dst, n));
                s.blocks.push(dst);
                self.stats.prompt_tokens_copied += n as u64;
            }
            s.computed += n;
        }
        Some(copies)
    }

    /// Decides the next step: decodes, prompt chunks and admissions within the limits,
    /// preempting the newest running sequences when blocks run out. Blocks are taken for
    /// everything scheduled; the sequences advance only in `advance`.
    pub fn schedule(&mut self) -> Batch {
        let mut batch = Batch::default();
        let mut budget = self.limits.max_step_tokens;
        // 1. decodes, oldest first; preempt the newest when blocks run out. `plan[i]`: tokens
        // sequence `running[i]` runs in this step.
        let mut plan = vec![0usize; self.running.len()];
        let mut i = 0;
        while i < self.running.len() {
            let s = &mut self.running[i];
            if s.tokens.len() - s.computed == 1 && budget > 0 {
                let upto = s.computed + 1;
                if !Self::grow(&mut self.pool, s, upto) {
                    self.preempt_newest(&mut batch);
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
                if Self::grow(&mut self.pool, s, upto) {
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
            let (hit, parent) = self.pool.match_prefix_keyed(&s.tokens);
            s.computed = hit.len() * self.pool.block_size;
            s.published = hit.len();
            s.parent = parent;
            s.blocks = hit;
            let copies = match donor {
                Some(d) => match self.copy_from(d, &mut s) {
                    Some(c) => c,
                    None => {
                        s.uncache(&mut self.pool);
                        self.waiting.insert(w, s);
                        break;
                    }
                },
                None => Vec::new(),
            };
            let n = (s.tokens.len() - s.computed).min(budget);
            let upto = s.computed + n;
            if !Self::grow(&mut self.pool, &mut s, upto) {
                s.uncache(&mut self.pool);
                self.waiting.insert(w, s);
                break;
            }
            budget -= n;
            batch.copies.extend(copies);
            batch.admitted.push(s.id);
            self.running.push(s);
            plan.push(n);
        }
        batch.seqs = (self.running.iter().zip(&plan).enumerate())
            .filter(|(_, (_, &n))| n > 0)
            .map(|(at, (s, &n))| Scheduled {
                at,
                id: s.id,
                start: s.computed,
                tokens: n,
                logits: s.computed + n == s.tokens.len(),
            })
            .collect();
        batch
    }

    /// The forward pass's work for `batch`: each scheduled sequence's tokens and block table.
    pub fn work(&self, batch: &Batch) -> Vec<Work<'_>> {
        batch
            .seqs
            .iter()
            .map(|sc| {
                let s = &self.running[sc.at];
                Work {
                    tokens: &s.tokens[sc.start..sc.start + sc.tokens],
                    start: sc.start,
                    blocks: &s.blocks,
                    logits: sc.logits,
                }
            })
            .collect()
    }
}

/// The scheduling rules on their own: a block pool and sequences, no model (each step's
/// logits are made up: token 1 is always the likeliest).
#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::request::Output;

    const VOCAB: usize = 1000;

    /// `blocks` blocks of 4 tokens, a context of 64.
    fn sched(blocks: usize, max_running: usize, max_step_tokens: usize) -> Scheduler {
        Scheduler::new(BlockPool::new(blocks, 4), Limits { max_running, max_step_tokens }, 64, VOCAB)
    }

    /// A prompt of its own (no two ids share a block).
    fn prompt(id: u64, len: usize) -> Vec<u32> {
        (0..len).map(|i| id as u32 * 100 + i as u32).collect()
    }

    fn add(s: &mut Scheduler, id: u64, len: usize, max_tokens: usize) {
        s.add_with(Request { id, prompt: prompt(id, len), sampling: Sampling::greedy(max_tokens) }, Admit::default())
            .unwrap();
    }

    /// One step as the engine runs it, the forward pass made up.
    fn step(s: &mut Scheduler) -> (Batch, Vec<Output>) {
        let b = s.schedule();
        let rows: Vec<Vec<f32>> = b
            .seqs
            .iter()
            .filter(|x| x.logits)
            .map(|_| {
                let mut r = vec![0f32; VOCAB];
                r[1] = 1.0;
                r
            })
            .collect();
        let out = s.advance(&b, crate::model::Logits::from_rows(&rows, VOCAB));
        s.pool.check();
        (b, out)
    }

    #[test]
    fn prompts_run_in_chunks_within_the_token_budget_and_decodes_go_first() {
        let mut s = sched(64, 8, 8);
        add(&mut s, 1, 3, 10);
        add(&mut s, 2, 20, 10);
        // the short prompt whole, the long one's first chunk with what is left of 8 tokens
        let (b, out) = step(&mut s);
        assert_eq!(b.plan(), [(1, 3), (2, 5)]);
        assert_eq!(b.admitted, [1, 2]);
        assert_eq!(b.seqs.iter().map(|x| x.logits).collect::<Vec<_>>(), [true, false], "logits end a prompt only");
        assert_eq!(out.iter().map(|o| o.id).collect::<Vec<_>>(), [1]);
        // then 1's decode first, the long prompt's chunks in what the budget leaves
        let (b, _) = step(&mut s);
        assert_eq!(b.plan(), [(1, 1), (2, 7)]);
        assert_eq!(b.seqs[1].start, 5);
        let (b, out) = step(&mut s);
        assert_eq!(b.plan(), [(1, 1), (2, 7)]);
        assert!(!b.seqs[1].logits && out.len() == 1);
        // its last prompt token runs as a decode does, and gets its logits
        let (b, out) = step(&mut s);
        assert_eq!(b.plan(), [(1, 1), (2, 1)]);
        assert!(b.seqs[1].logits);
        assert_eq!(out.iter().map(|o| o.id).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(s.stats.prompt_tokens_computed, 23);
        // a budget shorter than the decodes: the oldest decode, and no prompt chunk
        let mut s = sched(64, 8, 64);
        for id in 1..=3 {
            add(&mut s, id, 4, 10);
        }
        step(&mut s);
        add(&mut s, 4, 20, 10);
        s.limits.max_step_tokens = 2;
        let (b, _) = step(&mut s);
        assert_eq!(b.plan(), [(1, 1), (2, 1)], "decodes first, oldest first");
        assert!(b.admitted.is_empty());
    }

    #[test]
    fn beside_decodes_a_step_takes_a_bounded_share_of_prompt_tokens() {
        let mut s = sched(64, 8, 512);
        add(&mut s, 1, 3, 10);
        step(&mut s);
        add(&mut s, 2, 60, 2);
        // one decode: at most max(PREFILL_PER_DECODE · 1, MIN_PREFILL) prompt tokens
        let (b, _) = step(&mut s);
        assert_eq!(b.plan(), [(1, 1), (2, MIN_PREFILL.max(PREFILL_PER_DECODE))]);
        // with nothing decoding, a prompt takes the whole budget
        let mut s = sched(64, 8, 512);
        add(&mut s, 2, 60, 2);
        assert_eq!(step(&mut s).0.plan(), [(2, 60)]);
    }

    #[test]
    fn out_of_blocks_the_newest_is_preempted_and_waits_first_in_line() {
        // five blocks of 4: three 4-token prompts take one each; their first decodes need a
        // second each, and only two are left
        let mut s = sched(5, 8, 64);
        for id in 1..=3 {
            add(&mut s, id, 4, 3);
        }
        let (b, _) = step(&mut s);
        assert_eq!(b.plan(), [(1, 4), (2, 4), (3, 4)]);
        let (b, _) = step(&mut s);
        assert_eq!(b.preempted, [3], "the newest goes");
        assert_eq!(b.plan(), [(1, 1), (2, 1)], "the older ones decode");
        assert_eq!((s.stats.preemptions, s.running(), s.waiting()), (1, 2, 1));
        assert_eq!(s.pool.free_blocks(), 1, "its block is back (still cached)");
        // a later request queues behind it: the preempted sequence comes back first, its
        // prompt block from the cache, its generated token recomputed
        add(&mut s, 4, 4, 3);
        let mut readmitted = Vec::new();
        while s.has_work() {
            let (b, _) = step(&mut s);
            readmitted.extend(b.admitted);
        }
        assert_eq!(readmitted, [3, 4]);
        assert!(s.pool.hits > 0, "the preempted prompt came from the cache");
        assert_eq!(s.pool.free_blocks(), 5);
        // two short of blocks: the two newest go, newest first; the oldest keeps decoding
        let mut s = sched(3, 8, 64);
        for id in 1..=3 {
            add(&mut s, id, 4, 3);
        }
        step(&mut s);
        let (b, _) = step(&mut s);
        assert_eq!(b.preempted, [3, 2]);
        assert_eq!(b.plan(), [(1, 1)]);
        assert_eq!(s.waiting.iter().map(|x| x.id).collect::<Vec<_>>(), [2, 3], "the older of them first");
    }

    #[test]
    fn admissions_stop_at_the_running_limit_and_keep_their_order() {
        let mut s = sched(64, 2, 64);
        for id in 1..=3 {
            add(&mut s, id, 4, 2);
        }
        let (b, _) = step(&mut s);
        assert_eq!(b.admitted, [1, 2]);
        assert_eq!((s.running(), s.waiting()), (2, 1));
        // 1 and 2 finish at their second token; 3 takes a place freed
        let (b, out) = step(&mut s);
        assert!(out.iter().all(|o| o.finished.is_some()) && b.admitted.is_empty());
        let (b, _) = step(&mut s);
        assert_eq!(b.admitted, [3]);
    }

    #[test]
    fn a_branch_waits_for_its_sibling_then_takes_its_blocks_and_copies_the_partial_one() {
        let mut s = sched(64, 8, 8);
        let p = prompt(1, 10);
        s.add_with(Request { id: 1, prompt: p.clone(), sampling: Sampling::greedy(4) }, Admit::default()).unwrap();
        let follows = Admit { follows: Some(1), ..Default::default() };
        s.add_with(Request { id: 2, prompt: p, sampling: Sampling::greedy(4) }, follows).unwrap();
        // while the sibling computes the shared prompt, the branch waits
        let (b, _) = step(&mut s);
        assert_eq!((b.plan(), b.admitted.clone()), (vec![(1, 8)], vec![1]));
        let (b, _) = step(&mut s);
        assert_eq!(b.plan(), [(1, 2)]);
        // then takes its two full blocks through the prefix cache, copies the one slot of the
        // third it shares, and runs only its last prompt token
        let (b, _) = step(&mut s);
        let (donor, branch) = (&s.running[0].blocks, &s.running[1].blocks);
        assert_eq!(&branch[..2], &donor[..2]);
        assert_eq!(b.copies, [(donor[2], branch[2], 1)]);
        assert_eq!(b.plan(), [(1, 1), (2, 1)]);
        assert_eq!((s.stats.prompt_tokens_copied, s.pool.hits), (1, 2));
    }
}
