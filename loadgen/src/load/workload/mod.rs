//! Workloads: what each request asks for (prompt, exact input length, target output length,
//! optional shared-prefix group). Sources: the synthetic generators and trace files.

pub mod agentic;
pub mod lengths;
pub mod prompt;
pub mod sessions;
pub mod synthetic;
pub mod traces;

use serde::{Deserialize, Serialize};

/// A piece of a synthetic prompt: `len` tokens drawn deterministically from `key`.
/// Requests that share a block key share those tokens (a reusable prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Block {
    pub key: u64,
    pub len: u32,
}

/// Where a request's prompt comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptSource {
    /// Concatenation of synthetic blocks, built to an exact token count.
    Blocks(Vec<Block>),
    /// Literal text from a trace (ShareGPT, or the project JSONL `prompt`).
    Text(String),
}

impl PromptSource {
    /// The prompt as text.
    pub fn text(&self, prompts: &prompt::PromptBuilder) -> String {
        match self {
            PromptSource::Blocks(blocks) => prompts.text(blocks),
            PromptSource::Text(text) => text.clone(),
        }
    }
}

/// One request of a workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestSpec {
    /// Prompt length in tokens (approximate for literal text without a tokenizer).
    pub input_len: u32,
    /// Requested output length (`max_tokens`).
    pub output_len: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_group: Option<u64>,
    pub prompt: PromptSource,
    /// The model it asks for, when not the run's (`--model-mix`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The class its trace row gave it (the trace's model or service column).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
}

/// SplitMix64 finaliser: derives well-mixed block keys from (seed, tag, index).
pub fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Key tags keep block key spaces apart.
const TAG_UNIQUE: u64 = 1;
const TAG_PREFIX: u64 = 2;
const TAG_HASH_ID: u64 = 3;

/// Blocks of a prompt of `input_len` tokens whose first `prefix_len` tokens are shared by
/// `prefix_group` and whose rest is unique to request `index`.
pub fn prefixed_blocks(
    seed: u64,
    index: u64,
    input_len: u32,
    prefix: Option<(u64, u32)>,
) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut rest = input_len;
    if let Some((group, prefix_len)) = prefix {
        let len = prefix_len.min(input_len);
        blocks.push(Block {
            key: mix(mix(seed, TAG_PREFIX), group),
            len,
        });
        rest -= len;
    }
    if rest > 0 {
        blocks.push(Block {
            key: mix(mix(seed, TAG_UNIQUE), index),
            len: rest,
        });
    }
    blocks
}

/// Mooncake-style prompt: one block per prefix hash id (`block_size` tokens each, the last
/// one cut so the total is `input_len`). Equal hash ids give equal token blocks; tokens past
/// the last id (a trace that hashes full blocks only) are request `index`'s own.
pub fn hash_id_blocks(
    seed: u64,
    index: u64,
    hash_ids: &[u64],
    input_len: u32,
    block_size: u32,
) -> Vec<Block> {
    let mut blocks = Vec::with_capacity(hash_ids.len());
    let mut rest = input_len;
    for &h in hash_ids {
        if rest == 0 {
            break;
        }
        let len = rest.min(block_size);
        blocks.push(Block {
            key: mix(mix(seed, TAG_HASH_ID), h),
            len,
        });
        rest -= len;
    }
    if rest > 0 {
        blocks.push(Block {
            key: mix(mix(seed, TAG_UNIQUE), index),
            len: rest,
        });
    }
    blocks
}
