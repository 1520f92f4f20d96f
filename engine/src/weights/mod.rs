//! Weights from safetensors (memory-mapped) and GGUF behind one interface.
//!
//! Every tensor is exposed under its Hugging Face name
//! (`model.layers.3.self_attn.q_proj.weight`, `model.embed_tokens.weight`,
//! `lm_head.weight`, ...) with HF's row-major shape (`[out_features, in_features]`
//! for linear layers), whatever the file format.

use half::{bf16, f16};

/// Element storage of a host tensor; quantised GGUF types arrive dequantised.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorData {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
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
}
