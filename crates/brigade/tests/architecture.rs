//! The floors of docs/architecture.md, checked on the source: every `use` and every path
//! written out (`crate::…`, `super::…`, `brigade::…`) is resolved to the file it names, and
//! no file may name one on a higher floor, no two files may name each other (nor any longer
//! circle of files), serving and embedding name nothing of the trainer, and serving's layers
//! hold: its model reaches no engine file, its programs no HTTP file (nor axum). A `mod.rs`
//! (or `lib.rs`) declaring and re-exporting its own children is the room's door, not an
//! import.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The floors, lowest first: a file may name files on its own floor or below.
const FLOORS: &[(&str, &[&str])] = &[
    ("ground", &["brigade-comm", "brigade::lib", "brigade::error", "brigade::alloc", "brigade::pages"]),
    ("kernels", &["brigade::tensor"]),
    ("values", &["brigade::params", "brigade::layout", "brigade::shards"]),
    ("layers", &["brigade::nn"]),
    ("models", &["brigade::models"]),
    ("ranks", &["brigade::parallel"]),
    ("training", &["brigade::train"]),
    ("jobs", &["brigade::embed", "brigade::tokenize", "brigade::plan", "brigade::bench"]),
    ("serving", &["brigade-serve"]),
    ("cli", &["brigade-cli"]),
];

/// A source file: its crate and its module path (`["nn", "tp", "comm"]`; `[]` for the root).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct File {
    krate: String,
    module: Vec<String>,
    path: PathBuf,
}

impl File {
    fn name(&self) -> String {
        format!("{}/{}", self.krate, self.module.join("/"))
    }

    fn floor(&self) -> usize {
        let room = match self.krate.as_str() {
            "brigade" => format!("brigade::{}", self.module.first().map_or("lib", String::as_str)),
            k => k.to_string(),
        };
        FLOORS
            .iter()
            .position(|(_, rooms)| rooms.contains(&room.as_str()))
            .unwrap_or_else(|| panic!("{} is on no floor of docs/architecture.md: add its room", self.name()))
    }
}

fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn source_files(krate: &str) -> Vec<File> {
    let src = crates_dir().join(krate).join("src");
    let mut out = Vec::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(&src).unwrap().with_extension("");
                let mut module: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
                if matches!(module.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                    module.pop();
                }
                out.push(File { krate: krate.to_string(), module, path: p });
            }
        }
    }
    out.sort();
    out
}

/// The code of a file without comments, string contents and its test module.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => text,
    };
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_str = false;
        let b = line.as_bytes();
        let mut i = 0;
        while i < b.len() {
            match b[i] {
                b'\\' if in_str => i += 1,
                b'"' => in_str = !in_str,
                b'/' if !in_str && b.get(i + 1) == Some(&b'/') => break,
                c if !in_str => out.push(c as char),
                _ => {}
            }
            i += 1;
        }
        out.push('\n');
    }
    out
}

/// Expands `a::{b, c::{d, e}}` into `a::b`, `a::c::d`, `a::c::e`.
fn expand(tree: &str) -> Vec<String> {
    let tree: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
    let Some(open) = tree.find('{') else { return vec![tree] };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').expect("balanced braces")];
    let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts.into_iter().filter(|p| !p.is_empty()).flat_map(|p| expand(&format!("{prefix}{p}"))).collect()
}

/// Every path a file names: its `use` trees, expanded, and the paths written in its code.
/// `pub use`/`pub mod` of its own children in a mod.rs or lib.rs are left out (the door).
fn named_paths(f: &File, code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    let door = f.path.file_name().is_some_and(|n| n == "mod.rs" || n == "lib.rs" || n == "main.rs");
    let mut body = String::new();
    while let Some(i) = rest.find("use ") {
        let word_start = i == 0 || !rest.as_bytes()[i - 1].is_ascii_alphanumeric() && rest.as_bytes()[i - 1] != b'_';
        body.push_str(&rest[..i]);
        if !word_start {
            body.push_str("use ");
            rest = &rest[i + 4..];
            continue;
        }
        let end = rest[i..].find(';').map_or(rest.len(), |e| i + e);
        let tree = &rest[i + 4..end];
        let public = rest[..i].trim_end().ends_with("pub");
        for p in expand(tree) {
            let p = p.split(" as ").next().unwrap().to_string();
            let own_child = !p.starts_with("crate") && !p.starts_with("super") && !p.starts_with("brigade");
            if !(door && public && own_child) {
                out.push(p);
            }
        }
        rest = &rest[(end + 1).min(rest.len())..];
    }
    body.push_str(rest);
    // paths written out in the code
    let b = body.as_bytes();
    for root in ["crate::", "super::", "brigade::", "brigade_comm::", "brigade_serve::"] {
        let mut from = 0;
        while let Some(k) = body[from..].find(root) {
            let at = from + k;
            from = at + root.len();
            if at > 0 && (b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_' || b[at - 1] == b':') {
                continue;
            }
            let len = body[at..].find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')).unwrap_or(0);
            out.push(body[at..at + len].trim_end_matches(':').to_string());
        }
    }
    out
}

/// The file a path names, from file `f`: the deepest module the path walks through.
fn resolve(f: &File, path: &str, files: &BTreeMap<(String, Vec<String>), File>) -> Option<File> {
    let segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let (krate, mut module, rest): (String, Vec<String>, &[&str]) = match *segs.first()? {
        "crate" => (f.krate.clone(), Vec::new(), &segs[1..]),
        "super" => {
            let mut m = f.module.clone();
            let mut k = 0;
            while segs.get(k) == Some(&"super") {
                m.pop();
                k += 1;
            }
            (f.krate.clone(), m, &segs[k..])
        }
        "brigade" => ("brigade".into(), Vec::new(), &segs[1..]),
        "brigade_comm" => ("brigade-comm".into(), Vec::new(), &segs[1..]),
        "brigade_serve" => ("brigade-serve".into(), Vec::new(), &segs[1..]),
        // `self::`, an external crate, or a child named from a file's own door
        "self" => (f.krate.clone(), f.module.clone(), &segs[1..]),
        _ => return None,
    };
    for s in rest {
        let mut deeper = module.clone();
        deeper.push(s.to_string());
        if files.contains_key(&(krate.clone(), deeper.clone())) {
            module = deeper;
        } else {
            break;
        }
    }
    files.get(&(krate, module)).cloned()
}

/// Every file's edges to the files it names (itself left out).
fn graph() -> (Vec<File>, BTreeMap<File, BTreeSet<File>>) {
    let mut all = Vec::new();
    for k in ["brigade-comm", "brigade", "brigade-serve", "brigade-cli"] {
        all.extend(source_files(k));
    }
    let index: BTreeMap<(String, Vec<String>), File> =
        all.iter().map(|f| ((f.krate.clone(), f.module.clone()), f.clone())).collect();
    let mut edges = BTreeMap::new();
    for f in &all {
        let text = std::fs::read_to_string(&f.path).unwrap();
        let to: BTreeSet<File> =
            named_paths(f, &code(&text)).iter().filter_map(|p| resolve(f, p, &index)).filter(|t| t != f).collect();
        edges.insert(f.clone(), to);
    }
    (all, edges)
}

#[test]
fn the_parser_reads_use_trees_and_written_paths() {
    assert_eq!(expand("crate::{a::b, c::{d, e}}"), ["crate::a::b", "crate::c::d", "crate::c::e"]);
    let f = File { krate: "brigade".into(), module: vec!["nn".into(), "attention".into()], path: "x.rs".into() };
    let c = code("use super::{ensure, Grads};\nfn f() { crate::tensor::matmul(); \"crate::nope\"; } // crate::no\n");
    let mut p = named_paths(&f, &c);
    p.sort();
    assert_eq!(p, ["crate::tensor::matmul", "super::Grads", "super::ensure"]);
}

#[test]
fn no_file_names_a_higher_floor() {
    let (all, edges) = graph();
    assert!(all.len() > 100, "found only {} source files", all.len());
    let mut bad = Vec::new();
    for (f, to) in &edges {
        for t in to.iter().filter(|t| t.floor() > f.floor()) {
            bad.push(format!(
                "{} (floor {}) names {} (floor {})",
                f.name(),
                FLOORS[f.floor()].0,
                t.name(),
                FLOORS[t.floor()].0
            ));
        }
    }
    assert!(bad.is_empty(), "imports that run back up:\n{}", bad.join("\n"));
}

#[test]
fn serving_and_embedding_name_nothing_of_the_trainer() {
    let (_, edges) = graph();
    let mut bad = Vec::new();
    for (f, to) in &edges {
        let serving =
            f.krate == "brigade-serve" || (f.krate == "brigade" && f.module.first().is_some_and(|m| m == "embed"));
        for t in to.iter().filter(|t| t.krate == "brigade" && t.module.first().is_some_and(|m| m == "train")) {
            if serving {
                bad.push(format!("{} names {}", f.name(), t.name()));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// A file of brigade-serve's room `room` (`model`, `engine`, `http`, `program`, …).
fn in_serve_room(f: &File, room: &str) -> bool {
    f.krate == "brigade-serve" && f.module.first().is_some_and(|m| m == room)
}

/// Every file `from` reaches over the edges (itself left out unless on a circle), and the
/// first file of the path to it.
fn reached(edges: &BTreeMap<File, BTreeSet<File>>, from: &File) -> BTreeMap<File, File> {
    let mut seen: BTreeMap<File, File> = BTreeMap::new();
    let mut stack: Vec<(File, File)> = edges[from].iter().map(|t| (t.clone(), t.clone())).collect();
    while let Some((f, via)) = stack.pop() {
        if seen.contains_key(&f) {
            continue;
        }
        stack.extend(edges[&f].iter().map(|t| (t.clone(), via.clone())));
        seen.insert(f, via);
    }
    seen
}

/// The files of serving room `from` that reach a file of room `to`, directly or through others.
fn serve_rooms_reaching(from: &str, to: &str) -> Vec<String> {
    let (_, edges) = graph();
    let mut bad = Vec::new();
    for f in edges.keys().filter(|f| in_serve_room(f, from)) {
        for (t, via) in reached(&edges, f).iter().filter(|(t, _)| in_serve_room(t, to)) {
            bad.push(format!("{} reaches {} (through {})", f.name(), t.name(), via.name()));
        }
    }
    bad
}

#[test]
fn the_serving_model_names_no_engine_file() {
    let (all, _) = graph();
    assert!(all.iter().any(|f| in_serve_room(f, "model")) && all.iter().any(|f| in_serve_room(f, "engine")));
    let bad = serve_rooms_reaching("model", "engine");
    assert!(bad.is_empty(), "the serving model knows the blocks only by number:\n{}", bad.join("\n"));
}

#[test]
fn programs_name_no_http_file() {
    let (all, edges) = graph();
    assert!(all.iter().any(|f| in_serve_room(f, "program")) && all.iter().any(|f| in_serve_room(f, "http")));
    let mut bad = serve_rooms_reaching("program", "http");
    // nor does anything they reach speak HTTP itself: `brigade run` carries no server
    for f in all.iter().filter(|f| in_serve_room(f, "program")) {
        let mut files: Vec<File> = reached(&edges, f).into_keys().collect();
        files.push(f.clone());
        for t in files.iter().filter(|t| t.krate == "brigade-serve") {
            if code(&std::fs::read_to_string(&t.path).unwrap()).contains("axum") {
                bad.push(format!("{} reaches {}, which names axum", f.name(), t.name()));
            }
        }
    }
    bad.sort();
    bad.dedup();
    assert!(bad.is_empty(), "programs run without the HTTP layer:\n{}", bad.join("\n"));
}

#[test]
fn no_files_name_each_other() {
    let (all, edges) = graph();
    // every circle of files, by the strongly connected components of the graph (Tarjan)
    struct Tarjan<'a> {
        edges: &'a BTreeMap<File, BTreeSet<File>>,
        index: BTreeMap<&'a File, usize>,
        low: BTreeMap<&'a File, usize>,
        stack: Vec<&'a File>,
        on: BTreeSet<&'a File>,
        circles: Vec<Vec<String>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a File) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on.insert(v);
            for w in &self.edges[v] {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let l = self.low[v].min(self.low[w]);
                    self.low.insert(v, l);
                } else if self.on.contains(w) {
                    let l = self.low[v].min(self.index[w]);
                    self.low.insert(v, l);
                }
            }
            if self.low[v] == self.index[v] {
                let mut c = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on.remove(w);
                    c.push(w.name());
                    if w == v {
                        break;
                    }
                }
                if c.len() > 1 {
                    self.circles.push(c);
                }
            }
        }
    }
    let mut t = Tarjan {
        edges: &edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        circles: Vec::new(),
    };
    for f in &all {
        if !t.index.contains_key(f) {
            t.visit(f);
        }
    }
    let shown: Vec<String> = t.circles.iter().map(|c| c.join(" ↔ ")).collect();
    assert!(shown.is_empty(), "files that name each other (directly or round a circle):\n{}", shown.join("\n"));
}
