//! `brigade embed` as its users run it: a corpus embedded across workers, killed at every
//! step of a shard's commit and at random moments (SIGKILL), resumed with the same command,
//! and compared byte for byte with an uninterrupted run; bad input refused with one line.
//! Needs ../shared/models/all-MiniLM-L6-v2 (skips with a message when absent).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn model() -> Option<String> {
    Some(common::shared("models/all-MiniLM-L6-v2")?.canonicalize().unwrap().display().to_string())
}

fn cmd(args: &[&str], cwd: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_brigade"));
    c.args(args).current_dir(cwd);
    c
}

mod common;
use common::{brigade as run, fails_with};

/// Standard output of a successful run.
fn ok(args: &[&str], cwd: &Path) -> String {
    String::from_utf8_lossy(&common::ok(args, cwd).stdout).into_owned()
}

/// Pseudo-sentences of 3 to 40 words, some long enough to be truncated at 256 tokens.
fn corpus(n: usize) -> String {
    let words = [
        "parallel", "shard", "vector", "the", "model", "naïve", "東京", "🙂", "resume", "kill", "token", "of", "A",
        "encoder",
    ];
    let mut s = String::new();
    for i in 0..n {
        let k = if i % 97 == 5 { 400 } else { 3 + (i * 7) % 38 };
        let line: Vec<&str> = (0..k).map(|j| words[(i * 31 + j * 17) % words.len()]).collect();
        s.push_str(&line.join(" "));
        s.push('\n');
    }
    s
}

/// Every file of a directory with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap())
        })
        .collect()
}

fn job_args<'a>(model: &'a str, out: &'a str) -> Vec<&'a str> {
    vec![
        "embed",
        "--model",
        model,
        "--input",
        "a.txt",
        "b.txt",
        "--output",
        out,
        "--workers",
        "2",
        "--shard-size",
        "20",
        "--max-batch-tokens",
        "300",
    ]
}

fn setup(n: usize) -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let text = corpus(n);
    let (a, b) = text.split_at(text[..text.len() / 2].rfind('\n').unwrap() + 1);
    std::fs::write(d.path().join("a.txt"), a).unwrap();
    std::fs::write(d.path().join("b.txt"), b).unwrap();
    let p = d.path().to_path_buf();
    (d, p)
}

#[test]
fn killed_anywhere_and_resumed_gives_the_uninterrupted_bytes() {
    let Some(m) = model() else { return };
    let (_d, dir) = setup(300);
    ok(&job_args(&m, "ref"), &dir);
    let want = snapshot(&dir.join("ref"));
    assert_eq!(want.len(), 1 + 2 * 15, "15 shards of 20 and the manifest: {:?}", want.keys());
    ok(&["embed", "--verify", "ref"], &dir);

    // a crash at each step of a shard's commit and of the manifest's, each leaving the window it
    // names: (point, files there, files not there, the manifest's `complete`)
    type Window = (&'static str, &'static [&'static str], &'static [&'static str], bool);
    let points: [Window; 6] = [
        ("npy-written:3", &["shard-00003.npy.tmp"], &["shard-00003.ids.tmp", "shard-00003.stats.json"], false),
        (
            "stats-written:5",
            &["shard-00005.npy.tmp", "shard-00005.ids.tmp", "shard-00005.stats.json"],
            &["shard-00005.npy"],
            false,
        ),
        (
            "npy-renamed:7",
            &["shard-00007.npy", "shard-00007.ids.tmp"],
            &["shard-00007.ids", "shard-00007.npy.tmp"],
            false,
        ),
        ("committed:2", &["shard-00002.ids", "shard-00002.claim"], &["shard-00002.ids.tmp"], false),
        ("before-manifest:0", &["shard-00014.ids", "shard-00014.stats.json"], &["shard-00014.claim"], false),
        ("manifest-written:0", &["shard-00000.stats.json"], &["manifest.json.tmp"], true),
    ];
    for (k, (point, there, absent, complete)) in points.iter().enumerate() {
        let out = format!("crash{k}");
        let res = cmd(&job_args(&m, &out), &dir).env("BRIGADE_EMBED_CRASH", point).output().unwrap();
        assert!(!res.status.success(), "{point}: the planted crash did not happen");
        let left = snapshot(&dir.join(&out));
        for f in *there {
            assert!(left.contains_key(*f), "{point}: {f} should be there: {:?}", left.keys());
        }
        for f in *absent {
            assert!(!left.contains_key(*f), "{point}: {f} should not be there yet: {:?}", left.keys());
        }
        let manifest: serde_json::Value = serde_json::from_slice(&left["manifest.json"]).unwrap();
        assert_eq!(manifest["complete"], *complete, "{point}");
        assert!(
            left.len() < want.len() || left.keys().any(|n| !want.contains_key(n)) || left != want,
            "{point}: nothing to resume"
        );
        let said = ok(&job_args(&m, &out), &dir);
        assert_eq!(
            snapshot(&dir.join(&out)),
            want,
            "{point}: resumed output differs from the uninterrupted run ({said})"
        );
        ok(&["embed", "--verify", &out], &dir);
    }

    // SIGKILL at moments of the run: right after start, after some shards, past half of the 15
    for (k, after) in [0usize, 3, 8].iter().enumerate() {
        let out = format!("kill{k}");
        let mut child = cmd(&job_args(&m, &out), &dir).stdout(std::process::Stdio::null()).spawn().unwrap();
        wait_for_shards(&mut child, &dir.join(&out), *after);
        // the job was really cut short: still running when killed, its output unfinished
        assert!(child.try_wait().unwrap().is_none(), "killed after {after} shards: the job had already ended");
        child.kill().ok();
        child.wait().unwrap();
        assert_ne!(snapshot(&dir.join(&out)), want, "killed after {after} shards: the output was already complete");
        ok(&job_args(&m, &out), &dir);
        assert_eq!(snapshot(&dir.join(&out)), want, "killed after {after} shards: resumed output differs");
    }

    // a finished job run again does nothing and changes nothing
    let said = ok(&job_args(&m, "ref"), &dir);
    assert!(said.contains("nothing to do"), "{said}");
    assert_eq!(snapshot(&dir.join("ref")), want);
}

/// Waits until the job in `out` has started (its manifest names it) and holds at least `n`
/// finished shards, or the child ends, or two minutes pass.
fn wait_for_shards(child: &mut std::process::Child, out: &Path, n: usize) {
    let t0 = Instant::now();
    loop {
        let done = std::fs::read_dir(out)
            .map(|r| r.filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".ids")).count())
            .unwrap_or(0);
        let started = out.join("manifest.json").exists();
        if started && done >= n || child.try_wait().unwrap().is_some() || t0.elapsed() > Duration::from_secs(120) {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn signal(child: &std::process::Child, sig: &str) {
    assert!(Command::new("kill").args([sig, &child.id().to_string()]).status().unwrap().success());
}

#[test]
fn ctrl_c_is_acknowledged_keeps_finished_shards_and_a_rerun_completes_the_job() {
    let Some(m) = model() else { return };
    let (_d, dir) = setup(300);
    ok(&job_args(&m, "ref"), &dir);
    let want = snapshot(&dir.join("ref"));
    for (out, twice) in [("once", false), ("twice", true)] {
        let mut child = cmd(&job_args(&m, out), &dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        wait_for_shards(&mut child, &dir.join(out), 3);
        assert!(child.try_wait().unwrap().is_none(), "{out}: the job ended before the interrupt");
        // standard error read as it comes, so that the second interrupt is sent only once the
        // first was seen (two signals sent together may arrive as one)
        let mut stderr = common::Stderr::follow(&mut child);
        signal(&child, "-INT");
        if twice {
            stderr.wait_for("interrupted — finishing", Duration::from_secs(60));
            signal(&child, "-INT");
        }
        let status = child.wait().unwrap();
        let err = stderr.all();
        assert_eq!(status.code(), Some(130), "{out}: {err}");
        assert!(err.contains("interrupted — finishing the shards in progress, then stopping"), "{out}: {err}");
        if twice {
            assert!(err.contains("interrupted again: quit at once; the finished shards are kept"), "{err}");
        } else {
            // the job says how far it got and how to go on
            let said = err.lines().find(|l| l.starts_with("error: interrupted: ")).unwrap_or_else(|| panic!("{err}"));
            assert!(
                said.contains("of 15 shards are complete") && said.contains("run the same command again"),
                "{said}"
            );
            let done: usize = said["error: interrupted: ".len()..].split(' ').next().unwrap().parse().unwrap();
            assert!((3..15).contains(&done), "{said}");
            let left = snapshot(&dir.join(out));
            assert_eq!(left.keys().filter(|k| k.ends_with(".npy")).count(), done, "{:?}", left.keys());
        }
        assert_ne!(snapshot(&dir.join(out)), want, "{out}: the output was complete despite the interrupt");
        let said = ok(&job_args(&m, out), &dir);
        assert!(said.contains("resumed:"), "{out}: {said}");
        assert_eq!(snapshot(&dir.join(out)), want, "{out}: resumed output differs from the uninterrupted run");
    }
}

#[test]
fn outputs_match_a_single_worker_and_keep_input_order() {
    let Some(m) = model() else { return };
    let (_d, dir) = setup(120);
    ok(&job_args(&m, "two"), &dir);
    ok(
        &[
            "embed",
            "--model",
            &m,
            "--input",
            "a.txt",
            "b.txt",
            "--output",
            "one",
            "--workers",
            "1",
            "--threads",
            "2",
            "--shard-size",
            "20",
            "--max-batch-tokens",
            "300",
        ],
        &dir,
    );
    let (two, one) = (snapshot(&dir.join("two")), snapshot(&dir.join("one")));
    assert_eq!(two, one, "worker and thread counts do not change a byte");
    let ids = String::from_utf8(two["shard-00001.ids"].clone()).unwrap();
    assert_eq!(ids.lines().collect::<Vec<_>>(), (20..40).map(|i| i.to_string()).collect::<Vec<_>>());
    // each vector is the model's vector of that line embedded alone (other batch, no packing)
    let lines: Vec<String> = corpus(120).lines().map(str::to_string).collect();
    // every one of the 120, shard by shard, in the order its ids file names them
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    let alone = brigade_embed_alone(&m, &refs);
    for k in 0..6 {
        let ids = String::from_utf8(two[&format!("shard-{k:05}.ids")].clone()).unwrap();
        let ids: Vec<usize> = ids.lines().map(|l| l.parse().unwrap()).collect();
        assert_eq!(ids, (20 * k..20 * k + 20).collect::<Vec<_>>(), "shard {k}");
        let (rows, dim, v) = brigade::embed::npy::read(&two[&format!("shard-{k:05}.npy")]).unwrap();
        assert_eq!((rows, dim), (20, 384), "shard {k}");
        for (r, &line) in ids.iter().enumerate() {
            let (got, want) = (&v[r * 384..(r + 1) * 384], &alone[line * 384..(line + 1) * 384]);
            let d = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(d < 1e-5, "line {line}: its vector differs from the document embedded alone by {d}");
        }
    }
    let man: serde_json::Value = serde_json::from_slice(&two["manifest.json"]).unwrap();
    assert_eq!(man["totals"]["documents"], 120);
    assert_eq!(man["totals"]["truncated"], 2, "lines 5 and 102 have 400 words");
}

fn brigade_embed_alone(model: &str, texts: &[&str]) -> Vec<f32> {
    let enc = brigade::embed::Encoder::load(Path::new(model)).unwrap();
    texts.iter().flat_map(|t| enc.embed(&[t]).unwrap()).collect()
}

#[test]
fn jsonl_input_errors_and_ids() {
    let Some(m) = model() else { return };
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    std::fs::write(
        dir.join("c.jsonl"),
        "{\"id\": \"doc-a\", \"text\": \"first\"}\n{\"id\": 17, \"text\": \"\"}\n{\"id\": \"doc-c\", \"text\": \n\n{\"id\": \"doc-d\", \"body\": \"x\"}\n{\"id\": \"doc-e\", \"text\": \"last\"}\n",
    )
    .unwrap();
    let base = ["embed", "--model", &m, "--input", "c.jsonl", "--workers", "1"];
    let with = |extra: &[&'static str]| -> Vec<String> {
        base.iter().map(|s| s.to_string()).chain(extra.iter().map(|s| s.to_string())).collect()
    };
    let args = with(&["--output", "o1"]);
    fails_with(&args.iter().map(String::as_str).collect::<Vec<_>>(), dir, "c.jsonl:3: malformed JSON");
    let args = with(&["--output", "o2", "--on-error", "skip"]);
    let said = ok(&args.iter().map(String::as_str).collect::<Vec<_>>(), dir);
    assert!(said.contains("skipped c.jsonl:3") && said.contains("skipped c.jsonl:5"), "{said}");
    assert!(said.contains("1 empty"), "{said}");
    let ids = std::fs::read_to_string(dir.join("o2/shard-00000.ids")).unwrap();
    assert_eq!(ids, "doc-a\n17\ndoc-e\n");
    let man: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("o2/manifest.json")).unwrap()).unwrap();
    assert_eq!(man["skipped"].as_array().unwrap().len(), 2);
    assert!(man["skipped"][1]["reason"].as_str().unwrap().contains("no 'text' field"));
    ok(&["embed", "--verify", "o2"], dir);
    // another job's output is refused, then replaced with --overwrite
    std::fs::write(dir.join("d.jsonl"), "{\"id\": \"x\", \"text\": \"a\"}\n{\"id\": \"x\", \"text\": \"b\"}\n")
        .unwrap();
    fails_with(
        &["embed", "--model", &m, "--input", "d.jsonl", "--output", "o3"],
        dir,
        "duplicate id \"x\": d.jsonl:1 and d.jsonl:2",
    );
    std::fs::write(dir.join("e.txt"), "one\ntwo\n").unwrap();
    fails_with(
        &["embed", "--model", &m, "--input", "e.txt", "--output", "o2"],
        dir,
        "holds another job's vectors (its input files, settings differ)",
    );
    ok(&["embed", "--model", &m, "--input", "e.txt", "--output", "o2", "--overwrite"], dir);
    assert_eq!(std::fs::read_to_string(dir.join("o2/shard-00000.ids")).unwrap(), "0\n1\n");
    ok(&["embed", "--verify", "o2"], dir);
}

#[test]
fn bad_input_is_refused_with_one_line() {
    let Some(m) = model() else { return };
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    std::fs::write(dir.join("e.txt"), "").unwrap();
    std::fs::write(dir.join("t.txt"), "hello\n").unwrap();
    fails_with(&["embed", "--model", &m, "--input", "nope.txt", "--output", "o"], dir, "nope.txt");
    fails_with(&["embed", "--model", &m, "--input", "e.txt", "--output", "o"], dir, "no documents");
    fails_with(
        &["embed", "--model", "no-model", "--input", "t.txt", "--output", "o"],
        dir,
        "model folder no-model not found",
    );
    fails_with(
        &["embed", "--model", &m, "--input", "t.txt", "--output", "o", "--shard-size", "0"],
        dir,
        "--shard-size 0",
    );
    fails_with(&["embed", "--model", &m, "--output", "o"], dir, "--input");
    fails_with(&["embed", "--verify", "o"], dir, "o is not a brigade embed output (no manifest.json)");
    fails_with(
        &["embed", "--model", &m, "--input", "t.txt", "--output", "o", "--workers", "2", "--backend", "mpi"],
        dir,
        "--workers is for the local backend",
    );
    std::fs::create_dir(dir.join("mine")).unwrap();
    std::fs::write(dir.join("mine/notes.txt"), "keep me").unwrap();
    fails_with(
        &["embed", "--model", &m, "--input", "t.txt", "--output", "mine", "--overwrite"],
        dir,
        "did not write (e.g. notes.txt)",
    );
    assert_eq!(std::fs::read_to_string(dir.join("mine/notes.txt")).unwrap(), "keep me");
    // an unsupported pooling mode or architecture is named
    let bad = dir.join("bad-model");
    std::fs::create_dir_all(bad.join("1_Pooling")).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json", "modules.json", "sentence_bert_config.json"] {
        std::os::unix::fs::symlink(Path::new(&m).join(f), bad.join(f)).unwrap();
    }
    std::fs::write(
        bad.join("1_Pooling/config.json"),
        "{\"word_embedding_dimension\": 384, \"pooling_mode_fancy\": true}",
    )
    .unwrap();
    fails_with(
        &["embed", "--model", "bad-model", "--input", "t.txt", "--output", "o"],
        dir,
        "pooling mode 'pooling_mode_fancy' is not supported; supported: pooling_mode_cls_token",
    );
    std::fs::remove_file(bad.join("config.json")).unwrap();
    std::fs::write(bad.join("config.json"), "{\"model_type\": \"roberta\"}").unwrap();
    fails_with(
        &["embed", "--model", "bad-model", "--input", "t.txt", "--output", "o"],
        dir,
        "model_type 'roberta' is not supported",
    );
    // verify names what is wrong with a damaged output
    ok(&["embed", "--model", &m, "--input", "t.txt", "--output", "good", "--workers", "1"], dir);
    let npy = dir.join("good/shard-00000.npy");
    let mut b = std::fs::read(&npy).unwrap();
    let last = b.len() - 1;
    b[last] ^= 1;
    std::fs::write(&npy, b).unwrap();
    fails_with(&["embed", "--verify", "good"], dir, "failed verification");
    std::fs::remove_file(dir.join("good/shard-00000.ids")).unwrap();
    let out = run(&["embed", "--verify", "good"], dir);
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing"));
}
