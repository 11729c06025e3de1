//! SIGINT and SIGTERM for the long-running commands (`train`, `embed`): the first sets a flag
//! the command reads at its next safe point and says at once what will happen; the second ends
//! the process at once, saying what that leaves. Either way the exit status is 130.

use anyhow::Result;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A command ended early by SIGINT or SIGTERM (after saving what it could): exit status 130.
#[derive(Debug)]
pub struct Interrupted(pub String);

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Interrupted {}

/// Installs the handlers: `first` is printed on the first signal (the flag is set; the
/// command stops at its next safe point), `second` on the next one, which exits at once.
pub fn flag(first: &'static str, second: &'static str) -> Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    // printed from the handler itself: the current step or shard may take a while to
    // finish, or end the process before any other thread could print
    let (first, second) = (first.as_bytes(), second.as_bytes());
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let f = Arc::clone(&flag);
        // SAFETY: the action only swaps an atomic, writes to stderr with write(2) and calls
        // _exit(2), all async-signal-safe.
        unsafe {
            signal_hook::low_level::register(sig, move || {
                if f.swap(true, Ordering::SeqCst) {
                    libc::write(2, second.as_ptr().cast(), second.len());
                    libc::_exit(130);
                }
                libc::write(2, first.as_ptr().cast(), first.len());
            })?;
        }
    }
    Ok(flag)
}
