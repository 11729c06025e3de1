//! Bulk embedding generation: a sentence-transformers encoder run over a corpus split into
//! shards that workers (threads or MPI ranks) take one at a time, each shard written once,
//! atomically, so a killed job resumes with nothing lost or doubled.

/// The corpus reader, shared with `brigade tokenize`.
pub use crate::shards::input as corpus;
pub mod encoder;
pub mod job;
pub mod npy;
pub mod output;
pub mod pooling;

pub use encoder::{Encoder, Tokenized};
