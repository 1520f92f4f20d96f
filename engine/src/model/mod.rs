//! The forward pass over a batch of sequence chunks, reading and writing the paged KV cache.
//!
//! [`Model`] is written once against [`Backend`]; `crate::loader` builds one on each device.
//! `load` reads a family's weights into its layers; `forward` runs a step over them.

mod forward;
mod load;

use anyhow::bail;

use crate::backend::{Backend, DeltaNetParams, QkvLayout, RowSample};
use crate::config::{DeltaNetSpec, ExpertSpec, LayerSpec, ModelConfig};
use crate::kv_sizing::{KvFootprint, KvPool};
use crate::layer_groups::{GroupKind, LayerGroups, StateCopy};
use crate::sampler::SampleSpec;

/// One sequence's slice of work in a forward step.
#[derive(Debug, Clone, Copy)]
pub struct SeqInput<'a> {
    /// Tokens to compute this step (a prefill chunk, or one token for decode).
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`; the KV cache already holds positions `0..start_pos`.
    pub start_pos: usize,
    /// The sequence's KV blocks, one table per layer group (`ModelRunner::kv_groups`),
    /// each covering positions `0..start_pos + tokens.len()` (a sliding group's from its
    /// window on).
    pub block_tables: &'a [Vec<u32>],
    /// Per recurrent group, a checkpoint of the state at `start_pos` to start from: copied
    /// into the sequence's own state (its table in the group) before the step.
    pub state_restores: &'a [StateCopy],
    /// Checkpoints of the recurrent state the step writes at positions within its tokens.
    pub state_saves: &'a [StateCopy],
    /// How to sample the token after the last one (decode, or the last prefill chunk);
    /// `None` for a chunk that samples nothing.
    pub sample: Option<SampleSpec<'a>>,
}

/// Where a runner's last step spent its time.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepProfile {
    /// Host: checking the batch, building the step's inputs and copying them to the device.
    pub prepare_secs: f64,
    /// The forward pass; on CUDA the GPU's time between events around it.
    pub forward_secs: f64,
    /// Penalties, sampling and logprobs; on CUDA the GPU's time between events around it.
    pub sample_secs: f64,
    /// The whole `forward` call as the host saw it (includes waiting for the device).
    pub wall_secs: f64,
    /// The mixture-of-experts FFNs (routing, the experts' GEMMs and their weighted sums),
    /// by the host's clock, on a backend that runs its ops as they are issued (the CPU's:
    /// part of `forward_secs`); 0 where the device runs them later (CUDA).
    pub experts_secs: f64,
    /// The Gated DeltaNet layers' token mixers (their projections, convolution and
    /// recurrence), timed as `experts_secs` is.
    pub delta_net_secs: f64,
}

/// Runs the model on a device; owns the weights and the KV cache storage.
pub trait ModelRunner: Send {
    /// Computes the batch, writes its K/V into the cache and samples every entry that has
    /// a [`SeqInput::sample`]: one result per such entry, in batch order. An entry's own
    /// failure is its `Err`; an `Err` of the whole call means the step failed.
    fn forward(&mut self, batch: &[SeqInput<'_>]) -> anyhow::Result<Vec<RowSample>>;
    /// The full-vocabulary logits of the entries with a `sample`, copied to the host, with
    /// no penalties applied (reference checks only; serving never copies logits).
    fn logits(&mut self, batch: &[SeqInput<'_>]) -> anyhow::Result<Vec<Vec<f32>>>;
    /// Where the last `forward` spent its time.
    fn profile(&self) -> StepProfile;
    /// Rows of the embedding table: token ids must be below it.
    fn vocab_size(&self) -> usize;
    /// Number of KV blocks the runner allocated (the block manager's capacity).
    fn num_blocks(&self) -> usize;
    /// Tokens per KV block.
    fn block_size(&self) -> usize;
    /// The layer groups the KV blocks serve, in the order of a sequence's block tables.
    fn kv_layer_groups(&self) -> LayerGroups;
    /// The kinds of the layer groups, in the order of a sequence's block tables.
    fn kv_groups(&self) -> Vec<GroupKind> {
        self.kv_layer_groups().kinds()
    }
    /// The pool of KV blocks as the layer groups draw on it.
    fn kv_pool(&self) -> KvPool {
        KvPool {
            num_blocks: self.num_blocks(),
            block_size: self.block_size(),
            groups: self.kv_groups(),
        }
    }
    /// What a decode step reads and a token caches, for the bandwidth bound.
    fn footprint(&self) -> Footprint;
}

/// The sizes behind the bandwidth bound (`GET /version`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Bytes one decode step of one sequence reads for the weights, as stored at run time:
    /// every layer's matrices and parameters (of a mixture of experts, the router and
    /// `top_k` experts), the final norm and the output head (the embedding table itself is
    /// only gathered from, one row a token).
    pub weight_bytes: usize,
    /// The parameters one token is computed with (the embedding table once, twice when the
    /// head is untied; of a mixture of experts, the router and `top_k` experts): the
    /// compute a prefill token costs is twice this.
    pub parameters: usize,
    /// What the KV cache keeps and a decode step reads of it.
    pub kv: KvFootprint,
    /// FLOPs one decode token spends per token of its context in attention: q·k and p·v,
    /// 2 × 2 × heads × head dim on every layer (a sliding window's cap not applied).
    pub attention_flops_per_context_token: usize,
}

/// One decoder layer: its description and its weights (Q/K/V and gate/up fused row-wise at
/// load time).
struct Layer<B: Backend> {
    spec: LayerSpec,
    /// Which of the model's RoPE tables it reads.
    rope: usize,
    attn_norm: B::Param,
    mixer: MixerWeights<B>,
    /// On the attention output and on the FFN output, before each residual add
    /// ([`NormPlacement::Sandwich`]).
    post_norms: Option<(B::Param, B::Param)>,
    mlp_norm: B::Param,
    ffn: FfnWeights<B>,
    /// Beside experts: a gated FFN every token runs, added times σ(`gate`·x)
    /// ([`LayerSpec::shared_expert`]).
    shared_expert: Option<SharedExpert<B>>,
}

/// A layer's token mixer: attention over the KV cache, or a Gated DeltaNet.
enum MixerWeights<B: Backend> {
    Attention(AttentionWeights<B>),
    DeltaNet(DeltaNetWeights<B>),
}

struct AttentionWeights<B: Backend> {
    qkv: B::Weight,
    qkv_bias: Option<B::Param>,
    qk_norm: Option<(B::Param, B::Param)>,
    /// The output gate's projection: the gate half of each head of Qwen3-Next's `q_proj`.
    gate: Option<B::Weight>,
    o_proj: B::Weight,
    o_bias: Option<B::Param>,
    /// One logit per query head ([`LayerSpec::sinks`]).
    sinks: Option<B::Param>,
}

struct DeltaNetWeights<B: Backend> {
    spec: DeltaNetSpec,
    /// q, k, v, z, b and a fused row-wise ([`DeltaNetSpec::projection_width`]).
    in_proj: B::Weight,
    params: DeltaNetParams<B::Param>,
    out_proj: B::Weight,
}

struct SharedExpert<B: Backend> {
    gate_up: B::Weight,
    down: B::Weight,
    /// `[1, hidden]`: the scalar gate's logit per token.
    gate: B::Weight,
}

/// A layer's FFN weights: one gated FFN (gate/up fused row-wise), or experts.
enum FfnWeights<B: Backend> {
    Dense { gate_up: B::Weight, down: B::Weight },
    Experts(ExpertSpec, B::Experts),
}

/// Activation buffers reused across steps.
struct Buffers<B: Backend> {
    x: B::Act,
    h: B::Act,
    qkv: B::Act,
    attn: B::Act,
    o: B::Act,
    /// A sublayer's output after its post-norm (sandwich norms).
    post: B::Act,
    gate_up: B::Act,
    act: B::Act,
    down: B::Act,
    /// An attention output gate, or a shared expert's gate logits.
    gate: B::Act,
    /// A shared expert's output.
    shared: B::Act,
    last: B::Act,
    logits: B::Act,
}

/// Host-side step inputs reused across steps.
#[derive(Default)]
struct HostScratch {
    tokens: Vec<u32>,
    positions: Vec<u32>,
    slots: Vec<usize>,
    logit_rows: Vec<usize>,
}

/// Positions the RoPE tables cover: the model's context, capped so a 128k-context model's
/// tables stay small (positions past it are rejected).
const MAX_ROPE_POSITIONS: usize = 1 << 17;

/// The longest context a model loaded from `config` serves: its maximum position, capped
/// to the RoPE tables.
pub fn max_positions(config: &ModelConfig) -> usize {
    config.max_position_embeddings.clamp(1, MAX_ROPE_POSITIONS)
}

/// The positions a model loaded from `config` to serve sequences of up to `max_model_len`
/// tokens (`None`: as long as it can) builds its RoPE tables for; LongRoPE picks its
/// factors by it.
pub fn rope_positions(config: &ModelConfig, max_model_len: Option<usize>) -> anyhow::Result<usize> {
    match max_model_len {
        Some(len) if len > max_positions(config) => bail!(
            "--max-model-len {len} exceeds the {} positions the model serves \
             (max_position_embeddings {})",
            max_positions(config),
            config.max_position_embeddings
        ),
        Some(len) => Ok(len.max(1)),
        None => Ok(max_positions(config)),
    }
}

/// Everything but the backend (split so the backend can run the forward in its context).
struct ModelState<B: Backend> {
    config: ModelConfig,
    layout: QkvLayout,
    embed: B::Weight,
    lm_head: Option<B::Weight>,
    final_norm: B::Param,
    layers: Vec<Layer<B>>,
    /// The layer groups the KV blocks serve, and each layer's (group, index in it).
    groups: LayerGroups,
    placement: Vec<(usize, usize)>,
    /// One cache per index in a group: layer `l` at index `i` of group `g` reads cache `i`
    /// through group `g`'s block tables (a recurrent layer's state in the same blocks'
    /// memory, [`crate::backend::state_page_values`]).
    caches: Vec<B::KvCache>,
    num_blocks: usize,
    block_size: usize,
    rope_positions: usize,
    /// RoPE cosine and sine tables, one pair per distinct [`RopeSpec`] of the layers.
    ropes: Vec<(B::Param, B::Param)>,
    bufs: Buffers<B>,
    host: HostScratch,
    profile: StepProfile,
}

/// A decoder of any described family on a [`Backend`], with its paged KV cache.
pub struct Model<B: Backend> {
    backend: B,
    state: ModelState<B>,
}
