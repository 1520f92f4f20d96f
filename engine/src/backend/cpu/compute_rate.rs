//! The compute rate `GET /version` reports beside the memory bandwidth, for the roofline a
//! load generator sets beside its measurement: measured at start-up as the engine's own f32
//! GEMM (the prefill path: `gemm` over column chunks) on every core, 2·M·N·K FLOPs over the
//! best of ten passes. The integer kernels of quantised weights can run faster, so this is
//! the f32 side of what the CPU computes, stated as such.

use std::time::Instant;

use super::matmul::{matmul, CpuWeight, WeightData};

/// Rows, columns and depth of the measured GEMM: the shape of a prefill chunk through a
/// small model's projection, large enough to leave the small-row kernel.
const M: usize = 256;
const N: usize = 1024;
const K: usize = 1024;
const PASSES: usize = 10;

/// FLOP/s of the engine's f32 GEMM on `threads` threads of a fresh pool.
pub fn cpu_gemm_flops(threads: usize) -> f64 {
    let threads = threads.max(1);
    let Ok(pool) = rayon::ThreadPoolBuilder::new().num_threads(threads).build() else {
        return 0.0;
    };
    let x: Vec<f32> = (0..M * K).map(|i| (i % 7) as f32 * 0.25 - 0.75).collect();
    let w = CpuWeight {
        rows: N,
        cols: K,
        data: WeightData::F32((0..N * K).map(|i| (i % 5) as f32 * 0.5 - 1.0).collect()),
    };
    let mut out = vec![0.0f32; M * N];
    let mut best = f64::INFINITY;
    pool.install(|| {
        for _ in 0..PASSES {
            let start = Instant::now();
            matmul(&x, M, &w, None, &mut out, threads);
            best = best.min(start.elapsed().as_secs_f64());
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
