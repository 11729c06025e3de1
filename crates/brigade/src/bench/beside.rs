//! What the machine itself takes from ranks run side by side: each kernel, and one worker's
//! whole training step, timed alone on one core and then as `copies` independent copies at
//! once, one core each, sharing nothing but the machine (its last-level cache, its memory
//! bandwidth, its clocks). A copy's loss beside the others is lost by every layout of that
//! many rank threads too, whatever its communication does: the ceiling of their speedup.

use super::median;
use crate::parallel::pipeline::RankModel;
use crate::tensor::matmul;
use crate::train::{TrainConfig, Trainer};
use std::sync::Barrier;
use std::time::Instant;

/// One kernel's rate alone and beside: `unit` per second on one copy.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Kernel {
    pub name: &'static str,
    pub unit: &'static str,
    pub alone: f64,
    /// The slowest copy's rate when `copies` ran at once.
    pub beside: f64,
}

impl Kernel {
    /// How much slower a copy runs beside the others (1.0: not at all).
    pub fn slowdown(&self) -> f64 {
        self.alone / self.beside
    }
}

/// Median seconds of `run` over `reps` runs in each of `copies` threads started together
/// (a barrier before every run), each thread in a pool of `threads`; the slowest copy's.
pub fn side_by_side<S>(
    copies: usize,
    threads: usize,
    reps: usize,
    setup: impl Fn() -> crate::Result<S> + Sync,
    run: impl Fn(&mut S) -> crate::Result<()> + Sync,
) -> crate::Result<f64> {
    let go = Barrier::new(copies);
    let per_copy = std::thread::scope(|s| {
        let handles: Vec<_> = (0..copies)
            .map(|_| {
                s.spawn(|| {
                    crate::with_threads(threads, || -> crate::Result<f64> {
                        // a copy that fails stops working but still meets the others at
                        // every barrier, so that none waits for it forever
                        let mut state = setup();
                        let step = |state: &mut crate::Result<S>| {
                            if let Ok(s) = state {
                                if let Err(e) = run(s) {
                                    *state = Err(e);
                                }
                            }
                        };
                        step(&mut state); // warm: pages touched, buffers allocated
                        let mut times = Vec::new();
                        for _ in 0..reps {
                            go.wait();
                            let t0 = Instant::now();
                            step(&mut state);
                            times.push(t0.elapsed().as_secs_f64());
                        }
                        state.map(|_| median(&times))
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| crate::Error::Train("a copy panicked".into())))
            .collect::<Vec<_>>()
    });
    let mut worst: f64 = 0.0;
    for t in per_copy {
        worst = worst.max(t???);
    }
    Ok(worst)
}

/// Each kernel alone on one core, then `copies` of it at once: arithmetic in registers,
/// matrix products in the shapes of a GPT-2-small step (one that stays in the core's caches,
/// the LM head that streams a 154 MB table), and streaming copies and reads of 256 MiB.
pub fn kernels(copies: usize, reps: usize) -> crate::Result<Vec<Kernel>> {
    let mut out = Vec::new();
    let mut measure = |name, unit, work: f64, t: &dyn Fn(usize) -> crate::Result<f64>| -> crate::Result<()> {
        let alone = work / t(1)?;
        let beside = work / t(copies)?;
        out.push(Kernel { name, unit, alone, beside });
        Ok(())
    };
    // 16 independent accumulators of 16 lanes: no memory traffic, only the core's arithmetic
    const FMA_ITERS: usize = 1 << 22;
    measure("arithmetic in registers", "GFLOP", 2.0 * 256.0 * FMA_ITERS as f64 / 1e9, &|c| {
        side_by_side(
            c,
            1,
            reps,
            || Ok([[1.0f32; 16]; 16]),
            |acc| {
                let (m, a) = (std::hint::black_box(0.999_999f32), std::hint::black_box(1e-7f32));
                for _ in 0..FMA_ITERS {
                    for lane in acc.iter_mut() {
                        for x in lane.iter_mut() {
                            *x = *x * m + a;
                        }
                    }
                }
                std::hint::black_box(&acc);
                Ok(())
            },
        )
    })?;
    for &(label, m, k, n, tb) in &[
        ("matmul 2048×768×3072 (MLP)", 2048, 768, 3072, false),
        ("matmul 1024×768×50257ᵀ (LM head)", 1024, 768, 50257, true),
    ] {
        measure(label, "GFLOP", 2.0 * (m * k * n) as f64 / 1e9, &|c| {
            side_by_side(
                c,
                1,
                reps,
                || Ok((vec![0.5f32; m * k], vec![0.25f32; k * n], vec![0f32; m * n])),
                |(a, b, y)| {
                    matmul(y, a, b, m, k, n, false, tb, false);
                    Ok(())
                },
            )
        })?;
    }
    const BYTES: usize = 256 << 20;
    measure("copy 256 MiB", "GB", 2.0 * BYTES as f64 / 1e9, &|c| {
        side_by_side(
            c,
            1,
            reps,
            || Ok((vec![1f32; BYTES / 4], vec![0f32; BYTES / 4])),
            |(s, d)| {
                d.copy_from_slice(s);
                Ok(())
            },
        )
    })?;
    measure("read 256 MiB", "GB", BYTES as f64 / 1e9, &|c| {
        side_by_side(
            c,
            1,
            reps,
            || Ok(vec![1f32; BYTES / 4]),
            |s| {
                std::hint::black_box(super::machine::read_all(s));
                Ok(())
            },
        )
    })?;
    Ok(out)
}

/// One worker's training step (a whole one: the batch drawn, forward, backward, norm,
/// AdamW) of `cfg`, median seconds over `steps` timed steps after one warm-up, alone and
/// with `copies` workers at once, `threads` threads each.
pub fn worker_step_s(cfg: &TrainConfig, copies: usize, threads: usize, steps: usize) -> crate::Result<f64> {
    let cfg = TrainConfig { steps: steps + 2, ..cfg.clone() };
    side_by_side(copies, threads, steps, || Trainer::new(cfg.clone()), |tr| tr.train_step().map(|_| ()))
}

/// One step of a layout beside the steps that bound it, taken in turn on the same rank
/// threads so that all see the machine as it is at that moment: the whole batch on one
/// worker (rank 0, the others waiting), `world` independent workers on their shares at once
/// (each rank thread its own single worker, no communication), the same workers running their
/// shares in the layout's micro-batches (where it names smaller ones: a pipeline's products
/// have that many rows), then the layout's step.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Paired {
    pub whole_s: f64,
    pub copies_s: f64,
    /// `copies_s` again where the layout's micro-batches are its whole share.
    pub copies_micro_s: f64,
    pub layout_s: f64,
}

impl Paired {
    /// The layout's speedup over the whole batch on one worker.
    pub fn speedup(&self) -> f64 {
        self.whole_s / self.layout_s
    }
    /// What no layout of these ranks can beat: the copies that never talk.
    pub fn ceiling(&self) -> f64 {
        self.whole_s / self.copies_s
    }
    /// The same copies running the layout's micro-batches: what is left between it and the
    /// layout is the layout's own (its schedule, its communication), not the products' rows.
    pub fn micro_ceiling(&self) -> f64 {
        self.whole_s / self.copies_micro_s
    }
}

/// The micro-batch (sequences) a rank of `layout` runs where it is smaller than the rank's
/// share of `share` sequences (and divides it): the copies of the second ceiling run it.
pub fn micro_batch_of(layout: &crate::layout::Layout, share: usize) -> Option<usize> {
    layout.mb.filter(|&mb| mb < share && share.is_multiple_of(mb))
}

/// Bytes the trainers a pairing of `layout` holds at once need, and how many they are: the
/// whole batch on one worker, and on each of the layout's ranks a copy on its share, that
/// copy's micro-batched twin (`micro`) and the layout's rank (the parameters, gradients and
/// AdamW state of the most a rank holds as its pipeline, tensor and ZeRO splits leave it, and
/// one micro-batch's activations of the whole model: a first 1F1B stage holds `pp`
/// micro-batches of `1/pp` of the layers). Not counted: the communication's buffers.
pub fn pairing_need(
    cfg: &TrainConfig,
    layout: &crate::layout::Layout,
    micro: Option<usize>,
) -> crate::Result<(u128, usize)> {
    use crate::train::memory::training_memory;
    let (mcfg, seq) = Trainer::check_layout(cfg, layout)?;
    let n = layout.world();
    let need = |b: usize| training_memory(&mcfg, b, seq);
    // the most parameters a rank of the layout holds: its pipeline chunks as the trainer cuts
    // them (the last stage's copy of a tied table included), or its tensor-parallel share
    let held = if layout.runs_executor() {
        let chunks = |r| RankModel::stage(mcfg, (0, layout.tp), (r, layout.pp), layout.v, seq, (0, 1));
        (0..layout.pp)
            .map(|r| chunks(r).map(|m| m.layout.total as u128))
            .collect::<crate::Result<Vec<_>>>()?
            .into_iter()
            .max()
            .unwrap_or(0)
    } else {
        mcfg.num_params() / layout.tp as u128
    };
    let dp = (layout.dp * layout.cp) as u128;
    let rank = {
        let zero = |stage: u8, x: u128| if layout.zero >= stage { x / dp } else { x };
        // parameters, gradients (and under ZeRO-1 and up the rank's shard of them beside),
        // two AdamW moments, one micro-batch's activations
        let shard = if layout.zero >= 1 { 4 * held / dp } else { 0 };
        let m = need(layout.micro_batch(cfg.batch, cfg.micro_batch)?);
        zero(3, 4 * held) + zero(2, 4 * held) + shard + zero(1, 8 * held) + m.activations
    };
    let worker = |share: usize| need(cfg.micro_batch.unwrap_or(share)).total();
    let twin = micro.map_or(0, |mb| need(mb).total());
    let total = worker(cfg.batch) + n as u128 * (worker(cfg.batch / n) + twin + rank);
    Ok((total, 1 + n * (2 + usize::from(micro.is_some()))))
}

/// `pairing_need` refused with its figure when it is more than `avail` bytes.
pub fn pairing_fits(
    cfg: &TrainConfig,
    layout: &crate::layout::Layout,
    micro: Option<usize>,
    avail: Option<u128>,
) -> crate::Result<()> {
    use crate::train::memory::gib;
    let Some(avail) = avail else { return Ok(()) };
    let (total, trainers) = pairing_need(cfg, layout, micro)?;
    if total > avail {
        return Err(crate::Error::Train(format!(
            "pairing {} ranks with their ceilings holds {trainers} trainers of {} at once (one worker on the whole batch of {}, and on each rank a copy on its share{}, and the layout's rank): about {:.1} GiB, but {:.1} GiB is available; lower --batch or --seq",
            layout.world(),
            cfg.model,
            cfg.batch,
            if micro.is_some() { ", the copy in the layout's micro-batches" } else { "" },
            gib(total),
            gib(avail)
        )));
    }
    Ok(())
}

/// `steps` paired steps (after one warm-up of each) of `layout` for `cfg`'s global batch,
/// `threads` threads per rank; each figure the slowest rank's. With a pipeline, also its
/// schedule's bubble on paper. It holds the trainers `pairing_need` counts: a caller checks
/// them once with `pairing_fits` (`brigade bench beside` does, for every layout before the
/// first round).
pub fn paired_steps(
    cfg: &TrainConfig,
    layout: &crate::layout::Layout,
    bucket_elems: usize,
    threads: usize,
    steps: usize,
) -> crate::Result<(Vec<Paired>, Option<f64>)> {
    let n = layout.world();
    if !cfg.batch.is_multiple_of(n) {
        return Err(crate::Error::Config(format!("batch {} does not split into {n} workers' shares", cfg.batch)));
    }
    let cfg = TrainConfig { steps: steps + 2, ..cfg.clone() };
    let share = TrainConfig { batch: cfg.batch / n, ..cfg.clone() };
    let micro = micro_batch_of(layout, share.batch);
    let share_micro = micro.map(|mb| TrainConfig { micro_batch: Some(mb), ..share.clone() });
    let per_rank = brigade_comm::local::run(n, |world| {
        let err = |e: brigade_comm::CommError| crate::Error::Train(e.to_string());
        let mut tr = Trainer::on_world(cfg.clone(), &world, layout)?;
        tr.set_bucket_elems(bucket_elems)?;
        let mut copy = Trainer::new(share.clone())?;
        let mut copy_micro = share_micro.clone().map(Trainer::new).transpose()?;
        let mut whole = if world.rank() == 0 { Some(Trainer::new(cfg.clone())?) } else { None };
        crate::with_threads(threads, || -> crate::Result<Vec<[f64; 4]>> {
            let mut out = Vec::new();
            for s in 0..=steps {
                let mut t = [0.0; 4];
                world.barrier().map_err(err)?;
                let t0 = Instant::now();
                if let Some(w) = &mut whole {
                    w.train_step()?;
                }
                t[0] = t0.elapsed().as_secs_f64();
                world.barrier().map_err(err)?;
                let t0 = Instant::now();
                copy.train_step()?;
                t[1] = t0.elapsed().as_secs_f64();
                t[3] = t[1];
                if let Some(c) = &mut copy_micro {
                    world.barrier().map_err(err)?;
                    let t0 = Instant::now();
                    c.train_step()?;
                    t[3] = t0.elapsed().as_secs_f64();
                }
                world.barrier().map_err(err)?;
                let t0 = Instant::now();
                tr.train_step()?;
                t[2] = t0.elapsed().as_secs_f64();
                if s > 0 {
                    out.push(t);
                }
            }
            Ok(out)
        })?
        .map(|t| (t, tr.pipeline_theory()))
    })
    .map_err(|e| crate::Error::Train(e.to_string()))?;
    let bubble = per_rank[0].1;
    let paired = (0..steps)
        .map(|s| {
            let worst = |k: usize| per_rank.iter().map(|r| r.0[s][k]).fold(0.0, f64::max);
            Paired { whole_s: worst(0), copies_s: worst(1), copies_micro_s: worst(3), layout_s: worst(2) }
        })
        .collect();
    Ok((paired, bubble))
}
