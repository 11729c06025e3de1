//! brigade-serve: batched GPT inference — a paged KV cache with prefix caching, one forward
//! pass per step over every running sequence, iteration-level scheduling, batch-invariant
//! outputs — behind an OpenAI-compatible HTTP API (`brigade serve`).
//!
//! The layers, from the bottom: `model/` the serving model (weights, the batched forward,
//! paged attention, the cache's floats); `engine/` the scheduler over the cache's blocks,
//! the step, the engine's thread(s); `request/` a request shaped for the engine, whatever
//! brought it; `startup` loading the model and starting its engine; `program/` programs of
//! generation calls run inside the engine; `http/` the axum server and its handlers — the only
//! layer that knows HTTP, with `route/`, the router over several servers (`brigade route`),
//! which knows nothing of the engine.

pub mod constraint;
pub mod engine;
pub mod error;
pub mod http;
pub mod metrics;
pub mod model;
pub mod program;
pub mod request;
pub mod route;
pub mod source;
pub mod startup;
