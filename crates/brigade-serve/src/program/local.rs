//! `brigade run PROGRAM`: a program run on an engine of this process, without a server — the
//! same runner as `POST /v1/programs`.

use super::graph::{Limits, Program};
use super::run::{check, run, Ctx};
use crate::error::{Result, ServeError};
use crate::metrics::Metrics;
use crate::startup::{engine_blocks, load, ServeOptions};
use serde_json::Value;
use std::sync::atomic::AtomicU64;

/// Parses a program (TOML when `toml`, else JSON), loads the model of `o`, runs the program
/// and returns its result (as `POST /v1/programs` answers). `on_node` gets each node's result
/// as it ends.
pub fn run_text(o: &ServeOptions, text: &str, toml: bool, on_node: impl FnMut(Value)) -> Result<Value> {
    let limits = Limits::default();
    let p = if toml { Program::from_toml(text, &limits) } else { Program::from_json(text, &limits) };
    let p = p.map_err(|e| ServeError::Program(e.0))?;
    let Some(source) = &o.source else {
        return Err(ServeError::Setting("give the model: --checkpoint DIR or --model PRESET".into()));
    };
    let kv_blocks = engine_blocks(o, source)?;
    let metrics = Metrics::new();
    let l = load(o, source, kv_blocks, &metrics)?;
    if let Some(m) = &p.model {
        let name = source.default_name();
        if *m != name {
            return Err(ServeError::Program(format!(
                "the program names the model '{m}', but '{name}' is loaded; change \"model\" or leave it out"
            )));
        }
    }
    check(&p, &l).map_err(|e| ServeError::Program(e.to_string()))?;
    let next_id = AtomicU64::new(1);
    let ctx = Ctx { l: &l, metrics: &metrics, next_id: &next_id, max_branches: limits.max_branches };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ServeError::io("starting the runtime", e))?;
    let v = rt.block_on(run(&ctx, &p, on_node));
    l.engine.stop();
    Ok(v)
}
