//! The forward pass over a batch of sequence chunks, reading and writing the paged KV cache.
//!
//! [`Model`] is written once against [`Backend`]; `crate::loader` builds one on each device.

use anyhow::{anyhow, bail, ensure, Context};

use std::time::Instant;

use crate::backend::{
    check_block_table, refuse_what_it_lacks, AttnSeq, Backend, HostExpert, HostExperts, QkvLayout,
    RowSample, ScoreSpec, StepMeta,
};
use crate::config::{
    ExpertSpec, Family, Ffn, LayerSpec, ModelConfig, NormPlacement, NormWeights, RopeSpec,
};
use crate::kv_sizing::{kv_bytes_per_token, RunnerOptions};
use crate::sampler::SampleSpec;
use crate::weights::{HostTensor, QuantType, TensorData, WeightSource};

/// One sequence's slice of work in a forward step.
#[derive(Debug, Clone, Copy)]
pub struct SeqInput<'a> {
    /// Tokens to compute this step (a prefill chunk, or one token for decode).
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`; the KV cache already holds positions `0..start_pos`.
    pub start_pos: usize,
    /// Physical KV block ids of the sequence, covering positions `0..start_pos + tokens.len()`.
    pub block_table: &'a [u32],
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
    /// What a decode step reads and a token caches, for the bandwidth bound.
    fn footprint(&self) -> Footprint;
}

/// The sizes behind the bandwidth bound (`GET /version`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    pub kv_bytes_per_token: usize,
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
    qkv: B::Weight,
    qkv_bias: Option<B::Param>,
    qk_norm: Option<(B::Param, B::Param)>,
    o_proj: B::Weight,
    o_bias: Option<B::Param>,
    /// One logit per query head ([`LayerSpec::sinks`]).
    sinks: Option<B::Param>,
    /// On the attention output and on the FFN output, before each residual add
    /// ([`NormPlacement::Sandwich`]).
    post_norms: Option<(B::Param, B::Param)>,
    mlp_norm: B::Param,
    ffn: FfnWeights<B>,
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

/// Reads a tensor and checks its shape; errors name the tensor.
fn read(weights: &mut dyn WeightSource, name: &str, shape: &[usize]) -> anyhow::Result<HostTensor> {
    if !weights.contains(name) {
        bail!("missing tensor `{name}`");
    }
    let t = weights
        .load(name)
        .with_context(|| format!("loading tensor `{name}`"))?;
    ensure!(
        t.shape == shape,
        "tensor `{name}` has shape {:?}, expected {shape:?}",
        t.shape
    );
    Ok(t)
}

/// Stacks 2-D tensors (or 1-D vectors) along the first dimension into `name`. Quantised
/// parts stay quantised, each in its own type (their rows are whole blocks); other mixes
/// of types become f32.
fn concat_rows(name: &str, parts: Vec<HostTensor>) -> HostTensor {
    let rows: usize = parts.iter().map(|p| p.shape[0]).sum();
    let len: usize = parts.iter().map(|p| p.data.len()).sum();
    let mut shape = parts[0].shape.clone();
    shape[0] = rows;
    let same = |f: fn(&TensorData) -> bool| parts.iter().all(|p| f(&p.data));
    let data = if same(|d| matches!(d, TensorData::F16(_))) {
        let mut out = Vec::with_capacity(len);
        for p in &parts {
            if let TensorData::F16(v) = &p.data {
                out.extend_from_slice(v);
            }
        }
        TensorData::F16(out)
    } else if same(|d| matches!(d, TensorData::BF16(_))) {
        let mut out = Vec::with_capacity(len);
        for p in &parts {
            if let TensorData::BF16(v) = &p.data {
                out.extend_from_slice(v);
            }
        }
        TensorData::BF16(out)
    } else if same(|d| matches!(d, TensorData::Quant(..))) {
        let mut stacked: Vec<(QuantType, Vec<u8>)> = Vec::new();
        for p in parts {
            if let TensorData::Quant(q, b) = p.data {
                match stacked.last_mut() {
                    Some((last, bytes)) if *last == q => bytes.extend_from_slice(&b),
                    _ => stacked.push((q, b)),
                }
            }
        }
        if stacked.len() == 1 {
            let (q, b) = stacked.pop().expect("one part");
            TensorData::Quant(q, b)
        } else {
            let types: Vec<String> = stacked.iter().map(|(q, _)| format!("{q:?}")).collect();
            tracing::debug!("`{name}` stacks parts of types {}", types.join(", "));
            TensorData::QuantParts(stacked)
        }
    } else {
        let mut out = Vec::with_capacity(len);
        for p in parts {
            out.extend_from_slice(&p.data.into_f32());
        }
        TensorData::F32(out)
    };
    HostTensor { shape, data }
}

/// A layer's experts under the prefix `p` (`model.layers.N`): the router (`mlp.gate`, or
/// gpt-oss's `mlp.router`) with its bias where the spec has biases, and each expert's gate,
/// up and down projections in one of the layouts files hold them:
/// - per expert, as HF files store Qwen3-MoE (`mlp.experts.E.gate_proj.weight`);
/// - stacked `[experts, rows, cols]`, as GGUF's `ffn_{gate,up,down}_exps` are
///   (`mlp.experts.gate_proj.weight`, biases `mlp.experts.gate_proj.bias`);
/// - gpt-oss's fused gate/up, gate and up rows interleaved, with biases
///   `gate_up_proj_bias` and `down_proj_bias`: as `[experts, out, in]` matrices where the
///   checkpoint holds MXFP4 blocks (`mlp.experts.gate_up_proj.weight`, read from
///   `gate_up_proj_blocks` and `_scales`), or as `x · W` matrices `[experts, in, out]`
///   where it holds them unquantised (`mlp.experts.gate_up_proj`, as `save_pretrained`
///   writes them).
///
/// Quantised experts stay so.
fn load_experts<B: Backend>(
    backend: &B,
    w: &mut dyn WeightSource,
    p: &str,
    e: ExpertSpec,
    h: usize,
    c: &ModelConfig,
) -> anyhow::Result<B::Experts> {
    let (n, inter) = (e.num_experts, e.intermediate_size);
    let router_name = match c.family {
        Family::GptOss => format!("{p}.mlp.router"),
        _ => format!("{p}.mlp.gate"),
    };
    let router = read(w, &format!("{router_name}.weight"), &[n, h])?;
    let router_bias = if e.biases {
        Some(read(w, &format!("{router_name}.bias"), &[n])?)
    } else {
        refuse_undescribed(w, std::iter::once(format!("{router_name}.bias")), c)?;
        None
    };
    let x = format!("{p}.mlp.experts");
    let (gates, ups, downs) = if w.contains(&format!("{x}.0.gate_proj.weight")) {
        let mut parts = [
            ("gate_proj", [inter, h]),
            ("up_proj", [inter, h]),
            ("down_proj", [h, inter]),
        ]
        .map(|(part, shape)| {
            (0..n)
                .map(|i| read(w, &format!("{x}.{i}.{part}.weight"), &shape))
                .collect::<anyhow::Result<Vec<_>>>()
        })
        .into_iter();
        let mut next = || parts.next().expect("three parts");
        (next()?, next()?, next()?)
    } else if w.contains(&format!("{x}.gate_proj.weight")) {
        let mut stack = |part: &str, [rows, cols]: [usize; 2]| {
            let name = format!("{x}.{part}.weight");
            read(w, &name, &[n, rows, cols])?.split_outer(&name)
        };
        (
            stack("gate_proj", [inter, h])?,
            stack("up_proj", [inter, h])?,
            stack("down_proj", [h, inter])?,
        )
    } else if w.contains(&format!("{x}.gate_up_proj.weight")) {
        let name = format!("{x}.gate_up_proj.weight");
        let (gates, ups) = split_gate_up(read(w, &name, &[n, 2 * inter, h])?, &name)?;
        let name = format!("{x}.down_proj.weight");
        (
            gates,
            ups,
            read(w, &name, &[n, h, inter])?.split_outer(&name)?,
        )
    } else if w.contains(&format!("{x}.gate_up_proj")) {
        let name = format!("{x}.gate_up_proj");
        let fused = read(w, &name, &[n, h, 2 * inter])?
            .split_outer(&name)?
            .into_iter()
            .map(|t| t.transposed(&name))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let (gates, ups) = fused
            .into_iter()
            .map(|t| t.split_interleaved_rows(&name))
            .collect::<anyhow::Result<(Vec<_>, Vec<_>)>>()?;
        let name = format!("{x}.down_proj");
        let downs = read(w, &name, &[n, inter, h])?
            .split_outer(&name)?
            .into_iter()
            .map(|t| t.transposed(&name))
            .collect::<anyhow::Result<Vec<_>>>()?;
        (gates, ups, downs)
    } else {
        bail!(
            "the experts of {p}: no tensor per expert (`{x}.0.gate_proj.weight`), stack (GGUF \
             `ffn_*_exps`) or fused gate/up (`{x}.gate_up_proj`, or its MXFP4 `_blocks`)"
        );
    };
    let biases = if e.biases {
        let (gate_b, up_b, down_b) = if w.contains(&format!("{x}.gate_proj.bias")) {
            let mut stack = |part: &str, len: usize| {
                let name = format!("{x}.{part}.bias");
                read(w, &name, &[n, len])?.split_outer(&name)
            };
            (
                stack("gate_proj", inter)?,
                stack("up_proj", inter)?,
                stack("down_proj", h)?,
            )
        } else {
            let name = format!("{x}.gate_up_proj_bias");
            let (gate_b, up_b) = split_gate_up(read(w, &name, &[n, 2 * inter])?, &name)?;
            let name = format!("{x}.down_proj_bias");
            (gate_b, up_b, read(w, &name, &[n, h])?.split_outer(&name)?)
        };
        let fused = gate_b
            .into_iter()
            .zip(up_b)
            .enumerate()
            .map(|(i, (g, u))| concat_rows(&format!("{x}.{i}.gate_up.bias"), vec![g, u]));
        fused.zip(down_b).map(Some).collect()
    } else {
        let names = ["gate_proj.bias", "gate_up_proj_bias", "down_proj_bias"];
        refuse_undescribed(w, names.iter().map(|b| format!("{x}.{b}")), c)?;
        vec![None; n]
    };
    let experts = gates
        .into_iter()
        .zip(ups)
        .zip(downs)
        .zip(biases)
        .enumerate()
        .map(|(i, (((gate, up), down), biases))| HostExpert {
            gate_up: concat_rows(&format!("{x}.{i}.gate_up"), vec![gate, up]),
            down,
            biases,
        })
        .collect();
    backend.upload_experts(
        p,
        HostExperts {
            router,
            router_bias,
            experts,
        },
    )
}

/// A stack of gpt-oss's fused gate/up (matrices `[experts, 2 × width, ..]` or biases
/// `[experts, 2 × width]`), gate and up rows interleaved, into each expert's gate and up.
fn split_gate_up(
    stack: HostTensor,
    name: &str,
) -> anyhow::Result<(Vec<HostTensor>, Vec<HostTensor>)> {
    stack
        .split_outer(name)?
        .into_iter()
        .map(|t| t.split_interleaved_rows(name))
        .collect()
}

impl<B: Backend> Layer<B> {
    fn load(
        backend: &B,
        c: &ModelConfig,
        w: &mut dyn WeightSource,
        i: usize,
        rope: usize,
    ) -> anyhow::Result<Self> {
        let p = format!("model.layers.{i}");
        let spec = c.layers[i].clone();
        let (h, hd) = (c.hidden_size, c.head_dim);
        let (qw, kvw) = (c.num_heads * hd, c.num_kv_heads * hd);
        let norm = |w: &mut dyn WeightSource, name: String, len: usize| {
            backend.upload_param(&name, read_norm(w, &name, len, c.norm_weights)?)
        };
        let qkv_names = ["q_proj", "k_proj", "v_proj"].map(|n| format!("{p}.self_attn.{n}"));
        let widths = [qw, kvw, kvw];
        let fused = c.family.stores_fused_projections();
        let qkv_name = format!("{p}.self_attn.qkv");
        let qkv = if fused {
            read(
                w,
                &format!("{p}.self_attn.qkv_proj.weight"),
                &[qw + 2 * kvw, h],
            )?
        } else {
            let mut parts = Vec::new();
            for (n, &rows) in qkv_names.iter().zip(&widths) {
                parts.push(read(w, &format!("{n}.weight"), &[rows, h])?);
            }
            concat_rows(&qkv_name, parts)
        };
        let qkv = backend.upload_weight(&qkv_name, qkv)?;
        let qkv_bias = if spec.qkv_bias {
            let mut parts = Vec::new();
            for (n, &rows) in qkv_names.iter().zip(&widths) {
                parts.push(read(w, &format!("{n}.bias"), &[rows])?);
            }
            let name = format!("{p}.self_attn.qkv.bias");
            Some(backend.upload_param(&name, concat_rows(&name, parts))?)
        } else {
            refuse_undescribed(w, qkv_names.iter().map(|n| format!("{n}.bias")), c)?;
            None
        };
        let q_norm = format!("{p}.self_attn.q_norm.weight");
        let k_norm = format!("{p}.self_attn.k_norm.weight");
        let qk_norm = if spec.qk_norm {
            Some((norm(w, q_norm, hd)?, norm(w, k_norm, hd)?))
        } else {
            refuse_undescribed(w, [q_norm, k_norm].into_iter(), c)?;
            None
        };
        // Biases no family here has.
        let biases = [
            "self_attn.qkv_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.gate_up_proj",
            "mlp.down_proj",
        ];
        refuse_undescribed(w, biases.iter().map(|n| format!("{p}.{n}.bias")), c)?;
        let o_name = format!("{p}.self_attn.o_proj");
        let o_weight = format!("{o_name}.weight");
        let o_proj = backend.upload_weight(&o_weight, read(w, &o_weight, &[h, qw])?)?;
        let o_bias_name = format!("{o_name}.bias");
        let o_bias = if spec.o_bias {
            Some(backend.upload_param(&o_bias_name, read(w, &o_bias_name, &[h])?)?)
        } else {
            refuse_undescribed(w, std::iter::once(o_bias_name), c)?;
            None
        };
        let sinks_name = format!("{p}.self_attn.sinks");
        let sinks = if spec.sinks {
            let values = read(w, &sinks_name, &[c.num_heads])?;
            Some(backend.upload_param(&sinks_name, values)?)
        } else {
            refuse_undescribed(w, std::iter::once(sinks_name), c)?;
            None
        };
        let ffn = match spec.ffn {
            Ffn::Dense {
                intermediate_size: inter,
            } => {
                let gate_up_name = format!("{p}.mlp.gate_up");
                let gate_up = if fused {
                    read(w, &format!("{p}.mlp.gate_up_proj.weight"), &[2 * inter, h])?
                } else {
                    let gate = read(w, &format!("{p}.mlp.gate_proj.weight"), &[inter, h])?;
                    let up = read(w, &format!("{p}.mlp.up_proj.weight"), &[inter, h])?;
                    concat_rows(&gate_up_name, vec![gate, up])
                };
                let down_name = format!("{p}.mlp.down_proj.weight");
                FfnWeights::Dense {
                    gate_up: backend.upload_weight(&gate_up_name, gate_up)?,
                    down: backend.upload_weight(&down_name, read(w, &down_name, &[h, inter])?)?,
                }
            }
            Ffn::Experts(e) => FfnWeights::Experts(e, load_experts(backend, w, &p, e, h, c)?),
        };
        // Llama's `post_attention_layernorm` is the pre-FFN norm; Gemma's is on the
        // attention output, its pre-FFN norm `pre_feedforward_layernorm`.
        let (mlp_norm, post_norms) = match spec.norms {
            NormPlacement::Pre => {
                let names = ["pre_feedforward_layernorm", "post_feedforward_layernorm"];
                refuse_undescribed(w, names.iter().map(|n| format!("{p}.{n}.weight")), c)?;
                (
                    norm(w, format!("{p}.post_attention_layernorm.weight"), h)?,
                    None,
                )
            }
            NormPlacement::Sandwich => (
                norm(w, format!("{p}.pre_feedforward_layernorm.weight"), h)?,
                Some((
                    norm(w, format!("{p}.post_attention_layernorm.weight"), h)?,
                    norm(w, format!("{p}.post_feedforward_layernorm.weight"), h)?,
                )),
            ),
        };
        Ok(Layer {
            spec,
            rope,
            attn_norm: norm(w, format!("{p}.input_layernorm.weight"), h)?,
            qkv,
            qkv_bias,
            qk_norm,
            o_proj,
            o_bias,
            sinks,
            post_norms,
            mlp_norm,
            ffn,
        })
    }
}

/// An RMSNorm weight of `len` values as the forward multiplies by it: `1 + w` where the
/// file stores Gemma's `w` ([`NormWeights::PlusOne`]).
fn read_norm(
    w: &mut dyn WeightSource,
    name: &str,
    len: usize,
    style: NormWeights,
) -> anyhow::Result<HostTensor> {
    let t = read(w, name, &[len])?;
    Ok(match style {
        NormWeights::AsStored => t,
        NormWeights::PlusOne => HostTensor {
            shape: t.shape,
            data: TensorData::F32(t.data.into_f32().into_iter().map(|v| v + 1.0).collect()),
        },
    })
}

/// Fails on the first of `names` that the weights hold although the family's description
/// has no place for it: a tensor the forward would silently leave out.
fn refuse_undescribed(
    w: &dyn WeightSource,
    mut names: impl Iterator<Item = String>,
    c: &ModelConfig,
) -> anyhow::Result<()> {
    match names.find(|n| w.contains(n)) {
        Some(name) => bail!(
            "tensor `{name}` is not part of the {:?} layer description: the forward would ignore it",
            c.family
        ),
        None => Ok(()),
    }
}

impl<B: Backend> Model<B> {
    /// Loads the weights onto `backend` and allocates the KV cache: as many blocks of
    /// `opts.block_size` tokens as fit in `opts.kv_cache_bytes` (at least one).
    pub fn load(
        backend: B,
        config: &ModelConfig,
        weights: &mut dyn WeightSource,
        opts: &RunnerOptions,
    ) -> anyhow::Result<Self> {
        let c = config;
        ensure!(
            c.num_heads > 0 && c.num_kv_heads > 0 && c.num_heads.is_multiple_of(c.num_kv_heads),
            "num_attention_heads {} is not a multiple of num_key_value_heads {}",
            c.num_heads,
            c.num_kv_heads
        );
        ensure!(
            c.head_dim > 0 && c.head_dim.is_multiple_of(2),
            "head_dim {} must be even",
            c.head_dim
        );
        ensure!(
            c.hidden_size > 0 && c.vocab_size > 0 && c.num_layers() > 0,
            "empty model dimensions in the config"
        );
        refuse_what_it_lacks(&backend, c)?;
        let num_blocks = opts.num_blocks(kv_bytes_per_token(c, backend.kv_value_bytes()))?;
        let embed_name = "model.embed_tokens.weight";
        let embed = backend.upload_weight(
            embed_name,
            read(weights, embed_name, &[c.vocab_size, c.hidden_size])?,
        )?;
        // The head is the embedding table when the config ties them (as transformers ties
        // them, whatever else the file holds), else its own tensor, which must be there.
        let lm_head = if c.tie_word_embeddings {
            None
        } else {
            let t = read(weights, "lm_head.weight", &[c.vocab_size, c.hidden_size])
                .context("the config does not tie the output head to the embeddings")?;
            Some(backend.upload_weight("lm_head.weight", t)?)
        };
        let final_norm = backend.upload_param(
            "model.norm.weight",
            read_norm(weights, "model.norm.weight", c.hidden_size, c.norm_weights)?,
        )?;
        // One RoPE table per distinct spec (most models have one; some one per layer kind).
        let mut ropes: Vec<&RopeSpec> = Vec::new();
        let mut layers = Vec::with_capacity(c.num_layers());
        let mut caches = Vec::with_capacity(c.num_layers());
        for (i, spec) in c.layers.iter().enumerate() {
            let rope = match ropes.iter().position(|r| **r == spec.rope) {
                Some(k) => k,
                None => {
                    ropes.push(&spec.rope);
                    ropes.len() - 1
                }
            };
            layers.push(Layer::load(&backend, c, weights, i, rope)?);
            caches.push(backend.new_kv_cache(
                num_blocks,
                opts.block_size,
                c.num_kv_heads,
                c.head_dim,
            )?);
        }
        let bufs = Buffers {
            x: backend.new_act(),
            h: backend.new_act(),
            qkv: backend.new_act(),
            attn: backend.new_act(),
            o: backend.new_act(),
            post: backend.new_act(),
            gate_up: backend.new_act(),
            act: backend.new_act(),
            down: backend.new_act(),
            last: backend.new_act(),
            logits: backend.new_act(),
        };
        let rope_positions = rope_positions(c, opts.max_model_len)?;
        let table = |name: String, v: Vec<f32>| {
            backend.upload_param(
                &name,
                HostTensor {
                    shape: vec![v.len()],
                    data: TensorData::F32(v),
                },
            )
        };
        let mut rope_tables_on_device = Vec::with_capacity(ropes.len());
        for (k, rope) in ropes.iter().enumerate() {
            let (cos, sin) = rope.tables(rope_positions);
            rope_tables_on_device.push((
                table(format!("rope.{k}.cos"), cos)?,
                table(format!("rope.{k}.sin"), sin)?,
            ));
        }
        let state = ModelState {
            config: c.clone(),
            layout: QkvLayout {
                num_heads: c.num_heads,
                num_kv_heads: c.num_kv_heads,
                head_dim: c.head_dim,
            },
            embed,
            lm_head,
            final_norm,
            layers,
            caches,
            num_blocks,
            block_size: opts.block_size,
            rope_positions,
            ropes: rope_tables_on_device,
            bufs,
            host: HostScratch::default(),
            profile: StepProfile::default(),
        };
        Ok(Model { backend, state })
    }
}

impl<B: Backend> ModelState<B> {
    /// Checks the batch and fills the host scratch (tokens, positions, slots, logits rows).
    fn prepare_inputs<'a>(&mut self, batch: &[SeqInput<'a>]) -> anyhow::Result<Vec<AttnSeq<'a>>> {
        let bs = self.block_size;
        let host = &mut self.host;
        host.tokens.clear();
        host.positions.clear();
        host.slots.clear();
        host.logit_rows.clear();
        let mut seqs = Vec::with_capacity(batch.len());
        for (i, s) in batch.iter().enumerate() {
            ensure!(!s.tokens.is_empty(), "batch entry {i} has no tokens");
            if let Some(&t) = s
                .tokens
                .iter()
                .find(|&&t| t as usize >= self.config.vocab_size)
            {
                bail!(
                    "batch entry {i}: token id {t} is outside the vocabulary ({})",
                    self.config.vocab_size
                );
            }
            let end = s.start_pos + s.tokens.len();
            ensure!(
                end <= self.rope_positions,
                "batch entry {i}: positions up to {end} exceed the model's {}",
                self.rope_positions
            );
            check_block_table(s.block_table, end, bs, self.num_blocks)
                .map_err(|e| anyhow!("batch entry {i}: {e}"))?;
            let row_start = host.tokens.len();
            host.tokens.extend_from_slice(s.tokens);
            for pos in s.start_pos..end {
                host.positions.push(pos as u32);
                host.slots
                    .push(s.block_table[pos / bs] as usize * bs + pos % bs);
            }
            if s.sample.is_some() {
                host.logit_rows.push(host.tokens.len() - 1);
            }
            seqs.push(AttnSeq {
                row_start,
                n_tokens: s.tokens.len(),
                start_pos: s.start_pos,
                block_table: s.block_table,
            });
        }
        Ok(seqs)
    }

    /// Runs the layers and leaves the sampled rows' logits in `bufs.logits`; returns the
    /// device step, or `None` when no entry samples.
    fn run_layers(
        &mut self,
        b: &B,
        batch: &[SeqInput<'_>],
        samples: &[SampleSpec<'_>],
    ) -> anyhow::Result<Option<B::Step>> {
        let started = Instant::now();
        let seqs = self.prepare_inputs(batch)?;
        let step = b.prepare_step(&StepMeta {
            seqs: &seqs,
            tokens: &self.host.tokens,
            positions: &self.host.positions,
            slots: &self.host.slots,
            logit_rows: &self.host.logit_rows,
            samples,
            block_size: self.block_size,
        })?;
        self.profile.prepare_secs = started.elapsed().as_secs_f64();
        b.record_mark(0)?;
        let samples_rows = !self.host.logit_rows.is_empty();
        if !b.replay_layers(&step, &mut self.bufs.logits)? {
            b.begin_layers(&step)?;
            let issued = self.issue_layers(b, &step);
            let ran = b.end_layers(&step, &self.bufs.logits, issued.is_ok())?;
            issued?;
            if !ran {
                self.issue_layers(b, &step)?;
            }
        }
        b.record_mark(1)?;
        Ok(samples_rows.then_some(step))
    }

    /// Issues the layers' ops: embedding, decoder layers, and (when rows are sampled) the
    /// final norm, the sampled rows and the LM head into `bufs.logits`.
    fn issue_layers(&mut self, b: &B, step: &B::Step) -> anyhow::Result<()> {
        let eps = self.config.rms_norm_eps;
        let layout = self.layout;
        let Buffers {
            x,
            h,
            qkv,
            attn,
            o,
            post,
            gate_up,
            act,
            down,
            last,
            logits,
        } = &mut self.bufs;
        b.embed(&self.embed, step, x)?;
        if self.config.embedding_scale != 1.0 {
            b.scale(x, self.config.embedding_scale)?;
        }
        // Where the last FFN's output waits for its residual add: `down`, or `post` after
        // its post-norm.
        let mut ffn_in_post = false;
        for (i, (layer, cache)) in self.layers.iter().zip(self.caches.iter_mut()).enumerate() {
            if i == 0 {
                b.rms_norm(x, &layer.attn_norm, eps, h)?;
            } else {
                let ffn_out = if ffn_in_post { &*post } else { &*down };
                b.add_rms_norm(x, ffn_out, &layer.attn_norm, eps, h)?;
            }
            b.matmul(h, &layer.qkv, layer.qkv_bias.as_ref(), qkv)?;
            if let Some((q_w, k_w)) = &layer.qk_norm {
                b.qk_head_norm(qkv, layout, q_w, k_w, eps)?;
            }
            let (cos, sin) = &self.ropes[layer.rope];
            b.rope(qkv, layout, layer.spec.rope.rotary_dim, cos, sin, step)?;
            let scores = ScoreSpec {
                scale: layer.spec.attn_scale,
                softcap: layer.spec.attn_softcap,
            };
            let span = layer.spec.attention;
            let sinks = layer.sinks.as_ref();
            b.attention(qkv, layout, span, scores, sinks, cache, step, attn)?;
            b.matmul(attn, &layer.o_proj, layer.o_bias.as_ref(), o)?;
            match &layer.post_norms {
                None => b.add_rms_norm(x, o, &layer.mlp_norm, eps, h)?,
                Some((post_attn, _)) => {
                    b.rms_norm(o, post_attn, eps, post)?;
                    b.add_rms_norm(x, post, &layer.mlp_norm, eps, h)?;
                }
            }
            match &layer.ffn {
                FfnWeights::Dense {
                    gate_up: w_gate_up,
                    down: w_down,
                } => {
                    b.matmul(h, w_gate_up, None, gate_up)?;
                    b.gated_activation(gate_up, layer.spec.activation, act)?;
                    b.matmul(act, w_down, None, down)?;
                }
                FfnWeights::Experts(spec, experts) => {
                    let started = Instant::now();
                    b.experts_ffn(h, experts, *spec, layer.spec.activation, down)?;
                    if b.runs_ops_as_issued() {
                        self.profile.experts_secs += started.elapsed().as_secs_f64();
                    }
                }
            }
            ffn_in_post = match &layer.post_norms {
                None => false,
                Some((_, post_ffn)) => {
                    b.rms_norm(down, post_ffn, eps, post)?;
                    true
                }
            };
        }
        if self.host.logit_rows.is_empty() {
            return Ok(());
        }
        let ffn_out = if ffn_in_post { &*post } else { &*down };
        b.add_rms_norm(x, ffn_out, &self.final_norm, eps, h)?;
        b.gather_logit_rows(h, step, last)?;
        b.matmul(
            last,
            self.lm_head.as_ref().unwrap_or(&self.embed),
            None,
            logits,
        )?;
        if let Some(cap) = self.config.final_logit_softcap {
            b.softcap(logits, cap)?;
        }
        Ok(())
    }

    fn forward(&mut self, b: &B, batch: &[SeqInput<'_>]) -> anyhow::Result<Vec<RowSample>> {
        let started = Instant::now();
        self.profile = StepProfile::default();
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let samples: Vec<SampleSpec<'_>> = batch.iter().filter_map(|s| s.sample).collect();
        let (layers_done, out) = match self.run_layers(b, batch, &samples)? {
            Some(step) => {
                let layers_done = started.elapsed().as_secs_f64();
                let out = b.sample(&mut self.bufs.logits, &samples, &step)?;
                b.record_mark(2)?;
                (layers_done, out)
            }
            None => (started.elapsed().as_secs_f64(), Vec::new()),
        };
        // Device timelines where the backend keeps one, else the host's clock.
        let device = |from, to| b.elapsed_between_marks(from, to);
        let host_forward = layers_done - self.profile.prepare_secs;
        self.profile.forward_secs = device(0, 1)?.unwrap_or(host_forward);
        self.profile.sample_secs = if out.is_empty() {
            0.0
        } else {
            let host_sample = started.elapsed().as_secs_f64() - layers_done;
            device(1, 2)?.unwrap_or(host_sample)
        };
        self.profile.wall_secs = started.elapsed().as_secs_f64();
        Ok(out)
    }

    fn logits(&mut self, b: &B, batch: &[SeqInput<'_>]) -> anyhow::Result<Vec<Vec<f32>>> {
        let samples: Vec<SampleSpec<'_>> = batch.iter().filter_map(|s| s.sample).collect();
        match self.run_layers(b, batch, &samples)? {
            Some(_) => {
                // A padded (graph) step has more logits rows than sampled entries.
                let mut rows = b.to_host(&self.bufs.logits)?;
                rows.truncate(samples.len());
                Ok(rows)
            }
            None => Ok(Vec::new()),
        }
    }
}

impl<B: Backend> ModelRunner for Model<B> {
    fn forward(&mut self, batch: &[SeqInput<'_>]) -> anyhow::Result<Vec<RowSample>> {
        let Model { backend, state } = self;
        backend.install(|| state.forward(backend, batch))
    }

    fn logits(&mut self, batch: &[SeqInput<'_>]) -> anyhow::Result<Vec<Vec<f32>>> {
        let Model { backend, state } = self;
        backend.install(|| state.logits(backend, batch))
    }

    fn profile(&self) -> StepProfile {
        self.state.profile
    }

    fn vocab_size(&self) -> usize {
        self.state.config.vocab_size
    }

    fn num_blocks(&self) -> usize {
        self.state.num_blocks
    }

    fn block_size(&self) -> usize {
        self.state.block_size
    }

    fn footprint(&self) -> Footprint {
        let (b, s) = (&self.backend, &self.state);
        let c = &s.config;
        // 1-D parameters are stored as f32 on every backend.
        let mut vector_params = c.hidden_size;
        let mut weight_bytes = 0;
        for l in &s.layers {
            weight_bytes += b.weight_bytes(&l.qkv) + b.weight_bytes(&l.o_proj);
            weight_bytes += match &l.ffn {
                FfnWeights::Dense { gate_up, down } => {
                    b.weight_bytes(gate_up) + b.weight_bytes(down)
                }
                // One sequence's step reads the router and `top_k` experts.
                FfnWeights::Experts(spec, experts) => {
                    let (router, expert) = b.expert_bytes(experts);
                    router + spec.top_k * expert
                }
            };
            vector_params += 2 * c.hidden_size;
            // gpt-oss's router bias, and the biases of the `top_k` experts a token runs.
            if let FfnWeights::Experts(e, _) = &l.ffn {
                if e.biases {
                    vector_params +=
                        e.num_experts + e.top_k * (2 * e.intermediate_size + c.hidden_size);
                }
            }
            if l.qkv_bias.is_some() {
                vector_params += (c.num_heads + 2 * c.num_kv_heads) * c.head_dim;
            }
            if l.o_bias.is_some() {
                vector_params += c.hidden_size;
            }
            if l.sinks.is_some() {
                vector_params += c.num_heads;
            }
            if l.qk_norm.is_some() {
                vector_params += 2 * c.head_dim;
            }
        }
        weight_bytes += b.weight_bytes(s.lm_head.as_ref().unwrap_or(&s.embed))
            + vector_params * std::mem::size_of::<f32>();
        let (q, kv) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        let matrices: usize = c
            .layers
            .iter()
            .map(|l| {
                c.hidden_size * (q + 2 * kv)
                    + q * c.hidden_size
                    + l.ffn.active_matrix_params(c.hidden_size)
            })
            .sum();
        let tables = if s.lm_head.is_some() { 2 } else { 1 };
        Footprint {
            weight_bytes,
            parameters: matrices + tables * c.vocab_size * c.hidden_size + vector_params,
            kv_bytes_per_token: kv_bytes_per_token(c, b.kv_value_bytes()),
            attention_flops_per_context_token: 4 * c.num_layers() * q,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 256-wide quantised tensor of `rows` rows whose blocks' bytes are all `fill`.
    fn quant(kind: QuantType, rows: usize, fill: u8) -> HostTensor {
        HostTensor {
            shape: vec![rows, 256],
            data: TensorData::Quant(kind, vec![fill; rows * kind.block_bytes()]),
        }
    }

    /// Parts of one type fuse into one quantised tensor; parts of different types stay
    /// apart, each run of one type merged, in order.
    #[test]
    fn fused_quantised_parts_keep_their_types() {
        let same = concat_rows(
            "gate_up",
            vec![quant(QuantType::Q4_K, 2, 1), quant(QuantType::Q4_K, 3, 2)],
        );
        assert_eq!(same.shape, [5, 256]);
        let mut bytes = vec![1u8; 2 * 144];
        bytes.extend(vec![2u8; 3 * 144]);
        assert_eq!(same.data, TensorData::Quant(QuantType::Q4_K, bytes.clone()));
        let parts = vec![
            quant(QuantType::Q4_K, 2, 1),
            quant(QuantType::Q4_K, 3, 2),
            quant(QuantType::Q6_K, 1, 3),
        ];
        let mixed = concat_rows("qkv", parts);
        assert_eq!(mixed.shape, [6, 256]);
        assert_eq!(
            mixed.data,
            TensorData::QuantParts(vec![
                (QuantType::Q4_K, bytes),
                (QuantType::Q6_K, vec![3u8; 210])
            ])
        );
        assert_eq!(mixed.data.len(), 6 * 256);
    }
}
