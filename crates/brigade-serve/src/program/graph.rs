//! A program: a graph of generation calls, as JSON or TOML (the same keys). A node is a prompt
//! template and `/v1/completions` settings, and fans out by `fork: N` (N branches of the same
//! prompt), `map` (a branch per item of an earlier node's output), or `choices` (a select
//! among given continuations). A node depends on the nodes its template names and the node
//! it maps over. Everything here is checked before anything runs: the limits, the ids, every
//! reference, cycles.

use super::template::{is_id, Template};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// How a map node cuts its input into items.
#[derive(Clone, Debug)]
pub enum Split {
    /// The non-empty lines, without their line ends.
    Lines,
    /// The elements of the JSON array the node produced (strings as they are, others as JSON).
    Json,
    /// The non-empty pieces between the matches of a regex.
    Regex(regex::Regex),
    /// The tool calls the node made (every branch's, in order), each as
    /// `{"name": N, "arguments": {…}}`: a node with `tools` only.
    ToolCalls,
}

/// How a node fans out.
#[derive(Clone, Debug)]
pub enum Fanout {
    /// One branch.
    One,
    /// N branches continuing the same prompt (as `/v1/completions` with `n: N`).
    Fork(usize),
    /// A branch per item of node `over`'s output.
    Map { over: String, split: Split },
    /// A branch per item of a list the program gives (`"map": {"items": [...]}`): a plan whose
    /// points are known, or a benchmark's fixed width.
    Items(Vec<String>),
    /// One of the given continuations, by the model's log-probability.
    Select(Vec<String>),
}

#[derive(Clone, Debug)]
pub struct Node {
    pub id: String,
    pub prompt: Template,
    pub fanout: Fanout,
    /// Every other key: the node's `/v1/completions` settings.
    pub settings: Map<String, Value>,
    /// The nodes it depends on, in index order.
    pub deps: Vec<usize>,
    /// Seconds from the program's start by which the node must be done, or it fails.
    pub deadline_s: Option<f64>,
    /// Rendered as a conversation by the model's chat template (`"chat": true`, or given a
    /// `system` or `tools`): the prompt is the user's turn and the settings are
    /// `/v1/chat/completions`' (`tools`, `tool_choice`, `parallel_tool_calls` among them).
    pub chat: bool,
    /// The system message of a chat node.
    pub system: Option<String>,
}

impl Node {
    /// Whether the node offers the model tools (its output may hold calls).
    pub fn has_tools(&self) -> bool {
        self.settings.get("tools").is_some_and(|t| !t.is_null())
    }
}

/// `max_parallel`: chosen by the engine, or a bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Width {
    Auto,
    Max(usize),
}

#[derive(Clone, Debug)]
pub struct Program {
    pub model: Option<String>,
    pub max_parallel: Width,
    /// Server-sent events: each node's result as it ends, then the whole.
    pub stream: bool,
    /// In a topological order (every node after the nodes it depends on).
    pub nodes: Vec<Node>,
}

/// What a program may hold (checked before it runs).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_nodes: usize,
    /// Branches of one node: a fork's N, a select's choices, a map's items (the last checked
    /// when its input is known).
    pub max_branches: usize,
    pub max_template_bytes: usize,
    /// Generated tokens of the whole program, counting a map node's branches at
    /// `max_branches` each.
    pub max_total_tokens: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { max_nodes: 64, max_branches: 64, max_template_bytes: 64 * 1024, max_total_tokens: 1 << 20 }
    }
}

/// Keys of a node that are the program's, not completions settings.
const NODE_KEYS: &[&str] = &["id", "prompt", "fork", "map", "choices", "deadline_s", "chat", "system"];
/// Completions (or chat) settings a node may not set: the program sets them.
const REFUSED: &[&str] = &["prompt", "messages", "n", "stream", "model", "echo"];
/// Settings that make a node a chat node.
const CHAT_SETTINGS: &[&str] = &["tools", "tool_choice", "parallel_tool_calls"];

/// Why a program is refused before anything runs: the node (or key) and the problem, in words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ProgramError(pub String);

impl Program {
    /// Parses the JSON form.
    pub fn from_json(text: &str, limits: &Limits) -> Result<Program, ProgramError> {
        let v: Value =
            serde_json::from_str(text).map_err(|e| ProgramError(format!("the program is not valid JSON: {e}")))?;
        Program::from_value(&v, limits)
    }

    /// Parses the TOML form (the same keys; nodes as `[[nodes]]`).
    pub fn from_toml(text: &str, limits: &Limits) -> Result<Program, ProgramError> {
        let v: toml::Value =
            toml::from_str(text).map_err(|e| ProgramError(format!("the program is not valid TOML: {e}")))?;
        let v = serde_json::to_value(v).map_err(|e| ProgramError(format!("the program: {e}")))?;
        Program::from_value(&v, limits)
    }

    /// Reads and checks the parsed form (the limits, the ids, every reference, cycles).
    pub fn from_value(v: &Value, limits: &Limits) -> Result<Program, ProgramError> {
        Program::parse(v, limits).map_err(ProgramError)
    }

    fn parse(v: &Value, limits: &Limits) -> Result<Program, String> {
        let top = v.as_object().ok_or("a program is an object with \"nodes\"")?;
        for k in top.keys() {
            if !["model", "max_parallel", "stream", "nodes"].contains(&k.as_str()) {
                return Err(format!("unknown program key '{k}'; a program has model, max_parallel, stream and nodes"));
            }
        }
        let model = match top.get("model") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err("\"model\" must be a string".into()),
        };
        let max_parallel = match top.get("max_parallel") {
            None | Some(Value::Null) => Width::Auto,
            Some(Value::String(s)) if s == "auto" => Width::Auto,
            Some(x) => match x.as_u64() {
                Some(n) if n >= 1 => Width::Max(n as usize),
                _ => return Err(format!("\"max_parallel\" must be \"auto\" or a whole number of 1 or more, got {x}")),
            },
        };
        let stream = match top.get("stream") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(x) => return Err(format!("\"stream\" must be true or false, got {x}")),
        };
        let list = top.get("nodes").and_then(Value::as_array).ok_or("a program needs \"nodes\": a list of nodes")?;
        if list.is_empty() {
            return Err("\"nodes\" is empty; give at least one node".into());
        }
        if list.len() > limits.max_nodes {
            return Err(format!("the program has {} nodes; at most {} are allowed", list.len(), limits.max_nodes));
        }
        let mut nodes = Vec::with_capacity(list.len());
        for (i, n) in list.iter().enumerate() {
            nodes.push(node(i, n, limits)?);
        }
        let index: BTreeMap<&str, usize> = nodes.iter().enumerate().map(|(i, n)| (n.id.as_str(), i)).collect();
        if index.len() < nodes.len() {
            let mut seen = std::collections::BTreeSet::new();
            let dup = nodes.iter().find(|n| !seen.insert(n.id.as_str())).map(|n| n.id.clone()).unwrap_or_default();
            return Err(format!("two nodes are called '{dup}'; ids must be unique"));
        }
        // dependencies: the template's names and the map's input
        let mut deps: Vec<Vec<usize>> = Vec::with_capacity(nodes.len());
        for n in &nodes {
            let mut d = Vec::new();
            let over = match &n.fanout {
                Fanout::Map { over, .. } => Some(over.as_str()),
                _ => None,
            };
            for name in n.prompt.names().into_iter().chain(over) {
                let &j = index
                    .get(name)
                    .ok_or_else(|| format!("node '{}' names '{name}', which is no node of the program", n.id))?;
                if j == index[n.id.as_str()] {
                    return Err(format!("node '{}' names itself", n.id));
                }
                d.push(j);
            }
            if let Fanout::Map { over, split: Split::ToolCalls } = &n.fanout {
                if !nodes[index[over.as_str()]].has_tools() {
                    return Err(format!(
                        "node '{}' maps over the tool calls of '{over}', which offers no tools; give '{over}' \"tools\"",
                        n.id
                    ));
                }
            }
            d.sort_unstable();
            d.dedup();
            deps.push(d);
        }
        let order = topological(&nodes, &deps)?;
        // renumber in that order
        let mut at = vec![0; nodes.len()];
        for (k, &i) in order.iter().enumerate() {
            at[i] = k;
        }
        let mut slots: Vec<Option<Node>> = nodes.into_iter().map(Some).collect();
        let mut sorted = Vec::with_capacity(slots.len());
        for &i in &order {
            let mut n = slots[i].take().expect("each node once");
            n.deps = deps[i].iter().map(|&j| at[j]).collect();
            n.deps.sort_unstable();
            sorted.push(n);
        }
        let p = Program { model, max_parallel, stream, nodes: sorted };
        let total = p.token_bound(limits);
        if total > limits.max_total_tokens {
            return Err(format!(
                "the program may generate {total} tokens (max_tokens × branches, a map's at {} branches); at most {} are allowed",
                limits.max_branches, limits.max_total_tokens
            ));
        }
        Ok(p)
    }

    /// The most tokens the program can generate: each node's `max_tokens` (16 unset, as the
    /// completions API) times its branches, a map's counted at the branch limit.
    pub fn token_bound(&self, limits: &Limits) -> usize {
        self.nodes.iter().map(|n| max_tokens(n).saturating_mul(branch_bound(n, limits))).fold(0, usize::saturating_add)
    }

    /// Each node's longest remaining path, in `max_tokens` (itself included): what a scheduler
    /// gives priority by.
    pub fn remaining_path(&self) -> Vec<usize> {
        let mut longest = vec![0usize; self.nodes.len()];
        for i in (0..self.nodes.len()).rev() {
            let after = (i + 1..self.nodes.len())
                .filter(|&j| self.nodes[j].deps.contains(&i))
                .map(|j| longest[j])
                .max()
                .unwrap_or(0);
            longest[i] = max_tokens(&self.nodes[i]) + after;
        }
        longest
    }

    /// The ids of the longest path through the program (by `max_tokens`), first to last.
    pub fn critical_path(&self) -> Vec<String> {
        let longest = self.remaining_path();
        let Some(mut i) = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].deps.is_empty())
            .max_by_key(|&i| (longest[i], usize::MAX - i))
        else {
            return Vec::new();
        };
        let mut path = vec![self.nodes[i].id.clone()];
        while let Some(j) = (i + 1..self.nodes.len())
            .filter(|&j| self.nodes[j].deps.contains(&i))
            .max_by_key(|&j| (longest[j], usize::MAX - j))
        {
            path.push(self.nodes[j].id.clone());
            i = j;
        }
        path
    }
}

fn max_tokens(n: &Node) -> usize {
    match &n.fanout {
        // a select scores its choices: it generates none
        Fanout::Select(_) => 0,
        _ => n.settings.get("max_tokens").and_then(Value::as_u64).unwrap_or(16) as usize,
    }
}

fn branch_bound(n: &Node, limits: &Limits) -> usize {
    match &n.fanout {
        Fanout::One | Fanout::Select(_) => 1,
        Fanout::Fork(k) => *k,
        Fanout::Map { .. } => limits.max_branches,
        Fanout::Items(items) => items.len(),
    }
}

fn node(i: usize, v: &Value, limits: &Limits) -> Result<Node, String> {
    let o = v.as_object().ok_or_else(|| format!("node {i} is not an object"))?;
    let id = match o.get("id") {
        Some(Value::String(s)) if is_id(s) => s.clone(),
        Some(Value::String(s)) => {
            return Err(format!("node {i}: id '{s}' must be letters, digits, '_' or '-' (and not 'item')"))
        }
        _ => return Err(format!("node {i} needs an \"id\" (a string)")),
    };
    let text =
        o.get("prompt").and_then(Value::as_str).ok_or_else(|| format!("node '{id}' needs a \"prompt\" (a string)"))?;
    if text.len() > limits.max_template_bytes {
        return Err(format!(
            "node '{id}': its prompt template is {} bytes; at most {} are allowed",
            text.len(),
            limits.max_template_bytes
        ));
    }
    let prompt = Template::parse(text).map_err(|e| format!("node '{id}': {e}"))?;
    let given: Vec<&str> = ["fork", "map", "choices"].into_iter().filter(|k| o.contains_key(*k)).collect();
    if given.len() > 1 {
        return Err(format!("node '{id}' gives {}; a node fans out one way", given.join(" and ")));
    }
    let fanout = match given.first().copied() {
        None => Fanout::One,
        Some("fork") => match o["fork"].as_u64() {
            Some(k) if k >= 1 && k as usize <= limits.max_branches => Fanout::Fork(k as usize),
            _ => {
                return Err(format!(
                    "node '{id}': \"fork\" must be a whole number from 1 to {}, got {}",
                    limits.max_branches, o["fork"]
                ))
            }
        },
        Some("map") => map(&id, &o["map"], limits)?,
        _ => {
            let c = branch_list(&o["choices"], limits).map_err(|n| match n {
                None => format!("node '{id}': \"choices\" must be a non-empty list of strings"),
                Some(n) => format!("node '{id}' has {n} choices; at most {} are allowed", limits.max_branches),
            })?;
            Fanout::Select(c)
        }
    };
    if prompt.uses_item() && !matches!(fanout, Fanout::Map { .. } | Fanout::Items(_)) {
        return Err(format!("node '{id}' uses {{{{item}}}} but maps over nothing; give it \"map\""));
    }
    let mut settings = Map::new();
    for (k, x) in o {
        if NODE_KEYS.contains(&k.as_str()) {
            continue;
        }
        if REFUSED.contains(&k.as_str()) {
            return Err(format!("node '{id}': \"{k}\" is set by the program, not by a node"));
        }
        settings.insert(k.clone(), x.clone());
    }
    if let Some(m) = settings.get("max_tokens") {
        if m.as_u64().is_none() {
            return Err(format!("node '{id}': \"max_tokens\" must be a whole number, got {m}"));
        }
    }
    let system = match o.get("system") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(x) => return Err(format!("node '{id}': \"system\" must be a string (the system message), got {x}")),
    };
    let wants_chat = system.is_some() || CHAT_SETTINGS.iter().any(|k| settings.contains_key(*k));
    let chat = match o.get("chat") {
        None | Some(Value::Null) => wants_chat,
        Some(Value::Bool(true)) => true,
        Some(Value::Bool(false)) if wants_chat => {
            return Err(format!(
                "node '{id}' says \"chat\": false but gives a system message or tools, which only a chat node takes"
            ))
        }
        Some(Value::Bool(false)) => false,
        Some(x) => return Err(format!("node '{id}': \"chat\" must be true or false, got {x}")),
    };
    if matches!(fanout, Fanout::Select(_)) && chat {
        return Err(format!(
            "node '{id}': a select scores given continuations of a text prompt; it cannot be a chat node"
        ));
    }
    let deadline_s = match o.get("deadline_s") {
        None | Some(Value::Null) => None,
        Some(x) => match x.as_f64() {
            Some(d) if d > 0.0 && d.is_finite() => Some(d),
            _ => return Err(format!("node '{id}': \"deadline_s\" must be a number of seconds above 0, got {x}")),
        },
    };
    Ok(Node { id, prompt, fanout, settings, deps: Vec::new(), deadline_s, chat, system })
}

fn map(id: &str, v: &Value, limits: &Limits) -> Result<Fanout, String> {
    let o = v.as_object().ok_or_else(|| {
        format!("node '{id}': \"map\" is {{\"over\": ID, \"split\": \"lines\" | \"json\" | {{\"regex\": R}}}} or {{\"items\": [...]}}")
    })?;
    if let Some(items) = o.get("items") {
        let list = branch_list(items, limits);
        if let Err(None) = list {
            return Err(format!("node '{id}': \"map\": {{\"items\": …}} must be a non-empty list of strings"));
        }
        if o.len() > 1 {
            return Err(format!("node '{id}': \"map\" takes either \"items\" or \"over\" (and \"split\")"));
        }
        return list.map(Fanout::Items).map_err(|n| {
            format!("node '{id}' maps over {} items; at most {} are allowed", n.unwrap_or(0), limits.max_branches)
        });
    }
    let over = o
        .get("over")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("node '{id}': \"map\" needs \"over\": the id of the node whose output it splits"))?;
    let split = match o.get("split") {
        None => Split::Lines,
        Some(Value::String(s)) if s == "lines" => Split::Lines,
        Some(Value::String(s)) if s == "json" => Split::Json,
        Some(Value::String(s)) if s == "tool_calls" => Split::ToolCalls,
        Some(Value::Object(r)) if r.len() == 1 && r.contains_key("regex") => {
            let pat = r["regex"].as_str().ok_or_else(|| format!("node '{id}': \"regex\" must be a string"))?;
            let re =
                regex::Regex::new(pat).map_err(|e| format!("node '{id}': the split regex does not compile: {e}"))?;
            Split::Regex(re)
        }
        Some(x) => {
            return Err(format!(
                "node '{id}': \"split\" must be \"lines\", \"json\", \"tool_calls\" or {{\"regex\": R}}, got {x}"
            ))
        }
    };
    for k in o.keys() {
        if k != "over" && k != "split" {
            return Err(format!("node '{id}': unknown \"map\" key '{k}' (over, split)"));
        }
    }
    Ok(Fanout::Map { over: over.to_string(), split })
}

/// A node's given branches (a select's choices, a map's items): a non-empty list of strings,
/// at most `max_branches` long. `Err(None)`: not such a list; `Err(Some(n))`: `n` are too many.
fn branch_list(v: &Value, limits: &Limits) -> Result<Vec<String>, Option<usize>> {
    let list: Vec<String> = match v.as_array() {
        Some(a) if !a.is_empty() => {
            a.iter().map(|x| x.as_str().map(str::to_string)).collect::<Option<_>>().ok_or(None)?
        }
        _ => return Err(None),
    };
    if list.len() > limits.max_branches {
        return Err(Some(list.len()));
    }
    Ok(list)
}

/// Kahn's order, earliest index first among the ready; a cycle is named.
fn topological(nodes: &[Node], deps: &[Vec<usize>]) -> Result<Vec<usize>, String> {
    let n = nodes.len();
    let mut waiting: Vec<usize> = deps.iter().map(Vec::len).collect();
    let mut users = vec![Vec::new(); n];
    for (i, d) in deps.iter().enumerate() {
        for &j in d {
            users[j].push(i);
        }
    }
    let mut ready: std::collections::BTreeSet<usize> = (0..n).filter(|&i| waiting[i] == 0).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &u in &users[i] {
            waiting[u] -= 1;
            if waiting[u] == 0 {
                ready.insert(u);
            }
        }
    }
    if order.len() < n {
        // walk back through unfinished dependencies until a node repeats: that is a cycle
        let mut at = (0..n).find(|&i| waiting[i] > 0).unwrap_or(0);
        let mut path = vec![at];
        loop {
            at = *deps[at].iter().find(|&&j| waiting[j] > 0).unwrap_or(&at);
            if let Some(k) = path.iter().position(|&x| x == at) {
                let mut cyc: Vec<&str> = path[k..].iter().map(|&x| nodes[x].id.as_str()).collect();
                cyc.push(cyc[0]);
                return Err(format!("the program has a cycle: {} (each node names the next)", cyc.join(" → ")));
            }
            path.push(at);
        }
    }
    Ok(order)
}

/// A program built in Rust, node by node, as its JSON form would be written: `build` runs the
/// same checks as parsing it.
#[derive(Clone, Debug, Default)]
pub struct Builder {
    top: Map<String, Value>,
    nodes: Vec<Value>,
}

impl Builder {
    pub fn new() -> Builder {
        Builder::default()
    }

    pub fn model(mut self, name: &str) -> Builder {
        self.top.insert("model".into(), Value::from(name));
        self
    }

    pub fn max_parallel(mut self, n: usize) -> Builder {
        self.top.insert("max_parallel".into(), Value::from(n));
        self
    }

    /// A node: its id, prompt template and `/v1/completions` settings (a JSON object, e.g.
    /// `json!({"max_tokens": 32, "temperature": 0})`; anything else counts as none).
    pub fn node(mut self, id: &str, prompt: &str, settings: Value) -> Builder {
        let mut n = settings.as_object().cloned().unwrap_or_default();
        n.insert("id".into(), Value::from(id));
        n.insert("prompt".into(), Value::from(prompt));
        self.nodes.push(Value::Object(n));
        self
    }

    /// A fork of `n` branches.
    pub fn fork(self, id: &str, n: usize, prompt: &str, settings: Value) -> Builder {
        self.with_last(id, prompt, settings, "fork", Value::from(n))
    }

    /// A map over node `over`'s output, split by `split` (`"lines"`, `"json"` or `{"regex": R}`).
    pub fn map(self, id: &str, over: &str, split: Value, prompt: &str, settings: Value) -> Builder {
        self.with_last(id, prompt, settings, "map", serde_json::json!({"over": over, "split": split}))
    }

    /// A select among `choices`.
    pub fn select(self, id: &str, prompt: &str, choices: &[&str]) -> Builder {
        self.with_last(id, prompt, Value::Null, "choices", Value::from(choices.to_vec()))
    }

    fn with_last(self, id: &str, prompt: &str, settings: Value, key: &str, v: Value) -> Builder {
        let mut b = self.node(id, prompt, settings);
        if let Some(Value::Object(n)) = b.nodes.last_mut() {
            n.insert(key.into(), v);
        }
        b
    }

    /// The JSON form (what `POST /v1/programs` takes).
    pub fn to_json(&self) -> Value {
        let mut top = self.top.clone();
        top.insert("nodes".into(), Value::Array(self.nodes.clone()));
        Value::Object(top)
    }

    /// The program, checked as a parsed one is.
    pub fn build(&self, limits: &Limits) -> Result<Program, ProgramError> {
        Program::from_value(&self.to_json(), limits)
    }
}

/// A map node's items from its input's output.
pub fn split(how: &Split, text: &str) -> Result<Vec<String>, String> {
    Ok(match how {
        Split::Lines => text.lines().filter(|l| !l.trim().is_empty()).map(str::to_string).collect(),
        Split::Json => {
            let v: Value =
                serde_json::from_str(text.trim()).map_err(|e| format!("the output is not a JSON array: {e}"))?;
            let a = v.as_array().ok_or("the output is JSON but not an array")?;
            a.iter()
                .map(|x| match x {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect()
        }
        Split::Regex(re) => re.split(text).filter(|s| !s.is_empty()).map(str::to_string).collect(),
        Split::ToolCalls => return Err("tool calls are split from the calls the node made, not from its text".into()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOT: &str = r#"{"model": "m", "max_parallel": "auto", "nodes": [
        {"id": "answer", "prompt": "{{expand}}\nAnswer:", "max_tokens": 32},
        {"id": "expand", "map": {"over": "outline", "split": "lines"}, "prompt": "{{outline}}\nExpand: {{item}}", "max_tokens": 48},
        {"id": "outline", "prompt": "Question: q\nOutline:", "max_tokens": 32, "temperature": 0},
        {"id": "vote", "fork": 4, "prompt": "{{outline[0]}}", "seed": 7},
        {"id": "pick", "prompt": "{{vote}}", "choices": ["yes", "no"]}]}"#;

    #[test]
    fn a_program_is_ordered_after_its_dependencies_with_its_settings_kept() {
        let p = Program::from_json(SOT, &Limits::default()).unwrap();
        let ids: Vec<&str> = p.nodes.iter().map(|n| n.id.as_str()).collect();
        // every node after those it names, the earliest written first among the ready
        for (k, n) in p.nodes.iter().enumerate() {
            assert!(n.deps.iter().all(|&d| d < k), "{ids:?}");
        }
        assert_eq!(ids, ["outline", "expand", "answer", "vote", "pick"]);
        assert_eq!(p.nodes[0].settings["temperature"], 0);
        assert!(!p.nodes[0].settings.contains_key("id"));
        assert!(matches!(p.nodes[3].fanout, Fanout::Fork(4)));
        assert!(matches!(&p.nodes[4].fanout, Fanout::Select(c) if c == &["yes", "no"]));
        // the longest path in tokens: outline 32 → expand 48 → answer 32
        assert_eq!(p.critical_path(), ["outline", "expand", "answer"]);
        assert_eq!(p.remaining_path()[0], 112);
    }

    #[test]
    fn the_toml_form_reads_as_the_json_form() {
        let t = r#"
model = "m"
max_parallel = 3
[[nodes]]
id = "plan"
prompt = "Plan:"
max_tokens = 8
[[nodes]]
id = "do"
prompt = "{{plan}} {{item}}"
map = { over = "plan", split = { regex = ",\\s*" } }
"#;
        let p = Program::from_toml(t, &Limits::default()).unwrap();
        assert_eq!(p.max_parallel, Width::Max(3));
        assert_eq!(p.nodes[1].deps, [0]);
        let Fanout::Map { split: how, .. } = &p.nodes[1].fanout else { panic!() };
        assert_eq!(split(how, "a, b,c,").unwrap(), ["a", "b", "c"]);
    }

    #[test]
    fn bad_programs_are_refused_naming_the_problem() {
        let l = Limits { max_nodes: 4, max_branches: 8, max_template_bytes: 64, max_total_tokens: 1000 };
        let cases = [
            (
                r#"{"nodes": [{"id": "a", "prompt": "{{b}}"}, {"id": "b", "prompt": "{{c}}"}, {"id": "c", "prompt": "{{a}}"}]}"#,
                "cycle: ",
            ),
            (r#"{"nodes": [{"id": "a", "prompt": "{{nope}}"}]}"#, "names 'nope', which is no node"),
            (r#"{"nodes": [{"id": "a", "prompt": "{{a}}"}]}"#, "names itself"),
            (r#"{"nodes": [{"id": "a", "prompt": "x"}, {"id": "a", "prompt": "y"}]}"#, "two nodes are called 'a'"),
            (r#"{"nodes": [{"id": "a", "prompt": "{{item}}"}]}"#, "maps over nothing"),
            (r#"{"nodes": [{"id": "a", "prompt": "x", "fork": 9}]}"#, "from 1 to 8"),
            (r#"{"nodes": [{"id": "a", "prompt": "x", "fork": 2, "choices": ["y"]}]}"#, "fans out one way"),
            (r#"{"nodes": [{"id": "a", "prompt": "x", "n": 2}]}"#, "\"n\" is set by the program"),
            (r#"{"nodes": [{"id": "a", "prompt": "x", "max_tokens": 600, "fork": 2}]}"#, "may generate 1200 tokens"),
            (
                r#"{"nodes": [{"id": "a", "prompt": "x"}, {"id": "b", "prompt": "{{item}}", "map": {"over": "a", "split": {"regex": "("}}}]}"#,
                "does not compile",
            ),
            (
                r#"{"nodes": [{"id": "a", "prompt": "0123456789012345678901234567890123456789012345678901234567890123456789"}]}"#,
                "at most 64",
            ),
            (r#"{"nodes": []}"#, "empty"),
            (r#"{"nodes": [1, 2, 3, 4, 5]}"#, "5 nodes; at most 4"),
            (r#"{"max_parallel": 0, "nodes": [{"id": "a", "prompt": "x"}]}"#, "max_parallel"),
            (r#"{"nodes": [{"id": "a b", "prompt": "x"}]}"#, "must be letters"),
            (r#"{"nodez": []}"#, "unknown program key 'nodez'"),
        ];
        for (text, want) in cases {
            let e = Program::from_json(text, &l).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
        // the cycle is named in order, back to its start
        let e = Program::from_json(cases[0].0, &l).unwrap_err().to_string();
        assert!(e.contains("a → b → c → a"), "{e}");
    }

    #[test]
    fn the_builder_makes_the_program_the_json_form_makes() {
        let built = Builder::new()
            .model("m")
            .max_parallel(3)
            .node("outline", "Question: q\nOutline:", serde_json::json!({"max_tokens": 32, "temperature": 0}))
            .map(
                "expand",
                "outline",
                Value::from("lines"),
                "{{outline}}\nExpand: {{item}}",
                serde_json::json!({"max_tokens": 48}),
            )
            .fork("vote", 4, "{{outline[0]}}", serde_json::json!({"seed": 7}))
            .select("pick", "{{vote}}", &["yes", "no"]);
        let p = built.build(&Limits::default()).unwrap();
        let text = built.to_json().to_string();
        let q = Program::from_json(&text, &Limits::default()).unwrap();
        let shape = |p: &Program| {
            p.nodes
                .iter()
                .map(|n| (n.id.clone(), n.deps.clone(), format!("{:?}", n.fanout), n.settings.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(shape(&p), shape(&q));
        assert_eq!((p.max_parallel, p.model.as_deref()), (Width::Max(3), Some("m")));
        assert!(matches!(p.nodes[3].fanout, Fanout::Select(_)) && matches!(p.nodes[2].fanout, Fanout::Fork(4)));
        // and its mistakes are the parser's
        let e = Builder::new().node("a", "{{a}}", Value::Null).build(&Limits::default()).unwrap_err().to_string();
        assert!(e.contains("names itself"), "{e}");
    }

    #[test]
    fn splits_follow_the_spec() {
        assert_eq!(split(&Split::Lines, "1. a\r\n\n  \n2. b\n").unwrap(), ["1. a", "2. b"]);
        assert_eq!(split(&Split::Json, " [\"x\", 2, {\"k\": 1}] ").unwrap(), ["x", "2", "{\"k\":1}"]);
        assert!(split(&Split::Json, "{\"a\": 1}").unwrap_err().contains("not an array"));
        assert!(split(&Split::Json, "[1,").unwrap_err().contains("not a JSON array"));
    }

    /// What is taken at its edges (as many branches as allowed, a map over a node's tool calls,
    /// a map's input as a dependency the prompt does not name, a select generating nothing) and
    /// the refusals a one-line check could get wrong.
    #[test]
    fn edges_of_a_program_taken_and_refused() {
        let l = Limits { max_nodes: 4, max_branches: 3, max_template_bytes: 256, max_total_tokens: 1000 };
        let p = Program::from_json(
            r#"{"nodes": [{"id": "m", "map": {"over": "a", "split": "tool_calls"}, "prompt": "{{item}}"},
                {"id": "a", "prompt": "x", "tools": [{"type": "function", "function": {"name": "f"}}]},
                {"id": "s", "prompt": "{{m}}", "choices": ["1", "2", "3"]}]}"#,
            &l,
        )
        .unwrap();
        let ids: Vec<&str> = p.nodes.iter().map(|n| n.id.as_str()).collect();
        assert_eq!(ids, ["a", "m", "s"], "the map's input comes first though its prompt names no node");
        assert_eq!(p.nodes[1].deps, [0]);
        assert!(p.nodes[0].has_tools() && !p.nodes[1].has_tools());
        // a select scores its choices: it generates nothing (16 tokens each for the others)
        assert_eq!(p.remaining_path(), [32, 16, 0]);
        assert!(
            !Program::from_json(r#"{"nodes": [{"id": "a", "prompt": "x", "chat": false}]}"#, &l).unwrap().nodes[0].chat
        );
        for (text, want) in [
            (r#"{"nodes": [{"id": "s", "prompt": "x", "choices": ["1", "2", "3", "4"]}]}"#, "at most 3"),
            (
                r#"{"nodes": [{"id": "m", "map": {"over": "a", "split": "tool_calls"}, "prompt": "{{item}}"}, {"id": "a", "prompt": "x", "tools": null}]}"#,
                "offers no tools",
            ),
            (r#"{"max_parallel": "fast", "nodes": [{"id": "a", "prompt": "x"}]}"#, "\"max_parallel\" must be"),
            (r#"{"nodes": [{"id": "a", "prompt": "x", "chat": false, "system": "s"}]}"#, "says \"chat\": false"),
            (r#"{"nodes": [{"id": "a", "prompt": "x", "deadline_s": -1}]}"#, "\"deadline_s\" must be"),
            (r#"{"nodes": [{"id": "a", "prompt": "x", "deadline_s": 0}]}"#, "\"deadline_s\" must be"),
            (
                r#"{"nodes": [{"id": "x", "prompt": "p"}, {"id": "a", "prompt": "y"}, {"id": "a", "prompt": "z"}]}"#,
                "two nodes are called 'a'",
            ),
        ] {
            let e = Program::from_json(text, &l).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }
}
