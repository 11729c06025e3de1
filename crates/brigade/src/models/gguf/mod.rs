//! GGUF, llama.cpp's model file: the container (`file.rs`) and a checkpoint written as one
//! (`export.rs`, `brigade export --gguf`).

pub mod export;
pub mod file;
pub mod quants;
pub mod read;

pub use export::{export, Exported, FileType};
