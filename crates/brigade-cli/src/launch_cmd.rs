//! `brigade launch -- train …`: runs a training job in a child process and, when a rank dies
//! (the process killed, a rank thread panicking, a collective past its deadline: the child's
//! exit status 75, a signal or a panic), restarts it from the last complete checkpoint, up to
//! `--max-restarts` times. A failure of the settings (exit status 1 or 2) or an interrupt (130)
//! is not retried.

use crate::train_cmd::{TrainArgs, RANK_LOST_EXIT};
use anyhow::{bail, Context, Result};
use clap::{Args, Parser};
use std::path::Path;
use std::process::{Command, ExitStatus};

#[derive(Args, Debug)]
pub struct LaunchArgs {
    /// Restarts allowed after a rank's death before the job is given up.
    #[arg(long, default_value_t = 3)]
    pub(crate) max_restarts: usize,
    /// The command to supervise: `train` and its flags (it needs --out DIR to restart from).
    #[arg(last = true, required = true, num_args = 1..)]
    pub(crate) command: Vec<String>,
}

/// The flags a resumed run takes over from the first one (the rest come from the checkpoint).
const KEPT_ON_RESUME: &[&str] =
    &["--steps", "--threads", "--layout", "--save-every", "--backend", "--bucket-mb", "--trace", "--eval-every"];
const KEPT_SWITCHES: &[&str] = &["--save-in-foreground"];

#[derive(Parser)]
#[command(name = "brigade")]
struct TrainOnly {
    #[command(flatten)]
    train: TrainArgs,
}

pub fn run(a: LaunchArgs) -> Result<()> {
    let Some((cmd, rest)) = a.command.split_first() else { bail!("give the command to run after --: train …") };
    if cmd != "train" {
        bail!("brigade launch supervises `train`; got '{cmd}' (write: brigade launch -- train --out DIR …)");
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
    let exe = std::env::current_exe().context("cannot find the brigade executable")?;
    let mut args: Vec<String> = a.command.clone();
    let mut restarts = 0;
    let mut had_checkpoint = t.resume.is_some();
    loop {
        let started = saved_step(&out);
        let status =
            Command::new(&exe).args(&args).status().with_context(|| format!("cannot start {}", exe.display()))?;
        if status.success() {
            if restarts > 0 {
                eprintln!("brigade launch: finished after {restarts} restart(s)");
            }
            return Ok(());
        }
        if !rank_died(status) {
            // the run's own error was printed by it: its settings, or an interrupt
            std::process::exit(status.code().unwrap_or(1));
        }
        let reached = saved_step(&out);
        if restarts == a.max_restarts {
            bail!(
                "a rank died ({}) and --max-restarts {} is spent; the last checkpoint{} is left in {}",
                describe(status),
                a.max_restarts,
                reached.map_or(" (none)".to_string(), |s| format!(" (step {s})")),
                out.display()
            );
        }
        restarts += 1;
        // a save killed between its renames is put back in place first
        brigade::models::checkpoint::check_output_dir(&out)?;
        match saved_step(&out) {
            Some(step) => {
                had_checkpoint = true;
                args = resume_args(rest, &out);
                eprintln!(
                    "brigade launch: a rank died ({}); restart {restarts} of {} from the checkpoint of step {step}{}",
                    describe(status),
                    a.max_restarts,
                    started.map_or(String::new(), |s| format!(" (this attempt began at step {s})"))
                );
            }
            None if had_checkpoint => {
                bail!(
                    "the checkpoint directory {} vanished; nothing to resume from (nothing was deleted)",
                    out.display()
                )
            }
            None => eprintln!(
                "brigade launch: a rank died ({}) before the first checkpoint; restart {restarts} of {} from the start",
                describe(status),
                a.max_restarts
            ),
        }
    }
}

/// Whether the child failed because a rank did: killed by a signal, a panic (101), or the
/// run's own word for it (75).
fn rank_died(status: ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt as _;
    status.signal().is_some() || matches!(status.code(), Some(RANK_LOST_EXIT) | Some(101))
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.signal(), status.code()) {
        (Some(9), _) => "killed by SIGKILL".into(),
        (Some(s), _) => format!("killed by signal {s}"),
        (_, Some(RANK_LOST_EXIT)) => "a rank failed".into(),
        (_, Some(101)) => "it panicked".into(),
        (_, c) => format!("exit status {c:?}"),
    }
}

/// The step of the complete checkpoint in `dir`, if one is there.
fn saved_step(dir: &Path) -> Option<usize> {
    brigade::train::state::RunState::read(dir).ok().map(|s| s.step)
}

/// `train --resume OUT --out OUT` with the flags a resumed run may take from the first one.
fn resume_args(first: &[String], out: &Path) -> Vec<String> {
    let out = out.display().to_string();
    let mut v: Vec<String> = ["train", "--resume", &out, "--out", &out].iter().map(|s| s.to_string()).collect();
    let mut i = 0;
    while i < first.len() {
        let a = &first[i];
        let name = a.split('=').next().unwrap_or(a);
        if KEPT_SWITCHES.contains(&name) {
            v.push(a.clone());
        } else if KEPT_ON_RESUME.contains(&name) {
            v.push(a.clone());
            if !a.contains('=') && i + 1 < first.len() {
                v.push(first[i + 1].clone());
                i += 1;
            }
        }
        i += 1;
    }
    v
}
