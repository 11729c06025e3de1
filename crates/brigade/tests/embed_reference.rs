//! all-MiniLM-L6-v2 against sentence-transformers: the same token ids as its tokenizer and
//! vectors with cosine ≥ 1 − 1e-7 to its `encode()` output, each component within a few
//! times f32 rounding of it (../shared/anchors, made by
//! ../shared/peers/bench_minilm.py reference). Skips with a message when ../shared is absent.

use brigade::embed::{npy, Encoder};
use std::path::PathBuf;

mod common;
use common::shared;

fn setup() -> Option<(Encoder, Vec<String>, PathBuf)> {
    let model = shared("models/all-MiniLM-L6-v2")?;
    let anchors = shared("anchors")?;
    let enc = Encoder::load(&model).unwrap();
    let text = std::fs::read_to_string(anchors.join("minilm_reference.txt")).unwrap();
    Some((enc, text.lines().map(str::to_string).collect(), anchors))
}

#[test]
fn token_ids_match_the_reference_tokenizer() {
    let Some((enc, sents, anchors)) = setup() else { return };
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(anchors.join("minilm_reference_tokens.json")).unwrap()).unwrap();
    let want = v["input_ids"].as_array().unwrap();
    assert_eq!(want.len(), sents.len());
    assert_eq!(v["max_seq_length"].as_u64().unwrap() as usize, enc.max_len);
    let mut truncated = 0;
    for (s, w) in sents.iter().zip(want) {
        let w: Vec<u32> = w.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        let t = enc.tokenize(s).unwrap();
        assert_eq!(t.ids, w, "tokens of {s:?}");
        truncated += t.truncated as usize;
    }
    assert_eq!(truncated, 1, "exactly one reference sentence is longer than 256 tokens");
}

/// The largest difference of one component (of a unit vector, components ≈ 0.05) from
/// sentence-transformers' allowed: measured 4.3e-7 over the 64 sentences, packed and alone
/// (2026-12-01), so 1e-6; the cosine bound alone would let a component move by 4e-4.
const COMPONENT: f32 = 1e-6;

#[test]
fn vectors_match_sentence_transformers() {
    let Some((enc, sents, anchors)) = setup() else { return };
    let (rows, cols, want) = npy::read(&std::fs::read(anchors.join("minilm_reference.npy")).unwrap()).unwrap();
    assert_eq!((rows, cols), (sents.len(), enc.dim()));
    let refs: Vec<&str> = sents.iter().map(String::as_str).collect();
    // all at once (packed), and one at a time: both must agree with the reference
    let together = enc.embed(&refs).unwrap();
    let (mut worst, mut worst_component) = (1f64, 0f32);
    for (i, s) in refs.iter().enumerate() {
        let alone = enc.embed(&[s]).unwrap();
        let got = &together[i * cols..(i + 1) * cols];
        let w = &want[i * cols..(i + 1) * cols];
        let cos = |a: &[f32]| {
            let dot: f64 = a.iter().zip(w).map(|(&x, &y)| x as f64 * y as f64).sum();
            let na: f64 = a.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
            let nb: f64 = w.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
            dot / (na * nb)
        };
        let (c1, c2) = (cos(got), cos(&alone));
        assert!(c1 >= 1.0 - 1e-7 && c2 >= 1.0 - 1e-7, "sentence {i} {s:?}: cosine {c1} packed, {c2} alone");
        worst = worst.min(c1).min(c2);
        // each component: f32 rounding in another order, no more (a changed activation or
        // normalisation moves components by 1e-3 and more)
        let diff = |a: &[f32]| a.iter().zip(w).map(|(&x, &y)| (x - y).abs()).fold(0f32, f32::max);
        let (d1, d2) = (diff(got), diff(&alone));
        assert!(
            d1 <= COMPONENT && d2 <= COMPONENT,
            "sentence {i} {s:?}: a component off by {d1:e} packed, {d2:e} alone"
        );
        worst_component = worst_component.max(d1).max(d2);
        let norm: f32 = got.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "vectors are normalised");
    }
    eprintln!(
        "worst cosine to sentence-transformers over {} sentences: {worst:.12}; worst component {worst_component:e}",
        refs.len()
    );
}
