//! The embedding model's thread: it owns the sentence-transformers encoder, takes every
//! request waiting, and packs their token sequences shortest first into forward passes of at
//! most `brigade embed`'s default `--max-batch-tokens`, through the function that packs
//! `brigade embed`'s shards; each request gets its vectors in order.

use crate::error::{Result, ServeError};
use brigade::embed::job::{embed_packed, DEFAULT_MAX_BATCH_TOKENS};
use brigade::embed::Encoder;
use std::sync::{mpsc, Arc};

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
    pub(crate) fn start(dir: &std::path::Path, threads: usize) -> Result<Embedder> {
        let encoder = Arc::new(Encoder::load(dir)?);
        let (tx, rx) = mpsc::channel::<Job>();
        let enc = encoder.clone();
        std::thread::Builder::new()
            .name("brigade-embed".into())
            .spawn(move || {
                let ran = brigade::with_threads(threads, || serve_jobs(&enc, rx));
                if ran.is_err() {
                    eprintln!("error: the embedding thread failed; stopping the server");
                    std::process::exit(1);
                }
            })
            .map_err(|e| ServeError::io("starting the embedding thread", e))?;
        Ok(Embedder {
            name: encoder.name.clone(),
            dim: encoder.dim(),
            max_len: encoder.max_len,
            vocab: encoder.bert.cfg.vocab,
            encoder,
            tx,
        })
    }
}

/// Takes every job waiting, embeds all their sequences together, and answers each job with
/// its vectors in order.
fn serve_jobs(enc: &Encoder, rx: mpsc::Receiver<Job>) {
    let dim = enc.dim();
    while let Ok(first) = rx.recv() {
        let jobs: Vec<Job> = std::iter::once(first).chain(rx.try_iter()).collect();
        let seqs: Vec<&[u32]> = jobs.iter().flat_map(|j| j.seqs.iter().map(Vec::as_slice)).collect();
        let vectors = embed_packed(enc, &seqs, DEFAULT_MAX_BATCH_TOKENS, &|_| {});
        let mut at = 0;
        for job in jobs {
            let n = job.seqs.len() * dim;
            let _ = job.reply.send(vectors[at..at + n].to_vec());
            at += n;
        }
    }
}
