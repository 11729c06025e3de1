//! Checkpoints: weights as safetensors under Hugging Face names (so a Hugging Face GPT-2,
//! Llama, Qwen2 or Mistral folder loads here and ours load there; F32, BF16 or F16, one file or
//! sharded), the model shape as a Hugging Face `config.json`,
//! optimizer moments as a second safetensors file, and run state as JSON. A checkpoint is
//! written to a temporary directory and renamed into place, so a crash never leaves half of one.

use crate::error::{Error, Result};
use crate::models::fused_experts;
use crate::models::{Gpt, GptConfig};
use crate::params::ParamLayout;
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub const MODEL_FILE: &str = "model.safetensors";
pub const CONFIG_FILE: &str = "config.json";
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
pub const STATE_FILE: &str = "trainer_state.json";
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// A JSON line per step taken: loss, lr, grad norm, tokens/s, compute/comm/idle seconds.
pub const METRICS_FILE: &str = "metrics.jsonl";
/// The loss curve of every step taken.
pub const LOSS_PLOT_FILE: &str = "loss.svg";

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |e| Error::io(path, e)
}

/// Writes the named views of `buf` (with `prefix` before each name) as one safetensors file.
pub fn save_tensors(
    path: &Path,
    layout: &ParamLayout,
    buf: &[f32],
    prefix: &str,
    meta: Option<HashMap<String, String>>,
) -> Result<()> {
    let views: Vec<(String, safetensors::tensor::TensorView)> = layout
        .specs
        .iter()
        .map(|s| {
            let bytes: &[u8] = bytemuck::cast_slice(s.view.of(buf));
            let tv = safetensors::tensor::TensorView::new(Dtype::F32, s.shape.clone(), bytes)
                .expect("shape matches the view's length");
            (format!("{prefix}{}", s.name), tv)
        })
        .collect();
    safetensors::serialize_to_file(views, meta, path).map_err(|e| Error::ckpt(path, format!("cannot write: {e}")))
}

/// The index of a sharded Hugging Face checkpoint: which file holds each tensor.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Hugging Face keeps these beside the weights: causal-mask buffers, the tied head, rotary
/// frequency buffers of older Llama checkpoints.
pub(crate) fn ignorable(name: &str, tied: bool) -> bool {
    name.ends_with(".attn.bias")
        || name.ends_with(".attn.masked_bias")
        || name.ends_with("rotary_emb.inv_freq")
        || (tied && name == "lm_head.weight")
}

/// Reads every tensor of `layout` (named with `prefix`) from a safetensors file.
pub fn load_tensors(path: &Path, layout: &ParamLayout, prefix: &str) -> Result<(Vec<f32>, HashMap<String, String>)> {
    let bytes = std::fs::read(path).map_err(|e| Error::ckpt(path, format!("cannot read: {e}")))?;
    tensors_from_bytes(&bytes, layout, prefix, path)
}

/// `load_tensors` on the bytes of a safetensors file (`path` names it in errors). Nothing is
/// allocated for the model before the file is known to be large enough to hold it.
pub fn tensors_from_bytes(
    bytes: &[u8],
    layout: &ParamLayout,
    prefix: &str,
    path: &Path,
) -> Result<(Vec<f32>, HashMap<String, String>)> {
    let meta = check_size(&[(bytes, path)], layout)?;
    let mut out = vec![0f32; layout.total];
    let st = parse(bytes, path)?;
    let mut found = std::collections::HashSet::new();
    fill_from(&st, layout, prefix, path, &mut out, &mut found)?;
    check_complete(&st, layout, prefix, path, &found, true)?;
    Ok((out, meta))
}

fn parse<'a>(bytes: &'a [u8], path: &Path) -> Result<SafeTensors<'a>> {
    SafeTensors::deserialize(bytes).map_err(|e| Error::ckpt(path, format!("not a valid safetensors file ({e})")))
}

/// Refuses files too small to hold the model (2 bytes a parameter at least: BF16), before
/// anything is allocated for it; returns the first file's metadata.
fn check_size(files: &[(&[u8], &Path)], layout: &ParamLayout) -> Result<HashMap<String, String>> {
    let mut meta = HashMap::new();
    for (k, (bytes, path)) in files.iter().enumerate() {
        let (_, m) = SafeTensors::read_metadata(bytes)
            .map_err(|e| Error::ckpt(*path, format!("not a valid safetensors file ({e})")))?;
        if k == 0 {
            meta = m.metadata().clone().unwrap_or_default();
        }
    }
    let have: u128 = files.iter().map(|(b, _)| b.len() as u128).sum();
    let need = layout.total as u128 * 2;
    if have < need {
        return Err(Error::ckpt(
            files[0].1,
            format!(
                "holds {have} bytes but the model its config describes has {} parameters (at least {need} bytes); the file is truncated or belongs to another model",
                layout.total
            ),
        ));
    }
    Ok(meta)
}

/// Copies the tensors of `layout` that this file holds into `out` (F32, or BF16 / F16
/// converted), checking shapes; records their names in `found`.
fn fill_from(
    st: &SafeTensors,
    layout: &ParamLayout,
    prefix: &str,
    path: &Path,
    out: &mut [f32],
    found: &mut std::collections::HashSet<String>,
) -> Result<()> {
    let fused = fused_experts::fused_shapes(layout.specs.iter().map(|s| (s.name.as_str(), s.shape.as_slice())));
    for s in &layout.specs {
        let name = format!("{prefix}{}", s.name);
        let Some((c, tv)) =
            fused_experts::candidates(&name).into_iter().find_map(|c| st.tensor(&c.name).ok().map(|tv| (c, tv)))
        else {
            continue;
        };
        let tv = c.view(tv, &s.shape, &fused).map_err(|e| Error::ckpt(path, e))?;
        if tv.shape() != s.shape.as_slice() {
            return Err(Error::ckpt(
                path,
                format!("tensor '{name}' has shape {:?}, the model expects {:?}", tv.shape(), s.shape),
            ));
        }
        convert(&tv, &name, path, s.view.of_mut(out))?;
        found.insert(s.name.clone());
    }
    Ok(())
}

/// Copies tensor `tv` (F32, or BF16 / F16 converted) into `dst`, whose length its shape gives.
pub(crate) fn convert(tv: &safetensors::tensor::TensorView, name: &str, path: &Path, dst: &mut [f32]) -> Result<()> {
    let data = tv.data();
    let size = match tv.dtype() {
        Dtype::F32 => 4,
        Dtype::BF16 | Dtype::F16 => 2,
        other => {
            return Err(Error::ckpt(
                path,
                format!("tensor '{name}' is {other:?}; brigade loads F32, BF16 and F16 weights"),
            ))
        }
    };
    if data.len() != dst.len() * size {
        return Err(Error::ckpt(
            path,
            format!(
                "tensor '{name}' holds {} bytes of {:?}, its shape needs {}",
                data.len(),
                tv.dtype(),
                dst.len() * size
            ),
        ));
    }
    match tv.dtype() {
        Dtype::F32 => {
            for (d, c) in dst.iter_mut().zip(data.chunks_exact(4)) {
                *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        Dtype::BF16 => {
            for (d, c) in dst.iter_mut().zip(data.chunks_exact(2)) {
                *d = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16);
            }
        }
        _ => {
            for (d, c) in dst.iter_mut().zip(data.chunks_exact(2)) {
                *d = f16_to_f32(u16::from_le_bytes([c[0], c[1]]));
            }
        }
    }
    Ok(())
}

/// IEEE half precision to f32, subnormals and infinities included.
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, m) => {
            // subnormal: value m · 2⁻²⁴
            let v = m as f32 * (1.0 / 16_777_216.0);
            return if sign != 0 { -v } else { v };
        }
        (0x1f, 0) => sign | 0x7f80_0000,
        (0x1f, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 112) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// Refuses a model whose tensors are not all found, or (`strict`) a file holding tensors the
/// model has not.
fn check_complete(
    st: &SafeTensors,
    layout: &ParamLayout,
    prefix: &str,
    path: &Path,
    found: &std::collections::HashSet<String>,
    strict: bool,
) -> Result<()> {
    if let Some(s) = layout.specs.iter().find(|s| !found.contains(&s.name)) {
        let mut names: Vec<String> = st.names().into_iter().map(str::to_string).collect();
        names.sort();
        names.truncate(3);
        return Err(Error::ckpt(
            path,
            format!(
                "tensor '{prefix}{}' is missing; is this a checkpoint of this model's family and shape? (it holds e.g. {})",
                s.name,
                names.join(", ")
            ),
        ));
    }
    if strict {
        check_unknown(st, layout, prefix, path)?;
    }
    Ok(())
}

fn check_unknown(st: &SafeTensors, layout: &ParamLayout, prefix: &str, path: &Path) -> Result<()> {
    let known = fused_experts::stored_names(layout.specs.iter().map(|s| format!("{prefix}{}", s.name)));
    let tied = !layout.specs.iter().any(|s| s.name == "lm_head.weight");
    if let Some(x) = st.names().into_iter().find(|n| !ignorable(n, tied) && !known.contains(*n)) {
        return Err(Error::ckpt(
            path,
            format!("unexpected tensor '{x}': the file holds a different model than its config describes"),
        ));
    }
    Ok(())
}

/// The safetensors files of a model directory: `model.safetensors`, or the shards that
/// `model.safetensors.index.json` names (each once, sorted). `index` is where a missing
/// shard is blamed.
pub fn weight_files(dir: &Path) -> Result<(Vec<PathBuf>, PathBuf)> {
    let index = dir.join(INDEX_FILE);
    if !index.exists() || dir.join(MODEL_FILE).exists() {
        return Ok((vec![dir.join(MODEL_FILE)], dir.join(MODEL_FILE)));
    }
    let text = std::fs::read_to_string(&index).map_err(|e| Error::ckpt(&index, format!("cannot read: {e}")))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Error::ckpt(&index, format!("not valid JSON ({e})")))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| Error::ckpt(&index, "has no weight_map object"))?;
    let mut files: Vec<String> = map.values().filter_map(|f| f.as_str().map(str::to_string)).collect();
    files.sort();
    files.dedup();
    if let Some(bad) = files.iter().find(|f| f.contains('/') || f.contains("..")) {
        return Err(Error::ckpt(&index, format!("names shard '{bad}' outside the directory")));
    }
    if let Some(f) = files.iter().find(|f| !dir.join(f).is_file()) {
        return Err(Error::ckpt(
            &index,
            format!("names shard '{f}', which is not there; the checkpoint is incomplete"),
        ));
    }
    Ok((files.iter().map(|f| dir.join(f)).collect(), index))
}

/// The weights of a model directory: `model.safetensors`, or the shards that
/// `model.safetensors.index.json` names.
pub fn load_weights(dir: &Path, layout: &ParamLayout) -> Result<Vec<f32>> {
    let (files, index) = weight_files(dir)?;
    if files.len() == 1 && index == files[0] {
        return Ok(load_tensors(&files[0], layout, "")?.0);
    }
    let mut blobs = Vec::with_capacity(files.len());
    for p in files {
        let bytes = std::fs::read(&p).map_err(|e| {
            Error::ckpt(
                &index,
                format!("names shard {}, which cannot be read ({e}); the checkpoint is incomplete", p.display()),
            )
        })?;
        blobs.push((p, bytes));
    }
    let refs: Vec<(&[u8], &Path)> = blobs.iter().map(|(p, b)| (b.as_slice(), p.as_path())).collect();
    check_size(&refs, layout)?;
    let mut out = vec![0f32; layout.total];
    let mut found = std::collections::HashSet::new();
    for (p, bytes) in &blobs {
        let st = parse(bytes, p)?;
        fill_from(&st, layout, "", p, &mut out, &mut found)?;
        check_unknown(&st, layout, "", p)?;
    }
    if let Some(s) = layout.specs.iter().find(|s| !found.contains(&s.name)) {
        return Err(Error::ckpt(&index, format!("tensor '{}' is in none of the shards", s.name)));
    }
    Ok(out)
}

/// A Hugging Face `config.json` for `cfg` (its family's).
pub fn hf_config(cfg: &GptConfig) -> serde_json::Value {
    cfg.hf_config()
}

/// Reads a Hugging Face `config.json` (ours or one from the Hub).
pub fn read_model_config(dir: &Path) -> Result<GptConfig> {
    let path = dir.join(CONFIG_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        Error::ckpt(&path, format!("cannot read ({e}); a checkpoint directory holds config.json and model.safetensors"))
    })?;
    parse_model_config(&text, &path)
}

/// The model shape from the text of a Hugging Face `config.json` of any family brigade
/// implements (`path` names it in errors).
pub fn parse_model_config(text: &str, path: &Path) -> Result<GptConfig> {
    let path = path.to_path_buf();
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| Error::ckpt(&path, format!("not valid JSON ({e})")))?;
    let (shape, family) = crate::models::family::read_hf(&v).map_err(|e| Error::ckpt(&path, e))?;
    let cfg = GptConfig::new(shape, family);
    cfg.validate().map_err(|e| Error::ckpt(&path, e.to_string()))?;
    Ok(cfg)
}

/// Loads a model directory (config.json + model.safetensors), ours or Hugging Face's.
pub fn load_model(dir: &Path) -> Result<(Gpt, Vec<f32>)> {
    if !dir.is_dir() {
        return Err(Error::ckpt(dir, "no such checkpoint directory"));
    }
    let cfg = read_model_config(dir)?;
    let model = Gpt::new(cfg)?;
    let params = load_weights(dir, &model.layout)?;
    Ok((model, params))
}

pub fn write_json(path: &Path, v: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(v).expect("JSON values serialise");
    std::fs::write(path, text).map_err(io(path))
}

/// The parent directory and final name of a checkpoint path.
fn split_dir(dir: &Path) -> Result<(PathBuf, String)> {
    let name = dir.file_name().ok_or_else(|| Error::ckpt(dir, "checkpoint path needs a final directory name"))?;
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    Ok((parent.to_path_buf(), name.to_string_lossy().into_owned()))
}

/// Whether `dir` holds a brigade checkpoint (what `--out` may replace).
pub fn is_checkpoint(dir: &Path) -> bool {
    dir.join(STATE_FILE).is_file()
}

/// Checks, before any work, that a checkpoint can be written to `dir`: it is absent, an empty
/// directory or an earlier brigade checkpoint (never a user's file or folder, which would be
/// replaced), and its parent is a writable directory. Also removes temporary directories that
/// a killed save left beside it.
pub fn check_output_dir(dir: &Path) -> Result<()> {
    let parent = prepare_target(dir)?;
    check_writable_dir(&parent)?;
    remove_stale_temporaries(dir)
}

/// Refuses a `dir` that is neither absent, an empty directory nor a brigade checkpoint, and
/// creates its parent; returns the parent.
fn prepare_target(dir: &Path) -> Result<PathBuf> {
    if dir.exists() || dir.is_symlink() {
        if !dir.is_dir() {
            return Err(Error::ckpt(dir, "exists and is not a directory; give --out a new or checkpoint directory"));
        }
        let empty = std::fs::read_dir(dir).map_err(io(dir))?.next().is_none();
        if !empty && !is_checkpoint(dir) {
            return Err(Error::ckpt(
                dir,
                format!(
                    "holds files but no brigade checkpoint ({STATE_FILE} is missing); brigade only replaces its own checkpoints, so give --out a new or empty directory"
                ),
            ));
        }
    }
    let (parent, _) = split_dir(dir)?;
    std::fs::create_dir_all(&parent).map_err(io(&parent))?;
    Ok(parent)
}

/// Creates and removes a file in `dir` to learn, before a long run, whether it is writable.
pub fn check_writable_dir(dir: &Path) -> Result<()> {
    let probe = dir.join(format!(".brigade-write-probe-{}", std::process::id()));
    std::fs::write(&probe, b"")
        .map_err(|e| Error::io(dir, std::io::Error::new(e.kind(), format!("not writable ({e})"))))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// `.NAME.tmp-PID` and `.NAME.old-PID` beside `dir` whose process is gone: left by a save that
/// was killed (a gpt2-small one is 239 MB). A save killed between its two renames left no
/// `dir`, the previous checkpoint in `.old-PID` and the new one, complete and synced, in
/// `.tmp-PID` (the old one is moved aside only once the new one is whole): the new one is put
/// in place before anything is removed.
fn remove_stale_temporaries(dir: &Path) -> Result<()> {
    let (parent, name) = split_dir(dir)?;
    let Ok(entries) = std::fs::read_dir(&parent) else { return Ok(()) };
    let mut stale: Vec<(u32, bool, PathBuf)> = Vec::new();
    for e in entries.flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        let found = [(".tmp-", true), (".old-", false)]
            .iter()
            .find_map(|(k, tmp)| file.strip_prefix(&format!(".{name}{k}")).map(|pid| (pid.to_string(), *tmp)));
        let Some((pid, tmp)) = found else { continue };
        let Ok(pid) = pid.parse::<u32>() else { continue };
        let alive = pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists();
        if !alive && e.path().is_dir() {
            stale.push((pid, tmp, e.path()));
        }
    }
    if !dir.exists() {
        // the newest save killed between its renames: its complete checkpoint, else the previous
        let moved_aside = |want_tmp: bool, pid: u32| stale.iter().find(|(p, t, _)| *p == pid && *t == want_tmp);
        let rescued = stale
            .iter()
            .filter(|(_, tmp, _)| !*tmp)
            .find_map(|(pid, _, old)| moved_aside(true, *pid).map(|(_, _, new)| new).or(Some(old)))
            .filter(|p| is_checkpoint(p))
            .cloned();
        if let Some(p) = rescued {
            std::fs::rename(&p, dir).map_err(io(dir))?;
        }
    }
    for (_, _, p) in stale {
        if p.exists() {
            let _ = std::fs::remove_dir_all(p);
        }
    }
    Ok(())
}

/// Fills a fresh temporary directory with `fill`, then renames it to `dir`, replacing an
/// older checkpoint there only once the new one is complete. Anything at `dir` that is not an
/// empty directory or a brigade checkpoint is refused, never replaced.
pub fn write_atomically(dir: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    // Only the refusal: writability and stale temporaries were checked before the run
    // (`check_output_dir`), and creating the temporary directory fails clearly anyway.
    let parent = prepare_target(dir)?;
    let (_, name) = split_dir(dir)?;
    let tmp: PathBuf = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    let old: PathBuf = parent.join(format!(".{name}.old-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir(&tmp).map_err(io(&tmp))?;
    if let Err(e) = fill(&tmp) {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    for entry in std::fs::read_dir(&tmp).map_err(io(&tmp))? {
        let p = entry.map_err(io(&tmp))?.path();
        std::fs::File::open(&p).and_then(|f| f.sync_all()).map_err(io(&p))?;
    }
    if dir.exists() {
        std::fs::rename(dir, &old).map_err(io(dir))?;
    }
    std::fs::rename(&tmp, dir).map_err(io(dir))?;
    // the renames themselves reach the disk
    let _ = std::fs::File::open(&parent).and_then(|d| d.sync_all());
    let _ = std::fs::remove_dir_all(&old);
    Ok(())
}

/// Whether the run that wrote brigade checkpoint `dir` tokenized with a Hugging Face
/// `tokenizer.json` (its `trainer_state.json` names one) rather than bytes; `None` when `dir`
/// holds no trainer state (a Hugging Face folder). Serving needs only this of the trainer's
/// state.
pub fn trained_with_tokenizer_file(dir: &Path) -> Result<Option<bool>> {
    let path = dir.join(STATE_FILE);
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Error::ckpt(&path, format!("not valid JSON: {e}")))?;
    match v.get("config").and_then(|c| c.get("tokenizer")) {
        Some(t) => Ok(Some(!t.is_null())),
        None => Err(Error::ckpt(&path, "has no config.tokenizer entry; it was not written by brigade train")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in checkpoint: its state file says which one it is.
    fn ckpt(dir: &Path, which: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(STATE_FILE), which).unwrap();
        std::fs::write(dir.join(MODEL_FILE), which.repeat(100)).unwrap();
    }

    fn which(dir: &Path) -> Option<String> {
        std::fs::read_to_string(dir.join(STATE_FILE)).ok()
    }

    /// Every state a save of `write_atomically` can be killed in leaves, once the next run
    /// has looked at the directory, the previous checkpoint or the new one, whole, and no
    /// temporary beside it.
    #[test]
    fn a_save_killed_at_any_stage_leaves_the_old_or_the_new_checkpoint() {
        let dead = 999_999_999u32; // no such process
        type Stage<'a> = (&'a str, Option<&'a str>, Option<&'a str>, Option<&'a str>, Option<&'a str>);
        let stages: &[Stage] = &[
            // (stage, dir, .tmp, .old, what must be at dir after)
            ("filling the first save", None, Some("partial"), None, None),
            ("filling", Some("A"), Some("partial"), None, Some("A")),
            ("filled and synced, before the renames", Some("A"), Some("B"), None, Some("A")),
            ("between the two renames", None, Some("B"), Some("A"), Some("B")),
            ("after the renames, before the old one is removed", Some("B"), None, Some("A"), Some("B")),
        ];
        for &(stage, at, tmp, old, want) in stages {
            let d = tempfile::tempdir().unwrap();
            let dir = d.path().join("ck");
            if let Some(w) = at {
                ckpt(&dir, w);
            }
            let tmp_dir = d.path().join(format!(".ck.tmp-{dead}"));
            match tmp {
                Some("partial") => {
                    std::fs::create_dir(&tmp_dir).unwrap();
                    std::fs::write(tmp_dir.join(MODEL_FILE), b"half").unwrap();
                }
                Some(w) => ckpt(&tmp_dir, w),
                None => {}
            }
            if let Some(w) = old {
                ckpt(&d.path().join(format!(".ck.old-{dead}")), w);
            }
            check_output_dir(&dir).unwrap();
            assert_eq!(which(&dir).as_deref(), want, "killed {stage}");
            if let Some(w) = want {
                assert_eq!(
                    std::fs::read_to_string(dir.join(MODEL_FILE)).unwrap(),
                    w.repeat(100),
                    "killed {stage}: a mix"
                );
            }
            let left: Vec<String> = std::fs::read_dir(d.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with('.'))
                .collect();
            assert!(left.is_empty(), "killed {stage}: left behind {left:?}");
        }
    }

    /// A living process's temporaries are its own business: never touched.
    #[test]
    fn a_running_save_is_left_alone() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("ck");
        let tmp = d.path().join(format!(".ck.tmp-{}", std::process::id()));
        ckpt(&tmp, "B");
        check_output_dir(&dir).unwrap();
        assert!(tmp.exists() && !dir.exists());
    }

    /// Tensors and the file's metadata come back as saved; a file without metadata gives none.
    #[test]
    fn tensors_and_metadata_come_back_as_saved() {
        let d = tempfile::tempdir().unwrap();
        let mut layout = ParamLayout::default();
        layout.add("w", &[2, 3], crate::params::Init::Zeros, true);
        layout.add("b", &[3], crate::params::Init::Zeros, false);
        let buf: Vec<f32> = (0..layout.total).map(|i| i as f32 * 0.5 - 1.0).collect();
        let meta = HashMap::from([("format".to_string(), "pt".to_string()), ("step".into(), "7".into())]);
        for (file, m) in [("with.safetensors", Some(meta.clone())), ("without.safetensors", None)] {
            let path = d.path().join(file);
            save_tensors(&path, &layout, &buf, "model.", m.clone()).unwrap();
            let (got, got_meta) = load_tensors(&path, &layout, "model.").unwrap();
            assert_eq!(got, buf, "{file}");
            assert_eq!(got_meta, m.unwrap_or_default(), "{file}");
        }
    }

    /// `config.json` and the run state read back as the values written; a folder that is not
    /// there is an error naming the path.
    #[test]
    fn json_reads_back_as_written() {
        let d = tempfile::tempdir().unwrap();
        let v = serde_json::json!({"model_type": "llama", "rope_scaling": {"factor": 8.0}, "eos_token_id": [1, 2]});
        let path = d.path().join(CONFIG_FILE);
        write_json(&path, &v).unwrap();
        let back: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(back, v);
        let missing = d.path().join("no-such-dir").join(CONFIG_FILE);
        let err = write_json(&missing, &v).unwrap_err().to_string();
        assert!(err.contains("no-such-dir"), "{err}");
    }

    /// A place no file can be made in is refused before a run (root writes anywhere a mode
    /// allows, so a regular file and `/proc` stand in for a read-only folder).
    #[test]
    fn an_unwritable_folder_is_refused_naming_it() {
        let d = tempfile::tempdir().unwrap();
        check_writable_dir(d.path()).unwrap();
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0, "the probe is removed");
        let file = d.path().join("a-file");
        std::fs::write(&file, b"x").unwrap();
        for bad in [file.as_path(), Path::new("/proc")] {
            if bad == Path::new("/proc") && !cfg!(target_os = "linux") {
                continue;
            }
            let err = check_writable_dir(bad).unwrap_err().to_string();
            assert!(err.contains("not writable") && err.contains(&*bad.to_string_lossy()), "{err}");
        }
    }
}
