//! `bench beside`'s paired steps: the copies that bound a layout are timed as the layout runs
//! its products, on whole shares and, where the layout names smaller micro-batches, on those.

use brigade::bench::beside::{micro_batch_of, paired_steps};
use brigade::layout::Layout;
use brigade::train::TrainConfig;

fn cfg() -> TrainConfig {
    TrainConfig { batch: 8, steps: 3, eval_every: 0, ..TrainConfig::default() }
}

#[test]
fn the_copies_run_the_layouts_micro_batch_where_it_is_smaller_and_divides_their_share() {
    let of = |l: &str, share| micro_batch_of(&Layout::parse(l).unwrap(), share);
    assert_eq!(of("pp=2,mb=1", 4), Some(1));
    assert_eq!(of("dp=2,mb=2", 4), Some(2));
    assert_eq!(of("dp=2,mb=4", 4), None, "the whole share");
    assert_eq!(of("pp=2,mb=3", 4), None, "does not divide it");
    assert_eq!(of("dp=2", 4), None);
}

#[test]
fn a_layout_of_smaller_micro_batches_is_paired_with_copies_running_them() {
    let layout = Layout::parse("pp=2,mb=1").unwrap();
    let (paired, bubble) = paired_steps(&cfg(), &layout, 1 << 20, 1, 2).unwrap();
    assert_eq!(paired.len(), 2);
    assert!(bubble.is_some_and(|b| b > 0.0 && b < 1.0), "a pipeline's bubble on paper: {bubble:?}");
    for p in &paired {
        assert!(p.whole_s > 0.0 && p.copies_s > 0.0 && p.layout_s > 0.0);
        // timed on its own (four one-sequence micro-batches, not the copies' step again)
        assert!(p.copies_micro_s > 0.0 && p.copies_micro_s != p.copies_s, "{p:?}");
        assert_eq!(p.micro_ceiling(), p.whole_s / p.copies_micro_s);
    }
}

#[test]
fn a_layout_of_whole_shares_has_one_ceiling() {
    let layout = Layout::parse("dp=2").unwrap();
    let (paired, bubble) = paired_steps(&cfg(), &layout, 1 << 20, 1, 1).unwrap();
    assert!(bubble.is_none());
    assert!(paired.iter().all(|p| p.copies_micro_s == p.copies_s && p.micro_ceiling() == p.ceiling()), "{paired:?}");
}

/// The trainers a pairing holds at once, counted from `training_memory` independently: the
/// whole batch, and per rank a copy, its micro-batched twin and the layout's rank (a pipeline
/// rank the state of the larger of its two stages' parameters as the trainer cuts them, the
/// tied table's copy included; ZeRO-1 on two ranks half the AdamW moments and a gradient shard
/// beside the whole gradient); a machine with less memory than that gets the figure and what to
/// lower, before anything is allocated.
#[test]
fn a_pairing_is_counted_and_refused_where_it_does_not_fit() {
    use brigade::bench::beside::{pairing_fits, pairing_need};
    use brigade::parallel::pipeline::RankModel;
    use brigade::train::memory::training_memory;
    let cfg = cfg();
    let (mcfg, seq) = brigade::train::Trainer::check_layout(&cfg, &Layout::default()).unwrap();
    let m = |b| training_memory(&mcfg, b, seq);
    let p = mcfg.num_params();
    let pp = Layout::parse("pp=2,mb=1").unwrap();
    let stage = |r| RankModel::stage(mcfg, (0, 1), (r, 2), 1, seq, (0, 1)).unwrap().layout.total as u128;
    let held = stage(0).max(stage(1));
    assert!(stage(0) + stage(1) > p, "the last stage holds a copy of the tied table");
    let pp_rank = 16 * held + m(1).activations;
    let want = m(8).total() + 2 * (m(4).total() + m(1).total() + pp_rank);
    assert_eq!(pairing_need(&cfg, &pp, Some(1)).unwrap(), (want, 7));
    let zero = Layout::parse("dp=2,zero=1").unwrap();
    let zero_rank = 4 * p + 4 * p + 2 * p + 4 * p + m(4).activations;
    assert_eq!(pairing_need(&cfg, &zero, None).unwrap(), (m(8).total() + 2 * (m(4).total() + zero_rank), 5));
    assert!(pairing_fits(&cfg, &pp, Some(1), Some(want)).is_ok());
    assert!(pairing_fits(&cfg, &pp, Some(1), None).is_ok(), "no figure for the memory: not refused");
    let e = pairing_fits(&cfg, &pp, Some(1), Some(want - 1)).unwrap_err().to_string();
    assert!(e.contains("7 trainers") && e.contains("lower --batch or --seq"), "{e}");
}
