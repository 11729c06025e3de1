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
/// stage, and among the splits that reach it the sum of the stages' squared loads: where one
/// piece alone fixes the most loaded stage (a small model's LM head on four stages), the other
/// stages are cut as evenly as they can be, not left at any load below it (among equal splits,
/// the one whose first stages end earliest). Refuses more stages than pieces.
pub fn partition(costs: &[f64], stages: usize) -> Result<Vec<Range<usize>>> {
    let n = costs.len();
    if stages == 0 || stages > n {
        return Err(Error::Layout(format!(
            "pp={stages} stages need at least as many pieces of the model to hold; it splits into {n}: use pp ≤ {n}"
        )));
    }
    if let Some(c) = costs.iter().find(|c| !c.is_finite() || **c < 0.0) {
        return Err(Error::Layout(format!("a pipeline cut needs each piece's cost finite and not negative, got {c}")));
    }
    let mut prefix = vec![0.0; n + 1];
    for (i, c) in costs.iter().enumerate() {
        prefix[i + 1] = prefix[i] + c;
    }
    let load = |a: usize, b: usize| prefix[b] - prefix[a];
    let below = |x: f64, y: f64| x < y - 1e-9 * x.abs().max(1.0);
    // worst[k][i]: the lightest most-loaded stage splitting units i.. into k stages
    let mut worst = vec![vec![f64::INFINITY; n + 1]; stages + 1];
    worst[0][n] = 0.0;
    for k in 1..=stages {
        for i in (0..n).rev() {
            // the first of the k stages takes units i..j
            for j in i + 1..=n - (k - 1) {
                let w = load(i, j).max(worst[k - 1][j]);
                if below(w, worst[k][i]) {
                    worst[k][i] = w;
                }
            }
        }
    }
    // within that bound, the least sum of squared loads: squares[k][i] splitting units i..
    let best = worst[stages][0];
    let bound = best + 1e-9 * best.abs().max(1.0);
    let mut squares = vec![vec![f64::INFINITY; n + 1]; stages + 1];
    let mut cut = vec![vec![0usize; n + 1]; stages + 1];
    squares[0][n] = 0.0;
    for k in 1..=stages {
        for i in (0..n).rev() {
            for j in i + 1..=n - (k - 1) {
                let l = load(i, j);
                if l > bound || squares[k - 1][j].is_infinite() {
                    continue;
                }
                let q = l * l + squares[k - 1][j];
                if below(q, squares[k][i]) {
                    squares[k][i] = q;
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

    /// Against every split, by brute force: the most loaded stage is the lightest any split
    /// reaches, and among the splits that reach it the sum of squared loads is the least — on
    /// costs where one piece dominates (it alone fixes the most loaded stage) as well.
    #[test]
    fn the_split_is_as_balanced_as_any() {
        let cases: [&[f64]; 4] = [
            &[3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0, 5.0, 3.0],
            &[0.1, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 9.0],
            &[7.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.25],
            &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0],
        ];
        for costs in cases {
            for k in 1..=costs.len() {
                let got = partition(costs, k).unwrap();
                assert_eq!(got.len(), k);
                assert_eq!(got.first().unwrap().start, 0);
                assert_eq!(got.last().unwrap().end, costs.len());
                assert!(got.windows(2).all(|w| w[0].end == w[1].start && w[0].start < w[0].end));
                let loads = |sizes: &[usize]| {
                    let mut at = 0;
                    sizes
                        .iter()
                        .map(|s| {
                            at += s;
                            costs[at - s..at].iter().sum::<f64>()
                        })
                        .collect::<Vec<f64>>()
                };
                let max = |l: &[f64]| l.iter().copied().fold(0.0, f64::max);
                let sq = |l: &[f64]| l.iter().map(|x| x * x).sum::<f64>();
                let mine = loads(&got.iter().map(|r| r.len()).collect::<Vec<_>>());
                let all: Vec<Vec<f64>> = all_splits(costs.len(), k).iter().map(|s| loads(s)).collect();
                let best = all.iter().map(|l| max(l)).fold(f64::INFINITY, f64::min);
                assert_eq!(max(&mine), best, "{costs:?} k={k}: {got:?}");
                let even = all.iter().filter(|l| max(l) <= best).map(|l| sq(l)).fold(f64::INFINITY, f64::min);
                assert!(
                    (sq(&mine) - even).abs() <= 1e-9 * even,
                    "{costs:?} k={k}: {got:?} {mine:?}, Σ² {} > {even}",
                    sq(&mine)
                );
            }
        }
    }

    /// GPT-2 small on four stages: the LM head alone outweighs a quarter of the model, so it
    /// fixes the most loaded stage; the embedding and the twelve blocks are shared evenly by the
    /// other three (four blocks each), not two blocks on the first and five on the next two.
    #[test]
    fn a_stage_the_head_fixes_leaves_the_others_even() {
        let cfg = GptConfig::preset("gpt2-small").unwrap();
        let split = partition(&gpt_slot_costs(&cfg, 256), 4).unwrap();
        assert_eq!(split, [0..9, 9..17, 17..25, 25..26]);
    }

    #[test]
    fn unequal_stages_and_too_many_are_refused() {
        // 126 equal layers on 16 stages: 8 or 7 each
        let costs = vec![1.0; 126];
        let got = partition(&costs, 16).unwrap();
        let sizes: Vec<usize> = got.iter().map(|r| r.len()).collect();
        assert_eq!(sizes.iter().sum::<usize>(), 126);
        assert_eq!(*sizes.iter().max().unwrap(), 8);
        let e = partition(&[1.0; 4], 5).unwrap_err().to_string();
        assert!(e.contains("use pp ≤ 4"), "{e}");
        for bad in [f64::NAN, f64::INFINITY, -1.0] {
            let e = partition(&[1.0, bad, 1.0], 2).unwrap_err().to_string();
            assert!(e.contains("finite and not negative"), "{bad}: {e}");
        }
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
