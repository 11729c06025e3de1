//! The body of `POST /v1/completions`, read field by field so that every mistake gets a
//! message naming the field (OpenAI's error format). Every parameter OpenAI's completions API
//! defines is either honoured or refused when set to anything but its no-op value; unknown
//! fields are refused — nothing is silently ignored.

use super::error::ApiError;
use brigade::models::generation_config::MAX_REPETITION_PENALTY;
use serde_json::{Map, Value};

#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

#[derive(Clone, Debug)]
pub struct Completion {
    pub model: Option<String>,
    pub prompts: Vec<Prompt>,
    /// `None`: 16, or what the context leaves if less.
    pub max_tokens: Option<usize>,
    pub temperature: f32,
    pub top_p: f32,
    /// 0: all tokens.
    pub top_k: usize,
    /// 1: none (vLLM's `repetition_penalty`; see `engine::Sampling`).
    pub repetition_penalty: f32,
    pub stop: Vec<String>,
    pub seed: Option<u64>,
    pub n: usize,
    /// Report each token's log-probability and this many alternatives.
    pub logprobs: Option<usize>,
    pub stream: bool,
    pub include_usage: bool,
    pub ignore_eos: bool,
    pub return_token_ids: bool,
    /// Structured output: what every choice's text must be.
    pub constraint: Option<crate::constraint::Spec>,
    /// A chat request with tools: the call syntax and the functions' names, to read the calls
    /// back out of each choice's text.
    pub tool_calls: Option<(super::tools::Syntax, Vec<String>)>,
}

/// What a request that leaves a sampling field out gets: OpenAI's defaults, or those the
/// model's `generation_config.json` sets (`brigade serve --generation-config auto`, as vLLM).
#[derive(Clone, Debug, PartialEq)]
pub struct Defaults {
    pub temperature: f32,
    pub top_p: f32,
    /// 0: all tokens.
    pub top_k: usize,
    pub repetition_penalty: f32,
    /// `max_tokens` when a request gives none (`None`: 16, or what the context leaves).
    pub max_tokens: Option<usize>,
}

impl Default for Defaults {
    fn default() -> Defaults {
        Defaults { temperature: 1.0, top_p: 1.0, top_k: 0, repetition_penalty: 1.0, max_tokens: None }
    }
}

impl Defaults {
    /// OpenAI's, with what `generation_config.json` sets in their place.
    pub fn from_generation(g: &brigade::models::generation_config::GenerationConfig) -> Defaults {
        let d = Defaults::default();
        Defaults {
            temperature: g.temperature.map_or(d.temperature, |x| x as f32),
            top_p: g.top_p.map_or(d.top_p, |x| x as f32),
            top_k: g.top_k.unwrap_or(d.top_k),
            repetition_penalty: g.repetition_penalty.map_or(d.repetition_penalty, |x| x as f32),
            max_tokens: g.max_new_tokens,
        }
    }
}

/// The most choices one request may ask for.
pub const MAX_N: usize = 64;
/// The most alternatives `logprobs` may ask for (vLLM's bound; OpenAI's is 5).
pub const MAX_LOGPROBS: usize = 20;

/// The fields both APIs take.
pub(crate) const COMMON: &[&str] = &[
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "repetition_penalty",
    "stop",
    "seed",
    "n",
    "stream",
    "stream_options",
    "ignore_eos",
    "return_token_ids",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "user",
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_choice",
];

/// The fields only `/v1/completions` takes.
const COMPLETIONS: &[&str] = &["prompt", "logprobs", "echo", "best_of", "suffix"];
pub(crate) use super::error::type_name;

/// A field that is absent or null is `None`.
pub(crate) fn field<'a>(o: &'a Map<String, Value>, k: &str) -> Option<&'a Value> {
    o.get(k).filter(|v| !v.is_null())
}

pub(crate) fn bool_field(o: &Map<String, Value>, k: &str) -> Result<bool, ApiError> {
    match field(o, k) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(ApiError::bad(k, format!("'{k}' must be true or false, got {}", type_name(v)))),
    }
}

pub(crate) fn int_field(o: &Map<String, Value>, k: &str) -> Result<Option<i64>, ApiError> {
    match field(o, k) {
        None => Ok(None),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(i) => Ok(Some(i)),
            None => Err(ApiError::bad(k, format!("'{k}' must be an integer, got {n}"))),
        },
        Some(v) => Err(ApiError::bad(k, format!("'{k}' must be an integer, got {}", type_name(v)))),
    }
}

pub(crate) fn num_field(o: &Map<String, Value>, k: &str) -> Result<Option<f64>, ApiError> {
    match field(o, k) {
        None => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(v) => Err(ApiError::bad(k, format!("'{k}' must be a number, got {}", type_name(v)))),
    }
}

fn token_ids(v: &[Value]) -> Option<Vec<u32>> {
    v.iter().map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok())).collect()
}

fn prompts(v: Option<&Value>) -> Result<Vec<Prompt>, ApiError> {
    let bad = |m: &str| ApiError::bad("prompt", m.to_string());
    let what = "'prompt' must be a string, a list of strings, a list of token ids or a list of lists of token ids";
    match v {
        None => Err(bad("'prompt' is required")),
        Some(Value::String(s)) => Ok(vec![Prompt::Text(s.clone())]),
        Some(Value::Array(a)) if a.is_empty() => Err(bad("'prompt' is an empty list")),
        Some(Value::Array(a)) => match &a[0] {
            Value::String(_) => {
                a.iter().map(|s| s.as_str().map(|s| Prompt::Text(s.to_string())).ok_or_else(|| bad(what))).collect()
            }
            Value::Number(_) => token_ids(a)
                .map(|t| vec![Prompt::Ids(t)])
                .ok_or_else(|| bad("'prompt' as token ids must hold integers from 0 to 4294967295 only")),
            Value::Array(_) => a
                .iter()
                .map(|p| match p {
                    Value::Array(p) if !p.is_empty() => token_ids(p)
                        .map(Prompt::Ids)
                        .ok_or_else(|| bad("'prompt' as lists of token ids must hold integers only")),
                    _ => Err(bad(what)),
                })
                .collect(),
            _ => Err(bad(what)),
        },
        Some(_) => Err(bad(what)),
    }
}

/// The body as a JSON object whose fields are all among `COMMON` and `own` (the API's own).
pub(crate) fn object(body: &[u8], own: &[&str]) -> Result<Map<String, Value>, ApiError> {
    object_of(body, &[own, COMMON])
}

/// The body as a JSON object whose fields are all in one of the lists `known`.
pub(crate) fn object_of(body: &[u8], known: &[&[&str]]) -> Result<Map<String, Value>, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| ApiError {
        status: 400,
        message: format!("the request body is not valid JSON: {e}"),
        kind: "invalid_request_error",
        param: None,
        code: None,
    })?;
    let Value::Object(o) = v else {
        return Err(ApiError::bad("body", format!("the request body must be a JSON object, got {}", type_name(&v))));
    };
    let all: Vec<&str> = known.iter().flat_map(|l| l.iter().copied()).collect();
    if let Some(k) = o.keys().find(|k| !all.contains(&k.as_str())) {
        return Err(ApiError::bad(k, format!("unsupported parameter '{k}'; this server takes {}", all.join(", "))));
    }
    Ok(o)
}

/// The fields both APIs share (`COMMON`): sampling, stopping, streaming, and OpenAI's
/// parameters this server does not implement (only their no-op values pass). No prompt and
/// no log-probabilities yet: each API reads its own.
pub(crate) fn common(o: &Map<String, Value>, d: &Defaults) -> Result<Completion, ApiError> {
    let model = match field(o, "model") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => return Err(ApiError::bad("model", format!("'model' must be a string, got {}", type_name(v)))),
    };
    let max_tokens = match int_field(o, "max_tokens")? {
        None => None,
        Some(m) if m < 1 => {
            return Err(ApiError::bad("max_tokens", format!("'max_tokens' must be at least 1, got {m}")))
        }
        Some(m) => Some(usize::try_from(m).unwrap_or(usize::MAX)),
    };
    // the request's own value is held to OpenAI's range; a model's default is taken as it is
    let given = num_field(o, "temperature")?;
    let temperature = given.unwrap_or(d.temperature as f64);
    if given.is_some() && !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::bad("temperature", format!("'temperature' must be from 0 to 2, got {temperature}")));
    }
    let top_p = num_field(o, "top_p")?.unwrap_or(d.top_p as f64);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad("top_p", format!("'top_p' must be above 0 and at most 1, got {top_p}")));
    }
    let top_k = match int_field(o, "top_k")? {
        None => d.top_k,
        Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => k as usize,
        Some(k) => {
            return Err(ApiError::bad("top_k", format!("'top_k' must be -1 or 0 (all tokens) or positive, got {k}")))
        }
    };
    let repetition_penalty = num_field(o, "repetition_penalty")?.unwrap_or(d.repetition_penalty as f64);
    if !(repetition_penalty > 0.0 && repetition_penalty <= MAX_REPETITION_PENALTY) {
        return Err(ApiError::bad(
            "repetition_penalty",
            format!(
                "'repetition_penalty' must be above 0 and at most {MAX_REPETITION_PENALTY} (1: none), got {repetition_penalty}"
            ),
        ));
    }
    let stop = match field(o, "stop") {
        None => vec![],
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.len() <= 4 => a
            .iter()
            .map(|s| s.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ApiError::bad("stop", "'stop' must be a string or a list of up to 4 strings"))?,
        Some(_) => return Err(ApiError::bad("stop", "'stop' must be a string or a list of up to 4 strings")),
    };
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::bad("stop", "'stop' strings must not be empty"));
    }
    let seed = int_field(o, "seed")?.map(|s| s as u64);
    let n = match int_field(o, "n")? {
        None => 1,
        Some(n) if (1..=MAX_N as i64).contains(&n) => n as usize,
        Some(n) => return Err(ApiError::bad("n", format!("'n' must be from 1 to {MAX_N}, got {n}"))),
    };
    let stream = bool_field(o, "stream")?;
    let include_usage = match field(o, "stream_options") {
        None => false,
        Some(_) if !stream => {
            return Err(ApiError::bad("stream_options", "'stream_options' is only allowed when 'stream' is true"))
        }
        Some(Value::Object(so)) => {
            if let Some(k) = so.keys().find(|k| *k != "include_usage") {
                return Err(ApiError::bad(
                    "stream_options",
                    format!("unsupported stream option '{k}'; this server takes include_usage"),
                ));
            }
            bool_field(so, "include_usage")
                .map_err(|_| ApiError::bad("stream_options", "'stream_options.include_usage' must be true or false"))?
        }
        Some(v) => {
            return Err(ApiError::bad(
                "stream_options",
                format!("'stream_options' must be an object, got {}", type_name(v)),
            ))
        }
    };
    for k in ["presence_penalty", "frequency_penalty"] {
        if let Some(p) = num_field(o, k)? {
            if p != 0.0 {
                return Err(ApiError::bad(k, format!("'{k}' is not supported; leave it out or set it to 0")));
            }
        }
    }
    match field(o, "logit_bias") {
        None => {}
        Some(Value::Object(m)) if m.is_empty() => {}
        Some(_) => return Err(ApiError::bad("logit_bias", "'logit_bias' is not supported; leave it out")),
    }
    if let Some(u) = field(o, "user") {
        if !u.is_string() {
            return Err(ApiError::bad("user", format!("'user' must be a string, got {}", type_name(u))));
        }
    }
    let constraint = constraint(o)?;
    Ok(Completion {
        constraint,
        tool_calls: None,
        model,
        prompts: Vec::new(),
        max_tokens,
        temperature: temperature as f32,
        top_p: top_p as f32,
        top_k,
        repetition_penalty: repetition_penalty as f32,
        stop,
        seed,
        n,
        logprobs: None,
        stream,
        include_usage,
        ignore_eos: bool_field(o, "ignore_eos")?,
        return_token_ids: bool_field(o, "return_token_ids")?,
    })
}

/// A structured-output request: OpenAI's `response_format` (`json_schema`, `json_object`,
/// `text`) or vLLM's `guided_json`, `guided_regex`, `guided_choice` — at most one of them.
fn constraint(o: &Map<String, Value>) -> Result<Option<crate::constraint::Spec>, ApiError> {
    use crate::constraint::Spec;
    let given: Vec<&str> = ["response_format", "guided_json", "guided_regex", "guided_choice"]
        .into_iter()
        .filter(|k| field(o, k).is_some())
        .collect();
    if given.len() > 1 {
        return Err(ApiError::bad(given[1], format!("give one of {}, not several", given.join(" and "))));
    }
    let Some(&k) = given.first() else { return Ok(None) };
    let v = &o[k];
    let bad = |m: &str| Err(ApiError::bad(k, m.to_string()));
    match k {
        "response_format" => {
            let kind = v.get("type").and_then(Value::as_str);
            match kind {
                Some("text") => Ok(None),
                Some("json_object") => Ok(Some(Spec::JsonObject)),
                Some("json_schema") => match v.get("json_schema").and_then(|j| j.get("schema")) {
                    Some(s) if s.is_object() => Ok(Some(Spec::JsonSchema(s.clone()))),
                    _ => bad("'response_format' of type json_schema needs \"json_schema\": {\"schema\": {…}}"),
                },
                _ => bad("'response_format' must be {\"type\": \"text\" | \"json_object\" | \"json_schema\", …}"),
            }
        }
        "guided_json" => match v {
            Value::Object(_) => Ok(Some(Spec::JsonSchema(v.clone()))),
            Value::String(t) => match serde_json::from_str::<Value>(t) {
                Ok(s) if s.is_object() => Ok(Some(Spec::JsonSchema(s))),
                _ => bad("'guided_json' must be a JSON schema (an object, or its text)"),
            },
            _ => bad("'guided_json' must be a JSON schema (an object, or its text)"),
        },
        "guided_regex" => match v.as_str() {
            Some(r) if !r.is_empty() => Ok(Some(Spec::Regex(r.to_string()))),
            _ => bad("'guided_regex' must be a non-empty string"),
        },
        _ => match v.as_array() {
            Some(a) if !a.is_empty() && a.iter().all(|c| c.as_str().is_some_and(|c| !c.is_empty())) => {
                Ok(Some(Spec::Choice(a.iter().filter_map(Value::as_str).map(str::to_string).collect())))
            }
            _ => bad("'guided_choice' must be a non-empty list of non-empty strings"),
        },
    }
}

/// Parses and checks a `/v1/completions` body (limits that depend on the model are checked
/// later), with OpenAI's defaults.
pub fn parse(body: &[u8]) -> Result<Completion, ApiError> {
    parse_with(body, &Defaults::default())
}

/// [`parse`], a field left out taking its value from `d`.
pub fn parse_with(body: &[u8], d: &Defaults) -> Result<Completion, ApiError> {
    let o = object(body, COMPLETIONS)?;
    let prompts = prompts(field(&o, "prompt"))?;
    let mut c = common(&o, d)?;
    c.prompts = prompts;
    c.logprobs = match int_field(&o, "logprobs")? {
        None => None,
        Some(k) if (0..=MAX_LOGPROBS as i64).contains(&k) => Some(k as usize),
        Some(k) => {
            return Err(ApiError::bad("logprobs", format!("'logprobs' must be from 0 to {MAX_LOGPROBS}, got {k}")))
        }
    };
    if bool_field(&o, "echo")? {
        return Err(ApiError::bad("echo", "'echo' is not supported; leave it out or set it to false"));
    }
    match int_field(&o, "best_of")? {
        None => {}
        Some(b) if b == c.n as i64 => {}
        Some(b) => {
            return Err(ApiError::bad(
                "best_of",
                format!("'best_of' other than n is not supported (got {b}, n is {})", c.n),
            ))
        }
    }
    if field(&o, "suffix").is_some() {
        return Err(ApiError::bad("suffix", "'suffix' is not supported; leave it out"));
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: &str) -> ApiError {
        parse(body.as_bytes()).expect_err(body)
    }

    #[test]
    fn prompts_in_every_form() {
        let p = |b: &str| parse(b.as_bytes()).unwrap().prompts;
        assert_eq!(p(r#"{"prompt": "hi"}"#), [Prompt::Text("hi".into())]);
        assert_eq!(p(r#"{"prompt": ["a", "b"]}"#), [Prompt::Text("a".into()), Prompt::Text("b".into())]);
        assert_eq!(p(r#"{"prompt": [1, 2]}"#), [Prompt::Ids(vec![1, 2])]);
        assert_eq!(p(r#"{"prompt": [[1], [2, 3]]}"#), [Prompt::Ids(vec![1]), Prompt::Ids(vec![2, 3])]);
    }

    #[test]
    fn defaults_are_openais() {
        let c = parse(br#"{"prompt": "x"}"#).unwrap();
        assert_eq!((c.temperature, c.top_p, c.top_k, c.n, c.max_tokens), (1.0, 1.0, 0, 1, None));
        assert!(!c.stream && c.logprobs.is_none() && c.stop.is_empty());
    }

    #[test]
    fn mistakes_name_their_field() {
        for (body, param) in [
            ("{", None),
            ("[1]", Some("body")),
            (r#"{}"#, Some("prompt")),
            (r#"{"prompt": []}"#, Some("prompt")),
            (r#"{"prompt": [1, "a"]}"#, Some("prompt")),
            (r#"{"prompt": [-1]}"#, Some("prompt")),
            (r#"{"prompt": [[]]}"#, Some("prompt")),
            (r#"{"prompt": 5}"#, Some("prompt")),
            (r#"{"prompt": "x", "max_tokens": "10"}"#, Some("max_tokens")),
            (r#"{"prompt": "x", "max_tokens": -5}"#, Some("max_tokens")),
            (r#"{"prompt": "x", "max_tokens": 0}"#, Some("max_tokens")),
            (r#"{"prompt": "x", "max_tokens": 1.5}"#, Some("max_tokens")),
            (r#"{"prompt": "x", "temperature": 3}"#, Some("temperature")),
            (r#"{"prompt": "x", "temperature": -0.1}"#, Some("temperature")),
            (r#"{"prompt": "x", "top_p": 0}"#, Some("top_p")),
            (r#"{"prompt": "x", "top_k": -2}"#, Some("top_k")),
            (r#"{"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}"#, Some("stop")),
            (r#"{"prompt": "x", "stop": [""]}"#, Some("stop")),
            (r#"{"prompt": "x", "n": 0}"#, Some("n")),
            (r#"{"prompt": "x", "logprobs": 21}"#, Some("logprobs")),
            (r#"{"prompt": "x", "stream": "yes"}"#, Some("stream")),
            (r#"{"prompt": "x", "stream_options": {"include_usage": true}}"#, Some("stream_options")),
            (r#"{"prompt": "x", "stream": true, "stream_options": {"other": 1}}"#, Some("stream_options")),
            (r#"{"prompt": "x", "echo": true}"#, Some("echo")),
            (r#"{"prompt": "x", "best_of": 3}"#, Some("best_of")),
            (r#"{"prompt": "x", "presence_penalty": 0.5}"#, Some("presence_penalty")),
            (r#"{"prompt": "x", "logit_bias": {"5": 1}}"#, Some("logit_bias")),
            (r#"{"prompt": "x", "suffix": "y"}"#, Some("suffix")),
            (r#"{"prompt": "x", "unknown_knob": 1}"#, Some("unknown_knob")),
        ] {
            let e = err(body);
            assert_eq!(e.status, 400, "{body}");
            assert_eq!(e.param.as_deref(), param, "{body}: {}", e.message);
            assert_eq!(e.body()["error"]["type"], "invalid_request_error");
        }
    }

    #[test]
    fn no_op_values_of_unsupported_parameters_pass() {
        parse(br#"{"prompt": "x", "echo": false, "best_of": 2, "n": 2, "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}, "suffix": null, "user": "u1"}"#).unwrap();
        let c = parse(br#"{"prompt": "x", "stream": true, "stream_options": {"include_usage": true}, "stop": "\n", "seed": 7, "logprobs": 2, "ignore_eos": true, "return_token_ids": true, "top_k": -1}"#).unwrap();
        assert!(c.stream && c.include_usage && c.ignore_eos && c.return_token_ids);
        assert_eq!((c.stop, c.seed, c.logprobs, c.top_k), (vec!["\n".to_string()], Some(7), Some(2), 0));
    }

    /// A model's defaults fill only the fields a request leaves out (null counts as out); a
    /// request's own value wins, even OpenAI's default value, and `top_k: -1` still means all.
    #[test]
    fn defaults_fill_only_what_is_left_out() {
        let d = Defaults { temperature: 0.6, top_p: 0.9, top_k: 20, repetition_penalty: 1.1, max_tokens: Some(5) };
        let c = parse_with(br#"{"prompt": "x"}"#, &d).unwrap();
        assert_eq!((c.temperature, c.top_p, c.top_k, c.repetition_penalty), (0.6, 0.9, 20, 1.1));
        assert_eq!(c.max_tokens, None, "max_tokens' default is applied against the context, later");
        let c = parse_with(
            br#"{"prompt": "x", "temperature": 1, "top_p": 1, "top_k": -1, "repetition_penalty": 1, "seed": null}"#,
            &d,
        )
        .unwrap();
        assert_eq!((c.temperature, c.top_p, c.top_k, c.repetition_penalty), (1.0, 1.0, 0, 1.0));
        let c = parse_with(br#"{"prompt": "x", "temperature": null, "top_k": 3}"#, &d).unwrap();
        assert_eq!((c.temperature, c.top_k), (0.6, 3));
        for bad in [r#"{"prompt": "x", "repetition_penalty": 0}"#, r#"{"prompt": "x", "repetition_penalty": 11}"#] {
            assert_eq!(err(bad).param.as_deref(), Some("repetition_penalty"), "{bad}");
        }
        assert_eq!(Defaults::from_generation(&Default::default()), Defaults::default());
    }

    /// Every structured-output form read into its constraint, and each malformed one refused
    /// naming its field (these were reached only through the HTTP tests).
    #[test]
    fn structured_output_forms_and_their_refusals() {
        use crate::constraint::Spec;
        let spec = |body: &str| parse(body.as_bytes()).unwrap_or_else(|e| panic!("{body}: {}", e.message)).constraint;
        let schema = serde_json::json!({"type": "object"});
        let cases: Vec<(&str, Option<Spec>)> = vec![
            (r#"{"prompt": "x"}"#, None),
            (r#"{"prompt": "x", "response_format": {"type": "text"}}"#, None),
            (r#"{"prompt": "x", "response_format": {"type": "json_object"}}"#, Some(Spec::JsonObject)),
            (
                r#"{"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "v", "schema": {"type": "object"}}}}"#,
                Some(Spec::JsonSchema(schema.clone())),
            ),
            (r#"{"prompt": "x", "guided_json": {"type": "object"}}"#, Some(Spec::JsonSchema(schema.clone()))),
            (r#"{"prompt": "x", "guided_json": "{\"type\": \"object\"}"}"#, Some(Spec::JsonSchema(schema))),
            (r#"{"prompt": "x", "guided_regex": "[a-z]+"}"#, Some(Spec::Regex("[a-z]+".into()))),
            (r#"{"prompt": "x", "guided_choice": ["a", "b c"]}"#, Some(Spec::Choice(vec!["a".into(), "b c".into()]))),
        ];
        for (body, want) in cases {
            assert_eq!(format!("{:?}", spec(body)), format!("{want:?}"), "{body}");
        }
        for (body, field) in [
            (
                r#"{"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": 3}}}"#,
                "response_format",
            ),
            (r#"{"prompt": "x", "response_format": {"type": "yaml"}}"#, "response_format"),
            (r#"{"prompt": "x", "guided_json": "[1]"}"#, "guided_json"),
            (r#"{"prompt": "x", "guided_json": "{"}"#, "guided_json"),
            (r#"{"prompt": "x", "guided_json": 3}"#, "guided_json"),
            (r#"{"prompt": "x", "guided_regex": ""}"#, "guided_regex"),
            (r#"{"prompt": "x", "guided_regex": 3}"#, "guided_regex"),
            (r#"{"prompt": "x", "guided_choice": []}"#, "guided_choice"),
            (r#"{"prompt": "x", "guided_choice": ["a", ""]}"#, "guided_choice"),
            (r#"{"prompt": "x", "guided_choice": ["a", 3]}"#, "guided_choice"),
            (r#"{"prompt": "x", "guided_regex": "a", "guided_choice": ["b"]}"#, "guided_choice"),
        ] {
            assert_eq!(err(body).param.as_deref(), Some(field), "{body}");
        }
    }

    /// The edges of the limits: one token is a valid max_tokens, up to four stop strings.
    #[test]
    fn limits_at_their_edges() {
        assert_eq!(parse(br#"{"prompt": "x", "max_tokens": 1}"#).unwrap().max_tokens, Some(1));
        assert_eq!(err(r#"{"prompt": "x", "max_tokens": 0}"#).param.as_deref(), Some("max_tokens"));
        let four = parse(br#"{"prompt": "x", "stop": ["a", "b", "c", "d"]}"#).unwrap();
        assert_eq!(four.stop.len(), 4);
        assert_eq!(err(r#"{"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}"#).param.as_deref(), Some("stop"));
    }

    /// What generation_config.json sets becomes the defaults, field by field.
    #[test]
    fn defaults_from_a_generation_config() {
        let g = brigade::models::generation_config::parse(
            r#"{"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.1, "max_new_tokens": 64}"#,
            10,
        )
        .unwrap();
        let d = Defaults::from_generation(&g);
        assert_eq!(
            d,
            Defaults { temperature: 0.7, top_p: 0.8, top_k: 20, repetition_penalty: 1.1, max_tokens: Some(64) }
        );
        let only_t = brigade::models::generation_config::parse(r#"{"temperature": 0.6}"#, 10).unwrap();
        assert_eq!(Defaults::from_generation(&only_t), Defaults { temperature: 0.6, ..Defaults::default() });
    }
}
