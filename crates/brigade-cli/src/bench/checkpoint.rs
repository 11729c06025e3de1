//! `brigade bench checkpoint`: what a periodic checkpoint costs the training it interrupts,
//! written in the foreground against written in the background, side by side in one run.

use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct Flags {
    #[command(flatten)]
    pub(crate) shape: super::args::ShapeArgs,
    /// Periodic saves in each run (a save after each of the first N steps).
    #[arg(long, default_value_t = 3)]
    pub(crate) saves: usize,
    /// Where the checkpoints are written (default: a temporary directory in the system's).
    #[arg(long)]
    pub(crate) dir: Option<PathBuf>,
}

pub fn run(f: Flags) -> Result<()> {
    let Flags { shape: super::args::ShapeArgs { model, seq, batch, threads, json }, saves, dir } = f;
    if saves == 0 {
        bail!("--saves must be at least 1");
    }
    let shape = crate::plan_cmd::step_shape(&model, batch, seq, threads)?;
    let parent = dir.unwrap_or_else(std::env::temp_dir);
    let tmp = parent.join(format!(".brigade-bench-checkpoint-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).with_context(|| format!("cannot make {} for the checkpoints", tmp.display()))?;
    // a generated text (bytes as tokens) at the step's shape: the addition task fixes its own
    let corpus = tmp.join("corpus.txt");
    let words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "and", "runs", "far"];
    let text: Vec<&str> = (0..400_000usize).map(|i| words[(i * 7 + i / 13) % words.len()]).collect();
    std::fs::write(&corpus, text.join(" ")).with_context(|| format!("cannot write {}", corpus.display()))?;
    let cfg = brigade::train::TrainConfig {
        model: model.clone(),
        data: Some(corpus),
        vocab_size: Some(shape.vocab_size),
        seq: Some(seq),
        batch,
        ..brigade::train::TrainConfig::default()
    };
    let r = brigade::with_threads(threads, || brigade::bench::checkpoint::save_stall(cfg, saves, &tmp));
    let _ = std::fs::remove_dir_all(&tmp);
    let r = r??;
    if json {
        let mut v = serde_json::to_value(&r)?;
        v["bench"] = "checkpoint".into();
        v["model"] = model.into();
        outln!("{v}");
        return Ok(());
    }
    outln!(
        "{model} ({:.1}M params, checkpoint {:.0} MB), batch {batch} × seq {seq}, {threads} threads, {saves} saves a run, in {}",
        r.params as f64 / 1e6,
        r.bytes as f64 / 1e6,
        parent.display()
    );
    outln!(
        "{:<11} {:>8} {:>14} {:>10} {:>14} {:>13}",
        "saves",
        "job s",
        "stall/save s",
        "write s",
        "write CPU s",
        "cost/save s"
    );
    for m in &r.modes {
        outln!(
            "{:<11} {:>8.2} {:>14.3} {:>10.3} {:>14.3} {:>13.3}",
            m.mode,
            m.job_s,
            m.stall_s,
            m.write_s,
            m.write_cpu_s,
            m.cost_per_save_s
        );
    }
    let (fg, bg) = (&r.modes[1], &r.modes[2]);
    outln!(
        "the step's wait per save, background against foreground: {:.3} s vs {:.3} s = {:.1}× less",
        bg.stall_s,
        fg.stall_s,
        fg.stall_s / bg.stall_s
    );
    outln!(
        "the job's time per save (stall, and the writer's CPU taken from training): {:.3} s vs {:.3} s = {:.2}×",
        bg.cost_per_save_s,
        fg.cost_per_save_s,
        fg.cost_per_save_s / bg.cost_per_save_s
    );
    Ok(())
}
