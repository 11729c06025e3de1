//! Autoregressive sampling: greedy (temperature 0) or temperature with optional top-k.

use super::{Activations, Gpt};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[derive(Clone, Copy, Debug)]
pub struct SampleOptions {
    pub max_new_tokens: usize,
    /// 0 picks the most likely token.
    pub temperature: f32,
    /// Keep only the k most likely tokens (0: all).
    pub top_k: usize,
    pub seed: u64,
    /// Stop after emitting this token.
    pub stop: Option<u32>,
}

/// Picks the next token from one row of logits.
pub fn pick(logits: &[f32], opt: &SampleOptions, rng: &mut ChaCha8Rng) -> u32 {
    let argmax = || {
        let mut best = 0;
        for (i, &v) in logits.iter().enumerate() {
            if v > logits[best] {
                best = i;
            }
        }
        best as u32
    };
    if opt.temperature <= 0.0 {
        return argmax();
    }
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    if opt.top_k > 0 && opt.top_k < idx.len() {
        idx.select_nth_unstable_by(opt.top_k - 1, |&a, &b| logits[b].total_cmp(&logits[a]));
        idx.truncate(opt.top_k);
    }
    let mx = idx.iter().map(|&i| logits[i]).fold(f32::NEG_INFINITY, f32::max);
    let w: Vec<f64> = idx.iter().map(|&i| (((logits[i] - mx) / opt.temperature) as f64).exp()).collect();
    let mut u = rng.gen::<f64>() * w.iter().sum::<f64>();
    for (k, &wi) in w.iter().enumerate() {
        if u < wi {
            return idx[k] as u32;
        }
        u -= wi;
    }
    idx[idx.len() - 1] as u32
}

/// Continues each of the `prompts` (equal lengths) for up to `max_new_tokens`, in one batch.
/// The context is cropped to the model's block size.
pub fn generate(model: &Gpt, params: &[f32], prompts: &[Vec<u32>], opt: &SampleOptions) -> Vec<Vec<u32>> {
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
            let tok = if done[i] { opt.stop.unwrap_or(0) } else { pick(&logits[i * v..(i + 1) * v], opt, &mut rng) };
            done[i] |= Some(tok) == opt.stop;
            s.push(tok);
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
        SampleOptions { max_new_tokens: 1, temperature, top_k, seed: 0, stop: None }
    }

    /// Sampled frequencies against softmax(logits / temperature) over the k best, written
    /// out in f64: each within 4.5 standard deviations of its expectation.
    fn check_frequencies(logits: &[f32], temperature: f32, top_k: usize) {
        let n = 40_000;
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut seen = vec![0usize; logits.len()];
        for _ in 0..n {
            seen[pick(logits, &opts(temperature, top_k), &mut rng) as usize] += 1;
        }
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        let kept = if top_k == 0 { logits.len() } else { top_k.min(logits.len()) };
        let z: f64 = order[..kept].iter().map(|&i| (logits[i] as f64 / temperature as f64).exp()).sum();
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
}
