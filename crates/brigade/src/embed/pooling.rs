//! sentence-transformers' Pooling and Normalize modules: token states → one vector.

use serde_json::Value;

/// One pooling mode; several may be on, and their outputs are concatenated in this order
/// (sentence-transformers' order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Cls,
    Max,
    Mean,
    MeanSqrtLen,
    WeightedMean,
    LastToken,
}

impl Mode {
    const ALL: [(Mode, &'static str); 6] = [
        (Mode::Cls, "pooling_mode_cls_token"),
        (Mode::Max, "pooling_mode_max_tokens"),
        (Mode::Mean, "pooling_mode_mean_tokens"),
        (Mode::MeanSqrtLen, "pooling_mode_mean_sqrt_len_tokens"),
        (Mode::WeightedMean, "pooling_mode_weightedmean_tokens"),
        (Mode::LastToken, "pooling_mode_lasttoken"),
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Cls => "cls",
            Mode::Max => "max",
            Mode::Mean => "mean",
            Mode::MeanSqrtLen => "mean_sqrt_len",
            Mode::WeightedMean => "weightedmean",
            Mode::LastToken => "lasttoken",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Pooling {
    pub modes: Vec<Mode>,
}

impl Pooling {
    pub fn mean() -> Pooling {
        Pooling { modes: vec![Mode::Mean] }
    }

    /// From `1_Pooling/config.json`; an unknown mode that is switched on is refused.
    pub fn from_json(v: &Value, hidden: usize) -> Result<Pooling, String> {
        let obj = v.as_object().ok_or("not a JSON object")?;
        let supported = || Mode::ALL.iter().map(|(_, k)| *k).collect::<Vec<_>>().join(", ");
        for (k, val) in obj {
            if k.starts_with("pooling_mode_") && val.as_bool() == Some(true) && !Mode::ALL.iter().any(|(_, n)| n == k) {
                return Err(format!("pooling mode '{k}' is not supported; supported: {}", supported()));
            }
        }
        if let Some(d) = obj.get("word_embedding_dimension").and_then(Value::as_u64) {
            if d as usize != hidden {
                return Err(format!("word_embedding_dimension {d} differs from the model's hidden_size {hidden}"));
            }
        }
        let modes: Vec<Mode> = Mode::ALL
            .iter()
            .filter(|(_, k)| obj.get(*k).and_then(Value::as_bool) == Some(true))
            .map(|(m, _)| *m)
            .collect();
        if modes.is_empty() {
            return Err(format!("no pooling mode is switched on; set one of {}", supported()));
        }
        Ok(Pooling { modes })
    }

    pub fn name(&self) -> String {
        self.modes.iter().map(|m| m.name()).collect::<Vec<_>>().join("+")
    }

    /// Output width for token states of width `c`.
    pub fn dim(&self, c: usize) -> usize {
        c * self.modes.len()
    }

    /// Pools one sequence's states `h[len, c]` into `out[dim]`.
    pub fn pool(&self, out: &mut [f32], h: &[f32], c: usize) {
        let len = h.len() / c;
        assert!(len > 0 && out.len() == self.dim(c));
        for (m, o) in self.modes.iter().zip(out.chunks_exact_mut(c)) {
            match m {
                Mode::Cls => o.copy_from_slice(&h[..c]),
                Mode::LastToken => o.copy_from_slice(&h[(len - 1) * c..]),
                Mode::Max => {
                    o.fill(f32::NEG_INFINITY);
                    for r in h.chunks_exact(c) {
                        o.iter_mut().zip(r).for_each(|(o, &v)| *o = o.max(v));
                    }
                }
                Mode::Mean | Mode::MeanSqrtLen | Mode::WeightedMean => {
                    o.fill(0.0);
                    let mut total = 0f32;
                    for (i, r) in h.chunks_exact(c).enumerate() {
                        let w = if *m == Mode::WeightedMean { (i + 1) as f32 } else { 1.0 };
                        o.iter_mut().zip(r).for_each(|(o, &v)| *o += w * v);
                        total += w;
                    }
                    let div = if *m == Mode::MeanSqrtLen { (len as f32).sqrt() } else { total };
                    o.iter_mut().for_each(|v| *v /= div);
                }
            }
        }
    }
}

/// `x / max(‖x‖₂, 1e-12)`, as torch's `F.normalize`.
pub fn normalize(x: &mut [f32]) {
    let n = x.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>().sqrt().max(1e-12) as f32;
    x.iter_mut().for_each(|v| *v /= n);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_pool_as_their_definitions() {
        let c = 2;
        let h = [1.0, -2.0, 3.0, 4.0, -5.0, 0.5];
        let all = Pooling { modes: Mode::ALL.iter().map(|(m, _)| *m).collect() };
        let mut out = vec![0f32; all.dim(c)];
        all.pool(&mut out, &h, c);
        let want = [
            1.0,
            -2.0, // cls
            3.0,
            4.0, // max
            -1.0 / 3.0,
            2.5 / 3.0, // mean
            -1.0 / 3f32.sqrt(),
            2.5 / 3f32.sqrt(), // mean_sqrt_len
            (1.0 + 6.0 - 15.0) / 6.0,
            (-2.0 + 8.0 + 1.5) / 6.0, // weighted by position 1, 2, 3
            -5.0,
            0.5, // last token
        ];
        for (g, w) in out.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{out:?}");
        }
    }

    #[test]
    fn unknown_or_missing_modes_are_refused() {
        let v = serde_json::json!({"pooling_mode_fancy_tokens": true, "pooling_mode_mean_tokens": true});
        assert!(Pooling::from_json(&v, 4).unwrap_err().contains("pooling_mode_fancy_tokens"));
        let v = serde_json::json!({"pooling_mode_mean_tokens": false});
        assert!(Pooling::from_json(&v, 4).unwrap_err().contains("no pooling mode"));
        let v = serde_json::json!({"pooling_mode_cls_token": true, "word_embedding_dimension": 8});
        assert!(Pooling::from_json(&v, 4).unwrap_err().contains("differs"));
    }
}
