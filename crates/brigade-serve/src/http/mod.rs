//! The OpenAI-compatible HTTP API (axum): `server` binds, loads in the background and routes;
//! the handlers — `completions`, `chat`, `embeddings`, `programs` — read a body, shape it
//! through `request`, and answer or stream; `app` is the state they share and their error
//! responses.

mod app;
mod chat;
mod completions;
mod embeddings;
mod programs;
pub mod server;

pub use server::run;
