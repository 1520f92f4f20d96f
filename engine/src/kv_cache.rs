//! Block manager for the paged KV cache: fixed-size blocks, per-sequence block tables,
//! reference counts, and prefix caching.
//!
//! Prefix caching: a FULL block whose K/V has been computed is registered under a chained
//! hash `hash(parent_hash, token_ids)`. A new sequence reuses registered blocks for its
//! leading full blocks (a hit is confirmed by comparing the stored parent hash and token
//! ids, so a hash collision can never alias two prefixes). A block is registered only once
//! its K/V is written, so no sequence can read a block that another one is still filling.
//! Freed blocks keep their hash and stay reusable until evicted, least recently used first.
//! The last token of a sequence is never served from the cache, so every admission
//! computes at least one token and the model yields logits.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

use anyhow::{bail, ensure};

use crate::sequence::Sequence;

/// Hash of the empty prefix, the parent of a sequence's first block.
const ROOT_HASH: u64 = 0;

/// Chained hash of one full block: depends on every token before it through `parent`.
pub fn chain_hash(parent: u64, tokens: &[u32]) -> u64 {
    // SipHash with fixed zero keys: deterministic within a build.
    let mut hasher = DefaultHasher::new();
    parent.hash(&mut hasher);
    tokens.hash(&mut hasher);
    hasher.finish()
}

#[derive(Debug, Clone, Default)]
struct Block {
    ref_count: u32,
    /// Set while the block is registered in the prefix cache.
    cached: Option<CachedContent>,
    /// LRU key while the block is free and cached (in `evictable`).
    lru_tick: Option<u64>,
}

#[derive(Debug, Clone)]
struct CachedContent {
    hash: u64,
    parent: u64,
    token_ids: Vec<u32>,
}

/// Counters in tokens, as vLLM reports them. Re-admissions after preemption are counted
/// apart (as vLLM v1 does): they find their own just-freed blocks, which is recompute saved,
/// not a prefix shared with other requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    pub queries: u64,
    pub hits: u64,
    pub preempted_queries: u64,
    pub preempted_hits: u64,
}

pub struct BlockManager {
    block_size: usize,
    enable_prefix_caching: bool,
    blocks: Vec<Block>,
    /// Free blocks holding nothing reusable; handed out first.
    free_plain: Vec<u32>,
    /// Free blocks still registered in the prefix cache, by LRU tick (oldest first).
    evictable: BTreeMap<u64, u32>,
    hash_to_block: HashMap<u64, u32>,
    next_tick: u64,
    stats: PrefixCacheStats,
}

impl BlockManager {
    pub fn new(num_blocks: usize, block_size: usize, enable_prefix_caching: bool) -> BlockManager {
        assert!(block_size > 0, "block size must be positive");
        let num_blocks_u32 = u32::try_from(num_blocks).expect("block count fits in u32");
        BlockManager {
            block_size,
            enable_prefix_caching,
            blocks: vec![Block::default(); num_blocks],
            // Reversed so that `pop` hands out block 0 first.
            free_plain: (0..num_blocks_u32).rev().collect(),
            evictable: BTreeMap::new(),
            hash_to_block: HashMap::new(),
            next_tick: 0,
            stats: PrefixCacheStats::default(),
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks that can be handed out now (never used, or cached but unreferenced).
    pub fn num_free_blocks(&self) -> usize {
        self.free_plain.len() + self.evictable.len()
    }

    /// Blocks referenced by at least one sequence.
    pub fn num_used_blocks(&self) -> usize {
        self.blocks.len() - self.num_free_blocks()
    }

    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        self.stats
    }

    /// Blocks needed to hold `num_tokens` tokens.
    pub fn blocks_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.block_size)
    }

    /// Leading blocks of `tokens` found in the prefix cache, with their hashes. Only full
    /// blocks that end before the last token are eligible.
    fn lookup(&self, tokens: &[u32]) -> Vec<(u32, u64)> {
        let mut hits = Vec::new();
        if !self.enable_prefix_caching || tokens.is_empty() {
            return hits;
        }
        let eligible = (tokens.len() - 1) / self.block_size;
        let mut parent = ROOT_HASH;
        for chunk in tokens.chunks_exact(self.block_size).take(eligible) {
            let hash = chain_hash(parent, chunk);
            let Some(&block_id) = self.hash_to_block.get(&hash) else {
                break;
            };
            let confirmed = self.blocks[block_id as usize]
                .cached
                .as_ref()
                .is_some_and(|c| c.parent == parent && c.token_ids == chunk);
            if !confirmed {
                break;
            }
            hits.push((block_id, hash));
            parent = hash;
        }
        hits
    }

    /// Free blocks an admission of `seq` would consume (hits on unreferenced cached blocks
    /// take those out of the free pool too).
    fn blocks_needed(&self, seq: &Sequence) -> (usize, Vec<(u32, u64)>) {
        let hits = self.lookup(&seq.token_ids);
        let revived = hits
            .iter()
            .filter(|(id, _)| self.blocks[*id as usize].ref_count == 0)
            .count();
        let needed = self.blocks_for(seq.num_tokens()) - hits.len() + revived;
        (needed, hits)
    }

    pub fn can_allocate(&self, seq: &Sequence) -> bool {
        self.blocks_needed(seq).0 <= self.num_free_blocks()
    }

    /// Gives a waiting sequence blocks for all its tokens, reusing cached prefix blocks.
    /// Sets `num_computed_tokens` to the number of tokens served by the cache.
    pub fn allocate(&mut self, seq: &mut Sequence) -> anyhow::Result<()> {
        ensure!(
            seq.block_table.is_empty(),
            "sequence {} already holds blocks",
            seq.id
        );
        let (needed, hits) = self.blocks_needed(seq);
        ensure!(
            needed <= self.num_free_blocks(),
            "sequence {} needs {needed} free KV blocks, {} are free",
            seq.id,
            self.num_free_blocks()
        );
        for &(block_id, hash) in &hits {
            self.acquire_cached(block_id);
            seq.block_table.push(block_id);
            seq.block_hashes.push(hash);
        }
        for _ in hits.len()..self.blocks_for(seq.num_tokens()) {
            let block_id = self.take_free_block()?;
            seq.block_table.push(block_id);
        }
        let cached_tokens = hits.len() * self.block_size;
        seq.num_computed_tokens = cached_tokens;
        if self.enable_prefix_caching {
            let (queries, hits) = if seq.admitted_once {
                (
                    &mut self.stats.preempted_queries,
                    &mut self.stats.preempted_hits,
                )
            } else {
                (&mut self.stats.queries, &mut self.stats.hits)
            };
            *queries += seq.num_tokens() as u64;
            *hits += cached_tokens as u64;
        }
        Ok(())
    }

    /// Whether a running sequence can get a block for its newest token.
    pub fn can_append(&self, seq: &Sequence) -> bool {
        let missing = self
            .blocks_for(seq.num_tokens())
            .saturating_sub(seq.block_table.len());
        missing <= self.num_free_blocks()
    }

    /// Extends a running sequence's block table to cover all its tokens.
    pub fn append_slots(&mut self, seq: &mut Sequence) -> anyhow::Result<()> {
        while seq.block_table.len() < self.blocks_for(seq.num_tokens()) {
            let block_id = self.take_free_block()?;
            seq.block_table.push(block_id);
        }
        Ok(())
    }

    /// Registers the full blocks of `seq` whose K/V became computed. When an identical
    /// block is already registered the sequence keeps its own copy unregistered.
    pub fn commit_computed(&mut self, seq: &mut Sequence) {
        let bs = self.block_size;
        while (seq.block_hashes.len() + 1) * bs <= seq.num_computed_tokens {
            let index = seq.block_hashes.len();
            let parent = seq.block_hashes.last().copied().unwrap_or(ROOT_HASH);
            let tokens = &seq.token_ids[index * bs..(index + 1) * bs];
            let hash = chain_hash(parent, tokens);
            seq.block_hashes.push(hash);
            if !self.enable_prefix_caching || self.hash_to_block.contains_key(&hash) {
                continue;
            }
            let block_id = seq.block_table[index];
            let block = &mut self.blocks[block_id as usize];
            if block.cached.is_none() {
                block.cached = Some(CachedContent {
                    hash,
                    parent,
                    token_ids: tokens.to_vec(),
                });
                self.hash_to_block.insert(hash, block_id);
            }
        }
    }

    /// Releases all blocks of `seq` and resets its cache state. Blocks are released
    /// from the tail so that the tail of a prompt is evicted before its shared head.
    pub fn free(&mut self, seq: &mut Sequence) {
        for &block_id in seq.block_table.iter().rev() {
            let tick = self.next_tick;
            let block = &mut self.blocks[block_id as usize];
            debug_assert!(block.ref_count > 0, "double free of block {block_id}");
            block.ref_count = block.ref_count.saturating_sub(1);
            if block.ref_count == 0 {
                if block.cached.is_some() {
                    block.lru_tick = Some(tick);
                    self.evictable.insert(tick, block_id);
                    self.next_tick += 1;
                } else {
                    self.free_plain.push(block_id);
                }
            }
        }
        seq.block_table.clear();
        seq.block_hashes.clear();
        seq.num_computed_tokens = 0;
    }

    fn acquire_cached(&mut self, block_id: u32) {
        let block = &mut self.blocks[block_id as usize];
        if block.ref_count == 0 {
            if let Some(tick) = block.lru_tick.take() {
                self.evictable.remove(&tick);
            }
        }
        block.ref_count += 1;
    }

    /// Takes a free block, evicting the least recently used cached one if needed.
    fn take_free_block(&mut self) -> anyhow::Result<u32> {
        let block_id = if let Some(id) = self.free_plain.pop() {
            id
        } else if let Some((_, id)) = self.evictable.pop_first() {
            let block = &mut self.blocks[id as usize];
            block.lru_tick = None;
            if let Some(content) = block.cached.take() {
                if self.hash_to_block.get(&content.hash) == Some(&id) {
                    self.hash_to_block.remove(&content.hash);
                }
            }
            id
        } else {
            bail!("out of KV cache blocks");
        };
        self.blocks[block_id as usize].ref_count = 1;
        Ok(block_id)
    }

    /// Checks the bookkeeping against the block tables of all live sequences: reference
    /// counts match the tables, every block is either free or referenced (never both),
    /// and the hash index points at blocks holding that hash.
    pub fn check_invariants(&self, block_tables: &[&[u32]]) -> anyhow::Result<()> {
        let mut expected = vec![0u32; self.blocks.len()];
        for table in block_tables {
            for &id in *table {
                ensure!(
                    (id as usize) < self.blocks.len(),
                    "block id {id} out of range"
                );
                expected[id as usize] += 1;
            }
        }
        let mut in_free = vec![false; self.blocks.len()];
        for &id in self.free_plain.iter().chain(self.evictable.values()) {
            ensure!(!in_free[id as usize], "block {id} is free twice");
            in_free[id as usize] = true;
        }
        for (id, block) in self.blocks.iter().enumerate() {
            ensure!(
                block.ref_count == expected[id],
                "block {id} has ref count {} but {} block tables hold it",
                block.ref_count,
                expected[id]
            );
            ensure!(
                (block.ref_count == 0) == in_free[id],
                "block {id} (ref count {}) is {} the free pool",
                block.ref_count,
                if in_free[id] { "in" } else { "not in" }
            );
            ensure!(
                block.lru_tick.is_some() == (in_free[id] && block.cached.is_some()),
                "block {id} has an inconsistent LRU entry"
            );
        }
        for (&tick, &id) in &self.evictable {
            ensure!(
                self.blocks[id as usize].lru_tick == Some(tick),
                "evictable block {id} has a stale LRU tick"
            );
        }
        let num_cached = self.blocks.iter().filter(|b| b.cached.is_some()).count();
        ensure!(
            num_cached == self.hash_to_block.len(),
            "{num_cached} blocks hold a hash but the index has {}",
            self.hash_to_block.len()
        );
        for (&hash, &id) in &self.hash_to_block {
            let holds = self.blocks[id as usize]
                .cached
                .as_ref()
                .is_some_and(|c| c.hash == hash);
            ensure!(
                holds,
                "hash index points at block {id} which does not hold it"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(id: u64, tokens: Vec<u32>) -> Sequence {
        Sequence::new(id, id, tokens)
    }

    /// Admits `s` and marks all but its last token computed, as a prefill would.
    fn admit_and_compute(bm: &mut BlockManager, s: &mut Sequence) {
        bm.allocate(s).unwrap();
        s.num_computed_tokens = s.num_tokens();
        bm.commit_computed(s);
    }

    fn check(bm: &BlockManager, seqs: &[&Sequence]) {
        let tables: Vec<&[u32]> = seqs.iter().map(|s| s.block_table.as_slice()).collect();
        bm.check_invariants(&tables).unwrap();
    }

    #[test]
    fn allocation_respects_capacity() {
        let mut bm = BlockManager::new(4, 4, true);
        let mut a = seq(0, (0..9).collect());
        assert!(bm.can_allocate(&a));
        bm.allocate(&mut a).unwrap();
        assert_eq!(a.block_table.len(), 3);
        assert_eq!(bm.num_used_blocks(), 3);
        let mut b = seq(1, (100..109).collect());
        assert!(!bm.can_allocate(&b));
        assert!(bm.allocate(&mut b).is_err());
        assert!(b.block_table.is_empty());
        check(&bm, &[&a, &b]);
        bm.free(&mut a);
        assert_eq!(bm.num_free_blocks(), 4);
        check(&bm, &[&a]);
    }

    #[test]
    fn shared_prefix_is_reused_with_reference_counts() {
        let mut bm = BlockManager::new(16, 4, true);
        let mut a = seq(0, (0..13).collect());
        admit_and_compute(&mut bm, &mut a);
        let mut b_tokens: Vec<u32> = (0..12).collect();
        b_tokens.extend([99, 98]);
        let mut b = seq(1, b_tokens);
        bm.allocate(&mut b).unwrap();
        assert_eq!(b.num_computed_tokens, 12);
        assert_eq!(&b.block_table[..3], &a.block_table[..3]);
        assert_ne!(b.block_table[3], a.block_table[3]);
        assert_eq!(
            bm.prefix_cache_stats(),
            PrefixCacheStats {
                queries: 27,
                hits: 12,
                ..PrefixCacheStats::default()
            }
        );
        check(&bm, &[&a, &b]);
        bm.free(&mut a);
        check(&bm, &[&b]);
        bm.free(&mut b);
        check(&bm, &[]);
        assert_eq!(bm.num_used_blocks(), 0);
    }

    #[test]
    fn full_prompt_hit_still_leaves_the_last_token_to_compute() {
        let mut bm = BlockManager::new(16, 4, true);
        let mut a = seq(0, (0..12).collect());
        admit_and_compute(&mut bm, &mut a);
        let mut b = seq(1, (0..12).collect());
        bm.allocate(&mut b).unwrap();
        // Blocks 0 and 1 hit; block 2 holds the last token and is computed again.
        assert_eq!(b.num_computed_tokens, 8);
        assert_eq!(b.num_uncomputed_tokens(), 4);
        b.num_computed_tokens = 12;
        bm.commit_computed(&mut b);
        check(&bm, &[&a, &b]);
        // A one-token prompt never hits.
        let mut c = seq(2, vec![5]);
        bm.allocate(&mut c).unwrap();
        assert_eq!(c.num_computed_tokens, 0);
    }

    #[test]
    fn blocks_are_shared_only_once_computed() {
        let mut bm = BlockManager::new(16, 4, true);
        let mut a = seq(0, (0..9).collect());
        bm.allocate(&mut a).unwrap();
        let mut b = seq(1, (0..9).collect());
        bm.allocate(&mut b).unwrap();
        assert_eq!(b.num_computed_tokens, 0);
        a.num_computed_tokens = 4;
        bm.commit_computed(&mut a);
        let mut c = seq(2, (0..9).collect());
        bm.allocate(&mut c).unwrap();
        assert_eq!(c.num_computed_tokens, 4);
        check(&bm, &[&a, &b, &c]);
    }

    #[test]
    fn freed_cached_blocks_stay_reusable_until_evicted_lru() {
        let mut bm = BlockManager::new(4, 4, true);
        let mut a = seq(0, (0..9).collect());
        admit_and_compute(&mut bm, &mut a);
        bm.free(&mut a);
        assert_eq!(bm.num_free_blocks(), 4);
        // The cached prefix survives the free.
        let mut again = seq(1, (0..9).collect());
        bm.allocate(&mut again).unwrap();
        assert_eq!(again.num_computed_tokens, 8);
        check(&bm, &[&again]);
        bm.free(&mut again);
        // A different sequence needing 3 blocks takes the two never-cached blocks first,
        // then evicts the tail block of the old prefix before its head.
        let mut other = seq(2, (50..62).collect());
        bm.allocate(&mut other).unwrap();
        check(&bm, &[&other]);
        let mut probe = seq(3, (0..9).collect());
        assert!(!bm.can_allocate(&probe));
        bm.free(&mut other);
        assert!(bm.can_allocate(&probe));
        bm.allocate(&mut probe).unwrap();
        assert_eq!(
            probe.num_computed_tokens, 4,
            "head block survived, tail evicted"
        );
        check(&bm, &[&probe]);
    }

    #[test]
    fn eviction_of_everything_keeps_the_index_consistent() {
        let mut bm = BlockManager::new(3, 2, true);
        for round in 0..5u32 {
            let mut s = seq(u64::from(round), (round * 10..round * 10 + 6).collect());
            admit_and_compute(&mut bm, &mut s);
            check(&bm, &[&s]);
            bm.free(&mut s);
            check(&bm, &[]);
        }
    }

    #[test]
    fn decode_appends_a_block_only_at_a_boundary() {
        let mut bm = BlockManager::new(3, 4, true);
        let mut a = seq(0, (0..4).collect());
        admit_and_compute(&mut bm, &mut a);
        a.token_ids.push(7);
        assert!(bm.can_append(&a));
        bm.append_slots(&mut a).unwrap();
        assert_eq!(a.block_table.len(), 2);
        a.token_ids.push(8);
        bm.append_slots(&mut a).unwrap();
        assert_eq!(a.block_table.len(), 2);
        check(&bm, &[&a]);
    }

    #[test]
    fn disabled_prefix_caching_never_hits() {
        let mut bm = BlockManager::new(8, 4, false);
        let mut a = seq(0, (0..9).collect());
        admit_and_compute(&mut bm, &mut a);
        let mut b = seq(1, (0..9).collect());
        bm.allocate(&mut b).unwrap();
        assert_eq!(b.num_computed_tokens, 0);
        bm.free(&mut a);
        bm.free(&mut b);
        check(&bm, &[]);
        assert_eq!(bm.prefix_cache_stats(), PrefixCacheStats::default());
    }
}
