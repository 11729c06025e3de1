//! Parallel programs (issue 24, in progress): an application's graph of generation calls —
//! fork, map, select, join — parsed and checked before it runs. `graph` the program and its
//! order; `template` the prompt templates that name earlier nodes' outputs.

pub mod graph;
pub mod template;

pub use graph::{Fanout, Limits, Node, Program, Split, Width};
pub use template::Template;
