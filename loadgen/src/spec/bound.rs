//! The inputs of the roofline (`reports::bound`) for a run: from the flags, a Hugging
//! Face `config.json`, the hardware table, and what the server says of itself (`engine
//! serve`'s `/version`: `weight_bytes`, `kv_read_bytes_per_token` with
//! `kv_window_read_bytes_per_token` (an older server's `kv_bytes_per_token`),
//! `recurrent_state_bytes_per_sequence`, `parameters`,
//! `attention_flops_per_context_token`, `memory_bandwidth_bytes_per_s`,
//! `compute_flops_per_s`). A flag wins over the config, the config over the server;
//! what none gives stays unknown and the diagnosis names it.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use reports::bound::{dtype_bytes, hardware, BoundInputs, KvWindowRead, ModelShape};
use serde_json::Value;

/// The bound's flags as given, with no command-line type (what a run's spec carries).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BoundOptions {
    pub model_config: Option<PathBuf>,
    pub weight_dtype: Option<String>,
    pub kv_dtype: Option<String>,
    pub weight_bytes: Option<f64>,
    pub kv_bytes_per_token: Option<f64>,
    pub hardware: Option<String>,
    pub bandwidth: Option<f64>,
    pub flops: Option<f64>,
}

fn positive(flag: &str, value: Option<f64>) -> Result<Option<f64>> {
    match value {
        Some(v) if !(v.is_finite() && v > 0.0) => bail!("{flag} {v}: expected a positive number"),
        v => Ok(v),
    }
}

/// The bound's inputs from `args` and the server's self-description `server_info`.
pub fn resolve(args: &BoundOptions, server_info: Option<&Value>) -> Result<BoundInputs> {
    let mut inputs = BoundInputs::default();
    let server_number = |key: &str| {
        server_info
            .and_then(|i| i[key].as_f64())
            .filter(|v| *v > 0.0)
    };
    inputs.weight_bytes = positive("--weight-bytes", args.weight_bytes)?;
    inputs.kv_bytes_per_token = positive("--kv-bytes-per-token", args.kv_bytes_per_token)?;
    inputs.bandwidth_bytes_per_s = positive("--bandwidth", args.bandwidth)?;
    inputs.flops = positive("--flops", args.flops)?;
    for (given, what) in [
        (inputs.weight_bytes.is_some(), "weight bytes"),
        (inputs.kv_bytes_per_token.is_some(), "KV bytes per token"),
        (inputs.bandwidth_bytes_per_s.is_some(), "bandwidth"),
        (inputs.flops.is_some(), "FLOP/s"),
    ] {
        if given {
            inputs.sources.push(format!("{what}: the command line"));
        }
    }
    if let Some(path) = &args.model_config {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--model-config {}", path.display()))?;
        let config: Value = serde_json::from_str(&text)
            .with_context(|| format!("--model-config {}: not JSON", path.display()))?;
        let shape = ModelShape::from_hf_config(&config)
            .with_context(|| format!("--model-config {}", path.display()))?;
        let weight = dtype_bytes(args.weight_dtype.as_deref().unwrap_or("bf16"))
            .context("--weight-dtype")?;
        let kv = dtype_bytes(args.kv_dtype.as_deref().unwrap_or("bf16")).context("--kv-dtype")?;
        let source = format!(
            "{} ({} weights, {} KV)",
            path.display(),
            args.weight_dtype.as_deref().unwrap_or("bf16"),
            args.kv_dtype.as_deref().unwrap_or("bf16")
        );
        if inputs.weight_bytes.is_none() {
            inputs.weight_bytes = Some(shape.decode_parameters * weight);
            inputs.sources.push(format!("weight bytes: {source}"));
        }
        if inputs.kv_bytes_per_token.is_none() {
            inputs.kv_bytes_per_token = Some(shape.kv_values_per_token * kv);
            inputs.sources.push(format!("KV bytes per token: {source}"));
        }
        inputs.parameters = Some(shape.parameters);
        inputs.sources.push(format!("parameters: {source}"));
        inputs.attention_flops_per_context_token = Some(shape.attention_flops_per_context_token);
        inputs
            .sources
            .push(format!("attention FLOPs per context token: {source}"));
    }
    if let Some(name) = &args.hardware {
        let h = hardware(name)?;
        if inputs.bandwidth_bytes_per_s.is_none() {
            inputs.bandwidth_bytes_per_s = Some(h.bandwidth_bytes_per_s);
            inputs
                .sources
                .push(format!("bandwidth: the {} datasheet", h.name));
        }
        if inputs.flops.is_none() {
            inputs.flops = Some(h.bf16_flops);
            inputs
                .sources
                .push(format!("FLOP/s: the {} datasheet (dense BF16)", h.name));
        }
    }
    // What a decode reads of the KV cache: the layers over the whole context, and each
    // sliding window's layers over at most their window (a server that says so).
    if inputs.kv_bytes_per_token.is_none() {
        // 0 where every layer has a window (the windows then carry the reads).
        let read = server_info
            .and_then(|i| i["kv_read_bytes_per_token"].as_f64())
            .filter(|v| *v >= 0.0);
        let windows = server_window_reads(server_info)?;
        if let Some(read) = read.filter(|&r| r > 0.0 || !windows.is_empty()) {
            inputs.kv_bytes_per_token = Some(read);
            inputs.kv_window_reads = windows;
            inputs.sources.push(
                "KV bytes per token (read, sliding windows apart): the server's /version"
                    .to_string(),
            );
        }
    }
    for (slot, key, what) in [
        (
            &mut inputs.state_bytes_per_sequence,
            "recurrent_state_bytes_per_sequence",
            "recurrent state bytes per sequence",
        ),
        (&mut inputs.weight_bytes, "weight_bytes", "weight bytes"),
        (
            &mut inputs.kv_bytes_per_token,
            "kv_bytes_per_token",
            "KV bytes per token",
        ),
        (&mut inputs.parameters, "parameters", "parameters"),
        (
            &mut inputs.attention_flops_per_context_token,
            "attention_flops_per_context_token",
            "attention FLOPs per context token",
        ),
        (
            &mut inputs.bandwidth_bytes_per_s,
            "memory_bandwidth_bytes_per_s",
            "bandwidth",
        ),
        (&mut inputs.flops, "compute_flops_per_s", "FLOP/s"),
    ] {
        if slot.is_none() {
            if let Some(v) = server_number(key) {
                *slot = Some(v);
                inputs
                    .sources
                    .push(format!("{what}: the server's /version"));
            }
        }
    }
    Ok(inputs)
}

/// The server's `kv_window_read_bytes_per_token`: `[{window, bytes}]`.
fn server_window_reads(server_info: Option<&Value>) -> Result<Vec<KvWindowRead>> {
    let Some(list) = server_info.map(|i| &i["kv_window_read_bytes_per_token"]) else {
        return Ok(Vec::new());
    };
    let Some(list) = list.as_array() else {
        return Ok(Vec::new());
    };
    list.iter()
        .map(|w| {
            let number = |key: &str| {
                w[key].as_f64().filter(|v| *v > 0.0).with_context(|| {
                    format!("the server's kv_window_read_bytes_per_token: `{key}` in {w}")
                })
            };
            Ok(KvWindowRead {
                window: number("window")?,
                bytes_per_token: number("bytes")?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_over_the_config_and_the_config_over_the_server() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.json");
        std::fs::write(
            &config,
            r#"{"hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16,
                "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072,
                "vocab_size": 151936, "tie_word_embeddings": true}"#,
        )
        .unwrap();
        let server = serde_json::json!({"weight_bytes": 5.0, "kv_bytes_per_token": 7.0,
            "parameters": 9.0, "memory_bandwidth_bytes_per_s": 1e10});
        let args = BoundOptions {
            model_config: Some(config),
            kv_dtype: Some("fp8".into()),
            kv_bytes_per_token: None,
            hardware: Some("h100-sxm".into()),
            flops: Some(1e15),
            ..BoundOptions::default()
        };
        let inputs = resolve(&args, Some(&server)).unwrap();
        assert_eq!(inputs.weight_bytes, Some(1_192_085_504.0));
        assert_eq!(
            inputs.kv_bytes_per_token,
            Some(57_344.0),
            "fp8: one byte a value"
        );
        assert_eq!(inputs.parameters, Some(596_042_752.0));
        assert_eq!(inputs.attention_flops_per_context_token, Some(229_376.0));
        assert_eq!(inputs.bandwidth_bytes_per_s, Some(3.35e12));
        assert_eq!(inputs.flops, Some(1e15));
        // The server alone.
        let inputs = resolve(&BoundOptions::default(), Some(&server)).unwrap();
        assert_eq!(inputs.weight_bytes, Some(5.0));
        assert_eq!(inputs.bandwidth_bytes_per_s, Some(1e10));
        assert_eq!(inputs.flops, None, "nothing says it: unknown, not guessed");
        assert_eq!(inputs.attention_flops_per_context_token, None);
        assert_eq!(inputs.kv_bytes_per_token, Some(7.0));
        // A server that says what a decode reads: the whole-context layers, and a window.
        let windowed = serde_json::json!({"kv_bytes_per_token": 7.0,
            "kv_read_bytes_per_token": 3.0,
            "kv_window_read_bytes_per_token": [{"window": 512, "bytes": 15.0}]});
        let inputs = resolve(&BoundOptions::default(), Some(&windowed)).unwrap();
        assert_eq!(inputs.kv_bytes_per_token, Some(3.0));
        assert_eq!(
            inputs.kv_window_reads,
            [KvWindowRead {
                window: 512.0,
                bytes_per_token: 15.0
            }]
        );
        // Every layer windowed (Mistral's sliding window): nothing over the whole context.
        let all_windowed = serde_json::json!({"kv_bytes_per_token": 0.0,
            "kv_read_bytes_per_token": 0.0,
            "kv_window_read_bytes_per_token": [{"window": 4096, "bytes": 8.0}]});
        let inputs = resolve(&BoundOptions::default(), Some(&all_windowed)).unwrap();
        assert_eq!(inputs.kv_bytes_per_token, Some(0.0));
        assert_eq!(inputs.kv_window_reads.len(), 1);
        assert!(
            !inputs
                .missing_for_decode()
                .iter()
                .any(|m| m.starts_with("KV")),
            "the KV reads are known"
        );
        // A hybrid model's server: its recurrent state per sequence.
        let hybrid = serde_json::json!({"kv_read_bytes_per_token": 3.0,
            "recurrent_state_bytes_per_sequence": 1_048_576.0});
        let inputs = resolve(&BoundOptions::default(), Some(&hybrid)).unwrap();
        assert_eq!(inputs.state_bytes_per_sequence, Some(1_048_576.0));
        assert_eq!(
            resolve(&BoundOptions::default(), Some(&server))
                .unwrap()
                .state_bytes_per_sequence,
            None
        );
        let broken = serde_json::json!({"kv_read_bytes_per_token": 3.0,
            "kv_window_read_bytes_per_token": [{"window": 512}]});
        let e = resolve(&BoundOptions::default(), Some(&broken)).unwrap_err();
        assert!(format!("{e:#}").contains("`bytes`"), "{e:#}");
        // A server that measured its compute says so.
        let mut measured = server.clone();
        measured["compute_flops_per_s"] = 2e11.into();
        measured["attention_flops_per_context_token"] = 3.0.into();
        let inputs = resolve(&BoundOptions::default(), Some(&measured)).unwrap();
        assert_eq!(inputs.flops, Some(2e11));
        assert_eq!(inputs.attention_flops_per_context_token, Some(3.0));
        assert!(inputs
            .sources
            .contains(&"FLOP/s: the server's /version".to_string()));
        assert!(resolve(
            &BoundOptions {
                bandwidth: Some(-1.0),
                ..BoundOptions::default()
            },
            None
        )
        .is_err());
        assert!(resolve(
            &BoundOptions {
                hardware: Some("tpu".into()),
                ..BoundOptions::default()
            },
            None
        )
        .is_err());
    }
}
