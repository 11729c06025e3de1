//! Parallel training: the device mesh, and (to come, per DESIGN.md) tensor-parallel layers,
//! data-parallel gradient buckets and ZeRO shards, pipeline schedules.

pub mod mesh;

pub use mesh::{Coords, Mesh, MeshShape};
