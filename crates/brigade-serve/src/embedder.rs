//! The embedding model's thread: it owns the sentence-transformers encoder, takes every
//! request waiting, and packs their token sequences shortest first into forward passes of at
//! most `MAX_BATCH_TOKENS` tokens, as `brigade embed` packs a shard; each request gets its
//! vectors in order.

use brigade::embed::Encoder;
use std::sync::{mpsc, Arc};

/// Tokens in one forward pass at most (`brigade embed`'s default `--max-batch-tokens`).
pub const MAX_BATCH_TOKENS: usize = 2048;

/// A request's token sequences and where its vectors go.
pub(crate) struct Job {
    pub(crate) seqs: Vec<Vec<u32>>,
    pub(crate) reply: tokio::sync::oneshot::Sender<Vec<f32>>,
}

/// The embedding model as the handlers see it.
pub(crate) struct Embedder {
    pub(crate) name: String,
    pub(crate) dim: usize,
    pub(crate) max_len: usize,
    pub(crate) vocab: usize,
    pub(crate) encoder: Arc<Encoder>,
    pub(crate) tx: mpsc::Sender<Job>,
}

impl Embedder {
    /// Loads the folder and starts its thread (its products on a pool of `threads`).
    pub(crate) fn start(dir: &std::path::Path, name: Option<String>, threads: usize) -> anyhow::Result<Embedder> {
        let encoder = Arc::new(Encoder::load(dir)?);
        let (tx, rx) = mpsc::channel::<Job>();
        let enc = encoder.clone();
        std::thread::Builder::new().name("brigade-embed".into()).spawn(move || {
            let ran = brigade::with_threads(threads, || serve_jobs(&enc, rx));
            if ran.is_err() {
                eprintln!("error: the embedding thread failed; stopping the server");
                std::process::exit(1);
            }
        })?;
        Ok(Embedder {
            name: name.unwrap_or_else(|| encoder.name.clone()),
            dim: encoder.dim(),
            max_len: encoder.max_len,
            vocab: encoder.bert.cfg.vocab,
            encoder,
            tx,
        })
    }
}

/// Takes every job waiting, packs their sequences shortest first into passes of at most
/// `MAX_BATCH_TOKENS`, and answers each job with its vectors in order.
fn serve_jobs(enc: &Encoder, rx: mpsc::Receiver<Job>) {
    let dim = enc.dim();
    while let Ok(first) = rx.recv() {
        let jobs: Vec<Job> = std::iter::once(first).chain(rx.try_iter()).collect();
        // (job, index in job) of every sequence, by length
        let mut order: Vec<(usize, usize)> =
            jobs.iter().enumerate().flat_map(|(j, job)| (0..job.seqs.len()).map(move |i| (j, i))).collect();
        order.sort_by_key(|&(j, i)| jobs[j].seqs[i].len());
        let mut out: Vec<Vec<f32>> = jobs.iter().map(|j| vec![0f32; j.seqs.len() * dim]).collect();
        let mut start = 0;
        while start < order.len() {
            let (mut end, mut tokens) = (start, 0);
            while end < order.len() {
                let (j, i) = order[end];
                let l = jobs[j].seqs[i].len();
                if end > start && tokens + l > MAX_BATCH_TOKENS {
                    break;
                }
                tokens += l;
                end += 1;
            }
            let seqs: Vec<&[u32]> = order[start..end].iter().map(|&(j, i)| jobs[j].seqs[i].as_slice()).collect();
            let v = enc.embed_tokens(&seqs);
            for (k, &(j, i)) in order[start..end].iter().enumerate() {
                out[j][i * dim..(i + 1) * dim].copy_from_slice(&v[k * dim..(k + 1) * dim]);
            }
            start = end;
        }
        for (job, vectors) in jobs.into_iter().zip(out) {
            let _ = job.reply.send(vectors);
        }
    }
}
