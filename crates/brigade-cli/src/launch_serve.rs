//! `brigade launch --np N [--hosts H1,H2,…] -- serve …`: a server whose ranks are MPI processes
//! over a host list (`--tp`, `--pp` or `--cp` of them, rank 0 serving HTTP), supervised as a
//! training job is: when a rank dies (a process killed, a host lost) the whole server is started
//! again, on the hosts that still answer when they hold enough slots, up to `--max-restarts`
//! times. A server that fails before it listens (its settings) is not retried. SIGINT or SIGTERM
//! (any number of them) is passed on to mpirun once: rank 0 drains its requests, every rank
//! exits, and launch exits 0 (SIGKILL ends launch at once).

use crate::launch_cmd::{child, describe, mpi_ranks, rank_died, unanswering, wait_within, LaunchArgs, Ranks};
use crate::serve_cmd::ServeArgs;
use anyhow::{bail, Context, Result};
use clap::Parser;
use std::sync::atomic::Ordering;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "brigade")]
struct ServeOnly {
    #[command(flatten)]
    serve: ServeArgs,
}

pub(crate) fn run(a: &LaunchArgs) -> Result<()> {
    let rest = &a.command[1..];
    let s = ServeOnly::try_parse_from(std::iter::once("serve".to_string()).chain(rest.iter().cloned()))
        .map_err(|e| anyhow::anyhow!("the serve command: {}", e.to_string().trim()))?
        .serve;
    let (world, replicas) = s.ranks();
    if replicas > 1 {
        bail!("brigade launch -- serve runs one server over MPI ranks; start replicas with `brigade serve --replicas` or `brigade route`");
    }
    let Some(np) = a.np else {
        bail!(
            "brigade launch -- serve runs the server's ranks under mpirun: give --np {world} (its --tp · --pp · --cp)"
        );
    };
    if np != world {
        bail!("--np {np} does not match the server's {world} rank(s) (--tp · --pp · --cp); give --np {world}");
    }
    if a.min_ranks.is_some() {
        bail!("--min-ranks resumes training on fewer ranks; a server restarts on its --np ranks (leave it out)");
    }
    let mut ranks = mpi_ranks(a, np)?;
    // every SIGINT/SIGTERM just asks the server to stop (a process group's signal reaches
    // launch more than once): it is passed on to mpirun once, and launch waits for the drain
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, std::sync::Arc::clone(&stop))?;
    }
    let exe = std::env::current_exe().context("cannot find the brigade executable")?;
    let progress = std::env::temp_dir().join(format!("brigade-launch-{}.serve", std::process::id()));
    // (`child` adds --backend mpi)
    let args: Vec<String> = a.command.clone();
    let drain = Duration::from_secs_f64(s.shutdown_timeout().max(0.0) + 30.0);
    let mut restarts = 0;
    loop {
        let _ = std::fs::remove_file(&progress);
        let mut job = child(&exe, &args, &ranks, np, &progress)
            .spawn()
            .with_context(|| format!("cannot start {}", exe.display()))?;
        let status = loop {
            if let Some(st) = job.try_wait().context("cannot wait for the server")? {
                break st;
            }
            if stop.load(Ordering::SeqCst) {
                eprintln!("brigade launch: stopping the server (rank 0 drains its requests)");
                // SAFETY: signals our own child; mpirun passes SIGTERM on to its ranks
                unsafe {
                    libc::kill(job.id() as i32, libc::SIGTERM);
                }
                let _ = std::fs::remove_file(&progress);
                if wait_within(&mut job, drain).is_none() {
                    let _ = job.kill();
                    let _ = job.wait();
                    bail!("the server did not stop within {} s of SIGTERM; mpirun was killed", drain.as_secs());
                }
                // (mpirun reports a job it was asked to end as failed, however its ranks ended:
                // rank 0 said whether it drained)
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let listened = progress.exists();
        let _ = std::fs::remove_file(&progress);
        if status.success() {
            return Ok(());
        }
        if !rank_died(status, &ranks, listened) {
            // the server's own error was printed by it: its settings
            std::process::exit(status.code().unwrap_or(1));
        }
        if restarts == a.max_restarts {
            bail!("a rank of the server died ({}) and --max-restarts {} is spent", describe(status), a.max_restarts);
        }
        restarts += 1;
        if let Ranks::Mpi { hosts, extra } = &mut ranks {
            if !hosts.is_empty() {
                let gone = unanswering(hosts, extra);
                hosts.retain(|(h, _)| !gone.contains(h));
                let slots: usize = hosts.iter().map(|(_, n)| n).sum();
                if slots < np {
                    bail!(
                        "a rank of the server died ({}); host(s) {} no longer answer and the rest hold {slots} slot(s) for its {np} ranks",
                        describe(status),
                        gone.join(", ")
                    );
                }
                if !gone.is_empty() {
                    eprintln!(
                        "brigade launch: host(s) {} no longer answer; the server restarts on the rest",
                        gone.join(", ")
                    );
                }
            }
        }
        eprintln!(
            "brigade launch: a rank of the server died ({}); restart {restarts} of {}",
            describe(status),
            a.max_restarts
        );
    }
}
