//! One work item of the attention: its scores, softmax and weighted values, written once
//! over the CPU's vector lanes.

use super::super::lanes::{dispatch, Kernel, Lanes};
use super::super::simd::{fast_exp, sum, Elem, Isa};
use super::{earliest_key, Run, Work, KEYS, TILE_MAX};
use crate::backend::{AttnSeq, QkvLayout, ScoreSpec};

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

/// One work item on the cache's values.
pub(super) struct Item<'a, E> {
    pub(super) run: Run<'a>,
    pub(super) k: &'a [E],
    pub(super) v: &'a [E],
    pub(super) seq: &'a AttnSeq<'a>,
    pub(super) work: Work,
}

impl<E: Elem> Item<'_, E> {
    /// # Safety
    /// No other thread writes this item's output region; `isa` is one this CPU runs.
    pub(super) unsafe fn run(&self, isa: Isa) {
        dispatch(isa, self);
    }
}

impl<E: Elem> Kernel for &Item<'_, E> {
    type Output = ();

    /// Work rows per tile: half the lanes of a register (AVX-512: 8 rows × one register of
    /// 16 accumulators, AVX2: 4 rows × two registers of 8, so 8 accumulator registers; plain:
    /// 4 rows of 16 lanes, 16 SSE registers).
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
