//! brigade: parallel training and inference of transformer models.
//! The floors of the library and what may import what: docs/architecture.md.

pub mod alloc;
pub mod bench;
pub mod embed;
pub mod error;
pub mod layout;
pub mod models;
pub mod nn;
pub mod pages;
pub mod parallel;
pub mod params;
pub mod plan;
pub mod shards;
pub mod tensor;
pub mod tokenize;
pub mod train;

pub use error::{Error, Result};

/// Runs `f` on a rayon pool of `threads` threads, so that every kernel inside (gemm included)
/// uses exactly that many cores: several workers can then share one machine.
pub fn with_threads<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> Result<R> {
    // the pool's threads allocate for the same rank as the caller
    let rank = alloc::current_rank();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .start_handler(move |_| alloc::set_rank(rank))
        .build()
        .map_err(|e| Error::Train(format!("cannot start {threads} threads: {e}")))?;
    Ok(pool.install(f))
}
