//! Llama 1–3, SmolLM2 and Mistral: pre-norm SwiGLU layers, rotate-half RoPE (Llama 3's
//! scaling), no biases; Mistral's sliding window on every layer.

use std::path::Path;

use anyhow::{bail, Context};
use serde_json::Value;

use super::hf_json::{opt_field, window_on_every_layer};
use super::rope::{llama3_scaling_from_factors, RopeScaling};
use super::{AttentionSpan, CommonLayer, Family, GgufMetadata, LayerSpec};

/// `max_position_embeddings` when a config leaves it out (transformers' defaults).
pub fn default_max_positions(family: Family) -> usize {
    match family {
        Family::Mistral => 4096 * 32,
        _ => 2048,
    }
}

/// The layers an HF config describes.
pub fn hf_layers(
    json: &Value,
    common: &CommonLayer,
    file: &Path,
) -> anyhow::Result<Vec<LayerSpec>> {
    let family = common.family;
    for key in ["attention_bias", "mlp_bias"] {
        if opt_field::<bool>(json, key, file)? == Some(true) {
            bail!(
                "`{key}: true` (biases on the projections) is not supported for {family:?} in {}",
                file.display()
            );
        }
    }
    let attention = match family {
        Family::Mistral => window_on_every_layer(json, common.num_layers, "Mistral", file)?,
        _ => AttentionSpan::Full,
    };
    Ok(common.uniform_with(&common.rope, attention))
}

/// The GGUF tensor in which llama.cpp stores Llama 3.1+ per-frequency rope factors.
const ROPE_FREQS_TENSOR: &str = "rope_freqs.weight";

/// The layers of a `llama` GGUF file: Llama 3 scaling when the file has llama.cpp's factor
/// table; q/k/v biases when the file has them (some converted fine-tunes do); a window on
/// every layer when the file has `llama.attention.sliding_window` (llama.cpp's converter
/// writes Mistral as `llama` without it, and llama.cpp then runs full attention, as here).
pub fn gguf_layers(
    file: &dyn GgufMetadata,
    common: &CommonLayer,
) -> anyhow::Result<Vec<LayerSpec>> {
    for stem in ["attn_output", "ffn_gate", "ffn_up", "ffn_down"] {
        if file.has_tensor(&format!("blk.0.{stem}.bias")) {
            bail!(
                "tensor `blk.0.{stem}.bias` in {}: biases outside q/k/v are not supported",
                file.path().display()
            );
        }
    }
    let mut rope = common.rope.clone();
    if file.has_tensor(ROPE_FREQS_TENSOR) {
        let factors = file.tensor_f32(ROPE_FREQS_TENSOR)?;
        let scaling = llama3_scaling_from_factors(&factors, rope.theta, rope.rotary_dim)
            .with_context(|| {
                format!(
                    "tensor `{ROPE_FREQS_TENSOR}` in {} does not match Llama 3 rope scaling",
                    file.path().display()
                )
            })?;
        rope.scaling = Some(RopeScaling::Llama3(scaling));
    }
    let qkv_bias = file.has_tensor("blk.0.attn_q.bias");
    let mut layers = common.uniform_with(&rope, file.window_on_every_layer("llama")?);
    for layer in &mut layers {
        layer.qkv_bias = qkv_bias;
    }
    Ok(layers)
}
