//! What the forward runs: the model's dimensions and a description of every decoder layer
//! (its attention span and score scaling, RoPE table, QK-norm, biases, norm placement,
//! FFN activation, and its FFN: dense of one width, or a mixture of experts), read from HF
//! `config.json` here and from GGUF metadata in
//! `weights::gguf_config`. One module per family (`llama`, `qwen`, `phi3`, `gemma`,
//! `gpt_oss`) maps
//! its keys onto the description, as llama.cpp's per-architecture builders sit over shared
//! pieces; the forward is written once over it.

mod gemma;
mod gpt_oss;
pub mod hf_json;
mod llama;
mod phi3;
mod qwen;
mod qwen_next;
pub mod rope;

use std::path::Path;

use anyhow::{bail, ensure, Context};

use hf_json::{opt_field, req_field, token_id_list};
pub use rope::{
    llama3_rope_factors, llama3_scaling_from_factors, Llama3RopeScaling, LongRopeScaling,
    RopeScaling, RopeSpec, YarnRopeScaling,
};

/// Model family: which module reads its config, and the GGUF conventions of its files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Llama 1/2/3, SmolLM2: plain attention, no biases.
    Llama,
    /// Mistral: Llama's layers, with a sliding window on every layer when set.
    Mistral,
    /// Qwen2: q/k/v projections carry a bias.
    Qwen2,
    /// Qwen3: per-head RMSNorm on q and k before RoPE.
    Qwen3,
    /// Qwen3-MoE: Qwen3's attention, and mixture-of-experts FFNs (dense ones where
    /// `mlp_only_layers` / `decoder_sparse_step` say).
    Qwen3Moe,
    /// Phi-3 and Phi-4: Llama's layers stored with q/k/v and gate/up fused, partial rotary
    /// embeddings and LongRoPE, a sliding window on every layer when set.
    Phi3,
    /// Gemma 2: sandwich norms of `x·(1+w)`, GeGLU, scaled embeddings, sliding and global
    /// layers alternating, soft-capped attention and final logits.
    Gemma2,
    /// Gemma 3: Gemma 2's layers without soft-capping, with per-head QK-norm, five sliding
    /// layers to a global one, each kind with its own RoPE.
    Gemma3,
    /// gpt-oss: biases on every attention projection, learned attention sinks, sliding and
    /// full layers alternating, YaRN, and mixtures of experts with biases, routed by a
    /// softmax over the best `top_k` router logits, through a clamped SwiGLU.
    GptOss,
    /// Qwen3-Next: three Gated DeltaNet layers to one full-attention layer with an output
    /// gate, zero-centred norms (`1 + w`), a quarter of each head rotated, and mixtures of
    /// experts with a gated shared expert; q/k/v/z and b/a projections fused per key head.
    Qwen3Next,
    /// Qwen3.5 (dense): Qwen3-Next's layers with the DeltaNet's projections stored apart.
    Qwen35,
    /// Qwen3.5-MoE: Qwen3.5's layers with Qwen3-Next's experts on every layer.
    Qwen35Moe,
}

impl Family {
    /// From an HF `architectures` entry.
    pub fn from_hf_class(class: &str) -> Option<Family> {
        match class {
            "LlamaForCausalLM" => Some(Family::Llama),
            "MistralForCausalLM" => Some(Family::Mistral),
            "Qwen2ForCausalLM" => Some(Family::Qwen2),
            "Qwen3ForCausalLM" => Some(Family::Qwen3),
            "Qwen3MoeForCausalLM" => Some(Family::Qwen3Moe),
            "Phi3ForCausalLM" => Some(Family::Phi3),
            "Gemma2ForCausalLM" => Some(Family::Gemma2),
            "Gemma3ForCausalLM" => Some(Family::Gemma3),
            "GptOssForCausalLM" => Some(Family::GptOss),
            "Qwen3NextForCausalLM" => Some(Family::Qwen3Next),
            "Qwen3_5ForCausalLM" | "Qwen3_5ForConditionalGeneration" => Some(Family::Qwen35),
            "Qwen3_5MoeForCausalLM" | "Qwen3_5MoeForConditionalGeneration" => {
                Some(Family::Qwen35Moe)
            }
            _ => None,
        }
    }

    /// From a GGUF `general.architecture` value (llama.cpp writes Mistral as `llama`).
    pub fn from_gguf_name(name: &str) -> Option<Family> {
        match name {
            "llama" => Some(Family::Llama),
            "qwen2" => Some(Family::Qwen2),
            "qwen3" => Some(Family::Qwen3),
            "qwen3moe" => Some(Family::Qwen3Moe),
            "phi3" => Some(Family::Phi3),
            "gemma2" => Some(Family::Gemma2),
            "gemma3" => Some(Family::Gemma3),
            "gpt-oss" => Some(Family::GptOss),
            "qwen3next" => Some(Family::Qwen3Next),
            "qwen35" => Some(Family::Qwen35),
            "qwen35moe" => Some(Family::Qwen35Moe),
            _ => None,
        }
    }

    /// Whether llama.cpp's converter interleaved the rows of each q and k head for its
    /// GGUF files (the reader restores HF's rotate-half order).
    pub fn gguf_permutes_qk(self) -> bool {
        matches!(self, Family::Llama | Family::Mistral)
    }

    /// Whether the family's files store q, k and v as one `qkv_proj` (GGUF `attn_qkv`)
    /// and the gate and up projections as one `gate_up_proj` (GGUF `ffn_up`, twice the
    /// FFN width), in the order the forward fuses them.
    pub fn stores_fused_projections(self) -> bool {
        self == Family::Phi3
    }

    /// `tie_word_embeddings` where a config leaves it out (transformers' default, which 4.x
    /// configs omit): Gemma ties its head, the others do not.
    pub fn ties_embeddings_by_default(self) -> bool {
        matches!(self, Family::Gemma2 | Family::Gemma3)
    }

    /// Whether the family's layers have sandwich norms, whose tensors are named apart
    /// from Llama's (HF `pre_feedforward_layernorm`, GGUF `ffn_norm` before the FFN).
    pub fn has_sandwich_norms(self) -> bool {
        matches!(self, Family::Gemma2 | Family::Gemma3)
    }

    /// Whether the family's decoders mix Gated DeltaNet layers with attention layers.
    pub fn is_hybrid(self) -> bool {
        matches!(self, Family::Qwen3Next | Family::Qwen35 | Family::Qwen35Moe)
    }
}

/// Where a layer's RMSNorms sit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormPlacement {
    /// Before attention (`input_layernorm`) and before the FFN (`post_attention_layernorm`).
    Pre,
    /// Gemma's four: before attention (`input_layernorm`), on the attention output before
    /// the residual add (`post_attention_layernorm`), before the FFN
    /// (`pre_feedforward_layernorm`) and on the FFN output (`post_feedforward_layernorm`).
    Sandwich,
}

/// The gated FFN's activation: `act(gate) · up`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    /// SwiGLU: `silu(gate) · up`.
    Silu,
    /// GeGLU with GELU's tanh approximation (`gelu_pytorch_tanh`): Gemma.
    GeluTanh,
    /// gpt-oss's clamped SwiGLU: `(clamp(up, −limit, limit) + 1) · g · σ(alpha · g)` with
    /// `g = min(gate, limit)` (llama.cpp's `swiglu_oai`).
    ClampedSwiglu { alpha: f32, limit: f32 },
}

/// How RMSNorm weights apply to the normalised row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormWeights {
    /// `x̂ · w`.
    AsStored,
    /// `x̂ · (1 + w)`: Gemma's safetensors. llama.cpp's converter adds the 1 into GGUF
    /// files, which therefore read as [`NormWeights::AsStored`].
    PlusOne,
}

/// A decoder layer's feed-forward network: `down(act(gate(x)) · up(x))`, once or per expert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ffn {
    /// One gated FFN of this width.
    Dense { intermediate_size: usize },
    /// A mixture of experts.
    Experts(ExpertSpec),
}

impl Ffn {
    /// The width of the gated FFN one token runs through (an expert's for experts).
    pub fn width(self) -> usize {
        match self {
            Ffn::Dense { intermediate_size } => intermediate_size,
            Ffn::Experts(e) => e.intermediate_size,
        }
    }

    /// Parameters of its matrices for a model of width `hidden`: every expert's and the
    /// router's.
    pub fn matrix_params(self, hidden: usize) -> usize {
        match self {
            Ffn::Dense { intermediate_size } => 3 * hidden * intermediate_size,
            Ffn::Experts(e) => e.num_experts * (3 * hidden * e.intermediate_size + hidden),
        }
    }

    /// Parameters of its matrices one token reads: the router and its `top_k` experts.
    pub fn active_matrix_params(self, hidden: usize) -> usize {
        match self {
            Ffn::Dense { .. } => self.matrix_params(hidden),
            Ffn::Experts(e) => e.top_k * 3 * hidden * e.intermediate_size + e.num_experts * hidden,
        }
    }
}

/// A mixture-of-experts FFN: a linear router scores every expert for each token; the
/// token runs through the `top_k` best, and its output is their sum weighted as `routing`
/// says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertSpec {
    pub num_experts: usize,
    pub top_k: usize,
    /// Each expert's gated FFN width (`moe_intermediate_size`).
    pub intermediate_size: usize,
    pub routing: Routing,
    /// The router and every expert projection carry a bias (gpt-oss).
    pub biases: bool,
}

impl ExpertSpec {
    /// The experts of an `arch` GGUF file (`{arch}.expert_count`, `expert_used_count` and
    /// `expert_feed_forward_length`), routed and biased as its family's are, checked.
    pub fn from_gguf(
        file: &dyn GgufMetadata,
        arch: &str,
        routing: Routing,
        biases: bool,
    ) -> anyhow::Result<ExpertSpec> {
        let key = |k: &str| format!("{arch}.{k}");
        let required = |k: &str| file.required_usize(&key(k));
        let spec = ExpertSpec {
            num_experts: required("expert_count")?,
            top_k: required("expert_used_count")?,
            intermediate_size: required("expert_feed_forward_length")?,
            routing,
            biases,
        };
        spec.check(&key("expert_used_count"), file.path())?;
        Ok(spec)
    }

    /// Checks the counts read from `file`, naming the top-k's key.
    pub fn check(self, top_k_key: &str, file: &Path) -> anyhow::Result<()> {
        ensure!(
            (1..=self.num_experts).contains(&self.top_k),
            "{top_k_key} {} must be between 1 and the {} experts in {}",
            self.top_k,
            self.num_experts,
            file.display()
        );
        ensure!(
            self.intermediate_size > 0,
            "the experts' FFN width is 0 in {}",
            file.display()
        );
        Ok(())
    }
}

/// How a token's router logits become its experts' weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routing {
    /// Softmax over every expert, then the `top_k` most probable, renormalised to sum to 1
    /// when `renormalise` (Qwen3-MoE's `norm_topk_prob`).
    SoftmaxTopK { renormalise: bool },
    /// The `top_k` largest logits, then a softmax over them (gpt-oss).
    TopKSoftmax,
}

/// How far back a layer's queries attend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionSpan {
    /// Every earlier position.
    Full,
    /// The last `window` positions, the query's own included (transformers' and vLLM's
    /// `sliding_window`: key `k` is seen from query `q` when `q - window < k <= q`).
    Sliding { window: usize },
}

/// How a layer mixes information across positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mixer {
    /// Softmax attention over the KV cache, as [`LayerSpec::attention`] says; with
    /// `output_gate`, `q_proj` also gives a gate per head and the attention output is
    /// multiplied by its sigmoid before `o_proj` (Qwen3-Next, Qwen3.5).
    Attention { output_gate: bool },
    /// A Gated DeltaNet (linear attention with a recurrent state per sequence).
    GatedDeltaNet(DeltaNetSpec),
}

/// Which key head a DeltaNet value head reads, as a file orders the value heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueHeadOrder {
    /// HF's: key head `h` serves value heads `h·r … h·r + r − 1` (`r = value / key heads`).
    Grouped,
    /// llama.cpp's `qwen35` / `qwen35moe` files: value head `j` reads key head `j mod n_k`.
    Tiled,
}

/// A Gated DeltaNet layer's shape (Qwen3-Next's `linear_*` keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaNetSpec {
    pub num_key_heads: usize,
    pub num_value_heads: usize,
    pub key_head_dim: usize,
    pub value_head_dim: usize,
    /// The causal depthwise convolution's width over q, k and v.
    pub conv_kernel: usize,
    pub value_head_order: ValueHeadOrder,
}

impl DeltaNetSpec {
    /// Width of all query (or key) heads.
    pub fn key_width(self) -> usize {
        self.num_key_heads * self.key_head_dim
    }

    /// Width of all value heads (and of the output gate z).
    pub fn value_width(self) -> usize {
        self.num_value_heads * self.value_head_dim
    }

    /// Channels the convolution runs over: q, k and v.
    pub fn conv_channels(self) -> usize {
        2 * self.key_width() + self.value_width()
    }

    /// Columns of the fused input projection: q, k, v, then z, then b and a (one per
    /// value head each).
    pub fn projection_width(self) -> usize {
        self.conv_channels() + self.value_width() + 2 * self.num_value_heads
    }

    /// The key head value head `j` reads.
    pub fn key_head(self, j: usize) -> usize {
        match self.value_head_order {
            ValueHeadOrder::Grouped => j / (self.num_value_heads / self.num_key_heads),
            ValueHeadOrder::Tiled => j % self.num_key_heads,
        }
    }

    /// f32 values of one sequence's state in one layer: every value head's
    /// `key_head_dim × value_head_dim` matrix, then the convolution's last
    /// `conv_kernel − 1` inputs of every channel.
    pub fn state_values(self) -> usize {
        self.num_value_heads * self.key_head_dim * self.value_head_dim
            + (self.conv_kernel - 1) * self.conv_channels()
    }
}

/// What one decoder layer computes, as the forward reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerSpec {
    /// Attention or a recurrent mixer; the attention fields below apply to attention only.
    pub mixer: Mixer,
    pub attention: AttentionSpan,
    pub rope: RopeSpec,
    /// Per-head RMSNorm on q and k before RoPE (Qwen3).
    pub qk_norm: bool,
    /// Biases on the q, k and v projections (Qwen2, gpt-oss).
    pub qkv_bias: bool,
    /// A bias on the output projection (gpt-oss).
    pub o_bias: bool,
    /// A learned logit per query head that joins its softmax's denominator and takes no
    /// value (gpt-oss's `sinks`).
    pub sinks: bool,
    /// The factor on q·k: `head_dim^-0.5`, or Gemma's `query_pre_attn_scalar^-0.5`.
    pub attn_scale: f32,
    /// Attention logits soft-capped to `cap · tanh(s / cap)` after scaling (Gemma 2).
    pub attn_softcap: Option<f32>,
    pub norms: NormPlacement,
    pub activation: Activation,
    pub ffn: Ffn,
    /// The width of a shared expert beside the experts: a gated FFN every token runs,
    /// added times the sigmoid of a scalar gate (`shared_expert_gate`) per token.
    pub shared_expert: Option<usize>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub family: Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// The factor on the embedding rows (Gemma's `√hidden_size`; 1 elsewhere).
    pub embedding_scale: f32,
    /// The output logits soft-capped to `cap · tanh(l / cap)` (Gemma 2).
    pub final_logit_softcap: Option<f32>,
    /// How every RMSNorm weight (layers, QK-norm, final) applies.
    pub norm_weights: NormWeights,
    /// One per decoder layer, in order.
    pub layers: Vec<LayerSpec>,
}

/// What every family's layers share, read before the family's own keys.
#[derive(Debug, Clone)]
pub struct CommonLayer {
    pub family: Family,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub rope: RopeSpec,
    /// The dense FFN's width.
    pub intermediate_size: usize,
    pub head_dim: usize,
}

impl CommonLayer {
    /// `num_layers` Llama layers: full attention scaled by `head_dim^-0.5`, pre-norms,
    /// SwiGLU, no QK-norm and no biases.
    pub fn uniform(&self) -> Vec<LayerSpec> {
        vec![
            LayerSpec {
                mixer: Mixer::Attention { output_gate: false },
                attention: AttentionSpan::Full,
                rope: self.rope.clone(),
                qk_norm: false,
                qkv_bias: false,
                o_bias: false,
                sinks: false,
                attn_scale: (self.head_dim as f32).powf(-0.5),
                attn_softcap: None,
                norms: NormPlacement::Pre,
                activation: Activation::Silu,
                ffn: Ffn::Dense {
                    intermediate_size: self.intermediate_size,
                },
                shared_expert: None,
            };
            self.num_layers
        ]
    }

    /// [`CommonLayer::uniform`]'s layers with `rope` and `attention` on every one.
    pub fn uniform_with(&self, rope: &RopeSpec, attention: AttentionSpan) -> Vec<LayerSpec> {
        let mut layers = self.uniform();
        for layer in &mut layers {
            layer.rope = rope.clone();
            layer.attention = attention;
        }
        layers
    }
}

/// What a family adds to the model beside its layers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelExtras {
    pub embedding_scale: f32,
    pub final_logit_softcap: Option<f32>,
    pub norm_weights: NormWeights,
}

impl ModelExtras {
    /// Llama's: none.
    pub const NONE: ModelExtras = ModelExtras {
        embedding_scale: 1.0,
        final_logit_softcap: None,
        norm_weights: NormWeights::AsStored,
    };
}

/// What a family reads from a GGUF file's metadata and tensor list, implemented by
/// `weights::gguf::GgufFile` (so that `config` does not depend on `weights`).
pub trait GgufMetadata {
    /// The file, for error messages.
    fn path(&self) -> &Path;
    fn has_tensor(&self, name: &str) -> bool;
    /// An integer key, if the file has it.
    fn usize_key(&self, key: &str) -> anyhow::Result<Option<usize>>;
    /// A float key, if the file has it.
    fn f64_key(&self, key: &str) -> anyhow::Result<Option<f64>>;
    /// An integer key the family needs: an error naming it when the file lacks it.
    fn required_usize(&self, key: &str) -> anyhow::Result<usize> {
        self.usize_key(key)?
            .with_context(|| format!("missing metadata key `{key}` in {}", self.path().display()))
    }
    /// An array of integers or booleans, if the file has one under the key.
    fn int_array_key(&self, key: &str) -> anyhow::Result<Option<Vec<i64>>>;
    /// A tensor's values as f32 (small tables such as `rope_freqs.weight`).
    fn tensor_f32(&self, name: &str) -> anyhow::Result<Vec<f32>>;

    /// The window `{arch}.attention.sliding_window` sets on every layer (absent or 0: full
    /// attention).
    fn window_on_every_layer(&self, arch: &str) -> anyhow::Result<AttentionSpan> {
        Ok(
            match self.usize_key(&format!("{arch}.attention.sliding_window"))? {
                Some(window) if window > 0 => AttentionSpan::Sliding { window },
                _ => AttentionSpan::Full,
            },
        )
    }
}

impl ModelConfig {
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Reads an HF `config.json` (transformers 4 and 5 key styles). When a
    /// `generation_config.json` sits beside it, its `eos_token_id`s are added.
    pub fn from_hf_config(file: &Path) -> anyhow::Result<ModelConfig> {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("invalid JSON in {}", file.display()))?;
        let classes: Vec<String> = req_field(&json, "architectures", file)?;
        let class = classes
            .first()
            .with_context(|| format!("empty `architectures` in {}", file.display()))?;
        let family = Family::from_hf_class(class)
            .with_context(|| format!("unsupported architecture {class} in {}", file.display()))?;
        let json = text_decoder_config(json);

        let hidden_size: usize = req_field(&json, "hidden_size", file)?;
        let num_heads: usize = req_field(&json, "num_attention_heads", file)?;
        let head_dim = match opt_field(&json, "head_dim", file)? {
            Some(head_dim) => head_dim,
            None if num_heads > 0 && hidden_size.is_multiple_of(num_heads) => {
                hidden_size / num_heads
            }
            None => bail!(
                "num_attention_heads {num_heads} does not divide hidden_size {hidden_size} in {}",
                file.display()
            ),
        };
        // A Qwen3-MoE config whose every layer has experts may leave the dense width out.
        let intermediate_size = match opt_field(&json, "intermediate_size", file)? {
            Some(width) => width,
            None if matches!(family, Family::Qwen3Moe | Family::Qwen35Moe) => 0,
            None => req_field(&json, "intermediate_size", file)?,
        };
        let common = CommonLayer {
            family,
            hidden_size,
            num_layers: req_field(&json, "num_hidden_layers", file)?,
            rope: hf_json::rope(&json, head_dim, file)?,
            intermediate_size,
            head_dim,
        };
        let mut extras = ModelExtras::NONE;
        let (layers, default_max_pos) = match family {
            Family::Llama | Family::Mistral => (
                llama::hf_layers(&json, &common, file)?,
                llama::default_max_positions(family),
            ),
            Family::Qwen2 | Family::Qwen3 | Family::Qwen3Moe => (
                qwen::hf_layers(&json, &common, file)?,
                qwen::DEFAULT_MAX_POSITIONS,
            ),
            Family::Phi3 => (
                phi3::hf_layers(&json, &common, file)?,
                phi3::DEFAULT_MAX_POSITIONS,
            ),
            Family::Gemma2 | Family::Gemma3 => {
                let (layers, gemma) = gemma::hf_layers(&json, &common, file)?;
                extras = gemma;
                (layers, gemma::default_max_positions(family))
            }
            Family::GptOss => (
                gpt_oss::hf_layers(&json, &common, file)?,
                gpt_oss::DEFAULT_MAX_POSITIONS,
            ),
            Family::Qwen3Next | Family::Qwen35 | Family::Qwen35Moe => {
                extras.norm_weights = NormWeights::PlusOne;
                (
                    qwen_next::hf_layers(&json, &common, file)?,
                    qwen_next::DEFAULT_MAX_POSITIONS,
                )
            }
        };

        let mut eos_token_ids = token_id_list(&json, "eos_token_id", file)?;
        let generation_file = file.with_file_name("generation_config.json");
        if generation_file.is_file() {
            let text = std::fs::read_to_string(&generation_file)
                .with_context(|| format!("cannot read {}", generation_file.display()))?;
            let generation: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("invalid JSON in {}", generation_file.display()))?;
            for id in token_id_list(&generation, "eos_token_id", &generation_file)? {
                if !eos_token_ids.contains(&id) {
                    eos_token_ids.push(id);
                }
            }
        }

        Ok(ModelConfig {
            family,
            vocab_size: req_field(&json, "vocab_size", file)?,
            hidden_size,
            num_heads,
            num_kv_heads: opt_field(&json, "num_key_value_heads", file)?.unwrap_or(num_heads),
            head_dim,
            rms_norm_eps: opt_field::<f64>(&json, "rms_norm_eps", file)?.unwrap_or(1e-6) as f32,
            max_position_embeddings: opt_field(&json, "max_position_embeddings", file)?
                .unwrap_or(default_max_pos),
            tie_word_embeddings: opt_field(&json, "tie_word_embeddings", file)?
                .unwrap_or(family.ties_embeddings_by_default()),
            bos_token_id: opt_field(&json, "bos_token_id", file)?,
            eos_token_ids,
            embedding_scale: extras.embedding_scale,
            final_logit_softcap: extras.final_logit_softcap,
            norm_weights: extras.norm_weights,
            layers,
        })
    }
}

/// A multimodal checkpoint's config (Qwen3.5's `*ForConditionalGeneration`) keeps its text
/// decoder's keys in `text_config`: those, with the top-level keys it leaves out.
fn text_decoder_config(json: serde_json::Value) -> serde_json::Value {
    let serde_json::Value::Object(mut top) = json else {
        return json;
    };
    match top.remove("text_config") {
        Some(serde_json::Value::Object(mut text)) => {
            for (key, value) in top {
                text.entry(key).or_insert(value);
            }
            serde_json::Value::Object(text)
        }
        other => {
            if let Some(other) = other {
                top.insert("text_config".into(), other);
            }
            serde_json::Value::Object(top)
        }
    }
}

/// The layers of a GGUF file whose shared keys gave `common`, and what its family adds
/// beside them.
pub fn gguf_layers(
    file: &dyn GgufMetadata,
    common: &CommonLayer,
) -> anyhow::Result<(Vec<LayerSpec>, ModelExtras)> {
    let plain = |layers| Ok((layers, ModelExtras::NONE));
    match common.family {
        Family::Llama | Family::Mistral => plain(llama::gguf_layers(file, common)?),
        Family::Qwen2 | Family::Qwen3 => plain(qwen::gguf_layers(common)),
        Family::Qwen3Moe => plain(qwen::gguf_moe_layers(file, common)?),
        Family::Phi3 => plain(phi3::gguf_layers(file, common)?),
        Family::Gemma2 | Family::Gemma3 => gemma::gguf_layers(file, common),
        Family::GptOss => plain(gpt_oss::gguf_layers(file, common)?),
        Family::Qwen3Next | Family::Qwen35 | Family::Qwen35Moe => {
            plain(qwen_next::gguf_layers(file, common)?)
        }
    }
}

/// `base` with the keys of `extra` added or replaced (the families' tests' configs).
#[cfg(test)]
pub(crate) fn with_keys(
    mut base: serde_json::Value,
    extra: serde_json::Value,
) -> serde_json::Value {
    if let (Some(base), serde_json::Value::Object(extra)) = (base.as_object_mut(), extra) {
        base.extend(extra);
    }
    base
}

/// The config a `config.json` of `json` reads as (the unit tests of the families' modules).
#[cfg(test)]
pub(crate) fn read_test_config(json: serde_json::Value) -> anyhow::Result<ModelConfig> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("config.json");
    std::fs::write(&path, json.to_string())?;
    ModelConfig::from_hf_config(&path)
}

/// A two-layer Llama of head dimension 128 (RoPE base 500,000), for the unit tests of the
/// modules that read a config.
#[cfg(test)]
pub(crate) fn test_llama() -> ModelConfig {
    let common = CommonLayer {
        family: Family::Llama,
        hidden_size: 8,
        num_layers: 2,
        rope: RopeSpec {
            theta: 500_000.0,
            rotary_dim: 128,
            scaling: None,
        },
        intermediate_size: 8,
        head_dim: 128,
    };
    ModelConfig {
        family: Family::Llama,
        vocab_size: 8,
        hidden_size: 8,
        num_heads: 1,
        num_kv_heads: 1,
        head_dim: 128,
        rms_norm_eps: 1e-5,
        max_position_embeddings: 131_072,
        tie_word_embeddings: true,
        bos_token_id: None,
        eos_token_ids: vec![],
        embedding_scale: 1.0,
        final_logit_softcap: None,
        norm_weights: NormWeights::AsStored,
        layers: common.uniform(),
    }
}
