//! How one parameter is cut across a tensor-parallel group, and back: a rank's slice of the
//! full tensor (at initialisation and on resume) and the full tensor from every rank's slice
//! (for a checkpoint, which always holds the full model).

/// How a tensor's full value maps onto each rank's local piece.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// The whole tensor on every rank (LayerNorm, the row-parallel biases, positions).
    Replicated,
    /// The last dimension cut: it is `parts` equal segments side by side (q | k | v has 3),
    /// and each rank holds its block of every segment (column-parallel weights and biases).
    Cols { parts: usize },
    /// The first dimension cut into equal blocks (row-parallel weights).
    Rows,
    /// The first dimension cut into tp / `copies` equal blocks, each held by `copies`
    /// consecutive ranks (key/value heads replicated when tp exceeds them, as Megatron-LM
    /// does); the copies' gradients are summed over them.
    Shared { copies: usize },
    /// The first dimension (the vocabulary) padded to a multiple of the group size, then cut
    /// into equal blocks, as Megatron pads it; the padded rows are zero and never read.
    Vocab,
}

impl Split {
    /// How rows of key/value heads are cut over a tensor-parallel group whose ranks hold each
    /// head `copies` times: each rank its own block (`copies` 1: tp divides the heads), or each
    /// head on `copies` consecutive ranks. Training's and serving's one rule.
    pub fn kv_heads(copies: usize) -> Split {
        if copies > 1 {
            Split::Shared { copies }
        } else {
            Split::Rows
        }
    }

    pub fn local_shape(&self, full: &[usize], tp: usize) -> Vec<usize> {
        let mut s = full.to_vec();
        match *self {
            Split::Replicated => {}
            Split::Cols { parts } => {
                let last = s.len() - 1;
                assert!(s[last].is_multiple_of(parts * tp), "{full:?} does not split into {parts}×{tp} column blocks");
                s[last] /= tp;
            }
            Split::Rows => {
                assert!(s[0].is_multiple_of(tp), "{full:?} does not split into {tp} row blocks");
                s[0] /= tp;
            }
            Split::Shared { copies } => {
                assert!(
                    tp.is_multiple_of(copies) && s[0].is_multiple_of(tp / copies),
                    "{full:?} over {tp} ranks in {copies} copies"
                );
                s[0] /= tp / copies;
            }
            Split::Vocab => s[0] = s[0].div_ceil(tp),
        }
        s
    }

    /// Writes rank `rank`'s piece of `full` (shape `shape`) into `out`.
    pub fn slice(&self, full: &[f32], shape: &[usize], rank: usize, tp: usize, out: &mut [f32]) {
        self.walk(shape, rank, tp, |f, l, n| out[l..l + n].copy_from_slice(&full[f..f + n]));
        if let Split::Vocab = self {
            // padding rows beyond the real vocabulary
            let cols: usize = shape[1..].iter().product();
            let real = (shape[0].saturating_sub(rank * out.len() / cols)).min(out.len() / cols);
            out[real * cols..].fill(0.0);
        }
    }

    /// The full tensor from every rank's piece (rank order).
    pub fn assemble(&self, pieces: &[&[f32]], shape: &[usize], out: &mut [f32]) {
        let tp = pieces.len();
        for (rank, piece) in pieces.iter().enumerate() {
            self.walk(shape, rank, tp, |f, l, n| out[f..f + n].copy_from_slice(&piece[l..l + n]));
        }
    }

    /// Calls `copy(full_offset, local_offset, len)` for each contiguous run of rank `rank`'s
    /// piece.
    fn walk(&self, shape: &[usize], rank: usize, tp: usize, mut copy: impl FnMut(usize, usize, usize)) {
        let total: usize = shape.iter().product();
        match *self {
            Split::Replicated => copy(0, 0, total),
            Split::Cols { parts } => {
                let cols = shape[shape.len() - 1];
                let (seg, rows) = (cols / parts, total / cols);
                let lseg = seg / tp;
                for r in 0..rows {
                    for p in 0..parts {
                        copy(r * cols + p * seg + rank * lseg, (r * parts + p) * lseg, lseg);
                    }
                }
            }
            Split::Rows => {
                let n = total / tp;
                copy(rank * n, 0, n);
            }
            Split::Shared { copies } => {
                let n = total / (tp / copies);
                copy(rank / copies * n, 0, n);
            }
            Split::Vocab => {
                let cols: usize = shape[1..].iter().product();
                let per = shape[0].div_ceil(tp);
                let lo = (rank * per).min(shape[0]);
                let hi = ((rank + 1) * per).min(shape[0]);
                copy(lo * cols, 0, (hi - lo) * cols);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pieces written out by hand for small tensors whose values are their own indices.
    #[test]
    fn slices_match_hand_written_pieces_and_assemble_back() {
        let iota = |n: usize| (0..n).map(|i| i as f32).collect::<Vec<f32>>();
        type Case = (Split, Vec<usize>, usize, Vec<Vec<f32>>);
        let cases: Vec<Case> = vec![
            // [2, 6] as q|k|v of width 2, over 2 ranks: rank 0 holds column 0 of each part
            (
                Split::Cols { parts: 3 },
                vec![2, 6],
                2,
                vec![vec![0., 2., 4., 6., 8., 10.], vec![1., 3., 5., 7., 9., 11.]],
            ),
            (Split::Cols { parts: 1 }, vec![4], 2, vec![vec![0., 1.], vec![2., 3.]]),
            (Split::Rows, vec![4, 2], 2, vec![vec![0., 1., 2., 3.], vec![4., 5., 6., 7.]]),
            (Split::Replicated, vec![3], 2, vec![vec![0., 1., 2.], vec![0., 1., 2.]]),
            // 2 key/value heads of 2 rows over 4 ranks: ranks 0 and 1 hold head 0
            (Split::Shared { copies: 2 }, vec![4, 1], 4, vec![vec![0., 1.], vec![0., 1.], vec![2., 3.], vec![2., 3.]]),
            // a vocabulary of 3 rows of width 2 over 2 ranks: padded to 4, the last row zero
            (Split::Vocab, vec![3, 2], 2, vec![vec![0., 1., 2., 3.], vec![4., 5., 0., 0.]]),
            // 5 rows over 4 ranks: 2 rows each, the last rank holds padding only
            (Split::Vocab, vec![5, 1], 4, vec![vec![0., 1.], vec![2., 3.], vec![4., 0.], vec![0., 0.]]),
        ];
        for (split, shape, tp, want) in cases {
            let full = iota(shape.iter().product());
            let local: usize = split.local_shape(&shape, tp).iter().product();
            let mut pieces = Vec::new();
            for (rank, w) in want.iter().enumerate() {
                let mut out = vec![f32::NAN; local];
                split.slice(&full, &shape, rank, tp, &mut out);
                assert_eq!(&out, w, "{split:?} {shape:?} rank {rank}");
                pieces.push(out);
            }
            let refs: Vec<&[f32]> = pieces.iter().map(|p| p.as_slice()).collect();
            let mut back = vec![f32::NAN; full.len()];
            split.assemble(&refs, &shape, &mut back);
            assert_eq!(back, full, "{split:?} {shape:?} assembled");
        }
    }
}
