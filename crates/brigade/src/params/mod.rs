//! Parameters of a model part in one flat buffer, each a named view into it.
//!
//! Gradients and optimizer moments use the same layout, so data-parallel buckets and
//! optimizer shards are plain slices, and a checkpoint is the list of named views.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use rayon::prelude::*;

pub mod split;
pub use split::Split;

/// Where a parameter lives in the flat buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct View {
    pub offset: usize,
    pub len: usize,
}

impl View {
    pub fn of<'a>(&self, buf: &'a [f32]) -> &'a [f32] {
        &buf[self.offset..self.offset + self.len]
    }
    pub fn of_mut<'a>(&self, buf: &'a mut [f32]) -> &'a mut [f32] {
        &mut buf[self.offset..self.offset + self.len]
    }
}

/// How a parameter's full value is drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    Normal(f32),
    Zeros,
    Ones,
}

#[derive(Clone, Debug)]
pub struct ParamSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub view: View,
    pub init: Init,
    /// AdamW applies weight decay to matrices and embeddings, not to biases or LayerNorm.
    pub decay: bool,
    /// How this (local) tensor is cut from the full one across a tensor-parallel group.
    pub split: Split,
    /// The shape of the full tensor (equal to `shape` when replicated or on one rank).
    pub full_shape: Vec<usize>,
    /// A routed expert's tensor: under expert parallelism held only by the ranks holding that
    /// expert, its gradient summed over them alone.
    pub expert: bool,
}

#[derive(Clone, Debug, Default)]
pub struct ParamLayout {
    pub specs: Vec<ParamSpec>,
    pub total: usize,
}

impl ParamLayout {
    /// A parameter held whole (on every rank of a tensor-parallel group).
    pub fn add(&mut self, name: &str, shape: &[usize], init: Init, decay: bool) -> View {
        self.add_split(name, shape, Split::Replicated, 1, init, decay)
    }

    /// This rank's slice of the full tensor `full_shape`, cut by `split` over `tp` ranks.
    pub fn add_split(
        &mut self,
        name: &str,
        full_shape: &[usize],
        split: Split,
        tp: usize,
        init: Init,
        decay: bool,
    ) -> View {
        let shape = split.local_shape(full_shape, tp);
        let len = shape.iter().product();
        let view = View { offset: self.total, len };
        self.total += len;
        let (name, full_shape) = (name.to_string(), full_shape.to_vec());
        self.specs.push(ParamSpec { name, shape, view, init, decay, split, full_shape, expert: false });
        view
    }

    /// Appends `unit` (a layout whose offsets start at 0) after what this layout holds;
    /// returns where it lies.
    pub fn append(&mut self, unit: &ParamLayout) -> std::ops::Range<usize> {
        let base = self.total;
        for s in &unit.specs {
            let view = View { offset: base + s.view.offset, len: s.view.len };
            self.specs.push(ParamSpec { view, ..s.clone() });
        }
        self.total += unit.total;
        base..self.total
    }

    /// The layout of the full model this (perhaps sharded) layout is cut from.
    pub fn full(&self) -> ParamLayout {
        let mut l = ParamLayout::default();
        for s in &self.specs {
            l.add(&s.name, &s.full_shape, s.init, s.decay);
            l.specs.last_mut().expect("just added").expert = s.expert;
        }
        l
    }

    /// The same layout without the routed experts' tensors (`keep` false) or with only them.
    pub fn experts(&self, keep: bool) -> ParamLayout {
        ParamLayout { specs: self.specs.iter().filter(|s| s.expert == keep).cloned().collect(), total: self.total }
    }

    /// The ranges of the buffer that hold routed experts' tensors, adjacent ones merged.
    pub fn expert_ranges(&self) -> Vec<std::ops::Range<usize>> {
        let mut out: Vec<std::ops::Range<usize>> = Vec::new();
        for s in self.specs.iter().filter(|s| s.expert) {
            let r = s.view.offset..s.view.offset + s.view.len;
            match out.last_mut() {
                Some(last) if last.end == r.start => last.end = r.end,
                _ => out.push(r),
            }
        }
        out
    }

    /// Whether any parameter is cut across ranks (else the layout is the full model's).
    pub fn is_sharded(&self) -> bool {
        self.specs.iter().any(|s| s.shape != s.full_shape)
    }

    /// This layout's slice (tensor-parallel rank `rank` of `tp`) of a buffer in `self.full()`.
    pub fn slice_full(&self, full: &[f32], rank: usize, tp: usize) -> Vec<f32> {
        let mut out = vec![0f32; self.total];
        let mut at = 0;
        for s in &self.specs {
            let n = s.full_shape.iter().product::<usize>();
            s.split.slice(&full[at..at + n], &s.full_shape, rank, tp, s.view.of_mut(&mut out));
            at += n;
        }
        out
    }

    /// The full buffer from every rank's local buffer, concatenated in rank order (what an
    /// all-gather of the local buffers over the tensor-parallel group returns).
    pub fn assemble_full(&self, all: &[f32], tp: usize) -> Vec<f32> {
        assert_eq!(all.len(), self.total * tp, "one local buffer per rank");
        let full_total = self.specs.iter().map(|s| s.full_shape.iter().product::<usize>()).sum();
        let mut out = vec![0f32; full_total];
        let mut at = 0;
        for s in &self.specs {
            let n = s.full_shape.iter().product::<usize>();
            let pieces: Vec<&[f32]> = (0..tp).map(|r| s.view.of(&all[r * self.total..(r + 1) * self.total])).collect();
            s.split.assemble(&pieces, &s.full_shape, &mut out[at..at + n]);
            at += n;
        }
        out
    }

    pub fn get(&self, name: &str) -> Option<&ParamSpec> {
        self.specs.iter().find(|s| s.name == name)
    }

    /// Draws every parameter from `seed` and its own name, so the value of a parameter does
    /// not depend on which others exist or on how the model is split across workers: a
    /// sharded layout draws the full tensors and keeps its slice.
    pub fn init_shard(&self, seed: u64, rank: usize, tp: usize) -> Vec<f32> {
        if !self.is_sharded() {
            return self.init(seed);
        }
        self.slice_full(&self.full().init(seed), rank, tp)
    }

    /// `init_shard` of a layout that holds whole tensors.
    pub fn init(&self, seed: u64) -> Vec<f32> {
        assert!(!self.is_sharded(), "a sharded layout is drawn with init_shard");
        let mut buf = vec![0f32; self.total];
        let mut parts: Vec<(&ParamSpec, &mut [f32])> = Vec::new();
        let mut rest: &mut [f32] = &mut buf;
        for s in &self.specs {
            let (head, tail) = rest.split_at_mut(s.view.len);
            parts.push((s, head));
            rest = tail;
        }
        parts.into_par_iter().for_each(|(s, out)| match s.init {
            Init::Zeros => out.fill(0.0),
            Init::Ones => out.fill(1.0),
            Init::Normal(std) => {
                let mut rng = ChaCha8Rng::seed_from_u64(name_seed(seed, &s.name));
                let dist = Normal::new(0.0f32, std).expect("std is finite and positive");
                out.iter_mut().for_each(|v| *v = dist.sample(&mut rng));
            }
        });
        buf
    }
}

/// FNV-1a of the name mixed with the run seed.
pub fn name_seed(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for b in name.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}
