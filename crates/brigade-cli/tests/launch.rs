//! `brigade launch`: a job whose rank is killed at a planted point finishes under the
//! supervisor with final weights and moments bit-identical to an uninterrupted run's; spent
//! restarts end it with one line and leave the checkpoint.

use std::path::Path;
use std::process::Command;

const TRAIN: &[&str] = &["train", "--steps", "8", "--layout", "dp=2", "--threads", "1", "--save-every", "2"];

fn train(dir: &Path, out: &str, launch: Option<&[&str]>, fault: Option<&str>) -> std::process::Output {
    let mut args: Vec<&str> = Vec::new();
    if let Some(l) = launch {
        args.extend(["launch"].iter().chain(l.iter()));
        args.push("--");
    }
    args.extend(TRAIN);
    args.extend(["--out", out]);
    let mut c = Command::new(env!("CARGO_BIN_EXE_brigade"));
    c.args(&args).current_dir(dir);
    if let Some(f) = fault {
        c.env("BRIGADE_FAULT", f);
        if launch.is_some_and(|l| l != ["--max-restarts", "1"]) {
            c.env("BRIGADE_FAULT_ONCE", dir.join(format!("{out}.fired")));
        }
    }
    c.output().unwrap()
}

fn bytes(dir: &Path) -> (Vec<u8>, Vec<u8>) {
    (std::fs::read(dir.join("model.safetensors")).unwrap(), std::fs::read(dir.join("optimizer.safetensors")).unwrap())
}

#[test]
fn a_killed_rank_is_restarted_from_its_checkpoint_and_the_run_ends_bit_identical() {
    let d = tempfile::tempdir().unwrap();
    assert!(train(d.path(), "whole", None, None).status.success());
    let want = bytes(&d.path().join("whole"));
    for (i, fault) in
        ["forward:3:1:kill", "backward:5:0:panic", "reduce:4:1:kill", "writing:4:0:kill", "renamed:6:0:kill"]
            .iter()
            .enumerate()
    {
        let out = format!("run{i}");
        let o = train(d.path(), &out, Some(&["--max-restarts", "2"]), Some(fault));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{fault}: {err}");
        assert!(err.contains("restart 1 of 2") && err.contains("finished after 1 restart"), "{fault}: {err}");
        assert!(bytes(&d.path().join(&out)) == want, "{fault}: the supervised run's weights differ");
    }
}

#[test]
fn spent_restarts_end_the_job_with_one_line_and_keep_the_checkpoint() {
    let d = tempfile::tempdir().unwrap();
    // fires on every attempt: the one restart allowed dies too
    let o = train(d.path(), "ck", Some(&["--max-restarts", "1"]), Some("backward:5:1:kill"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    // step 4's save may still be in the background when the kill comes: step 2's or step 4's
    assert!(
        err.contains("--max-restarts 1 is spent") && (err.contains("(step 2)") || err.contains("(step 4)")),
        "{err}"
    );
    assert!(d.path().join("ck/model.safetensors").is_file(), "the checkpoint was deleted");
    // a settings error is not retried
    let o = Command::new(env!("CARGO_BIN_EXE_brigade"))
        .args(["launch", "--", "train", "--steps", "2", "--lr", "-1", "--out", "x"])
        .current_dir(d.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(!String::from_utf8_lossy(&o.stderr).contains("restart"));
}
