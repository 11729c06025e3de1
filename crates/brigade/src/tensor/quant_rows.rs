//! A matrix's rows as a block-quantized file stores them (llama.cpp's GGUF types): each row of
//! `k` values in groups of `group` consecutive values, each group an integer per value, a
//! scale and, for the types with one, a minimum. The value is `q · s`, or `q · s + m` (two
//! roundings: the product, then the sum), which is exactly how the file's reference
//! dequantizes every type brigade reads — so a product over these rows in the quantized
//! kernels (`Packed::from_quant_rows`) computes bit for bit what the f32 kernel computes on
//! the dequantized matrix.
//!
//! The integers are kept as 4 or 8 bits: `bits == 4` holds `q` in −8..=7 without a minimum
//! (Q4_0's `nibble − 8`) or 0..=15 with one (Q4_1, Q4_K); `bits == 8` any i8 (Q8_0, the 5- and
//! 6-bit types).

/// Rows of a block-quantized matrix (row `r`: one output feature, its `k` inputs).
#[derive(Clone, Debug, PartialEq)]
pub struct QuantRows {
    pub rows: usize,
    pub k: usize,
    /// Consecutive values sharing a scale (and minimum); divides `k`.
    pub group: usize,
    /// 4 or 8: the width the integers fit.
    pub bits: u8,
    /// `[rows][k]`.
    pub q: Vec<i8>,
    /// `[rows][k / group]`.
    pub scales: Vec<f32>,
    /// `[rows][k / group]`, for the types with a minimum.
    pub mins: Option<Vec<f32>>,
}

impl QuantRows {
    pub fn groups(&self) -> usize {
        self.k / self.group
    }

    /// The value at row `r`, column `kk`, as the file's reference computes it.
    #[inline]
    pub fn value(&self, r: usize, kk: usize) -> f32 {
        let g = r * self.groups() + kk / self.group;
        let p = self.q[r * self.k + kk] as f32 * self.scales[g];
        match &self.mins {
            Some(m) => p + m[g],
            None => p,
        }
    }

    /// The matrix dequantized, `[rows][k]`.
    pub fn dequantized(&self) -> Vec<f32> {
        (0..self.rows).flat_map(|r| (0..self.k).map(move |kk| self.value(r, kk))).collect()
    }

    /// The rows `idx` in that order; `None` a row of zeros (a padded vocabulary's).
    pub fn select(&self, idx: &[Option<usize>]) -> QuantRows {
        let (k, gs) = (self.k, self.groups());
        let mut out = QuantRows {
            rows: idx.len(),
            k,
            group: self.group,
            bits: self.bits,
            q: vec![0; idx.len() * k],
            scales: vec![0.0; idx.len() * gs],
            mins: self.mins.as_ref().map(|_| vec![0.0; idx.len() * gs]),
        };
        for (i, r) in idx.iter().enumerate() {
            let Some(r) = *r else { continue };
            out.q[i * k..(i + 1) * k].copy_from_slice(&self.q[r * k..(r + 1) * k]);
            out.scales[i * gs..(i + 1) * gs].copy_from_slice(&self.scales[r * gs..(r + 1) * gs]);
            if let (Some(o), Some(m)) = (&mut out.mins, &self.mins) {
                o[i * gs..(i + 1) * gs].copy_from_slice(&m[r * gs..(r + 1) * gs]);
            }
        }
        out
    }

    /// The same values with groups of `group` (a divisor of this one's: each scale repeated).
    fn regrouped(self, group: usize) -> QuantRows {
        if group == self.group {
            return self;
        }
        assert!(self.group.is_multiple_of(group));
        let times = self.group / group;
        let spread = |v: &[f32]| v.iter().flat_map(|&x| std::iter::repeat_n(x, times)).collect::<Vec<f32>>();
        QuantRows { scales: spread(&self.scales), mins: self.mins.as_deref().map(spread), group, ..self }
    }

    /// Matrices reading the same input, their rows one after another (a fused q|k|v), in a
    /// form that holds each exactly: 8 bits if any is, the smallest group, minimums if any has
    /// them (a zero minimum adds nothing: `q · s + 0 = q · s`, but for −0 becoming +0, which
    /// an `fma` chain starting from +0 cannot tell apart). Four-bit rows with and without
    /// a minimum cannot share the 4-bit form (its integers mean different things): 8 bits then.
    pub fn concat(parts: Vec<QuantRows>) -> QuantRows {
        let k = parts[0].k;
        assert!(parts.iter().all(|p| p.k == k), "the parts read one input");
        let group = parts.iter().map(|p| p.group).min().expect("at least one part");
        let any_min = parts.iter().any(|p| p.mins.is_some());
        let mixed4 = any_min && parts.iter().any(|p| p.mins.is_none());
        let bits = if parts.iter().any(|p| p.bits == 8) || mixed4 { 8 } else { 4 };
        let mut out = QuantRows { rows: 0, k, group, bits, q: vec![], scales: vec![], mins: any_min.then(Vec::new) };
        for p in parts {
            let p = p.regrouped(group);
            out.rows += p.rows;
            out.q.extend_from_slice(&p.q);
            if let Some(m) = &mut out.mins {
                match &p.mins {
                    Some(pm) => m.extend_from_slice(pm),
                    None => m.extend(std::iter::repeat_n(0.0, p.scales.len())),
                }
            }
            out.scales.extend_from_slice(&p.scales);
        }
        out
    }
}
