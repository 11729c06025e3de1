//! The training job runs from the library as `brigade train` runs it: the evaluation and
//! checkpoint cadence, the ranks' agreement to stop after the same step, a checkpoint on the
//! way out, and a resumed job that continues the uninterrupted one exactly.

use brigade::layout::Layout;
use brigade::parallel::{Mesh, MeshShape};
use brigade::train::run::{run, JobOptions, Observer, Outcome, Quiet, SaveEvery};
use brigade::train::{EvalReport, StepStats, TrainConfig, Trainer};
use std::sync::atomic::AtomicBool;

fn cfg() -> TrainConfig {
    TrainConfig { n_embd: Some(16), n_head: Some(2), steps: 6, batch: 8, eval_every: 2, ..TrainConfig::default() }
}

#[derive(Default)]
struct Record {
    started_at: Vec<usize>,
    steps: Vec<usize>,
    evaluated: Vec<usize>,
    stepped: usize,
}

impl Observer for Record {
    fn start(&mut self, tr: &Trainer) {
        self.started_at.push(tr.step);
    }
    fn step(&mut self, s: &StepStats, tokens_per_s: f64) {
        assert!(tokens_per_s > 0.0);
        self.steps.push(s.step);
    }
    fn evaluated(&mut self, s: &StepStats, r: &EvalReport) {
        assert!(matches!(r, EvalReport::Addition { total: 1000, .. }), "{r}");
        self.evaluated.push(s.step);
    }
    fn stepped(&mut self) {
        self.stepped += 1;
    }
}

#[test]
fn a_job_runs_to_the_end_with_its_cadence_and_resumes_exactly() {
    let world = brigade_comm::local::solo();
    let never = AtomicBool::new(false);
    // the whole run, uninterrupted
    let mut whole = Trainer::new(cfg()).unwrap();
    let mut rec = Record::default();
    let Outcome::Finished(r) = run(&mut whole, &JobOptions::default(), &never, &world, &mut rec).unwrap() else {
        panic!("an unstopped job finishes")
    };
    assert_eq!(rec.started_at, [0]);
    assert_eq!(rec.steps, [1, 2, 3, 4, 5, 6]);
    assert_eq!(rec.evaluated, [2, 4], "every eval_every steps, the last step's evaluation being the report's");
    assert_eq!(rec.stepped, 1);
    assert_eq!((r.steps, r.ranks.len(), r.saved.as_deref()), (6, 1, None));
    assert_eq!(r.final_loss, whole.losses[5]);
    assert!(matches!(r.eval, Some(EvalReport::Addition { .. })) && r.sample.is_none() && r.bubble.is_none());

    // stopped after step 4 with checkpoints every 3 steps: the last checkpoint is step 4's
    let d = tempfile::tempdir().unwrap();
    let ck = d.path().join("ck");
    let opts = JobOptions {
        out: Some(ck.clone()),
        save_every: Some(SaveEvery::Steps(3)),
        stop_after: Some(4),
        ..JobOptions::default()
    };
    let mut first = Trainer::new(cfg()).unwrap();
    let Outcome::Finished(r) = run(&mut first, &opts, &never, &world, &mut Quiet).unwrap() else {
        panic!("stop_after ends the job as finished")
    };
    assert!(r.eval.is_none(), "a job that has not reached the run's last step is not evaluated");
    assert_eq!(r.steps, 4);
    let mut rest = Trainer::resume(&ck, None).unwrap();
    assert_eq!(rest.step, 4);
    let mut rec = Record::default();
    run(&mut rest, &JobOptions::default(), &never, &world, &mut rec).unwrap();
    assert_eq!((rec.started_at.as_slice(), rec.steps.as_slice()), (&[4][..], &[5, 6][..]));
    assert_eq!(rest.losses, whole.losses, "the resumed job continues the uninterrupted one bit for bit");
    assert_eq!(rest.params, whole.params);
}

#[test]
fn a_stop_asked_of_one_rank_stops_every_rank_after_the_same_step_with_a_checkpoint() {
    let d = tempfile::tempdir().unwrap();
    let ck = d.path().join("ck");
    let layout = Layout::parse("dp=2").unwrap();
    let out = brigade_comm::local::run(2, |world| {
        // only rank 1 is signalled
        let stop = AtomicBool::new(world.rank() == 1);
        let mesh = Mesh::new(&world, MeshShape::of(&layout))?;
        let mut tr = Trainer::on_mesh(cfg(), mesh, &layout)?;
        let opts = JobOptions { out: Some(ck.clone()), ..JobOptions::default() };
        let outcome = run(&mut tr, &opts, &stop, &world, &mut Quiet)?;
        Ok::<_, brigade::Error>((outcome.interrupted_message(), tr.step))
    })
    .unwrap();
    for (msg, step) in &out {
        assert_eq!(*step, 1, "every rank stops after the first step");
        let msg = msg.as_deref().expect("interrupted");
        assert!(msg.contains("interrupted after step 1 of 6") && msg.contains("--resume"), "{msg}");
    }
    assert_eq!(Trainer::resume(&ck, None).unwrap().step, 1, "the checkpoint written on the way out");
}

/// The files of a checkpoint that do not record timings, byte for byte.
fn contents(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    ["model.safetensors", "optimizer.safetensors", "trainer_state.json", "config.json"]
        .iter()
        .map(|f| (f.to_string(), std::fs::read(dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"))))
        .collect()
}

#[test]
fn a_snapshot_is_the_state_of_its_step_whatever_training_does_after_it() {
    let d = tempfile::tempdir().unwrap();
    let mut x = Trainer::new(cfg()).unwrap();
    let mut y = Trainer::new(cfg()).unwrap();
    for _ in 0..2 {
        x.train_step().unwrap();
        y.train_step().unwrap();
    }
    let snap = x.snapshot().unwrap().expect("a single worker writes");
    assert_eq!(snap.step(), 2);
    // training goes on while the snapshot waits to be written
    x.train_step().unwrap();
    snap.write(&d.path().join("background")).unwrap();
    y.save(&d.path().join("foreground")).unwrap();
    x.save(&d.path().join("later")).unwrap();
    let (bg, fg) = (contents(&d.path().join("background")), contents(&d.path().join("foreground")));
    assert!(bg == fg, "a snapshot written after a further step differs from a save at its step");
    assert!(bg != contents(&d.path().join("later")), "the snapshot followed the trainer");
}

#[test]
fn background_saves_resume_exactly_and_write_what_foreground_saves_write() {
    let world = brigade_comm::local::solo();
    let never = AtomicBool::new(false);
    let mut whole = Trainer::new(cfg()).unwrap();
    run(&mut whole, &JobOptions::default(), &never, &world, &mut Quiet).unwrap();
    let d = tempfile::tempdir().unwrap();
    let mut saved = Vec::new();
    for foreground in [false, true] {
        let ck = d.path().join(format!("ck-{foreground}"));
        let opts = JobOptions {
            out: Some(ck.clone()),
            save_every: Some(SaveEvery::Steps(1)),
            save_in_foreground: foreground,
            stop_after: Some(4),
            ..JobOptions::default()
        };
        let mut tr = Trainer::new(cfg()).unwrap();
        let Outcome::Finished(r) = run(&mut tr, &opts, &never, &world, &mut Quiet).unwrap() else { panic!() };
        // a save after each step; the last step's is the final one, written in the foreground
        let steps: Vec<(usize, bool)> = r.saves.iter().map(|s| (s.step, s.background)).collect();
        assert_eq!(
            steps,
            [(1, !foreground), (2, !foreground), (3, !foreground), (4, false)],
            "foreground {foreground}"
        );
        assert!(r.saves.iter().all(|s| s.write_s.is_some_and(|w| w > 0.0) && s.stall_s > 0.0), "{:?}", r.saves);
        saved.push(contents(&ck));
        let mut rest = Trainer::resume(&ck, None).unwrap();
        run(&mut rest, &JobOptions::default(), &never, &world, &mut Quiet).unwrap();
        assert_eq!(rest.losses, whole.losses, "foreground {foreground}: the resumed job continues the whole one");
        assert_eq!(rest.params, whole.params);
    }
    assert!(saved[0] == saved[1], "a background save's bytes differ from a foreground save's");
}

#[test]
fn a_timed_save_is_rank_0s_decision_and_every_rank_takes_it() {
    let d = tempfile::tempdir().unwrap();
    let ck = d.path().join("ck");
    let layout = Layout::parse("dp=2").unwrap();
    let out = brigade_comm::local::run(2, |world| {
        let never = AtomicBool::new(false);
        let mesh = Mesh::new(&world, MeshShape::of(&layout))?;
        let mut tr = Trainer::on_mesh(cfg(), mesh, &layout)?;
        // due after every step on rank 0's clock (the other rank's never says so)
        let opts = JobOptions {
            out: Some(ck.clone()),
            save_every: Some(SaveEvery::Secs(1e-9)),
            stop_after: Some(3),
            ..JobOptions::default()
        };
        let Outcome::Finished(r) = run(&mut tr, &opts, &never, &world, &mut Quiet)? else { panic!() };
        Ok::<_, brigade::Error>(r.saves.iter().map(|s| (s.step, s.write_s.is_some())).collect::<Vec<_>>())
    })
    .unwrap();
    assert_eq!(out[0], [(1, true), (2, true), (3, true)], "rank 0 writes every save");
    assert_eq!(out[1], [(1, false), (2, false), (3, false)], "rank 1 takes part in the same saves");
    assert_eq!(Trainer::resume(&ck, None).unwrap().step, 3);
}
