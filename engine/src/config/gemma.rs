//! Gemma 2 and Gemma 3 (`Gemma2ForCausalLM`, `Gemma3ForCausalLM`; GGUF `gemma2`, `gemma3`):
//! sandwich norms of `x·(1+w)`, GeGLU, embeddings times `√hidden_size`, attention scaled by
//! `query_pre_attn_scalar^-0.5`, sliding and global layers (each kind with its own RoPE in
//! Gemma 3), per-head QK-norm (Gemma 3) and tanh soft-capping (Gemma 2).

use std::path::Path;

use anyhow::{bail, Context};
use serde_json::Value;

use super::hf_json::{layer_types, nested_rope, opt_field, rope};
use super::rope::{RopeScaling, RopeSpec};
use super::{
    Activation, AttentionSpan, CommonLayer, Family, GgufMetadata, LayerSpec, ModelExtras,
    NormPlacement, NormWeights,
};

/// `max_position_embeddings` when a config leaves it out (transformers' defaults).
pub fn default_max_positions(family: Family) -> usize {
    match family {
        Family::Gemma2 => 8192,
        _ => 131_072,
    }
}

/// Gemma 3's sliding layers' RoPE base when the config names none (transformers' and
/// llama.cpp's default).
const LOCAL_ROPE_THETA: f32 = 10_000.0;

/// What differs between Gemma's layer kinds.
struct Kinds {
    window: usize,
    /// Sliding layers' and global layers' RoPE.
    sliding_rope: RopeSpec,
    full_rope: RopeSpec,
}

/// The layers of `spans` (true: sliding) for `common`'s Gemma family, with the scale and
/// caps given.
fn layers(
    common: &CommonLayer,
    spans: &[bool],
    kinds: &Kinds,
    attn_scale: f32,
    attn_softcap: Option<f32>,
) -> Vec<LayerSpec> {
    spans
        .iter()
        .zip(common.uniform())
        .map(|(&sliding, layer)| LayerSpec {
            attention: match sliding {
                true => AttentionSpan::Sliding {
                    window: kinds.window,
                },
                false => AttentionSpan::Full,
            },
            rope: match sliding {
                true => kinds.sliding_rope.clone(),
                false => kinds.full_rope.clone(),
            },
            qk_norm: common.family == Family::Gemma3,
            attn_scale,
            attn_softcap,
            norms: NormPlacement::Sandwich,
            activation: Activation::GeluTanh,
            ..layer
        })
        .collect()
}

/// Which layers slide when a config lists no `layer_types`: Gemma 2 alternates (even
/// layers slide), Gemma 3 has `pattern - 1` sliding layers to a global one.
fn pattern_spans(family: Family, num_layers: usize, pattern: usize) -> Vec<bool> {
    let pattern = match family {
        Family::Gemma2 => 2,
        _ => pattern.max(1),
    };
    (0..num_layers).map(|i| (i + 1) % pattern != 0).collect()
}

/// A positive cap, or none for a missing or zero one.
fn cap(value: Option<f64>) -> Option<f32> {
    value.filter(|&c| c > 0.0).map(|c| c as f32)
}

/// The layers an HF config describes, and the model-wide scales.
pub fn hf_layers(
    json: &Value,
    common: &CommonLayer,
    file: &Path,
) -> anyhow::Result<(Vec<LayerSpec>, ModelExtras)> {
    let (family, hidden_size) = (common.family, common.hidden_size);
    if let Some(act) = opt_field::<String>(json, "hidden_activation", file)? {
        if act != "gelu_pytorch_tanh" {
            bail!(
                "`hidden_activation: {act}` is not supported for Gemma (only `gelu_pytorch_tanh`) in {}",
                file.display()
            );
        }
    }
    if opt_field::<bool>(json, "use_bidirectional_attention", file)? == Some(true) {
        bail!(
            "`use_bidirectional_attention: true` (EmbeddingGemma) is not a causal language model, in {}",
            file.display()
        );
    }
    let n = common.num_layers;
    let spans: Vec<bool> = match layer_types(json, n, file)? {
        Some(spans) => spans.iter().map(|s| *s != AttentionSpan::Full).collect(),
        None => {
            // Published Gemma 3 configs write the pattern as `_sliding_window_pattern`.
            let pattern = match opt_field(json, "sliding_window_pattern", file)? {
                Some(p) => p,
                None => opt_field(json, "_sliding_window_pattern", file)?.unwrap_or(6),
            };
            pattern_spans(family, n, pattern)
        }
    };
    let window: usize = opt_field(json, "sliding_window", file)?.unwrap_or(4096);
    if window == 0 && spans.iter().any(|&s| s) {
        bail!(
            "`sliding_window` is 0 but layers slide, in {}",
            file.display()
        );
    }
    let head_dim = common.head_dim;
    // transformers 5 nests the RoPE by layer kind (Gemma 3); 4.x writes the global one at
    // the top level (`rope_theta`, `rope_scaling`) and Gemma 3's local base apart.
    let full_rope = match nested_rope(json, "full_attention", head_dim, file)? {
        Some(r) => r,
        None => rope(json, head_dim, file)?,
    };
    let sliding_rope = match nested_rope(json, "sliding_attention", head_dim, file)? {
        Some(r) => r,
        None if family == Family::Gemma3 => RopeSpec {
            theta: opt_field::<f64>(json, "rope_local_base_freq", file)?
                .map_or(LOCAL_ROPE_THETA, |t| t as f32),
            scaling: None,
            ..full_rope.clone()
        },
        None => full_rope.clone(),
    };
    let kinds = Kinds {
        window,
        sliding_rope,
        full_rope,
    };
    let scalar: f64 = opt_field(json, "query_pre_attn_scalar", file)?.unwrap_or(head_dim as f64);
    let attn_softcap = cap(opt_field(json, "attn_logit_softcapping", file)?);
    let layers = layers(
        common,
        &spans,
        &kinds,
        scalar.powf(-0.5) as f32,
        attn_softcap,
    );
    let extras = ModelExtras {
        embedding_scale: (hidden_size as f32).sqrt(),
        final_logit_softcap: cap(opt_field(json, "final_logit_softcapping", file)?),
        norm_weights: NormWeights::PlusOne,
    };
    Ok((layers, extras))
}

/// The layers of a `gemma2` or `gemma3` GGUF file, as llama.cpp reads them: the window
/// from `{arch}.attention.sliding_window`, which layers slide from
/// `{arch}.attention.sliding_window_pattern` (a number or a per-layer list; Gemma 3's
/// default 6, Gemma 2's layers alternating), the sliding layers' RoPE base from
/// `{arch}.rope.freq_base_swa` (10,000 when absent) and the global one from
/// `{arch}.rope.freq_base` with the file's scaling; the soft-caps from their keys. The
/// attention scale is llama.cpp's: `head_dim^-0.5`, but `(hidden / heads)^-0.5` for the
/// 27B models (46 layers in Gemma 2, 62 in Gemma 3), whose `query_pre_attn_scalar` the
/// converter does not write. The norms hold `1 + w` already.
pub fn gguf_layers(
    file: &dyn GgufMetadata,
    common: &CommonLayer,
) -> anyhow::Result<(Vec<LayerSpec>, ModelExtras)> {
    let (family, hidden_size) = (common.family, common.hidden_size);
    let arch = match family {
        Family::Gemma2 => "gemma2",
        _ => "gemma3",
    };
    let key = |suffix: &str| format!("{arch}.{suffix}");
    let n = common.num_layers;
    let window = file
        .usize_key(&key("attention.sliding_window"))?
        .unwrap_or(0);
    let pattern_key = key("attention.sliding_window_pattern");
    let spans: Vec<bool> = if window == 0 {
        vec![false; n]
    } else if let Some(list) = file.int_array_key(&pattern_key)? {
        if list.len() != n {
            bail!(
                "{pattern_key} lists {} layers but the file has {n} in {}",
                list.len(),
                file.path().display()
            );
        }
        list.iter().map(|&v| v != 0).collect()
    } else {
        let pattern = file.usize_key(&pattern_key)?.unwrap_or(6);
        pattern_spans(family, n, pattern)
    };
    let full_rope = common.rope.clone();
    let sliding_rope = match family {
        Family::Gemma3 => RopeSpec {
            theta: file
                .f64_key(&key("rope.freq_base_swa"))?
                .map_or(LOCAL_ROPE_THETA, |t| t as f32),
            scaling: None,
            ..full_rope.clone()
        },
        _ => full_rope.clone(),
    };
    if let Some(RopeScaling::Yarn(_) | RopeScaling::Llama3(_) | RopeScaling::LongRope(_)) =
        &full_rope.scaling
    {
        bail!(
            "{} scales Gemma's RoPE other than linearly, which llama.cpp's converter never writes",
            file.path().display()
        );
    }
    let kinds = Kinds {
        window,
        sliding_rope,
        full_rope,
    };
    let heads = file
        .usize_key(&key("attention.head_count"))?
        .with_context(|| {
            format!(
                "no {} in {}",
                key("attention.head_count"),
                file.path().display()
            )
        })?;
    let is_27b = matches!((family, n), (Family::Gemma2, 46) | (Family::Gemma3, 62));
    let scale_dim = if is_27b {
        hidden_size / heads.max(1)
    } else {
        common.head_dim
    };
    let attn_softcap = cap(file.f64_key(&key("attn_logit_softcapping"))?);
    let layers = layers(
        common,
        &spans,
        &kinds,
        (scale_dim as f32).powf(-0.5),
        attn_softcap,
    );
    let extras = ModelExtras {
        embedding_scale: (hidden_size as f32).sqrt(),
        final_logit_softcap: cap(file.f64_key(&key("final_logit_softcapping"))?),
        norm_weights: NormWeights::AsStored,
    };
    Ok((layers, extras))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gemma 3 270M's published (transformers 4) config, its pattern changed to 3: two
    /// sliding layers to a global one as `_sliding_window_pattern` says, the local RoPE base
    /// apart, the query scale from `query_pre_attn_scalar`, the head tied by default.
    #[test]
    fn gemma3_270m_config_reads_its_layer_kinds() {
        let json = serde_json::json!({
            "architectures": ["Gemma3ForCausalLM"], "hidden_size": 640,
            "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
            "num_hidden_layers": 18, "intermediate_size": 2048, "vocab_size": 262144,
            "query_pre_attn_scalar": 256, "sliding_window": 512, "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0, "rope_scaling": null,
            "final_logit_softcapping": null, "attn_logit_softcapping": null,
            "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 32768,
            "_sliding_window_pattern": 3
        });
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(&path, json.to_string()).unwrap();
        let c = super::super::ModelConfig::from_hf_config(&path).unwrap();
        assert_eq!(c.family, Family::Gemma3);
        assert!(
            c.tie_word_embeddings,
            "Gemma's default when the key is left out"
        );
        assert_eq!(c.embedding_scale, 640f32.sqrt());
        assert_eq!(c.norm_weights, NormWeights::PlusOne);
        let global: Vec<usize> = (0..18)
            .filter(|&i| c.layers[i].attention == AttentionSpan::Full)
            .collect();
        assert_eq!(
            global,
            [2, 5, 8, 11, 14, 17],
            "every third layer, as the key says"
        );
        assert_eq!(
            c.layers[0].attention,
            AttentionSpan::Sliding { window: 512 }
        );
        assert_eq!(c.layers[0].rope.theta, 10_000.0);
        assert_eq!(c.layers[2].rope.theta, 1_000_000.0);
        assert!(c.layers.iter().all(|l| l.qk_norm
            && l.norms == NormPlacement::Sandwich
            && l.activation == Activation::GeluTanh
            && l.attn_scale == 1.0 / 16.0
            && l.attn_softcap.is_none()));
    }
}
