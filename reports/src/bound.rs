//! The roofline a measurement is set beside. A decode step at batch B and mean context L
//! reads the weights once (W bytes) and every sequence's cached K and V
//! (B · L · kv_bytes_per_token, plus B · min(L, W) · bytes for the layers of each sliding
//! window W), and computes 2 · parameters · B FLOPs in the matrices plus
//! attention_flops_per_context_token · B · L in attention (4 · layers · heads · head dim per
//! context token: q·k and p·v). No engine can take less than the larger of bytes / bandwidth
//! and FLOPs / compute per step: bound TPOT = max of the two, bound output tok/s = B / bound
//! TPOT, and the larger side is the one that binds. Prefill's floor is compute: about
//! 2 × parameters FLOPs per prompt token. No efficiency factor is assumed; a report shows
//! observed / bound, and that ratio is the finding.
//!
//! The inputs come from the server (`engine serve`'s `/version`), from a Hugging Face
//! `config.json` ([`ModelShape::from_hf_config`]), from the hardware table ([`hardware`]) or
//! from flags; what is not known stays `None` and is named, never guessed.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One accelerator's datasheet numbers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hardware {
    /// The `--hardware` name.
    pub name: &'static str,
    /// Peak memory bandwidth, bytes/s.
    pub bandwidth_bytes_per_s: f64,
    /// Peak dense BF16 tensor FLOP/s (without structured sparsity).
    pub bf16_flops: f64,
}

/// The accelerators `--hardware` knows.
pub const HARDWARE: &[Hardware] = &[
    // NVIDIA H100 datasheet (SXM5 80 GB): 3.35 TB/s HBM3; BF16 1,979 TFLOPS with sparsity,
    // 989.4 dense.
    Hardware {
        name: "h100-sxm",
        bandwidth_bytes_per_s: 3.35e12,
        bf16_flops: 989.4e12,
    },
    // NVIDIA H100 datasheet (PCIe 80 GB): 2.0 TB/s HBM2e; BF16 1,513 TFLOPS with sparsity,
    // 756 dense.
    Hardware {
        name: "h100-pcie",
        bandwidth_bytes_per_s: 2.0e12,
        bf16_flops: 756e12,
    },
    // NVIDIA H200 datasheet (SXM 141 GB): 4.8 TB/s HBM3e; BF16 1,979 TFLOPS with sparsity,
    // 989.4 dense.
    Hardware {
        name: "h200",
        bandwidth_bytes_per_s: 4.8e12,
        bf16_flops: 989.4e12,
    },
    // NVIDIA A100 datasheet (40 GB SXM): 1,555 GB/s HBM2; BF16 312 TFLOPS dense.
    Hardware {
        name: "a100-40gb",
        bandwidth_bytes_per_s: 1.555e12,
        bf16_flops: 312e12,
    },
    // NVIDIA A100 datasheet (80 GB SXM): 2,039 GB/s HBM2e; BF16 312 TFLOPS dense.
    Hardware {
        name: "a100-80gb",
        bandwidth_bytes_per_s: 2.039e12,
        bf16_flops: 312e12,
    },
    // NVIDIA L40S datasheet: 864 GB/s GDDR6; BF16 733 TFLOPS with sparsity, 362.05 dense.
    Hardware {
        name: "l40s",
        bandwidth_bytes_per_s: 864e9,
        bf16_flops: 362.05e12,
    },
    // NVIDIA L4 datasheet: 300 GB/s GDDR6; BF16 242 TFLOPS with sparsity, 121 dense.
    Hardware {
        name: "l4",
        bandwidth_bytes_per_s: 300e9,
        bf16_flops: 121e12,
    },
];

/// The table's entry for `name` (case and `_` / ` ` for `-` ignored).
pub fn hardware(name: &str) -> Result<&'static Hardware> {
    let key = name.trim().to_ascii_lowercase().replace(['_', ' '], "-");
    HARDWARE.iter().find(|h| h.name == key).with_context(|| {
        let names: Vec<&str> = HARDWARE.iter().map(|h| h.name).collect();
        format!(
            "--hardware {name}: not in the table ({}); give --bandwidth and --flops instead",
            names.join(", ")
        )
    })
}

/// What the bound needs; each input says where it came from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BoundInputs {
    /// Bytes one decode step reads for the weights.
    pub weight_bytes: Option<f64>,
    /// Bytes a decode step reads per token of context in the layers that attend to all of
    /// it (every layer when no window is known).
    pub kv_bytes_per_token: Option<f64>,
    /// Per sliding window: the bytes per token its layers read of at most the window's
    /// last tokens.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kv_window_reads: Vec<KvWindowRead>,
    /// Bytes of the recurrent state (Gated DeltaNet layers) each decoding sequence reads and
    /// writes back every step, whatever its context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_bytes_per_sequence: Option<f64>,
    /// Parameters one token is computed with (for the prefill floor and decode's compute side).
    pub parameters: Option<f64>,
    /// Attention FLOPs a decode token spends per token of its context (decode's compute side).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_flops_per_context_token: Option<f64>,
    pub bandwidth_bytes_per_s: Option<f64>,
    /// Dense FLOP/s (for the prefill floor and decode's compute side).
    pub flops: Option<f64>,
    /// Where the inputs came from, in words.
    pub sources: Vec<String>,
}

/// The KV bytes sliding-window layers read per token of context, up to their window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct KvWindowRead {
    /// Tokens the window spans.
    pub window: f64,
    /// Bytes per token of the window's layers together.
    pub bytes_per_token: f64,
}

/// The side of the roofline that binds a step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Side {
    /// Bytes / bandwidth is the larger time.
    #[default]
    Memory,
    /// FLOPs / compute is the larger time.
    Compute,
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Side::Memory => "memory",
            Side::Compute => "compute",
        })
    }
}

/// The roofline of a decode step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DecodeBound {
    /// Sequences decoding together.
    pub batch: f64,
    /// Mean context length (tokens) each one attends to.
    pub context: f64,
    pub bytes_per_step: f64,
    /// The larger of the two sides' times: the step's floor.
    pub tpot_ms: f64,
    pub output_tok_per_s: f64,
    /// Bytes / bandwidth (0 in a file written before the compute side existed: see
    /// [`DecodeBound::memory_side_ms`]).
    #[serde(default)]
    pub memory_ms: f64,
    /// FLOPs of the step, when parameters and compute are known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flops_per_step: Option<f64>,
    /// FLOPs / compute, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_ms: Option<f64>,
    /// Which side is the larger.
    #[serde(default)]
    pub binds: Side,
}

impl DecodeBound {
    /// Bytes / bandwidth; in a file written before the compute side existed (no
    /// `memory_ms`), the bound itself, which was the memory side alone.
    pub fn memory_side_ms(&self) -> f64 {
        if self.memory_ms > 0.0 {
            self.memory_ms
        } else {
            self.tpot_ms
        }
    }

    /// "the roofline of 5.38 ms (memory binds: memory 5.38 ms, compute 1.20 ms)" or,
    /// without the compute side, "the bandwidth bound of 5.38 ms (compute unknown)".
    pub fn describe(&self) -> String {
        match self.compute_ms {
            Some(compute) => format!(
                "the roofline of {:.2} ms ({} binds: memory {:.2} ms, compute {compute:.2} ms)",
                self.tpot_ms,
                self.binds,
                self.memory_side_ms()
            ),
            None => format!(
                "the bandwidth bound of {:.2} ms (compute unknown)",
                self.tpot_ms
            ),
        }
    }
}

impl BoundInputs {
    /// The inputs the decode bound still lacks, by name.
    pub fn missing_for_decode(&self) -> Vec<&'static str> {
        let mut missing = Vec::new();
        if self.weight_bytes.is_none() {
            missing.push("weight bytes (--weight-bytes, --model-config, or a server /version)");
        }
        if self.kv_bytes_per_token.is_none() {
            missing.push("KV bytes per token (--kv-bytes-per-token or --model-config)");
        }
        if self.bandwidth_bytes_per_s.is_none() {
            missing.push("memory bandwidth (--hardware or --bandwidth)");
        }
        missing
    }

    /// What the roofline's compute side still lacks, by name.
    pub fn missing_for_compute(&self) -> Vec<&'static str> {
        let mut missing = Vec::new();
        if self.parameters.is_none() {
            missing.push("parameters (--model-config, or a server /version)");
        }
        if self.flops.is_none() {
            missing.push("compute FLOP/s (--hardware or --flops, or a server /version)");
        }
        missing
    }

    /// The decode roofline at `batch` sequences of mean context `context`, when the memory
    /// side's inputs are known; its compute side when parameters and FLOP/s are known too
    /// (attention's FLOPs counted when their per-token figure is known).
    pub fn decode(&self, batch: f64, context: f64) -> Option<DecodeBound> {
        let (w, kv, bw) = (
            self.weight_bytes?,
            self.kv_bytes_per_token?,
            self.bandwidth_bytes_per_s?,
        );
        if !(batch > 0.0 && context >= 0.0 && bw > 0.0) {
            return None;
        }
        let windows: f64 = self
            .kv_window_reads
            .iter()
            .map(|r| context.min(r.window) * r.bytes_per_token)
            .sum();
        let states = 2.0 * self.state_bytes_per_sequence.unwrap_or(0.0);
        let bytes_per_step = w + batch * (context * kv + windows + states);
        let memory_s = bytes_per_step / bw;
        let flops_per_step = self.parameters.map(|p| {
            2.0 * p * batch
                + self.attention_flops_per_context_token.unwrap_or(0.0) * batch * context
        });
        let compute_s = flops_per_step
            .zip(self.flops.filter(|f| *f > 0.0))
            .map(|(f, rate)| f / rate);
        let (tpot_s, binds) = match compute_s {
            Some(c) if c > memory_s => (c, Side::Compute),
            _ => (memory_s, Side::Memory),
        };
        Some(DecodeBound {
            batch,
            context,
            bytes_per_step,
            tpot_ms: tpot_s * 1000.0,
            output_tok_per_s: batch / tpot_s,
            memory_ms: memory_s * 1000.0,
            flops_per_step: compute_s.and(flops_per_step),
            compute_ms: compute_s.map(|c| c * 1000.0),
            binds,
        })
    }

    /// Prefill's compute floor for `prompt_tokens` tokens: 2 × parameters × tokens / FLOP/s,
    /// in ms.
    pub fn prefill_floor_ms(&self, prompt_tokens: f64) -> Option<f64> {
        let (p, flops) = (self.parameters?, self.flops?);
        (flops > 0.0).then(|| 2.0 * p * prompt_tokens / flops * 1000.0)
    }
}

/// Bytes of one value of a weight or KV dtype named as on the command line.
pub fn dtype_bytes(name: &str) -> Result<f64> {
    Ok(match name.trim().to_ascii_lowercase().as_str() {
        "f32" | "fp32" | "float32" => 4.0,
        "bf16" | "f16" | "fp16" | "bfloat16" | "float16" | "half" => 2.0,
        "fp8" | "f8" | "int8" | "i8" | "q8_0" => 1.0,
        "int4" | "fp4" | "mxfp4" | "nvfp4" | "q4" => 0.5,
        other => bail!("dtype `{other}`: expected f32, bf16, f16, fp8, int8, int4 or fp4"),
    })
}

/// The shapes of a dense decoder from a Hugging Face `config.json`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelShape {
    /// Every parameter, the embedding table counted once (twice when the output head is
    /// untied).
    pub parameters: f64,
    /// Parameters one decode step reads: all but the embedding table (from which a step reads
    /// one row per token), the output head included.
    pub decode_parameters: f64,
    /// K and V values cached per token: 2 × layers × KV heads × head dim.
    pub kv_values_per_token: f64,
    /// Attention FLOPs per decode token per context token: 4 × layers × heads × head dim.
    pub attention_flops_per_context_token: f64,
}

impl ModelShape {
    /// Reads the layer shapes of a dense Llama-like config (Llama, Qwen2/3, Mistral, …):
    /// `hidden_size`, `num_hidden_layers`, `num_attention_heads`, `num_key_value_heads`
    /// (default: the attention heads), `head_dim` (default: hidden / heads),
    /// `intermediate_size`, `vocab_size`, `tie_word_embeddings` (default false). Norms are
    /// counted (2 per layer, plus the final one); biases are not.
    pub fn from_hf_config(config: &Value) -> Result<ModelShape> {
        let field = |key: &str| -> Result<f64> {
            config[key]
                .as_f64()
                .with_context(|| format!("model config: `{key}` is missing or not a number"))
        };
        // A multimodal checkpoint (Qwen3.5's) keeps its text decoder's keys in `text_config`.
        let recurrent = [config, &config["text_config"]].iter().any(|c| {
            c["layer_types"]
                .as_array()
                .is_some_and(|types| types.iter().any(|t| t == "linear_attention"))
                || c.get("linear_num_value_heads").is_some()
        });
        if recurrent {
            bail!(
                "model config: a hybrid model (Gated DeltaNet layers beside attention) keeps \
                 a recurrent state instead of KV in most layers; read the bound's inputs from \
                 the server's /version (its recurrent_state_bytes_per_sequence among them)"
            );
        }
        if config.get("num_experts").is_some() || config.get("num_local_experts").is_some() {
            bail!(
                "model config: a mixture of experts reads only its active experts per token; \
                 give --weight-bytes for the bytes one decode step reads"
            );
        }
        let hidden = field("hidden_size")?;
        let layers = field("num_hidden_layers")?;
        let heads = field("num_attention_heads")?;
        let kv_heads = config["num_key_value_heads"].as_f64().unwrap_or(heads);
        let head_dim = config["head_dim"].as_f64().unwrap_or(hidden / heads);
        let intermediate = field("intermediate_size")?;
        let vocab = field("vocab_size")?;
        let tied = config["tie_word_embeddings"].as_bool().unwrap_or(false);
        let attention = hidden * heads * head_dim * 2.0 + hidden * kv_heads * head_dim * 2.0;
        let mlp = 3.0 * hidden * intermediate;
        let norms = 2.0 * hidden;
        let per_layer = attention + mlp + norms;
        let embedding = vocab * hidden;
        let body = layers * per_layer + hidden;
        let parameters = body + embedding + if tied { 0.0 } else { embedding };
        Ok(ModelShape {
            parameters,
            decode_parameters: body + embedding,
            kv_values_per_token: 2.0 * layers * kv_heads * head_dim,
            attention_flops_per_context_token: 4.0 * layers * heads * head_dim,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Qwen3-0.6B's published config (the QK-norm weights, 2 × 128 a layer, are not counted).
    fn qwen3_0_6b() -> Value {
        serde_json::json!({
            "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16,
            "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072,
            "vocab_size": 151936, "tie_word_embeddings": true
        })
    }

    #[test]
    fn qwen3_shape_by_hand() {
        let shape = ModelShape::from_hf_config(&qwen3_0_6b()).unwrap();
        // A layer: q and o 1024 × 2048 each, k and v 1024 × 1024 each, the MLP 3 × 1024 ×
        // 3072, two norms of 1024: 4,194,304 + 2,097,152 + 9,437,184 + 2,048 = 15,730,688.
        // 28 layers + the final norm: 440,460,288; the tied 151,936 × 1,024 table:
        // 155,582,464.
        assert_eq!(shape.parameters, 440_460_288.0 + 155_582_464.0);
        assert_eq!(shape.decode_parameters, shape.parameters);
        // 2 × 28 × 8 × 128.
        assert_eq!(shape.kv_values_per_token, 57_344.0);
        // 4 × 28 × 16 × 128.
        assert_eq!(shape.attention_flops_per_context_token, 229_376.0);
        let mut untied = qwen3_0_6b();
        untied["tie_word_embeddings"] = false.into();
        let untied = ModelShape::from_hf_config(&untied).unwrap();
        assert_eq!(untied.parameters, shape.parameters + 155_582_464.0);
        assert_eq!(untied.decode_parameters, shape.decode_parameters);
        let mut moe = qwen3_0_6b();
        moe["num_experts"] = 128.into();
        assert!(ModelShape::from_hf_config(&moe).is_err());
        let mut hybrid = qwen3_0_6b();
        hybrid["layer_types"] = serde_json::json!(["linear_attention", "full_attention"]);
        let err = ModelShape::from_hf_config(&hybrid).unwrap_err().to_string();
        assert!(err.contains("a hybrid model"), "{err}");
        let multimodal = serde_json::json!({"text_config": {"linear_num_value_heads": 16}});
        let err = ModelShape::from_hf_config(&multimodal)
            .unwrap_err()
            .to_string();
        assert!(err.contains("a hybrid model"), "{err}");
        assert!(ModelShape::from_hf_config(&serde_json::json!({"hidden_size": 8})).is_err());
    }

    #[test]
    fn decode_bound_of_qwen3_bf16_on_an_h100_sxm() {
        let shape = ModelShape::from_hf_config(&qwen3_0_6b()).unwrap();
        let h100 = hardware("H100_SXM").unwrap();
        let inputs = BoundInputs {
            weight_bytes: Some(shape.decode_parameters * dtype_bytes("bf16").unwrap()),
            kv_bytes_per_token: Some(shape.kv_values_per_token * 2.0),
            kv_window_reads: Vec::new(),
            state_bytes_per_sequence: None,
            parameters: Some(shape.parameters),
            attention_flops_per_context_token: Some(shape.attention_flops_per_context_token),
            bandwidth_bytes_per_s: Some(h100.bandwidth_bytes_per_s),
            flops: Some(h100.bf16_flops),
            sources: Vec::new(),
        };
        // Batch 64 at a mean context of 1,000: 2 × 596,042,752 = 1,192,085,504 weight bytes
        // + 64 × 1,000 × 114,688 = 7,340,032,000 KV bytes = 8,532,117,504 bytes a step;
        // / 3.35e12 B/s = 2.546901 ms; 64 / 2.546901 ms = 25,128.58 tok/s.
        let bound = inputs.decode(64.0, 1000.0).unwrap();
        assert_eq!(bound.bytes_per_step, 8_532_117_504.0);
        assert!((bound.tpot_ms - 2.546901).abs() < 1e-5, "{bound:?}");
        assert!(
            (bound.output_tok_per_s - 25_128.58).abs() < 0.01,
            "{bound:?}"
        );
        // Its compute: 2 × 596,042,752 × 64 + 229,376 × 64 × 1,000 = 90,973,536,256 FLOPs
        // / 989.4e12 = 0.091948 ms: memory binds.
        assert_eq!(bound.flops_per_step, Some(90_973_536_256.0));
        assert!(
            (bound.compute_ms.unwrap() - 0.091948).abs() < 1e-5,
            "{bound:?}"
        );
        assert_eq!(bound.binds, Side::Memory);
        assert_eq!(bound.memory_ms, bound.tpot_ms);
        // On a CPU of 50 GB/s and 200 GFLOP/s at batch 16 and context 500: memory
        // (1,192,085,504 + 16 × 500 × 114,688) / 50e9 = 42.19 ms; compute
        // (2 × 596,042,752 × 16 + 229,376 × 16 × 500) / 200e9 = 104.54 ms: compute binds.
        let cpu = BoundInputs {
            bandwidth_bytes_per_s: Some(50e9),
            flops: Some(200e9),
            ..inputs.clone()
        };
        let bound = cpu.decode(16.0, 500.0).unwrap();
        assert!((bound.memory_ms - 42.19179).abs() < 1e-4, "{bound:?}");
        assert!((bound.tpot_ms - 104.54188).abs() < 1e-4, "{bound:?}");
        assert_eq!(bound.binds, Side::Compute);
        assert!((bound.output_tok_per_s - 16.0 / 0.10454188).abs() < 0.01);
        // Without FLOP/s, the memory side alone, and the compute side named as missing.
        let no_compute = BoundInputs {
            flops: None,
            ..cpu.clone()
        };
        let bound = no_compute.decode(16.0, 500.0).unwrap();
        assert_eq!((bound.compute_ms, bound.binds), (None, Side::Memory));
        assert!((bound.tpot_ms - 42.19179).abs() < 1e-4);
        assert_eq!(no_compute.missing_for_compute().len(), 1);
        // Prefill of 1,000 tokens: 2 × 596,042,752 × 1,000 / 989.4e12 = 1.2049 ms.
        let floor = inputs.prefill_floor_ms(1000.0).unwrap();
        assert!((floor - 1.204857).abs() < 1e-5, "{floor}");
        assert!(inputs.missing_for_decode().is_empty());
        // Half the KV bytes in layers of a 128-token window: at a context of 1,000 they
        // read 128 tokens, (64 × (1,000 × 57,344 + 128 × 57,344)) = 4,139,778,048 KV bytes.
        let windowed = BoundInputs {
            kv_bytes_per_token: Some(57_344.0),
            kv_window_reads: vec![KvWindowRead {
                window: 128.0,
                bytes_per_token: 57_344.0,
            }],
            ..inputs.clone()
        };
        let bound = windowed.decode(64.0, 1000.0).unwrap();
        assert_eq!(bound.bytes_per_step, 1_192_085_504.0 + 4_139_778_048.0);
        assert_eq!(
            windowed.decode(64.0, 100.0).unwrap().bytes_per_step,
            inputs.decode(64.0, 100.0).unwrap().bytes_per_step,
            "within the window every layer reads every token"
        );
        // A recurrent state of 1 MiB per sequence is read and written back every step,
        // whatever the context: 2 MiB more per sequence.
        let recurrent = BoundInputs {
            state_bytes_per_sequence: Some(1_048_576.0),
            ..inputs.clone()
        };
        for context in [10.0, 1000.0] {
            assert_eq!(
                recurrent.decode(64.0, context).unwrap().bytes_per_step,
                inputs.decode(64.0, context).unwrap().bytes_per_step + 64.0 * 2_097_152.0
            );
        }
        let unknown = BoundInputs {
            bandwidth_bytes_per_s: None,
            ..inputs
        };
        assert_eq!(unknown.decode(64.0, 1000.0), None);
        assert_eq!(unknown.missing_for_decode().len(), 1);
        assert!(hardware("b300").is_err());
        assert!(dtype_bytes("q3").is_err());
    }
}
