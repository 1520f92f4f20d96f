//! Qwen2, Qwen3 and Qwen3-MoE: Llama's layers with biases on q/k/v (Qwen2) or a per-head
//! RMSNorm on q and k (Qwen3, Qwen3-MoE); a sliding window on the layers from
//! `max_window_layers` on when `use_sliding_window` is set (transformers' rule), or as
//! `layer_types` lists. Qwen3-MoE's FFNs are mixtures of experts except where
//! `mlp_only_layers` and `decoder_sparse_step` keep them dense.

use std::path::Path;

use anyhow::{bail, ensure, Context};
use serde_json::Value;

use super::hf_json::{layer_types, opt_field, req_field};
use super::{
    AttentionSpan, CommonLayer, ExpertSpec, Family, Ffn, GgufMetadata, LayerSpec, Routing,
};

/// `max_position_embeddings` when a config leaves it out (transformers' default).
pub const DEFAULT_MAX_POSITIONS: usize = 32_768;

/// The layers an HF config describes.
pub fn hf_layers(
    json: &Value,
    common: &CommonLayer,
    file: &Path,
) -> anyhow::Result<Vec<LayerSpec>> {
    let family = common.family;
    if family != Family::Qwen2 && opt_field::<bool>(json, "attention_bias", file)? == Some(true) {
        bail!(
            "`attention_bias: true` (biases on the projections) is not supported for {family:?} \
             in {}",
            file.display()
        );
    }
    let mut layers = layers_of(common);
    if family == Family::Qwen3Moe {
        let Some(experts) = hf_experts(json, file)? else {
            // No experts: every layer dense, as transformers builds it.
            return Ok(layers);
        };
        let dense: Vec<usize> = opt_field(json, "mlp_only_layers", file)?.unwrap_or_default();
        let step: usize = opt_field(json, "decoder_sparse_step", file)?.unwrap_or(1);
        ensure!(
            step >= 1,
            "decoder_sparse_step {step} must be at least 1 in {}",
            file.display()
        );
        if let Some(&i) = dense.iter().find(|&&i| i >= layers.len()) {
            bail!(
                "mlp_only_layers names layer {i} of {} in {}",
                layers.len(),
                file.display()
            );
        }
        // transformers' rule (Qwen3MoeDecoderLayer).
        for (i, layer) in layers.iter_mut().enumerate() {
            if !dense.contains(&i) && (i + 1) % step == 0 {
                layer.ffn = Ffn::Experts(experts);
            }
        }
        ensure_dense_width(&layers, common, file)?;
    }
    let spans = match layer_types(json, layers.len(), file)? {
        Some(spans) => spans,
        None => {
            let sliding = opt_field::<bool>(json, "use_sliding_window", file)?.unwrap_or(false);
            let window: usize = opt_field(json, "sliding_window", file)?.unwrap_or(4096);
            let first: usize = opt_field(json, "max_window_layers", file)?.unwrap_or(28);
            (0..layers.len())
                .map(|i| match sliding && window > 0 && i >= first {
                    true => AttentionSpan::Sliding { window },
                    false => AttentionSpan::Full,
                })
                .collect()
        }
    };
    for (layer, span) in layers.iter_mut().zip(spans) {
        layer.attention = span;
    }
    Ok(layers)
}

/// The layers of a `qwen2` or `qwen3` GGUF file (llama.cpp keeps no sliding window for them).
pub fn gguf_layers(common: &CommonLayer) -> Vec<LayerSpec> {
    layers_of(common)
}

/// The expert FFN an HF Qwen3-MoE config describes, `None` for no experts. The expert count
/// is `num_experts` in published configs and `num_local_experts` in those transformers 5
/// writes.
fn hf_experts(json: &Value, file: &Path) -> anyhow::Result<Option<ExpertSpec>> {
    let num_experts: usize = match opt_field(json, "num_experts", file)? {
        Some(n) => n,
        None => opt_field(json, "num_local_experts", file)?.with_context(|| {
            format!(
                "neither `num_experts` nor `num_local_experts` in {}",
                file.display()
            )
        })?,
    };
    if num_experts == 0 {
        return Ok(None);
    }
    let spec = ExpertSpec {
        num_experts,
        top_k: req_field(json, "num_experts_per_tok", file)?,
        intermediate_size: req_field(json, "moe_intermediate_size", file)?,
        routing: Routing::SoftmaxTopK {
            // Qwen3MoeConfig's default.
            renormalise: opt_field(json, "norm_topk_prob", file)?.unwrap_or(false),
        },
        biases: false,
    };
    spec.check("num_experts_per_tok", file)?;
    Ok(Some(spec))
}

/// A dense layer beside the experts needs the dense width.
pub(super) fn ensure_dense_width(
    layers: &[LayerSpec],
    common: &CommonLayer,
    file: &Path,
) -> anyhow::Result<()> {
    if let Some(i) = layers
        .iter()
        .position(|l| matches!(l.ffn, Ffn::Dense { .. }))
    {
        ensure!(
            common.intermediate_size > 0,
            "layer {i} is dense but the file gives no dense FFN width (intermediate_size, \
             feed_forward_length) in {}",
            file.display()
        );
    }
    Ok(())
}

/// The layers of a `qwen3moe` GGUF file: `expert_count`, `expert_used_count` and
/// `expert_feed_forward_length`; a layer with a router (`ffn_gate_inp`) has experts, one
/// without is dense. llama.cpp always renormalises the chosen experts' weights for
/// qwen3moe; `qwen3moe.expert_weights_norm`, which its converter writes for other families,
/// is read when present.
pub fn gguf_moe_layers(
    file: &dyn GgufMetadata,
    common: &CommonLayer,
) -> anyhow::Result<Vec<LayerSpec>> {
    let renormalise = file
        .usize_key("qwen3moe.expert_weights_norm")?
        .is_none_or(|v| v != 0);
    let routing = Routing::SoftmaxTopK { renormalise };
    let spec = ExpertSpec::from_gguf(file, "qwen3moe", routing, false)?;
    let mut layers = layers_of(common);
    for (i, layer) in layers.iter_mut().enumerate() {
        if file.has_tensor(&format!("blk.{i}.ffn_gate_inp.weight")) {
            layer.ffn = Ffn::Experts(spec);
        }
    }
    ensure_dense_width(&layers, common, file.path())?;
    Ok(layers)
}

fn layers_of(common: &CommonLayer) -> Vec<LayerSpec> {
    let family = common.family;
    common
        .uniform()
        .into_iter()
        .map(|layer| LayerSpec {
            qkv_bias: family == Family::Qwen2,
            qk_norm: matches!(family, Family::Qwen3 | Family::Qwen3Moe),
            ..layer
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::read_test_config as read;
    use super::super::with_keys;
    use super::super::{ExpertSpec, Ffn, Routing};

    fn config(extra: serde_json::Value) -> serde_json::Value {
        let json = serde_json::json!({
            "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "num_hidden_layers": 6, "intermediate_size": 96, "vocab_size": 256,
            "num_experts_per_tok": 2, "moe_intermediate_size": 32
        });
        with_keys(json, extra)
    }

    /// The published configs' `num_experts`, experts on every second layer
    /// (`decoder_sparse_step` 2: layers 1, 3, 5) but layer 3 (`mlp_only_layers`), and
    /// transformers' default of no renormalisation.
    #[test]
    fn sparse_step_and_dense_layers_pick_the_expert_layers() {
        let c = read(config(serde_json::json!({
            "num_experts": 8, "decoder_sparse_step": 2, "mlp_only_layers": [3]
        })))
        .unwrap();
        let experts = Ffn::Experts(ExpertSpec {
            num_experts: 8,
            top_k: 2,
            intermediate_size: 32,
            routing: Routing::SoftmaxTopK { renormalise: false },
            biases: false,
        });
        let dense = Ffn::Dense {
            intermediate_size: 96,
        };
        let ffns: Vec<Ffn> = c.layers.iter().map(|l| l.ffn).collect();
        assert_eq!(ffns, [dense, experts, dense, dense, dense, experts]);
    }

    /// No experts is a dense model; a top-k past the experts and a step of 0 are refused by
    /// their keys.
    #[test]
    fn expert_counts_are_checked() {
        let c = read(config(serde_json::json!({"num_experts": 0}))).unwrap();
        assert!(c.layers.iter().all(|l| matches!(l.ffn, Ffn::Dense { .. })));
        let err = read(config(serde_json::json!({"num_experts": 1})))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("num_experts_per_tok 2 must be between 1 and the 1 experts"),
            "{err}"
        );
        let err = read(config(
            serde_json::json!({"num_experts": 4, "decoder_sparse_step": 0}),
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("decoder_sparse_step 0"), "{err}");
        let err = read(config(serde_json::json!({"moe_intermediate_size": 32})))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("neither `num_experts` nor `num_local_experts`"),
            "{err}"
        );
    }
}
