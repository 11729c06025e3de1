use std::path::PathBuf;

/// Everything the library reports to a user: each message says what is wrong and, where
/// there is one, what would be right.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid model config: {0}")]
    Config(String),
    #[error("invalid layout: {0}")]
    Layout(String),
    #[error("invalid training setting: {0}")]
    Train(String),
    #[error("data: {0}")]
    Data(String),
    #[error("checkpoint {}: {msg}", path.display())]
    Checkpoint { path: PathBuf, msg: String },
    /// Stopped by SIGINT or SIGTERM; the message says what was kept and how to go on.
    #[error("{0}")]
    Interrupted(String),
    /// A message relayed from another rank, already worded for the user.
    #[error("{0}")]
    Relayed(String),
    /// The I/O error is part of the message, not a separate cause: a chain printed with `{:#}`
    /// would show it twice.
    #[error("{}: {err}", path.display())]
    Io { path: PathBuf, err: std::io::Error },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io { path: path.into(), err: source }
    }
    pub fn ckpt(path: impl Into<PathBuf>, msg: impl Into<String>) -> Error {
        Error::Checkpoint { path: path.into(), msg: msg.into() }
    }
}
