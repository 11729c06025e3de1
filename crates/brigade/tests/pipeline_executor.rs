//! The executor runs every schedule's lists on rank threads and computes the whole model's
//! loss and gradients, summed over the micro-batches.

use brigade::layout::{Recompute, Schedule};
use brigade::models::{Activations, Gpt, GptConfig};
use brigade::nn::tp::Tp;
use brigade::parallel::pipeline::executor::{run_step, Chunk, MicroBatches};
use brigade::parallel::pipeline::partition::partition;
use brigade::parallel::pipeline::{build, build_for, Costs, Plan};

fn rel(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-300)).sqrt()
}

/// The cases of the table below that `build` must refuse, by name (schedule, pp, v, m): every
/// other one runs, so a schedule that starts refusing a valid layout fails the test.
const REFUSED: [(Schedule, usize, usize, usize); 3] =
    [(Schedule::Interleaved, 2, 2, 1), (Schedule::Interleaved, 4, 2, 1), (Schedule::Interleaved, 4, 2, 2)];

#[test]
fn every_schedule_executed_equals_the_whole_model() {
    /// A run's micro-batch count and each rank's peak stash bytes.
    type StashBytes = (usize, Vec<usize>);
    let cfg =
        GptConfig { n_layer: 6, n_head: 2, n_embd: 16, vocab_size: 37, block_size: 8, family: Default::default() };
    let whole = Gpt::new(cfg).unwrap();
    let params = whole.init_params(3);
    let (b, t) = (2, 8);
    let (mut ran, mut refused) = (0, Vec::new());
    // 1F1B's and ZB-H1's stash bytes on each rank, by (schedule, pp, recompute) and m
    let mut stash_bytes: std::collections::HashMap<(Schedule, usize, Recompute), Vec<StashBytes>> = Default::default();
    for m in [1, 2, 4, 8] {
        let tokens: Vec<Vec<u32>> =
            (0..m).map(|k| (0..b * t).map(|i| ((i * 5 + k * 3 + 1) % 37) as u32).collect()).collect();
        let targets: Vec<Vec<i32>> = (0..m)
            .map(|k| (0..b * t).map(|i| if (i + k) % 7 == 0 { -1 } else { ((i * 3 + k) % 37) as i32 }).collect())
            .collect();
        let counted: usize = targets.iter().flatten().filter(|&&x| x >= 0).count();
        let scale = 1.0 / counted as f32;
        // the whole model, micro-batch after micro-batch
        let (mut want, mut want_loss) = (vec![0f32; whole.layout.total], 0f64);
        let mut acts = Activations::default();
        for k in 0..m {
            want_loss +=
                whole.forward_backward((&params, &mut want), (&tokens[k], &targets[k]), (b, t), scale, &mut acts).0;
        }
        for (kind, pp, v) in [
            (Schedule::GPipe, 2, 1),
            (Schedule::OneFOneB, 2, 1),
            (Schedule::OneFOneB, 3, 1),
            (Schedule::OneFOneB, 4, 1),
            (Schedule::ZeroBubble, 3, 1),
            (Schedule::Interleaved, 2, 2),
            (Schedule::Interleaved, 4, 2),
            (Schedule::Interleaved, 1, 3),
        ] {
            // ZB-H1 at 4 and 8 micro-batches on the lists fitted to a weight gradient a third of
            // the input gradient's time (as the trainer fits them to measured times: other
            // lists, the same sums)
            let skewed =
                Costs { forward: 1.0, backward: 2.0, backward_input: 1.5, backward_weight: 0.5, transfer: 0.0 };
            let costs = if kind == Schedule::ZeroBubble && m >= 4 { skewed } else { Costs::UNIT };
            if m >= 4 && kind == Schedule::ZeroBubble {
                let unit = build(kind, pp, m, v).unwrap();
                assert_ne!(build_for(kind, pp, m, v, &costs).unwrap().ranks, unit.ranks, "m={m}: the same lists");
            }
            // the one kind of case refused: interleaving needs a multiple of pp micro-batches
            let plan = match build_for(kind, pp, m, v, &costs) {
                Ok(plan) => plan,
                Err(e) => {
                    assert!(REFUSED.contains(&(kind, pp, v, m)), "{kind:?} pp={pp} v={v} m={m} refused: {e}");
                    refused.push((kind, pp, v, m));
                    continue;
                }
            };
            ran += 1;
            let mut kept_bytes = Vec::new();
            for recompute in [Recompute::None, Recompute::Selective, Recompute::Full] {
                // equal costs over the slots (the embedding, each block's two halves, the head):
                // stages cut inside blocks as well as between them
                let cuts = partition(&vec![1.0; brigade::models::gpt::slots(&cfg)], pp * v).unwrap();
                let run_plan = |plan: &Plan| {
                    brigade_comm::local::run(pp, |comm| {
                        let r = comm.rank();
                        // rank r runs stages r, r + pp, … (one per chunk)
                        let parts: Vec<Gpt> = (0..v)
                            .map(|c| Gpt::part_at(cfg, (0, 1), cuts[c * pp + r].clone(), (0, 1)).unwrap())
                            .collect();
                        let ps: Vec<Vec<f32>> = parts
                            .iter()
                            .map(|part| {
                                let mut p = vec![0f32; part.layout.total];
                                for s in &part.layout.specs {
                                    s.view
                                        .of_mut(&mut p)
                                        .copy_from_slice(whole.layout.get(&s.name).unwrap().view.of(&params));
                                }
                                p
                            })
                            .collect();
                        let mut gs: Vec<Vec<f32>> = parts.iter().map(|p| vec![0f32; p.layout.total]).collect();
                        let mut chunks: Vec<Chunk> = parts
                            .iter()
                            .zip(&ps)
                            .zip(gs.iter_mut())
                            .map(|((part, params), grads)| Chunk { part, params, grads })
                            .collect();
                        let data = MicroBatches { tokens: &tokens, targets: &targets, b, t, scale, positions: &[] };
                        let t0 = std::time::Instant::now();
                        let ran = run_step(
                            plan,
                            (&comm, &Tp::SOLO, None, None),
                            &mut chunks,
                            &data,
                            recompute,
                            &mut Default::default(),
                        )?;
                        // the forwards' and backwards' seconds: some, and within the step
                        let wall = t0.elapsed().as_secs_f64();
                        assert!(
                            ran.compute_s() > 0.0 && ran.compute_s() <= wall,
                            "compute {} s of {wall} s",
                            ran.compute_s()
                        );
                        let (loss, peak) = (ran.loss, (ran.peak, ran.peak_bytes));
                        // each tensor's gradient by name, for the check
                        let named: Vec<(String, Vec<f32>)> = parts
                            .iter()
                            .zip(&gs)
                            .flat_map(|(part, g)| {
                                part.layout
                                    .specs
                                    .iter()
                                    .map(|s| (s.name.clone(), s.view.of(g).to_vec()))
                                    .collect::<Vec<_>>()
                            })
                            .collect();
                        Ok::<_, brigade::Error>((loss, peak, named))
                    })
                    .unwrap()
                };
                let out = run_plan(&plan);
                if m >= 4 && kind == Schedule::ZeroBubble {
                    // the lists for equal costs: the same loss and gradients, bit for bit
                    let unit = run_plan(&build(kind, pp, m, v).unwrap());
                    for (r, (a, b)) in out.iter().zip(&unit).enumerate() {
                        assert_eq!(a.0.to_bits(), b.0.to_bits(), "m={m} rank {r}: the loss");
                        for ((name, x), (_, y)) in a.2.iter().zip(&b.2) {
                            let same = x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
                            assert!(same, "m={m} {recompute:?} rank {r}: {name} differs from the unit lists'");
                        }
                    }
                }
                let what = format!("{kind:?} pp={pp} v={v} m={m} recompute={recompute:?}");
                let loss: f64 = out.iter().map(|o| o.0).sum();
                assert!(((loss - want_loss) / want_loss).abs() < 1e-12, "{what}: loss {loss} vs {want_loss}");
                for s in &whole.layout.specs {
                    let mut got = vec![0f32; s.view.len];
                    for (_, _, named) in &out {
                        for (_, g) in named.iter().filter(|(n, _)| *n == s.name) {
                            got.iter_mut().zip(g).for_each(|(a, b)| *a += b);
                        }
                    }
                    let e = rel(&got, s.view.of(&want));
                    assert!(e < 1e-6, "{what}: {} differs by {e:.1e}", s.name);
                }
                // the executor holds what the schedule says: 1F1B at most pp − r micro-batches,
                // ZB-H1 (whose rule lets a rank start a forward while fewer than pp micro-batches
                // hold activations, counting those waiting for their W) at most pp
                for (r, o) in out.iter().enumerate() {
                    let most = match kind {
                        Schedule::OneFOneB => (pp - r).min(m),
                        Schedule::ZeroBubble => pp.min(m),
                        _ => m * v, // a stash entry per (micro-batch, chunk)
                    };
                    assert!(o.1 .0 <= most, "{what}: rank {r} held {}", o.1 .0);
                }
                // selective recompute keeps no attention scores, full recompute each micro-batch's
                // input only: a smaller stash on every rank, each time
                let bytes: Vec<usize> = out.iter().map(|o| o.1 .1).collect();
                if recompute != Recompute::None {
                    for (r, (&with, &before)) in bytes.iter().zip(&kept_bytes).enumerate() {
                        assert!(with < before, "{what}: rank {r} stashed {with} bytes, {before} with less recompute");
                    }
                }
                if matches!(kind, Schedule::OneFOneB | Schedule::ZeroBubble) {
                    stash_bytes.entry((kind, pp, recompute)).or_default().push((m, bytes.clone()));
                }
                kept_bytes = bytes;
            }
        }
    }
    let at = |key: (Schedule, usize, Recompute), m: usize| {
        &stash_bytes[&key].iter().find(|(k, _)| *k == m).expect("every m ran").1
    };
    // 1F1B holds at most pp − r micro-batches whatever m: once m ≥ pp, more micro-batches stash
    // no more bytes (what is taken from the stash is given back — under full recompute too)
    for &(kind, pp, recompute) in stash_bytes.keys().filter(|k| k.0 == Schedule::OneFOneB) {
        let key = (kind, pp, recompute);
        assert_eq!(at(key, 8), at(key, 4), "1F1B pp={pp} recompute={recompute:?}: stash bytes grew with m");
    }
    // a zero-bubble B leaves its weight gradients' inputs for its W: under full recompute, where
    // 1F1B's stash is each micro-batch's input only, ZB-H1 holds more on every rank, at every m
    for m in [1, 2, 4, 8] {
        let (zb, one) =
            (at((Schedule::ZeroBubble, 3, Recompute::Full), m), at((Schedule::OneFOneB, 3, Recompute::Full), m));
        for r in 0..3 {
            assert!(zb[r] > 4 * one[r], "m={m} rank {r}: ZB-H1 stashed {} bytes, 1F1B {}", zb[r], one[r]);
        }
    }
    assert_eq!(stash_bytes.len(), 4 * 3, "three 1F1B depths and one zero-bubble × three recompute modes");
    // 4 micro-batch counts × 8 schedules, less the three refused by name: no case vanished
    assert_eq!(refused, REFUSED.to_vec(), "the refused cases");
    assert_eq!(ran, 4 * 8 - REFUSED.len());
}
