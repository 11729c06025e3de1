//! Running the `brigade` binary as a user does, shared by the CLI test files.
#![allow(dead_code)] // each test file uses its own subset

pub mod server;
pub mod stream;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

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

pub fn brigade(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_brigade")).args(args).current_dir(cwd).output().expect("runs")
}

pub fn ok(args: &[&str], cwd: &Path) -> Output {
    let out = brigade(args, cwd);
    assert!(out.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// A clean failure: non-zero exit, no panic, and a first error line that mentions `needle`.
/// Returns standard error.
pub fn fails_with(args: &[&str], cwd: &Path, needle: &str) -> String {
    let out = brigade(args, cwd);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{args:?} succeeded");
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    let line =
        err.lines().find(|l| l.starts_with("error")).unwrap_or_else(|| panic!("{args:?}: no error line in {err}"));
    assert!(line.contains(needle), "{args:?}: expected '{needle}' in: {line}");
    err
}

/// A child's standard error followed line by line as it comes (a thread reads it), so that a
/// test acts only once the child has said what it waits for.
pub struct Stderr {
    lines: std::sync::mpsc::Receiver<String>,
    seen: String,
}

impl Stderr {
    /// Takes `child`'s piped standard error.
    pub fn follow(child: &mut std::process::Child) -> Stderr {
        let (tx, lines) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().expect("standard error piped");
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Stderr { lines, seen: String::new() }
    }

    /// Reads lines until one contains `what`; panics with everything seen if none does within
    /// `limit` of the last line (or the child closed its standard error).
    pub fn wait_for(&mut self, what: &str, limit: std::time::Duration) {
        loop {
            match self.lines.recv_timeout(limit) {
                Ok(line) => {
                    self.seen.push_str(&line);
                    self.seen.push('\n');
                    if line.contains(what) {
                        return;
                    }
                }
                Err(e) => panic!("no line with {what:?} ({e}): {}", self.seen),
            }
        }
    }

    /// Everything the child wrote, once it has closed its standard error.
    pub fn all(mut self) -> String {
        for line in self.lines.iter() {
            self.seen.push_str(&line);
            self.seen.push('\n');
        }
        self.seen
    }
}
