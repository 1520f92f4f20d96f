//! Qwen2 and Qwen3: Llama's layers with biases on q/k/v (Qwen2) or a per-head RMSNorm on q
//! and k (Qwen3); a sliding window on the layers from `max_window_layers` on when
//! `use_sliding_window` is set (transformers' rule), or as `layer_types` lists.

use std::path::Path;

use anyhow::bail;
use serde_json::Value;

use super::hf_json::{layer_types, opt_field};
use super::{AttentionSpan, CommonLayer, Family, LayerSpec};

/// `max_position_embeddings` when a config leaves it out (transformers' default).
pub const DEFAULT_MAX_POSITIONS: usize = 32_768;

/// The layers an HF config describes.
pub fn hf_layers(
    family: Family,
    json: &Value,
    common: &CommonLayer,
    file: &Path,
) -> anyhow::Result<Vec<LayerSpec>> {
    if family == Family::Qwen3 && opt_field::<bool>(json, "attention_bias", file)? == Some(true) {
        bail!(
            "`attention_bias: true` (biases on the projections) is not supported for Qwen3 in {}",
            file.display()
        );
    }
    let mut layers = layers_of(family, common);
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

fn layers_of(family: Family, common: &CommonLayer) -> Vec<LayerSpec> {
    common
        .uniform()
        .into_iter()
        .map(|layer| LayerSpec {
            qkv_bias: family == Family::Qwen2,
            qk_norm: family == Family::Qwen3,
            ..layer
        })
        .collect()
}
