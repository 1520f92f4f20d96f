//! Which path multiplies a quantised weight: the integer kernels on its blocks, or f16
//! kernels on a dequantised copy. Measured once per weight shape at load, on this CPU, by
//! the cost of one token of decode (1 activation row) plus one token of a prefill batch
//! (a 32-row product divided by 32), and logged.

use std::time::Instant;

use super::matmul::{self, CpuWeight};

/// Rows of the prefill-shaped product.
const PREFILL_ROWS: usize = 32;
/// Timed repetitions of each product (the fastest counts).
const REPEATS: usize = 3;

/// Seconds per token of each path.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub integer: f64,
    pub f16: f64,
}

impl Timing {
    pub fn integer_wins(&self) -> bool {
        self.integer <= self.f16
    }
}

/// Times both paths for one weight: `quant` on its blocks, `f16` dequantised.
pub fn measure(quant: &CpuWeight, f16: &CpuWeight, threads: usize) -> Timing {
    Timing {
        integer: per_token_secs(quant, threads),
        f16: per_token_secs(f16, threads),
    }
}

/// Decode's cost per token plus prefill's, on activations of ones (values do not change
/// the work).
fn per_token_secs(w: &CpuWeight, threads: usize) -> f64 {
    let x = vec![0.5f32; PREFILL_ROWS * w.cols];
    let mut out = vec![0.0f32; PREFILL_ROWS * w.rows];
    let mut fastest = |m: usize| {
        let (x, out) = (&x[..m * w.cols], &mut out[..m * w.rows]);
        matmul::matmul(x, m, w, None, out, threads);
        (0..REPEATS)
            .map(|_| {
                let started = Instant::now();
                matmul::matmul(x, m, w, None, out, threads);
                started.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
    };
    fastest(1) + fastest(PREFILL_ROWS) / PREFILL_ROWS as f64
}
