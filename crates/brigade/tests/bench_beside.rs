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
