//! Softmax cross-entropy over the vocabulary, mean over the tokens that have a target.

use super::ROW_CHUNK;
use rayon::prelude::*;

/// A target that takes no part in the loss (a prompt position, padding).
pub const IGNORE: i32 = -1;

/// Per-row loss `logsumexp(logits) − logits[target]` (0 for ignored rows); saves the
/// log-sum-exp of each row for backward.
pub fn cross_entropy_forward(losses: &mut [f32], lse: &mut [f32], logits: &[f32], targets: &[i32], v: usize) {
    assert!(logits.len() == targets.len() * v && losses.len() == targets.len() && lse.len() == targets.len());
    logits
        .par_chunks(v)
        .zip(targets.par_iter())
        .zip(losses.par_iter_mut().zip(lse.par_iter_mut()))
        .with_min_len(ROW_CHUNK)
        .for_each(|((row, &tgt), (loss, lse))| {
            let mx = row.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
            // Eight partial sums keep the loop vectorised and the rounding independent of threads.
            let mut acc = [0f32; 8];
            let chunks = row.chunks_exact(8);
            let rem = chunks.remainder();
            for ch in chunks {
                for k in 0..8 {
                    acc[k] += super::math::exp(ch[k] - mx);
                }
            }
            let mut sum: f32 = acc.iter().sum();
            sum += rem.iter().map(|&x| super::math::exp(x - mx)).sum::<f32>();
            *lse = mx + sum.ln();
            *loss = if tgt == IGNORE { 0.0 } else { *lse - row[tgt as usize] };
        });
}

/// Turns `logits` in place into `dlogits = (softmax − onehot(target)) · scale`, where
/// `scale` is 1 / (number of counted tokens in the whole batch).
pub fn cross_entropy_backward(logits: &mut [f32], lse: &[f32], targets: &[i32], v: usize, scale: f32) {
    assert!(logits.len() == targets.len() * v && lse.len() == targets.len());
    logits.par_chunks_mut(v).zip(targets.par_iter().zip(lse.par_iter())).with_min_len(ROW_CHUNK).for_each(
        |(row, (&tgt, &lse))| {
            if tgt == IGNORE {
                row.fill(0.0);
                return;
            }
            for x in row.iter_mut() {
                *x = super::math::exp(*x - lse) * scale;
            }
            row[tgt as usize] -= scale;
        },
    );
}
