//! `brigade tokenize` as its users run it: a corpus of documents tokenized across workers,
//! killed twice at planted points of a shard's commit and resumed with the same command, byte
//! for byte the uninterrupted run; the shards hold exactly what the `tokenizers` library gives
//! each document (BOS/EOS as the tokenizer's config says), `--verify` names planted damage,
//! training reads the folder, and bad input is refused with one line and nothing written.
//! Needs ../shared/tokenizers (skips with a message when absent).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::fails_with;

fn tokenizer(name: &str) -> Option<String> {
    Some(common::shared(&format!("tokenizers/{name}"))?.canonicalize().unwrap().display().to_string())
}

fn ok(args: &[&str], cwd: &Path) -> String {
    String::from_utf8_lossy(&common::ok(args, cwd).stdout).into_owned()
}

/// Standard output and error of a successful run (training logs its steps on standard error).
fn log(args: &[&str], cwd: &Path) -> String {
    let out = common::ok(args, cwd);
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap())
        })
        .collect()
}

/// A folder `docs/` of `n` documents (files) of a few lines each, with non-ASCII text, and an
/// empty file (an empty document, as training's folder reader takes it): the texts in order.
fn corpus(dir: &Path, n: usize) -> Vec<String> {
    let words = ["parallel", "shard", "naïve", "東京", "🙂", "resume", "token", "of", "A", "\n", "  "];
    std::fs::create_dir_all(dir.join("docs")).unwrap();
    let mut texts = Vec::new();
    for i in 0..n {
        let k = 5 + (i * 13) % 60;
        let text: String = (0..k).map(|j| format!("{} ", words[(i * 7 + j * 3) % words.len()])).collect();
        std::fs::write(dir.join(format!("docs/{i:03}.txt")), &text).unwrap();
        texts.push(text);
    }
    std::fs::write(dir.join("docs/zzz-empty.txt"), "").unwrap();
    texts.push(String::new());
    texts
}

fn job<'a>(tok: &'a str, out: &'a str) -> Vec<&'a str> {
    vec!["tokenize", "--tokenizer", tok, "--input", "docs", "--output", out, "--workers", "2", "--shard-size", "4"]
}

/// Documents of a Megatron dataset `prefix` (.bin + .idx, version 1) read with no help from
/// brigade: the layout Megatron-Core documents.
fn megatron_docs(prefix: &Path) -> Vec<Vec<u32>> {
    let idx = std::fs::read(prefix.with_extension("idx")).unwrap();
    let bin = std::fs::read(prefix.with_extension("bin")).unwrap();
    assert_eq!(&idx[..9], b"MMIDIDX\x00\x00");
    let w = match idx[17] {
        8 => 2,
        4 => 4,
        c => panic!("dtype {c}"),
    };
    let n = u64::from_le_bytes(idx[18..26].try_into().unwrap()) as usize;
    let lens: Vec<usize> =
        (0..n).map(|i| u32::from_le_bytes(idx[34 + 4 * i..38 + 4 * i].try_into().unwrap()) as usize).collect();
    let ptr = |i: usize| u64::from_le_bytes(idx[34 + 4 * n + 8 * i..42 + 4 * n + 8 * i].try_into().unwrap()) as usize;
    (0..n)
        .map(|i| {
            bin[ptr(i)..ptr(i) + lens[i] * w]
                .chunks_exact(w)
                .map(|c| {
                    if w == 2 {
                        u16::from_le_bytes([c[0], c[1]]) as u32
                    } else {
                        u32::from_le_bytes(c.try_into().unwrap())
                    }
                })
                .collect()
        })
        .collect()
}

/// Every document of a tokenize output, in order.
fn all_docs(out: &Path) -> Vec<Vec<u32>> {
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    m["shards"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| megatron_docs(&out.join(s["prefix"].as_str().unwrap())))
        .collect()
}

#[test]
fn killed_twice_and_resumed_gives_the_uninterrupted_bytes_and_the_tokenizers_ids() {
    let Some(tok) = tokenizer("llama3") else { return };
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let texts = corpus(dir, 30);
    let said = ok(&job(&tok, "ref"), dir);
    assert!(said.contains("tokenized 31 documents") && said.contains("8 shards"), "{said}");
    let want = snapshot(&dir.join("ref"));
    assert_eq!(want.len(), 1 + 2 * 8, "{:?}", want.keys());
    ok(&["tokenize", "--verify", "ref"], dir);

    // the ids are the tokenizers library's, BOS first (Llama 3 adds <|begin_of_text|>), EOS last
    let t = tokenizers::Tokenizer::from_file(format!("{tok}/tokenizer.json")).unwrap();
    let docs = all_docs(&dir.join("ref"));
    assert_eq!(docs.len(), texts.len());
    for (got, text) in docs.iter().zip(&texts) {
        let mut ids = vec![128000];
        ids.extend(t.encode(text.as_str(), false).unwrap().get_ids());
        ids.push(128009);
        assert_eq!(got, &ids);
    }

    // killed in two windows of two shards' commits, then resumed: the uninterrupted bytes. The
    // second window is in a shard the first run left unfinished: its two workers race, so which
    // shards the first run committed before its crash is the scheduler's choice (a fixed shard 5
    // was sometimes already committed, and the second run never reached it).
    for k in 0..2 {
        let point = if k == 0 {
            "stats-written:2".to_string()
        } else {
            let left = snapshot(&dir.join("crashed"));
            let open = (0..8).rev().find(|i| !left.contains_key(&format!("shard-{i:05}.bin")));
            format!("bin-renamed:{}", open.expect("the first crash left shard 2 unfinished"))
        };
        let res = Command::new(env!("CARGO_BIN_EXE_brigade"))
            .args(job(&tok, "crashed"))
            .current_dir(dir)
            .env("BRIGADE_TOKENIZE_CRASH", &point)
            .output()
            .unwrap();
        assert!(!res.status.success(), "{point}: the planted crash did not happen");
        assert_ne!(snapshot(&dir.join("crashed")), want, "{point}: nothing left to resume");
    }
    let said = ok(&job(&tok, "crashed"), dir);
    assert!(said.contains("resumed:"), "{said}");
    assert_eq!(snapshot(&dir.join("crashed")), want, "resumed output differs from the uninterrupted run");
    let again = ok(&job(&tok, "crashed"), dir);
    assert!(again.contains("nothing to do"), "{again}");

    // one worker, or one line a document: other jobs, other bytes only where they should be
    ok(
        &["tokenize", "--tokenizer", &tok, "--input", "docs", "--output", "one", "--workers", "1", "--shard-size", "4"],
        dir,
    );
    assert_eq!(snapshot(&dir.join("one")), want, "the shards do not depend on the number of workers");
}

#[test]
fn verify_names_planted_damage() {
    let Some(tok) = tokenizer("gpt2") else { return };
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    corpus(dir, 12);
    ok(&job(&tok, "out"), dir);
    let good = snapshot(&dir.join("out"));
    type Plant = fn(&Path);
    let cases: [(&str, Plant, &str); 4] = [
        ("a flipped token", |o| flip(&o.join("shard-00001.bin")), "shard 1: shard-00001.bin does not match its sha256"),
        (
            "a missing index",
            |o| std::fs::remove_file(o.join("shard-00002.idx")).unwrap(),
            "shard 2: shard-00002.bin or shard-00002.idx is missing",
        ),
        (
            "a stray file",
            |o| std::fs::write(o.join("shard-00000.claim"), b"").unwrap(),
            "shard-00000.claim is not part of the output",
        ),
        (
            "a cut index",
            |o| {
                let p = o.join("shard-00000.idx");
                let b = std::fs::read(&p).unwrap();
                std::fs::write(p, &b[..b.len() - 8]).unwrap()
            },
            "shard 0: shard-00000.idx does not match its sha256",
        ),
    ];
    for (name, plant, want) in cases {
        for (f, b) in &good {
            std::fs::write(dir.join("out").join(f), b).unwrap();
        }
        ok(&["tokenize", "--verify", "out"], dir);
        plant(&dir.join("out"));
        let e = fails_with(&["tokenize", "--verify", "out"], dir, "failed verification");
        assert!(e.contains(want), "{name}: {e}");
        let _ = std::fs::remove_file(dir.join("out/shard-00000.claim"));
    }
}

fn flip(p: &PathBuf) {
    let mut b = std::fs::read(p).unwrap();
    b[3] ^= 1;
    std::fs::write(p, b).unwrap();
}

#[test]
fn jsonl_records_and_lines_and_bad_input() {
    let Some(tok) = tokenizer("gpt2") else { return };
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    std::fs::write(dir.join("a.jsonl"), "{\"text\": \"one\", \"id\": 9}\n\n{\"body\": \"x\", \"text\": \"two\"}\n")
        .unwrap();
    let said = ok(&["tokenize", "--tokenizer", &tok, "--input", "a.jsonl", "--output", "j", "--workers", "1"], dir);
    assert!(said.contains("tokenized 2 documents"), "{said}");
    let t = tokenizers::Tokenizer::from_file(format!("{tok}/tokenizer.json")).unwrap();
    let enc = |s: &str| {
        let mut v: Vec<u32> = t.encode(s, false).unwrap().get_ids().to_vec();
        v.push(50256);
        v
    };
    assert_eq!(all_docs(&dir.join("j")), [enc("one"), enc("two")]);
    std::fs::write(dir.join("l.txt"), "first line\nsecond\n").unwrap();
    ok(
        &["tokenize", "--tokenizer", &tok, "--input", "l.txt", "--format", "lines", "--output", "l", "--workers", "1"],
        dir,
    );
    assert_eq!(all_docs(&dir.join("l")), [enc("first line"), enc("second")]);

    // a record without the field, a broken line: named with file and line, nothing written
    std::fs::write(dir.join("bad.jsonl"), "{\"text\": \"ok\"}\n{\"txt\": \"no\"}\n").unwrap();
    let tk = |input: &str, out: &str| {
        vec![
            "tokenize".to_string(),
            "--tokenizer".into(),
            tok.clone(),
            "--input".into(),
            input.into(),
            "--output".into(),
            out.into(),
        ]
    };
    let run = |a: Vec<String>, want: &str| {
        let a: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
        fails_with(&a, dir, want)
    };
    run(tk("bad.jsonl", "b1"), "bad.jsonl:2: no 'text' field");
    std::fs::write(dir.join("broken.jsonl"), "{\"text\": \"ok\"}\n{\"text\": \n").unwrap();
    run(tk("broken.jsonl", "b2"), "broken.jsonl:2: malformed JSON");
    assert!(!dir.join("b1").exists() && !dir.join("b2").exists(), "a refused job wrote nothing");
    run(tk("nope.txt", "b3"), "nope.txt");
    // another job's output, and a folder holding other files, are not written into
    std::fs::create_dir(dir.join("mine")).unwrap();
    std::fs::write(dir.join("mine/notes.txt"), "keep").unwrap();
    run(tk("l.txt", "mine"), "did not write");
    run(tk("l.txt", "j"), "another job's tokens");
    run(vec!["tokenize".into(), "--verify".into(), "mine".into()], "no manifest.json");
    run(
        vec![
            "tokenize".into(),
            "--tokenizer".into(),
            "nowhere".into(),
            "--input".into(),
            "l.txt".into(),
            "--output".into(),
            "x".into(),
        ],
        "nowhere",
    );
    run(
        vec![
            "tokenize".into(),
            "--tokenizer".into(),
            tok.clone(),
            "--input".into(),
            "a.jsonl".into(),
            "l.txt".into(),
            "--output".into(),
            "x".into(),
        ],
        "mixes JSON Lines",
    );
    assert_eq!(std::fs::read(dir.join("mine/notes.txt")).unwrap(), b"keep");
}

#[test]
fn training_reads_the_shards_and_refuses_another_tokenizers() {
    let (Some(gpt2), Some(qwen)) = (tokenizer("gpt2"), tokenizer("qwen2")) else { return };
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    corpus(dir, 40);
    ok(&job(&gpt2, "toks"), dir);
    let train = |data: &str, tok: &str| {
        log(
            &[
                "train",
                "--model",
                "tiny",
                "--data",
                data,
                "--tokenizer",
                tok,
                "--steps",
                "3",
                "--seq",
                "32",
                "--batch",
                "2",
                "--threads",
                "1",
            ],
            dir,
        )
    };
    let loss = |s: &str| {
        s.lines()
            .filter(|l| l.starts_with("step "))
            .map(|l| l.split("loss ").nth(1).unwrap().split_whitespace().next().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let (files, shards) = (train("docs", &gpt2), train("toks", &gpt2));
    assert_eq!(loss(&files).len(), 3, "{files}");
    assert_eq!(loss(&files), loss(&shards), "the shards train as the files they were made from");
    let e = fails_with(
        &["train", "--model", "tiny", "--data", "toks", "--tokenizer", &qwen, "--steps", "1"],
        dir,
        "another tokenizer",
    );
    assert!(e.contains("tokenize it again"), "{e}");
    // an unfinished output is not trained on
    let m = dir.join("toks/manifest.json");
    let text = std::fs::read_to_string(&m).unwrap().replace("\"complete\": true", "\"complete\": false");
    std::fs::write(&m, text).unwrap();
    fails_with(
        &["train", "--model", "tiny", "--data", "toks", "--tokenizer", &gpt2, "--steps", "1"],
        dir,
        "unfinished",
    );
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(|s| s.as_str()).collect()
}

/// Parquet written by pyarrow (scripts/make_parquet_fixtures.py): a row a document, shards
/// crossing row groups, snappy and zstd; a null row refused by its row, or skipped and listed.
#[test]
fn parquet_files_pyarrow_wrote_are_read_row_by_row() {
    let Some(tok) = tokenizer("gpt2") else { return };
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/parquet");
    let texts: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixtures.join("texts.json")).unwrap()).unwrap();
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let t = tokenizers::Tokenizer::from_file(format!("{tok}/tokenizer.json")).unwrap();
    let enc = |s: &str| {
        let mut v: Vec<u32> = t.encode(s, false).unwrap().get_ids().to_vec();
        v.push(50256);
        v
    };
    let (docs, zstd) = (fixtures.join("docs.parquet"), fixtures.join("docs_zstd.parquet"));
    let (docs, zstd) = (docs.to_str().unwrap(), zstd.to_str().unwrap());
    let base = |input: &str, out: &str| {
        vec!["tokenize", "--tokenizer", &tok, "--input", input, "--output", out, "--workers", "2", "--shard-size", "2"]
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    // zstd, one row group
    ok(&args(&base(zstd, "z")), dir);
    let want: Vec<Vec<u32>> =
        texts["docs_zstd.parquet"].as_array().unwrap().iter().map(|v| enc(v.as_str().unwrap())).collect();
    assert_eq!(all_docs(&dir.join("z")), want);
    // snappy, row groups of 3, row 4 null: refused naming the row, or skipped and listed
    let e = fails_with(&args(&base(docs, "n")), dir, "docs.parquet:4: column 'text' is null");
    assert!(e.contains("--on-error skip"), "{e}");
    let mut skip = base(docs, "s");
    skip.extend(["--on-error".into(), "skip".into()]);
    let said = ok(&args(&skip), dir);
    assert!(said.contains("tokenized 6 documents") && said.contains("docs.parquet:4"), "{said}");
    let want: Vec<Vec<u32>> =
        texts["docs.parquet"].as_array().unwrap().iter().filter_map(|v| v.as_str()).map(enc).collect();
    assert_eq!(all_docs(&dir.join("s")), want);
    ok(&["tokenize", "--verify", "s"], dir);
    // a column that is not there is named with the ones that are
    let mut other = base(zstd, "o");
    other.extend(["--text-field".into(), "body".into()]);
    fails_with(&args(&other), dir, "no column 'body' (its columns: text)");
    let mut not_text = base(docs, "o");
    not_text.extend(["--text-field".into(), "id".into()]);
    fails_with(&args(&not_text), dir, "not a string");
    // a file that is not Parquet
    std::fs::write(dir.join("fake.parquet"), "not parquet").unwrap();
    fails_with(&args(&base("fake.parquet", "o")), dir, "not a readable Parquet file");
}
