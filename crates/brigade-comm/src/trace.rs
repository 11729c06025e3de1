//! A per-communicator record of calls, for timelines and communication-time reports.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Debug, PartialEq)]
pub struct TraceEvent {
    pub op: &'static str,
    /// Bytes of this rank's payload (the full buffer for all-reduce and all-gather).
    pub bytes: usize,
    /// Since the tracer's epoch (its creation).
    pub start: Duration,
    pub end: Duration,
    pub algorithm: &'static str,
}

#[derive(Clone)]
pub struct Tracer {
    epoch: Instant,
    events: Arc<Mutex<Option<Vec<TraceEvent>>>>,
    /// Whether recording is on, read without the lock on every call.
    on: Arc<AtomicBool>,
}

impl Default for Tracer {
    fn default() -> Self {
        Tracer { epoch: Instant::now(), events: Arc::new(Mutex::new(None)), on: Arc::new(AtomicBool::new(false)) }
    }
}

impl Tracer {
    pub fn enable(&self, on: bool) {
        let mut g = self.events.lock().unwrap_or_else(|p| p.into_inner());
        *g = if on { Some(g.take().unwrap_or_default()) } else { None };
        self.on.store(on, Ordering::Release);
    }

    /// The start of a call to record: `None` (and no clock read) while recording is off.
    pub fn start(&self) -> Option<Instant> {
        self.on.load(Ordering::Acquire).then(Instant::now)
    }

    pub fn record(&self, op: &'static str, bytes: usize, start: Instant, algorithm: &'static str) {
        let end = Instant::now();
        let mut g = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(ev) = g.as_mut() {
            ev.push(TraceEvent { op, bytes, start: start - self.epoch, end: end - self.epoch, algorithm });
        }
    }

    /// The instant event times are measured from.
    pub fn epoch(&self) -> Instant {
        self.epoch
    }

    /// Returns and clears what was recorded.
    pub fn take(&self) -> Vec<TraceEvent> {
        let mut g = self.events.lock().unwrap_or_else(|p| p.into_inner());
        g.as_mut().map(std::mem::take).unwrap_or_default()
    }
}
