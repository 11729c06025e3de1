//! Generation: the last-position path (`forward_last`, used by `sample` and the evaluation)
//! against the full forward, and a trained addition checkpoint answering as the README says.

use brigade::models::checkpoint::load_model;
use brigade::models::{Activations, Gpt, GptConfig};
use brigade::train::evaluate::solve_addition;
use brigade::train::persist::saved_config;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::Path;

#[test]
fn forward_last_is_the_last_row_of_the_full_logits() {
    let cfg =
        GptConfig { n_layer: 2, n_head: 2, n_embd: 16, vocab_size: 37, block_size: 160, family: Default::default() };
    let model = Gpt::new(cfg).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut params = model.layout.init(9);
    for p in params.iter_mut() {
        *p += rng.gen_range(-0.3..0.3);
    }
    let v = cfg.vocab_size;
    // lengths inside one 64-row attention tile, at its edge, and across several
    for t in [1, 2, 5, 63, 64, 65, 130, 160] {
        let b = 3;
        let tokens: Vec<u32> = (0..b * t).map(|_| rng.gen_range(0..v as u32)).collect();
        let mut acts = Activations::default();
        let last = model.forward_last(&params, &tokens, b, t, &mut acts);
        let mut acts = Activations::default();
        model.logits(&params, &tokens, (b, t), &mut acts);
        for i in 0..b {
            let want = &acts.logits[((i + 1) * t - 1) * v..][..v];
            let got = &last[i * v..(i + 1) * v];
            let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
            for (k, (g, w)) in got.iter().zip(want).enumerate() {
                assert!((g - w).abs() <= 1e-5 * scale, "t={t} seq {i} logit {k}: {g} vs full forward {w}");
            }
        }
    }
}

/// `brigade train --out DIR` with the defaults (the README's quick start), weights and run
/// settings checked in (the optimizer state left out): it must answer 482+139 with 621.
#[test]
fn the_readme_addition_checkpoint_answers_621() {
    let dir = Path::new("tests/fixtures/addition_ckpt");
    let (model, params) = load_model(dir).unwrap();
    let task = saved_config(dir).unwrap().addition().expect("an addition checkpoint");
    let got = solve_addition(&model, &params, &task, &[(482, 139), (999, 1), (0, 0), (123, 877)]);
    let answers: Vec<Option<u64>> = got.iter().map(|g| task.parse_answer(g)).collect();
    assert_eq!(answers, vec![Some(621), Some(1000), Some(0), Some(1000)], "model wrote {got:?}");
}

/// A sequence that emits the stop token is finished: it is padded with the stop token, and
/// generation ends as soon as every sequence has stopped.
#[test]
fn generation_stops_at_the_stop_token() {
    use brigade::models::{generate, SampleOptions};
    let cfg =
        GptConfig { n_layer: 1, n_head: 2, n_embd: 16, vocab_size: 11, block_size: 32, family: Default::default() };
    let model = Gpt::new(cfg).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let mut params = model.layout.init(3);
    for p in params.iter_mut() {
        *p += rng.gen_range(-0.5..0.5);
    }
    let prompts = vec![vec![1, 2, 3], vec![4, 5, 6]];
    let free = SampleOptions { max_new_tokens: 12, temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0, stop: Vec::new() };
    let full = generate(&model, &params, &prompts, &free);
    // stop at the token the first sequence emits second; then at either of it and the token
    // the second sequence emits first (a model's end ids: a list)
    for stops in [vec![full[0][1]], vec![full[0][1], full[1][0]]] {
        let got = generate(&model, &params, &prompts, &SampleOptions { stop: stops.clone(), ..free.clone() });
        let ends = |f: &Vec<u32>| f.iter().position(|x| stops.contains(x)).map_or(f.len(), |k| k + 1);
        for (g, f) in got.iter().zip(&full) {
            let k = ends(f);
            assert_eq!(g[..k.min(g.len())], f[..k.min(g.len())], "stops {stops:?}: greedy tokens before the stop");
            assert!(g[k.min(g.len())..].iter().all(|&x| x == stops[0]), "stops {stops:?}: after the stop: {g:?}");
        }
        let all_stop = full.iter().map(ends).max().unwrap();
        assert_eq!(got[0].len(), all_stop, "stops {stops:?}: generation went on after every sequence stopped: {got:?}");
    }
}
