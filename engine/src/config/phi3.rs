//! Phi-3 and Phi-4 (`Phi3ForCausalLM`, GGUF `phi3`): Llama's pre-norm SwiGLU layers with
//! q/k/v and gate/up stored fused, partial rotary embeddings and LongRoPE (read with the
//! other RoPE keys), no biases, and a sliding window on every layer when set.

use std::path::Path;

use anyhow::{bail, Context};
use serde_json::Value;

use super::hf_json::window_on_every_layer;
use super::rope::{LongRopeScaling, RopeScaling};
use super::{CommonLayer, GgufMetadata, LayerSpec};

/// `max_position_embeddings` when a config leaves it out (transformers' default).
pub const DEFAULT_MAX_POSITIONS: usize = 4096;

/// The layers an HF config describes.
pub fn hf_layers(
    json: &Value,
    common: &CommonLayer,
    file: &Path,
) -> anyhow::Result<Vec<LayerSpec>> {
    let attention = window_on_every_layer(json, common.num_layers, "Phi-3", file)?;
    Ok(common.uniform_with(&common.rope, attention))
}

/// llama.cpp's LongRoPE factor tables (one per list, shared by every layer).
const LONG_FACTORS: &str = "rope_factors_long.weight";
const SHORT_FACTORS: &str = "rope_factors_short.weight";

/// The layers of a `phi3` GGUF file: LongRoPE when the file has llama.cpp's two factor
/// tables (with `phi3.rope.scaling.original_context_length` and, when written,
/// `phi3.rope.scaling.attn_factor`), a window on every layer when
/// `phi3.attention.sliding_window` is positive. llama.cpp itself ignores that window
/// (its converter's keys were found unreliable; ggml-org/llama.cpp#13676); transformers,
/// the model's reference, applies it, and so does this reader.
pub fn gguf_layers(
    file: &dyn GgufMetadata,
    common: &CommonLayer,
) -> anyhow::Result<Vec<LayerSpec>> {
    let shown = || file.path().display();
    let mut rope = common.rope.clone();
    match (
        file.has_tensor(LONG_FACTORS),
        file.has_tensor(SHORT_FACTORS),
    ) {
        (false, false) => {}
        (true, true) => {
            let original = file
                .usize_key("phi3.rope.scaling.original_context_length")?
                .with_context(|| {
                    format!(
                        "{} has LongRoPE factor tables but no phi3.rope.scaling.original_context_length",
                        shown()
                    )
                })?;
            let context = file.usize_key("phi3.context_length")?.unwrap_or(original);
            let table = |name: &str| -> anyhow::Result<Vec<f32>> {
                let factors = file.tensor_f32(name)?;
                if factors.len() != rope.rotary_dim / 2 {
                    bail!(
                        "tensor `{name}` in {} has {} factors, expected one per rotated pair ({})",
                        shown(),
                        factors.len(),
                        rope.rotary_dim / 2
                    );
                }
                Ok(factors)
            };
            rope.scaling = Some(RopeScaling::LongRope(LongRopeScaling {
                short_factor: table(SHORT_FACTORS)?,
                long_factor: table(LONG_FACTORS)?,
                original_max_position_embeddings: original,
                attention_factor: match file.f64_key("phi3.rope.scaling.attn_factor")? {
                    Some(a) => a as f32,
                    None => LongRopeScaling::default_attention_factor(
                        context as f64 / original as f64,
                        original,
                    ),
                },
            }));
        }
        _ => bail!(
            "{} has only one of `{LONG_FACTORS}` and `{SHORT_FACTORS}`: LongRoPE needs both",
            shown()
        ),
    }
    Ok(common.uniform_with(&rope, file.window_on_every_layer("phi3")?))
}
