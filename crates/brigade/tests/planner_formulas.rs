//! The planner's formulas against the closed forms of the papers it follows.

use brigade::layout::{Layout, Recompute, Schedule, Spec as Fixed};
use brigade::plan::catalog::{accelerator, gpt, model, Accelerator, ModelShape};
use brigade::plan::{estimate, memory_gib, search, step_flops, Training};

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
            ..Layout::default()
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
        ..Layout::default()
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
        ..Layout::default()
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
        ..Layout::default()
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
        ..Layout::default()
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
fn zero_bubble_is_the_bubble_of_the_plan_the_trainer_runs_within_its_memory_bound() {
    use brigade::parallel::pipeline::{build, simulate, Costs};
    let m = model("gpt3-13b").unwrap();
    let a = accelerator("a100-80gb").unwrap();
    let t = Training { global_batch: 256, ..Training::default() };
    let l = Layout {
        tp: 1,
        pp: 4,
        dp: 2,
        mb: Some(1),
        v: 1,
        recompute: Recompute::None,
        zero: 1,
        schedule: Schedule::OneFOneB,
        sp: false,
        ..Layout::default()
    };
    let z = Layout { schedule: Schedule::ZeroBubble, ..l };
    let (e1, ez) = (estimate(&m, &a, &t, &l), estimate(&m, &a, &t, &z));
    // without tensor parallelism or recompute a stage's forward, input gradient and weight
    // gradient cost the same u (the backward is twice the forward): the bubble is the
    // simulator's for the trainer's ZB-H1 plan at unit costs, in units of u
    let micro = 128;
    let u = (e1.breakdown.compute_s / micro as f64) / 3.0;
    let plan = build(Schedule::ZeroBubble, 4, micro, 1).unwrap();
    let idle = simulate(&plan, &Costs::UNIT).unwrap().makespan - 3.0 * micro as f64;
    assert!((ez.breakdown.pp_bubble_s / (idle * u) - 1.0).abs() < 1e-9, "{} vs {}", ez.breakdown.pp_bubble_s, idle * u);
    // 1F1B idles (pp − 1)(F + B + W) = 9u; the plan fills part of it with deferred W halves,
    // never below Qi et al.'s (pp − 1)(F + B − W) = 3u
    assert!((e1.breakdown.pp_bubble_s / (9.0 * u) - 1.0).abs() < 1e-9);
    assert!((3.0 - 1e-9..9.0).contains(&idle), "ZB-H1 at pp=4, m=128 idles {idle} u");
    println!("ZB-H1 pp=4 m=128: {idle} u idle, 1F1B 9 u");
    assert!(ez.step_time_s < e1.step_time_s);
    // with tensor parallelism the forward and the input half carry collectives W does not, so
    // W is lighter than F: the plan (its W's placed for equal costs) no longer idles 4 u of 9
    let (l8, z8) = (Layout { tp: 8, ..l }, Layout { tp: 8, ..z });
    let (b1, bz) = (estimate(&m, &a, &t, &l8).breakdown.pp_bubble_s, estimate(&m, &a, &t, &z8).breakdown.pp_bubble_s);
    println!("tp=8: ZB-H1 idles {bz:.4} s, 1F1B {b1:.4} s");
    assert!(bz.is_finite() && bz > 0.0 && (bz / b1 - idle / 9.0).abs() > 0.01, "tp=8: ZB {bz} of 1F1B {b1}");
    // every rank may hold pp micro-batches (1F1B: pp − r): never less than 1F1B
    assert!(memory_gib(&m, &t, &z) >= memory_gib(&m, &t, &l));
    let r = search(&m, &a, 64, &t, &Fixed::parse("tp=8,pp=4,schedule=zb").unwrap()).unwrap();
    assert!(r.iter().all(|e| e.layout.schedule == Schedule::ZeroBubble && e.layout.v == 1));
}

/// GPipe's, 1F1B's and interleaved 1F1B's closed-form bubble, (pp − 1)/v of a micro-batch's
/// stage time, is what the simulator gives the trainer's plans with equal chunks.
#[test]
fn the_closed_form_bubbles_are_the_simulated_plans() {
    use brigade::parallel::pipeline::{build, simulate, Costs};
    use brigade::plan::cost::{pipeline_bubble, Work};
    let mut checked = 0;
    for (kind, v) in
        [(Schedule::GPipe, 1), (Schedule::OneFOneB, 1), (Schedule::Interleaved, 2), (Schedule::Interleaved, 4)]
    {
        for pp in [2, 3, 4, 8] {
            for m in [pp, 2 * pp, 8 * pp] {
                let plan = build(kind, pp, m, v).unwrap();
                let idle = simulate(&plan, &Costs::per_chunk(v)).unwrap().makespan - 3.0 * m as f64;
                let l = Layout { pp, v, schedule: kind, ..Layout::default() };
                let got = pipeline_bubble(&l, m, Work { forward: 1.0, backward: 2.0, weight: 1.0 });
                assert!((got - idle).abs() < 1e-9, "{kind:?} pp={pp} v={v} m={m}: {got} vs simulated {idle}");
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 48);
}

/// An accelerator with round numbers, so each term is a closed form one can check by hand.
fn round_accelerator() -> Accelerator {
    Accelerator {
        peak_tflops: 100.0,
        tf32_tflops: 50.0,
        hbm_gib: 1e6,
        hbm_tbps: 2.0,
        nvlink_gbps: 200.0,
        net_gbps: 10.0,
        gpus_per_node: 8,
        gemm_efficiency: 0.5,
        attention_efficiency: 0.25,
    }
}

/// The α–β all-reduce the planner assumes for a payload over n ranks: the faster of a ring
/// (2(n − 1) steps, 2(n − 1)/n of the bytes) and a double binary tree (2⌈log₂ n⌉ steps, the
/// bytes twice), α = 5 µs.
fn all_reduce(n: usize, bytes: f64, gbps: f64) -> f64 {
    if n == 1 {
        return 0.0;
    }
    let (n, bw) = (n as f64, gbps * 1e9);
    let ring = 2.0 * (n - 1.0) * 5e-6 + 2.0 * (n - 1.0) / n * bytes / bw;
    let tree = 2.0 * n.log2().ceil() * 5e-6 + 2.0 * bytes / bw;
    ring.min(tree)
}

/// A GPT layer's forward on one micro-batch of `tokens` over tp ranks, by the planner's three
/// parts: the matrix products' 24·h² FLOPs a token at the large-matrix efficiency, scaled by
/// x / (x + 128) for the per-rank width x = h / tp; the attention core's 4·s·h at its own
/// efficiency; and 8 bytes of traffic per byte of Korthikanti's 34·h stored activations.
fn layer_forward(m: &ModelShape, a: &Accelerator, tokens: f64, tp: f64) -> (f64, f64) {
    let (h, s) = (m.hidden as f64, m.seq as f64);
    let x = h / tp;
    let lin = tokens * 24.0 * h * h / tp / (a.peak_tflops * 1e12 * a.gemm_efficiency * x / (x + 128.0));
    let att = tokens * 4.0 * s * h / tp / (a.peak_tflops * 1e12 * a.attention_efficiency);
    let mem = 8.0 * 34.0 * h * tokens / tp / (a.hbm_tbps * 1e12);
    (lin + att + mem, att)
}

/// Each term of the step time on its own, against its closed form: compute (forward, backward
/// twice the forward, recomputation, the LM head), tensor-parallel communication (4 or, with
/// the forward recomputed, 6 all-reduces of a layer's activations), the bubble, pipeline
/// point-to-point, the data-parallel reduction the last backward does not hide, the optimizer
/// (16 bytes of traffic per parameter it updates) — and the step as their sum.
#[test]
fn each_term_of_the_step_time_is_its_formula() {
    let a = round_accelerator();
    let m = gpt(8, 1024, 16, 512, 8192);
    let (l, h, vocab) = (m.layers as f64, m.hidden as f64, m.vocab as f64);
    let t = Training { global_batch: 64, ..Training::default() };
    let base = Layout { mb: Some(2), schedule: Schedule::OneFOneB, ..Layout::default() };
    let mut checked = 0;
    for (tp, pp, dp, v, zero, recompute) in [
        (1, 1, 1, 1, 0, Recompute::None),
        (2, 1, 1, 1, 0, Recompute::Full),
        (4, 2, 1, 1, 0, Recompute::Selective),
        (2, 2, 4, 2, 1, Recompute::None),
        (8, 1, 2, 1, 3, Recompute::None),
        (1, 4, 2, 1, 2, Recompute::Full),
        (2, 1, 8, 1, 0, Recompute::Selective),
    ] {
        let lay = Layout { tp, pp, dp, v, zero, recompute, schedule: Schedule::default_for(v), ..base };
        let e = estimate(&m, &a, &t, &lay);
        let b = e.breakdown;
        let what = format!("{lay}");
        let (tpf, lps) = (tp as f64, l / pp as f64);
        let tokens = 2.0 * m.seq as f64;
        let micro = (64 / (dp * 2)) as f64;
        let (fwd, att) = layer_forward(&m, &a, tokens, tpf);
        let rec = match recompute {
            Recompute::None => 0.0,
            Recompute::Selective => att,
            Recompute::Full => fwd,
        };
        let x = h / tpf;
        let head = 3.0 * tokens * 2.0 * h * vocab / tpf / (a.peak_tflops * 1e12 * a.gemm_efficiency * x / (x + 128.0));
        let close = |got: f64, want: f64, term: &str| {
            assert!((got - want).abs() <= 1e-9 * want.abs().max(1e-12), "{what}: {term} {got:e}, formula {want:e}");
        };
        close(b.compute_s, micro * (lps * (3.0 * fwd + rec) + head), "compute");
        let n = if recompute == Recompute::Full { 6.0 } else { 4.0 };
        // tp ≤ 8 GPUs of a node: over NVLink
        let tp_mb = lps * n * all_reduce(tp, tokens * h * 2.0, a.nvlink_gbps);
        close(b.tp_comm_s, micro * tp_mb, "tensor-parallel communication");
        let stage = lps * (3.0 * fwd + rec) + head + tp_mb;
        close(b.pp_bubble_s, (pp as f64 - 1.0) / v as f64 * stage, "bubble");
        let p2p_bw = if tp * dp >= 8 { a.net_gbps } else { a.nvlink_gbps };
        let p2p = if pp > 1 { 2.0 * v as f64 * micro * (5e-6 + tokens * h * 2.0 / tpf / (p2p_bw * 1e9)) } else { 0.0 };
        close(b.p2p_s, p2p, "point-to-point");
        // a GPU's parameters: its layers' 12·h² and the tied table, over tp
        let params = (lps * 12.0 * h * h + vocab * h) / tpf;
        let dp_bw = if tp * dp > 8 { a.net_gbps } else { a.nvlink_gbps };
        let zf = if zero >= 3 { 1.5 } else { 1.0 };
        let exposed = (zf * all_reduce(dp, 2.0 * params, dp_bw) - lps * 2.0 * fwd).max(0.0);
        close(b.dp_exposed_s, exposed, "exposed data-parallel reduction");
        let updated = if zero >= 1 { params / dp as f64 } else { params };
        close(b.optimizer_s, 16.0 * updated / (a.hbm_tbps * 1e12), "optimizer");
        let sum = micro * stage + b.pp_bubble_s + b.p2p_s + b.dp_exposed_s + b.optimizer_s;
        close(e.step_time_s, sum, "step time");
        checked += 1;
    }
    assert_eq!(checked, 7);
    // the exposed reduction is a real term somewhere in the table above: dp = 8 over tp = 2
    // leaves the node, and its 10 GB/s do not hide behind the last backward
    let slow = estimate(&m, &a, &t, &Layout { tp: 2, dp: 8, ..base });
    assert!(slow.breakdown.dp_exposed_s > 0.0, "{:?}", slow.breakdown);
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

/// A mixture's parameters as the planner counts them: every expert for memory, the k a token
/// goes to (with the attention and both tables) for its FLOPs — the published figures of
/// Mixtral 8x7B (46.7B, 12.9B active: Mistral AI's announcement) and Qwen3-30B-A3B (30.5B,
/// 3.3B activated: its model card) and OLMoE-1B-7B (6.9B, 1.3B active: its paper), to their
/// rounding.
#[test]
fn mixture_parameter_counts_match_the_published_figures() {
    for (name, total, active) in
        [("mixtral-8x7b", 46.7e9, 12.9e9), ("qwen3-30b-a3b", 30.5e9, 3.3e9), ("olmoe-1b-7b", 6.9e9, 1.3e9)]
    {
        let m = model(name).unwrap();
        let (per_layer, embed) = brigade::plan::cost::params(&m);
        let tables = embed + brigade::plan::cost::head_params(&m);
        let all = m.layers as f64 * per_layer + tables;
        let used = m.layers as f64 * brigade::plan::cost::layer_flops_per_token(&m).0 / 2.0 + tables;
        assert!((all / total - 1.0).abs() < 0.005, "{name}: {all:.4e} parameters, published {total:.3e}");
        assert!((used / active - 1.0).abs() < 0.02, "{name}: {used:.4e} active, published {active:.3e}");
        // and the model FLOPs of a step are 6 per active matrix parameter (head included) plus
        // the attention core, as training counts them
        let cfg = brigade::models::GptConfig::preset(name).unwrap();
        let (flops, _) = step_flops(&m, 1, Recompute::None);
        let attention = 3.0 * m.layers as f64 * 4.0 * (m.seq * m.seq * m.heads * m.head_dim) as f64;
        let want = 6.0 * (m.seq * cfg.matmul_params()) as f64;
        assert!(((flops - attention) / want - 1.0).abs() < 1e-6, "{name}: {flops:.4e} − attention vs {want:.4e}");
    }
}

/// Expert parallelism divides the routed experts' 16 bytes a parameter (weights, gradients,
/// AdamW) over the expert group, and its all-to-alls cross the network once the group leaves a
/// node.
#[test]
fn experts_divide_their_memory_over_ep_and_the_all_to_all_pays_for_leaving_a_node() {
    let m = model("mixtral-8x7b").unwrap();
    let a = accelerator("h100-sxm").unwrap();
    let t = Training { global_batch: 64, ..Training::default() };
    let base = Layout { dp: 16, mb: Some(1), recompute: Recompute::Full, ..Layout::default() };
    let e = m.moe.expect("a mixture");
    // every expert of every layer, counted from the shape
    let experts = (e.layers * e.experts * 3 * m.hidden * e.width) as f64;
    let gib = (1u64 << 30) as f64;
    let one = memory_gib(&m, &t, &base);
    for ep in [2, 4, 8] {
        let l = Layout { ep, ..base };
        let saved = one - memory_gib(&m, &t, &l);
        let want = 16.0 * experts * (1.0 - 1.0 / ep as f64) / gib;
        assert!((saved / want - 1.0).abs() < 1e-9, "ep={ep}: saves {saved:.3} GiB, want {want:.3}");
        // ZeRO-3 then cuts the experts over the dp / ep ranks holding the same ones
        let z = Layout { zero: 3, ..l };
        let z1 = Layout { zero: 3, ..base };
        assert!((memory_gib(&m, &t, &z) - memory_gib(&m, &t, &z1)).abs() < 1e-9, "ep={ep}: ZeRO-3 divides the same");
    }
    assert_eq!(estimate(&m, &a, &t, &base).breakdown.ep_comm_s, 0.0);
    let inside = estimate(&m, &a, &t, &Layout { ep: 8, ..base }).breakdown.ep_comm_s;
    let across = estimate(&m, &a, &t, &Layout { ep: 16, ..base }).breakdown.ep_comm_s;
    // 15/16 of the bytes over the 50 GB/s network against 7/8 over 450 GB/s NVLink
    let ratio = across / inside;
    let want = (15.0 / 16.0 / 50.0) / (7.0 / 8.0 / 450.0);
    assert!(
        ratio > 0.9 * want && ratio < 1.1 * want,
        "across / inside a node {ratio:.2}, bytes over bandwidth {want:.2}"
    );
    // a busier expert rank exchanges (and computes) more
    let busy = Training { expert_imbalance: 1.5, ..t };
    let b = estimate(&m, &a, &busy, &Layout { ep: 8, ..base });
    assert!(
        b.breakdown.ep_comm_s > 1.4 * inside
            && b.breakdown.compute_s > estimate(&m, &a, &t, &Layout { ep: 8, ..base }).breakdown.compute_s
    );
    // the search tries ep, and a dense model never
    let fixed = Fixed::default();
    assert!(search(&m, &a, 64, &Training { global_batch: 512, ..t }, &fixed).unwrap().iter().any(|e| e.layout.ep > 1));
    let dense = model("llama3-8b").unwrap();
    assert!(search(&dense, &a, 16, &Training { global_batch: 64, ..t }, &fixed)
        .unwrap()
        .iter()
        .all(|e| e.layout.ep == 1));
}

/// ZeRO's model states per device (Rajbhandari et al. 2020, §3 and Figure 1; mixed-precision
/// Adam, K = 12): baseline (2 + 2 + K)Ψ, P_os (2 + 2)Ψ + KΨ/N_d, P_os+g 2Ψ + (2 + K)Ψ/N_d,
/// P_os+g+p (2 + 2 + K)Ψ/N_d — first the paper's own figures for Ψ = 7.5B on 64 devices (120,
/// 31.4, 16.6, 1.9 GB), then the planner's memory: what each stage saves over no ZeRO is what
/// the formula saves for the model's Ψ, with N_d the data ranks, or data × context ranks (ZeRO
/// cuts over both).
#[test]
fn zero_stages_divide_model_states_as_the_zero_paper_says() {
    let states = |psi: f64, n: f64, stage: usize| {
        let k = 12.0;
        match stage {
            0 => (2.0 + 2.0 + k) * psi,
            1 => (2.0 + 2.0) * psi + k * psi / n,
            2 => 2.0 * psi + (2.0 + k) * psi / n,
            _ => (2.0 + 2.0 + k) * psi / n,
        }
    };
    for (stage, gb) in [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)] {
        let got = states(7.5e9, 64.0, stage) / 1e9;
        assert!((got - gb).abs() < 0.05, "stage {stage}: {got:.2} GB, the paper's figure {gb}");
    }
    let m = model("gpt3-13b").unwrap();
    let (per_layer, embed) = brigade::plan::cost::params(&m);
    let psi = m.layers as f64 * per_layer + embed + brigade::plan::cost::head_params(&m);
    let t = Training { global_batch: 64, ..Training::default() };
    for (dp, cp) in [(64, 1), (32, 2), (8, 1)] {
        let lay =
            |zero| Layout { tp: 1, pp: 1, dp, cp, mb: Some(1), zero, recompute: Recompute::Full, ..Layout::default() };
        let base = memory_gib(&m, &t, &lay(0));
        for stage in 1..=3 {
            let saved = base - memory_gib(&m, &t, &lay(stage));
            let n = (dp * cp) as f64;
            let want = (states(psi, n, 0) - states(psi, n, stage as usize)) / (1u64 << 30) as f64;
            assert!(
                (saved / want - 1.0).abs() < 1e-9,
                "dp {dp} cp {cp} ZeRO-{stage}: saves {saved:.3} GiB, the paper {want:.3}"
            );
        }
    }
}
