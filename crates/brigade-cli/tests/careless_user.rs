//! What a careless user can do to brigade, and what brigade must do back: never destroy their
//! files, never silently read other data, never panic on a closed pipe, refuse impossible sizes
//! and settings up front with one line, cross-check checkpoints, save on an interrupt.

use std::path::Path;
use std::process::{Command, Stdio};

mod common;
use common::{brigade, fails_with, ok};

const QUICK: &[&str] = &["--steps", "3", "--batch", "4", "--threads", "1", "--eval-every", "0"];

fn train_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["train"];
    v.extend_from_slice(QUICK);
    v.extend_from_slice(extra);
    v
}

fn state(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("trainer_state.json")).unwrap()).unwrap()
}

#[test]
fn out_never_replaces_what_is_not_a_checkpoint() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    std::fs::create_dir(p.join("mine")).unwrap();
    std::fs::write(p.join("mine/thesis.tex"), "years of work").unwrap();
    std::fs::write(p.join("notes.txt"), "keep me").unwrap();
    fails_with(&train_args(&["--out", "mine"]), p, "no brigade checkpoint");
    assert_eq!(std::fs::read_to_string(p.join("mine/thesis.tex")).unwrap(), "years of work");
    fails_with(&train_args(&["--out", "notes.txt"]), p, "not a directory");
    assert_eq!(std::fs::read_to_string(p.join("notes.txt")).unwrap(), "keep me");
    // an empty directory and an earlier checkpoint may be written over
    std::fs::create_dir(p.join("empty")).unwrap();
    ok(&train_args(&["--out", "empty"]), p);
    ok(&train_args(&["--out", "empty", "--seed", "2"]), p);
    assert_eq!(state(&p.join("empty"))["config"]["seed"], 2);
    // a temporary directory left by a killed save (its process long gone) is removed
    std::fs::create_dir(p.join(".empty.tmp-999999999")).unwrap();
    std::fs::write(p.join(".empty.tmp-999999999/model.safetensors"), vec![0u8; 1000]).unwrap();
    ok(&train_args(&["--out", "empty"]), p);
    assert!(!p.join(".empty.tmp-999999999").exists(), "stale temporary checkpoint left behind");
    let hidden: Vec<String> = std::fs::read_dir(p)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(hidden.is_empty(), "left behind: {hidden:?}");
}

#[test]
fn resume_reads_the_same_data_or_refuses() {
    let d = tempfile::tempdir().unwrap();
    let (a, b) = (d.path().join("a"), d.path().join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    std::fs::write(a.join("corpus.txt"), "the quick brown fox jumps over the lazy dog. ".repeat(80)).unwrap();
    std::fs::write(b.join("corpus.txt"), "a completely different corpus of other words! ".repeat(80)).unwrap();
    ok(&train_args(&["--data", "corpus.txt", "--seq", "16", "--out", "ck", "--stop-after", "1"]), &a);
    let saved = state(&a.join("ck"));
    let data = saved["config"]["data"].as_str().unwrap();
    assert!(Path::new(data).is_absolute(), "data path stored relative: {data}");
    assert_eq!(saved["fingerprints"]["data"]["bytes"], 45 * 80);
    // resuming from another directory reads a/corpus.txt, not b/corpus.txt
    let ck = a.join("ck");
    let ck = ck.to_str().unwrap();
    ok(&["train", "--resume", ck, "--threads", "1", "--stop-after", "2"], &b);
    // the data changed: refused, naming the data file
    std::fs::write(a.join("corpus.txt"), "the quick brown fox jumps over the lazy cat. ".repeat(80)).unwrap();
    fails_with(&["train", "--resume", ck, "--threads", "1"], &b, "the data file");
    std::fs::remove_file(a.join("corpus.txt")).unwrap();
    fails_with(&["train", "--resume", ck, "--threads", "1"], &b, "corpus.txt");
}

#[test]
fn resume_refuses_a_changed_tokenizer() {
    let tok = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models/all-MiniLM-L6-v2/tokenizer.json");
    if !tok.exists() {
        assert!(std::env::var_os("BRIGADE_REQUIRE_SHARED").is_none(), "{} not found", tok.display());
        eprintln!("skipped: {} not found (the shared models folder is absent)", tok.display());
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    std::fs::write(p.join("t.txt"), "the cat sat on the mat and looked at the hat. ".repeat(300)).unwrap();
    ok(
        &train_args(&[
            "--data",
            "t.txt",
            "--tokenizer",
            tok.to_str().unwrap(),
            "--seq",
            "16",
            "--out",
            "ck",
            "--stop-after",
            "1",
        ]),
        p,
    );
    let copy = p.join("ck/tokenizer.json");
    let mut text = std::fs::read_to_string(&copy).unwrap();
    text = text.replacen("\"[PAD]\"", "\"[PAD2]\"", 1);
    std::fs::write(&copy, text).unwrap();
    fails_with(&["train", "--resume", "ck", "--threads", "1"], p, "the tokenizer file");
    // and sample refuses a checkpoint whose tokenizer is gone instead of falling back to bytes
    std::fs::remove_file(&copy).unwrap();
    fails_with(&["sample", "--checkpoint", "ck", "--prompt", "the cat"], p, "tokenizer.json is missing");
}

#[test]
fn a_closed_or_full_stdout_is_not_a_panic() {
    let args = ["plan", "--model", "gpt3-175b", "--gpu", "h100-sxm", "--gpus", "1024", "--global-batch", "1536"];
    // `brigade plan … | head -0`: the reader is gone before brigade writes
    let mut child = Command::new(env!("CARGO_BIN_EXE_brigade"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked") && err.is_empty(), "closed pipe: {err}");
    // stdout on a full device: one line, non-zero exit
    let full = std::fs::File::create("/dev/full").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_brigade")).args(args).stdout(full).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && !err.contains("panicked"), "/dev/full: {err}");
    assert!(err.starts_with("error: cannot write to standard output"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

#[test]
fn sizes_are_checked_before_anything_is_allocated() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    fails_with(&["train", "--batch", "100000000", "--threads", "1"], p, "GiB of memory is available");
    fails_with(&["train", "--model", "gpt2-xl", "--batch", "4096", "--threads", "1"], p, "GiB of memory is available");
    fails_with(&["train", "--batch", "18446744073709551615", "--threads", "1"], p, "beyond any machine");
    fails_with(&["train", "--threads", "100000"], p, "--threads 100000 is out of range");
    fails_with(&["train", "--threads", "0"], p, "--threads 0 is out of range");
    fails_with(&["bench", "comm", "--ranks", "100000"], p, "--ranks 100000 is out of range");
    fails_with(&["bench", "comm", "--ranks", "2", "--max-bytes", "1000000000000000"], p, "lower --max-bytes");
    fails_with(&["bench", "train", "--batch", "100000", "--threads", "1"], p, "GiB of memory is available");
    let plan = ["plan", "--model", "gpt3-175b", "--global-batch", "1536"];
    fails_with(&[&plan[..], &["--gpus", "1000000000000000"]].concat(), p, "--gpus");
    fails_with(
        &["plan", "--model", "gpt3-175b", "--gpus", "8", "--global-batch", "100000000000000"],
        p,
        "--global-batch",
    );
    fails_with(
        &[
            "plan",
            "--layers",
            "2",
            "--hidden",
            "64",
            "--heads",
            "4",
            "--seq",
            "99999999999",
            "--vocab",
            "100",
            "--gpus",
            "8",
            "--global-batch",
            "8",
        ],
        p,
        "beyond any model",
    );
    // 8 local ranks stay allowed on any machine (the tests run 8 rank threads on 2 cores)
    ok(&["bench", "comm", "--ranks", "8", "--max-bytes", "64"], p);
}

#[test]
fn pipeline_benchmarks_report_their_bubble_and_the_planner_its_prediction() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    let tiny = ["--model", "tiny", "--seq", "16", "--batch", "4", "--threads", "1", "--steps", "1"];
    let layouts = "dp=1;pp=2,mb=1,schedule=zb;pp=2,mb=1,schedule=gpipe,recompute=selective;dp=2,pp=2,mb=1";
    let out = ok(&[&["bench", "parallel"][..], &tiny, &["--warmup", "0", "--layouts", layouts, "--json"]].concat(), p);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert!(rows[0]["bubble_measured"].is_null() && rows[0]["bubble_theory"].is_null(), "{v}");
    for r in &rows[1..] {
        for k in ["bubble_measured", "bubble_theory"] {
            assert!(r[k].as_f64().is_some_and(|b| (0.0..=1.0).contains(&b)), "{k} in {r}");
        }
    }
    // each stage's busy time, within the step, and their imbalance from them
    assert!(rows[0]["stage_busy_s"].as_array().unwrap().is_empty() && rows[0]["stage_imbalance"].is_null());
    for r in &rows[1..] {
        let busy: Vec<f64> = r["stage_busy_s"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        let step = 4.0 * 16.0 / r["tokens_per_s"].as_f64().unwrap();
        assert!(busy.len() == 2 && busy.iter().all(|&b| b > 0.0 && b <= step), "{r}");
        let (lo, hi) = (busy[0].min(busy[1]), busy[0].max(busy[1]));
        assert!((r["stage_imbalance"].as_f64().unwrap() - (hi - lo) / lo).abs() < 1e-12, "{r}");
    }
    // pp=2 with 4 micro-batches: GPipe's bubble on paper is 1/5
    assert!((rows[2]["bubble_theory"].as_f64().unwrap() - 0.2).abs() < 1e-9, "{v}");
    let out = ok(&[&["bench", "plan"][..], &tiny, &["--layout", "dp=2,pp=2,mb=1", "--json"]].concat(), p);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for k in ["predicted_step_s", "measured_step_s", "predicted_over_measured"] {
        assert!(v[k].as_f64().is_some_and(|x| x > 0.0), "{k} in {v}");
    }
    assert!(v["parts"]["bubble"].as_f64().is_some_and(|b| b > 0.0), "{v}");
    fails_with(
        &[&["bench", "plan"][..], &tiny, &["--layout", "pp=8,mb=1"]].concat(),
        p,
        "8 pipeline stages, but a model of 2 layers",
    );
    // where a single worker's step goes, kernel by kernel
    let out = ok(&[&["bench", "train"][..], &tiny, &["--breakdown", "--json"]].concat(), p);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["breakdown"].as_array().unwrap();
    for k in ["mlp.c_fc weight grad", "attention backward", "LayerNorm forward", "cross-entropy forward", "AdamW"] {
        let r = rows.iter().find(|r| r["kernel"].as_str().unwrap().starts_with(k)).unwrap_or_else(|| panic!("no {k}"));
        assert!(r["seconds"].as_f64().unwrap() > 0.0 && r["rate"].as_f64().unwrap() > 0.0, "{r}");
    }
}

#[test]
fn settings_are_checked() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    let cases: &[(&str, &str)] = &[
        ("[adamw]\nbeta1 = 1.0\n", "adamw.beta1 must be in [0, 1)"),
        ("[adamw]\nbeta2 = -0.1\n", "adamw.beta2 must be in [0, 1)"),
        ("[adamw]\neps = 0.0\n", "adamw.eps must be a positive number"),
        ("[adamw]\nweight_decay = nan\n", "adamw.weight_decay"),
        ("[adamw]\nweight_decay = -0.1\n", "adamw.weight_decay"),
        ("grad_clip = nan\n", "grad_clip"),
        ("grad_clip = -1.0\n", "grad_clip"),
        ("lr = 0.001\nmin_lr = 0.01\n", "min_lr must be between 0 and lr"),
        ("[adamw]\nbeta3 = 0.5\n", "beta3"),
        ("steps = 10\nbatch = \"many\"\n", "line 2, column 9"),
        ("n_kv_head = 2\n", "n_kv_head and intermediate_size set the Llama family's shape; tiny is a GPT-2 preset"),
        (
            "model = \"llama-tiny\"\nn_kv_head = 3\n",
            "num_attention_heads (4) must be a multiple of num_key_value_heads (3)",
        ),
    ];
    for (i, (toml, needle)) in cases.iter().enumerate() {
        let f = format!("c{i}.toml");
        std::fs::write(p.join(&f), toml).unwrap();
        fails_with(&["train", "--config", &f], p, needle);
    }
    // a partial [adamw] table takes the defaults for the rest
    std::fs::write(p.join("partial.toml"), "steps = 2\nbatch = 4\neval_every = 0\n[adamw]\nbeta2 = 0.99\n").unwrap();
    ok(&["train", "--config", "partial.toml", "--threads", "1", "--out", "ck"], p);
    let adamw = &state(&p.join("ck"))["config"]["adamw"];
    assert!(
        (adamw["beta2"].as_f64().unwrap() - 0.99).abs() < 1e-6 && (adamw["beta1"].as_f64().unwrap() - 0.9).abs() < 1e-6
    );
    let plan = ["plan", "--model", "gpt3-175b", "--gpus", "1024", "--global-batch", "1536"];
    fails_with(&[&plan[..], &["--tokens=-5"]].concat(), p, "--tokens must be a number");
    fails_with(&[&plan[..], &["--tokens", "NaN"]].concat(), p, "--tokens must be a number");
    fails_with(&[&plan[..], &["--tokens", "1e300"]].concat(), p, "--tokens must be a number");
    fails_with(&[&plan[..], &["--peak-tflops", "1e-300"]].concat(), p, "between 0.001 and 1e6");
    fails_with(&[&plan[..], &["--hbm-gib", "1e300"]].concat(), p, "between 0.001 and 1e6");
    fails_with(&[&plan[..], &["--gpus-per-node", "0"]].concat(), p, "--gpus-per-node");
    fails_with(&[&plan[..], &["--seq", "0"]].concat(), p, "must be at least 1");
    fails_with(&[&plan[..], &["--layout", "tp=8,pp=4,tp=4"]].concat(), p, "'tp' is given twice");
}

#[test]
fn checkpoint_state_is_cross_checked() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    ok(&train_args(&["--out", "ck"]), p);
    let good = std::fs::read_to_string(p.join("ck/trainer_state.json")).unwrap();
    let edit = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v: serde_json::Value = serde_json::from_str(&good).unwrap();
        f(&mut v);
        std::fs::write(p.join("ck/trainer_state.json"), v.to_string()).unwrap();
    };
    let resume = ["train", "--resume", "ck", "--threads", "1", "--steps", "5"];
    edit(&|v| v["step"] = 2.into());
    fails_with(&resume, p, "says step 2 but holds 3 losses");
    edit(&|v| v["format"] = 7.into());
    fails_with(&resume, p, "format 7");
    edit(&|v| v["losses"].as_array_mut().unwrap().pop().map(|_| ()).unwrap());
    fails_with(&resume, p, "holds 2 losses");
    // a step count that disagrees with the optimizer's: model and state of different saves
    edit(&|v| {
        v["step"] = 2.into();
        v["losses"].as_array_mut().unwrap().pop();
    });
    fails_with(&resume, p, "optimizer state of step 3");
    std::fs::write(p.join("ck/trainer_state.json"), &good).unwrap();
    fails_with(&["train", "--resume", "ck", "--steps", "2"], p, "--steps 2 is below the 3 steps");
    ok(&resume, p);
}

#[test]
fn unwritable_outputs_fail_before_training() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    let slow = ["train", "--steps", "100000", "--threads", "1"];
    // /proc refuses new files even to root
    let err = fails_with(&[&slow[..], &["--out", "/proc/brigade-ck"]].concat(), p, "/proc");
    assert!(!err.contains("steps in"), "trained before failing: {err}");
    assert_eq!(err.lines().filter(|l| l.starts_with("error")).count(), 1, "{err}");
    fails_with(&[&slow[..], &["--trace", "/proc/trace.json"]].concat(), p, "--trace /proc/trace.json");
    fails_with(&[&slow[..], &["--trace", "nowhere/trace.json"]].concat(), p, "does not exist");
    std::fs::create_dir(p.join("adir")).unwrap();
    fails_with(&[&slow[..], &["--trace", "adir"]].concat(), p, "is a directory");
}

/// A training run far longer than the test, saving to `out`, its stderr captured; `fault`: a
/// planted `BRIGADE_FAULT`.
fn long_run(p: &Path, out: &str, fault: Option<&str>) -> std::process::Child {
    let mut c = Command::new(env!("CARGO_BIN_EXE_brigade"));
    c.args(["train", "--steps", "100000", "--batch", "8", "--threads", "1", "--eval-every", "0", "--out", out]);
    if let Some(f) = fault {
        c.env("BRIGADE_FAULT", f);
    }
    c.current_dir(p).stderr(Stdio::piped()).spawn().unwrap()
}

#[test]
fn sigterm_finishes_the_step_saves_and_exits_non_zero() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    let child = long_run(p, "ck", None);
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let kill = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(kill.success());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(err.contains("interrupted after step") && err.contains("--resume ck"), "{err}");
    // the interrupt was acknowledged, and progress was printed though stderr is no terminal
    assert!(
        err.contains("interrupted — finishing the current step, then saving a checkpoint; interrupt again"),
        "{err}"
    );
    assert!(err.contains("step 1/100000  loss") && err.contains("tok/s"), "no progress lines: {err}");
    let s = state(&p.join("ck"));
    let step = s["step"].as_u64().unwrap();
    assert!(step >= 1, "no step finished in 2.5 s: {err}");
    // the checkpoint holds the step the message names, and as many losses
    let said: u64 = err
        .split("interrupted after step ")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no step in the message: {err}"));
    assert_eq!(step, said, "{err}");
    assert_eq!(s["losses"].as_array().map(Vec::len), Some(step as usize), "a loss a step");
    // and the run continues from there
    ok(&["train", "--resume", "ck", "--threads", "1", "--steps", &(step + 2).to_string()], p);
    assert_eq!(state(&p.join("ck"))["step"].as_u64().unwrap(), step + 2);
    // extending the run says how the schedule changes
    let more = (step + 10).to_string();
    let out = ok(&["train", "--resume", "ck", "--threads", "1", "--steps", &more], p);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("{} → {more} steps stretches the learning-rate schedule", step + 2)), "{err}");
    // a second interrupt quits at once, saying it did not save: the run held inside step 3 (a
    // planted hang), so the first interrupt cannot end it, and each interrupt sent only once the
    // process has said what it saw (two signals sent together may arrive as one)
    let mut child = long_run(p, "ck2", Some("backward:3:0:hang"));
    let mut err = common::Stderr::follow(&mut child);
    let limit = std::time::Duration::from_secs(120);
    let interrupt =
        || assert!(Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap().success());
    err.wait_for("planted fault: Backward of step 3", limit);
    interrupt();
    err.wait_for("interrupted — finishing the current step", limit);
    interrupt();
    err.wait_for("interrupted again: quit at once, without saving", limit);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{}", err.all());
}

#[test]
fn sample_and_plan_refuse_what_they_would_ignore() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    let ck = Path::new(env!("CARGO_MANIFEST_DIR")).join("../brigade/tests/fixtures/addition_ckpt");
    let ck = ck.to_str().unwrap();
    ok(&["sample", "--checkpoint", ck, "--prompt", "482+139", "--threads", "1"], p);
    fails_with(&["sample", "--checkpoint", ck, "--prompt", "482+139", "--max-tokens", "3"], p, "drop --max-tokens");
    fails_with(&["sample", "--checkpoint", ck, "--prompt", "482+139", "--ignore-eos"], p, "drop --ignore-eos");
    fails_with(&["sample", "--checkpoint", ck, "--prompt", "hi", "--top-k", "5"], p, "--top-k 5 has no effect");
    fails_with(&["sample", "--checkpoint", ck, "--prompt", "1+2", "--threads", "0"], p, "--threads 0 is out of range");
    let out = brigade(&["plan", "--local", "--layers", "4"], p);
    assert_eq!(out.status.code(), Some(2), "plan --local --layers accepted");
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
}

#[test]
fn parallel_training_from_the_cli_matches_the_single_worker() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    let base = ["train", "--steps", "4", "--batch", "8", "--threads", "1", "--eval-every", "0"];
    ok(&[&base[..], &["--out", "one"]].concat(), p);
    ok(&[&base[..], &["--layout", "dp=2,zero=1", "--micro-batch", "2", "--out", "two"]].concat(), p);
    ok(&[&base[..], &["--layout", "dp=4,zero=3", "--out", "four"]].concat(), p);
    ok(&[&base[..], &["--layout", "dp=2,tp=2,sp=1", "--out", "mixed", "--trace", "mixed.json"]].concat(), p);
    // the 3D mesh: 8 ranks, micro-batches of 1 through a 1F1B pipeline of 2 stages
    let out = ok(
        &[&base[..], &["--layout", "dp=2,pp=2,tp=2,zero=1,mb=1", "--out", "cube", "--trace", "cube.json"]].concat(),
        p,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rank 7 (dp 1 pp 1 tp 1)") && err.contains("pipeline bubble"), "{err}");
    assert!(err.contains("pipeline 1f1b · pp=2 · v=1 · 4 micro-batches: bubble measured"), "{err}");
    assert!(err.contains("theory 20.0%"), "{err}");
    ok(&[&base[..], &["--layout", "pp=4,schedule=zb,recompute=full", "--micro-batch", "2", "--out", "zb"]].concat(), p);
    let cube: serde_json::Value = serde_json::from_slice(&std::fs::read(p.join("cube.json")).unwrap()).unwrap();
    let events = cube["traceEvents"].as_array().unwrap();
    for name in ["wait for gradient mb0", "send activation mb3", "backward mb3 c0"] {
        assert!(events.iter().any(|e| e["name"] == name && e["tid"] == 1), "no '{name}' on rank 1's track");
    }
    // one trace, a track per rank, the tensor-parallel collectives on it
    let trace: serde_json::Value = serde_json::from_slice(&std::fs::read(p.join("mixed.json")).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let mut tracks: Vec<u64> = events.iter().map(|e| e["tid"].as_u64().unwrap()).collect();
    tracks.sort();
    tracks.dedup();
    assert_eq!(tracks, [0, 1, 2, 3]);
    for op in ["all_gather", "reduce_scatter", "forward mb0"] {
        assert!(events.iter().any(|e| e["name"] == op && e["tid"] == 3), "no {op} on rank 3's track");
    }
    let losses = |d: &str| -> Vec<f64> {
        state(&p.join(d))["losses"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
    };
    for d in ["two", "four", "mixed", "cube", "zb"] {
        for (a, b) in losses(d).iter().zip(losses("one")) {
            assert!(((a - b) / b).abs() < 1e-5, "{d}: loss {a} vs single worker {b}");
        }
    }
    // the checkpoint is layout-free: the single worker resumes a dp=2 run, tp=4 a dp×tp run
    ok(&["train", "--resume", "two", "--steps", "6", "--threads", "1"], p);
    ok(&["train", "--resume", "mixed", "--steps", "6", "--threads", "1", "--layout", "tp=4"], p);
    ok(&["train", "--resume", "cube", "--steps", "6", "--threads", "1", "--layout", "pp=4,schedule=gpipe"], p);
    ok(&["train", "--resume", "two", "--steps", "6", "--threads", "1"], p);
    // the metrics of every step, the resumed ones included, and the loss curve
    let metrics = std::fs::read_to_string(p.join("mixed/metrics.jsonl")).unwrap();
    let steps: Vec<u64> = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .inspect(|m| {
            for k in ["loss", "lr", "grad_norm", "tokens_per_s", "compute_s", "comm_s", "idle_s"] {
                assert!(m[k].as_f64().is_some_and(f64::is_finite), "{k} in {m}");
            }
        })
        .map(|m| m["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, [1, 2, 3, 4, 5, 6]);
    assert!(std::fs::read_to_string(p.join("mixed/loss.svg")).unwrap().contains("<polyline"));
    // and the model it holds is the full one, as `sample` reads it
    ok(&["sample", "--checkpoint", "mixed", "--prompt", "12+34"], p);
    // impossible layouts: one line, before any rank starts
    fails_with(
        &[&base[..], &["--layout", "dp=3"]].concat(),
        p,
        "does not split into dp=3 equal shares; use a batch that is a multiple of 3 (e.g. 6 or 9)",
    );
    fails_with(
        &[&base[..], &["--layout", "dp=4", "--micro-batch", "4"]].concat(),
        p,
        "make batch a multiple of dp × micro_batch = 16",
    );
    // a pipeline whose micro-batches do not fill its groups: one suggestion, not "2 or 2"
    let e = fails_with(&[&base[..], &["--layout", "pp=2,schedule=interleaved,mb=8"]].concat(), p, "not 1; use 2");
    assert!(!e.contains("or 2"), "{e}");
    // a negative count is named as such (flag syntax: exit 2), not taken for an unknown flag
    let out = brigade(&["train", "--steps", "-5"], p);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("'--steps <STEPS>': must be a whole number, 0 or more, got -5"), "{err}");
    // an unwritable --out: the cause once
    let e = fails_with(&[&base[..], &["--out", "/proc/nope"]].concat(), p, "not writable");
    assert_eq!(e.matches("not writable").count(), 1, "{e}");
    fails_with(
        &[&base[..], &["--layout", "pp=7"]].concat(),
        p,
        "7 pipeline stages, but a model of 2 layers splits into only 6 pieces",
    );
    fails_with(&[&base[..], &["--layout", "pp=2,zero=2"]].concat(), p, "use zero=1");
    // more micro-batches than message tags: refused before any rank starts
    fails_with(
        &["train", "--steps", "1", "--batch", "8192", "--layout", "pp=2,mb=1"],
        p,
        "8192 micro-batches × 2 pipeline stages need more message tags than MPI guarantees (32767); use fewer micro-batches a step (a larger --micro-batch)",
    );
    fails_with(
        &[&base[..], &["--layout", "pp=4,schedule=interleaved,mb=4"]].concat(),
        p,
        "needs a multiple of 4 micro-batches, not 2",
    );
    fails_with(&[&base[..], &["--layout", "tp=3"]].concat(), p, "tp=3 does not divide the model's 4 attention heads");
    fails_with(&[&base[..], &["--layout", "sp=1"]].concat(), p, "has tp=1");
    fails_with(&[&base[..], &["--layout", "tp=2,sp=2"]].concat(), p, "sp=2: expected 0 or 1");
    fails_with(&[&base[..], &["--layout", "dp=2,zero=4"]].concat(), p, "zero=4: expected a ZeRO stage 0, 1, 2 or 3");
    fails_with(
        &[&base[..], &["--layout", "pp=2,schedule=pipedream"]].concat(),
        p,
        "expected gpipe, 1f1b, interleaved or zb",
    );
    fails_with(&[&base[..], &["--layout", "dp=0"]].concat(), p, "positive integer");
    fails_with(&[&base[..], &["--layout", "dp=1000"]].concat(), p, "out of range");
    fails_with(&[&base[..], &["--backend", "mpi"]].concat(), p, "mpi");
    fails_with(&[&base[..], &["--backend", "nccl"]].concat(), p, "unknown --backend 'nccl'");
}

#[test]
fn pipeline_schedules_print_as_charts_and_impossible_ones_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    let out = ok(&["train", "--layout", "pp=2", "--batch", "3", "--micro-batch", "1", "--print-schedule"], p);
    let text = String::from_utf8_lossy(&out.stdout);
    // 1F1B by default: rank 0 runs one forward ahead, rank 1 alternates
    assert!(text.contains("schedule 1f1b · pp=2 · 3 micro-batches · v=1"), "{text}");
    assert!(text.contains("rank 0: F0 F1 B0 F2 B1 B2\nrank 1: F0 B0 F1 B1 F2 B2"), "{text}");
    assert!(text.contains("simulated bubble 25.0% ((pp−1)/(v·m+pp−1) = 25.0%)"), "{text}");
    let out =
        ok(&["train", "--layout", "pp=2,schedule=zb", "--batch", "4", "--micro-batch", "1", "--print-schedule"], p);
    assert!(String::from_utf8_lossy(&out.stdout).contains("rank 1: F0 b0"));
    let base = ["train", "--batch", "6", "--micro-batch", "1", "--print-schedule", "--layout"];
    fails_with(&[&base[..], &["pp=4,v=2"]].concat(), p, "needs a multiple of 4 micro-batches, not 6; use 4 or 8");
    fails_with(&[&base[..], &["pp=2,v=2,schedule=1f1b"]].concat(), p, "needs schedule=interleaved");
    // a schedule the model cannot be cut into is refused as train refuses it
    let eight = ["train", "--batch", "8", "--micro-batch", "1", "--print-schedule", "--layout", "pp=4,v=2"];
    fails_with(&eight, p, "8 pipeline stages, but a model of 2 layers splits into only 6 pieces");
    fails_with(&[&base[..], &["pp=2,schedule=zb2"]].concat(), p, "expected gpipe, 1f1b, interleaved or zb");
    // without --threads, the cores are divided among the ranks: eight of them run on any
    // machine (on 2 cores, 8 × all cores would be 16 threads, past the limit), and a
    // pipeline the model cannot take is refused for that reason, not for the threads
    let out = ok(&["train", "--layout", "dp=8", "--steps", "2", "--eval-every", "0"], p);
    let err = String::from_utf8_lossy(&out.stderr);
    let cores = std::thread::available_parallelism().unwrap().get();
    assert!(err.contains(&format!("· {} threads", (cores / 8).max(1))), "{err}");
    fails_with(&["train", "--layout", "pp=8", "--steps", "2"], p, "8 pipeline stages, but a model of 2 layers");
    fails_with(&[&base[..], &["dp=2"]].concat(), p, "no pipeline to schedule");
    // the planner costs zero-bubble pipelines too
    let out = ok(
        &[
            "plan",
            "--model",
            "gpt3-175b",
            "--gpus",
            "1024",
            "--global-batch",
            "512",
            "--layout",
            "tp=8,pp=8,schedule=zb",
        ],
        p,
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(" zb "), "{}", String::from_utf8_lossy(&out.stdout));
}

/// Hugging Face Llama-family folders from the CLI: a damaged config is refused with one line
/// and exit 1, nothing written; a tokenizer larger than the model's vocabulary is refused; a
/// good folder samples and writes its logits.
#[test]
fn llama_folders_sample_and_bad_ones_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../brigade/tests/fixtures/llama3_hf");
    let hf = p.join("hf");
    std::fs::create_dir(&hf).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture.join(f), hf.join(f)).unwrap();
    }
    let hf_s = hf.to_str().unwrap();
    let logits = p.join("l.npy");
    let args = |extra: &[&str]| {
        let mut v = vec!["sample", "--checkpoint", hf_s, "--prompt", "!#", "--max-tokens", "3", "--threads", "1"];
        v.extend_from_slice(extra);
        v.iter().map(|s| s.to_string()).collect::<Vec<String>>()
    };
    let lo = logits.to_str().unwrap();
    let good = args(&["--logits-out", lo]);
    ok(&good.iter().map(String::as_str).collect::<Vec<_>>(), p);
    // two bytes of prompt, byte tokens (the folder has no tokenizer): [2, 101] float32
    assert_eq!(std::fs::metadata(&logits).unwrap().len(), 128 + 2 * 101 * 4);
    std::fs::remove_file(&logits).unwrap();
    // an end-of-sequence id in generation_config.json ends the text before it (the id itself
    // not printed); --ignore-eos goes on to --max-tokens. Byte tokens: a printed byte is its id.
    let eight = |extra: &[&str]| {
        let mut v = vec!["sample", "--checkpoint", hf_s, "--prompt", "!#", "--max-tokens", "8", "--threads", "1"];
        v.extend_from_slice(extra);
        let out = ok(&v, p).stdout;
        assert!(out.starts_with(b"!#") && out.ends_with(b"\n"), "{out:?}");
        out[2..out.len() - 1].to_vec()
    };
    let free = eight(&[]);
    assert_eq!(free.len(), 8, "{free:?}");
    let eos = free[2];
    std::fs::write(hf.join("generation_config.json"), format!("{{\"eos_token_id\": [100, {eos}]}}")).unwrap();
    let cut = free.iter().position(|&b| b == eos || b == 100).unwrap();
    assert_eq!(eight(&[]), free[..cut], "stopped at the first {eos}");
    assert_eq!(eight(&["--ignore-eos"]), free, "--ignore-eos");
    std::fs::remove_file(hf.join("generation_config.json")).unwrap();
    // more tokens than the context holds: refused at once, naming the most it can give
    let long = ["sample", "--checkpoint", hf_s, "--prompt", "!#", "--max-tokens", "255", "--threads", "1"];
    fails_with(&long, p, "exceed the model's context of 256 tokens; give --max-tokens 254 or less");
    let cfg = std::fs::read_to_string(hf.join("config.json")).unwrap();
    std::fs::write(hf.join("config.json"), cfg.replace("\"silu\"", "\"gelu\"")).unwrap();
    fails_with(&good.iter().map(String::as_str).collect::<Vec<_>>(), p, "hidden_act = \"gelu\" is not supported");
    assert!(!logits.exists(), "nothing written on a refusal");
    std::fs::write(hf.join("config.json"), &cfg).unwrap();
    // the real Llama 3 tokenizer (128,256 tokens) beside a model of 101
    let Some(tok) = common::shared("tokenizers/llama3/tokenizer.json") else { return };
    std::fs::copy(&tok, hf.join("tokenizer.json")).unwrap();
    fails_with(
        &args(&[]).iter().map(String::as_str).collect::<Vec<_>>(),
        p,
        "has 128256 tokens but the model only 101",
    );
}

/// A sequence longer than the preset's block size names the flag that raises it, and the flag
/// works (the README's tour line `--data corpus.txt --seq 128 --block-size 128`).
#[test]
fn block_size_is_a_flag_and_the_error_names_it() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    let text: String = (0..400).map(|i| format!("line {i} of a small corpus\n")).collect();
    std::fs::write(p.join("corpus.txt"), text).unwrap();
    let base = [
        "train",
        "--data",
        "corpus.txt",
        "--seq",
        "128",
        "--steps",
        "1",
        "--batch",
        "2",
        "--threads",
        "1",
        "--eval-every",
        "0",
    ];
    fails_with(&base, p, "raise --block-size");
    let mut args = base.to_vec();
    args.extend(["--block-size", "128"]);
    ok(&args, p);
}
