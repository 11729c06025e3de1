//! Measurements behind `brigade bench …`: each returns figures, the CLI only prints them.

pub mod beside;
pub mod breakdown;
pub mod checkpoint;
pub mod embed;
pub mod machine;

use crate::models::{Activations, Gpt, GptConfig};
use crate::tensor::{matmul_on, Backend};
use crate::train::optimizer::{clip_factor, grad_norm, AdamW, AdamWConfig};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::Instant;

pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// f32 matmul rate of `m×k · k×n` on the current rayon pool: median GFLOP/s over `reps`.
pub fn matmul_gflops(m: usize, k: usize, n: usize, reps: usize) -> f64 {
    matmul_gflops_t(m, k, n, false, false, reps)
}

/// The shapes the PyTorch/OpenBLAS peer (`peers/bench_gemm.py`) measures, then the transposed
/// products a GPT-2-small step runs in backward (`ta`: a stored `[k,m]`, `tb`: b stored `[n,k]`).
pub const MATMUL_SHAPES: &[(usize, usize, usize, bool, bool)] = &[
    (256, 256, 256, false, false),
    (1024, 1024, 1024, false, false),
    (2048, 768, 768, false, false),
    (2048, 768, 3072, false, false),
    (1024, 768, 50257, false, false),
    (1024, 768, 50257, false, true),  // LM head forward: h·wteᵀ
    (1024, 50257, 768, false, false), // LM head backward: dlogits·wte
    (50257, 1024, 768, true, false),  // LM head weight gradient: dlogitsᵀ·h
    (768, 1024, 3072, true, false),   // c_fc weight gradient: xᵀ·dy
    (1024, 3072, 768, false, true),   // c_fc input gradient: dy·Wᵀ
    (1024, 3072, 768, false, false),
    (768, 3072, 1024, false, true),
    (768, 3072, 1024, true, true),
    (1024, 768, 3072, false, true),
];

/// A decode step's products on the row-invariant kernel serving uses (`matmul_rows`):
/// gpt2-small's four per-layer shapes `(k, n)`, each at 1 to 32 rows.
pub const ROWS_SHAPES: &[(usize, usize)] = &[(768, 2304), (768, 768), (768, 3072), (3072, 768)];
pub const ROWS_COUNTS: &[usize] = &[1, 2, 4, 8, 16, 32];

/// `matmul_rows`'s GFLOP/s for each of `counts` rows times `[k, n]` as a decode step meets it:
/// the product run over enough distinct packed matrices (64 MiB of them, at most 64, made once
/// for every count) that each comes from memory, not from the last product's cache; the
/// median pass of `reps` for each count.
pub fn rows_gflops(k: usize, n: usize, counts: &[usize], reps: usize) -> Vec<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let copies = ((64usize << 20) / (4 * k * n)).clamp(1, 64);
    let ws: Vec<crate::tensor::rowwise::Packed> = (0..copies)
        .map(|_| {
            let w: Vec<f32> = (0..k * n).map(|_| rng.gen::<f32>() - 0.5).collect();
            crate::tensor::rowwise::Packed::new(&w, k, n)
        })
        .collect();
    counts
        .iter()
        .map(|&m| {
            let a: Vec<f32> = (0..m * k).map(|_| rng.gen::<f32>() - 0.5).collect();
            let mut c = vec![0f32; m * n];
            let mut pass = || {
                let t0 = Instant::now();
                for w in &ws {
                    crate::tensor::rowwise::matmul_rows(&mut c, &a, w, m);
                }
                2.0 * (m * k * n * copies) as f64 / t0.elapsed().as_secs_f64() / 1e9
            };
            pass(); // warm up
            let rates: Vec<f64> = (0..reps.max(1)).map(|_| pass()).collect();
            median(&rates)
        })
        .collect()
}

/// As [`matmul_gflops`] with transposed operands.
pub fn matmul_gflops_t(m: usize, k: usize, n: usize, ta: bool, tb: bool, reps: usize) -> f64 {
    matmul_gflops_on(&[Backend::Auto], m, k, n, ta, tb, reps)[0]
}

/// Median GFLOP/s of each kernel in `backends` on one shape, their runs alternating so that
/// they share the machine's state (clock, neighbours) as evenly as possible.
pub fn matmul_gflops_on(
    backends: &[Backend],
    m: usize,
    k: usize,
    n: usize,
    ta: bool,
    tb: bool,
    reps: usize,
) -> Vec<f64> {
    let mut probe = MatmulProbe::new((m, k, n), (ta, tb));
    for &be in backends {
        probe.product(be); // warm up caches and buffers
    }
    let mut rates = vec![Vec::new(); backends.len()];
    for _ in 0..reps {
        for (r, &be) in rates.iter_mut().zip(backends) {
            r.push(probe.product(be));
        }
    }
    rates.iter().map(|r| median(r)).collect()
}

/// One product's operands (random, seeded), timed as often as asked: alternating kernels in
/// `matmul_gflops_on`, and between the steps `train_step` times, so that the rate a step is
/// compared with comes from the same minutes of a shared machine (one measurement before the
/// steps moved by ±15% from run to run on a 2-core VM).
struct MatmulProbe {
    shape: (usize, usize, usize),
    trans: (bool, bool),
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
}

impl MatmulProbe {
    /// `c[m, n] = op(a)·op(b)` with a `[m, k]` (`[k, m]` stored when transposed) and b `[k, n]`.
    fn new((m, k, n): (usize, usize, usize), trans: (bool, bool)) -> MatmulProbe {
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let a: Vec<f32> = (0..m * k).map(|_| rng.gen::<f32>() - 0.5).collect();
        let b: Vec<f32> = (0..k * n).map(|_| rng.gen::<f32>() - 0.5).collect();
        MatmulProbe { shape: (m, k, n), trans, a, b, c: vec![0f32; m * n] }
    }

    /// One product on kernel `be`; its GFLOP/s.
    fn product(&mut self, be: Backend) -> f64 {
        let ((m, k, n), (ta, tb)) = (self.shape, self.trans);
        let t0 = Instant::now();
        matmul_on(be, &mut self.c, &self.a, &self.b, m, k, n, ta, tb, false);
        2.0 * (m * k * n) as f64 / t0.elapsed().as_secs_f64() / 1e9
    }
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct TrainBench {
    pub params: usize,
    pub batch: usize,
    pub seq: usize,
    pub threads: usize,
    pub steps_measured: usize,
    pub step_s_median: f64,
    pub tokens_per_s: f64,
    pub model_gflops_per_s: f64,
    pub matmul_gflops_per_s: f64,
    /// The matrix-product kernel that ran: "brigade" or "gemm-crate".
    pub matmul_kernel: &'static str,
    pub mfu: f64,
    pub loss_first: f32,
    pub loss_last: f32,
}

/// Times full training steps (forward, backward, clip, AdamW) on random tokens, and the
/// machine's 2048³ matmul rate in the same process: three products before the steps and two
/// before each timed step, the median of them all.
pub fn train_step(cfg: GptConfig, batch: usize, seq: usize, warmup: usize, steps: usize) -> crate::Result<TrainBench> {
    let mut probe = MatmulProbe::new((2048, 2048, 2048), (false, false));
    probe.product(Backend::Auto); // warm up caches and buffers
    let mut rates: Vec<f64> = (0..3).map(|_| probe.product(Backend::Auto)).collect();
    let model = Gpt::new(cfg)?;
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let x: Vec<u32> = (0..batch * seq).map(|_| rng.gen_range(0..cfg.vocab_size as u32)).collect();
    let y: Vec<i32> = (0..batch * seq).map(|_| rng.gen_range(0..cfg.vocab_size as i32)).collect();
    model.check_input(&x, batch, seq)?;
    let mut params = model.layout.init(0);
    let mut grads = vec![0f32; params.len()];
    let mut opt = AdamW::new(AdamWConfig::default(), &model.layout);
    let mut acts = Activations::default();
    let mut times = Vec::new();
    let mut losses = Vec::new();
    for i in 0..warmup + steps {
        if i >= warmup {
            rates.extend((0..2).map(|_| probe.product(Backend::Auto)));
        }
        let t0 = Instant::now();
        crate::tensor::elementwise::zero(&mut grads);
        let (l, n) = model.forward_backward(
            (&params, &mut grads),
            (&x, &y),
            (batch, seq),
            1.0 / (batch * seq) as f32,
            &mut acts,
        );
        let clip = clip_factor(grad_norm(&grads), 1.0);
        opt.step(&mut params, &grads, clip, 3e-4);
        let dt = t0.elapsed().as_secs_f64();
        losses.push((l / n as f64) as f32);
        if i >= warmup {
            times.push(dt);
        }
    }
    let med = median(&times);
    let matmul_rate = median(&rates);
    let tokens = (batch * seq) as f64;
    let model_gflops = cfg.train_flops_per_token(seq) * tokens / med / 1e9;
    Ok(TrainBench {
        params: model.num_params(),
        batch,
        seq,
        threads: rayon::current_num_threads(),
        steps_measured: steps,
        step_s_median: med,
        tokens_per_s: tokens / med,
        model_gflops_per_s: model_gflops,
        matmul_gflops_per_s: matmul_rate,
        matmul_kernel: Backend::Auto.resolve().name(),
        mfu: model_gflops / matmul_rate,
        loss_first: losses[0],
        loss_last: *losses.last().unwrap(),
    })
}

/// One layout of `brigade bench parallel`: median step time over the ranks' slowest, and
/// where a step's time goes on the slowest rank.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ParallelBench {
    pub ranks: usize,
    pub step_s_median: f64,
    pub tokens_per_s: f64,
    /// Per step, on the rank with the longest steps: forward and backward, less the
    /// collectives inside them (tensor-parallel ones, ZeRO-3's parameter waits).
    pub compute_s: f64,
    /// Per step: the gradient norm, clipping and AdamW.
    pub optimizer_s: f64,
    /// Per step: communication nothing overlapped, every group (`tp + cp + dp + pp` below).
    pub exposed_comm_s: f64,
    pub tp_comm_s: f64,
    pub dp_comm_s: f64,
    pub pp_comm_s: f64,
    /// Per step: the context group's exchanges of keys and values nothing hid.
    pub cp_comm_s: f64,
    /// Under context parallelism: each rank's seconds per step in blockwise attention, and
    /// their imbalance, (max − min) / min over the ranks (what zigzag evens out).
    pub attention_s_per_rank: Vec<f64>,
    pub attention_imbalance: Option<f64>,
    /// Per step: waiting for another pipeline stage.
    pub pipeline_wait_s: f64,
    /// Per step: the rest (drawing the batch, bookkeeping, the barrier's skew).
    pub other_s: f64,
    /// The most bytes any rank held at once (parameters, gradients, optimizer state,
    /// activations, buffers), counted by the allocator; `None` without `alloc::RankAlloc`.
    pub peak_mib_per_rank: Option<f64>,
    /// With a pipeline: the share of the pipeline's time its ranks waited (mean over ranks and
    /// steps, 0 to 1), and what its schedule has on paper with balanced stages.
    pub bubble_measured: Option<f64>,
    pub bubble_theory: Option<f64>,
    /// With a pipeline: each stage's busy seconds per step — forward, backward and the
    /// optimizer, its waits and messages excluded; the mean over the stage's ranks — and their
    /// imbalance, (max − min) / min: what stages cut by measured time would even out.
    pub stage_busy_s: Vec<f64>,
    pub stage_imbalance: Option<f64>,
    /// With a pipeline: the most bytes of micro-batch stashes (activations kept for backward,
    /// zero-bubble W's inputs) any rank held at once in the last step, in MiB.
    pub stash_mib: Option<f64>,
}

/// Runs `steps` timed steps (after `warmup`) of `cfg` on a dp mesh of rank threads, each rank
/// on `threads` threads, and measures them.
pub fn parallel_step(
    cfg: crate::train::TrainConfig,
    layout: &crate::layout::Layout,
    bucket_elems: usize,
    threads: usize,
    warmup: usize,
    steps: usize,
) -> crate::Result<ParallelBench> {
    use crate::train::Trainer;
    let per_rank = brigade_comm::local::run(layout.world(), |world| {
        crate::alloc::set_rank(Some(world.rank()));
        crate::alloc::reset_peak(world.rank());
        let mut tr = Trainer::on_world(cfg.clone(), &world, layout)?;
        tr.set_bucket_elems(bucket_elems)?;
        crate::with_threads(threads, || -> crate::Result<(Vec<f64>, Vec<crate::train::StepStats>)> {
            for _ in 0..warmup {
                tr.train_step()?;
            }
            let mut times = Vec::new();
            for _ in 0..steps {
                world.barrier().map_err(|e| crate::Error::Train(e.to_string()))?;
                let t0 = Instant::now();
                tr.train_step()?;
                times.push(t0.elapsed().as_secs_f64());
            }
            // the trainer's own account of each timed step
            Ok((times, tr.history[tr.history.len() - steps..].to_vec()))
        })?
        .map(|r| {
            (r, crate::alloc::peak_bytes(world.rank()), tr.pipeline_theory(), tr.pipeline.map(|p| p.peak_stash_bytes))
        })
    })
    .map_err(|e| crate::Error::Train(e.to_string()))?;
    // the largest peak of any rank (ranks of a layout hold the same amounts, give or take)
    let peak = per_rank.iter().map(|r| r.1).max().flatten();
    let theory = per_rank[0].2;
    let stash = per_rank.iter().filter_map(|r| r.3).max();
    let per_rank: Vec<_> = per_rank.into_iter().map(|r| r.0).collect();
    // a part of the timed steps, per step, on one rank
    let per = |timed: &[crate::train::StepStats], f: fn(&crate::train::StepStats) -> f64| {
        timed.iter().map(f).sum::<f64>() / steps as f64
    };
    let bubble = per_rank.iter().map(|r| per(&r.1, |s| s.bubble)).sum::<f64>() / per_rank.len() as f64;
    // a step ends when its slowest rank ends
    let step_times: Vec<f64> = (0..steps).map(|s| per_rank.iter().map(|r| r.0[s]).fold(0.0, f64::max)).collect();
    let slowest = per_rank.iter().max_by(|a, b| median(&a.0).total_cmp(&median(&b.0))).expect("at least one rank");
    let step_s = median(&step_times);
    let part = |f: fn(&crate::train::StepStats) -> f64| per(&slowest.1, f);
    let tokens = (cfg.batch * cfg.seq.unwrap_or(0)) as f64;
    let attention: Vec<f64> =
        if layout.cp > 1 { per_rank.iter().map(|r| per(&r.1, |s| s.attention_s)).collect() } else { Vec::new() };
    // each pipeline stage's ranks (the outermost coordinate of the mesh), as many in each
    let stage_busy: Vec<f64> = if layout.pp > 1 {
        let mesh = crate::parallel::mesh::MeshShape::of(layout);
        let mut busy = vec![0.0; layout.pp];
        for (r, timed) in per_rank.iter().enumerate() {
            busy[mesh.coords(r)[crate::layout::Axis::Pp]] += per(&timed.1, |st| st.compute_s + st.optimizer_s);
        }
        let ranks_per_stage = (layout.world() / layout.pp) as f64;
        busy.iter().map(|b| b / ranks_per_stage).collect()
    } else {
        Vec::new()
    };
    Ok(ParallelBench {
        ranks: layout.world(),
        step_s_median: step_s,
        tokens_per_s: tokens / step_s,
        compute_s: part(|s| s.compute_s),
        optimizer_s: part(|s| s.optimizer_s),
        exposed_comm_s: part(|s| s.comm_s),
        tp_comm_s: part(|s| s.tp_comm_s),
        dp_comm_s: part(|s| s.dp_comm_s),
        pp_comm_s: part(|s| s.pp_comm_s),
        cp_comm_s: part(|s| s.cp_comm_s),
        attention_imbalance: imbalance(&attention),
        stage_imbalance: imbalance(&stage_busy),
        stage_busy_s: stage_busy,
        attention_s_per_rank: attention,
        pipeline_wait_s: part(|s| s.pipeline_wait_s),
        other_s: (step_s - part(|s| s.compute_s + s.optimizer_s + s.comm_s + s.pipeline_wait_s)).max(0.0),
        peak_mib_per_rank: peak.map(|b| b as f64 / (1 << 20) as f64),
        bubble_measured: theory.map(|_| bubble),
        bubble_theory: theory,
        stash_mib: stash.map(|b| b as f64 / (1 << 20) as f64),
    })
}

/// (max − min) / min of some ranks' seconds; `None` for none.
fn imbalance(x: &[f64]) -> Option<f64> {
    let (lo, hi) = x.iter().fold((f64::INFINITY, 0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    (!x.is_empty()).then(|| (hi - lo) / lo)
}

/// What `bench train --data` measures of a corpus: the time to draw a step's batch, and the
/// resident memory the corpus adds (its index, and the pages of the windows read).
#[derive(Clone, Debug, serde::Serialize)]
pub struct DataBench {
    pub corpus_tokens: u64,
    pub documents: usize,
    pub open_s: f64,
    pub batches: usize,
    pub batch_s_median: f64,
    pub rss_before_mib: f64,
    pub rss_after_mib: f64,
}

/// This process's resident memory (`VmRSS`), MiB.
pub fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .map_or(0.0, |kb: f64| kb / 1024.0)
}

/// Opens the corpus at `path` (read as a run would, for a model of `vocab` tokens) and draws
/// `batches` training batches of `batch` × `seq` tokens, as consecutive steps of a run.
pub fn data_loader(
    path: &std::path::Path,
    vocab: usize,
    batch: usize,
    seq: usize,
    batches: usize,
) -> crate::Result<DataBench> {
    use crate::train::data::{Dataset, Tokenizer};
    let rss_before_mib = rss_mib();
    let t0 = Instant::now();
    let data = Dataset::open(&[(path.to_path_buf(), 1.0)], None, false, &Tokenizer::Bytes, seq, vocab)?;
    let open_s = t0.elapsed().as_secs_f64();
    let (corpus_tokens, documents) = match &data {
        Dataset::Corpus(c) => c.list.iter().fold((0, 0), |(t, d), (c, _)| {
            (t + c.train.len() + c.val.len(), d + c.train.docs.len() + c.val.docs.len())
        }),
        _ => {
            return Err(crate::Error::Data(format!(
                "bench train --data times a token corpus (an llm.c or nanoGPT .bin, a Megatron dataset); {} is text",
                path.display()
            )))
        }
    };
    let mut times = Vec::with_capacity(batches);
    for step in 0..batches {
        let t0 = Instant::now();
        std::hint::black_box(data.batch(1337, step, batch, seq));
        times.push(t0.elapsed().as_secs_f64());
    }
    Ok(DataBench {
        corpus_tokens,
        documents,
        open_s,
        batches,
        batch_s_median: median(&times),
        rss_before_mib,
        rss_after_mib: rss_mib(),
    })
}

/// `measure` on `workers` single-threaded pools at once, summed. Every worker meets the
/// barrier before it starts its pool (`with_threads`), so one that cannot start fails the
/// measure (with the reason) instead of leaving the others waiting at the barrier; a measure
/// that panics fails it too, never counted as a rate of 0.
pub(crate) fn concurrent(workers: usize, measure: impl Fn() -> f64 + Sync) -> crate::Result<f64> {
    let barrier = std::sync::Barrier::new(workers);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    crate::with_threads(1, &measure)
                })
            })
            .collect();
        let mut sum = 0.0;
        for h in hs {
            match h.join() {
                Ok(rate) => sum += rate?,
                Err(_) => return Err(crate::Error::Train("a measuring thread panicked".into())),
            }
        }
        Ok(sum)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Every worker's rate is summed; a worker whose measure panics fails the whole measure
    /// (an error, not a rate of 0), and the others, past the barrier, finish instead of hanging.
    #[test]
    fn concurrent_sums_every_worker_and_fails_on_a_panicking_one() {
        assert_eq!(concurrent(3, || 2.5).unwrap(), 7.5);
        let started = AtomicUsize::new(0);
        let r = concurrent(3, || {
            if started.fetch_add(1, Ordering::SeqCst) == 1 {
                panic!("a planted failure");
            }
            1.0
        });
        assert!(r.is_err(), "a panicking worker fails the measure: {r:?}");
        assert_eq!(started.load(Ordering::SeqCst), 3, "every worker ran past the barrier");
    }
}
