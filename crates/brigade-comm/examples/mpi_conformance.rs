//! The collective conformance suite on the `mpi` backend. Run under MPI:
//!     cargo build --release -p brigade-comm --features mpi --example mpi_conformance
//!     mpirun -n 4 --oversubscribe target/release/examples/mpi_conformance
//! (as root, add --allow-run-as-root). Exits non-zero on any rank's failure.
//! With `--dead-rank` (or `--dead-rank-all-to-all`), rank 1 exits at once and the job must
//! fail promptly (see .ci/run).

use brigade_comm::{conformance, mpi, Comm, CommError, ReduceOp};
use std::time::Duration;

fn main() {
    let backend = match mpi::world(Duration::from_secs(120)) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    let comm = Comm::new(Box::new(backend));
    let (rank, size) = (comm.rank(), comm.size());
    let dead_all_to_all = std::env::args().any(|a| a == "--dead-rank-all-to-all");
    if std::env::args().any(|a| a == "--dead-rank") || dead_all_to_all {
        // Rank 1 dies before the collective; mpirun must then end the whole job (it kills the
        // ranks blocked in the collective), so the job fails promptly instead of hanging.
        if rank == 1 {
            eprintln!("rank 1: exiting on purpose");
            std::process::exit(3);
        }
        let mut buf = vec![1f32; 1000];
        if dead_all_to_all {
            let mut out = vec![0f32; size];
            let _ = comm.all_to_all_v(&vec![1f32; size], &vec![1; size], &mut out, &vec![1; size]);
        } else {
            let _ = comm.all_reduce(&mut buf, ReduceOp::Sum);
        }
        println!("rank {rank}: the collective returned although rank 1 is gone");
        std::process::exit(0);
    }
    let mut result = conformance::run_all(&comm);
    if result.is_ok() && size > 1 {
        // a mismatched call fails on every rank, with the same message
        let mut buf = vec![0f32; if rank == 1 { 11 } else { 10 }];
        result = match comm.all_reduce(&mut buf, ReduceOp::Sum) {
            Err(CommError::Mismatch { detail, .. })
                if detail.contains("rank 1 called all_reduce(sum) of 11 elements") =>
            {
                Ok(())
            }
            other => Err(format!("expected a mismatch error, got {other:?}")),
        };
        // an all-to-all whose sizes disagree fails on every rank, naming both ranks
        let (send, mut recv) = (vec![5usize; size], vec![5usize; size]);
        if rank == 1 {
            recv[0] = 4;
        }
        let mut out = vec![0f32; recv.iter().sum()];
        let a2a = comm.all_to_all_v(&vec![1f32; 5 * size], &send, &mut out, &recv);
        if result.is_ok() {
            result = match a2a {
                Err(CommError::Mismatch { detail, .. })
                    if detail.contains("rank 0 sends 5 elements to rank 1, which expects 4 from it") =>
                {
                    Ok(())
                }
                other => Err(format!("expected an all_to_all_v size mismatch, got {other:?}")),
            };
        }
    }
    drop(comm);
    match result {
        Ok(()) => println!("rank {rank}/{size}: mpi conformance ok"),
        Err(e) => {
            eprintln!("rank {rank}/{size}: FAILED: {e}");
            std::process::exit(1);
        }
    }
    mpi::finalize();
}
