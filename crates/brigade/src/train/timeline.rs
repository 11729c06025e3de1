//! A per-rank timeline of a run in Chrome's trace-event format (open it in Perfetto or
//! chrome://tracing): data, forward and backward of each micro-batch, clipping, optimizer,
//! evaluation and checkpoints, so a person can see where a step's time goes.

use crate::error::{Error, Result};
use std::path::Path;
use std::time::Instant;

#[derive(Clone, Debug)]
struct Span {
    name: String,
    cat: &'static str,
    start_us: f64,
    dur_us: f64,
    step: usize,
}

pub struct Timeline {
    epoch: Instant,
    rank: usize,
    spans: Vec<Span>,
}

impl Timeline {
    pub fn new(rank: usize) -> Timeline {
        Timeline { epoch: Instant::now(), rank, spans: Vec::new() }
    }

    /// Records a span that started at `start` and ends now.
    pub fn record(&mut self, name: impl Into<String>, cat: &'static str, step: usize, start: Instant) {
        let end = Instant::now();
        self.spans.push(Span {
            name: name.into(),
            cat,
            start_us: (start - self.epoch).as_secs_f64() * 1e6,
            dur_us: (end - start).as_secs_f64() * 1e6,
            step,
        });
    }

    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    pub fn to_json(&self) -> serde_json::Value {
        let events: Vec<serde_json::Value> = self
            .spans
            .iter()
            .map(|s| {
                serde_json::json!({"name": s.name, "cat": s.cat, "ph": "X", "ts": s.start_us, "dur": s.dur_us,
                    "pid": 0, "tid": self.rank, "args": {"step": s.step}})
            })
            .collect();
        serde_json::json!({"traceEvents": events, "displayTimeUnit": "ms"})
    }

    /// Writes the trace to `path` through a temporary file and a rename.
    pub fn write(&self, path: &Path) -> Result<()> {
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_string(&self.to_json()).expect("JSON values serialise");
        std::fs::write(&tmp, text).map_err(|e| Error::io(&tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
    }
}
