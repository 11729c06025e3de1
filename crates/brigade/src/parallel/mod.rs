//! Parallel training: the device mesh, and (to come, per DESIGN.md) tensor-parallel layers,
//! pipeline schedules. Data parallelism (ZeRO-0/1) is here.

pub mod data;
pub mod mesh;

pub use mesh::{Coords, Mesh, MeshShape};

use crate::error::{Error, Result};

/// The mesh and data-parallel settings of a training `--layout` (`dp=2,zero=1`, the syntax of
/// `brigade plan --layout`; unnamed axes are 1), checked before any rank starts. Used by
/// `brigade train` and `brigade bench parallel` alike.
pub fn training_layout(layout: &str, bucket_elems: usize) -> Result<(MeshShape, data::DataParallel)> {
    let f = crate::plan::Fixed::parse(layout)?;
    if f.v.is_some() || f.recompute.is_some() || f.schedule.is_some() || f.mb.is_some() {
        return Err(Error::Config(format!(
            "--layout for training takes dp, tp, pp and zero, not '{layout}'; give the micro-batch with --micro-batch (v, recompute and schedule come with pipeline parallelism)"
        )));
    }
    let shape = MeshShape::new(f.dp.unwrap_or(1), f.pp.unwrap_or(1), f.tp.unwrap_or(1))?;
    let dpc = data::DataParallel { zero: f.zero.unwrap_or(0), bucket_elems };
    dpc.validate()?;
    Ok((shape, dpc))
}
