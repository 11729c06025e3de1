use anyhow::{bail, Result};
use brigade::models::checkpoint::{STATE_FILE, TOKENIZER_FILE};
use brigade::models::generate::generate_streaming;
use brigade::models::tokenizer::Tokenizer;
use brigade::models::SampleOptions;
use brigade::train::evaluate::solve_addition;
use brigade::train::persist::saved_config;
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct SampleArgs {
    /// Checkpoint directory: config.json + model.safetensors (+ tokenizer.json).
    #[arg(long)]
    checkpoint: PathBuf,
    /// Text to continue. For a model trained on the addition task: a problem such as 482+139.
    #[arg(long)]
    prompt: String,
    /// Tokens to generate (default 64; addition checkpoints answer with the sum instead).
    #[arg(long)]
    max_tokens: Option<usize>,
    /// 0 is greedy decoding.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Sample among the k most likely tokens only (0: all); needs --temperature above 0.
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Go on past the model's end-of-sequence tokens (the tokenizer's, and those of
    /// generation_config.json) up to --max-tokens, instead of stopping at the first.
    #[arg(long)]
    ignore_eos: bool,
    #[arg(long, default_value_t = crate::threads::default_threads())]
    threads: usize,
    /// Also write the logits of every prompt position, `[prompt tokens, vocab]`, as a float32
    /// .npy file (to compare with another implementation).
    #[arg(long)]
    logits_out: Option<PathBuf>,
}

/// More than any context a model here attends to; bounds what one command can be asked to do.
const MAX_NEW_TOKENS: usize = 1 << 20;

pub fn run(a: SampleArgs) -> Result<()> {
    if a.max_tokens.is_some_and(|n| n > MAX_NEW_TOKENS) {
        bail!("--max-tokens must be at most {MAX_NEW_TOKENS}");
    }
    if a.prompt.is_empty() {
        bail!("--prompt is empty; give some text to continue");
    }
    if !(a.temperature >= 0.0 && a.temperature.is_finite()) {
        bail!("--temperature must be 0 (greedy) or positive, got {}", a.temperature);
    }
    if a.top_k > 0 && a.temperature == 0.0 {
        bail!(
            "--top-k {} has no effect with greedy decoding; give --temperature above 0 (e.g. 0.8) or drop --top-k",
            a.top_k
        );
    }
    crate::threads::check_threads(a.threads, "--threads")?;
    let (model, params) = brigade::models::open::open_model(&a.checkpoint)?;
    // a GGUF file's tokenizer is unpacked into a folder beside nothing of the user's
    let meta = brigade::models::open::metadata_folder(&a.checkpoint)?;
    // A brigade checkpoint says how it was trained; a Hugging Face folder has no trainer state.
    let run = if a.checkpoint.join(STATE_FILE).exists() { Some(saved_config(&a.checkpoint)?) } else { None };
    if let Some(task) = run.as_ref().and_then(|c| c.addition()) {
        if a.max_tokens.is_some() || a.ignore_eos {
            let flag = if a.ignore_eos { "--ignore-eos" } else { "--max-tokens" };
            bail!(
                "this checkpoint was trained on {}-digit addition and answers with the sum; drop {flag}",
                task.digits
            );
        }
        let q = a.prompt.trim().trim_end_matches('=');
        let parsed =
            q.split_once('+').and_then(|(x, y)| Some((x.trim().parse::<u64>().ok()?, y.trim().parse::<u64>().ok()?)));
        let limit = 10u64.pow(task.digits as u32);
        match parsed {
            Some((x, y)) if x < limit && y < limit => {
                let got = brigade::with_threads(a.threads, || solve_addition(&model, &params, &task, &[(x, y)]))?;
                match task.parse_answer(&got[0]) {
                    Some(v) => outln!("{x}+{y}={v}"),
                    None => outln!("{x}+{y}=? (model wrote {:?})", got[0]),
                }
                return Ok(());
            }
            _ => bail!(
                "this checkpoint was trained on {}-digit addition; give a prompt like 482+139 (operands below {limit})",
                task.digits
            ),
        }
    }
    let tok_path = meta.join(TOKENIZER_FILE);
    let trained_with_tokenizer = run.as_ref().is_some_and(|c| c.tokenizer.is_some());
    let tok = if tok_path.exists() {
        Tokenizer::from_file(&tok_path)?
    } else if trained_with_tokenizer {
        bail!(
            "{} is missing: this checkpoint was trained with a Hugging Face tokenizer; copy that tokenizer.json into the checkpoint directory",
            tok_path.display()
        );
    } else {
        Tokenizer::Bytes
    };
    if matches!(tok, Tokenizer::Hf(..)) && tok.vocab_size() > model.cfg.vocab_size {
        bail!(
            "{} has {} tokens but the model only {}; use the tokenizer the model was trained with",
            tok_path.display(),
            tok.vocab_size(),
            model.cfg.vocab_size
        );
    }
    // (under --ignore-eos the file is not read: nothing in it would be used)
    let end = if a.ignore_eos {
        Vec::new()
    } else {
        let generation = brigade::models::generation_config::read(&meta, model.cfg.vocab_size)?;
        brigade::models::generation_config::end_ids(Some(&tok), &generation)
    };
    let ids = tok.encode(&a.prompt)?;
    if ids.is_empty() {
        bail!("the prompt encodes to no tokens");
    }
    model.check_input(
        &ids[ids.len().saturating_sub(model.cfg.block_size)..],
        1,
        ids.len().min(model.cfg.block_size),
    )?;
    let max_new = a.max_tokens.unwrap_or(64.min(model.cfg.block_size.saturating_sub(ids.len())).max(1));
    if ids.len() + max_new > model.cfg.block_size {
        bail!(
            "the prompt's {} tokens and --max-tokens {max_new} exceed the model's context of {} tokens; give --max-tokens {} or less",
            ids.len(),
            model.cfg.block_size,
            model.cfg.block_size.saturating_sub(ids.len())
        );
    }
    let opt = SampleOptions {
        max_new_tokens: max_new,
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: 1.0,
        seed: a.seed,
        stop: end,
    };
    if let Some(path) = &a.logits_out {
        let t = ids.len().min(model.cfg.block_size);
        let ctx = &ids[ids.len() - t..];
        let mut acts = brigade::models::Activations::default();
        brigade::with_threads(a.threads, || model.logits(&params, ctx, (1, t), &mut acts))?;
        let mut bytes = Vec::new();
        brigade::embed::npy::write(&mut bytes, &acts.logits, t, model.cfg.vocab_size)?;
        // written beside, then renamed: never half a file
        brigade::shards::dir::write_atomic(path, &bytes)
            .map_err(|e| anyhow::anyhow!("cannot write --logits-out: {e}"))?;
    }
    // the text streams out as the tokens come: each time the continuation decodes to more
    // complete characters, the new ones are printed
    use std::io::Write as _;
    let mut stdout = std::io::stdout();
    write!(stdout, "{}", a.prompt)
        .and_then(|_| stdout.flush())
        .map_err(|e| anyhow::anyhow!("cannot write to standard output: {e}"))?;
    let (mut got, mut shown, mut failed) = (Vec::new(), 0usize, None);
    brigade::with_threads(a.threads, || {
        generate_streaming(&model, &params, &[ids], &opt, &mut |_, t| {
            // an end-of-sequence token ends the text; it is not part of it
            if opt.stop.contains(&t) {
                return;
            }
            got.push(t);
            let text = tok.decode(&got);
            // a character split across tokens decodes to U+FFFD until its last byte comes
            let ready = text.trim_end_matches('\u{FFFD}');
            if ready.len() > shown && failed.is_none() {
                let new = ready.get(shown..).unwrap_or("");
                if let Err(e) = write!(stdout, "{new}").and_then(|_| stdout.flush()) {
                    failed = Some(e);
                }
                shown = ready.len();
            }
        })
    })?;
    if let Some(e) = failed {
        bail!("cannot write to standard output: {e}");
    }
    let text = tok.decode(&got);
    outln!("{}", text.get(shown..).unwrap_or(""));
    Ok(())
}
