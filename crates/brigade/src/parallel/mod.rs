//! Parallel training: the device mesh, and (to come, per DESIGN.md) tensor-parallel layers,
//! pipeline schedules. Data parallelism (ZeRO-0/1) is here.

pub mod mesh;

pub use mesh::{Coords, Mesh, MeshShape};
pub mod data;
