//! The body of `POST /v1/chat/completions`, read field by field as `completion` reads completions:
//! the conversation (`messages`: system, user and assistant turns, `content` a string or a
//! list of text parts), the chat form of log-probabilities (`logprobs` + `top_logprobs`),
//! `max_completion_tokens`, vLLM's `add_generation_prompt` and `chat_template_kwargs`, and
//! every field both APIs share, and tools (`tools`, `tool_choice`, `parallel_tool_calls`, an
//! assistant's `tool_calls`, `tool` messages answering them: `request::tools`). Audio and images
//! are refused with 400 naming the field, as is anything unknown.

use super::completion::{self, bool_field, field, int_field, type_name, Completion, MAX_LOGPROBS};
use super::error::ApiError;
use serde_json::{json, Map, Value};

/// A chat request: its sampling as a completion (without a prompt until the template renders
/// one) and what the template takes.
#[derive(Clone, Debug)]
pub struct Chat {
    pub completion: Completion,
    /// `[{role, content}]` with each content as one string.
    pub messages: Value,
    pub add_generation_prompt: bool,
    pub template_kwargs: Map<String, Value>,
    /// The tools the model may call (none given: `None`).
    pub tools: Option<super::tools::Tools>,
}

/// The fields only the chat API takes (with the shared ones of `completion::COMMON`).
const CHAT: &[&str] = &[
    "messages",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    "add_generation_prompt",
    "chat_template_kwargs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "modalities",
    "audio",
    "functions",
    "function_call",
];

const ROLES: &[&str] = &["system", "user", "assistant", "tool"];

/// The reserved inputs of the template, which `chat_template_kwargs` may not set.
const RESERVED: &[&str] = &["messages", "add_generation_prompt", "tools", "documents", "bos_token", "eos_token"];

fn content(i: usize, v: Option<&Value>) -> Result<String, ApiError> {
    let param = format!("messages[{i}].content");
    match v {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::new();
            for (j, p) in parts.iter().enumerate() {
                let kind = p.get("type").and_then(Value::as_str);
                match (kind, p.get("text")) {
                    (Some("text"), Some(Value::String(t))) => texts.push(t.as_str()),
                    (Some("text"), _) => {
                        return Err(ApiError::bad(
                            &format!("{param}[{j}].text"),
                            format!("'{param}[{j}].text' must be a string"),
                        ))
                    }
                    (Some(other), _) => {
                        return Err(ApiError::bad(
                            &format!("{param}[{j}].type"),
                            format!(
                                "content parts of type '{other}' are not supported; this server takes text parts only"
                            ),
                        ))
                    }
                    (None, _) => {
                        return Err(ApiError::bad(
                            &format!("{param}[{j}]"),
                            format!("'{param}[{j}]' must be an object with a 'type' (\"text\") and its 'text'"),
                        ))
                    }
                }
            }
            // as vLLM joins a message's text parts
            Ok(texts.join("\n"))
        }
        None => Err(ApiError::bad(&param, format!("'{param}' is required (a string or a list of text parts)"))),
        Some(v) => Err(ApiError::bad(
            &param,
            format!("'{param}' must be a string or a list of text parts, got {}", type_name(v)),
        )),
    }
}

fn messages(v: Option<&Value>) -> Result<Value, ApiError> {
    let list = match v {
        None => return Err(ApiError::bad("messages", "'messages' is required")),
        Some(Value::Array(a)) if a.is_empty() => {
            return Err(ApiError::bad("messages", "'messages' is empty; send at least one message"))
        }
        Some(Value::Array(a)) => a,
        Some(v) => {
            return Err(ApiError::bad(
                "messages",
                format!("'messages' must be a list of messages, got {}", type_name(v)),
            ))
        }
    };
    let mut out = Vec::new();
    // the call ids assistant messages issued so far (a tool message answers one of them)
    let mut issued: Vec<String> = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let Value::Object(m) = m else {
            return Err(ApiError::bad(&format!("messages[{i}]"), format!("'messages[{i}]' must be an object")));
        };
        let role =
            match m.get("role") {
                Some(Value::String(r)) if ROLES.contains(&r.as_str()) => r.clone(),
                Some(Value::String(r)) if r == "function" => return Err(ApiError::bad(
                    &format!("messages[{i}].role"),
                    "'function' messages are the old API's; answer a call with a 'tool' message and its tool_call_id"
                        .to_string(),
                )),
                Some(Value::String(r)) => {
                    return Err(ApiError::bad(
                        &format!("messages[{i}].role"),
                        format!("unknown role '{r}' in messages[{i}]; use system, user, assistant or tool"),
                    ))
                }
                _ => {
                    return Err(ApiError::bad(
                        &format!("messages[{i}].role"),
                        format!("'messages[{i}].role' is required: system, user, assistant or tool"),
                    ))
                }
            };
        // an assistant turn that only calls tools may have no content
        let calls = m.get("tool_calls").filter(|v| !v.is_null());
        let text = match m.get("content") {
            None | Some(Value::Null) if role == "assistant" && calls.is_some() => Value::Null,
            c => Value::String(content(i, c)?),
        };
        let mut msg = json!({"role": role, "content": text});
        if let Some(c) = calls {
            if role != "assistant" {
                return Err(ApiError::bad(
                    &format!("messages[{i}].tool_calls"),
                    format!("'messages[{i}].tool_calls' belongs to assistant messages"),
                ));
            }
            let (calls, ids) = super::tools::assistant_calls(i, c)?;
            msg["tool_calls"] = calls;
            issued.extend(ids);
        }
        if role == "tool" {
            match m.get("tool_call_id") {
                Some(Value::String(id)) if issued.contains(id) => msg["tool_call_id"] = json!(id),
                Some(Value::String(id)) => {
                    return Err(ApiError::bad(
                        &format!("messages[{i}].tool_call_id"),
                        format!("'messages[{i}].tool_call_id' is '{id}', which no assistant message before it issued"),
                    ))
                }
                _ => {
                    return Err(ApiError::bad(
                        &format!("messages[{i}].tool_call_id"),
                        format!("'messages[{i}].tool_call_id' is required: the id of the call this message answers"),
                    ))
                }
            }
        }
        for (k, v) in m {
            match k.as_str() {
                "role" | "content" | "tool_calls" | "tool_call_id" => {}
                "name" if v.is_string() => msg["name"] = v.clone(),
                "name" => {
                    return Err(ApiError::bad(
                        &format!("messages[{i}].name"),
                        format!("'messages[{i}].name' must be a string"),
                    ))
                }
                "function_call" | "audio" | "refusal" if !v.is_null() => {
                    return Err(ApiError::bad(
                        &format!("messages[{i}].{k}"),
                        format!(
                            "'messages[{i}].{k}' is not supported (this server has no audio; calls are tool_calls)"
                        ),
                    ))
                }
                "function_call" | "audio" | "refusal" => {}
                _ => {
                    return Err(ApiError::bad(
                        &format!("messages[{i}].{k}"),
                        format!("unsupported field '{k}' in messages[{i}]; a message takes role, content and name"),
                    ))
                }
            }
        }
        out.push(msg);
    }
    Ok(Value::Array(out))
}

/// Parses and checks a chat request body (the template and the model's limits come later),
/// with OpenAI's defaults.
pub fn parse(body: &[u8]) -> Result<Chat, ApiError> {
    parse_with(body, &completion::Defaults::default())
}

/// [`parse`], a field left out taking its value from `d`.
pub fn parse_with(body: &[u8], d: &completion::Defaults) -> Result<Chat, ApiError> {
    let o = completion::object(body, CHAT)?;
    let messages = messages(field(&o, "messages"))?;
    // what this server does not do: only the no-op values pass
    let refuse = |k: &str, why: &str| Err(ApiError::bad(k, format!("'{k}' is not supported: {why}")));
    let tools = super::tools::parse(field(&o, "tools"), field(&o, "tool_choice"), field(&o, "parallel_tool_calls"))?;
    match field(&o, "modalities") {
        None => {}
        Some(Value::Array(a)) if a.iter().all(|m| m == "text") => {}
        Some(_) => return refuse("modalities", "this server writes text only; leave it out or use [\"text\"]"),
    }
    for k in ["audio", "functions", "function_call"] {
        if field(&o, k).is_some() {
            return refuse(k, "leave it out");
        }
    }
    let mut c = completion::common(&o, d)?;
    match int_field(&o, "max_completion_tokens")? {
        None => {}
        Some(m) if m < 1 => {
            return Err(ApiError::bad(
                "max_completion_tokens",
                format!("'max_completion_tokens' must be at least 1, got {m}"),
            ))
        }
        Some(m) => {
            let m = usize::try_from(m).unwrap_or(usize::MAX);
            if c.max_tokens.is_some_and(|t| t != m) {
                return Err(ApiError::bad(
                    "max_completion_tokens",
                    "'max_tokens' and 'max_completion_tokens' differ; give one of them",
                ));
            }
            c.max_tokens = Some(m);
        }
    }
    let logprobs = bool_field(&o, "logprobs")?;
    c.logprobs = match int_field(&o, "top_logprobs")? {
        None => logprobs.then_some(0),
        Some(_) if !logprobs => {
            return Err(ApiError::bad("top_logprobs", "'top_logprobs' needs 'logprobs' set to true"));
        }
        Some(k) if (0..=MAX_LOGPROBS as i64).contains(&k) => Some(k as usize),
        Some(k) => {
            return Err(ApiError::bad(
                "top_logprobs",
                format!("'top_logprobs' must be from 0 to {MAX_LOGPROBS}, got {k}"),
            ))
        }
    };
    let add_generation_prompt = match field(&o, "add_generation_prompt") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::bad("add_generation_prompt", "'add_generation_prompt' must be true or false")),
    };
    let template_kwargs = match field(&o, "chat_template_kwargs") {
        None => Map::new(),
        Some(Value::Object(m)) => {
            if let Some(k) = m.keys().find(|k| RESERVED.contains(&k.as_str())) {
                return Err(ApiError::bad(
                    "chat_template_kwargs",
                    format!("'chat_template_kwargs' may not set '{k}', which the server sets"),
                ));
            }
            m.clone()
        }
        Some(v) => {
            return Err(ApiError::bad(
                "chat_template_kwargs",
                format!("'chat_template_kwargs' must be an object, got {}", type_name(v)),
            ))
        }
    };
    if tools.as_ref().is_some_and(|t| t.choice != super::tools::Choice::None) && c.constraint.is_some() {
        return Err(ApiError::bad(
            "tool_choice",
            "a structured output and tool calls in one request: give 'tool_choice': \"none\" or leave the structured output out",
        ));
    }
    Ok(Chat { completion: c, messages, add_generation_prompt, template_kwargs, tools })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversation_with_text_parts() {
        let c = parse(br#"{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "name": "ann"}], "max_completion_tokens": 7, "logprobs": true, "top_logprobs": 3}"#).unwrap();
        assert_eq!(c.messages[1]["content"], "a\nb");
        assert_eq!(c.messages[1]["name"], "ann");
        assert_eq!((c.completion.max_tokens, c.completion.logprobs, c.add_generation_prompt), (Some(7), Some(3), true));
        let c = parse(br#"{"messages": [{"role": "user", "content": "x"}], "logprobs": true, "tool_choice": "none", "response_format": {"type": "text"}, "tools": []}"#).unwrap();
        assert_eq!(c.completion.logprobs, Some(0));
        let c = parse(br#"{"messages": [{"role": "user", "content": "x"}], "logprobs": false}"#).unwrap();
        assert_eq!(c.completion.logprobs, None);
    }

    #[test]
    fn mistakes_name_their_field() {
        let m = r#""messages": [{"role": "user", "content": "x"}]"#;
        for (body, param) in [
            (r#"{}"#.to_string(), "messages"),
            (r#"{"messages": []}"#.into(), "messages"),
            (r#"{"messages": "hi"}"#.into(), "messages"),
            (r#"{"messages": [{"role": "wizard", "content": "x"}]}"#.into(), "messages[0].role"),
            (r#"{"messages": [{"content": "x"}]}"#.into(), "messages[0].role"),
            (
                r#"{"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}]}"#.into(),
                "messages[1].tool_call_id",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "y", "tool_call_id": "c9"}]}"#.into(),
                "messages[1].tool_call_id",
            ),
            (r#"{"messages": [{"role": "user"}]}"#.into(), "messages[0].content"),
            (r#"{"messages": [{"role": "user", "content": 5}]}"#.into(), "messages[0].content"),
            (
                r#"{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}"#
                    .into(),
                "messages[0].content[0].type",
            ),
            (
                r#"{"messages": [{"role": "user", "content": [{"type": "text"}]}]}"#.into(),
                "messages[0].content[0].text",
            ),
            (
                r#"{"messages": [{"role": "assistant", "content": "x", "tool_calls": [{"id": "1"}]}]}"#.into(),
                "messages[0].tool_calls[0].function",
            ),
            (r#"{"messages": [{"role": "user", "content": "x", "mood": "sad"}]}"#.into(), "messages[0].mood"),
            (format!(r#"{{{m}, "tools": [{{"type": "function"}}]}}"#), "tools[0].function"),
            (format!(r#"{{{m}, "tool_choice": "required"}}"#), "tool_choice"),
            (format!(r#"{{{m}, "response_format": {{"type": "xml"}}}}"#), "response_format"),
            (format!(r#"{{{m}, "audio": {{"voice": "x"}}}}"#), "audio"),
            (format!(r#"{{{m}, "modalities": ["text", "audio"]}}"#), "modalities"),
            (format!(r#"{{{m}, "top_logprobs": 2}}"#), "top_logprobs"),
            (format!(r#"{{{m}, "logprobs": true, "top_logprobs": 21}}"#), "top_logprobs"),
            (format!(r#"{{{m}, "logprobs": 3}}"#), "logprobs"),
            (format!(r#"{{{m}, "max_completion_tokens": 0}}"#), "max_completion_tokens"),
            (format!(r#"{{{m}, "max_tokens": 5, "max_completion_tokens": 6}}"#), "max_completion_tokens"),
            (format!(r#"{{{m}, "chat_template_kwargs": {{"messages": []}}}}"#), "chat_template_kwargs"),
            (format!(r#"{{{m}, "prompt": "x"}}"#), "prompt"),
            (format!(r#"{{{m}, "temperature": 5}}"#), "temperature"),
        ] {
            let e = parse(body.as_bytes()).expect_err(&body);
            assert_eq!((e.status, e.param.as_deref()), (400, Some(param)), "{body}: {}", e.message);
        }
    }

    /// What is taken (a tool call answered, an assistant turn of calls only, null legacy fields,
    /// text modalities, one token, a structured output without tools or with tools turned off),
    /// and each refusal's own message — not just its field.
    #[test]
    fn accepted_forms_and_each_refusals_message() {
        let call = r#"{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}"#;
        let c = parse(format!(r#"{{"messages": [{{"role": "user", "content": "x"}}, {{"role": "assistant", "tool_calls": [{call}], "refusal": null, "audio": null, "function_call": null}}, {{"role": "tool", "tool_call_id": "call_1", "content": "7"}}], "modalities": ["text"], "max_completion_tokens": 1}}"#).as_bytes()).unwrap();
        assert_eq!(c.messages[1]["content"], Value::Null);
        assert_eq!(c.messages[1]["tool_calls"][0]["id"], "call_1");
        assert_eq!(c.messages[2]["tool_call_id"], "call_1");
        assert_eq!(c.completion.max_tokens, Some(1));
        let m = r#""messages": [{"role": "user", "content": "x"}]"#;
        let json = r#""response_format": {"type": "json_object"}"#;
        let tool = r#""tools": [{"type": "function", "function": {"name": "f"}}]"#;
        assert!(parse(format!(r#"{{{m}, {json}}}"#).as_bytes()).unwrap().completion.constraint.is_some());
        parse(format!(r#"{{{m}, {json}, {tool}, "tool_choice": "none"}}"#).as_bytes()).unwrap();
        for (body, message) in [
            (format!(r#"{{{m}, {json}, {tool}}}"#), "a structured output and tool calls"),
            (r#"{"messages": [{"role": "function", "content": "x"}]}"#.into(), "'function' messages are the old API's"),
            (r#"{"messages": [{"role": "wizard", "content": "x"}]}"#.into(), "unknown role 'wizard'"),
            (r#"{"messages": [{"role": 3, "content": "x"}]}"#.into(), "'messages[0].role' is required"),
            (r#"{"messages": [{"role": "assistant"}]}"#.into(), "'messages[0].content' is required"),
            (
                r#"{"messages": [{"role": "user", "content": "x", "name": 5}]}"#.into(),
                "'messages[0].name' must be a string",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x", "refusal": "no"}]}"#.into(),
                "'messages[0].refusal' is not supported",
            ),
            (
                format!(
                    r#"{{"messages": [{{"role": "assistant", "tool_calls": [{call}]}}, {{"role": "tool", "tool_call_id": "call_2", "content": "7"}}]}}"#
                ),
                "'messages[1].tool_call_id' is 'call_2', which no assistant message before it issued",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x", "tool_calls": []}]}"#.into(),
                "'messages[0].tool_calls' belongs to assistant messages",
            ),
        ] {
            let e = parse(body.as_bytes()).expect_err(&body);
            assert!(e.message.contains(message), "{body}: {}", e.message);
        }
    }
}
