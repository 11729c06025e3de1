//! Loading a checkpoint directory: `config.json`, `model.safetensors` (header and tensors) and
//! `trainer_state.json`, each parsed from a part of the input (parts separated by 0xFF 0xFE).
//! The parsers must return errors, never panic or allocate beyond the input's size.
#![no_main]

use brigade::models::Gpt;
use brigade::models::checkpoint::{parse_model_config, tensors_from_bytes};
use brigade::train::state::RunState;
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let mut parts = data.split(|&b| b == 0xFF).map(|p| p.strip_prefix(&[0xFE]).unwrap_or(p));
    let config = parts.next().unwrap_or_default();
    let tensors = parts.next().unwrap_or_default();
    let state = parts.next().unwrap_or_default();
    let p = Path::new("fuzz");
    if let Ok(text) = std::str::from_utf8(state) {
        let _ = RunState::parse(text, p);
    }
    let Ok(text) = std::str::from_utf8(config) else { return };
    let Ok(cfg) = parse_model_config(text, p) else { return };
    // Building the layout of a valid but huge config is the loader's job too; keep each run short.
    if cfg.num_params() > 1 << 22 {
        return;
    }
    let Ok(model) = Gpt::new(cfg) else { return };
    let _ = tensors_from_bytes(tensors, &model.layout, "", p);
});
