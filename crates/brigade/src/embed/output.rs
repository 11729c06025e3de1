//! Embed's output directory: `shard-NNNNN.npy` + `shard-NNNNN.ids` per shard and
//! `manifest.json`, through the sharded-output protocol of [`crate::shards::dir`] (a shard is
//! complete exactly when its `.ids` file exists; a directory never mixes two jobs' vectors).

use super::corpus::{FileInfo, InputSpec, Skipped};
use crate::shards::dir::{self, sha256, Layout};
pub use crate::shards::dir::{Start, MANIFEST};
use crate::Error;
use crate::Result;
use serde::{Deserialize, Serialize};
use std::fs;
use std::path::Path;

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
            id_field: spec.id_field.clone().unwrap_or_default(),
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

pub type Manifest = dir::Manifest<Job, Totals, ShardEntry>;

/// Embed's shards: vectors (`.npy`) then ids (`.ids`), the `.ids` committing.
pub const LAYOUT: Layout = Layout {
    tool: "brigade embed",
    what: "vectors",
    format: FORMAT,
    parts: &[".npy", ".ids"],
    crash_env: "BRIGADE_EMBED_CRASH",
};

pub fn npy_name(i: usize) -> String {
    LAYOUT.name(i, ".npy")
}
pub fn ids_name(i: usize) -> String {
    LAYOUT.name(i, ".ids")
}

pub fn read_manifest(dir: &Path) -> Result<Manifest> {
    dir::read_manifest(dir, &LAYOUT)
}

/// Readies `dir` for `job` (see [`dir::prepare`]).
pub fn prepare(dir: &Path, job: &Job, overwrite: bool) -> Result<Start> {
    let started = Manifest::of(&LAYOUT, job.clone(), false, &[]);
    dir::prepare(dir, &LAYOUT, job, Job::differences, &started, overwrite)
}

/// Takes shard `i` for this worker (see [`dir::claim`]).
pub fn claim(dir: &Path, i: usize) -> Result<bool> {
    dir::claim(dir, &LAYOUT, i)
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
    dir::commit(dir, &LAYOUT, i, &[&npy, idtext.as_bytes()], &stats)
}

/// Once every shard is committed: the final manifest, then the statistics files go.
pub fn finish(dir: &Path, job: &Job, shards: usize, skipped: &[Skipped]) -> Result<Manifest> {
    let mut m = Manifest::of(&LAYOUT, job.clone(), true, skipped);
    m.totals.skipped = skipped.len() as u64;
    for (i, s) in dir::shard_stats::<ShardStats>(dir, &LAYOUT, shards)?.into_iter().enumerate() {
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
    dir::finish(dir, &LAYOUT, &m, shards)?;
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
        m.shards.iter().flat_map(|s| [s.embeddings.clone(), s.ids.clone()]).collect();
    for n in dir::strays(dir, &listed)? {
        problems.push(format!("{n} is not part of the output (left by an interrupted run, or added)"));
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

#[cfg(test)]
mod tests {
    //! The directory's protocol, file by file: which names are whose, how a run resumes, what a
    //! commit leaves, what the manifest sums, and every problem `verify` must name.
    use super::super::corpus::{Format, OnError};
    use super::*;
    use crate::shards::dir::write_atomic;

    fn model() -> ModelInfo {
        ModelInfo {
            name: "m".into(),
            weights_blake3: "w".into(),
            dimension: 3,
            pooling: "mean".into(),
            normalize: true,
            max_seq_length: 128,
        }
    }

    fn text_file(path: &str, lines: u64) -> FileInfo {
        FileInfo { path: path.into(), format: Format::Text, bytes: 10 * lines, lines, blake3: format!("b3-{path}") }
    }

    fn job(input: Vec<FileInfo>) -> Job {
        let spec = InputSpec {
            files: vec![],
            format: None,
            id_field: Some("id".into()),
            text_field: "text".into(),
            on_error: OnError::Skip,
        };
        Job::new(model(), input, &spec, 2, 512)
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> =
            fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    fn stats_name(i: usize) -> String {
        LAYOUT.name(i, ".stats.json")
    }

    fn claim_name(i: usize) -> String {
        LAYOUT.name(i, ".claim")
    }

    fn err(r: Result<impl std::fmt::Debug>) -> String {
        r.expect_err("should be refused").to_string()
    }

    /// Vectors of `n` rows of the test model's dimension, row r filled with `r + base`.
    fn vectors(n: usize, base: f32) -> Vec<f32> {
        (0..n).flat_map(|r| [r as f32 + base; 3]).collect()
    }

    fn ids(range: std::ops::Range<usize>) -> Vec<String> {
        range.map(|i| i.to_string()).collect()
    }

    /// A whole job of 5 plain-text lines in shards of 2, 2, 1, finished.
    fn finished(dir: &Path) -> (Job, Manifest) {
        let j = job(vec![text_file("a.txt", 5)]);
        assert_eq!(prepare(dir, &j, false).unwrap(), Start::Run { done: vec![] });
        for (i, r) in [(0, 0..2), (1, 2..4), (2, 4..5)] {
            assert!(claim(dir, i).unwrap());
            let n = r.len();
            commit_shard(dir, i, &vectors(n, i as f32), 3, &ids(r), ShardStats::default()).unwrap();
        }
        let m = finish(dir, &j, 3, &[]).unwrap();
        (j, m)
    }

    fn verify_problems(dir: &Path) -> String {
        err(verify(dir))
    }

    #[test]
    fn each_name_is_known_for_what_it_is() {
        assert_eq!(npy_name(4), "shard-00004.npy");
        assert_eq!(ids_name(123456), "shard-123456.ids");
        assert_eq!(stats_name(9), "shard-00009.stats.json");
    }

    #[test]
    fn a_job_names_what_differs_from_another() {
        let a = job(vec![text_file("a.txt", 5)]);
        assert!(a.differences(&a.clone()).is_empty());
        let mut b = a.clone();
        b.model.normalize = false;
        assert_eq!(a.differences(&b), ["model"]);
        let mut b = a.clone();
        b.input[0].blake3 = "other".into();
        assert_eq!(a.differences(&b), ["input files"]);
        for change in 0..6 {
            let mut b = a.clone();
            match change {
                0 => b.format = Some(Format::Jsonl),
                1 => b.id_field = "key".into(),
                2 => b.text_field = "body".into(),
                3 => b.on_error = OnError::Fail,
                4 => b.shard_size = 3,
                _ => b.max_batch_tokens = 1024,
            }
            assert_eq!(a.differences(&b), ["settings"], "change {change}");
        }
        let mut b = a.clone();
        b.model.dimension = 4;
        b.input.clear();
        b.shard_size = 9;
        assert_eq!(a.differences(&b), ["model", "input files", "settings"]);
        // Job::new takes the spec's settings as they are
        assert_eq!((a.shard_size, a.max_batch_tokens, a.on_error), (2, 512, OnError::Skip));
        assert_eq!((a.id_field.as_str(), a.text_field.as_str(), a.format), ("id", "text", None));
    }

    #[test]
    fn an_atomic_write_is_whole_or_absent() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("manifest.json");
        write_atomic(&p, b"first").unwrap();
        write_atomic(&p, b"second").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"second");
        assert_eq!(names(d.path()), ["manifest.json"]);
        // a rename onto a directory fails: the error names it and no temporary file stays
        let sub = d.path().join("shard-00000.npy");
        fs::create_dir(&sub).unwrap();
        fs::write(sub.join("x"), b"").unwrap();
        assert!(write_atomic(&sub, b"v").is_err());
        assert_eq!(names(d.path()), ["manifest.json", "shard-00000.npy"]);
        // a directory that is not there: an error, nothing created
        assert!(write_atomic(&d.path().join("no/such/file"), b"v").is_err());
        assert!(!d.path().join("no").exists());
    }

    #[test]
    fn a_manifest_is_read_or_refused_in_words() {
        let d = tempfile::tempdir().unwrap();
        assert!(err(read_manifest(d.path())).contains("no manifest.json"));
        fs::write(d.path().join(MANIFEST), b"{not json").unwrap();
        assert!(err(read_manifest(d.path())).contains("not a brigade embed manifest"));
        let (_, m) = finished(&d.path().join("out"));
        assert_eq!(read_manifest(&d.path().join("out")).unwrap(), m);
    }

    #[test]
    fn a_new_directory_starts_a_job_with_its_identity() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("a/b");
        let j = job(vec![text_file("a.txt", 5)]);
        assert_eq!(prepare(&out, &j, false).unwrap(), Start::Run { done: vec![] });
        assert_eq!(names(&out), [MANIFEST]);
        let m = read_manifest(&out).unwrap();
        assert_eq!((m.format.as_str(), m.complete, &m.job), (FORMAT, false, &j));
        assert!(m.shards.is_empty() && m.skipped.is_empty() && m.totals == Totals::default());
        // the same job again: nothing done yet, nothing refused
        assert_eq!(prepare(&out, &j, false).unwrap(), Start::Run { done: vec![] });
        // --output naming a file
        let f = d.path().join("file");
        fs::write(&f, b"x").unwrap();
        assert!(err(prepare(&f, &j, true)).contains("is a file"));
    }

    #[test]
    fn files_brigade_did_not_write_are_never_touched() {
        let d = tempfile::tempdir().unwrap();
        let (j, _) = finished(d.path());
        fs::write(d.path().join("notes.txt"), b"mine").unwrap();
        let before = names(d.path());
        for overwrite in [false, true] {
            let e = err(prepare(d.path(), &j, overwrite));
            assert!(e.contains("did not write") && e.contains("notes.txt"), "{e}");
            assert_eq!(names(d.path()), before);
        }
        assert_eq!(fs::read(d.path().join("notes.txt")).unwrap(), b"mine");
    }

    #[test]
    fn a_resumed_job_keeps_finished_shards_and_clears_the_rest() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path();
        let j = job(vec![text_file("a.txt", 14)]);
        prepare(dir, &j, false).unwrap();
        // shard 0 and 3 finished; 1 killed after its statistics (npy + stats, no ids);
        // 2 killed after its .npy rename (no ids); 4 claimed only; 5 mid-write (temporaries)
        for i in [0, 3] {
            assert!(claim(dir, i).unwrap());
            commit_shard(dir, i, &vectors(2, 0.0), 3, &ids(2 * i..2 * i + 2), ShardStats::default()).unwrap();
        }
        fs::write(dir.join(npy_name(1)), b"n").unwrap();
        fs::write(dir.join(stats_name(1)), b"{}").unwrap();
        fs::write(dir.join(npy_name(2)), b"n").unwrap();
        fs::write(dir.join(stats_name(2)), b"{}").unwrap();
        fs::write(dir.join(claim_name(2)), b"").unwrap();
        fs::write(dir.join(claim_name(4)), b"").unwrap();
        fs::write(dir.join(format!("{}.tmp", npy_name(5))), b"n").unwrap();
        fs::write(dir.join(format!("{}.tmp", ids_name(5))), b"i").unwrap();
        fs::write(dir.join(format!("{MANIFEST}.tmp")), b"m").unwrap();
        // an .ids without its .npy or statistics is not a finished shard either
        fs::write(dir.join(ids_name(6)), b"12\n").unwrap();
        assert_eq!(prepare(dir, &j, false).unwrap(), Start::Run { done: vec![0, 3] });
        let mut want: Vec<String> = [0, 3].iter().flat_map(|&i| [npy_name(i), ids_name(i), stats_name(i)]).collect();
        want.push(MANIFEST.into());
        want.sort();
        assert_eq!(names(dir), want);
        // the finished shards are the ones committed, and can still be finished into a job
        for i in [1, 2, 4, 5, 6] {
            assert!(claim(dir, i).unwrap(), "shard {i} free again");
            commit_shard(dir, i, &vectors(2, 0.0), 3, &ids(2 * i..2 * i + 2), ShardStats::default()).unwrap();
        }
        assert!(!claim(dir, 0).unwrap(), "a finished shard is not claimed again");
        let m = finish(dir, &j, 7, &[]).unwrap();
        assert_eq!(verify(dir).unwrap(), m);
    }

    #[test]
    fn a_complete_output_of_the_same_job_is_done_and_left_as_it_is() {
        let d = tempfile::tempdir().unwrap();
        let (j, m) = finished(d.path());
        let shards: Vec<Vec<u8>> = (0..3).map(|i| fs::read(d.path().join(npy_name(i))).unwrap()).collect();
        // leftovers of a run killed after the manifest: statistics, a claim, a temporary
        fs::write(d.path().join(stats_name(1)), b"{}").unwrap();
        fs::write(d.path().join(claim_name(2)), b"").unwrap();
        fs::write(d.path().join(format!("{}.tmp", npy_name(0))), b"n").unwrap();
        assert_eq!(prepare(d.path(), &j, false).unwrap(), Start::Complete);
        assert_eq!(verify(d.path()).unwrap(), m);
        for (i, b) in shards.iter().enumerate() {
            assert_eq!(&fs::read(d.path().join(npy_name(i))).unwrap(), b);
        }
    }

    #[test]
    fn another_jobs_output_is_refused_unless_overwritten() {
        let d = tempfile::tempdir().unwrap();
        let (j, _) = finished(d.path());
        let mut other = j.clone();
        other.shard_size = 4;
        other.model.name = "n".into();
        let before = names(d.path());
        let e = err(prepare(d.path(), &other, false));
        assert!(e.contains("another job's vectors (its model, settings differ)") && e.contains("--overwrite"), "{e}");
        assert_eq!(names(d.path()), before);
        assert_eq!(prepare(d.path(), &other, true).unwrap(), Start::Run { done: vec![] });
        assert_eq!(names(d.path()), [MANIFEST]);
        assert_eq!(read_manifest(d.path()).unwrap().job, other);

        // an unfinished output of another job: its finished shards are not this job's
        let d = tempfile::tempdir().unwrap();
        prepare(d.path(), &j, false).unwrap();
        commit_shard(d.path(), 0, &vectors(2, 0.0), 3, &ids(0..2), ShardStats::default()).unwrap();
        assert!(err(prepare(d.path(), &other, false)).contains("another job's vectors"));
        assert_eq!(prepare(d.path(), &other, true).unwrap(), Start::Run { done: vec![] });
        assert_eq!(names(d.path()), [MANIFEST]);

        // a manifest of another format version is another job's too
        let d = tempfile::tempdir().unwrap();
        let (j, mut m) = finished(d.path());
        m.format = "brigade-embed/0".into();
        fs::write(d.path().join(MANIFEST), serde_json::to_vec(&m).unwrap()).unwrap();
        assert!(err(prepare(d.path(), &j, false)).contains("another job's vectors"));
        assert_eq!(prepare(d.path(), &j, true).unwrap(), Start::Run { done: vec![] });
    }

    #[test]
    fn an_unreadable_manifest_or_shards_without_one_need_overwrite() {
        let d = tempfile::tempdir().unwrap();
        let (j, _) = finished(d.path());
        fs::write(d.path().join(MANIFEST), b"{").unwrap();
        let e = err(prepare(d.path(), &j, false));
        assert!(e.contains("a manifest this job cannot read") && e.contains("--overwrite"), "{e}");
        assert_eq!(prepare(d.path(), &j, true).unwrap(), Start::Run { done: vec![] });
        assert_eq!(names(d.path()), [MANIFEST]);

        let d = tempfile::tempdir().unwrap();
        let (j, _) = finished(d.path());
        fs::remove_file(d.path().join(MANIFEST)).unwrap();
        let before = names(d.path());
        let e = err(prepare(d.path(), &j, false));
        assert!(e.contains("no manifest.json"), "{e}");
        assert_eq!(names(d.path()), before);
        assert_eq!(prepare(d.path(), &j, true).unwrap(), Start::Run { done: vec![] });
        assert_eq!(names(d.path()), [MANIFEST]);
    }

    #[test]
    fn removing_what_is_gone_is_fine_and_what_cannot_go_is_an_error() {
        let d = tempfile::tempdir().unwrap();
        // a directory where a shard file should be: removing it fails
        let p = d.path().join(stats_name(0));
        fs::create_dir(&p).unwrap();
        // ... so a resume that must clear it is refused rather than left half-cleared
        let j = job(vec![text_file("a.txt", 2)]);
        fs::write(
            d.path().join(MANIFEST),
            serde_json::to_vec(&Manifest {
                format: FORMAT.into(),
                complete: false,
                job: j.clone(),
                totals: Totals::default(),
                skipped: vec![],
                shards: vec![],
            })
            .unwrap(),
        )
        .unwrap();
        assert!(prepare(d.path(), &j, false).is_err());
        assert!(p.is_dir());
    }

    #[test]
    fn a_claim_is_taken_once_and_never_on_a_finished_shard() {
        let d = tempfile::tempdir().unwrap();
        assert!(claim(d.path(), 0).unwrap());
        assert!(!claim(d.path(), 0).unwrap());
        assert!(claim(d.path(), 1).unwrap());
        fs::write(d.path().join(ids_name(2)), b"").unwrap();
        assert!(!claim(d.path(), 2).unwrap());
        assert!(!d.path().join(claim_name(2)).exists());
        // a directory that is not there is an error, not "taken"
        assert!(claim(&d.path().join("gone"), 0).is_err());
    }

    #[test]
    fn a_committed_shard_is_its_vectors_ids_and_statistics() {
        let d = tempfile::tempdir().unwrap();
        assert!(claim(d.path(), 7).unwrap());
        let v = vectors(2, 0.5);
        let stats = ShardStats { tokens: 11, truncated: 1, empty: 1, count: 99, ..ShardStats::default() };
        commit_shard(d.path(), 7, &v, 3, &["x".into(), "y z".into()], stats).unwrap();
        assert_eq!(names(d.path()), [ids_name(7), npy_name(7), stats_name(7)]);
        let npy = fs::read(d.path().join(npy_name(7))).unwrap();
        assert_eq!(super::super::npy::read(&npy).unwrap(), (2, 3, v));
        let idb = fs::read(d.path().join(ids_name(7))).unwrap();
        assert_eq!(idb, b"x\ny z\n");
        let s: ShardStats = serde_json::from_slice(&fs::read(d.path().join(stats_name(7))).unwrap()).unwrap();
        assert_eq!((s.count, s.tokens, s.truncated, s.empty), (2, 11, 1, 1));
        assert_eq!(s.sha256, sha256(&npy));
        assert_eq!(s.ids_sha256, sha256(&idb));
        assert_eq!(sha256(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }

    #[test]
    fn the_manifest_sums_the_shards_and_lists_them_in_order() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path();
        let j = job(vec![text_file("a.txt", 4), text_file("b.txt", 3)]);
        prepare(dir, &j, false).unwrap();
        let skipped = vec![Skipped { file: "b.txt".into(), line: 2, reason: "not UTF-8".into() }];
        let parts = [(0, 0..2, 5, 0, 1), (1, 2..4, 7, 1, 0), (2, 4..5, 3, 2, 0), (3, 6..7, 2, 0, 1)];
        for (i, r, tokens, truncated, empty) in parts.clone() {
            let n = r.len();
            let stats = ShardStats { tokens, truncated, empty, ..ShardStats::default() };
            commit_shard(dir, i, &vectors(n, 0.0), 3, &ids(r), stats).unwrap();
        }
        let m = finish(dir, &j, 4, &skipped).unwrap();
        assert!(m.complete && m.format == FORMAT && m.job == j && m.skipped == skipped);
        assert_eq!(m.totals, Totals { documents: 6, tokens: 17, truncated: 3, empty: 2, skipped: 1 });
        assert_eq!(m.shards.iter().map(|s| (s.index, s.count)).collect::<Vec<_>>(), [(0, 2), (1, 2), (2, 1), (3, 1)]);
        for s in &m.shards {
            assert_eq!((s.embeddings.clone(), s.ids.clone()), (npy_name(s.index), ids_name(s.index)));
            assert_eq!(s.sha256, sha256(&fs::read(dir.join(npy_name(s.index))).unwrap()));
            assert_eq!(s.ids_sha256, sha256(&fs::read(dir.join(ids_name(s.index))).unwrap()));
        }
        assert_eq!(read_manifest(dir).unwrap(), m);
        let mut want: Vec<String> = (0..4).flat_map(|i| [npy_name(i), ids_name(i)]).collect();
        want.push(MANIFEST.into());
        want.sort();
        assert_eq!(names(dir), want, "the statistics files are gone");
        // the skipped line (b.txt line 2 = global id 5) is accounted for
        assert_eq!(skipped_line_ids(&m), ["5".to_string()].into_iter().collect());
        assert_eq!(verify(dir).unwrap(), m);
    }

    #[test]
    fn finishing_before_every_shard_is_committed_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let j = job(vec![text_file("a.txt", 4)]);
        prepare(d.path(), &j, false).unwrap();
        commit_shard(d.path(), 0, &vectors(2, 0.0), 3, &ids(0..2), ShardStats::default()).unwrap();
        let e = err(finish(d.path(), &j, 2, &[]));
        assert!(e.contains("shard 1 is not finished"), "{e}");
        assert!(!read_manifest(d.path()).unwrap().complete);
        fs::write(d.path().join(stats_name(1)), b"garbage").unwrap();
        assert!(err(finish(d.path(), &j, 2, &[])).contains("shard 1 is not finished"));
    }

    #[test]
    fn verify_names_every_problem() {
        type Plant = fn(&Path, &mut Manifest);
        // (what is planted, how, a problem it must name, how many problems follow from it)
        let cases: [(&str, Plant, &str, usize); 11] = [
            ("unfinished", |_, m| m.complete = false, "has not finished", 1),
            (
                "missing file",
                |d, _| fs::remove_file(d.join(ids_name(1))).unwrap(),
                "shard 1: shard-00001.npy or shard-00001.ids is missing",
                4, // and so: the totals, the input's count, ids 2 and 3 missing
            ),
            (
                "changed vectors",
                |d, _| {
                    let p = d.join(npy_name(0));
                    let mut b = fs::read(&p).unwrap();
                    *b.last_mut().unwrap() ^= 1;
                    fs::write(p, b).unwrap()
                },
                "shard 0: shard-00000.npy does not match its sha256",
                1,
            ),
            (
                "changed ids",
                |d, _| fs::write(d.join(ids_name(2)), b"9\n").unwrap(),
                "shard 2: shard-00002.ids does not match its sha256",
                2, // and id 4 missing
            ),
            (
                "dimension",
                |_, m| m.job.model.dimension = 4,
                "shard 0: shard-00000.npy is 2×3, the manifest says 2×4",
                3,
            ),
            (
                "count",
                |_, m| m.shards[2].count = 2,
                "shard 2: shard-00002.npy is 1×3, the manifest says 2×3",
                4, // the ids' count, the totals, the input's count
            ),
            (
                "not npy",
                |d, m| {
                    fs::write(d.join(npy_name(1)), b"nope").unwrap();
                    m.shards[1].sha256 = sha256(b"nope");
                },
                "shard 1: shard-00001.npy:",
                1,
            ),
            (
                "duplicate ids",
                |d, m| {
                    fs::write(d.join(ids_name(1)), b"0\n1\n").unwrap();
                    m.shards[1].ids_sha256 = sha256(b"0\n1\n");
                },
                "ids appear twice: 0, 1",
                2, // and ids 2, 3 missing
            ),
            ("total", |_, m| m.totals.documents = 4, "shards hold 5 documents, the manifest's total is 4", 1),
            (
                "missing line",
                |_, m| m.job.input[0].lines = 7,
                "the input had 7 documents (lines not skipped), the shards hold 5",
                2, // and ids 5, 6 missing
            ),
            (
                "stray file",
                |d, _| fs::write(d.join(stats_name(0)), b"{}").unwrap(),
                "shard-00000.stats.json is not part of the output",
                1,
            ),
        ];
        for (name, plant, want, count) in cases {
            let d = tempfile::tempdir().unwrap();
            let (_, mut m) = finished(d.path());
            verify(d.path()).unwrap();
            plant(d.path(), &mut m);
            fs::write(d.path().join(MANIFEST), serde_json::to_vec(&m).unwrap()).unwrap();
            let e = verify_problems(d.path());
            assert!(e.contains(want), "{name}: {e}");
            assert!(e.contains(&format!("{} failed verification:\n  ", d.path().display())), "{name}: {e}");
            assert_eq!(e.matches("\n  ").count(), count, "{name}: {e}");
        }
    }

    #[test]
    fn verify_checks_plain_text_ids_line_by_line() {
        // the right count of ids, but one line's id missing and another's twice
        let d = tempfile::tempdir().unwrap();
        let (_, mut m) = finished(d.path());
        fs::write(d.path().join(ids_name(2)), b"1\n").unwrap();
        m.shards[2].ids_sha256 = sha256(b"1\n");
        fs::write(d.path().join(MANIFEST), serde_json::to_vec(&m).unwrap()).unwrap();
        let e = verify_problems(d.path());
        assert!(e.contains("ids missing: 4") && e.contains("ids appear twice: 1"), "{e}");
        assert!(!e.contains("the input had"), "{e}");

        // at most five of each are named
        let d = tempfile::tempdir().unwrap();
        let (_, mut m) = finished(d.path());
        let twice = ["0", "1", "2", "3", "4", "0", "1", "2", "3", "4"].map(String::from);
        commit_shard(d.path(), 3, &vectors(10, 0.0), 3, &twice, ShardStats::default()).unwrap();
        fs::remove_file(d.path().join(stats_name(3))).unwrap();
        let mut more = m.shards[0].clone();
        more.index = 3;
        (more.embeddings, more.ids, more.count) = (npy_name(3), ids_name(3), 10);
        more.sha256 = sha256(&fs::read(d.path().join(npy_name(3))).unwrap());
        more.ids_sha256 = sha256(&fs::read(d.path().join(ids_name(3))).unwrap());
        m.shards.push(more);
        m.totals.documents = 15;
        m.job.input[0].lines = 20; // ids 5…19 missing
        fs::write(d.path().join(MANIFEST), serde_json::to_vec(&m).unwrap()).unwrap();
        let e = verify_problems(d.path());
        let line = |want: &str| e.lines().any(|l| l.trim() == want);
        assert!(line("ids appear twice: 0, 1, 2, 3, 4"), "{e}");
        assert!(line("ids missing: 5, 6, 7, 8, 9"), "{e}");

        // a skipped line is not missing: files a (3 lines), b (3 lines), b's line 2 skipped
        let d = tempfile::tempdir().unwrap();
        let dir = d.path();
        let j = job(vec![text_file("a", 3), text_file("b", 3)]);
        prepare(dir, &j, false).unwrap();
        let kept = ["0", "1", "2", "3", "5"].map(String::from);
        commit_shard(dir, 0, &vectors(5, 0.0), 3, &kept, ShardStats::default()).unwrap();
        let skipped = [Skipped { file: "b".into(), line: 2, reason: "r".into() }];
        let m = finish(dir, &j, 1, &skipped).unwrap();
        assert_eq!(verify(dir).unwrap(), m);
        // the same skip recorded against the first file leaves id 4 missing
        let mut wrong = m.clone();
        wrong.skipped[0].file = "a".into();
        fs::write(dir.join(MANIFEST), serde_json::to_vec(&wrong).unwrap()).unwrap();
        assert!(verify_problems(dir).contains("ids missing: 4"));
        // ids of JSONL input are the user's: not checked against line numbers
        let mut jsonl = m.clone();
        jsonl.job.input[1].format = Format::Jsonl;
        jsonl.job.input[1].lines = 9;
        fs::write(dir.join(MANIFEST), serde_json::to_vec(&jsonl).unwrap()).unwrap();
        assert_eq!(verify(dir).unwrap(), jsonl);
    }
}
