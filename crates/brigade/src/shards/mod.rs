//! Sharded jobs over a corpus: the input files read as documents and cut into shards
//! (`input`), the output directory a killed job resumes in with nothing lost or doubled
//! (`dir`), and the loop that hands shards to workers — threads or MPI ranks — one claim at a
//! time (`work`). `brigade embed` and `brigade tokenize` are such jobs.

pub mod dir;
pub mod input;
pub mod megatron;
pub mod tokens;
pub mod work;
