//! Block manager for the paged KV cache: one pool of fixed-size blocks that the model's
//! layer groups ([`crate::layer_groups`]) draw on, one block table per group per sequence,
//! reference counts, and prefix caching.
//!
//! A full group keeps a block for every position of a sequence, reserved for its whole
//! prompt at admission. A sliding group keeps the blocks of its window: at admission the
//! window before the first uncomputed position and the first chunk, then what each chunk
//! adds; once the window has passed a block, it goes back to the pool (its table entry
//! becomes [`NO_BLOCK`]), so a decoding sequence holds `⌈W / block⌉ + 1` blocks there. A
//! recurrent group holds a fixed number of blocks per sequence for its state.
//!
//! Prefix caching: a FULL block whose K/V has been computed is registered, per group,
//! under a chained hash `hash(parent_hash, token_ids)`. A hit is confirmed by comparing the
//! stored parent hash and token ids, so a hash collision can never alias two prefixes, and
//! a block is registered only once its K/V is written, so no sequence can read a block
//! that another one is still filling. A prefix of `L` blocks hits when every full group
//! holds its `L` blocks and every sliding group the blocks its window needs at position
//! `L · block` (as vLLM's hybrid KV cache manager intersects its groups' hits); the longest
//! such prefix is taken. A recurrent group serves a prefix from a cached copy of its state
//! at the prefix's end, a checkpoint: a step that passes a checkpoint position reserves
//! blocks for a copy of the state there ([`BlockManager::reserve_checkpoints`]), the model
//! writes it as it passes, and once the step is computed the copy is registered, part by
//! part, under the prefix's last block, unheld and evictable as freed KV blocks are; a hit
//! hands the copy to the new sequence (`Sequence::state_restores`) to copy into its own
//! state in its first step. Checkpoints are taken at the last block boundary of each
//! prompt (where the next turn of a conversation, or the same prompt again, finds it) and
//! every [`BlockManager::with_state_checkpoints`] blocks. Freed blocks keep their hash and
//! stay reusable until evicted, least recently used first. The last token of a sequence is
//! never served from the cache, so every admission computes at least one token and the
//! model yields logits.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

use anyhow::{bail, ensure};

use crate::kv_sizing::longest_fitting;
use crate::layer_groups::{GroupKind, StateCopy, NO_BLOCK};
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
    group: usize,
    /// Which block of a recurrent state's copy (0 for a KV block).
    part: usize,
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
    /// Checkpoints of recurrent state cached once computed (one per position, whatever the
    /// groups).
    pub checkpoints_saved: u64,
}

/// What admitting a waiting sequence takes, from [`BlockManager::plan_admission`].
#[derive(Debug, Clone)]
pub struct Admission {
    /// Chained hashes of the leading blocks the prefix cache serves.
    hashes: Vec<u64>,
    /// Per group: the index of its first kept block and the cached blocks from there to
    /// the hit's end.
    hits: Vec<(usize, Vec<u32>)>,
    /// Tokens of the first chunk, after the hit.
    pub chunk: usize,
    /// Free blocks it takes (new ones, and cached ones no sequence holds).
    pub needed: usize,
}

pub struct BlockManager {
    block_size: usize,
    enable_prefix_caching: bool,
    /// Recurrent state is checkpointed every this many blocks (0: at prompt ends only).
    checkpoint_every: usize,
    groups: Vec<GroupKind>,
    blocks: Vec<Block>,
    /// Free blocks holding nothing reusable; handed out first.
    free_plain: Vec<u32>,
    /// Free blocks still registered in the prefix cache, by LRU tick (oldest first).
    evictable: BTreeMap<u64, u32>,
    /// (group, hash, part) → the block holding it.
    hash_to_block: HashMap<(usize, u64, usize), u32>,
    next_tick: u64,
    stats: PrefixCacheStats,
    /// Blocks registered as parts of checkpoints of recurrent state.
    checkpoint_blocks: usize,
}

impl BlockManager {
    /// A pool of `num_blocks` blocks of `block_size` tokens for layer groups of `groups`.
    pub fn new(
        num_blocks: usize,
        block_size: usize,
        groups: Vec<GroupKind>,
        enable_prefix_caching: bool,
    ) -> BlockManager {
        assert!(block_size > 0, "block size must be positive");
        assert!(
            !groups.is_empty(),
            "a KV cache has at least one layer group"
        );
        let num_blocks_u32 = u32::try_from(num_blocks)
            .ok()
            .filter(|&n| n < NO_BLOCK)
            .expect("block ids fit below NO_BLOCK");
        BlockManager {
            block_size,
            enable_prefix_caching,
            checkpoint_every: 0,
            groups,
            blocks: vec![Block::default(); num_blocks],
            // Reversed so that `pop` hands out block 0 first.
            free_plain: (0..num_blocks_u32).rev().collect(),
            evictable: BTreeMap::new(),
            hash_to_block: HashMap::new(),
            next_tick: 0,
            stats: PrefixCacheStats::default(),
            checkpoint_blocks: 0,
        }
    }

    /// Checkpoints recurrent state every `every` blocks as well as at each prompt's last
    /// block boundary (0: at prompt ends only).
    pub fn with_state_checkpoints(mut self, every: usize) -> BlockManager {
        self.checkpoint_every = every;
        self
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks the prefix cache holds for checkpoints of recurrent state.
    pub fn num_checkpoint_blocks(&self) -> usize {
        self.checkpoint_blocks
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

    /// The block group `group` holds under `hash` (part `part` of a state's copy), if its
    /// parent and tokens confirm it.
    fn cached_block(
        &self,
        (group, hash, part): (usize, u64, usize),
        parent: u64,
        tokens: &[u32],
    ) -> Option<u32> {
        let &id = self.hash_to_block.get(&(group, hash, part))?;
        let confirmed = self.blocks[id as usize]
            .cached
            .as_ref()
            .is_some_and(|c| c.parent == parent && c.token_ids == tokens);
        confirmed.then_some(id)
    }

    /// The longest prefix of whole blocks of `tokens` (ending before its last token) that
    /// every group can serve from the cache: its blocks' hashes, and per group its first
    /// kept block and the cached blocks from there.
    fn lookup(&self, tokens: &[u32]) -> (Vec<u64>, Vec<(usize, Vec<u32>)>) {
        let none = || self.groups.iter().map(|_| (0, Vec::new())).collect();
        if !self.enable_prefix_caching || tokens.is_empty() {
            return (Vec::new(), none());
        }
        let bs = self.block_size;
        let eligible = (tokens.len() - 1) / bs;
        let mut hashes = Vec::with_capacity(eligible);
        let mut parent = ROOT_HASH;
        for chunk in tokens.chunks_exact(bs).take(eligible) {
            parent = chain_hash(parent, chunk);
            hashes.push(parent);
        }
        let cached_part = |g: usize, i: usize, part: usize| {
            let parent = if i == 0 { ROOT_HASH } else { hashes[i - 1] };
            self.cached_block((g, hashes[i], part), parent, &tokens[i * bs..(i + 1) * bs])
        };
        let cached = |g: usize, i: usize| cached_part(g, i, 0);
        // A recurrent group's copy of its state after block `i`, every part cached.
        let state_copy = |g: usize, i: usize, parts: usize| -> Option<Vec<u32>> {
            (0..parts).map(|p| cached_part(g, i, p)).collect()
        };
        // Full groups: the leading run every one of them holds.
        let mut upper = eligible;
        for (g, kind) in self.groups.iter().enumerate() {
            if *kind == GroupKind::Full {
                upper = (0..upper)
                    .find(|&i| cached(g, i).is_none())
                    .unwrap_or(upper);
            }
        }
        // Sliding groups: for each, the run of cached blocks ending at each block.
        let runs: Vec<(GroupKind, Vec<usize>)> = self
            .groups
            .iter()
            .enumerate()
            .filter(|(_, k)| matches!(k, GroupKind::Sliding { .. }))
            .map(|(g, &kind)| {
                let mut run = Vec::with_capacity(upper);
                let mut n = 0;
                for i in 0..upper {
                    n = if cached(g, i).is_some() { n + 1 } else { 0 };
                    run.push(n);
                }
                (kind, run)
            })
            .collect();
        let serves = |len: usize| {
            let windows = runs.iter().all(|(kind, run)| {
                let need = len - kind.first_kept_block(len * bs, bs);
                need == 0 || run[len - 1] >= need
            });
            let states = self.groups.iter().enumerate().all(|(g, kind)| match kind {
                GroupKind::Recurrent { blocks } => {
                    len == 0 || state_copy(g, len - 1, *blocks).is_some()
                }
                _ => true,
            });
            windows && states
        };
        let len = (0..=upper).rev().find(|&l| serves(l)).unwrap_or(0);
        let hits = self
            .groups
            .iter()
            .enumerate()
            .map(|(g, &kind)| match kind {
                GroupKind::Recurrent { blocks } if len > 0 => {
                    (0, state_copy(g, len - 1, blocks).expect("checked above"))
                }
                GroupKind::Recurrent { .. } => (0, Vec::new()),
                _ => {
                    let first = kind.first_kept_block(len * bs, bs).min(len);
                    let ids = (first..len)
                        .map(|i| cached(g, i).expect("checked above"))
                        .collect();
                    (first, ids)
                }
            })
            .collect();
        hashes.truncate(len);
        (hashes, hits)
    }

    /// What admitting `seq` takes: its prefix hit, its first chunk (at most `max_chunk`
    /// tokens; fewer when the free blocks hold the sliding groups' blocks for no more),
    /// and the free blocks it consumes (a full group's blocks for every token, a sliding
    /// group's for its window and the chunk, a recurrent group's state). When not even a
    /// one-token chunk fits, `needed` exceeds the free blocks.
    pub fn plan_admission(&self, seq: &Sequence, max_chunk: usize) -> Admission {
        let (hashes, hits) = self.lookup(&seq.token_ids);
        let start = hashes.len() * self.block_size;
        let needed = |chunk: usize| -> usize {
            let mut needed = 0;
            for (kind, (first, ids)) in self.groups.iter().zip(&hits) {
                // A recurrent group's hit is a copy to restore from, beside its own state.
                let held = match kind {
                    GroupKind::Full => self.blocks_for(seq.num_tokens()),
                    GroupKind::Sliding { .. } => self.blocks_for(start + chunk) - first,
                    GroupKind::Recurrent { blocks } => blocks + ids.len(),
                };
                let revived = ids
                    .iter()
                    .filter(|&&id| self.blocks[id as usize].ref_count == 0)
                    .count();
                needed += held - ids.len() + revived;
            }
            needed
        };
        let free = self.num_free_blocks();
        let most = (seq.num_tokens() - start).min(max_chunk.max(1));
        let chunk = longest_fitting(most, |c| needed(c) <= free).max(1);
        let needed = needed(chunk);
        Admission {
            hashes,
            hits,
            chunk,
            needed,
        }
    }

    /// Admits a waiting sequence as `plan` says: the cached blocks of its hit, new blocks
    /// for the rest. Sets `num_computed_tokens` to the tokens the cache serves.
    pub fn admit(&mut self, seq: &mut Sequence, plan: Admission) -> anyhow::Result<()> {
        ensure!(
            seq.block_tables.is_empty(),
            "sequence {} already holds blocks",
            seq.id
        );
        ensure!(
            plan.needed <= self.num_free_blocks(),
            "sequence {} needs {} free KV blocks, {} are free",
            seq.id,
            plan.needed,
            self.num_free_blocks()
        );
        let start = plan.hashes.len() * self.block_size;
        // Every group's hits first: taking a new block may evict a cached block no
        // sequence holds, which must not be one another group is about to take.
        for (g, (first, ids)) in plan.hits.into_iter().enumerate() {
            for &id in &ids {
                self.acquire_cached(id);
            }
            if matches!(self.groups[g], GroupKind::Recurrent { .. }) {
                if !ids.is_empty() {
                    seq.state_restores.push(StateCopy {
                        group: g,
                        position: start,
                        blocks: ids,
                    });
                }
                seq.block_tables.push(Vec::new());
            } else {
                let mut table = vec![NO_BLOCK; first];
                table.extend(ids);
                seq.block_tables.push(table);
            }
        }
        for g in 0..self.groups.len() {
            let want = match self.groups[g] {
                GroupKind::Full => self.blocks_for(seq.num_tokens()),
                GroupKind::Sliding { .. } => self.blocks_for(start + plan.chunk),
                GroupKind::Recurrent { blocks } => blocks,
            };
            while seq.block_tables[g].len() < want {
                let id = self.take_free_block()?;
                seq.block_tables[g].push(id);
            }
        }
        seq.block_hashes = plan.hashes;
        seq.num_computed_tokens = start;
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
            *hits += start as u64;
        }
        Ok(())
    }

    /// Free blocks a running sequence needs so that every group covers positions `0..end`.
    pub fn blocks_to_extend(&self, seq: &Sequence, end: usize) -> usize {
        let want = self.blocks_for(end);
        self.groups
            .iter()
            .zip(&seq.block_tables)
            .filter(|(kind, _)| !matches!(kind, GroupKind::Recurrent { .. }))
            .map(|(_, table)| want.saturating_sub(table.len()))
            .sum()
    }

    /// Extends a running sequence's tables to cover positions `0..end`.
    pub fn extend(&mut self, seq: &mut Sequence, end: usize) -> anyhow::Result<()> {
        let want = self.blocks_for(end);
        for g in 0..self.groups.len() {
            if matches!(self.groups[g], GroupKind::Recurrent { .. }) {
                continue;
            }
            while seq.block_tables[g].len() < want {
                let id = self.take_free_block()?;
                seq.block_tables[g].push(id);
            }
        }
        Ok(())
    }

    /// Registers the full blocks of `seq` whose K/V became computed (a group that already
    /// holds an identical block keeps the sequence's copy unregistered), then returns to
    /// the pool the blocks every sliding group's window has passed.
    pub fn commit_computed(&mut self, seq: &mut Sequence) {
        let bs = self.block_size;
        while (seq.block_hashes.len() + 1) * bs <= seq.num_computed_tokens {
            let index = seq.block_hashes.len();
            let parent = seq.block_hashes.last().copied().unwrap_or(ROOT_HASH);
            let tokens = &seq.token_ids[index * bs..(index + 1) * bs];
            let hash = chain_hash(parent, tokens);
            seq.block_hashes.push(hash);
            if !self.enable_prefix_caching {
                continue;
            }
            for (g, table) in seq.block_tables.iter().enumerate() {
                if matches!(self.groups[g], GroupKind::Recurrent { .. })
                    || self.hash_to_block.contains_key(&(g, hash, 0))
                {
                    continue;
                }
                let Some(&block_id) = table.get(index).filter(|&&id| id != NO_BLOCK) else {
                    continue;
                };
                let block = &mut self.blocks[block_id as usize];
                if block.cached.is_none() {
                    block.cached = Some(CachedContent {
                        group: g,
                        part: 0,
                        hash,
                        parent,
                        token_ids: tokens.to_vec(),
                    });
                    self.hash_to_block.insert((g, hash, 0), block_id);
                }
            }
        }
        self.commit_state_copies(seq);
        for g in 0..seq.block_tables.len() {
            let first = self.groups[g].first_kept_block(seq.num_computed_tokens, bs);
            let passed = first.min(seq.block_tables[g].len());
            for i in (0..passed).rev() {
                let id = std::mem::replace(&mut seq.block_tables[g][i], NO_BLOCK);
                if id == NO_BLOCK {
                    break;
                }
                self.release(id);
            }
        }
    }

    /// Takes blocks for the checkpoints of `seq`'s recurrent state that its step computing
    /// tokens up to `end` passes: the last block boundary of its prompt, the last one within
    /// its history (`Sequence::history_tokens`), and every `checkpoint_every`-th block
    /// boundary, each unless the cache holds it already. Best
    /// effort, after the step's other blocks are taken: a checkpoint the free blocks cannot
    /// hold is not taken. The model writes them in the step; [`BlockManager::commit_computed`]
    /// caches them.
    pub fn reserve_checkpoints(&mut self, seq: &mut Sequence, end: usize) -> anyhow::Result<()> {
        let recurrent: Vec<(usize, usize)> = self
            .groups
            .iter()
            .enumerate()
            .filter_map(|(g, kind)| match kind {
                GroupKind::Recurrent { blocks } => Some((g, *blocks)),
                _ => None,
            })
            .collect();
        if !self.enable_prefix_caching || recurrent.is_empty() || seq.block_tables.is_empty() {
            return Ok(());
        }
        let bs = self.block_size;
        let per_checkpoint: usize = recurrent.iter().map(|&(_, blocks)| blocks).sum();
        let prompt_end = (seq.num_prompt_tokens.saturating_sub(1) / bs) * bs;
        let history_end = seq
            .history_tokens
            .map(|n| (n.min(seq.num_prompt_tokens) / bs) * bs);
        let every = self.checkpoint_every;
        let first = seq.num_computed_tokens / bs + 1;
        let last = end.min(seq.num_tokens()) / bs;
        let wanted = |index: usize| {
            let position = index * bs;
            position == prompt_end
                || Some(position) == history_end
                || (every > 0 && index.is_multiple_of(every))
        };
        if !(first..=last).any(wanted) {
            return Ok(());
        }
        let mut hashes = seq.block_hashes.clone();
        for index in (first..=last).filter(|&i| wanted(i)) {
            let position = index * bs;
            while hashes.len() < index {
                let i = hashes.len();
                let parent = hashes.last().copied().unwrap_or(ROOT_HASH);
                hashes.push(chain_hash(parent, &seq.token_ids[i * bs..(i + 1) * bs]));
            }
            let hash = hashes[index - 1];
            let cached = recurrent.iter().all(|&(g, blocks)| {
                (0..blocks).all(|p| self.hash_to_block.contains_key(&(g, hash, p)))
            });
            if cached {
                continue;
            }
            if per_checkpoint > self.num_free_blocks() {
                break;
            }
            for &(group, blocks) in &recurrent {
                let ids = (0..blocks)
                    .map(|_| self.take_free_block())
                    .collect::<anyhow::Result<Vec<u32>>>()?;
                seq.state_saves.push(StateCopy {
                    group,
                    position,
                    blocks: ids,
                });
            }
        }
        Ok(())
    }

    /// After a step: gives back the copies the sequence restored from, and caches the
    /// checkpoints it took, each part under the last block before its position, unheld (a
    /// part the cache already holds is dropped).
    fn commit_state_copies(&mut self, seq: &mut Sequence) {
        for copy in std::mem::take(&mut seq.state_restores) {
            copy.blocks.into_iter().for_each(|id| self.release(id));
        }
        let bs = self.block_size;
        let mut cached_positions = Vec::new();
        for copy in std::mem::take(&mut seq.state_saves) {
            let index = copy.position / bs;
            if self.enable_prefix_caching && index > 0 && index <= seq.block_hashes.len() {
                let hash = seq.block_hashes[index - 1];
                let parent = index
                    .checked_sub(2)
                    .map_or(ROOT_HASH, |i| seq.block_hashes[i]);
                let tokens = &seq.token_ids[(index - 1) * bs..index * bs];
                for (part, &id) in copy.blocks.iter().enumerate() {
                    let key = (copy.group, hash, part);
                    if self.hash_to_block.contains_key(&key) {
                        continue;
                    }
                    self.blocks[id as usize].cached = Some(CachedContent {
                        group: copy.group,
                        part,
                        hash,
                        parent,
                        token_ids: tokens.to_vec(),
                    });
                    self.hash_to_block.insert(key, id);
                    self.checkpoint_blocks += 1;
                    if !cached_positions.contains(&copy.position) {
                        cached_positions.push(copy.position);
                    }
                }
            }
            copy.blocks.into_iter().for_each(|id| self.release(id));
        }
        self.stats.checkpoints_saved += cached_positions.len() as u64;
    }

    /// Releases all blocks of `seq` and resets its cache state. Blocks are released
    /// from the tail so that the tail of a prompt is evicted before its shared head.
    pub fn free(&mut self, seq: &mut Sequence) {
        for table in std::mem::take(&mut seq.block_tables) {
            for &block_id in table.iter().rev().filter(|&&id| id != NO_BLOCK) {
                self.release(block_id);
            }
        }
        let copies = std::mem::take(&mut seq.state_restores)
            .into_iter()
            .chain(std::mem::take(&mut seq.state_saves));
        for copy in copies {
            copy.blocks.into_iter().for_each(|id| self.release(id));
        }
        seq.block_hashes.clear();
        seq.num_computed_tokens = 0;
    }

    /// Drops one reference to `block_id`; at none it goes back to the pool, to the LRU of
    /// reusable blocks when it is cached.
    fn release(&mut self, block_id: u32) {
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
                let key = (content.group, content.hash, content.part);
                if self.hash_to_block.get(&key) == Some(&id) {
                    self.hash_to_block.remove(&key);
                }
                if matches!(self.groups[content.group], GroupKind::Recurrent { .. }) {
                    self.checkpoint_blocks -= 1;
                }
            }
            id
        } else {
            bail!("out of KV cache blocks");
        };
        self.blocks[block_id as usize].ref_count = 1;
        Ok(block_id)
    }

    /// Checks one sequence's tables against its tokens: none and nothing computed, or one
    /// per group, a full group's covering its computed tokens with no gap, a sliding
    /// group's holding no block its window has passed and every block after, a recurrent
    /// group's its state.
    pub fn check_sequence(&self, seq: &Sequence) -> anyhow::Result<()> {
        let id = seq.id;
        if seq.block_tables.is_empty() {
            ensure!(
                seq.num_computed_tokens == 0
                    && seq.state_restores.is_empty()
                    && seq.state_saves.is_empty(),
                "sequence {id} holds no blocks but has {} tokens computed or a state copy",
                seq.num_computed_tokens
            );
            return Ok(());
        }
        ensure!(
            seq.block_tables.len() == self.groups.len(),
            "sequence {id} has {} block tables for {} groups",
            seq.block_tables.len(),
            self.groups.len()
        );
        let (computed, total) = (seq.num_computed_tokens, seq.num_tokens());
        for (g, (kind, table)) in self.groups.iter().zip(&seq.block_tables).enumerate() {
            if let GroupKind::Recurrent { blocks } = *kind {
                ensure!(
                    table.len() == blocks && !table.contains(&NO_BLOCK),
                    "sequence {id} holds {} state blocks in group {g}, not {blocks}",
                    table.len()
                );
                continue;
            }
            ensure!(
                table.len() >= self.blocks_for(computed) && table.len() <= self.blocks_for(total),
                "sequence {id} has {} blocks in group {g} for {computed} computed of \
                 {total} tokens",
                table.len()
            );
            let first = kind
                .first_kept_block(computed, self.block_size)
                .min(table.len());
            ensure!(
                table[..first].iter().all(|&b| b == NO_BLOCK)
                    && !table[first..].contains(&NO_BLOCK),
                "sequence {id} in group {g} must hold exactly blocks {first}.. of {}",
                table.len()
            );
        }
        Ok(())
    }

    /// Checks the bookkeeping against the block tables of all live sequences: reference
    /// counts match the tables, every block is either free or referenced (never both), a
    /// cached block is held only by its own group's tables, and the hash index points at
    /// blocks holding that hash.
    pub fn check_invariants(&self, seqs: &[&Sequence]) -> anyhow::Result<()> {
        let mut expected = vec![0u32; self.blocks.len()];
        for seq in seqs {
            self.check_sequence(seq)?;
            let copies = seq.state_restores.iter().chain(&seq.state_saves);
            let held = seq
                .block_tables
                .iter()
                .enumerate()
                .chain(copies.map(|c| (c.group, &c.blocks)));
            for (g, table) in held {
                for &id in table.iter().filter(|&&id| id != NO_BLOCK) {
                    ensure!(
                        (id as usize) < self.blocks.len(),
                        "block id {id} out of range"
                    );
                    expected[id as usize] += 1;
                    if let Some(c) = &self.blocks[id as usize].cached {
                        ensure!(
                            c.group == g,
                            "block {id} is cached for group {} but group {g} holds it",
                            c.group
                        );
                    }
                }
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
        for (&(group, hash, part), &id) in &self.hash_to_block {
            let holds = self.blocks[id as usize]
                .cached
                .as_ref()
                .is_some_and(|c| c.hash == hash && c.group == group && c.part == part);
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

    /// A pool of `num_blocks` blocks for one full group.
    fn full(num_blocks: usize, block_size: usize, caching: bool) -> BlockManager {
        BlockManager::new(num_blocks, block_size, vec![GroupKind::Full], caching)
    }

    fn can_allocate(bm: &BlockManager, s: &Sequence) -> bool {
        bm.plan_admission(s, usize::MAX).needed <= bm.num_free_blocks()
    }

    /// Admits `s` with its whole prompt as the first chunk.
    fn allocate(bm: &mut BlockManager, s: &mut Sequence) -> anyhow::Result<()> {
        let plan = bm.plan_admission(s, usize::MAX);
        bm.admit(s, plan)
    }

    /// Admits `s` and marks all its tokens computed, as a prefill would.
    fn admit_and_compute(bm: &mut BlockManager, s: &mut Sequence) {
        allocate(bm, s).unwrap();
        s.num_computed_tokens = s.num_tokens();
        bm.commit_computed(s);
    }

    fn check(bm: &BlockManager, seqs: &[&Sequence]) {
        bm.check_invariants(seqs).unwrap();
    }

    #[test]
    fn allocation_respects_capacity() {
        let mut bm = full(4, 4, true);
        let mut a = seq(0, (0..9).collect());
        assert!(can_allocate(&bm, &a));
        allocate(&mut bm, &mut a).unwrap();
        assert_eq!(a.block_tables[0].len(), 3);
        assert_eq!(bm.num_used_blocks(), 3);
        let mut b = seq(1, (100..109).collect());
        assert!(!can_allocate(&bm, &b));
        assert!(allocate(&mut bm, &mut b).is_err());
        assert!(b.block_tables.is_empty());
        check(&bm, &[&a, &b]);
        bm.free(&mut a);
        assert_eq!(bm.num_free_blocks(), 4);
        check(&bm, &[&a]);
    }

    #[test]
    fn shared_prefix_is_reused_with_reference_counts() {
        let mut bm = full(16, 4, true);
        let mut a = seq(0, (0..13).collect());
        admit_and_compute(&mut bm, &mut a);
        let mut b_tokens: Vec<u32> = (0..12).collect();
        b_tokens.extend([99, 98]);
        let mut b = seq(1, b_tokens);
        allocate(&mut bm, &mut b).unwrap();
        assert_eq!(b.num_computed_tokens, 12);
        assert_eq!(&b.block_tables[0][..3], &a.block_tables[0][..3]);
        assert_ne!(b.block_tables[0][3], a.block_tables[0][3]);
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
        let mut bm = full(16, 4, true);
        let mut a = seq(0, (0..12).collect());
        admit_and_compute(&mut bm, &mut a);
        let mut b = seq(1, (0..12).collect());
        allocate(&mut bm, &mut b).unwrap();
        // Blocks 0 and 1 hit; block 2 holds the last token and is computed again.
        assert_eq!(b.num_computed_tokens, 8);
        assert_eq!(b.num_uncomputed_tokens(), 4);
        b.num_computed_tokens = 12;
        bm.commit_computed(&mut b);
        check(&bm, &[&a, &b]);
        // A one-token prompt never hits.
        let mut c = seq(2, vec![5]);
        allocate(&mut bm, &mut c).unwrap();
        assert_eq!(c.num_computed_tokens, 0);
    }

    #[test]
    fn blocks_are_shared_only_once_computed() {
        let mut bm = full(16, 4, true);
        let mut a = seq(0, (0..9).collect());
        allocate(&mut bm, &mut a).unwrap();
        let mut b = seq(1, (0..9).collect());
        allocate(&mut bm, &mut b).unwrap();
        assert_eq!(b.num_computed_tokens, 0);
        a.num_computed_tokens = 4;
        bm.commit_computed(&mut a);
        let mut c = seq(2, (0..9).collect());
        allocate(&mut bm, &mut c).unwrap();
        assert_eq!(c.num_computed_tokens, 4);
        check(&bm, &[&a, &b, &c]);
    }

    #[test]
    fn freed_cached_blocks_stay_reusable_until_evicted_lru() {
        let mut bm = full(4, 4, true);
        let mut a = seq(0, (0..9).collect());
        admit_and_compute(&mut bm, &mut a);
        bm.free(&mut a);
        assert_eq!(bm.num_free_blocks(), 4);
        // The cached prefix survives the free.
        let mut again = seq(1, (0..9).collect());
        allocate(&mut bm, &mut again).unwrap();
        assert_eq!(again.num_computed_tokens, 8);
        check(&bm, &[&again]);
        bm.free(&mut again);
        // A different sequence needing 3 blocks takes the two never-cached blocks first,
        // then evicts the tail block of the old prefix before its head.
        let mut other = seq(2, (50..62).collect());
        allocate(&mut bm, &mut other).unwrap();
        check(&bm, &[&other]);
        let mut probe = seq(3, (0..9).collect());
        assert!(!can_allocate(&bm, &probe));
        bm.free(&mut other);
        assert!(can_allocate(&bm, &probe));
        allocate(&mut bm, &mut probe).unwrap();
        assert_eq!(
            probe.num_computed_tokens, 4,
            "head block survived, tail evicted"
        );
        check(&bm, &[&probe]);
    }

    #[test]
    fn eviction_of_everything_keeps_the_index_consistent() {
        let mut bm = full(3, 2, true);
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
        let mut bm = full(3, 4, true);
        let mut a = seq(0, (0..4).collect());
        admit_and_compute(&mut bm, &mut a);
        a.token_ids.push(7);
        assert!(bm.blocks_to_extend(&a, 5) <= bm.num_free_blocks());
        bm.extend(&mut a, 5).unwrap();
        assert_eq!(a.block_tables[0].len(), 2);
        a.token_ids.push(8);
        bm.extend(&mut a, 6).unwrap();
        assert_eq!(a.block_tables[0].len(), 2);
        check(&bm, &[&a]);
    }

    #[test]
    fn disabled_prefix_caching_never_hits() {
        let mut bm = full(8, 4, false);
        let mut a = seq(0, (0..9).collect());
        admit_and_compute(&mut bm, &mut a);
        let mut b = seq(1, (0..9).collect());
        allocate(&mut bm, &mut b).unwrap();
        assert_eq!(b.num_computed_tokens, 0);
        bm.free(&mut a);
        bm.free(&mut b);
        check(&bm, &[]);
        assert_eq!(bm.prefix_cache_stats(), PrefixCacheStats::default());
    }

    const N: u32 = NO_BLOCK;

    /// A sliding group (window 8, blocks of 4) beside a full one: a chunked prefill takes
    /// the sliding group's blocks chunk by chunk and gives back those the window passed;
    /// decoding holds ⌈8 / 4⌉ + 1 of them while the full group keeps every block.
    #[test]
    fn a_sliding_group_holds_its_window_as_the_sequence_advances() {
        let sliding = GroupKind::Sliding { window: 8 };
        let mut bm = BlockManager::new(32, 4, vec![sliding, GroupKind::Full], true);
        let mut a = seq(0, (0..22).collect());
        let plan = bm.plan_admission(&a, 6);
        assert_eq!((plan.chunk, plan.needed), (6, 2 + 6));
        bm.admit(&mut a, plan).unwrap();
        assert_eq!(a.block_tables[0].len(), 2);
        assert_eq!(a.block_tables[1].len(), 6);
        a.num_computed_tokens = 6;
        bm.commit_computed(&mut a);
        check(&bm, &[&a]);
        // The next chunk, 6..16: its first query reads from position 6 + 1 − 8 = 0.
        assert_eq!(bm.blocks_to_extend(&a, 16), 2);
        bm.extend(&mut a, 16).unwrap();
        a.num_computed_tokens = 16;
        bm.commit_computed(&mut a);
        // Position 16 reads from 9: blocks 0 and 1 went back to the pool.
        assert_eq!(&a.block_tables[0][..2], &[N, N]);
        assert_eq!(bm.num_used_blocks(), 2 + 6);
        check(&bm, &[&a]);
        bm.extend(&mut a, 22).unwrap();
        a.num_computed_tokens = 22;
        bm.commit_computed(&mut a);
        // Decoding: 22 tokens computed, the window 15..=22 spans blocks 3..=5.
        let held = |s: &Sequence| s.block_tables[0].iter().filter(|&&b| b != N).count();
        assert_eq!(held(&a), 3);
        for t in 22..60u32 {
            a.token_ids.push(t);
            let end = a.num_tokens();
            bm.extend(&mut a, end).unwrap();
            a.num_computed_tokens = end;
            bm.commit_computed(&mut a);
            assert!(
                held(&a) <= 8usize.div_ceil(4) + 1,
                "{:?}",
                a.block_tables[0]
            );
            check(&bm, &[&a]);
        }
        assert_eq!(
            a.block_tables[1].len(),
            15,
            "the full group keeps every block"
        );
        bm.free(&mut a);
        check(&bm, &[&a]);
        assert_eq!(bm.num_used_blocks(), 0);
    }

    /// An admission whose first chunk's sliding blocks do not fit takes a shorter chunk
    /// (the full group still holds the whole prompt); with no room for one token, none.
    #[test]
    fn an_admission_shortens_its_first_chunk_to_the_free_blocks() {
        let sliding = GroupKind::Sliding { window: 8 };
        let bm = BlockManager::new(12, 4, vec![sliding, GroupKind::Full], true);
        let a = seq(0, (0..32).collect());
        // The whole prompt: 8 full blocks and 8 sliding ones; 4 sliding blocks fit.
        let plan = bm.plan_admission(&a, usize::MAX);
        assert_eq!((plan.chunk, plan.needed), (16, 8 + 4));
        let small = BlockManager::new(8, 4, vec![sliding, GroupKind::Full], true);
        assert!(small.plan_admission(&a, usize::MAX).needed > small.num_free_blocks());
    }

    /// A second sequence sharing a 16-token prefix takes the full group's four blocks and
    /// the sliding group's two that its window needs at position 16, none before.
    #[test]
    fn a_prefix_hit_takes_every_full_block_and_the_window_of_each_sliding_group() {
        let sliding = GroupKind::Sliding { window: 8 };
        let mut bm = BlockManager::new(32, 4, vec![sliding, GroupKind::Full], true);
        let mut a = seq(0, (0..22).collect());
        admit_and_compute(&mut bm, &mut a);
        let mut b_tokens: Vec<u32> = (0..16).collect();
        b_tokens.extend([90, 91, 92]);
        let mut b = seq(1, b_tokens);
        allocate(&mut bm, &mut b).unwrap();
        assert_eq!(b.num_computed_tokens, 16);
        assert_eq!(&b.block_tables[1][..4], &a.block_tables[1][..4]);
        // Position 16 reads from 9: blocks 2 and 3 (A gave them back, cached).
        assert_eq!(&b.block_tables[0][..2], &[N, N]);
        assert_eq!(b.block_tables[0].len(), 5);
        assert!(b.block_tables[0][2..].iter().all(|&x| x != N));
        check(&bm, &[&a, &b]);
        assert_eq!(bm.prefix_cache_stats().hits, 16);
        bm.free(&mut a);
        bm.free(&mut b);
        check(&bm, &[]);
    }

    /// When the blocks a sliding group's window needs are evicted, the prefix misses even
    /// though the full group still holds all of it.
    #[test]
    fn a_prefix_whose_window_was_evicted_misses() {
        let sliding = GroupKind::Sliding { window: 4 };
        let mut bm = BlockManager::new(12, 4, vec![sliding, GroupKind::Full], true);
        let mut a = seq(0, (0..17).collect());
        admit_and_compute(&mut bm, &mut a);
        bm.free(&mut a);
        // Evictable, oldest first: sliding blocks 2, 1, 0 (passed by the window), then 3;
        // then the full group's 3, 2, 1, 0. Four blocks are plain. C takes the plain ones,
        // D evicts the sliding group's four.
        let mut c = seq(1, (100..108).collect());
        allocate(&mut bm, &mut c).unwrap();
        let mut d = seq(2, (200..208).collect());
        allocate(&mut bm, &mut d).unwrap();
        check(&bm, &[&c, &d]);
        let mut b_tokens: Vec<u32> = (0..16).collect();
        b_tokens.push(99);
        let b = seq(3, b_tokens);
        let plan = bm.plan_admission(&b, usize::MAX);
        assert!(
            plan.hashes.is_empty(),
            "the window at 16 needs block 3, evicted"
        );
        assert_eq!(plan.hits[1].1.len(), 0);
        check(&bm, &[&c, &d]);
    }

    /// A fake recurrent layer (its state 2 blocks) beside a full group: a sequence holds its
    /// state from admission to free; a checkpoint is taken at its prompt's last block
    /// boundary and every `every` blocks, and cached under the prefix once computed, so that
    /// a sequence sharing the prefix starts from it (holding the copy until its first step);
    /// a longer shared prefix with no checkpoint at its end is served only up to the last
    /// one; a checkpoint the cache holds is not taken again; checkpoints are evicted as
    /// freed blocks are; no block leaks.
    #[test]
    fn a_recurrent_group_holds_its_state_and_serves_prefixes_from_cached_copies() {
        let groups = vec![GroupKind::Recurrent { blocks: 2 }, GroupKind::Full];
        let mut bm = BlockManager::new(24, 4, groups, true).with_state_checkpoints(2);
        let mut a = seq(0, (0..13).collect());
        let plan = bm.plan_admission(&a, 9);
        assert_eq!((plan.chunk, plan.needed), (9, 2 + 4));
        bm.admit(&mut a, plan).unwrap();
        // The first chunk (0..9) passes block boundaries 4 and 8: 8 is the second.
        bm.reserve_checkpoints(&mut a, 9).unwrap();
        let positions = |s: &Sequence| -> Vec<(usize, usize)> {
            s.state_saves
                .iter()
                .map(|c| (c.group, c.position))
                .collect()
        };
        assert_eq!(positions(&a), [(0, 8)]);
        assert_eq!(a.state_saves[0].blocks.len(), 2);
        check(&bm, &[&a]);
        a.num_computed_tokens = 9;
        bm.commit_computed(&mut a);
        assert!(a.state_saves.is_empty());
        assert_eq!(bm.num_checkpoint_blocks(), 2);
        // The rest of the prompt (9..13) passes 12, its last block boundary.
        bm.reserve_checkpoints(&mut a, 13).unwrap();
        assert_eq!(positions(&a), [(0, 12)]);
        a.num_computed_tokens = 13;
        bm.commit_computed(&mut a);
        assert_eq!(bm.prefix_cache_stats().checkpoints_saved, 2);
        for t in 13..20u32 {
            a.token_ids.push(t);
            let end = a.num_tokens();
            assert_eq!(bm.blocks_to_extend(&a, end), usize::from(end % 4 == 1));
            bm.extend(&mut a, end).unwrap();
            bm.reserve_checkpoints(&mut a, end).unwrap();
            // Decoding passes 16 (the fourth block: a checkpoint) and 20 (not one).
            let expected: &[(usize, usize)] = if end == 16 { &[(0, 16)] } else { &[] };
            assert_eq!(positions(&a), expected);
            a.num_computed_tokens = end;
            bm.commit_computed(&mut a);
        }
        assert_eq!(a.block_tables[0].len(), 2, "the state does not grow");
        assert_eq!(bm.num_checkpoint_blocks(), 3 * 2);
        check(&bm, &[&a]);
        // The same prompt again finds its checkpoint at 12; computed from 8 on, it would pass
        // 12 but takes no checkpoint there, the cache holding it already.
        let mut again = seq(9, (0..13).collect());
        allocate(&mut bm, &mut again).unwrap();
        assert_eq!(again.num_computed_tokens, 12);
        again.num_computed_tokens = 8;
        bm.reserve_checkpoints(&mut again, 13).unwrap();
        assert!(again.state_saves.is_empty(), "the cache holds it already");
        again.num_computed_tokens = 12;
        bm.free(&mut again);
        // B shares 8 tokens: the full group's two blocks and the copy after them.
        let mut b_tokens: Vec<u32> = (0..8).collect();
        b_tokens.extend([50, 51, 52]);
        let mut b = seq(1, b_tokens);
        allocate(&mut bm, &mut b).unwrap();
        assert_eq!(b.num_computed_tokens, 8);
        assert_eq!(b.state_restores.len(), 1);
        assert_eq!(b.state_restores[0].position, 8);
        assert_eq!(b.state_restores[0].blocks.len(), 2);
        assert_eq!(b.block_tables[0].len(), 2, "its own state beside the copy");
        // C shares all 20 of A's tokens: A cached five full blocks, checkpoints up to 16.
        let mut c_tokens: Vec<u32> = (0..20).collect();
        c_tokens.push(60);
        let mut c = seq(2, c_tokens);
        allocate(&mut bm, &mut c).unwrap();
        assert_eq!(c.num_computed_tokens, 16);
        assert_eq!(c.state_restores[0].position, 16);
        check(&bm, &[&a, &b, &c]);
        // Their first steps copy the state in, and give the copy back to the cache.
        for s in [&mut b, &mut c] {
            s.num_computed_tokens = s.num_tokens();
            bm.commit_computed(s);
            assert!(s.state_restores.is_empty());
        }
        check(&bm, &[&a, &b, &c]);
        for s in [&mut a, &mut b, &mut c] {
            bm.free(s);
        }
        check(&bm, &[]);
        assert_eq!(bm.num_used_blocks(), 0);
        // Unrelated sequences take every block: the copy is evicted and the prefix misses.
        let mut big = seq(3, (100..172).collect());
        allocate(&mut bm, &mut big).unwrap();
        let mut other = seq(4, (200..208).collect());
        allocate(&mut bm, &mut other).unwrap();
        assert!(
            !bm.hash_to_block.keys().any(|&(g, _, _)| g == 0),
            "every state copy was evicted"
        );
        let probe = seq(5, (0..9).collect());
        assert_eq!(bm.plan_admission(&probe, usize::MAX).hashes.len(), 0);
        check(&bm, &[&big, &other]);
    }
}
