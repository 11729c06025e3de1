//! Context parallelism's known bug classes, each against the single worker on the same batch:
//!
//! - **the tokens at chunk boundaries**: the target of a chunk's last token is the first token
//!   of the next chunk, held by another rank (verl PR #4250's bug touched 2 tokens in 32 and
//!   passed a whole-loss check). Here only the boundary tokens (and one whole chunk, so that the
//!   ranks count unequal numbers of targets) have targets, so the loss and every gradient are
//!   made of little else; with packed documents starting inside chunks as well;
//! - **the loss's scale**: the mean over every counted target of the global batch — not each
//!   rank's mean, not multiplied by cp (Megatron-LM #673; transformers PR #48167 reported eval
//!   loss cp× too high): the printed training loss and the evaluation equal the single
//!   worker's at cp = 1, 2 and 4;
//! - **bad layouts**: a sequence cp cannot split, misspelt `cp_comm`/`cp_order`, a world of
//!   another size — one line naming what fits, before any rank communicates;
//! - **memory**: a rank of cp=2 holds at most 0.55× one worker's activations, by the trainer's
//!   own accounting and by the allocator's count of what a step allocates.

use brigade::layout::{Axis, CpOrder, Layout};
use brigade::models::family::Family;
use brigade::parallel::{Mesh, MeshShape};
use brigade::tensor::docs::positions_from_starts;
use brigade::tensor::loss::IGNORE;
use brigade::train::{TrainConfig, Trainer};

mod common;
use brigade::alloc::{live_bytes, peak_bytes, reset_peak, set_rank, RankAlloc};
use common::for_each_family;

#[global_allocator]
static ALLOC: RankAlloc = RankAlloc;

const T: usize = 16;
const B: usize = 4;

fn text(dir: &std::path::Path) -> std::path::PathBuf {
    let words = ["ring", "block", "of", "keys", "and", "values", "travels", "round", "the", "group"];
    let mut x = 7u64;
    let mut s = String::new();
    while s.len() < 20_000 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        s.push_str(words[(x >> 33) as usize % words.len()]);
        s.push(' ');
    }
    let p = dir.join("text.txt");
    std::fs::write(&p, s).unwrap();
    p
}

fn cfg(f: Family, data: &std::path::Path) -> TrainConfig {
    TrainConfig {
        model: f.tiny_preset().into(),
        data: Some(data.to_path_buf()),
        seq: Some(T),
        steps: 3,
        batch: B,
        micro_batch: Some(2),
        n_embd: Some(32),
        n_head: Some(4),
        n_layer: Some(2),
        lr: 1e-3,
        eval_every: 0,
        ..TrainConfig::default()
    }
}

/// ‖a − b‖ / ‖b‖.
fn rel(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-60)).sqrt()
}

/// A batch whose only targets are the last token of every chunk of `chunks` (whose target is the
/// next chunk's first token) and every token of chunk 1: real tokens of the text, their true
/// next tokens.
fn boundary_batch(tr: &mut Trainer, chunks: usize) -> (Vec<u32>, Vec<i32>) {
    let batch = tr.data.batch(tr.cfg.seed, 0, B, T);
    let c = T / chunks;
    let y = batch
        .y
        .iter()
        .enumerate()
        .map(|(i, &y)| {
            let r = i % T;
            let boundary = r % c == c - 1 && r + 1 < T;
            if boundary || r / c == 1 {
                y
            } else {
                IGNORE
            }
        })
        .collect();
    (batch.x, y)
}

/// The loss (sum, count) and gradient of one accumulation on every rank of `layout`, rank 0's.
fn accumulate(
    c: &TrainConfig,
    layout: &str,
    (x, y, pos): (&[u32], &[i32], Option<&[u32]>),
) -> ((f64, usize), Vec<f32>) {
    let layout = Layout::parse(layout).unwrap();
    let out = brigade_comm::local::run(layout.world(), |world| {
        let mesh = Mesh::new(&world, MeshShape::of(&layout))?;
        let mut tr = Trainer::on_mesh(c.clone(), mesh, &layout)?;
        let loss = tr.accumulate_gradients_docs(x, y, pos)?;
        Ok::<_, brigade::Error>((loss, tr.local_grads()?.into_owned()))
    })
    .unwrap();
    for (r, o) in out.iter().enumerate() {
        assert_eq!(o.0, out[0].0, "rank {r}'s loss differs from rank 0's");
    }
    out.into_iter().next().unwrap()
}

fn assert_same(
    what: &str,
    model: &brigade::models::Gpt,
    got: &((f64, usize), Vec<f32>),
    want: &((f64, usize), Vec<f32>),
) {
    let ((gl, gc), (wl, wc)) = (got.0, want.0);
    assert_eq!(gc, wc, "{what}: counted targets");
    assert!(((gl - wl) / wl).abs() < 1e-6, "{what}: loss sum {gl}, single worker {wl}");
    for spec in &model.layout.specs {
        let e = rel(spec.view.of(&got.1), spec.view.of(&want.1));
        assert!(e < 1e-6, "{what}: the gradient of {} differs from the single worker's by {e:.2e}", spec.name);
    }
}

#[test]
fn chunk_boundary_targets_give_the_single_workers_loss_and_gradient() {
    let d = tempfile::tempdir().unwrap();
    let data = text(d.path());
    for_each_family(|f| {
        let c = cfg(f, &data);
        let mut single = Trainer::new(c.clone()).unwrap();
        for (layout, chunks) in [
            ("cp=2", 4),
            ("cp=2,cp_comm=ring", 4),
            ("cp=4", 8),
            ("cp=4,cp_order=contiguous,cp_comm=ring", 4),
            ("dp=2,cp=2", 4),
        ] {
            let (x, y) = boundary_batch(&mut single, chunks);
            let want = (single.accumulate_gradients(&x, &y).unwrap(), single.grads().to_vec());
            let got = accumulate(&c, layout, (&x, &y, None));
            assert_same(&format!("{} {layout}", f.name()), &single.model, &got, &want);
            // documents packed and kept apart, starting inside chunks and across their edges
            let starts: Vec<Vec<usize>> = (0..B).map(|s| vec![0, 3 + s, 9, 13 - s]).collect();
            let pos = positions_from_starts(T, &starts);
            let want = (single.accumulate_gradients_docs(&x, &y, Some(&pos)).unwrap(), single.grads().to_vec());
            let got = accumulate(&c, layout, (&x, &y, Some(&pos)));
            assert_same(&format!("{} {layout} with documents", f.name()), &single.model, &got, &want);
        }
    });
}

#[test]
fn the_loss_is_the_global_mean_at_every_cp_in_training_and_evaluation() {
    let d = tempfile::tempdir().unwrap();
    let data = text(d.path());
    for_each_family(|f| {
        let c = cfg(f, &data);
        let mut single = Trainer::new(c.clone()).unwrap();
        while !single.done() {
            single.train_step().unwrap();
        }
        let want_eval = single.evaluate().to_string();
        for layout in ["cp=1", "cp=2", "cp=4,cp_comm=ring", "dp=2,cp=2"] {
            let l = Layout::parse(layout).unwrap();
            let out = brigade_comm::local::run(l.world(), |world| {
                let mut tr = Trainer::on_world(c.clone(), &world, &l)?;
                while !tr.done() {
                    tr.train_step()?;
                }
                let full = tr.full_params_to_first()?;
                let eval = (world.rank() == 0).then(|| tr.evaluate_with(full.as_deref()).to_string());
                Ok::<_, brigade::Error>((tr.losses.clone(), eval))
            })
            .unwrap();
            let (losses, eval) = &out[0];
            for (s, (g, w)) in losses.iter().zip(&single.losses).enumerate() {
                assert!(
                    ((g - w) / w).abs() < 1e-5,
                    "{} {layout}: loss at step {} is {g}, single worker {w}",
                    f.name(),
                    s + 1
                );
            }
            assert_eq!(losses.len(), single.losses.len());
            assert_eq!(eval.as_deref(), Some(want_eval.as_str()), "{} {layout}: evaluation", f.name());
        }
    });
}

/// Builds every rank of `layout` over `world` ranks; the first failure's message.
fn refused(c: &TrainConfig, layout: &str, world: usize) -> String {
    let l = match Layout::parse(layout) {
        Ok(l) => l,
        Err(e) => return e.to_string(),
    };
    let r = brigade_comm::local::run(world, |w| {
        l.check_world(w.size())?;
        Trainer::on_world(c.clone(), &w, &l).map(|_| ())
    });
    r.map(|_| String::new()).unwrap_or_else(|e| e.failures[0].1.clone())
}

#[test]
fn layouts_context_parallelism_cannot_run_are_refused_naming_what_fits() {
    let d = tempfile::tempdir().unwrap();
    let c = cfg(Family::Gpt2, &text(d.path()));
    let c15 = TrainConfig { seq: Some(15), ..c.clone() };
    let e = refused(&c15, "cp=2", 2);
    assert!(e.contains("cuts each sequence into 4 equal chunks") && e.contains("(e.g. 12 or 16)"), "{e}");
    let c12 = TrainConfig { seq: Some(12), ..c.clone() };
    let e = refused(&c12, "cp=4", 4);
    assert!(e.contains("a sequence of 12 tokens does not split into them") && e.contains("(e.g. 8 or 16)"), "{e}");
    assert_eq!(refused(&c12, "cp=4,cp_order=contiguous", 4), "", "12 rows in 4 chunks of 3");
    assert_eq!(refused(&c, "cp=8", 8), "", "16 rows in 16 chunks of 1");
    // the addition task's 12 tokens: cp=2 splits them, cp=4's 8 chunks do not
    let add = TrainConfig { data: None, seq: None, ..c.clone() };
    assert_eq!(refused(&add, "cp=2", 2), "");
    let e = refused(&add, "cp=4", 4);
    assert!(e.contains("use a sequence length that is a multiple of 8"), "{e}");
    assert!(refused(&c, "cp=2,cp_comm=p2p", 2).contains("cp_comm=p2p: expected ring or allgather"));
    assert!(refused(&c, "cp=2,cp_order=zig", 2).contains("cp_order=zig: expected zigzag or contiguous"));
    let e = refused(&c, "dp=2,cp=2", 2);
    assert!(e.contains("dp=2 × pp=1 × cp=2 × tp=1 needs 4 ranks but 2 were started"), "{e}");
    let layout = Layout::parse("dp=2,cp=2,tp=2").unwrap();
    assert_eq!((layout.degree(Axis::Cp), layout.world(), layout.cp_order), (2, 8, CpOrder::Zigzag));
}

/// The most bytes the first step holds above what a rank held before it (its activations, the
/// step's buffers, and the optimizer's moments, which every layout here allocates alike), the
/// largest over the ranks of `layout`, by the allocator.
fn step_bytes(c: &TrainConfig, layout: &str) -> usize {
    let l = Layout::parse(layout).unwrap();
    let out = brigade_comm::local::run(l.world(), |world| {
        set_rank(Some(world.rank()));
        let mut tr = Trainer::on_world(c.clone(), &world, &l)?;
        world.barrier().unwrap();
        let base = live_bytes(world.rank()).unwrap();
        reset_peak(world.rank());
        brigade::with_threads(1, || tr.train_step())??;
        Ok::<_, brigade::Error>(peak_bytes(world.rank()).unwrap() - base)
    })
    .unwrap();
    out.into_iter().max().unwrap()
}

#[test]
fn a_rank_of_cp2_holds_at_most_055_of_one_workers_activations() {
    let d = tempfile::tempdir().unwrap();
    let data = text(d.path());
    let seq = 512;
    let c = TrainConfig {
        seq: Some(seq),
        block_size: Some(seq),
        batch: 1,
        micro_batch: Some(1),
        n_embd: Some(64),
        n_head: Some(4),
        model: "llama-tiny".into(),
        ..cfg(Family::Gpt2, &data)
    };
    let m = Trainer::new(c.clone()).unwrap().model.cfg;
    use brigade::train::memory::training_memory_cp;
    for kind in [brigade::layout::CpComm::AllGather, brigade::layout::CpComm::Ring] {
        let one = training_memory_cp(&m, 1, seq, 1, kind).activations as f64;
        let two = training_memory_cp(&m, 1, seq, 2, kind).activations as f64;
        assert!(
            two <= 0.55 * one,
            "{kind:?}: the trainer counts {two} bytes of activations at cp=2, {one} on one worker"
        );
    }
    let one = step_bytes(&c, "dp=1") as f64;
    for layout in ["cp=2", "cp=2,cp_comm=ring"] {
        let two = step_bytes(&c, layout) as f64;
        println!(
            "{layout}: a step allocates {:.1} MiB on the busiest rank, one worker {:.1} MiB",
            two / 1048576.0,
            one / 1048576.0
        );
        assert!(two <= 0.55 * one, "{layout}: a step allocates {two} bytes on a rank, {one} on one worker");
    }
    // the accounting is of the same size as what the allocator counts on one worker
    let counted = training_memory_cp(&m, 1, seq, 1, brigade::layout::CpComm::AllGather).activations as f64;
    assert!(
        (0.5..2.0).contains(&(one / counted)),
        "the allocator counts {one} bytes, the trainer's accounting {counted}"
    );
}
