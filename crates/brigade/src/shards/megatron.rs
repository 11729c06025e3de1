//! Megatron-LM's indexed datasets (`PREFIX.bin` + `PREFIX.idx`, version 1), both ways: the
//! index read and checked (training reads Megatron corpora and `brigade tokenize`'s shards
//! through it) and written (`brigade tokenize` writes each shard as one), byte for byte what
//! Megatron-Core's `IndexedDatasetBuilder` writes.

use crate::{Error, Result};
use std::path::Path;

/// Megatron's index magic.
pub const MEGATRON_MAGIC: &[u8; 9] = b"MMIDIDX\x00\x00";

/// The width of one token in a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Width {
    U16,
    U32,
}

impl Width {
    pub fn bytes(self) -> usize {
        match self {
            Width::U16 => 2,
            Width::U32 => 4,
        }
    }

    /// The token whose little-endian bytes are `b` (`bytes()` of them).
    pub fn read(self, b: &[u8]) -> u32 {
        match self {
            Width::U16 => u16::from_le_bytes([b[0], b[1]]) as u32,
            Width::U32 => u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        }
    }
}

impl Width {
    /// The width Megatron picks for a vocabulary (`DType.optimal_dtype`): uint16 below 65500
    /// tokens, int32 above.
    pub fn for_vocab(vocab: usize) -> Width {
        if vocab < 65500 {
            Width::U16
        } else {
            Width::U32
        }
    }

    /// Megatron's dtype code (uint16 8, int32 4).
    pub fn code(self) -> u8 {
        match self {
            Width::U16 => 8,
            Width::U32 => 4,
        }
    }
}

/// A Megatron index: its token width, each sequence's length and byte offset, and the
/// document boundaries (indices into the sequences).
pub struct MegatronIndex {
    pub width: Width,
    pub lengths: Vec<u32>,
    pub pointers: Vec<u64>,
    pub doc_idx: Vec<u64>,
    pub bytes: Vec<u8>,
}

impl MegatronIndex {
    pub fn read(idx: &Path) -> Result<MegatronIndex> {
        let bytes = std::fs::read(idx)
            .map_err(|e| Error::Data(format!("Megatron index {}: cannot read ({e})", idx.display())))?;
        MegatronIndex::parse(bytes, idx)
    }

    /// The index in `bytes` (read from `idx`, which messages name).
    pub fn parse(bytes: Vec<u8>, idx: &Path) -> Result<MegatronIndex> {
        let bad = |m: String| Error::Data(format!("Megatron index {}: {m}", idx.display()));
        let mut at = 0usize;
        let mut take = |n: usize| -> Result<&[u8]> {
            let s =
                bytes.get(at..at + n).ok_or_else(|| bad(format!("ends at byte {}; it is truncated", bytes.len())))?;
            at += n;
            Ok(s)
        };
        if take(9)? != MEGATRON_MAGIC {
            return Err(bad("does not begin with MMIDIDX; not a Megatron indexed dataset".into()));
        }
        let u64_at = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
        let version = u64_at(take(8)?);
        if version != 1 {
            return Err(bad(format!("version {version}; brigade reads version 1")));
        }
        let width = match take(1)?[0] {
            8 => Width::U16,
            4 => Width::U32,
            c => return Err(bad(format!("token type code {c}; brigade reads uint16 (8) and int32 (4) tokens"))),
        };
        let n = u64_at(take(8)?) as usize;
        let d = u64_at(take(8)?) as usize;
        let need = n.checked_mul(12).and_then(|s| s.checked_add(d.checked_mul(8)?));
        if need.is_none_or(|need| need > bytes.len()) {
            return Err(bad(format!(
                "claims {n} sequences and {d} document marks, more than its {} bytes hold",
                bytes.len()
            )));
        }
        let lengths = take(4 * n)?.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4"))).collect();
        let pointers = take(8 * n)?.chunks_exact(8).map(u64_at).collect();
        let doc_idx: Vec<u64> = take(8 * d)?.chunks_exact(8).map(u64_at).collect();
        if doc_idx.first() != Some(&0) || doc_idx.windows(2).any(|w| w[0] > w[1]) || doc_idx.last() != Some(&(n as u64))
        {
            return Err(bad(format!("its document marks do not run from 0 up to its {n} sequences")));
        }
        Ok(MegatronIndex { width, lengths, pointers, doc_idx, bytes })
    }
}

/// Documents (one sequence each, as Megatron's `preprocess_data.py` writes them) as a
/// dataset's `.bin` and `.idx` bytes.
pub fn write(docs: &[Vec<u32>], width: Width) -> (Vec<u8>, Vec<u8>) {
    let tokens: usize = docs.iter().map(Vec::len).sum();
    let mut bin = Vec::with_capacity(tokens * width.bytes());
    for d in docs {
        for &t in d {
            match width {
                Width::U16 => bin.extend_from_slice(&(t as u16).to_le_bytes()),
                Width::U32 => bin.extend_from_slice(&t.to_le_bytes()),
            }
        }
    }
    let n = docs.len();
    let mut idx = Vec::with_capacity(34 + n * 20 + 8);
    idx.extend_from_slice(MEGATRON_MAGIC);
    idx.extend_from_slice(&1u64.to_le_bytes());
    idx.push(width.code());
    idx.extend_from_slice(&(n as u64).to_le_bytes());
    idx.extend_from_slice(&(n as u64 + 1).to_le_bytes());
    for d in docs {
        idx.extend_from_slice(&(d.len() as u32).to_le_bytes());
    }
    let mut at = 0u64;
    for d in docs {
        idx.extend_from_slice(&at.to_le_bytes());
        at += (d.len() * width.bytes()) as u64;
    }
    for i in 0..=n as u64 {
        idx.extend_from_slice(&i.to_le_bytes());
    }
    (bin, idx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_index_reads_back_as_its_documents() {
        let docs = [vec![1, 2, 3], vec![], vec![70000, 5]];
        for width in [Width::U16, Width::U32] {
            let docs: Vec<Vec<u32>> =
                docs.iter().map(|d| d.iter().map(|&t| t % (1 << (8 * width.bytes() as u32 - 1))).collect()).collect();
            let (bin, idx) = write(&docs, width);
            let m = MegatronIndex::parse(idx.clone(), Path::new("x.idx")).unwrap();
            assert_eq!((m.width, m.lengths.clone(), m.doc_idx.clone()), (width, vec![3, 0, 2], vec![0, 1, 2, 3]));
            let w = width.bytes();
            assert_eq!(m.pointers, [0, 3 * w as u64, 3 * w as u64]);
            assert_eq!(bin.len(), 5 * w);
            let back: Vec<u32> = bin.chunks_exact(w).map(|c| width.read(c)).collect();
            assert_eq!(back, docs.concat());
            // a cut index is refused in words
            let e = MegatronIndex::parse(idx[..idx.len() - 3].to_vec(), Path::new("x.idx")).err().unwrap().to_string();
            assert!(e.contains("x.idx"), "{e}");
        }
        assert_eq!((Width::for_vocab(50257), Width::for_vocab(128256)), (Width::U16, Width::U32));
    }
}
