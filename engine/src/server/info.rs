//! What `GET /version` and `GET /v1/models` answer: who is serving what. `/version` gives the engine,
//! its device (which the backend's [`Device`] describes: its name, bandwidth and compute),
//! the model's architecture and footprint, and the KV cache, so that a load generator can
//! record who it measured.

use super::response::protocol::{ModelCard, ModelList};
use crate::backend::Device;
use crate::config::{AttentionSpan, ModelConfig, Routing};
use crate::layer_groups::LayerGroups;
use crate::model::Footprint;

/// What `GET /version` reports of a loaded server.
pub struct Facts<'a> {
    /// The `--model` path.
    pub model: String,
    pub served_names: &'a [String],
    pub device: Device,
    /// The CPU threads the engine computes on (what the CPU's bandwidth and compute are
    /// measured with).
    pub threads: usize,
    pub max_model_len: usize,
    pub kv_capacity_tokens: usize,
    pub max_num_seqs: usize,
    pub footprint: Footprint,
    /// The layer groups the KV cache's blocks serve.
    pub kv_layer_groups: &'a LayerGroups,
    pub config: &'a ModelConfig,
    /// The positions RoPE tables are built for.
    pub rope_positions: usize,
    pub prefix_caching: crate::engine::PrefixCaching,
    /// `--state-checkpoint-every`, in blocks.
    pub state_checkpoint_every: usize,
}

/// The body of `GET /version`; the device's bandwidth and compute are found here (on the
/// CPU, measured), once, at load.
pub fn version_body(facts: &Facts<'_>) -> serde_json::Value {
    let bandwidth = facts.device.memory_bandwidth(facts.threads);
    let compute = facts.device.compute_rate(facts.threads);
    serde_json::json!({
        "version": format!("engine {}", env!("CARGO_PKG_VERSION")),
        "backend": facts.device.to_string(),
        "device": facts.device.name(),
        "model": facts.model,
        "served_model_names": facts.served_names,
        "dtype": facts.device.dtype(),
        "max_model_len": facts.max_model_len,
        "kv_capacity_tokens": facts.kv_capacity_tokens,
        "max_num_seqs": facts.max_num_seqs,
        "weight_bytes": facts.footprint.weight_bytes,
        "kv_bytes_per_token": facts.footprint.kv.bytes_per_token,
        "kv_bytes_per_sequence_fixed": facts.footprint.kv.bytes_per_sequence_fixed,
        "kv_read_bytes_per_token": facts.footprint.kv.read_bytes_per_token,
        "kv_window_read_bytes_per_token": facts
            .footprint
            .kv
            .window_read_bytes
            .iter()
            .map(|&(window, bytes)| serde_json::json!({"window": window, "bytes": bytes}))
            .collect::<Vec<_>>(),
        "recurrent_state_bytes_per_sequence": facts.footprint.kv.state_bytes_per_sequence,
        "state_checkpoint_bytes": facts.footprint.kv.state_checkpoint_bytes,
        "kv_block_bytes": facts.footprint.kv.block_bytes,
        "state_checkpoint_every_blocks": facts.state_checkpoint_every,
        "kv_layer_groups": facts.kv_layer_groups.describe(),
        "prefix_caching": facts.prefix_caching.describe(),
        "parameters": facts.footprint.parameters,
        "attention_flops_per_context_token": facts.footprint.attention_flops_per_context_token,
        "architecture": architecture(facts.config, facts.rope_positions),
        "memory_bandwidth_bytes_per_s": bandwidth.as_ref().ok().map(|b| b.0),
        "memory_bandwidth_source": match &bandwidth {
            Ok((_, source)) => source.to_string(),
            Err(why) => format!("unknown: {why}"),
        },
        "compute_flops_per_s": compute.as_ref().ok().map(|c| c.0),
        "compute_flops_source": match &compute {
            Ok((_, source)) => source.to_string(),
            Err(why) => format!("unknown: {why}"),
        },
    })
}

/// `GET /v1/models`' body: each served name as a card.
pub fn model_list(
    served_names: &[String],
    created: u64,
    root: &str,
    max_model_len: usize,
) -> ModelList {
    let data = served_names
        .iter()
        .map(|name| ModelCard {
            id: name.clone(),
            object: "model",
            created,
            owned_by: "engine",
            root: root.to_string(),
            max_model_len,
        })
        .collect();
    ModelList {
        object: "list",
        data,
    }
}

/// The family and what its layers attend to: how many use a sliding window and which
/// windows, and that the KV blocks outside every window are kept (not freed) for now; each
/// distinct RoPE with the layers that use it, as tables of `rope_positions` apply it; and
/// each distinct mixture-of-experts FFN with the layers that have it.
fn architecture(config: &crate::config::ModelConfig, rope_positions: usize) -> serde_json::Value {
    let ropes = count_distinct(config.layers.iter().map(|l| &l.rope));
    let rope: Vec<serde_json::Value> = ropes
        .iter()
        .map(|(r, layers)| {
            serde_json::json!({
                "layers": layers,
                "theta": r.theta,
                "rotary_dim": r.rotary_dim,
                "head_dim": config.head_dim,
                "scaling": r.describe_scaling(rope_positions),
            })
        })
        .collect();
    let mut windows: Vec<usize> = config
        .layers
        .iter()
        .filter_map(|l| match l.attention {
            AttentionSpan::Sliding { window } => Some(window),
            AttentionSpan::Full => None,
        })
        .collect();
    let sliding = windows.len();
    windows.sort_unstable();
    windows.dedup();
    let experts = count_distinct(config.layers.iter().filter_map(|l| match l.ffn {
        crate::config::Ffn::Experts(e) => Some(e),
        crate::config::Ffn::Dense { .. } => None,
    }));
    let experts: Vec<serde_json::Value> = experts
        .iter()
        .map(|(e, layers)| {
            serde_json::json!({
                "layers": layers,
                "num_experts": e.num_experts,
                "top_k": e.top_k,
                "expert_intermediate_size": e.intermediate_size,
                "routing": match e.routing {
                    Routing::SoftmaxTopK { renormalise: false } => "softmax_top_k",
                    Routing::SoftmaxTopK { renormalise: true } => "softmax_top_k_renormalised",
                    Routing::TopKSoftmax => "top_k_softmax",
                },
                "biases": e.biases,
            })
        })
        .collect();
    serde_json::json!({
        "family": format!("{:?}", config.family),
        "layers": config.num_layers(),
        "sliding_window_layers": sliding,
        "sliding_windows": windows,
        "rope": rope,
        "experts": experts,
    })
}

/// Each distinct item, in order of first appearance, with how many times it appears.
fn count_distinct<T: PartialEq>(items: impl Iterator<Item = T>) -> Vec<(T, usize)> {
    let mut counted: Vec<(T, usize)> = Vec::new();
    for item in items {
        match counted.iter_mut().find(|(x, _)| *x == item) {
            Some((_, n)) => *n += 1,
            None => counted.push((item, 1)),
        }
    }
    counted
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/version` lists each distinct expert FFN with how many layers have it (none for a
    /// dense model).
    #[test]
    fn the_architecture_lists_each_expert_ffn_with_its_layers() {
        let mut config = crate::config::test_llama();
        assert_eq!(
            super::architecture(&config, 64)["experts"],
            serde_json::json!([])
        );
        let spec = crate::config::ExpertSpec {
            num_experts: 16,
            top_k: 4,
            intermediate_size: 32,
            routing: crate::config::Routing::SoftmaxTopK { renormalise: true },
            biases: false,
        };
        config.layers[1].ffn = crate::config::Ffn::Experts(spec);
        assert_eq!(
            super::architecture(&config, 64)["experts"],
            serde_json::json!([{"layers": 1, "num_experts": 16, "top_k": 4,
                "expert_intermediate_size": 32, "routing": "softmax_top_k_renormalised",
                "biases": false}])
        );
    }

    /// `/version` counts the windowed layers and lists their windows once.
    #[test]
    fn the_architecture_reports_sliding_windows() {
        let mut config = crate::config::test_llama();
        let full = super::architecture(&config, 4096);
        assert_eq!(full["sliding_window_layers"], 0);
        for layer in &mut config.layers {
            layer.attention = AttentionSpan::Sliding { window: 4096 };
        }
        let windowed = super::architecture(&config, 4096);
        assert_eq!(windowed["sliding_window_layers"], 2);
        assert_eq!(windowed["sliding_windows"], serde_json::json!([4096]));
        assert_eq!(
            windowed["rope"],
            serde_json::json!([{"layers": 2, "theta": 500000.0, "rotary_dim": 128,
                "head_dim": 128, "scaling": "none"}])
        );
    }

    /// LongRoPE's factor list follows the served context: short within the original one.
    #[test]
    fn the_architecture_says_which_longrope_factors_serve() {
        let mut config = crate::config::test_llama();
        for layer in &mut config.layers {
            layer.rope.scaling = Some(crate::config::RopeScaling::LongRope(
                crate::config::LongRopeScaling {
                    short_factor: vec![1.0; 64],
                    long_factor: vec![2.0; 64],
                    original_max_position_embeddings: 4096,
                    attention_factor: 1.2,
                },
            ));
        }
        let scaling =
            |positions| super::architecture(&config, positions)["rope"][0]["scaling"].clone();
        assert_eq!(
            scaling(4096),
            "longrope: the short factors, as the served context (4096) is within the original 4096"
        );
        assert_eq!(
            scaling(4097),
            "longrope: the long factors, as the served context (4097) exceeds the original 4096"
        );
    }
}
