//! Every schedule's lists, checked by the simulator: each send has its receive, nothing
//! deadlocks, the activation peak per stage and the bubble against theory; and the simulator
//! refuses broken lists.

use brigade::layout::Schedule;
use brigade::parallel::pipeline::{build, build_for, chart, simulate, Action, Costs, Plan};

const KINDS: [Schedule; 4] = [Schedule::GPipe, Schedule::OneFOneB, Schedule::Interleaved, Schedule::ZeroBubble];

/// (pp − 1) / (v·m + pp − 1): the idle share with a forward 1 and a backward 2 per chunk
/// of 1/v of the model.
fn theory(pp: usize, m: usize, v: usize) -> f64 {
    (pp - 1) as f64 / ((v * m + pp - 1) as f64)
}

fn per_chunk(v: usize) -> Costs {
    Costs::per_chunk(v)
}

/// Whether the documented rules admit a schedule (written here, not asked of `build`): model
/// chunks (v > 1) only interleaved, and interleaving needs a multiple of pp micro-batches.
fn admitted(kind: Schedule, pp: usize, m: usize, v: usize) -> bool {
    (v == 1 || kind == Schedule::Interleaved) && (kind != Schedule::Interleaved || m.is_multiple_of(pp))
}

/// `build`, held to the rules: what they admit must build, what they refuse must be refused
/// (`None`), and `counts` (ran, refused) keeps the tally the test checks against the table.
fn built(kind: Schedule, pp: usize, m: usize, v: usize, counts: &mut (usize, usize)) -> Option<Plan> {
    match build(kind, pp, m, v) {
        Ok(plan) => {
            assert!(admitted(kind, pp, m, v), "{kind:?} pp={pp} m={m} v={v}: built, though the rules refuse it");
            counts.0 += 1;
            Some(plan)
        }
        Err(e) => {
            assert!(!admitted(kind, pp, m, v), "{kind:?} pp={pp} m={m} v={v}: refused ({e}), though valid");
            counts.1 += 1;
            None
        }
    }
}

/// Cases of a table over pp, m = 1..=16 and (schedule, v) pairs that the rules admit.
fn admitted_count(pps: &[usize], kinds: &[(Schedule, usize)]) -> usize {
    let mut n = 0;
    for &pp in pps {
        for &(kind, v) in kinds {
            n += match kind {
                // m = pp, 2pp, … up to 16
                Schedule::Interleaved => 16 / pp,
                _ if v == 1 => 16,
                _ => 0,
            };
        }
    }
    n
}

#[test]
fn every_schedule_runs_without_deadlock_at_its_theoretical_bubble() {
    let mut counts = (0, 0);
    for pp in [1, 2, 3, 4, 8] {
        for m in 1..=16 {
            for kind in KINDS {
                for v in [1, 2, 3] {
                    let Some(plan) = built(kind, pp, m, v, &mut counts) else { continue };
                    let r =
                        simulate(&plan, &per_chunk(v)).unwrap_or_else(|e| panic!("{kind:?} pp={pp} m={m} v={v}: {e}"));
                    let what =
                        format!("{kind:?} pp={pp} m={m} v={v}: bubble {:.4}, peaks {:?}", r.bubble, r.peak_activations);
                    match kind {
                        Schedule::GPipe | Schedule::OneFOneB => {
                            assert!((r.bubble - theory(pp, m, 1)).abs() < 1e-9, "{what}")
                        }
                        Schedule::Interleaved => assert!((r.bubble - theory(pp, m, v)).abs() < 1e-9, "{what}"),
                        Schedule::ZeroBubble => {
                            let one = simulate(&build(Schedule::OneFOneB, pp, m, 1).unwrap(), &Costs::UNIT).unwrap();
                            if m == 2 * pp {
                                println!("{what}; 1F1B {:.4}, peaks {:?}", one.bubble, one.peak_activations);
                            }
                            assert!(r.bubble <= one.bubble + 1e-9, "{what} vs 1F1B {:.4}", one.bubble);
                            if pp > 1 && m >= pp {
                                assert!(
                                    r.bubble < one.bubble - 1e-9,
                                    "{what}: no better than 1F1B's {:.4}",
                                    one.bubble
                                );
                            }
                            // 1F1B's activation memory: no rank holds more than 1F1B's first rank
                            let (z, o) = (r.peak_activations.iter().max(), one.peak_activations.iter().max());
                            assert!(z <= o, "{what}: a rank holds {z:?} > 1F1B's peak {o:?}");
                        }
                    }
                    // activations: GPipe holds every micro-batch, 1F1B at most pp − r on rank r
                    for (rank, &p) in r.peak_activations.iter().enumerate() {
                        match kind {
                            Schedule::GPipe => assert_eq!(p, m, "{what}"),
                            Schedule::OneFOneB => assert_eq!(p, (pp - rank).min(m), "{what}"),
                            // Megatron's warm-up of (pp − 1 − r)·2 + (v − 1)·pp chunks, plus one
                            Schedule::Interleaved if v > 1 => {
                                assert_eq!(p, ((pp - 1 - rank) * 2 + (v - 1) * pp + 1).min(m * v), "{what}")
                            }
                            _ => assert!(p <= pp.min(m), "{what}"),
                        }
                    }
                }
            }
        }
    }
    // no case vanished: 5 pp × 16 m × 4 schedules × 3 v; v > 1 only interleaved, and
    // interleaving only with m a multiple of pp (16 + 8 + 5 + 4 + 2 counts of m, each v)
    let pairs: Vec<(Schedule, usize)> = KINDS.iter().flat_map(|&k| [1, 2, 3].map(|v| (k, v))).collect();
    let admitted = admitted_count(&[1, 2, 3, 4, 8], &pairs);
    assert_eq!(admitted, 3 * 5 * 16 + 3 * (16 + 8 + 5 + 4 + 2));
    assert_eq!(counts, (admitted, 5 * 16 * 4 * 3 - admitted));
}

#[test]
fn impossible_schedules_are_refused_with_what_would_work() {
    let e = build(Schedule::Interleaved, 4, 6, 2).unwrap_err().to_string();
    assert!(e.contains("needs a multiple of 4 micro-batches, not 6; use 4 or 8"), "{e}");
    let e = build(Schedule::OneFOneB, 4, 8, 2).unwrap_err().to_string();
    assert!(e.contains("needs schedule=interleaved"), "{e}");
    assert!(build(Schedule::GPipe, 0, 4, 1).is_err());
    // found by fuzzing `--print-schedule`: a pipeline too large to list is refused before its
    // lists are built
    let e = build(Schedule::OneFOneB, 333_666_666_666_666, 8, 1).unwrap_err().to_string();
    assert!(e.contains("at most 4096 stages"), "{e}");
    assert!(build(Schedule::Interleaved, usize::MAX / 2, 8, 4).is_err());
    assert!(build(Schedule::GPipe, 2, 1 << 20, 1).is_err());
    let e = Schedule::parse("zb1").unwrap_err().to_string();
    assert!(e.contains("expected gpipe, 1f1b, interleaved or zb"), "{e}");
    for k in KINDS {
        assert_eq!(Schedule::parse(k.name()).unwrap(), k);
    }
}

#[test]
fn the_simulator_rejects_broken_lists() {
    let good = build(Schedule::OneFOneB, 4, 8, 1).unwrap();
    assert!(simulate(&good, &Costs::UNIT).is_ok());
    // a dropped receive: the forward lacks its input
    let mut p = good.clone();
    let i = p.ranks[2].iter().position(|a| matches!(a, Action::RecvActivation { .. })).unwrap();
    p.ranks[2].remove(i);
    let e = simulate(&p, &Costs::UNIT).unwrap_err();
    assert!(e.contains("without the previous stage's activation"), "{e}");
    // a dropped send: the receiver waits for ever
    let mut p = good.clone();
    let i = p.ranks[1].iter().position(|a| matches!(a, Action::SendGrad { .. })).unwrap();
    p.ranks[1].remove(i);
    let e = simulate(&p, &Costs::UNIT).unwrap_err();
    assert!(e.contains("deadlock") && e.contains("RecvGrad"), "{e}");
    // a swapped pair: two ranks each receive before they send what the other waits for
    let mut p = good.clone();
    let (a, b) = (p.ranks[3].iter().position(|a| matches!(a, Action::RecvActivation { .. })).unwrap(), 0);
    let recv = p.ranks[3].remove(a);
    p.ranks[3].insert(b, recv);
    assert!(simulate(&p, &Costs::UNIT).is_ok(), "a receive moved earlier only waits");
    let mut p = good.clone();
    let f = p.ranks[0].iter().position(|a| matches!(a, Action::Backward { .. })).unwrap();
    p.ranks[0].swap(f, f - 1);
    let e = simulate(&p, &Costs::UNIT).unwrap_err();
    assert!(e.contains("deadlock") || e.contains("without"), "{e}");
    // a micro-batch computed twice
    let mut p = good.clone();
    p.ranks[0].push(Action::Forward { mb: 0, chunk: 0 });
    assert!(simulate(&p, &Costs::UNIT).unwrap_err().contains("2 time(s) forward"));
    // a send nobody receives
    let mut p = good;
    p.ranks[0].push(Action::SendActivation { mb: 7, chunk: 0, to: 2 });
    assert!(simulate(&p, &Costs::UNIT).unwrap_err().contains("never receives it"));
}

#[test]
fn the_chart_shows_each_rank_order() {
    let c = chart(&build(Schedule::OneFOneB, 2, 3, 1).unwrap());
    assert_eq!(
        c,
        "schedule 1f1b · pp=2 · 3 micro-batches · v=1\nrank 0: F0 F1 B0 F2 B1 B2\nrank 1: F0 B0 F1 B1 F2 B2\n"
    );
    let z = chart(&build(Schedule::ZeroBubble, 2, 2, 1).unwrap());
    assert!(z.contains("rank 1: F0 b0") && z.contains(" w"), "{z}");
}

/// The planner's memory model counts each stage's in-flight micro-batches as the schedules
/// really hold them.
#[test]
fn the_planner_counts_in_flight_micro_batches_as_the_simulator_measures() {
    use brigade::plan::cost::{in_flight, in_flight_at, Layout, Recompute};
    const KINDS_V: [(Schedule, usize); 5] = [
        (Schedule::GPipe, 1),
        (Schedule::OneFOneB, 1),
        (Schedule::ZeroBubble, 1),
        (Schedule::Interleaved, 2),
        (Schedule::Interleaved, 3),
    ];
    let mut counts = (0, 0);
    for pp in [2, 3, 4, 8] {
        for m in 1..=16 {
            for (kind, v) in KINDS_V {
                let Some(plan) = built(kind, pp, m, v, &mut counts) else { continue };
                let r = simulate(&plan, &per_chunk(v)).unwrap();
                let measured = *r.peak_activations.iter().max().unwrap() as f64 / v as f64;
                let l = Layout {
                    tp: 1,
                    pp,
                    dp: 1,
                    mb: Some(1),
                    v,
                    recompute: Recompute::None,
                    zero: 0,
                    schedule: kind,
                    sp: false,
                    ..Layout::default()
                };
                let planned = in_flight(&l, m);
                assert!(
                    (planned - measured).abs() < 1e-9,
                    "{kind:?} pp={pp} m={m} v={v}: planner {planned}, simulator {measured}"
                );
                for (r, &peak) in r.peak_activations.iter().enumerate() {
                    let planned = in_flight_at(&l, m, r);
                    let measured = peak as f64 / v as f64;
                    // ZB-H1's bound: exact on the first rank, never exceeded on the others
                    let zb_bound = kind == Schedule::ZeroBubble && measured <= planned;
                    assert!(
                        zb_bound || (planned - measured).abs() < 1e-9,
                        "{kind:?} pp={pp} m={m} v={v} rank {r}: planner {planned}, simulator {measured}"
                    );
                }
            }
        }
    }
    // no case vanished: 4 pp × 16 m × 5 pairs, of which interleaving admits m a multiple of pp
    let admitted = admitted_count(&[2, 3, 4, 8], &KINDS_V);
    assert_eq!(admitted, 3 * 4 * 16 + 2 * (8 + 5 + 4 + 2));
    assert_eq!(counts, (admitted, 4 * 16 * 5 - admitted));
}

/// ZB-H1 built for measured costs (`build_for`): on the costs it is built for, never longer
/// than the unit-cost lists or 1F1B, as little memory as 1F1B's first rank, micro-batches in
/// order within B's and within W's (so the gradients sum alike whichever lists run); and on a
/// weight gradient cheaper than the input gradient, well below the unit-cost lists.
#[test]
fn zero_bubble_lists_fit_the_costs_they_are_built_for() {
    let mut cases = 0;
    for pp in [2, 3, 4] {
        for m in [pp, 2 * pp, 8, 13, 16] {
            for (f, b, w) in [(1.0, 1.0, 1.0), (1.0, 1.3, 0.8), (1.15, 1.3, 1.0), (1.0, 1.5, 0.5), (1.2, 1.0, 1.1)] {
                for transfer in [0.0, 0.05] {
                    let c = Costs { forward: f, backward: b + w, backward_input: b, backward_weight: w, transfer };
                    let what = format!("pp={pp} m={m} F={f} B={b} W={w} transfer={transfer}");
                    let plan = build_for(Schedule::ZeroBubble, pp, m, 1, &c).unwrap();
                    let got = simulate(&plan, &c).unwrap_or_else(|e| panic!("{what}: {e}"));
                    let unit = simulate(&build(Schedule::ZeroBubble, pp, m, 1).unwrap(), &c).unwrap();
                    let one = simulate(&build(Schedule::OneFOneB, pp, m, 1).unwrap(), &c).unwrap();
                    assert!(
                        got.makespan <= unit.makespan + 1e-9,
                        "{what}: {} > unit lists' {}",
                        got.makespan,
                        unit.makespan
                    );
                    assert!(got.makespan <= one.makespan + 1e-9, "{what}: {} > 1F1B's {}", got.makespan, one.makespan);
                    assert!(got.peak_activations.iter().all(|&p| p <= pp.min(m)), "{what}: {:?}", got.peak_activations);
                    for list in &plan.ranks {
                        let order =
                            |pick: fn(&Action) -> Option<usize>| list.iter().filter_map(pick).collect::<Vec<_>>();
                        let bs = order(|a| match *a {
                            Action::BackwardInput { mb, .. } => Some(mb),
                            _ => None,
                        });
                        let ws = order(|a| match *a {
                            Action::BackwardWeight { mb, .. } => Some(mb),
                            _ => None,
                        });
                        let fs = order(|a| match *a {
                            Action::Forward { mb, .. } => Some(mb),
                            _ => None,
                        });
                        let all: Vec<usize> = (0..m).collect();
                        assert_eq!((&fs, &bs, &ws), (&all, &all, &all), "{what}: {}", chart(&plan));
                    }
                    cases += 1;
                }
            }
        }
    }
    assert_eq!(cases, 3 * 5 * 5 * 2);
    // the case measured on gpt2-small's stages: W a good deal cheaper than B
    let c = Costs { forward: 1.0, backward: 2.1, backward_input: 1.3, backward_weight: 0.8, transfer: 0.0 };
    let got = simulate(&build_for(Schedule::ZeroBubble, 2, 8, 1, &c).unwrap(), &c).unwrap();
    let unit = simulate(&build(Schedule::ZeroBubble, 2, 8, 1).unwrap(), &c).unwrap();
    assert!(got.bubble < unit.bubble - 0.03, "{:.4} vs the unit lists' {:.4}", got.bubble, unit.bubble);
}
