//! `brigade run PROGRAM`: a program of generation calls (JSON, or TOML by its extension) run
//! inside the batching engine without a server — the runner `POST /v1/programs` uses. The
//! result (every node's output, the critical path, the makespan, the tokens) goes to stdout
//! or, written whole and then renamed into place, to `--out`.

use crate::serve_cmd::EngineArgs;
use anyhow::{bail, Context, Result};
use brigade_serve::source::Source;
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The program: a .json or .toml file.
    program: PathBuf,
    /// Checkpoint directory with a tokenizer.json (programs are text).
    #[arg(long)]
    checkpoint: PathBuf,
    #[command(flatten)]
    engine: EngineArgs,
    /// Write the result here (JSON) instead of to stdout.
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn run(a: RunArgs) -> Result<()> {
    let o = a.engine.options(Some(Source::Checkpoint(a.checkpoint.clone())))?;
    let text = std::fs::read_to_string(&a.program)
        .with_context(|| format!("cannot read the program {}; give a .json or .toml file", a.program.display()))?;
    let toml = a.program.extension().is_some_and(|e| e == "toml");
    if let Some(out) = &a.out {
        if out.is_dir() {
            bail!("--out {} is a directory; give a file name", out.display());
        }
    }
    let v = brigade_serve::program::local::run_text(&o, &text, toml, |ev| {
        let state = if ev["error"].is_null() { "done".to_string() } else { format!("failed: {}", ev["error"]) };
        eprintln!("brigade run: node {} {state}", ev["node"]);
    })?;
    eprintln!(
        "brigade run: {} node(s) in {:.2} s ({} generated tokens, {} prompt tokens shared, critical path {}); estimated {:.2} s one call at a time",
        v["nodes"].as_object().map_or(0, |m| m.len()),
        v["makespan_s"].as_f64().unwrap_or(0.0),
        v["generated_tokens"],
        v["prefill_tokens_saved"],
        v["critical_path"],
        v["sequential_estimate_s"].as_f64().unwrap_or(0.0),
    );
    let body = serde_json::to_string_pretty(&v)? + "\n";
    match &a.out {
        None => print!("{body}"),
        Some(out) => {
            let tmp = out.with_extension("partial");
            std::fs::write(&tmp, body).with_context(|| format!("cannot write {}", tmp.display()))?;
            std::fs::rename(&tmp, out).with_context(|| format!("cannot write {}", out.display()))?;
        }
    }
    let failed = v["failed"].as_array().map_or(0, Vec::len);
    if failed > 0 {
        bail!("{failed} node(s) failed: {}; their errors are in the result", v["failed"]);
    }
    Ok(())
}
