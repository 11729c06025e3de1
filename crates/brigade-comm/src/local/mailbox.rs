//! Tagged point-to-point messages between rank threads (pipeline activations, the tied
//! table's gradient): a send copies into the receiver's queue and returns; a receive waits,
//! with the group's deadline. A received message's buffer is kept for the next send of its
//! size: a large message in fresh memory costs a page fault every 4 KiB (a 154 MiB table,
//! 100–280 ms a step, against ~7 ms to copy it into memory already mapped).

use crate::error::{CommError, Result};
use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

type Key = (u64, usize, usize, u32); // (group, src, dst, tag)

/// Buffers smaller than this are left to the allocator (which keeps them mapped itself).
const SPARE_MIN_BYTES: usize = 1 << 20;
/// The most received buffers kept for reuse, and the most bytes they may hold together (the
/// largest is kept even alone above it: a model's table sent every step is what the spares are
/// for); beyond either the smallest are freed.
const MAX_SPARES: usize = 8;
const MAX_SPARE_BYTES: usize = 1 << 30;

#[derive(Default)]
pub struct Mailboxes {
    queues: Mutex<HashMap<Key, VecDeque<Vec<f32>>>>,
    arrived: Condvar,
    /// Buffers of received messages, for the next sends (by capacity, smallest first).
    spares: Mutex<Vec<Vec<f32>>>,
}

impl Mailboxes {
    /// Queues a copy of `msg` for `key`'s receiver.
    pub fn put(&self, key: Key, msg: &[f32]) {
        let mut buf = self.spare(msg.len());
        buf.extend_from_slice(msg);
        self.queues.lock().unwrap_or_else(|p| p.into_inner()).entry(key).or_default().push_back(buf);
        self.arrived.notify_all();
    }

    /// An empty buffer holding at least `len` elements: the smallest spare that fits (if it is
    /// not more than twice the size), else a new one.
    fn spare(&self, len: usize) -> Vec<f32> {
        let mut spares = self.spares.lock().unwrap_or_else(|p| p.into_inner());
        let fits = spares.iter().position(|b| b.capacity() >= len);
        match fits {
            Some(i) if spares[i].capacity() / 2 <= len => {
                let mut b = spares.remove(i);
                b.clear();
                b
            }
            _ => Vec::with_capacity(len),
        }
    }

    /// Keeps a received message's buffer for a later send.
    pub fn recycle(&self, buf: Vec<f32>) {
        if buf.capacity() * std::mem::size_of::<f32>() < SPARE_MIN_BYTES {
            return;
        }
        let mut spares = self.spares.lock().unwrap_or_else(|p| p.into_inner());
        let at = spares.partition_point(|b| b.capacity() < buf.capacity());
        spares.insert(at, buf);
        let bytes = |s: &[Vec<f32>]| s.iter().map(|b| b.capacity() * std::mem::size_of::<f32>()).sum::<usize>();
        while spares.len() > MAX_SPARES || (spares.len() > 1 && bytes(&spares) > MAX_SPARE_BYTES) {
            spares.remove(0);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn take(m: &Mailboxes, key: Key) -> Vec<f32> {
        m.take(key, Duration::from_secs(5), || Ok(())).unwrap()
    }

    /// A received buffer carries the next send of a size it fits (its memory, not a new
    /// allocation), and the reused buffer holds exactly the new message, whatever it held.
    #[test]
    fn a_received_buffer_carries_the_next_message_of_its_size() {
        let m = Mailboxes::default();
        let big: Vec<f32> = (0..1 << 19).map(|i| i as f32).collect(); // 2 MiB
        m.put((0, 0, 1, 7), &big);
        let got = take(&m, (0, 0, 1, 7));
        assert_eq!(got, big);
        let at = got.as_ptr();
        m.recycle(got);
        // three quarters of it: the same memory, only the new values
        let next: Vec<f32> = (0..3 << 17).map(|i| -(i as f32)).collect();
        m.put((0, 1, 0, 3), &next);
        let got = take(&m, (0, 1, 0, 3));
        assert_eq!(got.as_ptr(), at);
        assert_eq!(got, next);
        m.recycle(got);
        // a message under half its size gets its own buffer; the spare stays for a larger one
        let small = vec![1.5f32; 1 << 17];
        m.put((0, 0, 1, 7), &small);
        let got = take(&m, (0, 0, 1, 7));
        assert_ne!(got.as_ptr(), at);
        assert_eq!(got, small);
        // one larger than every spare gets its own too
        let larger = vec![2.5f32; 1 << 20];
        m.put((0, 0, 1, 8), &larger);
        let got = take(&m, (0, 0, 1, 8));
        assert_ne!(got.as_ptr(), at);
        assert_eq!(got, larger);
    }

    /// Small buffers are left to the allocator, and at most `MAX_SPARES` are kept: the
    /// smallest go first.
    #[test]
    fn the_spares_are_bounded() {
        let m = Mailboxes::default();
        m.recycle(vec![0f32; 1024]);
        m.recycle(Vec::with_capacity((SPARE_MIN_BYTES - 4) / 4));
        assert!(m.spares.lock().unwrap().is_empty());
        // exactly the least kept
        m.recycle(Vec::with_capacity(SPARE_MIN_BYTES / 4));
        assert_eq!(m.spares.lock().unwrap().len(), 1);
        m.spares.lock().unwrap().clear();
        for k in 0..MAX_SPARES + 3 {
            m.recycle(Vec::with_capacity((1 << 18) + k * 4096));
        }
        let spares = m.spares.lock().unwrap();
        assert_eq!(spares.len(), MAX_SPARES);
        assert!(spares.windows(2).all(|w| w[0].capacity() <= w[1].capacity()));
        assert!(spares[0].capacity() >= (1 << 18) + 3 * 4096, "the smallest were dropped");
    }

    /// The spares hold at most `MAX_SPARE_BYTES` together, the smallest dropped first, but the
    /// largest is kept even when it alone is above it (capacities only: nothing is touched).
    #[test]
    fn the_spares_bytes_are_bounded_but_the_largest_stays() {
        let m = Mailboxes::default();
        let floats = |bytes: usize| bytes / std::mem::size_of::<f32>();
        for mib in [100, 300, 200, 400] {
            m.recycle(Vec::with_capacity(floats(mib << 20)));
        }
        let caps = |m: &Mailboxes| m.spares.lock().unwrap().iter().map(|b| b.capacity()).collect::<Vec<_>>();
        // 1000 MiB together: all four fit under 1 GiB
        assert_eq!(caps(&m), [100, 200, 300, 400].map(|mib| floats(mib << 20)));
        m.recycle(Vec::with_capacity(floats(120 << 20)));
        // 1120 MiB: the 100 MiB one goes, leaving 1020
        assert_eq!(caps(&m), [120, 200, 300, 400].map(|mib| floats(mib << 20)));
        m.recycle(Vec::with_capacity(floats(150 << 20)));
        // 1170 MiB: the 120 MiB one going leaves 1050, so the 150 MiB one goes too
        assert_eq!(caps(&m), [200, 300, 400].map(|mib| floats(mib << 20)));
        m.recycle(Vec::with_capacity(floats(124 << 20)));
        // exactly 1 GiB together: kept
        assert_eq!(caps(&m), [124, 200, 300, 400].map(|mib| floats(mib << 20)));
        m.recycle(Vec::with_capacity(floats(2 << 30)));
        // a 2 GiB table alone is above the bound: every other spare goes, it stays
        assert_eq!(caps(&m), [floats(2 << 30)]);
    }
}
