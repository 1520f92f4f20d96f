//! KV-cache sizing from device memory (pure arithmetic, unit-tested on the host).

use crate::config::{Ffn, ModelConfig};

/// Bytes of the bf16 weights the model uploads (linear layers and embeddings; norms are
/// negligible and covered by the reserve).
pub fn weight_bytes_bf16(c: &ModelConfig, separate_lm_head: bool) -> usize {
    let h = c.hidden_size;
    let (q, kv) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
    let layers: usize = c
        .layers
        .iter()
        .map(|l| h * (q + 2 * kv) + q * h + l.ffn.matrix_params(h))
        .sum();
    let embed = c.vocab_size * h * if separate_lm_head { 2 } else { 1 };
    2 * (embed + layers)
}

/// Activation memory of the largest step, plus the logits rows and a fixed headroom for
/// cuBLAS workspaces and the CUDA context.
pub fn activation_reserve_bytes(
    c: &ModelConfig,
    max_batched_tokens: usize,
    max_num_seqs: usize,
) -> usize {
    let qkv = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim;
    let widest_ffn = c.layers.iter().map(|l| l.ffn.width()).max().unwrap_or(0);
    // The expert kernels' buffers, per token and slot: its activations and output (bf16),
    // its expert id, weight and place in the grouping (4 bytes each).
    let experts = c
        .layers
        .iter()
        .filter_map(|l| match l.ffn {
            Ffn::Experts(e) => Some(e.top_k * (2 * e.intermediate_size + 2 * c.hidden_size + 12)),
            Ffn::Dense { .. } => None,
        })
        .max()
        .unwrap_or(0);
    let per_token =
        2 * (4 * c.hidden_size + qkv + c.num_heads * c.head_dim + 3 * widest_ffn) + experts;
    let logits = max_num_seqs * c.vocab_size * (2 + 4);
    max_batched_tokens * per_token + logits + (512 << 20)
}

/// KV-cache tokens that fit: `free - total * (1 - utilization) - weights - reserve`, in
/// bf16 per-token units, rounded down to whole blocks. Zero when nothing fits.
pub fn kv_cache_tokens(
    free: usize,
    total: usize,
    utilization: f64,
    weights: usize,
    reserve: usize,
    bytes_per_token: usize,
    block_size: usize,
) -> usize {
    let keep_free = (total as f64 * (1.0 - utilization.clamp(0.0, 1.0))) as usize;
    let budget = free
        .saturating_sub(keep_free)
        .saturating_sub(weights)
        .saturating_sub(reserve);
    let tokens = budget / bytes_per_token.max(1);
    tokens / block_size.max(1) * block_size.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_tokens_subtract_weights_reserve_and_headroom() {
        let gib = 1usize << 30;
        // 80 GiB total, 79 free, 0.9 → keep 8 GiB free; 2 GiB weights, 1 GiB reserve → 68 GiB.
        let t = kv_cache_tokens(79 * gib, 80 * gib, 0.9, 2 * gib, gib, 114_688, 16);
        assert_eq!(t, (68 * gib / 114_688) / 16 * 16);
        assert_eq!(kv_cache_tokens(gib, 80 * gib, 0.9, 0, 0, 1024, 16), 0);
    }
}
