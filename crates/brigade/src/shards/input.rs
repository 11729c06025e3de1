//! The corpus: input files read as documents (plain text lines, JSONL records, or a whole
//! file each), scanned once to validate every line, fingerprint the input and cut it into
//! shards; then each worker reads only its shards' bytes.

use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// One document a line; its id is the 0-based line number across the input files.
    Text,
    /// One JSON object a line with a text field (and an id field, where one is asked for).
    Jsonl,
    /// The whole file is one document; its id is its 0-based number as a line would be.
    Document,
    /// An Apache Parquet file: a row a document, its text in a string column (the text
    /// field); its id the row's 0-based number across the input, as a line's.
    Parquet,
}

impl Format {
    /// `--format auto`: JSONL for `*.jsonl` files, Parquet for `*.parquet`, plain text otherwise.
    pub fn of(path: &Path) -> Format {
        match path.extension().and_then(|e| e.to_str()) {
            Some("jsonl") => Format::Jsonl,
            Some("parquet") => Format::Parquet,
            _ => Format::Text,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnError {
    Fail,
    Skip,
}

/// How to read the input files.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputSpec {
    pub files: Vec<PathBuf>,
    /// `None`: by each file's extension.
    pub format: Option<Format>,
    /// `None`: JSONL documents are numbered like lines.
    pub id_field: Option<String>,
    pub text_field: String,
    pub on_error: OnError,
}

impl InputSpec {
    pub fn format_of(&self, file: usize) -> Format {
        self.format.unwrap_or_else(|| Format::of(&self.files[file]))
    }
}

/// One input file as scanned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileInfo {
    pub path: String,
    pub format: Format,
    pub bytes: u64,
    pub lines: u64,
    pub blake3: String,
}

/// A line left out under `--on-error skip`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    pub file: String,
    /// 1-based, as editors count.
    pub line: u64,
    pub reason: String,
}

/// Where a shard's documents start and how many it holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardSpan {
    pub index: usize,
    pub file: usize,
    pub offset: u64,
    /// 0-based line of `offset` in its file.
    pub line: u64,
    pub count: usize,
}

/// The scanned corpus: what every worker needs to find its shards.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Index {
    pub files: Vec<FileInfo>,
    pub shards: Vec<ShardSpan>,
    pub documents: u64,
    pub skipped: Vec<Skipped>,
}

/// One document: its id (as written to the `.ids` file) and text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Doc {
    pub id: String,
    pub text: String,
}

/// What a line holds: a document, nothing (a blank JSONL line), or a fault.
enum Line {
    Doc(Doc),
    Blank,
}

/// Parses one line (without its line ending). `number` is the line's global 0-based number,
/// the id of a plain-text document.
fn parse(raw: &[u8], format: Format, spec: &InputSpec, number: u64) -> std::result::Result<Line, String> {
    // a UTF-8 byte-order mark opening a line (Windows editors write one at the start of a
    // file) is not text: JSON parsers refuse it and it is no part of a document
    let raw = raw.strip_prefix(b"\xef\xbb\xbf").unwrap_or(raw);
    let text = std::str::from_utf8(raw).map_err(|e| format!("invalid UTF-8 at byte {}", e.valid_up_to()))?;
    match format {
        Format::Text | Format::Document | Format::Parquet => {
            Ok(Line::Doc(Doc { id: number.to_string(), text: text.to_string() }))
        }
        Format::Jsonl => {
            if text.trim().is_empty() {
                return Ok(Line::Blank);
            }
            let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("malformed JSON ({e})"))?;
            let obj = v.as_object().ok_or("a JSONL line must be a JSON object")?;
            let id = match &spec.id_field {
                None => number.to_string(),
                Some(field) => match obj.get(field) {
                    Some(serde_json::Value::String(s)) => s.clone(),
                    Some(serde_json::Value::Number(n)) if n.is_i64() || n.is_u64() => n.to_string(),
                    Some(_) => return Err(format!("field '{field}' must be a string or an integer")),
                    None => return Err(format!("no '{field}' field (choose the id field with --id-field)")),
                },
            };
            if id.is_empty() || id.contains(['\n', '\r']) {
                return Err(format!("id {id:?} is empty or holds a line break"));
            }
            let text = match obj.get(&spec.text_field) {
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(_) => return Err(format!("field '{}' must be a string", spec.text_field)),
                None => {
                    return Err(format!("no '{}' field (choose the text field with --text-field)", spec.text_field))
                }
            };
            Ok(Line::Doc(Doc { id, text }))
        }
    }
}

/// The files of a folder of documents, in name order (hidden files and subfolders left out):
/// how a folder given as input is read, by `brigade tokenize` and by training alike.
pub fn folder_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::Data(format!("cannot read folder {}: {e}", dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')))
        .collect();
    files.sort();
    Ok(files)
}

/// Reads the next line into `buf` (ending stripped); false at end of file.
fn next_line(r: &mut impl BufRead, buf: &mut Vec<u8>, path: &Path) -> Result<Option<usize>> {
    buf.clear();
    let n = r.read_until(b'\n', buf).map_err(|e| Error::io(path, e))?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
    }
    Ok(Some(n))
}

/// Reads the next document's bytes into `buf`: a line (ending stripped), or for
/// [`Format::Document`] the whole file, once (`read` says whether it was; an empty file is
/// one empty document, as training's folder reader takes it).
fn next_document(
    r: &mut impl BufRead,
    buf: &mut Vec<u8>,
    path: &Path,
    format: Format,
    read: &mut bool,
) -> Result<Option<usize>> {
    if format != Format::Document {
        return next_line(r, buf, path);
    }
    buf.clear();
    if std::mem::replace(read, true) {
        return Ok(None);
    }
    Ok(Some(std::io::Read::read_to_end(r, buf).map_err(|e| Error::io(path, e))?))
}

/// Calls `each` with every row of the Parquet file `path` from row `skip` on: its number and
/// the text of its column `field` (or why it has none) until `each` says stop; returns the
/// file's rows. Whole row groups before `skip` are not read.
fn parquet_rows(
    path: &Path,
    field: &str,
    skip: u64,
    each: &mut dyn FnMut(u64, std::result::Result<String, String>) -> Result<bool>,
) -> Result<u64> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::Field;
    use parquet::schema::types::Type;
    let bad = |e: parquet::errors::ParquetError| {
        Error::Data(format!("{}: not a readable Parquet file ({e})", path.display()))
    };
    let f = File::open(path).map_err(|e| Error::io(path, e))?;
    let r = SerializedFileReader::new(f).map_err(bad)?;
    let schema = r.metadata().file_metadata().schema();
    let Some(col) = schema.get_fields().iter().find(|t| t.name() == field) else {
        let names: Vec<&str> = schema.get_fields().iter().map(|t| t.name()).collect();
        return Err(Error::Data(format!(
            "{}: no column '{field}' (its columns: {}); choose the text column with --text-field",
            path.display(),
            names.join(", ")
        )));
    };
    let projection = Type::group_type_builder("schema").with_fields(vec![col.clone()]).build().map_err(bad)?;
    let total = r.metadata().file_metadata().num_rows() as u64;
    let mut first = 0u64;
    for g in 0..r.num_row_groups() {
        let n = r.metadata().row_group(g).num_rows() as u64;
        if first + n <= skip {
            first += n;
            continue;
        }
        let group = r.get_row_group(g).map_err(bad)?;
        for (k, row) in group.get_row_iter(Some(projection.clone())).map_err(bad)?.enumerate() {
            let i = first + k as u64;
            if i < skip {
                continue;
            }
            let text = match row.map_err(bad)?.get_column_iter().next().map(|(_, v)| v) {
                Some(Field::Str(t)) => Ok(t.clone()),
                Some(Field::Null) | None => Err(format!("column '{field}' is null")),
                Some(other) => Err(format!("column '{field}' holds {other}, not a string")),
            };
            if !each(i, text)? {
                return Ok(total);
            }
        }
        first += n;
    }
    Ok(total)
}

/// Scans every input file once: validates each line, hashes the bytes, cuts shards of
/// `shard_size` documents and refuses duplicate JSONL ids (naming both lines).
pub fn scan(spec: &InputSpec, shard_size: usize) -> Result<Index> {
    if spec.files.is_empty() {
        return Err(Error::Data("no input files; give one or more with --input".into()));
    }
    assert!(shard_size > 0);
    let mut files = Vec::new();
    let mut shards: Vec<ShardSpan> = Vec::new();
    let mut skipped = Vec::new();
    let mut documents = 0u64;
    let mut base = 0u64; // lines of the files before this one
    let mut ids: Vec<(u128, u32, u64)> = Vec::new();
    let mut buf = Vec::new();
    for (fi, path) in spec.files.iter().enumerate() {
        let name = path.display().to_string();
        let f = File::open(path).map_err(|e| {
            Error::Data(format!(
                "cannot open input {name}: {e}{}",
                if path.exists() { "" } else { " (check the path)" }
            ))
        })?;
        if f.metadata().map(|m| m.is_dir()).unwrap_or(false) {
            return Err(Error::Data(format!("input {name} is a directory; give files")));
        }
        let format = spec.format_of(fi);
        // one document (or a fault) at `offset` (a byte, or a Parquet row), the file's `line`
        let mut handle = |parsed: std::result::Result<Line, String>, offset: u64, line: u64| -> Result<()> {
            match parsed {
                Ok(Line::Doc(d)) => {
                    if documents.is_multiple_of(shard_size as u64) {
                        shards.push(ShardSpan { index: shards.len(), file: fi, offset, line, count: 0 });
                    }
                    shards.last_mut().unwrap().count += 1;
                    documents += 1;
                    if format == Format::Jsonl && spec.id_field.is_some() {
                        ids.push((
                            u128::from_le_bytes(blake3::hash(d.id.as_bytes()).as_bytes()[..16].try_into().unwrap()),
                            fi as u32,
                            line,
                        ));
                    }
                }
                Ok(Line::Blank) => {}
                Err(why) => {
                    if spec.on_error == OnError::Fail {
                        let what = if format == Format::Parquet { "row" } else { "line" };
                        return Err(Error::Data(format!(
                            "{name}:{}: {why}; fix the {what}, or pass --on-error skip to leave such {what}s out (they are listed in the manifest)",
                            line + 1
                        )));
                    }
                    skipped.push(Skipped { file: name.clone(), line: line + 1, reason: why });
                }
            }
            Ok(())
        };
        if format == Format::Parquet {
            let rows = parquet_rows(path, &spec.text_field, 0, &mut |row, text| {
                handle(text.map(|t| Line::Doc(Doc { id: (base + row).to_string(), text: t })), row, row)?;
                Ok(true)
            })?;
            let mut hasher = blake3::Hasher::new();
            let bytes = std::io::copy(&mut BufReader::new(f), &mut hasher).map_err(|e| Error::io(path, e))?;
            files.push(FileInfo {
                path: name,
                format,
                bytes,
                lines: rows,
                blake3: hasher.finalize().to_hex().to_string(),
            });
            base += rows;
            continue;
        }
        let mut r = BufReader::with_capacity(1 << 20, f);
        let mut hasher = blake3::Hasher::new();
        let (mut offset, mut line, mut read) = (0u64, 0u64, false);
        while let Some(n) = next_document(&mut r, &mut buf, path, format, &mut read)? {
            hasher.update(&buf);
            hasher.update(&b"\n"[..]);
            handle(parse(&buf, format, spec, base + line), offset, line)?;
            offset += n as u64;
            line += 1;
        }
        files.push(FileInfo {
            path: name,
            format,
            bytes: offset,
            lines: line,
            blake3: hasher.finalize().to_hex().to_string(),
        });
        base += line;
    }
    if documents == 0 {
        return Err(Error::Data(format!(
            "the input holds no documents ({} lines, {} skipped); give non-empty files",
            base,
            skipped.len()
        )));
    }
    check_unique(&mut ids, spec)?;
    Ok(Index { files, shards, documents, skipped })
}

/// Refuses the first id that two lines share (ids compared by a 128-bit hash).
fn check_unique(ids: &mut [(u128, u32, u64)], spec: &InputSpec) -> Result<()> {
    ids.sort_unstable();
    if let Some(w) = ids.windows(2).find(|w| w[0].0 == w[1].0) {
        let (a, b) = (w[0], w[1]);
        let id = read_doc_at(spec, a.1 as usize, a.2).map(|d| d.id).unwrap_or_default();
        return Err(Error::Data(format!(
            "duplicate id {id:?}: {}:{} and {}:{}; every document needs its own id",
            spec.files[a.1 as usize].display(),
            a.2 + 1,
            spec.files[b.1 as usize].display(),
            b.2 + 1
        )));
    }
    Ok(())
}

/// The document on 0-based `line` of file `fi` (for error messages).
fn read_doc_at(spec: &InputSpec, fi: usize, line: u64) -> Option<Doc> {
    let path = &spec.files[fi];
    let mut r = BufReader::new(File::open(path).ok()?);
    let mut buf = Vec::new();
    for _ in 0..=line {
        next_line(&mut r, &mut buf, path).ok()??;
    }
    match parse(&buf, spec.format_of(fi), spec, 0) {
        Ok(Line::Doc(d)) => Some(d),
        _ => None,
    }
}

/// Reads shard `s`'s documents, in input order, from its files' bytes only. The input must be
/// the one scanned (its files are checked against the index's sizes).
pub fn read_shard(spec: &InputSpec, index: &Index, s: &ShardSpan) -> Result<Vec<Doc>> {
    let mut docs = Vec::with_capacity(s.count);
    let mut buf = Vec::new();
    let (mut fi, mut offset, mut line) = (s.file, s.offset, s.line);
    while docs.len() < s.count {
        let path = spec.files.get(fi).ok_or_else(|| {
            Error::Data(format!(
                "shard {} runs past the last input file; did the input change during the job?",
                s.index
            ))
        })?;
        let mut f = File::open(path).map_err(|e| Error::io(path, e))?;
        let len = f.metadata().map_err(|e| Error::io(path, e))?.len();
        if len != index.files[fi].bytes {
            return Err(Error::Data(format!(
                "{} changed since the job started ({} bytes, was {}); start the job again",
                path.display(),
                len,
                index.files[fi].bytes
            )));
        }
        let base: u64 = index.files[..fi].iter().map(|f| f.lines).sum();
        let format = spec.format_of(fi);
        if format == Format::Parquet {
            parquet_rows(path, &spec.text_field, offset, &mut |row, text| {
                if let Ok(text) = text {
                    docs.push(Doc { id: (base + row).to_string(), text });
                }
                Ok(docs.len() < s.count)
            })?;
            (fi, offset, line) = (fi + 1, 0, 0);
            continue;
        }
        f.seek(SeekFrom::Start(offset)).map_err(|e| Error::io(path, e))?;
        let mut r = BufReader::with_capacity(1 << 20, f);
        let mut read = false;
        while docs.len() < s.count {
            if next_document(&mut r, &mut buf, path, format, &mut read)?.is_none() {
                break;
            }
            if let Ok(Line::Doc(d)) = parse(&buf, format, spec, base + line) {
                docs.push(d);
            }
            line += 1;
        }
        (fi, offset, line) = (fi + 1, 0, 0);
    }
    Ok(docs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn spec(files: Vec<PathBuf>, on_error: OnError) -> InputSpec {
        InputSpec { files, format: None, id_field: Some("id".into()), text_field: "text".into(), on_error }
    }

    fn write(dir: &Path, name: &str, body: &[u8]) -> PathBuf {
        let p = dir.join(name);
        File::create(&p).unwrap().write_all(body).unwrap();
        p
    }

    #[test]
    fn shards_cover_every_document_once_across_files() {
        let d = tempfile::tempdir().unwrap();
        let a = write(d.path(), "a.txt", b"\xef\xbb\xbfzero\none\r\n\nthree\n");
        let b = write(
            d.path(),
            "b.jsonl",
            b"\xef\xbb\xbf{\"id\": \"x\", \"text\": \"ex\"}\n\n{\"id\": 7, \"text\": \"seven\"}",
        );
        let c = write(d.path(), "c.txt", b"last, no newline");
        let sp = spec(vec![a, b, c], OnError::Fail);
        for size in 1..8 {
            let idx = scan(&sp, size).unwrap();
            assert_eq!(idx.documents, 7);
            let docs: Vec<Doc> = idx.shards.iter().flat_map(|s| read_shard(&sp, &idx, s).unwrap()).collect();
            let ids: Vec<&str> = docs.iter().map(|d| d.id.as_str()).collect();
            // text ids are global line numbers: a.txt has lines 0..4, b.jsonl 4..7, c.txt 7
            assert_eq!(ids, ["0", "1", "2", "3", "x", "7", "7"]);
            assert_eq!(docs[0].text, "zero", "the byte-order mark is dropped");
            assert_eq!(docs[1].text, "one");
            assert_eq!(docs[2].text, "");
            assert_eq!(docs[6].text, "last, no newline");
            assert!(idx.shards.iter().all(|s| s.count <= size));
        }
    }

    #[test]
    fn a_whole_file_is_one_document_even_empty_and_jsonl_ids_may_be_line_numbers() {
        let d = tempfile::tempdir().unwrap();
        let a = write(d.path(), "a.txt", b"\xef\xbb\xbfline one\nline two\n");
        let b = write(d.path(), "b.txt", b"");
        let c = write(d.path(), "c.txt", b"third");
        let mut sp = spec(vec![a, b, c], OnError::Fail);
        sp.format = Some(Format::Document);
        for size in 1..4 {
            let idx = scan(&sp, size).unwrap();
            assert_eq!((idx.documents, idx.files.iter().map(|f| f.lines).sum::<u64>()), (3, 3));
            let docs: Vec<Doc> = idx.shards.iter().flat_map(|s| read_shard(&sp, &idx, s).unwrap()).collect();
            let texts: Vec<&str> = docs.iter().map(|d| d.text.as_str()).collect();
            assert_eq!(texts, ["line one\nline two\n", "", "third"], "shards of {size}");
        }
        let j = write(d.path(), "j.jsonl", b"{\"text\": \"x\"}\n{\"text\": \"y\"}\n");
        let mut sp = spec(vec![j], OnError::Fail);
        sp.id_field = None;
        let idx = scan(&sp, 10).unwrap();
        let ids: Vec<String> = read_shard(&sp, &idx, &idx.shards[0]).unwrap().into_iter().map(|d| d.id).collect();
        assert_eq!(ids, ["0", "1"]);
    }

    #[test]
    fn faults_name_file_and_line_and_skip_lists_them() {
        let d = tempfile::tempdir().unwrap();
        let a = write(
            d.path(),
            "a.jsonl",
            b"{\"id\": 1, \"text\": \"a\"}\n{\"id\": 2, \"text\": \n{\"id\": 3, \"txt\": \"c\"}\n",
        );
        let b = write(d.path(), "b.txt", b"ok\n\xff\xfebad\n");
        let e = scan(&spec(vec![a.clone(), b.clone()], OnError::Fail), 10).unwrap_err().to_string();
        assert!(e.contains("a.jsonl:2: malformed JSON"), "{e}");
        let idx = scan(&spec(vec![a, b], OnError::Skip), 10).unwrap();
        assert_eq!(idx.documents, 2);
        let where_: Vec<(String, u64)> = idx
            .skipped
            .iter()
            .map(|s| (Path::new(&s.file).file_name().unwrap().to_string_lossy().into_owned(), s.line))
            .collect();
        assert_eq!(where_, [("a.jsonl".into(), 2), ("a.jsonl".into(), 3), ("b.txt".into(), 2)]);
        assert!(idx.skipped[1].reason.contains("no 'text' field"));
        assert!(idx.skipped[2].reason.contains("invalid UTF-8"));
    }

    #[test]
    fn duplicate_ids_are_refused_naming_both_lines() {
        let d = tempfile::tempdir().unwrap();
        let a = write(d.path(), "a.jsonl", b"{\"id\": \"p\", \"text\": \"a\"}\n{\"id\": \"q\", \"text\": \"b\"}\n");
        let b = write(d.path(), "b.jsonl", b"{\"id\": \"r\", \"text\": \"a\"}\n{\"id\": \"q\", \"text\": \"b\"}\n");
        let e = scan(&spec(vec![a, b], OnError::Skip), 10).unwrap_err().to_string();
        assert!(e.contains("duplicate id \"q\"") && e.contains("a.jsonl:2") && e.contains("b.jsonl:2"), "{e}");
    }

    #[test]
    fn empty_or_missing_input_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let a = write(d.path(), "a.txt", b"");
        assert!(scan(&spec(vec![a], OnError::Fail), 10).unwrap_err().to_string().contains("no documents"));
        let e = scan(&spec(vec![d.path().join("nope.txt")], OnError::Fail), 10).unwrap_err().to_string();
        assert!(e.contains("nope.txt") && e.contains("check the path"), "{e}");
    }
}
