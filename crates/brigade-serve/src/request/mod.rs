//! Requests shaped for the engine, whatever brought them: the OpenAI bodies read field by
//! field (`completion`, `chat`; errors as `error`), a prompt's token ids checked against the
//! model and each choice's sampling (`shape`), the choices assembled as tokens arrive
//! (`choices`, through `text`'s detokenizer); tool calls in and out (`tools`). No transport here: the HTTP handlers and the
//! program runner share it.

pub mod chat;
pub(crate) mod choices;
pub mod completion;
pub mod error;
pub(crate) mod shape;
pub mod text;
pub mod tools;

pub use completion::{Completion, Prompt};
pub use error::ApiError;
