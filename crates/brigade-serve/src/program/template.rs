//! A node's prompt template: text with `{{X}}` (every branch of node X, joined by a newline in
//! branch order), `{{X[i]}}` (branch i of X) and, in a map node, `{{item}}` (its item).

use std::collections::BTreeSet;

/// One piece of a parsed template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    /// `{{X}}`, or `{{X[i]}}` with `Some(i)`.
    Node(String, Option<usize>),
    /// `{{item}}`.
    Item,
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
        self.pieces.contains(&Piece::Item)
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
    fn malformed_references_are_refused_naming_them() {
        for (s, want) in
            [("a {{b", "unclosed"), ("{{}}", "names no node"), ("{{a b}}", "names no node"), ("{{a[x]}}", "index")]
        {
            let e = Template::parse(s).unwrap_err();
            assert!(e.contains(want), "{s}: {e}");
        }
    }
}
