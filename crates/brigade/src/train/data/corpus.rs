//! A corpus of documents: token sources cut into documents, a share of the documents held out
//! for validation (chosen by hash, so the choice depends on nothing but the corpus), and the
//! training sequences of each step drawn from the rest as a pure function of (seed, step) — so
//! every layout, and a resumed run, sees the single worker's batches.
//!
//! Pretraining text is read as random windows of the documents laid end to end (packed: a
//! window runs on from one document into the next). Conversations are packed whole: each
//! sequence is filled with randomly drawn conversations, the last one cut at the sequence's
//! end, and only the tokens the data marks as trained on (the assistant's) have targets.

use super::tokens::Source;
use super::Batch;
use crate::error::{Error, Result};
use crate::models::tokenizer::Fingerprint;
use crate::tensor::docs::positions_from_starts;
use crate::tensor::loss::IGNORE;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A piece of a document: `len` tokens of source `src` from `start` (16 bytes: a corpus of a
/// million documents keeps 16 MB of them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Doc {
    pub src: u32,
    pub len: u32,
    pub start: u64,
}

/// A corpus's documents as it is read: pieces in order, and where each document's begin.
#[derive(Default)]
pub struct Documents {
    pub pieces: Vec<Doc>,
    /// The index in `pieces` of each document's first piece.
    pub starts: Vec<usize>,
}

impl Documents {
    /// Adds a document of these pieces.
    pub fn push(&mut self, pieces: impl IntoIterator<Item = Doc>) {
        self.starts.push(self.pieces.len());
        self.pieces.extend(pieces);
    }

    pub fn len(&self) -> usize {
        self.starts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    /// The pieces of document `i`.
    pub fn doc(&self, i: usize) -> &[Doc] {
        let end = self.starts.get(i + 1).copied().unwrap_or(self.pieces.len());
        &self.pieces[self.starts[i]..end]
    }
}

/// Documents laid end to end, as their pieces.
#[derive(Default)]
pub struct Stream {
    pub docs: Vec<Doc>,
    /// Whether piece i is its document's first (a Megatron document of several sequences is
    /// several pieces, and a document begins only at the first).
    begins: Vec<bool>,
    /// `ends[i]`: the tokens of pieces 0..=i.
    ends: Vec<u64>,
}

impl Stream {
    /// The stream of these pieces, each with whether it begins its document.
    fn of(pieces: Vec<(Doc, bool)>) -> Stream {
        let mut total = 0;
        let ends = pieces
            .iter()
            .map(|(d, _)| {
                total += d.len as u64;
                total
            })
            .collect();
        let (docs, begins) = pieces.into_iter().unzip();
        Stream { docs, begins, ends }
    }

    /// The pieces back, each with whether it begins its document.
    fn into_pieces(self) -> impl Iterator<Item = (Doc, bool)> {
        self.docs.into_iter().zip(self.begins)
    }

    pub fn len(&self) -> u64 {
        self.ends.last().copied().unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends tokens `pos..pos + n` of the stream (across documents), and to `starts` where
    /// in `out` each document that begins in them does (at its first piece).
    fn read(
        &self,
        sources: &[Source],
        mut pos: u64,
        mut n: usize,
        out: &mut Vec<u32>,
        trained: &mut Vec<bool>,
        starts: &mut Vec<usize>,
    ) {
        let mut i = self.ends.partition_point(|&e| e <= pos);
        while n > 0 {
            let d = self.docs[i];
            let before = self.ends[i] - d.len as u64;
            let off = pos - before;
            if off == 0 && self.begins[i] {
                starts.push(out.len());
            }
            let take = ((d.len as u64 - off) as usize).min(n);
            sources[d.src as usize].extend(d.start + off, take, out, trained);
            n -= take;
            pos += take as u64;
            i += 1;
        }
    }
}

/// How a corpus's sequences are made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Packing {
    /// Random windows of the documents laid end to end.
    Windows,
    /// Whole documents (conversations) drawn at random, packed until the sequence is full.
    Whole,
}

/// One corpus: its sources, its documents split into training and held-out ones.
pub struct Corpus {
    /// What the corpus is (a path), for messages.
    pub name: String,
    pub sources: Vec<Source>,
    pub train: Stream,
    pub val: Stream,
    pub packing: Packing,
    pub fingerprint: Fingerprint,
}

/// The share of a corpus's documents held out for validation (chosen by hash: about this share).
pub const VAL_SHARE: f64 = 0.05;

/// splitmix64: a document's hash from its index.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Corpus {
    /// A corpus of `docs` whose held-out documents are those whose hash falls in the lowest
    /// `VAL_SHARE` of its range (at least one): a choice that depends on nothing but the
    /// document's index, made without holding anything per document beyond its pieces.
    pub fn new(
        name: String,
        sources: Vec<Source>,
        docs: Documents,
        packing: Packing,
        fingerprint: Fingerprint,
    ) -> Result<Corpus> {
        let n = docs.len();
        let nonempty = |i: &usize| docs.doc(*i).iter().any(|p| p.len > 0);
        let cut = (VAL_SHARE * u64::MAX as f64) as u64;
        let mut held: Vec<bool> = (0..n).map(|i| mix(i as u64) < cut && nonempty(&i)).collect();
        // one document alone is all training (validation must then come from --val-data)
        if !held.iter().any(|&h| h) && (0..n).filter(nonempty).count() >= 2 {
            // a small corpus: the document of the smallest hash
            let i = (0..n).filter(nonempty).min_by_key(|&i| mix(i as u64));
            held[i.expect("two documents at least")] = true;
        }
        let (mut train, mut val) = (Vec::new(), Vec::new());
        for (i, &h) in held.iter().enumerate() {
            let side = if h { &mut val } else { &mut train };
            side.extend(docs.doc(i).iter().filter(|p| p.len > 0).enumerate().map(|(k, p)| (*p, k == 0)));
        }
        drop(docs);
        Ok(Corpus { name, sources, train: Stream::of(train), val: Stream::of(val), packing, fingerprint })
    }

    /// Every document for training: validation comes from another corpus (`--val-data`).
    pub fn all_for_training(mut self) -> Corpus {
        let mut d: Vec<(Doc, bool)> = std::mem::take(&mut self.train).into_pieces().collect();
        d.extend(std::mem::take(&mut self.val).into_pieces());
        d.sort_by_key(|(p, _)| (p.src, p.start));
        self.train = Stream::of(d);
        self
    }

    /// Every document for validation (the corpus `--val-data` names).
    pub fn all_for_validation(self) -> Corpus {
        let mut c = self.all_for_training();
        std::mem::swap(&mut c.train, &mut c.val);
        c
    }

    /// Refuses a corpus too small for sequences of `t` tokens in what it is used for:
    /// training (`train`), validation (`val`), or both.
    pub fn check_length(&self, t: usize, train: bool, val: bool) -> Result<()> {
        let short = |s: &Stream| match self.packing {
            Packing::Windows => s.len() < (t + 2) as u64,
            Packing::Whole => s.is_empty(),
        };
        if val && self.val.is_empty() {
            return Err(Error::Data(format!(
                "{} holds one document; validation holds out whole documents, so give more documents or a corpus to validate on with --val-data",
                self.name
            )));
        }
        if (train && short(&self.train)) || (val && short(&self.val)) {
            return Err(Error::Data(format!(
                "{} has {} training and {} held-out tokens; sequences of {t} tokens need more than {} of each (or use a shorter --seq)",
                self.name,
                self.train.len(),
                self.val.len(),
                t + 1
            )));
        }
        Ok(())
    }

    /// Appends one sequence of `t` inputs and `t` targets from `stream`, and its tokens'
    /// positions in their documents.
    fn sequence(&self, stream: &Stream, rng: &mut ChaCha8Rng, t: usize, b: &mut Batch) {
        let (mut tok, mut keep) = (Vec::with_capacity(t + 1), Vec::with_capacity(t + 1));
        let mut starts = Vec::new();
        match self.packing {
            Packing::Windows => {
                let start = rng.gen_range(0..stream.len() - t as u64);
                stream.read(&self.sources, start, t + 1, &mut tok, &mut keep, &mut starts);
            }
            Packing::Whole => {
                while tok.len() < t + 1 {
                    let d = stream.docs[rng.gen_range(0..stream.docs.len())];
                    let n = (d.len as usize).min(t + 1 - tok.len());
                    starts.push(tok.len());
                    self.sources[d.src as usize].extend(d.start, n, &mut tok, &mut keep);
                }
            }
        }
        b.x.extend_from_slice(&tok[..t]);
        b.y.extend((1..=t).map(|i| if keep[i] { tok[i] as i32 } else { IGNORE }));
        b.pos.get_or_insert_with(Vec::new).extend(positions_from_starts(t, &[starts]));
    }
}

/// Several corpora drawn from by weight (one corpus: weight 1), and where validation
/// sequences come from: each corpus's held-out documents, or `held`, a corpus of its own.
pub struct Corpora {
    pub list: Vec<(Corpus, f64)>,
    pub held: Option<Corpus>,
}

impl Corpora {
    /// Batch `step`: `b` sequences of `t` tokens, each from a corpus drawn by weight.
    pub fn batch(&self, seed: u64, step: usize, b: usize, t: usize) -> Batch {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (step as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
        let mut out = Batch::with_capacity(b * t);
        let total: f64 = self.list.iter().map(|(_, w)| w).sum();
        for _ in 0..b {
            let c = self.pick(&mut rng, total);
            c.sequence(&c.train, &mut rng, t, &mut out);
        }
        out
    }

    fn pick(&self, rng: &mut ChaCha8Rng, total: f64) -> &Corpus {
        if self.list.len() == 1 {
            return &self.list[0].0;
        }
        let mut r = rng.gen::<f64>() * total;
        for (c, w) in &self.list {
            if r < *w {
                return c;
            }
            r -= w;
        }
        &self.list[self.list.len() - 1].0
    }

    /// `n` fixed validation sequences from the held-out documents (each corpus's share of
    /// them by weight).
    pub fn val_batch(&self, n: usize, t: usize) -> Batch {
        let mut rng = ChaCha8Rng::seed_from_u64(0x7a1);
        let mut out = Batch::with_capacity(n * t);
        if let Some(h) = &self.held {
            for _ in 0..n {
                h.sequence(&h.val, &mut rng, t, &mut out);
            }
            return out;
        }
        let total: f64 = self.list.iter().map(|(_, w)| w).sum();
        for _ in 0..n {
            let c = self.pick(&mut rng, total);
            c.sequence(&c.val, &mut rng, t, &mut out);
        }
        out
    }

    /// The fingerprint of them all (one corpus: its own).
    pub fn fingerprint(&self) -> Fingerprint {
        if self.list.len() == 1 && self.held.is_none() {
            return self.list[0].0.fingerprint.clone();
        }
        let mut h = blake3::Hasher::new();
        let mut bytes = 0;
        for (c, w) in &self.list {
            h.update(c.fingerprint.blake3.as_bytes());
            h.update(&w.to_le_bytes());
            bytes += c.fingerprint.bytes;
        }
        if let Some(v) = &self.held {
            h.update(b"validation");
            h.update(v.fingerprint.blake3.as_bytes());
            bytes += v.fingerprint.bytes;
        }
        Fingerprint { bytes, blake3: h.finalize().to_hex().to_string() }
    }

    /// The first tokens of the held-out documents (a sample prompt).
    pub fn val_prompt(&self, n: usize) -> Vec<u32> {
        let c = self.held.as_ref().unwrap_or(&self.list[0].0);
        let (mut tok, mut keep) = (Vec::new(), Vec::new());
        c.val.read(&c.sources, 0, n.min(c.val.len() as usize), &mut tok, &mut keep, &mut Vec::new());
        tok
    }
}
