pub use crate::train_args::TrainArgs;
use anyhow::{bail, Context, Result};
use brigade::layout::{Axis, Layout};
use brigade::train::run::{self as job, JobOptions, JobReport, Observer, Outcome};
use brigade::train::{EvalReport, StepStats, TrainConfig, Trainer};
use indicatif::{ProgressBar, ProgressStyle};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

pub use crate::interrupt::Interrupted;

/// A run that failed because a rank did (it panicked, lost its peers, or a collective passed
/// its deadline) rather than because of its settings: exit status 75, which `brigade launch`
/// restarts from the last checkpoint.
#[derive(Debug)]
pub struct RankLost(pub String);

impl std::fmt::Display for RankLost {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RankLost {}

/// The exit status of a run that failed because a rank did.
pub const RANK_LOST_EXIT: i32 = 75;

/// Checks, before the run, that the timeline can be written to `path`.
fn check_trace_path(path: &std::path::Path) -> Result<()> {
    if path.is_dir() {
        bail!("--trace {} is a directory; give a file name such as trace.json", path.display());
    }
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    if !parent.is_dir() {
        bail!("--trace {}: the directory {} does not exist", path.display(), parent.display());
    }
    brigade::models::checkpoint::check_writable_dir(parent).with_context(|| format!("--trace {}", path.display()))?;
    if path.exists() && std::fs::OpenOptions::new().append(true).open(path).is_err() {
        bail!("--trace {}: the file exists and is not writable", path.display());
    }
    Ok(())
}

/// SIGINT and SIGTERM set a flag that the loop reads after each step; a second signal ends
/// the process at once.
fn interrupt_flag(saving: bool) -> Result<Arc<AtomicBool>> {
    crate::interrupt::flag(
        if saving {
            "\nbrigade: interrupted — finishing the current step, then saving a checkpoint; interrupt again to quit at once without saving\n"
        } else {
            "\nbrigade: interrupted — finishing the current step, then stopping (no --out: nothing is saved); interrupt again to quit at once without saving\n"
        },
        "\nbrigade: interrupted again: quit at once, without saving\n",
    )
}

/// `--layout`, checked before any rank starts.
fn parse_layout(a: &TrainArgs) -> Result<Layout> {
    let layout = Layout::parse(a.layout.as_deref().unwrap_or(""))?;
    layout.check_training()?;
    Ok(layout)
}

/// `--bucket-mb` in gradient elements.
fn bucket_elems(a: &TrainArgs) -> Result<usize> {
    if !(a.bucket_mb.is_finite() && a.bucket_mb > 0.0 && a.bucket_mb <= 1e6) {
        bail!("--bucket-mb must be a positive size in MB (at most 1e6), got {}", a.bucket_mb);
    }
    Ok(((a.bucket_mb * 1e6 / 4.0) as usize).max(1))
}

pub fn run(mut a: TrainArgs) -> Result<()> {
    if let Some(t) = a.threads {
        crate::threads::check_threads(t, "--threads")?;
    }
    if a.print_schedule {
        return print_schedule(&a);
    }
    if a.save_every.is_some() && a.out.is_none() && a.resume.is_none() {
        bail!("--save-every needs --out DIR (or --resume DIR) to write checkpoints to");
    }
    let layout = parse_layout(&a)?;
    // unset, each rank gets its share of the cores: the ranks of the layout here, or under
    // mpirun the ranks on this node
    let here = match a.backend.as_str() {
        "mpi" => std::env::var("OMPI_COMM_WORLD_LOCAL_SIZE").ok().and_then(|s| s.parse().ok()).unwrap_or(1),
        _ => layout.world(),
    };
    a.threads = Some(a.threads_for(here));
    bucket_elems(&a)?;
    // where checkpoints go: --out, or back into the --resume directory
    if let Some(dir) = a.out.as_ref().or(a.resume.as_ref()) {
        brigade::models::checkpoint::check_output_dir(dir)?;
    }
    if let Some(path) = &a.trace {
        check_trace_path(path)?;
    }
    if a.resume.is_some() {
        let fixed = a.numeric_overrides();
        if !fixed.is_empty() {
            bail!(
                "{} cannot change on --resume (the run's settings come from its checkpoint); only {} may be given",
                fixed.join(", "),
                crate::train_args::KEPT_ON_RESUME
                    .iter()
                    .chain(crate::train_args::KEPT_SWITCHES)
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    let cfg = if a.resume.is_some() { None } else { Some(a.config()?) };
    let stop = interrupt_flag(a.out.is_some() || a.resume.is_some())?;
    match a.backend.as_str() {
        "local" => {
            let world = layout.world();
            crate::threads::check_threads(world, "the layout's rank count")?;
            crate::threads::check_threads(world * a.rank_threads(), "ranks × --threads")?;
            if world == 1 {
                return run_rank(brigade_comm::local::solo(), &layout, cfg, &a, &stop);
            }
            brigade_comm::local::run(world, |comm| run_rank(comm, &layout, cfg.clone(), &a, &stop)).map(|_| ()).map_err(
                |e| {
                    // every rank refuses a bad setting alike: say it once
                    let first = e.failures[0].1.clone();
                    let panicked = e.failures.iter().any(|(_, m)| m.starts_with("panicked"));
                    if first.starts_with("interrupted") {
                        Interrupted(first).into()
                    } else if e.failures.iter().all(|(_, m)| *m == first) && !panicked {
                        anyhow::anyhow!("{first}")
                    } else {
                        // not every rank refused alike: one failed and the others lost it
                        RankLost(e.to_string()).into()
                    }
                },
            )
        }
        "mpi" => run_mpi(&layout, cfg, &a, &stop),
        other => bail!("unknown --backend '{other}'; use local or mpi"),
    }
}

#[cfg(feature = "mpi")]
fn run_mpi(layout: &Layout, cfg: Option<TrainConfig>, a: &TrainArgs, stop: &AtomicBool) -> Result<()> {
    if std::env::var_os("OMPI_COMM_WORLD_SIZE").is_none() && std::env::var_os("PMI_SIZE").is_none() {
        bail!(
            "--backend mpi needs to be started by mpirun or srun (e.g. mpirun -n {} brigade train --backend mpi …)",
            layout.world()
        );
    }
    let world = brigade_comm::Comm::new(Box::new(brigade_comm::mpi::world(std::time::Duration::from_secs(300))?));
    layout.check_world(world.size())?;
    let r = run_rank(world, layout, cfg, a, stop);
    brigade_comm::mpi::finalize();
    r
}

#[cfg(not(feature = "mpi"))]
fn run_mpi(_: &Layout, _: Option<TrainConfig>, _: &TrainArgs, _: &AtomicBool) -> Result<()> {
    bail!("this brigade was built without MPI; rebuild with `cargo build --release --features mpi` (needs libopenmpi-dev) and start it under mpirun")
}

/// One rank of the run: its part of the mesh, its trainer, the loop. Rank 0 reports, evaluates
/// and writes the files.
fn run_rank(
    world: brigade_comm::Comm,
    layout: &Layout,
    cfg: Option<TrainConfig>,
    a: &TrainArgs,
    stop: &AtomicBool,
) -> Result<()> {
    let lead = world.rank() == 0;
    let mut tr = match (&a.resume, cfg) {
        (Some(dir), _) => {
            let before = brigade::train::persist::saved_config(dir)?;
            let tr = Trainer::resume_on_world(dir, a.steps, &world, layout)?;
            if lead {
                eprintln!("resuming {} at step {} of {}", dir.display(), tr.step, tr.cfg.steps);
                if tr.step >= tr.cfg.steps {
                    eprintln!(
                        "the run is complete: nothing to train (it is evaluated again); give --steps above {} to extend it",
                        tr.cfg.steps
                    );
                }
                if tr.cfg.steps != before.steps {
                    // the schedule's length is the run's: a longer run stretches it
                    use brigade::train::optimizer::LrSchedule;
                    let (old, new) = (LrSchedule::of(&before), LrSchedule::of(&tr.cfg));
                    eprintln!(
                        "note: {} → {} steps stretches the learning-rate schedule (warmup {} → {} steps, cosine to step {}): step {}'s lr is {:.3e}, where the {}-step run would have used {:.3e}; give the original --steps {} to continue it unchanged",
                        before.steps,
                        tr.cfg.steps,
                        old.warmup,
                        new.warmup,
                        tr.cfg.steps,
                        tr.step + 1,
                        new.at(tr.step),
                        before.steps,
                        old.at(tr.step),
                        before.steps
                    );
                }
            }
            tr
        }
        (None, Some(cfg)) => Trainer::on_world(cfg, &world, layout)?,
        (None, None) => unreachable!("a config without --resume"),
    };
    tr.set_bucket_elems(bucket_elems(a)?)?;
    if a.trace.is_some() {
        // every rank records its track; their clocks start together
        world.barrier()?;
        tr.timeline = Some(brigade::train::timeline::Timeline::new(world.rank()));
    }
    let opts = JobOptions {
        out: a.out.clone().or_else(|| a.resume.clone()),
        save_every: a.save_every,
        save_in_foreground: a.save_in_foreground,
        stop_after: a.stop_after,
        trace: a.trace.clone(),
        no_sample: a.no_sample,
    };
    let mut bar = Bar::new(world.rank() == 0, a);
    let outcome = brigade::with_threads(a.rank_threads(), || job::run(&mut tr, &opts, stop, &world, &mut bar))??;
    if let Some(msg) = outcome.interrupted_message() {
        return Err(Interrupted(msg).into());
    }
    if world.rank() == 0 {
        if let Outcome::Finished(report) = outcome {
            print_report(&tr, &report)?;
        }
    }
    Ok(())
}

/// `--print-schedule`: the lists each rank would run, and how they fare on paper (a forward 1,
/// a backward 2, transfers free).
fn print_schedule(a: &TrainArgs) -> Result<()> {
    let cfg = a.config()?;
    let l = parse_layout(a)?;
    if l.pp < 2 {
        bail!("'{l}' has no pipeline to schedule; give pp=2 or more");
    }
    let mb = l.micro_batch(cfg.batch, cfg.micro_batch)?;
    let plan = brigade::parallel::pipeline::build(l.schedule, l.pp, l.micro_batches(cfg.batch, mb), l.v)?;
    // the stages must fit the model as training would cut it (the same check, the same line)
    let mcfg = cfg.model_config(0)?;
    let seq = cfg.seq.unwrap_or(mcfg.block_size.min(256));
    brigade::parallel::pipeline::stages::stage_slots(&mcfg, l.pp, l.v, seq)?;
    outln!("{}", brigade::parallel::pipeline::chart(&plan).trim_end());
    let unit = brigade::parallel::pipeline::Costs::per_chunk(plan.v);
    let r = brigade::parallel::pipeline::simulate(&plan, &unit)
        .map_err(|e| anyhow::anyhow!("the schedule is broken: {e}"))?;
    let theory = (plan.pp - 1) as f64 / (plan.v * plan.m + plan.pp - 1) as f64;
    outln!(
        "simulated bubble {:.1}% ((pp−1)/(v·m+pp−1) = {:.1}%), micro-batch chunks holding activations per rank: {:?}",
        100.0 * r.bubble,
        100.0 * theory,
        r.peak_activations
    );
    Ok(())
}

/// Rank 0's progress bar and lines; the other ranks' is hidden. When stderr is not a terminal
/// (a log file, a pipe, CI) the bar would print nothing: a plain line every 5% of the run or 30
/// seconds instead.
struct Bar {
    lead: bool,
    bar: ProgressBar,
    threads: usize,
    layout: String,
    plain: Option<Plain>,
    /// `BRIGADE_PROGRESS=FILE` (set by `brigade launch`): rank 0 writes the last step it
    /// finished there, so that a supervisor knows how far a run that died had got.
    progress: Option<std::path::PathBuf>,
    /// After the last step: a thread that keeps the progress file fresh while the final save,
    /// gather and evaluation run (no step can finish then; the supervisor must not take the
    /// evaluation of a finished run for a hang). Stopped when the bar is dropped.
    heartbeat: Option<Heartbeat>,
}

/// Touches a file every half second until dropped.
/// Writes the progress file whole or not at all (beside it, then renamed over it): a rank killed
/// mid-write must not leave the supervisor an empty file, which reads as no step. A report, not
/// state: a write that fails costs the supervisor its count, no more.
fn write_progress(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("writing");
    if std::fs::write(&tmp, text).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}

struct Heartbeat {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Heartbeat {
    fn start(path: std::path::PathBuf) -> Heartbeat {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                // the content (the last step) stays; its time is what the supervisor watches
                if let Ok(step) = std::fs::read_to_string(&path) {
                    write_progress(&path, &step);
                }
                std::thread::sleep(std::time::Duration::from_millis(500));
            }
        });
        Heartbeat { stop, thread: Some(thread) }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The environment variable naming the file a run's last finished step is written to.
pub const PROGRESS_ENV: &str = "BRIGADE_PROGRESS";

struct Plain {
    every: usize,
    last: std::time::Instant,
    started: std::time::Instant,
    steps: usize,
}

impl Bar {
    fn new(lead: bool, a: &TrainArgs) -> Bar {
        use std::io::IsTerminal as _;
        let tty = std::io::stderr().is_terminal();
        let bar = if lead && tty { ProgressBar::new(0) } else { ProgressBar::hidden() };
        bar.set_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed_precise} eta {eta}]")
                .expect("valid template"),
        );
        let now = std::time::Instant::now();
        let plain = (lead && !tty).then_some(Plain { every: 1, last: now, started: now, steps: 0 });
        let progress = std::env::var_os(PROGRESS_ENV).filter(|_| lead).map(std::path::PathBuf::from);
        Bar {
            lead,
            bar,
            threads: a.rank_threads(),
            layout: a.layout.clone().unwrap_or_default(),
            plain,
            progress,
            heartbeat: None,
        }
    }

    /// A line above the bar (or on stderr when there is none).
    fn say(&mut self, line: String) {
        if self.bar.is_hidden() {
            eprintln!("{line}");
        } else {
            self.bar.println(line);
        }
    }
}

impl Observer for Bar {
    fn start(&mut self, tr: &Trainer) {
        if let Some(path) = &self.progress {
            write_progress(path, &format!("{}\n", tr.step));
        }
        let m = &tr.model.cfg;
        let (layout, per_rank) = match tr.mesh.shape.world() {
            1 => (String::new(), String::new()),
            n => (
                format!(" · {n} ranks ({})", self.layout),
                format!(", {:.2}M on this rank", tr.parts.layout.total as f64 / 1e6),
            ),
        };
        if self.lead {
            eprintln!(
                "model {} ({} layers, {} heads, {} wide, vocab {}, {:.2}M params{per_rank}) · {} · batch {} × seq {} · {} steps · {} threads{layout}",
                tr.cfg.model,
                m.n_layer,
                m.n_head,
                m.n_embd,
                m.vocab_size,
                m.num_params() as f64 / 1e6,
                match &tr.cfg.data {
                    Some(p) => format!("data {}", p.display()),
                    None => format!("built-in task: {}-digit addition", tr.cfg.digits),
                },
                tr.cfg.batch,
                tr.seq,
                tr.cfg.steps,
                self.threads
            );
        }
        self.bar.set_length(tr.cfg.steps as u64);
        self.bar.set_position(tr.step as u64);
        if let Some(p) = &mut self.plain {
            (p.every, p.steps) = ((tr.cfg.steps / 20).max(1), tr.cfg.steps);
        }
    }

    fn step(&mut self, s: &StepStats, rate: f64) {
        if let Some(path) = &self.progress {
            write_progress(path, &format!("{}\n", s.step));
        }
        self.bar.set_position(s.step as u64);
        self.bar.set_message(format!("loss {:.4} lr {:.2e} {:.0} tok/s", s.loss, s.lr, rate));
        if let Some(p) = &mut self.plain {
            let now = std::time::Instant::now();
            // the first step, then every 5% of the run or 30 seconds, and the last
            let first = p.last == p.started;
            if first
                || s.step.is_multiple_of(p.every)
                || now.duration_since(p.last).as_secs() >= 30
                || s.step == p.steps
            {
                p.last = now;
                eprintln!(
                    "step {}/{}  loss {:.4}  lr {:.2e}  {:.0} tok/s  {:.1}s elapsed",
                    s.step,
                    p.steps,
                    s.loss,
                    s.lr,
                    rate,
                    now.duration_since(p.started).as_secs_f64()
                );
            }
        }
    }

    fn evaluated(&mut self, s: &StepStats, r: &EvalReport) {
        self.say(format!("step {:>6}  loss {:.4}  {r}", s.step, s.loss));
    }

    fn evaluated_start(&mut self, r: &EvalReport) {
        self.say(format!("step {:>6}  the --init model: {r}", 0));
    }

    fn stepped(&mut self) {
        self.bar.finish_and_clear();
        // the steps are over: the final save, gather and evaluation take seconds of their own
        if let (Some(path), None) = (&self.progress, &self.heartbeat) {
            self.heartbeat = Some(Heartbeat::start(path.clone()));
        }
    }
}

/// Rank 0's summary of a finished job.
fn print_report(tr: &Trainer, r: &JobReport) -> Result<()> {
    eprintln!("{} steps in {:.1}s ({:.0} tokens/s), final loss {:.4}", r.steps, r.secs, r.tokens_per_s, r.final_loss);
    if let Some(dir) = &r.saved {
        eprintln!("checkpoint written to {}", dir.display());
    }
    let periodic: Vec<_> = r.saves.iter().take(r.saves.len().saturating_sub(1)).collect();
    if !periodic.is_empty() {
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
        };
        let stall = median(periodic.iter().map(|s| s.stall_s).collect());
        let write = median(periodic.iter().filter_map(|s| s.write_s).collect());
        let how = if periodic[0].background { "in the background" } else { "in the foreground" };
        eprintln!(
            "{} periodic checkpoints written {how}: each held its step {:.3}s (median), the files took {:.2}s",
            periodic.len(),
            stall,
            write
        );
    }
    if r.ranks.len() > 1 {
        eprintln!(
            "seconds per rank over these steps (compute · optimizer · exposed communication · waiting for stages · other):"
        );
        for (i, t) in r.ranks.iter().enumerate() {
            let c = tr.mesh.shape.coords(i);
            let piped = match tr.pipeline_plan() {
                Some(_) => format!(" · pipeline bubble {:.1}%", 100.0 * t.bubble),
                None => String::new(),
            };
            let cp = if tr.mesh.shape.degree(Axis::Cp) > 1 { format!(" cp {}", c[Axis::Cp]) } else { String::new() };
            eprintln!(
                "  rank {i} (dp {} pp {}{cp} tp {}): {:.2} · {:.2} · {:.2} · {:.2} · {:.2}{piped}",
                c[Axis::Dp],
                c[Axis::Pp],
                c[Axis::Tp],
                t.compute_s,
                t.optimizer_s,
                t.comm_s,
                t.wait_s,
                t.idle_s
            );
        }
    }
    if let (Some(plan), Some((mean, theory))) = (tr.pipeline_plan(), r.bubble) {
        eprintln!(
            "pipeline {} · pp={} · v={} · {} micro-batches: bubble measured {:.1}% (mean over ranks), theory {:.1}%",
            plan.kind.name(),
            plan.pp,
            plan.v,
            plan.m,
            100.0 * mean,
            100.0 * theory
        );
    }
    if let Some((path, spans)) = &r.trace {
        eprintln!("timeline ({spans} spans, a track per rank) written to {}", path.display());
    }
    let Some(report) = &r.eval else { return Ok(()) };
    outln!("{report}");
    if let EvalReport::Addition { examples, .. } = report {
        outln!("held-out problems (model's answer):");
        for (q, want, got) in examples {
            let mark = if want == got { "ok" } else { "WRONG" };
            outln!("  {q} = {got:<6} {mark}");
        }
    }
    if let Some(sample) = &r.sample {
        outln!("sample: {sample}");
    }
    Ok(())
}
