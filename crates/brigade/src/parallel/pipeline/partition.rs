//! The model's slots (the embedding, each block's attention and MLP halves, the final norm with
//! the LM head and the loss) split into contiguous pipeline stages balanced by cost: the most
//! loaded stage is as light as any split can make it, so stages may hold unequal numbers of
//! blocks (126 layers on 16 stages, or fewer blocks beside GPT-2's heavy LM head).

use crate::error::{Error, Result};
use crate::models::GptConfig;
use std::ops::Range;

/// Training FLOPs per token of each slot of `cfg` (`models::gpt::slots`) at sequence length
/// `seq`: the embedding (a lookup, nearly free), each block's attention half (its projections
/// and causal attention) and MLP half (its products, a mixture's active ones), and the last
/// slot (the LM head's matmul over the vocabulary — tied or not, the same FLOPs — the final
/// norm and the loss).
pub fn gpt_slot_costs(cfg: &GptConfig, seq: usize) -> Vec<f64> {
    let (c, v, t) = (cfg.n_embd as f64, cfg.vocab_size as f64, seq as f64);
    let mut costs = vec![6.0 * c];
    for i in 0..cfg.n_layer {
        let (attn, mlp) = cfg.block(i).half_matrices();
        costs.push(6.0 * attn as f64 + 6.0 * t * cfg.q_width() as f64);
        costs.push(6.0 * mlp as f64);
    }
    costs.push(6.0 * v * c + 30.0 * c);
    costs
}

/// Contiguous ranges of `costs` on `stages` stages, each non-empty, minimising the most loaded
/// stage (among the best splits, the one whose first stages end earliest). Refuses more
/// stages than pieces.
pub fn partition(costs: &[f64], stages: usize) -> Result<Vec<Range<usize>>> {
    let n = costs.len();
    if stages == 0 || stages > n {
        return Err(Error::Layout(format!(
            "pp={stages} stages need at least as many pieces of the model to hold; it splits into {n}: use pp ≤ {n}"
        )));
    }
    let mut prefix = vec![0.0; n + 1];
    for (i, c) in costs.iter().enumerate() {
        prefix[i + 1] = prefix[i] + c;
    }
    let load = |a: usize, b: usize| prefix[b] - prefix[a];
    // best[k][i]: the lightest most-loaded stage splitting units i.. into k stages
    let mut best = vec![vec![f64::INFINITY; n + 1]; stages + 1];
    let mut cut = vec![vec![0usize; n + 1]; stages + 1];
    best[0][n] = 0.0;
    for k in 1..=stages {
        for i in (0..n).rev() {
            // the first of the k stages takes units i..j
            for j in i + 1..=n - (k - 1) {
                let worst = load(i, j).max(best[k - 1][j]);
                if worst < best[k][i] - 1e-9 * worst.abs().max(1.0) {
                    best[k][i] = worst;
                    cut[k][i] = j;
                }
            }
        }
    }
    let mut out = Vec::with_capacity(stages);
    let mut i = 0;
    for k in (1..=stages).rev() {
        let j = cut[k][i];
        out.push(i..j);
        i = j;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every way to cut `n` units into `k` non-empty contiguous stages, by brute force.
    fn all_splits(n: usize, k: usize) -> Vec<Vec<usize>> {
        if k == 1 {
            return vec![vec![n]];
        }
        (1..=n - (k - 1))
            .flat_map(|first| {
                all_splits(n - first, k - 1).into_iter().map(move |mut rest| {
                    rest.insert(0, first);
                    rest
                })
            })
            .collect()
    }

    #[test]
    fn the_split_is_as_balanced_as_any() {
        let costs = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0, 5.0, 3.0];
        for k in 1..=costs.len() {
            let got = partition(&costs, k).unwrap();
            assert_eq!(got.len(), k);
            assert_eq!(got.first().unwrap().start, 0);
            assert_eq!(got.last().unwrap().end, costs.len());
            assert!(got.windows(2).all(|w| w[0].end == w[1].start && w[0].start < w[0].end));
            let worst = |r: &Range<usize>| costs[r.clone()].iter().sum::<f64>();
            let mine = got.iter().map(worst).fold(0.0, f64::max);
            let best = all_splits(costs.len(), k)
                .iter()
                .map(|sizes| {
                    let mut at = 0;
                    sizes
                        .iter()
                        .map(|s| {
                            at += s;
                            costs[at - s..at].iter().sum::<f64>()
                        })
                        .fold(0.0, f64::max)
                })
                .fold(f64::INFINITY, f64::min);
            assert_eq!(mine, best, "k={k}: {got:?}");
        }
    }

    #[test]
    fn unequal_stages_and_too_many_are_refused() {
        // 126 equal layers on 16 stages: 8 or 7 each, the first ones fuller
        let costs = vec![1.0; 126];
        let got = partition(&costs, 16).unwrap();
        let sizes: Vec<usize> = got.iter().map(|r| r.len()).collect();
        assert_eq!(sizes.iter().sum::<usize>(), 126);
        assert_eq!(*sizes.iter().max().unwrap(), 8);
        let e = partition(&[1.0; 4], 5).unwrap_err().to_string();
        assert!(e.contains("use pp ≤ 4"), "{e}");
        // GPT-2 small on 2 stages: the LM head weighs like ~5 blocks, so the first stage
        // takes more blocks than the second
        let cfg = GptConfig::preset("gpt2-small").unwrap();
        let costs = gpt_slot_costs(&cfg, 256);
        let split = partition(&costs, 2).unwrap();
        assert!(split[0].len() > split[1].len(), "{split:?}");
        let total: f64 = costs.iter().sum();
        let heaviest = split.iter().map(|r| costs[r.clone()].iter().sum::<f64>()).fold(0.0, f64::max);
        // the ceiling of pp=2 at 8 micro-batches: the split's balance times 1F1B's bubble
        println!("gpt2-small on 2 stages: {split:?}, ceiling at m=8 {:.3}", total / heaviest * 8.0 / 9.0);
    }
}
