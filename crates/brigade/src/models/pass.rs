//! One call shape for every model pass: a forward or backward of a model part takes its
//! input, its activations and one [`Pass`] — this rank's tensor-parallel group, where each
//! unit's parameters are and where their gradients go (the whole buffer, or ZeRO-3's gathered
//! windows), whether the weight matrices' gradients are taken now or deferred, and the context
//! group holding the rest of each sequence (context parallelism). The single
//! worker is the pass on `Tp::SOLO` over its whole buffer.

use super::units::UnitStore;
use crate::nn::context::Context;
use crate::nn::tp::Tp;
use crate::nn::WeightGrads;
use crate::tensor::docs::Docs;
use brigade_comm::Comm;

pub struct Pass<'a> {
    pub tp: &'a Tp<'a>,
    pub store: &'a mut dyn UnitStore,
    /// The weight matrices' gradients: at once, or (a zero-bubble schedule's B) kept for its W.
    pub dw: WeightGrads,
    /// Where the rows stand (a forward's: one document a sequence, or packed documents kept
    /// apart); the forward keeps them for its backward.
    pub docs: Docs<'a>,
    /// The context group holding the sequences' other rows (context parallelism), if any.
    pub cp: Option<Context<'a>>,
    /// The expert group a mixture's experts are spread over (expert parallelism), if any.
    pub ep: Option<&'a Comm>,
}

impl<'a> Pass<'a> {
    /// A pass that takes every gradient at once.
    pub fn new(tp: &'a Tp<'a>, store: &'a mut dyn UnitStore) -> Pass<'a> {
        Pass { tp, store, dw: WeightGrads::Now, docs: Docs::WHOLE, cp: None, ep: None }
    }

    /// The same pass over packed documents at these positions (`None`: one a sequence).
    pub fn with_docs(self, pos: Option<&'a [u32]>) -> Pass<'a> {
        Pass { docs: Docs::of(pos), ..self }
    }

    /// The same pass over this rank's rows of sequences split across a context group.
    pub fn in_context(self, cp: Option<Context<'a>>) -> Pass<'a> {
        Pass { cp, ..self }
    }

    /// The same pass with a mixture's experts spread over `ep`.
    pub fn with_experts(self, ep: Option<&'a Comm>) -> Pass<'a> {
        Pass { ep, ..self }
    }

    /// The same pass with the weight matrices' gradients going to `dw`.
    pub fn deferring(self, dw: WeightGrads) -> Pass<'a> {
        Pass { dw, ..self }
    }
}

/// What a part's forward starts from: the tokens (the first stage) or the previous stage's
/// output rows.
#[derive(Clone, Copy)]
pub enum Input<'a> {
    Tokens(&'a [u32]),
    Hidden(&'a [f32]),
}

/// What a part's backward starts from: the loss (the last stage) or the gradient of the
/// stage's output rows.
#[derive(Clone, Copy)]
pub enum Output<'a> {
    Loss { targets: &'a [i32], scale: f32 },
    Grad(&'a [f32]),
}
