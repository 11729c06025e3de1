//! The models the serving tests run: one of each family, with weights larger than the
//! init's so that logits are far from uniform and ties are rare.
#![allow(dead_code)]

use brigade::models::{Gpt, GptConfig};
use std::path::{Path, PathBuf};

/// The families the engine serves, each with the small model its tests run
/// (`Family::example`: every part of the family).
pub use brigade::models::family::Family;

pub const FAMILIES: [Family; Family::ALL.len()] = Family::ALL;

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
            panic!("{}: {}", f.name(), msg.unwrap_or("(a panic without a message)"));
        }
    }
}
