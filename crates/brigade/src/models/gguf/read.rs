//! Reading a GGUF file (versions 2 and 3, as llama.cpp's `gguf.cpp` reads them), memory-mapped:
//! the metadata (every value type, arrays of them), the tensor table, and each tensor's bytes
//! where the table puts them past the aligned data start. Everything is checked before it is
//! used — the magic, the version, lengths against the file's size, each tensor's type, its
//! bytes inside the file — and a problem is one line naming it.

use super::quants::{GgmlType, SUPPORTED};
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Meta {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Meta>),
}

impl Meta {
    /// A whole number of any width (a negative one is not).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Meta::U8(v) => Some(v as u64),
            Meta::U16(v) => Some(v as u64),
            Meta::U32(v) => Some(v as u64),
            Meta::U64(v) => Some(v),
            Meta::I8(v) => u64::try_from(v).ok(),
            Meta::I16(v) => u64::try_from(v).ok(),
            Meta::I32(v) => u64::try_from(v).ok(),
            Meta::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Meta::F32(v) => Some(v as f64),
            Meta::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Meta::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Meta::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Meta]> {
        match self {
            Meta::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// A tensor of the table: its name, dimensions as GGUF lists them (innermost first), type and
/// where its bytes start, from the data section's start.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    pub offset: u64,
}

impl TensorInfo {
    pub fn len(&self) -> usize {
        self.dims.iter().product::<u64>() as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The shape outermost first (a `[rows, cols]` matrix for GGUF's `[cols, rows]`).
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    pub fn bytes(&self) -> usize {
        self.ty.bytes(self.len())
    }
}

/// An opened GGUF file.
pub struct Gguf {
    pub path: PathBuf,
    pub version: u32,
    pub metadata: BTreeMap<String, Meta>,
    pub tensors: Vec<TensorInfo>,
    map: memmap2::Mmap,
    data_start: usize,
}

/// A reader of the header's fields, every read checked against the end.
struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> std::result::Result<&'a [u8], String> {
        let end =
            self.at.checked_add(n).filter(|&e| e <= self.b.len()).ok_or_else(|| {
                format!("the file ends inside its header ({what} at byte {}): it is truncated", self.at)
            })?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u32(&mut self, what: &str) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self, what: &str) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().expect("8 bytes")))
    }

    fn str(&mut self, what: &str) -> std::result::Result<String, String> {
        let n = self.u64(what)?;
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.b.len())
            .ok_or_else(|| format!("{what} claims {n} bytes, more than the file holds: it is truncated or not GGUF"))?;
        let s = self.take(n, what)?;
        String::from_utf8(s.to_vec()).map_err(|_| format!("{what} is not UTF-8"))
    }

    fn value(&mut self, ty: u32, key: &str, depth: usize) -> std::result::Result<Meta, String> {
        let what = format!("the value of '{key}'");
        Ok(match ty {
            0 => Meta::U8(self.take(1, &what)?[0]),
            1 => Meta::I8(self.take(1, &what)?[0] as i8),
            2 => Meta::U16(u16::from_le_bytes(self.take(2, &what)?.try_into().expect("2"))),
            3 => Meta::I16(i16::from_le_bytes(self.take(2, &what)?.try_into().expect("2"))),
            4 => Meta::U32(self.u32(&what)?),
            5 => Meta::I32(self.u32(&what)? as i32),
            6 => Meta::F32(f32::from_bits(self.u32(&what)?)),
            7 => match self.take(1, &what)?[0] {
                0 => Meta::Bool(false),
                1 => Meta::Bool(true),
                b => return Err(format!("{what} is a bool of byte {b}, neither 0 nor 1")),
            },
            8 => Meta::Str(self.str(&what)?),
            9 => {
                if depth > 2 {
                    return Err(format!("{what} nests arrays more than twice"));
                }
                let inner = self.u32(&what)?;
                let n = self.u64(&what)?;
                // every element takes at least a byte: a count past the file is not believed
                if n > (self.b.len() - self.at) as u64 {
                    return Err(format!("{what} claims {n} elements, more than the file holds: it is truncated"));
                }
                let mut a = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    a.push(self.value(inner, key, depth + 1)?);
                }
                Meta::Array(a)
            }
            10 => Meta::U64(self.u64(&what)?),
            11 => Meta::I64(self.u64(&what)? as i64),
            12 => Meta::F64(f64::from_bits(self.u64(&what)?)),
            t => return Err(format!("{what} has value type {t}, which GGUF does not define")),
        })
    }
}

impl Gguf {
    /// Opens and checks `path`.
    pub fn open(path: &Path) -> Result<Gguf> {
        let bad = |msg: String| Error::ckpt(path, msg);
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the map is read-only and the file is not written while it is open; a file
        // changed underneath by another process is outside what any reader can guard against
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        if map.len() < 4 || &map[..4] != b"GGUF" {
            return Err(bad("not a GGUF file (it does not start with 'GGUF')".into()));
        }
        let mut c = Cursor { b: &map, at: 4 };
        let version = c.u32("the version").map_err(bad)?;
        if !(2..=3).contains(&version) {
            return Err(bad(format!("GGUF version {version}; brigade reads versions 2 and 3")));
        }
        let n_tensors = c.u64("the tensor count").map_err(bad)?;
        let n_kv = c.u64("the metadata count").map_err(bad)?;
        if n_tensors > map.len() as u64 || n_kv > map.len() as u64 {
            return Err(bad(format!(
                "the header claims {n_tensors} tensors and {n_kv} metadata keys, more than the file holds: it is truncated or corrupt"
            )));
        }
        let mut metadata = BTreeMap::new();
        for i in 0..n_kv {
            let key = c.str(&format!("metadata key {i}")).map_err(bad)?;
            let ty = c.u32(&format!("the type of '{key}'")).map_err(bad)?;
            let v = c.value(ty, &key, 0).map_err(bad)?;
            if metadata.insert(key.clone(), v).is_some() {
                return Err(bad(format!("the metadata key '{key}' appears twice")));
            }
        }
        let mut tensors = Vec::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            let name = c.str(&format!("tensor {i}'s name")).map_err(bad)?;
            let n_dims = c.u32(&format!("tensor '{name}''s dimension count")).map_err(bad)?;
            if n_dims == 0 || n_dims > 4 {
                return Err(bad(format!("tensor '{name}' has {n_dims} dimensions; GGUF allows 1 to 4")));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(c.u64(&format!("tensor '{name}''s dimensions")).map_err(bad)?);
            }
            let ty_id = c.u32(&format!("tensor '{name}''s type")).map_err(bad)?;
            let ty = GgmlType::from_id(ty_id).map_err(|t| {
                bad(format!("tensor '{name}' has {t}, which brigade does not read; it reads {SUPPORTED}"))
            })?;
            let offset = c.u64(&format!("tensor '{name}''s offset")).map_err(bad)?;
            if dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d)).filter(|&n| n <= 1 << 40).is_none() {
                return Err(bad(format!("tensor '{name}' has dimensions {dims:?}, too many values")));
            }
            let per = ty.block().0 as u64;
            if dims[0] % per != 0 {
                return Err(bad(format!(
                    "tensor '{name}': its rows of {} values are not whole {} blocks of {per}",
                    dims[0],
                    ty.name()
                )));
            }
            tensors.push(TensorInfo { name, dims, ty, offset });
        }
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => a as usize,
                _ => return Err(bad(format!("general.alignment is {v:?}; it must be a power of two"))),
            },
        };
        let data_start = c.at.next_multiple_of(alignment);
        for t in &tensors {
            let start = data_start as u64 + t.offset;
            let end = start + t.bytes() as u64;
            if !t.offset.is_multiple_of(alignment as u64) {
                return Err(bad(format!(
                    "tensor '{}' starts at offset {}, not aligned to {alignment}",
                    t.name, t.offset
                )));
            }
            if end > map.len() as u64 {
                return Err(bad(format!(
                    "tensor '{}' ({} bytes at byte {start}) runs past the end of the file ({} bytes): it is truncated",
                    t.name,
                    t.bytes(),
                    map.len()
                )));
            }
        }
        Ok(Gguf { path: path.to_path_buf(), version, metadata, tensors, map, data_start })
    }

    /// A name for the file's content: the hash of its header (metadata and tensor table).
    pub fn header_hash(&self) -> String {
        blake3::hash(&self.map[..self.data_start]).to_hex()[..24].to_string()
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// A tensor's stored bytes.
    pub fn data(&self, t: &TensorInfo) -> &[u8] {
        let start = self.data_start + t.offset as usize;
        &self.map[start..start + t.bytes()]
    }

    /// A tensor's values as f32, in its stored order (row-major, outermost dimension first).
    pub fn dequantize(&self, t: &TensorInfo) -> Vec<f32> {
        let mut out = Vec::with_capacity(t.len());
        t.ty.dequantize_into(self.data(t), &mut out);
        out
    }

    pub fn get(&self, key: &str) -> Option<&Meta> {
        self.metadata.get(key)
    }

    /// A metadata value that must be there: missing, it is an error naming the key.
    pub fn need(&self, key: &str) -> Result<&Meta> {
        self.get(key).ok_or_else(|| Error::ckpt(&self.path, format!("the metadata key '{key}' is missing")))
    }

    /// A whole number the model needs.
    pub fn need_u64(&self, key: &str) -> Result<u64> {
        let v = self.need(key)?;
        v.as_u64().ok_or_else(|| Error::ckpt(&self.path, format!("'{key}' is {v:?}; a whole number was expected")))
    }

    /// A string the model needs.
    pub fn need_str(&self, key: &str) -> Result<&str> {
        let v = self.need(key)?;
        v.as_str().ok_or_else(|| Error::ckpt(&self.path, format!("'{key}' is {v:?}; a string was expected")))
    }
}

#[cfg(test)]
mod tests {
    use super::super::file::{self, Tensor, TensorType, Value};
    use super::*;

    fn written(meta: &[(String, Value)], tensors: &[Tensor]) -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("m.gguf");
        let mut out = Vec::new();
        file::write(&mut out, meta, tensors).unwrap();
        std::fs::write(&p, out).unwrap();
        (d, p)
    }

    #[test]
    fn what_the_writer_writes_reads_back() {
        let meta = vec![
            ("general.architecture".to_string(), Value::Str("llama".into())),
            ("llama.block_count".into(), Value::U32(2)),
            ("tokenizer.ggml.tokens".into(), Value::Strs(vec!["a".into(), "b".into()])),
            ("f".into(), Value::F32s(vec![0.5, 2.0])),
        ];
        let x: Vec<f32> = (0..64).map(|i| i as f32 * 0.25 - 3.0).collect();
        let t = [
            Tensor::new("w", &[2, 32], TensorType::Q8_0, &x),
            Tensor::new("v", &[3], TensorType::F32, &[1., 2., 3.]),
            Tensor::new("h", &[2, 2], TensorType::F16, &[1.5, -2., 0.25, 8.]),
        ];
        let (_d, p) = written(&meta, &t);
        let g = Gguf::open(&p).unwrap();
        assert_eq!(g.version, 3);
        assert_eq!(g.need_str("general.architecture").unwrap(), "llama");
        assert_eq!(g.need_u64("llama.block_count").unwrap(), 2);
        assert_eq!(g.need("tokenizer.ggml.tokens").unwrap().as_array().unwrap()[1], Meta::Str("b".into()));
        assert_eq!(g.need("f").unwrap(), &Meta::Array(vec![Meta::F32(0.5), Meta::F32(2.0)]));
        let w = g.tensor("w").unwrap();
        assert_eq!((w.shape(), w.ty), (vec![2, 32], GgmlType::Q8_0));
        let back = g.dequantize(w);
        // within half a step of each block's scale (max|x| / 127)
        assert!(back.iter().zip(&x).all(|(a, b)| (a - b).abs() <= 0.51 * 12.75 / 127.0), "{back:?}");
        assert_eq!(g.dequantize(g.tensor("v").unwrap()), [1., 2., 3.]);
        assert_eq!(g.dequantize(g.tensor("h").unwrap()), [1.5, -2., 0.25, 8.]);
        let e = g.need("llama.context_length").unwrap_err().to_string();
        assert!(e.contains("'llama.context_length' is missing"), "{e}");
    }

    #[test]
    fn broken_files_are_refused_naming_the_problem() {
        let meta = vec![("general.architecture".to_string(), Value::Str("llama".into()))];
        let t = [Tensor::new("w", &[4, 32], TensorType::F32, &[0.5; 128])];
        let (d, p) = written(&meta, &t);
        let whole = std::fs::read(&p).unwrap();
        let open = |bytes: &[u8]| {
            let q = d.path().join("x.gguf");
            std::fs::write(&q, bytes).unwrap();
            Gguf::open(&q).err().map(|e| e.to_string()).unwrap_or_default()
        };
        assert!(open(b"PK\x03\x04 a zip").contains("not a GGUF file"));
        // cut inside the tensor data: named, with the sizes
        let e = open(&whole[..whole.len() - 100]);
        assert!(e.contains("tensor 'w'") && e.contains("past the end of the file"), "{e}");
        // cut inside the header
        assert!(open(&whole[..40]).contains("truncated"), "{}", open(&whole[..40]));
        // version 1 (32-bit counts) and a future one
        let mut v = whole.clone();
        v[4] = 1;
        assert!(open(&v).contains("GGUF version 1"));
        // a tensor type brigade does not read: named, with the types it does
        let mut q = whole.clone();
        // the table's entry: the name "w" (a u64 length and a byte), n_dims, two dims, the type
        let name_at = q.windows(9).position(|w| w == b"\x01\0\0\0\0\0\0\0w").unwrap();
        let ty_at = name_at + 9 + 4 + 16;
        q[ty_at..ty_at + 4].copy_from_slice(&11u32.to_le_bytes());
        let e = open(&q);
        assert!(e.contains("tensor 'w' has tensor type 11 (Q3_K)") && e.contains("Q4_K"), "{e}");
    }
}
