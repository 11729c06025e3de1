//! Where a backward's weight gradients go. Every weight matrix's gradient is `xᵀ·dout`, apart
//! from the input gradient `dout·Wᵀ` that the layer below waits for. Computed at once (`Now`),
//! or kept with copies of `x` and `dout` and computed later (`Later`): the zero-bubble
//! schedules (Qi et al. 2023) split a backward into its input-gradient part B, which the
//! previous stage waits for, and this weight-gradient part W, which fills the bubble.

use crate::params::View;
use crate::tensor::matmul;

/// One weight gradient left for later: `g[offset..offset + len] += xᵀ·dout` in the gradient
/// buffer of `unit`, with `x` `[n, d_in]` and `dout` `[n, d_out]`.
#[derive(Debug)]
pub struct Deferred {
    pub unit: usize,
    offset: usize,
    len: usize,
    x: Vec<f32>,
    dout: Vec<f32>,
    d_in: usize,
    n: usize,
    d_out: usize,
}

impl Deferred {
    /// Adds this gradient into `g`, the gradient buffer of its unit.
    pub fn run(&self, g: &mut [f32]) {
        let w = &mut g[self.offset..self.offset + self.len];
        matmul(w, &self.x, &self.dout, self.d_in, self.n, self.d_out, true, false, true);
    }

    /// Bytes it holds until it runs.
    pub fn bytes(&self) -> usize {
        4 * (self.x.len() + self.dout.len())
    }

    /// Its two buffers, for reuse once it has run.
    pub fn into_buffers(self) -> [Vec<f32>; 2] {
        [self.x, self.dout]
    }
}

/// Buffers kept for reuse by the deferred gradients' copies (fresh large allocations are
/// page-faulted in on every use).
#[derive(Debug, Default)]
pub struct Spare(Vec<Vec<f32>>);

impl Spare {
    /// A copy of `src` in a kept buffer large enough, or a new one.
    pub fn copy_of(&mut self, src: &[f32]) -> Vec<f32> {
        let fit =
            self.0.iter().enumerate().filter(|(_, b)| b.capacity() >= src.len()).min_by_key(|(_, b)| b.capacity());
        let mut buf = match fit.map(|(i, _)| i) {
            Some(i) => self.0.swap_remove(i),
            None => Vec::with_capacity(src.len()),
        };
        buf.clear();
        buf.extend_from_slice(src);
        buf
    }

    /// A kept buffer of at least `n` elements' capacity, if there is one (emptied).
    pub fn take(&mut self, n: usize) -> Option<Vec<f32>> {
        let i = self.0.iter().position(|b| b.capacity() >= n)?;
        let mut buf = self.0.swap_remove(i);
        buf.clear();
        Some(buf)
    }

    pub fn give(&mut self, buf: Vec<f32>) {
        if buf.capacity() > 0 {
            self.0.push(buf);
        }
    }
}

#[derive(Debug, Default)]
pub enum WeightGrads {
    /// Into the gradient buffer as the backward goes.
    #[default]
    Now,
    /// Kept for later; `unit` is the unit whose layers run now; copies go into `spare`'s
    /// buffers.
    Later { unit: usize, queue: Vec<Deferred>, spare: Spare },
}

impl WeightGrads {
    pub fn later() -> WeightGrads {
        WeightGrads::later_with(Spare::default())
    }

    /// `later`, copying into `spare`'s buffers.
    pub fn later_with(spare: Spare) -> WeightGrads {
        WeightGrads::Later { unit: 0, queue: Vec::new(), spare }
    }

    /// The unit whose layers' gradients come next.
    pub fn set_unit(&mut self, u: usize) {
        if let WeightGrads::Later { unit, .. } = self {
            *unit = u;
        }
    }

    /// `w`'s gradient in `g` (the unit's buffer) `+= xᵀ·dout`, `x` `[n, d_in]`, `dout`
    /// `[n, d_out]`.
    pub fn add(&mut self, g: &mut [f32], w: View, x: &[f32], dout: &[f32], (d_in, n, d_out): (usize, usize, usize)) {
        match self {
            WeightGrads::Now => matmul(w.of_mut(g), x, dout, d_in, n, d_out, true, false, true),
            WeightGrads::Later { spare, .. } => {
                let x = spare.copy_of(x);
                self.keep(w, x, dout, (d_in, n, d_out))
            }
        }
    }

    /// `add` taking `x` by value (kept without a copy when deferred).
    pub fn add_owned(
        &mut self,
        g: &mut [f32],
        w: View,
        x: Vec<f32>,
        dout: &[f32],
        (d_in, n, d_out): (usize, usize, usize),
    ) {
        match self {
            WeightGrads::Now => matmul(w.of_mut(g), &x, dout, d_in, n, d_out, true, false, true),
            WeightGrads::Later { .. } => self.keep(w, x, dout, (d_in, n, d_out)),
        }
    }

    fn keep(&mut self, w: View, x: Vec<f32>, dout: &[f32], (d_in, n, d_out): (usize, usize, usize)) {
        if let WeightGrads::Later { unit, queue, spare } = self {
            let (offset, len, dout) = (w.offset, w.len, spare.copy_of(dout));
            queue.push(Deferred { unit: *unit, offset, len, x, dout, d_in, n, d_out });
        }
    }

    /// The gradients left for later (none when computed at once), and the spare buffers lent
    /// to `Later` (none for `Now`, which was lent none).
    pub fn into_deferred(self) -> (Vec<Deferred>, Option<Spare>) {
        match self {
            WeightGrads::Now => (Vec::new(), None),
            WeightGrads::Later { queue, spare, .. } => (queue, Some(spare)),
        }
    }
}
