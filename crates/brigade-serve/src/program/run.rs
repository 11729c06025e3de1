//! Runs a program inside the engine: a node enters the running batch as soon as the nodes it
//! names are done; its branches (a fork's, a map's items, a select's choices) are sequences of
//! the engine that share their prompt's keys and values with branch 0 (`Admit::follows`);
//! while the program's width is spent, the branch of the node with the longest remaining path
//! goes first. Each node's sequences are built exactly as `/v1/completions` builds a request's
//! (`request::shape` and `request::choices`), so a node's output is what that API returns
//! for its rendered prompt and settings. A node that fails fails the nodes that depend on it
//! and no other; the result names which and why.

use super::graph::{split, Fanout, Node, Program, Split, Width};
use crate::constraint::ConstraintError;
use crate::engine::{Admit, Output, Refused, Request, Sampling, StepProfile};
use crate::metrics::Metrics;
use crate::request::choices::Choices;
use crate::request::completion::{self, Completion};
use crate::request::shape::{chat_prompt, prompt_ids, prompted, sampling, Kind};
use crate::request::tools::{self, Call, Syntax};
use crate::request::{chat, ApiError};
use crate::startup::Loaded;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::unbounded_channel;

/// What a run needs of the server (or of `brigade run`'s engine without one).
pub(crate) struct Ctx<'a> {
    pub(crate) l: &'a Loaded,
    pub(crate) metrics: &'a Metrics,
    pub(crate) next_id: &'a AtomicU64,
    /// The most branches of one node (a map's items are only known when it starts).
    pub(crate) max_branches: usize,
}

/// Checks, before anything runs, what the graph's own checks cannot: that the model can take
/// text prompts, and every node's settings as `/v1/completions` would check them.
pub(crate) fn check(p: &Program, l: &Loaded) -> Result<(), CheckError> {
    let Some(tok) = &l.tokenizer else {
        return Err(CheckError::NoTokenizer);
    };
    for n in &p.nodes {
        let node = || n.id.clone();
        let req = completion(l, n, vec!["x".into()]).map_err(|err| CheckError::Settings { node: node(), err })?;
        l.constraint(req.constraint.as_ref()).map_err(|err| CheckError::Constraint { node: node(), err })?;
        if let Fanout::Select(choices) = &n.fanout {
            for c in choices {
                if tok.encode(c)?.is_empty() {
                    return Err(CheckError::EmptyChoice { node: node(), choice: c.clone() });
                }
            }
        }
    }
    Ok(())
}

/// Why a program cannot run on the loaded model (found before anything runs; a 400).
#[derive(Debug, thiserror::Error)]
pub(crate) enum CheckError {
    #[error("this model has no tokenizer.json, and programs are text; serve a checkpoint that has one")]
    NoTokenizer,
    /// A node's settings, as `/v1/completions` would refuse them.
    #[error("node '{node}': {err}")]
    Settings { node: String, err: ApiError },
    #[error("node '{node}': {err}")]
    Constraint { node: String, err: ConstraintError },
    /// A select's choice the tokenizer could not encode.
    #[error(transparent)]
    Tokenize(#[from] brigade::Error),
    #[error("node '{node}': the choice {choice:?} is no tokens")]
    EmptyChoice { node: String, choice: String },
}

/// The node's settings as a completions request for `prompts` (a fork's N as `n`); a chat
/// node's as a chat request per prompt (its system message, the prompt as the user's turn)
/// rendered by the model's template, the prompts then token ids.
fn completion(l: &Loaded, n: &Node, prompts: Vec<String>) -> Result<Completion, ApiError> {
    let mut body: Map<String, Value> = n.settings.clone();
    if let Fanout::Fork(k) = n.fanout {
        body.insert("n".into(), json!(k));
    }
    if !n.chat {
        body.insert("prompt".into(), json!(prompts));
        let bytes = serde_json::to_vec(&Value::Object(body)).expect("JSON");
        return completion::parse_with(&bytes, &l.defaults);
    }
    let mut rendered: Option<Completion> = None;
    let mut ids = Vec::with_capacity(prompts.len());
    for p in prompts {
        let mut messages = Vec::new();
        if let Some(s) = &n.system {
            messages.push(json!({"role": "system", "content": s}));
        }
        messages.push(json!({"role": "user", "content": p}));
        body.insert("messages".into(), Value::Array(messages));
        let bytes = serde_json::to_vec(&Value::Object(body.clone())).expect("JSON");
        let mut c = chat_prompt(l, chat::parse_with(&bytes, &l.defaults)?)?;
        ids.append(&mut c.prompts);
        rendered = Some(c);
    }
    let mut req = rendered.expect("a node has at least one prompt");
    req.prompts = ids;
    Ok(req)
}

enum State {
    Waiting,
    Running,
    Done,
    Failed(String),
}

struct Branch {
    prompt: String,
    request: Request,
    admit: Admit,
    submitted: bool,
    done: bool,
    start_s: Option<f64>,
    end_s: Option<f64>,
    prompt_computed: usize,
    /// Sum of the forced tokens' log-probabilities (a select's choice).
    logprob: f64,
    /// Its constraint was not met when it ended.
    unmet: bool,
}

struct Run<'a> {
    state: State,
    branches: Vec<Branch>,
    choices: Option<Choices<'a>>,
    /// Each branch's text once done (a select's: the chosen choice).
    texts: Vec<String>,
    /// A select's mean log-probability of each choice.
    scores: Vec<f64>,
    start_s: Option<f64>,
    end_s: Option<f64>,
    /// A node with tools: how its calls are written, and the functions offered.
    tool_calls: Option<(Syntax, Vec<String>)>,
    /// Each branch's tool calls once done (every one parses against its function's schema).
    calls: Vec<Vec<Call>>,
}

impl Run<'_> {
    fn finished(&self) -> bool {
        matches!(self.state, State::Done | State::Failed(_))
    }
}

/// Runs `p` to its end; `on_node` gets each node's result as it ends. Returns the result.
pub(crate) async fn run(ctx: &Ctx<'_>, p: &Program, mut on_node: impl FnMut(Value)) -> Value {
    let l = ctx.l;
    let profile: StepProfile =
        l.engine.profile().await.unwrap_or(StepProfile { decode: vec![], prefill_per_token: 0.0 });
    let t0 = Instant::now();
    let remaining = p.remaining_path();
    let (tx, mut rx) = unbounded_channel::<Result<Output, Refused>>();
    let mut runs: Vec<Run> = p
        .nodes
        .iter()
        .map(|_| Run {
            state: State::Waiting,
            branches: Vec::new(),
            choices: None,
            texts: Vec::new(),
            scores: Vec::new(),
            start_s: None,
            end_s: None,
            tool_calls: None,
            calls: Vec::new(),
        })
        .collect();
    let mut owner: HashMap<u64, (usize, usize)> = HashMap::new();
    // every sequence submitted is aborted when the run ends, however it ends (a client that
    // goes away drops this future)
    let mut submitted = Aborts { l, ids: Vec::new() };
    let mut inflight = 0usize;
    let mut width_at_start = None;
    let now = |t0: Instant| t0.elapsed().as_secs_f64();
    loop {
        // nodes whose inputs are in: started, or failed with the input that failed
        for i in 0..p.nodes.len() {
            if !matches!(runs[i].state, State::Waiting) {
                continue;
            }
            let node = &p.nodes[i];
            if let Some(&d) = node.deps.iter().find(|&&d| matches!(runs[d].state, State::Failed(_))) {
                fail(&mut runs[i], format!("it depends on '{}', which failed", p.nodes[d].id), t0);
                on_node(node_event(&p.nodes[i], &runs[i]));
                continue;
            }
            if node.deps.iter().all(|&d| matches!(runs[d].state, State::Done)) {
                match start(ctx, p, i, &runs) {
                    Ok((branches, choices, tool_calls)) => {
                        let r = &mut runs[i];
                        r.tool_calls = tool_calls;
                        for (j, b) in branches.iter().enumerate() {
                            owner.insert(b.request.id, (i, j));
                        }
                        r.branches = branches;
                        r.choices = Some(choices);
                        r.state = State::Running;
                        r.start_s = Some(now(t0));
                    }
                    Err(e) => {
                        fail(&mut runs[i], e, t0);
                        on_node(node_event(&p.nodes[i], &runs[i]));
                    }
                }
            }
        }
        // deadlines
        let t = now(t0);
        for (i, node) in p.nodes.iter().enumerate() {
            if let (Some(d), false) = (node.deadline_s, runs[i].finished()) {
                if t >= d {
                    inflight -= stop_branches(&mut runs[i], l);
                    fail(&mut runs[i], format!("its deadline of {d} s passed before it finished"), t0);
                    on_node(node_event(node, &runs[i]));
                }
            }
        }
        if runs.iter().all(Run::finished) {
            break;
        }
        // branches into the engine while the width allows, longest remaining path first
        // the other sequences in the engine (its gauges count this program's too)
        let others = others_than(ctx.metrics.running.get(), ctx.metrics.waiting.get(), inflight);
        let width = match p.max_parallel {
            Width::Max(n) => n,
            Width::Auto => profile.width(others, l.max_running),
        };
        width_at_start.get_or_insert((width, others));
        while inflight < width {
            let next = (0..p.nodes.len())
                .filter(|&i| matches!(runs[i].state, State::Running))
                .filter_map(|i| runs[i].branches.iter().position(|b| !b.submitted).map(|j| (i, j)))
                .max_by_key(|&(i, _)| (remaining[i], usize::MAX - i));
            let Some((i, j)) = next else { break };
            let b = &mut runs[i].branches[j];
            b.submitted = true;
            b.start_s = Some(now(t0));
            inflight += 1;
            submitted.ids.push(b.request.id);
            l.engine.add_with(b.request.clone(), std::mem::take(&mut b.admit), tx.clone());
        }
        // the next token, or the next deadline
        let next_deadline = p
            .nodes
            .iter()
            .zip(&runs)
            .filter(|(_, r)| !r.finished())
            .filter_map(|(n, _)| n.deadline_s)
            .fold(f64::INFINITY, f64::min);
        let wait = Duration::from_secs_f64((next_deadline - now(t0)).clamp(0.0, 3600.0));
        let msg = tokio::select! {
            m = rx.recv() => m,
            _ = tokio::time::sleep(wait) => continue,
        };
        let o = match msg {
            Some(Ok(o)) => o,
            Some(Err(e)) => {
                // the engine refused a sequence: its node fails (the sender does not say
                // which, so the oldest running node with an unfinished branch is not named;
                // every check the engine makes was made before, so this does not happen)
                for (i, r) in runs.iter_mut().enumerate() {
                    if matches!(r.state, State::Running) {
                        inflight -= stop_branches(r, l);
                        fail(r, format!("the engine refused it: {e}"), t0);
                        on_node(node_event(&p.nodes[i], r));
                    }
                }
                continue;
            }
            None => unreachable!("the run holds a sender"),
        };
        let Some(&(i, j)) = owner.get(&o.id) else { continue };
        let r = &mut runs[i];
        if !matches!(r.state, State::Running) {
            continue;
        }
        let choices = r.choices.as_mut().expect("a running node has its choices");
        let b = &mut r.branches[j];
        b.prompt_computed = o.prompt_computed;
        b.unmet |= o.unmet;
        b.logprob += o.logprob as f64;
        choices.take(&o, ctx.metrics);
        if !b.done && choices.list[j].finish.is_some() {
            b.done = true;
            b.end_s = Some(now(t0));
            inflight -= 1;
        }
        if r.branches.iter().all(|b| b.done) {
            // a tool node's calls are read as the chat API reads them: a call cut by max_tokens
            // is left out and the whole ones kept, so only a text constraint can go unmet
            match r.branches.iter().position(|b| b.unmet && r.tool_calls.is_none()) {
                Some(j) => {
                    let max = r.branches[j].request.sampling.max_tokens;
                    fail(r, format!("branch {j}'s output did not meet its constraint within max_tokens ({max})"), t0)
                }
                None => finish(&p.nodes[i], r, t0),
            }
            on_node(node_event(&p.nodes[i], r));
        }
    }
    drop(submitted);
    result(p, &runs, &profile, width_at_start.unwrap_or((1, 0)), t0)
}

/// Aborts every sequence it names when dropped (finished ones are no longer in the engine).
struct Aborts<'a> {
    l: &'a Loaded,
    ids: Vec<u64>,
}

impl Drop for Aborts<'_> {
    fn drop(&mut self) {
        for &id in &self.ids {
            self.l.engine.abort(id);
        }
    }
}

/// Aborts a node's submitted, unfinished branches; returns how many.
fn stop_branches(r: &mut Run, l: &Loaded) -> usize {
    let mut n = 0;
    for b in &mut r.branches {
        if b.submitted && !b.done {
            l.engine.abort(b.request.id);
            n += 1;
        }
        b.done = true;
    }
    n
}

/// The sequences in the engine that are not this program's: running and waiting, less the
/// program's own in flight.
fn others_than(running: i64, waiting: i64, inflight: usize) -> usize {
    ((running + waiting).max(0) as usize).saturating_sub(inflight)
}

/// Refuses a map of `n` items past `max` branches, naming `what` found them.
fn at_most(max: usize, n: usize, what: &str, unit: &str) -> Result<(), String> {
    if n > max {
        return Err(format!("{what} found {n} {unit}; at most {max} branches are allowed"));
    }
    Ok(())
}

fn fail(r: &mut Run, why: String, t0: Instant) {
    r.state = State::Failed(why);
    r.end_s = Some(t0.elapsed().as_secs_f64());
}

/// What a node starts with: its branches, their choices as they fill, and (with tools) how its
/// calls are read back.
type Started<'a> = (Vec<Branch>, Choices<'a>, Option<(Syntax, Vec<String>)>);

/// A node's branches, as the completions (or chat) API would build its sequences.
fn start<'a>(ctx: &Ctx<'a>, p: &Program, i: usize, runs: &[Run]) -> Result<Started<'a>, String> {
    let l = ctx.l;
    let node = &p.nodes[i];
    let texts = |name: &str| p.nodes.iter().position(|n| n.id == name).map(|k| &runs[k].texts[..]);
    let prompts: Vec<String> = match &node.fanout {
        Fanout::Map { over, split: Split::ToolCalls } => {
            let k = p.nodes.iter().position(|n| n.id == *over).expect("a checked reference");
            let items: Vec<String> = runs[k]
                .calls
                .iter()
                .flatten()
                .map(|c| {
                    let args: Value = serde_json::from_str(&c.arguments).expect("every call read back parses");
                    json!({"name": c.name, "arguments": args}).to_string()
                })
                .collect();
            if items.is_empty() {
                return Err(format!("its map over the tool calls of '{over}' found none: '{over}' called no tool"));
            }
            at_most(ctx.max_branches, items.len(), &format!("its map over the tool calls of '{over}'"), "calls")?;
            items.iter().map(|it| node.prompt.render(texts, Some(it))).collect::<Result<_, _>>()?
        }
        Fanout::Map { over, split: how } => {
            let input = texts(over).expect("a checked reference").join("\n");
            let items = split(how, &input).map_err(|e| format!("its map over '{over}': {e}"))?;
            if items.is_empty() {
                return Err(format!("its map over '{over}' found no items in {:?}", preview(&input)));
            }
            at_most(ctx.max_branches, items.len(), &format!("its map over '{over}'"), "items")?;
            items.iter().map(|it| node.prompt.render(texts, Some(it))).collect::<Result<_, _>>()?
        }
        Fanout::Items(items) => items.iter().map(|it| node.prompt.render(texts, Some(it))).collect::<Result<_, _>>()?,
        _ => vec![node.prompt.render(texts, None)?],
    };
    let mut req = completion(l, node, prompts.clone()).map_err(|e| e.message)?;
    let kind = if node.chat { Kind::Chat } else { Kind::Text };
    if req.seed.is_none() && req.temperature > 0.0 {
        // as the completions API: sampling without a seed draws one
        req.seed = Some(rand::random());
    }
    let mut checked = Vec::new();
    for prompt in &req.prompts {
        let ids = prompt_ids(l, prompt).map_err(|e| e.message)?;
        checked.push(prompted(l, &req, ids).map_err(|e| format!("its rendered prompt: {}", e.message))?);
    }
    let count = match &node.fanout {
        Fanout::Fork(k) => *k,
        Fanout::Select(c) => c.len(),
        _ => checked.len(),
    };
    let base = ctx.next_id.fetch_add(count as u64, Ordering::SeqCst);
    let ids: Vec<u64> = (base..base + count as u64).collect();
    let follows = |j: usize| (j > 0).then_some(base);
    let constrained = !matches!(node.fanout, Fanout::Select(_));
    let branch =
        |j: usize, prompt: &str, ids_: &[u32], sampling: Sampling, forced: Vec<u32>| -> Result<Branch, String> {
            let constraint =
                if constrained { l.constraint(req.constraint.as_ref()).map_err(|e| e.to_string())? } else { None };
            Ok(Branch {
                prompt: prompt.to_string(),
                request: Request { id: base + j as u64, prompt: ids_.to_vec(), sampling },
                admit: Admit { follows: follows(j), forced, constraint },
                submitted: false,
                done: false,
                start_s: None,
                end_s: None,
                prompt_computed: 0,
                logprob: 0.0,
                unmet: false,
            })
        };
    let mut branches = Vec::new();
    match &node.fanout {
        Fanout::Select(choices) => {
            let tok = l.tokenizer.as_ref().expect("checked: the model has a tokenizer");
            let c0 = &checked[0];
            for (j, c) in choices.iter().enumerate() {
                let forced = tok.encode(c).map_err(|e| e.to_string())?;
                if c0.ids.len() + forced.len() > l.context {
                    return Err(format!(
                        "its prompt and the choice {c:?} are {} tokens; the model's context is {}",
                        c0.ids.len() + forced.len(),
                        l.context
                    ));
                }
                let s = Sampling::greedy(forced.len());
                branches.push(branch(j, &prompts[0], &c0.ids, s, forced)?);
            }
        }
        Fanout::Fork(k) => {
            for j in 0..*k {
                let s = sampling(l, &req, kind, checked[0].max_tokens, j);
                branches.push(branch(j, &prompts[0], &checked[0].ids, s, vec![])?);
            }
        }
        _ => {
            for (j, c) in checked.iter().enumerate() {
                let s = sampling(l, &req, kind, c.max_tokens, 0);
                branches.push(branch(j, &prompts[j], &c.ids, s, vec![])?);
            }
        }
    }
    let started = Instant::now();
    Ok((branches, Choices::new(l, &req, kind, &ids, started), req.tool_calls.clone()))
}

/// A node whose branches are all done: its texts (a select's: the choice of highest mean
/// log-probability per token, the first among equals, as SGLang's `select`).
fn finish(node: &Node, r: &mut Run, t0: Instant) {
    let choices = r.choices.as_ref().expect("a running node has its choices");
    match &node.fanout {
        Fanout::Select(options) => {
            r.scores = r.branches.iter().map(|b| b.logprob / b.request.sampling.max_tokens as f64).collect();
            let best = (0..options.len()).fold(0, |a, k| if r.scores[k] > r.scores[a] { k } else { a });
            r.texts = vec![options[best].clone()];
        }
        _ => r.texts = choices.list.iter().map(|c| c.detok.text().to_string()).collect(),
    }
    if let Some((syntax, names)) = &r.tool_calls {
        r.calls = r.texts.iter().map(|t| tools::read_calls(t, *syntax, names).1).collect();
    }
    r.state = State::Done;
    r.end_s = Some(t0.elapsed().as_secs_f64());
}

fn preview(s: &str) -> String {
    let p: String = s.chars().take(60).collect();
    if p.len() < s.len() {
        format!("{p}…")
    } else {
        p
    }
}

/// A node's part of the result.
fn node_value(node: &Node, r: &Run) -> Value {
    let choices = r.choices.as_ref();
    let branches: Vec<Value> = r
        .branches
        .iter()
        .enumerate()
        .map(|(j, b)| {
            let c = choices.map(|c| &c.list[j]);
            let text = match (&node.fanout, &r.state) {
                (Fanout::Select(options), _) => options[j].clone(),
                _ => c.map(|c| c.detok.text().to_string()).unwrap_or_default(),
            };
            let mut v = json!({
                "prompt": b.prompt,
                "text": text,
                "token_ids": c.map(|c| c.tokens.clone()).unwrap_or_default(),
                "finish_reason": c.and_then(|c| c.finish),
                "start_s": b.start_s,
                "end_s": b.end_s,
                "prompt_tokens": b.request.prompt.len(),
                "prompt_tokens_computed": b.prompt_computed,
            });
            if let (Some((syntax, names)), Some(c)) = (&r.tool_calls, c) {
                // as the chat API answers: the text before the calls, and the calls
                let (content, calls) = tools::read_calls(c.detok.text(), *syntax, names);
                v["content"] = json!(content);
                v["tool_calls"] = tools::api_calls(&calls, &format!("{}_{j}", node.id));
            }
            v
        })
        .collect();
    let mut v = json!({
        "branches": branches,
        "error": match &r.state { State::Failed(e) => Some(e.clone()), _ => None },
        "start_s": r.start_s,
        "end_s": r.end_s,
    });
    if let (Fanout::Select(_), State::Done) = (&node.fanout, &r.state) {
        v["choice"] = json!(r.texts[0]);
        v["scores"] = json!(r.scores);
    }
    v
}

fn node_event(node: &Node, r: &Run) -> Value {
    let mut v = node_value(node, r);
    v["node"] = json!(node.id);
    v
}

/// The result; `(width, others)`: the program's width when it started and the sequences of
/// others it was chosen beside.
fn result(p: &Program, runs: &[Run], profile: &StepProfile, (width, others): (usize, usize), t0: Instant) -> Value {
    let mut nodes = Map::new();
    let (mut generated, mut saved, mut sequential) = (0usize, 0usize, 0f64);
    for (n, r) in p.nodes.iter().zip(runs) {
        nodes.insert(n.id.clone(), node_value(n, r));
        if let Some(c) = &r.choices {
            for (b, c) in r.branches.iter().zip(&c.list) {
                generated += c.tokens.len();
                if c.tokens.is_empty() {
                    continue;
                }
                let len = b.request.prompt.len();
                saved += len.saturating_sub(b.prompt_computed);
                // the same call alone: its whole prompt, then a decode step per token
                sequential += len as f64 * profile.prefill_per_token + c.tokens.len() as f64 * profile.decode_one();
            }
        }
    }
    let makespan = t0.elapsed().as_secs_f64();
    json!({
        "object": "program.result",
        "nodes": nodes,
        "critical_path": critical_path(p, runs),
        "makespan_s": makespan,
        "sequential_estimate_s": sequential,
        "speedup_estimate": if makespan > 0.0 { sequential / makespan } else { 0.0 },
        "generated_tokens": generated,
        "prefill_tokens_saved": saved,
        "max_parallel": width,
        "max_parallel_auto": p.max_parallel == Width::Auto,
        // what `auto` is chosen from: the engine's decode step time by batch size
        "decode_step_s": profile.decode,
        "prefill_s_per_token": profile.prefill_per_token,
        "decode_knee": profile.knee(),
        "others_at_start": others,
        "failed": p.nodes.iter().zip(runs).filter(|(_, r)| matches!(r.state, State::Failed(_))).map(|(n, _)| n.id.clone()).collect::<Vec<_>>(),
    })
}

/// The path that set the makespan: from the node that ended last back through, at each step,
/// the input that ended last.
fn critical_path(p: &Program, runs: &[Run]) -> Vec<String> {
    let end = |i: usize| runs[i].end_s.unwrap_or(0.0);
    let Some(mut i) = (0..p.nodes.len()).max_by(|&a, &b| end(a).total_cmp(&end(b))) else { return vec![] };
    let mut path = vec![p.nodes[i].id.clone()];
    while let Some(&d) = p.nodes[i].deps.iter().max_by(|&&a, &&b| end(a).total_cmp(&end(b))) {
        path.push(p.nodes[d].id.clone());
        i = d;
    }
    path.reverse();
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn others_are_the_engines_running_and_waiting_less_the_programs_own() {
        assert_eq!(others_than(3, 2, 1), 4);
        assert_eq!(others_than(2, 0, 2), 0);
        assert_eq!(others_than(1, 3, 6), 0, "never below none");
        assert_eq!(others_than(-1, 0, 0), 0, "a gauge below zero counts none");
    }

    #[test]
    fn a_map_takes_at_most_max_branches() {
        assert_eq!(at_most(64, 64, "its map over 'a'", "items"), Ok(()));
        assert_eq!(
            at_most(64, 65, "its map over 'a'", "items"),
            Err("its map over 'a' found 65 items; at most 64 branches are allowed".into())
        );
    }
}
