//! Parallel programs: an application's graph of generation calls — fork, map, select, join —
//! parsed and checked before it runs (`graph`, with the prompt `template`s that name earlier
//! nodes' outputs), then run inside the batching engine (`run`), from `POST /v1/programs` or
//! `brigade run` (`local`).

pub mod graph;
pub mod local;
pub(crate) mod run;
pub mod template;

pub use graph::{Builder, Fanout, Limits, Node, Program, ProgramError, Split, Width};
pub use template::Template;
