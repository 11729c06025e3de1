//! A model cut into pipeline stages (`Gpt::part`), run stage after stage with the activations
//! and their gradients handed over by hand, computes the whole model's loss and gradients: the
//! seam the pipeline executor is built on.

use brigade::models::units::Whole;
use brigade::models::{Activations, Gpt, GptConfig, Input, Output, Pass};
use brigade::nn::tp::Tp;

fn rel(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-300)).sqrt()
}

/// Cuts of a model's units (`Gpt::part`: 0 the embedding, 1…L the blocks, L + 1 the head) or
/// slots (`Gpt::part_at`: 0 the embedding, 2i + 1 and 2i + 2 block i's attention and MLP
/// halves, 2L + 1 the head).
#[derive(Clone, Copy, Debug)]
enum By {
    Units,
    Slots,
}

/// Runs `cfg` cut as `cuts` stage after stage, the activations and their gradients handed over
/// by hand, and holds the loss and every tensor's gradient to the whole model's.
fn stages_equal_the_whole(cfg: GptConfig, by: By, all_cuts: &[Vec<std::ops::Range<usize>>]) {
    let whole = Gpt::new(cfg).unwrap();
    // every parameter moved off its initial value (biases start at zero, norms at one: a part
    // that dropped one would not show)
    let mut params = whole.init_params(5);
    params.iter_mut().enumerate().for_each(|(i, p)| *p += 0.02 * ((i * 7919 % 201) as f32 / 100.0 - 1.0));
    let (b, t) = (3, 16);
    let v = cfg.vocab_size;
    let tokens: Vec<u32> = (0..b * t).map(|i| ((i * 7 + 3) % v) as u32).collect();
    let targets: Vec<i32> = (0..b * t).map(|i| if i % 5 == 0 { -1 } else { ((i * 11 + 1) % v) as i32 }).collect();
    let counted = targets.iter().filter(|&&x| x >= 0).count();
    let scale = 1.0 / counted as f32;
    let mut acts = Activations::default();
    let mut want = vec![0f32; whole.layout.total];
    let want_loss = whole.forward_backward((&params, &mut want), (&tokens, &targets), (b, t), scale, &mut acts).0;
    let grad_of = |name: &str| whole.layout.get(name).unwrap().view.of(&want).to_vec();

    for cuts in all_cuts {
        let parts: Vec<Gpt> = cuts
            .iter()
            .map(|r| match by {
                By::Units => Gpt::part(cfg, 0, 1, r.clone()).unwrap(),
                By::Slots => Gpt::part_at(cfg, (0, 1), r.clone(), (0, 1)).unwrap(),
            })
            .collect();
        // each part's parameters: its tensors of the whole model's (the last part's token-table copy too)
        let mut ps: Vec<Vec<f32>> = Vec::new();
        for part in &parts {
            let mut p = vec![0f32; part.layout.total];
            for s in &part.layout.specs {
                s.view.of_mut(&mut p).copy_from_slice(whole.layout.get(&s.name).unwrap().view.of(&params));
            }
            ps.push(p);
        }
        let mut gs: Vec<Vec<f32>> = parts.iter().map(|p| vec![0f32; p.layout.total]).collect();
        let mut acts: Vec<Activations> = parts.iter().map(|_| Activations::default()).collect();
        let mut hidden: Vec<f32> = Vec::new();
        for (k, part) in parts.iter().enumerate() {
            let input = if k == 0 { Input::Tokens(&tokens) } else { Input::Hidden(&hidden) };
            let mut store = Whole::reading(&part.units, &ps[k]);
            part.forward(&mut Pass::new(&Tp::SOLO, &mut store), input, (b, t), &mut acts[k]).unwrap();
            hidden = acts[k].output().to_vec();
        }
        let last = parts.len() - 1;
        let loss = parts[last].loss(&Tp::SOLO, &targets, &mut acts[last]).unwrap().0;
        assert_eq!(loss, want_loss, "{by:?} {cuts:?}: the loss");
        let mut dy: Vec<f32> = Vec::new();
        for (k, part) in parts.iter().enumerate().rev() {
            let from = if k == last { Output::Loss { targets: &targets, scale } } else { Output::Grad(&dy) };
            let mut store = Whole::new(&part.units, &ps[k], &mut gs[k]);
            part.backward(&mut Pass::new(&Tp::SOLO, &mut store), &tokens, from, &mut acts[k]).unwrap();
            dy = acts[k].input_grad().to_vec();
        }
        // every tensor's gradient, held by exactly one part; the token table's from its two
        // copies summed
        let table = cfg.embedding_name();
        for s in &whole.layout.specs {
            let mut got = vec![0f32; s.view.len];
            let mut copies = 0;
            for (part, g) in parts.iter().zip(&gs) {
                if let Some(spec) = part.layout.get(&s.name) {
                    got.iter_mut().zip(spec.view.of(g)).for_each(|(a, b)| *a += b);
                    copies += 1;
                }
            }
            let expect_copies = if s.name == table && cfg.tied() && parts.len() > 1 { 2 } else { 1 };
            assert_eq!(copies, expect_copies, "{by:?} {cuts:?}: {} held by {copies} parts", s.name);
            let e = rel(&got, &grad_of(&s.name));
            assert!(e < 1e-6, "{by:?} {cuts:?}: {} differs by {e:.1e}", s.name);
        }
    }
}

#[test]
#[allow(clippy::single_range_in_vec_init)] // a list of cuts, the first of one stage
fn stages_run_in_turn_equal_the_whole_model() {
    let cfg =
        GptConfig { n_layer: 4, n_head: 4, n_embd: 32, vocab_size: 61, block_size: 16, family: Default::default() };
    // units 0 (embedding), 1–4 (blocks), 5 (ln_f + head)
    let units = [vec![0..6], vec![0..3, 3..6], vec![0..1, 1..5, 5..6], vec![0..2, 2..3, 3..4, 4..6], vec![0..5, 5..6]];
    stages_equal_the_whole(cfg, By::Units, &units);
    // slots 0 (embedding), 1–8 (each block's attention and MLP halves), 9 (ln_f + head): cuts
    // between a block's halves, a stage of one half, a stage ending or starting inside a block
    let slots = [
        vec![0..10],
        vec![0..2, 2..10],
        vec![0..4, 4..10],
        vec![0..1, 1..2, 2..3, 3..9, 9..10],
        vec![0..5, 5..6, 6..10],
        vec![0..9, 9..10],
        vec![0..3, 3..8, 8..10],
    ];
    stages_equal_the_whole(cfg, By::Slots, &slots);
    // a part of units or slots beyond the model is refused
    assert!(Gpt::part(cfg, 0, 1, 3..7).is_err());
    assert!(Gpt::part(cfg, 0, 1, 2..2).is_err());
    assert!(Gpt::part_at(cfg, (0, 1), 3..11, (0, 1)).is_err());
    assert!(Gpt::part_at(cfg, (0, 1), 4..4, (0, 1)).is_err());
}

/// The Llama family (RMSNorm, rotary grouped-query attention, an untied head) and a mixture of
/// experts (its auxiliary losses summed over the parts holding its MLP halves), cut inside
/// blocks.
#[test]
fn llama_and_mixture_stages_cut_inside_blocks_equal_the_whole_model() {
    use brigade::models::family::PRESETS;
    for name in ["llama-tiny", "moe-tiny", "qwen3-moe-tiny"] {
        let (_, _, family) = PRESETS.iter().find(|p| p.0 == name).copied().unwrap();
        let cfg = GptConfig { n_layer: 3, n_head: 4, n_embd: 128, vocab_size: 256, block_size: 16, family };
        let slots = [vec![0..2, 2..8], vec![0..3, 3..4, 4..7, 7..8], vec![0..7, 7..8]];
        stages_equal_the_whole(cfg, By::Slots, &slots);
    }
}
