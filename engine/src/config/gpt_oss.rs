//! gpt-oss: Llama's pre-norm layers with biases on q, k, v and o, a learned attention sink
//! per query head, sliding (`sliding_window`, 128) and full layers alternating as
//! `layer_types` lists them (sliding first, transformers' default), YaRN, and on every
//! layer a mixture of experts with biases, routed by a softmax over the `top_k` best
//! router logits, through the clamped SwiGLU (`swiglu_alpha`, `swiglu_limit`).

use std::path::Path;

use serde_json::Value;

use super::hf_json::{layer_types, opt_field, req_field};
use super::{
    Activation, AttentionSpan, CommonLayer, ExpertSpec, Ffn, GgufMetadata, LayerSpec, Routing,
};

/// `max_position_embeddings` when a config leaves it out (`GptOssConfig`'s default).
pub const DEFAULT_MAX_POSITIONS: usize = 131_072;

/// The clamped SwiGLU's constants in every published gpt-oss (`GptOssConfig`'s defaults;
/// llama.cpp's `swiglu_oai` hard-codes them).
const ALPHA: f32 = 1.702;
const LIMIT: f32 = 7.0;

/// The window of the published models' sliding layers, for files without the key
/// (`GptOssConfig`'s default).
const DEFAULT_WINDOW: usize = 128;

/// The layers an HF config describes.
pub fn hf_layers(
    json: &Value,
    common: &CommonLayer,
    file: &Path,
) -> anyhow::Result<Vec<LayerSpec>> {
    let experts = ExpertSpec {
        num_experts: req_field(json, "num_local_experts", file)?,
        top_k: req_field(json, "num_experts_per_tok", file)?,
        intermediate_size: common.intermediate_size,
        routing: Routing::TopKSoftmax,
        biases: true,
    };
    experts.check("num_experts_per_tok", file)?;
    let activation = Activation::ClampedSwiglu {
        alpha: opt_field::<f64>(json, "swiglu_alpha", file)?.map_or(ALPHA, |a| a as f32),
        limit: opt_field::<f64>(json, "swiglu_limit", file)?.map_or(LIMIT, |l| l as f32),
    };
    let biases = opt_field::<bool>(json, "attention_bias", file)?.unwrap_or(true);
    let window: usize = opt_field(json, "sliding_window", file)?.unwrap_or(DEFAULT_WINDOW);
    let mut with_window = json.clone();
    with_window["sliding_window"] = window.into();
    let spans = match layer_types(&with_window, common.num_layers, file)? {
        Some(spans) => spans,
        None => alternating(common.num_layers, window),
    };
    Ok(layers(common, spans, experts, activation, biases))
}

/// The layers of a `gpt-oss` GGUF file, as llama.cpp reads them: `expert_count`,
/// `expert_used_count` and `expert_feed_forward_length`, the window from
/// `attention.sliding_window`, every even layer sliding. The clamped SwiGLU's constants
/// are the published ones (llama.cpp's converter writes neither). The RoPE's YaRN is not
/// truncated, as transformers and OpenAI's reference run gpt-oss (`truncate: false`),
/// where llama.cpp rounds YaRN's correction range for every model.
pub fn gguf_layers(
    file: &dyn GgufMetadata,
    common: &CommonLayer,
) -> anyhow::Result<Vec<LayerSpec>> {
    let key = |k: &str| format!("gpt-oss.{k}");
    let experts = ExpertSpec::from_gguf(file, "gpt-oss", Routing::TopKSoftmax, true)?;
    let window = file
        .usize_key(&key("attention.sliding_window"))?
        .unwrap_or(DEFAULT_WINDOW);
    let mut common = common.clone();
    if let Some(super::RopeScaling::Yarn(yarn)) = &mut common.rope.scaling {
        yarn.truncate = false;
    }
    let activation = Activation::ClampedSwiglu {
        alpha: ALPHA,
        limit: LIMIT,
    };
    let spans = alternating(common.num_layers, window);
    Ok(layers(&common, spans, experts, activation, true))
}

/// Sliding layers first, then full, alternating (transformers' default `layer_types` and
/// llama.cpp's pattern of 2).
fn alternating(num_layers: usize, window: usize) -> Vec<AttentionSpan> {
    (0..num_layers)
        .map(|i| match i % 2 == 0 && window > 0 {
            true => AttentionSpan::Sliding { window },
            false => AttentionSpan::Full,
        })
        .collect()
}

fn layers(
    common: &CommonLayer,
    spans: Vec<AttentionSpan>,
    experts: ExpertSpec,
    activation: Activation,
    biases: bool,
) -> Vec<LayerSpec> {
    common
        .uniform()
        .into_iter()
        .zip(spans)
        .map(|(layer, attention)| LayerSpec {
            attention,
            qkv_bias: biases,
            o_bias: biases,
            sinks: true,
            activation,
            ffn: Ffn::Experts(experts),
            ..layer
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::read_test_config as read;
    use super::super::{Activation, AttentionSpan, Ffn, RopeScaling, Routing};

    /// gpt-oss-20b's published config.json, its layers cut to four.
    fn published() -> serde_json::Value {
        serde_json::json!({
            "architectures": ["GptOssForCausalLM"], "attention_bias": true,
            "attention_dropout": 0.0, "eos_token_id": 200002, "experts_per_token": 4,
            "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
            "initial_context_length": 4096, "initializer_range": 0.02,
            "intermediate_size": 2880,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention",
                            "full_attention"],
            "max_position_embeddings": 131072, "model_type": "gpt_oss",
            "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 4,
            "num_key_value_heads": 8, "num_local_experts": 32, "output_router_logits": false,
            "pad_token_id": 199999,
            "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn",
                "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
                "quant_method": "mxfp4"},
            "rms_norm_eps": 1e-05,
            "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                             "original_max_position_embeddings": 4096, "rope_type": "yarn",
                             "truncate": false},
            "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
            "swiglu_limit": 7.0, "tie_word_embeddings": false, "use_cache": true,
            "vocab_size": 201088
        })
    }

    #[test]
    fn the_published_config_reads_as_its_layers() {
        let c = read(published()).unwrap();
        assert_eq!(c.num_layers(), 4);
        assert_eq!(c.eos_token_ids, [200002]);
        assert!(!c.tie_word_embeddings);
        let spans: Vec<AttentionSpan> = c.layers.iter().map(|l| l.attention).collect();
        let sliding = AttentionSpan::Sliding { window: 128 };
        assert_eq!(
            spans,
            [sliding, AttentionSpan::Full, sliding, AttentionSpan::Full]
        );
        let l = &c.layers[0];
        assert!(l.qkv_bias && l.o_bias && l.sinks && !l.qk_norm);
        assert_eq!(
            l.activation,
            Activation::ClampedSwiglu {
                alpha: 1.702,
                limit: 7.0
            }
        );
        let Ffn::Experts(e) = l.ffn else {
            panic!("dense FFN")
        };
        assert_eq!((e.num_experts, e.top_k, e.intermediate_size), (32, 4, 2880));
        assert_eq!(e.routing, Routing::TopKSoftmax);
        assert!(e.biases);
        let Some(RopeScaling::Yarn(y)) = &l.rope.scaling else {
            panic!("{:?}", l.rope)
        };
        assert!(!y.truncate);
        assert_eq!((y.factor, y.original_max_position_embeddings), (32.0, 4096));
        assert_eq!(l.rope.theta, 150_000.0);
        assert!((l.attn_scale - 0.125).abs() < 1e-7);
    }

    /// Without `layer_types`, layers alternate from a sliding one; a top-k past the
    /// experts is refused by its key.
    #[test]
    fn defaults_and_refusals() {
        let mut json = published();
        json.as_object_mut().unwrap().remove("layer_types");
        json["sliding_window"] = 5.into();
        let c = read(json.clone()).unwrap();
        let mut listed = published();
        listed.as_object_mut().unwrap().remove("sliding_window");
        let default = read(listed).unwrap();
        assert_eq!(
            default.layers[0].attention,
            AttentionSpan::Sliding { window: 128 },
            "GptOssConfig's default window"
        );
        let sliding: Vec<bool> = c
            .layers
            .iter()
            .map(|l| matches!(l.attention, AttentionSpan::Sliding { window: 5 }))
            .collect();
        assert_eq!(sliding, [true, false, true, false]);
        json["num_experts_per_tok"] = 33.into();
        let err = read(json).unwrap_err().to_string();
        assert!(
            err.contains("num_experts_per_tok 33 must be between 1 and the 32 experts"),
            "{err}"
        );
    }
}
