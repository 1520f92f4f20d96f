//! GGUF's block-quantised weights (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K) kept
//! quantised, multiplied with integer dot products.
//!
//! Every format is the same sum in another costume: a weight is `d·u + m` for an unsigned
//! `u` (4 bits for Q4_0, Q4_1 and Q4_K, 8 bits holding Q5's 5 and Q8_0's 8) and per-group
//! f16 `d`, `m` over 32 weights ([`affine_group`]: exact but for Q4_K's and Q5_K's products
//! of two scales, rounded to f16). Activations are quantised on the fly per
//! 32-value block to `q·dₓ` with `q` in −127..=127 (llama.cpp's Q8_1), so one block of
//! one output is
//!
//! `d·dₓ·Σ u·q + m·dₓ·Σ q`
//!
//! with the first sum in exact integer arithmetic (AVX-512 VNNI `vpdpbusd`, AVX2
//! `vpmaddubsw`). Weights are repacked once at load into panels of 16 output rows whose
//! bytes feed those instructions directly (see [`QuantMatrix`]), so decode streams 0.625
//! bytes per Q4 weight instead of the 2 of an f16 copy, and prefill runs a register-tiled
//! integer GEMM.

use std::cell::RefCell;

use anyhow::ensure;
use half::f16;
use rayon::prelude::*;

use super::quant_simd;
use super::simd::SendPtr;
use crate::weights::ggml_quants::{affine_group, GROUP};
use crate::weights::QuantType;

/// Values per quantisation block (weights and activations).
pub const BLOCK: usize = 32;
/// Output rows per packed panel (one 512-bit vector of i32 / f32 lanes).
pub const PANEL: usize = 16;
/// Activation rows of one micro-tile.
pub const TILE_ROWS: usize = 8;
/// Activation rows whose quantised copy is walked per pass over a task's panels
/// (keeps that copy in L2 while the panels stream past it).
const ROW_CHUNK: usize = 128;

/// Width of the unsigned weight values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bits {
    /// 4-bit values, two per byte (Q4_0, Q4_1, Q4_K).
    U4,
    /// 8-bit values (Q8_0; Q5_0, Q5_1 and Q5_K's 5 bits).
    U8,
}

impl Bits {
    /// Bytes of one block of one panel's weights (16 rows × 32 values).
    pub const fn weight_bytes(self) -> usize {
        match self {
            Bits::U4 => PANEL * BLOCK / 2,
            Bits::U8 => PANEL * BLOCK,
        }
    }

    /// Bytes of one block of one panel: weights, then 16 f16 `d`, then 16 f16 `m`.
    pub const fn block_stride(self) -> usize {
        self.weight_bytes() + 4 * PANEL
    }
}

/// A `[rows, cols]` quantised weight matrix in panels of 16 rows.
///
/// Panel `p` holds rows `16p..16p + 16` (rows past the end are zero), block after block.
/// In a block, the value `u` of row `r` at column `c` (both within the panel and block) sits
/// where one `vpdpbusd` step wants it: steps of 4 columns, each step 64 bytes with row `r`'s
/// 4 values at bytes `4r..4r + 4`. U8 stores steps 0..8 in order. U4 stores step pairs
/// `(2t, 2t + 1)` in 64 bytes, step `2t` in the low nibbles and `2t + 1` in the high ones.
#[derive(Debug, Clone)]
pub struct QuantMatrix {
    pub rows: usize,
    pub cols: usize,
    pub bits: Bits,
    data: Vec<u8>,
}

/// Offset of row `r`'s value at column `c` in a block's weight bytes, and whether it is
/// the high nibble (U4).
fn value_offset(bits: Bits, r: usize, c: usize) -> (usize, bool) {
    let (step, lane) = (c / 4, c % 4);
    match bits {
        Bits::U8 => (step * 64 + 4 * r + lane, false),
        Bits::U4 => ((step / 2) * 64 + 4 * r + lane, step % 2 == 1),
    }
}

/// Row `r`'s value at column `c` of a packed block.
fn value_at(bits: Bits, block: &[u8], r: usize, c: usize) -> u8 {
    match value_offset(bits, r, c) {
        (off, _) if bits == Bits::U8 => block[off],
        (off, false) => block[off] & 0x0f,
        (off, true) => block[off] >> 4,
    }
}

impl QuantMatrix {
    /// Whether `kind` has the integer kernels' form (Q6_K does not: its scales change
    /// every 16 weights).
    pub fn supports(kind: QuantType) -> bool {
        kind.affine_max().is_some()
    }

    /// Repacks GGUF blocks (`rows` rows of `cols / block size` blocks each); `name` is for
    /// errors.
    pub fn from_gguf(
        name: &str,
        kind: QuantType,
        rows: usize,
        cols: usize,
        blocks: &[u8],
    ) -> anyhow::Result<QuantMatrix> {
        let elems = kind.block_elems();
        ensure!(
            cols.is_multiple_of(elems),
            "weight `{name}`: {cols} columns are not whole {kind:?} blocks of {elems}"
        );
        let nb = cols / BLOCK;
        let (gguf_blocks, groups) = (cols / elems, elems / GROUP);
        ensure!(
            blocks.len() == rows * gguf_blocks * kind.block_bytes(),
            "weight `{name}`: {} bytes of {kind:?} for {rows}x{cols}",
            blocks.len()
        );
        let bits = match kind.affine_max() {
            Some(max) if max <= 15 => Bits::U4,
            Some(_) => Bits::U8,
            None => anyhow::bail!(
                "weight `{name}`: {kind:?} has no integer kernels (its scales change every 16 weights)"
            ),
        };
        let stride = bits.block_stride();
        let panels = rows.div_ceil(PANEL);
        let mut data = vec![0u8; panels * nb * stride];
        let wb = bits.weight_bytes();
        data.par_chunks_mut(nb * stride)
            .enumerate()
            .for_each(|(p, panel)| {
                for r in 0..PANEL.min(rows - p * PANEL) {
                    let row = p * PANEL + r;
                    for b in 0..nb {
                        let block = row * gguf_blocks + b / groups;
                        let src = &blocks[block * kind.block_bytes()..][..kind.block_bytes()];
                        let dst = &mut panel[b * stride..(b + 1) * stride];
                        let (u, d, m) = affine_group(kind, src, b % groups);
                        for (c, &v) in u.iter().enumerate() {
                            let (off, high) = value_offset(bits, r, c);
                            dst[off] |= if high { v << 4 } else { v };
                        }
                        dst[wb + 2 * r..wb + 2 * r + 2].copy_from_slice(&d.to_le_bytes());
                        dst[wb + 2 * PANEL + 2 * r..][..2].copy_from_slice(&m.to_le_bytes());
                    }
                }
            });
        // `m` of Q4_0 / Q5_0 / Q8_0 is −8d / −16d / −128d, and a K-quant group's `d` and `m`
        // are products of two scales: finite unless a scale is near f16's maximum.
        let overflow = data.chunks_exact(stride).position(|blk| {
            blk[wb..]
                .chunks_exact(2)
                .any(|h| !f16::from_le_bytes([h[0], h[1]]).is_finite())
        });
        if let Some(at) = overflow {
            anyhow::bail!(
                "weight `{name}`: a {kind:?} scale near row {} is too large to re-express in f16",
                at / nb * PANEL
            );
        }
        Ok(QuantMatrix {
            rows,
            cols,
            bits,
            data,
        })
    }

    /// Blocks per row.
    pub fn blocks(&self) -> usize {
        self.cols / BLOCK
    }

    /// Panel `p`'s bytes.
    fn panel(&self, p: usize) -> &[u8] {
        let len = self.blocks() * self.bits.block_stride();
        &self.data[p * len..(p + 1) * len]
    }

    /// Row `r` dequantised into `dst` (`dst.len() == cols`): an embedding lookup.
    pub fn row_to_f32(&self, r: usize, dst: &mut [f32]) {
        let panel = self.panel(r / PANEL);
        let (rr, stride, wb) = (
            r % PANEL,
            self.bits.block_stride(),
            self.bits.weight_bytes(),
        );
        for (b, out) in dst.chunks_exact_mut(BLOCK).enumerate() {
            let blk = &panel[b * stride..(b + 1) * stride];
            let d = f16::from_le_bytes([blk[wb + 2 * rr], blk[wb + 2 * rr + 1]]).to_f32();
            let m = &blk[wb + 2 * PANEL + 2 * rr..];
            let m = f16::from_le_bytes([m[0], m[1]]).to_f32();
            for (c, o) in out.iter_mut().enumerate() {
                *o = d * f32::from(value_at(self.bits, blk, rr, c)) + m;
            }
        }
    }
}

/// Activation rows quantised per block: `x ≈ q·d`, with `s = d·Σq` per block.
#[derive(Debug, Default)]
pub struct QuantRows {
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    pub s: Vec<f32>,
    /// `Σq` per block (the AVX2 Q8_0 kernel's offset correction).
    pub qsum: Vec<i32>,
}

impl QuantRows {
    /// Quantises `x[m, k]` (k a multiple of 32), reusing the buffers.
    pub fn quantize(&mut self, x: &[f32], m: usize, k: usize) {
        let nb = k / BLOCK;
        self.q.resize(m * k, 0);
        self.d.resize(m * nb, 0.0);
        self.s.resize(m * nb, 0.0);
        self.qsum.resize(m * nb, 0);
        let rows = self
            .q
            .par_chunks_mut(k)
            .zip(self.d.par_chunks_mut(nb))
            .zip(self.s.par_chunks_mut(nb))
            .zip(self.qsum.par_chunks_mut(nb))
            .zip(x.par_chunks(k));
        rows.with_min_len(16)
            .for_each(|((((q, d), s), qsum), x)| quant_simd::quantize_row(x, q, d, s, qsum));
    }
}

/// Quantises one row: per block `d = max|x| / 127`, `q = round(x / d)`.
pub fn quantize_row_scalar(
    x: &[f32],
    q: &mut [i8],
    d: &mut [f32],
    s: &mut [f32],
    qsum: &mut [i32],
) {
    for (b, (xb, qb)) in x
        .chunks_exact(BLOCK)
        .zip(q.chunks_exact_mut(BLOCK))
        .enumerate()
    {
        let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let scale = amax / 127.0;
        let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (qv, &xv) in qb.iter_mut().zip(xb) {
            let v = (xv * inv).round_ties_even() as i32;
            *qv = v as i8;
            sum += v;
        }
        d[b] = scale;
        s[b] = scale * sum as f32;
        qsum[b] = sum;
    }
}

thread_local! {
    /// The caller thread's quantised activations (reused across matmuls).
    static ROWS: RefCell<QuantRows> = RefCell::new(QuantRows::default());
}

/// `out[m, N] = x[m, K] · wᵀ` on the current rayon pool.
pub fn matmul(x: &[f32], m: usize, w: &QuantMatrix, out: &mut [f32], threads: usize) {
    assert_eq!(x.len(), m * w.cols, "quantised matmul: activation shape");
    assert_eq!(out.len(), m * w.rows, "quantised matmul: output shape");
    if m == 0 || w.rows == 0 {
        return;
    }
    ROWS.with(|rows| {
        let mut rows = rows.borrow_mut();
        rows.quantize(x, m, w.cols);
        matmul_quantized(&rows, m, w, out, threads, quant_simd::Isa::detect());
    });
}

/// The integer GEMM on already quantised rows, with the kernel set `isa`.
pub fn matmul_quantized(
    x: &QuantRows,
    m: usize,
    w: &QuantMatrix,
    out: &mut [f32],
    threads: usize,
    isa: quant_simd::Isa,
) {
    let panels = w.rows.div_ceil(PANEL);
    let per_task = panels.div_ceil(threads.max(1) * 4).max(1);
    let out_ptr = SendPtr(out.as_mut_ptr());
    (0..panels.div_ceil(per_task))
        .into_par_iter()
        .for_each(|task| {
            let (p0, p1) = (task * per_task, ((task + 1) * per_task).min(panels));
            for r0 in (0..m).step_by(ROW_CHUNK) {
                let r1 = (r0 + ROW_CHUNK).min(m);
                for p in p0..p1 {
                    let cols = PANEL.min(w.rows - p * PANEL);
                    for t0 in (r0..r1).step_by(TILE_ROWS) {
                        let tile = quant_simd::Tile {
                            panel: w.panel(p),
                            bits: w.bits,
                            blocks: w.blocks(),
                            x,
                            k: w.cols,
                            row0: t0,
                            rows: TILE_ROWS.min(r1 - t0),
                            // SAFETY: columns 16p..16p + cols of rows t0.. of `out`, written by
                            // this task only (panels are disjoint across tasks).
                            out: unsafe { out_ptr.get().add(t0 * w.rows + p * PANEL) },
                            ldo: w.rows,
                            cols,
                        };
                        // SAFETY: the tile's pointers and sizes were derived from checked shapes.
                        unsafe { tile.run(isa) };
                    }
                }
            }
        });
}

/// The reference kernel: the same sum in plain integer and float arithmetic.
///
/// # Safety
/// `tile.out` is writable for `tile.rows` rows of `tile.cols` values at stride `tile.ldo`.
pub unsafe fn tile_scalar(tile: &quant_simd::Tile<'_>) {
    let (stride, wb) = (tile.bits.block_stride(), tile.bits.weight_bytes());
    let nb = tile.blocks;
    for i in 0..tile.rows {
        let row = tile.row0 + i;
        for r in 0..tile.cols {
            let mut acc = 0.0f32;
            for b in 0..nb {
                let blk = &tile.panel[b * stride..(b + 1) * stride];
                let mut dot = 0i32;
                for c in 0..BLOCK {
                    let u = value_at(tile.bits, blk, r, c);
                    dot += i32::from(u) * i32::from(tile.x.q[row * tile.k + b * BLOCK + c]);
                }
                let d = f16::from_le_bytes([blk[wb + 2 * r], blk[wb + 2 * r + 1]]).to_f32();
                let mo = wb + 2 * PANEL + 2 * r;
                let m = f16::from_le_bytes([blk[mo], blk[mo + 1]]).to_f32();
                let (dx, sx) = (tile.x.d[row * nb + b], tile.x.s[row * nb + b]);
                acc += dot as f32 * (d * dx) + m * sx;
            }
            *tile.out.add(i * tile.ldo + r) = acc;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::ggml_quants::dequantize;

    fn lcg(seed: &mut u64) -> u32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (*seed >> 33) as u32
    }

    /// The types with integer kernels.
    const KINDS: [QuantType; 7] = [
        QuantType::Q8_0,
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q5_1,
        QuantType::Q4_K,
        QuantType::Q5_K,
    ];

    /// Random GGUF blocks of `kind` (`n_blocks` of 32 weights' worth): random bytes, with
    /// small positive f16 scales (and offsets of either sign) where the type has them.
    fn random_blocks(kind: QuantType, n_blocks: usize, seed: &mut u64) -> Vec<u8> {
        let n = n_blocks * BLOCK / kind.block_elems();
        let mut out: Vec<u8> = (0..n * kind.block_bytes())
            .map(|_| lcg(seed) as u8)
            .collect();
        // K-quant weights are d times a 6-bit scale times u: d a 32nd of the others'.
        let k_quant = kind.block_elems() > BLOCK;
        let d_unit = if k_quant { 1.0 / 32.0 } else { 1.0 };
        for block in out.chunks_exact_mut(kind.block_bytes()) {
            let d = f16::from_f32((0.001 + (lcg(seed) % 1000) as f32 * 1e-5) * d_unit);
            block[..2].copy_from_slice(&d.to_le_bytes());
            let m = match kind {
                QuantType::Q4_1 | QuantType::Q5_1 => -0.05 + (lcg(seed) % 1000) as f32 * 1e-4,
                // dmin of the K-quants: small and positive (the min is subtracted).
                QuantType::Q4_K | QuantType::Q5_K => (lcg(seed) % 1000) as f32 * 1e-6 * d_unit,
                _ => continue,
            };
            block[2..4].copy_from_slice(&f16::from_f32(m).to_le_bytes());
        }
        out
    }

    fn random_x(m: usize, k: usize, seed: &mut u64) -> Vec<f32> {
        (0..m * k)
            .map(|_| (lcg(seed) % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    }

    #[test]
    fn packing_keeps_every_value() {
        let mut seed = 3;
        for kind in KINDS {
            let (rows, cols) = (37, 512);
            let blocks = random_blocks(kind, rows * cols / BLOCK, &mut seed);
            let want = dequantize(kind, &blocks);
            let w = QuantMatrix::from_gguf("w", kind, rows, cols, &blocks).unwrap();
            let mut row = vec![0.0; cols];
            let per_row = cols / kind.block_elems();
            for r in 0..rows {
                w.row_to_f32(r, &mut row);
                for (c, (&a, &b)) in row.iter().zip(&want[r * cols..]).enumerate() {
                    let block =
                        &blocks[(r * per_row + c / kind.block_elems()) * kind.block_bytes()..];
                    let (_, _, m) = affine_group(kind, block, c % kind.block_elems() / BLOCK);
                    // K-quants: a group's scale and offset are rounded to f16 (2⁻¹¹ each);
                    // the others are exact up to f32 rounding.
                    let tol = if kind.block_elems() == BLOCK {
                        1e-6 * b.abs().max(1e-3)
                    } else {
                        2f32.powi(-11) * (b.abs() + 2.0 * m.to_f32().abs()) * 1.01 + 1e-7
                    };
                    assert!((a - b).abs() <= tol, "{kind:?} [{r},{c}]: {a} vs {b}");
                }
            }
        }
        let err = QuantMatrix::from_gguf("w", QuantType::Q6_K, 1, 256, &[0; 210]).unwrap_err();
        assert!(err.to_string().contains("no integer kernels"), "{err}");
    }

    #[test]
    fn shapes_that_are_not_whole_blocks_are_refused() {
        let err = QuantMatrix::from_gguf("blk.w", QuantType::Q4_1, 2, 40, &[0; 60]).unwrap_err();
        assert!(err.to_string().contains("`blk.w`"), "{err}");
        let err = QuantMatrix::from_gguf("blk.w", QuantType::Q4_K, 2, 288, &[0; 288]).unwrap_err();
        assert!(err.to_string().contains("`blk.w`"), "{err}");
        let err = QuantMatrix::from_gguf("blk.w", QuantType::Q4_1, 2, 32, &[0; 39]).unwrap_err();
        assert!(err.to_string().contains("39 bytes"), "{err}");
    }

    #[test]
    fn simd_activation_quantisation_gives_the_scalar_bytes() {
        let mut seed = 9;
        let mut x = random_x(1, 256, &mut seed);
        x[40] = 0.0;
        x[64..96].fill(0.0);
        x[100] = 2.5;
        let nb = 256 / BLOCK;
        let (mut q1, mut d1, mut s1, mut n1) =
            (vec![0i8; 256], vec![0.0; nb], vec![0.0; nb], vec![0; nb]);
        let (mut q2, mut d2, mut s2, mut n2) = (q1.clone(), d1.clone(), s1.clone(), n1.clone());
        quantize_row_scalar(&x, &mut q1, &mut d1, &mut s1, &mut n1);
        quant_simd::quantize_row(&x, &mut q2, &mut d2, &mut s2, &mut n2);
        assert_eq!((q1, d1, s1, n1), (q2, d2, s2, n2));
    }

    #[test]
    fn activation_quantisation_is_within_half_a_step() {
        let mut seed = 5;
        let x = random_x(3, 64, &mut seed);
        let mut rows = QuantRows::default();
        rows.quantize(&x, 3, 64);
        for (i, &v) in x.iter().enumerate() {
            let (q, d) = (rows.q[i] as f32, rows.d[i / BLOCK]);
            assert!(
                (q * d - v).abs() <= 0.5 * d * 1.0001,
                "{i}: {v} vs {}",
                q * d
            );
        }
        for b in 0..6 {
            let sum: i32 = rows.q[b * BLOCK..(b + 1) * BLOCK]
                .iter()
                .map(|&q| q as i32)
                .sum();
            assert_eq!(rows.qsum[b], sum);
            assert!((rows.s[b] - rows.d[b] * sum as f32).abs() < 1e-6);
        }
        let mut zero = QuantRows::default();
        zero.quantize(&[0.0; 32], 1, 32);
        assert_eq!(
            (zero.q.iter().map(|&q| q as i32).sum::<i32>(), zero.d[0]),
            (0, 0.0)
        );
    }

    /// Every kernel set this CPU has, against the scalar reference on the same quantised
    /// rows: the integer sums are exact, so only float summation order differs.
    #[test]
    fn kernels_match_the_scalar_reference() {
        let mut seed = 11;
        for kind in KINDS {
            for &(m, n, k) in &[
                (1, 16, 256),
                (3, 21, 512),
                (8, 48, 256),
                (13, 35, 768),
                (40, 70, 256),
            ] {
                let blocks = random_blocks(kind, n * k / BLOCK, &mut seed);
                let w = QuantMatrix::from_gguf("w", kind, n, k, &blocks).unwrap();
                let x = random_x(m, k, &mut seed);
                let mut rows = QuantRows::default();
                rows.quantize(&x, m, k);
                let mut want = vec![f32::NAN; m * n];
                matmul_quantized(&rows, m, &w, &mut want, 2, quant_simd::Isa::Scalar);
                for isa in quant_simd::Isa::available() {
                    let mut got = vec![f32::NAN; m * n];
                    matmul_quantized(&rows, m, &w, &mut got, 2, isa);
                    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                            "{kind:?} {isa:?} m={m} n={n} k={k} [{i}]: {a} vs {b}"
                        );
                    }
                }
            }
        }
    }

    /// Against f64 math on the packed weights' values (the dequantised ones but for the
    /// K-quants' f16 group scales, checked above) and the unquantised activations. The
    /// only difference is the activations' rounding to `q·d`: at most `d/2` per value,
    /// so a block's error is at most `d/2 · Σ|w|` (the bound checked, plus f32 slack).
    #[test]
    fn quantised_product_is_within_the_activation_rounding_bound() {
        let mut seed = 17;
        for kind in KINDS {
            let (m, n, k) = (5, 33, 512);
            let blocks = random_blocks(kind, n * k / BLOCK, &mut seed);
            let w = QuantMatrix::from_gguf("w", kind, n, k, &blocks).unwrap();
            let mut wf = vec![0.0; n * k];
            for (r, row) in wf.chunks_exact_mut(k).enumerate() {
                w.row_to_f32(r, row);
            }
            let x = random_x(m, k, &mut seed);
            let mut out = vec![0.0; m * n];
            matmul(&x, m, &w, &mut out, 2);
            let mut rows = QuantRows::default();
            rows.quantize(&x, m, k);
            for i in 0..m {
                for j in 0..n {
                    let (mut exact, mut bound) = (0.0f64, 0.0f64);
                    for t in 0..k {
                        exact += x[i * k + t] as f64 * wf[j * k + t] as f64;
                        bound += 0.5
                            * rows.d[i * (k / BLOCK) + t / BLOCK] as f64
                            * (wf[j * k + t] as f64).abs();
                    }
                    let got = out[i * n + j] as f64;
                    assert!(
                        (got - exact).abs() <= bound * 1.001 + 1e-5,
                        "{kind:?} [{i},{j}]: {got} vs {exact} (bound {bound})"
                    );
                }
            }
        }
    }
}
