//! Tagged point-to-point messages between rank threads (pipeline activations): a send copies
//! into the receiver's queue and returns; a receive waits, with the group's deadline.

use crate::error::{CommError, Result};
use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

type Key = (u64, usize, usize, u32); // (group, src, dst, tag)

#[derive(Default)]
pub struct Mailboxes {
    queues: Mutex<HashMap<Key, VecDeque<Vec<f32>>>>,
    arrived: Condvar,
}

impl Mailboxes {
    pub fn put(&self, key: Key, msg: Vec<f32>) {
        self.queues.lock().unwrap_or_else(|p| p.into_inner()).entry(key).or_default().push_back(msg);
        self.arrived.notify_all();
    }

    pub fn wake_all(&self) {
        let _g = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        self.arrived.notify_all();
    }

    /// Waits for the next message under `key`; `alive` fails the wait when a peer has failed.
    pub fn take(&self, key: Key, timeout: Duration, alive: impl Fn() -> Result<()>) -> Result<Vec<f32>> {
        let start = Instant::now();
        let mut q = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(m) = q.get_mut(&key).and_then(|d| d.pop_front()) {
                return Ok(m);
            }
            alive()?;
            let left = timeout.checked_sub(start.elapsed()).ok_or(CommError::Timeout {
                op: "recv",
                seq: 0,
                len: 0,
                waited: start.elapsed(),
                missing: vec![key.1],
            })?;
            q = self.arrived.wait_timeout(q, left.min(Duration::from_millis(100))).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}
