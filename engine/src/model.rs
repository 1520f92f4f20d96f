//! The forward pass over a batch of sequence chunks, reading and writing the paged KV cache.

/// One sequence's slice of work in a forward step.
#[derive(Debug, Clone, Copy)]
pub struct SeqInput<'a> {
    /// Tokens to compute this step (a prefill chunk, or one token for decode).
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`; the KV cache already holds positions `0..start_pos`.
    pub start_pos: usize,
    /// Physical KV block ids of the sequence, covering positions `0..start_pos + tokens.len()`.
    pub block_table: &'a [u32],
    /// Whether logits of the last token are wanted (decode, or the last prefill chunk).
    pub need_logits: bool,
}

/// Runs the model on a device; owns the weights and the KV cache storage.
pub trait ModelRunner: Send {
    /// Computes the batch, writes its K/V into the cache, and returns one full-vocab
    /// logits row per entry with `need_logits`, in batch order.
    fn forward(&mut self, batch: &[SeqInput<'_>]) -> anyhow::Result<Vec<Vec<f32>>>;
    /// Number of KV blocks the runner allocated (the block manager's capacity).
    fn num_blocks(&self) -> usize;
    /// Tokens per KV block.
    fn block_size(&self) -> usize;
}

/// How a runner sizes its KV cache.
#[derive(Debug, Clone, Copy)]
pub struct RunnerOptions {
    /// Tokens per KV block.
    pub block_size: usize,
    /// Memory budget for the KV cache in bytes; the runner allocates as many blocks as fit.
    pub kv_cache_bytes: usize,
}
