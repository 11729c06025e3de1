//! `bench beside`'s paired steps: the copies that bound a layout are timed as the layout runs
//! its products, on whole shares and, where the layout names smaller micro-batches, on those.

use brigade::bench::beside::paired_steps;
use brigade::layout::Layout;
use brigade::train::TrainConfig;

fn cfg() -> TrainConfig {
    TrainConfig { batch: 8, steps: 3, eval_every: 0, ..TrainConfig::default() }
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
