use std::time::Duration;

#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum CommError {
    /// Ranks of one group called different collectives (or lengths) at the same point.
    #[error("collective mismatch in group of {size} at call #{seq}: {detail}")]
    Mismatch { seq: u64, size: usize, detail: String },
    #[error(
        "{op} (call #{seq}, {len} elements) timed out after {waited:?}: ranks {missing:?} of the group never arrived"
    )]
    Timeout { op: &'static str, seq: u64, len: usize, waited: Duration, missing: Vec<usize> },
    #[error("{op} aborted: rank {rank} failed ({reason})")]
    PeerFailed { op: &'static str, rank: usize, reason: String },
    #[error("invalid {op} call: {detail}")]
    Invalid { op: &'static str, detail: String },
    #[error("{0}")]
    Backend(String),
}

pub type Result<T> = std::result::Result<T, CommError>;
