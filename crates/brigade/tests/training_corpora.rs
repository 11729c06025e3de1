//! Corpora and conversations through the parallel machinery: a Megatron dataset and a chat
//! JSON Lines file (assistant-only targets) train on every layout with the single worker's
//! losses and weights; a run saved mid-corpus resumes on the uninterrupted run's losses;
//! held-out documents are whole documents and never trained on; and bad corpora are refused
//! with one line naming the problem.

use brigade::layout::Layout;
use brigade::parallel::{Mesh, MeshShape};
use brigade::tensor::loss::IGNORE;
use brigade::train::data::{corpus::Packing, Dataset, Tokenizer};
use brigade::train::{TrainConfig, Trainer};
use std::path::{Path, PathBuf};

const LAYOUTS: [&str; 6] = ["dp=2", "tp=2", "pp=2,mb=1", "dp=2,zero=1", "dp=2,zero=3", "pp=2,tp=2,dp=2,sp=1,mb=1"];
const STEPS: usize = 4;

/// A byte-level BPE of 384 tokens (`<|endoftext|>` its EOS) with a ChatML-like template.
fn tokenizer_dir(root: &Path) -> PathBuf {
    let dir = root.join("tok");
    std::fs::create_dir_all(&dir).unwrap();
    let bpe = Path::new(env!("CARGO_MANIFEST_DIR")).join("../brigade-serve/tests/data/bpe-tokenizer.json");
    std::fs::copy(bpe, dir.join("tokenizer.json")).unwrap();
    let template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}<|endoftext|>\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}";
    let config = serde_json::json!({"eos_token": "<|endoftext|>", "chat_template": template});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    dir
}

fn conversations(root: &Path, n: usize) -> PathBuf {
    let mut text = String::new();
    for i in 0..n {
        let (a, b) = (i * 37 % 90 + 3, i * 11 % 70 + 5);
        let mut messages = vec![
            serde_json::json!({"role": "user", "content": format!("What is {a} plus {b}?")}),
            serde_json::json!({"role": "assistant", "content": format!("{a} plus {b} is {}.", a + b)}),
        ];
        if i % 3 == 0 {
            messages.push(serde_json::json!({"role": "user", "content": "And twice that?"}));
            messages.push(serde_json::json!({"role": "assistant", "content": format!("{}.", 2 * (a + b))}));
        }
        text.push_str(&serde_json::json!({ "messages": messages }).to_string());
        text.push('\n');
    }
    let p = root.join("chat.jsonl");
    std::fs::write(&p, text).unwrap();
    p
}

/// A Megatron dataset (u16 tokens below `vocab`), documents of varied lengths.
fn megatron(root: &Path, vocab: usize, docs: usize) -> PathBuf {
    let prefix = root.join("corpus");
    let lens: Vec<usize> = (0..docs).map(|d| 20 + d * 29 % 90).collect();
    let mut bin = Vec::new();
    let mut k = 0usize;
    for &l in &lens {
        for _ in 0..l {
            bin.extend_from_slice(&(((k * 31 + k / 7) % vocab) as u16).to_le_bytes());
            k += 1;
        }
    }
    let mut idx = b"MMIDIDX\x00\x00".to_vec();
    idx.extend_from_slice(&1u64.to_le_bytes());
    idx.push(8);
    idx.extend_from_slice(&(docs as u64).to_le_bytes());
    idx.extend_from_slice(&(docs as u64 + 1).to_le_bytes());
    for &l in &lens {
        idx.extend_from_slice(&(l as i32).to_le_bytes());
    }
    let mut at = 0i64;
    for &l in &lens {
        idx.extend_from_slice(&at.to_le_bytes());
        at += 2 * l as i64;
    }
    for d in 0..=docs {
        idx.extend_from_slice(&(d as i64).to_le_bytes());
    }
    std::fs::write(prefix.with_extension("bin"), bin).unwrap();
    std::fs::write(prefix.with_extension("idx"), idx).unwrap();
    prefix
}

fn cfg(data: PathBuf, tokenizer: Option<PathBuf>, chat: bool) -> TrainConfig {
    TrainConfig {
        model: "llama-tiny".into(),
        n_embd: Some(32),
        n_head: Some(4),
        n_layer: Some(4),
        vocab_size: Some(384),
        data: Some(data),
        tokenizer,
        chat,
        steps: STEPS,
        batch: 8,
        seq: Some(32),
        lr: 1e-3,
        eval_every: 0,
        ..TrainConfig::default()
    }
}

/// Losses of every step and the final full weights, on `spec`.
fn run(cfg: &TrainConfig, spec: &str) -> (Vec<f32>, Vec<f32>) {
    let layout = Layout::parse(spec).unwrap();
    let out = brigade_comm::local::run(layout.world(), |world| {
        let mesh = Mesh::new(&world, MeshShape::of(&layout))?;
        let mut tr = Trainer::on_mesh(cfg.clone(), mesh, &layout)?;
        let losses = brigade::with_threads(1, || -> brigade::Result<Vec<f32>> {
            let mut l = Vec::new();
            while !tr.done() {
                l.push(tr.train_step()?.loss);
            }
            Ok(l)
        })??;
        let local = tr.local_params()?.into_owned();
        let full = tr.full_params()?.unwrap_or(local);
        Ok::<_, brigade::Error>((losses, full))
    })
    .unwrap_or_else(|e| panic!("{spec}: {e}"));
    out.into_iter().next().unwrap()
}

fn rel(a: &[f32], b: &[f32]) -> f64 {
    let num = a.iter().zip(b).map(|(x, y)| (x - y).abs() as f64).fold(0.0, f64::max);
    num / b.iter().map(|y| y.abs() as f64).fold(0.0, f64::max)
}

fn every_layout_equals_the_single_worker(cfg: TrainConfig, what: &str) {
    let (losses, weights) = run(&cfg, "dp=1");
    assert!(losses.iter().all(|l| l.is_finite()) && losses[0] > losses[STEPS - 1], "{what}: {losses:?}");
    for spec in LAYOUTS {
        let (l, w) = run(&cfg, spec);
        assert!(rel(&l, &losses) < 1e-5, "{what} on {spec}: losses {l:?} vs the single worker's {losses:?}");
        assert!(rel(&w, &weights) < 1e-5, "{what} on {spec}: final weights differ by {:.1e}", rel(&w, &weights));
    }
}

#[test]
fn a_megatron_corpus_trains_alike_on_every_layout() {
    let tmp = tempfile::tempdir().unwrap();
    let data = megatron(tmp.path(), 384, 60);
    every_layout_equals_the_single_worker(cfg(data, None, false), "megatron corpus");
}

#[test]
fn conversations_train_alike_on_every_layout() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = tokenizer_dir(tmp.path());
    let data = conversations(tmp.path(), 40);
    every_layout_equals_the_single_worker(cfg(data, Some(tok), true), "chat");
}

/// `--doc-mask` (documents packed into a sequence kept apart) on every layout, with both
/// kinds of recompute, for both families: the single worker's losses and weights. And the mask
/// is not a no-op: the same run without it takes other steps.
#[test]
fn doc_masked_corpora_train_alike_on_every_layout() {
    let tmp = tempfile::tempdir().unwrap();
    let data = megatron(tmp.path(), 384, 60);
    for model in ["llama-tiny", "tiny"] {
        let c = TrainConfig { model: model.into(), doc_mask: true, ..cfg(data.clone(), None, false) };
        every_layout_equals_the_single_worker(c.clone(), &format!("{model} --doc-mask"));
        for spec in ["pp=2,mb=1,recompute=full", "dp=2,tp=2,recompute=selective"] {
            let (l, w) = run(&c, spec);
            let (l1, w1) = run(&c, "dp=1");
            assert!(rel(&l, &l1) < 1e-5 && rel(&w, &w1) < 1e-5, "{model} --doc-mask on {spec}: {l:?} vs {l1:?}");
        }
        let (masked, _) = run(&c, "dp=1");
        let (plain, _) = run(&TrainConfig { doc_mask: false, ..c }, "dp=1");
        assert!(rel(&masked, &plain) > 1e-4, "{model}: --doc-mask changed nothing: {masked:?} vs {plain:?}");
    }
}

/// The positions a corpus gives each token restart exactly where its documents begin: a
/// corpus whose documents each begin with token 0 (and hold no other 0) shows them — with one
/// sequence a document, and with Megatron documents of two sequences each (a document begins at
/// its first sequence only), before and after `--val-data` merges the held-out documents back.
#[test]
fn positions_restart_where_documents_begin() {
    for per_doc in [1, 2] {
        let tmp = tempfile::tempdir().unwrap();
        let prefix = megatron(tmp.path(), 384, 80);
        let mut idx = std::fs::read(prefix.with_extension("idx")).unwrap();
        let seqs = u64::from_le_bytes(idx[18..26].try_into().unwrap()) as usize;
        let lens: Vec<usize> =
            (0..seqs).map(|d| i32::from_le_bytes(idx[34 + 4 * d..][..4].try_into().unwrap()) as usize).collect();
        // group the sequences `per_doc` to a document (the index's doc_idx, last in the file)
        let doc_idx = 34 + 12 * seqs;
        idx.truncate(doc_idx);
        let firsts: Vec<usize> = (0..=seqs).step_by(per_doc).collect();
        idx[26..34].copy_from_slice(&(firsts.len() as u64).to_le_bytes());
        firsts.iter().for_each(|&d| idx.extend_from_slice(&(d as i64).to_le_bytes()));
        std::fs::write(prefix.with_extension("idx"), idx).unwrap();
        // rewrite the tokens: 0 at each document's first token, 1 + (k mod 300) elsewhere
        let mut bin = Vec::new();
        for (s, &l) in lens.iter().enumerate() {
            for k in 0..l {
                let v: u16 = if k == 0 && s % per_doc == 0 { 0 } else { 1 + (k % 300) as u16 };
                bin.extend_from_slice(&v.to_le_bytes());
            }
        }
        std::fs::write(prefix.with_extension("bin"), bin).unwrap();
        let val = megatron(&tmp.path().join("val").tap_mkdir(), 384, 20);
        for held in [None, Some(val.as_path())] {
            let Dataset::Corpus(c) =
                Dataset::open(&[(prefix.clone(), 1.0)], held, false, &Tokenizer::Bytes, 64, 384).unwrap()
            else {
                panic!("a corpus")
            };
            let t = 64;
            for step in 0..5 {
                let b = c.batch(11, step, 8, t);
                let pos = b.pos.expect("a corpus knows its documents");
                for (r, (&x, &p)) in b.x.iter().zip(&pos).enumerate() {
                    let i = r % t;
                    if x == 0 {
                        assert_eq!(p, 0, "{per_doc} a document, row {r}: a document begins here");
                    } else if i > 0 {
                        assert_eq!(p, pos[r - 1] + 1, "{per_doc} a document, row {r}: the same document runs on");
                    } else {
                        assert_eq!(p, 0, "row {r}: a sequence's first token is at 0");
                    }
                }
                // (documents of two sequences are twice as long: half as many starts)
                let starts = b.x.iter().filter(|&&x| x == 0).count();
                assert!(starts >= 4 / per_doc, "windows cross documents: {starts} starts");
            }
        }
    }
}

/// Only the assistant's text and its end-of-turn are targets; the prompt, the user's turns and
/// the template's role markers are not. Checked on text: the targets decode to exactly the
/// assistant contents, each followed by the template's `<|endoftext|>\n`.
#[test]
fn only_the_assistant_turns_are_trained_on() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = Tokenizer::from_file(&tokenizer_dir(tmp.path())).unwrap();
    let data = conversations(tmp.path(), 7);
    let Dataset::Corpus(c) = Dataset::open(&[(data.clone(), 1.0)], None, true, &tok, 32, 384).unwrap() else {
        panic!("conversations are a corpus")
    };
    let corpus = &c.list[0].0;
    assert_eq!(corpus.packing, Packing::Whole);
    let brigade::train::data::tokens::Source::Memory { tokens, trained: Some(mask) } = &corpus.sources[0] else {
        panic!("conversations are held in memory with their mask")
    };
    let kept: Vec<u32> = tokens.iter().zip(mask).filter(|(_, &m)| m).map(|(&t, _)| t).collect();
    let text = std::fs::read_to_string(&data).unwrap();
    let mut want = String::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        for m in v["messages"].as_array().unwrap() {
            if m["role"] == "assistant" {
                want.push_str(m["content"].as_str().unwrap());
                want.push_str("<|endoftext|>\n");
            }
        }
    }
    assert_eq!(tok.decode(&kept), want);
    // and a batch's targets are those tokens, the rest IGNORE
    let batch = c.batch(5, 0, 4, 32);
    let (x, y) = (batch.x, batch.y);
    assert_eq!(x.len(), 4 * 32);
    let targets = y.iter().filter(|&&t| t != IGNORE).count();
    assert!(targets > 0 && targets < y.len() / 2, "{targets} of {} positions are targets", y.len());
    // exactly: each row is a window of the conversations' tokens, and position i's target is
    // the next token where the mask trains it, IGNORE elsewhere (no shift by one either way)
    for (r, (xr, yr)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
        let o = (0..tokens.len() - 32).find(|&o| tokens[o..o + 32] == *xr);
        let o = o.unwrap_or_else(|| panic!("row {r} is no window of the corpus"));
        for i in 0..32 {
            let want = if mask[o + i + 1] { tokens[o + i + 1] as i32 } else { IGNORE };
            assert_eq!(yr[i], want, "row {r}, position {i}");
        }
    }
}

#[test]
fn held_out_documents_are_whole_and_never_trained_on() {
    let tmp = tempfile::tempdir().unwrap();
    let data = megatron(tmp.path(), 384, 200);
    let Dataset::Corpus(c) = Dataset::open(&[(data, 1.0)], None, false, &Tokenizer::Bytes, 32, 384).unwrap() else {
        panic!("a Megatron dataset is a corpus")
    };
    let corpus = &c.list[0].0;
    let (t, v) = (&corpus.train.docs, &corpus.val.docs);
    assert_eq!(t.len() + v.len(), 200, "every document in exactly one of the two");
    // chosen by hash: about 5% (10 of 200), at least one
    assert!((3..=20).contains(&v.len()), "{} of 200 documents held out", v.len());
    assert!(v.iter().all(|d| !t.contains(d)));
    // the documents held out do not depend on the run (seed) or on what else is in the corpus
    let again = megatron(&tmp.path().join("again").tap_mkdir(), 384, 200);
    let Dataset::Corpus(c2) = Dataset::open(&[(again, 1.0)], None, false, &Tokenizer::Bytes, 32, 384).unwrap() else {
        unreachable!()
    };
    assert_eq!(&c2.list[0].0.val.docs, v);
}

/// `--val-data`: validation sequences come from that corpus alone, and the training corpus
/// keeps every document.
#[test]
fn a_separate_validation_corpus_takes_the_place_of_held_out_documents() {
    let tmp = tempfile::tempdir().unwrap();
    let train = megatron(tmp.path(), 384, 60);
    let val = megatron(&tmp.path().join("val").tap_mkdir(), 1, 30); // every token 0
    let total = std::fs::metadata(train.with_extension("bin")).unwrap().len() / 2;
    let Dataset::Corpus(c) = Dataset::open(&[(train, 1.0)], Some(&val), false, &Tokenizer::Bytes, 32, 384).unwrap()
    else {
        panic!("a corpus")
    };
    let t = &c.list[0].0;
    assert_eq!((t.train.len(), t.val.len()), (total, 0), "every training document trained on");
    let v = c.val_batch(8, 32);
    assert!(v.x.iter().all(|&v| v == 0) && v.y.iter().all(|&v| v == 0), "validation from --val-data only");
    assert!(c.batch(1, 0, 8, 32).x.iter().any(|&v| v != 0), "training from --data");
}

trait Mkdir {
    fn tap_mkdir(self) -> Self;
}
impl Mkdir for PathBuf {
    fn tap_mkdir(self) -> Self {
        std::fs::create_dir_all(&self).unwrap();
        self
    }
}

#[test]
fn a_run_saved_mid_corpus_resumes_on_the_same_losses() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = tokenizer_dir(tmp.path());
    let data = conversations(tmp.path(), 40);
    let c = cfg(data, Some(tok), true);
    let mut whole = Trainer::new(c.clone()).unwrap();
    let mut all = Vec::new();
    while !whole.done() {
        all.push(whole.train_step().unwrap().loss);
    }
    let mut first = Trainer::new(c).unwrap();
    first.train_step().unwrap();
    first.train_step().unwrap();
    let ck = tmp.path().join("ck");
    first.save(&ck).unwrap();
    let layout = Layout::parse("dp=2").unwrap();
    let rest = brigade_comm::local::run(2, |world| {
        let mesh = Mesh::new(&world, MeshShape::of(&layout))?;
        let mut tr = Trainer::resume_on(&ck, None, mesh, &layout)?;
        let mut l = Vec::new();
        while !tr.done() {
            l.push(tr.train_step()?.loss);
        }
        Ok::<_, brigade::Error>(l)
    })
    .unwrap();
    assert!(rel(&rest[0], &all[2..]) < 1e-5, "resumed {:?} vs {:?}", rest[0], &all[2..]);
}

fn refused(path: &Path, chat: bool, tok: &Tokenizer) -> String {
    match Dataset::open(&[(path.to_path_buf(), 1.0)], None, chat, tok, 32, 384) {
        Ok(_) => panic!("{} was accepted", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_corpora_are_refused_with_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = Tokenizer::from_file(&tokenizer_dir(tmp.path())).unwrap();
    let p = tmp.path().join("broken.jsonl");
    let good = r#"{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}"#;
    std::fs::write(&p, format!("{good}\n{good}\n{{\"messages\": [\n")).unwrap();
    let e = refused(&p, true, &tok);
    assert!(e.contains("line 3") && e.contains("not valid JSON"), "{e}");
    std::fs::write(&p, format!("{good}\n{{\"text\": \"no messages\"}}\n")).unwrap();
    let e = refused(&p, true, &tok);
    assert!(e.contains("line 2") && e.contains("\"messages\""), "{e}");
    std::fs::write(&p, format!("{good}\n{}\n", r#"{"messages": [{"role": "user", "content": "hi"}]}"#)).unwrap();
    let e = refused(&p, true, &tok);
    assert!(e.contains("line 2") && e.contains("no assistant turn"), "{e}");
    let e = refused(&p, true, &Tokenizer::Bytes);
    assert!(e.contains("chat template"), "{e}");
    // a Megatron index that does not match its .bin
    let prefix = megatron(tmp.path(), 384, 50);
    let bin = prefix.with_extension("bin");
    let bytes = std::fs::read(&bin).unwrap();
    std::fs::write(&bin, &bytes[..bytes.len() - 10]).unwrap();
    let e = refused(&prefix, false, &tok);
    assert!(e.contains("does not match"), "{e}");
    // ids beyond the model's vocabulary: tokens of another tokenizer
    let other = megatron(&tmp.path().join("big").tap_mkdir(), 1000, 50);
    let e = refused(&other, false, &tok);
    assert!(e.contains("beyond the model's vocabulary of 384"), "{e}");
    assert!(!e.contains('\n'), "one line: {e}");
    // --doc-mask on one text file (one document), and on the built-in task
    let text = tmp.path().join("one.txt");
    std::fs::write(&text, "one document, no boundaries to keep. ".repeat(40)).unwrap();
    let c = TrainConfig { doc_mask: true, ..cfg(text, None, false) };
    let e = Trainer::new(c).err().expect("--doc-mask on a text file").to_string();
    assert!(e.contains("--doc-mask") && e.contains("one text file") && !e.contains('\n'), "{e}");
    let e = Trainer::new(TrainConfig { doc_mask: true, ..TrainConfig::default() }).err().expect("no data").to_string();
    assert!(e.contains("--doc-mask needs --data"), "{e}");
}
