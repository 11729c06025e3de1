//! Training on any layout: the run's settings (`config`) and data, the trainer of one rank
//! (`setup` builds it, `trainer` steps it, `gradients` runs a rank's share of a step through
//! the executor for every layout, `persist` saves and resumes it, `evaluate` measures it), the
//! optimizer, and the job that steps it to the end with its cadence of evaluations and
//! checkpoints (`run`).

pub mod addition;
pub mod config;
pub mod data;
pub mod diagnose;
pub mod evaluate;
pub mod fault;
pub mod gradients;
pub mod memory;
pub mod metrics;
pub mod optimizer;
pub mod persist;
pub mod plot;
pub mod run;
pub mod setup;
pub mod state;
pub mod timeline;
pub mod trainer;

pub use config::TrainConfig;
pub use evaluate::EvalReport;
pub use metrics::StepStats;
pub use trainer::Trainer;
