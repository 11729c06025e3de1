//! The output directory of a sharded job: `shard-NNNNN<part>` files per shard and
//! `manifest.json`, written so that a killed job resumes with nothing lost or doubled and a
//! directory never mixes two jobs' output. `brigade embed` and `brigade tokenize` both write
//! through it; a [`Layout`] says which files a shard is.
//!
//! A shard's parts are written to temporary names, then its statistics, then renamed in order,
//! the last part last, so a shard is complete exactly when its last part exists. A job's
//! identity is in `manifest.json` from its start; at the end the manifest lists every shard
//! (the tool builds it from the statistics) and the temporary files are gone.

use crate::{Error, Result};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

pub const MANIFEST: &str = "manifest.json";

/// What one tool's output directory holds.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// The command that writes it ("brigade embed"), for messages.
    pub tool: &'static str,
    /// What its shards hold ("vectors"), for messages.
    pub what: &'static str,
    /// The manifest's `format`: another value is another job's output.
    pub format: &'static str,
    /// A shard's files by suffix, in the order they are renamed into place: the last one's
    /// presence means the shard is committed.
    pub parts: &'static [&'static str],
    /// The test hook: `VAR=<point>:<shard>` aborts the process there, as a SIGKILL would.
    pub crash_env: &'static str,
}

/// A finished (or begun) job's manifest: its identity `job`, its `totals`, the documents left
/// out, and an entry `E` per shard. Each tool names its own `J`, `T` and `E`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest<J, T, E> {
    pub format: String,
    pub complete: bool,
    pub job: J,
    pub totals: T,
    pub skipped: Vec<super::input::Skipped>,
    pub shards: Vec<E>,
}

impl<J, T: Default, E> Manifest<J, T, E> {
    /// The manifest of `job` begun (`complete: false`, nothing counted) or finished with
    /// `skipped` left out (its shards and totals to be filled in).
    pub fn of(layout: &Layout, job: J, complete: bool, skipped: &[super::input::Skipped]) -> Self {
        Manifest {
            format: layout.format.into(),
            complete,
            job,
            totals: T::default(),
            skipped: skipped.to_vec(),
            shards: vec![],
        }
    }
}

/// The first fields of every manifest: enough to tell whose output a directory holds.
#[derive(Deserialize)]
struct Head {
    format: String,
    complete: bool,
    /// Read as the tool's job only once the format is known to be its.
    job: serde_json::Value,
}

impl Layout {
    /// Shard `i`'s file for `part` (one of `parts`, or `.stats.json` / `.claim`).
    pub fn name(&self, i: usize, part: &str) -> String {
        format!("shard-{i:05}{part}")
    }

    fn stats_name(&self, i: usize) -> String {
        self.name(i, ".stats.json")
    }

    fn claim_name(&self, i: usize) -> String {
        self.name(i, ".claim")
    }

    fn kind(&self, name: &str) -> Kind {
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
            ".stats.json" => Kind::Shard(i, Part::Stats),
            ".claim" => Kind::Shard(i, Part::Claim),
            p => match self.parts.iter().position(|q| *q == p) {
                Some(k) => Kind::Shard(i, Part::Data(k)),
                None => Kind::Foreign,
            },
        }
    }

    fn crash_point(&self, point: &str, i: usize) {
        if let Ok(v) = std::env::var(self.crash_env) {
            if v == format!("{point}:{i}") {
                std::process::abort();
            }
        }
    }

    /// The name of the first part without its dot ("npy"), for crash points.
    fn first(&self) -> &str {
        self.parts[0].trim_start_matches('.')
    }
}

/// A file of a shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    Data(usize),
    Stats,
    Claim,
}

/// What a file in the output directory is.
#[derive(Debug, PartialEq)]
enum Kind {
    Manifest,
    Shard(usize, Part),
    Temporary,
    Foreign,
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

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = fs::File::create(path).map_err(|e| Error::io(path, e))?;
    f.write_all(bytes).and_then(|_| f.sync_all()).map_err(|e| Error::io(path, e))
}

pub fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// The manifest in `dir`, or a refusal naming what `dir` is not.
pub fn read_manifest<M: DeserializeOwned>(dir: &Path, layout: &Layout) -> Result<M> {
    let path = dir.join(MANIFEST);
    if !path.is_file() {
        return Err(Error::Data(format!(
            "{} is not a {} output (no manifest.json); give the --output directory of a `{}` job",
            dir.display(),
            layout.tool,
            layout.tool
        )));
    }
    let text = fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    serde_json::from_str(&text)
        .map_err(|e| Error::Data(format!("{}: not a {} manifest ({e})", path.display(), layout.tool)))
}

/// Where a job stands when it starts.
#[derive(Debug, PartialEq)]
pub enum Start {
    /// Nothing to do: a complete output of this very job is there.
    Complete,
    /// Shards still to do (finished ones are skipped).
    Run { done: Vec<usize> },
}

/// Readies `dir` for `job`: creates it, or resumes this job there (temporary files of killed
/// runs removed, unfinished shards cleared), or — another job's output — refuses unless
/// `overwrite`, which removes that job's files. Files the tool did not write are never
/// touched. `started` is the manifest of the job begun (complete: false), written on a run;
/// `differences` names what sets two jobs apart.
pub fn prepare<J: DeserializeOwned + PartialEq>(
    dir: &Path,
    layout: &Layout,
    job: &J,
    differences: impl Fn(&J, &J) -> Vec<&'static str>,
    started: &impl Serialize,
    overwrite: bool,
) -> Result<Start> {
    if dir.exists() && !dir.is_dir() {
        return Err(Error::Data(format!("--output {} is a file; give a directory", dir.display())));
    }
    fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let names = entries(dir)?;
    if let Some(f) = names.iter().find(|n| layout.kind(n) == Kind::Foreign) {
        return Err(Error::Data(format!(
            "output directory {} holds files {} did not write (e.g. {f}); give an empty or new directory",
            dir.display(),
            layout.tool
        )));
    }
    let has_manifest = names.iter().any(|n| n == MANIFEST);
    let mut ours = has_manifest;
    if has_manifest {
        let old = read_manifest::<Head>(dir, layout);
        let why = match &old {
            Ok(m) if m.format != layout.format => {
                Some(format!("another job's {} (format {}, this one writes {})", layout.what, m.format, layout.format))
            }
            Ok(m) => match serde_json::from_value::<J>(m.job.clone()) {
                Ok(j) if j == *job => None,
                Ok(j) => {
                    Some(format!("another job's {} (its {} differ)", layout.what, differences(&j, job).join(", ")))
                }
                Err(e) => Some(format!("a manifest this job cannot read ({e})")),
            },
            Err(e) => Some(format!("a manifest this job cannot read ({e})")),
        };
        match why {
            None if old.as_ref().is_ok_and(|m| m.complete) => {
                clear(dir, layout, &names, |k| {
                    matches!(k, Kind::Temporary | Kind::Shard(_, Part::Stats | Part::Claim))
                })?;
                return Ok(Start::Complete);
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
        clear(dir, layout, &names, |_| true)?;
    }
    // a shard is finished when all its parts and its statistics are there; clear the rest
    let names = entries(dir)?;
    let mut parts: BTreeMap<usize, Vec<Part>> = BTreeMap::new();
    for n in &names {
        if let Kind::Shard(i, part) = layout.kind(n) {
            parts.entry(i).or_default().push(part);
        }
    }
    let finished =
        |p: &Vec<Part>| p.contains(&Part::Stats) && (0..layout.parts.len()).all(|k| p.contains(&Part::Data(k)));
    let done: Vec<usize> = parts.iter().filter(|(_, p)| finished(p)).map(|(&i, _)| i).collect();
    clear(dir, layout, &names, |k| match k {
        Kind::Temporary | Kind::Shard(_, Part::Claim) => true,
        Kind::Shard(i, _) => !finished(&parts[i]),
        _ => false,
    })?;
    write_atomic(&dir.join(MANIFEST), &serde_json::to_vec_pretty(started).expect("manifests serialise"))?;
    Ok(Start::Run { done })
}

fn clear(dir: &Path, layout: &Layout, names: &[String], pick: impl Fn(&Kind) -> bool) -> Result<()> {
    for n in names {
        let k = layout.kind(n);
        if k != Kind::Foreign && pick(&k) {
            remove(&dir.join(n))?;
        }
    }
    Ok(())
}

/// Takes shard `i` for this worker: false when another worker (thread, rank or machine sharing
/// the directory) has it, or it is finished.
pub fn claim(dir: &Path, layout: &Layout, i: usize) -> Result<bool> {
    if dir.join(layout.name(i, layout.parts.last().expect("a shard has parts"))).exists() {
        return Ok(false);
    }
    let path = dir.join(layout.claim_name(i));
    match fs::OpenOptions::new().write(true).create_new(true).open(&path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(Error::io(path, e)),
    }
}

/// Writes shard `i`'s parts (the bytes of each of `layout.parts`, in order) and its statistics,
/// and commits it. Crash points (`layout.crash_env`): `<first part>-written`, `stats-written`,
/// `<first part>-renamed`, `committed`.
pub fn commit(dir: &Path, layout: &Layout, i: usize, parts: &[&[u8]], stats: &impl Serialize) -> Result<()> {
    assert_eq!(parts.len(), layout.parts.len(), "one buffer a part");
    let tmp: Vec<PathBuf> = layout.parts.iter().map(|p| dir.join(format!("{}.tmp", layout.name(i, p)))).collect();
    for (k, (path, bytes)) in tmp.iter().zip(parts).enumerate() {
        write_synced(path, bytes)?;
        if k == 0 {
            layout.crash_point(&format!("{}-written", layout.first()), i);
        }
    }
    write_atomic(&dir.join(layout.stats_name(i)), &serde_json::to_vec(stats).expect("statistics serialise"))?;
    layout.crash_point("stats-written", i);
    for (k, (path, part)) in tmp.iter().zip(layout.parts).enumerate() {
        fs::rename(path, dir.join(layout.name(i, part))).map_err(|e| Error::io(path, e))?;
        if k == 0 {
            layout.crash_point(&format!("{}-renamed", layout.first()), i);
        }
    }
    layout.crash_point("committed", i);
    remove(&dir.join(layout.claim_name(i)))
}

/// The statistics of shards `0..shards`, once every one is committed.
pub fn shard_stats<S: DeserializeOwned>(dir: &Path, layout: &Layout, shards: usize) -> Result<Vec<S>> {
    (0..shards)
        .map(|i| {
            let path = dir.join(layout.stats_name(i));
            fs::read(&path).ok().and_then(|b| serde_json::from_slice(&b).ok()).ok_or_else(|| {
                Error::Data(format!("shard {i} is not finished ({} missing or unreadable)", path.display()))
            })
        })
        .collect()
}

/// Writes the final manifest (built from [`shard_stats`]), then removes the statistics.
pub fn finish(dir: &Path, layout: &Layout, manifest: &impl Serialize, shards: usize) -> Result<()> {
    layout.crash_point("before-manifest", 0);
    write_atomic(&dir.join(MANIFEST), &serde_json::to_vec_pretty(manifest).expect("manifests serialise"))?;
    layout.crash_point("manifest-written", 0);
    for i in 0..shards {
        remove(&dir.join(layout.stats_name(i)))?;
    }
    Ok(())
}

/// The files in `dir` that are neither the manifest nor `listed` (for `--verify`).
pub fn strays(dir: &Path, listed: &HashSet<String>) -> Result<Vec<String>> {
    Ok(entries(dir)?.into_iter().filter(|n| n != MANIFEST && !listed.contains(n)).collect())
}

#[cfg(test)]
mod tests {
    //! The protocol, file by file, on a layout of three parts (embed's two-part one is tested
    //! through `embed::output`).
    use super::*;

    const L: Layout =
        Layout { tool: "t", what: "things", format: "t/1", parts: &[".a", ".b", ".c"], crash_env: "BRIGADE_T_CRASH" };

    #[derive(Serialize, Deserialize, PartialEq, Clone, Debug)]
    struct J {
        n: u32,
    }

    #[derive(Serialize)]
    struct M<'a> {
        format: &'a str,
        complete: bool,
        job: &'a J,
    }

    fn start(dir: &Path, j: &J, overwrite: bool) -> Result<Start> {
        let m = M { format: L.format, complete: false, job: j };
        prepare(dir, &L, j, |_, _| vec!["n"], &m, overwrite)
    }

    fn put(dir: &Path, i: usize) {
        assert!(claim(dir, &L, i).unwrap());
        commit(dir, &L, i, &[b"a", b"b", b"c"], &i).unwrap();
    }

    #[test]
    fn names_are_known_for_what_they_are() {
        assert_eq!(L.kind("manifest.json"), Kind::Manifest);
        assert_eq!(L.kind("shard-00003.b.tmp"), Kind::Temporary);
        assert_eq!(L.kind("manifest.json.tmp"), Kind::Temporary);
        assert_eq!(L.kind("shard-00003.a"), Kind::Shard(3, Part::Data(0)));
        assert_eq!(L.kind("shard-00012.c"), Kind::Shard(12, Part::Data(2)));
        assert_eq!(L.kind(&L.stats_name(9)), Kind::Shard(9, Part::Stats));
        assert_eq!(L.kind(&L.claim_name(9)), Kind::Shard(9, Part::Claim));
        for foreign in ["notes.txt", "x.tmp", "shard-.a", "shard-00001.npy", "shard-00001", "manifest.jsonx"] {
            assert_eq!(L.kind(foreign), Kind::Foreign, "{foreign}");
        }
        assert_eq!(L.name(123456, ".b"), "shard-123456.b");
    }

    #[test]
    fn a_shard_is_finished_only_with_every_part_and_its_statistics() {
        let d = tempfile::tempdir().unwrap();
        let j = J { n: 1 };
        assert_eq!(start(d.path(), &j, false).unwrap(), Start::Run { done: vec![] });
        put(d.path(), 0);
        put(d.path(), 2);
        // shard 1: all but the last part; shard 3: every part, no statistics
        for p in [".a", ".b"] {
            fs::write(d.path().join(L.name(1, p)), b"x").unwrap();
        }
        fs::write(d.path().join(L.stats_name(1)), b"1").unwrap();
        for p in L.parts {
            fs::write(d.path().join(L.name(3, p)), b"x").unwrap();
        }
        assert!(!claim(d.path(), &L, 2).unwrap(), "a committed shard is not claimed again");
        assert_eq!(start(d.path(), &j, false).unwrap(), Start::Run { done: vec![0, 2] });
        let left = entries(d.path()).unwrap();
        assert!(left.iter().all(|n| !n.starts_with("shard-00001") && !n.starts_with("shard-00003")), "{left:?}");
        put(d.path(), 1);
        put(d.path(), 3);
        let stats: Vec<usize> = shard_stats(d.path(), &L, 4).unwrap();
        assert_eq!(stats, [0, 1, 2, 3]);
        finish(d.path(), &L, &M { format: L.format, complete: true, job: &j }, 4).unwrap();
        assert_eq!(start(d.path(), &j, false).unwrap(), Start::Complete);
        assert_eq!(entries(d.path()).unwrap().len(), 1 + 4 * 3, "no statistics left");
        let listed: HashSet<String> = (0..4).flat_map(|i| L.parts.iter().map(move |p| L.name(i, p))).collect();
        assert!(strays(d.path(), &listed).unwrap().is_empty());
        fs::write(d.path().join("shard-00000.claim"), b"").unwrap();
        assert_eq!(strays(d.path(), &listed).unwrap(), ["shard-00000.claim"]);
    }

    #[test]
    fn another_format_or_job_is_refused_by_name() {
        let d = tempfile::tempdir().unwrap();
        start(d.path(), &J { n: 1 }, false).unwrap();
        let e = start(d.path(), &J { n: 2 }, false).unwrap_err().to_string();
        assert!(e.contains("another job's things (its n differ)") && e.contains("--overwrite"), "{e}");
        let other = M { format: "u/1", complete: true, job: &J { n: 1 } };
        fs::write(d.path().join(MANIFEST), serde_json::to_vec(&other).unwrap()).unwrap();
        let e = start(d.path(), &J { n: 1 }, false).unwrap_err().to_string();
        assert!(e.contains("format u/1, this one writes t/1"), "{e}");
        assert_eq!(start(d.path(), &J { n: 1 }, true).unwrap(), Start::Run { done: vec![] });
    }
}
