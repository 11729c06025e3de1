//! brigade-comm: collectives over `[f32]` for parallel training.
//!
//! A [`Comm`] is one rank's handle on a group of ranks. It offers the collectives training
//! needs (all-reduce, reduce-scatter, all-gather, broadcast), tagged point-to-point messages for
//! pipeline stages, a barrier, asynchronous forms that return a [`Handle`], and `split` into
//! sub-groups as `MPI_Comm_split` does. Backends: [`local`] (ranks are threads of one process,
//! exchanging through shared memory) and `mpi` (feature `mpi`: each process is a rank).
//!
//! Nothing hangs silently: every collective carries the group's sequence number, operation and
//! length, so ranks that disagree fail together with an error naming both sides; every wait has
//! a deadline whose error names the ranks that never arrived; a rank that fails poisons its
//! peers' pending and later calls.

pub mod bench;
pub mod chunks;
mod comm;
pub mod conformance;
pub mod error;
pub mod local;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod trace;

pub use chunks::chunk_range;
pub use comm::{Backend, Comm, Handle};
pub use error::{CommError, Result};
pub use trace::TraceEvent;

/// How values from the ranks are combined.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    /// The sum divided by the group size.
    Avg,
    Max,
}

impl ReduceOp {
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Avg => "avg",
            ReduceOp::Max => "max",
        }
    }
}
