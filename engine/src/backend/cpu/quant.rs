//! GGUF's block-quantised weights (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4, Q4_K, Q5_K, Q6_K) kept
//! quantised, multiplied with integer dot products.
//!
//! Every format is the same sum in another costume: a group of 32 weights is `d·u + m`
//! for an unsigned `u` (4 bits for Q4_0, Q4_1 and Q4_K; 8 bits holding Q5's 5, Q6_K's 6
//! and Q8_0's 8) and a scale `d` and offset `m` per group. The 32-weight types store them
//! as f16 (exact, [`affine_group`]). The K-quants keep the file's integer scales and mins
//! and their super-block's f16 `d` / `dmin` (group `d = d_sb·scale`, `m = −dmin·min`;
//! Q6_K's scale changes every 16 weights, so it has a signed scale per half and
//! `m = −32·d_sb·scale`, [`q6_k_group`]). Activations are quantised on the fly to `q·dₓ`
//! with `q` in −127..=127, as llama.cpp does for each type ([`ActScales`]), so one group of
//! one output is
//!
//! `d·dₓ·Σ u·q + m·dₓ·Σ q`
//!
//! with `Σ u·q` in exact integer arithmetic (AVX-512 VNNI `vpdpbusd`, AVX2 `vpmaddubsw`).
//! The K-quants go further, as llama.cpp does: `scale·Σ u·q` and `min·Σ q` are summed in
//! integers over a super-block, then scaled once by `d_sb·dₓ` and `dmin·dₓ`. Weights are repacked once at load into panels of 16 output rows whose
//! bytes feed those instructions directly (see [`QuantMatrix`]), so decode streams 0.58
//! bytes per Q4_K weight instead of the 2 of an f16 copy, and prefill runs a register-tiled
//! integer GEMM.

use std::cell::RefCell;

use anyhow::ensure;
use half::f16;
use rayon::prelude::*;

use super::quant_layout::{
    row_scales, value_at, value_offset, BlockScale, Format, QuantRows, RowScales, BLOCK, PANEL,
    TILE_ROWS,
};
use super::quant_simd;
use super::simd::Isa;
use super::simd::SendPtr;
use crate::weights::ggml_quants::{affine_group, k_group, q6_k_group, super_block_scales, GROUP};
use crate::weights::QuantType;

/// Activation rows whose quantised copy is walked per pass over a task's panels
/// (keeps that copy in L2 while the panels stream past it).
const ROW_CHUNK: usize = 128;
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
/// after block (K-quants: each super-block's header before its 8 blocks; see [`Format`]).
/// In a block, the value `u` of row `r` at column `c` (both within the panel and block)
/// sits where one `vpdpbusd` step wants it: steps of 4 columns, each step 64 bytes with row
/// `r`'s 4 values at bytes `4r..4r + 4`. Byte formats store steps 0..8 in order; nibble
/// formats store step pairs `(2t, 2t + 1)` in 64 bytes, step `2t` in the low nibbles and
/// `2t + 1` in the high ones.
#[derive(Debug, Clone)]
struct Part {
    row0: usize,
    rows: usize,
    format: Format,
    act: ActScales,
    data: Vec<u8>,
}

impl QuantMatrix {
    /// Bytes of its repacked panels, scales included.
    pub fn bytes(&self) -> usize {
        self.parts.iter().map(|p| p.data.len()).sum()
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
        let (rr, format) = (r % PANEL, part.format);
        for (b, out) in dst.chunks_exact_mut(BLOCK).enumerate() {
            let blk = &panel[format.block_offset(b)..];
            let scales = row_scales(format, panel, b, rr);
            for (c, o) in out.iter_mut().enumerate() {
                let u = f32::from(value_at(format, blk, rr, c));
                *o = match scales {
                    RowScales::Affine { d, m } => d * u + m,
                    // In ggml's order: `(d·scale)·u − dmin·min`, each product exact in f32.
                    RowScales::ScaleMin {
                        d,
                        dmin,
                        scale,
                        min,
                    } => d * scale as f32 * u - dmin * min as f32,
                    RowScales::Halves { d, scales } => {
                        d * scales[c / (BLOCK / 2)] as f32 * (u - 32.0)
                    }
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
        let format = Format::of(kind);
        let wb = format.weight_bytes();
        let mut data = vec![0u8; rows.div_ceil(PANEL) * format.panel_bytes(nb)];
        data.par_chunks_mut(format.panel_bytes(nb))
            .enumerate()
            .for_each(|(p, panel)| {
                for r in 0..PANEL.min(rows - p * PANEL) {
                    let row = p * PANEL + r;
                    for b in 0..nb {
                        let block = row * gguf_blocks + b / groups;
                        let src = &blocks[block * kind.block_bytes()..][..kind.block_bytes()];
                        let (g, head) = (b % groups, format.header_offset(b));
                        if format.k_quant() && g == 0 {
                            let (d, dmin) = super_block_scales(kind, src);
                            panel[head + 2 * r..][..2].copy_from_slice(&d.to_le_bytes());
                            if format != Format::Q6K {
                                let at = head + 2 * PANEL + 2 * r;
                                panel[at..at + 2].copy_from_slice(&dmin.to_le_bytes());
                            }
                        }
                        let (at, tail) = (format.block_offset(b), format.block_offset(b) + wb);
                        let u = match format {
                            Format::Nibbles | Format::Bytes => {
                                let (u, d, m) = affine_group(kind, src);
                                panel[tail + 2 * r..][..2].copy_from_slice(&d.to_le_bytes());
                                let m_at = tail + 2 * PANEL + 2 * r;
                                panel[m_at..m_at + 2].copy_from_slice(&m.to_le_bytes());
                                u
                            }
                            Format::KNibbles | Format::KBytes => {
                                let (u, scale, min) = k_group(kind, src, g);
                                panel[tail + r] = scale;
                                panel[head + Format::min_offset(r, g)] = min;
                                u
                            }
                            Format::Q6K => {
                                let (u, scales) = q6_k_group(src, g);
                                for (h, sc) in scales.into_iter().enumerate() {
                                    panel[tail + PANEL * h + r] = sc as u8;
                                }
                                u
                            }
                        };
                        for (c, &v) in u.iter().enumerate() {
                            let (off, high) = value_offset(format, r, c);
                            panel[at + off] |= if high { v << 4 } else { v };
                        }
                    }
                }
            });
        Self::check_scales(name, kind, row0, rows, nb, &data)?;
        Ok(Part {
            row0,
            rows,
            format,
            act: ActScales::of(kind),
            data,
        })
    }

    /// Every f16 of packed `data` is finite: a file's `d` / `dmin`, or a 32-weight type's
    /// `m = −k·d` (Q4_0, Q5_0, Q8_0), finite unless `d` is near f16's maximum.
    fn check_scales(
        name: &str,
        kind: QuantType,
        row0: usize,
        rows: usize,
        nb: usize,
        data: &[u8],
    ) -> anyhow::Result<()> {
        let format = Format::of(kind);
        let (wb, panel_bytes) = (format.weight_bytes(), format.panel_bytes(nb));
        // The K-quants' headers start with their f16 `d` (and `dmin`).
        let d_bytes = if format == Format::Q6K {
            2 * PANEL
        } else {
            4 * PANEL
        };
        let finite = |bytes: &[u8]| {
            bytes
                .chunks_exact(2)
                .all(|h| f16::from_le_bytes([h[0], h[1]]).is_finite())
        };
        for (p, panel) in data.chunks_exact(panel_bytes).enumerate() {
            let (first, end) = (row0 + p * PANEL, (row0 + (p + 1) * PANEL).min(row0 + rows));
            for b in (0..nb).step_by(format.super_blocks()) {
                if format.k_quant() {
                    let head = format.header_offset(b);
                    ensure!(
                        finite(&panel[head..head + d_bytes]),
                        "weight `{name}`: a {kind:?} scale in rows {first}..{end} is not finite"
                    );
                } else {
                    let tail = format.block_offset(b) + wb;
                    ensure!(
                        finite(&panel[tail..tail + 4 * PANEL]),
                        "weight `{name}`: a {kind:?} scale in rows {first}..{end} is not \
                         finite, or its offset is too large for f16"
                    );
                }
            }
        }
        Ok(())
    }

    /// Panel `p`'s bytes (`nb` blocks per row).
    fn panel(&self, p: usize, nb: usize) -> &[u8] {
        let len = self.format.panel_bytes(nb);
        &self.data[p * len..(p + 1) * len]
    }
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

/// Quantises one row: per block of 32, `d = max|x| / 127` and `q = round(x / d)` (ties to
/// even, as llama.cpp's AVX2 Q8_0 / Q8_1).
pub fn quantize_row(x: &[f32], q: &mut [i8], scales: &mut [BlockScale], act: ActScales, isa: Isa) {
    for ((xb, qb), sc) in x
        .chunks_exact(BLOCK)
        .zip(q.chunks_exact_mut(BLOCK))
        .zip(scales.iter_mut())
    {
        let amax = quant_simd::amax(xb, isa);
        let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
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
                            format: part.format,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::ggml_quants::{dequantize, f16_at};

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

    /// The f16 offset `m` of the block holding column `c` of a Q4_1 / Q5_1 row.
    fn q8_1_offset(kind: QuantType, row_blocks: &[u8], c: usize) -> f32 {
        assert_eq!(ActScales::of(kind), ActScales::Q8_1);
        f16_at(&row_blocks[c / BLOCK * kind.block_bytes()..], 2)
    }

    /// The K-quants' values are ggml's bit for bit (the same f32 products); the 32-weight
    /// types' `d·u + m` differ from ggml's `(u − k)·d` by f32 rounding at most.
    #[test]
    fn packing_keeps_every_value() {
        let mut seed = 3;
        for kind in KINDS {
            let (rows, cols) = (37, 512);
            let blocks = random_blocks(kind, rows * cols / BLOCK, &mut seed);
            let want = dequantize(kind, &blocks);
            let w = QuantMatrix::from_gguf("w", kind, rows, cols, &blocks).unwrap();
            let mut row = vec![0.0; cols];
            for r in 0..rows {
                w.row_to_f32(r, &mut row);
                for (c, (&a, &b)) in row.iter().zip(&want[r * cols..]).enumerate() {
                    let tol = if kind.is_k_quant() {
                        0.0
                    } else {
                        1e-6 * b.abs().max(1e-3)
                    };
                    assert!((a - b).abs() <= tol, "{kind:?} [{r},{c}]: {a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn scales_that_are_not_finite_are_refused() {
        let mut seed = 29;
        for (kind, at) in [
            (QuantType::Q4_K, 0),
            (QuantType::Q5_K, 2),
            (QuantType::Q6_K, 208),
            (QuantType::Q4_1, 0),
        ] {
            // Row 17's second half: the second K-quant super-block.
            let (rows, cols) = (20, 512);
            let mut blocks = random_blocks(kind, rows * cols / BLOCK, &mut seed);
            let row_bytes = cols / kind.block_elems() * kind.block_bytes();
            let bad = 17 * row_bytes + row_bytes / 2 + at;
            blocks[bad..bad + 2].copy_from_slice(&f16::INFINITY.to_le_bytes());
            let err = QuantMatrix::from_gguf("blk.3.w", kind, rows, cols, &blocks).unwrap_err();
            let msg = err.to_string();
            assert!(
                msg.contains("`blk.3.w`") && msg.contains("rows 16..20"),
                "{msg}"
            );
        }
        let mut q8 = random_blocks(QuantType::Q8_0, 1, &mut seed);
        q8[..2].copy_from_slice(&f16::from_f32(1000.0).to_le_bytes());
        let err = QuantMatrix::from_gguf("w", QuantType::Q8_0, 1, 32, &q8).unwrap_err();
        assert!(err.to_string().contains("too large for f16"), "{err}");
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
        for act in [ActScales::Q8_0, ActScales::Q8_1, ActScales::F32] {
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
            (ActScales::F32, 0.5),
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
                if act == ActScales::F32 {
                    assert_eq!(sc.s, s, "{b}");
                } else {
                    assert!((sc.s - s).abs() <= s.abs() * 2f32.powi(-10), "{act:?} {b}");
                }
            }
            // One scale per block, its own: the largest |q| of a block is 127.
            for (b, sc) in rows.scales.iter().enumerate() {
                let q = &rows.q[b * BLOCK..(b + 1) * BLOCK];
                assert_eq!(
                    q.iter().map(|q| q.unsigned_abs()).max(),
                    Some(127),
                    "{act:?} {b}"
                );
                assert!(sc.d > 0.0, "{act:?} {b}");
            }
        }
        let mut zero = QuantRows::default();
        zero.quantize(&[0.0; 256], 1, 256, ActScales::F32, Isa::detect());
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
                (5, 29, 512),
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

    /// Against f64 math on the packed weights' values (the dequantised ones, checked above)
    /// and the unquantised activations. The
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
            let step = if act == ActScales::F32 {
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
                            let m = q8_1_offset(kind, &blocks[j * row_bytes..], t);
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
