//! Tensor parallelism (Megatron-LM): each layer's matrices split across the ranks of the tp
//! group, with the communication of each split stated beside it (`comm`), column- and
//! row-parallel layers (`linear`), the vocabulary-parallel embedding and loss (`vocab`), and
//! how each parameter is cut and put back together (`shard`).

pub mod comm;
pub mod linear;
pub mod shard;
pub mod state;
pub mod vocab;

pub use comm::Tp;
pub use linear::{ColumnParallelLinear, RowParallelLinear};
pub use shard::Split;
pub use vocab::VocabShard;
