//! The collective conformance suite on the `mpi` backend. Run under MPI:
//!     cargo build --release -p brigade-comm --features mpi --example mpi_conformance
//!     mpirun -n 4 --oversubscribe target/release/examples/mpi_conformance
//! (as root, add --allow-run-as-root). Exits non-zero on any rank's failure.
//! With `--dead-rank`, rank 1 exits at once and the job must fail promptly (see .ci/run).

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
    if std::env::args().any(|a| a == "--dead-rank") {
        // Rank 1 dies before the collective; mpirun must then end the whole job (it kills the
        // ranks blocked in the all-reduce), so the job fails promptly instead of hanging.
        if rank == 1 {
            eprintln!("rank 1: exiting on purpose");
            std::process::exit(3);
        }
        let mut buf = vec![1f32; 1000];
        let _ = comm.all_reduce(&mut buf, ReduceOp::Sum);
        println!("rank {rank}: the all-reduce returned although rank 1 is gone");
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
