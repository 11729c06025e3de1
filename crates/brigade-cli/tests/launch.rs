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
        // restarted from the newest save, or the one before when the newest was still being
        // written (at most one save is in flight: the next waits for it): saves every 2 steps,
        // so at most 4 finished steps redone (a writer thread the scheduler starves until the
        // save after it waits) — and the count said is exactly the steps between the two
        let redo = redone(&err);
        let after = number_after(&err, "after step ");
        let from = if err.contains("from the start") { 0 } else { number_after(&err, "from the checkpoint of step ") };
        assert_eq!(redo, after - from, "{fault}: {err}");
        assert!(
            from % 2 == 0 && from <= after && after - from <= 4,
            "{fault}: died after step {after}, restarted from step {from}: {err}"
        );
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

/// The number the supervisor's restart line gives right after `prefix`.
fn number_after(log: &str, prefix: &str) -> usize {
    let line = log
        .lines()
        .find(|l| l.contains("restart 1 of") && l.contains(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?}: {log}"));
    let rest = &line[line.find(prefix).unwrap() + prefix.len()..];
    rest.split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap_or_else(|_| panic!("{line}"))
}

/// The finished steps the supervisor said a restart redoes.
fn redone(log: &str) -> usize {
    let line =
        log.lines().find(|l| l.contains("finished step(s) to redo")).unwrap_or_else(|| panic!("no count: {log}"));
    let n = line.rsplit(": ").next().unwrap().split(' ').next().unwrap();
    n.parse().unwrap_or_else(|_| panic!("{line}"))
}

/// Every tensor of a checkpoint's model, by name.
fn tensors(dir: &Path) -> Vec<(String, Vec<f32>)> {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut v: Vec<(String, Vec<f32>)> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| {
            assert_eq!(t.dtype(), safetensors::Dtype::F32, "{n}");
            (n, t.data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect())
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

fn losses(dir: &Path) -> Vec<f64> {
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("trainer_state.json")).unwrap()).unwrap();
    s["losses"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

/// Runs `brigade ARGS` in `dir` with a planted fault (fired once when `once`).
fn brigade(dir: &Path, args: &[&str], fault: Option<&str>, once: bool) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_brigade"));
    c.args(args).current_dir(dir);
    if let Some(f) = fault {
        c.env("BRIGADE_FAULT", f);
    }
    if once {
        c.env("BRIGADE_FAULT_ONCE", dir.join("fired"));
    }
    c.output().unwrap()
}

const ELASTIC: &[&str] = &[
    "train",
    "--steps",
    "8",
    "--batch",
    "12",
    "--layout",
    "dp=4",
    "--threads",
    "1",
    "--save-every",
    "2",
    "--eval-every",
    "0",
];

#[test]
fn a_run_that_loses_a_rank_resumes_on_fewer_under_the_planners_layout_and_matches_the_uninterrupted_run() {
    let d = tempfile::tempdir().unwrap();
    let whole = brigade(d.path(), &[ELASTIC, &["--out", "whole"]].concat(), None, false);
    assert!(whole.status.success(), "{}", String::from_utf8_lossy(&whole.stderr));
    let args = [&["launch", "--min-ranks", "2", "--"], ELASTIC, &["--out", "el"]].concat();
    let o = brigade(d.path(), &args, Some("backward:5:2:kill"), true);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    // 4 ranks less one: dp=3 splits the batch of 12, and the log says so
    let line = err.lines().find(|l| l.contains("resumed step")).unwrap_or_else(|| panic!("no resume line: {err}"));
    assert!(line.contains(" on 3 ranks as "), "{line}");
    let (got, want) = (tensors(&d.path().join("el")), tensors(&d.path().join("whole")));
    assert_eq!(got.len(), want.len());
    let (mut num, mut den) = (0f64, 0f64);
    for ((n, g), (m, w)) in got.iter().zip(&want) {
        assert_eq!(n, m);
        for (a, b) in g.iter().zip(w) {
            num += ((a - b) as f64).powi(2);
            den += (*b as f64).powi(2);
        }
    }
    let rel = (num / den).sqrt();
    assert!(rel < 1e-5, "the elastic run's weights differ from the uninterrupted run's by {rel:.2e}");
    let (lg, lw) = (losses(&d.path().join("el")), losses(&d.path().join("whole")));
    assert_eq!(lg.len(), 8);
    for (s, (g, w)) in lg.iter().zip(&lw).enumerate() {
        assert!(((g - w) / w).abs() < 1e-5, "step {}: loss {g} vs {w}", s + 1);
    }
}

#[test]
fn fewer_ranks_than_min_ranks_end_the_job_with_one_line_and_keep_the_checkpoint() {
    let d = tempfile::tempdir().unwrap();
    // the fault fires on every attempt: 4 ranks, then 3, then 2 < --min-ranks 3
    let args = [&["launch", "--min-ranks", "3", "--"], ELASTIC, &["--out", "ck"]].concat();
    let o = brigade(d.path(), &args, Some("backward:5:1:kill"), false);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("on 3 ranks as dp=3"), "{err}");
    let last = err.lines().last().unwrap();
    assert!(last.contains("2 rank(s) remain, fewer than --min-ranks 3"), "{err}");
    assert!(d.path().join("ck/model.safetensors").is_file(), "the checkpoint was deleted");
    // --min-ranks beyond the world, or zero: refused before anything runs
    for m in ["0", "5"] {
        let args = [&["launch", "--min-ranks", m, "--"], ELASTIC, &["--out", "x"]].concat();
        let o = brigade(d.path(), &args, None, false);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains("--min-ranks must be between 1 and the job's 4 ranks"), "{err}");
        assert!(!d.path().join("x").exists());
    }
}

#[test]
fn a_rank_that_hangs_outside_any_collective_is_killed_after_the_hang_timeout_and_the_run_ends_bit_identical() {
    let d = tempfile::tempdir().unwrap();
    assert!(train(d.path(), "whole", None, None).status.success());
    let t0 = std::time::Instant::now();
    let o = train(d.path(), "hung", Some(&["--hang-timeout", "3"]), Some("backward:5:1:hang"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("no step finished in 3 s: the job hung"), "{err}");
    assert!(bytes(&d.path().join("hung")) == bytes(&d.path().join("whole")), "the restarted run's weights differ");
    assert!(t0.elapsed().as_secs() < 120, "the hang was not caught promptly");
    // a timeout that is no number of seconds is refused before anything runs
    let o = train(d.path(), "x", Some(&["--hang-timeout", "0"]), None);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("--hang-timeout must be"));
}

#[test]
fn a_checkpoint_directory_that_vanished_ends_the_job_with_one_line() {
    let d = tempfile::tempdir().unwrap();
    // rank 1 hangs in step 5; while it does, the checkpoints (steps 2 and 4) are deleted
    let mut c = Command::new(env!("CARGO_BIN_EXE_brigade"));
    c.args(["launch", "--hang-timeout", "10", "--"]).args(TRAIN).args(["--out", "gone"]);
    c.current_dir(d.path()).env("BRIGADE_FAULT", "backward:5:1:hang");
    c.stderr(std::process::Stdio::piped()).stdout(std::process::Stdio::null());
    let job = c.spawn().unwrap();
    let state = d.path().join("gone/trainer_state.json");
    let t0 = std::time::Instant::now();
    loop {
        let step = std::fs::read(&state)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v["step"].as_u64());
        if step == Some(4) {
            break;
        }
        assert!(t0.elapsed().as_secs() < 60, "no checkpoint of step 4");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // the supervisor looks for checkpoints four times a second; the hang is not called one for
    // 10 s (counted from step 4's progress: step 4's save on a slow disk and this second fit)
    std::thread::sleep(std::time::Duration::from_secs(1));
    std::fs::remove_dir_all(d.path().join("gone")).unwrap();
    let o = job.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.lines().last().unwrap().contains("the checkpoint directory") && err.contains("vanished"), "{err}");
    assert!(!err.contains("restart 1 of"), "{err}");
}

#[test]
fn bad_launch_flags_are_refused_with_one_line_before_anything_runs() {
    let d = tempfile::tempdir().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["--np", "4", "--hosts", "a,b,c"], "--np 4 does not split evenly over 3 hosts"),
        (&["--np", "4", "--hosts", "a:2,b:x"], "the slots after ':' must be a whole number"),
        (&["--np", "4", "--hosts", "a:1,b:2"], "--hosts has 3 slot(s) for --np 4"),
        (&["--np", "4", "--hosts", " , "], "--hosts is empty"),
        (&["--np", "3"], "--np 3 does not match the layout's 4 rank(s)"),
        (&["--gpu", "tpu9"], "unknown accelerator 'tpu9'"),
        (&["--hang-timeout", "nan"], "--hang-timeout must be"),
    ];
    for (flags, want) in cases {
        let args = [&["launch"], *flags, &["--"], ELASTIC, &["--out", "x"]].concat();
        let o = brigade(d.path(), &args, None, false);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{flags:?} was accepted");
        assert!(err.contains(want), "{flags:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{flags:?}: {err}");
        assert!(!d.path().join("x").exists(), "{flags:?} wrote output");
    }
    // without an MPI build, --np says how to get one
    if !cfg!(feature = "mpi") {
        let args = [&["launch", "--np", "4", "--"], ELASTIC, &["--out", "x"]].concat();
        let err = String::from_utf8_lossy(&brigade(d.path(), &args, None, false).stderr).to_string();
        assert!(err.contains("built without MPI"), "{err}");
    }
}
