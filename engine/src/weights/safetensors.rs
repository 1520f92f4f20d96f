//! HF safetensors checkpoints, single-file or sharded, memory-mapped.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ::safetensors::tensor::{Dtype, TensorInfo};
use ::safetensors::SafeTensors;
use anyhow::{bail, Context};

use super::{decode_le_bytes, map_file, ElementType, HostTensor, WeightSource};

/// One memory-mapped `.safetensors` file with its parsed header.
struct Shard {
    path: PathBuf,
    mmap: memmap2::Mmap,
    /// Offset of the data section (8 + header length).
    data_start: usize,
    tensors: HashMap<String, TensorInfo>,
}

impl Shard {
    fn open(path: &Path) -> anyhow::Result<Shard> {
        let mmap = map_file(path)?;
        let (header_len, metadata) = SafeTensors::read_metadata(&mmap).map_err(|e| {
            anyhow::anyhow!(
                "invalid or truncated safetensors file {}: {e:?}",
                path.display()
            )
        })?;
        let tensors = metadata
            .tensors()
            .into_iter()
            .map(|(name, info)| (name, info.clone()))
            .collect();
        Ok(Shard {
            path: path.to_path_buf(),
            mmap,
            data_start: 8 + header_len,
            tensors,
        })
    }
}

/// The tensors of an HF checkpoint directory.
pub struct SafetensorsWeights {
    dir: PathBuf,
    shards: Vec<Shard>,
    /// Tensor name -> index into `shards`.
    index: HashMap<String, usize>,
}

impl SafetensorsWeights {
    /// Opens `model.safetensors`, or the shards listed in
    /// `model.safetensors.index.json`, inside `dir`.
    pub fn open_dir(dir: &Path) -> anyhow::Result<SafetensorsWeights> {
        let single = dir.join("model.safetensors");
        let index_file = dir.join("model.safetensors.index.json");
        let files = if single.is_file() {
            vec![single]
        } else if index_file.is_file() {
            shard_files(&index_file)?
        } else {
            bail!(
                "no model.safetensors or model.safetensors.index.json in {}",
                dir.display()
            );
        };
        Self::open_files(dir, &files)
    }

    /// Opens an explicit list of safetensors files (`dir` only labels errors).
    pub fn open_files(dir: &Path, files: &[PathBuf]) -> anyhow::Result<SafetensorsWeights> {
        let mut shards = Vec::with_capacity(files.len());
        let mut index = HashMap::new();
        for file in files {
            let shard = Shard::open(file)?;
            for name in shard.tensors.keys() {
                if index.insert(name.clone(), shards.len()).is_some() {
                    bail!(
                        "tensor `{name}` appears in more than one file of {}",
                        dir.display()
                    );
                }
            }
            shards.push(shard);
        }
        Ok(SafetensorsWeights {
            dir: dir.to_path_buf(),
            shards,
            index,
        })
    }

    /// Names of all tensors, sorted.
    pub fn tensor_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.index.keys().cloned().collect();
        names.sort();
        names
    }
}

/// The distinct shard files named by an index's `weight_map`, in first-seen order.
fn shard_files(index_file: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string(index_file)
        .with_context(|| format!("cannot read {}", index_file.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("invalid JSON in {}", index_file.display()))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .with_context(|| format!("missing object `weight_map` in {}", index_file.display()))?;
    let dir = index_file.parent().unwrap_or(Path::new("."));
    let mut files: Vec<PathBuf> = Vec::new();
    for (name, file) in map {
        let file = file.as_str().with_context(|| {
            format!(
                "`weight_map.{name}` in {} is not a file name",
                index_file.display()
            )
        })?;
        let path = dir.join(file);
        if !files.contains(&path) {
            files.push(path);
        }
    }
    Ok(files)
}

impl WeightSource for SafetensorsWeights {
    fn load(&mut self, name: &str) -> anyhow::Result<HostTensor> {
        let shard = self
            .index
            .get(name)
            .map(|&i| &self.shards[i])
            .with_context(|| format!("missing tensor `{name}` in {}", self.dir.display()))?;
        let info = &shard.tensors[name];
        let dtype = match info.dtype {
            Dtype::F32 => ElementType::F32,
            Dtype::F16 => ElementType::F16,
            Dtype::BF16 => ElementType::BF16,
            other => bail!(
                "tensor `{name}` in {} has unsupported dtype {other:?} (supported: F32, F16, BF16)",
                shard.path.display()
            ),
        };
        let (begin, end) = info.data_offsets;
        let numel: usize = info.shape.iter().product();
        let bytes = shard
            .mmap
            .get(shard.data_start + begin..shard.data_start + end)
            .filter(|b| b.len() == numel * dtype.size())
            .with_context(|| {
                format!(
                    "tensor `{name}` in {} has data offsets {begin}..{end} that do not fit its shape {:?} or the file",
                    shard.path.display(),
                    info.shape
                )
            })?;
        Ok(HostTensor {
            shape: info.shape.clone(),
            data: decode_le_bytes(bytes, dtype),
        })
    }

    fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    fn origin(&self) -> String {
        self.dir.display().to_string()
    }
}
