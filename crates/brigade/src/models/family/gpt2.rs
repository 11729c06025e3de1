//! GPT-2: learned positions, LayerNorm, a fused biased q|k|v (`c_attn`), a GELU MLP of width
//! 4·C, every product stored `[in, out]` with a bias (Conv1D), the head tied to the token
//! table. Tensor names as Hugging Face's `GPT2Model` (`h.0.attn.c_attn.weight`; files from
//! the Hub may prefix them `transformer.`).

use super::spec::{
    AttnSpec, BlockSpec, Describe, GgufArch, GgufNum, Linear, MlpSpec, NormKind, NormSpec, Orient, Overrides,
    Positions, Qkv, Shape,
};
use serde_json::Value;

/// The GPT-2 family (it has no fields of its own).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Gpt2;

/// Named GPT-2 shapes `[layers, heads, hidden, vocab, positions]`: `tiny` for tests and the
/// built-in task, then the published sizes.
#[rustfmt::skip]
pub const PRESETS: &[(&str, [usize; 5])] = &[
    ("tiny", [2, 4, 128, 256, 64]),
    ("gpt2-small", [12, 12, 768, 50257, 1024]),
    ("gpt2-medium", [24, 16, 1024, 50257, 1024]),
    ("gpt2-large", [36, 20, 1280, 50257, 1024]),
    ("gpt2-xl", [48, 25, 1600, 50257, 1024]),
];

/// The small model the tests run for this family: 4 heads of 16.
pub fn example(vocab: usize, context: usize) -> Shape {
    Shape::of([2, 4, 64, vocab, context])
}

fn linear(name: String, (d_in, d_out): (usize, usize)) -> Linear {
    Linear { name, d_in, d_out, bias: true, orient: Orient::InOut }
}

impl Describe for Gpt2 {
    fn kv_heads(&self, s: &Shape) -> usize {
        s.n_head
    }

    fn head_dim(&self, s: &Shape) -> usize {
        s.n_embd / s.n_head.max(1)
    }

    fn mlp_width(&self, s: &Shape) -> usize {
        4 * s.n_embd
    }

    fn tied(&self) -> bool {
        true
    }

    fn sizes(&self) -> Vec<(&'static str, usize)> {
        Vec::new()
    }

    fn check(&self, s: &Shape) -> Result<(), String> {
        if !s.n_embd.is_multiple_of(s.n_head) {
            return Err(format!(
                "n_embd ({}) must be divisible by n_head ({}); pick n_head among the divisors of n_embd",
                s.n_embd, s.n_head
            ));
        }
        Ok(())
    }

    fn block(&self, s: &Shape, i: usize) -> BlockSpec {
        let c = s.n_embd;
        let prefix = format!("h.{i}");
        let ln = |n: &str| NormSpec {
            kind: NormKind::Layer { eps: crate::tensor::layernorm::EPS },
            name: format!("{prefix}.{n}"),
        };
        BlockSpec {
            ln_1: ln("ln_1"),
            attn: AttnSpec {
                qkv: Qkv::Fused(linear(format!("{prefix}.attn.c_attn"), (c, 3 * c))),
                o: linear(format!("{prefix}.attn.c_proj"), (c, c)),
                qk_norm: None,
            },
            ln_2: ln("ln_2"),
            mlp: MlpSpec::Gelu {
                fc: linear(format!("{prefix}.mlp.c_fc"), (c, 4 * c)),
                proj: linear(format!("{prefix}.mlp.c_proj"), (4 * c, c)),
            },
            std: 0.02,
            // GPT-2 scales the projections into the residual stream by 1/sqrt(2·n_layer)
            proj_std: 0.02 / (2.0 * s.n_layer as f32).sqrt(),
            prefix,
        }
    }

    fn positions(&self, _: &Shape) -> Positions {
        Positions::Learned { name: "wpe.weight".into() }
    }

    fn embedding(&self) -> &'static str {
        "wte.weight"
    }

    fn final_norm(&self) -> NormSpec {
        NormSpec { kind: NormKind::Layer { eps: crate::tensor::layernorm::EPS }, name: "ln_f".into() }
    }

    fn gguf(&self, s: &Shape) -> GgufArch {
        let u = |v: usize| GgufNum::U32(v as u32);
        GgufArch {
            arch: "gpt2",
            keys: vec![
                ("block_count", u(s.n_layer)),
                ("context_length", u(s.block_size)),
                ("embedding_length", u(s.n_embd)),
                ("feed_forward_length", u(4 * s.n_embd)),
                ("attention.head_count", u(s.n_head)),
                ("attention.layer_norm_epsilon", GgufNum::F32(crate::tensor::layernorm::EPS)),
            ],
            interleave_qk: false,
        }
    }

    fn hf_config(&self, s: &Shape) -> Value {
        serde_json::json!({
            "model_type": "gpt2",
            "architectures": ["GPT2LMHeadModel"],
            "n_layer": s.n_layer,
            "n_head": s.n_head,
            "n_embd": s.n_embd,
            "vocab_size": s.vocab_size,
            "n_positions": s.block_size,
            "n_ctx": s.block_size,
            "n_inner": null,
            "activation_function": "gelu_new",
            "layer_norm_epsilon": crate::tensor::layernorm::EPS,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "tie_word_embeddings": true,
            "torch_dtype": "float32",
            // GPT-2's <|endoftext|> where the vocabulary is GPT-2's; none for byte-level models
            "bos_token_id": (s.vocab_size == 50257).then_some(50256),
            "eos_token_id": (s.vocab_size == 50257).then_some(50256)
        })
    }

    fn reshape(&mut self, _: &Shape, o: Overrides, preset: &str) -> Result<(), String> {
        if o.n_kv_head.is_some() || o.intermediate.is_some() {
            return Err(format!(
                "n_kv_head and intermediate_size set the Llama family's shape; {preset} is a GPT-2 preset (use e.g. model = \"llama-tiny\")"
            ));
        }
        Ok(())
    }
}

/// The shape from a Hugging Face GPT-2 `config.json`; any value brigade does not implement
/// is refused naming its key.
pub fn parse(v: &Value) -> Result<Shape, String> {
    let field = |k: &str| -> Result<usize, String> {
        v.get(k)
            .and_then(|x| x.as_u64())
            .map(|x| x as usize)
            .ok_or_else(|| format!("missing integer field '{k}'; is this a GPT-2 config?"))
    };
    if let Some(act) = v.get("activation_function").and_then(|a| a.as_str()) {
        if act != "gelu_new" && act != "gelu_pytorch_tanh" {
            return Err(format!(
                "activation_function '{act}' is not supported; brigade implements GPT-2's tanh GELU (gelu_new)"
            ));
        }
    }
    // what changes GPT-2's function and brigade does not implement: refused, never ignored
    if let Some(eps) = v.get("layer_norm_epsilon").and_then(|x| x.as_f64()) {
        if eps as f32 != crate::tensor::layernorm::EPS {
            return Err(format!(
                "layer_norm_epsilon {eps} is not supported; brigade's GPT-2 LayerNorm uses {}",
                crate::tensor::layernorm::EPS
            ));
        }
    }
    for (key, implemented) in
        [("scale_attn_weights", true), ("scale_attn_by_inverse_layer_idx", false), ("tie_word_embeddings", true)]
    {
        if let Some(b) = v.get(key).and_then(|x| x.as_bool()).filter(|&b| b != implemented) {
            return Err(format!("{key} {b} is not supported; brigade's GPT-2 implements {key} {implemented}"));
        }
    }
    if let Some(inner) = v.get("n_inner").and_then(|x| x.as_u64()) {
        if inner as usize != 4 * field("n_embd")? {
            return Err(format!("n_inner {inner} is not supported; brigade's MLP width is 4·n_embd"));
        }
    }
    Ok(Shape {
        n_layer: field("n_layer")?,
        n_head: field("n_head")?,
        n_embd: field("n_embd")?,
        vocab_size: field("vocab_size")?,
        block_size: field("n_positions")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GPT-2's keys that change its function: the values brigade implements pass (as the Hub's
    /// gpt2 config.json has them), any other is refused naming the key — never read and ignored.
    #[test]
    fn keys_that_change_the_function_are_refused_unless_implemented() {
        let base = serde_json::json!({"n_layer": 2, "n_head": 4, "n_embd": 32, "vocab_size": 67, "n_positions": 64,
            "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "scale_attn_weights": true,
            "scale_attn_by_inverse_layer_idx": false, "reorder_and_upcast_attn": false, "tie_word_embeddings": true});
        assert_eq!(parse(&base).unwrap().n_embd, 32);
        for (key, value) in [
            ("layer_norm_epsilon", serde_json::json!(1e-6)),
            ("scale_attn_weights", serde_json::json!(false)),
            ("scale_attn_by_inverse_layer_idx", serde_json::json!(true)),
            ("tie_word_embeddings", serde_json::json!(false)),
            ("activation_function", serde_json::json!("relu")),
            ("n_inner", serde_json::json!(100)),
        ] {
            let mut v = base.clone();
            v[key] = value.clone();
            let e = parse(&v).unwrap_err();
            assert!(e.contains(key), "{key} {value}: {e}");
        }
    }
}
