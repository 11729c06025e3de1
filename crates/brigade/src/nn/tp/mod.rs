//! Tensor parallelism (Megatron-LM): each layer's matrices split across the ranks of the tp
//! group, with the communication of each split stated beside it (`comm`), column- and
//! row-parallel layers (`linear`), the vocabulary-parallel embedding and loss (`vocab`), and
//! the group's sums over the flat buffers (`state`). These are the only layers that talk to
//! peers; how each parameter is cut lives with the parameter layout (`params::Split`).

pub mod comm;
pub mod linear;
pub mod state;
pub mod vocab;

pub use comm::Tp;
pub use linear::{ColumnParallelLinear, RowParallelLinear};
pub use vocab::VocabShard;
