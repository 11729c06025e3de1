//! brigade-serve: batched GPT inference — a paged KV cache with prefix caching, one forward
//! pass per step over every running sequence, iteration-level scheduling, batch-invariant
//! outputs. (The HTTP API of issue 11 is built on this engine.)

pub mod engine;
pub mod kv;
pub mod model;
