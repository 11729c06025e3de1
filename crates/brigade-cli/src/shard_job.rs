//! Running a sharded job (`brigade embed`, `brigade tokenize`) on its backend: workers as
//! threads of this process, or one worker an MPI rank; a progress bar on rank 0; an
//! interrupt finishes the shards in progress and says how to resume.

use anyhow::{bail, Result};
use brigade::shards::work::{Progress, Report};
use brigade_comm::Comm;
use clap::ValueEnum;
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Clone, Copy, Debug, PartialEq, ValueEnum)]
pub enum BackendArg {
    /// Workers are threads of this process.
    Local,
    /// Every rank started by mpirun is one worker (build with --features mpi).
    Mpi,
}

/// The interrupt flag of a sharded job: the first SIGINT/SIGTERM finishes the shards in
/// progress and stops, the second quits at once.
pub fn stop_flag() -> Result<std::sync::Arc<std::sync::atomic::AtomicBool>> {
    crate::interrupt::flag(
        "\nbrigade: interrupted — finishing the shards in progress, then stopping (finished shards are kept: run the same command again to resume); interrupt again to quit at once\n",
        "\nbrigade: interrupted again: quit at once; the finished shards are kept, and the ones in progress are redone when the same command runs again\n",
    )
}

/// How long a rank waits for its peers: rank 0's scan of the corpus, or the last shard of a
/// slower rank, can take minutes; a rank that dies fails its peers at once all the same.
const PEER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(6 * 3600);

/// Runs `job` on every worker; rank 0's report back (`None` on the other MPI ranks).
pub fn drive<M: Send>(
    backend: BackendArg,
    workers: Option<usize>,
    threads: usize,
    show: bool,
    tool: &str,
    job: impl Fn(&Comm, &dyn Progress) -> brigade::Result<Option<Report<M>>> + Sync,
) -> Result<Option<Report<M>>> {
    let bar = Bar::new(show);
    let report = match backend {
        BackendArg::Local => {
            let workers = workers.unwrap_or_else(crate::threads::default_threads);
            crate::threads::check_threads(workers, "--workers")?;
            crate::threads::check_threads(workers * threads, "--workers × --threads")?;
            Some(run_local(workers, &bar, &job)?)
        }
        BackendArg::Mpi => {
            if workers.is_some() {
                bail!("--workers is for the local backend; under mpirun every rank is one worker (mpirun -n N)");
            }
            run_mpi(tool, &bar, &job)?
        }
    };
    bar.0.finish_and_clear();
    Ok(report)
}

fn run_local<M: Send>(
    workers: usize,
    bar: &Bar,
    job: &(impl Fn(&Comm, &dyn Progress) -> brigade::Result<Option<Report<M>>> + Sync),
) -> Result<Report<M>> {
    let cfg = brigade_comm::local::LocalConfig { timeout: PEER_TIMEOUT, ..Default::default() };
    let mut res = brigade_comm::local::run_with(cfg, workers, |comm| job(&comm, bar)).map_err(|e| {
        let first = e.failures[0].1.clone();
        if first.starts_with("interrupted") {
            bar.0.abandon();
            crate::interrupt::Interrupted(first).into()
        } else if e.failures.iter().all(|(_, m)| *m == first) {
            anyhow::anyhow!("{first}")
        } else {
            anyhow::anyhow!("{e}")
        }
    })?;
    Ok(res.swap_remove(0).expect("rank 0 reports"))
}

#[cfg(feature = "mpi")]
fn run_mpi<M>(
    tool: &str,
    bar: &Bar,
    job: &(impl Fn(&Comm, &dyn Progress) -> brigade::Result<Option<Report<M>>> + Sync),
) -> Result<Option<Report<M>>> {
    if std::env::var_os("OMPI_COMM_WORLD_SIZE").is_none() && std::env::var_os("PMI_SIZE").is_none() {
        bail!("--backend mpi needs to be started by mpirun or srun (e.g. mpirun -n 4 brigade {tool} --backend mpi …)");
    }
    let world = Comm::new(Box::new(brigade_comm::mpi::world(PEER_TIMEOUT)?));
    let quiet = Bar(ProgressBar::hidden());
    let res = job(&world, if world.rank() == 0 { bar } else { &quiet });
    let rank = world.rank();
    drop(world);
    brigade_comm::mpi::finalize();
    match res {
        // rank 0 says what went wrong; the others' copy of its message would only repeat it
        Err(brigade::Error::Relayed(_)) if rank != 0 => std::process::exit(1),
        Err(brigade::Error::Interrupted(_)) if rank != 0 => std::process::exit(130),
        Err(brigade::Error::Interrupted(m)) => {
            bar.0.abandon();
            Err(crate::interrupt::Interrupted(m).into())
        }
        r => Ok(r?),
    }
}

#[cfg(not(feature = "mpi"))]
fn run_mpi<M>(
    _: &str,
    _: &Bar,
    _: &(impl Fn(&Comm, &dyn Progress) -> brigade::Result<Option<Report<M>>> + Sync),
) -> Result<Option<Report<M>>> {
    bail!("this brigade was built without MPI; rebuild with `cargo build --release --features mpi` (needs libopenmpi-dev) and start it under mpirun")
}

/// The progress bar: documents, documents/s and ETA (on a terminal only).
struct Bar(ProgressBar);

impl Bar {
    fn new(show: bool) -> Bar {
        let b = if show { ProgressBar::new(0) } else { ProgressBar::hidden() };
        b.set_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} documents  {per_sec}  [{elapsed_precise} eta {eta}]")
                .expect("valid template"),
        );
        Bar(b)
    }
}

impl Progress for Bar {
    fn start(&self, total: u64, done: u64) {
        self.0.set_length(total);
        self.0.set_position(done);
        self.0.reset_eta();
    }
    fn documents(&self, n: u64) {
        self.0.inc(n);
    }
}
