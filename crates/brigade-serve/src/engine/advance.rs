//! After the forward pass: each scheduled sequence's computed tokens advance and its full
//! blocks go into the prefix cache; a sequence whose chunk reached its last token gets its
//! next token (forced, constrained or sampled), its log-probability, and its finish (a stop
//! token, its constraint complete, its length, the context); a finished one leaves the
//! running batch and gives its blocks back.

use super::batch::Batch;
use super::request::{Finish, Output, Sampling};
use super::scheduler::Scheduler;
use crate::model::Logits;
use brigade::models::generate::{candidates, pick, Candidates, SampleOptions};
use rayon::prelude::*;

/// What `pick` reads of a request's sampling.
fn sample_options(s: &Sampling) -> SampleOptions {
    SampleOptions {
        max_new_tokens: 0,
        temperature: s.temperature,
        top_k: s.top_k,
        top_p: s.top_p,
        seed: 0,
        stop: Vec::new(),
    }
}

/// `ln Σ exp(x)` over a row of logits, in a fixed order (8 lanes, then the lanes in order)
/// with the vectorised `exp`: the log-probabilities are as batch-invariant as the logits.
fn log_sum_exp(x: &[f32]) -> f32 {
    let mx = brigade::tensor::math::max_in_lanes(x);
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

impl Scheduler {
    /// Takes the step's `logits` (one row per sequence of `batch` that asked for them, in
    /// order) and returns the tokens made.
    pub fn advance(&mut self, batch: &Batch, logits: Logits) -> Vec<Output> {
        let mut out = Vec::new();
        // the sampling of each row's sequence (the chunks that asked for logits, in order),
        // where its draw can be prepared beside the others': sampled, with no penalty, no
        // constraint and nothing forced
        let prepared: Vec<Option<SampleOptions>> = batch
            .seqs
            .iter()
            .filter(|sc| sc.logits)
            .map(|sc| &self.running[sc.at])
            .map(|s| {
                let opt = sample_options(&s.sampling);
                let alone = s.sampling.repetition_penalty == 1.0 && s.constraint.is_none();
                (opt.temperature > 0.0 && alone && s.forced.get(s.generated).is_none()).then_some(opt)
            })
            .collect();
        assert_eq!(prepared.len(), logits.rows().len(), "a row of logits for every finished chunk");
        // each row's log-sum-exp, most likely token and sampling candidates side by side on the
        // engine's threads (a vocabulary's exponentials a row: 50257 for GPT-2, 32 rows a step
        // at 32 concurrent; the greedy picks, one after another, took 1.5 ms of a 62 ms
        // gpt2-small step). The draws stay in order below: each sequence's generator as before
        let found: Vec<(f32, u32, Option<Candidates>)> = logits
            .par_rows()
            .zip(prepared.par_iter())
            .map(|(r, o)| {
                (log_sum_exp(r), brigade::tensor::math::argmax(r) as u32, o.as_ref().map(|o| candidates(r, o)))
            })
            .collect();
        let mut li = logits.rows().zip(found);
        let mut finished = Vec::new();
        for sc in &batch.seqs {
            let (i, n) = (sc.at, sc.tokens);
            let s = &mut self.running[i];
            if s.generated == 0 {
                self.stats.prompt_tokens_computed += n as u64;
                s.prompt_computed += n;
            }
            s.computed += n;
            let bs = self.pool.block_size;
            while (s.published + 1) * bs <= s.computed {
                let b = s.blocks[s.published];
                s.parent = Some(self.pool.publish(b, s.parent, &s.tokens[s.published * bs..(s.published + 1) * bs]));
                s.published += 1;
            }
            if !sc.logits {
                continue;
            }
            let (row, (lse, greedy, ready)) = li.next().expect("logits for every finished chunk");
            let opt = sample_options(&s.sampling);
            let penalized = (s.sampling.repetition_penalty != 1.0)
                .then(|| penalize_repeats(row, &s.tokens, s.sampling.repetition_penalty));
            let scores: &[f32] = penalized.as_deref().unwrap_or(row);
            let masked = s.constraint.as_mut().map(|c| {
                let mut m = scores.to_vec();
                let any = c.mask(&mut m);
                (m, any)
            });
            let tok = match (s.forced.get(s.generated), &masked) {
                (Some(&t), _) => t,
                (None, Some((m, true))) => pick(m, &opt, &mut s.rng),
                // greedy on the row as it came: its argmax, found above (what `pick` returns)
                (None, None) if opt.temperature <= 0.0 && penalized.is_none() => greedy,
                // sampled from the row as it came: the candidates found above, drawn as `pick` draws
                (None, None) if ready.is_some() => ready.as_ref().expect("checked").draw(&mut s.rng),
                (None, _) => pick(scores, &opt, &mut s.rng),
            };
            // a constraint that allows nothing more (it cannot be met from here) ends it
            let dead = matches!(masked, Some((_, false)));
            let complete = !dead && s.constraint.as_mut().is_some_and(|c| c.commit(tok));
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
            } else if s.tokens.len() >= self.context {
                Some(Finish::Context)
            } else {
                None
            };
            let top =
                top_tokens(row, s.sampling.top_logprobs).into_iter().map(|t| (t, row[t as usize] - lse)).collect();
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
            self.pool.release(&s.blocks);
        }
        out
    }
}

/// `row` with every token of `seen` made less likely by `penalty` (once per distinct token):
/// a positive logit divided by it, a negative one multiplied (`transformers`'
/// `RepetitionPenaltyLogitsProcessor`, vLLM's `repetition_penalty`).
pub fn penalize_repeats(row: &[f32], seen: &[u32], penalty: f32) -> Vec<f32> {
    let mut out = row.to_vec();
    let mut ids = seen.to_vec();
    ids.sort_unstable();
    ids.dedup();
    for t in ids {
        if let Some(x) = out.get_mut(t as usize) {
            *x = if *x > 0.0 { *x / penalty } else { *x * penalty };
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::log_sum_exp;

    /// Against the sum written out in f64, and bit for bit against the same sum with its
    /// maximum taken by a fold in order (the lanes' maximum is the same float): rows of every
    /// length to 40 and a vocabulary's, with masked (−∞) entries among them.
    #[test]
    fn log_sum_exp_is_the_sum_written_out_and_its_maximum_the_fold_in_order() {
        let val = |i: usize| ((i * 2654435761 % 10007) as f32 / 500.0) - 10.0;
        for n in (1..=40).chain([50257]) {
            let row: Vec<f32> = (0..n).map(|i| if i % 7 == 3 { f32::NEG_INFINITY } else { val(i + n) }).collect();
            if row.iter().all(|v| v.is_infinite()) {
                continue;
            }
            let mx = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let want = mx as f64 + row.iter().map(|&v| (v as f64 - mx as f64).exp()).sum::<f64>().ln();
            let got = log_sum_exp(&row);
            assert!((got as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()), "n {n}: {got} vs {want}");
            // the same sum, its maximum folded in order
            let mut acc = [0f32; 8];
            let mut chunks = row.chunks_exact(8);
            for c in &mut chunks {
                for t in 0..8 {
                    acc[t] += brigade::tensor::math::exp(c[t] - mx);
                }
            }
            let tail: f32 = chunks.remainder().iter().map(|&v| brigade::tensor::math::exp(v - mx)).sum();
            let folded = mx + (acc.iter().sum::<f32>() + tail).ln();
            assert_eq!(got.to_bits(), folded.to_bits(), "n {n}");
        }
    }
}
