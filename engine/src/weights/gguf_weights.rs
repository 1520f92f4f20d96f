//! A GGUF model as a [`WeightSource`]: HF tensor names, and the Q/K row order
//! of HF's rotate-half RoPE restored for Llama files.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context;

use super::gguf::GgufFile;
use super::{HostTensor, TensorData, WeightSource};
use crate::config::{Family, ModelConfig};

/// Per-layer GGUF tensor stems and their HF counterparts.
const LAYER_NAMES: &[(&str, &str)] = &[
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
    ("attn_norm", "input_layernorm"),
    ("ffn_norm", "post_attention_layernorm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
    ("ffn_gate_inp", "mlp.gate"),
    ("ffn_gate_exps", "mlp.experts.gate_proj"),
    ("ffn_up_exps", "mlp.experts.up_proj"),
    ("ffn_down_exps", "mlp.experts.down_proj"),
];

/// The HF name of a GGUF tensor of a `family` file, or `None` for tensors without one
/// (e.g. `rope_freqs.weight`). A family that stores fused projections keeps q/k/v in
/// `attn_qkv` and gate/up in `ffn_up`; one with sandwich norms (Gemma) names its pre-FFN
/// norm `ffn_norm` and the two post-norms `post_attention_norm` and `post_ffw_norm`.
/// gpt-oss names its pre-FFN norm `post_attention_norm` and its router `mlp.router`, and
/// its sinks (`attn_sinks.weight`) are HF's `self_attn.sinks`.
pub fn hf_name(gguf_name: &str, family: Family) -> Option<String> {
    if family.is_hybrid() {
        if let Some(name) = delta_net_parameter(gguf_name) {
            return Some(name);
        }
    }
    let (stem, suffix) = gguf_name.rsplit_once('.')?;
    if suffix != "weight" && suffix != "bias" {
        return None;
    }
    let hf_stem = match stem {
        "token_embd" => "model.embed_tokens".to_string(),
        "output_norm" => "model.norm".to_string(),
        "output" => "lm_head".to_string(),
        _ => {
            let rest = stem.strip_prefix("blk.")?;
            let (layer, part) = rest.split_once('.')?;
            let layer: usize = layer.parse().ok()?;
            let fused = family.stores_fused_projections();
            let sandwich = family.has_sandwich_norms();
            let gpt_oss = family == Family::GptOss;
            if part == "attn_sinks" && suffix == "weight" {
                return Some(format!("model.layers.{layer}.self_attn.sinks"));
            }
            let hybrid = family.is_hybrid();
            let hf_part = match part {
                "post_attention_norm" if gpt_oss || hybrid => "post_attention_layernorm",
                "attn_qkv" if hybrid => "linear_attn.in_proj_qkv",
                "attn_gate" if hybrid => "linear_attn.in_proj_z",
                "ssm_beta" if hybrid => "linear_attn.in_proj_b",
                "ssm_alpha" if hybrid => "linear_attn.in_proj_a",
                "ssm_ba" if hybrid => "linear_attn.in_proj_ba",
                "ssm_conv1d" if hybrid => "linear_attn.conv1d",
                "ssm_norm" if hybrid => "linear_attn.norm",
                "ssm_out" if hybrid => "linear_attn.out_proj",
                "ffn_gate_shexp" if hybrid => "mlp.shared_expert.gate_proj",
                "ffn_up_shexp" if hybrid => "mlp.shared_expert.up_proj",
                "ffn_down_shexp" if hybrid => "mlp.shared_expert.down_proj",
                "ffn_gate_inp_shexp" if hybrid => "mlp.shared_expert_gate",
                "ffn_gate_inp" if gpt_oss => "mlp.router",
                "attn_qkv" if fused => "self_attn.qkv_proj",
                "ffn_up" if fused => "mlp.gate_up_proj",
                "post_attention_norm" if sandwich => "post_attention_layernorm",
                "ffn_norm" if sandwich => "pre_feedforward_layernorm",
                "post_ffw_norm" if sandwich => "post_feedforward_layernorm",
                _ => LAYER_NAMES.iter().find(|(g, _)| *g == part)?.1,
            };
            format!("model.layers.{layer}.{hf_part}")
        }
    };
    Some(format!("{hf_stem}.{suffix}"))
}

/// A DeltaNet's parameters that llama.cpp names without HF's suffix: `blk.N.ssm_a`
/// (`−exp(A_log)`, kept as `linear_attn.ssm_a`) and `blk.N.ssm_dt.bias` (`dt_bias`).
fn delta_net_parameter(gguf_name: &str) -> Option<String> {
    let rest = gguf_name.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let hf = match part {
        "ssm_a" => "ssm_a",
        "ssm_dt.bias" => "dt_bias",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.linear_attn.{hf}"))
}

/// Undoes llama.cpp's Q/K permutation. llama.cpp's converter reordered the rows
/// of every head from HF's `[half0 | half1]` to interleaved pairs
/// (`w.reshape(n_head, 2, head_dim / 2, ..).swapaxes(1, 2)`); this restores the
/// HF order: HF row `j * head_dim / 2 + i` of a head = GGUF row `2 * i + j`.
pub fn unpermute_rows<T: Copy + Default>(rows: &[T], n_head: usize, row_len: usize) -> Vec<T> {
    let head_rows = rows.len() / row_len / n_head;
    let half = head_rows / 2;
    let mut out = vec![T::default(); rows.len()];
    for h in 0..n_head {
        for j in 0..2 {
            for i in 0..half {
                let src = (h * head_rows + 2 * i + j) * row_len;
                let dst = (h * head_rows + j * half + i) * row_len;
                out[dst..dst + row_len].copy_from_slice(&rows[src..src + row_len]);
            }
        }
    }
    out
}

/// The tensors of a GGUF file under HF names.
pub struct GgufWeights {
    file: GgufFile,
    /// HF name -> GGUF name.
    names: HashMap<String, String>,
    /// `Some((n_head, n_kv_head))` when Q/K rows must be un-permuted (Llama).
    unpermute: Option<(usize, usize)>,
}

impl GgufWeights {
    /// Wraps a parsed file; `config` gives the head counts for Llama's un-permutation.
    pub fn new(file: GgufFile, config: &ModelConfig) -> GgufWeights {
        let names = file
            .tensors
            .keys()
            .map(|g| {
                let hf = hf_name(g, config.family).unwrap_or_else(|| g.clone());
                (hf, g.clone())
            })
            .collect();
        let unpermute =
            (config.family.gguf_permutes_qk()).then_some((config.num_heads, config.num_kv_heads));
        GgufWeights {
            file,
            names,
            unpermute,
        }
    }

    /// Names of all tensors (HF names where known), sorted.
    pub fn tensor_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.names.keys().cloned().collect();
        names.sort();
        names
    }
}

impl WeightSource for GgufWeights {
    fn load(&mut self, name: &str) -> anyhow::Result<HostTensor> {
        let gguf_name = self.names.get(name).with_context(|| {
            format!("missing tensor `{name}` in {}", self.file.path().display())
        })?;
        let tensor = self.file.read_tensor(gguf_name)?;
        let n_head = match self.unpermute {
            Some((n_head, _)) if name.ends_with("self_attn.q_proj.weight") => n_head,
            Some((_, n_kv_head)) if name.ends_with("self_attn.k_proj.weight") => n_kv_head,
            _ => return Ok(tensor),
        };
        if tensor.shape.len() != 2 {
            anyhow::bail!(
                "tensor `{gguf_name}` in {} has shape {:?}, not a matrix",
                self.file.path().display(),
                tensor.shape
            );
        }
        let rows = tensor.shape.first().copied().unwrap_or(0);
        let row_len = tensor.shape.get(1..).map_or(1, |d| d.iter().product());
        if n_head == 0 || !rows.is_multiple_of(2 * n_head) {
            anyhow::bail!(
                "tensor `{gguf_name}` in {} has {rows} rows, not a multiple of 2 x {n_head} heads",
                self.file.path().display()
            );
        }
        let data = match &tensor.data {
            TensorData::F32(v) => TensorData::F32(unpermute_rows(v, n_head, row_len)),
            TensorData::F16(v) => TensorData::F16(unpermute_rows(v, n_head, row_len)),
            TensorData::BF16(v) => TensorData::BF16(unpermute_rows(v, n_head, row_len)),
            TensorData::Quant(q, b) => {
                let row_bytes = row_len / q.block_elems() * q.block_bytes();
                TensorData::Quant(*q, unpermute_rows(b, n_head, row_bytes))
            }
            TensorData::QuantParts(_) => unreachable!("a file's tensor is of one type"),
        };
        Ok(HostTensor {
            shape: tensor.shape,
            data,
        })
    }

    fn contains(&self, name: &str) -> bool {
        self.names.contains_key(name)
    }

    fn origin(&self) -> String {
        self.file.path().display().to_string()
    }
}

/// Opens a GGUF model file: configuration from its metadata, and its weights.
pub fn open_gguf_model(path: &Path) -> anyhow::Result<(ModelConfig, GgufWeights)> {
    let file = GgufFile::open(path)?;
    let config = ModelConfig::from_gguf(&file)?;
    let weights = GgufWeights::new(file, &config);
    Ok((config, weights))
}
