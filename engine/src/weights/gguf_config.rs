//! The model's hyper-parameters from a GGUF file's metadata (`{arch}.*` keys), beside the
//! GGUF reader, so that `config` does not depend on it.

use std::path::Path;

use anyhow::{bail, Context};

use super::gguf::{GgufFile, GgufValue};
use crate::config::{
    gguf_layers, CommonLayer, Family, GgufMetadata, ModelConfig, RopeScaling, RopeSpec,
    YarnRopeScaling,
};

impl GgufMetadata for GgufFile {
    fn path(&self) -> &Path {
        GgufFile::path(self)
    }

    fn has_tensor(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    fn usize_key(&self, key: &str) -> anyhow::Result<Option<usize>> {
        self.opt(key, GgufFile::get_usize)
    }

    fn f64_key(&self, key: &str) -> anyhow::Result<Option<f64>> {
        self.opt(key, GgufFile::get_f64)
    }

    fn int_array_key(&self, key: &str) -> anyhow::Result<Option<Vec<i64>>> {
        match self.metadata.get(key) {
            Some(GgufValue::Array(_)) => self.get_int_array(key).map(Some),
            _ => Ok(None),
        }
    }

    fn tensor_f32(&self, name: &str) -> anyhow::Result<Vec<f32>> {
        Ok(self.read_tensor(name)?.into_f32())
    }
}

impl ModelConfig {
    /// Reads the hyper-parameters from GGUF metadata (`{arch}.*` keys); the vocab
    /// size is the length of `tokenizer.ggml.tokens`, and embeddings are tied
    /// when the file has no `output.weight`.
    pub fn from_gguf(file: &GgufFile) -> anyhow::Result<ModelConfig> {
        let arch_name = file.get_str("general.architecture")?;
        let family = Family::from_gguf_name(arch_name).with_context(|| {
            format!(
                "unsupported architecture {arch_name} in {} (general.architecture)",
                file.path().display()
            )
        })?;
        let key = |suffix: &str| format!("{arch_name}.{suffix}");
        let scaling = rope_scaling(file, &key)?;
        let hidden_size = file.get_usize(&key("embedding_length"))?;
        let num_heads = file.get_usize(&key("attention.head_count"))?;
        let head_dim = match file.opt(&key("attention.key_length"), GgufFile::get_usize)? {
            Some(head_dim) => head_dim,
            None if num_heads > 0 && hidden_size.is_multiple_of(num_heads) => {
                hidden_size / num_heads
            }
            None => bail!(
                "{} {num_heads} does not divide {} {hidden_size} in {}",
                key("attention.head_count"),
                key("embedding_length"),
                file.path().display()
            ),
        };
        let rotary_dim = file
            .opt(&key("rope.dimension_count"), GgufFile::get_usize)?
            .unwrap_or(head_dim);
        if rotary_dim == 0 || rotary_dim > head_dim || !rotary_dim.is_multiple_of(2) {
            bail!(
                "{} {rotary_dim} must be a positive even number at most the head dimension {head_dim} in {}",
                key("rope.dimension_count"),
                file.path().display()
            );
        }
        let common = CommonLayer {
            family,
            hidden_size,
            num_layers: file.get_usize(&key("block_count"))?,
            rope: RopeSpec {
                theta: file
                    .opt(&key("rope.freq_base"), GgufFile::get_f64)?
                    .unwrap_or(10_000.0) as f32,
                rotary_dim,
                scaling,
            },
            // A qwen3moe file whose every layer has experts needs no dense width.
            intermediate_size: match family {
                Family::Qwen3Moe => file
                    .opt(&key("feed_forward_length"), GgufFile::get_usize)?
                    .unwrap_or(0),
                _ => file.get_usize(&key("feed_forward_length"))?,
            },
            head_dim,
        };
        let (layers, extras) = gguf_layers(file, &common)?;
        let eos = file.opt("tokenizer.ggml.eos_token_id", GgufFile::get_usize)?;
        Ok(ModelConfig {
            family,
            vocab_size: file.get_str_array("tokenizer.ggml.tokens")?.len(),
            hidden_size,
            num_heads,
            num_kv_heads: file
                .opt(&key("attention.head_count_kv"), GgufFile::get_usize)?
                .unwrap_or(num_heads),
            head_dim,
            rms_norm_eps: file.get_f64(&key("attention.layer_norm_rms_epsilon"))? as f32,
            max_position_embeddings: file.get_usize(&key("context_length"))?,
            tie_word_embeddings: !file.tensors.contains_key("output.weight"),
            bos_token_id: file
                .opt("tokenizer.ggml.bos_token_id", GgufFile::get_usize)?
                .map(|id| id as u32),
            eos_token_ids: eos.map(|id| id as u32).into_iter().collect(),
            embedding_scale: extras.embedding_scale,
            final_logit_softcap: extras.final_logit_softcap,
            norm_weights: extras.norm_weights,
            layers,
        })
    }
}

/// The RoPE scaling llama.cpp's converter wrote (`{arch}.rope.scaling.*`): none, linear
/// with its factor, or YaRN with its factor, original context and optional betas and
/// attention factor (llama.cpp's default attention factor is transformers'
/// `0.1 ln(factor) + 1`). Llama 3's scaling is a tensor instead, read by the family.
fn rope_scaling(
    file: &GgufFile,
    key: &dyn Fn(&str) -> String,
) -> anyhow::Result<Option<RopeScaling>> {
    let type_key = key("rope.scaling.type");
    if !file.metadata.contains_key(&type_key) {
        return Ok(None);
    }
    let kind = file.get_str(&type_key)?;
    if kind == "none" {
        return Ok(None);
    }
    if kind == "linear" {
        return Ok(Some(RopeScaling::Linear {
            factor: file.get_f64(&key("rope.scaling.factor"))? as f32,
        }));
    }
    if kind != "yarn" {
        bail!(
            "unsupported rope scaling `{kind}` ({type_key}) in {}",
            file.path().display()
        );
    }
    let opt_f64 = |suffix: &str| file.opt(&key(suffix), GgufFile::get_f64);
    let ext_key = key("rope.scaling.yarn_ext_factor");
    if let Some(ext) = opt_f64("rope.scaling.yarn_ext_factor")? {
        if ext != 1.0 {
            bail!(
                "{ext_key} = {ext} in {}: only YaRN's full ramp (1) is supported",
                file.path().display()
            );
        }
    }
    let log_mul_key = key("rope.scaling.yarn_log_multiplier");
    if file.metadata.contains_key(&log_mul_key) {
        bail!(
            "{log_mul_key} (DeepSeek's YaRN variant) is not supported, in {}",
            file.path().display()
        );
    }
    let factor = file.get_f64(&key("rope.scaling.factor"))? as f32;
    // The converter writes transformers' `attention_factor` as `yarn_attn_factor`; llama.cpp
    // multiplies the result by `rope.scaling.attn_factor` (1 when absent).
    let extra = opt_f64("rope.scaling.attn_factor")?.unwrap_or(1.0) as f32;
    Ok(Some(RopeScaling::Yarn(YarnRopeScaling {
        factor,
        original_max_position_embeddings: file
            .get_usize(&key("rope.scaling.original_context_length"))?,
        beta_fast: opt_f64("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0) as f32,
        beta_slow: opt_f64("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0) as f32,
        attention_factor: extra
            * match opt_f64("rope.scaling.yarn_attn_factor")? {
                Some(a) => a as f32,
                None => YarnRopeScaling::default_attention_factor(factor),
            },
        truncate: true,
    })))
}
