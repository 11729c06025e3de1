//! `brigade bench embed`: the real job (scan, shards, files) on a generated corpus with 1 and
//! 2 workers of 1 thread and 1 worker of 2 threads, in one run, against this machine's matrix
//! product rate at the encoder's shapes.

use anyhow::{bail, Result};
use brigade::embed::corpus::{Format, InputSpec, OnError};
use brigade::embed::job::{self, NoProgress, Settings};
use brigade::embed::Encoder;
use clap::Args;
use std::path::Path;

#[derive(Args, Debug)]
pub struct Flags {
    /// sentence-transformers model folder.
    #[arg(long)]
    pub(crate) model: std::path::PathBuf,
    #[arg(long, default_value_t = 10_000)]
    pub(crate) docs: usize,
    /// Documents per shard (default: a 100th of --docs, so two workers finish together).
    #[arg(long)]
    pub(crate) shard_size: Option<usize>,
    #[arg(long, default_value_t = 2048)]
    pub(crate) max_batch_tokens: usize,
    #[arg(long)]
    pub(crate) json: bool,
}

pub fn run(f: Flags) -> Result<()> {
    let Flags { model, docs, shard_size, max_batch_tokens, json } = f;
    measure(&model, docs, shard_size, max_batch_tokens, json)
}

fn measure(model: &Path, docs: usize, shard_size: Option<usize>, max_batch_tokens: usize, json: bool) -> Result<()> {
    if docs == 0 || docs > 10_000_000 {
        bail!("--docs {docs} is out of range: give 1 to 10000000");
    }
    let enc = Encoder::load(model)?;
    let vocab = model.join("vocab.txt");
    if !vocab.exists() {
        bail!(
            "{} not found: the benchmark builds its sentences from the model's WordPiece vocabulary",
            vocab.display()
        );
    }
    let texts = brigade::bench::embed::synthetic_corpus(&vocab, docs, 1234)?;
    let tmp = super::args::tempfile_dir()?;
    let input = tmp.join("corpus.txt");
    std::fs::write(&input, texts.join("\n") + "\n")?;
    // the work the corpus asks for
    let cfg = &enc.bert.cfg;
    let (mut tokens, mut flops) = (0u64, 0f64);
    for t in &texts {
        let n = enc.tokenize(t)?.ids.len();
        tokens += n as u64;
        flops += cfg.matmul_flops_per_token() * n as f64 + cfg.attention_flops(n);
    }
    let shard_size = shard_size.unwrap_or(docs.div_ceil(100).max(1));
    let rate =
        |threads: usize| brigade::with_threads(threads, || brigade::bench::embed::encoder_matmul_gflops(cfg, 2048));
    // two cores: one product on 2 threads, or two single-threaded products at once
    let (rate1, rate2_pool) = (rate(1)?, rate(2)?);
    let rate2_pair = brigade::bench::embed::encoder_matmul_gflops_concurrent(cfg, 2048, 2)?;
    let rate2 = rate2_pool.max(rate2_pair);
    // the embedding's own kernel at the same shapes (it must keep up with the general one)
    let rows_pair = brigade::bench::embed::encoder_rows_gflops_concurrent(cfg, 2048, 2)?;
    // the most arithmetic two cores do at once: the ceiling no kernel work can pass
    let (peak1, peak_pair) =
        (brigade::bench::machine::fma_peak_gflops(), brigade::bench::machine::fma_peak_gflops_concurrent(2));
    let per_doc = flops / docs as f64 / 1e9;
    if !json {
        outln!(
            "{} documents of 20–40 words ({:.1} tokens each on average, {:.1} MFLOP per token), shards of {shard_size}",
            docs,
            tokens as f64 / docs as f64,
            flops / tokens as f64 / 1e6
        );
        outln!(
            "matrix products at the encoder's shapes: {rate1:.1} GFLOP/s on 1 thread; on 2 cores {rate2_pool:.1} (one product, 2 threads), {rate2_pair:.1} (two 1-thread products at once); the embedding's row-invariant kernel {rows_pair:.1} (two 1-thread products at once)"
        );
        if let Some(p) = peak_pair {
            outln!(
                "the cores' peak (a loop of register-only fused multiply-adds, {}): {p:.1} GFLOP/s on two threads at once, {:.1} documents/s at it",
                brigade::tensor::simd_name(),
                p / per_doc
            );
        }
        outln!(
            "{:<22} {:>11} {:>10} {:>9} {:>9} {:>9} {:>9}",
            "workers × threads",
            "documents/s",
            "tokens/s",
            "GFLOP/s",
            "of matmul",
            "of peak",
            "speedup"
        );
    }
    let mut rows = Vec::new();
    let mut base = None;
    for (workers, threads) in [(1usize, 1usize), (2, 1), (1, 2)] {
        let out = tmp.join(format!("out-{workers}x{threads}"));
        let spec = InputSpec {
            files: vec![input.clone()],
            format: Some(Format::Text),
            id_field: Some("id".into()),
            text_field: "text".into(),
            on_error: OnError::Fail,
        };
        let s = Settings { shard_size, max_batch_tokens, threads, overwrite: true, stop: None };
        let mut res = brigade_comm::local::run(workers, |comm| job::run(&comm, &spec, &enc, &out, &s, &NoProgress))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let r = res.swap_remove(0).expect("rank 0 reports");
        std::fs::remove_dir_all(&out).ok();
        let dps = docs as f64 / r.wall_s;
        let gflops = flops / r.wall_s / 1e9;
        let of = gflops / if workers * threads == 1 { rate1 } else { rate2 };
        // of the peak the same cores give: one thread alone, or two at once
        let of_peak = if workers * threads == 1 { peak1 } else { peak_pair }.map(|p| gflops / p);
        let speedup = dps / *base.get_or_insert(dps);
        if !json {
            outln!(
                "{:<22} {:>11.1} {:>10.0} {:>9.1} {:>8.0}% {:>9} {:>8.2}x",
                format!("{workers} × {threads}"),
                dps,
                tokens as f64 / r.wall_s,
                gflops,
                100.0 * of,
                of_peak.map_or("—".to_string(), |f| format!("{:.0}%", 100.0 * f)),
                speedup
            );
        }
        rows.push(serde_json::json!({"workers": workers, "threads": threads, "documents_per_s": dps,
            "tokens_per_s": tokens as f64 / r.wall_s, "gflops": gflops, "matmul_fraction": of,
            "fma_peak_fraction": of_peak, "speedup": speedup, "wall_s": r.wall_s}));
    }
    std::fs::remove_dir_all(&tmp).ok();
    let best = rows.iter().map(|r| r["documents_per_s"].as_f64().unwrap()).fold(0.0, f64::max);
    let projection: Vec<serde_json::Value> = [1u64, 10, 100, 1000]
        .iter()
        .map(|&m| serde_json::json!({"machines": m, "hours": 1e8 / (best * m as f64) / 3600.0}))
        .collect();
    if json {
        outln!(
            "{}",
            serde_json::json!({"bench": "embed", "model": enc.name, "documents": docs, "tokens": tokens,
                "simd": brigade::tensor::simd_name(), "matmul_kernel": brigade::tensor::matmul::Backend::Auto.name(),
                "shard_size": shard_size, "max_batch_tokens": max_batch_tokens,
                "matmul_gflops_1_thread": rate1, "matmul_gflops_2_threads": rate2,
                "matmul_gflops_2_threads_one_product": rate2_pool, "matmul_gflops_two_1_thread_products": rate2_pair,
                "rows_gflops_two_1_thread_products": rows_pair, "fma_peak_gflops_1_thread": peak1,
                "fma_peak_gflops_two_1_thread": peak_pair, "gflop_per_document": per_doc, "rows": rows,
                "projection_100m_documents": projection})
        );
    } else {
        let p: Vec<String> = projection
            .iter()
            .map(|p| format!("{} machine(s): {:.1} h", p["machines"], p["hours"].as_f64().unwrap()))
            .collect();
        outln!("100 million such documents at {best:.1} documents/s per machine of this kind: {}", p.join(", "));
    }
    Ok(())
}
