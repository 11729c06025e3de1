//! The built-in task: multi-digit addition written as text, byte-level tokens.
//!
//! `"482+039=1250\n"`: operands zero-padded to `digits`, the sum written with `digits + 1`
//! digits, least significant first (so the model emits the digit a carry lands in after the
//! carry itself — the order in which people add; Lee et al. 2023 show it learns far faster).
//! Only the answer is trained on. A tenth of all problems is held out by hash and never
//! appears in training; accuracy is exact match on held-out problems, decoded greedily.

use crate::tensor::loss::IGNORE;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[derive(Clone, Copy, Debug)]
pub struct Addition {
    pub digits: usize,
    /// Write the sum least significant digit first (the default; see the module note).
    pub reverse: bool,
}

impl Addition {
    /// Tokens in one problem including the trailing newline.
    pub fn seq_len(&self) -> usize {
        3 * self.digits + 4
    }
    /// Length of the prompt `"aaa+bbb="`.
    pub fn prompt_len(&self) -> usize {
        2 * self.digits + 2
    }
    fn limit(&self) -> u64 {
        10u64.pow(self.digits as u32)
    }

    /// Whether (a, b) belongs to the held-out tenth.
    pub fn held_out(&self, a: u64, b: u64) -> bool {
        let mut h = a.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ b.wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
        h ^= h >> 29;
        h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h ^= h >> 32;
        h.is_multiple_of(10)
    }

    pub fn prompt(&self, a: u64, b: u64) -> String {
        format!("{a:0w$}+{b:0w$}=", w = self.digits)
    }

    /// The answer as the model writes it (reversed digits, then a newline).
    pub fn answer(&self, a: u64, b: u64) -> String {
        let s = format!("{:0w$}", a + b, w = self.digits + 1);
        if self.reverse {
            s.chars().rev().chain(std::iter::once('\n')).collect()
        } else {
            s + "\n"
        }
    }

    /// Reads the model's answer text back into a number (None if malformed).
    pub fn parse_answer(&self, text: &str) -> Option<u64> {
        let body = text.strip_suffix('\n')?;
        let digits: String = if self.reverse { body.chars().rev().collect() } else { body.to_string() };
        if digits.len() != self.digits + 1 {
            return None;
        }
        digits.parse().ok()
    }

    fn draw(&self, rng: &mut ChaCha8Rng, held_out: bool) -> (u64, u64) {
        loop {
            let (a, b) = (rng.gen_range(0..self.limit()), rng.gen_range(0..self.limit()));
            if self.held_out(a, b) == held_out {
                return (a, b);
            }
        }
    }

    /// Training batch `step` of `b` problems: inputs `[b, seq_len-1]`, targets on the answer only.
    pub fn batch(&self, seed: u64, step: usize, b: usize) -> (Vec<u32>, Vec<i32>) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (step as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
        let t = self.seq_len() - 1;
        let (mut x, mut y) = (Vec::with_capacity(b * t), Vec::with_capacity(b * t));
        for _ in 0..b {
            let (a, c) = self.draw(&mut rng, false);
            let text = self.prompt(a, c) + &self.answer(a, c);
            let bytes = text.as_bytes();
            x.extend(bytes[..t].iter().map(|&v| v as u32));
            for (i, &v) in bytes[1..].iter().enumerate() {
                y.push(if i + 1 >= self.prompt_len() { v as i32 } else { IGNORE });
            }
        }
        (x, y)
    }

    /// `n` fixed held-out problems (the same for every run with this `digits`).
    pub fn eval_set(&self, n: usize) -> Vec<(u64, u64)> {
        let mut rng = ChaCha8Rng::seed_from_u64(0xe7a1);
        (0..n).map(|_| self.draw(&mut rng, true)).collect()
    }
}
