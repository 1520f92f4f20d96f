//! What ggml's block-quantised types mean: their block sizes, their dequantisation to f32
//! (the scalar reference, checked against PyPI `gguf`'s own dequantiser), and each block
//! as 32-value groups of unsigned values `u` with the scales that the CPU's integer
//! kernels multiply them by.
//!
//! Layouts (llama.cpp's `ggml-common.h`): Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and MXFP4 hold 32
//! weights per block; the K-quants Q4_K, Q5_K and Q6_K hold 256 per super-block, in 8 groups of 32
//! (Q4_K, Q5_K: a 6-bit scale and a 6-bit min each, times the super-block's f16 `d` and
//! `dmin`) or 16 groups of 16 (Q6_K: a signed 8-bit scale each, times `d`).

use half::f16;
use rayon::prelude::*;

/// Block-quantised ggml types, under ggml's names.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantType {
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q4_K,
    Q5_K,
    Q6_K,
    /// OCP microscaling FP4 (gpt-oss's experts): 32 FP4 (E2M1) values and one E8M0 scale;
    /// ggml's `block_mxfp4` is the scale byte, then byte `j` holds value `j` in its low
    /// nibble and value `j + 16` in its high one.
    MXFP4,
}

/// FP4 (E2M1) values doubled, by code (ggml's `kvalues_mxfp4`): the code's sign bit, then
/// 0, 0.5, 1, 1.5, 2, 3, 4, 6 times two, so that each is an integer.
pub const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// An E8M0 scale halved (it multiplies [`MXFP4_VALUES`], which are doubled): `2^(e − 128)`,
/// exact for every byte (as ggml's `ggml_e8m0_to_fp32_half`; 255, the format's NaN, is read as
/// `2^127` as there).
pub fn e8m0_half(e: u8) -> f32 {
    f32::from_bits(if e < 2 {
        0x0020_0000 << e
    } else {
        u32::from(e - 1) << 23
    })
}

/// Weights per K-quant super-block.
const QK_K: usize = 256;
/// Weights per group of the integer kernels' form.
pub const GROUP: usize = 32;

impl QuantType {
    /// The ggml type id in GGUF files.
    pub fn from_id(id: u32) -> Option<QuantType> {
        Some(match id {
            2 => QuantType::Q4_0,
            3 => QuantType::Q4_1,
            6 => QuantType::Q5_0,
            7 => QuantType::Q5_1,
            8 => QuantType::Q8_0,
            12 => QuantType::Q4_K,
            13 => QuantType::Q5_K,
            14 => QuantType::Q6_K,
            39 => QuantType::MXFP4,
            _ => return None,
        })
    }

    /// Weights per block.
    pub fn block_elems(self) -> usize {
        match self {
            QuantType::Q4_K | QuantType::Q5_K | QuantType::Q6_K => QK_K,
            _ => 32,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            QuantType::Q8_0 => 34,
            QuantType::Q4_0 => 18,
            QuantType::Q4_1 => 20,
            QuantType::Q5_0 => 22,
            QuantType::Q5_1 => 24,
            QuantType::Q4_K => 144,
            QuantType::Q5_K => 176,
            QuantType::Q6_K => 210,
            QuantType::MXFP4 => 17,
        }
    }

    /// Whether the type is a K-quant (256-weight super-blocks; llama.cpp multiplies these
    /// with activations quantised per 256 values, the others per 32; the CPU backend here
    /// quantises every activation per 32).
    pub fn is_k_quant(self) -> bool {
        self.block_elems() == QK_K
    }
}

/// The little-endian f16 at byte `at`, as f32.
pub fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([bytes[at], bytes[at + 1]])).to_f32()
}

/// Dequantises whole blocks to f32 (`bytes.len()` must be a multiple of the block size).
pub fn dequantize(dtype: QuantType, bytes: &[u8]) -> Vec<f32> {
    let (elems, block_bytes) = (dtype.block_elems(), dtype.block_bytes());
    let n_blocks = bytes.len() / block_bytes;
    let mut out = vec![0f32; n_blocks * elems];
    out.par_chunks_mut(elems)
        .zip(bytes.par_chunks_exact(block_bytes))
        .with_min_len(1024 * 32 / elems)
        .for_each(|(dst, block)| dequantize_block(dtype, block, dst));
    out
}

/// One block's values; `dst.len()` is the type's block size. Each type's own formula,
/// in the order ggml evaluates it.
fn dequantize_block(dtype: QuantType, block: &[u8], dst: &mut [f32]) {
    if dtype == QuantType::Q6_K {
        return dequantize_q6_k(block, dst);
    }
    if dtype == QuantType::MXFP4 {
        let d = e8m0_half(block[0]);
        for (j, &q) in block[1..17].iter().enumerate() {
            dst[j] = f32::from(MXFP4_VALUES[usize::from(q & 0x0f)]) * d;
            dst[j + 16] = f32::from(MXFP4_VALUES[usize::from(q >> 4)]) * d;
        }
        return;
    }
    let d = f16_at(block, 0);
    for (g, out) in dst.chunks_exact_mut(GROUP).enumerate() {
        let q = stored_group(dtype, block, g);
        fn each(out: &mut [f32], q: &[u8; GROUP], f: impl Fn(u8) -> f32) {
            for (x, &v) in out.iter_mut().zip(q) {
                *x = f(v);
            }
        }
        match dtype {
            QuantType::Q8_0 => each(out, &q, |v| f32::from(v as i8) * d),
            QuantType::Q4_0 => each(out, &q, |v| (f32::from(v) - 8.0) * d),
            QuantType::Q5_0 => each(out, &q, |v| (f32::from(v) - 16.0) * d),
            QuantType::Q4_1 | QuantType::Q5_1 => {
                let m = f16_at(block, 2);
                each(out, &q, |v| f32::from(v) * d + m)
            }
            _ => {
                let (scale, min) = k_scale_min(&block[4..16], g);
                let (dl, ml) = (d * f32::from(scale), f16_at(block, 2) * f32::from(min));
                each(out, &q, |v| dl * f32::from(v) - ml)
            }
        }
    }
}

/// The 6-bit scale and min of group `g` (0..8) of a Q4_K / Q5_K super-block's 12 scale bytes.
fn k_scale_min(scales: &[u8], g: usize) -> (u8, u8) {
    if g < 4 {
        (scales[g] & 63, scales[g + 4] & 63)
    } else {
        (
            (scales[g + 4] & 0x0f) | ((scales[g - 4] >> 6) << 4),
            (scales[g + 4] >> 4) | ((scales[g] >> 6) << 4),
        )
    }
}

/// Group `g`'s stored values as unsigned bytes (Q8_0's are its `i8`s' bits). Not for Q6_K.
fn stored_group(kind: QuantType, block: &[u8], g: usize) -> [u8; GROUP] {
    let mut u = [0u8; GROUP];
    let nibbles = |u: &mut [u8; GROUP], qs: &[u8]| {
        for (i, &q) in qs.iter().enumerate() {
            u[i] = q & 0x0f;
            u[i + 16] = q >> 4;
        }
    };
    let fifth_bits = |u: &mut [u8; GROUP], qh: &[u8]| {
        let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
        for (i, v) in u.iter_mut().enumerate() {
            *v |= (((qh >> i) & 1) as u8) << 4;
        }
    };
    match kind {
        QuantType::Q8_0 => u.copy_from_slice(&block[2..34]),
        QuantType::MXFP4 => {
            nibbles(&mut u, &block[1..17]);
            // Offset by 12: the doubled FP4 values as unsigned bytes 0..=24.
            u.iter_mut()
                .for_each(|v| *v = (MXFP4_VALUES[usize::from(*v)] + 12) as u8);
        }
        QuantType::Q4_0 => nibbles(&mut u, &block[2..18]),
        QuantType::Q4_1 => nibbles(&mut u, &block[4..20]),
        QuantType::Q5_0 => {
            nibbles(&mut u, &block[6..22]);
            fifth_bits(&mut u, &block[2..6]);
        }
        QuantType::Q5_1 => {
            nibbles(&mut u, &block[8..24]);
            fifth_bits(&mut u, &block[4..8]);
        }
        QuantType::Q4_K | QuantType::Q5_K => {
            // 64 weights per 32 bytes: group 2c takes the low nibbles, 2c + 1 the high ones.
            let qs_at = if kind == QuantType::Q4_K { 16 } else { 48 };
            let shift = 4 * (g % 2);
            for (v, &q) in u.iter_mut().zip(&block[qs_at + (g / 2) * 32..][..32]) {
                *v = (q >> shift) & 0x0f;
            }
            if kind == QuantType::Q5_K {
                for (v, &h) in u.iter_mut().zip(&block[16..48]) {
                    *v |= ((h >> g) & 1) << 4;
                }
            }
        }
        QuantType::Q6_K => panic!("Q6_K groups are not 32 stored values"),
    }
    u
}

/// The 32 values of a 32-weight type's block (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4) as unsigned
/// values `u` and f16 `d`, `m` with value = `d·u + m`: exact (Q4_0's `m = −8d`, Q5_0's
/// `−16d` and Q8_0's `u = q + 128`, `m = −128d` are exact in f16 unless they overflow it).
///
/// Panics for the K-quants ([`k_group`], [`q6_k_group`]).
pub fn affine_group(kind: QuantType, block: &[u8]) -> ([u8; GROUP], f16, f16) {
    let mut u = stored_group(kind, block, 0);
    if kind == QuantType::MXFP4 {
        // value = d·(u − 12): exact in f16 for E8M0 104 ..= 140 (d = 2^-24 ..= 2^12, and
        // m = −12d within f16's range), the range of weights; the integer path refuses a
        // block whose offset overflows f16, and smaller scales round.
        let d = f16::from_f32(e8m0_half(block[0]));
        return (u, d, f16::from_f32(-12.0 * d.to_f32()));
    }
    let d = f16::from_le_bytes([block[0], block[1]]);
    let scaled = |k: f32| f16::from_f32(k * d.to_f32());
    match kind {
        QuantType::Q8_0 => {
            u.iter_mut().for_each(|v| *v ^= 0x80);
            (u, d, scaled(-128.0))
        }
        QuantType::Q4_0 => (u, d, scaled(-8.0)),
        QuantType::Q5_0 => (u, d, scaled(-16.0)),
        QuantType::Q4_1 | QuantType::Q5_1 => (u, d, f16::from_le_bytes([block[2], block[3]])),
        _ => panic!("{kind:?} is not a 32-weight type"),
    }
}

/// Group `g` (0..8) of a Q4_K / Q5_K super-block as its stored values `u` and its 6-bit
/// scale and min: value = `d·scale·u − dmin·min` with the super-block's
/// [`super_block_scales`].
pub fn k_group(kind: QuantType, block: &[u8], g: usize) -> ([u8; GROUP], u8, u8) {
    assert!(matches!(kind, QuantType::Q4_K | QuantType::Q5_K));
    let (scale, min) = k_scale_min(&block[4..16], g);
    (stored_group(kind, block, g), scale, min)
}

/// A K-quant super-block's f16 `d` and `dmin` (Q6_K has no `dmin`: zero).
pub fn super_block_scales(kind: QuantType, block: &[u8]) -> (f16, f16) {
    let at = |i: usize| f16::from_le_bytes([block[i], block[i + 1]]);
    match kind {
        QuantType::Q4_K | QuantType::Q5_K => (at(0), at(2)),
        QuantType::Q6_K => (at(208), f16::ZERO),
        _ => panic!("{kind:?} has no super-blocks"),
    }
}

/// Q6_K: `ql[128]`, `qh[64]`, `scales[16]` (i8), f16 `d`; weight = `d·scale·(q − 32)` with
/// a 6-bit `q` from 4 low bits in `ql` and 2 high bits in `qh`, one scale per 16 weights.
fn dequantize_q6_k(block: &[u8], dst: &mut [f32]) {
    let d = f16_at(block, 208);
    for (e, x) in dst.iter_mut().enumerate() {
        let q = i32::from(q6_k_value(block, e)) - 32;
        *x = d * f32::from(block[192 + e / 16] as i8) * q as f32;
    }
}

/// The stored 6-bit value (0..=63) of weight `e` of a Q6_K super-block.
fn q6_k_value(block: &[u8], e: usize) -> u8 {
    let (ql, qh) = (&block[..128], &block[128..192]);
    // Within a half of 128: nibble j of ql[64·half + k % 64] for k = 64j + (k % 64); the
    // high bits of weight k sit at bits 2·(k / 32) of qh[32·half + k % 32].
    let (half, k) = (e / 128, e % 128);
    let low = (ql[64 * half + k % 64] >> (4 * (k / 64))) & 0x0f;
    let high = (qh[32 * half + k % 32] >> (2 * (k / 32))) & 0x03;
    low | (high << 4)
}

/// Group `g` (0..8) of a Q6_K super-block as its stored values `u` (0..=63) and the
/// signed scales of its two 16-weight halves: value = `d·scaleₕ·(u − 32)` with the
/// super-block's `d` ([`super_block_scales`]).
pub fn q6_k_group(block: &[u8], g: usize) -> ([u8; GROUP], [i8; 2]) {
    let u = std::array::from_fn(|c| q6_k_value(block, GROUP * g + c));
    (u, [block[192 + 2 * g] as i8, block[193 + 2 * g] as i8])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k_scales_unpack_as_ggml_packs_them() {
        // The upper four scales and mins keep their two high bits in the top bits of bytes 0..8.
        let (sc, mn) = (
            [1u8, 2, 3, 4, 50, 51, 62, 63],
            [40u8, 41, 42, 43, 17, 33, 48, 63],
        );
        let mut packed = [0u8; 12];
        for g in 0..4 {
            packed[g] = sc[g] | ((sc[g + 4] >> 4) << 6);
            packed[g + 4] = mn[g] | ((mn[g + 4] >> 4) << 6);
            packed[g + 8] = (sc[g + 4] & 0x0f) | ((mn[g + 4] & 0x0f) << 4);
        }
        for g in 0..8 {
            assert_eq!(k_scale_min(&packed, g), (sc[g], mn[g]), "group {g}");
        }
    }

    /// The OCP MX format's FP4 (E2M1) values, code by code, times the block's scale
    /// 2^(e − 127): each of the 16 codes at value positions 0..16 (low nibbles) and 16..32
    /// (high nibbles), under scales 2^-3, 2^0 and 2^5.
    #[test]
    fn mxfp4_blocks_dequantise_by_the_fp4_table() {
        const E2M1: [f32; 16] = [
            0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
        ];
        for e in [124u8, 127, 132] {
            let scale = 2f32.powi(i32::from(e) - 127);
            let mut block = vec![e];
            // Byte j: code j in the low nibble, code 15 − j in the high one.
            block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
            let got = dequantize(QuantType::MXFP4, &block);
            for j in 0..16 {
                assert_eq!(got[j], E2M1[j] * scale, "e {e}, value {j}");
                assert_eq!(got[j + 16], E2M1[15 - j] * scale, "e {e}, value {}", j + 16);
            }
        }
        assert_eq!(e8m0_half(0), 2f32.powi(-128));
        assert_eq!(e8m0_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_half(254), 2f32.powi(126));
        assert_eq!(QuantType::from_id(39), Some(QuantType::MXFP4));
    }

    /// The integer kernels' form of an MXFP4 group (`u − 12` times the halved scale) gives
    /// the dequantised values.
    #[test]
    fn mxfp4_affine_form_matches_its_values() {
        let mut block = vec![125u8];
        block.extend((0..16u8).map(|j| ((j * 7 + 3) % 16) | (((j * 5 + 1) % 16) << 4)));
        let got = dequantize(QuantType::MXFP4, &block);
        let (u, d, m) = affine_group(QuantType::MXFP4, &block);
        for (v, &want) in got.iter().enumerate() {
            assert_eq!(d.to_f32() * f32::from(u[v]) + m.to_f32(), want, "value {v}");
        }
    }
}
