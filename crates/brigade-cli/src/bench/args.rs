//! Flags and helpers more than one benchmark takes.

use anyhow::Result;
use clap::Args;

/// The training step's shape a benchmark runs at.
#[derive(Args, Debug)]
pub struct ShapeArgs {
    /// A model preset, or a Hugging Face folder whose config.json gives the shape (random
    /// weights either way).
    #[arg(long, default_value = "gpt2-small")]
    pub(crate) model: String,
    #[arg(long, default_value_t = 256)]
    pub(crate) seq: usize,
    #[arg(long, default_value_t = 4)]
    pub(crate) batch: usize,
    #[arg(long, default_value_t = crate::threads::default_threads())]
    pub(crate) threads: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

/// The training step a benchmark times.
#[derive(Args, Debug)]
pub struct StepArgs {
    #[command(flatten)]
    pub(crate) shape: ShapeArgs,
    /// Steps timed (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub(crate) steps: usize,
}

/// The generation load a serving benchmark runs: a model shape, concurrent requests, prompt
/// and output lengths (shared by `bench engine` and `bench serve`).
#[derive(Args, Debug)]
pub struct LoadArgs {
    /// Model preset (random weights).
    #[arg(long, default_value = "gpt2-small")]
    pub(crate) model: String,
    /// Concurrent requests, comma-separated: one row each.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    pub(crate) concurrency: Vec<usize>,
    #[arg(long, default_value_t = 32)]
    pub(crate) prompt_len: usize,
    #[arg(long, default_value_t = 64)]
    pub(crate) output_len: usize,
    #[arg(long, default_value_t = crate::threads::default_threads())]
    pub(crate) threads: usize,
    #[arg(long)]
    pub(crate) json: bool,
}

/// A training run of `model` on random text (enough for any window: a step's cost does not
/// depend on it), in a fresh directory the caller removes.
pub(crate) fn text_run(
    model: &str,
    seq: usize,
    batch: usize,
    micro_batch: Option<usize>,
    steps: usize,
) -> Result<(brigade::train::TrainConfig, std::path::PathBuf)> {
    let dir = tempfile_dir()?;
    let data = dir.join("bench.txt");
    let text: String = {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        (0..20 * (seq + 1) + 1000).map(|_| rng.gen_range(b'a'..=b'z') as char).collect()
    };
    std::fs::write(&data, text)?;
    // a Hugging Face folder's shape (its config.json), random weights, as `bench train --model DIR`
    let folder = std::path::Path::new(model);
    let shape_from = folder.join("config.json").is_file().then(|| folder.to_path_buf());
    let cfg = brigade::train::TrainConfig {
        model: model.to_string(),
        shape_from,
        data: Some(data),
        seq: Some(seq),
        batch,
        micro_batch,
        steps,
        eval_every: 0,
        ..Default::default()
    };
    Ok((cfg, dir))
}

/// `--layouts`: layouts separated by ';' (blanks ignored), each parsed, checked as a training
/// layout and then by the benchmark's own `check`, in order, with the text it was given as.
pub(crate) fn training_layouts(
    layouts: &str,
    check: impl Fn(&str, &brigade::layout::Layout) -> Result<()>,
) -> Result<Vec<(String, brigade::layout::Layout)>> {
    let mut parsed = Vec::new();
    for l in layouts.split(';').map(str::trim).filter(|l| !l.is_empty()) {
        let layout = brigade::layout::Layout::parse(l)?;
        layout.check_training()?;
        check(l, &layout)?;
        parsed.push((l.to_string(), layout));
    }
    Ok(parsed)
}

/// A fresh private directory under the system's temporary directory.
pub(crate) fn tempfile_dir() -> Result<std::path::PathBuf> {
    let d = std::env::temp_dir().join(format!("brigade-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
