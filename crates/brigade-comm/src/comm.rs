//! `Comm`: the public face of a backend — argument checks, tracing, and asynchronous
//! operations run in order on a per-communicator worker thread.

use crate::chunks::chunk_range;
use crate::error::{CommError, Result};
use crate::trace::{TraceEvent, Tracer};
use crate::ReduceOp;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// What a backend implements. Each collective returns the name of the algorithm it ran.
pub trait Backend: Send + Sync {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    fn all_reduce(&self, buf: &mut [f32], op: ReduceOp) -> Result<&'static str>;
    /// `output` is this rank's chunk (`chunk_range(input.len(), size, rank)`) of the reduction.
    fn reduce_scatter(&self, input: &[f32], output: &mut [f32], op: ReduceOp) -> Result<&'static str>;
    /// `input` is this rank's chunk of `output`.
    fn all_gather(&self, input: &[f32], output: &mut [f32]) -> Result<&'static str>;
    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<&'static str>;
    /// Rank r sends `input`'s consecutive pieces of `send[s]` elements to each rank s (itself
    /// included) and receives `recv[s]` from each into `output`, in rank order; every rank's
    /// `send[s]` must equal rank s's `recv[r]` (checked on every rank alike).
    fn all_to_all_v(&self, input: &[f32], send: &[usize], output: &mut [f32], recv: &[usize]) -> Result<&'static str>;
    fn send(&self, buf: &[f32], dst: usize, tag: u32) -> Result<()>;
    fn recv(&self, buf: &mut [f32], src: usize, tag: u32) -> Result<()>;
    fn barrier(&self) -> Result<()>;
    fn split(&self, color: u32, key: u32) -> Result<Box<dyn Backend>>;
}

type Job = Box<dyn FnOnce(&Inner) + Send>;

struct Inner {
    backend: Box<dyn Backend>,
    tracer: Tracer,
    /// Operations run one at a time: blocking calls from the owner, queued ones on the worker.
    run_lock: Mutex<()>,
    pending: Mutex<usize>,
    /// `pending`, readable without the lock.
    queued: std::sync::atomic::AtomicUsize,
    idle: Condvar,
}

impl Inner {
    fn traced<R>(&self, op: &'static str, bytes: usize, f: impl FnOnce() -> Result<(R, &'static str)>) -> Result<R> {
        let _g = self.run_lock.lock().unwrap_or_else(|p| p.into_inner());
        let t0 = self.tracer.start();
        let (r, algo) = f()?;
        if let Some(t0) = t0 {
            self.tracer.record(op, bytes, t0, algo);
        }
        Ok(r)
    }
}

/// One rank's communicator over a group.
pub struct Comm {
    inner: Arc<Inner>,
    queue: Mutex<Option<(Sender<Job>, JoinHandle<()>)>>,
}

/// An operation in flight; `wait` returns its result (and the buffer it took).
pub struct Handle<T> {
    rx: Receiver<Result<T>>,
}

impl<T> Handle<T> {
    pub fn wait(self) -> Result<T> {
        self.rx.recv().unwrap_or_else(|_| Err(CommError::Backend("communicator worker stopped".into())))
    }
}

const F32: usize = std::mem::size_of::<f32>();

impl Comm {
    pub fn new(backend: Box<dyn Backend>) -> Comm {
        let inner = Inner {
            backend,
            tracer: Tracer::default(),
            run_lock: Mutex::new(()),
            pending: Mutex::new(0),
            queued: std::sync::atomic::AtomicUsize::new(0),
            idle: Condvar::new(),
        };
        Comm { inner: Arc::new(inner), queue: Mutex::new(None) }
    }

    pub fn rank(&self) -> usize {
        self.inner.backend.rank()
    }

    pub fn size(&self) -> usize {
        self.inner.backend.size()
    }

    /// Records every call from now on (see [`Comm::take_trace`]).
    pub fn enable_tracing(&self, on: bool) {
        self.inner.tracer.enable(on);
    }

    /// Returns and clears the recorded calls; their times count from [`Comm::trace_epoch`].
    pub fn take_trace(&self) -> Vec<TraceEvent> {
        self.inner.tracer.take()
    }

    pub fn trace_epoch(&self) -> std::time::Instant {
        self.inner.tracer.epoch()
    }

    /// Blocking calls first wait for this communicator's queued asynchronous ones, so that
    /// every rank issues its operations in program order.
    fn drain(&self) {
        // the common case, nothing queued, without the lock
        if self.inner.queued.load(std::sync::atomic::Ordering::Acquire) == 0 {
            return;
        }
        let mut p = self.inner.pending.lock().unwrap_or_else(|p| p.into_inner());
        while *p > 0 {
            p = self.inner.idle.wait(p).unwrap_or_else(|p| p.into_inner());
        }
    }

    pub fn all_reduce(&self, buf: &mut [f32], op: ReduceOp) -> Result<()> {
        self.drain();
        all_reduce(&self.inner, buf, op)
    }

    pub fn reduce_scatter(&self, input: &[f32], output: &mut [f32], op: ReduceOp) -> Result<()> {
        self.drain();
        reduce_scatter(&self.inner, input, output, op)
    }

    pub fn all_gather(&self, input: &[f32], output: &mut [f32]) -> Result<()> {
        self.drain();
        all_gather(&self.inner, input, output)
    }

    pub fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<()> {
        self.drain();
        if root >= self.size() {
            return Err(CommError::Invalid {
                op: "broadcast",
                detail: format!("root {root} outside a group of {}", self.size()),
            });
        }
        let b = &self.inner.backend;
        self.inner.traced("broadcast", buf.len() * F32, || Ok(((), b.broadcast(buf, root)?)))
    }

    /// Each rank sends `input`, cut into consecutive pieces of `send[s]` elements, to every rank
    /// s (itself included), and receives `recv[s]` elements from each into `output`, in rank
    /// order: the exchange of a mixture of experts' dispatch, whose sizes differ by rank and by
    /// step. Sizes that disagree (a rank sending a count its peer does not expect) fail on every
    /// rank with one message naming both; a rank that never comes is named after the timeout.
    pub fn all_to_all_v(&self, input: &[f32], send: &[usize], output: &mut [f32], recv: &[usize]) -> Result<()> {
        self.drain();
        let n = self.size();
        let bad = |detail: String| Err(CommError::Invalid { op: "all_to_all_v", detail });
        if send.len() != n || recv.len() != n {
            return bad(format!("{} send and {} receive counts for a group of {n}", send.len(), recv.len()));
        }
        let (s, r): (usize, usize) = (send.iter().sum(), recv.iter().sum());
        if s != input.len() || r != output.len() {
            return bad(format!(
                "counts sum to {s} sent and {r} received, but the input holds {} and the output {}",
                input.len(),
                output.len()
            ));
        }
        let b = &self.inner.backend;
        self.inner.traced("all_to_all_v", (s + r) * F32, || Ok(((), b.all_to_all_v(input, send, output, recv)?)))
    }

    /// What each rank will send this one: `send[s]` to rank s becomes the result's entry for
    /// s on rank s — the counts exchange before an `all_to_all_v`.
    pub fn all_to_all_counts(&self, send: &[usize]) -> Result<Vec<usize>> {
        let n = self.size();
        if send.len() != n {
            return Err(CommError::Invalid {
                op: "all_to_all_v",
                detail: format!("{} counts for a group of {n}", send.len()),
            });
        }
        // each count as two exact f32 halves of 16 bits (counts up to 2³²)
        let input: Vec<f32> = send.iter().flat_map(|&c| [(c >> 16) as f32, (c & 0xffff) as f32]).collect();
        let mut out = vec![0f32; 2 * n];
        self.all_to_all_v(&input, &vec![2; n], &mut out, &vec![2; n])?;
        Ok(out.chunks_exact(2).map(|h| ((h[0] as usize) << 16) | h[1] as usize).collect())
    }

    pub fn send(&self, buf: &[f32], dst: usize, tag: u32) -> Result<()> {
        self.drain();
        self.check_peer("send", dst)?;
        let b = &self.inner.backend;
        self.inner.traced("send", buf.len() * F32, || Ok((b.send(buf, dst, tag)?, "p2p")))
    }

    pub fn recv(&self, buf: &mut [f32], src: usize, tag: u32) -> Result<()> {
        self.drain();
        self.check_peer("recv", src)?;
        let b = &self.inner.backend;
        self.inner.traced("recv", buf.len() * F32, || Ok((b.recv(buf, src, tag)?, "p2p")))
    }

    pub fn barrier(&self) -> Result<()> {
        self.drain();
        let b = &self.inner.backend;
        self.inner.traced("barrier", 0, || Ok((b.barrier()?, "barrier")))
    }

    /// Splits the group: ranks passing the same `color` form a new group, ordered by `key`
    /// (then by rank). Every rank of this group must call it.
    pub fn split(&self, color: u32, key: u32) -> Result<Comm> {
        self.drain();
        let b = &self.inner.backend;
        let nb = self.inner.traced("split", 0, || Ok((b.split(color, key)?, "split")))?;
        Ok(Comm::new(nb))
    }

    fn check_peer(&self, op: &'static str, peer: usize) -> Result<()> {
        if peer >= self.size() || peer == self.rank() {
            return Err(CommError::Invalid {
                op,
                detail: format!(
                    "peer {peer} must be another rank of this group of {} (this is rank {})",
                    self.size(),
                    self.rank()
                ),
            });
        }
        Ok(())
    }

    fn enqueue<T: Send + 'static>(&self, job: impl FnOnce(&Inner) -> Result<T> + Send + 'static) -> Handle<T> {
        let (tx, rx) = channel();
        *self.inner.pending.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        self.inner.queued.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let wrapped: Job = Box::new(move |inner: &Inner| {
            let r = job(inner);
            let _ = tx.send(r);
            let mut p = inner.pending.lock().unwrap_or_else(|p| p.into_inner());
            *p -= 1;
            inner.queued.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
            inner.idle.notify_all();
        });
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let (sender, _) = q.get_or_insert_with(|| {
            let (s, r) = channel::<Job>();
            let inner = self.inner.clone();
            let h = std::thread::Builder::new()
                .name(format!("comm-async-r{}", self.rank()))
                .spawn(move || {
                    for job in r {
                        job(&inner);
                    }
                })
                .expect("spawn the communicator's worker thread");
            (s, h)
        });
        sender.send(wrapped).expect("worker alive while the Comm exists");
        Handle { rx }
    }

    /// Starts an all-reduce of `buf`, which comes back from `wait`.
    pub fn all_reduce_async(&self, mut buf: Vec<f32>, op: ReduceOp) -> Handle<Vec<f32>> {
        self.enqueue(move |inner| all_reduce(inner, &mut buf, op).map(|_| buf))
    }

    /// Starts a reduce-scatter of `input`; `wait` returns this rank's chunk.
    pub fn reduce_scatter_async(&self, input: Vec<f32>, op: ReduceOp) -> Handle<Vec<f32>> {
        let (rank, size) = (self.rank(), self.size());
        self.enqueue(move |inner| {
            let mut out = vec![0.0; chunk_range(input.len(), size, rank).len()];
            reduce_scatter(inner, &input, &mut out, op).map(|_| out)
        })
    }

    /// Starts an all-gather of this rank's chunk of a `total`-element buffer.
    pub fn all_gather_async(&self, input: Vec<f32>, total: usize) -> Handle<Vec<f32>> {
        self.enqueue(move |inner| {
            let mut out = vec![0.0; total];
            all_gather(inner, &input, &mut out).map(|_| out)
        })
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        let q = self.queue.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((sender, handle)) = q {
            drop(sender);
            let _ = handle.join();
        }
    }
}

fn all_reduce(inner: &Inner, buf: &mut [f32], op: ReduceOp) -> Result<()> {
    let b = &inner.backend;
    inner.traced("all_reduce", buf.len() * F32, || Ok(((), b.all_reduce(buf, op)?)))
}

fn reduce_scatter(inner: &Inner, input: &[f32], output: &mut [f32], op: ReduceOp) -> Result<()> {
    let (rank, size) = (inner.backend.rank(), inner.backend.size());
    let want = chunk_range(input.len(), size, rank).len();
    if output.len() != want {
        return Err(CommError::Invalid {
            op: "reduce_scatter",
            detail: format!(
                "rank {rank} gets {want} of {} elements, but its output holds {}",
                input.len(),
                output.len()
            ),
        });
    }
    let b = &inner.backend;
    inner.traced("reduce_scatter", input.len() * F32, || Ok(((), b.reduce_scatter(input, output, op)?)))
}

fn all_gather(inner: &Inner, input: &[f32], output: &mut [f32]) -> Result<()> {
    let (rank, size) = (inner.backend.rank(), inner.backend.size());
    let want = chunk_range(output.len(), size, rank).len();
    if input.len() != want {
        return Err(CommError::Invalid {
            op: "all_gather",
            detail: format!(
                "rank {rank} contributes {want} of {} elements, but its input holds {}",
                output.len(),
                input.len()
            ),
        });
    }
    let b = &inner.backend;
    inner.traced("all_gather", output.len() * F32, || Ok(((), b.all_gather(input, output)?)))
}
