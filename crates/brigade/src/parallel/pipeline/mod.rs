//! Pipeline parallelism: schedules as data (`schedule`), checked on paper (`simulate`).
//! The executor and the stage split come next (issue "Parallel training II").

pub mod partition;
pub mod schedule;
pub mod simulate;

pub use schedule::{build, chart, Action, Kind, Plan};
pub use simulate::{simulate, Costs, Report};
