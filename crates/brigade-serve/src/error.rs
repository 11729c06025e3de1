//! What goes wrong starting to serve (`brigade serve`, `brigade run`): each message says what
//! is wrong and, where there is one, what would be right. A request's own mistakes are
//! `request::ApiError`s; the engine's refusals are `engine::Refused`.

/// Why the server (or `brigade run`) could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A setting this model cannot be served with (the message names the flag).
    #[error("{0}")]
    Setting(String),
    /// Reading the model: its config, weights, tokenizer or training state.
    #[error(transparent)]
    Model(#[from] brigade::Error),
    /// A file of the model's folder that is there but cannot be used (the message names it).
    #[error("{0}")]
    ModelFile(String),
    /// A program that does not parse, or does not fit the model.
    #[error("{0}")]
    Program(String),
    /// The runtime, the port, the server or a thread. The I/O error is part of the message,
    /// not a separate cause (a chain printed with `{:#}` would show it twice).
    #[error("{what}: {err}")]
    Io { what: String, err: std::io::Error },
    /// The loading thread ended without an answer.
    #[error("loading the model failed: {0}")]
    Load(String),
}

impl ServeError {
    pub(crate) fn io(what: impl Into<String>, err: std::io::Error) -> ServeError {
        ServeError::Io { what: what.into(), err }
    }
}

pub type Result<T> = std::result::Result<T, ServeError>;
