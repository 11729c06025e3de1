pub use crate::train_args::TrainArgs;
use anyhow::{bail, Context, Result};
use brigade::layout::Layout;
use brigade::train::{EvalReport, TrainConfig, Trainer};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// A run ended early by SIGINT or SIGTERM (after saving, where it could): exit status 130.
#[derive(Debug)]
pub struct Interrupted(pub String);

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Interrupted {}

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
fn interrupt_flag() -> Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register_conditional_shutdown(sig, 130, Arc::clone(&flag))?;
        signal_hook::flag::register(sig, Arc::clone(&flag))?;
    }
    Ok(flag)
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

pub fn run(a: TrainArgs) -> Result<()> {
    crate::check_threads(a.threads, "--threads")?;
    if a.print_schedule {
        return print_schedule(&a);
    }
    if a.save_every.is_some() && a.out.is_none() {
        bail!("--save-every needs --out DIR to write checkpoints to");
    }
    let layout = parse_layout(&a)?;
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
            bail!("{} cannot change on --resume (the run's settings come from its checkpoint); only --steps, --threads, --layout, --out, --save-every may be given", fixed.join(", "));
        }
    }
    let cfg = if a.resume.is_some() { None } else { Some(a.config()?) };
    let stop = interrupt_flag()?;
    match a.backend.as_str() {
        "local" => {
            let world = layout.world();
            crate::check_threads(world, "the layout's rank count")?;
            crate::check_threads(world * a.threads, "ranks × --threads")?;
            if world == 1 {
                return run_rank(brigade_comm::local::solo(), &layout, cfg, &a, &stop);
            }
            brigade_comm::local::run(world, |comm| run_rank(comm, &layout, cfg.clone(), &a, &stop)).map(|_| ()).map_err(
                |e| {
                    // every rank refuses a bad setting alike: say it once
                    let first = e.failures[0].1.clone();
                    if first.starts_with("interrupted") {
                        Interrupted(first).into()
                    } else if e.failures.iter().all(|(_, m)| *m == first) {
                        anyhow::anyhow!("{first}")
                    } else {
                        anyhow::anyhow!("{e}")
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
            let tr = Trainer::resume_on_world(dir, a.steps, &world, layout)?;
            if lead {
                eprintln!("resuming {} at step {} of {}", dir.display(), tr.step, tr.cfg.steps);
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
    let out = a.out.clone().or_else(|| a.resume.clone());
    brigade::with_threads(a.threads, || train_loop(&mut tr, a, out, stop, &world))?
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

/// Every rank's seconds in compute, exposed communication and idle over the steps this process
/// took (from `start`), and its mean pipeline bubble, on every rank.
fn rank_times(tr: &Trainer, start: usize, world: &brigade_comm::Comm) -> Result<Vec<[f32; 4]>> {
    let mut mine = [0f32; 4];
    let steps = tr.history.iter().filter(|s| s.step > start).count().max(1);
    for s in tr.history.iter().filter(|s| s.step > start) {
        mine[0] += s.compute_s as f32;
        mine[1] += s.comm_s as f32;
        mine[2] += s.idle_s as f32;
        mine[3] += s.bubble as f32 / steps as f32;
    }
    let mut all = vec![0f32; 4 * world.size()];
    if world.size() > 1 {
        world.all_gather(&mine, &mut all)?;
    } else {
        all.copy_from_slice(&mine);
    }
    Ok(all.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]).collect())
}

/// Whether any rank was asked to stop: every rank must stop after the same step.
fn any_rank_stopping(world: &brigade_comm::Comm, stop: &AtomicBool) -> Result<bool> {
    let mut v = [stop.load(Ordering::Relaxed) as u8 as f32];
    if world.size() > 1 {
        world.all_reduce(&mut v, brigade_comm::ReduceOp::Max)?;
    }
    Ok(v[0] > 0.0)
}

fn train_loop(
    tr: &mut Trainer,
    a: &TrainArgs,
    out: Option<PathBuf>,
    stop: &AtomicBool,
    world: &brigade_comm::Comm,
) -> Result<()> {
    let lead = world.rank() == 0;
    let m = &tr.model.cfg;
    let layout = match world.size() {
        1 => String::new(),
        n => format!(" · {n} ranks ({})", a.layout.as_deref().unwrap_or_default()),
    };
    if lead {
        eprintln!(
            "model {} ({} layers, {} heads, {} wide, vocab {}, {:.2}M params) · {} · batch {} × seq {} · {} steps · {} threads{layout}",
            tr.cfg.model,
            m.n_layer,
            m.n_head,
            m.n_embd,
            m.vocab_size,
            tr.model.num_params() as f64 / 1e6,
            match &tr.cfg.data {
                Some(p) => format!("data {}", p.display()),
                None => format!("built-in task: {}-digit addition", tr.cfg.digits),
            },
            tr.cfg.batch,
            tr.seq,
            tr.cfg.steps,
            a.threads
        );
    }
    let bar = if lead { ProgressBar::new(tr.cfg.steps as u64) } else { ProgressBar::hidden() };
    bar.set_position(tr.step as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed_precise} eta {eta}]")
            .expect("valid template"),
    );
    let t0 = Instant::now();
    let start_step = tr.step;
    let stop_at = a.stop_after.map(|s| s.min(tr.cfg.steps)).unwrap_or(tr.cfg.steps);
    while tr.step < stop_at {
        let s = tr.train_step()?;
        let rate = (tr.step - start_step) as f64 * tr.tokens_per_step() as f64 / t0.elapsed().as_secs_f64();
        bar.set_position(s.step as u64);
        bar.set_message(format!("loss {:.4} lr {:.2e} {:.0} tok/s", s.loss, s.lr, rate));
        if tr.cfg.eval_every > 0 && s.step % tr.cfg.eval_every == 0 && s.step < tr.cfg.steps {
            // the model cut across a tensor-parallel group is gathered by its ranks; rank 0 evaluates
            let full = tr.full_params()?;
            if lead {
                let t0 = Instant::now();
                let r = tr.evaluate_with(full.as_deref());
                tr.trace("evaluate", "eval", s.step, t0);
                let line = format!("step {:>6}  loss {:.4}  {r}", s.step, s.loss);
                if bar.is_hidden() {
                    eprintln!("{line}");
                } else {
                    bar.println(line);
                }
            }
        }
        if let (Some(dir), Some(every)) = (&out, a.save_every) {
            if every > 0 && s.step % every == 0 {
                let t0 = Instant::now();
                tr.save(dir)?;
                tr.trace("checkpoint", "io", s.step, t0);
            }
        }
        if any_rank_stopping(world, stop)? && tr.step < tr.cfg.steps {
            bar.finish_and_clear();
            let msg = match &out {
                Some(dir) => {
                    tr.save(dir)?;
                    format!(
                        "interrupted after step {} of {}; checkpoint written to {}: continue with --resume {}",
                        tr.step,
                        tr.cfg.steps,
                        dir.display(),
                        dir.display()
                    )
                }
                None => format!("interrupted after step {} of {}; nothing saved (no --out)", tr.step, tr.cfg.steps),
            };
            return Err(Interrupted(msg).into());
        }
    }
    bar.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    if let Some(dir) = &out {
        tr.save(dir)?;
    }
    let full = if tr.step < tr.cfg.steps { None } else { tr.full_params()? };
    let trace = match &tr.timeline {
        Some(tl) => tl.gather(world)?,
        None => None,
    };
    let times = rank_times(tr, start_step, world)?;
    if !lead {
        return Ok(());
    }
    eprintln!(
        "{} steps in {:.1}s ({:.0} tokens/s), final loss {:.4}",
        tr.step - start_step,
        secs,
        (tr.step - start_step) as f64 * tr.tokens_per_step() as f64 / secs,
        tr.losses.last().copied().unwrap_or(f32::NAN)
    );
    if let Some(dir) = &out {
        eprintln!("checkpoint written to {}", dir.display());
    }
    if world.size() > 1 {
        eprintln!("seconds per rank over these steps (compute · exposed communication · idle):");
        for (r, [compute, comm, idle, bubble]) in times.iter().enumerate() {
            let c = tr.mesh.shape.coords(r);
            let piped = match &tr.plan {
                Some(_) => format!(" · pipeline bubble {:.1}%", 100.0 * bubble),
                None => String::new(),
            };
            eprintln!("  rank {r} (dp {} pp {} tp {}): {compute:.2} · {comm:.2} · {idle:.2}{piped}", c.dp, c.pp, c.tp);
        }
    }
    if let Some(plan) = &tr.plan {
        let theory = brigade::parallel::pipeline::simulate::bubble_theory(plan);
        let mean = times.iter().map(|t| t[3] as f64).sum::<f64>() / times.len() as f64;
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
    if let (Some(path), Some(trace)) = (&a.trace, &trace) {
        brigade::train::timeline::write_trace(path, trace)?;
        let spans = trace["traceEvents"].as_array().map_or(0, |e| e.len());
        eprintln!("timeline ({spans} spans, a track per rank) written to {}", path.display());
    }
    if tr.step < tr.cfg.steps {
        return Ok(());
    }
    let report = tr.evaluate_with(full.as_deref());
    outln!("{report}");
    match &report {
        EvalReport::Addition { examples, .. } => {
            outln!("held-out problems (model's answer):");
            for (q, want, got) in examples {
                let mark = if want == got { "ok" } else { "WRONG" };
                outln!("  {q} = {got:<6} {mark}");
            }
        }
        EvalReport::Text { .. } => {
            let prompt = tr.data_prompt();
            let opt = brigade::models::SampleOptions {
                max_new_tokens: 64,
                temperature: 0.8,
                top_k: 40,
                top_p: 1.0,
                seed: 0,
                stop: None,
            };
            let ids = tr.tokenizer.encode(&prompt)?;
            let (model, params) = tr.whole_model(full.as_deref());
            let gen = brigade::models::generate(model, params, &[ids], &opt);
            outln!("sample: {}{}", prompt, tr.tokenizer.decode(&gen[0]));
        }
    }
    Ok(())
}
