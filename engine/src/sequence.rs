//! A sequence as the scheduler and the block manager see it: token ids, how many of
//! them have KV in the cache, and the physical blocks holding that KV, one table per
//! layer group.

use crate::layer_groups::StateCopy;

/// A sequence's id, unique within an engine.
pub type SeqId = u64;

/// Where a sequence is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqStatus {
    /// Queued, holds no blocks (new, or preempted).
    Waiting,
    /// Admitted: holds blocks for its prompt in every full group, and for the window
    /// and the tokens being computed in every sliding group.
    Running,
}

#[derive(Debug, Clone)]
pub struct Sequence {
    pub id: SeqId,
    /// Arrival order (smaller = earlier); FCFS and preemption victims follow it.
    pub arrival: u64,
    pub status: SeqStatus,
    /// Prompt followed by the generated tokens.
    pub token_ids: Vec<u32>,
    pub num_prompt_tokens: usize,
    /// Leading tokens whose K/V is in the cache. Prefill versus decode is decided from
    /// this against `token_ids.len()`, never from the number of generated tokens.
    pub num_computed_tokens: usize,
    /// Prompt tokens served by the prefix cache at first admission (reported as usage).
    pub num_cached_prompt_tokens: usize,
    /// Whether the sequence was admitted at least once (later admissions are re-prefills).
    pub admitted_once: bool,
    /// One table per layer group while running (empty while waiting). A full or sliding
    /// group's entry `i` is the block of positions `i·block_size..(i+1)·block_size`, or
    /// [`crate::layer_groups::NO_BLOCK`] where a sliding group's window has passed; a
    /// recurrent group's entries hold its state.
    pub block_tables: Vec<Vec<u32>>,
    /// Leading prompt tokens a later request is expected to share
    /// ([`crate::sampler::SamplingParams::history_tokens`]): a checkpoint of recurrent state
    /// is taken at the last block boundary within them.
    pub history_tokens: Option<usize>,
    /// Chained hashes of the leading full blocks whose K/V is computed.
    pub block_hashes: Vec<u64>,
    /// Per recurrent group, a cached copy of the state at the end of the prefix the cache
    /// served, for the next step to copy into the sequence's own state; held until then.
    pub state_restores: Vec<StateCopy>,
    /// Checkpoints the step being computed takes: per recurrent group, blocks for a copy
    /// of the state at a block-aligned position within the step's tokens, cached under
    /// the prefix once the step is computed.
    pub state_saves: Vec<StateCopy>,
}

impl Sequence {
    pub fn new(id: SeqId, arrival: u64, prompt: Vec<u32>) -> Sequence {
        let num_prompt_tokens = prompt.len();
        Sequence {
            id,
            arrival,
            status: SeqStatus::Waiting,
            token_ids: prompt,
            num_prompt_tokens,
            num_computed_tokens: 0,
            num_cached_prompt_tokens: 0,
            admitted_once: false,
            block_tables: Vec::new(),
            history_tokens: None,
            block_hashes: Vec::new(),
            state_restores: Vec::new(),
            state_saves: Vec::new(),
        }
    }

    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }

    pub fn prompt_tokens(&self) -> &[u32] {
        &self.token_ids[..self.num_prompt_tokens]
    }

    pub fn output_tokens(&self) -> &[u32] {
        &self.token_ids[self.num_prompt_tokens..]
    }

    pub fn num_output_tokens(&self) -> usize {
        self.token_ids.len() - self.num_prompt_tokens
    }

    /// Tokens still to run through the model before the next sample.
    pub fn num_uncomputed_tokens(&self) -> usize {
        self.token_ids.len() - self.num_computed_tokens
    }

    /// A decode step computes exactly the last sampled token; anything more is (re-)prefill.
    pub fn is_decode(&self) -> bool {
        self.num_uncomputed_tokens() == 1 && self.num_output_tokens() > 0
    }
}
