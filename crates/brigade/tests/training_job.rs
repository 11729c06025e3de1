//! The training job runs from the library as `brigade train` runs it: the evaluation and
//! checkpoint cadence, the ranks' agreement to stop after the same step, a checkpoint on the
//! way out, and a resumed job that continues the uninterrupted one exactly.

use brigade::layout::Layout;
use brigade::parallel::{Mesh, MeshShape};
use brigade::train::run::{run, JobOptions, Observer, Outcome, Quiet};
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
    let opts = JobOptions { out: Some(ck.clone()), save_every: Some(3), stop_after: Some(4), trace: None };
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
