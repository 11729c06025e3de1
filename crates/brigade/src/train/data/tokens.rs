//! Token arrays a corpus is made of: a file of little-endian integers read memory-mapped (a
//! rank touches only the pages of the windows it reads, so memory stays flat in corpus size),
//! or tokens held in memory (a text file or conversations tokenized at start), with an optional
//! per-token mask of the tokens trained on.

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

pub use crate::shards::megatron::Width;

/// A file's tokens from byte `offset` on, memory-mapped.
pub struct TokenFile {
    map: memmap2::Mmap,
    offset: usize,
    width: Width,
    len: u64,
    pub path: PathBuf,
}

impl TokenFile {
    /// `count` tokens from byte `offset` of `path` (all that follow when `None`); a file
    /// shorter than that is refused.
    pub fn open(path: &Path, offset: usize, width: Width, count: Option<u64>) -> Result<TokenFile> {
        let f = std::fs::File::open(path)
            .map_err(|e| Error::Data(format!("cannot read token file {}: {e}", path.display())))?;
        // SAFETY: read only; a corpus rewritten under a running job is the user's to avoid
        let map = unsafe { memmap2::Mmap::map(&f) }
            .map_err(|e| Error::Data(format!("cannot map token file {}: {e}", path.display())))?;
        let body = map.len().saturating_sub(offset);
        let have = (body / width.bytes()) as u64;
        let len = count.unwrap_or(have);
        if map.len() < offset || len > have || (count.is_none() && body % width.bytes() != 0) {
            return Err(Error::Data(format!(
                "token file {} holds {} bytes, not {} tokens of {} bytes after a {offset}-byte header; it is truncated or not this format",
                path.display(),
                map.len(),
                len,
                width.bytes()
            )));
        }
        Ok(TokenFile { map, offset, width, len, path: path.to_path_buf() })
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Token `i`.
    pub fn get(&self, i: u64) -> u32 {
        let at = self.offset + i as usize * self.width.bytes();
        self.width.read(&self.map[at..at + self.width.bytes()])
    }

    /// Appends tokens `start..start + n`.
    pub fn extend(&self, start: u64, n: usize, out: &mut Vec<u32>) {
        let w = self.width.bytes();
        let at = self.offset + start as usize * w;
        let bytes = &self.map[at..at + n * w];
        out.extend(bytes.chunks_exact(w).map(|c| self.width.read(c)));
    }

    /// The file's bytes (for its fingerprint).
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }
}

/// Where a corpus's tokens are.
pub enum Source {
    File(TokenFile),
    /// Tokens in memory, and which of them are trained on (`None`: all).
    Memory {
        tokens: Vec<u32>,
        trained: Option<Vec<bool>>,
    },
}

impl Source {
    pub fn len(&self) -> u64 {
        match self {
            Source::File(f) => f.len(),
            Source::Memory { tokens, .. } => tokens.len() as u64,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends tokens `start..start + n`, and whether each is trained on.
    pub fn extend(&self, start: u64, n: usize, out: &mut Vec<u32>, trained: &mut Vec<bool>) {
        match self {
            Source::File(f) => {
                f.extend(start, n, out);
                trained.resize(trained.len() + n, true);
            }
            Source::Memory { tokens, trained: mask } => {
                let r = start as usize..start as usize + n;
                out.extend_from_slice(&tokens[r.clone()]);
                match mask {
                    Some(m) => trained.extend_from_slice(&m[r]),
                    None => trained.resize(trained.len() + n, true),
                }
            }
        }
    }
}
