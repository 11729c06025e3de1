//! The models the serving tests run: one of each family, with weights larger than the
//! init's so that logits are far from uniform and ties are rare.
#![allow(dead_code)]

use brigade::models::{Gpt, GptConfig};
use std::path::{Path, PathBuf};

/// The families the engine serves, each with the small model its tests run
/// (`Family::example`: every part of the family), and the Llama family's example with a
/// mixture of experts (`llama::MOE_EXAMPLE`: a dense first layer, then 4 experts, 2 a token, and
/// a shared expert).
pub use brigade::models::family::Family;

pub const FAMILIES: [Family; Family::ALL.len() + 1] = [Family::ALL[0], Family::ALL[1], Family::Llama(MOE)];

const MOE: brigade::models::family::Llama = brigade::models::family::Llama {
    moe: Some(brigade::models::family::llama::MOE_EXAMPLE),
    ..brigade::models::family::llama::EXAMPLE
};

pub fn config(f: Family, vocab: usize, context: usize) -> GptConfig {
    GptConfig::example(f, vocab, context)
}

/// A model of family `f` and its parameters (drawn from `seed`, scaled by 4).
pub fn model(f: Family, vocab: usize, context: usize, seed: u64) -> (Gpt, Vec<f32>) {
    let gpt = Gpt::new(config(f, vocab, context)).unwrap();
    let mut p = gpt.init_params(seed);
    p.iter_mut().for_each(|v| *v *= 4.0);
    (gpt, p)
}

/// `../shared/REL` (beside the checkout), or `None` with a printed reason when it is absent;
/// under `BRIGADE_REQUIRE_SHARED` (CI) its absence fails the test instead.
pub fn shared(rel: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared").join(rel);
    if p.exists() {
        return Some(p);
    }
    assert!(
        std::env::var_os("BRIGADE_REQUIRE_SHARED").is_none(),
        "{} not found and BRIGADE_REQUIRE_SHARED is set",
        p.display()
    );
    eprintln!("skipping: {} is absent", p.display());
    None
}

/// Runs `check` on every family in turn; a failure names its family.
pub fn for_each_family(mut check: impl FnMut(Family)) {
    for f in FAMILIES {
        if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(f))) {
            let msg = e.downcast_ref::<String>().map(String::as_str).or_else(|| e.downcast_ref::<&str>().copied());
            let moe = if f.describe().experts_in(0).is_some() { " (mixture of experts)" } else { "" };
            panic!("{}{moe}: {}", f.name(), msg.unwrap_or("(a panic without a message)"));
        }
    }
}

/// The engine workload the parallel tests run on one worker and on ranks: six requests of 3 to
/// 28 prompt tokens (greedy and sampled), then three branches sharing request 5's prompt (its
/// partial block copied on every rank), stepped to the end.
pub fn drive(e: &mut brigade_serve::engine::Engine) -> Vec<brigade_serve::engine::Output> {
    use brigade_serve::engine::{Admit, Request, Sampling};
    let requests: Vec<Request> = (0..6u64)
        .map(|j| Request {
            id: j,
            prompt: (0..(3 + j * 5)).map(|i| ((i * 11 + j * 3) % 101) as u32).collect(),
            sampling: Sampling {
                repetition_penalty: 1.0,
                temperature: if j % 2 == 0 { 0.0 } else { 0.9 },
                top_k: 0,
                top_p: 1.0,
                seed: j,
                max_tokens: 20,
                stop_tokens: vec![],
                top_logprobs: 2,
            },
        })
        .collect();
    for r in &requests {
        e.add(r.clone()).unwrap();
    }
    for k in 0..3u64 {
        let mut r = requests[5].clone();
        r.id = 10 + k;
        r.sampling.seed = 100 + k;
        e.add_with(r, Admit { follows: Some(5), ..Default::default() }).unwrap();
    }
    let mut out = Vec::new();
    while e.has_work() {
        out.extend(e.step());
    }
    out
}

/// The parallel tests' model workload: three sequences over three steps on blocks of 4 tokens
/// numbered 0… (whole prompts, then a chunk beside decodes, then decodes) — under cp 2 or 3 every
/// sequence's blocks fall on every rank in turn, and sequence c's two blocks (7, 8) on no block
/// of rank 0 at cp 3. The logits of every item that asks for them, in order.
pub fn steps(model: &brigade_serve::model::Model, kv: &mut brigade_serve::model::KvStore) -> Vec<Vec<f32>> {
    let a: Vec<u32> = (0..9).map(|i| (i * 7 + 1) % 101).collect();
    let b: Vec<u32> = (0..14).map(|i| (i * 13 + 2) % 101).collect();
    let c: Vec<u32> = (0..5).map(|i| (i * 3 + 50) % 101).collect();
    let (ba, bb, bc) = (vec![0, 1, 2], vec![3, 4, 5, 6], vec![7, 8]);
    let mut out = Vec::new();
    out.extend(model.step(
        kv,
        &[
            brigade_serve::model::Work { tokens: &a, start: 0, blocks: &ba, logits: true },
            brigade_serve::model::Work { tokens: &b[..6], start: 0, blocks: &bb, logits: false },
        ],
    ));
    out.extend(model.step(
        kv,
        &[
            brigade_serve::model::Work { tokens: &[3], start: 9, blocks: &ba, logits: true },
            brigade_serve::model::Work { tokens: &b[6..], start: 6, blocks: &bb, logits: true },
            brigade_serve::model::Work { tokens: &c, start: 0, blocks: &bc, logits: true },
        ],
    ));
    out.extend(model.step(
        kv,
        &[
            brigade_serve::model::Work { tokens: &[4], start: 10, blocks: &ba, logits: true },
            brigade_serve::model::Work { tokens: &[5], start: 14, blocks: &bb, logits: true },
            brigade_serve::model::Work { tokens: &[6], start: 5, blocks: &bc, logits: true },
        ],
    ));
    out
}
