//! Qwen3-Next, Qwen3.5 and Qwen3.5-MoE: hybrid decoders whose layers are Gated DeltaNet
//! layers (`linear_attention`) and full-attention layers with an output gate, per-head
//! zero-centred QK-norms and a quarter of each head rotated (`partial_rotary_factor`).
//! Qwen3-Next and Qwen3.5-MoE have experts with a gated shared expert.

use std::path::Path;

use anyhow::{bail, ensure, Context};
use serde_json::Value;

use super::hf_json::{opt_field, req_field};
use super::qwen::ensure_dense_width;
use super::{
    AttentionSpan, CommonLayer, DeltaNetSpec, ExpertSpec, Family, Ffn, GgufMetadata, LayerSpec,
    Mixer, Routing, ValueHeadOrder,
};

/// `max_position_embeddings` when a config leaves it out (Qwen3NextConfig's default).
pub const DEFAULT_MAX_POSITIONS: usize = 32_768;

/// Every `interval`-th layer is full attention when a config has no `layer_types`
/// (`full_attention_interval`, 4 by default).
const DEFAULT_FULL_ATTENTION_INTERVAL: usize = 4;

/// The layers an HF config describes.
pub fn hf_layers(
    json: &Value,
    common: &CommonLayer,
    file: &Path,
) -> anyhow::Result<Vec<LayerSpec>> {
    let n = common.num_layers;
    let full: Vec<bool> = match opt_field::<Vec<String>>(json, "layer_types", file)? {
        Some(types) => {
            ensure!(
                types.len() == n,
                "`layer_types` lists {} layers but `num_hidden_layers` is {n} in {}",
                types.len(),
                file.display()
            );
            types
                .iter()
                .enumerate()
                .map(|(i, kind)| match kind.as_str() {
                    "full_attention" => Ok(true),
                    "linear_attention" => Ok(false),
                    other => bail!(
                        "unsupported layer type `{other}` (layer {i} of `layer_types`) in {}",
                        file.display()
                    ),
                })
                .collect::<anyhow::Result<_>>()?
        }
        None => {
            let interval: usize = opt_field(json, "full_attention_interval", file)?
                .unwrap_or(DEFAULT_FULL_ATTENTION_INTERVAL);
            ensure!(
                interval >= 1,
                "full_attention_interval {interval} must be at least 1 in {}",
                file.display()
            );
            (0..n).map(|i| (i + 1) % interval == 0).collect()
        }
    };
    let or = |key: &str, default: usize| -> anyhow::Result<usize> {
        Ok(opt_field(json, key, file)?.unwrap_or(default))
    };
    // Qwen3NextConfig's defaults.
    let delta_net = DeltaNetSpec {
        num_key_heads: or("linear_num_key_heads", 16)?,
        num_value_heads: or("linear_num_value_heads", 32)?,
        key_head_dim: or("linear_key_head_dim", 128)?,
        value_head_dim: or("linear_value_head_dim", 128)?,
        conv_kernel: or("linear_conv_kernel_dim", 4)?,
        value_head_order: ValueHeadOrder::Grouped,
    };
    check_delta_net(delta_net, file)?;
    let experts = hf_experts(json, common.family, file)?;
    let mut layers = layers_of(common, &full, delta_net);
    if let Some((spec, shared)) = experts {
        let dense: Vec<usize> = match common.family {
            Family::Qwen3Next => opt_field(json, "mlp_only_layers", file)?.unwrap_or_default(),
            _ => Vec::new(),
        };
        let step: usize = match common.family {
            Family::Qwen3Next => opt_field(json, "decoder_sparse_step", file)?.unwrap_or(1),
            _ => 1,
        };
        ensure!(
            step >= 1,
            "decoder_sparse_step {step} must be at least 1 in {}",
            file.display()
        );
        // transformers' rule (Qwen3NextDecoderLayer).
        for (i, layer) in layers.iter_mut().enumerate() {
            if !dense.contains(&i) && (i + 1) % step == 0 {
                layer.ffn = Ffn::Experts(spec);
                layer.shared_expert = shared;
            }
        }
    }
    ensure_dense_width(&layers, common, file)?;
    Ok(layers)
}

/// The experts of an HF config and its shared expert's width (none when 0).
fn hf_experts(
    json: &Value,
    family: Family,
    file: &Path,
) -> anyhow::Result<Option<(ExpertSpec, Option<usize>)>> {
    if family == Family::Qwen35 {
        return Ok(None);
    }
    let num_experts: usize = req_field(json, "num_experts", file)?;
    if num_experts == 0 {
        return Ok(None);
    }
    // Qwen3.5-MoE always renormalises the chosen experts' weights; Qwen3-Next as its
    // `norm_topk_prob` says (true by default).
    let renormalise = match family {
        Family::Qwen3Next => opt_field(json, "norm_topk_prob", file)?.unwrap_or(true),
        _ => true,
    };
    let spec = ExpertSpec {
        num_experts,
        top_k: req_field(json, "num_experts_per_tok", file)?,
        intermediate_size: req_field(json, "moe_intermediate_size", file)?,
        routing: Routing::SoftmaxTopK { renormalise },
        biases: false,
    };
    spec.check("num_experts_per_tok", file)?;
    let shared: usize = opt_field(json, "shared_expert_intermediate_size", file)?.unwrap_or(0);
    Ok(Some((spec, (shared > 0).then_some(shared))))
}

/// The layers of a `qwen3next`, `qwen35` or `qwen35moe` GGUF file: a layer with
/// `ssm_a` is a DeltaNet, one with `attn_q` attention; the DeltaNet's shape from the
/// `ssm.*` keys as llama.cpp's converter writes them (`conv_kernel`, `state_size` = the
/// key head width, `group_count` = key heads, `time_step_rank` = value heads,
/// `inner_size` = all value heads' width). Blocks past `block_count −
/// nextn_predict_layers` (MTP) are left out.
pub fn gguf_layers(
    file: &dyn GgufMetadata,
    common: &CommonLayer,
) -> anyhow::Result<Vec<LayerSpec>> {
    let family = common.family;
    let arch = match family {
        Family::Qwen3Next => "qwen3next",
        Family::Qwen35 => "qwen35",
        _ => "qwen35moe",
    };
    let key = |k: &str| format!("{arch}.{k}");
    let required = |k: &str| file.required_usize(&key(k));
    let num_value_heads = required("ssm.time_step_rank")?;
    let inner = required("ssm.inner_size")?;
    ensure!(
        num_value_heads > 0 && inner.is_multiple_of(num_value_heads),
        "{} {inner} is not a multiple of {} {num_value_heads} in {}",
        key("ssm.inner_size"),
        key("ssm.time_step_rank"),
        file.path().display()
    );
    let delta_net = DeltaNetSpec {
        num_key_heads: required("ssm.group_count")?,
        num_value_heads,
        key_head_dim: required("ssm.state_size")?,
        value_head_dim: inner / num_value_heads,
        conv_kernel: required("ssm.conv_kernel")?,
        value_head_order: match family {
            Family::Qwen3Next => ValueHeadOrder::Grouped,
            _ => ValueHeadOrder::Tiled,
        },
    };
    check_delta_net(delta_net, file.path())?;
    let mtp = file.usize_key(&key("nextn_predict_layers"))?.unwrap_or(0);
    let n = common.num_layers.checked_sub(mtp).with_context(|| {
        format!(
            "{} {mtp} exceeds the {} blocks in {}",
            key("nextn_predict_layers"),
            common.num_layers,
            file.path().display()
        )
    })?;
    let mut full = Vec::with_capacity(n);
    for i in 0..n {
        let delta = file.has_tensor(&format!("blk.{i}.ssm_a"));
        let attention = file.has_tensor(&format!("blk.{i}.attn_q.weight"));
        ensure!(
            delta != attention,
            "block {i} of {} has {} (`blk.{i}.ssm_a` for a DeltaNet, `blk.{i}.attn_q.weight` \
             for attention)",
            file.path().display(),
            if delta { "both" } else { "neither" }
        );
        full.push(attention);
    }
    let mut layers = layers_of(
        &CommonLayer {
            num_layers: n,
            ..common.clone()
        },
        &full,
        delta_net,
    );
    if family != Family::Qwen35 {
        let spec = ExpertSpec::from_gguf(
            file,
            arch,
            Routing::SoftmaxTopK {
                renormalise: file
                    .usize_key(&key("expert_weights_norm"))?
                    .is_none_or(|v| v != 0),
            },
            false,
        )?;
        let shared = file
            .usize_key(&key("expert_shared_feed_forward_length"))?
            .filter(|&w| w > 0);
        for (i, layer) in layers.iter_mut().enumerate() {
            if file.has_tensor(&format!("blk.{i}.ffn_gate_inp.weight")) {
                layer.ffn = Ffn::Experts(spec);
                layer.shared_expert = shared;
            }
        }
    }
    ensure_dense_width(&layers, common, file.path())?;
    Ok(layers)
}

/// Value heads must share the key heads evenly, and the convolution must see a position.
fn check_delta_net(spec: DeltaNetSpec, file: &Path) -> anyhow::Result<()> {
    ensure!(
        spec.num_key_heads > 0
            && spec.num_value_heads.is_multiple_of(spec.num_key_heads)
            && spec.num_value_heads > 0,
        "the DeltaNet's {} value heads are not a positive multiple of its {} key heads in {}",
        spec.num_value_heads,
        spec.num_key_heads,
        file.display()
    );
    ensure!(
        spec.key_head_dim > 0 && spec.value_head_dim > 0 && spec.conv_kernel >= 1,
        "the DeltaNet's head widths ({} key, {} value) and convolution width ({}) must be \
         positive in {}",
        spec.key_head_dim,
        spec.value_head_dim,
        spec.conv_kernel,
        file.display()
    );
    Ok(())
}

/// Layer `i` attends where `full[i]`, else is a DeltaNet of `delta_net`'s shape.
fn layers_of(common: &CommonLayer, full: &[bool], delta_net: DeltaNetSpec) -> Vec<LayerSpec> {
    common
        .uniform()
        .into_iter()
        .zip(full)
        .map(|(layer, &full)| LayerSpec {
            mixer: match full {
                true => Mixer::Attention { output_gate: true },
                false => Mixer::GatedDeltaNet(delta_net),
            },
            attention: AttentionSpan::Full,
            qk_norm: full,
            ..layer
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::read_test_config as read;
    use super::super::with_keys;
    use super::super::{DeltaNetSpec, Ffn, Mixer, ValueHeadOrder};

    fn config(extra: serde_json::Value) -> serde_json::Value {
        let json = serde_json::json!({
            "architectures": ["Qwen3_5ForCausalLM"], "hidden_size": 64,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "num_hidden_layers": 8, "intermediate_size": 96, "vocab_size": 256,
            "linear_num_key_heads": 2, "linear_num_value_heads": 6, "linear_key_head_dim": 16,
            "linear_value_head_dim": 8,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e7,
                                "partial_rotary_factor": 0.25, "mrope_section": [1, 1, 0],
                                "mrope_interleaved": true}
        });
        with_keys(json, extra)
    }

    /// Without `layer_types`, every fourth layer attends; the DeltaNet takes its `linear_*`
    /// keys (the conv width by default 4), attention its gate, QK-norm and a quarter of the
    /// head rotated; norms are zero-centred.
    #[test]
    fn every_fourth_layer_attends_and_the_others_are_delta_nets() {
        let c = read(config(serde_json::json!({}))).unwrap();
        let delta_net = Mixer::GatedDeltaNet(DeltaNetSpec {
            num_key_heads: 2,
            num_value_heads: 6,
            key_head_dim: 16,
            value_head_dim: 8,
            conv_kernel: 4,
            value_head_order: ValueHeadOrder::Grouped,
        });
        let gated = Mixer::Attention { output_gate: true };
        let mixers: Vec<Mixer> = c.layers.iter().map(|l| l.mixer).collect();
        let want = [delta_net, delta_net, delta_net, gated];
        assert_eq!(mixers, [want, want].concat());
        assert_eq!(c.layers[3].rope.rotary_dim, 4);
        assert_eq!(c.layers[3].rope.theta, 1e7);
        assert!(c.layers[3].qk_norm && !c.layers[0].qk_norm);
        assert_eq!(c.norm_weights, super::super::NormWeights::PlusOne);
        let Mixer::GatedDeltaNet(spec) = mixers[0] else {
            unreachable!()
        };
        assert_eq!(
            (spec.conv_channels(), spec.projection_width()),
            (112, 112 + 48 + 12)
        );
        assert_eq!(spec.state_values(), 6 * 16 * 8 + 3 * 112);
        // Value heads 0..3 read key head 0 (grouped); tiled they alternate.
        assert_eq!(
            (0..6).map(|j| spec.key_head(j)).collect::<Vec<_>>(),
            [0, 0, 0, 1, 1, 1]
        );
        let tiled = DeltaNetSpec {
            value_head_order: ValueHeadOrder::Tiled,
            ..spec
        };
        assert_eq!(
            (0..6).map(|j| tiled.key_head(j)).collect::<Vec<_>>(),
            [0, 1, 0, 1, 0, 1]
        );
    }

    /// `layer_types` sets the pattern; an unknown type and value heads that do not share
    /// the key heads evenly are refused by name.
    #[test]
    fn layer_types_set_the_pattern_and_bad_shapes_are_refused() {
        let types = ["full_attention", "linear_attention"].repeat(4);
        let c = read(config(serde_json::json!({ "layer_types": types }))).unwrap();
        assert!(matches!(c.layers[0].mixer, Mixer::Attention { .. }));
        assert!(matches!(c.layers[1].mixer, Mixer::GatedDeltaNet(_)));
        let mut bad = types.clone();
        bad[5] = "mamba";
        let err = read(config(serde_json::json!({ "layer_types": bad })))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unsupported layer type `mamba` (layer 5"),
            "{err}"
        );
        let err = read(config(serde_json::json!({ "linear_num_value_heads": 5 })))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("5 value heads are not a positive multiple of its 2"),
            "{err}"
        );
    }

    /// Qwen3.5-MoE: experts on every layer, renormalised, with the shared expert;
    /// Qwen3-Next follows `norm_topk_prob` and `mlp_only_layers`.
    #[test]
    fn the_mixtures_take_their_experts_and_shared_expert() {
        let moe = serde_json::json!({
            "architectures": ["Qwen3_5MoeForCausalLM"], "num_experts": 4,
            "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 48
        });
        let c = read(config(moe.clone())).unwrap();
        for layer in &c.layers {
            let Ffn::Experts(e) = layer.ffn else {
                panic!("a dense layer")
            };
            assert_eq!((e.num_experts, e.top_k, e.intermediate_size), (4, 2, 32));
            assert_eq!(
                e.routing,
                super::super::Routing::SoftmaxTopK { renormalise: true }
            );
            assert_eq!(layer.shared_expert, Some(48));
        }
        let mut next = moe;
        next["architectures"] = serde_json::json!(["Qwen3NextForCausalLM"]);
        next["norm_topk_prob"] = false.into();
        next["mlp_only_layers"] = serde_json::json!([2]);
        let c = read(config(next)).unwrap();
        assert!(matches!(
            c.layers[2].ffn,
            Ffn::Dense {
                intermediate_size: 96
            }
        ));
        assert_eq!(c.layers[2].shared_expert, None);
        let Ffn::Experts(e) = c.layers[0].ffn else {
            panic!("a dense layer")
        };
        assert_eq!(
            e.routing,
            super::super::Routing::SoftmaxTopK { renormalise: false }
        );
    }
}
