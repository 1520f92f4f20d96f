//! The micro-kernels of the quantised matmul: one tile of up to 8 activation rows × one panel
//! of 16 output rows, with AVX-512 VNNI (`vpdpbusd`: 64 u8·i8 products per instruction)
//! or AVX2 (`vpmaddubsw`, 8 columns at a time), chosen at run time; and the scalar
//! reference kernel (`tile_scalar`) that the others are tested against.

#[cfg(target_arch = "x86_64")]
use super::super::lanes::{Avx2, Avx512};
use super::super::simd::Isa;
use super::layout::{row_scales, value_at, Format, QuantRows, RowScales, BLOCK, PANEL, TILE_ROWS};
#[cfg(target_arch = "x86_64")]
use super::scaling::{add_block, RowLanes, SuperScales};

/// One micro-tile: `rows` activation rows from `row0` times one panel's `cols` output rows.
#[derive(Clone, Copy)]
pub struct Tile<'a> {
    pub panel: &'a [u8],
    pub format: Format,
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

/// The kernels' const tags of the [`Format`]s.
const NIBBLES: u8 = Format::Nibbles.tag();
const BYTES: u8 = Format::Bytes.tag();
const K_NIBBLES: u8 = Format::KNibbles.tag();
const K_BYTES: u8 = Format::KBytes.tag();
const Q6K: u8 = Format::Q6K.tag();

/// Calls `$kernel::<$rows, tag>($args)` with the const tag of `$format`.
macro_rules! by_format {
    ($format:expr, $kernel:ident::<$rows:literal>($($args:expr),*)) => {
        match $format {
            Format::Nibbles => $kernel::<$rows, NIBBLES>($($args),*),
            Format::Bytes => $kernel::<$rows, BYTES>($($args),*),
            Format::KNibbles => $kernel::<$rows, K_NIBBLES>($($args),*),
            Format::KBytes => $kernel::<$rows, K_BYTES>($($args),*),
            Format::Q6K => $kernel::<$rows, Q6K>($($args),*),
        }
    };
}

impl Tile<'_> {
    /// # Safety
    /// `out` is writable for `rows` rows of `cols` values at stride `ldo`; `isa` is one
    /// of [`Isa::available`] (or scalar); `rows <= 8`, `cols <= 16`.
    pub unsafe fn run(&self, isa: Isa) {
        debug_assert!(self.rows <= TILE_ROWS && self.cols <= PANEL);
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 { vnni: true } => {
                let mut i = 0;
                while i < self.rows {
                    let n = match self.rows - i {
                        8.. => 8,
                        4..=7 => 4,
                        2 | 3 => 2,
                        _ => 1,
                    };
                    let t = self.rest(i);
                    match n {
                        8 => by_format!(self.format, vnni::<8>(&t)),
                        4 => by_format!(self.format, vnni::<4>(&t)),
                        2 => by_format!(self.format, vnni::<2>(&t)),
                        _ => by_format!(self.format, vnni::<1>(&t)),
                    }
                    i += n;
                }
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 | Isa::Avx512 { vnni: false } => {
                for half in 0..self.cols.div_ceil(8) {
                    let mut i = 0;
                    while i < self.rows {
                        let n = match self.rows - i {
                            4.. => 4,
                            2 | 3 => 2,
                            _ => 1,
                        };
                        let t = self.rest(i);
                        match n {
                            4 => by_format!(self.format, avx2::<4>(&t, half)),
                            2 => by_format!(self.format, avx2::<2>(&t, half)),
                            _ => by_format!(self.format, avx2::<1>(&t, half)),
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
/// output), then scaled into the f32 sums by [`add_block`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn vnni<const MR: usize, const FMT: u8>(t: &Tile<'_>) {
    use std::arch::x86_64::*;
    let f = Format::from_tag(FMT);
    let (wb, nb, k, per) = (f.weight_bytes(), t.blocks, t.k, f.super_blocks());
    debug_assert!(nb.is_multiple_of(per));
    let w = t.panel.as_ptr();
    let xq = t.x.q.as_ptr().add(t.row0 * k);
    let xs = t.x.scales.as_ptr().add(t.row0 * nb);
    let low = _mm512_set1_epi8(0x0f);
    let mut accf = [_mm512_setzero_ps(); MR];
    let mut sup = SuperScales::none::<Avx512>();
    for b in 0..nb {
        if f.k_quant() && b % per == 0 {
            sup = SuperScales::load::<Avx512>(f, w.add(f.header_offset(b)), 0);
        }
        let blk = w.add(f.block_offset(b));
        let xb = xq.add(b * BLOCK);
        // Q6_K: the first half's sums (the second half's go to `acci`).
        let mut acc_low = [_mm512_setzero_si512(); MR];
        let mut acci = [_mm512_setzero_si512(); MR];
        if f.nibbles() {
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
            add_byte_dots::<Avx512, MR>(f, blk, (xb, k), (&mut acc_low, &mut acci));
        }
        let sums = (&acc_low, &acci);
        add_block::<Avx512, MR>(f, blk.add(wb), 0, &sup, b, (xs.add(b), nb), sums, &mut accf);
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

/// `MR` rows × columns `8·half..8·half + 8` of the panel: [`vnni`]'s sums.
///
/// Nibbles: `vpmaddubsw` sums pairs of u4·i8 products into i16 (at most 2·15·127 each,
/// and a block's 8 of them stay below i16::MAX), one `vpmaddwd` per block widens them.
/// Q8_0's values (in [`Format::Bytes`], with Q5_0's and Q5_1's) reach 255, so a pair
/// could saturate i16: the kernel multiplies the signed `u − 128` instead
/// (`|w|·sign(x, w)`, at most 2·128·127) and adds `128·Σq` back. Q5_K's and Q6_K's values
/// stay below 64 (a pair at most 2·63·127): `vpmaddubsw` takes them as they are, and each
/// Q6_K half's `32·Σq` comes off its sum.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn avx2<const MR: usize, const FMT: u8>(t: &Tile<'_>, half: usize) {
    use std::arch::x86_64::*;
    let f = Format::from_tag(FMT);
    let (wb, nb, k, per) = (f.weight_bytes(), t.blocks, t.k, f.super_blocks());
    debug_assert!(nb.is_multiple_of(per));
    let row0 = t.row0;
    let panel = t.panel.as_ptr();
    let xq = t.x.q.as_ptr().add(row0 * k);
    let xs = t.x.scales.as_ptr().add(row0 * nb);
    let low = _mm256_set1_epi8(0x0f);
    let flip = _mm256_set1_epi8(-128);
    let ones = _mm256_set1_epi16(1);
    let mut accf = [_mm256_setzero_ps(); MR];
    let mut sup = SuperScales::none::<Avx2>();
    for b in 0..nb {
        if f.k_quant() && b % per == 0 {
            sup = SuperScales::load::<Avx2>(f, panel.add(f.header_offset(b)), 8 * half);
        }
        let blk = panel.add(f.block_offset(b));
        let w = blk.add(32 * half);
        let xb = xq.add(b * BLOCK);
        // Q6_K: the first half's sums (the second half's go to `acci`).
        let mut acc_low = [_mm256_setzero_si256(); MR];
        let mut acci = [_mm256_setzero_si256(); MR];
        if f.nibbles() {
            let mut acc16 = [_mm256_setzero_si256(); MR];
            for pair in 0..4 {
                let v = _mm256_loadu_si256(w.add(pair * 64) as *const __m256i);
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
        } else if f == Format::Bytes {
            for step in 0..8 {
                let v = _mm256_loadu_si256(w.add(step * 64) as *const __m256i);
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
        } else {
            add_byte_dots::<Avx2, MR>(f, w, (xb, k), (&mut acc_low, &mut acci));
        }
        let (sums, row0) = ((&acc_low, &acci), 8 * half);
        add_block::<Avx2, MR>(
            f,
            blk.add(wb),
            row0,
            &sup,
            b,
            (xs.add(b), nb),
            sums,
            &mut accf,
        );
    }
    let cols = t.cols.saturating_sub(8 * half).min(8);
    for (i, f) in accf.iter().enumerate() {
        let mut lanes = [0.0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), *f);
        let dst = t.out.add(i * t.ldo + 8 * half);
        std::ptr::copy_nonoverlapping(lanes.as_ptr(), dst, cols);
    }
}

/// A block of one value per byte, 4 per lane and step over 8 steps: each row's sums of
/// `u·q`, Q6_K's first half into `acc_low`. The activation row `i`'s block is at
/// `xb + i·k`.
///
/// # Safety
/// `w` holds the block's 8 steps of weights, `xb` its activation rows; the CPU runs `L`
/// with its [`RowLanes::add_dots`] (AVX-512 VNNI; on AVX2, no [`Format::Bytes`]).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn add_byte_dots<L: RowLanes, const MR: usize>(
    f: Format,
    w: *const u8,
    (xb, k): (*const i8, usize),
    (acc_low, acci): (&mut [L::I; MR], &mut [L::I; MR]),
) {
    debug_assert!(
        L::N == 16 || f != Format::Bytes,
        "AVX2's pairs would saturate"
    );
    for step in 0..8 {
        let v = L::load_weights(w.add(step * 64));
        let accs = if f == Format::Q6K && step < 4 {
            &mut *acc_low
        } else {
            &mut *acci
        };
        for (i, a) in accs.iter_mut().enumerate() {
            let x = (xb.add(i * k + 4 * step) as *const i32).read_unaligned();
            *a = L::add_dots(*a, v, x);
        }
    }
}

/// The reference kernel: the same sum in plain integer and float arithmetic. A K-quant
/// block adds `f32(Σu·q)·(scale·d)·dₓ − (min·dmin)·sₓ` with its own activation scale `dₓ`
/// (and `sₓ = dₓ·Σq`).
///
/// # Safety
/// `tile.out` is writable for `tile.rows` rows of `tile.cols` values at stride `tile.ldo`.
pub unsafe fn tile_scalar(tile: &Tile<'_>) {
    let format = tile.format;
    let nb = tile.blocks;
    debug_assert!(nb.is_multiple_of(format.super_blocks()));
    for i in 0..tile.rows {
        let row = tile.row0 + i;
        for r in 0..tile.cols {
            let mut acc = 0.0f32;
            for b in 0..nb {
                let blk = &tile.panel[format.block_offset(b)..];
                let mut dots = [0i32; 2];
                for c in 0..BLOCK {
                    let u = value_at(format, blk, r, c);
                    let q = tile.x.q[row * tile.k + b * BLOCK + c];
                    dots[c / (BLOCK / 2)] += i32::from(u) * i32::from(q);
                }
                let sc = tile.x.scales[row * nb + b];
                acc += match row_scales(format, tile.panel, b, r) {
                    RowScales::Affine { d, m } => {
                        (dots[0] + dots[1]) as f32 * (d * sc.d) + m * sc.s
                    }
                    RowScales::ScaleMin {
                        d,
                        dmin,
                        scale,
                        min,
                    } => {
                        (dots[0] + dots[1]) as f32 * (scale as f32 * d) * sc.d
                            - min as f32 * dmin * sc.s
                    }
                    RowScales::Halves { d, scales } => {
                        let low = dots[0] - 32 * sc.qsum_low;
                        let high = dots[1] - 32 * (sc.qsum - sc.qsum_low);
                        let half = |dot: i32, scale: i32| dot as f32 * (scale as f32 * d);
                        (half(low, scales[0]) + half(high, scales[1])) * sc.d
                    }
                };
            }
            *tile.out.add(i * tile.ldo + r) = acc;
        }
    }
}
