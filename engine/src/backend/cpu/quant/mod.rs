//! GGUF's block-quantised weights (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4, Q4_K, Q5_K, Q6_K) kept
//! quantised, multiplied with integer dot products.
//!
//! Every format is the same sum in another costume: a group of 32 weights is `d·u + m`
//! for an unsigned `u` (4 bits for Q4_0, Q4_1 and Q4_K; 8 bits holding Q5's 5, Q6_K's 6
//! and Q8_0's 8) and a scale `d` and offset `m` per group. The 32-weight types store them
//! as f16 (exact, `ggml_quants::affine_group`). The K-quants keep the file's integer scales and mins
//! and their super-block's f16 `d` / `dmin` (group `d = d_sb·scale`, `m = −dmin·min`;
//! Q6_K's scale changes every 16 weights, so it has a signed scale per half and
//! `m = −32·d_sb·scale`, `ggml_quants::q6_k_group`). Activations are quantised on the fly to `q·dₓ`
//! with `q` in −127..=127 and one scale per 32 values ([`ActScales`]), so one group of
//! one output is
//!
//! `d·dₓ·Σ u·q + m·dₓ·Σ q`
//!
//! with `Σ u·q` in exact integer arithmetic (AVX-512 VNNI `vpdpbusd`, AVX2 `vpmaddubsw`).
//! Weights are repacked once at load into panels of 16 output rows whose bytes feed those
//! instructions directly (`pack`, laid out as `layout` says), so decode streams 0.58 bytes
//! per Q4_K weight instead of the 2 of an f16 copy, and prefill runs a register-tiled
//! integer GEMM (`dot`) on the activations quantised by `activations`.

mod activations;
mod dot;
mod layout;
mod pack;
#[cfg(target_arch = "x86_64")]
mod scaling;
#[cfg(test)]
mod tests;

use std::cell::RefCell;

use rayon::prelude::*;

use super::simd::{Isa, SendPtr};
use crate::weights::QuantType;
pub use activations::ActScales;
use layout::{Format, QuantRows, BLOCK, PANEL, TILE_ROWS};

/// Activation rows whose quantised copy is walked per pass over a task's panels
/// (keeps that copy in L2 while the panels stream past it).
const ROW_CHUNK: usize = 128;

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
                        let tile = dot::Tile {
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
