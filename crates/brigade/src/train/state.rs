//! `trainer_state.json`: where a run stands (its settings, step, losses, and fingerprints of
//! the files it reads), parsed and cross-checked as one value, so that a contradictory or
//! foreign file is refused before anything is built from it.

use super::config::TrainConfig;
use super::data::Fingerprint;
use crate::error::{Error, Result};
use crate::models::checkpoint::STATE_FILE;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Version of the file's layout.
pub const STATE_FORMAT: u64 = 1;

/// What a checkpoint records of the files a run reads.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprints {
    pub data: Option<Fingerprint>,
    pub tokenizer: Option<Fingerprint>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RunState {
    pub config: TrainConfig,
    /// Optimizer steps taken.
    pub step: usize,
    /// The loss of every step taken.
    pub losses: Vec<f32>,
    pub fingerprints: Fingerprints,
}

impl RunState {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "format": STATE_FORMAT,
            "step": self.step,
            "config": self.config,
            "losses": self.losses,
            "fingerprints": self.fingerprints,
        })
    }

    /// Reads `dir/trainer_state.json`.
    pub fn read(dir: &Path) -> Result<RunState> {
        let path = dir.join(STATE_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            Error::ckpt(
                &path,
                format!("cannot read ({e}); --resume needs a directory written by `brigade train --out`"),
            )
        })?;
        RunState::parse(&text, &path)
    }

    /// Parses and cross-checks the text of a state file (`path` names it in errors).
    pub fn parse(text: &str, path: &Path) -> Result<RunState> {
        let bad = |m: String| Error::ckpt(path, m);
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(format!("not valid JSON ({e})")))?;
        let format = v["format"].as_u64();
        if format != Some(STATE_FORMAT) {
            return Err(bad(format!(
                "has format {}, this brigade reads format {STATE_FORMAT}",
                format.map_or("none".into(), |f| f.to_string())
            )));
        }
        let mut config: TrainConfig =
            serde_json::from_value(v["config"].clone()).map_err(|e| bad(format!("bad config ({e})")))?;
        if v["config"].get("carry_chains").is_none() {
            // written before the addition task drew carry chains: its problems were uniform
            config.carry_chains = 0.0;
        }
        config.validate().map_err(|e| bad(format!("bad config ({e})")))?;
        let step = v["step"].as_u64().ok_or_else(|| bad("missing 'step'".into()))? as usize;
        let losses: Vec<f32> =
            serde_json::from_value(v["losses"].clone()).map_err(|e| bad(format!("bad losses ({e})")))?;
        if losses.len() != step {
            return Err(bad(format!("says step {step} but holds {} losses; the file is inconsistent", losses.len())));
        }
        if step > config.steps {
            return Err(bad(format!("says step {step} of a {}-step run; the file is inconsistent", config.steps)));
        }
        let fingerprints: Fingerprints = serde_json::from_value(v["fingerprints"].clone())
            .map_err(|e| bad(format!("bad or missing fingerprints ({e})")))?;
        if fingerprints.data.is_some() != config.data.is_some()
            || fingerprints.tokenizer.is_some() != config.tokenizer.is_some()
        {
            return Err(bad(
                "its fingerprints do not match the files its config names; the file is inconsistent".into()
            ));
        }
        Ok(RunState { config, step, losses, fingerprints })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_survives_its_json_and_contradictions_are_refused() {
        let s = RunState {
            config: TrainConfig { steps: 10, ..TrainConfig::default() },
            step: 2,
            losses: vec![3.0, 2.5],
            fingerprints: Fingerprints::default(),
        };
        let p = Path::new("trainer_state.json");
        assert_eq!(RunState::parse(&s.to_json().to_string(), p).unwrap(), s);
        let edits: &[(&str, serde_json::Value)] = &[
            ("step", 3.into()),
            ("format", 2.into()),
            ("losses", serde_json::json!([1.0])),
            ("fingerprints", serde_json::Value::Null),
            ("fingerprints", serde_json::json!({"data": {"bytes": 1, "blake3": "00"}, "tokenizer": null})),
            ("config", serde_json::json!({"steps": 1})),
            ("config", serde_json::json!({"lr": -1.0})),
        ];
        for (k, v) in edits {
            let mut j = s.to_json();
            j[*k] = v.clone();
            assert!(RunState::parse(&j.to_string(), p).is_err(), "{k} = {v} accepted");
        }
    }
}
