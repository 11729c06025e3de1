//! A per-communicator record of calls, for timelines and communication-time reports.

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
}

impl Default for Tracer {
    fn default() -> Self {
        Tracer { epoch: Instant::now(), events: Arc::new(Mutex::new(None)) }
    }
}

impl Tracer {
    pub fn enable(&self, on: bool) {
        let mut g = self.events.lock().unwrap_or_else(|p| p.into_inner());
        *g = if on { Some(g.take().unwrap_or_default()) } else { None };
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
