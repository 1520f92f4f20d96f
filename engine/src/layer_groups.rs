//! The KV cache's layer groups: the layers that keep the same tokens of a sequence, so
//! that one block table per sequence serves them all (issue 61).
//!
//! Full-attention layers keep every token; sliding layers keep their window, one kind per
//! window size. As in vLLM's hybrid KV cache manager (`_get_kv_cache_groups_uniform_page_size`),
//! every group has the same number of layers, so a block of any group is the same bytes and
//! all groups can draw on one pool: the kind with the fewest layers sets the group size
//! (the kind with the most, when it has under 1.5 times as many, the shorter kinds' groups
//! then padded), and a kind of `n` layers splits into `g = ⌈n / size⌉` groups, group `i`
//! taking its layers `i, i + g, i + 2g, …`.

use crate::config::{AttentionSpan, Mixer, ModelConfig};

/// The tokens a group's layers keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupKind {
    /// Every token of the context.
    Full,
    /// The last `window` positions.
    Sliding { window: usize },
    /// A fixed-size state per sequence, in `blocks` blocks of the pool, whatever its
    /// length: the recurrent layers of hybrid models (Qwen3.5's Gated DeltaNet, issue 62).
    Recurrent { blocks: usize },
}

/// Bytes of one value of a recurrent state: states are kept in f32.
pub const STATE_VALUE_BYTES: usize = 4;

/// A block-table entry holding no block: a position a sliding group's window has passed.
pub const NO_BLOCK: u32 = u32::MAX;

/// A copy of a sequence's recurrent state in one layer group, at a block-aligned
/// position: a checkpoint the prefix cache keeps, held in blocks of the pool laid out as
/// the sequence's own state (the group's table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateCopy {
    pub group: usize,
    /// The position the state is at: the tokens `0..position` are in it.
    pub position: usize,
    pub blocks: Vec<u32>,
}

impl GroupKind {
    /// The first block (of `block_size` tokens) the group keeps for a sequence whose next
    /// position to compute is `next`: a sliding window's query at `next` reads from
    /// `next + 1 − window`; the other kinds keep everything.
    pub fn first_kept_block(self, next: usize, block_size: usize) -> usize {
        match self {
            GroupKind::Sliding { window } => (next + 1).saturating_sub(window) / block_size,
            GroupKind::Full | GroupKind::Recurrent { .. } => 0,
        }
    }
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
    /// The groups of `config`'s layers, kind by kind in the order of their first layers,
    /// for blocks of `layer_block_bytes` per layer: a recurrent layer's f32 state takes as
    /// many blocks as it needs.
    pub fn of(config: &ModelConfig, layer_block_bytes: usize) -> LayerGroups {
        let mut kinds: Vec<(GroupKind, Vec<usize>)> = Vec::new();
        for (i, layer) in config.layers.iter().enumerate() {
            let kind = match (layer.mixer, layer.attention) {
                (Mixer::GatedDeltaNet(spec), _) => GroupKind::Recurrent {
                    blocks: (spec.state_values() * STATE_VALUE_BYTES)
                        .div_ceil(layer_block_bytes.max(1)),
                },
                (Mixer::Attention { .. }, AttentionSpan::Full) => GroupKind::Full,
                (Mixer::Attention { .. }, AttentionSpan::Sliding { window }) => {
                    GroupKind::Sliding { window }
                }
            };
            match kinds.iter_mut().find(|(k, _)| *k == kind) {
                Some((_, layers)) => layers.push(i),
                None => kinds.push((kind, vec![i])),
            }
        }
        let fewest = kinds.iter().map(|(_, l)| l.len()).min().unwrap_or(0);
        let most = kinds.iter().map(|(_, l)| l.len()).max().unwrap_or(0);
        let group_size = if 2 * most < 3 * fewest { most } else { fewest };
        let mut groups = Vec::new();
        for (kind, layers) in &kinds {
            let num_groups = layers.len().div_ceil(group_size.max(1));
            for i in 0..num_groups {
                groups.push(LayerGroup {
                    kind: *kind,
                    layers: layers.iter().copied().skip(i).step_by(num_groups).collect(),
                });
            }
        }
        LayerGroups { groups, group_size }
    }

    /// The groups a backend keeps: by kind where its attention reads a table per group
    /// ([`crate::backend::AttentionOps::keeps_windows`]) or the model has recurrent layers,
    /// else every layer in one full group.
    pub fn kept(
        config: &ModelConfig,
        keeps_windows: bool,
        layer_block_bytes: usize,
    ) -> LayerGroups {
        let recurrent = config
            .layers
            .iter()
            .any(|l| matches!(l.mixer, Mixer::GatedDeltaNet(_)));
        if keeps_windows || recurrent {
            LayerGroups::of(config, layer_block_bytes)
        } else {
            LayerGroups::whole(config)
        }
    }

    /// Whether any group keeps a recurrent state.
    pub fn has_recurrent(&self) -> bool {
        self.groups
            .iter()
            .any(|g| matches!(g.kind, GroupKind::Recurrent { .. }))
    }

    /// Every layer in one full group: the cache keeps every token of every layer.
    pub fn whole(config: &ModelConfig) -> LayerGroups {
        LayerGroups::full(config.num_layers())
    }

    /// One full group of `num_layers` layers.
    pub fn full(num_layers: usize) -> LayerGroups {
        let layers: Vec<usize> = (0..num_layers).collect();
        LayerGroups {
            group_size: layers.len(),
            groups: vec![LayerGroup {
                kind: GroupKind::Full,
                layers,
            }],
        }
    }

    /// The kinds of the groups, in order (what the block manager is built from).
    pub fn kinds(&self) -> Vec<GroupKind> {
        self.groups.iter().map(|g| g.kind).collect()
    }

    /// For each layer, its group and its index in it (the cache it reads: layers at the
    /// same index of different groups share one cache, through their groups' blocks).
    pub fn placement(&self, num_layers: usize) -> Vec<(usize, usize)> {
        let mut at = vec![(0, 0); num_layers];
        for (g, group) in self.groups.iter().enumerate() {
            for (i, &layer) in group.layers.iter().enumerate() {
                at[layer] = (g, i);
            }
        }
        at
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
                    GroupKind::Recurrent { .. } => ("recurrent_state", None),
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
        let groups = LayerGroups::of(&with_spans(&[AttentionSpan::Full; 4]), 1);
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
    /// layers set the group size: five sliding groups of 3 layers, each taking every fifth
    /// sliding layer, then the full group.
    #[test]
    fn gemma3s_pattern_makes_groups_of_its_full_layers_count() {
        let spans: Vec<AttentionSpan> = (0..18)
            .map(|i| match i % 6 {
                5 => AttentionSpan::Full,
                _ => AttentionSpan::Sliding { window: 512 },
            })
            .collect();
        let groups = LayerGroups::of(&with_spans(&spans), 1);
        assert_eq!(groups.group_size, 3);
        let sliding = GroupKind::Sliding { window: 512 };
        let want = [
            (sliding, vec![0, 6, 12]),
            (sliding, vec![1, 7, 13]),
            (sliding, vec![2, 8, 14]),
            (sliding, vec![3, 9, 15]),
            (sliding, vec![4, 10, 16]),
            (GroupKind::Full, vec![5, 11, 17]),
        ];
        let got: Vec<(GroupKind, Vec<usize>)> = groups
            .groups
            .into_iter()
            .map(|g| (g.kind, g.layers))
            .collect();
        assert_eq!(got, want);
    }

    /// Two windows are two kinds; a kind whose layers do not divide by the group size has
    /// a short group; kinds of nearly equal counts (under 1.5 times) take the larger count
    /// as the group size, as vLLM pads gpt-oss's 12 sliding and 13 full layers (with a
    /// drafter's layer) to two groups of 13.
    #[test]
    fn group_sizes_follow_the_kinds_counts() {
        let (a, b) = (
            AttentionSpan::Sliding { window: 128 },
            AttentionSpan::Sliding { window: 4096 },
        );
        let kinds_and_sizes = |spans: &[AttentionSpan]| {
            let groups = LayerGroups::of(&with_spans(spans), 1);
            let sizes: Vec<(GroupKind, Vec<usize>)> = groups
                .groups
                .into_iter()
                .map(|g| (g.kind, g.layers))
                .collect();
            (groups.group_size, sizes)
        };
        let (short, long) = (
            GroupKind::Sliding { window: 128 },
            GroupKind::Sliding { window: 4096 },
        );
        // 4 + 2 layers: groups of 2.
        assert_eq!(
            kinds_and_sizes(&[a, b, a, b, a, a]),
            (
                2,
                vec![(short, vec![0, 4]), (short, vec![2, 5]), (long, vec![1, 3])]
            )
        );
        // 3 + 2 layers: 1.5 times exactly, so groups of 2, the short kind's second short.
        assert_eq!(
            kinds_and_sizes(&[a, b, a, b, a]),
            (
                2,
                vec![(short, vec![0, 4]), (short, vec![2]), (long, vec![1, 3])]
            )
        );
        // 4 + 3 layers: under 1.5 times, so one group of each, the long kind's padded.
        assert_eq!(
            kinds_and_sizes(&[a, b, a, b, a, b, a]),
            (4, vec![(short, vec![0, 2, 4, 6]), (long, vec![1, 3, 5])])
        );
        // 5 + 2 + 1: the single full layer sets groups of 1.
        let (size, groups) = kinds_and_sizes(&[a, b, a, b, a, AttentionSpan::Full, a]);
        assert_eq!((size, groups.len()), (1, 7));
        let mut spans = vec![AttentionSpan::Sliding { window: 128 }; 12];
        spans.extend([AttentionSpan::Full; 13]);
        let (size, groups) = kinds_and_sizes(&spans);
        assert_eq!(size, 13);
        assert_eq!(
            groups
                .iter()
                .map(|(k, l)| (*k, l.len()))
                .collect::<Vec<_>>(),
            [(short, 12), (GroupKind::Full, 13)]
        );
    }

    /// Qwen3.5's pattern, three DeltaNet layers to an attention layer: each DeltaNet layer
    /// a recurrent group (the one attention layer sets groups of one) of as many blocks as
    /// its f32 state needs (4 value heads of 16 × 16 and 3 × 128 convolution inputs: 5,632
    /// bytes, two blocks of 4,096, one of 5,632), kept by kind even where the backend's
    /// attention keeps no windows.
    #[test]
    fn delta_net_layers_are_recurrent_groups_of_their_states_blocks() {
        use crate::config::{DeltaNetSpec, Mixer, ValueHeadOrder};
        let mut config = with_spans(&[AttentionSpan::Full; 4]);
        let spec = DeltaNetSpec {
            num_key_heads: 2,
            num_value_heads: 4,
            key_head_dim: 16,
            value_head_dim: 16,
            conv_kernel: 4,
            value_head_order: ValueHeadOrder::Grouped,
        };
        for layer in &mut config.layers[..3] {
            layer.mixer = Mixer::GatedDeltaNet(spec);
        }
        let state = GroupKind::Recurrent { blocks: 2 };
        for keeps_windows in [true, false] {
            let groups = LayerGroups::kept(&config, keeps_windows, 4096);
            assert_eq!(groups.group_size, 1);
            assert_eq!(
                groups.kinds(),
                [state, state, state, GroupKind::Full],
                "keeps_windows {keeps_windows}"
            );
            assert!(groups.has_recurrent());
        }
        let one_block = LayerGroups::of(&config, 5632).kinds();
        assert_eq!(one_block[0], GroupKind::Recurrent { blocks: 1 });
        assert_eq!(
            LayerGroups::of(&config, 5631).kinds()[0],
            GroupKind::Recurrent { blocks: 2 }
        );
        assert!(!LayerGroups::of(&with_spans(&[AttentionSpan::Full; 4]), 1).has_recurrent());
    }

    /// `/version` lists the groups with their kinds, windows and layers.
    #[test]
    fn the_groups_describe_their_kinds_windows_and_layers() {
        let window = AttentionSpan::Sliding { window: 4096 };
        assert_eq!(
            LayerGroups::of(&with_spans(&[window, window]), 1).describe(),
            serde_json::json!({"layers_per_group": 2, "groups": [
                {"kind": "sliding_attention", "window": 4096, "layers": [0, 1]}]})
        );
        assert_eq!(
            LayerGroups::of(&with_spans(&[window, AttentionSpan::Full]), 1).describe(),
            serde_json::json!({"layers_per_group": 1, "groups": [
                {"kind": "sliding_attention", "window": 4096, "layers": [0]},
                {"kind": "full_attention", "window": null, "layers": [1]}]})
        );
        assert_eq!(
            LayerGroups::whole(&with_spans(&[window, AttentionSpan::Full])).describe(),
            serde_json::json!({"layers_per_group": 2, "groups": [
                {"kind": "full_attention", "window": null, "layers": [0, 1]}]})
        );
    }
}
