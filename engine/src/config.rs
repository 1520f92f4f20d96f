//! Model hyper-parameters, read from HF `config.json` (GGUF metadata: `weights::gguf_config`).

use std::path::Path;

use anyhow::{bail, Context};

/// Model family: decides norms, biases and weight names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama 1/2/3, SmolLM2: plain attention, no biases.
    Llama,
    /// Qwen2: q/k/v projections carry a bias.
    Qwen2,
    /// Qwen3: per-head RMSNorm on q and k before RoPE.
    Qwen3,
}

/// Llama 3.x `rope_scaling` with `rope_type = "llama3"`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3RopeScaling {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_max_position_embeddings: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f32,
    pub rope_scaling: Option<Llama3RopeScaling>,
    pub rms_norm_eps: f32,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

/// Reads an optional JSON field, failing when it exists with the wrong type.
fn opt_field<T: serde::de::DeserializeOwned>(
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
fn req_field<T: serde::de::DeserializeOwned>(
    obj: &serde_json::Value,
    key: &str,
    file: &Path,
) -> anyhow::Result<T> {
    opt_field(obj, key, file)?
        .with_context(|| format!("missing field `{key}` in {}", file.display()))
}

/// `eos_token_id` may be one id or a list of ids.
fn token_id_list(obj: &serde_json::Value, key: &str, file: &Path) -> anyhow::Result<Vec<u32>> {
    match obj.get(key) {
        None | Some(serde_json::Value::Null) => Ok(Vec::new()),
        Some(serde_json::Value::Array(_)) => req_field(obj, key, file),
        Some(_) => Ok(vec![req_field(obj, key, file)?]),
    }
}

impl Arch {
    /// From an HF `architectures` entry.
    pub fn from_hf_class(class: &str) -> Option<Arch> {
        match class {
            "LlamaForCausalLM" => Some(Arch::Llama),
            "Qwen2ForCausalLM" => Some(Arch::Qwen2),
            "Qwen3ForCausalLM" => Some(Arch::Qwen3),
            _ => None,
        }
    }

    /// From a GGUF `general.architecture` value.
    pub fn from_gguf_name(name: &str) -> Option<Arch> {
        match name {
            "llama" => Some(Arch::Llama),
            "qwen2" => Some(Arch::Qwen2),
            "qwen3" => Some(Arch::Qwen3),
            _ => None,
        }
    }
}

/// Parses a `rope_scaling` / `rope_parameters` object. `default` means none;
/// `llama3` is supported; any other scaling type is an error.
fn parse_rope_scaling(
    obj: &serde_json::Value,
    key: &str,
    file: &Path,
) -> anyhow::Result<Option<Llama3RopeScaling>> {
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
            Ok(Some(Llama3RopeScaling {
                factor: get("factor")? as f32,
                low_freq_factor: get("low_freq_factor")? as f32,
                high_freq_factor: get("high_freq_factor")? as f32,
                original_max_position_embeddings: get("original_max_position_embeddings")? as usize,
            }))
        }
        Some(other) => bail!(
            "unsupported rope type `{other}` in field `{key}` of {}",
            file.display()
        ),
    }
}

impl ModelConfig {
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
        let arch = Arch::from_hf_class(class)
            .with_context(|| format!("unsupported architecture {class} in {}", file.display()))?;

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
        let rope_theta = match opt_field::<f64>(&json, "rope_theta", file)? {
            Some(theta) => theta,
            None => json
                .get("rope_parameters")
                .map(|p| opt_field::<f64>(p, "rope_theta", file))
                .transpose()?
                .flatten()
                .unwrap_or(10_000.0),
        };
        let rope_scaling = match parse_rope_scaling(&json, "rope_scaling", file)? {
            Some(scaling) => Some(scaling),
            None => parse_rope_scaling(&json, "rope_parameters", file)?,
        };
        let default_max_pos = match arch {
            Arch::Llama => 2048,
            Arch::Qwen2 | Arch::Qwen3 => 32_768,
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
            arch,
            vocab_size: req_field(&json, "vocab_size", file)?,
            hidden_size,
            intermediate_size: req_field(&json, "intermediate_size", file)?,
            num_layers: req_field(&json, "num_hidden_layers", file)?,
            num_heads,
            num_kv_heads: opt_field(&json, "num_key_value_heads", file)?.unwrap_or(num_heads),
            head_dim,
            rope_theta: rope_theta as f32,
            rope_scaling,
            rms_norm_eps: opt_field::<f64>(&json, "rms_norm_eps", file)?.unwrap_or(1e-6) as f32,
            max_position_embeddings: opt_field(&json, "max_position_embeddings", file)?
                .unwrap_or(default_max_pos),
            tie_word_embeddings: opt_field(&json, "tie_word_embeddings", file)?.unwrap_or(false),
            bos_token_id: opt_field(&json, "bos_token_id", file)?,
            eos_token_ids,
        })
    }
}

/// The per-frequency divisors that Llama 3 rope scaling applies (llama.cpp
/// stores exactly these in `rope_freqs.weight`).
pub fn llama3_rope_factors(
    scaling: &Llama3RopeScaling,
    rope_theta: f32,
    head_dim: usize,
) -> Vec<f32> {
    let old_context = scaling.original_max_position_embeddings as f32;
    let low_freq_wavelen = old_context / scaling.low_freq_factor;
    let high_freq_wavelen = old_context / scaling.high_freq_factor;
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / rope_theta.powf(2.0 * i as f32 / head_dim as f32);
            let wavelen = 2.0 * std::f32::consts::PI / freq;
            if wavelen < high_freq_wavelen {
                1.0
            } else if wavelen > low_freq_wavelen {
                scaling.factor
            } else {
                let smooth = (old_context / wavelen - scaling.low_freq_factor)
                    / (scaling.high_freq_factor - scaling.low_freq_factor);
                1.0 / ((1.0 - smooth) / scaling.factor + smooth)
            }
        })
        .collect()
}

/// Recovers Llama 3 rope scaling from llama.cpp's factor table: `factor` is the
/// largest entry; the other parameters are those of every Llama 3.1/3.2/3.3
/// release (low 1, high 4, original context 8192), checked against the table.
pub(crate) fn llama3_scaling_from_factors(
    factors: &[f32],
    rope_theta: f32,
    head_dim: usize,
) -> anyhow::Result<Llama3RopeScaling> {
    if factors.len() != head_dim / 2 {
        bail!("{} factors for head_dim {head_dim}", factors.len());
    }
    let scaling = Llama3RopeScaling {
        factor: factors.iter().cloned().fold(1.0, f32::max),
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 8192,
    };
    let expected = llama3_rope_factors(&scaling, rope_theta, head_dim);
    for (i, (got, want)) in factors.iter().zip(&expected).enumerate() {
        if (got - want).abs() > 1e-3 * want.abs() {
            bail!("factor {i} is {got}, Llama 3 scaling {scaling:?} gives {want}");
        }
    }
    Ok(scaling)
}

/// A two-layer Llama of head dimension 128 (RoPE base 500,000), for the unit tests of the
/// modules that read a config.
#[cfg(test)]
pub(crate) fn test_llama(rope_scaling: Option<Llama3RopeScaling>) -> ModelConfig {
    ModelConfig {
        arch: Arch::Llama,
        vocab_size: 8,
        hidden_size: 8,
        intermediate_size: 8,
        num_layers: 2,
        num_heads: 1,
        num_kv_heads: 1,
        head_dim: 128,
        rope_theta: 500_000.0,
        rope_scaling,
        rms_norm_eps: 1e-5,
        max_position_embeddings: 131_072,
        tie_word_embeddings: true,
        bos_token_id: None,
        eos_token_ids: vec![],
    }
}
