//! `brigade eval kld`: how far a quantized model is from its reference, measured the way
//! llama.cpp's `llama-perplexity --kl-divergence` measures it — the text cut into chunks of
//! `--ctx` tokens, the second half of each chunk scored (every position sees at least half a
//! chunk of context) — as the mean KL divergence of the model's next-token distribution from
//! the reference's, the share of positions whose most likely token agrees, and each model's
//! perplexity of the text. Both run through the serving forward (`--weights` as `serve` takes
//! it), the chunks as one batch of sequences, a token a step after the first half.

use anyhow::{bail, Context, Result};
use brigade::models::open::{metadata_folder, open_model};
use brigade::models::tokenizer::Tokenizer;
use brigade_serve::model::{KvStore, Model, Work};
use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Subcommand, Debug)]
pub enum EvalCmd {
    /// KL divergence, top-1 agreement and perplexities of a model against a reference.
    Kld(KldArgs),
}

#[derive(Args, Debug)]
pub struct KldArgs {
    /// The reference: a checkpoint folder or a GGUF file, run in f32.
    #[arg(long)]
    reference: PathBuf,
    /// The model to measure (default: the reference, held as --weights says).
    #[arg(long)]
    model: Option<PathBuf>,
    /// How the measured model holds its matrices (as `brigade serve --weights`).
    #[arg(long, value_enum, default_value_t = crate::serve_cmd::Weights::Stored)]
    weights: crate::serve_cmd::Weights,
    /// Text files to score (their text joined), tokenized by the reference's tokenizer.
    #[arg(long, required = true, num_args = 1..)]
    text: Vec<PathBuf>,
    /// Tokens a chunk (llama.cpp's default: 512).
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Chunks to score (the first ones of the text).
    #[arg(long, default_value_t = 8)]
    chunks: usize,
    #[arg(long, default_value_t = crate::threads::default_threads())]
    threads: usize,
    /// One JSON line instead of the summary.
    #[arg(long)]
    json: bool,
}

pub fn run(c: EvalCmd) -> Result<()> {
    match c {
        EvalCmd::Kld(a) => kld(a),
    }
}

/// Log-softmax of `x` in f64.
fn log_softmax(x: &[f32]) -> Vec<f64> {
    let m = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let z = x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln() + m;
    x.iter().map(|&v| v as f64 - z).collect()
}

fn argmax(x: &[f32]) -> usize {
    (0..x.len()).fold(0, |b, i| if x[i] > x[b] { i } else { b })
}

/// What one scored position adds: KL(ref ‖ model), top-1 agreement, and both models' negative
/// log-likelihood of the token that follows.
fn score(r: &[f32], m: &[f32], next: u32) -> (f64, bool, f64, f64) {
    let (lr, lm) = (log_softmax(r), log_softmax(m));
    let kl: f64 = lr.iter().zip(&lm).map(|(a, b)| a.exp() * (a - b)).sum();
    (kl.max(0.0), argmax(r) == argmax(m), -lr[next as usize], -lm[next as usize])
}

fn kld(a: KldArgs) -> Result<()> {
    crate::threads::check_threads(a.threads, "--threads")?;
    if a.ctx < 8 || a.chunks == 0 {
        bail!("--ctx must be at least 8 tokens and --chunks at least 1");
    }
    let (gpt, params) = open_model(&a.reference)?;
    if a.ctx > gpt.cfg.block_size {
        bail!("--ctx {} is longer than the model's context of {} tokens", a.ctx, gpt.cfg.block_size);
    }
    let meta = metadata_folder(&a.reference)?;
    let tok = Tokenizer::from_file(&meta).with_context(|| format!("the reference's tokenizer ({})", meta.display()))?;
    let mut text = String::new();
    for f in &a.text {
        text.push_str(&std::fs::read_to_string(f).with_context(|| format!("reading --text {}", f.display()))?);
    }
    let ids = tok.encode(&text)?;
    let chunks: Vec<&[u32]> = ids.chunks_exact(a.ctx).take(a.chunks).collect();
    if chunks.len() < a.chunks {
        bail!(
            "the text is {} tokens: {} chunks of {} fit, {} were asked for; give more text or fewer --chunks",
            ids.len(),
            chunks.len(),
            a.ctx,
            a.chunks
        );
    }
    let (other_gpt, other_params);
    let (mgpt, mparams) = match &a.model {
        Some(p) => {
            (other_gpt, other_params) = open_model(p)?;
            if other_gpt.cfg.vocab_size != gpt.cfg.vocab_size {
                bail!(
                    "--model has {} tokens, the reference {}: not the same model",
                    other_gpt.cfg.vocab_size,
                    gpt.cfg.vocab_size
                );
            }
            (&other_gpt, &other_params[..])
        }
        None => (&gpt, &params[..]),
    };
    let source = brigade_serve::source::Source::Checkpoint(a.model.clone().unwrap_or_else(|| a.reference.clone()));
    let format = source.held(&a.weights.format(), mgpt)?;
    let t0 = std::time::Instant::now();
    let stats = brigade::with_threads(a.threads, || -> Result<_> {
        let reference = Model::shard_as(&gpt, &params, None, brigade_serve::model::weights::WeightFormat::F32)?;
        let model = Model::shard_as(mgpt, mparams, None, format.clone())?;
        let bs = 16;
        let per = a.ctx.div_ceil(bs);
        let tables: Vec<Vec<usize>> = (0..chunks.len()).map(|c| (c * per..(c + 1) * per).collect()).collect();
        let mut kv_r = KvStore::new(per * chunks.len(), bs, reference.layers_n, reference.kv_width());
        let mut kv_m = KvStore::new(per * chunks.len(), bs, model.layers_n, model.kv_width());
        let first = a.ctx / 2;
        let (mut kl, mut agree, mut nll_r, mut nll_m, mut n) = (0f64, 0usize, 0f64, 0f64, 0usize);
        let mut kls = Vec::new();
        // positions first..ctx-1 each predict the next token: the first half in one step, then a
        // token a step, every chunk at once
        let mut j = first;
        while j + 1 < a.ctx {
            let work: Vec<Work> = chunks
                .iter()
                .zip(&tables)
                .map(|(c, t)| {
                    let from = if j == first { 0 } else { j };
                    Work { tokens: &c[from..=j], start: from, blocks: t, logits: true }
                })
                .collect();
            let (lr, lm) = (reference.step(&mut kv_r, &work), model.step(&mut kv_m, &work));
            for ((r, m), c) in lr.iter().zip(&lm).zip(&chunks) {
                let (k, same, a_, b_) = score(r, m, c[j + 1]);
                kl += k;
                kls.push(k);
                agree += usize::from(same);
                nll_r += a_;
                nll_m += b_;
                n += 1;
            }
            j += 1;
        }
        kls.sort_by(f64::total_cmp);
        Ok((kl / n as f64, agree as f64 / n as f64, (nll_r / n as f64).exp(), (nll_m / n as f64).exp(), n, kls))
    })??;
    let (kl, top1, ppl_r, ppl_m, n, kls) = stats;
    let p99 = kls[((kls.len() as f64 * 0.99) as usize).min(kls.len() - 1)];
    let what = a.model.as_ref().unwrap_or(&a.reference).display().to_string();
    if a.json {
        outln!(
            "{}",
            serde_json::json!({"eval": "kld", "reference": a.reference, "model": what, "weights": format!("{format:?}"),
                "ctx": a.ctx, "chunks": a.chunks, "tokens_scored": n, "mean_kld": kl, "kld_p99": p99,
                "top1_agreement": top1, "ppl_reference": ppl_r, "ppl_model": ppl_m, "seconds": t0.elapsed().as_secs_f64()})
        );
    } else {
        outln!(
            "{what} ({format:?}) against {}: mean KL divergence {kl:.6} (99th percentile {p99:.6}), top-1 agreement {:.2}%, perplexity {ppl_m:.4} against {ppl_r:.4} ({:+.2}%) — {n} tokens, {} chunks of {}, the second half of each scored",
            a.reference.display(),
            100.0 * top1,
            100.0 * (ppl_m / ppl_r - 1.0),
            a.chunks,
            a.ctx
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// KL against its definition: zero for the same logits, ≥ 0, and the textbook value for
    /// two small distributions.
    #[test]
    fn kl_divergence_and_agreement_are_their_definitions() {
        let r = [1.0f32, 2.0, 3.0];
        assert_eq!(score(&r, &r, 0).0, 0.0);
        let m = [3.0f32, 2.0, 1.0];
        let p: Vec<f64> = log_softmax(&r).iter().map(|v| v.exp()).collect();
        let q: Vec<f64> = log_softmax(&m).iter().map(|v| v.exp()).collect();
        let want: f64 = (0..3).map(|i| p[i] * (p[i] / q[i]).ln()).sum();
        let (kl, same, nr, nm) = score(&r, &m, 2);
        assert!((kl - want).abs() < 1e-12 && kl > 0.0);
        assert!(!same);
        assert!((nr + p[2].ln()).abs() < 1e-12 && (nm + q[2].ln()).abs() < 1e-12);
    }
}
