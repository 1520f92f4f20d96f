//! Paged causal attention on the CPU: f32 arithmetic on a KV cache of f16 (the default,
//! as llama.cpp's: half the bytes a long context's decode reads, and K and V rounded as
//! llama.cpp rounds them) or f32 values ([`KvCacheDtype`]).
//!
//! The cache of one layer stores V as `[block][kv_head][offset][head_dim]` and K transposed,
//! `[block][kv_head][head_dim][offset]`, so that 16 consecutive keys' values of one dimension
//! are one vector: a score tile is `Σ_d q[d]·Kᵀ[d][16 keys]`, a register-tiled product with
//! no horizontal sums, and `P·V` adds whole value rows. Work is split into items of
//! (sequence, KV head, block of query rows); an item handles every query head of the
//! KV head's group together, so each key and value is read once per item. When a step has
//! too few items to keep every thread busy (one decoding sequence: one item per KV head),
//! a decode row's context is split by key range across items, each keeping its softmax
//! unnormalised with its running max and sum, and the parts are merged after.

use anyhow::{anyhow, ensure};
use rayon::prelude::*;

use super::simd::{Elem, Isa, SendPtr};
use crate::backend::{check_block_table, AttnSeq, QkvLayout, ScoreSpec};

mod cache;
mod item;

pub use cache::{CpuKvCache, KvCacheDtype};
use cache::{KvStore, KEYS};
use item::Item;

/// Query rows per work item.
const QUERY_BLOCK: usize = 16;
/// Most work rows (query row × head) of one register tile.
const TILE_MAX: usize = 8;
/// About the fewest keys per part of a split context (a part's fixed cost stays small
/// beside it; parts take equal numbers of whole pages).
const MIN_SPLIT_KEYS: usize = 256;

/// What shapes each query row's softmax.
#[derive(Debug, Clone, Copy)]
pub struct Softmax<'a> {
    /// Sliding window: each row attends to its last `window` positions only.
    pub window: Option<usize>,
    pub scores: ScoreSpec,
    /// One logit per query head that joins the denominator and weighs no value.
    pub sinks: Option<&'a [f32]>,
}

/// Writes K/V of every row to its slot, then `out[t, q heads] = softmax(s(q kᵀ)) v` with
/// the logits `s` as `softmax.scores` says, over positions `0..=pos(t)` of the row's
/// sequence, or with a `window` over its last `window` of them
/// (`pos(t) - window < k <= pos(t)`); a head's sink adds `exp(sink)` to its denominator.
/// Runs the kernel set `isa` (one this CPU runs, or an error), splitting contexts for
/// `threads` threads.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    qkv: &[f32],
    layout: QkvLayout,
    softmax: Softmax<'_>,
    cache: &mut CpuKvCache,
    seqs: &[AttnSeq<'_>],
    slots: &[usize],
    out: &mut [f32],
    threads: usize,
    isa: Isa,
) -> anyhow::Result<()> {
    ensure!(isa.runs_here(), "attention: this CPU does not run {isa:?}");
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
    if let Some(sinks) = softmax.sinks {
        ensure!(
            sinks.len() == layout.num_heads,
            "attention: {} sinks for {} heads",
            sinks.len(),
            layout.num_heads
        );
    }
    cache.write(qkv, layout, slots)?;
    let mut items = work_items(seqs, layout, softmax.window, slots.len(), cache)?;
    let splits = split_contexts(&mut items, cache.block_size, threads);
    let group = layout.group_size();
    let part_len = group * (layout.head_dim + 2);
    let mut partials = vec![0.0f32; splits.iter().map(|s| s.parts).sum::<usize>() * part_len];
    let run = Run {
        qkv,
        layout,
        softmax,
        cache: &*cache,
        seqs,
        out: SendPtr(out.as_mut_ptr()),
        partials: SendPtr(partials.as_mut_ptr()),
    };
    match &cache.store {
        KvStore::F16 { k, v } => run.items(&items, k, v, isa),
        KvStore::F32 { k, v } => run.items(&items, k, v, isa),
    }
    for split in &splits {
        let parts = &partials[split.first * part_len..(split.first + split.parts) * part_len];
        merge_parts(parts, split, layout, softmax.sinks, &seqs[split.seq], out);
    }
    Ok(())
}

/// One item per (sequence, KV head, block of query rows), over the causal context from the
/// page that holds its first row's earliest key in the `window` (every key without one);
/// checks that each sequence's rows are in the batch of `rows` and its block table fits.
fn work_items(
    seqs: &[AttnSeq<'_>],
    layout: QkvLayout,
    window: Option<usize>,
    rows: usize,
    cache: &CpuKvCache,
) -> anyhow::Result<Vec<Work>> {
    let mut items = Vec::new();
    for (si, s) in seqs.iter().enumerate() {
        ensure!(
            s.row_start + s.n_tokens <= rows,
            "sequence {si} rows are past the batch"
        );
        check_block_table(
            s.block_table,
            earliest_key(s.start_pos, window),
            s.start_pos + s.n_tokens,
            cache.block_size,
            cache.num_blocks,
        )
        .map_err(|e| anyhow!("sequence {si}: {e}"))?;
        for h in 0..layout.num_kv_heads {
            for q0 in (0..s.n_tokens).step_by(QUERY_BLOCK) {
                let q1 = (q0 + QUERY_BLOCK).min(s.n_tokens);
                let earliest = earliest_key(s.start_pos + q0, window);
                let first = earliest - earliest % cache.block_size;
                items.push(Work {
                    seq: si,
                    kv_head: h,
                    q0,
                    q1,
                    keys: (first, s.start_pos + q1),
                    partial: None,
                });
            }
        }
    }
    Ok(items)
}

/// The earliest position a query at `pos` attends to.
fn earliest_key(pos: usize, window: Option<usize>) -> usize {
    window.map_or(0, |w| (pos + 1).saturating_sub(w))
}

/// A work item: query rows `q0..q1` of sequence `seq`, the query heads of `kv_head`,
/// against the keys at positions `keys.0..keys.1`. `partial`: the item is part `i` of a
/// split context, and leaves its unnormalised rows in part `i` of the partials buffer.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Work {
    seq: usize,
    kv_head: usize,
    q0: usize,
    q1: usize,
    keys: (usize, usize),
    partial: Option<usize>,
}

/// A decode row's context split into parts `first..first + parts` of the partials buffer.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Split {
    seq: usize,
    kv_head: usize,
    q0: usize,
    first: usize,
    parts: usize,
}

/// With fewer items than twice the threads, splits each single-row item's context into
/// page-aligned parts of about equal size (about [`MIN_SPLIT_KEYS`] keys or more), enough
/// for about two items per thread; returns the splits (their parts in `items`).
fn split_contexts(items: &mut Vec<Work>, block_size: usize, threads: usize) -> Vec<Split> {
    let mut splits = Vec::new();
    if items.is_empty() || items.len() >= 2 * threads {
        return splits;
    }
    let want = (2 * threads).div_ceil(items.len());
    let mut out = Vec::with_capacity(items.len() * want);
    let mut next = 0;
    for w in items.drain(..) {
        let (start, ctx) = w.keys;
        let first_page = start / block_size;
        let pages = ctx.div_ceil(block_size) - first_page;
        let parts = want.min((ctx - start) / MIN_SPLIT_KEYS).min(pages);
        if w.q1 - w.q0 > 1 || parts < 2 {
            out.push(w);
            continue;
        }
        let first = next;
        for i in 0..parts {
            let (p0, p1) = (
                first_page + i * pages / parts,
                first_page + (i + 1) * pages / parts,
            );
            out.push(Work {
                keys: (p0 * block_size, (p1 * block_size).min(ctx)),
                partial: Some(next),
                ..w
            });
            next += 1;
        }
        splits.push(Split {
            seq: w.seq,
            kv_head: w.kv_head,
            q0: w.q0,
            first,
            parts: next - first,
        });
    }
    *items = out;
    splits
}

/// Combines a split's parts (each per work row: `head_dim` unnormalised outputs, then per
/// row the part's max score and sum of `exp(score − max)`) into the row's output. A head's
/// sink is one more part: its logit is its max, its sum 1, its values none.
fn merge_parts(
    parts: &[f32],
    split: &Split,
    layout: QkvLayout,
    sinks: Option<&[f32]>,
    seq: &AttnSeq<'_>,
    out: &mut [f32],
) {
    let (hd, group) = (layout.head_dim, layout.group_size());
    let part_len = group * (hd + 2);
    let t = seq.row_start + split.q0;
    for w in 0..group {
        let stat = |p: &[f32], i: usize| p[group * hd + i * group + w];
        let qh = split.kv_head * group + w;
        let sink = sinks.map(|s| s[qh]);
        let max = parts
            .chunks_exact(part_len)
            .fold(sink.unwrap_or(f32::NEG_INFINITY), |m, p| m.max(stat(p, 0)));
        let dst = &mut out[(t * layout.num_heads + qh) * hd..][..hd];
        dst.fill(0.0);
        let mut total = sink.map_or(0.0, |s| (s - max).exp());
        for p in parts.chunks_exact(part_len) {
            let weight = (stat(p, 0) - max).exp();
            total += weight * stat(p, 1);
            for (o, &v) in dst.iter_mut().zip(&p[w * hd..(w + 1) * hd]) {
                *o += weight * v;
            }
        }
        let inv = 1.0 / total;
        dst.iter_mut().for_each(|o| *o *= inv);
    }
}

/// What every work item of one attention call shares.
#[derive(Clone, Copy)]
struct Run<'a> {
    qkv: &'a [f32],
    layout: QkvLayout,
    softmax: Softmax<'a>,
    cache: &'a CpuKvCache,
    seqs: &'a [AttnSeq<'a>],
    out: SendPtr<f32>,
    /// The split contexts' parts (see [`merge_parts`]).
    partials: SendPtr<f32>,
}

impl Run<'_> {
    /// Runs the items in parallel on the cache's `k` / `v`.
    fn items<E: Elem>(&self, items: &[Work], k: &[E], v: &[E], isa: Isa) {
        items.par_iter().for_each(|&work| {
            let job = Item {
                run: *self,
                k,
                v,
                seq: &self.seqs[work.seq],
                work,
            };
            // SAFETY: an item writes only the output columns of the query heads of its KV
            // head in rows of its own query block, or its own part of the partials buffer:
            // disjoint across items. `attention` checked that this CPU runs `isa`.
            unsafe { job.run(isa) };
        });
    }
}

#[cfg(test)]
mod tests;
