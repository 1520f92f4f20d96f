//! HF safetensors checkpoints, single-file or sharded, memory-mapped. A checkpoint's MXFP4
//! matrices (OpenAI's `X_blocks` and `X_scales`, as gpt-oss is published) read as one
//! quantised tensor `X.weight` of ggml's MXFP4 blocks.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ::safetensors::tensor::{Dtype, TensorInfo};
use ::safetensors::SafeTensors;
use anyhow::{bail, Context};

use super::{
    decode_le_bytes, map_file, ElementType, HostTensor, QuantType, TensorData, WeightSource,
};

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
    /// Tensor name (a text decoder's, [`text_decoder_name`]) -> index into `shards` and the
    /// name the shard stores it under.
    index: HashMap<String, (usize, String)>,
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
                let entry = (shards.len(), name.clone());
                if index.insert(text_decoder_name(name), entry).is_some() {
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

/// A multimodal checkpoint's text decoder (Qwen3.5's `*ForConditionalGeneration`) under
/// the names of a text-only one: `model.language_model.X` is `model.X`.
fn text_decoder_name(name: &str) -> String {
    match name.strip_prefix("model.language_model.") {
        Some(rest) => format!("model.{rest}"),
        None => name.to_string(),
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

impl SafetensorsWeights {
    /// `X_blocks` and `X_scales` for a tensor name `X.weight` when the checkpoint has both.
    fn mxfp4_parts(&self, name: &str) -> Option<(String, String)> {
        let stem = name.strip_suffix(".weight")?;
        let (blocks, scales) = (format!("{stem}_blocks"), format!("{stem}_scales"));
        (self.index.contains_key(&blocks) && self.index.contains_key(&scales))
            .then_some((blocks, scales))
    }

    /// A tensor's dtype, shape and raw bytes, whatever its dtype, and the file it is in.
    fn raw(&self, name: &str) -> anyhow::Result<(Dtype, Vec<usize>, &[u8], &Path)> {
        let (shard, stored) = self
            .index
            .get(name)
            .map(|(i, stored)| (&self.shards[*i], stored))
            .with_context(|| format!("missing tensor `{name}` in {}", self.dir.display()))?;
        let info = &shard.tensors[stored];
        let (begin, end) = info.data_offsets;
        let bytes = shard
            .mmap
            .get(shard.data_start + begin..shard.data_start + end)
            .with_context(|| {
                format!(
                    "tensor `{name}` in {} has data offsets {begin}..{end} past the file",
                    shard.path.display()
                )
            })?;
        Ok((info.dtype, info.shape.clone(), bytes, &shard.path))
    }

    /// OpenAI's MXFP4 `blocks` (`[.., groups, 16]` bytes, values `2j` and `2j + 1` in the
    /// low and high nibbles of byte `j`) and `scales` (`[.., groups]` E8M0 exponents) as
    /// one tensor `[.., groups × 32]` of ggml's MXFP4 blocks: the scale byte, then 16
    /// bytes holding values `j` and `j + 16` in the low and high nibbles of byte `j` (the
    /// repacking of llama.cpp's converter). The codes index the same E2M1 table.
    fn load_mxfp4(&self, name: &str, blocks: &str, scales: &str) -> anyhow::Result<HostTensor> {
        let (b_type, b_shape, b_bytes, _) = self.raw(blocks)?;
        let (s_type, s_shape, s_bytes, _) = self.raw(scales)?;
        let groups = s_shape.iter().product::<usize>();
        anyhow::ensure!(
            b_type == Dtype::U8 && s_type == Dtype::U8,
            "`{blocks}` and `{scales}` in {} are {b_type:?} and {s_type:?}, not the U8 of MXFP4",
            self.dir.display()
        );
        anyhow::ensure!(
            b_shape.split_last() == Some((&16, s_shape.as_slice()))
                && b_bytes.len() == groups * 16
                && s_bytes.len() == groups,
            "`{blocks}` {b_shape:?} and `{scales}` {s_shape:?} in {} are not MXFP4 blocks of \
             32 values and their scales",
            self.dir.display()
        );
        let mut out = Vec::with_capacity(groups * 17);
        for (block, &scale) in b_bytes.chunks_exact(16).zip(s_bytes) {
            out.push(scale);
            let value = |i: usize| (block[i / 2] >> (4 * (i % 2))) & 0x0f;
            out.extend((0..16).map(|j| value(j) | (value(j + 16) << 4)));
        }
        let mut shape = s_shape;
        if let Some(last) = shape.last_mut() {
            *last *= 32;
        }
        tracing::debug!("`{name}` read from MXFP4 `{blocks}` and `{scales}`");
        Ok(HostTensor {
            shape,
            data: TensorData::Quant(QuantType::MXFP4, out),
        })
    }
}

impl WeightSource for SafetensorsWeights {
    fn load(&mut self, name: &str) -> anyhow::Result<HostTensor> {
        if !self.index.contains_key(name) {
            if let Some((blocks, scales)) = self.mxfp4_parts(name) {
                return self.load_mxfp4(name, &blocks, &scales);
            }
        }
        let (dtype, shape, bytes, file) = self.raw(name)?;
        let element = match dtype {
            Dtype::F32 => ElementType::F32,
            Dtype::F16 => ElementType::F16,
            Dtype::BF16 => ElementType::BF16,
            other => bail!(
                "tensor `{name}` in {} has unsupported dtype {other:?} (supported: F32, F16, BF16)",
                file.display()
            ),
        };
        let numel: usize = shape.iter().product();
        if bytes.len() != numel * element.size() {
            bail!(
                "tensor `{name}` in {} has {} bytes of data for its shape {shape:?}",
                file.display(),
                bytes.len()
            );
        }
        Ok(HostTensor {
            data: decode_le_bytes(bytes, element),
            shape,
        })
    }

    fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name) || self.mxfp4_parts(name).is_some()
    }

    fn origin(&self) -> String {
        self.dir.display().to_string()
    }
}

#[cfg(test)]
mod tests {
    use ::safetensors::tensor::TensorView;

    use super::*;
    use crate::weights::ggml_quants::MXFP4_VALUES;

    /// OpenAI's E2M1 values by code.
    const FP4: [f32; 16] = [
        0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
    ];

    /// A 2 × 64 MXFP4 matrix in OpenAI's layout (codes counting up, scales 2^-3, 2^0, 2^2,
    /// 2^-1) reads as one MXFP4 tensor whose every value is the format's: the code's E2M1
    /// value times two to the scale byte minus 127, through ggml's table and block layout.
    #[test]
    fn openai_mxfp4_blocks_read_as_ggml_blocks_value_for_value() {
        let codes: Vec<u8> = (0..128).map(|i| ((i * 7 + i / 16) % 16) as u8).collect();
        let blocks: Vec<u8> = codes.chunks(2).map(|p| p[0] | (p[1] << 4)).collect();
        let scales = [124u8, 127, 129, 126];
        let dir = tempfile::tempdir().unwrap();
        let views = vec![
            (
                "m.w_blocks",
                TensorView::new(Dtype::U8, vec![2, 2, 16], &blocks).unwrap(),
            ),
            (
                "m.w_scales",
                TensorView::new(Dtype::U8, vec![2, 2], &scales).unwrap(),
            ),
        ];
        let bytes = ::safetensors::serialize(views, None).unwrap();
        std::fs::write(dir.path().join("model.safetensors"), bytes).unwrap();
        let mut w = SafetensorsWeights::open_dir(dir.path()).unwrap();
        assert!(w.contains("m.w.weight") && !w.contains("m.v.weight"));
        let t = w.load("m.w.weight").unwrap();
        assert_eq!(t.shape, [2, 64]);
        let TensorData::Quant(QuantType::MXFP4, ggml) = &t.data else {
            panic!("{:?}", t.data)
        };
        assert_eq!(ggml.len(), 4 * 17);
        let values = t.data.to_f32();
        for (i, (&code, &got)) in codes.iter().zip(&values).enumerate() {
            let scale = 2f32.powi(i32::from(scales[i / 32]) - 127);
            let want = FP4[usize::from(code)] * scale;
            assert_eq!(got, want, "value {i} (code {code})");
            // ggml's table holds the same values doubled.
            assert_eq!(
                f32::from(MXFP4_VALUES[usize::from(code)]) / 2.0,
                FP4[usize::from(code)]
            );
        }
        // A blocks tensor of another dtype is refused by name.
        let dir = tempfile::tempdir().unwrap();
        let floats = vec![0u8; 4 * 16 * 4];
        let views = vec![
            (
                "m.w_blocks",
                TensorView::new(Dtype::F32, vec![4, 16], &floats).unwrap(),
            ),
            (
                "m.w_scales",
                TensorView::new(Dtype::U8, vec![4], &scales).unwrap(),
            ),
        ];
        let bytes = ::safetensors::serialize(views, None).unwrap();
        std::fs::write(dir.path().join("model.safetensors"), bytes).unwrap();
        let mut w = SafetensorsWeights::open_dir(dir.path()).unwrap();
        let err = w.load("m.w.weight").unwrap_err().to_string();
        assert!(err.contains("`m.w_blocks`") && err.contains("F32"), "{err}");
    }
}
