//! Helpers shared by the library's test files.
#![allow(dead_code)] // each test file uses its own subset

use std::path::{Path, PathBuf};

pub mod fixture;

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

/// Runs `check` on every model family (`Family::ALL`) in turn; a failure names its family.
pub fn for_each_family(mut check: impl FnMut(brigade::models::family::Family)) {
    for f in brigade::models::family::Family::ALL {
        if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(f))) {
            let msg = e.downcast_ref::<String>().map(String::as_str).or_else(|| e.downcast_ref::<&str>().copied());
            panic!("{}: {}", f.name(), msg.unwrap_or("(a panic without a message)"));
        }
    }
}
