//! What each model family is, once: one file per family answering its Hugging Face
//! `config.json` both ways, its shape (heads, key/value heads, head width, MLP width, tied
//! head), its positions and a spec of each block (norms, q/k/v, MLP, tensor names), in the
//! words of `spec.rs`. Training's decoder (`models::gpt`), serving's, the checkpoint code, the
//! planner and the benchmarks read these answers; only this folder names a family.
//! `docs/adding-a-family.md` says how a family is added.

pub mod gpt2;
pub mod llama;
pub mod spec;

pub use gpt2::Gpt2;
pub use llama::{Llama, LlamaMoe, MoeNaming};
pub use spec::{
    AttnSpec, BlockSpec, Cut, Describe, GgufArch, GgufNum, Linear, Llama3Rope, MlpSpec, MoeLosses, MoeSpec, NormKind,
    NormSpec, Orient, Overrides, Positions, Qkv, Shape,
};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Which decoder family a config describes, with that family's own fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub enum Family {
    #[default]
    Gpt2,
    Llama(Llama),
}

impl From<Llama> for Family {
    fn from(a: Llama) -> Family {
        Family::Llama(a)
    }
}

impl From<Gpt2> for Family {
    fn from(_: Gpt2) -> Family {
        Family::Gpt2
    }
}

const N_PRESETS: usize = gpt2::PRESETS.len() + llama::PRESETS.len();

/// Every family's named shapes, in order (each family's first is its tiny one, for tests).
pub const PRESETS: [(&str, Shape, Family); N_PRESETS] = presets();

const fn presets() -> [(&'static str, Shape, Family); N_PRESETS] {
    let mut out = [("", Shape::of([0; 5]), Family::Gpt2); N_PRESETS];
    let mut i = 0;
    while i < gpt2::PRESETS.len() {
        let (name, s) = gpt2::PRESETS[i];
        out[i] = (name, Shape::of(s), Family::Gpt2);
        i += 1;
    }
    let mut j = 0;
    while j < llama::PRESETS.len() {
        let (name, s, a) = llama::PRESETS[j];
        out[i + j] = (name, Shape::of(s), Family::Llama(a));
        j += 1;
    }
    out
}

impl Family {
    /// Every family, each with the fields of the small model its tests run (`example`).
    pub const ALL: [Family; 2] = [Family::Gpt2, Family::Llama(llama::EXAMPLE)];

    /// What the family answers.
    pub fn describe(&self) -> &dyn Describe {
        match self {
            Family::Gpt2 => &Gpt2,
            Family::Llama(a) => a,
        }
    }

    /// The family's name as messages print it.
    pub fn name(&self) -> &'static str {
        match self {
            Family::Gpt2 => "GPT-2",
            Family::Llama(_) => "Llama",
        }
    }

    /// The family's tiny preset (its first; a mixture of experts' own), for tests and the
    /// built-in task.
    pub fn tiny_preset(&self) -> &'static str {
        match self {
            Family::Gpt2 => gpt2::PRESETS[0].0,
            Family::Llama(a) if a.moe.is_some() && a.qk_norm => llama::QWEN3_MOE_TINY_PRESET,
            Family::Llama(a) if a.moe.is_some() => llama::MOE_TINY_PRESET,
            Family::Llama(_) => llama::PRESETS[0].0,
        }
    }

    /// The small model the tests run for this family (with `vocab` tokens and `context`
    /// positions), with this value's fields.
    pub fn example(&self, vocab: usize, context: usize) -> Shape {
        match self {
            Family::Gpt2 => gpt2::example(vocab, context),
            Family::Llama(_) => llama::example(vocab, context),
        }
    }

    /// A `brigade train` config's changes to a preset of this family.
    pub fn reshape(&mut self, s: &Shape, o: Overrides, preset: &str) -> Result<(), String> {
        match self {
            Family::Gpt2 => Gpt2.reshape(s, o, preset),
            Family::Llama(a) => a.reshape(s, o, preset),
        }
    }
}

/// The model classes a `config.json` may name.
pub const HF_CLASSES: &str =
    "LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, OlmoeForCausalLM, MixtralForCausalLM (and GPT2LMHeadModel)";

/// Whether a `config.json` describes a Llama-family model (else GPT-2; anything else refused).
fn is_llama_family(v: &Value) -> Result<bool, String> {
    let ty = v.get("model_type").and_then(Value::as_str);
    let arch = v.get("architectures").and_then(|a| a.get(0)).and_then(Value::as_str);
    match (ty, arch) {
        (Some("llama" | "qwen2" | "qwen3" | "mistral" | "qwen2_moe" | "qwen3_moe" | "olmoe" | "mixtral"), _) => {
            Ok(true)
        }
        (Some("gpt2"), _) | (None, None | Some("GPT2LMHeadModel")) => Ok(false),
        (
            None,
            Some(
                "LlamaForCausalLM"
                | "Qwen2ForCausalLM"
                | "Qwen3ForCausalLM"
                | "MistralForCausalLM"
                | "Qwen2MoeForCausalLM"
                | "Qwen3MoeForCausalLM"
                | "OlmoeForCausalLM"
                | "MixtralForCausalLM",
            ),
        ) => Ok(true),
        (ty, arch) => Err(format!(
            "model_type {:?} (architectures {:?}) is not supported; brigade loads {HF_CLASSES}",
            ty.unwrap_or("none"),
            arch.unwrap_or("none")
        )),
    }
}

/// The shape and family of a Hugging Face `config.json` of GPT-2 or the Llama family (not yet
/// validated). Any value brigade does not implement is refused naming its key.
pub fn read_hf(v: &Value) -> Result<(Shape, Family), String> {
    if let Some(t) = v
        .get("layer_types")
        .and_then(|l| l.as_array())
        .and_then(|l| l.iter().find(|t| t.as_str() != Some("full_attention")))
    {
        return Err(format!("layer_types holds {t}; brigade implements full causal attention only"));
    }
    if is_llama_family(v)? {
        let (s, a) = llama::parse(v)?;
        return Ok((s, Family::Llama(a)));
    }
    Ok((gpt2::parse(v)?, Family::Gpt2))
}
