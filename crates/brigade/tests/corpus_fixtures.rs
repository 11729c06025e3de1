//! The corpus readers against files written by the tools users make them with
//! (scripts/make_corpus_fixtures.py): Megatron-LM datasets by megatron-core's own
//! IndexedDatasetBuilder (uint16 and int32, a document of two sequences), llm.c token files in
//! both header formats, nanoGPT's headerless u16 file; and conversations rendered with the
//! model's template and masked as transformers renders and tokenizes them.

use brigade::train::data::corpus::Corpus;
use brigade::train::data::tokens::Source;
use brigade::train::data::{Dataset, Tokenizer};
use std::path::{Path, PathBuf};

mod common;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/corpora")
}

fn open(path: &Path, chat: bool, tok: &Tokenizer) -> Corpus {
    match Dataset::open(&[(path.to_path_buf(), 1.0)], None, chat, tok, 8, 200_000) {
        Ok(Dataset::Corpus(mut c)) => c.list.remove(0).0,
        Ok(_) => panic!("{} read as plain text", path.display()),
        Err(e) => panic!("{}: {e}", path.display()),
    }
}

/// Every document of the corpus (held out or not) in file order, as token lists; the pieces of
/// one document (its sequences) are joined.
fn documents(c: &Corpus) -> Vec<Vec<u32>> {
    let mut pieces: Vec<_> = c.train.docs.iter().chain(&c.val.docs).copied().collect();
    pieces.sort_by_key(|d| (d.src, d.start));
    pieces
        .iter()
        .map(|d| {
            let (mut t, mut m) = (Vec::new(), Vec::new());
            c.sources[d.src as usize].extend(d.start, d.len as usize, &mut t, &mut m);
            t
        })
        .collect()
}

fn expected(name: &str) -> Vec<Vec<u32>> {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("expected.json")).unwrap()).unwrap();
    serde_json::from_value(v[name].clone()).unwrap()
}

#[test]
fn megatron_datasets_written_by_megatron_core_read_back() {
    for name in ["megatron_u16", "megatron_i32"] {
        let c = open(&fixtures().join(name), false, &Tokenizer::Bytes);
        let want = expected(name);
        let got = documents(&c);
        // document 4 was written as two sequences: two pieces, side by side, on one side of the split
        assert_eq!(got.len(), want.len() + 1, "{name}: one piece per sequence");
        let mut joined = got.clone();
        let second = joined.remove(5);
        joined[4].extend(second);
        assert_eq!(joined, want, "{name}");
        let held: Vec<bool> = {
            let mut p: Vec<_> = c
                .train
                .docs
                .iter()
                .map(|d| (d.start, false))
                .chain(c.val.docs.iter().map(|d| (d.start, true)))
                .collect();
            p.sort();
            p.into_iter().map(|(_, h)| h).collect()
        };
        assert_eq!(held[4], held[5], "{name}: a document's sequences are held out together");
        // PREFIX.bin names the same dataset as PREFIX
        let again = open(&fixtures().join(format!("{name}.bin")), false, &Tokenizer::Bytes);
        assert_eq!(documents(&again), got);
    }
}

/// brigade tokenize's shards are Megatron datasets of one sequence a document: the writer
/// gives megatron-core's own bytes for the same documents, and they read back as them.
#[test]
fn megatron_datasets_brigade_writes_are_megatron_cores_bytes() {
    use brigade::shards::megatron::{write, Width};
    for (name, width) in [("megatron_plain_u16", Width::U16), ("megatron_plain_i32", Width::U32)] {
        let want = expected(name);
        let (bin, idx) = write(&want, width);
        assert_eq!(bin, std::fs::read(fixtures().join(format!("{name}.bin"))).unwrap(), "{name}.bin");
        assert_eq!(idx, std::fs::read(fixtures().join(format!("{name}.idx"))).unwrap(), "{name}.idx");
        let c = open(&fixtures().join(name), false, &Tokenizer::Bytes);
        assert_eq!(documents(&c), want, "{name}");
    }
}

#[test]
fn llmc_and_nanogpt_token_files_read_back_as_their_documents() {
    for (file, name) in [("llmc_gpt2.bin", "llmc_gpt2"), ("llmc_llama3.bin", "llmc_llama3"), ("nanogpt.bin", "nanogpt")]
    {
        let c = open(&fixtures().join(file), false, &Tokenizer::Bytes);
        assert_eq!(documents(&c), expected(name), "{file}");
    }
}

#[test]
fn conversations_are_rendered_and_masked_as_transformers_does() {
    for name in ["qwen2", "llama3"] {
        let Some(tok_dir) = common::shared(&format!("tokenizers/{name}")) else { return };
        let tok = Tokenizer::from_file(&tok_dir).unwrap();
        let rows: Vec<serde_json::Value> =
            serde_json::from_str(&std::fs::read_to_string(fixtures().join(format!("chat_{name}.json"))).unwrap())
                .unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let jsonl = tmp.path().join("chat.jsonl");
        let lines: Vec<String> =
            rows.iter().map(|r| serde_json::json!({"messages": r["messages"]}).to_string()).collect();
        std::fs::write(&jsonl, lines.join("\n")).unwrap();
        let c = open(&jsonl, true, &tok);
        let Source::Memory { tokens, trained: Some(mask) } = &c.sources[0] else { panic!("conversations in memory") };
        let want_ids: Vec<u32> =
            rows.iter().flat_map(|r| serde_json::from_value::<Vec<u32>>(r["ids"].clone()).unwrap()).collect();
        let want_mask: Vec<bool> =
            rows.iter().flat_map(|r| serde_json::from_value::<Vec<bool>>(r["trained"].clone()).unwrap()).collect();
        assert_eq!(tokens, &want_ids, "{name}: the rendered conversations' tokens");
        assert_eq!(mask, &want_mask, "{name}: which tokens are trained on");
        assert!(mask.iter().any(|&m| m) && !mask.iter().all(|&m| m));
    }
}
