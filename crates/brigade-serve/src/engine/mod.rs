//! The engine: continuous batching over the paged KV cache. `scheduler` decides each step (a
//! `batch`) over the blocks of `block_pool`; `step` runs it through the model and `advance`s
//! the sequences; `request` is what goes in and comes out; `profile` the measured step
//! times; `worker` the engine's thread(s), with tensor-parallel followers; `embedder` the
//! embedding model's batching thread.

mod advance;
pub mod batch;
pub mod block_pool;
pub(crate) mod embedder;
pub mod profile;
pub mod request;
pub mod scheduler;
pub mod step;
pub mod worker;

pub use advance::penalize_repeats;
pub use batch::{Batch, Scheduled};
pub use block_pool::{BlockKey, BlockPool};
pub use profile::StepProfile;
pub use request::{Admit, Constrain, Finish, Output, Refused, Request, Sampling};
pub use scheduler::{Limits, Scheduler, Stats, MIN_PREFILL, PREFILL_PER_DECODE};
pub use step::{BlockCounts, Engine};
pub use worker::{follow_group, EngineHandle, EngineSetup};
