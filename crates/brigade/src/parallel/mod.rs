//! Parallel training: the device mesh, data parallelism with ZeRO (`data`), tensor and
//! sequence parallelism (`tensor`), and pipeline schedules with their simulator (`pipeline`;
//! the executor is to come).

pub mod data;
pub mod mesh;
pub mod pipeline;
pub mod tensor;

pub use mesh::{Coords, Mesh, MeshShape};

use crate::error::{Error, Result};

/// How a rank trains beside the mesh shape: data-parallel reduction and ZeRO stage, and
/// sequence parallelism inside the tensor-parallel group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    pub data: data::DataParallel,
    pub sp: bool,
}

/// The mesh and settings of a training `--layout` (`dp=2,tp=2,zero=1,sp=1`, the syntax of
/// `brigade plan --layout`; unnamed axes are 1), checked before any rank starts. Used by
/// `brigade train` and `brigade bench parallel` alike.
pub fn training_layout(layout: &str, bucket_elems: usize) -> Result<(MeshShape, Settings)> {
    let f = crate::plan::Fixed::parse(layout)?;
    if f.v.is_some() || f.recompute.is_some() || f.schedule.is_some() || f.mb.is_some() {
        return Err(Error::Layout(format!(
            "--layout for training takes dp, tp, pp, zero and sp, not '{layout}'; give the micro-batch with --micro-batch (v, recompute and schedule come with pipeline parallelism)"
        )));
    }
    let shape = MeshShape::new(f.dp.unwrap_or(1), f.pp.unwrap_or(1), f.tp.unwrap_or(1))?;
    let sp = f.sp.unwrap_or(false);
    if sp && shape.tp == 1 {
        return Err(Error::Layout(format!(
            "sp=1 splits the sequence across the tensor-parallel group, but the layout '{layout}' has tp=1; add tp=2 or more, or drop sp"
        )));
    }
    let data = data::DataParallel { zero: f.zero.unwrap_or(0), bucket_elems };
    data.validate()?;
    Ok((shape, Settings { data, sp }))
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
    let kind = match f.schedule {
        Some(s) => pipeline::Kind::parse(s)?,
        None if v > 1 => pipeline::Kind::Interleaved,
        None => pipeline::Kind::OneFOneB,
    };
    pipeline::build(kind, pp, batch / (dp * mb), v)
}
