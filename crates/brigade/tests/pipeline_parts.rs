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

#[test]
#[allow(clippy::single_range_in_vec_init)] // a list of cuts, the first of one stage
fn stages_run_in_turn_equal_the_whole_model() {
    let cfg =
        GptConfig { n_layer: 4, n_head: 4, n_embd: 32, vocab_size: 61, block_size: 16, family: Default::default() };
    let whole = Gpt::new(cfg).unwrap();
    let params = whole.init_params(5);
    let (b, t) = (3, 16);
    let tokens: Vec<u32> = (0..b * t).map(|i| ((i * 7 + 3) % 61) as u32).collect();
    let targets: Vec<i32> = (0..b * t).map(|i| if i % 5 == 0 { -1 } else { ((i * 11 + 1) % 61) as i32 }).collect();
    let counted = targets.iter().filter(|&&x| x >= 0).count();
    let scale = 1.0 / counted as f32;
    let mut acts = Activations::default();
    let mut want = vec![0f32; whole.layout.total];
    let want_loss = whole.forward_backward((&params, &mut want), (&tokens, &targets), (b, t), scale, &mut acts).0;
    let grad_of = |name: &str| whole.layout.get(name).unwrap().view.of(&want).to_vec();

    // units 0 (embedding), 1–4 (blocks), 5 (ln_f + head)
    for cuts in [vec![0..6], vec![0..3, 3..6], vec![0..1, 1..5, 5..6], vec![0..2, 2..3, 3..4, 4..6], vec![0..5, 5..6]] {
        let parts: Vec<Gpt> = cuts.iter().map(|r| Gpt::part(cfg, 0, 1, r.clone()).unwrap()).collect();
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
        assert_eq!(loss, want_loss, "{cuts:?}: the loss");
        let mut dy: Vec<f32> = Vec::new();
        for (k, part) in parts.iter().enumerate().rev() {
            let from = if k == last { Output::Loss { targets: &targets, scale } } else { Output::Grad(&dy) };
            let mut store = Whole::new(&part.units, &ps[k], &mut gs[k]);
            part.backward(&mut Pass::new(&Tp::SOLO, &mut store), &tokens, from, &mut acts[k]).unwrap();
            dy = acts[k].input_grad().to_vec();
        }
        // every tensor's gradient; the token table's from its two copies summed
        for s in &whole.layout.specs {
            let mut got = vec![0f32; s.view.len];
            let mut copies = 0;
            for (part, g) in parts.iter().zip(&gs) {
                if let Some(spec) = part.layout.get(&s.name) {
                    got.iter_mut().zip(spec.view.of(g)).for_each(|(a, b)| *a += b);
                    copies += 1;
                }
            }
            let expect_copies = if s.name == "wte.weight" && parts.len() > 1 { 2 } else { 1 };
            assert_eq!(copies, expect_copies, "{cuts:?}: {} held by {copies} parts", s.name);
            let e = rel(&got, &grad_of(&s.name));
            assert!(e < 1e-6, "{cuts:?}: {} differs by {e:.1e}", s.name);
        }
    }
    // a part of units beyond the model is refused
    assert!(Gpt::part(cfg, 0, 1, 3..7).is_err());
    assert!(Gpt::part(cfg, 0, 1, 2..2).is_err());
}
