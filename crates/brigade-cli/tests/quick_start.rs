//! The README's quick start, trained from scratch as a newcomer runs it: `brigade train` with
//! no arguments must end at 99% or more held-out accuracy on both matrix kernels (brigade's
//! AVX2 kernel, the default on AVX2 machines, and the `gemm` crate's, the default on AVX-512
//! ones), since their rounding once decided whether the recipe learned carries.
//! `scripts/quickstart_matrix.sh` runs the same over seeds 0–4.

use std::process::Command;

/// The held-out accuracy `brigade train` prints last, with the kernel `BRIGADE_MATMUL` names.
fn quick_start(kernel: &str) -> f64 {
    let d = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_brigade"))
        .args(["train", "--threads", "2"])
        .env("BRIGADE_MATMUL", kernel)
        .current_dir(d.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{kernel}: {}", String::from_utf8_lossy(&out.stderr));
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with("held-out accuracy "))
        .unwrap_or_else(|| panic!("{kernel}: no accuracy line in {text}"));
    line["held-out accuracy ".len()..].split('%').next().unwrap().parse().unwrap()
}

#[test]
fn the_quick_start_learns_addition_on_brigades_kernel() {
    let acc = quick_start("brigade");
    assert!(acc >= 99.0, "brigade kernel: the quick start ended at {acc}% held-out accuracy");
}

#[test]
fn the_quick_start_learns_addition_on_the_gemm_crates_kernel() {
    let acc = quick_start("gemm-crate");
    assert!(acc >= 99.0, "gemm-crate kernel: the quick start ended at {acc}% held-out accuracy");
}
