//! Token corpora in the formats users already have: llm.c / nanoGPT token files (a 256-int32
//! header, then u16 or u32 tokens) and Megatron-LM's indexed datasets (`PREFIX.bin` +
//! `PREFIX.idx`). Both are read memory-mapped.

use super::corpus::{Corpus, Doc, Documents, Packing};
use super::tokens::{Source, TokenFile, Width};
use crate::error::{Error, Result};
use crate::models::tokenizer::{Fingerprint, Tokenizer};
pub use crate::shards::megatron::{MegatronIndex, MEGATRON_MAGIC};
use crate::shards::tokens;
use std::io::Read;
use std::path::{Path, PathBuf};

/// llm.c's header: 256 int32, the first three magic, version, token count; GPT-2's files
/// (version 1) hold u16 tokens, Llama 3's (version 7) u32.
pub const LLMC_MAGIC: i32 = 20240520;
pub const LLMC_MAGIC_LLAMA3: i32 = 20240801;
const LLMC_HEADER: usize = 256 * 4;

/// What `path` holds, judged by its name and first bytes.
#[derive(Debug, PartialEq, Eq)]
pub enum Format {
    LlmC,
    /// nanoGPT's `prepare.py` output: u16 GPT-2 tokens, no header.
    NanoGpt,
    /// A Megatron dataset: the prefix (without `.bin` / `.idx`).
    Megatron(PathBuf),
    ChatJsonl,
    Text,
    /// A folder of text files, one document each.
    TextFolder,
    /// A folder `brigade tokenize` wrote: Megatron shards and their manifest.
    TokenShards,
}

pub fn detect(path: &Path, chat: bool) -> Result<Format> {
    if path.is_dir() {
        return Ok(if tokens::is_tokens_dir(path) { Format::TokenShards } else { Format::TextFolder });
    }
    let s = path.to_string_lossy();
    if chat {
        return Ok(Format::ChatJsonl);
    }
    let prefix = s.strip_suffix(".bin").unwrap_or(&s).to_string();
    if Path::new(&format!("{prefix}.idx")).is_file() {
        return Ok(Format::Megatron(PathBuf::from(prefix)));
    }
    if !path.exists() {
        return Err(Error::Data(format!(
            "cannot read data {}: no such file (a Megatron dataset is given as PREFIX or PREFIX.bin, with PREFIX.idx beside it)",
            path.display()
        )));
    }
    if s.ends_with(".jsonl") {
        return Err(Error::Data(format!(
            "{} is JSON Lines: give --chat for conversations, or turn text records into token shards with `brigade tokenize --input {} --text-field NAME`",
            path.display(),
            path.display()
        )));
    }
    let mut head = [0u8; 4];
    let n = std::fs::File::open(path).and_then(|mut f| f.read(&mut head)).unwrap_or(0);
    if n == 4 && [LLMC_MAGIC, LLMC_MAGIC_LLAMA3].contains(&i32::from_le_bytes(head)) {
        return Ok(Format::LlmC);
    }
    if s.ends_with(".bin") {
        return Ok(Format::NanoGpt);
    }
    Ok(Format::Text)
}

/// The fingerprint of a large file without reading it all: its size, and the hash of its
/// first and last MiB and of `extra` (an index, read whole).
fn quick_fingerprint(bytes: &[u8], extra: &[u8]) -> Fingerprint {
    let mut h = blake3::Hasher::new();
    let m = 1 << 20;
    h.update(&bytes[..bytes.len().min(m)]);
    h.update(&bytes[bytes.len().saturating_sub(m)..]);
    h.update(extra);
    Fingerprint { bytes: bytes.len() as u64, blake3: h.finalize().to_hex().to_string() }
}

/// An llm.c token file: documents begin with the delimiter (GPT-2's `<|endoftext|>` in its
/// u16 files, Llama 3's `<|begin_of_text|>` in its u32 files).
pub fn llmc(path: &Path) -> Result<Corpus> {
    let bad = |m: String| Error::Data(format!("llm.c token file {}: {m}", path.display()));
    let mut header = vec![0u8; LLMC_HEADER];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut header))
        .map_err(|e| bad(format!("cannot read its 1024-byte header ({e})")))?;
    let word = |i: usize| i32::from_le_bytes(header[4 * i..4 * i + 4].try_into().expect("4 bytes"));
    let (width, delimiter) = match (word(0), word(1)) {
        (LLMC_MAGIC, 1) => (Width::U16, 50256),
        (LLMC_MAGIC_LLAMA3, 7) => (Width::U32, 128000),
        (m, v) => {
            return Err(bad(format!(
                "magic {m} version {v}; llm.c writes {LLMC_MAGIC} version 1 (GPT-2, u16 tokens) or {LLMC_MAGIC_LLAMA3} version 7 (Llama 3, u32 tokens)"
            )))
        }
    };
    let count = u64::try_from(word(2)).map_err(|_| bad(format!("a negative token count {}", word(2))))?;
    let file = TokenFile::open(path, LLMC_HEADER, width, Some(count))?;
    let docs = split_at_delimiter(path, LLMC_HEADER, width, count, delimiter)?;
    let fp = quick_fingerprint(file.bytes(), &[]);
    Corpus::new(path.display().to_string(), vec![Source::File(file)], docs, Packing::Windows, fp)
}

/// The documents of a token file whose documents each begin with `delimiter`, found by one
/// buffered pass (not through the map, so that it leaves no pages resident).
fn split_at_delimiter(path: &Path, offset: usize, width: Width, count: u64, delimiter: u32) -> Result<Documents> {
    let mut f = std::io::BufReader::with_capacity(
        1 << 20,
        std::fs::File::open(path).map_err(|e| Error::Data(format!("cannot read {}: {e}", path.display())))?,
    );
    std::io::copy(&mut (&mut f).take(offset as u64), &mut std::io::sink())
        .map_err(|e| Error::Data(format!("cannot read {}: {e}", path.display())))?;
    let mut starts = vec![0u64];
    let mut buf = vec![0u8; 1 << 20];
    let w = width.bytes();
    let mut i = 0u64;
    while i < count {
        let n = ((count - i) as usize * w).min(buf.len());
        f.read_exact(&mut buf[..n]).map_err(|e| Error::Data(format!("cannot read {}: {e}", path.display())))?;
        for c in buf[..n].chunks_exact(w) {
            let t = width.read(c);
            if t == delimiter && i > 0 {
                starts.push(i);
            }
            i += 1;
        }
    }
    starts.push(count);
    let mut docs = Documents::default();
    for s in starts.windows(2) {
        let len = u32::try_from(s[1] - s[0]).map_err(|_| {
            Error::Data(format!(
                "{}: a document of {} tokens; brigade reads documents of up to 2^32",
                path.display(),
                s[1] - s[0]
            ))
        })?;
        docs.push([Doc { src: 0, start: s[0], len }]);
    }
    Ok(docs)
}

/// A nanoGPT token file: u16 GPT-2 tokens, documents separated by `<|endoftext|>`.
pub fn nanogpt(path: &Path) -> Result<Corpus> {
    let file = TokenFile::open(path, 0, Width::U16, None)?;
    let docs = split_at_delimiter(path, 0, Width::U16, file.len(), 50256)?;
    let fp = quick_fingerprint(file.bytes(), &[]);
    Corpus::new(path.display().to_string(), vec![Source::File(file)], docs, Packing::Windows, fp)
}

/// A Megatron dataset `PREFIX.bin` + `PREFIX.idx` as the source `src` of a corpus: its
/// documents, after the index is checked against the `.bin`.
pub fn megatron_source(prefix: &Path, src: u32) -> Result<(Source, Documents, MegatronIndex)> {
    let idx_path = PathBuf::from(format!("{}.idx", prefix.display()));
    let bin_path = PathBuf::from(format!("{}.bin", prefix.display()));
    let idx = MegatronIndex::read(&idx_path)?;
    let file = TokenFile::open(&bin_path, 0, idx.width, None)?;
    let w = idx.width.bytes() as u64;
    let size = file.bytes().len() as u64;
    let mut total = 0u64;
    for (i, (&len, &ptr)) in idx.lengths.iter().zip(&idx.pointers).enumerate() {
        if ptr % w != 0 || ptr + len as u64 * w > size {
            return Err(Error::Data(format!(
                "Megatron index {} does not match {}: sequence {i} ({len} tokens at byte {ptr}) is not inside its {size} bytes",
                idx_path.display(),
                bin_path.display()
            )));
        }
        total += len as u64 * w;
    }
    if total != size {
        return Err(Error::Data(format!(
            "Megatron index {} does not match {}: its sequences hold {total} bytes, the .bin {size}",
            idx_path.display(),
            bin_path.display()
        )));
    }
    let mut docs = Documents::default();
    for r in idx.doc_idx.windows(2) {
        docs.push((r[0] as usize..r[1] as usize).map(|s| Doc { src, start: idx.pointers[s] / w, len: idx.lengths[s] }));
    }
    Ok((Source::File(file), docs, idx))
}

pub fn megatron(prefix: &Path) -> Result<Corpus> {
    let (src, docs, idx) = megatron_source(prefix, 0)?;
    let Source::File(f) = &src else { unreachable!("a file") };
    let fp = quick_fingerprint(f.bytes(), &idx.bytes);
    Corpus::new(prefix.display().to_string(), vec![src], docs, Packing::Windows, fp)
}

/// A folder `brigade tokenize` wrote, as one corpus: its shards' documents in input order,
/// each shard memory-mapped. Refused when unfinished, or made by another tokenizer than `tok`
/// (when the run has one: token corpora train without).
pub fn token_shards(dir: &Path, tok: &Tokenizer) -> Result<Corpus> {
    let m = tokens::read_manifest(dir)?;
    if !m.complete {
        return Err(Error::Data(format!(
            "{} is an unfinished brigade tokenize output; run the same `brigade tokenize` command again to finish it",
            dir.display()
        )));
    }
    if let Tokenizer::Hf(..) = tok {
        let mine = tok.identity();
        if m.job.tokenizer != mine {
            return Err(Error::Data(format!(
                "{} was tokenized by another tokenizer ({}: {} tokens, eos {}) than this run's ({}: {} tokens, eos {}); tokenize it again with --tokenizer {}, or train with the tokenizer it was made with",
                dir.display(),
                m.job.tokenizer.path,
                m.job.tokenizer.vocab_size,
                m.job.tokenizer.eos.map_or("none".into(), |e| e.to_string()),
                mine.path,
                mine.vocab_size,
                mine.eos.map_or("none".into(), |e| e.to_string()),
                mine.path
            )));
        }
    }
    let (mut sources, mut docs) = (Vec::new(), Documents::default());
    let mut h = blake3::Hasher::new();
    let mut bytes = 0;
    for (i, s) in m.shards.iter().enumerate() {
        let (src, d, _) = megatron_source(&dir.join(&s.prefix), i as u32)?;
        if d.len() != s.documents {
            return Err(Error::Data(format!(
                "{}: shard {} holds {} documents, its manifest says {}; check it with `brigade tokenize --verify {}`",
                dir.display(),
                s.index,
                d.len(),
                s.documents,
                dir.display()
            )));
        }
        for k in 0..d.len() {
            docs.push(d.doc(k).iter().copied());
        }
        bytes += src.len() * m.job.width().bytes() as u64;
        h.update(s.sha256.as_bytes());
        sources.push(src);
    }
    let fp = Fingerprint { bytes, blake3: h.finalize().to_hex().to_string() };
    Corpus::new(dir.display().to_string(), sources, docs, Packing::Windows, fp)
}
