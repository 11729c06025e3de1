//! What `brigade bench comm` measures: a memcpy baseline, then nccl-tests-style rows per size.

use crate::{Comm, ReduceOp, Result};
use std::time::Instant;

/// Bytes per second that `threads` threads copy, each a share of a `bytes` buffer (median of 5).
pub fn memcpy_gbps(bytes: usize, threads: usize) -> f64 {
    let n = bytes / 4;
    let src = vec![1.0f32; n];
    let mut dst = vec![0.0f32; n];
    let per = n.div_ceil(threads.max(1));
    let mut rates: Vec<f64> = (0..6)
        .map(|_| {
            let t0 = Instant::now();
            std::thread::scope(|s| {
                for (d, sr) in dst.chunks_mut(per).zip(src.chunks(per)) {
                    s.spawn(move || d.copy_from_slice(sr));
                }
            });
            bytes as f64 / t0.elapsed().as_secs_f64() / 1e9
        })
        .skip(1) // the first run also pays for faulting in `dst`
        .collect();
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast,
    /// An all-to-all: each rank sends every rank (itself too) one piece of its buffer.
    AllToAllV,
}

impl Op {
    pub fn parse(s: &str) -> Option<Op> {
        match s {
            "all_reduce" => Some(Op::AllReduce),
            "reduce_scatter" => Some(Op::ReduceScatter),
            "all_gather" => Some(Op::AllGather),
            "broadcast" => Some(Op::Broadcast),
            "all_to_all_v" => Some(Op::AllToAllV),
            _ => None,
        }
    }

    /// nccl-tests' bus-bandwidth factor: busbw = algbw · factor.
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Op::AllReduce => 2.0 * (n - 1.0) / n,
            Op::ReduceScatter | Op::AllGather | Op::AllToAllV => (n - 1.0) / n,
            Op::Broadcast => 1.0,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Row {
    pub bytes: usize,
    pub count: usize,
    pub algorithm: String,
    pub time_us: f64,
    pub algbw_gbps: f64,
    pub busbw_gbps: f64,
}

/// A replacement for the all-reduce under test (input, output): the MPI baseline runs MPI's
/// own out-of-place `MPI_Allreduce` through it.
pub type AllReduceFn<'a> = &'a dyn Fn(&[f32], &mut [f32]) -> Result<()>;

/// A replacement for the all-to-all under test (input, send counts, output, receive counts):
/// the MPI baseline runs MPI's own `MPI_Alltoallv` through it.
pub type AllToAllFn<'a> = &'a dyn Fn(&[f32], &[usize], &mut [f32], &[usize]) -> Result<()>;

/// What replaces brigade's own collective in a sweep (MPI's, for the baseline).
#[derive(Clone, Copy, Default)]
pub struct Raw<'a> {
    pub all_reduce: Option<AllReduceFn<'a>>,
    pub all_to_all: Option<AllToAllFn<'a>>,
}

/// Times `op` at every power-of-two size from `min_bytes` to `max_bytes` (nccl-tests' form:
/// mean time per call over many calls; the slowest rank's time is reported). Every rank must
/// call it; all get the same rows.
pub fn sweep(comm: &Comm, op: Op, min_bytes: usize, max_bytes: usize, raw: Raw) -> Result<Vec<Row>> {
    let (rank, n) = (comm.rank(), comm.size());
    let mut rows = Vec::new();
    let mut bytes = min_bytes.max(4).next_power_of_two();
    while bytes <= max_bytes {
        let count = bytes / 4;
        let chunk = crate::chunk_range(count, n, rank).len();
        let mut a = vec![1.0f32; count];
        let mut b = vec![0.0f32; count];
        let mut c = vec![0.0f32; chunk];
        // an all-to-all sends piece s of the buffer to rank s and gets this rank's piece from each
        let send: Vec<usize> = (0..n).map(|s| crate::chunk_range(count, n, s).len()).collect();
        let recv = vec![chunk; n];
        let mut d = vec![0.0f32; if op == Op::AllToAllV { n * chunk } else { 0 }];
        let mut call = |a: &mut Vec<f32>, b: &mut Vec<f32>, c: &mut Vec<f32>| -> Result<()> {
            match (op, raw.all_reduce, raw.all_to_all) {
                (Op::AllReduce, Some(f), _) => f(a, b),
                (Op::AllReduce, None, _) => comm.all_reduce(a, ReduceOp::Sum),
                (Op::ReduceScatter, ..) => comm.reduce_scatter(a, c, ReduceOp::Sum),
                (Op::AllGather, ..) => comm.all_gather(c, b),
                (Op::Broadcast, ..) => comm.broadcast(a, 0),
                (Op::AllToAllV, _, Some(f)) => f(a, &send, &mut d, &recv),
                (Op::AllToAllV, _, None) => comm.all_to_all_v(a, &send, &mut d, &recv),
            }
        };
        // One traced call names the algorithm; tracing stays off while timing.
        comm.enable_tracing(true);
        call(&mut a, &mut b, &mut c)?;
        let algorithm = match (op, raw.all_reduce, raw.all_to_all) {
            (Op::AllReduce, Some(_), _) | (Op::AllToAllV, _, Some(_)) => "mpi".to_string(),
            _ => comm.take_trace().last().map(|e| e.algorithm.to_string()).unwrap_or_default(),
        };
        comm.enable_tracing(false);
        let iters = ((1usize << 31) / bytes).clamp(10, 2000);
        for _ in 0..iters.min(20) {
            call(&mut a, &mut b, &mut c)?;
        }
        comm.barrier()?;
        let t0 = Instant::now();
        for _ in 0..iters {
            call(&mut a, &mut b, &mut c)?;
        }
        let mut t = [t0.elapsed().as_secs_f64() as f32 / iters as f32];
        comm.all_reduce(&mut t, ReduceOp::Max)?;
        let secs = t[0] as f64;
        let algbw = bytes as f64 / secs / 1e9;
        rows.push(Row {
            bytes,
            count,
            algorithm,
            time_us: secs * 1e6,
            algbw_gbps: algbw,
            busbw_gbps: algbw * op.bus_factor(n),
        });
        bytes *= 2;
    }
    Ok(rows)
}
