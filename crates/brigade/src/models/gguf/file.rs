//! The GGUF container (version 3, as llama.cpp's `gguf.h` and gguf-py define it): a header,
//! key/value metadata, a table of tensors (name, dimensions innermost first, type, offset) and
//! the tensors' data, each at a multiple of the alignment (32), written here (`read` reads
//! it). Tensors are written as f32, f16, or Q8_0 (blocks of 32 values: an f16 scale
//! `max|x| / 127` and 32 signed bytes `round(x / scale)`, llama.cpp's `quantize_row_q8_0_ref`;
//! `quants`).

use std::io::{self, Write};

pub const MAGIC: &[u8; 4] = b"GGUF";
pub const VERSION: u32 = 3;
pub const ALIGNMENT: usize = 32;
/// Values per Q8_0 block.
pub const Q8_0_BLOCK: usize = 32;

/// A tensor's element type (the writer encodes F32, F16 and Q8_0).
pub use super::quants::GgmlType as TensorType;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    Strs(Vec<String>),
    I32s(Vec<i32>),
    F32s(Vec<f32>),
}

impl Value {
    fn type_id(&self) -> u32 {
        match self {
            Value::U32(_) => 4,
            Value::I32(_) => 5,
            Value::F32(_) => 6,
            Value::Bool(_) => 7,
            Value::Str(_) => 8,
            Value::Strs(_) | Value::I32s(_) | Value::F32s(_) => 9,
        }
    }

    fn write(&self, w: &mut impl Write) -> io::Result<()> {
        match self {
            Value::U32(v) => w.write_all(&v.to_le_bytes()),
            Value::I32(v) => w.write_all(&v.to_le_bytes()),
            Value::F32(v) => w.write_all(&v.to_le_bytes()),
            Value::Bool(v) => w.write_all(&[*v as u8]),
            Value::Str(s) => write_str(w, s),
            Value::Strs(v) => {
                w.write_all(&8u32.to_le_bytes())?;
                w.write_all(&(v.len() as u64).to_le_bytes())?;
                v.iter().try_for_each(|s| write_str(w, s))
            }
            Value::I32s(v) => {
                w.write_all(&5u32.to_le_bytes())?;
                w.write_all(&(v.len() as u64).to_le_bytes())?;
                v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes()))
            }
            Value::F32s(v) => {
                w.write_all(&6u32.to_le_bytes())?;
                w.write_all(&(v.len() as u64).to_le_bytes())?;
                v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes()))
            }
        }
    }
}

fn write_str(w: &mut impl Write, s: &str) -> io::Result<()> {
    w.write_all(&(s.len() as u64).to_le_bytes())?;
    w.write_all(s.as_bytes())
}

/// A tensor to write: its GGUF name, dimensions as GGUF lists them (innermost, the row's
/// length, first: a `[rows, cols]` matrix is `[cols, rows]`), type and encoded bytes.
pub struct Tensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: TensorType,
    pub data: Vec<u8>,
}

impl Tensor {
    /// A row-major `shape` (outermost first) of values, encoded as `ty`.
    pub fn new(name: impl Into<String>, shape: &[usize], ty: TensorType, values: &[f32]) -> Tensor {
        assert_eq!(shape.iter().product::<usize>(), values.len(), "the shape holds the values");
        Tensor { name: name.into(), dims: shape.iter().rev().map(|&d| d as u64).collect(), ty, data: ty.encode(values) }
    }
}

/// Writes a GGUF file: `metadata` in order, then `tensors`.
pub fn write(w: &mut impl Write, metadata: &[(String, Value)], tensors: &[Tensor]) -> io::Result<()> {
    let mut head = Vec::new();
    head.extend_from_slice(MAGIC);
    head.extend_from_slice(&VERSION.to_le_bytes());
    head.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    head.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata {
        write_str(&mut head, k)?;
        head.extend_from_slice(&v.type_id().to_le_bytes());
        v.write(&mut head)?;
    }
    let mut offset = 0usize;
    for t in tensors {
        write_str(&mut head, &t.name)?;
        head.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        t.dims.iter().for_each(|d| head.extend_from_slice(&d.to_le_bytes()));
        head.extend_from_slice(&t.ty.id().to_le_bytes());
        head.extend_from_slice(&(offset as u64).to_le_bytes());
        offset = (offset + t.data.len()).next_multiple_of(ALIGNMENT);
    }
    head.resize(head.len().next_multiple_of(ALIGNMENT), 0);
    w.write_all(&head)?;
    for t in tensors {
        w.write_all(&t.data)?;
        let pad = t.data.len().next_multiple_of(ALIGNMENT) - t.data.len();
        w.write_all(&[0u8; ALIGNMENT][..pad])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header, metadata, tensor table and aligned data where the format puts them.
    #[test]
    fn the_container_is_laid_out_as_the_format_says() {
        let meta = vec![("general.architecture".to_string(), Value::Str("llama".into())), ("n".into(), Value::U32(7))];
        let t = [
            Tensor::new("a", &[2, 3], TensorType::F32, &[1., 2., 3., 4., 5., 6.]),
            Tensor::new("b", &[1], TensorType::F32, &[9.]),
        ];
        let mut out = Vec::new();
        write(&mut out, &meta, &t).unwrap();
        assert_eq!(&out[..4], b"GGUF");
        assert_eq!(u32::from_le_bytes(out[4..8].try_into().unwrap()), 3);
        assert_eq!(u64::from_le_bytes(out[8..16].try_into().unwrap()), 2);
        assert_eq!(u64::from_le_bytes(out[16..24].try_into().unwrap()), 2);
        // first key: length-prefixed
        assert_eq!(u64::from_le_bytes(out[24..32].try_into().unwrap()), 20);
        assert_eq!(&out[32..52], b"general.architecture");
        // the data section starts aligned and ends with b's value after a's padded 24 bytes
        let data = out.len() - 64;
        assert!(data.is_multiple_of(ALIGNMENT));
        assert_eq!(f32::from_le_bytes(out[data..data + 4].try_into().unwrap()), 1.0);
        assert_eq!(f32::from_le_bytes(out[data + 32..data + 36].try_into().unwrap()), 9.0);
    }
}
