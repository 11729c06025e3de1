//! `brigade launch -- train …`: runs a training job — its rank threads in a child process, or
//! with `--np N` one rank a process under `mpirun` — and, when a rank dies (a process killed,
//! a rank thread panicking, a collective past its deadline: the child's exit status 75, a
//! signal or a panic), restarts it from the last complete checkpoint, up to `--max-restarts`
//! times, saying how many steps were redone. With `--min-ranks M` a death costs the world its
//! rank (under `--hosts`, the hosts that no longer answer), and the job resumes on the ranks
//! left, at least M, under the layout the planner finds fastest for them. A failure of the
//! settings (exit status 1 or 2) or an interrupt (130) is not retried. `brigade launch --np N
//! -- serve …` supervises a server's MPI ranks the same way (`launch_serve`).

use crate::train_args::{KEPT_ON_RESUME, KEPT_SWITCHES};
use crate::train_cmd::{TrainArgs, PROGRESS_ENV, RANK_LOST_EXIT};
use anyhow::{bail, Context, Result};
use brigade::layout::Layout;
use clap::{Args, Parser};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant, SystemTime};

#[derive(Args, Debug)]
pub struct LaunchArgs {
    /// Restarts allowed after a rank's death before the job is given up.
    #[arg(long, default_value_t = 3)]
    pub(crate) max_restarts: usize,
    /// Resume on fewer ranks after a death (elastic): each death takes its rank out of the
    /// world (under --hosts, every host that no longer answers), down to this many ranks; the
    /// planner picks the remaining world's layout. Unset, a restart keeps the world.
    #[arg(long)]
    pub(crate) min_ranks: Option<usize>,
    /// Run N ranks as processes under mpirun (`train --backend mpi`; a build with
    /// --features mpi). Unset, the ranks are threads of one child process.
    #[arg(long)]
    pub(crate) np: Option<usize>,
    /// Hosts for mpirun: H1,H2,… or H1:SLOTS,H2:SLOTS,… (unset slots: --np split evenly).
    #[arg(long, requires = "np")]
    pub(crate) hosts: Option<String>,
    /// More flags for mpirun, as one string (e.g. "--mca btl_tcp_if_include 10.0.0.0/24").
    #[arg(long, requires = "np", allow_hyphen_values = true)]
    pub(crate) mpirun_args: Option<String>,
    /// A job that finishes no step for this many seconds (a rank stuck outside any
    /// collective, which no deadline catches) is taken for hung: killed and restarted.
    #[arg(long, default_value_t = 1800.0)]
    pub(crate) hang_timeout: f64,
    /// The accelerator the planner ranks layouts for when it resumes on fewer ranks (as
    /// `brigade plan --gpu`).
    #[arg(long, default_value = "h100-sxm")]
    pub(crate) gpu: String,
    /// The command to supervise: `train` and its flags (it needs --out DIR to restart from), or
    /// `serve` and its flags (with --np: its ranks under mpirun, started again if one dies).
    #[arg(last = true, required = true, num_args = 1..)]
    pub(crate) command: Vec<String>,
}

#[derive(Parser)]
#[command(name = "brigade")]
struct TrainOnly {
    #[command(flatten)]
    train: TrainArgs,
}

/// Where the ranks run: threads of one child, or processes under mpirun on some hosts.
#[derive(Clone, Debug)]
pub(crate) enum Ranks {
    Threads,
    Mpi { hosts: Vec<(String, usize)>, extra: Vec<String> },
}

/// How long a host may take to run `true` under mpirun before it counts as gone.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

pub fn run(a: LaunchArgs) -> Result<()> {
    let Some((cmd, rest)) = a.command.split_first() else { bail!("give the command to run after --: train …") };
    if cmd != "train" {
        bail!(
            "brigade launch supervises `train` and `serve`; got '{cmd}' (write: brigade launch -- train --out DIR …)"
        );
    }
    let t = TrainOnly::try_parse_from(std::iter::once("train".to_string()).chain(rest.iter().cloned()))
        .map_err(|e| anyhow::anyhow!("the train command: {}", e.to_string().trim()))?
        .train;
    let Some(out) = t.out.clone().or_else(|| t.resume.clone()) else {
        bail!("brigade launch restarts from checkpoints: give train --out DIR (and --save-every N)");
    };
    if t.save_every.is_none() {
        eprintln!("brigade launch: no --save-every: a restart redoes the run from its start (or from --resume)");
    }
    let mut layout = Layout::parse(t.layout.as_deref().unwrap_or(""))?;
    let mut world = layout.world();
    let mut ranks = ranks(&a, &t, world)?;
    if !(a.hang_timeout.is_finite() && a.hang_timeout >= 1.0) {
        bail!("--hang-timeout must be a number of seconds, 1 or more, got {}", a.hang_timeout);
    }
    if let Some(m) = a.min_ranks {
        if m == 0 || m > world {
            bail!("--min-ranks must be between 1 and the job's {world} ranks, got {m}");
        }
    }
    // checked now, not after the first death
    let acc = brigade::plan::catalog::accelerator(&a.gpu)?;
    let exe = std::env::current_exe().context("cannot find the brigade executable")?;
    let progress = std::env::temp_dir().join(format!("brigade-launch-{}.progress", std::process::id()));
    let _cleanup = Remove(progress.clone());
    // a checkpoint already there when a fresh run starts is an older run's, replaced at the
    // first save: a death before that restarts from the start, not from it
    let fresh_mark = if t.resume.is_none() { mark(&out) } else { None };
    let mut args: Vec<String> = a.command.clone();
    let (mut restarts, mut redone) = (0, 0);
    let mut had_checkpoint = t.resume.is_some();
    loop {
        let _ = std::fs::remove_file(&progress);
        let job = child(&exe, &args, &ranks, world, &progress)
            .spawn()
            .with_context(|| format!("cannot start {}", exe.display()))?;
        let seen = |m: Option<(usize, SystemTime)>| m.is_some() && m != fresh_mark;
        let (status, hung, saved) =
            watch(job, &progress, Duration::from_secs_f64(a.hang_timeout), &ranks, || seen(mark(&out)))?;
        // a checkpoint this job wrote, seen while it ran: one that vanishes later is missed
        had_checkpoint |= saved;
        if status.success() {
            if restarts > 0 {
                eprintln!("brigade launch: finished after {restarts} restart(s), {redone} step(s) redone");
            }
            return Ok(());
        }
        if !hung && !rank_died(status, &ranks, progress.exists()) {
            // the run's own error was printed by it: its settings, or an interrupt
            std::process::exit(status.code().unwrap_or(1));
        }
        let reached = std::fs::read_to_string(&progress).ok().and_then(|s| s.trim().parse::<usize>().ok());
        if restarts == a.max_restarts {
            bail!(
                "a rank died ({}) and --max-restarts {} is spent; the last checkpoint{} is left in {}",
                describe(status),
                a.max_restarts,
                saved_step(&out).map_or(" (none)".to_string(), |s| format!(" (step {s})")),
                out.display()
            );
        }
        restarts += 1;
        // a save killed between its renames is put back in place first
        brigade::models::checkpoint::check_output_dir(&out)?;
        let from = resume_point(mark(&out), fresh_mark, &mut had_checkpoint, &out)?;
        let lost = reached.map(|r| r.saturating_sub(from.unwrap_or(0)));
        redone += lost.unwrap_or(0);
        eprintln!(
            "brigade launch: a rank died ({}){}; restart {restarts} of {} from {}{}",
            match hung {
                true => format!("no step finished in {} s: the job hung, and was killed", a.hang_timeout),
                false => describe(status),
            },
            reached.map_or(String::new(), |r| format!(" after step {r}")),
            a.max_restarts,
            from.map_or("the start (no checkpoint yet)".to_string(), |s| format!("the checkpoint of step {s}")),
            lost.map_or(String::new(), |n| format!(": {n} finished step(s) to redo"))
        );
        // the ranks left, and the layout they resume under
        let left = match (&a.min_ranks, &mut ranks) {
            (_, Ranks::Mpi { hosts, extra }) if !hosts.is_empty() => {
                let gone = unanswering(hosts, extra);
                drop_gone(hosts, &gone, a.min_ranks.is_some(), &out)?;
                hosts.iter().map(|(_, s)| s).sum::<usize>().min(world)
            }
            (Some(_), _) => world - 1,
            (None, _) => world,
        };
        if left < world {
            let m = a.min_ranks.unwrap_or(world);
            if left < m {
                bail!(
                    "{left} rank(s) remain, fewer than --min-ranks {m}; the checkpoint{} is kept in {}",
                    from.map_or(" (none)".to_string(), |s| format!(" of step {s}")),
                    out.display()
                );
            }
            let cfg = match from {
                Some(_) => brigade::train::persist::saved_config(&out)?,
                None => t.config()?,
            };
            let (n, e) = fewer(&cfg, left, m, &acc)?;
            let skipped = skipped_worlds(n, left);
            eprintln!(
                "brigade launch: resumed step {} on {n} ranks as {} (was {world} ranks as {layout}; the planner's fastest layout of {n} ranks on {}, {:.3} ms a step there{skipped})",
                from.unwrap_or(0),
                e.layout,
                a.gpu,
                1e3 * e.step_time_s
            );
            (layout, world) = (e.layout, n);
        }
        args = match from {
            Some(_) => resume_args(rest, &out, &layout),
            None => with_layout(&a.command, &layout),
        };
    }
}

/// The ranks the job runs on, checked against its layout.
fn ranks(a: &LaunchArgs, t: &TrainArgs, world: usize) -> Result<Ranks> {
    let Some(np) = a.np else { return Ok(Ranks::Threads) };
    if np != world {
        bail!("--np {np} does not match the layout's {world} rank(s); give train --layout whose dp·pp·tp = {np}");
    }
    if t.backend == "local" && a.command.iter().any(|s| s.starts_with("--backend")) {
        bail!("--np runs one rank a process: drop train's --backend local (launch passes --backend mpi)");
    }
    mpi_ranks(a, np)
}

/// `np` ranks as processes under mpirun, on `--hosts` if given.
pub(crate) fn mpi_ranks(a: &LaunchArgs, np: usize) -> Result<Ranks> {
    let extra: Vec<String> = a.mpirun_args.as_deref().unwrap_or("").split_whitespace().map(str::to_string).collect();
    let hosts = match &a.hosts {
        None => Vec::new(),
        Some(s) => {
            let names: Vec<&str> = s.split(',').map(str::trim).filter(|h| !h.is_empty()).collect();
            if names.is_empty() {
                bail!("--hosts is empty; give H1,H2,… or H1:SLOTS,H2:SLOTS,…");
            }
            let mut hosts = Vec::new();
            for h in &names {
                hosts.push(match h.rsplit_once(':') {
                    Some((name, n)) => match n.parse::<usize>() {
                        Ok(n) if n > 0 => (name.to_string(), n),
                        _ => bail!("--hosts {h}: the slots after ':' must be a whole number of 1 or more"),
                    },
                    None if np.is_multiple_of(names.len()) => (h.to_string(), np / names.len()),
                    None => bail!(
                        "--np {np} does not split evenly over {} hosts; give each its slots (H1:SLOTS,…)",
                        names.len()
                    ),
                });
            }
            let slots: usize = hosts.iter().map(|(_, s)| s).sum();
            if slots < np {
                bail!("--hosts has {slots} slot(s) for --np {np}; give more hosts or slots");
            }
            hosts
        }
    };
    if !cfg!(feature = "mpi") {
        bail!("--np runs the ranks under mpirun, but this brigade was built without MPI; rebuild with `cargo build --release --features mpi` (needs libopenmpi-dev)");
    }
    Ok(Ranks::Mpi { hosts, extra })
}

/// mpirun's own flags: as root it needs leave, and ranks may outnumber cores (the tests').
fn mpirun_base() -> Vec<String> {
    let mut v = vec!["--oversubscribe".to_string()];
    // SAFETY: geteuid only reads the process's credentials
    if unsafe { libc::geteuid() } == 0 {
        v.push("--allow-run-as-root".into());
    }
    v
}

/// The child process of one attempt.
pub(crate) fn child(exe: &Path, args: &[String], ranks: &Ranks, world: usize, progress: &Path) -> Command {
    let mut c;
    match ranks {
        Ranks::Threads => {
            c = Command::new(exe);
            c.args(args);
        }
        Ranks::Mpi { hosts, extra } => {
            c = Command::new("mpirun");
            c.args(["-n", &world.to_string()]).args(mpirun_base());
            if !hosts.is_empty() {
                let list: Vec<String> = hosts.iter().map(|(h, s)| format!("{h}:{s}")).collect();
                c.args(["--host", &list.join(",")]);
            }
            // the progress file's name reaches ranks on other hosts too
            c.args(["-x", PROGRESS_ENV]).args(extra).arg(exe).args(args);
            if !args.iter().any(|s| s.starts_with("--backend")) {
                c.args(["--backend", "mpi"]);
            }
        }
    }
    c.env(PROGRESS_ENV, progress);
    c
}

/// Waits for the job; when neither it started nor its progress file changed for `hang`, it
/// is killed (mpirun first asked to end its ranks). Its status, whether it hung, and whether
/// `saved` (polled four times a second) ever said a checkpoint of this job was there.
fn watch(
    mut job: std::process::Child,
    progress: &Path,
    hang: Duration,
    ranks: &Ranks,
    saved: impl Fn() -> bool,
) -> Result<(ExitStatus, bool, bool)> {
    let started = SystemTime::now();
    let (mut seen, mut polled) = (false, Instant::now());
    loop {
        if let Some(s) = job.try_wait().context("cannot wait for the job")? {
            return Ok((s, false, seen));
        }
        if polled.elapsed() >= Duration::from_millis(250) {
            seen |= saved();
            polled = Instant::now();
        }
        let last = std::fs::metadata(progress).and_then(|m| m.modified()).unwrap_or(started).max(started);
        if SystemTime::now().duration_since(last).unwrap_or_default() > hang {
            if matches!(ranks, Ranks::Mpi { .. }) {
                // SAFETY: signals our own child; mpirun ends its ranks on SIGTERM
                unsafe {
                    libc::kill(job.id() as i32, libc::SIGTERM);
                }
                wait_within(&mut job, Duration::from_secs(20));
            }
            let _ = job.kill();
            return Ok((job.wait()?, true, seen));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The child's status if it ends within `limit` (checked every 100 ms), else `None`.
pub(crate) fn wait_within(p: &mut std::process::Child, limit: Duration) -> Option<ExitStatus> {
    let until = Instant::now() + limit;
    loop {
        match p.try_wait() {
            Ok(Some(s)) => return Some(s),
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(100)),
            _ => return None,
        }
    }
}

/// Whether the child failed because a rank did: killed by a signal, a panic (101), the run's
/// own word for it (75). Under mpirun, which reports a lost rank or host by its own codes
/// (128 + a rank's signal, a signal's number, 1), any failure but an interrupt (130) or a
/// usage error (2) once training has `started` (its progress file written), and before that
/// a rank's signal.
pub(crate) fn rank_died(status: ExitStatus, ranks: &Ranks, started: bool) -> bool {
    use std::os::unix::process::ExitStatusExt as _;
    let mpi = matches!(ranks, Ranks::Mpi { .. });
    let code = status.code();
    status.signal().is_some()
        || matches!(code, Some(RANK_LOST_EXIT) | Some(101))
        || (mpi && code.is_some_and(|c| c > 128 && c != 130))
        || (mpi && started && code.is_some_and(|c| c != 130 && c != 2))
}

pub(crate) fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.signal(), status.code()) {
        (Some(9), _) => "killed by SIGKILL".into(),
        (Some(s), _) => format!("killed by signal {s}"),
        (_, Some(RANK_LOST_EXIT)) => "a rank failed".into(),
        (_, Some(101)) => "it panicked".into(),
        (_, Some(137)) => "a rank was killed by SIGKILL".into(),
        (_, Some(c)) if c > 128 => format!("a rank was killed by signal {}", c - 128),
        (_, Some(c)) => format!("exit status {c}"),
        (_, None) => "no exit status".into(),
    }
}

/// The hosts among `hosts` that do not run `true` under mpirun within [`PROBE_TIMEOUT`].
pub(crate) fn unanswering(hosts: &[(String, usize)], extra: &[String]) -> Vec<String> {
    let mut gone = Vec::new();
    for (h, _) in hosts {
        let mut c = Command::new("mpirun");
        c.args(["-n", "1"]).args(mpirun_base()).args(["--host", &format!("{h}:1")]).args(extra).arg("true");
        c.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
        let ok = match c.spawn() {
            Err(_) => false,
            Ok(mut p) => match wait_within(&mut p, PROBE_TIMEOUT) {
                Some(s) => s.success(),
                None => {
                    let _ = p.kill();
                    let _ = p.wait();
                    false
                }
            },
        };
        if !ok {
            gone.push(h.clone());
        }
    }
    gone
}

/// What the resume line says of the worlds between the `n` ranks resumed on and the `left`
/// ones that no layout trains.
fn skipped_worlds(n: usize, left: usize) -> String {
    match n < left {
        true if n + 1 == left => format!("; no layout of {left} ranks trains it"),
        true => format!("; no layout of {}–{left} ranks trains it", n + 1),
        false => String::new(),
    }
}

/// The step a restart resumes from: the checkpoint `found` in the output directory unless it
/// is the older run's `fresh` one; none (the start) where there is none yet. A checkpoint of
/// this job seen before (`had`, which a found one sets for the next death — the watcher may
/// have missed a save that landed just before the death) that is gone now ends the job.
fn resume_point(
    found: Option<(usize, SystemTime)>,
    fresh: Option<(usize, SystemTime)>,
    had: &mut bool,
    out: &Path,
) -> Result<Option<usize>> {
    let from = match found {
        Some(m) if fresh.is_none_or(|f| f != m) => Some(m.0),
        Some(_) => None,
        None if *had => {
            bail!("the checkpoint directory {} vanished; nothing to resume from (nothing was deleted)", out.display())
        }
        None => None,
    };
    *had |= from.is_some();
    Ok(from)
}

/// The hosts left once the `gone` ones are dropped — only where the run may resume on fewer
/// ranks (`elastic`: `--min-ranks` given); otherwise a lost host ends the job, naming it.
fn drop_gone(hosts: &mut Vec<(String, usize)>, gone: &[String], elastic: bool, out: &Path) -> Result<()> {
    if !gone.is_empty() && !elastic {
        bail!(
            "host(s) {} no longer answer; give --min-ranks to resume on the rest (the checkpoint is kept in {})",
            gone.join(", "),
            out.display()
        );
    }
    hosts.retain(|(h, _)| !gone.contains(h));
    Ok(())
}

/// The most ranks, from `left` down to `min`, that some layout can train the run on, with
/// the planner's pick of that world.
fn fewer(
    cfg: &brigade::train::TrainConfig,
    left: usize,
    min: usize,
    acc: &brigade::plan::Accelerator,
) -> Result<(usize, brigade::plan::Estimate)> {
    let mut first = None;
    for n in (min..=left).rev() {
        match brigade::plan::elastic::relayout(cfg, n, acc) {
            Ok(e) => return Ok((n, e)),
            Err(e) => first = first.or(Some(e)),
        }
    }
    bail!(
        "no layout of {min} to {left} ranks can train this run ({}); the checkpoint is kept",
        first.map(|e| e.to_string()).unwrap_or_default()
    )
}

/// The complete checkpoint in `dir`: its step, and when its state was written.
fn mark(dir: &Path) -> Option<(usize, SystemTime)> {
    let step = saved_step(dir)?;
    let at = std::fs::metadata(dir.join(brigade::models::checkpoint::STATE_FILE)).and_then(|m| m.modified()).ok()?;
    Some((step, at))
}

/// The step of the complete checkpoint in `dir`, if one is there.
fn saved_step(dir: &Path) -> Option<usize> {
    brigade::train::state::RunState::read(dir).ok().map(|s| s.step)
}

/// `train --resume OUT --out OUT` with the flags a resumed run may take from the first one,
/// under `layout`.
fn resume_args(first: &[String], out: &Path, layout: &Layout) -> Vec<String> {
    let out = out.display().to_string();
    let mut v: Vec<String> = ["train", "--resume", &out, "--out", &out].iter().map(|s| s.to_string()).collect();
    let mut i = 0;
    while i < first.len() {
        let a = &first[i];
        let name = a.split('=').next().unwrap_or(a);
        let value = !a.contains('=') && i + 1 < first.len();
        if KEPT_SWITCHES.contains(&name) {
            v.push(a.clone());
        } else if name == "--layout" || name == "--out" {
            // given above and below
            i += usize::from(value);
        } else if KEPT_ON_RESUME.contains(&name) {
            v.push(a.clone());
            if value {
                v.push(first[i + 1].clone());
                i += 1;
            }
        }
        i += 1;
    }
    v.extend(["--layout".to_string(), layout.to_string()]);
    v
}

/// The first command with its `--layout` replaced by `layout` (a fresh start on fewer ranks).
fn with_layout(first: &[String], layout: &Layout) -> Vec<String> {
    let mut v = Vec::new();
    let mut i = 0;
    while i < first.len() {
        let a = &first[i];
        if a == "--layout" {
            i += 2;
            continue;
        }
        if !a.starts_with("--layout=") {
            v.push(a.clone());
        }
        i += 1;
    }
    v.extend(["--layout".to_string(), layout.to_string()]);
    v
}

/// Removes a file when dropped.
struct Remove(PathBuf);
impl Drop for Remove {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn a_resume_keeps_the_allowed_flags_and_takes_the_new_layout() {
        let first = s(&["--steps", "8", "--layout", "dp=4", "--batch", "8", "--save-every=2", "--threads", "1"]);
        let l = Layout::parse("dp=2,tp=2").unwrap();
        let got = resume_args(&first, Path::new("ck"), &l);
        assert_eq!(
            got,
            s(&[
                "train",
                "--resume",
                "ck",
                "--out",
                "ck",
                "--steps",
                "8",
                "--save-every=2",
                "--threads",
                "1",
                "--layout",
                "dp=2,tp=2"
            ])
        );
        let fresh = with_layout(&s(&["train", "--layout=dp=4", "--steps", "3", "--layout", "dp=4"]), &l);
        assert_eq!(fresh, s(&["train", "--steps", "3", "--layout", "dp=2,tp=2"]));
    }

    /// What counts as a lost rank, by how the child ended: a signal, a panic or the run's own
    /// code always; under mpirun also a rank's signal as 128 + n, and once training started any
    /// failure but an interrupt or a usage error. A threads run's plain failure (a config
    /// error: 1) is not one — it is not restarted.
    #[test]
    fn a_lost_rank_is_told_from_a_failed_run() {
        use std::os::unix::process::ExitStatusExt as _;
        let code = |c: i32| ExitStatus::from_raw(c << 8);
        let mpi = Ranks::Mpi { hosts: vec![], extra: vec![] };
        let cases = [
            // (status, mpi, started, a lost rank)
            (ExitStatus::from_raw(9), false, false, true),
            (code(101), false, true, true),
            (code(RANK_LOST_EXIT), false, false, true),
            (code(1), false, true, false),
            (code(0), false, true, false),
            (code(137), true, false, true),
            (code(137), false, true, false),
            (code(130), true, true, false),
            (code(1), true, false, false),
            (code(1), true, true, true),
            (code(2), true, true, false),
        ];
        for (st, under_mpi, started, want) in cases {
            let ranks = if under_mpi { &mpi } else { &Ranks::Threads };
            assert_eq!(rank_died(st, ranks, started), want, "{st:?}, mpi {under_mpi}, started {started}");
        }
    }

    /// A restart resumes from this job's checkpoint, never the older run's it found at the
    /// start; once one was found, its vanishing ends the job — also when the watcher missed
    /// the save (a death right after it).
    #[test]
    fn a_restart_resumes_from_this_jobs_checkpoint_and_notices_it_vanish() {
        let out = Path::new("ck");
        let t = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        let old = Some((6, t(1)));
        let mut had = false;
        assert_eq!(resume_point(None, old, &mut had, out).unwrap(), None, "nothing yet: the start");
        assert_eq!(resume_point(old, old, &mut had, out).unwrap(), None, "the older run's: the start");
        assert!(!had);
        assert_eq!(resume_point(Some((2, t(5))), old, &mut had, out).unwrap(), Some(2));
        assert!(had, "a checkpoint found counts as seen");
        let err = resume_point(None, old, &mut had, out).unwrap_err().to_string();
        assert!(err.contains("ck") && err.contains("vanished"), "{err}");
        let mut seen = true;
        assert!(resume_point(None, None, &mut seen, out).is_err(), "seen by the watcher, then gone");
    }

    /// A child past its limit is left running and `None` comes back in about the limit; one
    /// that ends within it gives its status.
    #[test]
    fn waiting_is_bounded() {
        let mut quick = Command::new("true").spawn().unwrap();
        assert!(wait_within(&mut quick, Duration::from_secs(10)).is_some_and(|s| s.success()));
        let mut slow = Command::new("sleep").arg("30").spawn().unwrap();
        let t0 = Instant::now();
        assert!(wait_within(&mut slow, Duration::from_millis(300)).is_none());
        assert!(t0.elapsed() < Duration::from_secs(5), "waited {:?}", t0.elapsed());
        let _ = slow.kill();
        let _ = slow.wait();
    }

    /// `--np` needs an MPI build: refused, naming the fix, without one; taken with one.
    #[test]
    fn np_needs_an_mpi_build() {
        #[derive(Parser)]
        struct L {
            #[command(flatten)]
            a: LaunchArgs,
        }
        let a = L::try_parse_from(["launch", "--np", "2", "--", "train"]).unwrap().a;
        match mpi_ranks(&a, 2) {
            Ok(r) => assert!(cfg!(feature = "mpi") && matches!(r, Ranks::Mpi { .. })),
            Err(e) => assert!(!cfg!(feature = "mpi") && e.to_string().contains("--features mpi"), "{e}"),
        }
    }

    #[test]
    fn the_worlds_skipped_are_named() {
        assert_eq!(skipped_worlds(4, 4), "");
        assert_eq!(skipped_worlds(2, 3), "; no layout of 3 ranks trains it");
        assert_eq!(skipped_worlds(2, 5), "; no layout of 3–5 ranks trains it");
    }

    /// How the supervisor names the way a child ended, in its one line.
    #[test]
    fn an_end_is_named_by_its_signal_or_code() {
        use std::os::unix::process::ExitStatusExt as _;
        let code = |c: i32| ExitStatus::from_raw(c << 8);
        for (st, want) in [
            (ExitStatus::from_raw(9), "killed by SIGKILL".to_string()),
            (ExitStatus::from_raw(15), "killed by signal 15".into()),
            (code(RANK_LOST_EXIT), "a rank failed".into()),
            (code(101), "it panicked".into()),
            (code(137), "a rank was killed by SIGKILL".into()),
            (code(143), "a rank was killed by signal 15".into()),
            (code(129), "a rank was killed by signal 1".into()),
            (code(128), "exit status 128".into()),
            (code(1), "exit status 1".into()),
        ] {
            assert_eq!(describe(st), want, "{st:?}");
        }
    }

    /// A host gone ends the job naming it unless --min-ranks was given; with it the host is
    /// dropped; none gone changes nothing either way.
    #[test]
    fn a_lost_host_is_dropped_only_when_the_run_may_shrink() {
        let hosts = || vec![("h1".to_string(), 2), ("h2".to_string(), 2)];
        let out = Path::new("ck");
        for elastic in [false, true] {
            let mut h = hosts();
            drop_gone(&mut h, &[], elastic, out).unwrap();
            assert_eq!(h, hosts());
        }
        let mut h = hosts();
        let err = drop_gone(&mut h, &["h2".to_string()], false, out).unwrap_err().to_string();
        assert!(err.contains("h2") && err.contains("--min-ranks") && err.contains("ck"), "{err}");
        drop_gone(&mut h, &["h2".to_string()], true, out).unwrap();
        assert_eq!(h, [("h1".to_string(), 2)]);
    }

    /// A host no mpirun can reach is gone (whether mpirun is installed or not); where it is,
    /// this machine answers.
    #[test]
    fn a_host_that_cannot_run_true_is_gone() {
        let bad = vec![("no-such-host.invalid".to_string(), 1)];
        assert_eq!(unanswering(&bad, &[]), ["no-such-host.invalid"]);
        if Command::new("mpirun").arg("--version").output().is_ok_and(|o| o.status.success()) {
            assert!(unanswering(&[("localhost".to_string(), 1)], &[]).is_empty(), "localhost did not answer");
        } else {
            eprintln!("skipped localhost: no mpirun here (CI installs Open MPI)");
        }
    }
}
