//! What `brigade bench embed` needs besides the job itself: a corpus like the
//! sentence-transformers peer's (../shared/peers/bench_minilm.py) and this machine's matrix
//! product rate at the encoder's shapes.

use super::machine::time_it;
use crate::models::bert::BertConfig;
use crate::tensor::{gemm_into, Mat, Threads};
use rand::{Rng, SeedableRng};
use std::path::Path;

/// `n` pseudo-sentences of 20–40 whole words from the model's `vocab.txt` (alphabetic ASCII,
/// 3+ letters), commas every 5–9 words, capitalised, ending with a period — the peer's recipe.
pub fn synthetic_corpus(vocab_txt: &Path, n: usize, seed: u64) -> crate::Result<Vec<String>> {
    let text = std::fs::read_to_string(vocab_txt).map_err(|e| crate::Error::io(vocab_txt, e))?;
    let words: Vec<&str> =
        text.lines().filter(|w| w.len() >= 3 && w.bytes().all(|b| b.is_ascii_alphabetic())).collect();
    if words.is_empty() {
        return Err(crate::Error::Data(format!(
            "{} holds no whole words to build sentences from",
            vocab_txt.display()
        )));
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    Ok((0..n)
        .map(|_| {
            let k = rng.gen_range(20..=40);
            let mut ws: Vec<String> = (0..k).map(|_| words[rng.gen_range(0..words.len())].to_string()).collect();
            let step = rng.gen_range(5..=9);
            for j in (3..k - 1).step_by(step) {
                ws[j].push(',');
            }
            let mut s = ws.join(" ");
            s[..1].make_ascii_uppercase();
            s.push('.');
            s
        })
        .collect())
}

/// The products' GFLOP/s with `workers` threads each running its own single-threaded product
/// at once, the way `embed --workers N --threads 1` uses the cores (summed over the workers).
pub fn encoder_matmul_gflops_concurrent(cfg: &BertConfig, tokens: usize, workers: usize) -> crate::Result<f64> {
    super::concurrent(workers, || encoder_matmul_gflops(cfg, tokens))
}

/// As `encoder_matmul_gflops_concurrent` with the kernel the embedding itself runs: the
/// row-invariant products over packed weights (`matmul_rows`), whose rate bounds the job's.
pub fn encoder_rows_gflops_concurrent(cfg: &BertConfig, tokens: usize, workers: usize) -> crate::Result<f64> {
    super::concurrent(workers, || encoder_rows_gflops(cfg, tokens))
}

/// GFLOP/s of one encoder layer's four products (qkv, attention output, MLP up and down) at
/// `tokens` rows, on the current rayon pool.
pub fn encoder_matmul_gflops(cfg: &BertConfig, tokens: usize) -> f64 {
    let (c, i, shapes) = layer_products(cfg);
    let x = vec![0.5f32; tokens * i];
    let w = vec![0.25f32; i * 3 * c];
    let mut y = vec![0f32; tokens * i.max(3 * c)];
    let s = time_it(|| {
        for &(k, m) in &shapes {
            gemm_into(&mut y, Mat::rm(tokens, m), &x, Mat::rm(tokens, k), &w, Mat::rm(k, m), 1.0, false, Threads::Pool);
        }
    });
    layer_flops(&shapes, tokens) / s / 1e9
}

/// As `encoder_matmul_gflops` with `matmul_rows` over the weights packed as the encoder packs
/// them.
pub fn encoder_rows_gflops(cfg: &BertConfig, tokens: usize) -> f64 {
    use crate::tensor::rowwise::{matmul_rows, Packed};
    let (c, i, shapes) = layer_products(cfg);
    let x = vec![0.5f32; tokens * i];
    let ws: Vec<(usize, usize, Packed)> =
        shapes.iter().map(|&(k, m)| (k, m, Packed::new(&vec![0.25f32; k * m], k, m))).collect();
    let mut y = vec![0f32; tokens * i.max(3 * c)];
    let s = time_it(|| {
        for (k, m, w) in &ws {
            matmul_rows(&mut y[..tokens * m], &x[..tokens * k], w, tokens);
        }
    });
    layer_flops(&shapes, tokens) / s / 1e9
}

/// The width, the MLP's width and one layer's four products `(k, n)`: qkv, attention output,
/// MLP up and down.
fn layer_products(cfg: &BertConfig) -> (usize, usize, [(usize, usize); 4]) {
    let (c, i) = (cfg.hidden, cfg.intermediate);
    (c, i, [(c, 3 * c), (c, c), (c, i), (i, c)])
}

/// The FLOPs of `shapes` at `tokens` rows.
fn layer_flops(shapes: &[(usize, usize)], tokens: usize) -> f64 {
    shapes.iter().map(|&(k, m)| 2.0 * (tokens * k * m) as f64).sum()
}
