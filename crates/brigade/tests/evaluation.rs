//! What the trainer reports at the end of a run, against independent computations: held-out
//! accuracy of the README's addition checkpoint, a text run's validation loss against one
//! direct forward pass, the prompt it samples from, and the settings a checkpoint records.

use brigade::models::checkpoint::load_model;
use brigade::models::Activations;
use brigade::train::persist::saved_config;
use brigade::train::{EvalReport, TrainConfig, Trainer};
use std::path::Path;

#[test]
fn the_addition_checkpoint_scores_as_trained() {
    let dir = Path::new("tests/fixtures/addition_ckpt");
    let mut tr = Trainer::new(saved_config(dir).unwrap()).unwrap();
    tr.params = load_model(dir).unwrap().1;
    assert_eq!(tr.data_prompt(), "482+139=");
    match tr.evaluate() {
        EvalReport::Addition { correct, total, examples } => {
            assert_eq!(total, 1000);
            // the count, exactly: each of the 1000 problems (every one held out of training)
            // answered by a greedy generation of its own, read back here and compared with
            // the sum computed here
            let a = brigade::train::addition::Addition { digits: 3, reverse: true, carry_chains: 0.0 };
            let problems = a.eval_set(1000);
            assert!(problems.iter().all(|&(x, y)| a.held_out(x, y)), "an evaluated problem is a training one");
            let (model, params) = load_model(dir).unwrap();
            let opt = brigade::models::SampleOptions {
                max_new_tokens: 5,
                temperature: 0.0,
                top_k: 0,
                top_p: 1.0,
                seed: 0,
                stop: vec![b'\n' as u32],
            };
            let mut answers = Vec::new();
            for &(x, y) in &problems {
                let prompt: Vec<u32> = format!("{x:03}+{y:03}=").bytes().map(u32::from).collect();
                let ids = &brigade::models::generate(&model, &params, &[prompt], &opt)[0];
                // four digits, least significant first, then the newline
                let text: String = ids.iter().map(|&i| i as u8 as char).collect();
                let sum = (text.len() == 5 && text.ends_with('\n'))
                    .then(|| text[..4].chars().rev().collect::<String>().parse::<u64>().ok())
                    .flatten();
                answers.push((x, y, sum));
            }
            let right = answers.iter().filter(|(x, y, s)| *s == Some(x + y)).count();
            assert_eq!(correct, right, "the reported count against the answers counted here");
            // and the model is the trained one (the run that wrote it reported 999/1000)
            assert!(correct >= 990, "{correct}/{total}");
            assert_eq!(examples.len(), 8);
            for ((q, want, shown), (x, y, sum)) in examples.iter().zip(&answers) {
                assert_eq!(q, &format!("{x}+{y}"));
                assert_eq!(want, &(x + y).to_string());
                assert_eq!(Some(shown), sum.map(|s| s.to_string()).as_ref(), "{q}: the answer shown");
            }
        }
        other => panic!("{other:?}"),
    }
    // a fresh model knows nothing
    let mut fresh = Trainer::new(saved_config(dir).unwrap()).unwrap();
    match fresh.evaluate() {
        EvalReport::Addition { correct, .. } => assert!(correct < 50, "{correct}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn text_validation_loss_is_the_mean_over_the_held_out_windows() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("t.txt");
    let text: String = (0..300).map(|i| format!("line {i}: the quick brown fox jumps over the lazy dog.\n")).collect();
    std::fs::write(&f, &text).unwrap();
    let cfg = TrainConfig {
        data: Some(f.clone()),
        seq: Some(24),
        batch: 8,
        micro_batch: Some(4),
        n_embd: Some(32),
        eval_every: 0,
        steps: 3,
        ..TrainConfig::default()
    };
    let mut tr = Trainer::new(cfg).unwrap();
    tr.train_step().unwrap();
    let got = match tr.evaluate() {
        EvalReport::Text { val_loss } => val_loss as f64,
        other => panic!("{other:?}"),
    };
    let brigade::train::data::Dataset::Text(data) = &tr.data else { panic!("text data") };
    let (x, y) = data.val_batch(16, 24);
    let mut acts = Activations::default();
    tr.model.logits(&tr.params, &x, (16, 24), &mut acts);
    let (sum, n) = tr.model.loss(&brigade::nn::tp::Tp::SOLO, &y, &mut acts).unwrap();
    let want = sum / n as f64;
    assert!((got - want).abs() < 1e-5 * want, "validation loss {got} vs one pass {want}");
    // the prompt is the start of the held-out text
    let prompt = tr.data_prompt();
    assert_eq!(prompt.len(), 8);
    assert!(text.contains(&prompt), "{prompt:?}");
    // the checkpoint records the run's settings, with the data as an absolute path
    let ck = d.path().join("ck");
    tr.save(&ck).unwrap();
    let saved = saved_config(&ck).unwrap();
    assert_eq!(saved.data.as_deref(), Some(std::path::absolute(&f).unwrap().as_path()));
    assert_eq!((saved.batch, saved.micro_batch, saved.seq), (8, Some(4), Some(24)));
}
