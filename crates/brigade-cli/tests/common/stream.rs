//! A streamed response reassembled into the whole response it stands for, and compared with
//! the whole response to the same request in every field.
//!
//! OpenAI's streams carry a response in pieces: a completion's text, a chat message's role,
//! content and tool calls (each call's id, type and name once, its arguments in pieces), the
//! log-probabilities of the tokens each chunk adds, the finish reason on a choice's last chunk,
//! the usage in a final chunk of no choices (`stream_options.include_usage`). [`reassemble`]
//! puts them back together, checking on the way what a stream promises (one id, creation time
//! and model in every chunk, `object` named as a chunk, a finish reason only on a choice's last
//! chunk); [`assert_stream_is_whole`] then compares every field with the whole response, but
//! the request's own `id`, `created` and tool calls' ids (named after the request).

use serde_json::{json, Map, Value};

/// The whole response `events` (a stream's data lines, `[DONE]` excluded) adds up to.
pub fn reassemble(events: &[Value]) -> Value {
    assert!(!events.is_empty(), "an empty stream");
    let head = &events[0];
    let chat = head["object"] == "chat.completion.chunk";
    if !chat {
        assert_eq!(head["object"], "text_completion", "a stream's chunks are text_completion or chat.completion.chunk");
    }
    let mut choices: Vec<Map<String, Value>> = Vec::new();
    let mut finished: Vec<bool> = Vec::new();
    let mut usage = None;
    let mut prompt_ids = None;
    for (k, e) in events.iter().enumerate() {
        for key in ["id", "object", "created", "model"] {
            assert_eq!(e[key], head[key], "chunk {k}: '{key}' differs from the first chunk's");
        }
        let list = e["choices"].as_array().unwrap_or_else(|| panic!("chunk {k} has no choices list: {e}"));
        if list.is_empty() {
            assert!(usage.is_none() && k == events.len() - 1, "chunk {k}: a usage chunk that is not the last");
            usage = Some(e["usage"].clone());
            continue;
        }
        if let Some(u) = e.get("usage") {
            assert!(u.is_null(), "chunk {k}: usage on a chunk with choices: {u}");
        }
        for c in list {
            let i = c["index"].as_u64().unwrap_or_else(|| panic!("chunk {k}: a choice without an index")) as usize;
            if choices.len() <= i {
                choices.resize_with(i + 1, Map::new);
                finished.resize(i + 1, false);
            }
            assert!(!finished[i], "chunk {k}: choice {i} goes on after its finish reason");
            let into = &mut choices[i];
            for (key, v) in c.as_object().unwrap() {
                match key.as_str() {
                    "index" => {
                        into.insert(key.clone(), v.clone());
                    }
                    "text" => append_str(into, "text", v),
                    "finish_reason" => {
                        if !v.is_null() {
                            finished[i] = true;
                            into.insert(key.clone(), v.clone());
                        }
                    }
                    "token_ids" => append_list(into, "token_ids", v),
                    "prompt_token_ids" if chat => {
                        // a chat stream's first chunk carries the rendered prompt's ids, which a
                        // whole chat response keeps at its top level
                        assert!(prompt_ids.is_none(), "chunk {k}: the prompt's ids twice");
                        prompt_ids = Some(v.clone());
                    }
                    "prompt_token_ids" => {
                        assert!(!into.contains_key(key), "chunk {k}: choice {i}'s prompt ids twice");
                        into.insert(key.clone(), v.clone());
                    }
                    "logprobs" => add_logprobs(into, v, chat),
                    "delta" => add_delta(into, v, k),
                    other => panic!("chunk {k}: choice {i} has a field '{other}' a stream does not carry"),
                }
            }
        }
    }
    let mut out = Vec::new();
    for (i, mut c) in choices.into_iter().enumerate() {
        assert!(finished[i], "choice {i} never finished");
        if chat {
            let mut m = c.remove("message").unwrap_or_else(|| panic!("choice {i}: no delta ever came"));
            if let Some(calls) = m.get_mut("tool_calls") {
                // a call's index is the stream's bookkeeping; a whole message lists the calls
                for call in calls.as_array_mut().unwrap() {
                    call.as_object_mut().unwrap().remove("index");
                }
                if m["content"] == "" {
                    m["content"] = Value::Null;
                }
            }
            c.insert("message".into(), m);
        }
        c.entry("logprobs").or_insert(Value::Null);
        out.push(Value::Object(c));
    }
    let object = if chat { "chat.completion" } else { "text_completion" };
    let mut whole = json!({"id": head["id"], "object": object, "created": head["created"], "model": head["model"],
        "choices": out});
    if let Some(u) = usage {
        whole["usage"] = u;
    }
    if let Some(p) = prompt_ids {
        whole["prompt_token_ids"] = p;
    }
    whole
}

/// Asserts that the stream `events` adds up to `whole` (the same request answered whole) in
/// every field but `id` and `created`; the usage is compared when the stream carried it, and
/// `usage_asked` says whether it must have.
pub fn assert_stream_is_whole(whole: &Value, events: &[Value], usage_asked: bool, what: &str) {
    let mut got = reassemble(events);
    assert_eq!(got.get("usage").is_some(), usage_asked, "{what}: usage in the stream");
    let mut want = whole.clone();
    for v in [&mut got, &mut want] {
        let o = v.as_object_mut().unwrap();
        o.remove("id");
        o.remove("created");
        if !usage_asked {
            o.remove("usage");
        }
        // a tool call's id is named after its request, as the response's is: each present,
        // distinct, and compared by place only
        for c in o["choices"].as_array_mut().unwrap() {
            let Some(calls) = c["message"].get_mut("tool_calls").and_then(Value::as_array_mut) else { continue };
            let ids: std::collections::HashSet<String> =
                calls.iter().map(|call| call["id"].as_str().expect("a tool call's id").to_string()).collect();
            assert_eq!(ids.len(), calls.len(), "{what}: tool call ids repeat");
            calls.iter_mut().for_each(|call| call["id"] = json!("call_…"));
        }
    }
    if got != want {
        let (g, w) = (got.as_object().unwrap(), want.as_object().unwrap());
        for key in g.keys().chain(w.keys()) {
            if g.get(key) != w.get(key) {
                panic!(
                    "{what}: field '{key}' of the reassembled stream differs from the whole response's:\n stream {}\n  whole {}",
                    g.get(key).map_or("(absent)".into(), Value::to_string),
                    w.get(key).map_or("(absent)".into(), Value::to_string)
                );
            }
        }
    }
}

fn append_str(into: &mut Map<String, Value>, key: &str, v: &Value) {
    let s = v.as_str().unwrap_or_else(|| panic!("'{key}' is not a string: {v}"));
    let e = into.entry(key).or_insert(json!(""));
    *e = json!(format!("{}{s}", e.as_str().unwrap()));
}

fn append_list(into: &mut Map<String, Value>, key: &str, v: &Value) {
    let items = v.as_array().unwrap_or_else(|| panic!("'{key}' is not a list: {v}"));
    let e = into.entry(key).or_insert(json!([]));
    e.as_array_mut().unwrap().extend(items.iter().cloned());
}

/// A chunk's log-probabilities appended to the choice's: the legacy form's four lists, or a
/// chat choice's `content` list. A chunk without them (null) adds nothing.
fn add_logprobs(into: &mut Map<String, Value>, v: &Value, chat: bool) {
    if v.is_null() {
        return;
    }
    let lp = into.entry("logprobs").or_insert(Value::Null);
    if lp.is_null() {
        *lp = if chat {
            json!({"content": []})
        } else {
            json!({"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []})
        };
    }
    let lp = lp.as_object_mut().unwrap();
    for (key, items) in v.as_object().unwrap_or_else(|| panic!("logprobs is not an object: {v}")) {
        append_list(lp, key, items);
    }
}

/// A chat delta added to the message: the role once, content appended, a tool call opened by
/// its index (id, type, name) and its arguments appended.
fn add_delta(into: &mut Map<String, Value>, d: &Value, k: usize) {
    let m = into.entry("message").or_insert(json!({})).as_object_mut().unwrap();
    for (key, v) in d.as_object().unwrap_or_else(|| panic!("chunk {k}: delta is not an object")) {
        match key.as_str() {
            "role" => {
                assert!(!m.contains_key("role"), "chunk {k}: the role twice");
                m.insert("role".into(), v.clone());
            }
            "content" => append_str(m, "content", v),
            "tool_calls" => {
                let calls = m.entry("tool_calls").or_insert(json!([])).as_array_mut().unwrap();
                for piece in v.as_array().unwrap() {
                    let at = piece["index"].as_u64().unwrap() as usize;
                    if at == calls.len() {
                        assert!(piece["id"].is_string(), "chunk {k}: call {at} opened without an id");
                        calls.push(json!({"index": at, "id": piece["id"], "type": piece["type"],
                            "function": {"name": piece["function"]["name"], "arguments": ""}}));
                    } else {
                        assert!(at + 1 == calls.len(), "chunk {k}: call {at} out of order");
                        assert!(piece.get("id").is_none(), "chunk {k}: call {at}'s id twice");
                    }
                    let args = piece["function"]["arguments"].as_str().unwrap_or("");
                    let f = calls[at]["function"].as_object_mut().unwrap();
                    append_str(f, "arguments", &json!(args));
                }
            }
            other => panic!("chunk {k}: a delta field '{other}'"),
        }
    }
}
