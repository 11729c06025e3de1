//! Where each row of a `[b, t]` batch stands. By default a sequence is one document: row r is
//! at position r mod t and attends to every row before it in its sequence. Documents packed
//! into a sequence and kept apart (`--doc-mask`, as Llama 3 trained) give each row its
//! position in its own document instead: it attends only to the rows of that document (the
//! `pos` rows before it, and itself), and its position embedding or rotation is that position —
//! so a packed sequence computes what its documents would alone.

/// The rows' positions: none (`r mod t`), or one per row of the batch.
#[derive(Clone, Copy, Debug, Default)]
pub struct Docs<'a> {
    pos: Option<&'a [u32]>,
}

impl<'a> Docs<'a> {
    /// One document a sequence.
    pub const WHOLE: Docs<'static> = Docs { pos: None };

    /// Packed documents: `pos[r]` is row r's position in its document (at most its position in
    /// the sequence: a document that began before the sequence counts from the sequence's start).
    pub fn packed(pos: &'a [u32]) -> Docs<'a> {
        Docs { pos: Some(pos) }
    }

    /// `Some(pos)` packed, `None` whole.
    pub fn of(pos: Option<&'a [u32]>) -> Docs<'a> {
        Docs { pos }
    }

    pub fn positions(&self) -> Option<&'a [u32]> {
        self.pos
    }

    /// The position of row `r` of sequences of `t` rows.
    #[inline]
    pub fn pos(&self, r: usize, t: usize) -> usize {
        match self.pos {
            None => r % t,
            Some(p) => p[r] as usize,
        }
    }

    /// The first key (a position in the sequence) that row `r` attends to.
    #[inline]
    pub fn first_key(&self, r: usize, t: usize) -> usize {
        match self.pos {
            None => 0,
            Some(p) => r % t - p[r] as usize,
        }
    }

    /// Whether the positions fit `n` rows of sequences of `t`: one per row, none reaching back
    /// before its sequence's start.
    pub fn fits(&self, n: usize, t: usize) -> bool {
        self.pos.is_none_or(|p| p.len() == n && p.iter().enumerate().all(|(r, &q)| q as usize <= r % t))
    }

    /// `fits`, asserted (a caller's bug otherwise: the trainer checks what it is given).
    pub fn check(&self, n: usize, t: usize) {
        assert!(self.fits(n, t), "positions that do not fit {n} rows of sequences of {t}");
    }

    /// The positions of rows `rows` (a block of them: a tensor-parallel rank's under sequence
    /// parallelism).
    pub fn rows(&self, rows: std::ops::Range<usize>) -> Docs<'a> {
        Docs { pos: self.pos.map(|p| &p[rows]) }
    }
}

/// Positions of documents packed into sequences of `t` tokens: `starts` (one per sequence of
/// the batch, ascending, each inside its sequence) are where documents begin in each.
pub fn positions_from_starts(t: usize, starts: &[Vec<usize>]) -> Vec<u32> {
    let mut pos = Vec::with_capacity(t * starts.len());
    for s in starts {
        let mut begin = 0;
        let mut next = s.iter().peekable();
        for i in 0..t {
            while next.peek().is_some_and(|&&b| b <= i) {
                begin = *next.next().expect("peeked");
            }
            pos.push((i - begin) as u32);
        }
    }
    pos
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_restart_at_each_document() {
        let pos = positions_from_starts(6, &[vec![0, 2, 5], vec![], vec![3]]);
        assert_eq!(pos, [0, 1, 0, 1, 2, 0, 0, 1, 2, 3, 4, 5, 0, 1, 2, 0, 1, 2]);
        let d = Docs::packed(&pos);
        d.check(18, 6);
        assert_eq!((d.pos(4, 6), d.first_key(4, 6)), (2, 2));
        assert_eq!((Docs::WHOLE.pos(10, 6), Docs::WHOLE.first_key(10, 6)), (4, 0));
    }
}
