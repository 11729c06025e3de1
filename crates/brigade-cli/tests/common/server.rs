//! A `brigade serve` started as a user starts it, and a client for it: shared by the HTTP
//! test files. The tiny checkpoint is trained once per test binary.
#![allow(dead_code)]

use super::ok;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub fn fixture_tokenizer() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../brigade-serve/tests/data/bpe-tokenizer.json")
}

/// The repository's own prose as one text: `README.md`, then every `docs/*.md` in file-name
/// order, joined by newlines (as `scripts/readme_tour.py` makes its `corpus.txt`), so the
/// text a test trains on did not shrink when the README's topics moved to `docs/`.
pub fn prose_corpus() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    let mut parts = vec![std::fs::read_to_string(root.join("README.md")).unwrap()];
    parts.extend(docs.iter().map(|p| std::fs::read_to_string(p).unwrap()));
    parts.join("\n")
}

/// A tiny checkpoint trained for 30 steps on the README and docs/ ([`prose_corpus`]) with the
/// BPE tokenizer (once per run).
pub fn checkpoint() -> &'static Path {
    static DIR: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &DIR.get_or_init(|| {
        let d = tempfile::tempdir().unwrap();
        let corpus = d.path().join("corpus.txt");
        std::fs::write(&corpus, prose_corpus()).unwrap();
        let out = d.path().join("tiny-bpe");
        ok(
            &[
                "train",
                "--data",
                corpus.to_str().unwrap(),
                "--tokenizer",
                fixture_tokenizer().to_str().unwrap(),
                "--steps",
                "30",
                "--lr",
                "3e-3",
                "--threads",
                "1",
                "--out",
                out.to_str().unwrap(),
            ],
            d.path(),
        );
        (d, out)
    })
    .1
}

pub struct Server {
    pub child: Child,
    pub url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `brigade serve --port 0 ARGS` and waits for the port (not for readiness).
pub fn start(args: &[&str]) -> Server {
    let threads: &[&str] = if args.contains(&"--threads") { &[] } else { &["--threads", "1"] };
    start_command("serve", &[threads, args].concat())
}

/// Starts `brigade COMMAND --port 0 ARGS` (a server whose stdout's first line ends in its URL)
/// and waits for the port.
pub fn start_command(command: &str, args: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_brigade"))
        .arg(command)
        .args(["--port", "0"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let url = line.trim().rsplit(' ').next().unwrap().to_string();
    assert!(url.starts_with("http://"), "no listening line: {line:?}");
    Server { child, url }
}

impl Server {
    pub async fn wait_ready(&self) {
        let t0 = Instant::now();
        loop {
            if let Ok(r) = reqwest::get(format!("{}/ready", self.url)).await {
                if r.status() == 200 {
                    return;
                }
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "not ready after 60 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn post(&self, body: Value) -> (u16, Value) {
        self.post_to("/v1/completions", body).await
    }

    pub async fn post_to(&self, path: &str, body: Value) -> (u16, Value) {
        let r = reqwest::Client::new().post(format!("{}{path}", self.url)).json(&body).send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap())
    }

    /// The SSE events of a streamed completion, parsed, until `[DONE]`.
    pub async fn stream(&self, body: Value) -> Vec<Value> {
        self.stream_to("/v1/completions", body).await
    }

    pub async fn stream_to(&self, path: &str, body: Value) -> Vec<Value> {
        let r = reqwest::Client::new().post(format!("{}{path}", self.url)).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["content-type"], "text/event-stream");
        let text = r.text().await.unwrap();
        let mut events = Vec::new();
        for block in text.split("\n\n").filter(|b| !b.is_empty()) {
            let data = block.strip_prefix("data: ").unwrap_or_else(|| panic!("not an SSE data line: {block:?}"));
            if data == "[DONE]" {
                return events;
            }
            events.push(serde_json::from_str(data).unwrap());
        }
        panic!("the stream ended without [DONE]: {text}");
    }

    /// A metric's value, summed over its labels.
    pub async fn metric(&self, name: &str) -> f64 {
        let text = reqwest::get(format!("{}/metrics", self.url)).await.unwrap().text().await.unwrap();
        let values: Vec<f64> = text
            .lines()
            .filter(|l| l.split([' ', '{']).next() == Some(name))
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
            .collect();
        assert!(!values.is_empty(), "no metric {name} in:\n{text}");
        values.iter().sum()
    }
}

impl Server {
    /// A per-rank metric: rank → value.
    pub async fn per_rank(&self, name: &str) -> std::collections::BTreeMap<usize, f64> {
        let text = reqwest::get(format!("{}/metrics", self.url)).await.unwrap().text().await.unwrap();
        let prefix = format!("{name}{{rank=\"");
        text.lines()
            .filter_map(|l| l.strip_prefix(&prefix))
            .map(|rest| {
                let (rank, value) = rest.split_once("\"} ").unwrap();
                (rank.parse().unwrap(), value.parse().unwrap())
            })
            .collect()
    }
}

/// A random-weight Llama-family folder in Hugging Face's form (config.json, model.safetensors)
/// with the real tokenizer folder `../shared/tokenizers/NAME` copied in (its chat template),
/// `context` positions; `None` (with the reason printed) without `../shared`.
pub fn chat_model_of(name: &str, context: usize) -> Option<tempfile::TempDir> {
    chat_model_with(name, context, true, |_, _| {})
}

/// [`chat_model_of`] with its head tied or not, and its parameters changed by `edit` (given
/// the model, to find tensors by name) before they are written.
pub fn chat_model_with(
    name: &str,
    context: usize,
    tied: bool,
    edit: impl FnOnce(&brigade::models::Gpt, &mut [f32]),
) -> Option<tempfile::TempDir> {
    use brigade::models::family::Llama;
    use brigade::models::{checkpoint, Gpt, GptConfig};
    let tok_dir = super::shared(&format!("tokenizers/{name}"))?;
    let tok = brigade::models::tokenizer::Tokenizer::from_file(&tok_dir).unwrap();
    let a = Llama {
        n_kv_head: 1,
        head_dim: 8,
        intermediate: 32,
        rms_eps: 1e-6,
        rope_theta: 1e6,
        rope_scaling: None,
        tied,
        qkv_bias: true,
        o_bias: false,
        moe: None,
        qk_norm: false,
        qk_norm_whole: false,
    };
    let cfg = GptConfig {
        n_layer: 1,
        n_head: 2,
        n_embd: 16,
        vocab_size: tok.vocab_size(),
        block_size: context,
        family: a.into(),
    };
    let gpt = Gpt::new(cfg).unwrap();
    let mut params = gpt.init_params(7);
    edit(&gpt, &mut params);
    let d = tempfile::tempdir().unwrap();
    checkpoint::write_json(&d.path().join("config.json"), &checkpoint::hf_config(&cfg)).unwrap();
    checkpoint::save_tensors(&d.path().join("model.safetensors"), &gpt.layout, &params, "", None).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(tok_dir.join(f), d.path().join(f)).unwrap();
    }
    Some(d)
}
