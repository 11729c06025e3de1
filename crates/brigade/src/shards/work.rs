//! A sharded job on one rank of a group (threads of this process, or MPI ranks): rank 0 scans
//! the corpus and readies the output directory, every rank then takes shards one at a time (a
//! claim file each, so threads, ranks and machines sharing the directory never take the same
//! one), and rank 0 writes the manifest once all are in. What a shard becomes is the [`Task`]'s.

use super::dir::Start;
use super::input::{self, Doc, Index, InputSpec, ShardSpan};
use crate::{Error, Result};
use brigade_comm::Comm;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// What a job does with its shards.
pub trait Task: Sync {
    /// Everything that decides the output (sent from rank 0 to every rank).
    type Job: Serialize + DeserializeOwned + Sync;
    type Manifest;
    /// Rank 0: the job for this scanned input, and the output directory readied for it.
    fn prepare(&self, index: &Index) -> Result<(Self::Job, Start)>;
    /// Takes shard `i` for this worker: false when another has it or it is finished.
    fn claim(&self, i: usize) -> Result<bool>;
    /// Turns shard `span`'s documents into its output and commits it; returns its tokens.
    fn shard(&self, job: &Self::Job, span: &ShardSpan, docs: Vec<Doc>, progress: &dyn Progress) -> Result<u64>;
    /// Rank 0, once every shard is committed: the final manifest.
    fn finish(&self, job: &Self::Job, index: &Index) -> Result<Self::Manifest>;
    /// Rank 0, when the directory already held this job's complete output.
    fn complete(&self) -> Result<Self::Manifest>;
    /// What the job does to a document, for the interrupt message ("embed").
    fn verb(&self) -> &'static str;
}

/// How the workers run.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    /// Documents per shard.
    pub shard_size: usize,
    /// Threads of each worker (its own rayon pool).
    pub threads: usize,
    /// Set (by a signal handler) to stop taking shards: the ones in progress are finished and
    /// kept, the job ends with [`Error::Interrupted`] and a rerun resumes it.
    pub stop: Option<Arc<AtomicBool>>,
}

/// What a worker did.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct WorkerStats {
    pub rank: usize,
    pub shards: usize,
    pub documents: u64,
    pub tokens: u64,
    /// Seconds spent reading, working on and writing shards.
    pub busy_s: f64,
    /// Stopped taking shards on an interrupt.
    #[serde(default)]
    pub stopped: bool,
}

/// The job's result, on rank 0.
#[derive(Debug)]
pub struct Report<M> {
    pub manifest: M,
    pub workers: Vec<WorkerStats>,
    /// The directory already held this job's complete output.
    pub already_complete: bool,
    /// Shards finished by an earlier run and kept.
    pub resumed_shards: usize,
    pub wall_s: f64,
}

/// Told what happens, to draw a progress bar (rank 0's only under MPI).
pub trait Progress: Sync {
    /// `total` documents in the job, `done` of them in shards finished by earlier runs.
    fn start(&self, _total: u64, _done: u64) {}
    /// `n` more documents done by this process.
    fn documents(&self, _n: u64) {}
}

pub struct NoProgress;
impl Progress for NoProgress {}

/// What rank 0 tells the others after its scan.
#[derive(Serialize, Deserialize)]
#[serde(bound = "J: Serialize + DeserializeOwned")]
struct Plan<J> {
    index: Index,
    job: J,
    done: Vec<usize>,
    complete: bool,
}

/// Runs the job as this rank over the input `spec`, writing into `out`. Every rank returns `Ok`
/// or the same error; rank 0's `Ok` holds the report.
pub fn run<T: Task>(
    comm: &Comm,
    spec: &InputSpec,
    task: &T,
    out: &Path,
    s: &Settings,
    progress: &dyn Progress,
) -> Result<Option<Report<T::Manifest>>> {
    let t0 = Instant::now();
    // this worker's allocations are counted as its own (workers as threads of one process
    // would otherwise share one counter, and every allocation would wait for the other's)
    crate::alloc::set_rank(Some(comm.rank()));
    let msg = if comm.rank() == 0 {
        let p = plan(spec, task, s).map_err(|e| e.to_string());
        Some(serde_json::to_vec(&p).expect("plans serialise"))
    } else {
        None
    };
    let bytes = broadcast_bytes(comm, msg)?;
    let p: std::result::Result<Plan<T::Job>, String> =
        serde_json::from_slice(&bytes).map_err(|e| Error::Data(format!("rank 0 sent an unreadable plan ({e})")))?;
    let p = p.map_err(Error::Relayed)?;
    if comm.rank() == 0 {
        let done_docs: u64 = p.done.iter().map(|&i| p.index.shards[i].count as u64).sum();
        progress.start(p.index.documents, done_docs);
    }
    let mut mine = WorkerStats { rank: comm.rank(), ..WorkerStats::default() };
    if !p.complete {
        crate::with_threads(s.threads, || work(&p, spec, task, s, progress, &mut mine))??;
    }
    let all = all_gather_bytes(comm, serde_json::to_vec(&mine).expect("stats serialise"))?;
    let workers: Vec<WorkerStats> = all.iter().filter_map(|b| serde_json::from_slice(b).ok()).collect();
    if workers.iter().any(|w| w.stopped) {
        // every rank sees the same stats, so every rank ends alike
        let done = p.done.len() + workers.iter().map(|w| w.shards).sum::<usize>();
        return Err(Error::Interrupted(format!(
            "interrupted: {done} of {} shards are complete in {}; run the same command again to {} the rest",
            p.index.shards.len(),
            out.display(),
            task.verb()
        )));
    }
    if comm.rank() != 0 {
        return Ok(None);
    }
    let manifest = if p.complete { task.complete()? } else { task.finish(&p.job, &p.index)? };
    Ok(Some(Report {
        manifest,
        workers,
        already_complete: p.complete,
        resumed_shards: p.done.len(),
        wall_s: t0.elapsed().as_secs_f64(),
    }))
}

fn plan<T: Task>(spec: &InputSpec, task: &T, s: &Settings) -> Result<Plan<T::Job>> {
    let index = input::scan(spec, s.shard_size)?;
    let (job, start) = task.prepare(&index)?;
    let (done, complete) = match start {
        Start::Complete => ((0..index.shards.len()).collect(), true),
        Start::Run { done } => (done, false),
    };
    Ok(Plan { index, job, done, complete })
}

/// Takes shards until none is left.
fn work<T: Task>(
    p: &Plan<T::Job>,
    spec: &InputSpec,
    task: &T,
    s: &Settings,
    progress: &dyn Progress,
    st: &mut WorkerStats,
) -> Result<()> {
    let mut done = vec![false; p.index.shards.len()];
    p.done.iter().for_each(|&i| {
        if let Some(d) = done.get_mut(i) {
            *d = true;
        }
    });
    for shard in &p.index.shards {
        if s.stop.as_ref().is_some_and(|f| f.load(Ordering::SeqCst)) {
            st.stopped = true;
            break;
        }
        if done[shard.index] || !task.claim(shard.index)? {
            continue;
        }
        let t = Instant::now();
        let docs = input::read_shard(spec, &p.index, shard)?;
        let n = docs.len() as u64;
        st.tokens += task.shard(&p.job, shard, docs, progress)?;
        st.shards += 1;
        st.documents += n;
        st.busy_s += t.elapsed().as_secs_f64();
    }
    Ok(())
}

/// Bytes as f32 words (the communicator moves f32; these are copied, never added).
fn to_words(b: &[u8]) -> Vec<f32> {
    b.chunks(4)
        .map(|c| {
            let mut w = [0u8; 4];
            w[..c.len()].copy_from_slice(c);
            f32::from_bits(u32::from_le_bytes(w))
        })
        .collect()
}

fn from_words(w: &[f32], len: usize) -> Vec<u8> {
    let mut b: Vec<u8> = w.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect();
    b.truncate(len);
    b
}

fn comm_err(e: brigade_comm::CommError) -> Error {
    Error::Data(format!("communication failed: {e}"))
}

/// Rank 0's bytes to every rank.
fn broadcast_bytes(comm: &Comm, mine: Option<Vec<u8>>) -> Result<Vec<u8>> {
    let mut len = [f32::from_bits(mine.as_ref().map_or(0, |b| b.len() as u32))];
    comm.broadcast(&mut len, 0).map_err(comm_err)?;
    let n = len[0].to_bits() as usize;
    let mut words = match mine {
        Some(b) => to_words(&b),
        None => vec![0f32; n.div_ceil(4)],
    };
    comm.broadcast(&mut words, 0).map_err(comm_err)?;
    Ok(from_words(&words, n))
}

/// Every rank's bytes, in rank order, to every rank.
fn all_gather_bytes(comm: &Comm, mine: Vec<u8>) -> Result<Vec<Vec<u8>>> {
    let size = comm.size();
    let mut lens = vec![0f32; size];
    comm.all_gather(&[f32::from_bits(mine.len() as u32)], &mut lens).map_err(comm_err)?;
    let lens: Vec<usize> = lens.iter().map(|l| l.to_bits() as usize).collect();
    let words = lens.iter().max().unwrap().div_ceil(4);
    let mut padded = to_words(&mine);
    padded.resize(words, 0.0);
    let mut all = vec![0f32; words * size];
    comm.all_gather(&padded, &mut all).map_err(comm_err)?;
    Ok(all.chunks(words.max(1)).zip(&lens).map(|(w, &l)| from_words(w, l)).collect())
}
