//! A block's integer sums scaled into f32 and added to the accumulators: the part of the
//! integer tiles that is the same whatever instruction made the sums, written once over
//! [`RowLanes`] (the f32 [`Lanes`] of AVX-512, 16 output rows, or of AVX2, 8) and inlined
//! into each tile.

use super::super::lanes::{Avx2, Avx512, Lanes};
use super::layout::{BlockScale, Format, BLOCK, PANEL, SUPER_BLOCK};

/// One vector of the panel's output rows, from row `row0` on: what the scaling needs
/// beyond the f32 [`Lanes`].
///
/// # Safety
/// The CPU has the implementation's instructions; pointers are readable for the lanes.
pub trait RowLanes: Lanes {
    /// i32 lanes (the integer sums).
    type I: Copy;

    unsafe fn splat(x: f32) -> Self::V;
    /// One f16 per lane.
    unsafe fn load_f16(p: *const u8) -> Self::V;
    /// One u8 (`signed`: i8) per lane, as f32.
    unsafe fn load_bytes(p: *const u8, signed: bool) -> Self::V;
    /// Two u8 per lane (lane r's at bytes 2r and 2r + 1), as f32: the firsts, the seconds.
    unsafe fn load_byte_pairs(p: *const u8) -> (Self::V, Self::V);
    unsafe fn to_f32(v: Self::I) -> Self::V;
    /// The lanes' next 4 u8 weights each, from `p`.
    unsafe fn load_weights(p: *const u8) -> Self::I;
    /// `acc` plus, in each lane, the dot product of its 4 u8 of `u` with the 4 i8 of `x`.
    ///
    /// # Safety
    /// AVX-512's needs AVX-512 VNNI (`vpdpbusd`). AVX2's sums pairs in i16 first
    /// (`vpmaddubsw`, which saturates): `u`'s values must be below 64, as Q5_K's and Q6_K's
    /// are (Q8_0's, up to 255, are not).
    unsafe fn add_dots(acc: Self::I, u: Self::I, x: i32) -> Self::I;
    /// `v − x` in every lane.
    unsafe fn sub_splat(v: Self::I, x: i32) -> Self::I;
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    /// `c − a·b`.
    unsafe fn fnmadd(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
}

/// A K-quant super-block's scales per output row: `d`, and each block's `min·dmin`
/// (Q4_K, Q5_K).
pub struct SuperScales<F> {
    d: F,
    mins: [F; SUPER_BLOCK / BLOCK],
}

impl<F: Copy> SuperScales<F> {
    /// From the super-block's header at `head`, for the rows from `row0`.
    ///
    /// # Safety
    /// `head` is a K-quant super-block header of a panel; the CPU runs `L`.
    #[inline(always)]
    pub unsafe fn load<L: RowLanes<V = F>>(format: Format, head: *const u8, row0: usize) -> Self {
        let d = L::load_f16(head.add(2 * row0));
        let mut mins = [L::zero(); SUPER_BLOCK / BLOCK];
        if format != Format::Q6K {
            let dmin = L::load_f16(head.add(2 * PANEL + 2 * row0));
            for p in 0..mins.len() / 2 {
                let (even, odd) = L::load_byte_pairs(head.add(Format::min_offset(row0, 2 * p)));
                mins[2 * p] = L::mul(even, dmin);
                mins[2 * p + 1] = L::mul(odd, dmin);
            }
        }
        SuperScales { d, mins }
    }

    /// Scales that no block reads (before a panel's first K-quant header).
    ///
    /// # Safety
    /// The CPU runs `L`.
    #[inline(always)]
    pub unsafe fn none<L: RowLanes<V = F>>() -> Self {
        SuperScales {
            d: L::zero(),
            mins: [L::zero(); SUPER_BLOCK / BLOCK],
        }
    }
}

/// Block `b`'s integer sums of `MR` activation rows, added to `accf`. The 32-weight types
/// add `f32(Σu·q)·(d·dₓ) + m·sₓ`; the K-quants, whose activation blocks each have their own
/// `dₓ`, add `f32(Σu·q)·(scale·d)·dₓ` (Q6_K: per half, `acc_low` the first's sums, with the
/// half's `32·Σq` taken off) and (Q4_K, Q5_K) `−(min·dmin)·sₓ`, the products of the
/// weights' scales taken once for all the activation rows.
///
/// # Safety
/// `tail` is the block's tail in a panel (after its weights); `xs` points at activation
/// row 0's scale of block `b`, the rows `nb` apart; the CPU runs `L`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn add_block<L: RowLanes, const MR: usize>(
    format: Format,
    tail: *const u8,
    row0: usize,
    sup: &SuperScales<L::V>,
    b: usize,
    (xs, nb): (*const BlockScale, usize),
    (acc_low, acci): (&[L::I; MR], &[L::I; MR]),
    accf: &mut [L::V; MR],
) {
    let scale = |i: usize| &*xs.add(i * nb);
    match format {
        Format::Nibbles | Format::Bytes => {
            let d = L::load_f16(tail.add(2 * row0));
            let m = L::load_f16(tail.add(2 * PANEL + 2 * row0));
            for (i, (a, s)) in accf.iter_mut().zip(acci).enumerate() {
                let sc = scale(i);
                *a = L::fmadd(L::to_f32(*s), L::mul(d, L::splat(sc.d)), *a);
                *a = L::fmadd(m, L::splat(sc.s), *a);
            }
        }
        Format::KNibbles | Format::KBytes => {
            let sd = L::mul(L::load_bytes(tail.add(row0), false), sup.d);
            let min = sup.mins[b % format.super_blocks()];
            for (i, (a, dot)) in accf.iter_mut().zip(acci).enumerate() {
                let sc = scale(i);
                *a = L::fmadd(L::mul(L::to_f32(*dot), sd), L::splat(sc.d), *a);
                *a = L::fnmadd(min, L::splat(sc.s), *a);
            }
        }
        Format::Q6K => {
            let sd0 = L::mul(L::load_bytes(tail.add(row0), true), sup.d);
            let sd1 = L::mul(L::load_bytes(tail.add(PANEL + row0), true), sup.d);
            for (i, a) in accf.iter_mut().enumerate() {
                let sc = scale(i);
                let lo = L::sub_splat(acc_low[i], 32 * sc.qsum_low);
                let hi = L::sub_splat(acci[i], 32 * (sc.qsum - sc.qsum_low));
                let both = L::fmadd(L::to_f32(lo), sd0, L::mul(L::to_f32(hi), sd1));
                *a = L::fmadd(both, L::splat(sc.d), *a);
            }
        }
    }
}

/// 16 rows in 512-bit registers.
impl RowLanes for Avx512 {
    type I = std::arch::x86_64::__m512i;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    unsafe fn splat(x: f32) -> Self::V {
        std::arch::x86_64::_mm512_set1_ps(x)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    unsafe fn load_f16(p: *const u8) -> Self::V {
        use std::arch::x86_64::*;
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    unsafe fn load_bytes(p: *const u8, signed: bool) -> Self::V {
        use std::arch::x86_64::*;
        let v = _mm_loadu_si128(p as *const __m128i);
        _mm512_cvtepi32_ps(if signed {
            _mm512_cvtepi8_epi32(v)
        } else {
            _mm512_cvtepu8_epi32(v)
        })
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    unsafe fn load_byte_pairs(p: *const u8) -> (Self::V, Self::V) {
        use std::arch::x86_64::*;
        let pair = _mm512_cvtepu8_epi16(_mm256_loadu_si256(p as *const __m256i));
        let first = _mm512_and_si512(pair, _mm512_set1_epi32(0xffff));
        let second = _mm512_srli_epi32::<16>(pair);
        (_mm512_cvtepi32_ps(first), _mm512_cvtepi32_ps(second))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    unsafe fn to_f32(v: Self::I) -> Self::V {
        std::arch::x86_64::_mm512_cvtepi32_ps(v)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    unsafe fn load_weights(p: *const u8) -> Self::I {
        use std::arch::x86_64::*;
        _mm512_loadu_si512(p as *const __m512i)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    unsafe fn add_dots(acc: Self::I, u: Self::I, x: i32) -> Self::I {
        use std::arch::x86_64::*;
        _mm512_dpbusd_epi32(acc, u, _mm512_set1_epi32(x))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    unsafe fn sub_splat(v: Self::I, x: i32) -> Self::I {
        use std::arch::x86_64::*;
        _mm512_sub_epi32(v, _mm512_set1_epi32(x))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V {
        std::arch::x86_64::_mm512_mul_ps(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    unsafe fn fnmadd(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        std::arch::x86_64::_mm512_fnmadd_ps(a, b, c)
    }
}

/// 8 rows in 256-bit registers.
impl RowLanes for Avx2 {
    type I = std::arch::x86_64::__m256i;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn splat(x: f32) -> Self::V {
        std::arch::x86_64::_mm256_set1_ps(x)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_f16(p: *const u8) -> Self::V {
        use std::arch::x86_64::*;
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_bytes(p: *const u8, signed: bool) -> Self::V {
        use std::arch::x86_64::*;
        let v = _mm_loadl_epi64(p as *const __m128i);
        _mm256_cvtepi32_ps(if signed {
            _mm256_cvtepi8_epi32(v)
        } else {
            _mm256_cvtepu8_epi32(v)
        })
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_byte_pairs(p: *const u8) -> (Self::V, Self::V) {
        use std::arch::x86_64::*;
        let pair = _mm256_cvtepu8_epi16(_mm_loadu_si128(p as *const __m128i));
        let first = _mm256_and_si256(pair, _mm256_set1_epi32(0xffff));
        let second = _mm256_srli_epi32::<16>(pair);
        (_mm256_cvtepi32_ps(first), _mm256_cvtepi32_ps(second))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn to_f32(v: Self::I) -> Self::V {
        std::arch::x86_64::_mm256_cvtepi32_ps(v)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_weights(p: *const u8) -> Self::I {
        use std::arch::x86_64::*;
        _mm256_loadu_si256(p as *const __m256i)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn add_dots(acc: Self::I, u: Self::I, x: i32) -> Self::I {
        use std::arch::x86_64::*;
        let pairs = _mm256_maddubs_epi16(u, _mm256_set1_epi32(x));
        _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sub_splat(v: Self::I, x: i32) -> Self::I {
        use std::arch::x86_64::*;
        _mm256_sub_epi32(v, _mm256_set1_epi32(x))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V {
        std::arch::x86_64::_mm256_mul_ps(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn fnmadd(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        std::arch::x86_64::_mm256_fnmadd_ps(a, b, c)
    }
}
