//! What spans ranks in training: the device mesh (named axes, groups asked for by axes), data parallelism with ZeRO (`data`), and
//! pipeline parallelism with schedules as data (`pipeline`). Tensor and sequence parallelism
//! live inside the layers (`nn::tp`).

pub mod data;
pub mod mesh;
pub mod pipeline;

pub use mesh::{Axis, Coords, Mesh, MeshShape};
