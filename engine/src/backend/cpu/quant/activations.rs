//! Activations quantised on the fly for the integer kernels: per block of 32 values, `q` in
//! −127..=127 and a scale as [`ActScales`] says.

use half::f16;
use rayon::prelude::*;

use super::super::simd::Isa;
use super::layout::{BlockScale, QuantRows, BLOCK};
use crate::weights::QuantType;

/// How activations are quantised for a weight type: for the 32-weight types as llama.cpp
/// quantises them (its activation types' names), so that both engines round the same
/// products the same way; for the K-quants one f32 scale per 32 values, finer than
/// llama.cpp's Q8_K.
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
    /// The activation rounding for weights of `kind`: llama.cpp's for the 32-weight types,
    /// [`ActScales::F32`] for the K-quants.
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
/// even, as llama.cpp's AVX2 Q8_0 / Q8_1), with the kernels of `isa`, a set this CPU runs.
pub fn quantize_row(x: &[f32], q: &mut [i8], scales: &mut [BlockScale], act: ActScales, isa: Isa) {
    assert!(
        isa.runs_here(),
        "quantize_row: this CPU does not run {isa:?}"
    );
    for ((xb, qb), sc) in x
        .chunks_exact(BLOCK)
        .zip(q.chunks_exact_mut(BLOCK))
        .zip(scales.iter_mut())
    {
        let amax = amax(xb, isa);
        let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        let (qsum, qsum_low) = quantize_block(xb, qb, inv, isa);
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

/// Largest `|x|` (`x.len()` a multiple of 8).
fn amax(x: &[f32], isa: Isa) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar {
        // SAFETY: `quantize_row` checked that this CPU runs `isa`; every SIMD set has AVX2.
        return unsafe { amax_avx2(x) };
    }
    amax_scalar(x)
}

/// [`quantize_block_scalar`] with AVX2 where `isa` has it: the same rounding (ties to
/// even), so the same bytes.
fn quantize_block(x: &[f32], q: &mut [i8], inv: f32, isa: Isa) -> (i32, i32) {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar {
        // SAFETY: as in `amax`; both slices hold a block.
        return unsafe { quantize_block_avx2(x, q, inv) };
    }
    quantize_block_scalar(x, q, inv)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn amax_avx2(x: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let mut amax = _mm256_setzero_ps();
    for c in x.chunks_exact(8) {
        amax = _mm256_max_ps(amax, _mm256_and_ps(_mm256_loadu_ps(c.as_ptr()), abs_mask));
    }
    let m4 = _mm_max_ps(
        _mm256_castps256_ps128(amax),
        _mm256_extractf128_ps::<1>(amax),
    );
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_block_avx2(x: &[f32], q: &mut [i8], inv: f32) -> (i32, i32) {
    use std::arch::x86_64::*;
    assert!(x.len() >= BLOCK && q.len() >= BLOCK);
    let inv = _mm256_set1_ps(inv);
    let ints: [__m256i; 4] = std::array::from_fn(|j| {
        let v = _mm256_loadu_ps(x.as_ptr().add(8 * j));
        let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(v, inv),
        );
        _mm256_cvtps_epi32(r)
    });
    let low = hsum_epi32(_mm256_add_epi32(ints[0], ints[1]));
    let high = hsum_epi32(_mm256_add_epi32(ints[2], ints[3]));
    // packs interleave the 128-bit lanes; the permute restores element order.
    let w01 = _mm256_packs_epi32(ints[0], ints[1]);
    let w23 = _mm256_packs_epi32(ints[2], ints[3]);
    let bytes = _mm256_packs_epi16(w01, w23);
    let ordered = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, ordered);
    (low + high, low)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn hsum_epi32(v: std::arch::x86_64::__m256i) -> i32 {
    use std::arch::x86_64::*;
    let s4 = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s2 = _mm_add_epi32(s4, _mm_shuffle_epi32::<0b01_00_11_10>(s4));
    _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32::<0b10_11_00_01>(s2)))
}

/// Largest `|x|`.
fn amax_scalar(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |a, v| a.max(v.abs()))
}

/// `q = round(x·inv)` (ties to even) for one block; returns `Σq` and `Σq` of the first 16.
fn quantize_block_scalar(x: &[f32], q: &mut [i8], inv: f32) -> (i32, i32) {
    let (mut sum, mut low) = (0i32, 0i32);
    for (c, (qv, &xv)) in q.iter_mut().zip(x).enumerate() {
        let v = (xv * inv).round_ties_even() as i32;
        *qv = v as i8;
        sum += v;
        if c < BLOCK / 2 {
            low += v;
        }
    }
    (sum, low)
}
