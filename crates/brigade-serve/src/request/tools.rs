//! Tool calls in the chat API: the request's `tools`, `tool_choice` and `parallel_tool_calls`
//! checked as OpenAI's API checks them; the call syntax of the model's template family (Hermes /
//! Qwen2.5 `<tool_call>{"name", "arguments"}</tool_call>`, Llama 3.x `{"name", "parameters"}`,
//! or the generic fallback `{"tool_calls": [{"name", "arguments"}]}` for templates that do not
//! take tools); the grammar that makes a required call parse (llguidance's Lark, each
//! function's `parameters` schema inside it); and the calls read back out of the text.

use super::error::{type_name, ApiError};
use serde_json::{json, Value};

/// What `tool_choice` asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    None,
    Auto,
    Required,
    Named(String),
}

/// How the model writes a call (its template's family).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Syntax {
    /// Hermes / Qwen2.5: `<tool_call>\n{"name": N, "arguments": {…}}\n</tool_call>`, one a line.
    Hermes,
    /// Llama 3.x: the message is `{"name": N, "parameters": {…}}` (one call a turn).
    Llama3,
    /// A template that does not take tools: `{"tool_calls": [{"name": N, "arguments": {…}}]}`.
    Generic,
}

/// A request's tools, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct Tools {
    /// `[{type: "function", function: {name, description?, parameters?, strict?}}]` as given.
    pub list: Value,
    pub choice: Choice,
    pub parallel: bool,
}

impl Tools {
    /// Each function's name and its parameters' schema (an empty object schema if none).
    pub fn functions(&self) -> Vec<(String, Value)> {
        self.list
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|t| {
                        let f = &t["function"];
                        let params = f.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object"}));
                        (f["name"].as_str().unwrap_or_default().to_string(), params)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn bad(param: &str, msg: String) -> ApiError {
    ApiError::bad(param, msg)
}

/// A function name OpenAI's API allows: letters, digits, `_` and `-`, 1 to 64 of them.
fn valid_name(n: &str) -> bool {
    !n.is_empty() && n.len() <= 64 && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// `tools`, `tool_choice` and `parallel_tool_calls` of a chat request; `None` when no tool is
/// given (and the choice allows that).
pub fn parse(
    tools: Option<&Value>,
    choice: Option<&Value>,
    parallel: Option<&Value>,
) -> Result<Option<Tools>, ApiError> {
    let list = match tools {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a.clone(),
        Some(v) => return Err(bad("tools", format!("'tools' must be a list of tools, got {}", type_name(v)))),
    };
    let mut names: Vec<String> = Vec::new();
    for (i, t) in list.iter().enumerate() {
        let p = format!("tools[{i}]");
        let Value::Object(t) = t else { return Err(bad(&p, format!("'{p}' must be an object"))) };
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(other) => {
                return Err(bad(
                    &format!("{p}.type"),
                    format!("'{p}.type' is '{other}'; this server calls tools of type \"function\""),
                ))
            }
            None => return Err(bad(&format!("{p}.type"), format!("'{p}.type' is required (\"function\")"))),
        }
        let Some(Value::Object(f)) = t.get("function") else {
            return Err(bad(&format!("{p}.function"), format!("'{p}.function' must be an object with a name")));
        };
        let name = match f.get("name") {
            Some(Value::String(n)) if valid_name(n) => n.clone(),
            Some(Value::String(n)) => {
                return Err(bad(
                    &format!("{p}.function.name"),
                    format!("'{p}.function.name' is '{n}'; a name is 1 to 64 letters, digits, '_' or '-'"),
                ))
            }
            _ => return Err(bad(&format!("{p}.function.name"), format!("'{p}.function.name' is required (a string)"))),
        };
        if names.contains(&name) {
            return Err(bad(&format!("{p}.function.name"), format!("two tools are named '{name}'; names must differ")));
        }
        match f.get("parameters") {
            None | Some(Value::Object(_)) => {}
            Some(v) => {
                return Err(bad(
                    &format!("{p}.function.parameters"),
                    format!("'{p}.function.parameters' must be a JSON schema (an object), got {}", type_name(v)),
                ))
            }
        }
        if let Some(Value::Object(s)) = f.get("parameters") {
            if let Some(ty) = s.get("type") {
                if !(ty.is_string() || ty.is_array()) {
                    return Err(bad(
                        &format!("{p}.function.parameters"),
                        format!(
                            "'{p}.function.parameters' is not a valid JSON schema: 'type' must be a string or a list"
                        ),
                    ));
                }
            }
        }
        if let Some(d) = f.get("description") {
            if !d.is_string() && !d.is_null() {
                return Err(bad(
                    &format!("{p}.function.description"),
                    format!("'{p}.function.description' must be a string"),
                ));
            }
        }
        names.push(name);
    }
    let choice = match choice {
        None | Some(Value::Null) => {
            if names.is_empty() {
                Choice::None
            } else {
                Choice::Auto
            }
        }
        Some(Value::String(s)) => match s.as_str() {
            "none" => Choice::None,
            "auto" => Choice::Auto,
            "required" => Choice::Required,
            other => {
                return Err(bad(
                    "tool_choice",
                    format!("'tool_choice' is '{other}'; use \"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": …}}}}"),
                ))
            }
        },
        Some(Value::Object(o)) => {
            let name = o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str);
            match (o.get("type").and_then(Value::as_str), name) {
                (Some("function"), Some(n)) => Choice::Named(n.to_string()),
                _ => {
                    return Err(bad(
                        "tool_choice",
                        "'tool_choice' as an object is {\"type\": \"function\", \"function\": {\"name\": …}}".into(),
                    ))
                }
            }
        }
        Some(v) => return Err(bad("tool_choice", format!("'tool_choice' must be a string or an object, got {}", type_name(v)))),
    };
    match &choice {
        Choice::Required if names.is_empty() => {
            return Err(bad("tool_choice", "'tool_choice' is \"required\" but no 'tools' are given".into()))
        }
        Choice::Named(n) if !names.contains(n) => {
            return Err(bad(
                "tool_choice",
                format!("'tool_choice' names the function '{n}', which is not among the tools ({})", names.join(", ")),
            ))
        }
        _ => {}
    }
    let parallel = match parallel {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("parallel_tool_calls", "'parallel_tool_calls' must be true or false".into())),
    };
    if names.is_empty() {
        return Ok(None);
    }
    Ok(Some(Tools { list: Value::Array(list), choice, parallel }))
}

/// An assistant message's `tool_calls` as the templates take them: each call's `arguments` (a
/// JSON string in the API) parsed to an object, as vLLM passes them; the ids it issues.
pub fn assistant_calls(i: usize, v: &Value) -> Result<(Value, Vec<String>), ApiError> {
    let p = format!("messages[{i}].tool_calls");
    let Value::Array(calls) = v else { return Err(bad(&p, format!("'{p}' must be a list of calls"))) };
    let mut out = Vec::new();
    let mut ids = Vec::new();
    for (j, c) in calls.iter().enumerate() {
        let q = format!("{p}[{j}]");
        let id = c
            .get("id")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(&format!("{q}.id"), format!("'{q}.id' is required (a string)")))?;
        if c.get("type").is_some_and(|t| t != "function") {
            return Err(bad(&format!("{q}.type"), format!("'{q}.type' must be \"function\"")));
        }
        let f =
            c.get("function").ok_or_else(|| bad(&format!("{q}.function"), format!("'{q}.function' is required")))?;
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(&format!("{q}.function.name"), format!("'{q}.function.name' is required (a string)")))?;
        let args = match f.get("arguments") {
            Some(Value::String(s)) => serde_json::from_str::<Value>(s).map_err(|e| {
                bad(&format!("{q}.function.arguments"), format!("'{q}.function.arguments' is not valid JSON: {e}"))
            })?,
            _ => {
                return Err(bad(
                    &format!("{q}.function.arguments"),
                    format!("'{q}.function.arguments' must be a JSON string (the call's arguments as text)"),
                ))
            }
        };
        ids.push(id.to_string());
        out.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}}));
    }
    Ok((Value::Array(out), ids))
}

/// The family of a chat template, from the call syntax it writes.
pub fn syntax_of(takes_tools: bool, mentions: impl Fn(&str) -> bool) -> Syntax {
    if !takes_tools {
        Syntax::Generic
    } else if mentions("<tool_call>") {
        Syntax::Hermes
    } else if mentions("parameters") {
        Syntax::Llama3
    } else {
        Syntax::Generic
    }
}

/// The generic fallback for a template that does not take tools (llama.cpp's generic format,
/// documented in docs/serving.md): a system message with the tools as JSON and how to call them
/// goes first (merged into the conversation's own system message), an assistant message's calls
/// become its content as the JSON the model is asked to write, a tool result becomes a user
/// message the model reads.
pub fn generic_messages(messages: &Value, tools: &Tools) -> Value {
    let list = serde_json::to_string(&tools.list).unwrap_or_default();
    let ask = match &tools.choice {
        Choice::Required => "You must call one of them.".to_string(),
        Choice::Named(n) => format!("You must call {n}."),
        Choice::Auto => {
            "Call them when they help; otherwise answer as JSON: {\"response\": \"your answer\"}.".to_string()
        }
        Choice::None => "Do not call them now: answer the user in plain text.".to_string(),
    };
    let preface = match tools.choice {
        Choice::None => format!("These tools were available:\n{list}\n\n{ask}"),
        _ => format!(
            "You can call these tools:\n{list}\n\nTo call tools, answer with JSON only: {{\"tool_calls\": [{{\"name\": \"<tool name>\", \"arguments\": {{...}}}}]}}. {ask}"
        ),
    };
    let mut out = Vec::new();
    let msgs = messages.as_array().cloned().unwrap_or_default();
    let mut rest = msgs.as_slice();
    match msgs.first() {
        Some(m) if m["role"] == "system" => {
            let own = m["content"].as_str().unwrap_or_default();
            out.push(json!({"role": "system", "content": format!("{own}\n\n{preface}")}));
            rest = &msgs[1..];
        }
        _ => out.push(json!({"role": "system", "content": preface})),
    }
    for m in rest {
        match m["role"].as_str() {
            Some("assistant") if m.get("tool_calls").is_some() => {
                let calls: Vec<Value> = m["tool_calls"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .map(|c| json!({"name": c["function"]["name"], "arguments": c["function"]["arguments"]}))
                            .collect()
                    })
                    .unwrap_or_default();
                out.push(json!({"role": "assistant", "content": json!({"tool_calls": calls}).to_string()}));
            }
            Some("tool") => out.push(json!({"role": "user", "content": format!(
                "Result of tool call {}: {}",
                m["tool_call_id"].as_str().unwrap_or_default(),
                m["content"].as_str().unwrap_or_default()
            )})),
            _ => out.push(m.clone()),
        }
    }
    Value::Array(out)
}

/// JSON written as the templates show it: `", "` and `": "`, no other whitespace.
const COMPACT: &str = r#""x-guidance": {"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}"#;

/// A parameters schema whose objects take only the properties they name: every object schema
/// with `properties` and no `additionalProperties` gets `additionalProperties: false` (as
/// llama.cpp's grammar converter treats an absent one). A function takes the arguments it
/// declares; JSON Schema's default would let a call add any others, which no function accepts.
/// The schema the template shows the model is left as given.
fn closed(v: &Value) -> Value {
    match v {
        Value::Object(o) => {
            let mut out: serde_json::Map<String, Value> = o
                .iter()
                .map(|(k, x)| {
                    let x = match k.as_str() {
                        // maps of names to schemas
                        "properties" | "$defs" | "definitions" | "patternProperties" => match x {
                            Value::Object(m) => Value::Object(m.iter().map(|(n, s)| (n.clone(), closed(s))).collect()),
                            other => other.clone(),
                        },
                        // schemas, or lists of them
                        "items" | "anyOf" | "oneOf" | "allOf" | "prefixItems" | "additionalProperties" | "not" => {
                            match x {
                                Value::Array(a) => Value::Array(a.iter().map(closed).collect()),
                                other => closed(other),
                            }
                        }
                        _ => x.clone(),
                    };
                    (k.clone(), x)
                })
                .collect();
            if out.contains_key("properties") && !out.contains_key("additionalProperties") {
                out.insert("additionalProperties".into(), Value::Bool(false));
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

/// One call's JSON schema: the function's name as a constant, then its arguments' schema
/// (closed: no arguments it does not declare).
fn call_schema(name: &str, params: &Value, args_key: &str) -> Value {
    json!({
        "type": "object",
        "properties": {"name": {"const": name}, args_key: closed(params)},
        "required": ["name", args_key],
        "additionalProperties": false,
    })
}

/// The Lark grammar (llguidance) of a request's output with tools: calls in the template
/// family's syntax, each one of the functions allowed with its parameters' schema, one or (with
/// `parallel_tool_calls`) more. `required` and a named function: calls from the first token.
/// `auto`: free text until the model starts a call (Hermes: `<tool_call>`, found by a lazy
/// lexeme; Llama 3.x: a message opening with `{`; generic: its JSON answer), from where the call
/// is held to its schema — so every call that is emitted parses. `None` for `none`.
pub fn grammar(tools: &Tools, syntax: Syntax) -> Option<String> {
    let auto = tools.choice == Choice::Auto;
    let functions: Vec<(String, Value)> = match &tools.choice {
        Choice::Required | Choice::Auto => tools.functions(),
        Choice::Named(n) => tools.functions().into_iter().filter(|(f, _)| f == n).collect(),
        Choice::None => return None,
    };
    let args_key = if syntax == Syntax::Llama3 { "parameters" } else { "arguments" };
    let one: Vec<Value> = functions.iter().map(|(n, p)| call_schema(n, p, args_key)).collect();
    let schema = |s: Value| {
        let mut text = s.to_string();
        // the compact separators llguidance writes, inserted at the schema's top
        text.insert_str(1, &format!("{COMPACT}, "));
        text
    };
    let call = schema(json!({"anyOf": one}));
    let many = tools.parallel && syntax != Syntax::Llama3;
    let more = if many { r#" ("\n" call)*"# } else { "" };
    let calls = format!("call: \"<tool_call>\\n\" body \"\\n</tool_call>\"\nbody: %json {call}\n");
    Some(match syntax {
        // text without a call, or text up to the first `<tool_call>` (lazy: it ends there)
        // and the calls from it
        Syntax::Hermes if auto => format!(
            "start: TEXT | pre \"\\n\" body \"\\n</tool_call>\"{more}\npre[lazy]: /(?s:.*)<tool_call>/\nTEXT: /(?s:.*)/ & ~/(?s:.*)<tool_call>(?s:.*)/\n{calls}"
        ),
        Syntax::Hermes => format!("start: call{more}\n{calls}"),
        Syntax::Llama3 if auto => {
            format!("start: TEXT | body\nTEXT: /(?s:.*)/ & ~/[ \\t\\n]*\\{{(?s:.*)/\nbody: %json {call}\n")
        }
        Syntax::Llama3 => format!("start: body\nbody: %json {call}\n"),
        Syntax::Generic => {
            let mut list = json!({"type": "array", "items": {"anyOf": one}, "minItems": 1});
            if !many {
                list["maxItems"] = json!(1);
            }
            let calls = json!({"type": "object", "properties": {"tool_calls": list}, "required": ["tool_calls"],
                "additionalProperties": false});
            let answer = json!({"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"],
                "additionalProperties": false});
            let whole = if auto { schema(json!({"anyOf": [calls, answer]})) } else { schema(calls) };
            format!("start: body\nbody: %json {whole}\n")
        }
    })
}

/// A call read back out of the model's text.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub name: String,
    /// The arguments as JSON text (compact, as they parse).
    pub arguments: String,
}

/// The calls in `text` written in `syntax` to functions among `names`, and the text before the
/// first call (the message's content). A call that does not parse (cut by `max_tokens`, or not
/// a call at all) is left as text: every call returned parses.
pub fn read_calls(text: &str, syntax: Syntax, names: &[String]) -> (String, Vec<Call>) {
    let as_call = |v: &Value, key: &str| -> Option<Call> {
        let name = v.get("name")?.as_str()?;
        let args = v.get(key).or_else(|| v.get("arguments")).or_else(|| v.get("parameters"))?;
        (names.iter().any(|n| n == name) && args.is_object())
            .then(|| Call { name: name.to_string(), arguments: args.to_string() })
    };
    match syntax {
        Syntax::Hermes => {
            let Some(first) = text.find("<tool_call>") else { return (text.to_string(), Vec::new()) };
            let mut calls = Vec::new();
            let mut rest = &text[first..];
            while let Some(start) = rest.find("<tool_call>") {
                let after = &rest[start + "<tool_call>".len()..];
                let Some(end) = after.find("</tool_call>") else { break };
                let Ok(v) = serde_json::from_str::<Value>(after[..end].trim()) else { break };
                let Some(c) = as_call(&v, "arguments") else { break };
                calls.push(c);
                rest = &after[end + "</tool_call>".len()..];
            }
            if calls.is_empty() {
                return (text.to_string(), calls);
            }
            (text[..first].trim_end().to_string(), calls)
        }
        Syntax::Llama3 => {
            let body = text.trim().trim_start_matches("<|python_tag|>").trim();
            let mut calls = Vec::new();
            for part in body.split(';') {
                match serde_json::from_str::<Value>(part.trim()).ok().as_ref().and_then(|v| as_call(v, "parameters")) {
                    Some(c) => calls.push(c),
                    None => return (text.to_string(), Vec::new()),
                }
            }
            (String::new(), calls)
        }
        Syntax::Generic => {
            let Ok(v) = serde_json::from_str::<Value>(text.trim()) else {
                // cut by max_tokens inside the list: the calls written whole before the cut
                let calls = whole_calls(text).iter().map_while(|c| as_call(c, "arguments")).collect::<Vec<_>>();
                return if calls.is_empty() { (text.to_string(), calls) } else { (String::new(), calls) };
            };
            if let Some(list) = v.get("tool_calls").and_then(Value::as_array) {
                let calls: Option<Vec<Call>> = list.iter().map(|c| as_call(c, "arguments")).collect();
                if let Some(calls) = calls.filter(|c| !c.is_empty()) {
                    return (String::new(), calls);
                }
            }
            match v.get("response").and_then(Value::as_str) {
                Some(r) => (r.to_string(), Vec::new()),
                None => (text.to_string(), Vec::new()),
            }
        }
    }
}

/// The elements written whole at the start of a generic answer's `{"tool_calls": [` list whose
/// end was cut off (the compact form the grammar writes: `, ` between elements).
fn whole_calls(text: &str) -> Vec<Value> {
    let Some(mut rest) = text.trim_start().strip_prefix(r#"{"tool_calls": ["#) else { return Vec::new() };
    let mut out = Vec::new();
    loop {
        let mut it = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        match it.next() {
            Some(Ok(v)) => {
                out.push(v);
                rest = &rest[it.byte_offset()..];
            }
            _ => return out,
        }
        match rest.strip_prefix(", ") {
            Some(r) => rest = r,
            None => return out,
        }
    }
}

/// What a streamed choice with tools sends next.
#[derive(Clone, Debug, PartialEq)]
pub enum Delta {
    /// Text of the message's content.
    Content(String),
    /// Call `index`, whole (it is sent as its id and name, then its arguments in pieces).
    Call(usize, Call),
}

/// A choice with tools, streamed as it is generated: the text before the first call as it comes
/// (holding back what may still turn out to start a call: a partial `<tool_call>` and the
/// whitespace before it, which the content loses), then each call as soon as it is whole. What
/// it sends adds up to what [`read_calls`] reads from the whole text: the same content, the same
/// calls. The Hermes syntax only; the others (whose text is JSON from its first character, or
/// not a call at all) are read once the choice ends.
#[derive(Clone, Debug)]
pub struct Stream {
    syntax: Syntax,
    names: Vec<String>,
    /// Bytes of the text sent as content.
    sent: usize,
    /// Calls sent.
    calls: usize,
}

impl Stream {
    pub fn new(syntax: Syntax, names: Vec<String>) -> Stream {
        Stream { syntax, names, sent: 0, calls: 0 }
    }

    /// What to send now that the choice's text is `text` (`ended`: it will not grow).
    pub fn feed(&mut self, text: &str, ended: bool) -> Vec<Delta> {
        let mut out = Vec::new();
        if self.syntax != Syntax::Hermes && !ended {
            return out;
        }
        let (content, calls) = read_calls(text, self.syntax, &self.names);
        // content that is final: with a call read, the text before it; at the end, all of it
        let upto = if !calls.is_empty() || ended {
            content.len()
        } else {
            let cut = match text.find(TOOL_CALL) {
                Some(at) => at,
                None => text.len() - partial_open(text),
            };
            text[..cut].trim_end().len()
        };
        if upto > self.sent {
            out.push(Delta::Content(text[self.sent..upto].to_string()));
            self.sent = upto;
        }
        for (k, c) in calls.into_iter().enumerate().skip(self.calls) {
            out.push(Delta::Call(k, c));
            self.calls = k + 1;
        }
        out
    }
}

const TOOL_CALL: &str = "<tool_call>";

/// Bytes at the end of `text` that begin `<tool_call>` (a call's opening, cut mid-way).
fn partial_open(text: &str) -> usize {
    (1..TOOL_CALL.len()).rev().find(|&n| text.ends_with(&TOOL_CALL[..n])).unwrap_or(0)
}

/// The calls as the API returns them (`message.tool_calls`), with ids `call_<base>_<k>`.
pub fn api_calls(calls: &[Call], base: &str) -> Value {
    Value::Array(
        calls
            .iter()
            .enumerate()
            .map(|(k, c)| json!({"id": call_id(base, k), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect(),
    )
}

/// Call `k`'s id among calls numbered from `base`.
pub fn call_id(base: &str, k: usize) -> String {
    format!("call_{base}_{k}")
}

/// The functions' names, in order.
pub fn names(tools: &Tools) -> Vec<String> {
    tools.functions().into_iter().map(|(n, _)| n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
    }

    #[test]
    fn tools_and_choices_are_checked_as_openai_checks_them() {
        let t = parse(Some(&json!([weather()])), None, None).unwrap().unwrap();
        assert_eq!((t.choice.clone(), t.parallel), (Choice::Auto, true));
        let t = parse(
            Some(&json!([weather()])),
            Some(&json!({"type": "function", "function": {"name": "get_weather"}})),
            Some(&json!(false)),
        )
        .unwrap()
        .unwrap();
        assert_eq!((t.choice, t.parallel), (Choice::Named("get_weather".into()), false));
        assert_eq!(parse(None, Some(&json!("none")), None).unwrap(), None);
        for (tools, choice, param) in [
            (json!([{"type": "retrieval"}]), None, "tools[0].type"),
            (json!([{"type": "function", "function": {"name": "a b"}}]), None, "tools[0].function.name"),
            (json!([weather(), weather()]), None, "tools[1].function.name"),
            (
                json!([{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
                None,
                "tools[0].function.parameters",
            ),
            (
                json!([{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]),
                None,
                "tools[0].function.parameters",
            ),
            (json!([weather()]), Some(json!({"type": "function", "function": {"name": "nope"}})), "tool_choice"),
            (json!([]), Some(json!("required")), "tool_choice"),
            (json!([weather()]), Some(json!("sometimes")), "tool_choice"),
            (json!("x"), None, "tools"),
        ] {
            let e = parse(Some(&tools), choice.as_ref(), None).expect_err(&tools.to_string());
            assert_eq!(e.param.as_deref(), Some(param), "{tools}: {}", e.message);
        }
    }

    #[test]
    fn calls_are_read_back_in_each_syntax_and_broken_ones_stay_text() {
        let names = vec!["get_weather".to_string(), "get-time".to_string()];
        let h = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get-time\", \"arguments\": {\"zone\": \"UTC\"}}\n</tool_call>";
        let (content, calls) = read_calls(h, Syntax::Hermes, &names);
        assert_eq!(content, "Let me check.");
        assert_eq!(calls.len(), 2);
        assert_eq!((calls[1].name.as_str(), calls[1].arguments.as_str()), ("get-time", r#"{"zone":"UTC"}"#));
        // cut by max_tokens: no call
        let (content, calls) = read_calls("<tool_call>\n{\"name\": \"get_weather\", \"argu", Syntax::Hermes, &names);
        assert!(calls.is_empty() && content.starts_with("<tool_call>"));
        // an unknown function is not a call
        assert!(read_calls("<tool_call>{\"name\": \"rm\", \"arguments\": {}}</tool_call>", Syntax::Hermes, &names)
            .1
            .is_empty());
        let (_, calls) =
            read_calls("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}", Syntax::Llama3, &names);
        assert_eq!(calls[0].arguments, r#"{"city":"Oslo"}"#);
        let (_, calls) = read_calls(
            r#"{"tool_calls": [{"name": "get-time", "arguments": {"zone": "X"}}]}"#,
            Syntax::Generic,
            &names,
        );
        assert_eq!(calls[0].name, "get-time");
        assert_eq!(read_calls(r#"{"response": "hi"}"#, Syntax::Generic, &names), ("hi".to_string(), vec![]));
        // a generic list cut by max_tokens: the calls written whole before the cut, and no other
        let cut = r#"{"tool_calls": [{"name": "get-time", "arguments": {"zone": "X"}}, {"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_weather", "argu"#;
        let (content, calls) = read_calls(cut, Syntax::Generic, &names);
        assert_eq!((content.as_str(), calls.len()), ("", 2));
        assert_eq!(calls[1].arguments, r#"{"city":"Oslo"}"#);
        let (content, calls) = read_calls(r#"{"tool_calls": [{"name": "get-time", "argu"#, Syntax::Generic, &names);
        assert!(calls.is_empty() && content.starts_with("{\"tool_calls\""));
        // an unknown function ends what is read
        let odd = r#"{"tool_calls": [{"name": "rm", "arguments": {}}, {"name": "get-time", "arguments": {}}, {"#;
        assert!(read_calls(odd, Syntax::Generic, &names).1.is_empty());
    }

    /// Every way of cutting `text` into two pieces, and token-like pieces of 3 bytes: what the
    /// stream sends adds up to what `read_calls` reads from the whole.
    fn streams_like_the_whole(text: &str, syntax: Syntax, names: &[String]) -> Vec<Delta> {
        let (content, calls) = read_calls(text, syntax, names);
        let cuts: Vec<usize> = (0..=text.len()).filter(|&i| text.is_char_boundary(i)).collect();
        let mut first = Vec::new();
        let mut plans: Vec<Vec<usize>> = cuts.iter().map(|&c| vec![c, text.len()]).collect();
        plans.push(cuts.iter().copied().step_by(3).chain([text.len()]).collect());
        for plan in plans {
            let mut s = Stream::new(syntax, names.to_vec());
            let mut deltas = Vec::new();
            for &end in &plan {
                deltas.extend(s.feed(&text[..end], false));
            }
            deltas.extend(s.feed(text, true));
            let sent: String = deltas
                .iter()
                .filter_map(|d| match d {
                    Delta::Content(c) => Some(c.as_str()),
                    _ => None,
                })
                .collect();
            let got: Vec<Call> = deltas
                .iter()
                .filter_map(|d| match d {
                    Delta::Call(_, c) => Some(c.clone()),
                    _ => None,
                })
                .collect();
            assert_eq!((sent.as_str(), &got), (content.as_str(), &calls), "{text:?} cut at {plan:?}");
            if first.is_empty() {
                first = deltas;
            }
        }
        first
    }

    #[test]
    fn a_streamed_choice_with_tools_adds_up_to_the_whole_and_sends_text_early() {
        let names = vec!["get_weather".to_string(), "get-time".to_string()];
        let w = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let t = "<tool_call>\n{\"name\": \"get-time\", \"arguments\": {\"zone\": \"UTC\"}}\n</tool_call>";
        for text in [
            format!("Let me check the <tool weather.  \n{w}\n{t}"),
            format!("{w}\n{t}"),
            "Just text, < and <tool_ in it \n".to_string(),
            format!("Text then a cut call {}", &w[..30]),
            format!("Text, a call, then a broken one\n{w}\n<tool_call>\n{{\"name\": \"rm\"}}\n</tool_call>"),
            "<tool_call>\n{\"name\": \"rm\", \"arguments\": {}}\n</tool_call> after".to_string(),
            "ünïcödé ✓ <tool_call>".to_string(),
        ] {
            streams_like_the_whole(&text, Syntax::Hermes, &names);
        }
        // cut in two just after the first call: the text and the first call go before the end
        let text = format!("Let me check.\n{w}\n{t}");
        let mut s = Stream::new(Syntax::Hermes, names.clone());
        let early = s.feed(&text[..text.find(t).unwrap()], false);
        assert_eq!(early.len(), 2, "{early:?}");
        assert_eq!(early[0], Delta::Content("Let me check.".into()));
        assert!(matches!(&early[1], Delta::Call(0, c) if c.name == "get_weather"));
        // the other syntaxes: everything at the end
        let g = r#"{"tool_calls": [{"name": "get-time", "arguments": {"zone": "X"}}]}"#;
        let mut s = Stream::new(Syntax::Generic, names.clone());
        assert!(s.feed(&g[..20], false).is_empty() && s.feed(g, false).is_empty());
        streams_like_the_whole(g, Syntax::Generic, &names);
        streams_like_the_whole(r#"{"name": "get-time", "parameters": {"zone": "X"}}"#, Syntax::Llama3, &names);
        streams_like_the_whole("plain words", Syntax::Llama3, &names);
    }

    #[test]
    fn a_calls_schema_takes_only_the_arguments_it_declares() {
        let params = json!({"type": "object", "properties": {"where": {"type": "object", "properties": {"city": {"type": "string"}}},
            "tags": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string"}}}},
            "extra": {"type": "object", "properties": {}, "additionalProperties": true}}, "required": ["where"]});
        let c = closed(&params);
        assert_eq!(c["additionalProperties"], false);
        assert_eq!(c["properties"]["where"]["additionalProperties"], false);
        assert_eq!(c["properties"]["tags"]["items"]["additionalProperties"], false);
        // what the schema says is kept
        assert_eq!(c["properties"]["extra"]["additionalProperties"], true);
        assert_eq!(c["required"], json!(["where"]));
        // a string property named like a keyword is not a schema
        let p = json!({"type": "object", "properties": {"items": {"type": "string"}}});
        assert_eq!(closed(&p)["properties"]["items"], json!({"type": "string"}));
    }

    #[test]
    fn assistant_calls_take_json_string_arguments() {
        let (v, ids) = assistant_calls(
            1,
            &json!([{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]),
        )
        .unwrap();
        assert_eq!(ids, ["c1"]);
        assert_eq!(v[0]["function"]["arguments"], json!({"a": 1}));
        let e =
            assistant_calls(1, &json!([{"id": "c1", "function": {"name": "f", "arguments": {"a": 1}}}])).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[1].tool_calls[0].function.arguments"));
        let e =
            assistant_calls(1, &json!([{"id": "c1", "function": {"name": "f", "arguments": "{oops"}}])).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[1].tool_calls[0].function.arguments"));
    }

    /// Each malformed function definition refused naming its field; both schema `type` forms taken.
    #[test]
    fn function_definitions_refused_naming_the_field() {
        let f = |function: Value| parse(Some(&json!([{"type": "function", "function": function}])), None, None);
        let err = |function: Value| format!("{:?}", f(function).unwrap_err());
        assert!(err(json!({"name": "bad name!"})).contains("'tools[0].function.name' is 'bad name!'"));
        assert!(err(json!({"name": 3})).contains("'tools[0].function.name' is required"));
        assert!(err(json!({"name": "f", "parameters": {"type": 5}})).contains("not a valid JSON schema"));
        for ty in [json!("object"), json!(["object", "null"])] {
            f(json!({"name": "f", "parameters": {"type": ty}})).unwrap().unwrap();
        }
        let two = parse(Some(&json!([weather(), {"type": "function", "function": {"name": "get-time"}}])), None, None);
        assert_eq!(names(&two.unwrap().unwrap()), vec!["get_weather".to_string(), "get-time".to_string()]);
    }

    /// The calls as the API returns them, ids numbered from the base.
    #[test]
    fn api_calls_number_their_ids() {
        let calls = [
            Call { name: "get_weather".into(), arguments: r#"{"city":"Paris"}"#.into() },
            Call { name: "get-time".into(), arguments: "{}".into() },
        ];
        assert_eq!(
            api_calls(&calls, "ab"),
            json!([
                {"id": "call_ab_0", "type": "function", "function": {"name": "get_weather", "arguments": r#"{"city":"Paris"}"#}},
                {"id": "call_ab_1", "type": "function", "function": {"name": "get-time", "arguments": "{}"}},
            ])
        );
    }

    /// The generic fallback, message by message: the preface merged into the conversation's
    /// own system message (or put first), calls as the JSON asked for, results as user messages.
    #[test]
    fn generic_fallback_messages() {
        let tools = parse(Some(&json!([weather()])), None, None).unwrap().unwrap();
        let list = serde_json::to_string(&tools.list).unwrap();
        let preface = format!(
            "You can call these tools:\n{list}\n\nTo call tools, answer with JSON only: {{\"tool_calls\": [{{\"name\": \"<tool name>\", \"arguments\": {{...}}}}]}}. Call them when they help; otherwise answer as JSON: {{\"response\": \"your answer\"}}."
        );
        let call = json!({"id": "call_x_0", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}});
        let talk = json!([
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": null, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_x_0", "content": "sunny"},
            {"role": "assistant", "content": "It is sunny."},
        ]);
        let turns = |m: &Value| m.as_array().unwrap()[1..].to_vec();
        let want_turns = vec![
            json!({"role": "user", "content": "Weather?"}),
            json!({"role": "assistant", "content": json!({"tool_calls": [{"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}]}).to_string()}),
            json!({"role": "user", "content": "Result of tool call call_x_0: sunny"}),
            json!({"role": "assistant", "content": "It is sunny."}),
        ];
        let out = generic_messages(&talk, &tools);
        assert_eq!(out[0], json!({"role": "system", "content": preface}));
        assert_eq!(turns(&out), want_turns);
        let mut with_system = vec![json!({"role": "system", "content": "Be brief."})];
        with_system.extend(talk.as_array().unwrap().iter().cloned());
        let out = generic_messages(&Value::Array(with_system), &tools);
        assert_eq!(out[0], json!({"role": "system", "content": format!("Be brief.\n\n{preface}")}));
        assert_eq!(turns(&out), want_turns);
    }

    /// A feed that adds nothing sends nothing (no empty content delta).
    #[test]
    fn a_feed_with_nothing_new_sends_nothing() {
        let mut s = Stream::new(Syntax::Hermes, vec!["get_weather".to_string()]);
        assert_eq!(s.feed("Hello", false), vec![Delta::Content("Hello".into())]);
        assert_eq!(s.feed("Hello", false), vec![]);
        assert_eq!(s.feed("Hello", true), vec![]);
    }
}
