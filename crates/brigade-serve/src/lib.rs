//! brigade-serve: batched GPT inference — a paged KV cache with prefix caching, one forward
//! pass per step over every running sequence, iteration-level scheduling, batch-invariant
//! outputs — behind an OpenAI-compatible HTTP API (`brigade serve`).

pub mod api;
mod app;
mod chat;
pub mod chat_api;
mod completions;
pub mod constraint;
mod embedder;
mod embeddings;
pub mod engine;
pub mod kv;
pub mod loadgen;
pub mod metrics;
pub mod model;
mod paged_attention;
pub mod program;
mod programs;
pub mod served;
pub mod server;
pub mod text;
pub mod weights;
pub mod worker;
