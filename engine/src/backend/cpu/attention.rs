//! Paged causal attention on the CPU, f32 throughout.
//!
//! The cache of one layer stores K and V as `[block][kv_head][offset][head_dim]`, so the
//! keys of one head inside one block are contiguous. Work is split into items of
//! (sequence, KV head, block of query rows); an item handles every query head of the
//! KV head's group, so each key and value is read once per query row for the group.

use anyhow::{anyhow, ensure};
use rayon::prelude::*;

use super::simd::{axpy, cpu_has_avx2, dot_fast, fast_exp, sum, SendPtr};
use crate::backend::{check_block_table, AttnSeq, QkvLayout};

/// Query rows per work item.
const QUERY_BLOCK: usize = 16;

/// One layer's paged K/V storage.
#[derive(Debug)]
pub struct CpuKvCache {
    k: Vec<f32>,
    v: Vec<f32>,
    num_blocks: usize,
    block_size: usize,
    num_kv_heads: usize,
    head_dim: usize,
}

impl CpuKvCache {
    /// Zero-filled cache (calloc'd, so untouched blocks cost no memory).
    pub fn new(
        num_blocks: usize,
        block_size: usize,
        num_kv_heads: usize,
        head_dim: usize,
    ) -> anyhow::Result<Self> {
        let len = num_blocks
            .checked_mul(block_size)
            .and_then(|v| v.checked_mul(num_kv_heads * head_dim))
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "KV cache size overflows: {num_blocks} blocks of {block_size} tokens"
                )
            })?;
        Ok(Self {
            k: vec![0.0; len],
            v: vec![0.0; len],
            num_blocks,
            block_size,
            num_kv_heads,
            head_dim,
        })
    }

    /// Offset of (block, head, offset-in-block).
    fn index(&self, block: usize, head: usize, off: usize) -> usize {
        ((block * self.num_kv_heads + head) * self.block_size + off) * self.head_dim
    }

    /// Copies the K and V parts of every row of `qkv` to the row's slot.
    fn write(&mut self, qkv: &[f32], layout: QkvLayout, slots: &[usize]) -> anyhow::Result<()> {
        let (width, hd) = (layout.qkv_width(), layout.head_dim);
        let (k_off, v_off) = (layout.q_width(), layout.q_width() + layout.kv_width());
        for (t, &slot) in slots.iter().enumerate() {
            let (block, off) = (slot / self.block_size, slot % self.block_size);
            ensure!(
                block < self.num_blocks,
                "KV slot {slot} is past the cache ({} blocks)",
                self.num_blocks
            );
            let row = &qkv[t * width..(t + 1) * width];
            for h in 0..self.num_kv_heads {
                let dst = self.index(block, h, off);
                self.k[dst..dst + hd].copy_from_slice(&row[k_off + h * hd..k_off + (h + 1) * hd]);
                self.v[dst..dst + hd].copy_from_slice(&row[v_off + h * hd..v_off + (h + 1) * hd]);
            }
        }
        Ok(())
    }
}

/// Writes K/V of every row to its slot, then `out[t, q heads] = softmax(q kᵀ / √d) v`
/// over positions `0..=pos(t)` of the row's sequence.
pub fn attention(
    qkv: &[f32],
    layout: QkvLayout,
    cache: &mut CpuKvCache,
    seqs: &[AttnSeq<'_>],
    slots: &[usize],
    out: &mut [f32],
) -> anyhow::Result<()> {
    ensure!(
        cache.num_kv_heads == layout.num_kv_heads && cache.head_dim == layout.head_dim,
        "KV cache shape does not match the attention layout"
    );
    let rows = slots.len();
    ensure!(
        qkv.len() == rows * layout.qkv_width(),
        "attention: qkv shape"
    );
    ensure!(
        out.len() == rows * layout.q_width(),
        "attention: output shape"
    );
    cache.write(qkv, layout, slots)?;
    let bs = cache.block_size;
    let mut items = Vec::new();
    for (si, s) in seqs.iter().enumerate() {
        ensure!(
            s.row_start + s.n_tokens <= rows,
            "sequence {si} rows are past the batch"
        );
        check_block_table(
            s.block_table,
            s.start_pos + s.n_tokens,
            bs,
            cache.num_blocks,
        )
        .map_err(|e| anyhow!("sequence {si}: {e}"))?;
        for h in 0..layout.num_kv_heads {
            for q0 in (0..s.n_tokens).step_by(QUERY_BLOCK) {
                items.push((si, h, q0, (q0 + QUERY_BLOCK).min(s.n_tokens)));
            }
        }
    }
    let out_ptr = SendPtr(out.as_mut_ptr());
    let cache = &*cache;
    let avx2 = cpu_has_avx2();
    items.into_par_iter().for_each(|(si, h, q0, q1)| {
        let job = Item {
            qkv,
            layout,
            cache,
            seq: &seqs[si],
            kv_head: h,
            q0,
            q1,
            out: out_ptr,
        };
        // SAFETY: an item writes only the output columns of the query heads of KV head
        // `h` in rows of its own query block: disjoint across items. `avx2` was detected.
        unsafe { job.run(avx2) };
    });
    Ok(())
}

/// One work item: query rows `q0..q1` of `seq`, the query heads of `kv_head`.
struct Item<'a> {
    qkv: &'a [f32],
    layout: QkvLayout,
    cache: &'a CpuKvCache,
    seq: &'a AttnSeq<'a>,
    kv_head: usize,
    q0: usize,
    q1: usize,
    out: SendPtr<f32>,
}

impl Item<'_> {
    /// # Safety
    /// No other thread writes this item's output region; `avx2` only if the CPU has AVX2+FMA.
    unsafe fn run(&self, avx2: bool) {
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            self.run_avx2();
            return;
        }
        let _ = avx2;
        self.compute::<false>();
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn run_avx2(&self) {
        self.compute::<true>();
    }

    #[inline(always)]
    unsafe fn compute<const FMA: bool>(&self) {
        let QkvLayout {
            num_heads,
            head_dim: hd,
            ..
        } = self.layout;
        let group = self.layout.group_size();
        let width = self.layout.qkv_width();
        let bs = self.cache.block_size;
        let scale = 1.0 / (hd as f32).sqrt();
        let max_ctx = self.seq.start_pos + self.q1;
        let mut scores = vec![0.0f32; group * max_ctx];
        let mut acc = vec![0.0f32; group * hd];
        let mut inv_sums = vec![0.0f32; group];
        for qi in self.q0..self.q1 {
            let t = self.seq.row_start + qi;
            let ctx = self.seq.start_pos + qi + 1;
            let q_row = &self.qkv[t * width..t * width + num_heads * hd];
            let q_head = |g: usize| {
                let qh = self.kv_head * group + g;
                &q_row[qh * hd..(qh + 1) * hd]
            };
            // scores[g * ctx + j] = q_g · k_j * scale
            for (bi, &block) in self.seq.block_table[..ctx.div_ceil(bs)].iter().enumerate() {
                let n = bs.min(ctx - bi * bs);
                let base = self.cache.index(block as usize, self.kv_head, 0);
                for o in 0..n {
                    let key = &self.cache.k[base + o * hd..base + (o + 1) * hd];
                    for g in 0..group {
                        scores[g * ctx + bi * bs + o] = dot_fast::<FMA>(q_head(g), key) * scale;
                    }
                }
            }
            for g in 0..group {
                let s = &mut scores[g * ctx..(g + 1) * ctx];
                let max = s.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                for v in s.iter_mut() {
                    *v = fast_exp(*v - max);
                }
                inv_sums[g] = 1.0 / sum::<FMA>(s);
            }
            acc.fill(0.0);
            for (bi, &block) in self.seq.block_table[..ctx.div_ceil(bs)].iter().enumerate() {
                let n = bs.min(ctx - bi * bs);
                let base = self.cache.index(block as usize, self.kv_head, 0);
                for o in 0..n {
                    let val = &self.cache.v[base + o * hd..base + (o + 1) * hd];
                    for g in 0..group {
                        axpy::<FMA>(
                            &mut acc[g * hd..(g + 1) * hd],
                            scores[g * ctx + bi * bs + o],
                            val,
                        );
                    }
                }
            }
            for g in 0..group {
                let qh = self.kv_head * group + g;
                let dst = self.out.get().add(t * num_heads * hd + qh * hd);
                let inv = inv_sums[g];
                for (d, &a) in acc[g * hd..(g + 1) * hd].iter().enumerate() {
                    *dst.add(d) = a * inv;
                }
            }
        }
    }
}
