//! NumPy's `.npy` format (version 1.0) for `[rows, cols]` little-endian float32 arrays: what
//! `numpy.load` reads back as `float32` with that shape.

use std::io::{self, Write};

const MAGIC: &[u8] = b"\x93NUMPY\x01\x00";

/// The header for a C-order `<f4` array of `[rows, cols]`, padded to a multiple of 64 bytes.
pub fn header(rows: usize, cols: usize) -> Vec<u8> {
    let dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {cols}), }}");
    let unpadded = MAGIC.len() + 2 + dict.len() + 1;
    let pad = unpadded.next_multiple_of(64) - unpadded;
    let mut h = MAGIC.to_vec();
    h.extend_from_slice(&((dict.len() + pad + 1) as u16).to_le_bytes());
    h.extend_from_slice(dict.as_bytes());
    h.extend(std::iter::repeat_n(b' ', pad));
    h.push(b'\n');
    h
}

pub fn write(w: &mut impl Write, data: &[f32], rows: usize, cols: usize) -> io::Result<()> {
    assert_eq!(data.len(), rows * cols);
    w.write_all(&header(rows, cols))?;
    w.write_all(bytemuck::cast_slice(data))
}

/// Parses a 2-D `<f4` C-order array: `(rows, cols, values)`, or what is wrong with it.
pub fn read(bytes: &[u8]) -> Result<(usize, usize, Vec<f32>), String> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err("not a .npy file (bad magic)".into());
    }
    let (hlen, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10usize),
        2 | 3 if bytes.len() >= 12 => (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12),
        v => return Err(format!("unsupported .npy version {v}")),
    };
    let end = start.checked_add(hlen).filter(|&e| e <= bytes.len()).ok_or("truncated .npy header")?;
    let dict = std::str::from_utf8(&bytes[start..end]).map_err(|_| "header is not text")?;
    if !dict.contains("'descr': '<f4'") {
        return Err(format!("expected float32 ('<f4') data, header says {}", dict.trim()));
    }
    if !dict.contains("'fortran_order': False") {
        return Err("Fortran-order arrays are not supported".into());
    }
    let shape = dict
        .split("'shape':")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .map(|s| s.trim().trim_start_matches('('))
        .ok_or("header has no shape")?;
    let dims: Vec<usize> = shape
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|_| format!("bad shape ({shape})")))
        .collect::<Result<_, _>>()?;
    let [rows, cols] = dims[..] else { return Err(format!("expected a 2-D array, shape is ({shape})")) };
    let body = &bytes[end..];
    let want = rows.checked_mul(cols).and_then(|n| n.checked_mul(4)).ok_or("shape overflows")?;
    if body.len() != want {
        return Err(format!("holds {} data bytes, shape ({rows}, {cols}) needs {want}", body.len()));
    }
    Ok((rows, cols, body.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_trip_and_aligned_header() {
        for (r, c) in [(0, 384), (1, 1), (3, 7), (12345, 768)] {
            let data: Vec<f32> = (0..r * c).map(|i| i as f32 * 0.5 - 3.0).collect();
            let mut buf = Vec::new();
            super::write(&mut buf, &data, r, c).unwrap();
            assert_eq!(super::header(r, c).len() % 64, 0);
            assert_eq!(super::read(&buf).unwrap(), (r, c, data));
        }
        let mut buf = Vec::new();
        super::write(&mut buf, &[1.0, 2.0], 1, 2).unwrap();
        assert!(super::read(&buf[..buf.len() - 1]).unwrap_err().contains("data bytes"));
    }
}
