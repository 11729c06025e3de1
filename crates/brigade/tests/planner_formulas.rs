//! The planner's formulas against the closed forms of the papers it follows.

use brigade::layout::{Layout, Recompute, Schedule, Spec as Fixed};
use brigade::plan::catalog::{accelerator, model, ModelShape};
use brigade::plan::{estimate, memory_gib, search, step_flops, Training};

fn gpt(layers: usize, hidden: usize, heads: usize, seq: usize, vocab: usize) -> ModelShape {
    ModelShape { layers, hidden, heads, kv_heads: heads, ffn: 4 * hidden, swiglu: false, seq, vocab, tied: true }
}

#[test]
fn flops_match_the_megatron_lm_closed_forms() {
    for m in [gpt(96, 12288, 96, 2048, 51200), gpt(24, 2304, 24, 2048, 51200), gpt(12, 768, 12, 1024, 50257)] {
        let (b, s, l, h, v) = (512.0, m.seq as f64, m.layers as f64, m.hidden as f64, m.vocab as f64);
        let model72 = 72.0 * b * s * l * h * h * (1.0 + s / (6.0 * h) + v / (12.0 * h * l));
        let hw96 = 96.0 * b * s * l * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * h * l));
        let (fm, _) = step_flops(&m, 512, Recompute::None);
        let (_, fh) = step_flops(&m, 512, Recompute::Full);
        assert!((fm / model72 - 1.0).abs() < 1e-12, "{fm} vs {model72}");
        assert!((fh / hw96 - 1.0).abs() < 1e-12, "{fh} vs {hw96}");
    }
}

#[test]
fn activation_memory_matches_korthikanti_with_tensor_and_sequence_parallelism() {
    // One stage, one micro-batch in flight, no optimizer state to speak of: memory minus
    // weights/state and logits is the per-layer formula s·b·h/t·(34 + 5·a·s/h) times layers.
    let m = gpt(4, 4096, 32, 2048, 8);
    let t = Training { global_batch: 1, flash_attention: false, ..Training::default() };
    let gib = (1u64 << 30) as f64;
    for (tp, rec, per_layer) in [
        (1usize, Recompute::None, 34.0 + 5.0 * 32.0 * 2048.0 / 4096.0),
        (4, Recompute::None, 34.0 + 5.0 * 32.0 * 2048.0 / 4096.0),
        (8, Recompute::Selective, 34.0),
    ] {
        let l = Layout {
            tp,
            pp: 1,
            dp: 1,
            mb: Some(1),
            v: 1,
            recompute: rec,
            zero: 0,
            schedule: Schedule::OneFOneB,
            sp: false,
        };
        let total = memory_gib(&m, &t, &l) * gib;
        let (pl, pe) = brigade::plan::cost::params(&m);
        let state = 16.0 * (4.0 * pl + pe) / tp as f64;
        let logits = 2048.0 * 8.0 / tp as f64 * 6.0;
        let act = total - state - logits - 2.0 * gib;
        let want = 4.0 * 2048.0 * 4096.0 / tp as f64 * per_layer;
        assert!((act / want - 1.0).abs() < 1e-9, "tp {tp} {rec:?}: {act} vs {want}");
    }
}

#[test]
fn more_gpus_never_slow_down_the_best_layout_and_bubbles_follow_theory() {
    let m = model("gpt3-13b").unwrap();
    let a = accelerator("a100-80gb").unwrap();
    let t = Training { global_batch: 512, flash_attention: true, ..Training::default() };
    let t64 = search(&m, &a, 64, &t, &Fixed::default()).unwrap()[0].step_time_s;
    let t256 = search(&m, &a, 256, &t, &Fixed::default()).unwrap()[0].step_time_s;
    assert!(t256 < t64);
    // bubble = (p−1)/(v·m) of the ideal per-micro-batch time
    let l = Layout {
        tp: 8,
        pp: 4,
        dp: 2,
        mb: Some(1),
        v: 1,
        recompute: Recompute::None,
        zero: 0,
        schedule: Schedule::OneFOneB,
        sp: false,
    };
    let e1 = estimate(&m, &a, &t, &l);
    let e2 = estimate(&m, &a, &t, &Layout { v: 2, schedule: Schedule::Interleaved, ..l });
    let micro = 512.0 / 2.0;
    let ideal1 = (e1.breakdown.compute_s + e1.breakdown.tp_comm_s) / micro;
    assert!((e1.breakdown.pp_bubble_s / ideal1 - 3.0).abs() < 1e-9);
    assert!((e2.breakdown.pp_bubble_s / e1.breakdown.pp_bubble_s - 0.5).abs() < 0.05);
}

#[test]
fn a_model_that_fits_nowhere_says_how_much_it_needs() {
    let m = model("llama3-405b").unwrap();
    let a = accelerator("a100-40gb").unwrap();
    let t = Training { global_batch: 16, flash_attention: true, ..Training::default() };
    let e = search(&m, &a, 8, &t, &Fixed::default()).unwrap_err().to_string();
    assert!(e.contains("no layout fits in 40 GiB per GPU: the smallest needs"), "{e}");
}

#[test]
fn fp32_doubles_activations_and_runs_at_the_tf32_peak() {
    use brigade::plan::cost::Precision;
    let m = gpt(4, 4096, 32, 2048, 8);
    let a = accelerator("a100-80gb").unwrap();
    let l = Layout {
        tp: 1,
        pp: 1,
        dp: 1,
        mb: Some(1),
        v: 1,
        recompute: Recompute::None,
        zero: 0,
        schedule: Schedule::OneFOneB,
        sp: false,
    };
    let bf = Training { global_batch: 1, ..Training::default() };
    let fp = Training { precision: Precision::Fp32, ..bf };
    let state = 16.0 * {
        let (pl, pe) = brigade::plan::cost::params(&m);
        4.0 * pl + pe
    } / (1u64 << 30) as f64;
    let logits = |b: f64| 2048.0 * 8.0 * (b + 4.0) / (1u64 << 30) as f64;
    let act = |t: &Training, b: f64| memory_gib(&m, t, &l) - state - logits(b) - 2.0;
    assert!((act(&fp, 4.0) / act(&bf, 2.0) - 2.0).abs() < 1e-9);
    // compute-bound step: the time scales with the peak (312 / 156)
    let (tb, tf) = (estimate(&m, &a, &bf, &l), estimate(&m, &a, &fp, &l));
    let ratio = tf.breakdown.compute_s / tb.breakdown.compute_s;
    assert!(ratio > 1.9 && ratio <= 2.0 + 1e-9, "{ratio}");
}

#[test]
fn gpipe_keeps_every_micro_batch_in_flight_and_1f1b_only_pp() {
    let m = model("gpt3-13b").unwrap();
    let a = accelerator("a100-80gb").unwrap();
    let l = Layout {
        tp: 8,
        pp: 4,
        dp: 2,
        mb: Some(1),
        v: 1,
        recompute: Recompute::None,
        zero: 1,
        schedule: Schedule::OneFOneB,
        sp: false,
    };
    let g = Layout { schedule: Schedule::GPipe, ..l };
    let batch = |b| Training { global_batch: b, ..Training::default() };
    // same bubble, same time
    assert_eq!(estimate(&m, &a, &batch(256), &l).step_time_s, estimate(&m, &a, &batch(256), &g).step_time_s);
    // GPipe holds m micro-batches on every stage, 1F1B pp − r on stage r: never more than
    // GPipe, and GPipe's extra grows with m (batch 256 over dp 2: m = 128; 128: 64; 64: 32)
    let extra = |b| memory_gib(&m, &batch(b), &g) - memory_gib(&m, &batch(b), &l);
    assert!(extra(8) >= 0.0); // m = 4 = pp: the later stages hold fewer under 1F1B
    assert!(((extra(256) - extra(128)) / (extra(128) - extra(64)) - 2.0).abs() < 1e-9);
    // a fixed schedule stays fixed
    let t = Training { global_batch: 256, ..Training::default() };
    let fixed = Fixed::parse("tp=8,pp=4,schedule=gpipe,recompute=full").unwrap();
    let r = search(&m, &a, 64, &t, &fixed).unwrap();
    assert!(r.iter().all(|e| e.layout.schedule == Schedule::GPipe && e.layout.v == 1));
    assert!(Fixed::parse("schedule=zigzag").is_err());
}

#[test]
fn uneven_stages_take_fewer_layers_first_and_last_and_memory_is_the_busiest_ranks() {
    use brigade::plan::cost::layers_per_rank;
    // Llama 3 405B: 126 layers on 16 stages, split 7, 8 × 14, 7 (Dubey et al. 2024, §3.3.2)
    let m = model("llama3-405b").unwrap();
    let l = Layout {
        tp: 8,
        pp: 16,
        dp: 64,
        mb: Some(1),
        v: 1,
        recompute: Recompute::None,
        zero: 1,
        schedule: Schedule::OneFOneB,
        sp: false,
    };
    let mut want = vec![8; 16];
    (want[0], want[15]) = (7, 7);
    assert_eq!(layers_per_rank(&m, &l), want);
    // with two chunks a rank: 32 stages of 3 or 4 layers, the first and last of 3
    let per_rank = layers_per_rank(&m, &Layout { v: 2, schedule: Schedule::Interleaved, ..l });
    assert_eq!(per_rank.iter().sum::<usize>(), 126);
    assert_eq!((per_rank[0], per_rank[1], per_rank[15]), (7, 8, 7));
    // and it fits, without recompute, on 80 GB (1F1B: the second rank's 8 layers × 15
    // micro-batches outweigh the first's 7 × 16)
    let a = accelerator("h100-sxm").unwrap();
    let t = Training { global_batch: 2048, flash_attention: true, ..Training::default() };
    let e = estimate(&m, &a, &t, &l);
    assert!(e.fits, "{:.1} GiB", e.memory_gib_per_gpu);
    // a layer count pp divides: every rank the same
    let even = model("gpt3-13b").unwrap();
    assert_eq!(layers_per_rank(&even, &Layout { pp: 4, tp: 1, dp: 1, ..l }), [10, 10, 10, 10]);
}

#[test]
fn zero_bubble_leaves_a_third_of_the_1f1b_bubble_within_its_memory_bound() {
    let m = model("gpt3-13b").unwrap();
    let a = accelerator("a100-80gb").unwrap();
    let t = Training { global_batch: 256, ..Training::default() };
    let l = Layout {
        tp: 8,
        pp: 4,
        dp: 2,
        mb: Some(1),
        v: 1,
        recompute: Recompute::None,
        zero: 1,
        schedule: Schedule::OneFOneB,
        sp: false,
    };
    let z = Layout { schedule: Schedule::ZeroBubble, ..l };
    let (e1, ez) = (estimate(&m, &a, &t, &l), estimate(&m, &a, &t, &z));
    // a forward 1, a backward 2 split into B 1 and W 1: (pp − 1)(F + B − W) of (pp − 1)(F + B + W)
    assert!((ez.breakdown.pp_bubble_s / e1.breakdown.pp_bubble_s - 1.0 / 3.0).abs() < 1e-9);
    assert!(ez.step_time_s < e1.step_time_s);
    // every rank may hold pp micro-batches (1F1B: pp − r): never less than 1F1B
    assert!(memory_gib(&m, &t, &z) >= memory_gib(&m, &t, &l));
    let r = search(&m, &a, 64, &t, &Fixed::parse("tp=8,pp=4,schedule=zb").unwrap()).unwrap();
    assert!(r.iter().all(|e| e.layout.schedule == Schedule::ZeroBubble && e.layout.v == 1));
}

/// The planner's Llama 3 shapes are brigade's presets of them (the ones training builds), and
/// brigade's other presets plan as they train: GQA, SwiGLU, tied or untied head.
#[test]
fn the_planner_uses_the_models_training_builds() {
    for name in ["llama3-8b", "llama3-70b", "llama3-405b"] {
        let cfg = brigade::models::GptConfig::preset(name).unwrap();
        let mut want = ModelShape::of(&cfg, 0);
        let got = model(name).unwrap();
        want.seq = got.seq;
        assert_eq!(got, want, "{name}");
    }
    let smol = model("smollm2-135m").unwrap();
    assert_eq!((smol.heads, smol.kv_heads, smol.ffn, smol.swiglu, smol.tied), (9, 3, 1536, true, true));
    // the untied head is its own parameters: the 8B model's 8.03B, counted by the planner
    let m = model("llama3-8b").unwrap();
    let (per_layer, embed) = brigade::plan::cost::params(&m);
    let total = 32.0 * per_layer + embed + brigade::plan::cost::head_params(&m);
    // the planner leaves out the norms' 2·L·h + h = 266,240 scales
    assert_eq!(total, 8_030_261_248.0 - 266_240.0);
}
