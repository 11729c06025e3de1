//! `brigade plan`: predicts the cost of 3D layouts of a model on a cluster and picks the best.

use anyhow::{bail, Result};
use brigade::layout::{Layout, Recompute, Spec};
use brigade::models::gpt::MAX_DIM;
use brigade::plan::catalog::{accelerator, model, ModelShape};
use brigade::plan::{estimate, search, Estimate, Training};
use clap::Args;

#[derive(Args, Debug)]
pub struct PlanArgs {
    /// Model preset (gpt2-*, gpt3-125m … gpt3-175b, megatron-1.7b … megatron-1t, llama2-*, llama3-*).
    #[arg(long)]
    model: Option<String>,
    #[arg(long)]
    layers: Option<usize>,
    #[arg(long)]
    hidden: Option<usize>,
    #[arg(long)]
    heads: Option<usize>,
    /// Key/value heads (grouped-query attention); default: --heads.
    #[arg(long)]
    kv_heads: Option<usize>,
    /// MLP width; default 4·hidden.
    #[arg(long)]
    ffn: Option<usize>,
    /// Gated (SwiGLU) MLP.
    #[arg(long)]
    swiglu: bool,
    /// Sequence length (with --model: overrides the preset's).
    #[arg(long)]
    seq: Option<usize>,
    #[arg(long)]
    vocab: Option<usize>,
    /// Accelerator: a100-40gb, a100-80gb, h100-sxm, h200, b200.
    #[arg(long, default_value = "h100-sxm")]
    gpu: String,
    /// Override the accelerator's dense 16-bit peak (TFLOP/s).
    #[arg(long)]
    peak_tflops: Option<f64>,
    #[arg(long)]
    hbm_gib: Option<f64>,
    /// HBM bandwidth (TB/s).
    #[arg(long)]
    hbm_tbps: Option<f64>,
    /// NVLink bandwidth per GPU per direction (GB/s).
    #[arg(long)]
    nvlink_gbps: Option<f64>,
    /// Network bandwidth per GPU per direction (GB/s).
    #[arg(long)]
    net_gbps: Option<f64>,
    #[arg(long)]
    gpus_per_node: Option<usize>,
    /// A mixture of experts' busiest expert's tokens over the mean (1: balanced; `brigade
    /// train` reports it as moe_load_max_over_mean).
    #[arg(long, default_value_t = 1.0)]
    expert_imbalance: f64,
    /// Total GPUs.
    #[arg(long, required_unless_present = "local")]
    gpus: Option<usize>,
    /// Global batch in sequences.
    #[arg(long, required_unless_present = "local")]
    global_batch: Option<usize>,
    /// Measure this machine and predict a single-worker `brigade train` step of --model
    /// (a brigade preset: tiny, gpt2-small, …) at --batch × --seq with --threads.
    #[arg(long, conflicts_with_all = [
        "gpus", "global_batch", "gpu", "precision", "layers", "hidden", "heads", "kv_heads", "ffn",
        "swiglu", "vocab", "peak_tflops", "hbm_gib", "hbm_tbps", "nvlink_gbps", "net_gbps", "gpus_per_node",
        "tokens", "no_flash_attention", "top",
    ])]
    local: bool,
    /// Sequences per step (with --local).
    #[arg(long, default_value_t = 4, requires = "local")]
    batch: usize,
    /// Threads (with --local).
    #[arg(long, default_value_t = crate::threads::default_threads(), requires = "local")]
    threads: usize,
    /// Fix some layout fields, e.g. tp=8,pp=4,cp=2,dp=32,mb=2,v=3,recompute=full,zero=1; the rest are
    /// searched. With --local, its cp fields (cp, cp_comm, cp_order) pick the context split whose
    /// longest trainable sequence is printed.
    #[arg(long)]
    layout: Option<String>,
    /// Tokens to train on (e.g. 300e9): prints the time to train.
    #[arg(long)]
    tokens: Option<f64>,
    /// Number format: bf16 (mixed precision, the default; fp16 is costed the same) or fp32 (TF32 tensor cores).
    #[arg(long, default_value = "bf16")]
    precision: String,
    /// Attention without a fused (flash) kernel: s×s scores are stored.
    #[arg(long)]
    no_flash_attention: bool,
    /// Layouts shown in the table.
    #[arg(long, default_value_t = 10)]
    top: usize,
    #[arg(long)]
    json: bool,
}

/// Far beyond any cluster or batch ever run; keeps the search and its arithmetic bounded.
const MAX_GPUS: usize = 1 << 20;
const MAX_GLOBAL_BATCH: usize = 1 << 30;

fn shape(a: &PlanArgs) -> Result<ModelShape> {
    let m = shape_unchecked(a)?;
    if [m.layers, m.hidden, m.heads, m.kv_heads, m.ffn, m.seq, m.vocab].contains(&0) {
        bail!("model dimensions (--layers, --hidden, --heads, --kv-heads, --ffn, --seq, --vocab) must be at least 1");
    }
    if let Some(big) = [m.layers, m.hidden, m.heads, m.kv_heads, m.ffn, m.seq, m.vocab].iter().find(|&&d| d > MAX_DIM) {
        bail!("model dimension {big} is beyond any model; each must be at most {MAX_DIM}");
    }
    Ok(m)
}

fn shape_unchecked(a: &PlanArgs) -> Result<ModelShape> {
    let explicit = [
        ("--layers", a.layers.is_some()),
        ("--hidden", a.hidden.is_some()),
        ("--heads", a.heads.is_some()),
        ("--kv-heads", a.kv_heads.is_some()),
        ("--ffn", a.ffn.is_some()),
        ("--swiglu", a.swiglu),
        ("--vocab", a.vocab.is_some()),
    ];
    if let Some(name) = &a.model {
        if let Some((flag, _)) = explicit.iter().find(|(_, set)| *set) {
            bail!(
                "{flag} contradicts --model {name}; give either a preset (optionally with --seq) or an explicit shape"
            );
        }
        let mut m = model(name)?;
        if let Some(s) = a.seq {
            m.seq = s;
        }
        return Ok(m);
    }
    let need = |v: Option<usize>, flag: &str| v.ok_or_else(|| anyhow::anyhow!("{flag} is required without --model"));
    let (layers, hidden, heads) = (need(a.layers, "--layers")?, need(a.hidden, "--hidden")?, need(a.heads, "--heads")?);
    let m = ModelShape {
        layers,
        hidden,
        heads,
        kv_heads: a.kv_heads.unwrap_or(heads),
        head_dim: hidden / heads.max(1),
        moe: None,
        ffn: a.ffn.unwrap_or(4 * hidden),
        swiglu: a.swiglu,
        seq: need(a.seq, "--seq")?,
        vocab: need(a.vocab, "--vocab")?,
        // a gated MLP is the Llama family's, which unties its head
        tied: !a.swiglu,
    };
    if [m.hidden, m.heads, m.kv_heads].contains(&0) {
        bail!("model dimensions must be at least 1");
    }
    if !m.hidden.is_multiple_of(m.heads) || !m.heads.is_multiple_of(m.kv_heads) {
        bail!(
            "--hidden ({}) must be divisible by --heads ({}), and --heads by --kv-heads ({})",
            m.hidden,
            m.heads,
            m.kv_heads
        );
    }
    Ok(m)
}

fn layout_json(e: &Estimate) -> serde_json::Value {
    let l = e.layout;
    serde_json::json!({
        "tp": l.tp, "pp": l.pp, "cp": l.cp, "cp_comm": l.cp_comm, "dp": l.dp, "mb": l.mb, "v": l.v, "recompute": l.recompute, "zero": l.zero,
        "schedule": l.schedule_name(),
        "step_time_s": e.step_time_s, "model_tflops_per_gpu": e.model_tflops_per_gpu,
        "hw_tflops_per_gpu": e.hw_tflops_per_gpu, "mfu": e.mfu, "memory_gib_per_gpu": e.memory_gib_per_gpu,
        "fits": e.fits, "breakdown": e.breakdown,
    })
}

fn human_time(s: f64) -> String {
    match s {
        s if s < 3600.0 => format!("{:.1} minutes", s / 60.0),
        s if s < 2.0 * 86400.0 => format!("{:.1} hours", s / 3600.0),
        s if s < 730.0 * 86400.0 => format!("{:.1} days", s / 86400.0),
        s => format!("{:.1} years", s / (365.25 * 86400.0)),
    }
}

/// The model of a measured single-worker step (`plan --local`, `bench plan`, `bench train`),
/// its position table sized to `seq` as the PyTorch peer does, after checking the sizes, the
/// thread count and that the step fits in this machine's memory.
pub fn step_shape(model: &str, batch: usize, seq: usize, threads: usize) -> Result<brigade::models::GptConfig> {
    let dir = std::path::Path::new(model);
    let mut cfg = match dir.join("config.json").is_file() {
        true => brigade::models::checkpoint::read_model_config(dir)?,
        false => brigade::models::GptConfig::preset(model)?,
    };
    crate::threads::check_threads(threads, "--threads")?;
    if seq == 0 || batch == 0 {
        bail!("--seq and --batch must be at least 1");
    }
    if seq > cfg.block_size {
        bail!("--seq {seq} exceeds {model}'s block_size {}", cfg.block_size);
    }
    cfg.block_size = seq;
    let need = brigade::train::memory::training_memory(&cfg, batch, seq);
    brigade::train::memory::check_fits(&need, &format!("a {model} step at batch {batch} × seq {seq}"))?;
    Ok(cfg)
}

/// The longest sequence `model` trains at micro-batch `batch` in the memory this machine has
/// available, on one worker and on one rank of context groups (the layout's `cp`, else 2 and 4),
/// as the trainer's own memory accounting counts it.
fn longest_sequences(model: &str, batch: usize, layout: Option<&str>) -> Result<()> {
    use brigade::train::memory::{available_bytes, gib, longest_seq};
    let Some(avail) = available_bytes() else { return Ok(()) };
    let cfg = brigade::models::GptConfig::preset(model)?;
    const CAP: usize = 1 << 24;
    let layout = brigade::layout::Layout::parse(layout.unwrap_or(""))?;
    let cps: Vec<usize> = if layout.cp > 1 { vec![layout.cp] } else { vec![2, 4] };
    let mut parts = Vec::new();
    let one = longest_seq(&cfg, batch, (1, layout.cp_comm, 1), avail, CAP);
    parts.push(format!("one worker {}", one.map_or("none".into(), |n| n.to_string())));
    for cp in cps {
        let chunks = layout.cp_order.chunks(cp);
        let n = longest_seq(&cfg, batch, (cp, layout.cp_comm, chunks), avail, CAP);
        parts.push(format!("a rank of cp={cp} {}", n.map_or("none".into(), |n| n.to_string())));
    }
    outln!(
        "longest sequence at batch {batch} in the {:.1} GiB available (per rank, as the trainer counts it): {}",
        gib(avail),
        parts.join(", ")
    );
    Ok(())
}

/// The `--local` figures: measured machine and predicted step, for `plan --local` and `bench plan`.
pub fn local_prediction(
    model: &str,
    batch: usize,
    seq: usize,
    threads: usize,
) -> Result<(brigade::models::GptConfig, brigade::plan::local::Machine, brigade::plan::local::LocalPrediction)> {
    let cfg = step_shape(model, batch, seq, threads)?;
    let machine = brigade::with_threads(threads, || brigade::bench::machine::measure(&cfg, batch, seq, 1))?;
    let p = brigade::plan::local::predict(&cfg, batch, seq, &machine);
    Ok((cfg, machine, p))
}

pub fn run(a: PlanArgs) -> Result<()> {
    if a.local {
        let model = a.model.clone().unwrap_or_else(|| "gpt2-small".into());
        let seq = a.seq.unwrap_or(256);
        // Collectives first: rayon's workers spin for a while after the compute measurements
        // and would steal the cores the rank threads' barriers spin on.
        let coll = brigade::bench::machine::measure_collectives(2)?;
        let (_, machine, p) = local_prediction(&model, a.batch, seq, a.threads)?;
        if a.json {
            outln!(
                "{}",
                serde_json::json!({"machine": machine, "collectives": coll, "prediction": p, "model": model, "batch": a.batch, "seq": seq})
            );
        } else {
            outln!(
                "all-reduce between 2 rank threads (brigade-comm): {:.2} µs at 8 B, {:.1} GB/s bus bandwidth at 64 MiB",
                coll.latency_us,
                coll.busbw_gbps
            );
            outln!(
                "this machine, {} threads: matmul {:.1} GFLOP/s (2048³), memory {:.1} GB/s",
                machine.threads,
                machine.matmul_gflops,
                machine.mem_gbps
            );
            outln!(
                "{model} step, batch {} × seq {seq}: predicted {:.4} s = matmul {:.4} + attention {:.4} + memory-bound kernels {:.4} + optimizer {:.4}",
                a.batch, p.step_s, p.matmul_s, p.attention_s, p.elementwise_s, p.optimizer_s
            );
            longest_sequences(&model, a.batch, a.layout.as_deref())?;
        }
        return Ok(());
    }
    let (gpus, global_batch) = (a.gpus.unwrap_or(0), a.global_batch.unwrap_or(0));
    let m = shape(&a)?;
    let mut acc = accelerator(&a.gpu)?;
    for (v, slot) in [
        (a.peak_tflops, &mut acc.peak_tflops),
        (a.hbm_gib, &mut acc.hbm_gib),
        (a.hbm_tbps, &mut acc.hbm_tbps),
        (a.nvlink_gbps, &mut acc.nvlink_gbps),
        (a.net_gbps, &mut acc.net_gbps),
    ] {
        if let Some(x) = v {
            if !(1e-3..=1e6).contains(&x) {
                bail!("accelerator figures (--peak-tflops, --hbm-gib, --hbm-tbps, --nvlink-gbps, --net-gbps) must be between 0.001 and 1e6, got {x}");
            }
            *slot = x;
        }
    }
    if let Some(g) = a.gpus_per_node {
        if g == 0 || g > MAX_GPUS {
            bail!("--gpus-per-node must be between 1 and {MAX_GPUS}, got {g}");
        }
        acc.gpus_per_node = g;
    }
    if gpus == 0 || global_batch == 0 {
        bail!("--gpus and --global-batch must be at least 1");
    }
    if gpus > MAX_GPUS || global_batch > MAX_GLOBAL_BATCH {
        bail!("--gpus ({gpus}) must be at most {MAX_GPUS} and --global-batch ({global_batch}) at most {MAX_GLOBAL_BATCH} sequences");
    }
    if let Some(n) = a.tokens {
        if !(1.0..=1e18).contains(&n) {
            bail!("--tokens must be a number of tokens between 1 and 1e18 (e.g. 300e9), got {n}");
        }
    }
    let fixed = match &a.layout {
        Some(s) => Spec::parse(s)?,
        None => Spec::default(),
    };
    let product = fixed.tp.unwrap_or(1) * fixed.pp.unwrap_or(1) * fixed.cp.unwrap_or(1) * fixed.dp.unwrap_or(1);
    // (cp, new beside them, counts as 1 when tp, pp and dp are given without it)
    let all_fixed = fixed.tp.is_some() && fixed.pp.is_some() && fixed.dp.is_some();
    if all_fixed && product != gpus {
        bail!("--layout tp·pp·cp·dp = {product} does not match --gpus {gpus}");
    }
    if !gpus.is_multiple_of(product) {
        let axes = [("tp", fixed.tp), ("pp", fixed.pp), ("cp", fixed.cp), ("dp", fixed.dp)];
        let (given, free): (Vec<_>, Vec<_>) = axes.iter().partition(|(_, v)| v.is_some());
        let names = |a: &[&(&str, Option<usize>)], sep: &str| a.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(sep);
        bail!(
            "--layout fixes {} = {product}, which does not divide --gpus {gpus}; the axes not given ({}) take the rest of the GPUs, so the given ones must divide it",
            names(&given, "·"),
            names(&free, ", ")
        );
    }
    let precision = brigade::plan::cost::Precision::parse(&a.precision)
        .ok_or_else(|| anyhow::anyhow!("unknown --precision '{}'; use bf16, fp16 or fp32", a.precision))?;
    if !(a.expert_imbalance >= 1.0 && a.expert_imbalance.is_finite()) {
        bail!("--expert-imbalance {} must be at least 1 (the busiest expert over the mean)", a.expert_imbalance);
    }
    let t = Training {
        global_batch,
        flash_attention: !a.no_flash_attention,
        precision,
        expert_imbalance: a.expert_imbalance,
    };
    let ranked = search(&m, &acc, gpus, &t, &fixed)?;
    let best = ranked[0];
    let tokens_per_step = (global_batch * m.seq) as f64;
    let train_s = a.tokens.map(|n| best.step_time_s * n / tokens_per_step);
    // The same job on one GPU: gradient accumulation of micro-batches of 1, full recompute.
    let one = estimate(&m, &acc, &t, &Layout { mb: Some(1), recompute: Recompute::Full, ..Layout::default() });
    let one_train_s = a.tokens.map(|n| one.step_time_s * n / tokens_per_step);
    if a.json {
        let v = serde_json::json!({
            "model": m, "accelerator": acc, "gpus": gpus, "global_batch": global_batch,
            "best": layout_json(&best),
            "tokens_per_s": tokens_per_step / best.step_time_s,
            "train_days": train_s.map(|s| s / 86400.0),
            "top": ranked.iter().take(a.top).map(layout_json).collect::<Vec<_>>(),
            "single_gpu": {"memory_gib": one.memory_gib_per_gpu, "fits": one.fits, "step_time_s": one.step_time_s,
                           "train_years": one_train_s.map(|s| s / (365.25 * 86400.0))},
        });
        outln!("{v}");
        return Ok(());
    }
    let (p_layer, p_embed) = brigade::plan::cost::params(&m);
    let p_embed = p_embed + brigade::plan::cost::head_params(&m);
    outln!(
        "model: {} layers, hidden {}, {} heads ({} kv), ffn {}{}, seq {}, vocab {} — {:.2}B parameters",
        m.layers,
        m.hidden,
        m.heads,
        m.kv_heads,
        m.ffn,
        if m.swiglu { " (SwiGLU)" } else { "" },
        m.seq,
        m.vocab,
        (m.layers as f64 * p_layer + p_embed) / 1e9
    );
    if let Some(e) = m.moe {
        // what a token passes through: its k experts (and a shared one), the attention, the tables
        let active = m.layers as f64 * brigade::plan::cost::layer_flops_per_token(&m).0 / 2.0 + p_embed;
        outln!(
            "       {} of {} layers mixtures of {} experts of {} ({} a token{}) — {:.2}B active parameters",
            e.layers,
            m.layers,
            e.experts,
            e.width,
            e.top_k,
            if e.shared > 0 { format!(", a shared expert of {}", e.shared) } else { String::new() },
            active / 1e9
        );
    }
    outln!(
        "cluster: {} × {} ({:.0} TFLOP/s, {:.0} GiB, {:.2} TB/s; NVLink {:.0} GB/s, network {:.0} GB/s per GPU, {} per node); global batch {}",
        gpus, a.gpu, acc.peak_tflops, acc.hbm_gib, acc.hbm_tbps, acc.nvlink_gbps, acc.net_gbps, acc.gpus_per_node, global_batch
    );
    outln!("{} layouts fit; fastest first:", ranked.len());
    outln!(
        "{:>4} {:>4} {:>4} {:>5} {:>4} {:>3} {:>2} {:>11} {:>10} {:>4} {:>9} {:>9} {:>6} {:>8}",
        "tp",
        "pp",
        "cp",
        "dp",
        "ep",
        "mb",
        "v",
        "schedule",
        "recompute",
        "zero",
        "step (s)",
        "TFLOP/s",
        "MFU",
        "mem GiB"
    );
    for e in ranked.iter().take(a.top) {
        let l = e.layout;
        outln!(
            "{:>4} {:>4} {:>4} {:>5} {:>4} {:>3} {:>2} {:>11} {:>10} {:>4} {:>9.3} {:>9.1} {:>5.1}% {:>8.1}",
            l.tp,
            l.pp,
            l.cp,
            l.dp,
            l.ep,
            l.mb.map_or("-".to_string(), |m| m.to_string()),
            l.v,
            l.schedule_name(),
            format!("{:?}", l.recompute).to_lowercase(),
            l.zero,
            e.step_time_s,
            e.model_tflops_per_gpu,
            100.0 * e.mfu,
            e.memory_gib_per_gpu
        );
    }
    let b = best.breakdown;
    outln!(
        "best: step {:.3} s = compute {:.3} + tp comm {:.3} + cp comm {:.3} + ep all-to-all {:.3} + pp bubble {:.3} + p2p {:.3} + exposed dp comm {:.3} + optimizer {:.3}",
        best.step_time_s, b.compute_s, b.tp_comm_s, b.cp_comm_s, b.ep_comm_s, b.pp_bubble_s, b.p2p_s, b.dp_exposed_s, b.optimizer_s
    );
    outln!(
        "      {:.1} model TFLOP/s per GPU ({:.1} with recomputation), MFU {:.1}%, {:.1} GiB per GPU, {:.0} tokens/s",
        best.model_tflops_per_gpu,
        best.hw_tflops_per_gpu,
        100.0 * best.mfu,
        best.memory_gib_per_gpu,
        tokens_per_step / best.step_time_s
    );
    if let (Some(n), Some(s), Some(s1)) = (a.tokens, train_s, one_train_s) {
        outln!("training on {n:.3e} tokens: {} on {gpus} GPUs", human_time(s));
        outln!(
            "  on one {}: {} — and it {} ({:.0} GiB needed, {:.0} GiB there)",
            a.gpu,
            human_time(s1),
            if one.fits { "fits" } else { "does not fit" },
            one.memory_gib_per_gpu,
            acc.hbm_gib
        );
    }
    Ok(())
}
