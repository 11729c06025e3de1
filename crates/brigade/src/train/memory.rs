//! What a training run will hold in memory, computed before anything is allocated, so that a
//! run that cannot fit is refused with the figure instead of aborting halfway.

use crate::error::{Error, Result};
use crate::layout::CpComm;
use crate::models::GptConfig;

/// Bytes a single-worker run holds: f32 parameters, gradients, two AdamW moments, and the
/// activations of one micro-batch (what forward stashes for backward, plus backward's scratch).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoryNeed {
    pub params: u128,
    pub grads: u128,
    pub optimizer: u128,
    pub activations: u128,
}

impl MemoryNeed {
    pub fn total(&self) -> u128 {
        self.params + self.grads + self.optimizer + self.activations
    }
}

/// Counted from the buffers the model and trainer allocate (see `models::gpt::Activations`).
pub fn training_memory(cfg: &GptConfig, micro_batch: usize, seq: usize) -> MemoryNeed {
    training_memory_cp(cfg, micro_batch, seq, 1, CpComm::AllGather)
}

/// `training_memory` on one rank of a context group of `cp` splitting each sequence: the
/// rank's `seq / cp` rows of each, and in place of the attention probabilities each layer's
/// log-sum-exp per head and row and the keys and values the backward reads again (all-gather:
/// the whole sequence's; ring: the rank's own).
pub fn training_memory_cp(cfg: &GptConfig, micro_batch: usize, seq: usize, cp: usize, kind: CpComm) -> MemoryNeed {
    let (l, c, v, h) = (cfg.n_layer as u128, cfg.n_embd as u128, cfg.vocab_size as u128, cfg.n_head as u128);
    let p = cfg.num_params();
    let (b, t) = (micro_batch as u128, seq as u128);
    let n = b * t / cp as u128;
    let kvw = (cfg.kv_heads() * cfg.head_dim()) as u128;
    let attention = match (cp, kind) {
        (1, _) => b * h * t * t,
        (_, CpComm::AllGather) => h * n + 2 * b * t * kvw,
        (_, CpComm::Ring) => h * n + 2 * n * kvw,
    };
    // per block: input, ln_1 (out, mean, rstd), qkv, attention probabilities (or what context
    // parallelism keeps), attention output, x2, ln_2, MLP hidden before and after GELU
    let per_layer = 16 * n * c + 4 * n + attention;
    // ln_f input and output, logits, log-sum-exp, losses, backward scratch
    let head = 2 * n * c + n * v + 2 * n + 11 * n * c;
    MemoryNeed { params: 4 * p, grads: 4 * p, optimizer: 8 * p, activations: 4 * (l * per_layer + head) }
}

/// The longest sequence whose training step fits in `budget` bytes on one rank at micro-batch
/// `mb`, over a context group of `cp` (a multiple of its chunks, `chunks`: 2·cp zigzag, cp
/// contiguous; 1 for one worker), at most `cap`; `None` if not even the shortest fits. The
/// model's position table (GPT-2's) grows to the sequence where it is shorter.
pub fn longest_seq(
    cfg: &GptConfig,
    mb: usize,
    (cp, kind, chunks): (usize, CpComm, usize),
    budget: u128,
    cap: usize,
) -> Option<usize> {
    let fits = |k: usize| {
        let seq = k * chunks;
        let c = GptConfig { block_size: cfg.block_size.max(seq), ..*cfg };
        training_memory_cp(&c, mb, seq, cp, kind).total() <= budget
    };
    // the memory grows with the sequence: bisect on the number of chunks
    let (mut lo, mut hi) = (0usize, cap / chunks);
    if hi == 0 || !fits(1) {
        return None;
    }
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Some(lo * chunks)
}

/// Memory the system can give this process now (Linux `MemAvailable`), if known.
pub fn available_bytes() -> Option<u128> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u128 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

pub fn gib(bytes: u128) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// Refuses a run that needs more memory than the machine has available.
pub fn check_fits(need: &MemoryNeed, what: &str) -> Result<()> {
    let Some(avail) = available_bytes() else { return Ok(()) };
    if need.total() > avail {
        return Err(Error::Train(format!(
            "{what} needs {:.1} GiB (parameters {:.1}, gradients {:.1}, AdamW state {:.1}, activations {:.1}) but {:.1} GiB of memory is available; lower --micro-batch, --seq or the model size",
            gib(need.total()),
            gib(need.params),
            gib(need.grads),
            gib(need.optimizer),
            gib(need.activations),
            gib(avail)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::{Gpt, PRESETS};

    #[test]
    fn parameter_bytes_are_those_the_model_allocates() {
        for (name, cfg) in PRESETS {
            let need = training_memory(cfg, 1, 1);
            let real = Gpt::new(*cfg).unwrap().layout.total as u128;
            assert_eq!(need.params, 4 * real, "{name}");
            assert_eq!(need.optimizer, 8 * real, "{name}");
        }
    }
}
