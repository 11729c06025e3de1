//! The engine thread: owns the [`Engine`], takes requests and aborts from the HTTP handlers
//! (and programs) over a channel, steps while there is work, and sends each sequence its tokens. A handler
//! that goes away (its client disconnected) drops its receiver; the thread sees the closed
//! channel and aborts the sequence, so its KV blocks are free at the next step.

use super::profile::StepProfile;
use super::request::{Admit, Output, Refused, Request};
use super::scheduler::Limits;
use super::step::Engine;
use crate::metrics::Metrics;
use crate::model::weights::WeightFormat;
use crate::model::{KvDtype, KvStore, Model, ShardError};
use brigade::models::Gpt;
use std::collections::HashMap;
use std::sync::{mpsc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc::UnboundedSender;

/// How the engine is set up: the cache and step limits, and the tensor-parallel degree.
#[derive(Clone, Debug)]
pub struct EngineSetup {
    pub kv_blocks: usize,
    pub block_size: usize,
    /// What the KV cache holds its numbers as (f32, or f16: half the memory).
    pub kv_dtype: KvDtype,
    pub limits: Limits,
    /// Ranks the model is sharded over (threads of this process).
    pub tp: usize,
    /// Pipeline stages the model's layers are cut into (threads, or processes); tp must be 1
    /// then.
    pub pp: usize,
    /// Context-parallel ranks each sequence's cache is striped over (threads, or processes);
    /// tp and pp must be 1 then.
    pub cp: usize,
    /// Threads for arithmetic, split evenly over the ranks.
    pub threads: usize,
    /// How the products' weights are held (f32 or 8 bits).
    pub weights: WeightFormat,
}

/// Why a rank of the tensor-parallel engine could not start.
#[derive(Debug, thiserror::Error)]
enum RankError {
    #[error(transparent)]
    Shard(#[from] ShardError),
    #[error(transparent)]
    Threads(#[from] brigade::Error),
}

enum Cmd {
    Add(Request, Admit, UnboundedSender<Result<Output, Refused>>),
    Abort(u64),
    Profile(tokio::sync::oneshot::Sender<StepProfile>),
    Stop,
}

/// How handlers reach the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Cmd>,
}

impl EngineHandle {
    /// Starts the engine on its own thread, its products on a pool of `threads`.
    fn start(engine: Engine, threads: usize, metrics: Metrics) -> (EngineHandle, std::thread::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel();
        let join = std::thread::Builder::new()
            .name("brigade-engine".into())
            .spawn(move || {
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    brigade::with_threads(threads, || run(engine, rx, metrics))
                }));
                if !matches!(ran, Ok(Ok(()))) {
                    // a server whose engine is gone must not keep accepting requests
                    eprintln!("error: the engine thread failed; stopping the server");
                    std::process::exit(1);
                }
            })
            .expect("spawn the engine thread");
        (EngineHandle { tx }, join)
    }

    /// Starts the engine for `gpt`: on one thread, or with `--tp N` (`--pp N`) on N rank threads
    /// of a local tensor-parallel group (pipeline) — rank 0 schedules and samples, every rank
    /// runs its share of each step.
    pub fn start_model(
        gpt: Gpt,
        params: Vec<f32>,
        setup: EngineSetup,
        metrics: Metrics,
    ) -> (EngineHandle, std::thread::JoinHandle<()>) {
        // rank 0's engine, which reports what it holds as every rank does
        let reporter = metrics.clone();
        let cfg = gpt.cfg;
        let engine_of = move |model: Model| {
            let engine = Engine::with_cache(model, (setup.kv_blocks, setup.block_size, setup.kv_dtype), setup.limits);
            say_pipeline(&cfg, &engine);
            reporter.engine_holds(engine.blocks().total, engine.model.weight_bytes().1);
            engine
        };
        let ranks = setup.tp * setup.pp * setup.cp;
        let per_rank = (setup.threads / ranks).max(1);
        if ranks == 1 {
            let model = Model::shard_as(&gpt, &params, None, setup.weights).expect("a single worker takes any model");
            let engine = engine_of(model);
            drop(params);
            return EngineHandle::start(engine, setup.threads, metrics);
        }
        let (tx, rx) = mpsc::channel();
        let rx = Mutex::new(Some(rx));
        // each rank says when its share is built: the engine is ready (and /ready says so)
        // only once every rank is
        let (built_tx, built_rx) = mpsc::channel::<()>();
        let join = std::thread::Builder::new()
            .name("brigade-tp".into())
            .spawn(move || {
                // an idle server waits on its followers for as long as it has no work
                let cfg = brigade_comm::local::LocalConfig {
                    timeout: Duration::from_secs(365 * 24 * 3600),
                    ..Default::default()
                };
                let res = brigade_comm::local::run_with(cfg, ranks, |comm| -> Result<(), RankError> {
                    let rank = comm.rank();
                    let model = rank_model(&gpt, &params, comm, (setup.pp, setup.cp), setup.weights.clone())?;
                    let built = built_tx.clone();
                    brigade::with_threads(per_rank, || {
                        if rank == 0 {
                            let rx = rx.lock().expect("one rank 0").take().expect("one rank 0");
                            let engine = engine_of(model);
                            let _ = built.send(());
                            drop(built);
                            run(engine, rx, metrics.clone());
                        } else {
                            let (layers, width) = (model.layers_n, model.kv_width());
                            let mut kv =
                                KvStore::with_dtype(setup.kv_blocks, setup.block_size, layers, width, setup.kv_dtype);
                            metrics.rank_holds(rank, kv.blocks(), model.weight_bytes().1);
                            let _ = built.send(());
                            drop(built);
                            while model.follow(&mut kv) {}
                        }
                    })?;
                    Ok(())
                });
                if let Err(e) = res {
                    eprintln!("error: the tensor-parallel engine failed: {e}");
                    std::process::exit(1);
                }
            })
            .expect("spawn the engine's rank threads");
        // (a rank that fails to build ends the process with its error instead)
        for _ in 0..ranks {
            if built_rx.recv().is_err() {
                break;
            }
        }
        (EngineHandle { tx }, join)
    }

    /// Starts the engine as rank 0 of a tensor-parallel group of processes (`comm`, MPI): this
    /// process's share of `gpt`, its engine thread scheduling and sampling, every step sent to
    /// the other ranks, which run [`follow_group`].
    pub fn start_on_group(
        gpt: Gpt,
        params: Vec<f32>,
        comm: brigade_comm::Comm,
        setup: EngineSetup,
        metrics: Metrics,
    ) -> Result<(EngineHandle, std::thread::JoinHandle<()>), ShardError> {
        let model = rank_model(&gpt, &params, comm, (setup.pp, setup.cp), setup.weights)?;
        drop(params);
        let engine = Engine::with_cache(model, (setup.kv_blocks, setup.block_size, setup.kv_dtype), setup.limits);
        say_pipeline(&gpt.cfg, &engine);
        metrics.engine_holds(engine.blocks().total, engine.model.weight_bytes().1);
        Ok(EngineHandle::start(engine, setup.threads, metrics))
    }

    /// Queues a request; its tokens (or an error) arrive on `out`.
    pub fn add(&self, r: Request, out: UnboundedSender<Result<Output, Refused>>) {
        self.add_with(r, Admit::default(), out);
    }

    /// Queues a request that shares a sibling's prompt or has its tokens given.
    pub fn add_with(&self, r: Request, admit: Admit, out: UnboundedSender<Result<Output, Refused>>) {
        let _ = self.tx.send(Cmd::Add(r, admit, out));
    }

    /// The engine's measured step times (measured at the first call, between two steps).
    pub async fn profile(&self) -> Option<StepProfile> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let _ = self.tx.send(Cmd::Profile(tx));
        rx.await.ok()
    }

    pub fn abort(&self, id: u64) {
        let _ = self.tx.send(Cmd::Abort(id));
    }

    /// Ends the engine thread once it has taken the commands before this one.
    pub fn stop(&self) {
        let _ = self.tx.send(Cmd::Stop);
    }
}

/// This rank's model in group `comm`: a pipeline stage (pp > 1), a context-parallel rank with
/// the whole model (cp > 1), or a tensor-parallel shard.
fn rank_model(
    gpt: &Gpt,
    params: &[f32],
    comm: brigade_comm::Comm,
    (pp, cp): (usize, usize),
    weights: WeightFormat,
) -> Result<Model, ShardError> {
    if pp > 1 {
        Model::stage_as(gpt, params, comm, weights)
    } else if cp > 1 {
        Model::context_as(gpt, params, comm, weights)
    } else {
        Model::shard_as(gpt, params, Some(comm), weights)
    }
}

/// One line on a pipelined engine: its stages' layers and the steps it keeps in flight.
fn say_pipeline(cfg: &brigade::models::GptConfig, engine: &Engine) {
    let stages = engine.model.stages();
    if stages > 1 {
        let cut: Vec<String> = (0..stages)
            .map(|s| {
                let r = crate::model::forward::stage_layers(cfg, stages, s);
                format!("{}..{}", r.start, r.end)
            })
            .collect();
        let lanes = engine.lanes();
        let short = if lanes < stages {
            " (a step per stage needs a whole context's KV blocks per stage: raise --kv-cache-mib for more)"
        } else {
            ""
        };
        eprintln!(
            "brigade serve: {stages} pipeline stages (layers {}), {lanes} steps in flight{short}",
            cut.join(", ")
        );
    }
}

fn run(engine: Engine, rx: mpsc::Receiver<Cmd>, metrics: Metrics) {
    let mut engine = serve_commands(engine, rx, metrics);
    // the steps still in the pipeline come back before the stages are told to stop
    engine.drain();
    engine.model.stop_followers();
}

fn serve_commands(mut engine: Engine, rx: mpsc::Receiver<Cmd>, metrics: Metrics) -> Engine {
    let mut outs: HashMap<u64, UnboundedSender<Result<Output, Refused>>> = HashMap::new();
    let mut hits = engine.blocks().hits;
    let mut preemptions = 0;
    loop {
        // wait for work when idle; otherwise take what has come in and step
        let mut cmds: Vec<Cmd> = Vec::new();
        if !engine.has_work() {
            match rx.recv() {
                Ok(c) => cmds.push(c),
                Err(_) => return engine,
            }
        }
        cmds.extend(rx.try_iter());
        for c in cmds {
            match c {
                Cmd::Add(r, admit, out) => {
                    let id = r.id;
                    match engine.add_with(r, admit) {
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
                Cmd::Profile(reply) => {
                    // measured one step at a time: the steps in the pipeline come back first
                    let out = engine.drain();
                    hand_out(&mut engine, &mut outs, out, &metrics, (&mut hits, &mut preemptions));
                    let _ = reply.send(engine.profile());
                }
                Cmd::Stop => return engine,
            }
        }
        // clients that went away before their next token
        let gone: Vec<u64> = outs.iter().filter(|(_, o)| o.is_closed()).map(|(&id, _)| id).collect();
        for id in gone {
            engine.abort(id);
            outs.remove(&id);
        }
        let out = engine.step();
        hand_out(&mut engine, &mut outs, out, &metrics, (&mut hits, &mut preemptions));
    }
}

/// A step's tokens to their handlers, the engine's state on the metrics before they go out (a
/// client holding its last token reads the blocks it held as free) and again after where a
/// handler gone in the meantime gave its blocks back.
fn hand_out(
    engine: &mut Engine,
    outs: &mut HashMap<u64, UnboundedSender<Result<Output, Refused>>>,
    out: Vec<Output>,
    metrics: &Metrics,
    counts: (&mut u64, &mut u64),
) {
    let (hits, preemptions) = counts;
    report(engine, metrics, (&mut *hits, &mut *preemptions));
    if deliver(engine, outs, out) {
        report(engine, metrics, (hits, preemptions));
    }
}

/// The engine's counts on the metrics (`hits`, `preemptions`: what the counters already hold).
fn report(engine: &Engine, metrics: &Metrics, (hits, preemptions): (&mut u64, &mut u64)) {
    let blocks = engine.blocks();
    metrics.generated_tokens.inc_by(engine.stats().generated - metrics.generated_tokens.get());
    metrics.prefix_cache_hits.inc_by(blocks.hits - *hits);
    *hits = blocks.hits;
    metrics.preemptions.inc_by(engine.stats().preemptions - *preemptions);
    *preemptions = engine.stats().preemptions;
    metrics.running.set(engine.running() as i64);
    metrics.waiting.set(engine.waiting() as i64);
    metrics.kv_blocks_used.set(blocks.used as i64);
}

/// Sends each token to its request's handler; a handler gone aborts its request. Whether any
/// was aborted.
fn deliver(
    engine: &mut Engine,
    outs: &mut HashMap<u64, UnboundedSender<Result<Output, Refused>>>,
    out: Vec<Output>,
) -> bool {
    let mut aborted = false;
    for o in out {
        let (id, done) = (o.id, o.finished.is_some());
        let sent = outs.get(&o.id).is_some_and(|tx| tx.send(Ok(o)).is_ok());
        if !sent && !done {
            engine.abort(id);
            aborted = true;
        }
        if done || !sent {
            outs.remove(&id);
        }
    }
    aborted
}

/// A rank other than 0 of a tensor-parallel group of processes: its share of `gpt` and its KV
/// cache (`kv_blocks` of `block_size` tokens, numbers of `dtype`), on `threads` threads,
/// running each step rank 0 sends until rank 0 stops.
pub fn follow_group(
    gpt: Gpt,
    params: Vec<f32>,
    comm: brigade_comm::Comm,
    ((kv_blocks, block_size, dtype), threads, weights): ((usize, usize, KvDtype), usize, WeightFormat),
    (pp, cp): (usize, usize),
) -> Result<(), crate::error::ServeError> {
    let model = rank_model(&gpt, &params, comm, (pp, cp), weights)
        .map_err(|e| crate::error::ServeError::Setting(e.to_string()))?;
    drop(params);
    let mut kv = KvStore::with_dtype(kv_blocks, block_size, model.layers_n, model.kv_width(), dtype);
    brigade::with_threads(threads, || while model.follow(&mut kv) {})
        .map_err(|e| crate::error::ServeError::Setting(e.to_string()))?;
    Ok(())
}
