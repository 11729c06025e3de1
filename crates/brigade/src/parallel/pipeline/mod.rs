//! Pipeline parallelism: schedules as data (`schedule`), checked on paper (`simulate`), run
//! by one executor (`executor`) over model parts (`Gpt::part`) split by cost (`partition`).
//! Not yet wired into the trainer (issue "Parallel training II").

pub mod executor;
pub mod partition;
pub mod schedule;
pub mod simulate;

pub use schedule::{build, chart, Action, Kind, Plan};
pub use simulate::{simulate, Costs, Report};
