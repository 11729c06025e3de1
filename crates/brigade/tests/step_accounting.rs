//! The trainer's account of a step names what the time was: one rank of a mesh is held back
//! by a planted sleep before a step, and the rank that waits for it must book the wait as the
//! communication (or pipeline wait) of the group it waited in — never as compute or optimizer.
//! The sleep is 400 ms against a tiny model's step of milliseconds, so the bounds hold on a
//! loaded machine too.

use brigade::layout::Layout;
use brigade::parallel::pipeline::RankModel;
use brigade::train::{StepStats, TrainConfig, Trainer};
use std::time::Duration;

const SLEEP: f64 = 0.4;

fn cfg() -> TrainConfig {
    TrainConfig {
        model: "tiny".into(),
        steps: 3,
        batch: 8,
        micro_batch: Some(2),
        n_embd: Some(32),
        n_head: Some(4),
        n_layer: Some(2),
        eval_every: 0,
        ..TrainConfig::default()
    }
}

/// Runs a warm-up step on every rank, then a step that rank `slow` starts `SLEEP` late;
/// returns each rank's stats of that step.
fn held_back(layout: &str, slow: usize) -> Vec<StepStats> {
    let layout = Layout::parse(layout).unwrap();
    brigade_comm::local::run(layout.world(), |world| {
        let mut tr = Trainer::on_world(cfg(), &world, &layout)?;
        brigade::with_threads(1, || -> brigade::Result<StepStats> {
            tr.train_step()?;
            world.barrier().map_err(|e| brigade::Error::Train(e.to_string()))?;
            if world.rank() == slow {
                std::thread::sleep(Duration::from_secs_f64(SLEEP));
            }
            tr.train_step()
        })?
    })
    .unwrap()
}

/// The waiting rank's step: the wait where it belongs, nothing of it in compute or optimizer.
fn check(what: &str, s: &StepStats, booked: f64) {
    let parts = s.compute_s + s.optimizer_s + s.comm_s + s.pipeline_wait_s;
    println!("{what}: {s:?}");
    // (the waiting rank's own compute counted in: time the scheduler took from it inside its
    // compute shortens its wait by as much)
    assert!(
        booked + s.compute_s >= 0.9 * SLEEP,
        "{what}: the wait was booked as {booked:.3} s of the {SLEEP} s slept: {s:?}"
    );
    assert!(s.compute_s < SLEEP / 2.0, "{what}: compute {:.3} s holds the wait: {s:?}", s.compute_s);
    assert!(s.optimizer_s < SLEEP / 2.0, "{what}: optimizer {:.3} s holds the wait: {s:?}", s.optimizer_s);
    let total = s.tp_comm_s + s.dp_comm_s + s.pp_comm_s;
    assert!((s.comm_s - total).abs() < 1e-9, "{what}: comm {} is not tp + dp + pp {total}", s.comm_s);
    let wall = s.tokens as f64 / s.tokens_per_s;
    assert!(parts <= wall * 1.001 + 1e-4, "{what}: the parts {parts:.3} s exceed the step's {wall:.3} s");
}

#[test]
fn a_slow_replica_is_booked_as_data_parallel_communication() {
    // the bucketed all-reduce after the last backward waits for the late replica
    let s = held_back("dp=2", 1);
    check("dp=2", &s[0], s[0].dp_comm_s);
    // ZeRO-3: the first forward's parameter gather waits, inside the forward's span
    let s = held_back("dp=2,zero=3", 1);
    check("dp=2,zero=3", &s[0], s[0].dp_comm_s);
    // ZeRO-2: the full parameters need no gather; the first backward's reduce-scatters wait,
    // as its store finishes them
    let s = held_back("dp=2,zero=2", 1);
    check("dp=2,zero=2", &s[0], s[0].dp_comm_s);
    // ZeRO-1: the per-unit reduce-scatter
    let s = held_back("dp=2,zero=1", 1);
    check("dp=2,zero=1", &s[0], s[0].dp_comm_s);
}

#[test]
fn a_slow_tensor_parallel_peer_is_booked_as_tensor_parallel_communication() {
    // the first forward's all-reduce waits for the late peer
    let s = held_back("tp=2", 1);
    check("tp=2", &s[0], s[0].tp_comm_s);
    // inside a pipeline stage: not compute, and not the pipeline's bubble either
    let s = held_back("pp=2,tp=2", 1);
    check("pp=2,tp=2", &s[0], s[0].tp_comm_s);
    assert!(s[0].pipeline_wait_s < SLEEP / 2.0, "{:?}", s[0]);
}

#[test]
fn a_slow_stage_is_booked_as_the_pipelines_wait() {
    // stage 0 waits for stage 1's first gradient
    let s = held_back("pp=2,schedule=1f1b", 1);
    check("pp=2", &s[0], s[0].pipeline_wait_s);
    assert!(s[0].bubble > 0.5, "the bubble share of a step mostly spent waiting: {:?}", s[0]);
}

#[test]
fn a_single_worker_spends_nothing_on_communication_or_waiting() {
    let mut tr = Trainer::new(cfg()).unwrap();
    let s = tr.train_step().unwrap();
    assert_eq!((s.comm_s, s.pipeline_wait_s, s.bubble), (0.0, 0.0, 0.0), "{s:?}");
    assert!(s.compute_s > 0.0 && s.optimizer_s > 0.0, "{s:?}");
}

/// Each rank's (reductions launched while the forwards and backwards ran, reductions) of a step.
fn reductions(layout: &str) -> Vec<(usize, usize)> {
    reductions_in_buckets(layout, None)
}

/// The same, with gradient buckets of `bucket` elements.
fn reductions_in_buckets(layout: &str, bucket: Option<usize>) -> Vec<(usize, usize)> {
    let layout = Layout::parse(layout).unwrap();
    brigade_comm::local::run(layout.world(), |world| {
        let mut tr = Trainer::on_world(cfg(), &world, &layout)?;
        if let Some(elems) = bucket {
            tr.set_bucket_elems(elems)?;
        }
        brigade::with_threads(1, || tr.train_step().map(|s| (s.dp_overlapped, s.dp_reductions)))?
    })
    .unwrap()
}

#[test]
fn a_step_says_how_many_gradient_reductions_its_backward_hid() {
    // plain dp: every bucket launched as the last backward finishes it; ZeRO-1 on one stage:
    // every unit's reduce-scatter; a pipeline of interleaved chunks: every chunk's all-reduce,
    // as its last backward ends
    for layout in ["dp=2", "dp=2,zero=1", "dp=2,pp=2", "dp=2,pp=2,v=2,schedule=interleaved"] {
        let r = reductions(layout);
        assert_eq!(r.len(), 4.min(Layout::parse(layout).unwrap().world()));
        for (rank, &(hid, all)) in r.iter().enumerate() {
            assert!(all >= 1 && hid == all, "{layout}: rank {rank} launched {hid} of {all} under the backward");
        }
    }
    // small buckets: one all-reduce each, every one launched as the backward finishes it
    let r = reductions_in_buckets("dp=2", Some(5000));
    assert!(r.iter().all(|&(hid, all)| hid == all && all > 3), "{r:?}");
    // ZeRO-1 with a pipeline sums the tied table's copies first: every reduce-scatter after
    let r = reductions("dp=2,pp=2,zero=1");
    assert!(r.iter().all(|&(hid, all)| hid == 0 && all > 1), "{r:?}");
    // one chunk of the model per rank: a reduce-scatter for each of its stage's units (the
    // whole model's units split between the stages, a block cut between its halves on both)
    let layout = Layout::parse("dp=2,pp=2,zero=1").unwrap();
    let (mcfg, seq) = Trainer::check_layout(&cfg(), &layout).unwrap();
    let units = |p| RankModel::stage(mcfg, (0, 1), (p, 2), 1, seq, (0, 1)).unwrap().units.len();
    let (mut got, mut want) = (r.iter().map(|x| x.1).collect::<Vec<_>>(), vec![units(0), units(0), units(1), units(1)]);
    got.sort();
    want.sort();
    assert_eq!(got, want, "the stages' units: {r:?}");
    // slot 2i + 2 is block i's MLP half: a cut before it leaves the block on both stages
    let cut = brigade::parallel::pipeline::stages::stage_slots(&mcfg, 2, 1, seq).unwrap()[0].end;
    let halved = usize::from(cut.is_multiple_of(2) && (2..=2 * mcfg.n_layer).contains(&cut));
    let whole = reductions("dp=2,zero=1")[0].1;
    assert_eq!(units(0) + units(1), whole + halved, "the stages' units are the model's: {r:?}, cut at slot {cut}");
    // nothing to reduce, and ZeRO-2/3's stores (which reduce inside each backward)
    for layout in ["dp=1", "tp=2", "dp=2,zero=2", "dp=2,zero=3"] {
        assert!(reductions(layout).iter().all(|&r| r == (0, 0)), "{layout}");
    }
}
