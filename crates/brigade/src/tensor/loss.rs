//! Softmax cross-entropy over the vocabulary, in pieces that also work on a window of it (a
//! rank's vocabulary shard): row maxima, sums of exponentials and target logits are combined
//! across windows by the caller; on the whole vocabulary `cross_entropy_forward` does it.

use super::ROW_CHUNK;
use rayon::prelude::*;

/// A target that takes no part in the loss (a prompt position, padding).
pub const IGNORE: i32 = -1;

/// Which columns of a `[n, width]` logits buffer are the vocabulary entries `lo..lo + valid`
/// (the columns beyond `valid` are padding and take no part).
#[derive(Clone, Copy, Debug)]
pub struct VocabWindow {
    pub width: usize,
    pub lo: usize,
    pub valid: usize,
}

impl VocabWindow {
    pub fn whole(v: usize) -> VocabWindow {
        VocabWindow { width: v, lo: 0, valid: v }
    }
    /// The column of target `tgt` in this window, if it lies in it.
    fn col(&self, tgt: i32) -> Option<usize> {
        (tgt != IGNORE).then(|| (tgt as usize).wrapping_sub(self.lo)).filter(|&c| c < self.valid)
    }
}

/// `mx[i] = max` of row i's valid columns (−∞ for an empty window).
pub fn row_max(mx: &mut [f32], logits: &[f32], w: VocabWindow) {
    logits.par_chunks(w.width).zip(mx.par_iter_mut()).with_min_len(ROW_CHUNK).for_each(|(row, m)| {
        *m = row[..w.valid].iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
    });
}

/// `sum[i] = Σ exp(logit − mx[i])` over row i's valid columns; `tgt[i]` = the target's logit
/// where the target lies in the window, else 0.
pub fn row_sum_exp(sum: &mut [f32], tgt: &mut [f32], logits: &[f32], mx: &[f32], targets: &[i32], w: VocabWindow) {
    logits
        .par_chunks(w.width)
        .zip(sum.par_iter_mut().zip(tgt.par_iter_mut()))
        .zip(mx.par_iter().zip(targets.par_iter()))
        .with_min_len(ROW_CHUNK)
        .for_each(|((row, (s, tl)), (&mx, &t))| {
            let row = &row[..w.valid];
            // Eight partial sums keep the loop vectorised and the rounding independent of threads.
            let mut acc = [0f32; 8];
            let chunks = row.chunks_exact(8);
            let rem = chunks.remainder();
            for ch in chunks {
                for k in 0..8 {
                    acc[k] += super::math::exp(ch[k] - mx);
                }
            }
            *s = acc.iter().sum::<f32>() + rem.iter().map(|&x| super::math::exp(x - mx)).sum::<f32>();
            *tl = w.col(t).map_or(0.0, |c| row[c]);
        });
}

/// Per-row loss `lse − target logit` (0 for ignored rows), with `lse = mx + ln(sum)`.
pub fn finish_loss(losses: &mut [f32], lse: &mut [f32], mx: &[f32], sum: &[f32], tgt: &[f32], targets: &[i32]) {
    for i in 0..losses.len() {
        lse[i] = mx[i] + sum[i].ln();
        losses[i] = if targets[i] == IGNORE { 0.0 } else { lse[i] - tgt[i] };
    }
}

/// Per-row loss `logsumexp(logits) − logits[target]` (0 for ignored rows) over the whole
/// vocabulary of width `v`; saves the log-sum-exp of each row for backward.
pub fn cross_entropy_forward(losses: &mut [f32], lse: &mut [f32], logits: &[f32], targets: &[i32], v: usize) {
    let n = targets.len();
    assert!(logits.len() == n * v && losses.len() == n && lse.len() == n);
    let (mut mx, mut sum, mut tgt) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
    let w = VocabWindow::whole(v);
    row_max(&mut mx, logits, w);
    row_sum_exp(&mut sum, &mut tgt, logits, &mx, targets, w);
    finish_loss(losses, lse, &mx, &sum, &tgt, targets);
}

/// Turns `logits` in place into `dlogits = (softmax − onehot(target)) · scale` on the
/// window's valid columns (padding columns get 0), where `scale` is 1 / (number of counted
/// tokens in the whole batch).
pub fn cross_entropy_backward(logits: &mut [f32], lse: &[f32], targets: &[i32], w: VocabWindow, scale: f32) {
    assert!(logits.len() == targets.len() * w.width && lse.len() == targets.len());
    logits.par_chunks_mut(w.width).zip(targets.par_iter().zip(lse.par_iter())).with_min_len(ROW_CHUNK).for_each(
        |(row, (&tgt, &lse))| {
            if tgt == IGNORE {
                row.fill(0.0);
                return;
            }
            let (real, pad) = row.split_at_mut(w.valid);
            for x in real.iter_mut() {
                *x = super::math::exp(*x - lse) * scale;
            }
            pad.fill(0.0);
            if let Some(c) = w.col(tgt) {
                real[c] -= scale;
            }
        },
    );
}
