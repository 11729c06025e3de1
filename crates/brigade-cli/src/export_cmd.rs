//! `brigade export CHECKPOINT --gguf OUT.gguf [--type f32|f16|q8_0|q4_0|q4_k]`: a checkpoint (ours
//! or a Hugging Face folder of either family) as one GGUF file for llama.cpp and Ollama.
//! `brigade quantize IN OUT.gguf --type …` is the same writer.

use anyhow::{bail, Result};
use brigade::models::gguf::{export, export_model, FileType};
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// Checkpoint directory (config.json, model.safetensors, tokenizer.json): a `brigade train
    /// --out` directory or a Hugging Face folder.
    checkpoint: PathBuf,
    /// Write a GGUF file here (metadata, tokenizer, chat template, tensors under llama.cpp's names).
    #[arg(long, value_name = "OUT.gguf")]
    gguf: Option<PathBuf>,
    /// How matrices are stored: f32 (exact), f16, q8_0 (8 bits per weight plus a scale per
    /// 32), q4_0 (4 bits plus a scale per 32), or q4_k (llama.cpp's Q4_K: 4 bits, a 6-bit scale
    /// and minimum per 32 under an f16 pair per 256; rows not a multiple of 256 as Q5_0); with
    /// q4_0 and q4_k the token table and output layer at q8_0; norms and biases stay f32.
    /// Quantized byte for byte as llama.cpp's quantizers do.
    #[arg(long = "type", default_value = "f32", value_name = "f32|f16|q8_0|q4_0|q4_k")]
    ty: String,
}

/// `brigade quantize IN OUT.gguf --type …`: the export's writer under the name llama.cpp's tool
/// has.
#[derive(Args, Debug)]
pub struct QuantizeArgs {
    /// Checkpoint directory (a `brigade train --out` directory or a Hugging Face folder), or a
    /// GGUF file (dequantized, then written in `--type`).
    checkpoint: PathBuf,
    /// The GGUF file to write.
    out: PathBuf,
    #[arg(long = "type", default_value = "q8_0", value_name = "f32|f16|q8_0|q4_0|q4_k")]
    ty: String,
}

pub fn quantize(a: QuantizeArgs) -> Result<()> {
    run(ExportArgs { checkpoint: a.checkpoint, gguf: Some(a.out), ty: a.ty })
}

pub fn run(a: ExportArgs) -> Result<()> {
    let ty = FileType::parse(&a.ty)?;
    let Some(out) = a.gguf else {
        bail!("say what to export to: --gguf OUT.gguf (the one format brigade exports; a checkpoint is a Hugging Face folder already)");
    };
    if out.is_dir() {
        bail!("--gguf {} is a directory; give a file name such as model.gguf", out.display());
    }
    // a GGUF file too (llama-quantize's input): its weights dequantized, its metadata unpacked
    let e = if brigade::models::gguf::import::is_gguf(&a.checkpoint) {
        let (model, params) = brigade::models::open::open_model(&a.checkpoint)?;
        let meta = brigade::models::open::metadata_folder(&a.checkpoint)?;
        let name = a.checkpoint.file_stem().map(|n| n.to_string_lossy().into_owned());
        export_model((&model, &params), &meta, name, &out, ty)?
    } else {
        export(&a.checkpoint, &out, ty)?
    };
    outln!(
        "wrote {} ({} tensors, {:.1} MB, llama.cpp architecture {}, tokenizer pre-split {}, {})",
        out.display(),
        e.tensors,
        e.bytes as f64 / 1e6,
        e.arch,
        e.pre,
        a.ty
    );
    Ok(())
}
