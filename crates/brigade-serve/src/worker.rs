//! The engine thread: owns the [`Engine`], takes requests and aborts from the HTTP handlers
//! over a channel, steps while there is work, and sends each sequence its tokens. A handler
//! that goes away (its client disconnected) drops its receiver; the thread sees the closed
//! channel and aborts the sequence, so its KV blocks are free at the next step.

use crate::engine::{Engine, Output, Request};
use crate::metrics::Metrics;
use std::collections::HashMap;
use std::sync::mpsc;
use tokio::sync::mpsc::UnboundedSender;

enum Cmd {
    Add(Request, UnboundedSender<Result<Output, String>>),
    Abort(u64),
    Stop,
}

/// How handlers reach the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Cmd>,
}

impl EngineHandle {
    /// Starts the engine on its own thread, its products on a pool of `threads`.
    pub fn start(engine: Engine, threads: usize, metrics: Metrics) -> (EngineHandle, std::thread::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel();
        let join = std::thread::Builder::new()
            .name("brigade-engine".into())
            .spawn(move || {
                brigade::with_threads(threads, || run(engine, rx, metrics)).expect("engine thread pool");
            })
            .expect("spawn the engine thread");
        (EngineHandle { tx }, join)
    }

    /// Queues a request; its tokens (or an error) arrive on `out`.
    pub fn add(&self, r: Request, out: UnboundedSender<Result<Output, String>>) {
        let _ = self.tx.send(Cmd::Add(r, out));
    }

    pub fn abort(&self, id: u64) {
        let _ = self.tx.send(Cmd::Abort(id));
    }

    /// Ends the engine thread once it has taken the commands before this one.
    pub fn stop(&self) {
        let _ = self.tx.send(Cmd::Stop);
    }
}

fn run(mut engine: Engine, rx: mpsc::Receiver<Cmd>, metrics: Metrics) {
    let mut outs: HashMap<u64, UnboundedSender<Result<Output, String>>> = HashMap::new();
    let mut hits = engine.kv.hits;
    let mut preemptions = 0;
    metrics.kv_blocks_total.set(engine.kv.total_blocks() as i64);
    loop {
        // wait for work when idle; otherwise take what has come in and step
        let mut cmds: Vec<Cmd> = Vec::new();
        if !engine.has_work() {
            match rx.recv() {
                Ok(c) => cmds.push(c),
                Err(_) => return,
            }
        }
        cmds.extend(rx.try_iter());
        for c in cmds {
            match c {
                Cmd::Add(r, out) => {
                    let id = r.id;
                    match engine.add(r) {
                        Ok(()) => {
                            outs.insert(id, out);
                        }
                        Err(e) => {
                            let _ = out.send(Err(e));
                        }
                    }
                }
                Cmd::Abort(id) => {
                    engine.abort(id);
                    outs.remove(&id);
                }
                Cmd::Stop => return,
            }
        }
        // clients that went away before their next token
        let gone: Vec<u64> = outs.iter().filter(|(_, o)| o.is_closed()).map(|(&id, _)| id).collect();
        for id in gone {
            engine.abort(id);
            outs.remove(&id);
        }
        for o in engine.step() {
            let (id, done) = (o.id, o.finished.is_some());
            let sent = outs.get(&o.id).is_some_and(|tx| tx.send(Ok(o)).is_ok());
            if !sent && !done {
                engine.abort(id);
            }
            if done || !sent {
                outs.remove(&id);
            }
        }
        metrics.generated_tokens.inc_by(engine.stats.generated - metrics.generated_tokens.get());
        metrics.prefix_cache_hits.inc_by(engine.kv.hits - hits);
        hits = engine.kv.hits;
        metrics.preemptions.inc_by(engine.stats.preemptions - preemptions);
        preemptions = engine.stats.preemptions;
        metrics.running.set(engine.running() as i64);
        metrics.waiting.set(engine.waiting() as i64);
        metrics.kv_blocks_used.set(engine.kv.used_blocks() as i64);
    }
}
