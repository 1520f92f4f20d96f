//! Where a quantised weight's values and scales sit in the panels the kernels read, and the
//! quantised activations they multiply: the layout below both the packing (`pack`) and
//! the kernels (`dot`).

use crate::weights::ggml_quants::f16_at;
use crate::weights::QuantType;

/// Values per quantisation block (weights and activations).
pub const BLOCK: usize = 32;
/// Output rows per packed panel (one 512-bit vector of i32 / f32 lanes).
pub const PANEL: usize = 16;
/// Activation rows of one micro-tile.
pub const TILE_ROWS: usize = 8;
/// Values per K-quant super-block.
pub(super) const SUPER_BLOCK: usize = 256;

/// How a type's values and scales sit in a panel's blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// 4-bit values, two per byte; f16 `d` and `m` per block (Q4_0, Q4_1).
    Nibbles,
    /// 8-bit values; f16 `d` and `m` per block (Q8_0; Q5_0 and Q5_1's 5 bits; MXFP4's FP4
    /// codes as their doubled values plus 12).
    Bytes,
    /// Q4_K: 4-bit values; a 6-bit scale and min per block; f16 `d`, `dmin` per
    /// super-block.
    KNibbles,
    /// Q5_K: 5-bit values in bytes; scales as [`Format::KNibbles`].
    KBytes,
    /// Q6_K: 6-bit values in bytes; a signed scale per 16 values; f16 `d` per super-block.
    Q6K,
}

impl Format {
    /// The layout of a type.
    pub fn of(kind: QuantType) -> Format {
        match kind {
            QuantType::Q4_0 | QuantType::Q4_1 => Format::Nibbles,
            QuantType::Q5_0 | QuantType::Q5_1 | QuantType::Q8_0 | QuantType::MXFP4 => Format::Bytes,
            QuantType::Q4_K => Format::KNibbles,
            QuantType::Q5_K => Format::KBytes,
            QuantType::Q6_K => Format::Q6K,
        }
    }

    /// The kernels' const tag.
    pub const fn tag(self) -> u8 {
        self as u8
    }

    /// The format of a tag.
    pub const fn from_tag(tag: u8) -> Format {
        match tag {
            0 => Format::Nibbles,
            1 => Format::Bytes,
            2 => Format::KNibbles,
            3 => Format::KBytes,
            _ => Format::Q6K,
        }
    }

    /// Whether values are 4-bit pairs in bytes.
    pub const fn nibbles(self) -> bool {
        matches!(self, Format::Nibbles | Format::KNibbles)
    }

    /// Whether the format is a K-quant's (super-blocks with a header).
    pub const fn k_quant(self) -> bool {
        matches!(self, Format::KNibbles | Format::KBytes | Format::Q6K)
    }

    /// Bytes of one block of one panel's weights (16 rows × 32 values).
    pub const fn weight_bytes(self) -> usize {
        if self.nibbles() {
            PANEL * BLOCK / 2
        } else {
            PANEL * BLOCK
        }
    }

    /// Bytes of one block of one panel: its weights, then its tail: 16 f16 `d`, then 16
    /// f16 `m` (32-weight types); the 16 rows' u8 scales (Q4_K, Q5_K); their i8 scales of
    /// the first 16 values, then of the last 16 (Q6_K).
    pub const fn block_stride(self) -> usize {
        self.weight_bytes()
            + match self {
                Format::Nibbles | Format::Bytes => 4 * PANEL,
                Format::KNibbles | Format::KBytes => PANEL,
                Format::Q6K => 2 * PANEL,
            }
    }

    /// Blocks per super-block (1: the 32-weight types have none).
    pub const fn super_blocks(self) -> usize {
        if self.k_quant() {
            SUPER_BLOCK / BLOCK
        } else {
            1
        }
    }

    /// Bytes before each super-block's blocks: 16 f16 `d`; Q4_K and Q5_K then 16 f16
    /// `dmin` and the 8 blocks' u8 mins, as 4 pairs of blocks of 16 rows of 2 (a row's
    /// `(min₂ₚ, min₂ₚ₊₁)` side by side, read as two vectors by `RowLanes::load_byte_pairs`;
    /// see [`Format::min_offset`]).
    pub const fn header_bytes(self) -> usize {
        match self {
            Format::Nibbles | Format::Bytes => 0,
            Format::KNibbles | Format::KBytes => 4 * PANEL + SUPER_BLOCK / BLOCK * PANEL,
            Format::Q6K => 2 * PANEL,
        }
    }

    /// Offset in a Q4_K / Q5_K header of row `r`'s min of block `g` of the super-block.
    pub const fn min_offset(r: usize, g: usize) -> usize {
        4 * PANEL + (g / 2) * 2 * PANEL + 2 * r + g % 2
    }

    /// Bytes of a panel's row of `nb` blocks.
    pub const fn panel_bytes(self, nb: usize) -> usize {
        nb * self.block_stride() + nb / self.super_blocks() * self.header_bytes()
    }

    /// Offset of block `b` in a panel.
    pub const fn block_offset(self, b: usize) -> usize {
        let per = self.super_blocks();
        (b / per) * self.super_stride() + self.header_bytes() + (b % per) * self.block_stride()
    }

    /// Offset of the header of the super-block holding block `b` in a panel.
    pub const fn header_offset(self, b: usize) -> usize {
        (b / self.super_blocks()) * self.super_stride()
    }

    /// Bytes of one super-block of a panel, header included.
    const fn super_stride(self) -> usize {
        self.header_bytes() + self.super_blocks() * self.block_stride()
    }
}

/// Offset of row `r`'s value at column `c` in a block's weight bytes, and whether it is
/// the high nibble.
pub(super) fn value_offset(format: Format, r: usize, c: usize) -> (usize, bool) {
    let (step, lane) = (c / 4, c % 4);
    if format.nibbles() {
        ((step / 2) * 64 + 4 * r + lane, step % 2 == 1)
    } else {
        (step * 64 + 4 * r + lane, false)
    }
}

/// Row `r`'s value at column `c` of a packed block.
pub(super) fn value_at(format: Format, block: &[u8], r: usize, c: usize) -> u8 {
    match value_offset(format, r, c) {
        (off, _) if !format.nibbles() => block[off],
        (off, false) => block[off] & 0x0f,
        (off, true) => block[off] >> 4,
    }
}

/// One panel row's scales for one block, as stored.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum RowScales {
    /// value = `d·u + m` (the 32-weight types).
    Affine { d: f32, m: f32 },
    /// Q4_K, Q5_K: value = `d·scale·u − dmin·min`.
    ScaleMin {
        d: f32,
        dmin: f32,
        scale: i32,
        min: i32,
    },
    /// Q6_K: value = `d·scaleₕ·(u − 32)` in half `h`.
    Halves { d: f32, scales: [i32; 2] },
}

/// Row `r`'s scales of block `b` of a panel.
pub(super) fn row_scales(format: Format, panel: &[u8], b: usize, r: usize) -> RowScales {
    let (head, tail) = (
        format.header_offset(b),
        format.block_offset(b) + format.weight_bytes(),
    );
    match format {
        Format::Nibbles | Format::Bytes => RowScales::Affine {
            d: f16_at(panel, tail + 2 * r),
            m: f16_at(panel, tail + 2 * PANEL + 2 * r),
        },
        Format::KNibbles | Format::KBytes => RowScales::ScaleMin {
            d: f16_at(panel, head + 2 * r),
            dmin: f16_at(panel, head + 2 * PANEL + 2 * r),
            scale: i32::from(panel[tail + r]),
            min: i32::from(panel[head + Format::min_offset(r, b % format.super_blocks())]),
        },
        Format::Q6K => RowScales::Halves {
            d: f16_at(panel, head + 2 * r),
            scales: std::array::from_fn(|h| i32::from(panel[tail + PANEL * h + r] as i8)),
        },
    }
}

/// One quantised activation block's scale and sums.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BlockScale {
    /// `dₓ`.
    pub d: f32,
    /// `dₓ·Σq`: the offset term (of the 32-weight types' `m`, and of the K-quants' mins;
    /// rounded to f16 for `ActScales::Q8_1`, as llama.cpp stores it).
    pub s: f32,
    /// `Σq` (the AVX2 byte kernel's `128·Σq`, Q6_K's `32·Σq`).
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
