//! brigade's mixtures of experts against Hugging Face `transformers` (fixtures made by
//! scripts/make_moe_fixture.py): a Qwen2-MoE (a dense layer between two mixtures, a shared
//! expert and its sigmoid gate, probabilities not renormalised) and a Mixtral (softmax over the
//! chosen two). Same weights, same input → same logits, the same cross-entropy plus
//! load-balancing loss, every parameter's gradient (the router's through the balancing loss
//! too), and the same greedy continuation; and on one sequence of a one-layer model, brigade's
//! per-sequence balancing loss is transformers' own.

mod common;
use brigade::models::checkpoint::load_model;
use brigade::models::units::Whole;
use brigade::models::{generate, Activations, Output, Pass, SampleOptions};
use brigade::nn::tp::Tp;
use brigade::tensor::loss::IGNORE;
use common::fixture::{f32s, gradients_match, ids, rel_err};
use safetensors::SafeTensors;
use std::path::Path;

fn targets_of(x: &[u32], t: usize) -> Vec<i32> {
    (0..x.len()).map(|i| if i % t == t - 1 { IGNORE } else { x[i + 1] as i32 }).collect()
}

/// Cross-entropy mean plus the coefficient times the mean balancing loss, for `b` sequences.
fn total_loss(model: &brigade::models::Gpt, params: &[f32], x: &[u32], (b, t): (usize, usize)) -> (f64, f64) {
    let mut acts = Activations::default();
    model.logits(params, x, (b, t), &mut acts);
    let targets = targets_of(x, t);
    let (sum, n) = model.loss(&Tp::SOLO, &targets, &mut acts).unwrap();
    let coef = model.cfg.moe().unwrap().balance as f64;
    let aux = model.aux_losses(&acts).balance / (model.cfg.moe_layers() * b) as f64;
    (sum / n as f64 + coef * aux, aux)
}

fn matches_hugging_face(dir: &str, moe_layers: usize) {
    let dir = Path::new(dir);
    let (model, params) = load_model(dir).expect("loads a Hugging Face save_pretrained directory");
    assert_eq!(model.cfg.moe_layers(), moe_layers, "{dir:?}: mixture layers");
    let bytes = std::fs::read(dir.join("expected.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let (x, b, t) = ids(&st, "input_ids");
    let targets = targets_of(&x, t);
    let count = targets.iter().filter(|&&y| y != IGNORE).count();

    let mut acts = Activations::default();
    model.logits(&params, &x, (b, t), &mut acts);
    let e = rel_err(&acts.logits, &f32s(&st, "logits"));
    assert!(e < 1e-4, "{dir:?}: logits differ from Hugging Face by {e:.2e} (relative)");
    let (loss, aux) = total_loss(&model, &params, &x, (b, t));
    let (want, want_aux) = (f32s(&st, "loss")[0] as f64, f32s(&st, "aux")[0] as f64);
    assert!(((aux - want_aux) / want_aux).abs() < 1e-5, "{dir:?}: balancing loss {aux} vs PyTorch {want_aux}");
    assert!(((loss - want) / want).abs() < 1e-5, "{dir:?}: loss {loss} vs PyTorch {want}");

    model.logits(&params, &x, (b, t), &mut acts);
    model.loss(&Tp::SOLO, &targets, &mut acts).unwrap();
    let mut grads = vec![0f32; model.layout.total];
    let mut store = Whole::new(&model.units, &params, &mut grads);
    let from = Output::Loss { targets: &targets, scale: 1.0 / count as f32 };
    model.backward(&mut Pass::new(&Tp::SOLO, &mut store), &x, from, &mut acts).unwrap();
    gradients_match(&model.layout, &grads, &st, &format!("{dir:?}"));

    let (prompt, _, _) = ids(&st, "prompt_ids");
    let (want, _, n) = ids(&st, "greedy_ids");
    let opt = SampleOptions { max_new_tokens: n, temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0, stop: Vec::new() };
    let got = generate(&model, &params, &[prompt], &opt);
    assert_eq!(got[0], want, "{dir:?}: greedy continuation differs from Hugging Face generate()");
}

#[test]
fn qwen2_moe_matches_hugging_face() {
    matches_hugging_face(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/qwen2_moe_hf"), 2);
}

#[test]
fn mixtral_matches_hugging_face() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/mixtral_hf");
    matches_hugging_face(dir, 1);
    // one sequence through the one-layer model: brigade's per-sequence balancing loss is
    // transformers' own pooled one, and so is the whole loss
    let (model, params) = load_model(Path::new(dir)).unwrap();
    let st_bytes = std::fs::read(Path::new(dir).join("expected.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&st_bytes).unwrap();
    let (x, _, t) = ids(&st, "input_ids");
    let (loss, _) = total_loss(&model, &params, &x[..t], (1, t));
    let want = f32s(&st, "one_seq_loss")[0] as f64;
    assert!(((loss - want) / want).abs() < 1e-5, "one sequence: {loss} vs transformers' {want}");
}

/// Qwen3-MoE: an RMSNorm over each query and key head (q_norm, k_norm) before the rotation,
/// head_dim 16 beside a hidden size of 32 (4 heads), the k probabilities renormalised, no
/// shared expert, the middle layer dense; transformers 5 wrote the expert count as
/// `num_local_experts`.
#[test]
fn qwen3_moe_matches_hugging_face() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/qwen3_moe_hf");
    matches_hugging_face(dir, 2);
    let (model, _) = load_model(Path::new(dir)).unwrap();
    assert!(model.layout.get("model.layers.0.self_attn.q_norm.weight").is_some_and(|s| s.shape == [16]));
}

/// OLMoE: RMSNorms over all of q and all of k at once (q_norm of the 32 features of 4 heads,
/// k_norm of 16), experts `intermediate_size` wide, not renormalised, every layer a mixture.
#[test]
fn olmoe_matches_hugging_face() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/olmoe_hf");
    matches_hugging_face(dir, 2);
    let (model, _) = load_model(Path::new(dir)).unwrap();
    assert!(model.layout.get("model.layers.1.self_attn.q_norm.weight").is_some_and(|s| s.shape == [32]));
    assert!(model.layout.get("model.layers.1.self_attn.k_norm.weight").is_some_and(|s| s.shape == [16]));
}

/// transformers 5's own form of the same weights (scripts/make_fused_moe_fixture.py: its state
/// dict, each layer's experts fused into `gate_up_proj` [E, 2M, C] and `down_proj` [E, C, M],
/// Mixtral's block renamed `mlp`) reads as the same model: every parameter equal to the Hub
/// form's bit for bit, by both readers (the whole-file one and the memory-mapped one of `train
/// --init`), and the fixture's logits. A fused tensor of another shape is refused naming both.
#[test]
fn fused_expert_tensors_read_as_the_hubs() {
    use brigade::models::shard_load::MappedWeights;
    for name in ["qwen2_moe_hf", "mixtral_hf", "qwen3_moe_hf", "olmoe_hf"] {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
        let d = tempfile::tempdir().unwrap();
        std::fs::copy(src.join("config.json"), d.path().join("config.json")).unwrap();
        std::fs::copy(src.join("fused.safetensors"), d.path().join("model.safetensors")).unwrap();
        let (model, hub) = load_model(&src).unwrap();
        let (_, fused) = load_model(d.path()).expect("reads transformers 5's fused experts");
        assert!(hub == fused, "{name}: the fused form reads other numbers than the Hub's");
        let mapped = MappedWeights::open(d.path()).unwrap().read_local(&model.layout, 0, 1, &model.layout).unwrap();
        assert!(hub == mapped, "{name}: the memory-mapped reader reads other numbers from the fused form");
        let bytes = std::fs::read(src.join("expected.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let (x, b, t) = ids(&st, "input_ids");
        let mut acts = Activations::default();
        model.logits(&fused, &x, (b, t), &mut acts);
        let e = rel_err(&acts.logits, &f32s(&st, "logits"));
        assert!(e < 1e-4, "{name}: logits of the fused form differ from Hugging Face by {e:.2e}");

        // one layer's gate_up_proj one expert short: refused with both shapes, by both readers
        let fbytes = std::fs::read(src.join("fused.safetensors")).unwrap();
        let fst = SafeTensors::deserialize(&fbytes).unwrap();
        let mut cut = None;
        let views: Vec<(String, safetensors::tensor::TensorView)> = fst
            .tensors()
            .into_iter()
            .map(|(n, tv)| {
                if cut.is_none() && n.ends_with("experts.gate_up_proj") {
                    let mut s = tv.shape().to_vec();
                    let per: usize = s[1..].iter().product::<usize>() * 4;
                    s[0] -= 1;
                    cut = Some((n.clone(), tv.shape().to_vec(), s.clone()));
                    let short = &tv.data()[..tv.data().len() - per];
                    return (n, safetensors::tensor::TensorView::new(tv.dtype(), s, short).unwrap());
                }
                (n, tv)
            })
            .collect();
        safetensors::serialize_to_file(views, None, &d.path().join("model.safetensors")).unwrap();
        let (bad, full, short) = cut.unwrap();
        let want = [format!("'{bad}'"), format!("{short:?}"), format!("{full:?}")];
        let Err(err) = load_model(d.path()) else { panic!("{name}: a short fused tensor is read") };
        let err = err.to_string();
        assert!(want.iter().all(|w| err.contains(w.as_str())), "{name}: {err}");
        let err = MappedWeights::open(d.path()).unwrap().read_local(&model.layout, 0, 1, &model.layout).unwrap_err();
        assert!(want.iter().all(|w| err.to_string().contains(w.as_str())), "{name}: {err}");
    }
}
