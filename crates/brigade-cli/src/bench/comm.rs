//! `brigade bench comm`: prints brigade-comm's measurements.

use anyhow::{bail, Result};
use brigade_comm::bench::{memcpy_gbps, sweep, Op, Row};
use clap::Args;

#[derive(Args, Debug)]
pub struct Flags {
    /// Ranks (threads) for the local backend; under mpirun the launcher decides.
    #[arg(long, default_value_t = 2)]
    pub(crate) ranks: usize,
    /// local (threads sharing memory) or mpi (run under mpirun; needs --features mpi).
    #[arg(long, default_value = "local")]
    pub(crate) backend: String,
    /// all_reduce, reduce_scatter, all_gather, broadcast or all_to_all_v (each rank sends every
    /// rank a piece of its buffer).
    #[arg(long, default_value = "all_reduce")]
    pub(crate) op: String,
    #[arg(long, default_value_t = 8)]
    pub(crate) min_bytes: usize,
    #[arg(long, default_value_t = 256 << 20)]
    pub(crate) max_bytes: usize,
    #[arg(long)]
    pub(crate) json: bool,
}

const MEMCPY_BYTES: usize = 256 << 20;

pub fn run(f: Flags) -> Result<()> {
    let Flags { ranks, backend, op, min_bytes, max_bytes, json } = f;
    measure(ranks, &backend, &op, min_bytes, max_bytes, json)
}

fn measure(ranks: usize, backend: &str, op: &str, min_bytes: usize, max_bytes: usize, json: bool) -> Result<()> {
    let Some(op_kind) = Op::parse(op) else {
        bail!("unknown --op '{op}'; use all_reduce, reduce_scatter, all_gather, broadcast or all_to_all_v");
    };
    if min_bytes == 0 || min_bytes > max_bytes {
        bail!("need 0 < --min-bytes <= --max-bytes");
    }
    match backend {
        "local" => {
            crate::threads::check_threads(ranks, "--ranks")?;
            // each rank holds a send and a receive buffer of the largest size, plus the memcpy test
            let need = (ranks as u128 * 2 * max_bytes as u128).max(2 * MEMCPY_BYTES as u128);
            if let Some(avail) = brigade::train::memory::available_bytes() {
                if need > avail {
                    bail!(
                        "--max-bytes {max_bytes} on {ranks} ranks needs {:.1} GiB of buffers but {:.1} GiB is available; lower --max-bytes",
                        brigade::train::memory::gib(need),
                        brigade::train::memory::gib(avail)
                    );
                }
            }
            let memcpy = memcpy_gbps(MEMCPY_BYTES, 2);
            let rows =
                brigade_comm::local::run(ranks, |c| sweep(&c, op_kind, min_bytes, max_bytes, Default::default()))
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
            report("local", ranks, op, memcpy, &rows[0], json)
        }
        "mpi" => run_mpi(op_kind, op, min_bytes, max_bytes, json),
        other => bail!("unknown --backend '{other}'; use local or mpi"),
    }
}

#[cfg(feature = "mpi")]
fn run_mpi(op_kind: Op, op: &str, min_bytes: usize, max_bytes: usize, json: bool) -> Result<()> {
    use brigade_comm::{Comm, ReduceOp};
    // Both handles skip the descriptor exchange: the benchmark measures MPI's collectives
    // themselves (`raw` runs the timed out-of-place all-reduce, `comm` the rest of the sweep).
    let unchecked = || -> Result<brigade_comm::mpi::MpiBackend> {
        let mut b = brigade_comm::mpi::world(std::time::Duration::from_secs(300))?;
        b.set_checked(false);
        Ok(b)
    };
    let raw = unchecked()?;
    let comm = Comm::new(Box::new(unchecked()?));
    let memcpy = if comm.rank() == 0 { memcpy_gbps(MEMCPY_BYTES, 2) } else { 0.0 };
    comm.barrier()?;
    let f = |a: &[f32], b: &mut [f32]| raw.all_reduce_out_of_place(a, b, ReduceOp::Sum);
    let g = |a: &[f32], s: &[usize], b: &mut [f32], r: &[usize]| raw.all_to_all_v_raw(a, s, b, r);
    let raws = brigade_comm::bench::Raw { all_reduce: Some(&f), all_to_all: Some(&g) };
    let rows = sweep(&comm, op_kind, min_bytes, max_bytes, raws)?;
    if comm.rank() == 0 {
        report("mpi", comm.size(), op, memcpy, &rows, json)?;
    }
    drop(comm);
    drop(raw);
    brigade_comm::mpi::finalize();
    Ok(())
}

#[cfg(not(feature = "mpi"))]
fn run_mpi(_: Op, _: &str, _: usize, _: usize, _: bool) -> Result<()> {
    bail!("this brigade was built without MPI; rebuild with `cargo build --release --features mpi` (needs libopenmpi-dev) and run it under mpirun")
}

fn report(backend: &str, ranks: usize, op: &str, memcpy: f64, rows: &[Row], json: bool) -> Result<()> {
    if json {
        let rows: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                serde_json::json!({"bytes": r.bytes, "count": r.count, "algorithm": r.algorithm,
                    "time_us": r.time_us, "algbw_gbps": r.algbw_gbps, "busbw_gbps": r.busbw_gbps})
            })
            .collect();
        let v = serde_json::json!({"bench": "comm", "backend": backend, "ranks": ranks, "op": op,
            "memcpy_gbps": memcpy, "rows": rows});
        outln!("{v}");
        return Ok(());
    }
    outln!("# brigade bench comm: {op}, backend {backend}, {ranks} ranks");
    outln!("# memcpy, 2 threads, 256 MiB: {memcpy:.2} GB/s (an in-memory all-reduce's busbw limit is about half)");
    outln!(
        "#{:>12} {:>10} {:>10} {:>11} {:>12} {:>12}",
        "size(B)",
        "count",
        "algorithm",
        "time(us)",
        "algbw(GB/s)",
        "busbw(GB/s)"
    );
    for r in rows {
        outln!(
            " {:>12} {:>10} {:>10} {:>11.2} {:>12.3} {:>12.3}",
            r.bytes,
            r.count,
            r.algorithm,
            r.time_us,
            r.algbw_gbps,
            r.busbw_gbps
        );
    }
    Ok(())
}
