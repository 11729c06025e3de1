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

/// One rank's call as the error messages show it: `all_reduce(sum) of 10 elements`.
pub(crate) fn describe_call(op: &str, len: usize, arg: u64) -> String {
    let arg = match op {
        "all_reduce" | "reduce_scatter" => format!("({})", ["sum", "avg", "max"].get(arg as usize).unwrap_or(&"?")),
        "broadcast" => format!("(root {arg})"),
        _ => String::new(),
    };
    if op == "all_to_all_v" {
        return "all_to_all_v".into();
    }
    format!("{op}{arg} of {len} elements")
}

/// The first disagreement of an all-to-all's counts (`counts[r]`: rank r's sends then its
/// receives, a group's worth each), the same text on every rank; `None` when they agree.
pub(crate) fn all_to_all_disagreement(counts: &[Vec<usize>]) -> Option<String> {
    let n = counts.len();
    for (a, c) in counts.iter().enumerate() {
        for b in 0..n {
            let (sends, expects) = (c[b], counts[b][n + a]);
            if sends != expects {
                return Some(format!(
                    "all_to_all_v: rank {a} sends {sends} elements to rank {b}, which expects {expects} from it"
                ));
            }
        }
    }
    None
}

/// The mismatch error for call `seq`, given what each rank called: ranks grouped by call, so
/// that every rank reports the same text.
pub(crate) fn mismatch(seq: u64, per_rank: &[String]) -> CommError {
    let mut calls: Vec<(&String, Vec<usize>)> = Vec::new();
    for (r, d) in per_rank.iter().enumerate() {
        match calls.iter_mut().find(|(x, _)| *x == d) {
            Some((_, rs)) => rs.push(r),
            None => calls.push((d, vec![r])),
        }
    }
    let parts: Vec<String> = calls
        .iter()
        .map(|(d, rs)| {
            let who = if rs.len() == 1 { format!("rank {}", rs[0]) } else { format!("ranks {rs:?}") };
            format!("{who} called {d}")
        })
        .collect();
    CommError::Mismatch { seq, size: per_rank.len(), detail: parts.join(" but ") }
}
