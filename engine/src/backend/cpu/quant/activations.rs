//! Activations quantised on the fly for the integer kernels: per block of 32 values, `q` in
//! −127..=127 and a scale as [`ActScales`] says.

use half::f16;
use rayon::prelude::*;

use super::super::simd::Isa;
use super::dot;
use super::layout::{BlockScale, QuantRows, BLOCK};
use crate::weights::QuantType;

/// How activations are quantised for a weight type: as llama.cpp quantises them (its
/// activation types' names), so that both engines round the same products the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum ActScales {
    /// One scale per 32 values, rounded to f16; `s = d·Σq` with that rounded `d`, so a
    /// weight offset `m = −k·d` (Q8_0, Q4_0, Q5_0, MXFP4) cancels as llama.cpp's signed products
    /// do (up to the f32 rounding of the two terms).
    Q8_0,
    /// One scale per 32 values and `s = d·Σq`, each rounded to f16 (Q4_1, Q5_1, whose
    /// offsets llama.cpp multiplies by that stored `s`).
    Q8_1,
    /// One f32 scale per 32 values, unrounded: the K-quants. Finer than llama.cpp's Q8_K (one
    /// scale per 256): the input of a K-quant `ffn_down` (Gemma 3's Q4_K and Q6_K) is heavy
    /// tailed, and one outlier per 256 values coarsened the other 255's steps.
    F32,
}

impl ActScales {
    /// llama.cpp's activation type for weights of `kind`.
    pub fn of(kind: QuantType) -> ActScales {
        match kind {
            QuantType::Q8_0 | QuantType::Q4_0 | QuantType::Q5_0 | QuantType::MXFP4 => {
                ActScales::Q8_0
            }
            QuantType::Q4_1 | QuantType::Q5_1 => ActScales::Q8_1,
            QuantType::Q4_K | QuantType::Q5_K | QuantType::Q6_K => ActScales::F32,
        }
    }
}

impl QuantRows {
    /// Quantises `x[m, k]` (k a multiple of 32), reusing the buffers.
    pub fn quantize(&mut self, x: &[f32], m: usize, k: usize, act: ActScales, isa: Isa) {
        let nb = k / BLOCK;
        self.q.resize(m * k, 0);
        self.scales.resize(m * nb, BlockScale::default());
        let rows = self
            .q
            .par_chunks_mut(k)
            .zip(self.scales.par_chunks_mut(nb))
            .zip(x.par_chunks(k));
        rows.with_min_len(16)
            .for_each(|((q, scales), x)| quantize_row(x, q, scales, act, isa));
    }
}

/// Quantises one row: per block of 32, `d = max|x| / 127` and `q = round(x / d)` (ties to
/// even, as llama.cpp's AVX2 Q8_0 / Q8_1).
pub fn quantize_row(x: &[f32], q: &mut [i8], scales: &mut [BlockScale], act: ActScales, isa: Isa) {
    for ((xb, qb), sc) in x
        .chunks_exact(BLOCK)
        .zip(q.chunks_exact_mut(BLOCK))
        .zip(scales.iter_mut())
    {
        let amax = dot::amax(xb, isa);
        let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        let (qsum, qsum_low) = dot::quantize_block(xb, qb, inv, isa);
        *sc = match act {
            ActScales::Q8_0 => {
                let d = f16::from_f32(amax / 127.0).to_f32();
                BlockScale {
                    d,
                    s: d * qsum as f32,
                    qsum,
                    qsum_low,
                }
            }
            ActScales::Q8_1 => {
                let d = amax / 127.0;
                BlockScale {
                    d: f16::from_f32(d).to_f32(),
                    s: f16::from_f32(d * qsum as f32).to_f32(),
                    qsum,
                    qsum_low,
                }
            }
            ActScales::F32 => {
                let d = if inv > 0.0 { 1.0 / inv } else { 0.0 };
                BlockScale {
                    d,
                    s: d * qsum as f32,
                    qsum,
                    qsum_low,
                }
            }
        };
    }
}
