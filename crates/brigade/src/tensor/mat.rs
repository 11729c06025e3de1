//! A strided matrix view: the operand shape every matrix product takes.

/// A strided matrix operand: element (i, j) is at `data[i * rs + j * cs]`.
#[derive(Clone, Copy, Debug)]
pub struct Mat {
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl Mat {
    /// A dense row-major `rows × cols` matrix.
    pub fn rm(rows: usize, cols: usize) -> Mat {
        Mat { rows, cols, rs: cols, cs: 1 }
    }
    /// The transpose of a dense row-major matrix stored as `cols × rows`.
    pub fn rm_t(rows: usize, cols: usize) -> Mat {
        Mat { rows, cols, rs: 1, cs: rows }
    }
    /// A row-major block with a wider row stride (a column slice of a bigger matrix).
    pub fn strided(rows: usize, cols: usize, rs: usize) -> Mat {
        Mat { rows, cols, rs, cs: 1 }
    }
    /// Transposed view of a strided block.
    pub fn t(self) -> Mat {
        Mat { rows: self.cols, cols: self.rows, rs: self.cs, cs: self.rs }
    }
    pub(crate) fn span(&self) -> usize {
        if self.rows == 0 || self.cols == 0 {
            0
        } else {
            (self.rows - 1) * self.rs + (self.cols - 1) * self.cs + 1
        }
    }
}
