//! The other spelling of a mixture's experts. The Hub's files name every expert's projections
//! apart (`mlp.experts.3.gate_proj.weight`, Mixtral's `block_sparse_moe.experts.3.w1.weight`),
//! and so do brigade's models; transformers 5 holds them as two fused tensors a layer —
//! `mlp.experts.gate_up_proj` [E, 2M, C] (each expert's gate rows, then its up rows) and
//! `mlp.experts.down_proj` [E, C, M] — with Mixtral's block under `mlp`, and a file written
//! from its state dict keeps that form. A reader asks [`candidates`] where a tensor may lie and
//! cuts an expert's block out of a fused tensor with [`Candidate::view`].

use safetensors::tensor::TensorView;
use std::collections::HashMap;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Part {
    Gate,
    Up,
    Down,
}

/// One place a tensor may be stored: a name, and for a fused tensor the block of it.
#[derive(Debug)]
pub(crate) struct Candidate {
    pub name: String,
    block: Option<(usize, Part)>,
}

/// Where the tensor the Hub names `name` may lie, in the order to try: its own name,
/// `transformer.`-prefixed (GPT-2's older files), then transformers 5's form of it if it has one.
pub(crate) fn candidates(name: &str) -> Vec<Candidate> {
    let mut out = vec![
        Candidate { name: name.to_string(), block: None },
        Candidate { name: format!("transformer.{name}"), block: None },
    ];
    out.extend(fused_form(name));
    out
}

/// The fused tensor (and block) or the renamed tensor transformers 5 keeps `name` as.
fn fused_form(name: &str) -> Option<Candidate> {
    const MIXTRAL: &str = ".block_sparse_moe.";
    const EXPERTS: &str = ".mlp.experts.";
    let (block, rest) = if let Some(i) = name.find(MIXTRAL) {
        (format!("{}.mlp.", &name[..i]), &name[i + MIXTRAL.len()..])
    } else if let Some(i) = name.find(EXPERTS) {
        (format!("{}.mlp.", &name[..i]), &name[i + ".mlp.".len()..])
    } else {
        return None;
    };
    let Some(tail) = rest.strip_prefix("experts.") else {
        // Mixtral's router: only renamed
        return Some(Candidate { name: format!("{block}{rest}"), block: None });
    };
    let (e, proj) = tail.split_once('.')?;
    let expert = e.parse().ok()?;
    let part = match proj {
        "gate_proj.weight" | "w1.weight" => Part::Gate,
        "up_proj.weight" | "w3.weight" => Part::Up,
        "down_proj.weight" | "w2.weight" => Part::Down,
        _ => return None,
    };
    let fused = if part == Part::Down { "down_proj" } else { "gate_up_proj" };
    Some(Candidate { name: format!("{block}experts.{fused}"), block: Some((expert, part)) })
}

/// The full shape each fused tensor must have for a model whose tensors are `specs` (name and
/// shape): [E, 2M, C] for `gate_up_proj`, [E, C, M] for `down_proj`.
pub(crate) fn fused_shapes<'a>(specs: impl IntoIterator<Item = (&'a str, &'a [usize])>) -> HashMap<String, Vec<usize>> {
    let mut out: HashMap<String, Vec<usize>> = HashMap::new();
    for (name, shape) in specs {
        let Some(Candidate { name: fused, block: Some((e, part)) }) = fused_form(name) else { continue };
        let want = match part {
            Part::Gate | Part::Up => vec![e + 1, 2 * shape[0], shape[1]],
            Part::Down => vec![e + 1, shape[0], shape[1]],
        };
        let have = out.entry(fused).or_insert_with(|| want.clone());
        have[0] = have[0].max(want[0]);
    }
    out
}

/// Every name a file of the tensors `names` may hold them under (each one's [`candidates`]).
pub(crate) fn stored_names(names: impl IntoIterator<Item = String>) -> std::collections::HashSet<String> {
    names.into_iter().flat_map(|n| candidates(&n)).map(|c| c.name).collect()
}

impl Candidate {
    /// The tensor of shape `shape` this candidate denotes, from `tv` (the tensor stored under
    /// `self.name`); a fused tensor is checked against its full shape in `fused` first.
    pub(crate) fn view<'a>(
        &self,
        tv: TensorView<'a>,
        shape: &[usize],
        fused: &HashMap<String, Vec<usize>>,
    ) -> Result<TensorView<'a>, String> {
        let Some((expert, part)) = self.block else { return Ok(tv) };
        let want = fused.get(&self.name).ok_or_else(|| format!("tensor '{}' is not one this model has", self.name))?;
        if tv.shape() != want.as_slice() {
            return Err(format!("tensor '{}' has shape {:?}, the model expects {:?}", self.name, tv.shape(), want));
        }
        let n: usize = shape.iter().product();
        let per_expert: usize = want[1..].iter().product();
        let first = expert * per_expert + if part == Part::Up { n } else { 0 };
        let bytes = tv.dtype().bitsize() / 8;
        let data = &tv.data()[first * bytes..(first + n) * bytes];
        TensorView::new(tv.dtype(), shape.to_vec(), data).map_err(|e| format!("tensor '{}': {e}", self.name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_spelling_finds_its_fused_block() {
        let c = fused_form("model.layers.2.mlp.experts.5.up_proj.weight").unwrap();
        assert_eq!((c.name.as_str(), c.block), ("model.layers.2.mlp.experts.gate_up_proj", Some((5, Part::Up))));
        let c = fused_form("model.layers.0.block_sparse_moe.experts.1.w2.weight").unwrap();
        assert_eq!((c.name.as_str(), c.block), ("model.layers.0.mlp.experts.down_proj", Some((1, Part::Down))));
        let c = fused_form("model.layers.0.block_sparse_moe.gate.weight").unwrap();
        assert_eq!((c.name.as_str(), c.block), ("model.layers.0.mlp.gate.weight", None));
        // a shared expert, the router of a Qwen mixture and dense tensors are stored as named
        for n in [
            "model.layers.0.mlp.shared_expert.gate_proj.weight",
            "model.layers.0.mlp.gate.weight",
            "model.layers.1.mlp.up_proj.weight",
        ] {
            assert!(fused_form(n).is_none(), "{n}");
        }
    }

    #[test]
    fn blocks_are_cut_where_transformers_puts_them() {
        // 2 experts, M = 2, C = 3: gate_up [2, 4, 3] numbered 0..24, down [2, 3, 2] numbered 0..12
        let gu: Vec<u8> = (0..24).flat_map(|v| (v as f32).to_le_bytes()).collect();
        let dn: Vec<u8> = (0..12).flat_map(|v| (v as f32).to_le_bytes()).collect();
        let specs = [
            ("l.mlp.experts.0.gate_proj.weight", vec![2, 3]),
            ("l.mlp.experts.1.up_proj.weight", vec![2, 3]),
            ("l.mlp.experts.1.down_proj.weight", vec![3, 2]),
        ];
        let shapes = fused_shapes(specs.iter().map(|(n, s)| (*n, s.as_slice())));
        assert_eq!(shapes["l.mlp.experts.gate_up_proj"], vec![2, 4, 3]);
        assert_eq!(shapes["l.mlp.experts.down_proj"], vec![2, 3, 2]);
        let read = |name: &str, shape: &[usize], data: &[u8], full: Vec<usize>| -> Vec<f32> {
            let c = fused_form(name).unwrap();
            let tv = TensorView::new(safetensors::Dtype::F32, full, data).unwrap();
            let v = c.view(tv, shape, &shapes).unwrap();
            v.data().chunks(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
        };
        let f = |r: std::ops::Range<i32>| r.map(|v| v as f32).collect::<Vec<_>>();
        assert_eq!(read(specs[0].0, &[2, 3], &gu, vec![2, 4, 3]), f(0..6));
        assert_eq!(read(specs[1].0, &[2, 3], &gu, vec![2, 4, 3]), f(18..24));
        assert_eq!(read(specs[2].0, &[3, 2], &dn, vec![2, 3, 2]), f(6..12));
        // a fused tensor of another width is refused with both shapes
        let c = fused_form(specs[0].0).unwrap();
        let tv = TensorView::new(safetensors::Dtype::F32, vec![2, 3, 4], &gu).unwrap();
        let err = c.view(tv, &[2, 3], &shapes).unwrap_err();
        assert!(err.contains("[2, 3, 4]") && err.contains("[2, 4, 3]"), "{err}");
    }
}
