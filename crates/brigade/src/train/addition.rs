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
    /// The fraction of training problems drawn with carry chains (see [`Addition::batch`]).
    pub carry_chains: f32,
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

    /// A training problem with carry chains: each digit pair sums to 9 (passing on a carry
    /// that comes in) with probability one half, otherwise it is uniform. In uniform problems
    /// a pair sums to 9 one time in ten and a carry is passed on through a 9 in 9% of them
    /// (13% with a quarter of chained draws), a pattern a small model learns last.
    fn draw_chained(&self, rng: &mut ChaCha8Rng) -> (u64, u64) {
        loop {
            let (mut a, mut b, mut place) = (0, 0, 1);
            for _ in 0..self.digits {
                let x = rng.gen_range(0..10u64);
                let y = if rng.gen_bool(0.5) { 9 - x } else { rng.gen_range(0..10u64) };
                a += x * place;
                b += y * place;
                place *= 10;
            }
            if !self.held_out(a, b) {
                return (a, b);
            }
        }
    }

    /// Training batch `step` of `b` problems: inputs `[b, seq_len-1]`, targets on the answer
    /// only; a fraction `carry_chains` of them, spread evenly, is drawn with carry chains, the
    /// rest uniformly (the held-out tenth never appears).
    pub fn batch(&self, seed: u64, step: usize, b: usize) -> (Vec<u32>, Vec<i32>) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (step as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
        let t = self.seq_len() - 1;
        let (mut x, mut y) = (Vec::with_capacity(b * t), Vec::with_capacity(b * t));
        let f = self.carry_chains as f64;
        for i in 0..b {
            // spread evenly: a fraction f of every stretch of the batch
            let chained = ((i + 1) as f64 * f).floor() > (i as f64 * f).floor();
            let (a, c) = if chained { self.draw_chained(&mut rng) } else { self.draw(&mut rng, false) };
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The problems of a batch, read back from its inputs and targets.
    fn problems(task: &Addition, seed: u64, step: usize, b: usize) -> Vec<(u64, u64)> {
        let (x, y) = task.batch(seed, step, b);
        let t = task.seq_len() - 1;
        (0..b)
            .map(|i| {
                let row: String = x[i * t..(i + 1) * t].iter().map(|&v| v as u8 as char).collect();
                let (a, rest) = row.split_once('+').unwrap();
                let (b, _) = rest.split_once('=').unwrap();
                // the targets are the answer's tokens only
                let answer: String =
                    y[i * t..(i + 1) * t].iter().filter(|&&v| v != IGNORE).map(|&v| v as u8 as char).collect();
                let (a, b) = (a.parse().unwrap(), b.parse().unwrap());
                assert_eq!(answer, task.answer(a, b));
                (a, b)
            })
            .collect()
    }

    /// Whether a carry is passed on through a digit pair summing to 9.
    fn chained(digits: usize, a: u64, b: u64) -> bool {
        let (mut carry, mut chain) = (0, false);
        for i in 0..digits {
            let (x, y) = ((a / 10u64.pow(i as u32)) % 10, (b / 10u64.pow(i as u32)) % 10);
            chain |= carry == 1 && x + y == 9;
            carry = (x + y + carry) / 10;
        }
        chain
    }

    /// Digit pairs of a problem that sum to 9.
    fn nines(digits: usize, a: u64, b: u64) -> usize {
        (0..digits).filter(|&i| (a / 10u64.pow(i as u32)) % 10 + (b / 10u64.pow(i as u32)) % 10 == 9).count()
    }

    #[test]
    fn carry_chains_are_drawn_as_asked_and_never_held_out() {
        let task = Addition { digits: 3, reverse: true, carry_chains: 0.25 };
        let uniform = Addition { carry_chains: 0.0, ..task };
        let (mut chains, mut uniform_chains, mut pairs, mut uniform_pairs, mut n) = (0, 0, 0, 0, 0);
        for step in 0..200 {
            let got = problems(&task, 7, step, 64);
            let plain = problems(&uniform, 7, step, 64);
            assert!(got.iter().chain(&plain).all(|&(a, b)| !task.held_out(a, b) && a < 1000 && b < 1000));
            chains += got.iter().filter(|&&(a, b)| chained(3, a, b)).count();
            uniform_chains += plain.iter().filter(|&&(a, b)| chained(3, a, b)).count();
            pairs += got.iter().map(|&(a, b)| nines(3, a, b)).sum::<usize>();
            uniform_pairs += plain.iter().map(|&(a, b)| nines(3, a, b)).sum::<usize>();
            n += 64;
        }
        // a pair sums to 9 with probability 1/10 in a uniform problem, 1/2 + 1/20 in a chained
        // draw: a quarter of chained draws makes it 0.2125 (12,800 problems: ±0.004)
        let (p, u) = (pairs as f64 / (3 * n) as f64, uniform_pairs as f64 / (3 * n) as f64);
        assert!((0.09..0.11).contains(&u), "uniform pairs summing to 9: {u}");
        assert!((0.2025..0.2225).contains(&p), "with chains, pairs summing to 9: {p}");
        // a carry passed on through a 9: 9% of uniform problems, about 13% with the chains
        let (f, u) = (chains as f64 / n as f64, uniform_chains as f64 / n as f64);
        assert!((0.08..0.10).contains(&u), "uniform: {u}");
        assert!((0.115..0.145).contains(&f), "with chains {f}, uniform {u}");
    }

    #[test]
    fn no_carry_chains_draws_the_uniform_problems_of_before() {
        // the uniform draw is the one every earlier run used: the same seed, the same problems
        let task = Addition { digits: 3, reverse: true, carry_chains: 0.0 };
        let mut rng = ChaCha8Rng::seed_from_u64(7 ^ 3u64.wrapping_mul(0x2545_f491_4f6c_dd1d));
        let want: Vec<(u64, u64)> = (0..16).map(|_| task.draw(&mut rng, false)).collect();
        assert_eq!(problems(&task, 7, 3, 16), want);
    }

    /// An answer reads back as its sum, in both digit orders; one digit short or long, or
    /// without its newline, is no answer.
    #[test]
    fn answers_read_back_as_their_sums() {
        for reverse in [true, false] {
            let task = Addition { digits: 3, reverse, carry_chains: 0.25 };
            for (a, b) in [(0, 0), (999, 999), (123, 77), (500, 500)] {
                assert_eq!(task.parse_answer(&task.answer(a, b)), Some(a + b), "{a}+{b} reverse {reverse}");
            }
            for bad in ["123\n", "12345\n", "1234", "12a4\n"] {
                assert_eq!(task.parse_answer(bad), None, "{bad:?}");
            }
        }
    }
}
