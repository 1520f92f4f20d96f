//! The KV cache's layer groups: the layers that keep the same tokens of a sequence, so
//! that one block table per sequence serves them all (issue 61).
//!
//! Full-attention layers keep every token; sliding layers keep their window, one kind per
//! window size. As in vLLM's hybrid KV cache manager, every group has the same number of
//! layers, so a block of any group is the same bytes and all groups can draw on one pool:
//! the kind with the fewest layers sets the group size, and every kind splits, in layer
//! order, into groups of that size (a kind's last group may be short).

use crate::config::{AttentionSpan, ModelConfig};

/// The tokens a group's layers keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupKind {
    /// Every token of the context.
    Full,
    /// The last `window` positions.
    Sliding { window: usize },
}

/// Layers of one kind that share a block table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerGroup {
    pub kind: GroupKind,
    /// Layer indices, ascending.
    pub layers: Vec<usize>,
}

/// A model's layer groups, in the order of their first layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerGroups {
    pub groups: Vec<LayerGroup>,
    /// Layers per group (the last group of a kind may hold fewer).
    pub group_size: usize,
}

impl LayerGroups {
    /// The groups of `config`'s layers.
    pub fn of(config: &ModelConfig) -> LayerGroups {
        let mut kinds: Vec<(GroupKind, Vec<usize>)> = Vec::new();
        for (i, layer) in config.layers.iter().enumerate() {
            let kind = match layer.attention {
                AttentionSpan::Full => GroupKind::Full,
                AttentionSpan::Sliding { window } => GroupKind::Sliding { window },
            };
            match kinds.iter_mut().find(|(k, _)| *k == kind) {
                Some((_, layers)) => layers.push(i),
                None => kinds.push((kind, vec![i])),
            }
        }
        let group_size = kinds.iter().map(|(_, l)| l.len()).min().unwrap_or(0);
        let mut groups: Vec<LayerGroup> = kinds
            .iter()
            .flat_map(|(kind, layers)| {
                layers.chunks(group_size.max(1)).map(|chunk| LayerGroup {
                    kind: *kind,
                    layers: chunk.to_vec(),
                })
            })
            .collect();
        groups.sort_by_key(|g| g.layers[0]);
        LayerGroups { groups, group_size }
    }

    /// The groups as `/version` lists them.
    pub fn describe(&self) -> serde_json::Value {
        let groups: Vec<serde_json::Value> = self
            .groups
            .iter()
            .map(|g| {
                let (kind, window) = match g.kind {
                    GroupKind::Full => ("full_attention", None),
                    GroupKind::Sliding { window } => ("sliding_attention", Some(window)),
                };
                serde_json::json!({ "kind": kind, "window": window, "layers": g.layers })
            })
            .collect();
        serde_json::json!({ "layers_per_group": self.group_size, "groups": groups })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_llama;

    /// A config whose layer `i` attends over `spans[i]`.
    fn with_spans(spans: &[AttentionSpan]) -> ModelConfig {
        let mut config = test_llama();
        let layer = config.layers[0].clone();
        config.layers = spans
            .iter()
            .map(|&attention| crate::config::LayerSpec {
                attention,
                ..layer.clone()
            })
            .collect();
        config
    }

    #[test]
    fn every_layer_full_is_one_group() {
        let groups = LayerGroups::of(&with_spans(&[AttentionSpan::Full; 4]));
        assert_eq!(groups.group_size, 4);
        assert_eq!(
            groups.groups,
            [LayerGroup {
                kind: GroupKind::Full,
                layers: vec![0, 1, 2, 3]
            }]
        );
    }

    /// Gemma 3 270M: 18 layers, every sixth full, the others sliding over 512. The 3 full
    /// layers set the group size: one full group and five sliding groups of 3 layers.
    #[test]
    fn gemma3s_pattern_makes_groups_of_its_full_layers_count() {
        let spans: Vec<AttentionSpan> = (0..18)
            .map(|i| match i % 6 {
                5 => AttentionSpan::Full,
                _ => AttentionSpan::Sliding { window: 512 },
            })
            .collect();
        let groups = LayerGroups::of(&with_spans(&spans));
        assert_eq!(groups.group_size, 3);
        let sliding = GroupKind::Sliding { window: 512 };
        let want = [
            (sliding, vec![0, 1, 2]),
            (sliding, vec![3, 4, 6]),
            (GroupKind::Full, vec![5, 11, 17]),
            (sliding, vec![7, 8, 9]),
            (sliding, vec![10, 12, 13]),
            (sliding, vec![14, 15, 16]),
        ];
        let got: Vec<(GroupKind, Vec<usize>)> = groups
            .groups
            .into_iter()
            .map(|g| (g.kind, g.layers))
            .collect();
        assert_eq!(got, want);
    }

    /// Two windows are two kinds; a kind whose layers do not divide by the group size ends
    /// with a short group.
    #[test]
    fn windows_of_two_sizes_are_two_kinds_and_a_last_group_may_be_short() {
        let (a, b) = (
            AttentionSpan::Sliding { window: 128 },
            AttentionSpan::Sliding { window: 4096 },
        );
        let groups = LayerGroups::of(&with_spans(&[a, b, a, b, a, AttentionSpan::Full, a]));
        assert_eq!(groups.group_size, 1);
        assert_eq!(groups.groups.len(), 7);
        let groups = LayerGroups::of(&with_spans(&[a, b, a, b, a]));
        assert_eq!(groups.group_size, 2);
        let sizes: Vec<(GroupKind, usize)> = groups
            .groups
            .iter()
            .map(|g| (g.kind, g.layers.len()))
            .collect();
        assert_eq!(
            sizes,
            [
                (GroupKind::Sliding { window: 128 }, 2),
                (GroupKind::Sliding { window: 4096 }, 2),
                (GroupKind::Sliding { window: 128 }, 1),
            ]
        );
    }
}
