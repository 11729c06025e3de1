//! Parameters of a model part in one flat buffer, each a named view into it.
//!
//! Gradients and optimizer moments use the same layout, so data-parallel buckets and
//! optimizer shards are plain slices, and a checkpoint is the list of named views.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use rayon::prelude::*;

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
}

#[derive(Clone, Debug, Default)]
pub struct ParamLayout {
    pub specs: Vec<ParamSpec>,
    pub total: usize,
}

impl ParamLayout {
    pub fn add(&mut self, name: &str, shape: &[usize], init: Init, decay: bool) -> View {
        let len = shape.iter().product();
        let view = View { offset: self.total, len };
        self.total += len;
        self.specs.push(ParamSpec { name: name.to_string(), shape: shape.to_vec(), view, init, decay });
        view
    }

    pub fn get(&self, name: &str) -> Option<&ParamSpec> {
        self.specs.iter().find(|s| s.name == name)
    }

    /// Draws every parameter from `seed` and its own name, so the value of a parameter does
    /// not depend on which others exist or on how the model is split across workers.
    pub fn init(&self, seed: u64) -> Vec<f32> {
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
