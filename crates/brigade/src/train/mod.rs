//! Single-worker training: data, optimizer, schedule, checkpoints and the loop.

pub mod addition;
pub mod checkpoint;
pub mod config;
pub mod data;
pub mod memory;
pub mod optimizer;
pub mod persist;
pub mod plot;
pub mod state;
pub mod timeline;
pub mod trainer;

pub use config::TrainConfig;
pub use trainer::{EvalReport, StepStats, Trainer};
