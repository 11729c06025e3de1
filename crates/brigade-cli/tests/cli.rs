//! The `brigade` binary end to end: bad input gets a one-line error and a non-zero exit,
//! never a panic; train → checkpoint → sample and train → interrupt → resume work.
mod common;
use common::{brigade, fails_with};

const QUICK: &[&str] = &["--steps", "6", "--batch", "4", "--threads", "1", "--eval-every", "0"];

#[test]
fn bad_input_gets_a_clear_error() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    std::fs::write(p.join("empty.txt"), "").unwrap();
    std::fs::write(p.join("small.txt"), "hello world, this is a short file.\n".repeat(20)).unwrap();
    std::fs::write(p.join("heads.toml"), "n_embd = 30\nn_head = 4\n").unwrap();
    std::fs::write(p.join("typo.toml"), "stepz = 10\n").unwrap();
    std::fs::write(p.join("binary.txt"), [0xffu8, 0xfe, 0x00, 0x80].repeat(500)).unwrap();
    fails_with(&["train", "--data", "missing.txt"], p, "missing.txt");
    fails_with(&["train", "--data", "binary.txt"], p, "not UTF-8");
    fails_with(&["train", "--resume", "nowhere"], p, "--resume needs a directory written by `brigade train --out`");
    fails_with(&["sample", "--checkpoint", "nowhere", "--prompt", ""], p, "--prompt is empty");
    fails_with(&["train", "--data", "empty.txt"], p, "empty");
    fails_with(&["train", "--config", "heads.toml"], p, "divisible by n_head");
    fails_with(&["train", "--config", "typo.toml"], p, "stepz");
    fails_with(&["train", "--config", "nope.toml"], p, "nope.toml");
    fails_with(&["train", "--data", "small.txt", "--seq", "65"], p, "block_size");
    fails_with(&["train", "--model", "gpt5"], p, "known presets: tiny");
    fails_with(&["train", "--batch", "6", "--micro-batch", "4"], p, "multiple of micro_batch");
    fails_with(&["train", "--tokenizer", "tok.json", "--data", "small.txt"], p, "tok.json");
    fails_with(&["train", "--bogus"], p, "--bogus");
    fails_with(&["sample", "--checkpoint", "nowhere", "--prompt", "hi"], p, "nowhere");
}

#[test]
fn broken_checkpoints_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    let ck = p.join("ck");
    let mut args = vec!["train", "--out", "ck"];
    args.extend_from_slice(QUICK);
    assert!(brigade(&args, p).status.success());
    let model = ck.join("model.safetensors");
    let full = std::fs::read(&model).unwrap();
    // truncated
    std::fs::write(&model, &full[..full.len() / 2]).unwrap();
    fails_with(&["sample", "--checkpoint", "ck", "--prompt", "1+2"], p, "model.safetensors");
    // foreign: a valid safetensors file holding some other model's tensors
    let data = vec![0u8; 16];
    let tv = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![4], &data).unwrap();
    safetensors::serialize_to_file(vec![("embeddings.word_embeddings.weight", tv)], None, &model).unwrap();
    fails_with(&["sample", "--checkpoint", "ck", "--prompt", "1+2"], p, "belongs to another model");
    // foreign and as large as ours
    let data = vec![0u8; full.len()];
    let tv = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![full.len() / 4], &data).unwrap();
    safetensors::serialize_to_file(vec![("embeddings.word_embeddings.weight", tv)], None, &model).unwrap();
    fails_with(&["sample", "--checkpoint", "ck", "--prompt", "1+2"], p, "missing");
    // garbage
    std::fs::write(&model, b"not a safetensors file at all").unwrap();
    fails_with(&["sample", "--checkpoint", "ck", "--prompt", "1+2"], p, "not a valid safetensors");
}

#[test]
fn train_then_sample() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    std::fs::write(p.join("t.txt"), "abcdefghij".repeat(200)).unwrap();
    let mut args = vec!["train", "--data", "t.txt", "--seq", "16", "--out", "ck"];
    args.extend_from_slice(QUICK);
    let out = brigade(&args, p);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("validation loss"));
    let out = brigade(&["sample", "--checkpoint", "ck", "--prompt", "abc", "--max-tokens", "5"], p);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("abc"));
}

#[test]
fn interrupted_and_resumed_cli_run_matches_uninterrupted() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    let run = |extra: &[&str]| {
        let mut args: Vec<&str> = vec!["train", "--steps", "12", "--batch", "8", "--threads", "2", "--eval-every", "0"];
        args.extend_from_slice(extra);
        let out = brigade(&args, p);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    run(&["--out", "a"]);
    run(&["--out", "b", "--stop-after", "5"]);
    let resumed = brigade(&["train", "--resume", "b", "--threads", "1"], p);
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    fails_with(&["train", "--resume", "b", "--lr", "0.1"], p, "--lr cannot change");
    let losses = |dir: &str| {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(p.join(dir).join("trainer_state.json")).unwrap()).unwrap();
        v["losses"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect::<Vec<_>>()
    };
    let (a, b) = (losses("a"), losses("b"));
    assert_eq!(a.len(), 12);
    assert_eq!(a, b, "resumed loss sequence differs");
    assert_eq!(
        std::fs::read(p.join("a/model.safetensors")).unwrap(),
        std::fs::read(p.join("b/model.safetensors")).unwrap()
    );
    // resuming a finished run says so, and how to extend it
    let again = brigade(&["train", "--resume", "a", "--threads", "1"], p);
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "{err}");
    assert!(err.contains("the run is complete: nothing to train") && err.contains("--steps above 12"), "{err}");
    assert_eq!(losses("a").len(), 12);
}

#[test]
fn trains_with_a_hugging_face_tokenizer() {
    let tok =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models/all-MiniLM-L6-v2/tokenizer.json");
    if !tok.exists() {
        assert!(
            std::env::var_os("BRIGADE_REQUIRE_SHARED").is_none(),
            "{} not found and BRIGADE_REQUIRE_SHARED is set",
            tok.display()
        );
        eprintln!("skipped: {} not found (the shared models folder is absent)", tok.display());
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    std::fs::write(p.join("t.txt"), "the cat sat on the mat and looked at the hat. ".repeat(300)).unwrap();
    let tok = tok.to_str().unwrap();
    let mut args = vec!["train", "--data", "t.txt", "--tokenizer", tok, "--seq", "16", "--out", "ck"];
    args.extend_from_slice(QUICK);
    let out = brigade(&args, p);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // the vocabulary grew to the tokenizer's, and the tokenizer travels with the checkpoint
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(p.join("ck/config.json")).unwrap()).unwrap();
    assert_eq!(cfg["vocab_size"], 30522);
    assert!(p.join("ck/tokenizer.json").exists());
    let out = brigade(&["sample", "--checkpoint", "ck", "--prompt", "the cat", "--max-tokens", "4"], p);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn plan_prints_json_with_the_best_layout_and_refuses_bad_input() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    let out = brigade(
        &[
            "plan",
            "--model",
            "gpt3-175b",
            "--gpu",
            "a100-80gb",
            "--gpus",
            "1024",
            "--global-batch",
            "1536",
            "--tokens",
            "300e9",
            "--json",
        ],
        p,
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let best = &v["best"];
    for k in [
        "tp",
        "pp",
        "dp",
        "mb",
        "v",
        "recompute",
        "zero",
        "step_time_s",
        "model_tflops_per_gpu",
        "hw_tflops_per_gpu",
        "mfu",
        "memory_gib_per_gpu",
        "fits",
    ] {
        assert!(!best[k].is_null(), "best lacks {k}: {best}");
    }
    assert_eq!(best["fits"], true);
    let gpus = best["tp"].as_u64().unwrap() * best["pp"].as_u64().unwrap() * best["dp"].as_u64().unwrap();
    assert_eq!(gpus, 1024);
    // the days, exactly: 300e9 tokens in steps of 1536 sequences of the model's length, each
    // taking the best layout's step time; and the rate it prints beside them
    let seq = v["model"]["seq"].as_f64().unwrap();
    let step_s = best["step_time_s"].as_f64().unwrap();
    let days = step_s * 300e9 / (1536.0 * seq) / 86400.0;
    assert!((v["train_days"].as_f64().unwrap() / days - 1.0).abs() < 1e-9, "{} days, {days} here", v["train_days"]);
    assert!((v["tokens_per_s"].as_f64().unwrap() * step_s / (1536.0 * seq) - 1.0).abs() < 1e-9);
    assert_eq!(seq, 2048.0, "GPT-3's sequence");
    assert_eq!(v["single_gpu"]["fits"], false);
    // a fixed field stays fixed
    let out = brigade(
        &[
            "plan",
            "--layers",
            "24",
            "--hidden",
            "2048",
            "--heads",
            "16",
            "--seq",
            "2048",
            "--vocab",
            "50257",
            "--gpus",
            "16",
            "--global-batch",
            "64",
            "--layout",
            "tp=2,recompute=full",
            "--json",
        ],
        p,
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["best"]["tp"], 2);
    assert_eq!(v["best"]["recompute"], "full");
    let base = ["plan", "--gpus", "8", "--global-batch", "16"];
    let with =
        |extra: &[&'static str]| -> Vec<&'static str> { base.iter().copied().chain(extra.iter().copied()).collect() };
    fails_with(&with(&["--model", "gpt5"]), p, "known: gpt2-small");
    fails_with(&with(&["--model", "gpt3-13b", "--gpu", "tpu"]), p, "known: a100-40gb");
    fails_with(&with(&["--model", "gpt3-13b", "--hidden", "1024"]), p, "--hidden contradicts --model");
    fails_with(
        &with(&["--model", "gpt3-13b", "--layout", "tp=16"]),
        p,
        "fixes tp = 16, which does not divide --gpus 8; the axes not given (pp, cp, dp) take the rest",
    );
    fails_with(&with(&["--model", "gpt3-13b", "--layout", "tp=3"]), p, "fixes tp = 3, which does not divide --gpus 8");
    fails_with(
        &with(&["--model", "gpt3-13b", "--layout", "tp=2,pp=2,dp=1"]),
        p,
        "tp·pp·cp·dp = 4 does not match --gpus 8",
    );
    fails_with(&with(&["--model", "gpt3-13b", "--layout", "tp=2,foo=1"]), p, "unknown layout field 'foo'");
    fails_with(&with(&["--model", "llama3-405b", "--gpu", "a100-40gb"]), p, "the smallest needs");
    fails_with(&with(&["--layers", "2"]), p, "--hidden is required");
}

#[test]
fn plan_local_predicts_a_step_from_measurements() {
    let d = tempfile::tempdir().unwrap();
    let out = brigade(
        &["plan", "--local", "--model", "tiny", "--seq", "32", "--batch", "2", "--threads", "1", "--json"],
        d.path(),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = &v["prediction"];
    let parts: f64 =
        ["matmul_s", "attention_s", "elementwise_s", "optimizer_s"].iter().map(|k| p[k].as_f64().unwrap()).sum();
    assert!(p["step_s"].as_f64().unwrap() > 0.0);
    assert!((parts - p["step_s"].as_f64().unwrap()).abs() < 1e-12);
    fails_with(&["plan", "--local", "--model", "tiny", "--seq", "65"], d.path(), "block_size");
}

#[test]
fn train_writes_a_chrome_trace_timeline() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    let out = brigade(
        &[
            "train",
            "--steps",
            "3",
            "--batch",
            "8",
            "--micro-batch",
            "4",
            "--threads",
            "1",
            "--eval-every",
            "2",
            "--trace",
            "t.json",
        ],
        p,
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p.join("t.json")).unwrap()).unwrap();
    let ev = v["traceEvents"].as_array().unwrap();
    let count = |name: &str| ev.iter().filter(|e| e["name"] == name).count();
    assert_eq!((count("forward mb0"), count("backward mb1"), count("adamw"), count("evaluate")), (3, 3, 3, 1));
    assert!(ev.iter().all(|e| e["ph"] == "X" && e["dur"].as_f64().unwrap() >= 0.0));
    // within a step: data, then forward/backward, then the gradient's norm, then the optimizer
    let start = |name: &str, step: u64| {
        ev.iter().find(|e| e["name"] == name && e["args"]["step"] == step).unwrap()["ts"].as_f64().unwrap()
    };
    assert!(
        start("data", 2) < start("forward mb0", 2)
            && start("backward mb1", 2) < start("gradient norm", 2)
            && start("gradient norm", 2) < start("adamw", 2)
    );
}

/// `BRIGADE_SIMD=avx2` holds every kernel to its AVX2 path (on this machine too, whatever it
/// has): the embedding benchmark reports the 256-bit paths and brigade's own matrix kernel; a
/// value it does not know, or the `gemm` crate (AVX-512 inside) asked for beside it, is refused
/// with one line before any work.
#[test]
fn brigade_simd_avx2_holds_the_kernels_to_avx2() {
    let d = tempfile::tempdir().unwrap();
    let run = |simd: &str, matmul: Option<&str>, args: &[&str]| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_brigade"));
        c.args(args).current_dir(d.path()).env("BRIGADE_SIMD", simd).env_remove("BRIGADE_MATMUL");
        if let Some(m) = matmul {
            c.env("BRIGADE_MATMUL", m);
        }
        c.output().unwrap()
    };
    let plan = ["plan", "--model", "gpt2-small", "--gpu", "a100-80gb", "--gpus", "8", "--global-batch", "8"];
    for (simd, matmul, named) in [
        ("avx512", None, "BRIGADE_SIMD=avx512 is not understood"),
        ("avx2", Some("gemm-crate"), "BRIGADE_MATMUL=gemm-crate would use AVX-512"),
        ("auto", Some("fast"), "BRIGADE_MATMUL=fast is not understood"),
    ] {
        let o = run(simd, matmul, &plan);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{simd} {matmul:?}: {err}");
        assert!(err.contains(named) && err.trim().lines().count() == 1, "{err}");
    }
    assert!(run("avx2", None, &plan).status.success());
    let Some(model) = common::shared("models/all-MiniLM-L6-v2") else { return };
    if !brigade::tensor::sgemm::runs_here() {
        eprintln!("skipped: no AVX2 here");
        return;
    }
    let bench = ["bench", "embed", "--model", model.to_str().unwrap(), "--docs", "16", "--json"];
    let o = run("avx2", None, &bench);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((v["simd"].as_str(), v["matmul_kernel"].as_str()), (Some("avx2"), Some("brigade")), "{v}");
    assert!(v["rows_gflops_two_1_thread_products"].as_f64().is_some_and(|r| r > 0.0), "{v}");
    // the cores' peak is measured at the width the kernels are held to, and each row's share of it
    assert!(v["fma_peak_gflops_two_1_thread"].as_f64().is_some_and(|r| r > 0.0), "{v}");
    assert!(
        v["rows"].as_array().unwrap().iter().all(|r| r["fma_peak_fraction"].as_f64().is_some_and(|f| f > 0.0)),
        "{v}"
    );
}
