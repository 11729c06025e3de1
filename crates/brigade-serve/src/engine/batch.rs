//! What one step runs, as the scheduler decides it: a plain value, handed to the forward pass
//! (which tokens of which sequences, which block copies first) and then to `advance` (which
//! sequences get a token sampled).

/// One running sequence's share of a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scheduled {
    /// Its place in the running list.
    pub at: usize,
    pub id: u64,
    /// The position of its first token this step.
    pub start: usize,
    /// How many of its tokens run (1 for a decode; a prompt's chunk otherwise).
    pub tokens: usize,
    /// The chunk reaches its last token: the step returns its logits and a token is sampled.
    pub logits: bool,
}

/// A step: the sequences that run, in running order, and what the scheduler did to get there.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    pub seqs: Vec<Scheduled>,
    /// `(src, dst, slots)`: a branch's copy of its sibling's partial block, made before the
    /// forward pass.
    pub copies: Vec<(usize, usize, usize)>,
    /// Sequences preempted to free blocks (newest first); they wait first in line.
    pub preempted: Vec<u64>,
    /// Sequences taken from the queue into the running batch, in order.
    pub admitted: Vec<u64>,
}

impl Batch {
    /// Nothing to run this step.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// Tokens in the step's forward pass.
    pub fn tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.tokens).sum()
    }

    /// `(id, tokens)` of each sequence that runs, in order.
    pub fn plan(&self) -> Vec<(u64, usize)> {
        self.seqs.iter().map(|s| (s.id, s.tokens)).collect()
    }
}
