//! Qwen2, Qwen3 and Qwen3-MoE: Llama's layers with biases on q/k/v (Qwen2) or a per-head
//! RMSNorm on q and k (Qwen3, Qwen3-MoE); a sliding window on the layers from
//! `max_window_layers` on when `use_sliding_window` is set (transformers' rule), or as
//! `layer_types` lists. Qwen3-MoE's FFNs are mixtures of experts except where
//! `mlp_only_layers` and `decoder_sparse_step` keep them dense.

use std::path::Path;

use anyhow::{bail, ensure, Context};
use serde_json::Value;

use super::hf_json::{layer_types, opt_field, req_field};
use super::{AttentionSpan, CommonLayer, ExpertSpec, Family, Ffn, GgufMetadata, LayerSpec};

/// `max_position_embeddings` when a config leaves it out (transformers' default).
pub const DEFAULT_MAX_POSITIONS: usize = 32_768;

/// The layers an HF config describes.
pub fn hf_layers(
    family: Family,
    json: &Value,
    common: &CommonLayer,
    file: &Path,
) -> anyhow::Result<Vec<LayerSpec>> {
    if family != Family::Qwen2 && opt_field::<bool>(json, "attention_bias", file)? == Some(true) {
        bail!(
            "`attention_bias: true` (biases on the projections) is not supported for {family:?} \
             in {}",
            file.display()
        );
    }
    let mut layers = layers_of(family, common);
    if family == Family::Qwen3Moe {
        let experts = hf_experts(json, file)?;
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
pub fn gguf_layers(family: Family, common: &CommonLayer) -> Vec<LayerSpec> {
    layers_of(family, common)
}

/// The expert FFN an HF Qwen3-MoE config describes. The expert count is `num_experts` in
/// published configs and `num_local_experts` in those transformers 5 writes.
fn hf_experts(json: &Value, file: &Path) -> anyhow::Result<ExpertSpec> {
    let num_experts: usize = match opt_field(json, "num_experts", file)? {
        Some(n) => n,
        None => opt_field(json, "num_local_experts", file)?.with_context(|| {
            format!(
                "neither `num_experts` nor `num_local_experts` in {}",
                file.display()
            )
        })?,
    };
    let spec = ExpertSpec {
        num_experts,
        top_k: req_field(json, "num_experts_per_tok", file)?,
        intermediate_size: req_field(json, "moe_intermediate_size", file)?,
        // Qwen3MoeConfig's default.
        norm_topk_prob: opt_field(json, "norm_topk_prob", file)?.unwrap_or(false),
    };
    check_experts(spec, "num_experts_per_tok", file)?;
    Ok(spec)
}

fn check_experts(spec: ExpertSpec, top_k_key: &str, file: &Path) -> anyhow::Result<()> {
    ensure!(
        (1..=spec.num_experts).contains(&spec.top_k),
        "{top_k_key} {} must be between 1 and the {} experts in {}",
        spec.top_k,
        spec.num_experts,
        file.display()
    );
    ensure!(
        spec.intermediate_size > 0,
        "the experts' FFN width is 0 in {}",
        file.display()
    );
    Ok(())
}

/// A dense layer beside the experts needs the dense width.
fn ensure_dense_width(
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
    let key = |k: &str| format!("qwen3moe.{k}");
    let required = |k: &str| -> anyhow::Result<usize> {
        file.usize_key(&key(k))?.with_context(|| {
            format!(
                "missing metadata key `{}` in {}",
                key(k),
                file.path().display()
            )
        })
    };
    let spec = ExpertSpec {
        num_experts: required("expert_count")?,
        top_k: required("expert_used_count")?,
        intermediate_size: required("expert_feed_forward_length")?,
        norm_topk_prob: file
            .usize_key(&key("expert_weights_norm"))?
            .is_none_or(|v| v != 0),
    };
    check_experts(spec, &key("expert_used_count"), file.path())?;
    let mut layers = layers_of(Family::Qwen3Moe, common);
    for (i, layer) in layers.iter_mut().enumerate() {
        if file.has_tensor(&format!("blk.{i}.ffn_gate_inp.weight")) {
            layer.ffn = Ffn::Experts(spec);
        }
    }
    ensure_dense_width(&layers, common, file.path())?;
    Ok(layers)
}

fn layers_of(family: Family, common: &CommonLayer) -> Vec<LayerSpec> {
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
