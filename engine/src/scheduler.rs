//! Continuous batching, first come first served, under `max_num_seqs` and a per-step
//! token budget. Each step schedules the decodes of running sequences first, then
//! continues running prefills in chunks, then admits waiting sequences with what is left
//! of the budget (chunked prefill). When a decode cannot get a block, the latest-arrived
//! running sequence is preempted by recompute: its blocks are freed and it goes back to
//! the front of the queue, to re-prefill its prompt and generated tokens later (often
//! largely from the prefix cache).

use std::collections::{HashMap, VecDeque};

use anyhow::{ensure, Context};

use crate::kv_cache::BlockManager;
use crate::sequence::SeqId;
use crate::sequence::{SeqStatus, Sequence};

#[derive(Debug, Clone, Copy)]
pub struct SchedulerConfig {
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
}

/// One sequence's work in a step: compute tokens `start..start + len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduledChunk {
    pub id: SeqId,
    pub start: usize,
    pub len: usize,
    /// False for a decode (the one newly sampled token), true for (re-)prefill work.
    pub is_prefill: bool,
}

/// A live sequence and the record its owner keeps beside it (the engine's per-sequence
/// state: sampler, detokeniser, stop state); added and removed together, so the two can
/// never disagree about which sequences exist.
struct Entry<R> {
    seq: Sequence,
    record: R,
}

pub struct Scheduler<R> {
    config: SchedulerConfig,
    block_manager: BlockManager,
    seqs: HashMap<SeqId, Entry<R>>,
    waiting: VecDeque<SeqId>,
    /// Sorted by arrival, so the tail is always the preemption victim.
    running: Vec<SeqId>,
    num_preemptions: u64,
}

impl<R> Scheduler<R> {
    pub fn new(config: SchedulerConfig, block_manager: BlockManager) -> Scheduler<R> {
        Scheduler {
            config: SchedulerConfig {
                max_num_seqs: config.max_num_seqs.max(1),
                max_num_batched_tokens: config.max_num_batched_tokens.max(1),
            },
            block_manager,
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            num_preemptions: 0,
        }
    }

    pub fn block_manager(&self) -> &BlockManager {
        &self.block_manager
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn num_preemptions(&self) -> u64 {
        self.num_preemptions
    }

    pub fn has_unfinished(&self) -> bool {
        !self.seqs.is_empty()
    }

    /// A live sequence with its record.
    pub fn get(&self, id: SeqId) -> Option<(&Sequence, &R)> {
        self.seqs.get(&id).map(|e| (&e.seq, &e.record))
    }

    /// A live sequence with its record, which the caller may change.
    pub fn get_mut(&mut self, id: SeqId) -> Option<(&Sequence, &mut R)> {
        self.seqs.get_mut(&id).map(|e| (&e.seq, &mut e.record))
    }

    /// Every live sequence's record, which the caller may change.
    pub fn records_mut(&mut self) -> impl Iterator<Item = (SeqId, &mut R)> {
        self.seqs.iter_mut().map(|(&id, e)| (id, &mut e.record))
    }

    /// Queues a new sequence with its record (its arrival must be later than every
    /// queued one).
    pub fn add(&mut self, seq: Sequence, record: R) {
        let id = seq.id;
        self.seqs.insert(id, Entry { seq, record });
        self.waiting.push_back(id);
    }

    /// Removes a sequence wherever it is and frees its blocks; returns it with its record.
    pub fn remove(&mut self, id: SeqId) -> Option<(Sequence, R)> {
        let Entry { mut seq, record } = self.seqs.remove(&id)?;
        match seq.status {
            SeqStatus::Waiting => self.waiting.retain(|&w| w != id),
            SeqStatus::Running => self.running.retain(|&r| r != id),
        }
        self.block_manager.free(&mut seq);
        Some((seq, record))
    }

    /// Picks this step's work.
    pub fn schedule(&mut self) -> anyhow::Result<Vec<ScheduledChunk>> {
        let mut budget = self.config.max_num_batched_tokens;
        let mut out = Vec::new();
        let preempted = self.schedule_decodes(&mut budget, &mut out)?;
        for &id in &self.running {
            let seq = &self.seqs[&id].seq;
            let remaining = seq.num_uncomputed_tokens();
            if remaining > 1 && budget > 0 {
                let len = remaining.min(budget);
                budget -= len;
                out.push(chunk(seq, len));
            }
        }
        // As vLLM: no admissions in a step that had to preempt.
        if !preempted {
            self.admit_waiting(&mut budget, &mut out)?;
        }
        Ok(out)
    }

    /// Schedules one token for every running sequence with exactly one uncomputed token,
    /// preempting from the tail when blocks run out. Returns whether it preempted.
    fn schedule_decodes(
        &mut self,
        budget: &mut usize,
        out: &mut Vec<ScheduledChunk>,
    ) -> anyhow::Result<bool> {
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() && *budget > 0 {
            let id = self.running[i];
            if self.seqs[&id].seq.num_uncomputed_tokens() != 1 {
                i += 1;
                continue;
            }
            while !self.block_manager.can_append(&self.seqs[&id].seq) {
                preempted = true;
                if self.running.len() - 1 > i {
                    let victim = self.running.pop().context("running queue is empty")?;
                    self.preempt(victim);
                } else {
                    self.running.remove(i);
                    self.preempt(id);
                    return Ok(true);
                }
            }
            let seq = &mut self
                .seqs
                .get_mut(&id)
                .context("running sequence missing")?
                .seq;
            self.block_manager.append_slots(seq)?;
            out.push(chunk(seq, 1));
            *budget -= 1;
            i += 1;
        }
        Ok(preempted)
    }

    fn preempt(&mut self, id: SeqId) {
        if let Some(Entry { seq, .. }) = self.seqs.get_mut(&id) {
            tracing::debug!(id, tokens = seq.num_tokens(), "preempting by recompute");
            self.block_manager.free(seq);
            seq.status = SeqStatus::Waiting;
            self.waiting.push_front(id);
            self.num_preemptions += 1;
        }
    }

    fn admit_waiting(
        &mut self,
        budget: &mut usize,
        out: &mut Vec<ScheduledChunk>,
    ) -> anyhow::Result<()> {
        while let Some(&id) = self.waiting.front() {
            if self.running.len() >= self.config.max_num_seqs || *budget == 0 {
                break;
            }
            let seq = &mut self
                .seqs
                .get_mut(&id)
                .context("waiting sequence missing")?
                .seq;
            if !self.block_manager.can_allocate(seq) {
                break;
            }
            self.waiting.pop_front();
            self.block_manager.allocate(seq)?;
            if !seq.admitted_once {
                seq.admitted_once = true;
                seq.num_cached_prompt_tokens = seq.num_computed_tokens.min(seq.num_prompt_tokens);
            }
            seq.status = SeqStatus::Running;
            let len = seq.num_uncomputed_tokens().min(*budget);
            *budget -= len;
            out.push(ScheduledChunk {
                is_prefill: true,
                ..chunk(seq, len)
            });
            let arrival = seq.arrival;
            let pos = self
                .running
                .partition_point(|r| self.seqs[r].seq.arrival < arrival);
            self.running.insert(pos, id);
        }
        Ok(())
    }

    /// Records that the chunks' K/V is now in the cache and registers newly full blocks.
    pub fn on_computed(&mut self, chunks: &[ScheduledChunk]) -> anyhow::Result<()> {
        for c in chunks {
            let seq = &mut self
                .seqs
                .get_mut(&c.id)
                .with_context(|| format!("scheduled sequence {} vanished", c.id))?
                .seq;
            ensure!(
                seq.num_computed_tokens == c.start,
                "sequence {} computed {} tokens, chunk started at {}",
                c.id,
                seq.num_computed_tokens,
                c.start
            );
            seq.num_computed_tokens += c.len;
            self.block_manager.commit_computed(seq);
        }
        Ok(())
    }

    /// Appends a sampled token to a running sequence.
    pub fn append_token(&mut self, id: SeqId, token: u32) -> anyhow::Result<()> {
        let entry = self
            .seqs
            .get_mut(&id)
            .with_context(|| format!("unknown sequence {id}"))?;
        entry.seq.token_ids.push(token);
        Ok(())
    }

    /// Checks the block manager against every live sequence, and each sequence's table
    /// against its state.
    pub fn check_invariants(&self) -> anyhow::Result<()> {
        let bm = &self.block_manager;
        for Entry { seq, .. } in self.seqs.values() {
            match seq.status {
                SeqStatus::Waiting => ensure!(
                    seq.block_table.is_empty() && seq.num_computed_tokens == 0,
                    "waiting sequence {} holds blocks",
                    seq.id
                ),
                SeqStatus::Running => ensure!(
                    seq.block_table.len() >= bm.blocks_for(seq.num_computed_tokens)
                        && seq.block_table.len() <= bm.blocks_for(seq.num_tokens()),
                    "running sequence {} has {} blocks for {} computed of {} tokens",
                    seq.id,
                    seq.block_table.len(),
                    seq.num_computed_tokens,
                    seq.num_tokens()
                ),
            }
        }
        ensure!(
            self.waiting.len() + self.running.len() == self.seqs.len(),
            "queues hold {} + {} sequences, {} are live",
            self.waiting.len(),
            self.running.len(),
            self.seqs.len()
        );
        let arrivals = |ids: &mut dyn Iterator<Item = &SeqId>| -> Vec<u64> {
            ids.map(|id| self.seqs[id].seq.arrival).collect()
        };
        ensure!(
            arrivals(&mut self.running.iter()).is_sorted(),
            "running queue is not in arrival order"
        );
        ensure!(
            arrivals(&mut self.waiting.iter()).is_sorted(),
            "waiting queue is not in arrival order"
        );
        let tables: Vec<&[u32]> = self
            .seqs
            .values()
            .map(|e| e.seq.block_table.as_slice())
            .collect();
        bm.check_invariants(&tables)
    }
}

fn chunk(seq: &Sequence, len: usize) -> ScheduledChunk {
    ScheduledChunk {
        id: seq.id,
        start: seq.num_computed_tokens,
        len,
        is_prefill: !seq.is_decode(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scheduler(num_blocks: usize, max_seqs: usize, budget: usize) -> Scheduler<()> {
        Scheduler::new(
            SchedulerConfig {
                max_num_seqs: max_seqs,
                max_num_batched_tokens: budget,
            },
            BlockManager::new(num_blocks, 4, true),
        )
    }

    /// Schedules one step, marks it computed, and appends `token` to every sequence
    /// whose tokens are all computed (as sampling would).
    fn step(s: &mut Scheduler<()>, token: u32) -> Vec<ScheduledChunk> {
        let chunks = s.schedule().unwrap();
        s.on_computed(&chunks).unwrap();
        for c in &chunks {
            let seq = s.get(c.id).unwrap().0;
            if seq.num_computed_tokens == seq.num_tokens() {
                s.append_token(c.id, token).unwrap();
            }
        }
        s.check_invariants().unwrap();
        chunks
    }

    fn lens(chunks: &[ScheduledChunk]) -> Vec<(SeqId, usize)> {
        chunks.iter().map(|c| (c.id, c.len)).collect()
    }

    #[test]
    fn chunked_prefill_runs_after_decodes_within_the_budget() {
        let mut s = scheduler(64, 8, 8);
        s.add(Sequence::new(0, 0, (0..3).collect()), ());
        assert_eq!(lens(&step(&mut s, 1)), vec![(0, 3)]);
        s.add(Sequence::new(1, 1, (100..120).collect()), ());
        // Decode of 0 first, then 7 prompt tokens of 1.
        assert_eq!(lens(&step(&mut s, 1)), vec![(0, 1), (1, 7)]);
        assert_eq!(lens(&step(&mut s, 1)), vec![(0, 1), (1, 7)]);
        let last = step(&mut s, 1);
        assert_eq!(lens(&last), vec![(0, 1), (1, 6)]);
        assert!(last[1].is_prefill && !last[0].is_prefill);
        assert_eq!(lens(&step(&mut s, 1)), vec![(0, 1), (1, 1)]);
        assert_eq!(s.get(1).unwrap().0.num_output_tokens(), 2);
    }

    #[test]
    fn max_num_seqs_caps_running() {
        let mut s = scheduler(64, 2, 100);
        for id in 0..3 {
            s.add(Sequence::new(id, id, vec![1, 2, 3]), ());
        }
        assert_eq!(lens(&step(&mut s, 9)), vec![(0, 3), (1, 3)]);
        assert_eq!((s.num_running(), s.num_waiting()), (2, 1));
        s.remove(0).unwrap();
        assert_eq!(lens(&step(&mut s, 9)), vec![(1, 1), (2, 3)]);
        s.check_invariants().unwrap();
    }

    #[test]
    fn preemption_frees_the_latest_arrival_which_reprefills_from_the_cache() {
        // 4 blocks of 4 tokens: two 7-token prompts take 2 blocks each.
        let mut s = scheduler(4, 8, 64);
        s.add(Sequence::new(0, 0, (0..7).collect()), ());
        s.add(Sequence::new(1, 1, (10..17).collect()), ());
        step(&mut s, 50);
        // Both now have 8 tokens; the next decode of 0 needs a third block.
        step(&mut s, 51);
        let chunks = step(&mut s, 52);
        assert_eq!(s.num_preemptions(), 1);
        assert_eq!(lens(&chunks), vec![(0, 1)]);
        assert_eq!((s.num_running(), s.num_waiting()), (1, 1));
        let victim = s.get(1).unwrap().0;
        assert_eq!(victim.num_output_tokens(), 2, "generated tokens are kept");
        assert!(victim.block_table.is_empty());
        // 0's third block evicted the tail of 1's cached blocks, the head survives.
        // Finish 0: 1 comes back with its first block from the cache and re-prefills
        // the other 5 tokens, although it has outputs (bug 4).
        s.remove(0).unwrap();
        let chunks = step(&mut s, 53);
        assert_eq!(chunks.len(), 1);
        assert_eq!((chunks[0].id, chunks[0].start, chunks[0].len), (1, 4, 5));
        assert!(chunks[0].is_prefill);
        let cache = s.block_manager().prefix_cache_stats();
        assert_eq!((cache.hits, cache.preempted_hits), (0, 4));
        let seq = s.get(1).unwrap().0;
        assert_eq!(seq.output_tokens(), &[50, 51, 53]);
        assert_eq!(
            seq.num_cached_prompt_tokens, 0,
            "first admission found nothing cached"
        );
    }

    #[test]
    fn the_last_running_sequence_preempts_itself() {
        let mut s = scheduler(3, 8, 64);
        s.add(Sequence::new(0, 0, vec![0, 1]), ());
        s.add(Sequence::new(1, 1, (10..18).collect()), ());
        assert_eq!(lens(&step(&mut s, 50)), vec![(0, 2), (1, 8)]);
        // 1 needs a third block for position 8 and is the tail: it preempts itself.
        assert_eq!(lens(&step(&mut s, 51)), vec![(0, 1)]);
        assert_eq!(s.num_preemptions(), 1);
        assert_eq!(s.get(1).unwrap().0.output_tokens(), &[50]);
        // 1 cannot come back while 0 holds a block; 0 then evicts 1's tail block.
        assert_eq!(lens(&step(&mut s, 52)), vec![(0, 1)]);
        assert_eq!(lens(&step(&mut s, 53)), vec![(0, 1)]);
        s.remove(0).unwrap();
        let chunks = step(&mut s, 54);
        assert_eq!(chunks.len(), 1);
        assert_eq!((chunks[0].id, chunks[0].start, chunks[0].len), (1, 4, 5));
        assert!(chunks[0].is_prefill);
        assert_eq!(s.get(1).unwrap().0.output_tokens(), &[50, 54]);
        s.remove(1).unwrap();
        s.check_invariants().unwrap();
        assert_eq!(s.block_manager().num_used_blocks(), 0);
    }
}
