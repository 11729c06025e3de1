//! Backend `mpi` (cargo feature `mpi`): each process is one rank, launched by `mpirun -n N`
//! (or `srun`), over the system's MPI through the `mpi` crate. This is how brigade runs
//! across machines; the launcher and transport are MPI's, not ours.
//!
//! Before each collective the ranks exchange a descriptor (call number, operation, length,
//! argument) with a non-blocking all-gather, so mismatched calls fail on every rank with the
//! same message as on `local`. A rank that does not arrive within the timeout makes the waiting
//! ranks print the error and abort the MPI job (MPI cannot cancel a collective, and it does not
//! say which ranks are missing); a rank that exits with an error aborts the job the same way.

use crate::chunks::chunk_range;
use crate::comm::Backend;
use crate::error::{describe_call, mismatch, CommError, Result};
use crate::ReduceOp;
use mpi::collective::SystemOperation;
use mpi::datatype::PartitionMut;
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

pub const ALGO_MPI: &str = "mpi";

static UNIVERSE: OnceLock<Mutex<Option<mpi::environment::Universe>>> = OnceLock::new();

/// Initialises MPI once per process (with full thread support, for async operations) and
/// returns this process's communicator over all ranks.
pub fn world(timeout: Duration) -> Result<MpiBackend> {
    let cell = UNIVERSE.get_or_init(|| Mutex::new(None));
    let mut g = cell.lock().unwrap_or_else(|p| p.into_inner());
    if g.is_none() {
        let (u, level) = mpi::initialize_with_threading(mpi::Threading::Multiple)
            .ok_or_else(|| CommError::Backend("MPI was already initialised by someone else".into()))?;
        if level < mpi::Threading::Multiple {
            return Err(CommError::Backend(format!(
                "this MPI library offers thread level {level:?}; brigade needs MPI_THREAD_MULTIPLE (async operations and sub-groups call MPI from several threads)"
            )));
        }
        *g = Some(u);
    }
    let w = g.as_ref().expect("initialised above").world();
    Ok(MpiBackend::new(w, timeout, true))
}

/// Ends MPI; call once, after the last communicator is gone.
pub fn finalize() {
    if let Some(cell) = UNIVERSE.get() {
        cell.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

/// How a wait for the other ranks ended.
enum Wait {
    Done,
    TimedOut,
    Orphaned,
}

fn parent_pid() -> u32 {
    std::os::unix::process::parent_id()
}

/// Polls `done` until it says so: spinning while a peer is about to arrive, then sleeping
/// between tests so that a rank that waits long (an idle server's followers) does not burn its
/// core; gives up after `timeout`, or when the launcher (mpirun) is gone and left this rank
/// orphaned.
fn wait_politely(timeout: Duration, mut done: impl FnMut() -> bool) -> Wait {
    let start = Instant::now();
    let parent = parent_pid();
    let mut checked_parent = start;
    loop {
        if done() {
            return Wait::Done;
        }
        let waited = start.elapsed();
        if waited > timeout {
            return Wait::TimedOut;
        }
        if waited < Duration::from_millis(2) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(if waited < Duration::from_millis(200) {
                Duration::from_micros(50)
            } else {
                Duration::from_micros(500)
            });
        }
        if checked_parent.elapsed() > Duration::from_secs(1) {
            checked_parent = Instant::now();
            if parent_pid() != parent {
                return Wait::Orphaned;
            }
        }
    }
}

/// Ends a rank whose launcher is gone.
fn exit_orphaned(rank: i32) -> ! {
    eprintln!("error: rank {rank}: the process that launched this rank (mpirun) is gone; exiting");
    std::process::exit(1)
}

pub struct MpiBackend {
    comm: SimpleCommunicator,
    /// Sends in flight with the copies they read from: a send returns at once, as on `local`
    /// (a ring of blocking sends would deadlock once messages outgrow MPI's eager limit).
    sends: Mutex<Vec<(mpi::ffi::MPI_Request, Vec<f32>)>>,
    seq: AtomicU64,
    timeout: Duration,
    /// Exchange descriptors before each collective (off only to measure MPI itself).
    checked: bool,
}

fn op_code(op: ReduceOp) -> u64 {
    op as u64
}

fn mpi_op(op: ReduceOp) -> SystemOperation {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => SystemOperation::sum(),
        ReduceOp::Max => SystemOperation::max(),
    }
}

const OPS: [&str; 8] =
    ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier", "split", "all_to_all_v", "?"];

impl MpiBackend {
    fn new(comm: SimpleCommunicator, timeout: Duration, checked: bool) -> MpiBackend {
        MpiBackend { comm, sends: Mutex::new(Vec::new()), seq: AtomicU64::new(0), timeout, checked }
    }

    /// Turns the descriptor exchange off (or on): `brigade bench comm` measures MPI's own
    /// collectives without it.
    pub fn set_checked(&mut self, on: bool) {
        self.checked = on;
    }

    fn fail(&self, e: CommError) -> ! {
        eprintln!("error: rank {}: {e}; aborting the MPI job", self.comm.rank());
        self.comm.abort(1)
    }

    fn check(&self, op: &'static str, len: usize, arg: u64) -> Result<()> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        if !self.checked {
            return Ok(());
        }
        let code = OPS.iter().position(|&o| o == op).unwrap_or(OPS.len() - 1) as u64;
        let mine = [seq, code, len as u64, arg];
        let n = self.comm.size() as usize;
        let mut all = vec![0u64; 4 * n];
        let start = Instant::now();
        let waited = mpi::request::scope(|scope| {
            let mut req = Some(self.comm.immediate_all_gather_into(scope, &mine[..], &mut all[..]));
            wait_politely(self.timeout, || match req.take().expect("tested until done").test() {
                Ok(_) => true,
                Err(r) => {
                    req = Some(r);
                    false
                }
            })
        });
        match waited {
            Wait::Done => {}
            // The request still references our buffers: the job cannot continue.
            Wait::TimedOut => self.fail(CommError::Timeout { op, seq, len, waited: start.elapsed(), missing: vec![] }),
            Wait::Orphaned => exit_orphaned(self.comm.rank()),
        }
        let descs: Vec<&[u64]> = all.chunks(4).collect();
        if descs.iter().all(|d| *d == mine) {
            return Ok(());
        }
        let calls: Vec<String> =
            descs.iter().map(|d| describe_call(OPS[(d[1] as usize).min(OPS.len() - 1)], d[2] as usize, d[3])).collect();
        Err(mismatch(seq, &calls))
    }

    /// MPI's own out-of-place all-reduce, what the benchmark measures as the baseline.
    pub fn all_reduce_out_of_place(&self, send: &[f32], recv: &mut [f32], op: ReduceOp) -> Result<()> {
        self.check("all_reduce", send.len(), op_code(op))?;
        self.comm.all_reduce_into(send, recv, mpi_op(op));
        if op == ReduceOp::Avg {
            let s = 1.0 / self.comm.size() as f32;
            recv.iter_mut().for_each(|x| *x *= s);
        }
        Ok(())
    }

    /// MPI's own `MPI_Alltoallv`, without the counts check: what the benchmark measures as the
    /// baseline.
    pub fn all_to_all_v_raw(&self, input: &[f32], send: &[usize], output: &mut [f32], recv: &[usize]) -> Result<()> {
        let part = |c: &[usize]| -> (Vec<i32>, Vec<i32>) {
            let counts: Vec<i32> = c.iter().map(|&x| x as i32).collect();
            let mut at = 0i32;
            let displs: Vec<i32> = c
                .iter()
                .map(|&x| {
                    let d = at;
                    at += x as i32;
                    d
                })
                .collect();
            (counts, displs)
        };
        let ((sc, sd), (rc, rd)) = (part(send), part(recv));
        let sendp = mpi::datatype::Partition::new(input, &sc[..], &sd[..]);
        let mut recvp = PartitionMut::new(output, &rc[..], &rd[..]);
        self.comm.all_to_all_varcount_into(&sendp, &mut recvp);
        Ok(())
    }

    /// Forgets sends that have completed.
    fn reap_sends(&self, wait: bool) {
        let mut sends = self.sends.lock().unwrap_or_else(|p| p.into_inner());
        sends.retain_mut(|(req, _)| {
            let mut done = 0;
            // SAFETY: `req` is a live request from MPI_Isend whose buffer we still own.
            unsafe {
                if wait {
                    mpi::ffi::MPI_Wait(req, mpi::ffi::RSMPI_STATUS_IGNORE);
                    done = 1;
                } else {
                    mpi::ffi::MPI_Test(req, &mut done, mpi::ffi::RSMPI_STATUS_IGNORE);
                }
            }
            done == 0
        });
    }

    fn counts(&self, n: usize) -> (Vec<i32>, Vec<i32>) {
        let size = self.comm.size() as usize;
        let c: Vec<i32> = (0..size).map(|r| chunk_range(n, size, r).len() as i32).collect();
        let d: Vec<i32> = (0..size).map(|r| chunk_range(n, size, r).start as i32).collect();
        (c, d)
    }
}

impl Drop for MpiBackend {
    fn drop(&mut self) {
        self.reap_sends(true);
    }
}

// SAFETY: MPI is initialised with MPI_THREAD_MULTIPLE (checked in `world`), so its
// communicator handles may be used from any thread; `Comm` runs one call at a time per group.
unsafe impl Send for MpiBackend {}
unsafe impl Sync for MpiBackend {}

impl Backend for MpiBackend {
    fn rank(&self) -> usize {
        self.comm.rank() as usize
    }

    fn size(&self) -> usize {
        self.comm.size() as usize
    }

    fn all_reduce(&self, buf: &mut [f32], op: ReduceOp) -> Result<&'static str> {
        // MPI_IN_PLACE is not exposed by the `mpi` crate: reduce from a copy.
        let send = buf.to_vec();
        self.all_reduce_out_of_place(&send, buf, op).map(|_| ALGO_MPI)
    }

    fn reduce_scatter(&self, input: &[f32], output: &mut [f32], op: ReduceOp) -> Result<&'static str> {
        self.check("reduce_scatter", input.len(), op_code(op))?;
        let (counts, _) = self.counts(input.len());
        // SAFETY: plain MPI_Reduce_scatter on valid buffers; counts sum to input.len() and this
        // rank's count is output.len() (checked by `Comm`).
        let rc = unsafe {
            mpi::ffi::MPI_Reduce_scatter(
                input.as_ptr() as *const _,
                output.as_mut_ptr() as *mut _,
                counts.as_ptr(),
                f32::equivalent_datatype().as_raw(),
                mpi_op(op).as_raw(),
                self.comm.as_raw(),
            )
        };
        if rc != 0 {
            return Err(CommError::Backend(format!("MPI_Reduce_scatter returned {rc}")));
        }
        if op == ReduceOp::Avg {
            let s = 1.0 / self.comm.size() as f32;
            output.iter_mut().for_each(|x| *x *= s);
        }
        Ok(ALGO_MPI)
    }

    fn all_gather(&self, input: &[f32], output: &mut [f32]) -> Result<&'static str> {
        self.check("all_gather", output.len(), 0)?;
        let (counts, displs) = self.counts(output.len());
        let mut part = PartitionMut::new(output, &counts[..], &displs[..]);
        self.comm.all_gather_varcount_into(input, &mut part);
        Ok(ALGO_MPI)
    }

    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<&'static str> {
        self.check("broadcast", buf.len(), root as u64)?;
        self.comm.process_at_rank(root as i32).broadcast_into(buf);
        Ok(ALGO_MPI)
    }

    fn all_to_all_v(&self, input: &[f32], send: &[usize], output: &mut [f32], recv: &[usize]) -> Result<&'static str> {
        self.check("all_to_all_v", 0, 0)?;
        // every rank's counts to every rank, so that a disagreement fails all of them alike
        let n = self.size();
        let mine: Vec<u64> = send.iter().chain(recv).map(|&c| c as u64).collect();
        let mut all = vec![0u64; 2 * n * n];
        self.comm.all_gather_into(&mine[..], &mut all[..]);
        let counts: Vec<Vec<usize>> = all.chunks(2 * n).map(|c| c.iter().map(|&x| x as usize).collect()).collect();
        if let Some(detail) = crate::error::all_to_all_disagreement(&counts) {
            return Err(CommError::Mismatch { seq: self.seq.load(Ordering::Relaxed), size: n, detail });
        }
        self.all_to_all_v_raw(input, send, output, recv).map(|_| ALGO_MPI)
    }

    fn send(&self, buf: &[f32], dst: usize, tag: u32) -> Result<()> {
        self.reap_sends(false);
        let data = buf.to_vec();
        // SAFETY: `data` lives in `self.sends` until MPI reports the send complete.
        let req = unsafe {
            let mut req = std::mem::MaybeUninit::<mpi::ffi::MPI_Request>::uninit();
            let rc = mpi::ffi::MPI_Isend(
                data.as_ptr() as *const _,
                data.len() as i32,
                f32::equivalent_datatype().as_raw(),
                dst as i32,
                tag as i32,
                self.comm.as_raw(),
                req.as_mut_ptr(),
            );
            if rc != 0 {
                return Err(CommError::Backend(format!("MPI_Isend returned {rc}")));
            }
            req.assume_init()
        };
        self.sends.lock().unwrap_or_else(|p| p.into_inner()).push((req, data));
        Ok(())
    }

    fn recv(&self, buf: &mut [f32], src: usize, tag: u32) -> Result<()> {
        // a message may be long in coming (a pipeline stage waiting for the next step): probe
        // politely rather than block in MPI's busy poll; as before, no timeout on a receive
        let peer = self.comm.process_at_rank(src as i32);
        let mut got = None;
        match wait_politely(Duration::MAX, || {
            got = peer.immediate_matched_probe_with_tag(tag as i32);
            got.is_some()
        }) {
            Wait::Done => {}
            Wait::TimedOut => unreachable!("no timeout on a receive"),
            Wait::Orphaned => exit_orphaned(self.comm.rank()),
        }
        let (msg, status) = got.expect("probed above");
        let n = status.count(f32::equivalent_datatype()) as usize;
        if n != buf.len() {
            return Err(CommError::Mismatch {
                seq: 0,
                size: self.size(),
                detail: format!(
                    "rank {src} sent {n} elements with tag {tag} but rank {} receives {}",
                    self.rank(),
                    buf.len()
                ),
            });
        }
        msg.matched_receive_into(buf);
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        self.check("barrier", 0, 0)?;
        self.comm.barrier();
        Ok(())
    }

    fn split(&self, color: u32, key: u32) -> Result<Box<dyn Backend>> {
        self.check("split", 0, 0)?;
        let c = self
            .comm
            .split_by_color_with_key(Color::with_value(color as i32), key as i32)
            .ok_or_else(|| CommError::Backend("MPI_Comm_split returned no communicator".into()))?;
        Ok(Box::new(MpiBackend::new(c, self.timeout, self.checked)))
    }
}
