//! How big the KV cache is, for every backend: bytes per token from the model's shape,
//! blocks from a byte budget, and what a sequence holds of them in each layer group.

use anyhow::{ensure, Context};

use crate::config::{AttentionSpan, Mixer, ModelConfig};
use crate::layer_groups::{GroupKind, LayerGroups, STATE_VALUE_BYTES};

/// How a runner sizes its KV cache and its RoPE tables.
#[derive(Debug, Clone, Copy)]
pub struct RunnerOptions {
    /// Tokens per KV block.
    pub block_size: usize,
    /// Memory budget for the KV cache in bytes; the runner allocates as many blocks as fit.
    pub kv_cache_bytes: usize,
    /// The longest sequence served (`--max-model-len`); `None`: the model's maximum
    /// position. The RoPE tables cover it, and LongRoPE picks its factors by it.
    pub max_model_len: Option<usize>,
}

/// KV-cache bytes per token if every layer keeps it (K and V of every layer, `value_bytes`
/// each): the unit a memory budget is counted in where layers keep no windows.
pub fn kv_bytes_per_token(config: &ModelConfig, value_bytes: usize) -> usize {
    config.num_layers() * kv_bytes_per_layer_token(config, value_bytes)
}

/// KV-cache bytes one layer keeps per token: K and V, `value_bytes` each.
pub fn kv_bytes_per_layer_token(config: &ModelConfig, value_bytes: usize) -> usize {
    2 * config.num_kv_heads * config.head_dim * value_bytes
}

/// Bytes a block of `block_size` tokens holds per layer: the unit a recurrent state is
/// counted in ([`LayerGroups::of`]).
pub fn layer_block_bytes(config: &ModelConfig, block_size: usize, value_bytes: usize) -> usize {
    block_size * kv_bytes_per_layer_token(config, value_bytes)
}

/// The largest `n` in `0..=upto` for which `fits(n)` holds, where `fits` holds up to some
/// point and not after (blocks needed grow with tokens); 0 when none does.
pub fn longest_fitting(upto: usize, fits: impl Fn(usize) -> bool) -> usize {
    if fits(upto) {
        return upto;
    }
    let (mut lo, mut hi) = (0, upto);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// The pool of KV blocks as the layer groups draw on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvPool {
    pub num_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    pub groups: Vec<GroupKind>,
}

impl KvPool {
    /// The most blocks a group keeps for one sequence of `tokens` tokens while it decodes:
    /// a full group one per block of tokens, a sliding group those its window spans
    /// (`⌈W / block⌉ + 1` at most), a recurrent group its state.
    pub fn group_blocks(&self, kind: GroupKind, tokens: usize) -> usize {
        let all = tokens.div_ceil(self.block_size);
        match kind {
            GroupKind::Full => all,
            GroupKind::Sliding { window } => all.min(window.div_ceil(self.block_size) + 1),
            GroupKind::Recurrent { blocks } => blocks,
        }
    }

    /// The most blocks one sequence of `tokens` tokens holds while it decodes.
    pub fn sequence_blocks(&self, tokens: usize) -> usize {
        self.groups
            .iter()
            .map(|&kind| self.group_blocks(kind, tokens))
            .sum()
    }

    /// The longest sequence the pool holds alone; `None` when every group's need is
    /// bounded (no full group), so any length fits once one fits.
    pub fn max_tokens_alone(&self) -> Option<usize> {
        let full = self
            .groups
            .iter()
            .filter(|&&k| k == GroupKind::Full)
            .count();
        let bounded = self.sequence_blocks(usize::MAX / 2);
        if full == 0 && bounded <= self.num_blocks {
            return None;
        }
        // `sequence_blocks` grows with the length, by at least one block per block of
        // tokens until it passes the pool.
        let fits = longest_fitting(self.num_blocks, |n| {
            self.sequence_blocks(n * self.block_size) <= self.num_blocks
        });
        Some(fits * self.block_size)
    }

    /// Tokens the pool holds in sequences of `len` tokens each (as many as fit, and the
    /// part of one more that the remaining blocks hold).
    pub fn capacity_tokens(&self, len: usize) -> usize {
        let per_sequence = self.sequence_blocks(len).max(1);
        let total = self.num_blocks as u128 * len as u128 / per_sequence as u128;
        usize::try_from(total).unwrap_or(usize::MAX)
    }
}

/// What the KV cache keeps of a sequence and what a decode step reads of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KvFootprint {
    /// Bytes one more token of a sequence's context costs: the full groups' blocks (a
    /// block holds a group's layers, padding included).
    pub bytes_per_token: usize,
    /// Bytes a decoding sequence holds whatever its length: its sliding groups' windows
    /// (`⌈W / block⌉ + 1` blocks each) and any recurrent state.
    pub bytes_per_sequence_fixed: usize,
    /// Bytes a decode step reads per token of its context in the layers that attend to
    /// all of it.
    pub read_bytes_per_token: usize,
    /// Per sliding window size `W`, the bytes per token its layers read of at most the last
    /// `W` tokens: `(W, bytes)`.
    pub window_read_bytes: Vec<(usize, usize)>,
    /// Bytes of the recurrent state (f32) a sequence's decode step reads and writes back,
    /// all recurrent layers together; 0 without them.
    pub state_bytes_per_sequence: usize,
    /// Bytes of one block of the pool: all its layers' K and V (or, held by a recurrent
    /// group, their state in the same memory).
    pub block_bytes: usize,
    /// Bytes of the pool a sequence's recurrent state takes (its groups' blocks), which
    /// is what each checkpoint of it in the prefix cache holds; 0 without them.
    pub state_checkpoint_bytes: usize,
}

impl KvFootprint {
    /// The footprint of `config`'s layers cached in `groups`, blocks of `block_size`
    /// tokens of `value_bytes` values.
    pub fn of(
        config: &ModelConfig,
        groups: &LayerGroups,
        block_size: usize,
        value_bytes: usize,
    ) -> KvFootprint {
        let layer_token_bytes = kv_bytes_per_layer_token(config, value_bytes);
        let block_bytes = groups.group_size * layer_token_bytes * block_size;
        let pool = KvPool {
            num_blocks: 0,
            block_size,
            groups: groups.kinds(),
        };
        let full_groups = pool
            .groups
            .iter()
            .filter(|&&k| k == GroupKind::Full)
            .count();
        let fixed_blocks: usize = pool
            .groups
            .iter()
            .filter(|&&k| k != GroupKind::Full)
            .map(|&k| pool.group_blocks(k, usize::MAX / 2))
            .sum();
        let state_blocks: usize = pool
            .groups
            .iter()
            .filter(|k| matches!(k, GroupKind::Recurrent { .. }))
            .map(|&k| pool.group_blocks(k, 0))
            .sum();
        let mut full_layers = 0;
        let mut window_read_bytes: Vec<(usize, usize)> = Vec::new();
        let mut state_bytes_per_sequence = 0;
        for layer in &config.layers {
            if let Mixer::GatedDeltaNet(spec) = layer.mixer {
                state_bytes_per_sequence += spec.state_values() * STATE_VALUE_BYTES;
                continue;
            }
            match layer.attention {
                AttentionSpan::Full => full_layers += 1,
                AttentionSpan::Sliding { window } => {
                    match window_read_bytes.iter_mut().find(|(w, _)| *w == window) {
                        Some((_, bytes)) => *bytes += layer_token_bytes,
                        None => window_read_bytes.push((window, layer_token_bytes)),
                    }
                }
            }
        }
        KvFootprint {
            bytes_per_token: full_groups * groups.group_size * layer_token_bytes,
            bytes_per_sequence_fixed: fixed_blocks * block_bytes,
            read_bytes_per_token: full_layers * layer_token_bytes,
            window_read_bytes,
            state_bytes_per_sequence,
            state_checkpoint_bytes: state_blocks * block_bytes,
            block_bytes,
        }
    }
}

impl RunnerOptions {
    /// The blocks of `block_size` tokens of `bytes_per_token` each that fit in the budget:
    /// at least one, or an error that says why not.
    pub fn num_blocks(&self, bytes_per_token: usize) -> anyhow::Result<usize> {
        ensure!(self.block_size > 0, "KV block size must be positive");
        ensure!(bytes_per_token > 0, "a KV-cache token must take some bytes");
        let block_bytes = bytes_per_token
            .checked_mul(self.block_size)
            .context("a KV block's bytes overflow")?;
        let num_blocks = self.kv_cache_bytes / block_bytes;
        ensure!(
            num_blocks >= 1,
            "KV cache budget of {} bytes is less than one block ({block_bytes} bytes for {} tokens)",
            self.kv_cache_bytes,
            self.block_size
        );
        Ok(num_blocks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_bytes_count_k_and_v_of_a_layer_and_of_every_layer() {
        let config = crate::config::test_llama();
        assert_eq!(kv_bytes_per_layer_token(&config, 2), 2 * 128 * 2);
        assert_eq!(kv_bytes_per_token(&config, 2), 2 * 2 * 128 * 2);
    }

    /// Gemma 3 270M's groups (five sliding over 512, one full) in blocks of 16: a 7,000-token
    /// sequence holds 438 full blocks and 33 per sliding group.
    #[test]
    fn a_sequence_holds_its_windows_and_every_full_block() {
        let mut groups = vec![GroupKind::Sliding { window: 512 }; 5];
        groups.push(GroupKind::Full);
        let pool = KvPool {
            num_blocks: 2000,
            block_size: 16,
            groups,
        };
        assert_eq!(pool.sequence_blocks(7000), 438 + 5 * 33);
        assert_eq!(pool.sequence_blocks(100), 6 * 7);
        // 2000 − 165 = 1835 full blocks: 29,360 tokens.
        assert_eq!(pool.max_tokens_alone(), Some(1835 * 16));
        assert_eq!(pool.capacity_tokens(7000), 2000 * 7000 / 603);
        let windows_only = KvPool {
            groups: vec![GroupKind::Sliding { window: 64 }],
            ..pool.clone()
        };
        assert_eq!(windows_only.max_tokens_alone(), None);
        let too_small = KvPool {
            num_blocks: 4,
            ..windows_only
        };
        assert_eq!(too_small.max_tokens_alone(), Some(64));
        let one_full = KvPool {
            num_blocks: 10,
            block_size: 4,
            groups: vec![GroupKind::Full, GroupKind::Recurrent { blocks: 3 }],
        };
        assert_eq!(one_full.max_tokens_alone(), Some(28));
    }

    #[test]
    fn a_budget_holds_whole_blocks_or_says_why_not() {
        let options = |block_size, kv_cache_bytes| RunnerOptions {
            block_size,
            kv_cache_bytes,
            max_model_len: None,
        };
        assert_eq!(options(16, 16 * 100 * 3).num_blocks(100).unwrap(), 3);
        assert_eq!(options(16, 16 * 100 * 3 - 1).num_blocks(100).unwrap(), 2);
        let below = options(16, 1599).num_blocks(100).unwrap_err().to_string();
        assert!(below.contains("less than one block"), "{below}");
        assert!(options(0, 1 << 20).num_blocks(100).is_err());
        assert!(options(16, 1 << 20).num_blocks(0).is_err());
    }

    /// Gemma 3 270M's pattern (every sixth of 18 layers full, the others over 512) with
    /// 1,024 bytes per layer and token: one more token costs the full group's 3 layers;
    /// each of the 5 sliding groups holds 33 blocks of 3 layers × 16 tokens; a decode reads
    /// 3 layers of the whole context and 15 of at most 512 tokens.
    #[test]
    fn a_footprint_counts_full_groups_per_token_and_windows_per_sequence() {
        let mut config = crate::config::test_llama();
        let layer = config.layers[0].clone();
        config.layers = (0..18)
            .map(|i| crate::config::LayerSpec {
                attention: if i % 6 == 5 {
                    AttentionSpan::Full
                } else {
                    AttentionSpan::Sliding { window: 512 }
                },
                ..layer.clone()
            })
            .collect();
        let bytes = kv_bytes_per_layer_token(&config, 4);
        assert_eq!(bytes, 1024);
        let grouped = KvFootprint::of(&config, &LayerGroups::of(&config, 1), 16, 4);
        assert_eq!(
            grouped,
            KvFootprint {
                bytes_per_token: 3 * 1024,
                bytes_per_sequence_fixed: 5 * 33 * 3 * 1024 * 16,
                read_bytes_per_token: 3 * 1024,
                window_read_bytes: vec![(512, 15 * 1024)],
                state_bytes_per_sequence: 0,
                state_checkpoint_bytes: 0,
                block_bytes: 3 * 1024 * 16,
            }
        );
        let whole = KvFootprint::of(&config, &LayerGroups::whole(&config), 16, 4);
        assert_eq!(
            (whole.bytes_per_token, whole.bytes_per_sequence_fixed),
            (18 * 1024, 0)
        );
        assert_eq!(whole.read_bytes_per_token, grouped.read_bytes_per_token);
    }
}
