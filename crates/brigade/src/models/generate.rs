//! Autoregressive sampling: greedy (temperature 0) or temperature with optional top-k.

use super::{Activations, Gpt};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[derive(Clone, Debug)]
pub struct SampleOptions {
    pub max_new_tokens: usize,
    /// 0 picks the most likely token.
    pub temperature: f32,
    /// Keep only the k most likely tokens (0: all).
    pub top_k: usize,
    /// Nucleus sampling: keep the most likely tokens whose probabilities (after temperature
    /// and top-k) add up to at least `top_p` (1: all).
    pub top_p: f32,
    pub seed: u64,
    /// Stop after emitting any of these tokens.
    pub stop: Vec<u32>,
}

/// Picks the next token from one row of logits.
pub fn pick(logits: &[f32], opt: &SampleOptions, rng: &mut ChaCha8Rng) -> u32 {
    if opt.temperature <= 0.0 {
        return crate::tensor::math::argmax(logits) as u32;
    }
    candidates(logits, opt).draw(rng)
}

/// The tokens a sampled pick can return and their weights, in the order the draw walks them:
/// everything `pick` does before its one random number, so that a batch's rows can be prepared
/// side by side and drawn in order afterwards (the same tokens as `pick`).
#[derive(Clone, Debug)]
pub struct Candidates {
    idx: Vec<usize>,
    w: Vec<f64>,
}

/// The candidates of a sampled pick (`opt.temperature` > 0): the top-k (its ties kept), their
/// tempered weights, then the nucleus.
pub fn candidates(logits: &[f32], opt: &SampleOptions) -> Candidates {
    assert!(opt.temperature > 0.0, "candidates of a greedy pick");
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    if opt.top_k > 0 && opt.top_k < idx.len() {
        idx.select_nth_unstable_by(opt.top_k - 1, |&a, &b| logits[b].total_cmp(&logits[a]));
        // every token as likely as the k-th stays (transformers' TopKLogitsWarper and vLLM keep
        // ties): which of equal tokens survives is not the partition's to decide
        let kth = logits[idx[opt.top_k - 1]];
        idx.retain(|&i| logits[i].total_cmp(&kth) != std::cmp::Ordering::Less);
    }
    let mx = idx.iter().map(|&i| logits[i]).fold(f32::NEG_INFINITY, f32::max);
    let mut w: Vec<f64> = idx.iter().map(|&i| (((logits[i] - mx) / opt.temperature) as f64).exp()).collect();
    if opt.top_p < 1.0 {
        // most likely first (ties by token id, so the order is fixed), then the shortest
        // prefix whose mass reaches top_p
        let keep = nucleus(&idx, &w, opt.top_p as f64);
        idx = keep.iter().map(|&k| idx[k]).collect();
        w = keep.iter().map(|&k| w[k]).collect();
    }
    Candidates { idx, w }
}

/// Positions into `idx`/`w` of the shortest prefix, most likely first (ties by token id), whose
/// weights reach `top_p` of their total (at least one). Only as many as that prefix needs are
/// put in order: the first `m` of the order found by a selection and sorted, `m` from 64 and
/// grown (at least eightfold, and to twice what the mass found so far says is needed) until the
/// prefix ends inside it, or the whole sorted once `m` passes half of it. The order is total
/// (token ids are distinct), so those are exactly the whole sort's first `m`, summed in the
/// same order, and an unstable sort gives it too. A vocabulary's stable sort took ~4 ms a row.
fn nucleus(idx: &[usize], w: &[f64], top_p: f64) -> Vec<usize> {
    let cmp = |a: &usize, b: &usize| w[*b].total_cmp(&w[*a]).then(idx[*a].cmp(&idx[*b]));
    let total: f64 = w.iter().sum();
    let n = idx.len();
    let mut m = 64;
    loop {
        let mut order: Vec<usize> = (0..n).collect();
        let whole = 2 * m >= n;
        if !whole {
            order.select_nth_unstable_by(m - 1, cmp);
            order.truncate(m);
        }
        order.sort_unstable_by(cmp);
        let (mut acc, mut keep) = (0.0, 0);
        while keep < order.len() && (keep == 0 || acc < top_p * total) {
            acc += w[order[keep]];
            keep += 1;
        }
        // the prefix ended before the selection's last (or it holds everything): the same
        // prefix as the whole order's
        if whole || acc >= top_p * total {
            order.truncate(keep);
            return order;
        }
        let needed = if acc > 0.0 { (m as f64 * top_p * total / acc).min(n as f64) as usize } else { n };
        m = (8 * m).max(2 * needed);
    }
}

impl Candidates {
    /// One draw: a uniform number times the weights' total, walked down in order.
    pub fn draw(&self, rng: &mut ChaCha8Rng) -> u32 {
        let mut u = rng.gen::<f64>() * self.w.iter().sum::<f64>();
        for (k, &wi) in self.w.iter().enumerate() {
            if u < wi {
                return self.idx[k] as u32;
            }
            u -= wi;
        }
        self.idx[self.idx.len() - 1] as u32
    }
}

/// Continues each of the `prompts` (equal lengths) for up to `max_new_tokens`, in one batch.
/// The context is cropped to the model's block size.
pub fn generate(model: &Gpt, params: &[f32], prompts: &[Vec<u32>], opt: &SampleOptions) -> Vec<Vec<u32>> {
    generate_streaming(model, params, prompts, opt, &mut |_, _| {})
}

/// `generate`, telling `on_token(sequence, token)` of each token as it is picked.
pub fn generate_streaming(
    model: &Gpt,
    params: &[f32],
    prompts: &[Vec<u32>],
    opt: &SampleOptions,
    on_token: &mut dyn FnMut(usize, u32),
) -> Vec<Vec<u32>> {
    let mut rng = ChaCha8Rng::seed_from_u64(opt.seed);
    let mut seqs: Vec<Vec<u32>> = prompts.to_vec();
    let mut done = vec![false; seqs.len()];
    let mut acts = Activations::default();
    let v = model.cfg.vocab_size;
    for _ in 0..opt.max_new_tokens {
        let len = seqs[0].len();
        let t = len.min(model.cfg.block_size);
        let ctx: Vec<u32> = seqs.iter().flat_map(|s| s[len - t..].iter().copied()).collect();
        let logits = model.forward_last(params, &ctx, seqs.len(), t, &mut acts);
        for (i, s) in seqs.iter_mut().enumerate() {
            let tok = if done[i] {
                opt.stop.first().copied().unwrap_or(0)
            } else {
                pick(&logits[i * v..(i + 1) * v], opt, &mut rng)
            };
            done[i] |= opt.stop.contains(&tok);
            s.push(tok);
            on_token(i, tok);
        }
        if done.iter().all(|&d| d) {
            break;
        }
    }
    seqs.iter().zip(prompts).map(|(s, p)| s[p.len()..].to_vec()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(temperature: f32, top_k: usize) -> SampleOptions {
        SampleOptions { max_new_tokens: 1, temperature, top_k, top_p: 1.0, seed: 0, stop: Vec::new() }
    }

    /// Sampled frequencies against softmax(logits / temperature) over the k best, then over
    /// the smallest most-likely set holding `top_p` of that mass, written out in f64: each
    /// within 4.5 standard deviations of its expectation.
    fn check_frequencies(logits: &[f32], temperature: f32, top_k: usize) {
        check_nucleus(logits, temperature, top_k, 1.0)
    }

    fn check_nucleus(logits: &[f32], temperature: f32, top_k: usize, top_p: f32) {
        let n = 40_000;
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut seen = vec![0usize; logits.len()];
        let o = SampleOptions { top_p, ..opts(temperature, top_k) };
        for _ in 0..n {
            seen[pick(logits, &o, &mut rng) as usize] += 1;
        }
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        let mut kept = if top_k == 0 { logits.len() } else { top_k.min(logits.len()) };
        let e = |i: usize| (logits[i] as f64 / temperature as f64).exp();
        let zk: f64 = order[..kept].iter().map(|&i| e(i)).sum();
        let mut cum = 0.0;
        for (r, &i) in order[..kept].iter().enumerate() {
            cum += e(i) / zk;
            if cum >= top_p as f64 - 1e-12 {
                kept = r + 1;
                break;
            }
        }
        let z: f64 = order[..kept].iter().map(|&i| e(i)).sum();
        for (rank, &i) in order.iter().enumerate() {
            let p = if rank < kept { (logits[i] as f64 / temperature as f64).exp() / z } else { 0.0 };
            let (want, sd) = (n as f64 * p, (n as f64 * p * (1.0 - p)).sqrt());
            assert!(
                (seen[i] as f64 - want).abs() <= 4.5 * sd + 1e-9,
                "T={temperature} k={top_k}: token {i} drawn {} times, expected {want:.0} ± {sd:.0} ({seen:?})",
                seen[i]
            );
        }
    }

    /// The nucleus from a partial order against the whole sort it replaces: weights with many
    /// ties (few distinct values), a zero, token ids out of order (as the top-k leaves them),
    /// sizes about the selection's steps (64, 512, 4096) and a vocabulary's, top_p from a sliver
    /// to all but a sliver — and the prefix ending inside the first selection and past it.
    #[test]
    fn nucleus_is_the_prefix_of_the_whole_sort() {
        let whole = |idx: &[usize], w: &[f64], top_p: f64| {
            let mut order: Vec<usize> = (0..idx.len()).collect();
            order.sort_by(|&a, &b| w[b].total_cmp(&w[a]).then(idx[a].cmp(&idx[b])));
            let total: f64 = w.iter().sum();
            let (mut acc, mut keep) = (0.0, 0);
            while keep < order.len() && (keep == 0 || acc < top_p * total) {
                acc += w[order[keep]];
                keep += 1;
            }
            order.truncate(keep);
            order
        };
        let (mut checked, mut past_first) = (0, 0);
        for n in [1usize, 2, 63, 64, 65, 511, 512, 513, 4095, 4097, 50257] {
            for seed in 0..3usize {
                // a permutation of 0..n (7919 is a prime dividing no n here): distinct ids
                let idx: Vec<usize> = (0..n).map(|i| (i * 7919 + seed) % n).collect();
                let distinct = [3usize, 50, 100_000][seed];
                let w: Vec<f64> = (0..n)
                    .map(|i| if i % 97 == 5 { 0.0 } else { ((i * 2654435761) % distinct) as f64 / 7.0 + 0.5 })
                    .collect();
                for top_p in [1e-9, 0.1, 0.5, 0.9, 0.999, 0.999_999] {
                    let got = nucleus(&idx, &w, top_p);
                    assert_eq!(got, whole(&idx, &w, top_p), "n {n} seed {seed} top_p {top_p}");
                    past_first += usize::from(got.len() > 64);
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 11 * 3 * 6);
        assert!(past_first > 20, "only {past_first} prefixes went past the first selection");
    }

    #[test]
    fn greedy_takes_the_first_largest_logit() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        assert_eq!(pick(&[0.1, 3.0, 2.9, -1.0, 2.8, 0.0], &opts(0.0, 0), &mut rng), 1);
        // ties go to the first, as torch.argmax
        assert_eq!(pick(&[1.0, 5.0, 2.0, 5.0], &opts(0.0, 0), &mut rng), 1);
    }

    #[test]
    fn sampling_follows_the_tempered_softmax_of_the_top_k() {
        let logits = [0.1, 3.0, 2.9, -1.0, 2.8, 0.0, 1.5];
        check_frequencies(&logits, 1.0, 3);
        check_frequencies(&logits, 0.5, 3);
        check_frequencies(&logits, 2.0, 0);
        check_frequencies(&logits, 0.7, 6); // every token but one
        check_frequencies(&logits, 1.3, 7); // k = vocabulary: no cut
                                            // large logits must not overflow
        let big: Vec<f32> = logits.iter().map(|x| x + 500.0).collect();
        check_frequencies(&big, 0.8, 0);
    }

    #[test]
    fn nucleus_sampling_keeps_the_smallest_set_reaching_top_p() {
        let logits = [0.1, 3.0, 2.9, -1.0, 2.8, 0.0, 1.5];
        check_nucleus(&logits, 1.0, 0, 0.5); // the two best
        check_nucleus(&logits, 1.0, 0, 0.9);
        check_nucleus(&logits, 0.6, 4, 0.7); // after top-k, on the tempered mass
        check_nucleus(&logits, 2.0, 0, 0.01); // the best alone
    }

    /// Top-k keeps every token as likely as the k-th, as transformers' `TopKLogitsWarper`
    /// does (`logits < topk(logits, k)[..., -1]` set to −∞): [2, 1, 1, 0] with k = 2 samples
    /// tokens 0, 1, 2 in proportion e² : e : e and never 3.
    #[test]
    fn top_k_keeps_the_ties_of_the_kth() {
        let logits = [2.0f32, 1.0, 1.0, 0.0];
        let n = 40_000;
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut seen = [0usize; 4];
        for _ in 0..n {
            seen[pick(&logits, &opts(1.0, 2), &mut rng) as usize] += 1;
        }
        let e = std::f64::consts::E;
        let z = e * e + 2.0 * e;
        for (i, p) in [e * e / z, e / z, e / z, 0.0].into_iter().enumerate() {
            let (want, sd) = (n as f64 * p, (n as f64 * p * (1.0 - p)).sqrt());
            assert!((seen[i] as f64 - want).abs() <= 4.5 * sd + 1e-9, "token {i}: {seen:?}, expected {want:.0}");
        }
    }
}
