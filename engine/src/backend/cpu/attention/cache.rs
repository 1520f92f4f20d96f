//! The CPU's paged KV cache of one layer.

use anyhow::ensure;
use half::f16;
use half::vec::HalfBitsVecExt;

use super::super::simd::Elem;
use crate::backend::{KvCacheShape, QkvLayout};

/// Keys per score vector (and dimensions per output vector).
pub(super) const KEYS: usize = 16;

/// What the CPU's KV cache stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KvCacheDtype {
    F16,
    F32,
}

impl KvCacheDtype {
    /// Bytes per cached value.
    pub fn bytes(self) -> usize {
        match self {
            KvCacheDtype::F16 => 2,
            KvCacheDtype::F32 => 4,
        }
    }
}

/// K and V of one layer, in the cache's element type.
#[derive(Debug)]
pub(super) enum KvStore {
    F16 { k: Vec<f16>, v: Vec<f16> },
    F32 { k: Vec<f32>, v: Vec<f32> },
}

/// One layer's paged K/V storage.
#[derive(Debug)]
pub struct CpuKvCache {
    pub(super) store: KvStore,
    pub(super) num_blocks: usize,
    pub(super) block_size: usize,
    pub(super) num_kv_heads: usize,
    pub(super) head_dim: usize,
}

impl CpuKvCache {
    /// Zero-filled cache (calloc'd, so untouched blocks cost no memory).
    pub fn new(dtype: KvCacheDtype, shape: KvCacheShape) -> anyhow::Result<Self> {
        let head_dim = shape.head_dim;
        ensure!(
            head_dim.is_multiple_of(KEYS),
            "the CPU backend needs a head dimension that is a multiple of {KEYS} (got {head_dim})"
        );
        let len = shape.values()?;
        let store = match dtype {
            KvCacheDtype::F16 => KvStore::F16 {
                k: vec![0u16; len].reinterpret_into(),
                v: vec![0u16; len].reinterpret_into(),
            },
            KvCacheDtype::F32 => KvStore::F32 {
                k: vec![0.0; len],
                v: vec![0.0; len],
            },
        };
        Ok(Self {
            store,
            num_blocks: shape.num_blocks,
            block_size: shape.block_size,
            num_kv_heads: shape.num_kv_heads,
            head_dim,
        })
    }

    /// The cache's memory as pages of f32 recurrent state (`backend::state_page_values`):
    /// the bases of K and of V read as f32, and the f32 values of one block's region of
    /// either. The pointers are valid while `self` is mutably borrowed.
    pub(crate) fn state_regions(&mut self) -> anyhow::Result<(*mut f32, *mut f32, usize)> {
        let region = self.num_kv_heads * self.block_size * self.head_dim;
        let (k, v, half) = match &mut self.store {
            KvStore::F16 { k, v } => (
                k.as_mut_ptr().cast::<f32>(),
                v.as_mut_ptr().cast::<f32>(),
                region / 2,
            ),
            KvStore::F32 { k, v } => (k.as_mut_ptr(), v.as_mut_ptr(), region),
        };
        ensure!(
            (k as usize).is_multiple_of(4) && (v as usize).is_multiple_of(4),
            "the KV cache's memory is not aligned for f32 state"
        );
        Ok((k, v, half))
    }

    pub(crate) fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Offset of (block, head, offset-in-block) in `v`, and of (block, head) in `k`.
    pub(super) fn index(&self, block: usize, head: usize, off: usize) -> usize {
        ((block * self.num_kv_heads + head) * self.block_size + off) * self.head_dim
    }

    /// Copies the K and V parts of every row of `qkv` to the row's slot.
    pub(super) fn write(
        &mut self,
        qkv: &[f32],
        layout: QkvLayout,
        slots: &[usize],
    ) -> anyhow::Result<()> {
        for &slot in slots {
            ensure!(
                slot / self.block_size < self.num_blocks,
                "KV slot {slot} is past the cache ({} blocks)",
                self.num_blocks
            );
        }
        let shape = (self.block_size, self.num_kv_heads);
        match &mut self.store {
            KvStore::F16 { k, v } => write_rows(k, v, shape, qkv, layout, slots),
            KvStore::F32 { k, v } => write_rows(k, v, shape, qkv, layout, slots),
        }
        Ok(())
    }
}

/// [`CpuKvCache::write`] into `k` / `v` of `(block_size, num_kv_heads)` (slots checked).
fn write_rows<E: Elem>(
    k: &mut [E],
    v: &mut [E],
    (block_size, num_kv_heads): (usize, usize),
    qkv: &[f32],
    layout: QkvLayout,
    slots: &[usize],
) {
    let (width, hd) = (layout.qkv_width(), layout.head_dim);
    let (k_off, v_off) = (layout.q_width(), layout.q_width() + layout.kv_width());
    for (t, &slot) in slots.iter().enumerate() {
        let (block, off) = (slot / block_size, slot % block_size);
        let row = &qkv[t * width..(t + 1) * width];
        for h in 0..num_kv_heads {
            let head = (block * num_kv_heads + h) * block_size;
            let dst = (head + off) * hd;
            for (o, &x) in v[dst..dst + hd].iter_mut().zip(&row[v_off + h * hd..]) {
                *o = E::from_f32(x);
            }
            for (d, &x) in row[k_off + h * hd..k_off + (h + 1) * hd].iter().enumerate() {
                k[head * hd + d * block_size + off] = E::from_f32(x);
            }
        }
    }
}
