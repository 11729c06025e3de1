//! A model's own chat template: the Jinja text of `chat_template.jinja` or of the
//! `chat_template` key of `tokenizer_config.json`, rendered by a real Jinja engine
//! (`minijinja`) the way `transformers`' `apply_chat_template` renders it — `trim_blocks` and
//! `lstrip_blocks`, loop controls, Python's string methods (`.strip()`, `.startswith()`, …),
//! `raise_exception`, `strftime_now`, a `tojson` that writes what Python's `json.dumps`
//! writes, and the inputs `messages`, `tools` (none), `documents` (none),
//! `add_generation_prompt` and the special tokens' text (`bos_token`, `eos_token`, …).
//! Beside the tokenizer so that serving's chat API and training's conversations render alike.

use super::tokenizer::{special_token_text, Tokenizer};
use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde_json::{Map, Value as Json};
use std::path::{Path, PathBuf};

/// The tokens that end an assistant's turn in the templates of the common families, when the
/// template writes them and the vocabulary has them (beside the tokenizer's EOS).
const END_OF_TURN: &[&str] = &["<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|eom_id|>"];

/// Why a chat template cannot be loaded or rendered, on one line, naming the file or what the
/// template refused.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ChatTemplateError(pub String);

impl From<String> for ChatTemplateError {
    fn from(s: String) -> ChatTemplateError {
        ChatTemplateError(s)
    }
}

impl From<ChatTemplateError> for String {
    fn from(e: ChatTemplateError) -> String {
        e.0
    }
}

pub struct ChatTemplate {
    env: Environment<'static>,
    /// The file the template came from.
    pub file: PathBuf,
    /// `bos_token`, `eos_token`, `pad_token`, `unk_token` as text, for the template.
    specials: Map<String, Json>,
    /// Ids that end a turn: the tokenizer's EOS and the template's end-of-turn token.
    pub end_of_turn: Vec<u32>,
    /// The template's source, to tell which tools syntax it writes.
    source: String,
}

impl ChatTemplate {
    /// The template of the tokenizer `tok` (from the folder of its `tokenizer.json`), `None`
    /// when the folder has none; an error for one that is unreadable or does not parse.
    pub fn load(tok: &Tokenizer, eos: &[u32]) -> Result<Option<ChatTemplate>, ChatTemplateError> {
        let Tokenizer::Hf(t, path, ..) = tok else { return Ok(None) };
        let dir = path.parent().unwrap_or(Path::new("."));
        let config_path = dir.join(super::tokenizer::TOKENIZER_CONFIG_FILE);
        let config: Map<String, Json> = match std::fs::read_to_string(&config_path) {
            Ok(text) => {
                serde_json::from_str(&text).map_err(|e| format!("{} is not valid JSON: {e}", config_path.display()))?
            }
            Err(_) => Map::new(),
        };
        let jinja = dir.join(super::tokenizer::CHAT_TEMPLATE_FILE);
        let (source, file) = if jinja.is_file() {
            let s = std::fs::read_to_string(&jinja).map_err(|e| format!("cannot read {}: {e}", jinja.display()))?;
            (s, jinja)
        } else {
            match config.get("chat_template") {
                None | Some(Json::Null) => return Ok(None),
                Some(Json::String(s)) => (s.clone(), config_path.clone()),
                // a list of named templates: the default one
                Some(Json::Array(named)) => {
                    let default = named.iter().find(|t| t.get("name").and_then(Json::as_str) == Some("default"));
                    match default.and_then(|t| t.get("template")).and_then(Json::as_str) {
                        Some(s) => (s.to_string(), config_path.clone()),
                        None => {
                            return Err(ChatTemplateError(format!(
                                "{}: chat_template is a list without a template named \"default\"",
                                config_path.display()
                            )))
                        }
                    }
                }
                Some(_) => {
                    return Err(ChatTemplateError(format!("{}: chat_template must be a string", config_path.display())))
                }
            }
        };
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .expect("the default delimiters"),
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |fmt: String| -> Result<String, Error> {
            strftime(&fmt, now_unix()).map_err(|e| Error::new(ErrorKind::InvalidOperation, e))
        });
        env.add_filter("tojson", tojson);
        env.add_template_owned("chat", source.clone())
            .map_err(|e| format!("the chat template in {} does not parse: {}", file.display(), one_line(&e)))?;
        let mut specials = Map::new();
        for key in ["bos_token", "eos_token", "pad_token", "unk_token"] {
            let text = config.get(key).and_then(special_token_text);
            specials.insert(key.into(), text.map_or(Json::Null, |s| Json::String(s.into())));
        }
        let mut end_of_turn = eos.to_vec();
        for name in END_OF_TURN {
            if let Some(id) = t.token_to_id(name).filter(|_| source.contains(name)) {
                if !end_of_turn.contains(&id) {
                    end_of_turn.push(id);
                }
            }
        }
        Ok(Some(ChatTemplate { env, file, specials, end_of_turn, source }))
    }

    /// The conversation `messages` (a list of `{role, content}`) as the template writes it,
    /// with the assistant's header after it if `add_generation_prompt`; `kwargs` are further
    /// inputs the template reads (vLLM's `chat_template_kwargs`). The error is one line.
    pub fn render(
        &self,
        messages: &Json,
        add_generation_prompt: bool,
        kwargs: &Map<String, Json>,
    ) -> Result<String, ChatTemplateError> {
        self.render_with_tools(messages, None, add_generation_prompt, kwargs)
    }

    /// `render` with the tools the model may call (OpenAI's `tools`: `[{type: "function",
    /// function: {name, description, parameters}}]`) in the template's `tools` input, as
    /// `transformers`' `apply_chat_template(messages, tools=…)` passes them; assistant messages'
    /// `tool_calls` (arguments as objects) and `tool` messages are in `messages`.
    pub fn render_with_tools(
        &self,
        messages: &Json,
        tools: Option<&Json>,
        add_generation_prompt: bool,
        kwargs: &Map<String, Json>,
    ) -> Result<String, ChatTemplateError> {
        let mut ctx = kwargs.clone();
        for (k, v) in &self.specials {
            ctx.insert(k.clone(), v.clone());
        }
        ctx.insert("messages".into(), messages.clone());
        ctx.insert("tools".into(), tools.cloned().unwrap_or(Json::Null));
        ctx.insert("documents".into(), Json::Null);
        ctx.insert("add_generation_prompt".into(), Json::Bool(add_generation_prompt));
        let tmpl = self.env.get_template("chat").expect("added at load");
        tmpl.render(Value::from(minijinja::value::Serde(&ctx)))
            .map_err(|e| ChatTemplateError(format!("the chat template failed: {}", one_line(&e))))
    }
}

impl ChatTemplate {
    /// Whether the template reads the `tools` input (else tools need the generic fallback).
    pub fn takes_tools(&self) -> bool {
        self.source.contains("tools")
    }

    /// Whether the template's text contains `s` (a family's call syntax: `<tool_call>`, …).
    pub fn mentions(&self, s: &str) -> bool {
        self.source.contains(s)
    }
}

/// An error with its causes on one line.
fn one_line(e: &Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `tojson` as `transformers` defines it for templates: Python's `json.dumps(x,
/// ensure_ascii=False, indent=indent, sort_keys=sort_keys)` — `", "` and `": "` between
/// items without an indent, one item a line with one.
fn tojson(value: Value, indent: Option<usize>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match kwargs.get::<Option<usize>>("indent")? {
        Some(i) => Some(i),
        None => indent,
    };
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let v = serde_json::to_value(&value).map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let mut out = String::new();
    py_json(&v, indent, sort_keys, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

fn py_json(v: &Json, indent: Option<usize>, sort_keys: bool, depth: usize, out: &mut String) {
    let newline = |out: &mut String, d: usize| {
        if let Some(i) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(i * d));
        }
    };
    let sep = if indent.is_some() { "," } else { ", " };
    match v {
        Json::Array(a) if !a.is_empty() => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, depth + 1);
                py_json(x, indent, sort_keys, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        Json::Object(o) if !o.is_empty() => {
            let mut keys: Vec<&String> = o.keys().collect();
            if sort_keys {
                keys.sort();
            }
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, depth + 1);
                out.push_str(&Json::String(k.clone()).to_string());
                out.push_str(": ");
                py_json(&o[k], indent, sort_keys, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

fn now_unix() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// Python's `strftime` for the directives chat templates use (`%d %b %Y` and the like), in
/// UTC: `%Y %y %m %d %e %B %b %H %M %S %j %A %a %%`; any other is an error naming it.
fn strftime(fmt: &str, unix: i64) -> Result<String, String> {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[(m - 1) as usize] + d + i64::from(leap && m > 2);
    // 1970-01-01 was a Thursday
    let wday = (days + 3).rem_euclid(7) as usize;
    let mut out = String::new();
    let mut it = fmt.chars();
    while let Some(ch) = it.next() {
        if ch != '%' {
            out.push(ch);
            continue;
        }
        match it.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:2}")),
            Some('B') => out.push_str(MONTHS[(m - 1) as usize]),
            Some('b') => out.push_str(&MONTHS[(m - 1) as usize][..3]),
            Some('A') => out.push_str(DAYS[wday]),
            Some('a') => out.push_str(&DAYS[wday][..3]),
            Some('H') => out.push_str(&format!("{:02}", secs / 3600)),
            Some('M') => out.push_str(&format!("{:02}", secs / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", secs % 60)),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            Some(c) => return Err(format!("strftime_now: the directive %{c} is not supported")),
            None => return Err("strftime_now: the format ends with a lone %".into()),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_match_the_calendar() {
        // 2024-07-26 00:00:00 UTC (Llama 3.1's default date) was a Friday, day 208
        assert_eq!(strftime("%d %b %Y", 1_721_952_000).unwrap(), "26 Jul 2024");
        assert_eq!(strftime("%A %j %H:%M:%S %%", 1_721_952_000 + 3723).unwrap(), "Friday 208 01:02:03 %");
        // a leap day and the epoch
        assert_eq!(strftime("%Y-%m-%d %a", 951_782_400).unwrap(), "2000-02-29 Tue");
        assert_eq!(strftime("%B %e, %y", 0).unwrap(), "January  1, 70");
        assert!(strftime("%Q", 0).unwrap_err().contains("%Q"));
        // centuries that are not leap years, and the clock itself
        assert_eq!(strftime("%Y-%m-%d %j %a", 4_107_542_400).unwrap(), "2100-03-01 060 Mon");
        assert_eq!(strftime("%Y-%m-%d %j %a", -2_203_891_200).unwrap(), "1900-03-01 060 Thu");
        assert!((1_700_000_000..4_000_000_000).contains(&now_unix()));
    }

    #[test]
    fn tojson_writes_what_python_writes() {
        let v: Json =
            serde_json::from_str(r#"{"b": [1, 2.5, "é\n"], "a": {}, "c": [], "d": null, "e": true}"#).unwrap();
        let mut s = String::new();
        py_json(&v, None, true, 0, &mut s);
        // json.dumps(v, ensure_ascii=False, sort_keys=True)
        assert_eq!(s, r#"{"a": {}, "b": [1, 2.5, "é\n"], "c": [], "d": null, "e": true}"#);
        let mut s = String::new();
        py_json(&serde_json::json!({"x": [1, {"y": 2}]}), Some(2), false, 0, &mut s);
        // json.dumps(..., indent=2)
        assert_eq!(s, "{\n  \"x\": [\n    1,\n    {\n      \"y\": 2\n    }\n  ]\n}");
    }
}
