//! A pipeline plan as data: every rank's list of actions for one optimizer step (forwards,
//! backwards and their halves, sends and receives). `schedule` builds plans, `simulate`
//! checks them on paper, `executor` runs them.

use crate::layout::Schedule;

/// One step of a rank's list. `chunk` is the rank's model chunk (0 unless interleaved).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Forward {
        mb: usize,
        chunk: usize,
    },
    /// The whole backward: input and weight gradients.
    Backward {
        mb: usize,
        chunk: usize,
    },
    /// The input-gradient half of a backward (zero-bubble schedules).
    BackwardInput {
        mb: usize,
        chunk: usize,
    },
    /// The weight-gradient half, after its `BackwardInput`.
    BackwardWeight {
        mb: usize,
        chunk: usize,
    },
    /// This chunk's output activation to `to`, which runs the next stage.
    SendActivation {
        mb: usize,
        chunk: usize,
        to: usize,
    },
    /// The previous stage's activation, from `from`, for this chunk's forward.
    RecvActivation {
        mb: usize,
        chunk: usize,
        from: usize,
    },
    /// This chunk's input gradient to `to`, which runs the previous stage.
    SendGrad {
        mb: usize,
        chunk: usize,
        to: usize,
    },
    /// The next stage's input gradient, from `from`, for this chunk's backward.
    RecvGrad {
        mb: usize,
        chunk: usize,
        from: usize,
    },
}

impl Action {
    /// A forward or (part of) a backward, as opposed to a send or a receive.
    pub fn is_compute(&self) -> bool {
        matches!(
            self,
            Action::Forward { .. }
                | Action::Backward { .. }
                | Action::BackwardInput { .. }
                | Action::BackwardWeight { .. }
        )
    }
}

/// Every rank's list of actions for one optimizer step.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub kind: Schedule,
    pub pp: usize,
    /// Micro-batches per step.
    pub m: usize,
    /// Model chunks per rank.
    pub v: usize,
    pub ranks: Vec<Vec<Action>>,
}
