//! Weights from safetensors (memory-mapped) and GGUF behind one interface.
//!
//! Every tensor is exposed under its Hugging Face name
//! (`model.layers.3.self_attn.q_proj.weight`, `model.embed_tokens.weight`,
//! `lm_head.weight`, ...) with HF's row-major shape (`[out_features, in_features]`
//! for linear layers), whatever the file format.

pub mod ggml_quants;
pub mod gguf;
pub mod gguf_config;
pub mod gguf_weights;
pub mod safetensors;

use std::path::Path;

use anyhow::{bail, ensure, Context};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::config::ModelConfig;
pub use ggml_quants::QuantType;

/// Element storage of a host tensor.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorData {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    /// GGUF blocks as stored in the file: each row is `cols / 32` whole blocks. A backend
    /// keeps them quantised or dequantises them ([`TensorData::to_f32`]).
    Quant(QuantType, Vec<u8>),
    /// Rows stacked from parts quantised with different types, in order (a fused weight
    /// whose parts a mixed file stores apart: Q4_K_M's Q4_K `q_proj` and Q6_K `v_proj`);
    /// each part is whole blocks of its type.
    QuantParts(Vec<(QuantType, Vec<u8>)>),
}

/// A tensor in host memory, row-major, HF shape.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    pub shape: Vec<usize>,
    pub data: TensorData,
}

/// A file (or set of files) that tensors can be read from by HF name.
pub trait WeightSource: Send {
    /// Reads one tensor; errors name the file and the tensor.
    fn load(&mut self, name: &str) -> anyhow::Result<HostTensor>;
    /// Whether the tensor exists (e.g. `lm_head.weight` for untied models).
    fn contains(&self, name: &str) -> bool;
    /// Where the tensors come from (a file or directory), for error messages.
    fn origin(&self) -> String {
        "weight source".to_string()
    }
    /// Reads a tensor and checks that its shape is `shape`; the error names the
    /// tensor, the source and both shapes.
    fn load_expect(&mut self, name: &str, shape: &[usize]) -> anyhow::Result<HostTensor> {
        let tensor = self.load(name)?;
        if tensor.shape != shape {
            bail!(
                "tensor `{name}` in {} has shape {:?}, expected {:?}",
                self.origin(),
                tensor.shape,
                shape
            );
        }
        Ok(tensor)
    }
}

impl TensorData {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            TensorData::F32(v) => v.len(),
            TensorData::F16(v) => v.len(),
            TensorData::BF16(v) => v.len(),
            TensorData::Quant(q, b) => quant_len(*q, b),
            TensorData::QuantParts(parts) => parts.iter().map(|(q, b)| quant_len(*q, b)).sum(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements widened (or dequantised) to f32, exact for every variant.
    pub fn to_f32(&self) -> Vec<f32> {
        match self {
            TensorData::F32(v) => v.clone(),
            TensorData::F16(v) => v.to_f32_vec(),
            TensorData::BF16(v) => v.to_f32_vec(),
            TensorData::Quant(q, b) => ggml_quants::dequantize(*q, b),
            TensorData::QuantParts(parts) => parts
                .iter()
                .flat_map(|(q, b)| ggml_quants::dequantize(*q, b))
                .collect(),
        }
    }

    /// Like [`TensorData::to_f32`] without copying an f32 tensor.
    pub fn into_f32(self) -> Vec<f32> {
        match self {
            TensorData::F32(v) => v,
            other => other.to_f32(),
        }
    }
}

/// Elements in whole blocks `b` of type `q`.
fn quant_len(q: QuantType, b: &[u8]) -> usize {
    b.len() / q.block_bytes() * q.block_elems()
}

impl HostTensor {
    /// Number of elements implied by the shape.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The elements widened to f32 (no copy for f32 tensors).
    pub fn into_f32(self) -> Vec<f32> {
        self.data.into_f32()
    }

    /// The tensor cut along its first dimension: `shape[0]` tensors of `shape[1..]` (a
    /// stack of experts into each expert). Quantised data is cut at whole rows.
    pub fn split_outer(self, name: &str) -> anyhow::Result<Vec<HostTensor>> {
        let (&n, inner) = self
            .shape
            .split_first()
            .with_context(|| format!("tensor `{name}` has no dimensions to split"))?;
        ensure!(
            n > 0 && self.data.len() == self.numel(),
            "tensor `{name}`: shape {:?} does not match its {} values",
            self.shape,
            self.data.len()
        );
        let shape = inner.to_vec();
        fn chunks<T: Clone>(
            v: &[T],
            n: usize,
            wrap: impl Fn(Vec<T>) -> TensorData,
        ) -> Vec<TensorData> {
            v.chunks(v.len() / n).map(|c| wrap(c.to_vec())).collect()
        }
        let pieces = match &self.data {
            TensorData::F32(v) => chunks(v, n, TensorData::F32),
            TensorData::F16(v) => chunks(v, n, TensorData::F16),
            TensorData::BF16(v) => chunks(v, n, TensorData::BF16),
            TensorData::Quant(q, b) => {
                ensure!(
                    b.len().is_multiple_of(n),
                    "tensor `{name}`: {} bytes of {q:?} do not split into {n} equal parts",
                    b.len()
                );
                let q = *q;
                chunks(b, n, |c| TensorData::Quant(q, c))
            }
            TensorData::QuantParts(_) => {
                bail!("tensor `{name}` mixes quantisation types and cannot be split")
            }
        };
        Ok(pieces
            .into_iter()
            .map(|data| HostTensor {
                shape: shape.clone(),
                data,
            })
            .collect())
    }

    /// The even rows and the odd rows of a matrix (or the even and odd elements of a
    /// vector): gate and up where a checkpoint interleaves them (gpt-oss). Quantised rows
    /// move as whole blocks.
    pub fn split_interleaved_rows(self, name: &str) -> anyhow::Result<(HostTensor, HostTensor)> {
        let rows = *self.shape.first().unwrap_or(&0);
        ensure!(
            rows > 0 && rows.is_multiple_of(2) && self.data.len() == self.numel(),
            "tensor `{name}` of shape {:?} has no even number of rows to split into gate and up",
            self.shape
        );
        fn halves<T: Clone>(
            v: &[T],
            rows: usize,
            wrap: impl Fn(Vec<T>) -> TensorData,
        ) -> [TensorData; 2] {
            let row = v.len() / rows;
            [0, 1].map(|parity| {
                wrap(
                    v.chunks(row)
                        .skip(parity)
                        .step_by(2)
                        .flatten()
                        .cloned()
                        .collect(),
                )
            })
        }
        let [even, odd] = match &self.data {
            TensorData::F32(v) => halves(v, rows, TensorData::F32),
            TensorData::F16(v) => halves(v, rows, TensorData::F16),
            TensorData::BF16(v) => halves(v, rows, TensorData::BF16),
            TensorData::Quant(q, b) => {
                let q = *q;
                halves(b, rows, |c| TensorData::Quant(q, c))
            }
            TensorData::QuantParts(_) => {
                bail!("tensor `{name}` mixes quantisation types and cannot be split")
            }
        };
        let mut shape = self.shape.clone();
        shape[0] = rows / 2;
        let half = |data| HostTensor {
            shape: shape.clone(),
            data,
        };
        Ok((half(even), half(odd)))
    }

    /// The rows `rows` lists, in that order, of a matrix (or elements of a vector): a
    /// checkpoint's fused projection reordered (Qwen3-Next's per-key-head q/k/v/z).
    /// Quantised rows move as whole blocks.
    pub fn select_rows(&self, name: &str, rows: &[usize]) -> anyhow::Result<HostTensor> {
        let total = *self.shape.first().unwrap_or(&0);
        ensure!(
            total > 0 && self.data.len() == self.numel(),
            "tensor `{name}` of shape {:?} has no rows to select",
            self.shape
        );
        if let Some(&bad) = rows.iter().find(|&&r| r >= total) {
            bail!("tensor `{name}` has {total} rows, not a row {bad}");
        }
        fn pick<T: Clone>(v: &[T], total: usize, rows: &[usize]) -> Vec<T> {
            let row = v.len() / total;
            rows.iter()
                .flat_map(|&r| &v[r * row..(r + 1) * row])
                .cloned()
                .collect()
        }
        let data = match &self.data {
            TensorData::F32(v) => TensorData::F32(pick(v, total, rows)),
            TensorData::F16(v) => TensorData::F16(pick(v, total, rows)),
            TensorData::BF16(v) => TensorData::BF16(pick(v, total, rows)),
            TensorData::Quant(q, b) => TensorData::Quant(*q, pick(b, total, rows)),
            TensorData::QuantParts(_) => {
                bail!("tensor `{name}` mixes quantisation types and cannot be reordered")
            }
        };
        let mut shape = self.shape.clone();
        shape[0] = rows.len();
        Ok(HostTensor { shape, data })
    }

    /// A matrix transposed (`[a, b]` to `[b, a]`), in its own float type: a checkpoint that
    /// stores `x · W` rather than HF's `x · Wᵀ` (gpt-oss's unquantised experts).
    pub fn transposed(self, name: &str) -> anyhow::Result<HostTensor> {
        let (rows, cols) = self.matrix_dims(name)?;
        fn flip<T: Copy>(v: &[T], rows: usize, cols: usize) -> Vec<T> {
            (0..cols)
                .flat_map(|c| (0..rows).map(move |r| v[r * cols + c]))
                .collect()
        }
        let data = match &self.data {
            TensorData::F32(v) => TensorData::F32(flip(v, rows, cols)),
            TensorData::F16(v) => TensorData::F16(flip(v, rows, cols)),
            TensorData::BF16(v) => TensorData::BF16(flip(v, rows, cols)),
            TensorData::Quant(..) | TensorData::QuantParts(_) => {
                bail!("tensor `{name}` is quantised along its rows and cannot be transposed")
            }
        };
        Ok(HostTensor {
            shape: vec![cols, rows],
            data,
        })
    }

    /// `(rows, cols)` of a 2-D weight whose data fills its shape; `name` is for errors.
    pub fn matrix_dims(&self, name: &str) -> anyhow::Result<(usize, usize)> {
        let &[rows, cols] = self.shape.as_slice() else {
            bail!(
                "weight `{name}` has shape {:?}, expected 2 dimensions",
                self.shape
            );
        };
        ensure!(
            self.data.len() == rows * cols,
            "weight `{name}`: shape {:?} does not match its {} values",
            self.shape,
            self.data.len()
        );
        Ok((rows, cols))
    }

    /// The values of a 1-D parameter (a norm weight, a bias) widened to f32, checked
    /// against its shape; `name` is for errors.
    pub fn into_param(self, name: &str) -> anyhow::Result<Vec<f32>> {
        ensure!(
            self.shape.len() == 1,
            "parameter `{name}` has shape {:?}, expected 1 dimension",
            self.shape
        );
        ensure!(
            self.data.len() == self.shape[0],
            "parameter `{name}`: shape {:?} does not match its {} values",
            self.shape,
            self.data.len()
        );
        Ok(self.into_f32())
    }
}

/// Opens a model: a directory is an HF checkpoint (`config.json` plus
/// `model.safetensors` or a sharded `model.safetensors.index.json`), a `.gguf`
/// file is a GGUF model. Returns its configuration and its weights.
pub fn open_model(path: &Path) -> anyhow::Result<(ModelConfig, Box<dyn WeightSource>)> {
    if path.is_dir() {
        let config = ModelConfig::from_hf_config(&path.join("config.json"))?;
        let weights = safetensors::SafetensorsWeights::open_dir(path)?;
        return Ok((config, Box::new(weights)));
    }
    if path
        .extension()
        .is_some_and(|ext| ext.eq_ignore_ascii_case("gguf"))
    {
        let (config, weights) = gguf_weights::open_gguf_model(path)?;
        return Ok((config, Box::new(weights)));
    }
    if !path.exists() {
        bail!("model path {} does not exist", path.display());
    }
    bail!(
        "model path {} is neither an HF model directory nor a .gguf file",
        path.display()
    )
}

/// Decodes little-endian element bytes into tensor data.
pub(crate) fn decode_le_bytes(bytes: &[u8], dtype: ElementType) -> TensorData {
    match dtype {
        ElementType::F32 => TensorData::F32(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        ),
        ElementType::F16 => TensorData::F16(
            bytes
                .chunks_exact(2)
                .map(|b| f16::from_bits(u16::from_le_bytes([b[0], b[1]])))
                .collect(),
        ),
        ElementType::BF16 => TensorData::BF16(
            bytes
                .chunks_exact(2)
                .map(|b| bf16::from_bits(u16::from_le_bytes([b[0], b[1]])))
                .collect(),
        ),
    }
}

/// The unquantised element types a file may store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ElementType {
    F32,
    F16,
    BF16,
}

impl ElementType {
    pub(crate) fn size(self) -> usize {
        match self {
            ElementType::F32 => 4,
            ElementType::F16 | ElementType::BF16 => 2,
        }
    }
}

/// Memory-maps a file read-only.
pub(crate) fn map_file(path: &Path) -> anyhow::Result<memmap2::Mmap> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: the map is read-only; model files are not modified while the engine runs.
    unsafe { memmap2::Mmap::map(&file) }
        .with_context(|| format!("cannot memory-map {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stack of 3 experts of 2 rows of 32 Q8_0 values splits into each expert's own
    /// blocks, in order; f32 stacks split by values; a split that cannot be whole is refused.
    #[test]
    fn split_outer_cuts_stacks_at_whole_rows() {
        let block = QuantType::Q8_0.block_bytes();
        let bytes: Vec<u8> = (0..3 * 2 * block).map(|i| (i / block) as u8).collect();
        let stacked = HostTensor {
            shape: vec![3, 2, 32],
            data: TensorData::Quant(QuantType::Q8_0, bytes),
        };
        let experts = stacked.split_outer("w").unwrap();
        assert_eq!(experts.len(), 3);
        for (x, e) in experts.iter().enumerate() {
            assert_eq!(e.shape, [2, 32]);
            let TensorData::Quant(QuantType::Q8_0, b) = &e.data else {
                panic!("{:?}", e.data);
            };
            let want: Vec<u8> = (0..2 * block).map(|i| (2 * x + i / block) as u8).collect();
            assert_eq!(b, &want, "expert {x}");
        }
        let f32s = HostTensor {
            shape: vec![2, 1, 2],
            data: TensorData::F32(vec![1.0, 2.0, 3.0, 4.0]),
        };
        let halves: Vec<Vec<f32>> = f32s
            .split_outer("v")
            .unwrap()
            .into_iter()
            .map(|t| t.into_f32())
            .collect();
        assert_eq!(halves, [vec![1.0, 2.0], vec![3.0, 4.0]]);
        let short = HostTensor {
            shape: vec![2, 1, 32],
            data: TensorData::F32(vec![0.0; 32]),
        };
        assert!(short.split_outer("s").is_err());
    }
}
