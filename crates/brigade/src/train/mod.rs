//! Single-worker training: data, optimizer, schedule, checkpoints and the loop.

pub mod addition;
pub mod config;
pub mod data;
pub mod diagnose;
pub mod evaluate;
pub mod memory;
pub mod metrics;
pub mod optimizer;
pub mod persist;
pub mod pipelined;
pub mod plot;
pub mod setup;
pub mod state;
pub mod timeline;
pub mod trainer;

pub use config::TrainConfig;
pub use evaluate::EvalReport;
pub use metrics::StepStats;
pub use trainer::Trainer;
