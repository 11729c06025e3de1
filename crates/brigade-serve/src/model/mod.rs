//! The serving model: a rank's share of the weights (`weights`), the batched forward over
//! every scheduled token (`forward`), grouped-query attention over the paged cache
//! (`paged_attention`), a mixture of experts' layers (`experts`) and, under context parallelism, over a cache striped across ranks
//! (`context_attention`), and the cache's floats (`kv_store`). It knows blocks only by number:
//! which sequence holds which block is the scheduler's business, not the model's.

mod context_attention;
mod experts;
pub mod forward;
pub mod kv_store;
mod paged_attention;
pub mod weights;

pub use forward::{Logits, Model, Work};
pub use kv_store::{KvDtype, KvStore};
pub use weights::ShardError;
