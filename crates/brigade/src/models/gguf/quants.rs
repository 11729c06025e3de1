//! GGUF's tensor types (ggml's `ggml_type`): how many values a block holds, its bytes, and its
//! values back as f32 — each type's dequantization as llama.cpp's `dequantize_row_*` and
//! gguf-py's `dequantize_blocks` write it, in the same f32 operations and order, so the values
//! are bit for bit theirs. The writer encodes F32, F16, Q8_0 and Q4_0 (`encode`), as
//! llama.cpp's reference quantizers do.

use crate::tensor::quant_rows::QuantRows;
pub use crate::tensor::rowwise_int4::q4_0_block;
use half::{bf16, f16};

/// Values per block of the k-quants.
pub const QK_K: usize = 256;

/// A tensor's element type, with its GGUF number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)] // ggml's names
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4_K,
    Q5_K,
    Q6_K,
}

/// The types read, as their names (for a message naming what is supported).
pub const SUPPORTED: &str = "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K";

impl GgmlType {
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
            GgmlType::BF16 => 30,
        }
    }

    /// The type numbered `id`, or its ggml name when it is one brigade does not read.
    pub fn from_id(id: u32) -> Result<GgmlType, String> {
        const ALL: [GgmlType; 11] = [
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::BF16,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ];
        if let Some(t) = ALL.into_iter().find(|t| t.id() == id) {
            return Ok(t);
        }
        // ggml's other numbers (ggml.h), so that a refusal names the type
        let name = match id {
            4 | 5 => "Q4_2/Q4_3 (removed from ggml)",
            9 => "Q8_1",
            10 => "Q2_K",
            11 => "Q3_K",
            15 => "Q8_K",
            16 => "IQ2_XXS",
            17 => "IQ2_XS",
            18 => "IQ3_XXS",
            19 => "IQ1_S",
            20 => "IQ4_NL",
            21 => "IQ3_S",
            22 => "IQ2_S",
            23 => "IQ4_XS",
            24 => "I8",
            25 => "I16",
            26 => "I32",
            27 => "I64",
            28 => "F64",
            29 => "IQ1_M",
            34 => "TQ1_0",
            35 => "TQ2_0",
            39 => "MXFP4",
            _ => "unknown",
        };
        Err(format!("tensor type {id} ({name})"))
    }

    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::BF16 => "BF16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q4_K => "Q4_K",
            GgmlType::Q5_K => "Q5_K",
            GgmlType::Q6_K => "Q6_K",
        }
    }

    /// (values, bytes) of one block.
    pub fn block(self) -> (usize, usize) {
        match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::BF16 => (1, 2),
            GgmlType::Q4_0 => (32, 18),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q5_0 => (32, 22),
            GgmlType::Q5_1 => (32, 24),
            GgmlType::Q8_0 => (32, 34),
            GgmlType::Q4_K => (QK_K, 144),
            GgmlType::Q5_K => (QK_K, 176),
            GgmlType::Q6_K => (QK_K, 210),
        }
    }

    /// Bytes of `n` values (`n` a whole number of blocks).
    pub fn bytes(self, n: usize) -> usize {
        let (v, b) = self.block();
        n / v * b
    }

    /// The values encoded as this type, as llama.cpp's reference quantizers
    /// (`quantize_row_*_ref`) encode them; the writer's types only (F32, F16; Q8_0, Q4_0 and
    /// Q5_0 with `x.len()` a multiple of 32; Q4_K with a multiple of 256).
    pub fn encode(self, x: &[f32]) -> Vec<u8> {
        match self {
            GgmlType::F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
            GgmlType::F16 => x.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect(),
            GgmlType::Q8_0 => {
                assert!(x.len().is_multiple_of(32), "Q8_0 takes whole blocks of 32");
                let mut out = Vec::with_capacity(self.bytes(x.len()));
                for b in x.chunks_exact(32) {
                    let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let d = amax / 127.0;
                    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                    out.extend(b.iter().map(|&v| (v * id).round() as i8 as u8));
                }
                out
            }
            GgmlType::Q4_0 => {
                assert!(x.len().is_multiple_of(32), "Q4_0 takes whole blocks of 32");
                let mut out = Vec::with_capacity(self.bytes(x.len()));
                for b in x.chunks_exact(32) {
                    let (d, q) = q4_0_block(b);
                    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                    out.extend((0..16).map(|j| q[j] | q[j + 16] << 4));
                }
                out
            }
            GgmlType::Q5_0 => {
                assert!(x.len().is_multiple_of(32), "Q5_0 takes whole blocks of 32");
                let mut out = Vec::with_capacity(self.bytes(x.len()));
                x.chunks_exact(32).for_each(|b| q5_0_block(b, &mut out));
                out
            }
            GgmlType::Q4_K => {
                assert!(x.len().is_multiple_of(QK_K), "Q4_K takes whole blocks of 256");
                let mut out = Vec::with_capacity(self.bytes(x.len()));
                x.chunks_exact(QK_K).for_each(|b| q4_k_block(b, &mut out));
                out
            }
            other => panic!("the GGUF writer does not encode {}", other.name()),
        }
    }

    /// `data`'s values (whole blocks) as f32, appended to `out`: the float types converted,
    /// the block types as their `quant_rows` give them.
    pub fn dequantize_into(self, data: &[u8], out: &mut Vec<f32>) {
        let (per, bb) = self.block();
        debug_assert!(data.len().is_multiple_of(bb));
        let n = data.len() / bb * per;
        if let Some(q) = self.quant_rows(data, 1, n) {
            out.extend(q.dequantized());
            return;
        }
        for b in data.chunks_exact(bb) {
            out.push(match self {
                GgmlType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                GgmlType::F16 => f16::from_le_bytes([b[0], b[1]]).to_f32(),
                GgmlType::BF16 => bf16::from_le_bytes([b[0], b[1]]).to_f32(),
                _ => unreachable!("the block types return above"),
            });
        }
    }

    /// A `[rows, k]` tensor's blocks as `QuantRows` (integers, scales, minimums) whose values
    /// are bit for bit those of gguf-py's reference dequantization (`tests/gguf_read.rs`): Q4_0 and Q4_1 as 4-bit groups of 32, Q4_K's
    /// sub-blocks as 4-bit groups of 32 with a minimum (`d·sc`, `−(dmin·m)`), Q8_0 and the
    /// 5-bit types as 8-bit groups of 32, Q6_K as 8-bit groups of 16 (`d·sc`). `None` for the
    /// float types (held as f32).
    pub fn quant_rows(self, data: &[u8], rows: usize, k: usize) -> Option<QuantRows> {
        let (bits, group, has_min) = match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => return None,
            GgmlType::Q4_0 => (4, 32, false),
            GgmlType::Q4_1 | GgmlType::Q4_K => (4, 32, true),
            GgmlType::Q8_0 | GgmlType::Q5_0 => (8, 32, false),
            GgmlType::Q5_1 | GgmlType::Q5_K => (8, 32, true),
            GgmlType::Q6_K => (8, 16, false),
        };
        let (per, bb) = self.block();
        assert!(k.is_multiple_of(per) && data.len() == rows * k / per * bb, "whole blocks of a [rows, k] tensor");
        let n = rows * k;
        let mut out = QuantRows {
            rows,
            k,
            group,
            bits,
            q: Vec::with_capacity(n),
            scales: Vec::with_capacity(n / group),
            mins: has_min.then(|| Vec::with_capacity(n / group)),
        };
        let h = |b: &[u8], at: usize| f16::from_le_bytes([b[at], b[at + 1]]).to_f32();
        let fifth = |qh: u32, j: usize| ((qh >> j) & 1) as u8;
        for b in data.chunks_exact(bb) {
            match self {
                GgmlType::Q8_0 => {
                    out.scales.push(h(b, 0));
                    out.q.extend(b[2..34].iter().map(|&q| q as i8));
                }
                GgmlType::Q4_0 | GgmlType::Q4_1 => {
                    let at = if self == GgmlType::Q4_0 { 2 } else { 4 };
                    let off = if self == GgmlType::Q4_0 { 8 } else { 0 };
                    out.scales.push(h(b, 0));
                    if let Some(m) = &mut out.mins {
                        m.push(h(b, 2));
                    }
                    let qs = &b[at..at + 16];
                    out.q.extend(qs.iter().map(|&q| (q & 0x0F) as i8 - off));
                    out.q.extend(qs.iter().map(|&q| (q >> 4) as i8 - off));
                }
                GgmlType::Q5_0 | GgmlType::Q5_1 => {
                    let at = if self == GgmlType::Q5_0 { 2 } else { 4 };
                    let off = if self == GgmlType::Q5_0 { 16 } else { 0 };
                    out.scales.push(h(b, 0));
                    if let Some(m) = &mut out.mins {
                        m.push(h(b, 2));
                    }
                    let qh = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
                    let qs = &b[at + 4..at + 20];
                    for half in 0..2 {
                        for (j, &q) in qs.iter().enumerate() {
                            let lo = if half == 0 { q & 0x0F } else { q >> 4 };
                            out.q.push((lo | fifth(qh, j + 16 * half) << 4) as i8 - off);
                        }
                    }
                }
                GgmlType::Q4_K | GgmlType::Q5_K => {
                    let (d, dmin, scales) = (h(b, 0), h(b, 2), &b[4..16]);
                    let (qh, qs) =
                        if self == GgmlType::Q5_K { (Some(&b[16..48]), &b[48..176]) } else { (None, &b[16..144]) };
                    for g in 0..4 {
                        let q = &qs[32 * g..32 * g + 32];
                        for (j, shift) in [(2 * g, 0u8), (2 * g + 1, 4u8)] {
                            let (sc, mn) = scale_min_k4(j, scales);
                            out.scales.push(d * sc as f32);
                            // `d1·v − m1` is `d1·v + (−m1)`, bit for bit
                            out.mins.as_mut().expect("k-quants have minimums").push(-(dmin * mn as f32));
                            for (l, &ql) in q.iter().enumerate() {
                                let mut v = (ql >> shift) & 0x0F;
                                if let Some(qh) = qh {
                                    v |= ((qh[l] >> j) & 1) << 4;
                                }
                                out.q.push(v as i8);
                            }
                        }
                    }
                }
                GgmlType::Q6_K => {
                    let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
                    let d = h(b, 208);
                    for n in 0..2 {
                        let (ql, qh, sc) = (&ql[64 * n..], &qh[32 * n..], &sc[8 * n..]);
                        for run in 0..4 {
                            let (lo_at, shift) = ([0, 32, 0, 32][run], [0, 0, 4, 4][run]);
                            for half in 0..2 {
                                // `d · s · q` is `(d · s) · q`: the scale of a group of 16
                                out.scales.push(d * sc[2 * run + half] as i8 as f32);
                                for l in 16 * half..16 * half + 16 {
                                    let lo = (ql[lo_at + l] >> shift) & 0x0F;
                                    let hi = (qh[l] >> (2 * run)) & 3;
                                    out.q.push((lo | hi << 4) as i8 - 32);
                                }
                            }
                        }
                    }
                }
                GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => unreachable!("float types return above"),
            }
        }
        Some(out)
    }
}

/// llama.cpp's `nearest_int`: round to nearest, ties to even (its `+ 1.5·2²³` trick).
fn nearest_int(v: f32) -> i32 {
    v.round_ties_even() as i32
}

/// One Q5_0 block (`quantize_row_q5_0_ref`): the scale `max / −16` of the value largest in
/// magnitude, then `min(31, trunc(x / d + 16.5))` split into four low bits and a fifth.
fn q5_0_block(x: &[f32], out: &mut Vec<u8>) {
    let d = crate::tensor::rowwise_int4::signed_absmax(x) / -16.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
    let q: Vec<u8> = x.iter().map(|&v| ((v * id + 16.5) as i8).min(31) as u8).collect();
    let qh = (0..32).fold(0u32, |h, j| h | (((q[j] & 0x10) >> 4) as u32) << j);
    out.extend_from_slice(&qh.to_le_bytes());
    out.extend((0..16).map(|j| (q[j] & 0x0F) | (q[j + 16] & 0x0F) << 4));
}

/// llama.cpp's `make_qkx2_quants` for `nmax` levels with a minimum: a scale and a minimum
/// (returned as the positive amount subtracted) for the weighted least-squares fit of `x`,
/// searched over `nstep + 1` trial scales; the levels in `l`.
fn make_qkx2_quants(nmax: i32, x: &[f32], w: &[f32], l: &mut [u8], rmin: f32, rdelta: f32, nstep: i32) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let (mut sum_w, mut sum_x) = (w[0], w[0] * x[0]);
    for i in 1..n {
        min = min.min(x[i]);
        max = max.max(x[i]);
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.iter_mut().for_each(|v| *v = 0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best = 0f32;
    for i in 0..n {
        l[i] = nearest_int(iscale * (x[i] - min)).clamp(0, nmax) as u8;
        let diff = scale * l[i] as f32 + min - x[i];
        best += w[i] * (diff * diff);
    }
    let mut aux = vec![0u8; n];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let li = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            aux[i] = li as u8;
            let lf = li as f32;
            sum_l += w[i] * lf;
            sum_l2 += w[i] * lf * lf;
            sum_xl += w[i] * lf * x[i];
        }
        let dd = sum_w * sum_l2 - sum_l * sum_l;
        if dd > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / dd;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / dd;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur = 0f32;
            for i in 0..n {
                let diff = this_scale * aux[i] as f32 + this_min - x[i];
                cur += w[i] * (diff * diff);
            }
            if cur < best {
                l.copy_from_slice(&aux);
                best = cur;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// One Q4_K block of 256 (`quantize_row_q4_K_ref`): eight sub-blocks of 32, each fitted with a
/// scale and a minimum (weights `rms + |x|`), those quantized to 6 bits against the block's
/// f16 `d` and `dmin`, then every value's level recomputed against its sub-block's stored pair.
fn q4_k_block(x: &[f32], out: &mut Vec<u8>) {
    let mut l = [0u8; QK_K];
    let (mut scales, mut mins) = ([0f32; 8], [0f32; 8]);
    let mut w = [0f32; 32];
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let sum_x2 = xs.iter().fold(0f32, |s, v| s + v * v);
        let av_x = (sum_x2 / 32.0).sqrt();
        for (wi, v) in w.iter_mut().zip(xs) {
            *wi = av_x + v.abs();
        }
        (scales[j], mins[j]) = make_qkx2_quants(15, xs, &w, &mut l[32 * j..32 * j + 32], -1.0, 0.1, 20);
    }
    let max_scale = scales.iter().fold(0f32, |m, &s| if s > m { s } else { m });
    let max_min = mins.iter().fold(0f32, |m, &s| if s > m { s } else { m });
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; 12];
    for j in 0..8 {
        // C's `uint8_t ls = nearest_int(…)` keeps the low byte
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0x0F) | ((lm & 0x0F) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let d = f16::from_f32(max_scale / 63.0);
    let dmin = f16::from_f32(max_min / 63.0);
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &packed);
        let dj = d.to_f32() * sc as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * m as f32;
        for i in 32 * j..32 * j + 32 {
            l[i] = nearest_int((x[i] + dm) / dj).clamp(0, 15) as u8;
        }
    }
    out.extend_from_slice(&d.to_le_bytes());
    out.extend_from_slice(&dmin.to_le_bytes());
    out.extend_from_slice(&packed);
    for g in l.chunks_exact(64) {
        out.extend((0..32).map(|i| g[i] | g[i + 32] << 4));
    }
}

/// Scale and minimum `j` (0..8) of a k-quant block's 12 packed bytes (llama.cpp's
/// `get_scale_min_k4`).
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Q8_0 against its definition written out: scale max|x| / 127 (as f16), values rounded.
    #[test]
    fn q8_0_blocks_are_llama_cpps() {
        let x: Vec<f32> = (0..64).map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.173).collect();
        let enc = GgmlType::Q8_0.encode(&x);
        assert_eq!(enc.len(), 2 * 34);
        for (b, blk) in x.chunks(32).zip(enc.chunks(34)) {
            let amax = b.iter().map(|v| v.abs()).fold(0.0, f32::max);
            let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
            assert!((d - amax / 127.0).abs() <= 1e-3 * amax / 127.0);
            for (v, &q) in b.iter().zip(&blk[2..]) {
                let want = (v * 127.0 / amax).round() as i8;
                assert!((q as i8 - want).abs() <= 1, "{v}: {} vs {want}", q as i8);
                // dequantized within half a step
                assert!((q as i8 as f32 * d - v).abs() <= 0.51 * d + 1e-3 * amax);
            }
        }
        // an all-zero block has scale 0 and zero values (no division by zero)
        assert!(GgmlType::Q8_0.encode(&[0.0; 32]).iter().all(|&b| b == 0));
        let mut back = Vec::new();
        GgmlType::Q8_0.dequantize_into(&enc, &mut back);
        assert!(back.iter().zip(&x).all(|(a, b)| (a - b).abs() < 0.02));
    }

    #[test]
    fn types_round_trip_their_numbers_and_name_the_others() {
        for id in 0..64 {
            if let Ok(t) = GgmlType::from_id(id) {
                assert_eq!(t.id(), id);
            }
        }
        assert_eq!(GgmlType::from_id(11).unwrap_err(), "tensor type 11 (Q3_K)");
        assert_eq!(GgmlType::Q6_K.bytes(512), 420);
    }
}
