//! The planner: predicts step time, memory and utilisation of 3D-parallel layouts of a model
//! on a cluster, and picks the fastest that fits. Pure functions of model × cluster × layout.

pub mod catalog;
pub mod cost;
pub mod elastic;
pub mod local;
pub mod search;

pub use crate::layout::Spec;
pub use catalog::{Accelerator, ModelShape};
pub use cost::{estimate, memory_gib, step_flops, Breakdown, Estimate, Layout, Recompute, Training};
pub use search::{rank_all, search};
