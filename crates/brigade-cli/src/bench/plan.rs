//! `brigade bench plan`: the planner's local prediction of a training step beside a real run
//! of it. With `--layout …`: the planner's prediction of a parallel layout's step on
//! this machine, beside a run of it. The prediction is built from measurements only: one
//! rank's work at its micro-batch and tensor slice, the all-reduces of its groups, the memory
//! bandwidth, and the schedule's simulated pipeline (`plan::local::predict_parallel`).

use super::args::{ShapeArgs, StepArgs};
use anyhow::{bail, Result};
use brigade::plan::local::{Collectives, LocalRun};
use clap::Args;

#[derive(Args, Debug)]
pub struct Flags {
    #[command(flatten)]
    pub(crate) step: StepArgs,
    /// A training layout, e.g. dp=2 or dp=2,pp=2,tp=2 or pp=2,schedule=zb,mb=1.
    #[arg(long)]
    pub(crate) layout: Option<String>,
    /// Sequences per forward pass on a rank (default: the layout's mb, else the rank's
    /// whole share).
    #[arg(long)]
    pub(crate) micro_batch: Option<usize>,
}

pub fn run(f: Flags) -> Result<()> {
    if let Some(layout) = &f.layout {
        return run_layout(&f.step, layout, f.micro_batch);
    }
    let StepArgs { shape: ShapeArgs { model, seq, batch, threads, json }, steps } = f.step;

    if steps == 0 {
        bail!("--steps must be at least 1");
    }
    let (cfg, _, p) = crate::plan_cmd::local_prediction(&model, batch, seq, threads)?;
    let r = brigade::with_threads(threads, || brigade::bench::train_step(cfg, batch, seq, 1, steps))??;
    let ratio = p.step_s / r.step_s_median;
    if json {
        outln!(
            "{}",
            serde_json::json!({"bench": "plan", "model": model, "batch": batch, "seq": seq, "threads": threads,
            "predicted_step_s": p.step_s, "measured_step_s": r.step_s_median, "predicted_over_measured": ratio, "parts": p})
        );
    } else {
        outln!(
            "{model}, batch {batch} × seq {seq}, {threads} threads: predicted {:.4} s, measured {:.4} s (median of {steps}) → predicted/measured {:.3}",
            p.step_s, r.step_s_median, ratio
        );
    }
    Ok(())
}

fn run_layout(step: &StepArgs, layout: &str, micro_batch: Option<usize>) -> Result<()> {
    let StepArgs { shape: ShapeArgs { model, seq, batch, threads, json }, steps } = step;
    let (model, seq, batch, threads, steps, json) = (model.as_str(), *seq, *batch, *threads, *steps, *json);
    if steps == 0 {
        bail!("--steps must be at least 1");
    }
    let bucket = brigade::parallel::data::DataParallel::default().bucket_elems;
    let mut l = brigade::layout::Layout::parse(layout)?;
    l.check_training()?;
    crate::threads::check_threads(l.world() * threads, &format!("layout '{layout}': ranks × --threads"))?;
    let mb = l.micro_batch(batch, micro_batch)?;
    l.mb = Some(mb);
    let cfg = crate::plan_cmd::step_shape(model, mb, seq, threads)?;
    // the groups' all-reduces first: rayon's workers spin for a while after compute and would
    // steal the cores the rank threads' barriers spin on
    let group = |n: usize| -> Result<Collectives> {
        Ok(match n {
            1 => Collectives { ranks: 1, latency_us: 0.0, busbw_gbps: 1.0 },
            n => brigade::bench::machine::measure_collectives(n)?,
        })
    };
    let (tp_coll, dp_coll) = (group(l.tp)?, group(l.dp)?);
    let machine = brigade::with_threads(threads, || brigade::bench::machine::measure(&cfg, mb, seq, l.tp))?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let run = LocalRun { layout: l, bucket_elems: bucket, batch, micro_batch: mb, seq, threads, cores };
    let p = brigade::plan::local::predict_parallel(&cfg, &run, &machine, &tp_coll, &dp_coll)?;
    let (train, dir) = super::args::text_run(model, seq, batch, Some(mb), steps + 2)?;
    let r = brigade::bench::parallel_step(train, &l, bucket, threads, 1, steps);
    let _ = std::fs::remove_dir_all(&dir);
    let r = r?;
    let ratio = p.step_s / r.step_s_median;
    if json {
        outln!(
            "{}",
            serde_json::json!({"bench": "plan", "model": model, "layout": layout, "batch": batch, "micro_batch": mb,
                "seq": seq, "threads": threads, "cores": cores, "predicted_step_s": p.step_s,
                "measured_step_s": r.step_s_median, "predicted_over_measured": ratio,
                "bubble_measured": r.bubble_measured, "parts": p})
        );
        return Ok(());
    }
    outln!(
        "{model} {layout}, batch {batch} (micro-batches of {mb}) × seq {seq}, {threads} thread(s) per rank on {cores} cores: predicted {:.3} s, measured {:.3} s (median of {steps}) → predicted/measured {:.3}",
        p.step_s,
        r.step_s_median,
        ratio
    );
    let pct = |x: f64| format!("{:.1}%", 100.0 * x);
    outln!(
        "  predicted: pipeline {:.3} s (stage forward {:.4} + backward {:.4} + weight gradients {:.4} per micro-batch; bubble {:.3} s = {}), tensor-parallel collectives {:.3} s, data-parallel exposed {:.3} s, optimizer {:.3} s, cores floor {:.3} s",
        p.pipeline_s,
        p.stage_s[0],
        p.stage_s[1],
        p.stage_s[2],
        p.bubble_s,
        pct(p.bubble),
        p.tp_comm_s,
        p.dp_exposed_s,
        p.optimizer_s,
        p.cores_floor_s
    );
    outln!(
        "  measured: compute {:.3} s, optimizer {:.3} s, exposed communication {:.3} s (tp {:.3}, dp {:.3}, pp {:.3}), waiting for stages {:.3} s, other {:.3} s{}",
        r.compute_s,
        r.optimizer_s,
        r.exposed_comm_s,
        r.tp_comm_s,
        r.dp_comm_s,
        r.pp_comm_s,
        r.pipeline_wait_s,
        r.other_s,
        r.bubble_measured.map_or(String::new(), |b| format!(", bubble {}", pct(b)))
    );
    Ok(())
}
