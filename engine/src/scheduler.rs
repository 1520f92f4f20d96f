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
use crate::kv_sizing::longest_fitting;
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
        let mut preempted = self.schedule_decodes(&mut budget, &mut out)?;
        preempted |= self.schedule_prefill_chunks(&mut budget, &mut out)?;
        // As vLLM: no admissions in a step that had to preempt.
        if !preempted {
            self.admit_waiting(&mut budget, &mut out)?;
        }
        // Last, so that a checkpoint never takes a block the step's work needed.
        for c in &out {
            let seq = &mut self
                .seqs
                .get_mut(&c.id)
                .context("scheduled sequence missing")?
                .seq;
            self.block_manager
                .reserve_checkpoints(seq, c.start + c.len)?;
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
            let seq = &self.seqs[&id].seq;
            if seq.num_uncomputed_tokens() != 1 {
                i += 1;
                continue;
            }
            let end = seq.num_tokens();
            while self.blocks_short(id, end) {
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
            self.block_manager.extend(seq, end)?;
            out.push(chunk(seq, 1));
            *budget -= 1;
            i += 1;
        }
        Ok(preempted)
    }

    /// Whether the pool lacks the free blocks sequence `id` needs to cover `0..end`.
    fn blocks_short(&self, id: SeqId, end: usize) -> bool {
        self.block_manager
            .blocks_to_extend(&self.seqs[&id].seq, end)
            > self.block_manager.num_free_blocks()
    }

    /// Continues the running prefills in arrival order with what is left of the budget. A
    /// full group holds a prompt's blocks from admission on; a sliding group takes blocks
    /// chunk by chunk, so a chunk shrinks to the blocks that are free, and a prefill that
    /// gets none preempts from the tail of the running queue, down to the first sequence
    /// this step has scheduled. Returns whether it preempted.
    fn schedule_prefill_chunks(
        &mut self,
        budget: &mut usize,
        out: &mut Vec<ScheduledChunk>,
    ) -> anyhow::Result<bool> {
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() && *budget > 0 {
            let id = self.running[i];
            let seq = &self.seqs[&id].seq;
            let remaining = seq.num_uncomputed_tokens();
            if remaining <= 1 {
                i += 1;
                continue;
            }
            let start = seq.num_computed_tokens;
            let mut len = self.fitting_chunk(id, remaining.min(*budget));
            while len == 0 {
                let Some(&victim) = self.running.last() else {
                    break;
                };
                if victim == id || out.iter().any(|c| c.id == victim) {
                    break;
                }
                self.running.pop();
                self.preempt(victim);
                preempted = true;
                len = self.fitting_chunk(id, remaining.min(*budget));
            }
            if len > 0 {
                let seq = &mut self
                    .seqs
                    .get_mut(&id)
                    .context("running sequence missing")?
                    .seq;
                self.block_manager.extend(seq, start + len)?;
                *budget -= len;
                out.push(chunk(seq, len));
            }
            i += 1;
        }
        Ok(preempted)
    }

    /// The most tokens, up to `want`, that sequence `id` can compute next with the free
    /// blocks.
    fn fitting_chunk(&self, id: SeqId, want: usize) -> usize {
        let start = self.seqs[&id].seq.num_computed_tokens;
        longest_fitting(want, |len| !self.blocks_short(id, start + len))
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
            let plan = self.block_manager.plan_admission(seq, *budget);
            if plan.needed > self.block_manager.num_free_blocks() {
                break;
            }
            self.waiting.pop_front();
            let len = plan.chunk;
            self.block_manager.admit(seq, plan)?;
            if !seq.admitted_once {
                seq.admitted_once = true;
                seq.num_cached_prompt_tokens = seq.num_computed_tokens.min(seq.num_prompt_tokens);
            }
            seq.status = SeqStatus::Running;
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

    /// Checks the block manager against every live sequence, and each sequence's tables
    /// against its state.
    pub fn check_invariants(&self) -> anyhow::Result<()> {
        for Entry { seq, .. } in self.seqs.values() {
            ensure!(
                (seq.status == SeqStatus::Running) != seq.block_tables.is_empty(),
                "{:?} sequence {} holds {} block tables",
                seq.status,
                seq.id,
                seq.block_tables.len()
            );
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
        let seqs: Vec<&Sequence> = self.seqs.values().map(|e| &e.seq).collect();
        self.block_manager.check_invariants(&seqs)
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
    use crate::layer_groups::GroupKind;

    fn scheduler(num_blocks: usize, max_seqs: usize, budget: usize) -> Scheduler<()> {
        Scheduler::new(
            SchedulerConfig {
                max_num_seqs: max_seqs,
                max_num_batched_tokens: budget,
            },
            BlockManager::new(num_blocks, 4, vec![GroupKind::Full], true),
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
        assert!(victim.block_tables.is_empty());
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

    /// Random arrivals (some sharing prefixes), aborts, chunked prefills, decodes and the
    /// preemptions a small pool forces, over a sliding group beside a full one and over a
    /// recurrent group beside a full one (checkpoints taken and restored): every step keeps
    /// the invariants (each sliding table holds no block its window passed), the shared
    /// prefixes hit, and once every sequence is gone every block is back in the pool.
    #[test]
    fn no_block_leaks_under_a_random_mix_of_groups_requests_and_aborts() {
        for groups in [
            vec![GroupKind::Sliding { window: 6 }, GroupKind::Full],
            vec![GroupKind::Recurrent { blocks: 2 }, GroupKind::Full],
        ] {
            let mut s: Scheduler<()> = Scheduler::new(
                SchedulerConfig {
                    max_num_seqs: 4,
                    max_num_batched_tokens: 10,
                },
                BlockManager::new(16, 4, groups.clone(), true),
            );
            let mut state = 0x9e37_79b9_7f4a_7c15u64;
            let mut next = |n: u64| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state % n
            };
            let mut live: Vec<SeqId> = Vec::new();
            let mut hits = 0;
            for id in 0..400u64 {
                if next(2) == 0 {
                    let len = 3 + next(20) as u32;
                    // Half the prompts share a 12-token prefix.
                    let base = if next(2) == 0 { 0 } else { 1000 * id as u32 };
                    s.add(Sequence::new(id, id, (base..base + len).collect()), ());
                    live.push(id);
                }
                if !live.is_empty() && next(10) == 0 {
                    let victim = live.swap_remove(next(live.len() as u64) as usize);
                    s.remove(victim).unwrap();
                }
                step(&mut s, 7);
                let done: Vec<SeqId> = live
                    .iter()
                    .copied()
                    .filter(|&l| s.get(l).unwrap().0.num_output_tokens() >= 12)
                    .collect();
                for l in done {
                    live.retain(|&x| x != l);
                    s.remove(l).unwrap();
                }
                hits = s.block_manager().prefix_cache_stats().hits;
            }
            for l in live {
                s.remove(l).unwrap();
            }
            s.check_invariants().unwrap();
            assert_eq!(s.block_manager().num_used_blocks(), 0, "{groups:?}");
            // A recurrent group hits from the checkpoints the steps took at prompt ends.
            assert!(hits > 0, "{groups:?}: no prefix hits");
            assert!(
                s.num_preemptions() > 0,
                "{groups:?}: the pool never ran short"
            );
        }
    }
}
