//! How big the KV cache is, for every backend: bytes per token from the model's shape, and
//! blocks from a byte budget.

use anyhow::{ensure, Context};

use crate::config::ModelConfig;

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

/// KV-cache bytes per token: K and V of every layer, `value_bytes` each.
pub fn kv_bytes_per_token(config: &ModelConfig, value_bytes: usize) -> usize {
    2 * config.num_layers() * config.num_kv_heads * config.head_dim * value_bytes
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
    fn kv_bytes_count_k_and_v_of_every_layer() {
        let config = crate::config::test_llama();
        assert_eq!(kv_bytes_per_token(&config, 2), 2 * 2 * 128 * 2);
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
}
