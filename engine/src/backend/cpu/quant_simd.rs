//! The micro-kernels of [`super::quant`]: one tile of up to 8 activation rows × one panel
//! of 16 output rows, with AVX-512 VNNI (`vpdpbusd`: 64 u8·i8 products per instruction)
//! or AVX2 (`vpmaddubsw`, 8 columns at a time), chosen at run time.

use super::quant::{
    amax_scalar, quantize_block_scalar, tile_scalar, Bits, QuantRows, BLOCK, PANEL, TILE_ROWS,
};

/// A kernel set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    Avx2,
    Avx512Vnni,
}

impl Isa {
    /// The fastest set this CPU runs (detected once).
    pub fn detect() -> Isa {
        static DETECTED: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *DETECTED.get_or_init(|| *Self::available().last().unwrap_or(&Isa::Scalar))
    }

    /// Every SIMD set this CPU runs, slowest first.
    pub fn available() -> Vec<Isa> {
        let mut sets = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if super::simd::cpu_has_avx2() {
                sets.push(Isa::Avx2);
                if is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vnni")
                {
                    sets.push(Isa::Avx512Vnni);
                }
            }
        }
        sets
    }

    /// For start-up messages.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "AVX2",
            Isa::Avx512Vnni => "AVX-512 VNNI",
        }
    }
}

/// Largest `|x|` (`x.len()` a multiple of 8).
pub fn amax(x: &[f32], isa: Isa) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar {
        // SAFETY: AVX2 was detected (every SIMD set includes it).
        return unsafe { amax_avx2(x) };
    }
    amax_scalar(x)
}

/// [`quantize_block_scalar`] with AVX2 where `isa` has it: the same rounding (ties to
/// even), so the same bytes.
pub fn quantize_block(x: &[f32], q: &mut [i8], inv: f32, isa: Isa) -> (i32, i32) {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar {
        // SAFETY: AVX2 was detected; both slices hold a block.
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

/// One micro-tile: `rows` activation rows from `row0` times one panel's `cols` output rows.
#[derive(Clone, Copy)]
pub struct Tile<'a> {
    pub panel: &'a [u8],
    pub bits: Bits,
    pub blocks: usize,
    pub x: &'a QuantRows,
    /// Activation width (values per row of `x.q`).
    pub k: usize,
    pub row0: usize,
    pub rows: usize,
    /// Where output `(row0, first row of the panel)` goes; row stride `ldo`.
    pub out: *mut f32,
    pub ldo: usize,
    pub cols: usize,
}

/// The kernels' const tag of a [`Bits`].
const U4: u8 = 4;
const U8: u8 = 8;
const U6: u8 = 6;

impl Tile<'_> {
    /// # Safety
    /// `out` is writable for `rows` rows of `cols` values at stride `ldo`; `isa` is one
    /// of [`Isa::available`] (or scalar); `rows <= 8`, `cols <= 16`.
    pub unsafe fn run(&self, isa: Isa) {
        debug_assert!(self.rows <= TILE_ROWS && self.cols <= PANEL);
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => {
                let mut i = 0;
                while i < self.rows {
                    let n = match self.rows - i {
                        8.. => 8,
                        4..=7 => 4,
                        2 | 3 => 2,
                        _ => 1,
                    };
                    let t = self.rest(i);
                    match (self.bits, n) {
                        (Bits::U4, 8) => vnni::<8, U4>(&t),
                        (Bits::U8, 8) => vnni::<8, U8>(&t),
                        (Bits::U6, 8) => vnni::<8, U6>(&t),
                        (Bits::U4, 4) => vnni::<4, U4>(&t),
                        (Bits::U8, 4) => vnni::<4, U8>(&t),
                        (Bits::U6, 4) => vnni::<4, U6>(&t),
                        (Bits::U4, 2) => vnni::<2, U4>(&t),
                        (Bits::U8, 2) => vnni::<2, U8>(&t),
                        (Bits::U6, 2) => vnni::<2, U6>(&t),
                        (Bits::U4, _) => vnni::<1, U4>(&t),
                        (Bits::U8, _) => vnni::<1, U8>(&t),
                        (Bits::U6, _) => vnni::<1, U6>(&t),
                    }
                    i += n;
                }
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                for half in 0..self.cols.div_ceil(8) {
                    let mut i = 0;
                    while i < self.rows {
                        let n = match self.rows - i {
                            4.. => 4,
                            2 | 3 => 2,
                            _ => 1,
                        };
                        let t = self.rest(i);
                        match (self.bits, n) {
                            (Bits::U4, 4) => avx2::<4, U4>(&t, half),
                            (Bits::U8, 4) => avx2::<4, U8>(&t, half),
                            (Bits::U6, 4) => avx2::<4, U6>(&t, half),
                            (Bits::U4, 2) => avx2::<2, U4>(&t, half),
                            (Bits::U8, 2) => avx2::<2, U8>(&t, half),
                            (Bits::U6, 2) => avx2::<2, U6>(&t, half),
                            (Bits::U4, _) => avx2::<1, U4>(&t, half),
                            (Bits::U8, _) => avx2::<1, U8>(&t, half),
                            (Bits::U6, _) => avx2::<1, U6>(&t, half),
                        }
                        i += n;
                    }
                }
            }
            _ => tile_scalar(self),
        }
    }

    /// The tile without its first `n` rows.
    fn rest(&self, n: usize) -> Tile<'_> {
        Tile {
            row0: self.row0 + n,
            rows: self.rows - n,
            out: self.out.wrapping_add(n * self.ldo),
            ..*self
        }
    }
}

/// `MR` rows × 16 columns. Per block: 8 `vpdpbusd` per row into i32 lanes (one lane per
/// output), then `acc += f32(Σu·q)·(d·dₓ) + m·sₓ`; U6 keeps each half's sum apart and
/// takes `32·Σq` of the half off it, then `acc += f32(sum)·(dₕ·dₓ)` per half.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn vnni<const MR: usize, const BITS: u8>(t: &Tile<'_>) {
    use std::arch::x86_64::*;
    let (stride, wb, nb, k) = (t.bits.block_stride(), t.bits.weight_bytes(), t.blocks, t.k);
    let w = t.panel.as_ptr();
    let xq = t.x.q.as_ptr().add(t.row0 * k);
    let xs = t.x.scales.as_ptr().add(t.row0 * nb);
    let low = _mm512_set1_epi8(0x0f);
    let mut accf = [_mm512_setzero_ps(); MR];
    for b in 0..nb {
        let blk = w.add(b * stride);
        let xb = xq.add(b * BLOCK);
        // U6: the first half's sums (the second half's go to `acci`).
        let mut acc_low = [_mm512_setzero_si512(); MR];
        let mut acci = [_mm512_setzero_si512(); MR];
        if BITS == U4 {
            for pair in 0..4 {
                let v = _mm512_loadu_si512(blk.add(pair * 64) as *const __m512i);
                let lo = _mm512_and_si512(v, low);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low);
                for (i, a) in acci.iter_mut().enumerate() {
                    let xp = xb.add(i * k + 8 * pair);
                    let x0 = _mm512_set1_epi32((xp as *const i32).read_unaligned());
                    let x1 = _mm512_set1_epi32((xp.add(4) as *const i32).read_unaligned());
                    *a = _mm512_dpbusd_epi32(*a, lo, x0);
                    *a = _mm512_dpbusd_epi32(*a, hi, x1);
                }
            }
        } else {
            for step in 0..8 {
                let v = _mm512_loadu_si512(blk.add(step * 64) as *const __m512i);
                let accs = if BITS == U6 && step < 4 {
                    &mut acc_low
                } else {
                    &mut acci
                };
                for (i, a) in accs.iter_mut().enumerate() {
                    let xp = xb.add(i * k + 4 * step) as *const i32;
                    *a = _mm512_dpbusd_epi32(*a, v, _mm512_set1_epi32(xp.read_unaligned()));
                }
            }
        }
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(wb) as *const __m256i));
        // U6: `d0` and `m` are the halves' scales d·scaleₕ (exact in f32).
        let (d0, m) = if BITS == U6 {
            let scale = |h: usize| {
                let s = _mm_loadu_si128(blk.add(wb + 32 + 16 * h) as *const __m128i);
                _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(s)))
            };
            (scale(0), scale(1))
        } else {
            let m = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(wb + 32) as *const __m256i));
            (d, m)
        };
        for i in 0..MR {
            let sc = &*xs.add(i * nb + b);
            let dx = _mm512_set1_ps(sc.d);
            if BITS == U6 {
                let lo = _mm512_sub_epi32(acc_low[i], _mm512_set1_epi32(32 * sc.qsum_low));
                let hi = _mm512_sub_epi32(acci[i], _mm512_set1_epi32(32 * (sc.qsum - sc.qsum_low)));
                accf[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), _mm512_mul_ps(d0, dx), accf[i]);
                accf[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), _mm512_mul_ps(m, dx), accf[i]);
            } else {
                accf[i] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(acci[i]), _mm512_mul_ps(d, dx), accf[i]);
                accf[i] = _mm512_fmadd_ps(m, _mm512_set1_ps(sc.s), accf[i]);
            }
        }
    }
    let mask: __mmask16 = if t.cols >= PANEL {
        0xffff
    } else {
        (1u16 << t.cols) - 1
    };
    for (i, f) in accf.iter().enumerate() {
        _mm512_mask_storeu_ps(t.out.add(i * t.ldo), mask, *f);
    }
}

/// `MR` rows × columns `8·half..8·half + 8` of the panel.
///
/// U4: `vpmaddubsw` sums pairs of u4·i8 products into i16 (at most 2·15·127 each, and a
/// block's 8 of them stay below i16::MAX), one `vpmaddwd` per block widens them.
/// U8 values reach 255, so a pair could saturate i16: the kernel multiplies the signed
/// `u − 128` instead (`|w|·sign(x, w)`, at most 2·128·127) and adds `128·Σq` back.
/// U6 values stay below 64 (a pair at most 2·63·127): `vpmaddubsw` takes them as they
/// are, and each half's `32·Σq` comes off its sum.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn avx2<const MR: usize, const BITS: u8>(t: &Tile<'_>, half: usize) {
    use std::arch::x86_64::*;
    let (stride, wb, nb, k) = (t.bits.block_stride(), t.bits.weight_bytes(), t.blocks, t.k);
    let row0 = t.row0;
    let w = t.panel.as_ptr().add(32 * half);
    let xq = t.x.q.as_ptr().add(row0 * k);
    let xs = t.x.scales.as_ptr().add(row0 * nb);
    let low = _mm256_set1_epi8(0x0f);
    let flip = _mm256_set1_epi8(-128);
    let ones = _mm256_set1_epi16(1);
    let mut accf = [_mm256_setzero_ps(); MR];
    for b in 0..nb {
        let blk = w.add(b * stride);
        let xb = xq.add(b * BLOCK);
        // U6: the first half's sums (the second half's go to `acci`).
        let mut acc_low = [_mm256_setzero_si256(); MR];
        let mut acci = [_mm256_setzero_si256(); MR];
        if BITS == U4 {
            let mut acc16 = [_mm256_setzero_si256(); MR];
            for pair in 0..4 {
                let v = _mm256_loadu_si256(blk.add(pair * 64) as *const __m256i);
                let lo = _mm256_and_si256(v, low);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low);
                for (i, a) in acc16.iter_mut().enumerate() {
                    let xp = xb.add(i * k + 8 * pair);
                    let x0 = _mm256_set1_epi32((xp as *const i32).read_unaligned());
                    let x1 = _mm256_set1_epi32((xp.add(4) as *const i32).read_unaligned());
                    *a = _mm256_add_epi16(*a, _mm256_maddubs_epi16(lo, x0));
                    *a = _mm256_add_epi16(*a, _mm256_maddubs_epi16(hi, x1));
                }
            }
            for (a, s) in acci.iter_mut().zip(&acc16) {
                *a = _mm256_madd_epi16(*s, ones);
            }
        } else if BITS == U6 {
            for step in 0..8 {
                let v = _mm256_loadu_si256(blk.add(step * 64) as *const __m256i);
                let accs = if step < 4 { &mut acc_low } else { &mut acci };
                for (i, a) in accs.iter_mut().enumerate() {
                    let xp = xb.add(i * k + 4 * step) as *const i32;
                    let pairs = _mm256_maddubs_epi16(v, _mm256_set1_epi32(xp.read_unaligned()));
                    *a = _mm256_add_epi32(*a, _mm256_madd_epi16(pairs, ones));
                }
            }
        } else {
            for step in 0..8 {
                let v = _mm256_loadu_si256(blk.add(step * 64) as *const __m256i);
                let signed = _mm256_xor_si256(v, flip);
                let magnitude = _mm256_abs_epi8(signed);
                for (i, a) in acci.iter_mut().enumerate() {
                    let xp = xb.add(i * k + 4 * step) as *const i32;
                    let x = _mm256_sign_epi8(_mm256_set1_epi32(xp.read_unaligned()), signed);
                    let pairs = _mm256_maddubs_epi16(magnitude, x);
                    *a = _mm256_add_epi32(*a, _mm256_madd_epi16(pairs, ones));
                }
            }
            for (i, a) in acci.iter_mut().enumerate() {
                let qsum = (*xs.add(i * nb + b)).qsum;
                *a = _mm256_add_epi32(*a, _mm256_set1_epi32(128 * qsum));
            }
        }
        let tail = blk.sub(32 * half).add(wb);
        let d = _mm256_cvtph_ps(_mm_loadu_si128(tail.add(16 * half) as *const __m128i));
        // U6: `d0` and `m` are the halves' scales d·scaleₕ (exact in f32).
        let (d0, m) = if BITS == U6 {
            let scale = |h: usize| {
                let s = _mm_loadl_epi64(tail.add(32 + 16 * h + 8 * half) as *const __m128i);
                _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s)))
            };
            (scale(0), scale(1))
        } else {
            let m = _mm256_cvtph_ps(_mm_loadu_si128(tail.add(32 + 16 * half) as *const __m128i));
            (d, m)
        };
        for i in 0..MR {
            let sc = &*xs.add(i * nb + b);
            let dx = _mm256_set1_ps(sc.d);
            if BITS == U6 {
                let lo = _mm256_sub_epi32(acc_low[i], _mm256_set1_epi32(32 * sc.qsum_low));
                let hi = _mm256_sub_epi32(acci[i], _mm256_set1_epi32(32 * (sc.qsum - sc.qsum_low)));
                accf[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo), _mm256_mul_ps(d0, dx), accf[i]);
                accf[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi), _mm256_mul_ps(m, dx), accf[i]);
            } else {
                accf[i] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(acci[i]), _mm256_mul_ps(d, dx), accf[i]);
                accf[i] = _mm256_fmadd_ps(m, _mm256_set1_ps(sc.s), accf[i]);
            }
        }
    }
    let cols = t.cols.saturating_sub(8 * half).min(8);
    for (i, f) in accf.iter().enumerate() {
        let mut lanes = [0.0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), *f);
        let dst = t.out.add(i * t.ldo + 8 * half);
        std::ptr::copy_nonoverlapping(lanes.as_ptr(), dst, cols);
    }
}
