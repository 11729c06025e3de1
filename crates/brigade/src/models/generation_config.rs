//! A model folder's `generation_config.json`, as the Hub publishes it: the ids that end a
//! generation (`eos_token_id`, one or a list) and the sampling defaults the model's authors
//! chose (`temperature`, `top_p`, `top_k`, `repetition_penalty`, `max_new_tokens`), which a
//! server applies to the requests that leave them out (as vLLM does by default). Read field by
//! field: a value of the wrong kind or outside its range is refused naming the file and the
//! key; keys that change nothing brigade does (`bos_token_id`, `pad_token_id`, `do_sample`, …)
//! pass.

use crate::error::{Error, Result};
use serde_json::Value;
use std::path::Path;

pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";

/// The largest repetition penalty taken, in this file and in a request (vLLM's bound is "above
/// 0"; past 10 a penalty only zeroes every seen token's chance, so a larger one is a typo).
pub const MAX_REPETITION_PENALTY: f64 = 10.0;

/// What `generation_config.json` says; every field absent when the file is.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationConfig {
    /// Generation ends after any of these (in the file's order, no repeats).
    pub eos: Vec<u32>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// 0: all tokens (the file's 0 or a negative value say the same).
    pub top_k: Option<usize>,
    pub repetition_penalty: Option<f64>,
    pub max_new_tokens: Option<usize>,
    /// Keys that would change sampling and that brigade does not apply (`min_p` ≠ 0,
    /// `typical_p` ≠ 1, …): named at startup, never silently dropped.
    pub not_applied: Vec<String>,
}

/// Keys `generate()` reads that change what is sampled, with the value at which they do
/// nothing; brigade applies none of them, so a file setting one otherwise is reported.
const NOT_APPLIED: &[(&str, f64)] = &[
    ("min_p", 0.0),
    ("typical_p", 1.0),
    ("epsilon_cutoff", 0.0),
    ("eta_cutoff", 0.0),
    ("no_repeat_ngram_size", 0.0),
    ("encoder_repetition_penalty", 1.0),
    ("length_penalty", 1.0),
    ("num_beams", 1.0),
];

/// The ids that end a generation: the tokenizer's end-of-sequence token (its `<|endoftext|>`
/// where `tokenizer_config.json` names none), then the file's `eos_token_id`s not already
/// there. None for a byte tokenizer without a file.
pub fn end_ids(tokenizer: Option<&crate::models::tokenizer::Tokenizer>, generation: &GenerationConfig) -> Vec<u32> {
    let mut eos: Vec<u32> = match tokenizer {
        Some(crate::models::tokenizer::Tokenizer::Hf(t, _, _, sp)) => {
            sp.eos.or_else(|| t.token_to_id("<|endoftext|>")).into_iter().collect()
        }
        _ => Vec::new(),
    };
    for &id in &generation.eos {
        if !eos.contains(&id) {
            eos.push(id);
        }
    }
    eos
}

/// The folder's `generation_config.json` (`Default` when it has none), its token ids checked
/// against the model's vocabulary.
pub fn read(dir: &Path, vocab: usize) -> Result<GenerationConfig> {
    let path = dir.join(GENERATION_CONFIG_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(GenerationConfig::default()),
        Err(e) => return Err(Error::io(&path, e)),
    };
    parse(&text, vocab).map_err(|e| Error::ckpt(&path, e))
}

/// `generation_config.json`'s text read as [`read`] does.
pub fn parse(text: &str, vocab: usize) -> std::result::Result<GenerationConfig, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("is not valid JSON: {e}"))?;
    let Value::Object(o) = &v else { return Err("must be a JSON object".into()) };
    let get = |k: &str| o.get(k).filter(|x| !x.is_null());
    let mut eos: Vec<u32> = Vec::new();
    let ids: Vec<&Value> = match get("eos_token_id") {
        None => vec![],
        Some(Value::Array(a)) => a.iter().collect(),
        Some(one) => vec![one],
    };
    for id in ids {
        match id.as_u64() {
            Some(i) if (i as usize) < vocab => {
                if !eos.contains(&(i as u32)) {
                    eos.push(i as u32)
                }
            }
            _ => return Err(format!("eos_token_id {id} is not a token id of this model (0..{vocab})")),
        }
    }
    let num = |k: &str| -> std::result::Result<Option<f64>, String> {
        match get(k) {
            None => Ok(None),
            Some(x) => x.as_f64().map(Some).ok_or_else(|| format!("'{k}' must be a number, got {x}")),
        }
    };
    let temperature = num("temperature")?;
    if let Some(t) = temperature.filter(|t| !(t.is_finite() && *t >= 0.0)) {
        return Err(format!("'temperature' must be 0 or positive, got {t}"));
    }
    let top_p = num("top_p")?;
    if let Some(p) = top_p.filter(|p| !(*p > 0.0 && *p <= 1.0)) {
        return Err(format!("'top_p' must be above 0 and at most 1, got {p}"));
    }
    let top_k = match get("top_k") {
        None => None,
        Some(x) => match x.as_i64() {
            Some(k) => Some(k.max(0) as usize),
            None => return Err(format!("'top_k' must be an integer, got {x}")),
        },
    };
    let repetition_penalty = num("repetition_penalty")?;
    if let Some(r) = repetition_penalty.filter(|r| !(*r > 0.0 && *r <= MAX_REPETITION_PENALTY)) {
        return Err(format!("'repetition_penalty' must be above 0 and at most {MAX_REPETITION_PENALTY}, got {r}"));
    }
    let max_new_tokens = match get("max_new_tokens") {
        None => None,
        Some(x) => match x.as_u64() {
            Some(m) if m > 0 => Some(m as usize),
            _ => return Err(format!("'max_new_tokens' must be a positive integer, got {x}")),
        },
    };
    let not_applied = NOT_APPLIED
        .iter()
        .filter(|(k, noop)| get(k).and_then(Value::as_f64).is_some_and(|x| x != *noop))
        .map(|(k, _)| format!("{k} {}", get(k).unwrap()))
        .collect();
    Ok(GenerationConfig { eos, temperature, top_p, top_k, repetition_penalty, max_new_tokens, not_applied })
}

impl GenerationConfig {
    /// The sampling defaults it sets, as a startup line shows them (empty when none).
    pub fn defaults_text(&self) -> String {
        let mut parts = Vec::new();
        let mut put = |k: &str, v: Option<String>| parts.extend(v.map(|v| format!("{k} {v}")));
        put("temperature", self.temperature.map(|x| x.to_string()));
        put("top_p", self.top_p.map(|x| x.to_string()));
        put("top_k", self.top_k.map(|x| x.to_string()));
        put("repetition_penalty", self.repetition_penalty.map(|x| x.to_string()));
        put("max_tokens", self.max_new_tokens.map(|x| x.to_string()));
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_one_or_a_list_and_each_default() {
        let g = parse(r#"{"eos_token_id": [5, 3, 5], "temperature": 0.6, "top_p": 0.9, "top_k": -1}"#, 10).unwrap();
        assert_eq!((g.eos, g.temperature, g.top_p, g.top_k), (vec![5, 3], Some(0.6), Some(0.9), Some(0)));
        let g = parse(r#"{"eos_token_id": 7, "repetition_penalty": 1.1, "max_new_tokens": 9, "do_sample": true}"#, 10)
            .unwrap();
        assert_eq!((g.eos, g.repetition_penalty, g.max_new_tokens), (vec![7], Some(1.1), Some(9)));
        assert_eq!(parse(r#"{"eos_token_id": null}"#, 10).unwrap(), GenerationConfig::default());
        assert_eq!(parse(r#"{"repetition_penalty": 10}"#, 10).unwrap().repetition_penalty, Some(10.0));
        let g = parse(r#"{"min_p": 0.05, "typical_p": 1.0}"#, 10).unwrap();
        assert_eq!(g.not_applied, vec!["min_p 0.05".to_string()]);
    }

    #[test]
    fn bad_values_are_named() {
        for (text, named) in [
            (r#"{"eos_token_id": 10}"#, "eos_token_id 10"),
            (r#"{"eos_token_id": [1, -2]}"#, "eos_token_id -2"),
            (r#"{"temperature": -1}"#, "'temperature'"),
            (r#"{"top_p": 0}"#, "'top_p'"),
            (r#"{"top_k": 2.5}"#, "'top_k'"),
            (r#"{"repetition_penalty": 0}"#, "'repetition_penalty'"),
            (r#"{"repetition_penalty": 10.5}"#, "at most 10, got 10.5"),
            (r#"{"max_new_tokens": 0}"#, "'max_new_tokens'"),
            ("[1]", "JSON object"),
            ("{", "not valid JSON"),
        ] {
            let e = parse(text, 10).unwrap_err();
            assert!(e.contains(named), "{text}: {e}");
        }
    }

    /// A folder without the file has none (every field absent); one whose file cannot be read
    /// (here a folder in its place) is refused naming it, not taken as absent.
    #[test]
    fn a_missing_file_is_none_an_unreadable_one_an_error() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(read(d.path(), 10).unwrap(), GenerationConfig::default());
        std::fs::write(d.path().join(GENERATION_CONFIG_FILE), r#"{"eos_token_id": 3, "top_k": 4}"#).unwrap();
        let g = read(d.path(), 10).unwrap();
        assert_eq!((g.eos, g.top_k), (vec![3], Some(4)));
        std::fs::remove_file(d.path().join(GENERATION_CONFIG_FILE)).unwrap();
        std::fs::create_dir(d.path().join(GENERATION_CONFIG_FILE)).unwrap();
        let e = read(d.path(), 10).unwrap_err().to_string();
        assert!(e.contains(GENERATION_CONFIG_FILE), "{e}");
    }

    /// The startup line's list: what the file sets, in a fixed order, nothing for a file that
    /// sets no default.
    #[test]
    fn defaults_text_names_what_the_file_sets() {
        let g = parse(
            r#"{"top_k": 20, "temperature": 0.7, "repetition_penalty": 1.1, "top_p": 0.8, "eos_token_id": 1}"#,
            10,
        )
        .unwrap();
        assert_eq!(g.defaults_text(), "temperature 0.7, top_p 0.8, top_k 20, repetition_penalty 1.1");
        assert_eq!(parse(r#"{"max_new_tokens": 9}"#, 10).unwrap().defaults_text(), "max_tokens 9");
        assert_eq!(parse(r#"{"eos_token_id": 1, "do_sample": true}"#, 10).unwrap().defaults_text(), "");
    }
}
