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
    /// Extra arguments shown in the viewer (a collective's bytes and algorithm).
    detail: Option<(usize, &'static str)>,
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
        self.record_until(name, cat, step, start, Instant::now());
    }

    /// Records a span from `start` to `end`.
    pub fn record_until(
        &mut self,
        name: impl Into<String>,
        cat: &'static str,
        step: usize,
        start: Instant,
        end: Instant,
    ) {
        self.spans.push(Span {
            name: name.into(),
            cat,
            start_us: (start - self.epoch).as_secs_f64() * 1e6,
            dur_us: (end - start).as_secs_f64() * 1e6,
            step,
            detail: None,
        });
    }

    /// Adds a communicator's recorded calls (from `Comm::take_trace`, timed from `epoch`, its
    /// `Comm::trace_epoch`) to this rank's timeline, beside the compute spans.
    pub fn add_comm(&mut self, epoch: Instant, events: &[brigade_comm::TraceEvent], step: usize) {
        for e in events {
            let start = epoch + e.start;
            let us = |t: Instant| t.saturating_duration_since(self.epoch).as_secs_f64() * 1e6;
            self.spans.push(Span {
                name: e.op.to_string(),
                cat: "comm",
                start_us: us(start),
                dur_us: (e.end - e.start).as_secs_f64() * 1e6,
                step,
                detail: Some((e.bytes, e.algorithm)),
            });
        }
    }

    /// Seconds spent in spans of category `cat` (e.g. "compute", "comm").
    pub fn seconds_in(&self, cat: &str) -> f64 {
        self.spans.iter().filter(|s| s.cat == cat).map(|s| s.dur_us).sum::<f64>() / 1e6
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
                let mut args = serde_json::json!({"step": s.step});
                if let Some((bytes, algorithm)) = s.detail {
                    args["bytes"] = bytes.into();
                    args["algorithm"] = algorithm.into();
                }
                serde_json::json!({"name": s.name, "cat": s.cat, "ph": "X", "ts": s.start_us, "dur": s.dur_us,
                    "pid": 0, "tid": self.rank, "args": args})
            })
            .collect();
        serde_json::json!({"traceEvents": events, "displayTimeUnit": "ms"})
    }

    /// Every rank's timeline merged into one trace (a track per rank) on the first rank of
    /// `world`, `None` on the others; every rank calls it. Each rank sends its trace as bytes.
    pub fn gather(&self, world: &brigade_comm::Comm) -> Result<Option<serde_json::Value>> {
        let err = |e: brigade_comm::CommError| Error::Train(format!("gathering the trace failed: {e}"));
        const TAG: u32 = 0x7ace;
        let mine = serde_json::to_vec(&self.to_json()).expect("JSON values serialise");
        if world.rank() != 0 {
            // the length in two 16-bit halves, each exact in f32
            let n = mine.len();
            world.send(&[(n >> 16) as f32, (n & 0xffff) as f32], 0, TAG).map_err(err)?;
            let bytes: Vec<f32> = mine.iter().map(|&b| b as f32).collect();
            world.send(&bytes, 0, TAG).map_err(err)?;
            return Ok(None);
        }
        let mut events = self.to_json()["traceEvents"].as_array().cloned().unwrap_or_default();
        for src in 1..world.size() {
            let mut len = [0f32; 2];
            world.recv(&mut len, src, TAG).map_err(err)?;
            let mut bytes = vec![0f32; ((len[0] as usize) << 16) | len[1] as usize];
            world.recv(&mut bytes, src, TAG).map_err(err)?;
            let text: Vec<u8> = bytes.iter().map(|&b| b as u8).collect();
            let v: serde_json::Value = serde_json::from_slice(&text)
                .map_err(|e| Error::Train(format!("rank {src} sent a trace that does not parse: {e}")))?;
            events.extend(v["traceEvents"].as_array().cloned().unwrap_or_default());
        }
        Ok(Some(serde_json::json!({"traceEvents": events, "displayTimeUnit": "ms"})))
    }

    /// Writes the trace to `path` through a temporary file and a rename.
    pub fn write(&self, path: &Path) -> Result<()> {
        write_trace(path, &self.to_json())
    }
}

/// Writes a trace (one rank's or a merged one) to `path` through a temporary file and a rename.
pub fn write_trace(path: &Path, trace: &serde_json::Value) -> Result<()> {
    {
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_string(trace).expect("JSON values serialise");
        std::fs::write(&tmp, text).map_err(|e| Error::io(&tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brigade_comm::ReduceOp;

    #[test]
    fn collectives_join_the_compute_spans_of_each_rank() {
        let traces = brigade_comm::local::run(2, |c| {
            let mut tl = Timeline::new(c.rank());
            c.enable_tracing(true);
            let t0 = Instant::now();
            let mut grads = vec![1.0f32; 100_000];
            tl.record("backward", "compute", 1, t0);
            c.all_reduce(&mut grads, ReduceOp::Avg)?;
            tl.add_comm(c.trace_epoch(), &c.take_trace(), 1);
            Ok::<_, brigade_comm::CommError>(tl.to_json())
        })
        .unwrap();
        for (rank, v) in traces.iter().enumerate() {
            let ev = v["traceEvents"].as_array().unwrap();
            assert_eq!(ev.len(), 2);
            let (compute, comm) = (&ev[0], &ev[1]);
            assert_eq!(comm["name"], "all_reduce");
            assert_eq!(comm["cat"], "comm");
            assert_eq!(comm["tid"], rank);
            assert_eq!(comm["args"]["bytes"], 400_000);
            assert_eq!(comm["args"]["algorithm"], "direct");
            // the all-reduce started after the backward span did
            assert!(comm["ts"].as_f64().unwrap() >= compute["ts"].as_f64().unwrap());
        }
    }
}
