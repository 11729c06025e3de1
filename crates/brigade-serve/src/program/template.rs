//! A node's prompt template: text with `{{X}}` (every branch of node X, joined by a newline in
//! branch order), `{{X[i]}}` (branch i of X) and, in a map node, `{{item}}` (its item) or
//! `{{item.F}}` (field F of an item that is a JSON object — a tool call's `name` or
//! `arguments`, or `item.arguments.city`: a string as it is, anything else as JSON).

use std::collections::BTreeSet;

/// One piece of a parsed template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    /// `{{X}}`, or `{{X[i]}}` with `Some(i)`.
    Node(String, Option<usize>),
    /// `{{item}}`.
    Item,
    /// `{{item.a.b}}`: a field of a JSON item, by its path.
    ItemField(Vec<String>),
}

/// A parsed template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    pub pieces: Vec<Piece>,
}

/// The name a map node's item goes by.
pub const ITEM: &str = "item";

fn valid_id(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl Template {
    /// Parses `s`; an unclosed `{{`, an empty or malformed reference is an error naming it.
    pub fn parse(s: &str) -> Result<Template, String> {
        let mut pieces = Vec::new();
        let mut rest = s;
        while let Some(at) = rest.find("{{") {
            if at > 0 {
                pieces.push(Piece::Text(rest[..at].to_string()));
            }
            let after = &rest[at + 2..];
            let Some(end) = after.find("}}") else {
                return Err(format!("an unclosed '{{{{' at '{}'", preview(&rest[at..])));
            };
            let inner = after[..end].trim();
            pieces.push(reference(inner)?);
            rest = &after[end + 2..];
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.to_string()));
        }
        Ok(Template { pieces })
    }

    /// The nodes the template names (not `item`).
    pub fn names(&self) -> BTreeSet<&str> {
        self.pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Node(n, _) => Some(n.as_str()),
                _ => None,
            })
            .collect()
    }

    pub fn uses_item(&self) -> bool {
        self.pieces.iter().any(|p| matches!(p, Piece::Item | Piece::ItemField(_)))
    }

    /// The text with each reference filled: `branches(X)` gives node X's branch texts, `item`
    /// the map item. A branch index past X's branches is an error naming it.
    pub fn render<'a>(
        &self,
        branches: impl Fn(&str) -> Option<&'a [String]>,
        item: Option<&str>,
    ) -> Result<String, String> {
        let mut out = String::new();
        for p in &self.pieces {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Item => out.push_str(item.ok_or("{{item}} outside a map node")?),
                Piece::ItemField(path) => {
                    let item = item.ok_or("{{item}} outside a map node")?;
                    let name = format!("{{{{item.{}}}}}", path.join("."));
                    let v: serde_json::Value = serde_json::from_str(item)
                        .map_err(|_| format!("{name}: the item is not a JSON object: {}", preview(item)))?;
                    let mut at = &v;
                    for f in path {
                        at = at
                            .get(f)
                            .ok_or_else(|| format!("{name}: the item has no field '{f}': {}", preview(item)))?;
                    }
                    match at {
                        serde_json::Value::String(s) => out.push_str(s),
                        other => out.push_str(&other.to_string()),
                    }
                }
                Piece::Node(n, i) => {
                    let b = branches(n).ok_or_else(|| format!("node '{n}' has no output"))?;
                    match i {
                        None => out.push_str(&b.join("\n")),
                        Some(i) => out.push_str(
                            b.get(*i)
                                .ok_or_else(|| format!("{{{{{n}[{i}]}}}}: node '{n}' has {} branch(es)", b.len()))?,
                        ),
                    }
                }
            }
        }
        Ok(out)
    }
}

fn reference(inner: &str) -> Result<Piece, String> {
    if inner == ITEM {
        return Ok(Piece::Item);
    }
    if let Some(path) = inner.strip_prefix("item.") {
        let path: Vec<String> = path.split('.').map(|f| f.trim().to_string()).collect();
        if path.iter().any(|f| !valid_id(f)) {
            return Err(format!(
                "'{{{{{inner}}}}}': a field path is names of letters, digits, '_' or '-' joined by '.'"
            ));
        }
        return Ok(Piece::ItemField(path));
    }
    let (name, index) = match inner.strip_suffix(']').and_then(|s| s.split_once('[')) {
        Some((n, i)) => {
            let i = i
                .trim()
                .parse::<usize>()
                .map_err(|_| format!("'{{{{{inner}}}}}': the index must be a whole number"))?;
            (n.trim(), Some(i))
        }
        None => (inner, None),
    };
    if !valid_id(name) {
        return Err(format!(
            "'{{{{{inner}}}}}' names no node: write {{{{ID}}}} or {{{{ID[i]}}}} with an ID of letters, digits, '_' or '-'"
        ));
    }
    Ok(Piece::Node(name.to_string(), index))
}

fn preview(s: &str) -> String {
    s.chars().take(24).collect()
}

/// Whether `id` is a valid node id (as references spell them).
pub fn is_id(id: &str) -> bool {
    valid_id(id) && id != ITEM
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_and_render_as_the_spec_says() {
        let t = Template::parse("Q: {{outline}}\nExpand: {{ item }} / {{expand[1]}}.").unwrap();
        assert_eq!(t.names().into_iter().collect::<Vec<_>>(), ["expand", "outline"]);
        assert!(t.uses_item());
        let outline = ["a".to_string()];
        let expand = ["x".to_string(), "y".to_string(), "z".to_string()];
        let get = |n: &str| match n {
            "outline" => Some(&outline[..]),
            "expand" => Some(&expand[..]),
            _ => None,
        };
        assert_eq!(t.render(get, Some("P")).unwrap(), "Q: a\nExpand: P / y.");
        // several branches join with a newline, in order
        let all = Template::parse("{{expand}}").unwrap();
        assert_eq!(all.render(get, None).unwrap(), "x\ny\nz");
        let past = Template::parse("{{expand[3]}}").unwrap().render(get, None).unwrap_err();
        assert!(past.contains("has 3 branch(es)"), "{past}");
        assert_eq!(Template::parse("no refs { } }}").unwrap().pieces, [Piece::Text("no refs { } }}".into())]);
    }

    #[test]
    fn an_items_fields_render_strings_as_they_are_and_the_rest_as_json() {
        let t = Template::parse("{{item.name}}({{ item.arguments }}) in {{item.arguments.city}}").unwrap();
        assert!(t.uses_item());
        let none = |_: &str| None;
        let call = r#"{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}"#;
        assert_eq!(t.render(none, Some(call)).unwrap(), r#"get_weather({"city":"Paris","days":2}) in Paris"#);
        let e = t.render(none, Some(r#"{"name": "f", "arguments": {}}"#)).unwrap_err();
        assert!(e.contains("no field 'city'"), "{e}");
        let e = t.render(none, Some("plain text")).unwrap_err();
        assert!(e.contains("not a JSON object"), "{e}");
        assert!(Template::parse("{{item.}}").unwrap_err().contains("field path"));
    }

    #[test]
    fn malformed_references_are_refused_naming_them() {
        for (s, want) in
            [("a {{b", "unclosed"), ("{{}}", "names no node"), ("{{a b}}", "names no node"), ("{{a[x]}}", "index")]
        {
            let e = Template::parse(s).unwrap_err();
            assert!(e.contains(want), "{s}: {e}");
        }
    }

    /// Ids take '_' and '-'; an unclosed reference is quoted, cut to 24 characters.
    #[test]
    fn ids_with_underscores_and_dashes_and_the_quoted_rest() {
        assert!(is_id("a_b-c") && !is_id("a b") && !is_id(ITEM) && !is_id(""));
        assert_eq!(Template::parse("x {{a_b-c}} y").unwrap().names().into_iter().collect::<Vec<_>>(), ["a_b-c"]);
        let e = Template::parse("x {{abc").unwrap_err();
        assert!(e.contains("an unclosed '{{' at '{{abc'"), "{e}");
        let e = Template::parse("{{0123456789abcdefghijklmnopqrstuvwxyz").unwrap_err();
        assert!(e.contains("at '{{0123456789abcdefghijkl'"), "{e}");
    }
}
