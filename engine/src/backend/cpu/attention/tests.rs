use half::f16;

use super::*;
use crate::backend::KvCacheShape;

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

/// A cache of `num_blocks` blocks of `block_size` tokens.
fn shape(
    num_blocks: usize,
    block_size: usize,
    num_kv_heads: usize,
    head_dim: usize,
) -> KvCacheShape {
    KvCacheShape {
        num_blocks,
        block_size,
        num_kv_heads,
        head_dim,
    }
}

/// Rows `rows` of the one sequence whose rows are all of `qkv`, attended on `threads`
/// threads with `isa`'s kernels; the sequence's blocks are `table`, which maps its
/// positions to the same slots (`table[i] = i`).
fn attend_rows(
    qkv: &[f32],
    rows: std::ops::Range<usize>,
    softmax: Softmax<'_>,
    cache: &mut CpuKvCache,
    table: &[u32],
    (threads, isa): (usize, Isa),
) -> Vec<f32> {
    let width = LAYOUT.qkv_width();
    let seq = AttnSeq {
        row_start: 0,
        n_tokens: rows.len(),
        start_pos: rows.start,
        block_table: table,
    };
    let slots: Vec<usize> = rows.clone().collect();
    let mut out = vec![0.0; rows.len() * LAYOUT.q_width()];
    let x = &qkv[rows.start * width..rows.end * width];
    attention(
        x,
        LAYOUT,
        softmax,
        cache,
        &[seq],
        &slots,
        &mut out,
        threads,
        isa,
    )
    .unwrap();
    out
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
        let mut cache = CpuKvCache::new(dtype, shape(16, bs, 2, hd)).unwrap();
        let seq_a = AttnSeq {
            row_start: 0,
            n_tokens: 20,
            start_pos: 0,
            block_table: &table_a,
        };
        let slots: Vec<usize> = (0..20).collect();
        let mut out = vec![0.0; 20 * layout.q_width()];
        attention(
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
        attention(
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
            let mut cache = CpuKvCache::new(dtype, shape(table.len(), 16, 2, 32)).unwrap();
            let scores = plain(None, LAYOUT.head_dim);
            attend_rows(&qkv, 0..n - 1, scores, &mut cache, &table, (4, isa));
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
            let out = attend_rows(&qkv, n - 1..n, scores, &mut cache, &table, (4, isa));
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
        let mut cache = CpuKvCache::new(dtype, shape(table.len(), 16, 2, 32)).unwrap();
        // Two prefill chunks (rows 0..600, then 600..1100), then the decode of row 1100.
        for (start, end, threads) in [(0, 600, 1), (600, n - 1, 2), (n - 1, n, 4)] {
            let softmax = plain(Some(window), LAYOUT.head_dim);
            let rows = start..end;
            let out = attend_rows(&qkv, rows, softmax, &mut cache, &table, (threads, isa));
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
        let mut cache = CpuKvCache::new(KvCacheDtype::F32, shape(1, 16, 2, 32)).unwrap();
        let softmax = Softmax {
            sinks: Some(&sinks),
            ..plain(None, LAYOUT.head_dim)
        };
        let out = attend_rows(&qkv, 0..2, softmax, &mut cache, &table, (1, isa));
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
        let mut cache = CpuKvCache::new(KvCacheDtype::F32, shape(table.len(), 16, 2, 32)).unwrap();
        for (start, end, threads) in [(0, n - 1, 2), (n - 1, n, 4)] {
            let rows = start..end;
            let out = attend_rows(&qkv, rows, softmax, &mut cache, &table, (threads, isa));
            for t in [0, 1, 17, 350, n - 2, n - 1] {
                if (start..end).contains(&t) {
                    let row = &out[(t - start) * LAYOUT.q_width()..][..LAYOUT.q_width()];
                    let what = format!("{isa:?} row {t}");
                    assert_like_reference(&hist[..=t], row, KvCacheDtype::F32, Some(&sinks), &what);
                }
            }
        }
    }
}

#[test]
fn head_dims_the_kernels_cannot_tile_are_refused() {
    let err = CpuKvCache::new(KvCacheDtype::F16, shape(4, 16, 2, 40))
        .unwrap_err()
        .to_string();
    assert!(err.contains("(got 40)"), "{err}");
}
