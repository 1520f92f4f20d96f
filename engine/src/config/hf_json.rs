//! Readers of HF `config.json` keys shared by the families, in both transformers 4.x style
//! (`rope_theta`, `rope_scaling`) and 5.x style (`rope_parameters`, `layer_types`).

use std::path::Path;

use anyhow::{bail, Context};
use serde_json::Value;

use super::rope::{Llama3RopeScaling, LongRopeScaling, RopeScaling, RopeSpec, YarnRopeScaling};
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

/// What a scaling block may take from the rest of the config.
struct RopeContext {
    /// The dimensions each head rotates (a LongRoPE list has one factor per pair).
    rotary_dim: usize,
    max_position_embeddings: Option<usize>,
    /// The top-level `original_max_position_embeddings` (Phi-3 keeps it there), which
    /// transformers prefers to the block's own.
    original_max_position_embeddings: Option<usize>,
}

impl RopeContext {
    /// The pre-training context a scaling block stretches: the top-level key, else the
    /// block's, else `max_position_embeddings` (transformers' order).
    fn original_context(&self, scaling: &Value, key: &str, file: &Path) -> anyhow::Result<usize> {
        let own: Option<f64> = opt_field(scaling, "original_max_position_embeddings", file)?;
        self.original_max_position_embeddings
            .or(own.map(|v| v as usize))
            .or(self.max_position_embeddings)
            .with_context(|| {
                format!(
                    "missing field `{key}.original_max_position_embeddings` in {}",
                    file.display()
                )
            })
    }
}

/// Parses a `rope_scaling` / `rope_parameters` object. `default` means none; `llama3`,
/// `yarn` and `longrope` (`su` in older Phi-3 configs) are supported; any other scaling
/// type is an error.
fn parse_rope_scaling(
    obj: &Value,
    key: &str,
    context: &RopeContext,
    file: &Path,
) -> anyhow::Result<Option<RopeScaling>> {
    let Some(scaling) = obj.get(key).filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let ctx = |field: &str| format!("{key}.{field}");
    let get = |field: &str| -> anyhow::Result<f64> {
        opt_field::<f64>(scaling, field, file)?
            .with_context(|| format!("missing field `{}` in {}", ctx(field), file.display()))
    };
    let or = |field: &str, default: f64| -> anyhow::Result<f64> {
        Ok(opt_field::<f64>(scaling, field, file)?.unwrap_or(default))
    };
    let kind: Option<String> = match opt_field(scaling, "rope_type", file)? {
        Some(kind) => Some(kind),
        None => opt_field(scaling, "type", file)?,
    };
    match kind.as_deref() {
        None | Some("default") => Ok(None),
        Some("linear") => Ok(Some(RopeScaling::Linear {
            factor: get("factor")? as f32,
        })),
        Some("llama3") => Ok(Some(RopeScaling::Llama3(Llama3RopeScaling {
            factor: get("factor")? as f32,
            low_freq_factor: get("low_freq_factor")? as f32,
            high_freq_factor: get("high_freq_factor")? as f32,
            original_max_position_embeddings: context.original_context(scaling, key, file)?,
        }))),
        Some("yarn") => {
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
                original_max_position_embeddings: context.original_context(scaling, key, file)?,
                beta_fast: beta("beta_fast", 32.0)?,
                beta_slow: beta("beta_slow", 1.0)?,
                attention_factor: match opt_field::<f64>(scaling, "attention_factor", file)? {
                    Some(a) => a as f32,
                    None => default,
                },
                truncate: opt_field(scaling, "truncate", file)?.unwrap_or(true),
            })))
        }
        Some("longrope" | "su") => {
            let original = context.original_context(scaling, key, file)?;
            let list = |field: &str| -> anyhow::Result<Vec<f32>> {
                let factors: Vec<f32> = opt_field(scaling, field, file)?.with_context(|| {
                    format!("missing field `{}` in {}", ctx(field), file.display())
                })?;
                if factors.len() != context.rotary_dim / 2 {
                    bail!(
                        "`{}` has {} factors but the heads rotate {} dimensions ({} pairs) in {}",
                        ctx(field),
                        factors.len(),
                        context.rotary_dim,
                        context.rotary_dim / 2,
                        file.display()
                    );
                }
                Ok(factors)
            };
            let factor = match opt_field::<f64>(scaling, "factor", file)? {
                Some(factor) => factor,
                None => {
                    let max = context.max_position_embeddings.with_context(|| {
                        format!(
                            "`{key}` is LongRoPE without `factor` and the config has no \
                             `max_position_embeddings` to derive it from, in {}",
                            file.display()
                        )
                    })?;
                    max as f64 / original as f64
                }
            };
            Ok(Some(RopeScaling::LongRope(LongRopeScaling {
                short_factor: list("short_factor")?,
                long_factor: list("long_factor")?,
                original_max_position_embeddings: original,
                attention_factor: match opt_field::<f64>(scaling, "attention_factor", file)? {
                    Some(a) => a as f32,
                    None => LongRopeScaling::default_attention_factor(factor, original),
                },
            })))
        }
        Some(other) => bail!(
            "unsupported rope type `{other}` in field `{key}` of {}",
            file.display()
        ),
    }
}

/// A key read at the top level (transformers 4.x) or inside `rope_parameters` (5.x).
fn top_or_rope_parameters<T: serde::de::DeserializeOwned>(
    json: &Value,
    key: &str,
    file: &Path,
) -> anyhow::Result<Option<T>> {
    match opt_field(json, key, file)? {
        Some(value) => Ok(Some(value)),
        None => json
            .get("rope_parameters")
            .map(|p| opt_field(p, key, file))
            .transpose()
            .map(Option::flatten),
    }
}

/// The RoPE of every layer of heads `head_dim` wide: `rope_theta` and
/// `partial_rotary_factor` at the top level (4.x) or in `rope_parameters` (5.x), a base of
/// 10,000 and the whole head when neither says; the scaling from `rope_scaling` or
/// `rope_parameters`.
pub fn rope(json: &Value, head_dim: usize, file: &Path) -> anyhow::Result<RopeSpec> {
    let theta: f64 = top_or_rope_parameters(json, "rope_theta", file)?.unwrap_or(10_000.0);
    let fraction: f64 = top_or_rope_parameters(json, "partial_rotary_factor", file)?.unwrap_or(1.0);
    // transformers: `int(head_dim * partial_rotary_factor)`.
    let rotary_dim = (head_dim as f64 * fraction) as usize;
    if !(fraction > 0.0 && fraction <= 1.0 && rotary_dim > 0 && rotary_dim.is_multiple_of(2)) {
        bail!(
            "`partial_rotary_factor` {fraction} of head_dim {head_dim} rotates {rotary_dim} \
             dimensions: it must be a positive even number at most head_dim, in {}",
            file.display()
        );
    }
    let context = RopeContext {
        rotary_dim,
        max_position_embeddings: opt_field(json, "max_position_embeddings", file)?,
        original_max_position_embeddings: opt_field(
            json,
            "original_max_position_embeddings",
            file,
        )?,
    };
    let scaling = match parse_rope_scaling(json, "rope_scaling", &context, file)? {
        Some(scaling) => Some(scaling),
        None => parse_rope_scaling(json, "rope_parameters", &context, file)?,
    };
    Ok(RopeSpec {
        theta: theta as f32,
        rotary_dim,
        scaling,
    })
}

/// The RoPE of the layers of one `kind` (`full_attention`, `sliding_attention`) where
/// transformers 5 nests `rope_parameters` by layer kind: the nested block read as a
/// config's own (with the top-level context keys), or `None` when the config does not
/// nest them.
pub fn nested_rope(
    json: &Value,
    kind: &str,
    head_dim: usize,
    file: &Path,
) -> anyhow::Result<Option<RopeSpec>> {
    let Some(block) = json.get("rope_parameters").and_then(|p| p.get(kind)) else {
        return Ok(None);
    };
    let mut own = serde_json::json!({ "rope_parameters": block });
    for key in [
        "max_position_embeddings",
        "original_max_position_embeddings",
        "partial_rotary_factor",
    ] {
        if let Some(v) = json.get(key) {
            own[key] = v.clone();
        }
    }
    rope(&own, head_dim, file)
        .with_context(|| format!("in `rope_parameters.{kind}`"))
        .map(Some)
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

/// The span of a family whose attention takes `sliding_window` on every layer, whatever
/// `layer_types` says (transformers' `MistralAttention` and `Phi3Attention`): a window
/// when it is positive, else full attention; a config whose `layer_types` disagrees is
/// refused.
pub fn window_on_every_layer(
    json: &Value,
    num_layers: usize,
    family: &str,
    file: &Path,
) -> anyhow::Result<AttentionSpan> {
    let span = match opt_field::<usize>(json, "sliding_window", file)? {
        Some(window) if window > 0 => AttentionSpan::Sliding { window },
        _ => AttentionSpan::Full,
    };
    if let Some(listed) = layer_types(json, num_layers, file)? {
        if listed.iter().any(|s| *s != span) {
            bail!(
                "`layer_types` disagrees with `sliding_window`, which {family} applies to every layer, in {}",
                file.display()
            );
        }
    }
    Ok(span)
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
            rotary_dim: 128,
            scaling: Some(RopeScaling::Yarn(YarnRopeScaling {
                factor: 4.0,
                original_max_position_embeddings: 32768,
                beta_fast: 32.0,
                beta_slow: 1.0,
                attention_factor: 0.1 * 4f32.ln() + 1.0,
                truncate: true,
            })),
        };
        assert_eq!(rope(&v4, 128, file).unwrap(), want);
        assert_eq!(rope(&v5, 128, file).unwrap(), want);
        // DeepSeek's pair: the attention factor is their ratio (1 when they are equal).
        let deepseek = serde_json::json!({"rope_scaling": {"type": "yarn", "factor": 40.0,
            "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 1.0}});
        let Some(RopeScaling::Yarn(y)) = rope(&deepseek, 128, file).unwrap().scaling else {
            panic!("yarn");
        };
        assert_eq!(y.attention_factor, 1.0);
    }

    /// Phi-4-mini's RoPE as its published (transformers 4) config writes it: three quarters
    /// of each 128-wide head rotate, LongRoPE with 48 factors per list, the original
    /// context at the top level; transformers 5's `rope_parameters` reads alike. A list of
    /// the wrong length is refused by name.
    #[test]
    fn longrope_and_partial_rotary_read_from_either_key_style() {
        let file = Path::new("config.json");
        let short: Vec<f64> = (0..48).map(|i| 1.0 + i as f64 / 100.0).collect();
        let long: Vec<f64> = (0..48).map(|i| 2.0 + i as f64).collect();
        let v4 = serde_json::json!({"partial_rotary_factor": 0.75,
            "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
            "rope_theta": 10000.0, "rope_scaling": {"type": "longrope",
            "short_factor": short, "long_factor": long}});
        let v5 = serde_json::json!({"max_position_embeddings": 131072,
            "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
            "partial_rotary_factor": 0.75, "original_max_position_embeddings": 4096,
            "short_factor": short, "long_factor": long}});
        let want = RopeSpec {
            theta: 10_000.0,
            rotary_dim: 96,
            scaling: Some(RopeScaling::LongRope(LongRopeScaling {
                short_factor: short.iter().map(|&f| f as f32).collect(),
                long_factor: long.iter().map(|&f| f as f32).collect(),
                original_max_position_embeddings: 4096,
                attention_factor: (1.0 + 32f64.ln() / 4096f64.ln()).sqrt() as f32,
            })),
        };
        assert_eq!(rope(&v4, 128, file).unwrap(), want);
        assert_eq!(rope(&v5, 128, file).unwrap(), want);
        let mut wrong = v4.clone();
        wrong["rope_scaling"]["long_factor"] = serde_json::json!(&long[..47]);
        let err = rope(&wrong, 128, file).unwrap_err().to_string();
        assert!(
            err.contains("`rope_scaling.long_factor` has 47 factors") && err.contains("96"),
            "{err}"
        );
        let odd = serde_json::json!({"partial_rotary_factor": 0.33});
        let err = rope(&odd, 16, file).unwrap_err().to_string();
        assert!(err.contains("rotates 5 dimensions"), "{err}");
    }
}
