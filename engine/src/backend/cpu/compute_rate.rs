//! The compute rate `GET /version` reports beside the memory bandwidth, for the roofline a
//! load generator sets beside its measurement: measured at start-up as the faster of the
//! engine's own GEMMs on the engine's threads, f32 (the prefill path of unquantised weights:
//! `gemm` over column chunks) and integer (quantised weights: int8 activations against Q8_0
//! blocks, the kernels every GGUF quantisation runs on), 2·M·N·K FLOPs over the best of ten
//! passes each. A roofline needs a ceiling: the integer path computes a quantised model's
//! prefill about twice as fast as f32 here, and the slower figure put prompts below their
//! "floor".

use std::time::Instant;

use half::f16;

use super::matmul::{matmul, CpuWeight, WeightData};
use super::quant::QuantMatrix;
use crate::weights::ggml_quants::QuantType;

/// Rows, columns and depth of the measured GEMM: the shape of a prefill chunk through a
/// small model's projection, large enough to leave the small-row kernel.
const M: usize = 256;
const N: usize = 1024;
const K: usize = 1024;
const PASSES: usize = 10;

/// Q8_0 blocks of an `N × K` weight: each an f16 scale and 32 int8 values.
fn q8_0_blocks() -> Vec<u8> {
    let blocks = N * K / 32;
    let mut bytes = Vec::with_capacity(blocks * 34);
    for b in 0..blocks {
        bytes.extend_from_slice(&f16::from_f32(0.01).to_le_bytes());
        bytes.extend((0..32).map(|i| ((b * 7 + i * 3) % 255) as u8));
    }
    bytes
}

/// FLOP/s of the faster of the engine's f32 and integer GEMMs on `threads` threads of a
/// fresh pool.
pub fn cpu_gemm_flops(threads: usize) -> f64 {
    let threads = threads.max(1);
    let Ok(pool) = rayon::ThreadPoolBuilder::new().num_threads(threads).build() else {
        return 0.0;
    };
    let x: Vec<f32> = (0..M * K).map(|i| (i % 7) as f32 * 0.25 - 0.75).collect();
    let f32_weight = CpuWeight {
        rows: N,
        cols: K,
        data: WeightData::F32((0..N * K).map(|i| (i % 5) as f32 * 0.5 - 1.0).collect()),
    };
    let mut weights = vec![f32_weight];
    if let Ok(q) = QuantMatrix::from_gguf("compute rate", QuantType::Q8_0, N, K, &q8_0_blocks()) {
        weights.push(CpuWeight {
            rows: N,
            cols: K,
            data: WeightData::Quant(q),
        });
    }
    let mut out = vec![0.0f32; M * N];
    let mut best = f64::INFINITY;
    pool.install(|| {
        for w in &weights {
            for _ in 0..PASSES {
                let start = Instant::now();
                matmul(&x, M, w, None, &mut out, threads);
                best = best.min(start.elapsed().as_secs_f64());
            }
        }
    });
    std::hint::black_box(&out);
    2.0 * (M * N * K) as f64 / best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gemm_computes_gigaflops() {
        let flops = cpu_gemm_flops(2);
        // Any CPU this runs on multiplies f32 between 1 GFLOP/s and 100 TFLOP/s.
        assert!((1e9..1e14).contains(&flops), "{flops}");
    }
}
