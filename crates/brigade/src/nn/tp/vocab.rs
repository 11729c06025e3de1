//! The vocabulary split across the tensor-parallel group (Megatron's `VocabParallelEmbedding`
//! and `vocab_parallel_cross_entropy`): each rank holds a block of rows of the (tied) token
//! table, looks up only its tokens, and computes the loss from its block of logits with three
//! small reductions, never holding a full row of logits.

use super::Tp;
use crate::error::Result;
use crate::nn::ensure;
use crate::tensor::docs::Docs;
use crate::tensor::embedding::{
    position_backward, position_forward, token_embedding_backward, token_embedding_forward,
};
use crate::tensor::loss::{finish_loss, row_max, row_sum_exp, VocabWindow};
use brigade_comm::ReduceOp;

/// This rank's block of the vocabulary: rows `lo..lo + rows` of the padded table, of which
/// the first `valid` are real tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VocabShard {
    pub lo: usize,
    pub rows: usize,
    pub valid: usize,
}

impl VocabShard {
    pub fn of(vocab: usize, rank: usize, tp: usize) -> VocabShard {
        let rows = vocab.div_ceil(tp);
        let lo = rank * rows;
        VocabShard { lo, rows, valid: vocab.saturating_sub(lo).min(rows) }
    }

    pub fn window(&self) -> VocabWindow {
        VocabWindow { width: self.rows, lo: self.lo, valid: self.valid }
    }
}

/// This rank's rows of `embedding(tokens) + positions` (no positions when `wpe` is empty): each rank embeds the tokens of its
/// block (zero rows for the others), `g` sums them, positions are added on this rank's rows.
/// `part` and `rows` are scratch.
pub fn embedding_forward(
    tp: &Tp,
    out: &mut [f32],
    (wte, wpe): (&[f32], &[f32]),
    (tokens, docs): (&[u32], Docs),
    sh: VocabShard,
    (t, c): (usize, usize),
    (part, rows): (&mut Vec<f32>, &mut Vec<f32>),
) -> Result<()> {
    ensure(part, tokens.len() * c);
    token_embedding_forward(part, wte, tokens, sh.lo, c);
    let e = tp.exit(part, rows)?;
    if wpe.is_empty() {
        // rotary models add no position table
        out.copy_from_slice(e);
    } else {
        position_forward(out, e, wpe, (tp.rows(tokens.len()).start, docs), t, c);
    }
    Ok(())
}

/// Backward of `embedding_forward` from this rank's rows of the gradient `drows`.
pub fn embedding_backward(
    tp: &Tp,
    (dwte, dwpe): (&mut [f32], &mut [f32]),
    drows: &[f32],
    (tokens, docs): (&[u32], Docs),
    sh: VocabShard,
    (t, c): (usize, usize),
    buf: &mut Vec<f32>,
) -> Result<()> {
    if !dwpe.is_empty() {
        position_backward(dwpe, drows, (tp.rows(tokens.len()).start, docs), t, c);
    }
    let d = tp.exit_backward(drows, buf)?;
    token_embedding_backward(dwte, d, tokens, sh.lo, c);
    Ok(())
}

/// Per-row losses (and log-sum-exp for backward) from this rank's block of logits
/// `[n, sh.rows]`: the row maximum is reduced with max, then the sums of exponentials and the
/// target logits (held by one rank each) with one sum.
pub fn cross_entropy_forward(
    tp: &Tp,
    losses: &mut [f32],
    lse: &mut [f32],
    logits: &[f32],
    targets: &[i32],
    sh: VocabShard,
) -> Result<()> {
    let n = targets.len();
    let w = sh.window();
    let mut mx = vec![0f32; n];
    row_max(&mut mx, logits, w);
    tp.all_reduce(&mut mx, ReduceOp::Max)?;
    let mut both = vec![0f32; 2 * n];
    let (sum, tgt) = both.split_at_mut(n);
    row_sum_exp(sum, tgt, logits, &mx, targets, w);
    tp.all_reduce(&mut both, ReduceOp::Sum)?;
    let (sum, tgt) = both.split_at(n);
    finish_loss(losses, lse, &mx, sum, tgt, targets);
    Ok(())
}
