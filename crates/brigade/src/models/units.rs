//! Where forward and backward find a model part's parameters and put its gradients, one unit
//! at a time. A unit is a run of layers whose parameters are contiguous in the flat buffer
//! (the embedding, one block, the final LayerNorm); its layers address them from the unit's
//! start. So a unit's parameters can be a slice of the whole buffer, or — under ZeRO-3 — a
//! window gathered from the data-parallel shards just before it is needed.

use crate::error::Result;
use std::ops::Range;

pub trait UnitStore {
    /// Unit `u`'s parameters (for a forward).
    fn params(&mut self, u: usize) -> Result<&[f32]>;
    /// Unit `u`'s parameters and the buffer its gradients accumulate into (for a backward).
    fn params_grads(&mut self, u: usize) -> Result<(&[f32], &mut [f32])>;
    /// Unit `u`'s gradients are final for this micro-batch (backward visits the last unit
    /// first and unit 0, the embedding, last).
    fn grads_done(&mut self, u: usize) -> Result<()>;
}

/// The plain store: the whole parameter buffer and the whole gradient buffer; `ready(g, from)`
/// hears that `g[from..]` holds final gradients (for data-parallel buckets).
pub struct Whole<'a> {
    pub units: &'a [Range<usize>],
    pub params: &'a [f32],
    pub grads: &'a mut [f32],
    pub ready: &'a mut dyn FnMut(&[f32], usize),
}

impl UnitStore for Whole<'_> {
    fn params(&mut self, u: usize) -> Result<&[f32]> {
        Ok(&self.params[self.units[u].clone()])
    }

    fn params_grads(&mut self, u: usize) -> Result<(&[f32], &mut [f32])> {
        let r = self.units[u].clone();
        Ok((&self.params[r.clone()], &mut self.grads[r]))
    }

    fn grads_done(&mut self, u: usize) -> Result<()> {
        (self.ready)(self.grads, self.units[u].start);
        Ok(())
    }
}
