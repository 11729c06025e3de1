//! The output directory: `shard-NNNNN.npy` + `shard-NNNNN.ids` per shard and `manifest.json`.
//!
//! A shard is written to temporary names, then its statistics, then renamed: `.npy` first,
//! `.ids` last, so a shard is complete exactly when its `.ids` file exists. A job's identity
//! (model, input, settings) is in `manifest.json` from its start, so a directory never mixes
//! two jobs' vectors; at the end the manifest lists every shard with its checksums and the
//! temporary files are gone.

use super::corpus::{FileInfo, InputSpec, Skipped};
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

pub const MANIFEST: &str = "manifest.json";
const FORMAT: &str = "brigade-embed/1";

/// Which model made the vectors.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    pub name: String,
    pub weights_blake3: String,
    pub dimension: usize,
    pub pooling: String,
    pub normalize: bool,
    pub max_seq_length: usize,
}

/// Everything that decides a job's output: two runs with equal `Job`s write identical bytes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub model: ModelInfo,
    pub input: Vec<FileInfo>,
    pub format: Option<super::corpus::Format>,
    pub id_field: String,
    pub text_field: String,
    pub on_error: super::corpus::OnError,
    pub shard_size: usize,
    pub max_batch_tokens: usize,
}

impl Job {
    pub fn new(
        model: ModelInfo,
        input: Vec<FileInfo>,
        spec: &InputSpec,
        shard_size: usize,
        max_batch_tokens: usize,
    ) -> Job {
        Job {
            model,
            input,
            format: spec.format,
            id_field: spec.id_field.clone(),
            text_field: spec.text_field.clone(),
            on_error: spec.on_error,
            shard_size,
            max_batch_tokens,
        }
    }

    /// What differs from another job, in words.
    fn differences(&self, other: &Job) -> Vec<&'static str> {
        let mut d = Vec::new();
        if self.model != other.model {
            d.push("model");
        }
        if self.input != other.input {
            d.push("input files");
        }
        if (&self.format, &self.id_field, &self.text_field, self.on_error, self.shard_size, self.max_batch_tokens)
            != (
                &other.format,
                &other.id_field,
                &other.text_field,
                other.on_error,
                other.shard_size,
                other.max_batch_tokens,
            )
        {
            d.push("settings");
        }
        d
    }
}

/// What one shard holds, written beside it until the manifest takes it over.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardStats {
    pub count: usize,
    pub tokens: u64,
    pub truncated: u64,
    pub empty: u64,
    pub sha256: String,
    pub ids_sha256: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardEntry {
    pub index: usize,
    pub embeddings: String,
    pub ids: String,
    pub count: usize,
    pub sha256: String,
    pub ids_sha256: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    pub documents: u64,
    pub tokens: u64,
    pub truncated: u64,
    pub empty: u64,
    pub skipped: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub complete: bool,
    pub job: Job,
    pub totals: Totals,
    pub skipped: Vec<Skipped>,
    pub shards: Vec<ShardEntry>,
}

pub fn npy_name(i: usize) -> String {
    format!("shard-{i:05}.npy")
}
pub fn ids_name(i: usize) -> String {
    format!("shard-{i:05}.ids")
}
fn stats_name(i: usize) -> String {
    format!("shard-{i:05}.stats.json")
}
fn claim_name(i: usize) -> String {
    format!("shard-{i:05}.claim")
}

/// What a file in the output directory is.
#[derive(Debug, PartialEq)]
enum Kind {
    Manifest,
    /// A shard's final file, its statistics, or its claim.
    Shard(usize, &'static str),
    Temporary,
    Foreign,
}

fn kind(name: &str) -> Kind {
    if name == MANIFEST {
        return Kind::Manifest;
    }
    if name.ends_with(".tmp") && (name.starts_with("shard-") || name.starts_with(MANIFEST)) {
        return Kind::Temporary;
    }
    let Some(rest) = name.strip_prefix("shard-") else { return Kind::Foreign };
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let Ok(i) = digits.parse::<usize>() else { return Kind::Foreign };
    match &rest[digits.len()..] {
        ".npy" => Kind::Shard(i, "npy"),
        ".ids" => Kind::Shard(i, "ids"),
        ".stats.json" => Kind::Shard(i, "stats"),
        ".claim" => Kind::Shard(i, "claim"),
        _ => Kind::Foreign,
    }
}

fn entries(dir: &Path) -> Result<Vec<String>> {
    let mut v = Vec::new();
    for e in fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let e = e.map_err(|e| Error::io(dir, e))?;
        v.push(e.file_name().to_string_lossy().into_owned());
    }
    v.sort();
    Ok(v)
}

fn remove(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(path, e)),
        _ => Ok(()),
    }
}

/// Writes `bytes` to `path` through a temporary file and a rename (never half-written).
/// A failed write leaves no temporary file behind.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = PathBuf::from(format!("{}.tmp", path.display()));
    let mut f = fs::File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let written = f.write_all(bytes).and_then(|_| f.sync_all()).map_err(|e| Error::io(&tmp, e));
    let done = written.and_then(|_| fs::rename(&tmp, path).map_err(|e| Error::io(path, e)));
    if done.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    done
}

pub fn read_manifest(dir: &Path) -> Result<Manifest> {
    let path = dir.join(MANIFEST);
    if !path.is_file() {
        return Err(Error::Data(format!(
            "{} is not a brigade embed output (no manifest.json); give the --output directory of an embedding job",
            dir.display()
        )));
    }
    let text = fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    serde_json::from_str(&text)
        .map_err(|e| Error::Data(format!("{}: not a brigade embed manifest ({e})", path.display())))
}

/// Where a job stands when it starts.
#[derive(Debug, PartialEq)]
pub enum Start {
    /// Nothing to do: a complete output of this very job is there.
    Complete(Box<Manifest>),
    /// Shards still to embed (finished ones are skipped).
    Run { done: Vec<usize> },
}

/// Readies `dir` for `job`: creates it, or resumes this job there (temporary files of killed
/// runs removed, unfinished shards cleared), or — another job's output — refuses unless
/// `overwrite`, which removes that job's files. Files brigade did not write are never touched.
pub fn prepare(dir: &Path, job: &Job, overwrite: bool) -> Result<Start> {
    if dir.exists() && !dir.is_dir() {
        return Err(Error::Data(format!("--output {} is a file; give a directory", dir.display())));
    }
    fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let names = entries(dir)?;
    if let Some(f) = names.iter().find(|n| kind(n) == Kind::Foreign) {
        return Err(Error::Data(format!(
            "output directory {} holds files brigade embed did not write (e.g. {f}); give an empty or new directory",
            dir.display()
        )));
    }
    let has_manifest = names.iter().any(|n| n == MANIFEST);
    let mut ours = has_manifest;
    if has_manifest {
        let old = read_manifest(dir);
        let why = match &old {
            Ok(m) if m.format == FORMAT && m.job == *job => None,
            Ok(m) => Some(format!("another job's vectors (its {} differ)", m.job.differences(job).join(", "))),
            Err(e) => Some(format!("a manifest this job cannot read ({e})")),
        };
        match why {
            None if old.as_ref().unwrap().complete => {
                clear(dir, &names, |k| matches!(k, Kind::Temporary | Kind::Shard(_, "stats" | "claim")))?;
                return Ok(Start::Complete(Box::new(old.unwrap())));
            }
            None => {}
            Some(why) if !overwrite => {
                return Err(Error::Data(format!(
                    "output directory {} holds {why}; choose another --output, or pass --overwrite to replace them",
                    dir.display()
                )))
            }
            Some(_) => ours = false,
        }
    } else if !names.is_empty() && !overwrite {
        return Err(Error::Data(format!(
            "output directory {} holds shard files but no manifest.json (a job that never started properly, or files copied in); pass --overwrite to replace them",
            dir.display()
        )));
    }
    if !ours {
        clear(dir, &names, |_| true)?;
    }
    // a shard is finished when its .ids, .npy and statistics are all there; clear the rest
    let names = entries(dir)?;
    let mut parts: std::collections::BTreeMap<usize, Vec<&str>> = std::collections::BTreeMap::new();
    for n in &names {
        if let Kind::Shard(i, part) = kind(n) {
            parts.entry(i).or_default().push(part);
        }
    }
    let finished = |p: &Vec<&str>| ["ids", "npy", "stats"].iter().all(|f| p.contains(f));
    let done: Vec<usize> = parts.iter().filter(|(_, p)| finished(p)).map(|(&i, _)| i).collect();
    clear(dir, &names, |k| match k {
        Kind::Temporary | Kind::Shard(_, "claim") => true,
        Kind::Shard(i, _) => !finished(&parts[i]),
        _ => false,
    })?;
    let started = Manifest {
        format: FORMAT.into(),
        complete: false,
        job: job.clone(),
        totals: Totals::default(),
        skipped: vec![],
        shards: vec![],
    };
    write_atomic(&dir.join(MANIFEST), &serde_json::to_vec_pretty(&started).unwrap())?;
    Ok(Start::Run { done })
}

fn clear(dir: &Path, names: &[String], pick: impl Fn(&Kind) -> bool) -> Result<()> {
    for n in names {
        let k = kind(n);
        if k != Kind::Foreign && pick(&k) {
            remove(&dir.join(n))?;
        }
    }
    Ok(())
}

/// Takes shard `i` for this worker: false when another worker (thread, rank or machine sharing
/// the directory) has it, or it is finished.
pub fn claim(dir: &Path, i: usize) -> Result<bool> {
    if dir.join(ids_name(i)).exists() {
        return Ok(false);
    }
    let path = dir.join(claim_name(i));
    match fs::OpenOptions::new().write(true).create_new(true).open(&path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(Error::io(path, e)),
    }
}

/// Test hook: `BRIGADE_EMBED_CRASH=<point>:<shard>` aborts the process at that point of that
/// shard's commit, as a SIGKILL would, so tests can hit each window exactly.
fn crash_point(point: &str, i: usize) {
    if let Ok(v) = std::env::var("BRIGADE_EMBED_CRASH") {
        if v == format!("{point}:{i}") {
            std::process::abort();
        }
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = fs::File::create(path).map_err(|e| Error::io(path, e))?;
    f.write_all(bytes).and_then(|_| f.sync_all()).map_err(|e| Error::io(path, e))
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes shard `i` (vectors `[ids.len(), dim]` and ids, in input order) and commits it.
pub fn commit_shard(
    dir: &Path,
    i: usize,
    vectors: &[f32],
    dim: usize,
    ids: &[String],
    mut stats: ShardStats,
) -> Result<()> {
    let mut npy = Vec::with_capacity(128 + vectors.len() * 4);
    super::npy::write(&mut npy, vectors, ids.len(), dim).expect("writing to memory");
    let mut idtext = String::with_capacity(ids.iter().map(|s| s.len() + 1).sum());
    for id in ids {
        idtext.push_str(id);
        idtext.push('\n');
    }
    stats.count = ids.len();
    stats.sha256 = sha256(&npy);
    stats.ids_sha256 = sha256(idtext.as_bytes());
    let (npy_tmp, ids_tmp) = (dir.join(format!("{}.tmp", npy_name(i))), dir.join(format!("{}.tmp", ids_name(i))));
    write_synced(&npy_tmp, &npy)?;
    crash_point("npy-written", i);
    write_synced(&ids_tmp, idtext.as_bytes())?;
    write_atomic(&dir.join(stats_name(i)), &serde_json::to_vec(&stats).unwrap())?;
    crash_point("stats-written", i);
    fs::rename(&npy_tmp, dir.join(npy_name(i))).map_err(|e| Error::io(&npy_tmp, e))?;
    crash_point("npy-renamed", i);
    fs::rename(&ids_tmp, dir.join(ids_name(i))).map_err(|e| Error::io(&ids_tmp, e))?;
    crash_point("committed", i);
    remove(&dir.join(claim_name(i)))
}

/// Once every shard is committed: the final manifest, then the statistics files go.
pub fn finish(dir: &Path, job: &Job, shards: usize, skipped: &[Skipped]) -> Result<Manifest> {
    let mut m = Manifest {
        format: FORMAT.into(),
        complete: true,
        job: job.clone(),
        totals: Totals { skipped: skipped.len() as u64, ..Totals::default() },
        skipped: skipped.to_vec(),
        shards: Vec::with_capacity(shards),
    };
    for i in 0..shards {
        let path = dir.join(stats_name(i));
        let s: ShardStats = fs::read(&path).ok().and_then(|b| serde_json::from_slice(&b).ok()).ok_or_else(|| {
            Error::Data(format!("shard {i} is not finished ({} missing or unreadable)", path.display()))
        })?;
        m.totals.documents += s.count as u64;
        m.totals.tokens += s.tokens;
        m.totals.truncated += s.truncated;
        m.totals.empty += s.empty;
        m.shards.push(ShardEntry {
            index: i,
            embeddings: npy_name(i),
            ids: ids_name(i),
            count: s.count,
            sha256: s.sha256,
            ids_sha256: s.ids_sha256,
        });
    }
    crash_point("before-manifest", 0);
    write_atomic(&dir.join(MANIFEST), &serde_json::to_vec_pretty(&m).unwrap())?;
    crash_point("manifest-written", 0);
    for i in 0..shards {
        remove(&dir.join(stats_name(i)))?;
    }
    Ok(m)
}

/// Re-checks a finished output: every shard's checksums, shapes and id counts, no id missing
/// or twice, no stray file. Returns the manifest, or every problem found, one a line.
pub fn verify(dir: &Path) -> Result<Manifest> {
    let m = read_manifest(dir)?;
    let mut problems = Vec::new();
    if !m.complete {
        problems.push(
            "the job has not finished (manifest says complete: false); run the same command again to finish it"
                .to_string(),
        );
    }
    let mut seen = std::collections::HashSet::new();
    let mut duplicates = Vec::new();
    let mut total = 0u64;
    for s in &m.shards {
        let (np, ip) = (dir.join(&s.embeddings), dir.join(&s.ids));
        let (Ok(nb), Ok(ib)) = (fs::read(&np), fs::read(&ip)) else {
            problems.push(format!("shard {}: {} or {} is missing", s.index, s.embeddings, s.ids));
            continue;
        };
        if sha256(&nb) != s.sha256 {
            problems
                .push(format!("shard {}: {} does not match its sha256 (changed or corrupt)", s.index, s.embeddings));
        }
        if sha256(&ib) != s.ids_sha256 {
            problems.push(format!("shard {}: {} does not match its sha256 (changed or corrupt)", s.index, s.ids));
        }
        match super::npy::read(&nb) {
            Ok((r, c, _)) if r == s.count && c == m.job.model.dimension => {}
            Ok((r, c, _)) => problems.push(format!(
                "shard {}: {} is {r}×{c}, the manifest says {}×{}",
                s.index, s.embeddings, s.count, m.job.model.dimension
            )),
            Err(e) => problems.push(format!("shard {}: {}: {e}", s.index, s.embeddings)),
        }
        let text = String::from_utf8_lossy(&ib);
        let ids: Vec<&str> = text.lines().collect();
        if ids.len() != s.count {
            problems.push(format!(
                "shard {}: {} holds {} ids, the manifest says {}",
                s.index,
                s.ids,
                ids.len(),
                s.count
            ));
        }
        for id in ids {
            if !seen.insert(id.to_string()) && duplicates.len() < 5 {
                duplicates.push(id.to_string());
            }
        }
        total += s.count as u64;
    }
    if !duplicates.is_empty() {
        problems.push(format!("ids appear twice: {}", duplicates.join(", ")));
    }
    if total != m.totals.documents {
        problems.push(format!("shards hold {total} documents, the manifest's total is {}", m.totals.documents));
    }
    // plain-text ids are line numbers: every line not skipped must be there
    if m.complete && m.job.input.iter().all(|f| f.format == super::corpus::Format::Text) {
        let lines: u64 = m.job.input.iter().map(|f| f.lines).sum();
        let want = lines.saturating_sub(m.skipped.len() as u64);
        if want != total {
            problems.push(format!("the input had {want} documents (lines not skipped), the shards hold {total}"));
        }
        let skipped_ids = skipped_line_ids(&m);
        let missing: Vec<String> = (0..lines)
            .map(|i| i.to_string())
            .filter(|i| !seen.contains(i) && !skipped_ids.contains(i))
            .take(5)
            .collect();
        if !missing.is_empty() {
            problems.push(format!("ids missing: {}", missing.join(", ")));
        }
    }
    let listed: std::collections::HashSet<String> =
        m.shards.iter().flat_map(|s| [s.embeddings.clone(), s.ids.clone()]).chain([MANIFEST.to_string()]).collect();
    for n in entries(dir)? {
        if !listed.contains(&n) {
            problems.push(format!("{n} is not part of the output (left by an interrupted run, or added)"));
        }
    }
    if problems.is_empty() {
        Ok(m)
    } else {
        Err(Error::Data(format!("{} failed verification:\n  {}", dir.display(), problems.join("\n  "))))
    }
}

/// Global line numbers (plain-text ids) of the skipped lines.
fn skipped_line_ids(m: &Manifest) -> std::collections::HashSet<String> {
    let mut base = std::collections::HashMap::new();
    let mut acc = 0u64;
    for f in &m.job.input {
        base.insert(f.path.clone(), acc);
        acc += f.lines;
    }
    m.skipped.iter().map(|s| (base.get(&s.file).copied().unwrap_or(0) + s.line.saturating_sub(1)).to_string()).collect()
}
