//! How big the KV cache is, for every backend: bytes per token from the model's shape, and
//! blocks from a byte budget.

use anyhow::ensure;

use crate::config::ModelConfig;

/// How a runner sizes its KV cache.
#[derive(Debug, Clone, Copy)]
pub struct RunnerOptions {
    /// Tokens per KV block.
    pub block_size: usize,
    /// Memory budget for the KV cache in bytes; the runner allocates as many blocks as fit.
    pub kv_cache_bytes: usize,
}

/// KV-cache bytes per token: K and V of every layer, `value_bytes` each.
pub fn kv_bytes_per_token(config: &ModelConfig, value_bytes: usize) -> usize {
    2 * config.num_layers * config.num_kv_heads * config.head_dim * value_bytes
}

impl RunnerOptions {
    /// The blocks of `block_size` tokens of `bytes_per_token` each that fit in the budget:
    /// at least one, or an error that says why not.
    pub fn num_blocks(&self, bytes_per_token: usize) -> anyhow::Result<usize> {
        ensure!(self.block_size > 0, "KV block size must be positive");
        let block_bytes = bytes_per_token * self.block_size;
        let num_blocks = self.kv_cache_bytes / block_bytes.max(1);
        ensure!(
            num_blocks >= 1,
            "KV cache budget of {} bytes is less than one block ({block_bytes} bytes for {} tokens)",
            self.kv_cache_bytes,
            self.block_size
        );
        Ok(num_blocks)
    }
}
