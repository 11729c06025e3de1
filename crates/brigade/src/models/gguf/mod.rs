//! GGUF, llama.cpp's model file: the container written (`file`) and read (`read`), its tensor
//! types (`quants`), a checkpoint written as one (`export`, `brigade export --gguf`) and one
//! read as a checkpoint (`import`).

pub mod export;
pub mod file;
pub mod import;
pub mod quants;
pub mod read;

pub use export::{export, export_model, Exported, FileType};
