//! The CPU backend: f32 activations, weights in f32 / f16 / bf16 or GGUF's quantised
//! blocks, a dedicated rayon pool.
//!
//! GGUF's quantised weights stay quantised and are multiplied with integer dot products
//! on activations quantised per block (`quant`), so decode, which is bandwidth-bound,
//! reads 0.58 bytes per Q4_K weight (0.625 per Q4_0); by default wherever the CPU has
//! integer SIMD kernels, by a fixed rule so that every process computes the same numbers
//! ([`QuantizedWeights`]).
//! Linear weights that arrive as f32 can be stored as f16
//! ([`CpuOptions::f32_weights_as_f16`]); unquantised f32 checkpoints keep full precision
//! by default.

mod attention;
mod attention_ops;
mod backend;
pub mod compute_rate;
mod delta_net;
mod experts;
mod lanes;
mod layer_ops;
mod matmul;
mod ops;
mod quant;
mod recurrent_ops;
mod sampling;
mod simd;
mod tensors;

pub use attention::{CpuKvCache, KvCacheDtype};
pub use backend::{CpuBackend, CpuOptions, QuantizedWeights};
pub use experts::CpuExperts;
pub use matmul::{CpuWeight, WeightData};
pub use quant::QuantMatrix;

pub use tensors::{CpuAct, CpuStep};

use super::Tensors;

impl Tensors for CpuBackend {
    type Act = CpuAct;
    type Weight = CpuWeight;
    type Param = Vec<f32>;
    type KvCache = CpuKvCache;
    type Step = CpuStep;
    type Experts = CpuExperts;
}
