//! GGUF's block-quantised weights (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) kept
//! quantised, multiplied with integer dot products.
//!
//! Every format is the same sum in another costume: a weight is `d·u + m` for an unsigned
//! `u` (4 bits for Q4_0, Q4_1 and Q4_K; 8 bits holding Q5's 5, Q6_K's 6 and Q8_0's 8) and
//! per-group f16 `d`, `m` over 32 weights ([`affine_group`]: exact but for the K-quants'
//! products of two scales, rounded to f16); Q6_K's scale changes every 16 weights, so its
//! groups carry its f16 `d` and a signed scale per half, multiplied in f32 (exact), with
//! `m = −32·d·scale` taken off in integer arithmetic ([`q6_k_group`]). Activations are
//! quantised on the fly to `q·dₓ` with `q` in −127..=127, as llama.cpp does for each type
//! ([`ActScales`]), so one group of one output is
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

use super::quant_simd::{self, Isa};
use super::simd::SendPtr;
use crate::weights::ggml_quants::{affine_group, q6_k_group, GROUP};
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
/// Values per activation scale for the K-quants (llama.cpp's Q8_K).
const SUPER_BLOCK: usize = 256;

/// How the stored values of a block are laid out and scaled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bits {
    /// 4-bit values, two per byte (Q4_0, Q4_1, Q4_K).
    U4,
    /// 8-bit values (Q8_0; Q5_0, Q5_1 and Q5_K's 5 bits).
    U8,
    /// Q6_K's 6-bit values in bytes, a signed scale per 16 values and `m = −32·d·scale`.
    U6,
}

impl Bits {
    /// The layout of a type's values.
    pub fn of(kind: QuantType) -> Bits {
        match kind {
            QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q4_K => Bits::U4,
            QuantType::Q5_0 | QuantType::Q5_1 | QuantType::Q5_K | QuantType::Q8_0 => Bits::U8,
            QuantType::Q6_K => Bits::U6,
        }
    }

    /// Bytes of one block of one panel's weights (16 rows × 32 values).
    pub const fn weight_bytes(self) -> usize {
        match self {
            Bits::U4 => PANEL * BLOCK / 2,
            Bits::U8 | Bits::U6 => PANEL * BLOCK,
        }
    }

    /// Bytes of one block of one panel: weights, then 16 f16 `d`, then 16 f16 `m` (U6: 16
    /// f16 `d`, then the 16 rows' i8 scales of the first 16 values, then of the last 16).
    pub const fn block_stride(self) -> usize {
        self.weight_bytes() + 4 * PANEL
    }
}

/// How activations are quantised for a weight type: as llama.cpp quantises them (its
/// activation types' names), so that both engines round the same products the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum ActScales {
    /// One scale per 32 values, rounded to f16; `s = d·Σq` with that rounded `d`, so a
    /// weight offset `m = −k·d` (Q8_0, Q4_0, Q5_0) cancels as llama.cpp's signed products
    /// do (up to the f32 rounding of the two terms).
    Q8_0,
    /// One scale per 32 values and `s = d·Σq`, each rounded to f16 (Q4_1, Q5_1, whose
    /// offsets llama.cpp multiplies by that stored `s`).
    Q8_1,
    /// One f32 scale per 256 values: the K-quants.
    Q8_K,
}

impl ActScales {
    /// llama.cpp's activation type for weights of `kind`.
    pub fn of(kind: QuantType) -> ActScales {
        match kind {
            QuantType::Q8_0 | QuantType::Q4_0 | QuantType::Q5_0 => ActScales::Q8_0,
            QuantType::Q4_1 | QuantType::Q5_1 => ActScales::Q8_1,
            QuantType::Q4_K | QuantType::Q5_K | QuantType::Q6_K => ActScales::Q8_K,
        }
    }

    /// Values that share one scale.
    fn span(self) -> usize {
        match self {
            ActScales::Q8_0 | ActScales::Q8_1 => BLOCK,
            ActScales::Q8_K => SUPER_BLOCK,
        }
    }
}

/// A `[rows, cols]` quantised weight matrix: one or more row ranges ([`Part`]s), each of
/// one GGUF type (a fused weight whose parts a file stores in different types keeps each
/// part's type).
#[derive(Debug, Clone)]
pub struct QuantMatrix {
    pub rows: usize,
    pub cols: usize,
    parts: Vec<Part>,
}

/// Rows `row0..row0 + rows` of a [`QuantMatrix`], in panels of 16 rows.
///
/// Panel `p` holds rows `16p..16p + 16` of the part (rows past its end are zero), block
/// after block. In a block, the value `u` of row `r` at column `c` (both within the panel
/// and block) sits where one `vpdpbusd` step wants it: steps of 4 columns, each step 64
/// bytes with row `r`'s 4 values at bytes `4r..4r + 4`. U8 and U6 store steps 0..8 in
/// order. U4 stores step pairs `(2t, 2t + 1)` in 64 bytes, step `2t` in the low nibbles and
/// `2t + 1` in the high ones.
#[derive(Debug, Clone)]
struct Part {
    row0: usize,
    rows: usize,
    bits: Bits,
    act: ActScales,
    data: Vec<u8>,
}

/// Offset of row `r`'s value at column `c` in a block's weight bytes, and whether it is
/// the high nibble (U4).
fn value_offset(bits: Bits, r: usize, c: usize) -> (usize, bool) {
    let (step, lane) = (c / 4, c % 4);
    match bits {
        Bits::U8 | Bits::U6 => (step * 64 + 4 * r + lane, false),
        Bits::U4 => ((step / 2) * 64 + 4 * r + lane, step % 2 == 1),
    }
}

/// Row `r`'s value at column `c` of a packed block.
fn value_at(bits: Bits, block: &[u8], r: usize, c: usize) -> u8 {
    match value_offset(bits, r, c) {
        (off, _) if bits != Bits::U4 => block[off],
        (off, false) => block[off] & 0x0f,
        (off, true) => block[off] >> 4,
    }
}

/// The f16 at byte `at` of a block.
fn f16_at(block: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([block[at], block[at + 1]]).to_f32()
}

/// Row `r`'s signed scale of half `h` of a U6 block.
fn u6_scale(block: &[u8], r: usize, h: usize) -> f32 {
    f32::from(block[Bits::U6.weight_bytes() + 2 * PANEL + PANEL * h + r] as i8)
}

impl QuantMatrix {
    /// Repacks GGUF blocks (`rows` rows of `cols / block size` blocks each); `name` is for
    /// errors.
    pub fn from_gguf(
        name: &str,
        kind: QuantType,
        rows: usize,
        cols: usize,
        blocks: &[u8],
    ) -> anyhow::Result<QuantMatrix> {
        Self::from_parts(name, cols, &[(kind, rows, blocks)])
    }

    /// Stacks parts `(type, rows, blocks)` in order, each repacked as [`Self::from_gguf`]
    /// would.
    pub fn from_parts(
        name: &str,
        cols: usize,
        parts: &[(QuantType, usize, &[u8])],
    ) -> anyhow::Result<QuantMatrix> {
        let mut row0 = 0;
        let mut packed = Vec::with_capacity(parts.len());
        for &(kind, rows, blocks) in parts {
            packed.push(Part::pack(name, kind, row0, rows, cols, blocks)?);
            row0 += rows;
        }
        Ok(QuantMatrix {
            rows: row0,
            cols,
            parts: packed,
        })
    }

    /// Blocks per row.
    pub fn blocks(&self) -> usize {
        self.cols / BLOCK
    }

    /// Row `r` dequantised into `dst` (`dst.len() == cols`): an embedding lookup.
    pub fn row_to_f32(&self, r: usize, dst: &mut [f32]) {
        let part = self
            .parts
            .iter()
            .find(|p| r < p.row0 + p.rows)
            .expect("row within the matrix");
        let r = r - part.row0;
        let panel = part.panel(r / PANEL, self.blocks());
        let (rr, bits) = (r % PANEL, part.bits);
        let (stride, wb) = (bits.block_stride(), bits.weight_bytes());
        for (b, out) in dst.chunks_exact_mut(BLOCK).enumerate() {
            let blk = &panel[b * stride..(b + 1) * stride];
            let d = f16_at(blk, wb + 2 * rr);
            for (c, o) in out.iter_mut().enumerate() {
                let u = f32::from(value_at(bits, blk, rr, c));
                *o = match bits {
                    Bits::U6 => d * u6_scale(blk, rr, c / (BLOCK / 2)) * (u - 32.0),
                    _ => d * u + f16_at(blk, wb + 2 * PANEL + 2 * rr),
                };
            }
        }
    }
}

impl Part {
    /// Repacks rows `row0..row0 + rows` from GGUF blocks of `kind`.
    fn pack(
        name: &str,
        kind: QuantType,
        row0: usize,
        rows: usize,
        cols: usize,
        blocks: &[u8],
    ) -> anyhow::Result<Part> {
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
        let bits = Bits::of(kind);
        let stride = bits.block_stride();
        let mut data = vec![0u8; rows.div_ceil(PANEL) * nb * stride];
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
                        let u = if bits == Bits::U6 {
                            let (u, d, scales) = q6_k_group(src, b % groups);
                            dst[wb + 2 * r..][..2].copy_from_slice(&d.to_le_bytes());
                            for (h, sc) in scales.into_iter().enumerate() {
                                dst[wb + 2 * PANEL + PANEL * h + r] = sc as u8;
                            }
                            u
                        } else {
                            let (u, d, m) = affine_group(kind, src, b % groups);
                            dst[wb + 2 * r..][..2].copy_from_slice(&d.to_le_bytes());
                            dst[wb + 2 * PANEL + 2 * r..][..2].copy_from_slice(&m.to_le_bytes());
                            u
                        };
                        for (c, &v) in u.iter().enumerate() {
                            let (off, high) = value_offset(bits, r, c);
                            dst[off] |= if high { v << 4 } else { v };
                        }
                    }
                }
            });
        // `m` of Q4_0 / Q5_0 / Q8_0 is −8d / −16d / −128d, and a K-quant group's `d` and `m`
        // are products of two scales: finite unless a scale is near f16's maximum. (U6 keeps
        // the file's `d`, then i8 scales.)
        let f16_bytes = if bits == Bits::U6 {
            2 * PANEL
        } else {
            4 * PANEL
        };
        let overflow = data.chunks_exact(stride).position(|blk| {
            blk[wb..wb + f16_bytes]
                .chunks_exact(2)
                .any(|h| !f16::from_le_bytes([h[0], h[1]]).is_finite())
        });
        if let Some(at) = overflow {
            let row = row0 + at / nb * PANEL;
            if bits == Bits::U6 {
                anyhow::bail!("weight `{name}`: a {kind:?} scale near row {row} is not finite");
            }
            anyhow::bail!(
                "weight `{name}`: a {kind:?} scale near row {row} is too large to re-express in f16"
            );
        }
        Ok(Part {
            row0,
            rows,
            bits,
            act: ActScales::of(kind),
            data,
        })
    }

    /// Panel `p`'s bytes (`nb` blocks per row).
    fn panel(&self, p: usize, nb: usize) -> &[u8] {
        let len = nb * self.bits.block_stride();
        &self.data[p * len..(p + 1) * len]
    }
}

/// One quantised activation block's scale and sums.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BlockScale {
    /// `dₓ`.
    pub d: f32,
    /// `dₓ·Σq` (the offsets' term).
    pub s: f32,
    /// `Σq` (the offset corrections of the AVX2 U8 kernel and of Q6_K).
    pub qsum: i32,
    /// `Σq` of the block's first 16 values (Q6_K's halves).
    pub qsum_low: i32,
}

/// Activation rows quantised per block: `x ≈ q·d`.
#[derive(Debug, Default)]
pub struct QuantRows {
    pub q: Vec<i8>,
    /// One per 32 values.
    pub scales: Vec<BlockScale>,
}

impl QuantRows {
    /// Quantises `x[m, k]` (k a multiple of `act`'s span), reusing the buffers.
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

/// Quantises one row: per span of `act`, `d = max|x| / 127` and `q = round(x / d)` (ties
/// to even, as llama.cpp's AVX2 Q8_0 / Q8_1 and scalar Q8_K).
pub fn quantize_row(x: &[f32], q: &mut [i8], scales: &mut [BlockScale], act: ActScales, isa: Isa) {
    let span = act.span();
    for ((xs, qs), ss) in x
        .chunks_exact(span)
        .zip(q.chunks_exact_mut(span))
        .zip(scales.chunks_exact_mut(span / BLOCK))
    {
        let amax = quant_simd::amax(xs, isa);
        let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        for ((xb, qb), sc) in xs
            .chunks_exact(BLOCK)
            .zip(qs.chunks_exact_mut(BLOCK))
            .zip(ss.iter_mut())
        {
            let (qsum, qsum_low) = quant_simd::quantize_block(xb, qb, inv, isa);
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
                ActScales::Q8_K => {
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
}

/// Largest `|x|`.
pub fn amax_scalar(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |a, v| a.max(v.abs()))
}

/// `q = round(x·inv)` (ties to even) for one block; returns `Σq` and `Σq` of the first 16.
pub fn quantize_block_scalar(x: &[f32], q: &mut [i8], inv: f32) -> (i32, i32) {
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
    let isa = Isa::detect();
    ROWS.with(|rows| {
        let mut rows = rows.borrow_mut();
        let mut quantized = None;
        for part in &w.parts {
            if quantized != Some(part.act) {
                rows.quantize(x, m, w.cols, part.act, isa);
                quantized = Some(part.act);
            }
            matmul_part(&rows, m, w, part, out, threads, isa);
        }
    });
}

/// The integer GEMM on rows already quantised as every part of `w` wants them, with the
/// kernel set `isa`.
#[cfg(test)]
pub fn matmul_quantized(
    x: &QuantRows,
    m: usize,
    w: &QuantMatrix,
    out: &mut [f32],
    threads: usize,
    isa: Isa,
) {
    for part in &w.parts {
        matmul_part(x, m, w, part, out, threads, isa);
    }
}

/// Output columns `part.row0..part.row0 + part.rows`.
fn matmul_part(
    x: &QuantRows,
    m: usize,
    w: &QuantMatrix,
    part: &Part,
    out: &mut [f32],
    threads: usize,
    isa: Isa,
) {
    let panels = part.rows.div_ceil(PANEL);
    let per_task = panels.div_ceil(threads.max(1) * 4).max(1);
    let out_ptr = SendPtr(out.as_mut_ptr());
    let nb = w.blocks();
    (0..panels.div_ceil(per_task))
        .into_par_iter()
        .for_each(|task| {
            let (p0, p1) = (task * per_task, ((task + 1) * per_task).min(panels));
            for r0 in (0..m).step_by(ROW_CHUNK) {
                let r1 = (r0 + ROW_CHUNK).min(m);
                for p in p0..p1 {
                    let cols = PANEL.min(part.rows - p * PANEL);
                    let col0 = part.row0 + p * PANEL;
                    for t0 in (r0..r1).step_by(TILE_ROWS) {
                        let tile = quant_simd::Tile {
                            panel: part.panel(p, nb),
                            bits: part.bits,
                            blocks: nb,
                            x,
                            k: w.cols,
                            row0: t0,
                            rows: TILE_ROWS.min(r1 - t0),
                            // SAFETY: columns col0..col0 + cols of rows t0.. of `out`, written
                            // by this task only (panels are disjoint across tasks and parts).
                            out: unsafe { out_ptr.get().add(t0 * w.rows + col0) },
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
                let mut dots = [0i32; 2];
                for c in 0..BLOCK {
                    let u = value_at(tile.bits, blk, r, c);
                    let q = tile.x.q[row * tile.k + b * BLOCK + c];
                    dots[c / (BLOCK / 2)] += i32::from(u) * i32::from(q);
                }
                let d = f16_at(blk, wb + 2 * r);
                let sc = tile.x.scales[row * nb + b];
                acc += if tile.bits == Bits::U6 {
                    let low = dots[0] - 32 * sc.qsum_low;
                    let high = dots[1] - 32 * (sc.qsum - sc.qsum_low);
                    let (d0, d1) = (d * u6_scale(blk, r, 0), d * u6_scale(blk, r, 1));
                    low as f32 * (d0 * sc.d) + high as f32 * (d1 * sc.d)
                } else {
                    let m = f16_at(blk, wb + 2 * PANEL + 2 * r);
                    (dots[0] + dots[1]) as f32 * (d * sc.d) + m * sc.s
                };
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

    const KINDS: [QuantType; 8] = [
        QuantType::Q8_0,
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q5_1,
        QuantType::Q4_K,
        QuantType::Q5_K,
        QuantType::Q6_K,
    ];

    /// Random GGUF blocks of `kind` (`n_blocks` of 32 weights' worth): random bytes, with
    /// small positive f16 scales (and offsets of either sign) where the type has them.
    fn random_blocks(kind: QuantType, n_blocks: usize, seed: &mut u64) -> Vec<u8> {
        let n = n_blocks * BLOCK / kind.block_elems();
        let mut out: Vec<u8> = (0..n * kind.block_bytes())
            .map(|_| lcg(seed) as u8)
            .collect();
        // K-quant weights are d times a 6-bit (Q6_K: 8-bit) scale times u: d a 32nd (128th)
        // of the others'.
        let d_unit = match kind {
            QuantType::Q6_K => 1.0 / 128.0,
            k if k.is_k_quant() => 1.0 / 32.0,
            _ => 1.0,
        };
        let d_at = if kind == QuantType::Q6_K { 208 } else { 0 };
        for block in out.chunks_exact_mut(kind.block_bytes()) {
            let d = f16::from_f32((0.001 + (lcg(seed) % 1000) as f32 * 1e-5) * d_unit);
            block[d_at..d_at + 2].copy_from_slice(&d.to_le_bytes());
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

    /// The f16 offset `m` of the group holding column `c` of a GGUF row (0 for Q6_K, whose
    /// offset is an exact multiple of its scale).
    fn group_offset(kind: QuantType, row_blocks: &[u8], c: usize) -> f32 {
        if kind == QuantType::Q6_K {
            return 0.0;
        }
        let block = &row_blocks[c / kind.block_elems() * kind.block_bytes()..];
        affine_group(kind, block, c % kind.block_elems() / BLOCK)
            .2
            .to_f32()
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
            let row_bytes = cols / kind.block_elems() * kind.block_bytes();
            for r in 0..rows {
                w.row_to_f32(r, &mut row);
                for (c, (&a, &b)) in row.iter().zip(&want[r * cols..]).enumerate() {
                    let m = group_offset(kind, &blocks[r * row_bytes..], c);
                    // Q4_K / Q5_K: a group's scale and offset are rounded to f16 (2⁻¹¹
                    // each); the others are exact up to f32 rounding.
                    let tol = if matches!(kind, QuantType::Q4_K | QuantType::Q5_K) {
                        2f32.powi(-11) * (b.abs() + 2.0 * m.abs()) * 1.01 + 1e-7
                    } else {
                        1e-6 * b.abs().max(1e-3)
                    };
                    assert!((a - b).abs() <= tol, "{kind:?} [{r},{c}]: {a} vs {b}");
                }
            }
        }
    }

    /// A fused weight of parts in different types reads back as its parts, in order, and
    /// multiplies as each part alone.
    #[test]
    fn parts_of_different_types_stack() {
        let mut seed = 23;
        let (cols, m) = (256, 3);
        let shapes = [
            (QuantType::Q4_K, 32),
            (QuantType::Q6_K, 21),
            (QuantType::Q5_0, 19),
        ];
        let blocks: Vec<Vec<u8>> = shapes
            .iter()
            .map(|&(kind, rows)| random_blocks(kind, rows * cols / BLOCK, &mut seed))
            .collect();
        let parts: Vec<(QuantType, usize, &[u8])> = shapes
            .iter()
            .zip(&blocks)
            .map(|(&(kind, rows), b)| (kind, rows, b.as_slice()))
            .collect();
        let fused = QuantMatrix::from_parts("qkv", cols, &parts).unwrap();
        assert_eq!((fused.rows, fused.cols), (72, cols));
        let x = random_x(m, cols, &mut seed);
        let mut got = vec![f32::NAN; m * fused.rows];
        matmul(&x, m, &fused, &mut got, 2);
        let (mut row0, mut a, mut b) = (0, vec![0.0; cols], vec![0.0; cols]);
        for &(kind, rows, bytes) in &parts {
            let alone = QuantMatrix::from_gguf("part", kind, rows, cols, bytes).unwrap();
            let mut want = vec![f32::NAN; m * rows];
            matmul(&x, m, &alone, &mut want, 2);
            for r in 0..rows {
                fused.row_to_f32(row0 + r, &mut a);
                alone.row_to_f32(r, &mut b);
                assert_eq!(a, b, "{kind:?} row {r}");
                for i in 0..m {
                    assert_eq!(got[i * fused.rows + row0 + r], want[i * rows + r]);
                }
            }
            row0 += rows;
        }
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
        let mut x = random_x(1, 512, &mut seed);
        x[40] = 0.0;
        x[64..96].fill(0.0);
        x[100] = 2.5;
        x[256..512].fill(0.0);
        for act in [ActScales::Q8_0, ActScales::Q8_1, ActScales::Q8_K] {
            let quantize = |isa| {
                let (mut q, mut sc) = (vec![0i8; 512], vec![BlockScale::default(); 16]);
                quantize_row(&x, &mut q, &mut sc, act, isa);
                (q, sc)
            };
            let want = quantize(Isa::Scalar);
            for isa in Isa::available() {
                assert_eq!(quantize(isa), want, "{act:?} {isa:?}");
            }
        }
    }

    /// `q·d` is within half a step of `x` (plus, per 32 values, the f16 rounding of `d`:
    /// at most 127 steps times 2⁻¹¹); the sums are the `q`s' sums.
    #[test]
    fn activation_quantisation_is_within_half_a_step() {
        let mut seed = 5;
        let (m, k) = (3, 512);
        let x = random_x(m, k, &mut seed);
        for (act, slack) in [
            (ActScales::Q8_0, 0.5 + 127.0 / 2048.0),
            (ActScales::Q8_1, 0.5 + 127.0 / 2048.0),
            (ActScales::Q8_K, 0.5),
        ] {
            let mut rows = QuantRows::default();
            rows.quantize(&x, m, k, act, Isa::detect());
            for (i, &v) in x.iter().enumerate() {
                let (q, d) = (rows.q[i] as f32, rows.scales[i / BLOCK].d);
                assert!(
                    (q * d - v).abs() <= slack * d * 1.0001,
                    "{act:?} {i}: {v} vs {}",
                    q * d
                );
            }
            for (b, sc) in rows.scales.iter().enumerate() {
                let q = &rows.q[b * BLOCK..(b + 1) * BLOCK];
                let sum = |q: &[i8]| q.iter().map(|&q| q as i32).sum::<i32>();
                assert_eq!((sc.qsum, sc.qsum_low), (sum(q), sum(&q[..BLOCK / 2])));
                let s = sc.d * sc.qsum as f32;
                assert!((sc.s - s).abs() <= s.abs() * 2f32.powi(-10), "{act:?} {b}");
            }
            // One scale per span.
            let span = act.span() / BLOCK;
            for sc in rows.scales.chunks_exact(span) {
                assert!(sc.iter().all(|s| s.d == sc[0].d), "{act:?}");
            }
        }
        let mut zero = QuantRows::default();
        zero.quantize(&[0.0; 256], 1, 256, ActScales::Q8_K, Isa::detect());
        assert!(zero.q.iter().all(|&q| q == 0) && zero.scales[0].d == 0.0);
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
                rows.quantize(&x, m, k, ActScales::of(kind), Isa::detect());
                let mut want = vec![f32::NAN; m * n];
                matmul_quantized(&rows, m, &w, &mut want, 2, Isa::Scalar);
                for isa in Isa::available() {
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

    /// Against f64 math on the packed weights' values (the dequantised ones but for Q4_K's
    /// and Q5_K's f16 group scales, checked above) and the unquantised activations. The
    /// only difference is the activations' rounding: per value at most half a step `d/2`
    /// (plus, for the 32-weight types, `d`'s own rounding to f16: 127·2⁻¹¹ steps), and for
    /// Q4_1 / Q5_1 per group the f16 roundings of `s` and `d` times the offset `m`
    /// (2·2⁻¹¹·|m·s|). The `m = −k·d` types' offsets cancel up to f32 rounding.
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
            let act = ActScales::of(kind);
            let mut rows = QuantRows::default();
            rows.quantize(&x, m, k, act, Isa::detect());
            let step = if act == ActScales::Q8_K {
                0.5
            } else {
                0.5 + 127.0 / 2048.0
            };
            let row_bytes = k / kind.block_elems() * kind.block_bytes();
            for i in 0..m {
                for j in 0..n {
                    let (mut exact, mut bound) = (0.0f64, 0.0f64);
                    for t in 0..k {
                        let sc = rows.scales[i * (k / BLOCK) + t / BLOCK];
                        exact += x[i * k + t] as f64 * wf[j * k + t] as f64;
                        bound += step * sc.d as f64 * (wf[j * k + t] as f64).abs();
                        if t % BLOCK == 0 && act == ActScales::Q8_1 {
                            let m = group_offset(kind, &blocks[j * row_bytes..], t);
                            bound += (m * sc.s).abs() as f64 * 2f64.powi(-10);
                        }
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
