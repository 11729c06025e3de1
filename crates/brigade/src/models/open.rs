//! A model from whatever holds it: a checkpoint folder (brigade's or Hugging Face's) or a GGUF
//! file, by what the path is. Commands that take `--checkpoint` open it here.

use crate::error::{Error, Result};
use crate::models::checkpoint::{load_model, read_model_config};
use crate::models::gguf::import;
use crate::models::{Gpt, GptConfig};
use std::path::{Path, PathBuf};

/// The model and its parameters (a GGUF file's dequantized to f32).
pub fn open_model(path: &Path) -> Result<(Gpt, Vec<f32>)> {
    exists(path)?;
    if import::is_gguf(path) {
        return import::load(path);
    }
    load_model(path)
}

/// A GGUF file's block-quantized matrices as stored (`None` for a checkpoint folder, whose
/// weights are floats), for serving them in their own types.
pub fn open_stored(path: &Path, model: &Gpt) -> Result<Option<import::Stored>> {
    exists(path)?;
    if import::is_gguf(path) {
        return import::Stored::open(path, model).map(Some);
    }
    Ok(None)
}

/// The model's shape, without its weights.
pub fn open_config(path: &Path) -> Result<GptConfig> {
    read_model_config(&metadata_folder(path)?)
}

/// The folder holding the model's `config.json`, `tokenizer.json`, `tokenizer_config.json` and
/// `generation_config.json`: a checkpoint folder itself, a GGUF file's metadata unpacked.
pub fn metadata_folder(path: &Path) -> Result<PathBuf> {
    exists(path)?;
    import::folder_of(path)
}

fn exists(path: &Path) -> Result<()> {
    if path.is_file() && !import::is_gguf(path) {
        return Err(Error::ckpt(
            path,
            "is a file but not GGUF; give a checkpoint folder (config.json, model.safetensors) or a .gguf file",
        ));
    }
    if !path.exists() {
        return Err(Error::ckpt(path, "no such checkpoint: give a checkpoint folder or a .gguf file"));
    }
    Ok(())
}
