//! Pipeline parallelism: schedules as data (`schedule`), checked on paper (`simulate`), run
//! by one executor (`executor`) over model parts (`Gpt::part`) split by cost (`partition`).

pub mod executor;
pub mod partition;
pub mod plan;
pub mod schedule;
pub mod simulate;
pub mod stages;

pub use plan::{Action, Plan};
pub use schedule::{build, build_for, chart};
pub use simulate::{simulate, Costs, Report};
pub use stages::RankModel;
