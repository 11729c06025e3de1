//! What spans ranks in training: the device mesh, data parallelism with ZeRO (`data`), and
//! pipeline parallelism with schedules as data (`pipeline`). Tensor and sequence parallelism
//! live inside the layers (`nn::tp`).

pub mod data;
pub mod mesh;
pub mod pipeline;

pub use mesh::{Coords, Mesh, MeshShape};

use crate::error::{Error, Result};
pub use crate::plan::Recompute;

/// How a rank trains beside the mesh shape: data-parallel reduction and ZeRO stage, sequence
/// parallelism inside the tensor-parallel group, the pipeline's schedule, and the micro-batch
/// size when the layout names it (`mb=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    pub data: data::DataParallel,
    pub sp: bool,
    pub pipe: Pipe,
    pub micro_batch: Option<usize>,
}

/// The pipeline's settings: its schedule (unset: 1F1B, or interleaved when v > 1), model chunks
/// per rank, and activation recompute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pipe {
    pub schedule: Option<pipeline::Kind>,
    pub v: usize,
    pub recompute: Recompute,
}

impl Default for Pipe {
    fn default() -> Pipe {
        Pipe { schedule: None, v: 1, recompute: Recompute::None }
    }
}

impl Pipe {
    /// The schedule this pipeline runs.
    pub fn kind(&self) -> pipeline::Kind {
        match self.schedule {
            Some(k) => k,
            None if self.v > 1 => pipeline::Kind::Interleaved,
            None => pipeline::Kind::OneFOneB,
        }
    }

    /// Whether a rank runs its micro-batches through the pipeline executor (a pipeline, model
    /// chunks, or recompute) rather than the data/tensor-parallel loop.
    pub fn runs_executor(&self, pp: usize) -> bool {
        pp > 1 || self.v > 1 || self.recompute != Recompute::None
    }
}

/// The mesh and settings of a training `--layout` (`dp=2,tp=2,zero=1,sp=1`, the syntax of
/// `brigade plan --layout`; unnamed axes are 1), checked before any rank starts. Used by
/// `brigade train` and `brigade bench parallel` alike.
pub fn training_layout(layout: &str, bucket_elems: usize) -> Result<(MeshShape, Settings)> {
    let f = crate::plan::Fixed::parse(layout)?;
    let pipe = Pipe {
        schedule: f.schedule.map(pipeline::Kind::parse).transpose()?,
        v: f.v.unwrap_or(1),
        recompute: f.recompute.unwrap_or(Recompute::None),
    };
    let shape = MeshShape::new(f.dp.unwrap_or(1), f.pp.unwrap_or(1), f.tp.unwrap_or(1))?;
    let sp = f.sp.unwrap_or(false);
    if sp && shape.tp == 1 {
        return Err(Error::Layout(format!(
            "sp=1 splits the sequence across the tensor-parallel group, but the layout '{layout}' has tp=1; add tp=2 or more, or drop sp"
        )));
    }
    let data = data::DataParallel { zero: f.zero.unwrap_or(0), bucket_elems };
    data.validate()?;
    if shape.pp > 1 && data.zero >= 2 {
        return Err(Error::Layout(format!(
            "zero={} with pp={}: a pipeline keeps every micro-batch's gradients until the step ends, so ZeRO-2/3 would save nothing; use zero=1 (as Megatron-LM's distributed optimizer)",
            data.zero, shape.pp
        )));
    }
    if pipe.runs_executor(shape.pp) && data.zero >= 2 {
        return Err(Error::Layout(format!("zero={} with v>1 or recompute: use zero=0 or 1 there", data.zero)));
    }
    Ok((shape, Settings { data, sp, pipe, micro_batch: f.mb }))
}

/// The pipeline schedule a `--layout` with pp > 1 would run (`schedule`, default 1F1B, or
/// interleaved when v > 1), for a global batch of `batch` sequences in micro-batches of
/// `micro_batch` (the layout's `mb`, else the whole share of a dp replica).
pub fn pipeline_plan(layout: &str, batch: usize, micro_batch: Option<usize>) -> Result<pipeline::Plan> {
    let f = crate::plan::Fixed::parse(layout)?;
    let (pp, dp, v) = (f.pp.unwrap_or(1), f.dp.unwrap_or(1), f.v.unwrap_or(1));
    if pp < 2 {
        return Err(Error::Layout(format!("'{layout}' has no pipeline to schedule; give pp=2 or more")));
    }
    let mb = micro_batch.or(f.mb).unwrap_or(batch / dp).max(1);
    if !batch.is_multiple_of(dp * mb) {
        return Err(Error::Layout(format!(
            "the global batch of {batch} sequences does not split into dp={dp} replicas of whole micro-batches of {mb}"
        )));
    }
    let schedule = f.schedule.map(pipeline::Kind::parse).transpose()?;
    let kind = Pipe { schedule, v, recompute: Recompute::None }.kind();
    pipeline::build(kind, pp, batch / (dp * mb), v)
}
