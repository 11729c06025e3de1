//! How many threads a command may use: the default (every core) and the bound every
//! `--threads`, `--workers` and local `--ranks` is checked against. Shared by the commands,
//! so none of them reaches up into `main.rs`.

/// Default intra-op threads: every core of the machine.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// Bounds `--threads` and local `--ranks`: more threads than cores only slow a run, and an
/// unbounded count would spawn threads until the machine gives out. At least 8 stay allowed
/// (tests run 8 rank threads on 2 cores).
pub fn check_threads(n: usize, flag: &str) -> anyhow::Result<()> {
    let max = (4 * default_threads()).max(8);
    if n == 0 || n > max {
        anyhow::bail!("{flag} {n} is out of range: give 1 to {max} (4 per core of this machine, at least 8)");
    }
    Ok(())
}
