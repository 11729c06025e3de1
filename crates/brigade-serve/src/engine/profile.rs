//! The engine's step times measured on its own model and threads, and what a program's
//! `max_parallel: auto` reads from them: how many branches ride along before the running
//! batch's steps slow by more than a fifth.

/// Step times measured on the engine's own model and threads.
#[derive(Clone, Debug, PartialEq)]
pub struct StepProfile {
    /// `(b, seconds)`: a decode step of b sequences, b = 1, 2, 4, … up to the running limit.
    pub decode: Vec<(usize, f64)>,
    /// Seconds per token of a 64-token prompt chunk.
    pub prefill_per_token: f64,
}

impl StepProfile {
    /// The widest measured batch whose decode step costs at most 1.5× one sequence's: up to
    /// there the step is still bound by reading the weights.
    pub fn knee(&self) -> usize {
        let one = self.decode_one();
        self.decode.iter().filter(|d| d.1 <= 1.5 * one).map(|d| d.0).max().unwrap_or(1)
    }

    /// A decode step's seconds for a batch of 1.
    pub fn decode_one(&self) -> f64 {
        self.decode.first().map_or(0.0, |d| d.1)
    }

    /// A decode step's seconds at batch `b`: the measured points joined by straight lines,
    /// the last two's line past them.
    pub fn step_at(&self, b: f64) -> f64 {
        let d = &self.decode;
        match d.len() {
            0 => 0.0,
            1 => d[0].1 * b.max(1.0),
            _ => {
                let k = d.windows(2).position(|w| b <= w[1].0 as f64).unwrap_or(d.len() - 2);
                let ((b0, t0), (b1, t1)) = (d[k], d[k + 1]);
                t0 + (t1 - t0) * (b - b0 as f64) / (b1 - b0) as f64
            }
        }
        .max(0.0)
    }

    /// How many more sequences a program may add beside `busy` others, at most `max`: with
    /// nothing else running, as many as still raise the step's throughput (tokens a second,
    /// the measured batches); beside others, as many as keep their step — their inter-token
    /// latency — within 20% of what it is without them: the branches ride on a step that is
    /// still bound by reading the weights.
    pub fn width(&self, busy: usize, max: usize) -> usize {
        let max = max.max(1);
        if self.decode.len() < 2 {
            return max;
        }
        if busy == 0 {
            let best =
                self.decode.iter().max_by(|a, b| (a.0 as f64 / a.1).total_cmp(&(b.0 as f64 / b.1))).map_or(1, |d| d.0);
            return best.min(max);
        }
        let base = self.step_at(busy as f64);
        let mut w = 1;
        while w < max && self.step_at((busy + w + 1) as f64) <= 1.2 * base {
            w += 1;
        }
        w
    }
}

#[cfg(test)]
mod tests {
    use super::StepProfile;

    /// The step times measured on this machine's gpt2-small (2 threads): flat to 4, then
    /// about 1.4 ms a sequence.
    fn measured() -> StepProfile {
        let decode = vec![(1, 0.0139), (2, 0.0174), (4, 0.0179), (8, 0.0252), (16, 0.0347), (32, 0.0573), (64, 0.0999)];
        StepProfile { decode, prefill_per_token: 0.001 }
    }

    #[test]
    fn the_step_between_and_past_the_measured_batches_is_a_straight_line() {
        let p = measured();
        assert!((p.step_at(16.0) - 0.0347).abs() < 1e-12);
        assert!((p.step_at(24.0) - (0.0347 + 0.0573) / 2.0).abs() < 1e-12);
        assert!((p.step_at(96.0) - (0.0999 + (0.0999 - 0.0573))).abs() < 1e-12);
        assert_eq!(p.knee(), 4);
    }

    #[test]
    fn auto_width_fills_an_idle_engine_and_spares_a_busy_one() {
        let p = measured();
        // alone: the batch of best throughput (64 here), capped by the running limit
        assert_eq!(p.width(0, 128), 64);
        assert_eq!(p.width(0, 16), 16);
        // beside 16 others: t(16 + w) ≤ 1.2 t(16) = 41.6 ms, 1.41 ms a sequence past 16 → 4
        assert_eq!(p.width(16, 128), 4);
        assert!(p.step_at(16.0 + 4.0) <= 1.2 * p.step_at(16.0));
        assert!(p.step_at(16.0 + 5.0) > 1.2 * p.step_at(16.0));
        // beside 2 others: the flat part of the curve (2 to 4, then 1.8 ms a sequence) is free:
        // t(5) = 19.7 ms ≤ 1.2 × 17.4, t(6) = 21.5 ms is not
        assert_eq!(p.width(2, 128), 3);
        // never above the limit, never below one
        assert_eq!(p.width(2, 2), 2);
        let steep = StepProfile { decode: vec![(1, 0.01), (2, 0.03)], prefill_per_token: 0.0 };
        assert_eq!(steep.width(1, 64), 1);
    }
}
