//! One rank's part of a published model: the safetensors files of a Hugging Face folder are
//! memory-mapped, and only the tensors this rank holds are read, each cut to its
//! tensor-parallel slice as it is converted to f32. A model that fits the cluster but not one
//! rank's memory still loads: a rank's resident memory is its own part plus one full tensor.

use super::checkpoint::{convert, ignorable, weight_files};
use super::fused_experts;
use crate::error::{Error, Result};
use crate::params::ParamLayout;
use safetensors::SafeTensors;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The memory-mapped weight files of a model directory.
pub struct MappedWeights {
    files: Vec<(PathBuf, memmap2::Mmap)>,
    /// Where a tensor missing from every file is blamed (the index, or the one file).
    index: PathBuf,
}

impl MappedWeights {
    pub fn open(dir: &Path) -> Result<MappedWeights> {
        let (paths, index) = weight_files(dir)?;
        let mut files = Vec::with_capacity(paths.len());
        for p in paths {
            let f = std::fs::File::open(&p).map_err(|e| Error::ckpt(&p, format!("cannot read: {e}")))?;
            // SAFETY: the map is read only; a file changed under a running job is the user's
            // to avoid, as with any reader of these files.
            let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| Error::ckpt(&p, format!("cannot map: {e}")))?;
            files.push((p, map));
        }
        Ok(MappedWeights { files, index })
    }

    /// The tensors of `local` (one rank's layout: its stages' tensors under the model's names,
    /// cut `rank` of `tp`), read from the files, every file's tensors checked against `full`
    /// (the whole model's layout) so that a folder of another model is refused.
    pub fn read_local(&self, local: &ParamLayout, rank: usize, tp: usize, full: &ParamLayout) -> Result<Vec<f32>> {
        let parsed: Vec<(&Path, SafeTensors)> = self
            .files
            .iter()
            .map(|(p, m)| {
                SafeTensors::deserialize(m)
                    .map(|st| (p.as_path(), st))
                    .map_err(|e| Error::ckpt(p, format!("not a valid safetensors file ({e})")))
            })
            .collect::<Result<_>>()?;
        self.check_names(&parsed, full)?;
        let mut at: HashMap<&str, usize> = HashMap::new();
        for (k, (_, st)) in parsed.iter().enumerate() {
            for n in st.names() {
                at.insert(n, k);
            }
        }
        let mut out = vec![0f32; local.total];
        let mut whole = Vec::new();
        let fused = fused_experts::fused_shapes(full.specs.iter().map(|s| (s.name.as_str(), s.full_shape.as_slice())));
        for s in &local.specs {
            let Some((c, k)) =
                fused_experts::candidates(&s.name).into_iter().find_map(|c| at.get(c.name.as_str()).map(|&k| (c, k)))
            else {
                return Err(Error::ckpt(&self.index, format!("tensor '{}' is in none of the files", s.name)));
            };
            let (path, st) = &parsed[k];
            let name = c.name.as_str();
            let tv = st.tensor(name).map_err(|e| Error::ckpt(*path, format!("tensor '{name}': {e}")))?;
            let tv = c.view(tv, &s.full_shape, &fused).map_err(|e| Error::ckpt(*path, e))?;
            if tv.shape() != s.full_shape.as_slice() {
                return Err(Error::ckpt(
                    *path,
                    format!("tensor '{name}' has shape {:?}, the model expects {:?}", tv.shape(), s.full_shape),
                ));
            }
            whole.resize(s.full_shape.iter().product(), 0.0);
            convert(&tv, name, path, &mut whole)?;
            s.split.slice(&whole, &s.full_shape, rank, tp, s.view.of_mut(&mut out));
        }
        Ok(out)
    }

    /// Refuses files holding a tensor the model has not (Hugging Face's buffers aside).
    fn check_names(&self, parsed: &[(&Path, SafeTensors)], full: &ParamLayout) -> Result<()> {
        let known = fused_experts::stored_names(full.specs.iter().map(|s| s.name.clone()));
        let tied = !full.specs.iter().any(|s| s.name == "lm_head.weight");
        for (path, st) in parsed {
            if let Some(x) = st.names().into_iter().find(|n| !ignorable(n, tied) && !known.contains(*n)) {
                return Err(Error::ckpt(
                    *path,
                    format!(
                        "unexpected tensor '{x}': the folder holds a different model than its config.json describes"
                    ),
                ));
            }
        }
        Ok(())
    }
}
