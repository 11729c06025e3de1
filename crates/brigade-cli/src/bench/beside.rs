//! `brigade bench beside`: what this machine takes from ranks run side by side, before any
//! communication — each kernel and one worker's training step alone on a core, then as
//! independent copies at once — and so the ceiling of a layout's speedup, beside the
//! layouts themselves (with --layouts) as a fraction of it.

use anyhow::{bail, Result};
use clap::Args;

#[derive(Args, Debug)]
pub struct Flags {
    /// Copies run at once (the rank threads of the layouts compared).
    #[arg(long, default_value_t = 2)]
    pub(crate) copies: usize,
    #[arg(long, default_value = "gpt2-small")]
    pub(crate) model: String,
    #[arg(long, default_value_t = 256)]
    pub(crate) seq: usize,
    /// Global batch in sequences: one worker runs all of it alone, each copy its share.
    #[arg(long, default_value_t = 8)]
    pub(crate) batch: usize,
    /// Intra-op threads per copy (and per rank of --layouts).
    #[arg(long, default_value_t = 1)]
    pub(crate) threads: usize,
    /// Training steps timed per measurement (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub(crate) steps: usize,
    /// Runs timed per kernel (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub(crate) reps: usize,
    /// Layouts of --copies ranks to run after, as `bench parallel --layouts`, each reported
    /// against the ceiling (e.g. "dp=2;pp=2,mb=1").
    #[arg(long, default_value = "")]
    pub(crate) layouts: String,
    /// Skip the kernels (only the training steps and the layouts).
    #[arg(long)]
    pub(crate) no_kernels: bool,
    /// Rounds of the whole measurement, one after another (this machine's speed drifts
    /// between minutes: each round's ratios are taken within it, then their medians).
    #[arg(long, default_value_t = 1)]
    pub(crate) rounds: usize,
    #[arg(long)]
    pub(crate) json: bool,
}

/// One round's figures: every ratio is taken within its round.
struct Round {
    kernels: Vec<brigade::bench::beside::Kernel>,
    whole_s: f64,
    share_alone_s: f64,
    share_beside_s: f64,
    /// Per layout, medians over its paired steps: its speedup, the ceiling beside it, and the
    /// schedule's bubble on paper.
    layouts: Vec<Layout>,
}

struct Layout {
    speedup: f64,
    ceiling: f64,
    /// The ceiling of copies that run the layout's micro-batches (where it names smaller ones).
    micro_ceiling: Option<f64>,
    bubble: Option<f64>,
}

impl Layout {
    /// A pipeline's schedule idles its stages for its bubble even on a machine that takes
    /// nothing: its ceiling is the copies' times the busy share.
    fn own_ceiling(&self) -> f64 {
        self.ceiling * (1.0 - self.bubble.unwrap_or(0.0))
    }
    /// The same with the copies on the layout's micro-batches.
    fn own_micro_ceiling(&self) -> Option<f64> {
        self.micro_ceiling.map(|c| c * (1.0 - self.bubble.unwrap_or(0.0)))
    }
}

impl Round {
    /// A layout of `copies` ranks cannot beat `copies` workers that split the batch and never talk.
    fn ceiling(&self) -> f64 {
        self.whole_s / self.share_beside_s
    }
}

pub fn run(f: Flags) -> Result<()> {
    let Flags { copies, model, seq, batch, threads, steps, reps, layouts, no_kernels, rounds, json } = f;
    crate::threads::check_threads(copies * threads, "--copies × --threads")?;
    if copies < 2 {
        bail!("--copies must be at least 2 (one copy has nothing beside it)");
    }
    if steps == 0 || reps == 0 || rounds == 0 {
        bail!("--steps, --reps and --rounds must be at least 1");
    }
    if !batch.is_multiple_of(copies) {
        bail!("--batch {batch} does not split into {copies} copies: give a multiple of {copies}");
    }
    let parsed = super::args::training_layouts(&layouts, |l, layout| {
        if layout.world() != copies {
            bail!("layout '{l}' has {} ranks, not --copies {copies}: its ceiling is another one", layout.world());
        }
        Ok(())
    })?;
    let (cfg, dir) = super::args::text_run(&model, seq, batch, None, steps + 3)?;
    let share = brigade::train::TrainConfig { batch: batch / copies, ..cfg.clone() };
    let bucket = brigade::parallel::data::DataParallel::default().bucket_elems;
    // every pairing's memory checked before the first is timed (the largest holds 2N + 1
    // trainers at once)
    for (_, layout) in &parsed {
        let micro = brigade::bench::beside::micro_batch_of(layout, batch / copies);
        let fits = brigade::bench::beside::pairing_fits(&cfg, layout, micro, brigade::train::memory::available_bytes());
        if let Err(e) = fits {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e.into());
        }
    }
    let mut all = Vec::new();
    for _ in 0..rounds {
        let kernels = if no_kernels { Vec::new() } else { brigade::bench::beside::kernels(copies, reps)? };
        let step = |c: &brigade::train::TrainConfig, n| brigade::bench::beside::worker_step_s(c, n, threads, steps);
        let mut r = Round {
            kernels,
            whole_s: step(&cfg, 1)?,
            share_alone_s: step(&share, 1)?,
            share_beside_s: step(&share, copies)?,
            layouts: Vec::new(),
        };
        for (_, layout) in &parsed {
            let micro = brigade::bench::beside::micro_batch_of(layout, batch / copies);
            let (paired, bubble) = brigade::bench::beside::paired_steps(&cfg, layout, bucket, threads, steps)?;
            let med = |f: fn(&brigade::bench::beside::Paired) -> f64| {
                brigade::bench::median(&paired.iter().map(f).collect::<Vec<_>>())
            };
            r.layouts.push(Layout {
                speedup: med(|p| p.speedup()),
                ceiling: med(|p| p.ceiling()),
                micro_ceiling: micro.map(|_| med(|p| p.micro_ceiling())),
                bubble,
            });
        }
        if !json {
            print_round(&r, all.len() + 1, rounds, copies, &parsed)?;
        }
        all.push(r);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let med = |f: &dyn Fn(&Round) -> f64| brigade::bench::median(&all.iter().map(f).collect::<Vec<_>>());
    let r3 = |x: f64| (x * 1000.0).round() / 1000.0;
    let own = |r: &Round, i: usize| r.layouts[i].own_ceiling();
    // (None for a layout whose micro-batch is its whole share: it has the one ceiling)
    let micro = |i: usize, f: &dyn Fn(&Round, f64) -> f64| {
        all[0].layouts[i]
            .micro_ceiling
            .map(|_| med(&|r| f(r, r.layouts[i].own_micro_ceiling().expect("the same layout every round"))))
    };
    let speedup = |r: &Round, i: usize| r.layouts[i].speedup;
    if json {
        let kernels: Vec<_> = (0..all[0].kernels.len())
            .map(|k| {
                serde_json::json!({"name": all[0].kernels[k].name, "unit": all[0].kernels[k].unit,
                    "alone": r3(med(&|r| r.kernels[k].alone)), "beside": r3(med(&|r| r.kernels[k].beside)),
                    "slowdown": r3(med(&|r| r.kernels[k].slowdown()))})
            })
            .collect();
        let rows: Vec<_> = parsed
            .iter()
            .enumerate()
            .map(|(i, (l, _))| {
                serde_json::json!({"layout": l, "speedup": r3(med(&|r| speedup(r, i))),
                    "ceiling": r3(med(&|r| own(r, i))), "of_ceiling": r3(med(&|r| speedup(r, i) / own(r, i))),
                    "ceiling_micro_batched": micro(i, &|_, c| c).map(r3),
                    "of_ceiling_micro_batched": micro(i, &|r, c| speedup(r, i) / c).map(r3),
                    "bubble_theory": all[0].layouts[i].bubble})
            })
            .collect();
        outln!(
            "{}",
            serde_json::json!({"bench": "beside", "copies": copies, "model": model, "batch": batch, "seq": seq,
                "threads": threads, "rounds": rounds, "kernels": kernels,
                "step_s": {"whole_alone": r3(med(&|r| r.whole_s)), "share_alone": r3(med(&|r| r.share_alone_s)),
                    "share_beside": r3(med(&|r| r.share_beside_s))},
                "ceiling": r3(med(&|r| r.ceiling())), "layouts": rows})
        );
    } else if rounds > 1 {
        outln!("medians of {rounds} rounds (each ratio taken within its round):");
        for k in 0..all[0].kernels.len() {
            outln!("  {:<36} slowdown beside {:.3}x", all[0].kernels[k].name, med(&|r| r.kernels[k].slowdown()));
        }
        outln!(
            "  a copy's step beside the others: {:.3}x slower; ceiling of {copies} ranks {:.2}x",
            med(&|r| r.share_beside_s / r.share_alone_s),
            med(&|r| r.ceiling())
        );
        for (i, (l, _)) in parsed.iter().enumerate() {
            let of_micro = match (micro(i, &|_, c| c), micro(i, &|r, c| speedup(r, i) / c)) {
                (Some(c), Some(f)) => format!("; of the micro-batched copies' {c:.2}x ({:.1}%)", 100.0 * f),
                _ => String::new(),
            };
            outln!(
                "  {l:<28} {:.2}x of ceiling {:.2}x ({:.1}%){of_micro}",
                med(&|r| speedup(r, i)),
                med(&|r| own(r, i)),
                100.0 * med(&|r| speedup(r, i) / own(r, i)),
            );
        }
    }
    Ok(())
}

fn print_round(
    r: &Round,
    n: usize,
    rounds: usize,
    copies: usize,
    parsed: &[(String, brigade::layout::Layout)],
) -> Result<()> {
    if rounds > 1 {
        outln!("round {n} of {rounds}");
    }
    if !r.kernels.is_empty() {
        outln!("kernels on one core alone, then {copies} copies at once (the slowest copy's rate)");
        outln!("{:<36} {:>10} {:>10} {:>10}", "kernel", "alone", format!("×{copies}"), "slowdown");
        for k in &r.kernels {
            outln!("{:<36} {:>10.1} {:>10.1} {:>9.3}x  {}/s", k.name, k.alone, k.beside, k.slowdown(), k.unit);
        }
    }
    outln!(
        "one worker's step: {:.3} s alone on the whole batch; on its share of {copies}: {:.3} s alone, {:.3} s as \
         {copies} copies at once ({:.3}x slower)",
        r.whole_s,
        r.share_alone_s,
        r.share_beside_s,
        r.share_beside_s / r.share_alone_s
    );
    outln!(
        "ceiling of {copies} ranks on this machine (no communication): {:.2}x ({:.2}x if the copies did not slow \
         each other)",
        r.ceiling(),
        r.whole_s / r.share_alone_s
    );
    if !parsed.is_empty() {
        outln!("each layout's steps paired with the whole batch on one worker and {copies} copies on their shares, in turn:");
        outln!("(micro-batched: the copies run their shares in the layout's micro-batches, as its products do)");
        outln!(
            "{:<28} {:>9} {:>9} {:>10} {:>14} {:>10} {:>10}",
            "layout",
            "speedup",
            "ceiling",
            "of ceiling",
            "micro-batched",
            "of it",
            "bubble"
        );
    }
    for ((l, _), x) in parsed.iter().zip(&r.layouts) {
        outln!(
            "{l:<28} {:>8.2}x {:>8.2}x {:>9.1}% {:>14} {:>10} {:>10}",
            x.speedup,
            x.own_ceiling(),
            100.0 * x.speedup / x.own_ceiling(),
            x.own_micro_ceiling().map_or("-".to_string(), |c| format!("{c:.2}x")),
            x.own_micro_ceiling().map_or("-".to_string(), |c| format!("{:.1}%", 100.0 * x.speedup / c)),
            x.bubble.map_or("-".to_string(), |b| format!("{:.1}%", 100.0 * b))
        );
    }
    Ok(())
}
