//! `brigade tokenize`: a corpus turned into token shards once, split across workers (threads
//! of this process, or MPI ranks) through the same sharded-job machinery as `brigade embed`
//! (`shards::work`), so a killed job resumes with nothing lost or doubled. Each document is
//! closed as training's folder reader closes one (`Tokenizer::encode_document`), so training on
//! the shards sees the tokens training on the files would.

use crate::models::tokenizer::Tokenizer;
use crate::shards::dir::Start;
use crate::shards::input::{Doc, Index, InputSpec, ShardSpan};
use crate::shards::tokens::{self, Job, Manifest};
use crate::shards::work::{self, Progress, Report, Settings, Task};
use crate::{Error, Result};
use brigade_comm::Comm;
use std::path::Path;

struct Tokenizing<'a> {
    spec: &'a InputSpec,
    tok: &'a Tokenizer,
    out: &'a Path,
    shard_size: usize,
    overwrite: bool,
}

impl Task for Tokenizing<'_> {
    type Job = Job;
    type Manifest = Manifest;

    fn prepare(&self, index: &Index) -> Result<(Job, Start)> {
        let job = Job::new(self.tok.identity(), index.files.clone(), self.spec, self.shard_size);
        let start = tokens::prepare(self.out, &job, self.overwrite)?;
        Ok((job, start))
    }

    fn claim(&self, i: usize) -> Result<bool> {
        tokens::claim(self.out, i)
    }

    fn shard(&self, job: &Job, span: &ShardSpan, docs: Vec<Doc>, progress: &dyn Progress) -> Result<u64> {
        let ids: Vec<Vec<u32>> = docs
            .iter()
            .map(|d| self.tok.encode_document(&d.text).map_err(|e| Error::Data(format!("document {}: {e}", d.id))))
            .collect::<Result<_>>()?;
        progress.documents(ids.len() as u64);
        Ok(tokens::commit_shard(self.out, span.index, &ids, job.width())?.tokens)
    }

    fn finish(&self, job: &Job, index: &Index) -> Result<Manifest> {
        tokens::finish(self.out, job, index.shards.len(), &index.skipped)
    }

    fn complete(&self) -> Result<Manifest> {
        tokens::read_manifest(self.out)
    }

    fn verb(&self) -> &'static str {
        "tokenize"
    }
}

/// Runs the job as this rank: the documents of `spec` tokenized with `tok` into shards of
/// `s.shard_size` documents in `out`. Every rank returns `Ok` or the same error; rank 0's `Ok`
/// holds the report.
pub fn run(
    comm: &Comm,
    spec: &InputSpec,
    tok: &Tokenizer,
    out: &Path,
    s: &Settings,
    overwrite: bool,
    progress: &dyn Progress,
) -> Result<Option<Report<Manifest>>> {
    let task = Tokenizing { spec, tok, out, shard_size: s.shard_size, overwrite };
    work::run(comm, spec, &task, out, s, progress)
}
