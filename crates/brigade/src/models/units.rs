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

/// Hears that `g[from..]` holds final gradients.
type Ready<'a> = &'a mut dyn FnMut(&[f32], usize);

/// The plain store: the whole parameter buffer and the whole gradient buffer; `ready(g, from)`,
/// when given, hears that `g[from..]` holds final gradients (for data-parallel buckets).
pub struct Whole<'a> {
    units: &'a [Range<usize>],
    params: &'a [f32],
    grads: &'a mut [f32],
    ready: Option<Ready<'a>>,
}

impl<'a> Whole<'a> {
    /// Parameters only, for a forward.
    pub fn reading(units: &'a [Range<usize>], params: &'a [f32]) -> Whole<'a> {
        Whole { units, params, grads: &mut [], ready: None }
    }

    /// Parameters and the gradient buffer, for a backward.
    pub fn new(units: &'a [Range<usize>], params: &'a [f32], grads: &'a mut [f32]) -> Whole<'a> {
        Whole { units, params, grads, ready: None }
    }

    /// Calls `ready(g, from)` each time a unit's gradients are final.
    pub fn on_ready(self, ready: Ready<'a>) -> Whole<'a> {
        Whole { ready: Some(ready), ..self }
    }
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
        if let Some(ready) = self.ready.as_mut() {
            ready(self.grads, self.units[u].start);
        }
        Ok(())
    }
}
