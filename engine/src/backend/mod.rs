//! The tensor operations the forward pass needs, implemented once per device.
//!
//! The model (`crate::model`) is written once against [`Backend`]. Every op works on a
//! whole step: all tokens of all sequences of the batch are rows of one `[T, width]`
//! activation matrix. Outputs are passed in and resized by the op, so a caller can
//! keep its activation buffers across steps.

pub mod cpu;
pub mod cuda;
mod device_facts;
pub mod routing;

use std::fmt;

use anyhow::{bail, ensure};

use crate::config::{Activation, AttentionSpan, DeltaNetSpec, ExpertSpec, ModelConfig};
use crate::layer_groups::StateCopy;
use crate::sampler::{SampleSpec, Sampled};
use crate::weights::HostTensor;

/// Refuses a model `backend` has no kernel for, naming what it needs.
pub fn refuse_what_it_lacks(backend: &impl Backend, c: &ModelConfig) -> anyhow::Result<()> {
    match backend.lacks(c) {
        Some(missing) => bail!("the model needs {missing}; `--device cpu` serves it"),
        None => Ok(()),
    }
}

/// How attention turns `q·k` into the logits of its softmax: times `scale`, then, with a
/// cap, `cap · tanh(s / cap)` (Gemma 2).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoreSpec {
    pub scale: f32,
    pub softcap: Option<f32>,
}

/// The device a model runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda,
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
        })
    }
}

impl std::str::FromStr for Device {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda),
            other => anyhow::bail!("unknown device `{other}` (expected `cpu` or `cuda`)"),
        }
    }
}

/// Where the heads sit in a fused QKV activation row: `[q heads | k heads | v heads]`,
/// each head `head_dim` wide. Query head `h` uses KV head `h / (num_heads / num_kv_heads)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QkvLayout {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl QkvLayout {
    /// Width of the query part (also the attention output width).
    pub fn q_width(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Width of the key part (and of the value part).
    pub fn kv_width(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Width of a fused QKV row.
    pub fn qkv_width(&self) -> usize {
        self.q_width() + 2 * self.kv_width()
    }

    /// Query heads per KV head.
    pub fn group_size(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }
}

/// One sequence's rows in a step, with its block table in every layer group.
#[derive(Debug, Clone, Copy)]
pub struct StepSeq<'a> {
    /// Index of the sequence's first row in the step's activations.
    pub row_start: usize,
    /// Number of rows (tokens) of the sequence in this step.
    pub n_tokens: usize,
    /// Position of the first row; the cache already holds positions `0..start_pos`.
    pub start_pos: usize,
    /// One table per layer group ([`crate::layer_groups`]), each covering positions
    /// `0..start_pos + n_tokens`; entries before a sliding window are
    /// [`crate::layer_groups::NO_BLOCK`].
    pub block_tables: &'a [Vec<u32>],
    /// Checkpoints of the sequence's recurrent state this step writes: each a recurrent
    /// group's state at a position in `start_pos + 1..=start_pos + n_tokens`, into blocks
    /// laid out as the group's table.
    pub state_saves: &'a [StateCopy],
}

/// One sequence's rows in a step, as one layer group's attention reads them.
#[derive(Debug, Clone, Copy)]
pub struct AttnSeq<'a> {
    /// Index of the sequence's first row in the step's activations.
    pub row_start: usize,
    /// Number of rows (tokens) of the sequence in this step.
    pub n_tokens: usize,
    /// Position of the first row; the cache already holds positions `0..start_pos`.
    pub start_pos: usize,
    /// Physical KV block ids covering positions `0..start_pos + n_tokens`
    /// ([`crate::layer_groups::NO_BLOCK`] before a sliding window).
    pub block_table: &'a [u32],
}

/// Checks the operands of [`LayerOps::qk_head_norm`]: a fused QKV width, one weight per
/// head dimension, and a head no wider than the backend's kernel handles.
pub fn check_qk_head_norm(
    qkv_cols: usize,
    layout: QkvLayout,
    q_len: usize,
    k_len: usize,
    max_head_dim: usize,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        qkv_cols == layout.qkv_width(),
        "qk_head_norm: width {qkv_cols}, expected {}",
        layout.qkv_width()
    );
    anyhow::ensure!(
        q_len == layout.head_dim && k_len == layout.head_dim && layout.head_dim <= max_head_dim,
        "qk_head_norm: weights of {q_len} and {k_len} for head_dim {} (at most {max_head_dim})",
        layout.head_dim
    );
    Ok(())
}

/// Checks that `block_table` covers positions `0..end` (blocks of `block_size` tokens) and
/// that each of its blocks from the one holding position `first_key` (the earliest key a
/// row reads) is one of a cache's `num_blocks`.
pub fn check_block_table(
    block_table: &[u32],
    first_key: usize,
    end: usize,
    block_size: usize,
    num_blocks: usize,
) -> anyhow::Result<()> {
    let need = end.div_ceil(block_size);
    ensure!(
        block_table.len() >= need,
        "block table has {} blocks but positions up to {end} need {need}",
        block_table.len()
    );
    let first = (first_key / block_size).min(need);
    if let Some(&b) = block_table[first..need]
        .iter()
        .find(|&&b| b as usize >= num_blocks)
    {
        if b == crate::layer_groups::NO_BLOCK {
            bail!("the block table holds no block for positions from {first_key} on");
        }
        bail!("block id {b} is past the KV cache ({num_blocks} blocks)");
    }
    Ok(())
}

/// Checks a recurrent group's table: the `blocks` pages of a sequence's state, each in the
/// pool.
pub fn check_state_table(table: &[u32], blocks: usize, num_blocks: usize) -> anyhow::Result<()> {
    ensure!(
        table.len() == blocks,
        "the state table has {} blocks, the state takes {blocks}",
        table.len()
    );
    if let Some(&b) = table.iter().find(|&&b| b as usize >= num_blocks) {
        bail!("state block id {b} is past the pool ({num_blocks} blocks)");
    }
    Ok(())
}

/// Checks the operands of [`RecurrentOps::sigmoid_gate`] (`per_row` false: a gate per
/// value, `out` being `x`) and of [`RecurrentOps::add_gated`] (`per_row`: one gate per row
/// of `x`, added into `out` of its shape); shapes are (rows, columns).
pub fn check_gates(
    out: (usize, usize),
    x: (usize, usize),
    gate: (usize, usize),
    per_row: bool,
) -> anyhow::Result<()> {
    let want = if per_row { (x.0, 1) } else { x };
    ensure!(
        out == x && gate == want,
        "{}: {}x{} values into {}x{}, gates {}x{} (want {}x{})",
        if per_row { "add_gated" } else { "sigmoid_gate" },
        x.0,
        x.1,
        out.0,
        out.1,
        gate.0,
        gate.1,
        want.0,
        want.1
    );
    Ok(())
}

/// Checks that no block appears twice among a sequence's state table and the copies of
/// its state a step reads or writes (a state's pages are written in place, so two roles
/// sharing a page would overwrite each other).
pub fn check_state_pages_distinct<'a>(
    tables: impl IntoIterator<Item = &'a [u32]>,
) -> anyhow::Result<()> {
    let mut ids: Vec<u32> = tables.into_iter().flatten().copied().collect();
    ids.sort_unstable();
    if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
        bail!("state block {} is used twice in one step", w[0]);
    }
    Ok(())
}

/// Per-step metadata shared by every layer, built by the model on the host and copied to
/// the device once per step.
#[derive(Debug, Clone, Copy)]
pub struct StepMeta<'a> {
    /// The sequences, in row order; their rows tile `0..T` without gaps.
    pub seqs: &'a [StepSeq<'a>],
    /// Layer groups: every sequence has one block table per group.
    pub num_groups: usize,
    /// Per row: the token id (checked against the vocabulary).
    pub tokens: &'a [u32],
    /// Per row: its position in its sequence (the row of the RoPE tables).
    pub positions: &'a [u32],
    /// Per group, then per row: the KV cache slot (`block * block_size + offset`) the
    /// row's K/V are written to in the group's blocks (`num_groups × T`, group-major).
    pub slots: &'a [usize],
    /// The rows whose next token is sampled, in batch order.
    pub logit_rows: &'a [usize],
    /// One per entry of `logit_rows`: how to sample it.
    pub samples: &'a [SampleSpec<'a>],
    /// Tokens per KV block.
    pub block_size: usize,
}

/// A layer's experts as read from the file, for [`ExpertOps::upload_experts`].
#[derive(Debug, Clone)]
pub struct HostExperts {
    /// The router `[num_experts, hidden]`, and its bias `[num_experts]` (gpt-oss).
    pub router: HostTensor,
    pub router_bias: Option<HostTensor>,
    /// One per expert, in order.
    pub experts: Vec<HostExpert>,
}

/// One expert's weights: gate/up fused row-wise `[2 × width, hidden]` (gate rows first)
/// and down `[hidden, width]`, with their biases (`[2 × width]` and `[hidden]`) where the
/// model has them.
#[derive(Debug, Clone)]
pub struct HostExpert {
    pub gate_up: HostTensor,
    pub down: HostTensor,
    pub biases: Option<(HostTensor, HostTensor)>,
}

/// One sampled row's result: a failure of one sequence does not fail the step.
pub type RowSample = anyhow::Result<Sampled>;

/// One layer's paged KV storage, for [`AttentionOps::new_kv_cache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCacheShape {
    pub num_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl KvCacheShape {
    /// Values of K (and of V) the cache holds; an error when that overflows or is none.
    pub fn values(&self) -> anyhow::Result<usize> {
        let n = [self.block_size, self.num_kv_heads, self.head_dim]
            .iter()
            .try_fold(self.num_blocks, |n, &d| n.checked_mul(d));
        match n {
            Some(n) if n > 0 => Ok(n),
            _ => bail!(
                "a KV cache of {} blocks of {} tokens, {} KV heads of {} values, is {}",
                self.num_blocks,
                self.block_size,
                self.num_kv_heads,
                self.head_dim,
                if n.is_some() { "empty" } else { "too large" }
            ),
        }
    }
}

/// The types a device keeps its tensors in.
///
/// `Act` is an f32 activation matrix `[rows, cols]`; `Weight` a linear weight `[N, K]`
/// (output features × input features, HF layout) in the device's storage type; `Param`
/// a 1-D f32 vector (norm weights, biases); `KvCache` one layer's paged K and V
/// storage; `Step` the device copy of a [`StepMeta`].
pub trait Tensors: Send + Sync {
    type Act: Send;
    type Weight: Send + Sync;
    type Param: Send + Sync;
    type KvCache: Send;
    type Step;
    /// A mixture-of-experts FFN's weights as the device keeps them.
    type Experts: Send + Sync;
}

/// How a step runs on the device: its metadata, its execution context, its timeline, and
/// the layers captured and replayed as a graph where the device can.
pub trait StepOps: Tensors {
    /// Runs `f` in the backend's execution context (the CPU backend's thread pool).
    fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        f()
    }

    /// Copies the step metadata to the device.
    fn prepare_step(&self, meta: &StepMeta<'_>) -> anyhow::Result<Self::Step>;

    /// Whether an op has finished when its call returns (the CPU), so that the host's clock
    /// times it; a device that queues its work (CUDA) says no.
    fn runs_ops_as_issued(&self) -> bool {
        true
    }

    /// Marks point `slot` (0..3) of the step on the device's timeline (a no-op where the
    /// host's clock already times the work).
    fn record_mark(&self, _slot: usize) -> anyhow::Result<()> {
        Ok(())
    }
    /// Device seconds between two recorded marks, once the work has finished; `None`
    /// where the device keeps no timeline.
    fn elapsed_between_marks(&self, _from: usize, _to: usize) -> anyhow::Result<Option<f64>> {
        Ok(None)
    }

    /// Runs the layers of `step` (embedding to logits) from a captured graph when the device
    /// holds one for its shape, leaving `logits` shaped as the graph wrote it; true when it
    /// did, and the caller then skips the layers.
    fn replay_layers(&self, _step: &Self::Step, _logits: &mut Self::Act) -> anyhow::Result<bool> {
        Ok(false)
    }
    /// Called before the layers run op by op: a backend may capture them instead of running
    /// them (CUDA graphs).
    fn begin_layers(&self, _step: &Self::Step) -> anyhow::Result<()> {
        Ok(())
    }
    /// Called after the layers' ops were issued (`issued` false when one failed): a capturing
    /// backend runs the capture now. False when the layers did not run (a capture was
    /// discarded) and must be issued again.
    fn end_layers(
        &self,
        _step: &Self::Step,
        _logits: &Self::Act,
        _issued: bool,
    ) -> anyhow::Result<bool> {
        Ok(true)
    }
}

/// The row-wise operations of a layer: embedding, projections, norms, RoPE, activations.
pub trait LayerOps: Tensors {
    /// `out[t] = table[step.tokens[t]]` (rows of the `[vocab, hidden]` table; ids are
    /// checked by the caller).
    fn embed(
        &self,
        table: &Self::Weight,
        step: &Self::Step,
        out: &mut Self::Act,
    ) -> anyhow::Result<()>;
    /// `out = x · wᵀ (+ bias)`: `[M, K] · [N, K]ᵀ → [M, N]`.
    fn matmul(
        &self,
        x: &Self::Act,
        w: &Self::Weight,
        bias: Option<&Self::Param>,
        out: &mut Self::Act,
    ) -> anyhow::Result<()>;
    /// Row-wise RMSNorm: `out = x / sqrt(mean(x²) + eps) * w`.
    fn rms_norm(
        &self,
        x: &Self::Act,
        w: &Self::Param,
        eps: f32,
        out: &mut Self::Act,
    ) -> anyhow::Result<()>;
    /// `residual += x`, then `out = rms_norm(residual)`.
    fn add_rms_norm(
        &self,
        residual: &mut Self::Act,
        x: &Self::Act,
        w: &Self::Param,
        eps: f32,
        out: &mut Self::Act,
    ) -> anyhow::Result<()>;
    /// In place, per head: RMSNorm over `head_dim` of every q head (weight `q_w`) and
    /// every k head (weight `k_w`) of a fused QKV matrix (Qwen3).
    fn qk_head_norm(
        &self,
        qkv: &mut Self::Act,
        layout: QkvLayout,
        q_w: &Self::Param,
        k_w: &Self::Param,
        eps: f32,
    ) -> anyhow::Result<()>;
    /// In place: rotate-half (NEOX) RoPE on the first `rotary_dim` dimensions of the q and
    /// k heads of a fused QKV matrix (the rest pass through). `cos` and `sin` are
    /// `[positions, rotary_dim / 2]` tables, read at each row's position.
    fn rope(
        &self,
        qkv: &mut Self::Act,
        layout: QkvLayout,
        rotary_dim: usize,
        cos: &Self::Param,
        sin: &Self::Param,
        step: &Self::Step,
    ) -> anyhow::Result<()>;
    /// `out = act(gate) * up` where `gate_up` rows are `[gate | up]`.
    fn gated_activation(
        &self,
        gate_up: &Self::Act,
        act: Activation,
        out: &mut Self::Act,
    ) -> anyhow::Result<()>;
    /// In place: `x *= factor`.
    fn scale(&self, x: &mut Self::Act, factor: f32) -> anyhow::Result<()>;
    /// In place: `x = cap · tanh(x / cap)`.
    fn softcap(&self, x: &mut Self::Act, cap: f32) -> anyhow::Result<()>;
}

/// Paged attention and the KV cache it reads.
pub trait AttentionOps: Tensors {
    /// Bytes of one cached K or V value.
    fn kv_value_bytes(&self) -> usize;
    /// Whether the attention reads a block table per layer group, so that a sliding
    /// group keeps only its window ([`crate::layer_groups::LayerGroups::of`]); otherwise
    /// every layer keeps every token in one group.
    fn keeps_windows(&self) -> bool;
    /// Allocates one layer's KV cache.
    fn new_kv_cache(&self, shape: KvCacheShape) -> anyhow::Result<Self::KvCache>;
    /// Writes every row's K and V into `cache` at its slot in layer group `group`, then
    /// computes causal attention of every query row over positions `0..=pos` of its
    /// sequence (only the last `window` of them for a sliding `span`), read through the
    /// group's block table, its logits as `scores` says. With `sinks` (one logit per query head), each head's
    /// softmax has one more term in its denominator, `exp(sink)`, that weighs no value.
    /// `out` is `[T, num_heads * head_dim]`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        qkv: &Self::Act,
        layout: QkvLayout,
        span: AttentionSpan,
        scores: ScoreSpec,
        sinks: Option<&Self::Param>,
        cache: &mut Self::KvCache,
        step: &Self::Step,
        group: usize,
        out: &mut Self::Act,
    ) -> anyhow::Result<()>;
}

/// f32 values of recurrent state a block of a layer index's KV cache holds: its K region,
/// then its V region, each read as f32 (a state's rows must not cross from one to the
/// other: a region holds whole rows). A sequence's state is spread over the pages of its
/// recurrent group's block table, in order.
pub fn state_page_values(shape: &KvCacheShape, value_bytes: usize) -> usize {
    2 * shape.block_size * shape.num_kv_heads * shape.head_dim * value_bytes / 4
}

/// A Gated DeltaNet layer's parameters beside its projections, as f32 vectors.
pub struct DeltaNetParams<P> {
    /// The depthwise convolution, tap-major `[conv_kernel, conv_channels]`: tap `j` of
    /// every channel, applied to the input `conv_kernel − 1 − j` positions back.
    pub conv: P,
    /// Per value head, `−exp(A_log)`: the decay rate's scale.
    pub decay: P,
    /// Per value head, the bias added to `a` before the softplus.
    pub dt_bias: P,
    /// The gated RMSNorm's weight over a value head (as stored: `w`, not `1 + w`).
    pub norm: P,
}

/// Gated DeltaNet layers (Qwen3-Next, Qwen3.5) and the gates of their neighbours: the
/// recurrent state each sequence keeps, in pages of the KV pool's blocks, in the same
/// memory as the K/V of those blocks ([`state_page_values`]), so that a block serves
/// either kind at the bytes the budget paid for once.
pub trait RecurrentOps: Tensors {
    /// Copies the state in the pages `from` to the pages `to` (as many, distinct from
    /// them): a checkpoint restored into a sequence's own state.
    fn copy_state(&self, cache: &mut Self::KvCache, from: &[u32], to: &[u32])
        -> anyhow::Result<()>;
    /// The DeltaNet between its projections. `proj` rows are `[q k v | z | b a]`
    /// ([`DeltaNetSpec::projection_width`]). Per sequence of the step, whose state sits in
    /// the pages of its table in layer group `group` (zero when it starts at position 0):
    /// the causal convolution over q, k and v with SiLU; q and k L2-normalised, q scaled by
    /// `key_head_dim^-½`; `β = σ(b)`, `g = decay · softplus(a + dt_bias)`; the recurrence
    /// `S ← e^g S; S += k ⊗ β(v − Sᵀk); o = Sᵀq` (position by position on the CPU; a
    /// device may compute it in chunks, to the same values); then `o` RMS-normed per value
    /// head, times the weight and `silu(z)`. `out` is `[T, value_width]`; the states are left at
    /// the last position, and the step's checkpoints in group `group`
    /// ([`StepSeq::state_saves`]) get the state at theirs.
    #[allow(clippy::too_many_arguments)]
    fn gated_delta_net(
        &self,
        proj: &Self::Act,
        spec: DeltaNetSpec,
        params: &DeltaNetParams<Self::Param>,
        eps: f32,
        cache: &mut Self::KvCache,
        step: &Self::Step,
        group: usize,
        out: &mut Self::Act,
    ) -> anyhow::Result<()>;
    /// In place: `x *= σ(gate)`, element by element (an attention output gate).
    fn sigmoid_gate(&self, x: &mut Self::Act, gate: &Self::Act) -> anyhow::Result<()>;
    /// `out[r] += σ(gate[r]) · x[r]` for a one-column `gate` (a gated shared expert).
    fn add_gated(&self, out: &mut Self::Act, x: &Self::Act, gate: &Self::Act)
        -> anyhow::Result<()>;
}

/// Mixture-of-experts FFNs: their upload and their routed forward pass.
pub trait ExpertOps: Tensors {
    /// Uploads a layer's experts (`name` is its prefix): the router, kept in f32 as
    /// llama.cpp keeps it (which experts a token takes turns on small differences of its
    /// scores), and each expert's matrices, stored as [`Backend::upload_weight`] stores
    /// weights.
    fn upload_experts(&self, name: &str, experts: HostExperts) -> anyhow::Result<Self::Experts>;
    /// Bytes of the router and of one expert's matrices (the experts' mean), as stored.
    fn expert_bytes(&self, experts: &Self::Experts) -> (usize, usize);
    /// The mixture-of-experts FFN over the rows of `x`: each row is routed by
    /// [`routing::route`]'s rule and run through its experts' gated FFNs with `act`; `out`
    /// gets each row's weighted sum of their outputs.
    fn experts_ffn(
        &self,
        x: &Self::Act,
        experts: &Self::Experts,
        spec: ExpertSpec,
        act: Activation,
        out: &mut Self::Act,
    ) -> anyhow::Result<()>;
}

/// The logits' last steps: picking the sampled rows and sampling them.
pub trait SamplingOps: Tensors {
    /// `out[i] = x[step.logit_rows[i]]`.
    fn gather_logit_rows(
        &self,
        x: &Self::Act,
        step: &Self::Step,
        out: &mut Self::Act,
    ) -> anyhow::Result<()>;
    /// Samples one token per row of `logits` (one row per `samples` entry, in order),
    /// applying the penalties in place; only the ids and the asked-for logprobs leave the
    /// device.
    fn sample(
        &self,
        logits: &mut Self::Act,
        samples: &[SampleSpec<'_>],
        step: &Self::Step,
    ) -> anyhow::Result<Vec<RowSample>>;
}

/// Tensor operations over one device's memory: each room of ops is a trait of its own,
/// implemented beside the device's kernels for it; this one holds what the model loads.
pub trait Backend:
    StepOps + LayerOps + AttentionOps + RecurrentOps + ExpertOps + SamplingOps
{
    /// An empty activation buffer.
    fn new_act(&self) -> Self::Act;
    /// Uploads a 2-D weight `[N, K]`; `name` is for error messages.
    fn upload_weight(&self, name: &str, tensor: HostTensor) -> anyhow::Result<Self::Weight>;
    /// Uploads a 1-D parameter (converted to f32); `name` is for error messages.
    fn upload_param(&self, name: &str, tensor: HostTensor) -> anyhow::Result<Self::Param>;
    /// Bytes `w` occupies as stored for the matmuls: what one pass over it reads.
    fn weight_bytes(&self, w: &Self::Weight) -> usize;
    /// What of the model this backend's kernels do not run, if anything, in words (a
    /// backend whose kernels for it have not been verified refuses the model at load).
    fn lacks(&self, config: &ModelConfig) -> Option<String> {
        let _ = config;
        None
    }
    /// Copies the matrix to the host, one `Vec` per row (reference checks only: the serving
    /// path never copies logits).
    fn to_host(&self, x: &Self::Act) -> anyhow::Result<Vec<Vec<f32>>>;
}

#[cfg(test)]
mod tests {
    use super::KvCacheShape;

    #[test]
    fn a_kv_cache_shape_counts_its_values_and_refuses_none_or_too_many() {
        let shape = |num_blocks, head_dim| KvCacheShape {
            num_blocks,
            block_size: 16,
            num_kv_heads: 2,
            head_dim,
        };
        assert_eq!(shape(3, 64).values().unwrap(), 3 * 16 * 2 * 64);
        let empty = shape(0, 64).values().unwrap_err().to_string();
        assert!(empty.ends_with("is empty"), "{empty}");
        let huge = shape(usize::MAX / 8, 64).values().unwrap_err().to_string();
        assert!(huge.ends_with("is too large"), "{huge}");
    }
}
