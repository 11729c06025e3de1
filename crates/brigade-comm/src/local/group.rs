//! Shared state of a group of rank threads: per-rank descriptor slots, arrival counters for
//! barriers, staging buffers, and the world-wide failure flag.

use super::mailbox::Mailboxes;
use super::LocalConfig;
use crate::error::{CommError, Result};
use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a rank is doing at a collective call: every rank of the group must publish the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Desc {
    pub seq: u64,
    pub op: &'static str,
    pub len: usize,
    /// Reduction, broadcast root, or split colour and key, as the operation needs.
    pub arg: u64,
}

/// Per-rank, per-call data read by peers after the first barrier of the call.
#[derive(Clone, Copy, Default)]
pub struct Slot {
    pub desc: Desc,
    /// Addresses of this rank's buffers (input / output) for the direct algorithms.
    pub src: usize,
    pub dst: usize,
}

/// Keeps each rank's hot atomic on its own cache line.
#[repr(align(128))]
#[derive(Default)]
pub struct Padded<T>(pub T);

pub struct World {
    pub cfg: LocalConfig,
    failed: AtomicBool,
    failure: Mutex<Option<(usize, String)>>,
    next_group: AtomicU64,
    /// Groups created by `split`, found by every member under (parent, call, colour).
    pub splits: Mutex<HashMap<(u64, u64, u32), Arc<Group>>>,
    pub mail: Mailboxes,
}

impl World {
    pub fn new(cfg: LocalConfig) -> World {
        World {
            cfg,
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            next_group: AtomicU64::new(0),
            splits: Mutex::new(HashMap::new()),
            mail: Mailboxes::default(),
        }
    }

    /// Marks `rank` (a world rank) failed: every wait of every rank now returns an error.
    pub fn fail(&self, rank: usize, why: &str) {
        let mut f = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
            *f = Some((rank, why.to_string()));
        }
        self.failed.store(true, Ordering::Release);
        self.mail.wake_all();
    }

    pub fn first_failure(&self) -> Option<(usize, String)> {
        self.failure.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The error a waiting rank returns once a peer has failed.
    pub fn check(&self, op: &'static str) -> Result<()> {
        if self.failed.load(Ordering::Acquire) {
            let (rank, reason) = self.first_failure().unwrap_or((usize::MAX, String::new()));
            return Err(CommError::PeerFailed { op, rank, reason });
        }
        Ok(())
    }
}

pub struct Group {
    pub world: Arc<World>,
    pub id: u64,
    /// World rank of each group rank.
    pub members: Vec<usize>,
    arrived: Vec<Padded<AtomicU64>>,
    /// Two slots per rank, used alternately by call number (see `LocalBackend`).
    slots: Vec<[UnsafeCell<Slot>; 2]>,
    staging: Vec<[UnsafeCell<Vec<f32>>; 2]>,
}

// SAFETY: a rank writes only its own slots and staging, and only before it arrives at the
// barrier that publishes them; peers read them only after that barrier (Release/Acquire on
// `arrived`). Alternating two slots keeps a fast rank's next call off a slow rank's reads.
unsafe impl Sync for Group {}
unsafe impl Send for Group {}

impl Group {
    pub fn new(world: Arc<World>, members: Vec<usize>) -> Group {
        let n = members.len();
        let id = world.next_group.fetch_add(1, Ordering::Relaxed);
        Group {
            world,
            id,
            members,
            arrived: (0..n).map(|_| Padded::default()).collect(),
            slots: (0..n).map(|_| Default::default()).collect(),
            staging: (0..n).map(|_| Default::default()).collect(),
        }
    }

    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// # Safety
    /// Only rank `r` itself, before arriving at the barrier of its call `parity`.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slot_mut(&self, r: usize, parity: usize) -> &mut Slot {
        &mut *self.slots[r][parity].get()
    }

    /// # Safety
    /// After the barrier that published the slot, before the next barrier of the call.
    pub unsafe fn slot(&self, r: usize, parity: usize) -> Slot {
        *self.slots[r][parity].get()
    }

    /// # Safety
    /// As `slot_mut`.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn staging_mut(&self, r: usize, parity: usize) -> &mut Vec<f32> {
        &mut *self.staging[r][parity].get()
    }

    /// # Safety
    /// As `slot`.
    pub unsafe fn staging(&self, r: usize, parity: usize) -> &[f32] {
        &*self.staging[r][parity].get()
    }

    /// Arrives at barrier `phase` and waits for every rank of the group to arrive there.
    pub fn wait_all(&self, me: usize, phase: u64, d: &Desc) -> Result<()> {
        self.arrived[me].0.store(phase, Ordering::Release);
        let start = Instant::now();
        let timeout = self.world.cfg.timeout;
        let mut spins = 0u32;
        loop {
            if self.arrived.iter().all(|a| a.0.load(Ordering::Acquire) >= phase) {
                return Ok(());
            }
            self.world.check(d.op)?;
            spins = spins.saturating_add(1);
            if spins < 2_000 {
                std::hint::spin_loop();
            } else if spins < 4_000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
                if start.elapsed() > timeout {
                    let missing: Vec<usize> =
                        (0..self.size()).filter(|&r| self.arrived[r].0.load(Ordering::Acquire) < phase).collect();
                    return Err(CommError::Timeout {
                        op: d.op,
                        seq: d.seq,
                        len: d.len,
                        waited: start.elapsed(),
                        missing,
                    });
                }
            }
        }
    }
}
