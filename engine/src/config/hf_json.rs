//! Readers of HF `config.json` keys shared by the families, in both transformers 4.x style
//! (`rope_theta`, `rope_scaling`) and 5.x style (`rope_parameters`, `layer_types`).

use std::path::Path;

use anyhow::{bail, Context};
use serde_json::Value;

use super::rope::{Llama3RopeScaling, RopeScaling, RopeSpec, YarnRopeScaling};
use super::AttentionSpan;

/// Reads an optional JSON field, failing when it exists with the wrong type.
pub fn opt_field<T: serde::de::DeserializeOwned>(
    obj: &serde_json::Value,
    key: &str,
    file: &Path,
) -> anyhow::Result<Option<T>> {
    match obj.get(key) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v.clone())
            .map(Some)
            .with_context(|| {
                format!(
                    "field `{key}` in {} has an unexpected type: {v}",
                    file.display()
                )
            }),
    }
}

/// Reads a required JSON field.
pub fn req_field<T: serde::de::DeserializeOwned>(
    obj: &serde_json::Value,
    key: &str,
    file: &Path,
) -> anyhow::Result<T> {
    opt_field(obj, key, file)?
        .with_context(|| format!("missing field `{key}` in {}", file.display()))
}

/// `eos_token_id` may be one id or a list of ids.
pub fn token_id_list(obj: &serde_json::Value, key: &str, file: &Path) -> anyhow::Result<Vec<u32>> {
    match obj.get(key) {
        None | Some(serde_json::Value::Null) => Ok(Vec::new()),
        Some(serde_json::Value::Array(_)) => req_field(obj, key, file),
        Some(_) => Ok(vec![req_field(obj, key, file)?]),
    }
}

/// Parses a `rope_scaling` / `rope_parameters` object. `default` means none; `llama3` and
/// `yarn` are supported; any other scaling type is an error.
fn parse_rope_scaling(
    obj: &serde_json::Value,
    key: &str,
    file: &Path,
) -> anyhow::Result<Option<RopeScaling>> {
    let Some(scaling) = obj.get(key).filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let ctx = |field: &str| format!("{key}.{field}");
    let kind: Option<String> = match opt_field(scaling, "rope_type", file)? {
        Some(kind) => Some(kind),
        None => opt_field(scaling, "type", file)?,
    };
    match kind.as_deref() {
        None | Some("default") => Ok(None),
        Some("llama3") => {
            let get = |field: &str| -> anyhow::Result<f64> {
                opt_field::<f64>(scaling, field, file)?.with_context(|| {
                    format!("missing field `{}` in {}", ctx(field), file.display())
                })
            };
            Ok(Some(RopeScaling::Llama3(Llama3RopeScaling {
                factor: get("factor")? as f32,
                low_freq_factor: get("low_freq_factor")? as f32,
                high_freq_factor: get("high_freq_factor")? as f32,
                original_max_position_embeddings: get("original_max_position_embeddings")? as usize,
            })))
        }
        Some("yarn") => {
            let get = |field: &str| -> anyhow::Result<f64> {
                opt_field::<f64>(scaling, field, file)?.with_context(|| {
                    format!("missing field `{}` in {}", ctx(field), file.display())
                })
            };
            let or = |field: &str, default: f64| -> anyhow::Result<f64> {
                Ok(opt_field::<f64>(scaling, field, file)?.unwrap_or(default))
            };
            let factor = get("factor")? as f32;
            // As transformers: `mscale` and `mscale_all_dim` (DeepSeek's) set the attention
            // factor only when both are non-zero; a zero beta takes its default.
            let mscales = (or("mscale", 0.0)?, or("mscale_all_dim", 0.0)?);
            let default = match mscales {
                (m, all) if m != 0.0 && all != 0.0 => {
                    let mscale = |m: f64| match f64::from(factor) {
                        f if f <= 1.0 => 1.0,
                        f => 0.1 * m * f.ln() + 1.0,
                    };
                    (mscale(m) / mscale(all)) as f32
                }
                _ => YarnRopeScaling::default_attention_factor(factor),
            };
            let beta = |field: &str, default: f64| -> anyhow::Result<f32> {
                Ok(match or(field, default)? {
                    0.0 => default,
                    b => b,
                } as f32)
            };
            Ok(Some(RopeScaling::Yarn(YarnRopeScaling {
                factor,
                original_max_position_embeddings: get("original_max_position_embeddings")? as usize,
                beta_fast: beta("beta_fast", 32.0)?,
                beta_slow: beta("beta_slow", 1.0)?,
                attention_factor: match opt_field::<f64>(scaling, "attention_factor", file)? {
                    Some(a) => a as f32,
                    None => default,
                },
                truncate: opt_field(scaling, "truncate", file)?.unwrap_or(true),
            })))
        }
        Some(other) => bail!(
            "unsupported rope type `{other}` in field `{key}` of {}",
            file.display()
        ),
    }
}

/// The RoPE of every layer: `rope_theta` at the top level (4.x) or in `rope_parameters`
/// (5.x), 10,000 when neither says; the scaling from `rope_scaling` or `rope_parameters`.
pub fn rope(json: &Value, file: &Path) -> anyhow::Result<RopeSpec> {
    let theta = match opt_field::<f64>(json, "rope_theta", file)? {
        Some(theta) => theta,
        None => json
            .get("rope_parameters")
            .map(|p| opt_field::<f64>(p, "rope_theta", file))
            .transpose()?
            .flatten()
            .unwrap_or(10_000.0),
    };
    let scaling = match parse_rope_scaling(json, "rope_scaling", file)? {
        Some(scaling) => Some(scaling),
        None => parse_rope_scaling(json, "rope_parameters", file)?,
    };
    Ok(RopeSpec {
        theta: theta as f32,
        scaling,
    })
}

/// Each layer's attention span from `layer_types` (`full_attention`, `sliding_attention`
/// with the window `sliding_window`), or `None` when the config has no `layer_types`.
pub fn layer_types(
    json: &Value,
    num_layers: usize,
    file: &Path,
) -> anyhow::Result<Option<Vec<AttentionSpan>>> {
    let Some(types) = opt_field::<Vec<String>>(json, "layer_types", file)? else {
        return Ok(None);
    };
    if types.len() != num_layers {
        bail!(
            "`layer_types` lists {} layers but `num_hidden_layers` is {num_layers} in {}",
            types.len(),
            file.display()
        );
    }
    let window: Option<usize> = opt_field(json, "sliding_window", file)?;
    types
        .iter()
        .enumerate()
        .map(|(i, kind)| match kind.as_str() {
            "full_attention" => Ok(AttentionSpan::Full),
            "sliding_attention" => window
                .filter(|&w| w > 0)
                .map(|window| AttentionSpan::Sliding { window })
                .with_context(|| {
                    format!(
                        "layer {i} is `sliding_attention` but `sliding_window` is not a positive size in {}",
                        file.display()
                    )
                }),
            other => bail!(
                "unsupported layer type `{other}` (layer {i} of `layer_types`) in {}",
                file.display()
            ),
        })
        .collect::<anyhow::Result<_>>()
        .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Qwen's transformers-4 YaRN block (`type`, no betas) and transformers 5's
    /// (`rope_parameters` with `rope_type` and the base inside) read alike; the attention
    /// factor defaults to `0.1 ln(factor) + 1`.
    #[test]
    fn yarn_reads_from_either_key_style() {
        let file = Path::new("config.json");
        let v4 = serde_json::json!({"rope_theta": 1e6, "rope_scaling":
            {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}});
        let v5 = serde_json::json!({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6,
            "factor": 4.0, "original_max_position_embeddings": 32768}});
        let want = RopeSpec {
            theta: 1e6,
            scaling: Some(RopeScaling::Yarn(YarnRopeScaling {
                factor: 4.0,
                original_max_position_embeddings: 32768,
                beta_fast: 32.0,
                beta_slow: 1.0,
                attention_factor: 0.1 * 4f32.ln() + 1.0,
                truncate: true,
            })),
        };
        assert_eq!(rope(&v4, file).unwrap(), want);
        assert_eq!(rope(&v5, file).unwrap(), want);
        // DeepSeek's pair: the attention factor is their ratio (1 when they are equal).
        let deepseek = serde_json::json!({"rope_scaling": {"type": "yarn", "factor": 40.0,
            "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 1.0}});
        let Some(RopeScaling::Yarn(y)) = rope(&deepseek, file).unwrap().scaling else {
            panic!("yarn");
        };
        assert_eq!(y.attention_factor, 1.0);
    }
}
