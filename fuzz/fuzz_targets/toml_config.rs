//! A training config from TOML: parsed and validated, never a panic.
#![no_main]

use brigade::train::TrainConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(cfg) = TrainConfig::from_toml(text, "fuzz.toml") {
        if cfg.validate().is_ok() {
            let _ = cfg.model_config(256);
        }
    }
});
