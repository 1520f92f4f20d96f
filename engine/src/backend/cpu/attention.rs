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
use half::f16;
use half::vec::HalfBitsVecExt;
use rayon::prelude::*;

use super::lanes::{dispatch, Kernel, Lanes};
use super::simd::{fast_exp, sum, Elem, Isa, SendPtr};
use crate::backend::{check_block_table, AttnSeq, QkvLayout, ScoreSpec};

/// Query rows per work item.
const QUERY_BLOCK: usize = 16;
/// Keys per score vector (and dimensions per output vector).
const KEYS: usize = 16;
/// Most work rows (query row × head) of one register tile.
const TILE_MAX: usize = 8;
/// About the fewest keys per part of a split context (a part's fixed cost stays small
/// beside it; parts take equal numbers of whole pages).
const MIN_SPLIT_KEYS: usize = 256;

/// `$body` with the const `$n` equal to `$rows` (1 to [`TILE_MAX`]): a tile of any
/// height runs the kernel instantiated for it.
macro_rules! with_rows {
    ($rows:expr, $n:ident => $body:expr) => {
        match $rows {
            1 => with_rows!(@ 1, $n => $body),
            2 => with_rows!(@ 2, $n => $body),
            3 => with_rows!(@ 3, $n => $body),
            4 => with_rows!(@ 4, $n => $body),
            5 => with_rows!(@ 5, $n => $body),
            6 => with_rows!(@ 6, $n => $body),
            7 => with_rows!(@ 7, $n => $body),
            _ => with_rows!(@ 8, $n => $body),
        }
    };
    (@ $v:literal, $n:ident => $body:expr) => {{
        const $n: usize = $v;
        $body
    }};
}

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
enum KvStore {
    F16 { k: Vec<f16>, v: Vec<f16> },
    F32 { k: Vec<f32>, v: Vec<f32> },
}

/// One layer's paged K/V storage.
#[derive(Debug)]
pub struct CpuKvCache {
    store: KvStore,
    num_blocks: usize,
    block_size: usize,
    num_kv_heads: usize,
    head_dim: usize,
}

impl CpuKvCache {
    /// Zero-filled cache (calloc'd, so untouched blocks cost no memory).
    pub fn new(
        dtype: KvCacheDtype,
        num_blocks: usize,
        block_size: usize,
        num_kv_heads: usize,
        head_dim: usize,
    ) -> anyhow::Result<Self> {
        ensure!(
            head_dim.is_multiple_of(KEYS),
            "the CPU backend needs a head dimension that is a multiple of {KEYS} (got {head_dim})"
        );
        let len = num_blocks
            .checked_mul(block_size)
            .and_then(|v| v.checked_mul(num_kv_heads * head_dim))
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "KV cache size overflows: {num_blocks} blocks of {block_size} tokens"
                )
            })?;
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
            num_blocks,
            block_size,
            num_kv_heads,
            head_dim,
        })
    }

    /// Offset of (block, head, offset-in-block) in `v`, and of (block, head) in `k`.
    fn index(&self, block: usize, head: usize, off: usize) -> usize {
        ((block * self.num_kv_heads + head) * self.block_size + off) * self.head_dim
    }

    /// Copies the K and V parts of every row of `qkv` to the row's slot.
    fn write(&mut self, qkv: &[f32], layout: QkvLayout, slots: &[usize]) -> anyhow::Result<()> {
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
pub fn attention(
    qkv: &[f32],
    layout: QkvLayout,
    softmax: Softmax<'_>,
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
    if let Some(sinks) = softmax.sinks {
        ensure!(
            sinks.len() == layout.num_heads,
            "attention: {} sinks for {} heads",
            sinks.len(),
            layout.num_heads
        );
    }
    let threads = rayon::current_num_threads();
    attention_with(
        qkv,
        layout,
        softmax,
        cache,
        seqs,
        slots,
        out,
        threads,
        Isa::detect(),
    )
}

/// [`attention`] with the kernel set `isa`, splitting contexts for `threads` threads.
#[allow(clippy::too_many_arguments)]
fn attention_with(
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
            // disjoint across items. `isa` was detected.
            unsafe { job.run(isa) };
        });
    }
}

/// One work item on the cache's values.
struct Item<'a, E> {
    run: Run<'a>,
    k: &'a [E],
    v: &'a [E],
    seq: &'a AttnSeq<'a>,
    work: Work,
}

impl<E: Elem> Item<'_, E> {
    /// # Safety
    /// No other thread writes this item's output region; `isa` is one this CPU runs.
    unsafe fn run(&self, isa: Isa) {
        dispatch(isa, self);
    }
}

impl<E: Elem> Kernel for &Item<'_, E> {
    type Output = ();

    /// Work rows per tile: half the lanes of a register (AVX-512: 8 rows × one register of
    /// 16 accumulators; AVX2 and plain: 4 rows × two registers of 8): 8 accumulator
    /// registers.
    #[inline(always)]
    unsafe fn run<L: Lanes>(self) {
        self.compute::<L>(L::N / 2);
    }
}

impl<E: Elem> Item<'_, E> {
    #[inline(always)]
    unsafe fn compute<L: Lanes>(&self, tile_rows: usize) {
        let QkvLayout {
            num_heads,
            head_dim: hd,
            ..
        } = self.run.layout;
        let group = self.run.layout.group_size();
        let width = self.run.layout.qkv_width();
        let bs = self.run.cache.block_size;
        let ScoreSpec { scale, softcap } = self.run.softmax.scores;
        let Work {
            kv_head,
            q0,
            q1,
            keys: (k0, k1),
            partial,
            ..
        } = self.work;
        // Work rows: (query row, head of the group), row-major; their q and output rows (or,
        // for a part of a split context, its rows in the partials buffer, then its stats).
        let rows = (q1 - q0) * group;
        let part = partial.map(|i| self.run.partials.get().add(i * rows * (hd + 2)));
        let mut q_rows = Vec::with_capacity(rows);
        let mut out_rows = Vec::with_capacity(rows);
        for w in 0..rows {
            let t = self.seq.row_start + q0 + w / group;
            let qh = kv_head * group + w % group;
            q_rows.push(self.run.qkv.as_ptr().add(t * width + qh * hd));
            out_rows.push(match part {
                Some(p) => p.add(w * hd),
                None => self.run.out.get().add(t * num_heads * hd + qh * hd),
            });
        }
        let first_page = k0 / bs;
        let pages: Vec<Page<E>> = self.seq.block_table[first_page..k1.div_ceil(bs)]
            .iter()
            .enumerate()
            .map(|(i, &block)| {
                let at = self.run.cache.index(block as usize, kv_head, 0);
                let first = (first_page + i) * bs;
                Page {
                    k: self.k.as_ptr().add(at),
                    v: self.v.as_ptr().add(at),
                    first: first - k0,
                    n: bs.min(k1 - first),
                }
            })
            .collect();

        // scores[w][j] = q_w · k_j / √d for every key of the item (16 keys per vector).
        let span = k1 - k0;
        let mut scores = vec![0.0f32; rows * span];
        let mut padded = vec![E::from_f32(0.0); hd * KEYS];
        for page in &pages {
            for c in (0..page.n).step_by(KEYS) {
                let n = KEYS.min(page.n - c);
                // 16 keys straight from the page, or copied out where the page ends first.
                let (keys, stride) = if c + KEYS <= bs {
                    (page.k.add(c), bs)
                } else {
                    for d in 0..hd {
                        for l in 0..n {
                            padded[d * KEYS + l] = *page.k.add(d * bs + c + l);
                        }
                    }
                    (padded.as_ptr(), KEYS)
                };
                let mut w = 0;
                while w < rows {
                    let r = tile_rows.min(rows - w);
                    let mut tile = [[0.0f32; KEYS]; TILE_MAX];
                    with_rows!(r, N => tile[..N].copy_from_slice(&scores_tile::<L, E, N>(
                        &std::array::from_fn(|i| q_rows[w + i]),
                        keys,
                        stride,
                        hd
                    )));
                    for (i, acc) in tile[..r].iter().enumerate() {
                        let dst = &mut scores[(w + i) * span + page.first + c..][..n];
                        match softcap {
                            None => {
                                for (s, &v) in dst.iter_mut().zip(acc) {
                                    *s = v * scale;
                                }
                            }
                            Some(cap) => {
                                for (s, &v) in dst.iter_mut().zip(acc) {
                                    *s = cap * (v * scale / cap).tanh();
                                }
                            }
                        }
                    }
                    w += r;
                }
            }
        }
        // Softmax over each row's own causal context (within its window) among the item's
        // keys, its head's sink in the denominator; other keys get probability 0. A part of
        // a split context keeps its max and sum instead (the sink joins at the merge).
        // Every part holds at least one key of the row's window: the item's keys start on
        // the page of its first row's earliest key.
        for w in 0..rows {
            let pos = self.seq.start_pos + q0 + w / group;
            let ctx = (pos + 1).min(k1) - k0;
            let lo = earliest_key(pos, self.run.softmax.window).max(k0) - k0;
            let s = &mut scores[w * span..(w + 1) * span];
            let sink = match part {
                None => self
                    .run
                    .softmax
                    .sinks
                    .map(|s| s[kv_head * group + w % group]),
                Some(_) => None,
            };
            let max = s[lo..ctx]
                .iter()
                .fold(sink.unwrap_or(f32::NEG_INFINITY), |m, &v| m.max(v));
            for v in s[lo..ctx].iter_mut() {
                *v = fast_exp(*v - max);
            }
            let kept = if L::FMA {
                sum::<true>(&s[lo..ctx])
            } else {
                sum::<false>(&s[lo..ctx])
            };
            let total = kept + sink.map_or(0.0, |s| fast_exp(s - max));
            match part {
                Some(p) => {
                    *p.add(rows * hd + w) = max;
                    *p.add(rows * hd + rows + w) = total;
                }
                None => {
                    let inv = 1.0 / total;
                    for v in s[lo..ctx].iter_mut() {
                        *v *= inv;
                    }
                }
            }
            s[..lo].fill(0.0);
            s[ctx..].fill(0.0);
        }
        // out = P·V, 16 dimensions of R work rows per tile.
        let mut w = 0;
        while w < rows {
            let r = tile_rows.min(rows - w);
            let p = |i: usize| scores.as_ptr().add((w + i) * span);
            for d0 in (0..hd).step_by(KEYS) {
                let mut tile = [[0.0f32; KEYS]; TILE_MAX];
                with_rows!(r, N => tile[..N].copy_from_slice(&weighted_values_tile::<L, E, N>(
                    &std::array::from_fn(p),
                    &pages,
                    hd,
                    d0
                )));
                for (i, acc) in tile[..r].iter().enumerate() {
                    std::ptr::copy_nonoverlapping(acc.as_ptr(), out_rows[w + i].add(d0), KEYS);
                }
            }
            w += r;
        }
    }
}

/// One cache page of the item: `kᵀ` (`[head_dim][block_size]`) and `v` of one KV head.
struct Page<E> {
    k: *const E,
    v: *const E,
    /// Position of the page's first key counted from the item's first key: its index in a
    /// row of the item's scores and probabilities.
    first: usize,
    /// Keys of the page inside the item's context.
    n: usize,
}

/// Scores of `R` work rows against 16 keys whose `kᵀ` rows are `stride` apart.
///
/// # Safety
/// Each `q` has `hd` values; `keys + d·stride .. + 16` is readable for every `d < hd`;
/// the CPU runs `L`'s instructions.
#[inline(always)]
unsafe fn scores_tile<L: Lanes, E: Elem, const R: usize>(
    q: &[*const f32; R],
    keys: *const E,
    stride: usize,
    hd: usize,
) -> [[f32; KEYS]; R] {
    let mut acc = [L::zero16(); R];
    for d in 0..hd {
        let k = L::load16(keys.add(d * stride));
        for (a, qr) in acc.iter_mut().zip(q) {
            *a = L::splat_fmadd16(*qr.add(d), k, *a);
        }
    }
    let mut out = [[0.0f32; KEYS]; R];
    for (o, a) in out.iter_mut().zip(&acc) {
        L::store16(o.as_mut_ptr(), *a);
    }
    out
}

/// `Σ_j p[j]·v_j[d0..d0 + 16]` for `R` rows of probabilities over the item's pages.
///
/// # Safety
/// Each `p` row covers every key of `pages`; `d0 + 16 <= hd`; the CPU runs `L`'s
/// instructions.
#[inline(always)]
unsafe fn weighted_values_tile<L: Lanes, E: Elem, const R: usize>(
    p: &[*const f32; R],
    pages: &[Page<E>],
    hd: usize,
    d0: usize,
) -> [[f32; KEYS]; R] {
    let mut acc = [L::zero16(); R];
    for page in pages {
        for o in 0..page.n {
            let v = L::load16(page.v.add(o * hd + d0));
            for (a, pr) in acc.iter_mut().zip(p) {
                *a = L::splat_fmadd16(*pr.add(page.first + o), v, *a);
            }
        }
    }
    let mut out = [[0.0f32; KEYS]; R];
    for (o, a) in out.iter_mut().zip(&acc) {
        L::store16(o.as_mut_ptr(), *a);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scores of heads `head_dim` wide: `q·k / √d`, no cap, no sinks, over `window`.
    fn plain(window: Option<usize>, head_dim: usize) -> Softmax<'static> {
        Softmax {
            window,
            scores: ScoreSpec {
                scale: 1.0 / (head_dim as f32).sqrt(),
                softcap: None,
            },
            sinks: None,
        }
    }

    /// A K or V value as a cache of `dtype` holds it.
    fn as_cached(x: f32, dtype: KvCacheDtype) -> f64 {
        match dtype {
            KvCacheDtype::F16 => f64::from(f16::from_f32(x).to_f32()),
            KvCacheDtype::F32 => f64::from(x),
        }
    }

    /// Every kernel set and cache type against plain f64 attention on the cached keys and
    /// values: a prefix of 20 tokens, then one decode row of that sequence beside a 37-token
    /// prefill of another (pages split mid-way, a partial last page, GQA groups of two),
    /// with pages of 16 tokens and of sizes that are not multiples of the 16-key vectors.
    #[test]
    fn every_kernel_set_matches_plain_attention() {
        let layout = QkvLayout {
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 32,
        };
        let (width, hd) = (layout.qkv_width(), 32);
        let mut seed = 1u64;
        let mut rand = move || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        let first: Vec<f32> = (0..20 * width).map(|_| rand()).collect();
        let second: Vec<f32> = (0..38 * width).map(|_| rand()).collect();
        let cases = Isa::available().into_iter().flat_map(|i| {
            [(i, 16), (i, 12), (i, 24)]
                .into_iter()
                .flat_map(|(i, bs)| [KvCacheDtype::F16, KvCacheDtype::F32].map(|t| (i, bs, t)))
        });
        for (isa, bs, dtype) in cases {
            // Pages of `bs` tokens: 20 + 1 tokens in table_a, 37 in table_b.
            let table_a: Vec<u32> = (0..21u32.div_ceil(bs as u32)).collect();
            let table_b: Vec<u32> = (8..8 + 37u32.div_ceil(bs as u32)).rev().collect();
            let mut cache = CpuKvCache::new(dtype, 16, bs, 2, hd).unwrap();
            let seq_a = AttnSeq {
                row_start: 0,
                n_tokens: 20,
                start_pos: 0,
                block_table: &table_a,
            };
            let slots: Vec<usize> = (0..20).collect();
            let mut out = vec![0.0; 20 * layout.q_width()];
            attention_with(
                &first,
                layout,
                plain(None, hd),
                &mut cache,
                &[seq_a],
                &slots,
                &mut out,
                1,
                isa,
            )
            .unwrap();
            let seqs = [
                AttnSeq {
                    row_start: 0,
                    n_tokens: 1,
                    start_pos: 20,
                    block_table: &table_a,
                },
                AttnSeq {
                    row_start: 1,
                    n_tokens: 37,
                    start_pos: 0,
                    block_table: &table_b,
                },
            ];
            let mut slots = vec![table_a[20 / bs] as usize * bs + 20 % bs];
            slots.extend((0..37).map(|p| table_b[p / bs] as usize * bs + p % bs));
            let mut out2 = vec![0.0; 38 * layout.q_width()];
            attention_with(
                &second,
                layout,
                plain(None, hd),
                &mut cache,
                &seqs,
                &slots,
                &mut out2,
                1,
                isa,
            )
            .unwrap();
            // (rows of qkv holding the sequence's history, row to check, its output)
            let history_a: Vec<&[f32]> = first
                .chunks(width)
                .chain(second.chunks(width).take(1))
                .collect();
            let history_b: Vec<&[f32]> = second.chunks(width).skip(1).collect();
            let mut checks = vec![];
            for t in 0..20 {
                checks.push((&history_a[..=t], &out[t * 128..(t + 1) * 128]));
            }
            checks.push((&history_a[..], &out2[..128]));
            for t in 0..37 {
                checks.push((&history_b[..=t], &out2[(t + 1) * 128..(t + 2) * 128]));
            }
            for (ci, (hist, got)) in checks.iter().enumerate() {
                assert_like_plain(hist, got, dtype, &format!("{isa:?} {dtype:?} check {ci}"));
            }
        }
    }

    /// The layout of the tests: 4 query heads in groups of 2 over 2 KV heads of 32 values.
    const LAYOUT: QkvLayout = QkvLayout {
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 32,
    };

    /// Checks the output of the last row of `hist` (rows of qkv, the sequence so far)
    /// against f64 attention on the keys and values as a cache of `dtype` holds them.
    fn assert_like_plain(hist: &[&[f32]], got: &[f32], dtype: KvCacheDtype, what: &str) {
        assert_like_reference(hist, got, dtype, None, what);
    }

    /// [`assert_like_plain`] with a sink per head in each softmax's denominator.
    fn assert_like_reference(
        hist: &[&[f32]],
        got: &[f32],
        dtype: KvCacheDtype,
        sinks: Option<&[f32]>,
        what: &str,
    ) {
        let (hd, group) = (LAYOUT.head_dim, LAYOUT.group_size());
        let (k_at, v_at) = (LAYOUT.q_width(), LAYOUT.q_width() + LAYOUT.kv_width());
        let q_row = hist[hist.len() - 1];
        for h in 0..LAYOUT.num_heads {
            let kvh = h / group;
            let q = &q_row[h * hd..(h + 1) * hd];
            let scores: Vec<f64> = hist
                .iter()
                .map(|r| {
                    let k = &r[k_at + kvh * hd..k_at + (kvh + 1) * hd];
                    q.iter()
                        .zip(k)
                        .map(|(a, b)| f64::from(*a) * as_cached(*b, dtype))
                        .sum::<f64>()
                        / (hd as f64).sqrt()
                })
                .collect();
            let sink = sinks.map(|s| f64::from(s[h]));
            let max = scores
                .iter()
                .cloned()
                .fold(sink.unwrap_or(f64::NEG_INFINITY), f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - max).exp());
            for d in 0..hd {
                let want: f64 = hist
                    .iter()
                    .zip(&e)
                    .map(|(r, p)| p / total * as_cached(r[v_at + kvh * hd + d], dtype))
                    .sum();
                let g = got[h * hd + d];
                assert!(
                    (f64::from(g) - want).abs() < 1e-5,
                    "{what} head {h} dim {d}: {g} vs {want}"
                );
            }
        }
    }

    /// Parts are page-aligned, cover the context once, and only single-row items split.
    #[test]
    fn contexts_split_into_page_aligned_parts() {
        let work = |seq, q0, q1, ctx| Work {
            seq,
            kv_head: 0,
            q0,
            q1,
            keys: (0, ctx),
            partial: None,
        };
        // One decode row over 1000 keys on 4 threads: 8 wanted, 1000 / 256 = 3 parts.
        let mut items = vec![work(0, 0, 1, 1000)];
        let splits = split_contexts(&mut items, 16, 4);
        let ranges: Vec<_> = items.iter().map(|w| (w.keys, w.partial)).collect();
        assert_eq!(
            ranges,
            [
                ((0, 336), Some(0)),
                ((336, 672), Some(1)),
                ((672, 1000), Some(2))
            ]
        );
        assert_eq!(
            splits,
            [Split {
                seq: 0,
                kv_head: 0,
                q0: 0,
                first: 0,
                parts: 3
            }]
        );
        // Parts take about equal numbers of pages: 513 keys in pages of 256 split 256 + 257.
        let mut items = vec![work(0, 0, 1, 513)];
        assert_eq!(split_contexts(&mut items, 256, 4).len(), 1);
        let keys: Vec<_> = items.iter().map(|w| w.keys).collect();
        assert_eq!(keys, [(0, 256), (256, 513)]);
        // A prefill block and a short context stay whole; enough items split nothing.
        let mut items = vec![work(0, 0, 16, 4000), work(1, 0, 1, 300)];
        assert!(split_contexts(&mut items, 16, 4).is_empty());
        assert_eq!(items, [work(0, 0, 16, 4000), work(1, 0, 1, 300)]);
        let mut items = vec![work(0, 0, 1, 4000); 8];
        assert!(split_contexts(&mut items, 16, 4).is_empty());
        assert_eq!(items.len(), 8);
    }

    /// `len` values uniform in [-2, 2) from a linear congruential stream seeded with `seed`.
    fn random_rows(len: usize, mut seed: u64) -> Vec<f32> {
        (0..len)
            .map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((seed >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
            })
            .collect()
    }

    /// One decoding sequence split for 4 threads: its 2 items split into 4 parts each (1,101
    /// keys over pages of 16), merged to plain attention, for every kernel set and cache type.
    #[test]
    fn a_split_context_merges_to_plain_attention() {
        let (width, n) = (LAYOUT.qkv_width(), 1101);
        let qkv = random_rows(n * width, 7);
        let table: Vec<u32> = (0..n.div_ceil(16) as u32).collect();
        for isa in Isa::available() {
            for dtype in [KvCacheDtype::F16, KvCacheDtype::F32] {
                let mut cache = CpuKvCache::new(dtype, table.len(), 16, 2, 32).unwrap();
                let prefill = AttnSeq {
                    row_start: 0,
                    n_tokens: n - 1,
                    start_pos: 0,
                    block_table: &table,
                };
                let slots: Vec<usize> = (0..n - 1).collect();
                let mut out = vec![0.0; (n - 1) * LAYOUT.q_width()];
                attention_with(
                    &qkv[..(n - 1) * width],
                    LAYOUT,
                    plain(None, LAYOUT.head_dim),
                    &mut cache,
                    &[prefill],
                    &slots,
                    &mut out,
                    4,
                    isa,
                )
                .unwrap();
                let decode = AttnSeq {
                    row_start: 0,
                    n_tokens: 1,
                    start_pos: n - 1,
                    block_table: &table,
                };
                // The decode step's two items split into four parts each on 4 threads.
                let mut items = work_items(&[decode], LAYOUT, None, 1, &cache).unwrap();
                let splits = split_contexts(&mut items, 16, 4);
                assert_eq!(splits.iter().map(|s| s.parts).collect::<Vec<_>>(), [4, 4]);
                let mut out = vec![0.0; LAYOUT.q_width()];
                let last = &qkv[(n - 1) * width..];
                attention_with(
                    last,
                    LAYOUT,
                    plain(None, LAYOUT.head_dim),
                    &mut cache,
                    &[decode],
                    &[n - 1],
                    &mut out,
                    4,
                    isa,
                )
                .unwrap();
                let hist: Vec<&[f32]> = qkv.chunks(width).collect();
                assert_like_plain(&hist, &out, dtype, &format!("{isa:?} {dtype:?}"));
            }
        }
    }

    /// A window of 520 keys (not a whole number of 16-key pages) over a 1,101-token
    /// sequence prefilled in two chunks, then decoded with its context split for 4 threads:
    /// every row equals plain attention over its last 520 positions, for every kernel set.
    #[test]
    fn a_sliding_window_attends_to_the_last_window_positions() {
        let (width, n, window) = (LAYOUT.qkv_width(), 1101, 520);
        let qkv = random_rows(n * width, 11);
        let hist: Vec<&[f32]> = qkv.chunks(width).collect();
        let last_window = |t: usize| &hist[(t + 1).saturating_sub(window)..=t];
        let table: Vec<u32> = (0..n.div_ceil(16) as u32).collect();
        for isa in Isa::available() {
            let dtype = KvCacheDtype::F32;
            let mut cache = CpuKvCache::new(dtype, table.len(), 16, 2, 32).unwrap();
            // Two prefill chunks (rows 0..600, then 600..1100), then the decode of row 1100.
            for (start, end, threads) in [(0, 600, 1), (600, n - 1, 2), (n - 1, n, 4)] {
                let seq = AttnSeq {
                    row_start: 0,
                    n_tokens: end - start,
                    start_pos: start,
                    block_table: &table,
                };
                let slots: Vec<usize> = (start..end).collect();
                let mut out = vec![0.0; (end - start) * LAYOUT.q_width()];
                attention_with(
                    &qkv[start * width..end * width],
                    LAYOUT,
                    plain(Some(window), LAYOUT.head_dim),
                    &mut cache,
                    &[seq],
                    &slots,
                    &mut out,
                    threads,
                    isa,
                )
                .unwrap();
                for t in [0, 10, 518, 519, 520, 521, 599, 600, 601, 999, n - 1] {
                    if (start..end).contains(&t) {
                        let row = &out[(t - start) * LAYOUT.q_width()..][..LAYOUT.q_width()];
                        assert_like_plain(last_window(t), row, dtype, &format!("{isa:?} row {t}"));
                    }
                }
            }
            // The decode's items start on the page of the window's first key, and split.
            let decode = AttnSeq {
                row_start: 0,
                n_tokens: 1,
                start_pos: n - 1,
                block_table: &table,
            };
            let mut items = work_items(&[decode], LAYOUT, Some(window), 1, &cache).unwrap();
            assert_eq!(items[0].keys, (576, n));
            assert!(!split_contexts(&mut items, 16, 4).is_empty());
            assert!(items.iter().all(|w| w.keys.0 >= 576 && w.keys.0 % 16 == 0));
        }
    }

    /// A hand-made case: queries of zeros score both keys 0, so a head whose sink is
    /// `ln 2` weighs each value by `1 / (1 + 1 + 2) = 1/4`: values of 1 and 3 give 1. A
    /// sink of −100 takes nothing (their mean, 2), one of `ln 6` leaves `4 / 8` = 0.5.
    #[test]
    fn a_sink_joins_the_denominator_and_weighs_no_value() {
        let width = LAYOUT.qkv_width();
        let v_at = LAYOUT.q_width() + LAYOUT.kv_width();
        let mut qkv = vec![0.0f32; 2 * width];
        for (t, value) in [(0, 1.0), (1, 3.0)] {
            qkv[t * width + v_at..(t + 1) * width].fill(value);
        }
        let sinks = [2f32.ln(), -100.0, 6f32.ln(), 0.0];
        let table = [0u32];
        for isa in Isa::available() {
            let mut cache = CpuKvCache::new(KvCacheDtype::F32, 1, 16, 2, 32).unwrap();
            let seq = AttnSeq {
                row_start: 0,
                n_tokens: 2,
                start_pos: 0,
                block_table: &table,
            };
            let mut out = vec![0.0; 2 * LAYOUT.q_width()];
            let softmax = Softmax {
                sinks: Some(&sinks),
                ..plain(None, LAYOUT.head_dim)
            };
            attention_with(
                &qkv,
                LAYOUT,
                softmax,
                &mut cache,
                &[seq],
                &[0, 1],
                &mut out,
                1,
                isa,
            )
            .unwrap();
            let row = &out[LAYOUT.q_width()..];
            // Head 3's sink of 0 weighs as a third key: (1 + 3) / 3.
            for (h, want) in [1.0, 2.0, 0.5, 4.0 / 3.0].into_iter().enumerate() {
                for &got in &row[h * 32..(h + 1) * 32] {
                    assert!(
                        (got - want).abs() < 1e-5,
                        "{isa:?} head {h}: {got} vs {want}"
                    );
                }
            }
            // The first row sees its own value only: 1 / (1 + e^sink).
            assert!((out[0] - 1.0 / 3.0).abs() < 1e-5, "{isa:?}: {}", out[0]);
        }
    }

    /// Sinks through a prefill of whole items and a decode whose context is split over
    /// four threads (the sink joins at the merge), against the f64 reference.
    #[test]
    fn sinks_hold_in_whole_and_split_contexts() {
        let (width, n) = (LAYOUT.qkv_width(), 700);
        let qkv = random_rows(n * width, 5);
        let hist: Vec<&[f32]> = qkv.chunks(width).collect();
        let sinks = [0.5f32, -1.0, 3.0, 1.5];
        let softmax = Softmax {
            sinks: Some(&sinks),
            ..plain(None, LAYOUT.head_dim)
        };
        let table: Vec<u32> = (0..n.div_ceil(16) as u32).collect();
        for isa in Isa::available() {
            let mut cache = CpuKvCache::new(KvCacheDtype::F32, table.len(), 16, 2, 32).unwrap();
            for (start, end, threads) in [(0, n - 1, 2), (n - 1, n, 4)] {
                let seq = AttnSeq {
                    row_start: 0,
                    n_tokens: end - start,
                    start_pos: start,
                    block_table: &table,
                };
                let slots: Vec<usize> = (start..end).collect();
                let mut out = vec![0.0; (end - start) * LAYOUT.q_width()];
                let rows = &qkv[start * width..end * width];
                attention_with(
                    rows,
                    LAYOUT,
                    softmax,
                    &mut cache,
                    &[seq],
                    &slots,
                    &mut out,
                    threads,
                    isa,
                )
                .unwrap();
                for t in [0, 1, 17, 350, n - 2, n - 1] {
                    if (start..end).contains(&t) {
                        let row = &out[(t - start) * LAYOUT.q_width()..][..LAYOUT.q_width()];
                        let what = format!("{isa:?} row {t}");
                        assert_like_reference(
                            &hist[..=t],
                            row,
                            KvCacheDtype::F32,
                            Some(&sinks),
                            &what,
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn head_dims_the_kernels_cannot_tile_are_refused() {
        let err = CpuKvCache::new(KvCacheDtype::F16, 4, 16, 2, 40)
            .unwrap_err()
            .to_string();
        assert!(err.contains("(got 40)"), "{err}");
    }
}
