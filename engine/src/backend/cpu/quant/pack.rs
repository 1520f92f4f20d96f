//! GGUF blocks repacked into a part's panels at load, and read back as f32.

use anyhow::ensure;
use half::f16;
use rayon::prelude::*;

use super::layout::{row_scales, value_at, value_offset, Format, RowScales, BLOCK, PANEL};
use super::{ActScales, Part, QuantMatrix};
use crate::weights::ggml_quants::{affine_group, k_group, q6_k_group, super_block_scales, GROUP};
use crate::weights::QuantType;

impl QuantMatrix {
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
    pub(super) fn pack(
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
    pub(super) fn panel(&self, p: usize, nb: usize) -> &[u8] {
        let len = self.format.panel_bytes(nb);
        &self.data[p * len..(p + 1) * len]
    }
}
