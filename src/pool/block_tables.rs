//! Per-request block tables whose token counts and block hashes belong to the
//! caller: the shape of vLLM 0.33's `KVCacheManager` with one full-attention
//! group (`UnitaryKVCacheCoordinator` over a `FullAttentionManager`), where the
//! scheduler owns `request.num_computed_tokens` and the request's `block_hashes`
//! and passes them in on every call.
//!
//! [`super::KVCacheManager`] keeps those itself; both apply the same slot rules
//! (`slots.rs`): how many blocks a request needs, how many free blocks that
//! takes, and which of its blocks are cached. This module adds vLLM's extra
//! inputs: external (connector) tokens, delayed caching, the full-sequence
//! admission gate, reserved and watermark blocks, and vLLM's rule that only a
//! request not yet running may adopt prefix hits.
//!
//! Every call validates first, so an `Err` changes nothing.

use hashbrown::HashMap;

use super::block_pool::{BlockPool, CacheBlocks};
use super::error::{PoolError, PoolResult};
use super::hash_key::HashSlice;
use super::known_hashes::{check_event_tokens, KnownHashes, KnowsHashes};
use super::manager::LoraInfo;
use super::request_id::{RequestId, RequestKey};
use super::slots;

/// One request's blocks, and the block hashes seen so far.
#[derive(Clone, Debug, Default)]
struct Table {
    blocks: Vec<u32>,
    hashes: KnownHashes,
    /// vLLM's `num_cached_block[request_id]`: `None` until the request adopts its
    /// prefix hits or first caches a block. A request with `Some` is running and
    /// takes no new hits.
    num_cached: Option<usize>,
}

/// One `allocate_slots` call: the request's state as the caller holds it, and
/// vLLM's arguments.
#[derive(Clone, Copy, Debug)]
pub struct SlotCall<'a> {
    /// `request.num_computed_tokens`.
    pub num_computed_tokens: usize,
    /// `request.num_tokens` (prompt and output tokens so far); `None` when the caller
    /// did not read it, which only a call that does not need it may do
    /// ([`SlotCall::needs_num_tokens`]).
    pub num_tokens: Option<usize>,
    /// `request.block_hashes[hashes_from..]`: the caller may leave out the hashes
    /// the tables already have ([`BlockTables::num_known_hashes`]).
    pub block_hashes: HashSlice<'a>,
    /// Index in `request.block_hashes` of `block_hashes[0]`.
    pub hashes_from: usize,
    /// Tokens to compute this step.
    pub num_new_tokens: usize,
    /// Tokens of `new_computed_blocks`.
    pub num_new_computed_tokens: usize,
    /// The prefix hits to adopt: `None` for vLLM's empty sentinel (nothing to
    /// adopt), `Some(&[])` for an explicit empty set.
    pub new_computed_blocks: Option<&'a [u32]>,
    /// Speculative slots beyond the new tokens (never cached).
    pub num_lookahead_tokens: usize,
    /// Tokens a KV connector provides, after the local hits.
    pub num_external_computed_tokens: usize,
    /// Do not cache the blocks now (P/D: the KV arrives later).
    pub delay_cache_blocks: bool,
    /// Allocate only if the whole request (`num_tokens`) would fit.
    pub full_sequence_must_fit: bool,
    /// Free blocks to leave for other requests.
    pub reserved_blocks: usize,
    /// Further free blocks to leave (vLLM's watermark, for waiting requests).
    pub watermark_blocks: usize,
    /// The request's token ids, for `BlockStored` events.
    pub token_ids: Option<&'a [i64]>,
    /// Leave the connector's blocks (for `num_external_computed_tokens`) out of the
    /// blocks recorded for zeroing: an async load writes them after this step, which
    /// zeroing would race (vLLM's `skip_zeroing_group_ids` holding the group).
    pub skip_zeroing_external: bool,
}

impl<'a> SlotCall<'a> {
    /// Whether a call reads `num_tokens`: only to cache the request's full blocks
    /// (a pool with prefix caching) and for the full-sequence gate.
    pub fn needs_num_tokens(enable_caching: bool, full_sequence_must_fit: bool) -> bool {
        enable_caching || full_sequence_must_fit
    }

    /// A call for `num_new_tokens` with no hits, lookahead, connector or gates.
    pub fn new(
        num_computed_tokens: usize,
        num_tokens: usize,
        block_hashes: HashSlice<'a>,
        num_new_tokens: usize,
    ) -> Self {
        Self {
            num_computed_tokens,
            num_tokens: Some(num_tokens),
            block_hashes,
            hashes_from: 0,
            num_new_tokens,
            num_new_computed_tokens: 0,
            new_computed_blocks: None,
            num_lookahead_tokens: 0,
            num_external_computed_tokens: 0,
            delay_cache_blocks: false,
            full_sequence_must_fit: false,
            reserved_blocks: 0,
            watermark_blocks: 0,
            token_ids: None,
            skip_zeroing_external: false,
        }
    }
}

/// Block tables over one pool (passed to each call, as the tracker's is), for a
/// caller that owns the requests.
#[derive(Debug)]
pub struct BlockTables {
    tables: HashMap<RequestId, Table>,
    max_model_len: usize,
    /// Ids of blocks allocated since the last [`Self::take_new_block_ids`], when
    /// the engine zeroes new blocks.
    new_block_ids: Option<Vec<u32>>,
}

impl KnowsHashes for BlockTables {
    fn known_hashes_of(&self, id: RequestKey<'_>) -> Option<&KnownHashes> {
        self.tables.get(&id).map(|t| &t.hashes)
    }

    fn forget_known_hashes_from(&mut self, id: RequestKey<'_>, n: usize) {
        if let Some(t) = self.tables.get_mut(&id) {
            t.hashes.truncate(n);
        }
    }
}

impl BlockTables {
    /// Empty tables for sequences of at most `max_model_len` tokens;
    /// `record_new_block_ids` keeps the ids of new blocks for zeroing.
    pub fn new(max_model_len: usize, record_new_block_ids: bool) -> PoolResult<Self> {
        if max_model_len == 0 {
            return Err(PoolError::InvalidArgument(
                "max_model_len must be at least 1".into(),
            ));
        }
        Ok(Self {
            tables: HashMap::new(),
            max_model_len,
            new_block_ids: record_new_block_ids.then(Vec::new),
        })
    }

    /// Longest sequence a request may reach.
    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    /// The request's blocks (empty for an unknown request, as vLLM's tables).
    pub fn blocks(&self, id: RequestKey<'_>) -> &[u32] {
        self.tables.get(&id).map_or(&[], |t| &t.blocks)
    }

    /// How many of the request's blocks are cached (`None`: vLLM does not track it
    /// yet).
    pub fn num_cached_blocks(&self, id: RequestKey<'_>) -> Option<usize> {
        self.tables.get(&id).and_then(|t| t.num_cached)
    }

    /// How many of the request's block hashes the tables hold: a caller passes
    /// `request.block_hashes[n..]` from here on.
    pub fn num_known_hashes(&self, id: RequestKey<'_>) -> usize {
        self.tables.get(&id).map_or(0, |t| t.hashes.len())
    }

    /// Checks that `hashes`, starting at index `from` of the request's hashes, leave
    /// no gap after the known ones and have their width.
    fn check_hashes(
        &self,
        pool: &BlockPool,
        id: RequestKey<'_>,
        from: usize,
        hashes: HashSlice<'_>,
    ) -> PoolResult<()> {
        KnownHashes::check(self.tables.get(&id).map(|t| &t.hashes), pool, from, hashes)
    }

    /// Requests with a table.
    pub fn request_ids(&self) -> impl Iterator<Item = &RequestId> {
        self.tables.keys()
    }

    /// Whether request `id` has a table.
    pub fn contains(&self, id: RequestKey<'_>) -> bool {
        self.tables.contains_key(&id)
    }

    /// How many requests have a table.
    pub fn num_requests(&self) -> usize {
        self.tables.len()
    }

    /// vLLM's `get_num_blocks_to_allocate` for the request: new blocks plus hits
    /// that must leave the free queue, to give it `num_tokens` slots.
    pub fn num_blocks_to_allocate(
        &self,
        pool: &BlockPool,
        id: RequestKey<'_>,
        num_tokens: usize,
        hits: &[u32],
    ) -> usize {
        Self::table_blocks_to_allocate(self.tables.get(&id), pool, num_tokens, hits)
    }

    /// [`Self::num_blocks_to_allocate`] for the request's table, if it has one.
    fn table_blocks_to_allocate(
        table: Option<&Table>,
        pool: &BlockPool,
        num_tokens: usize,
        hits: &[u32],
    ) -> usize {
        let held = table.map_or(0, |t| t.blocks.len());
        let required = num_tokens.div_ceil(pool.config().block_size as usize);
        if table.is_some_and(|t| t.num_cached.is_some()) {
            return required.saturating_sub(held);
        }
        slots::blocks_to_allocate(pool, required, held, hits)
    }

    /// vLLM's `allocate_slots`: `Ok(true)` with the new blocks appended to `out`,
    /// `Ok(false)` (nothing changed) when they do not fit.
    pub fn allocate_slots(
        &mut self,
        pool: &mut BlockPool,
        id: RequestKey<'_>,
        call: &SlotCall<'_>,
        out: &mut Vec<u32>,
    ) -> PoolResult<bool> {
        let hits = call.new_computed_blocks.unwrap_or(&[]);
        let needs_tokens =
            SlotCall::needs_num_tokens(pool.config().enable_caching, call.full_sequence_must_fit);
        let num_tokens = match call.num_tokens {
            Some(n) => n,
            None if !needs_tokens => 0, // read by nothing below
            None => {
                return Err(PoolError::InvalidArgument(
                    "num_tokens is needed with prefix caching or full_sequence_must_fit".into(),
                ))
            }
        };
        // One lookup to check and size the call, one to change the table.
        let table = self.tables.get(&id);
        KnownHashes::check(
            table.map(|t| &t.hashes),
            pool,
            call.hashes_from,
            call.block_hashes,
        )?;
        if call.num_new_tokens == 0
            && call.num_external_computed_tokens == 0
            && call.num_new_computed_tokens == 0
        {
            return Err(PoolError::InvalidArgument(
                "num_new_tokens must be greater than 0 when there are no computed tokens to adopt"
                    .into(),
            ));
        }
        let adopting = call.new_computed_blocks.is_some() || call.num_external_computed_tokens > 0;
        let running = table.is_some_and(|t| t.num_cached.is_some());
        if !hits.is_empty() {
            if running {
                return Err(PoolError::InvalidArgument(
                    "a running request takes no new computed blocks".into(),
                ));
            }
            if table.is_some_and(|t| !t.blocks.is_empty()) {
                return Err(PoolError::InvalidArgument(
                    "new computed blocks are adopted only by a request without blocks".into(),
                ));
            }
            if !pool.config().enable_caching {
                return Err(PoolError::CachingDisabled);
            }
            pool.check_ids(hits)?;
        }
        let block_size = pool.config().block_size as usize;
        let max_len = self.max_model_len;
        let num_local = call
            .num_computed_tokens
            .saturating_add(call.num_new_computed_tokens);
        let total = num_local
            .saturating_add(call.num_external_computed_tokens)
            .min(max_len);
        let free = pool.num_free_blocks() as i128;
        if call.full_sequence_must_fit {
            let need = Self::table_blocks_to_allocate(table, pool, num_tokens.min(max_len), hits);
            if (need + call.watermark_blocks) as i128 > free {
                return Ok(false);
            }
        }
        let need_slots = total
            .saturating_add(call.num_new_tokens)
            .saturating_add(call.num_lookahead_tokens)
            .min(max_len);
        let need = Self::table_blocks_to_allocate(table, pool, need_slots, hits);
        if !call.delay_cache_blocks {
            // The blocks this call caches: full within its tokens, with a hash, held.
            let known = KnownHashes::len_after(
                table.map(|t| &t.hashes),
                call.hashes_from,
                call.block_hashes,
            );
            let held = table
                .map_or(0, |t| t.blocks.len())
                .max(need_slots.div_ceil(block_size));
            let cached_to = total
                .saturating_add(call.num_new_tokens)
                .min(num_tokens)
                .min(known.saturating_mul(block_size))
                .min(held.saturating_mul(block_size));
            check_event_tokens(pool, call.token_ids, cached_to, [block_size])?;
        }
        if need.saturating_add(call.watermark_blocks) as i128 > free - call.reserved_blocks as i128
        {
            return Ok(false);
        }
        // From here on nothing fails: the ids are checked and the blocks fit.
        let table = self.tables.entry_ref(&id).or_default();
        table.hashes.learn(call.hashes_from, call.block_hashes);
        let adopt = adopting && table.num_cached.is_none();
        if adopt {
            if !hits.is_empty() {
                pool.touch(hits)?;
            }
            table.blocks.extend_from_slice(hits);
            table.num_cached = Some(table.blocks.len());
        }
        let first_new = table.blocks.len();
        if adopt && call.num_external_computed_tokens > 0 {
            // The connector's blocks belong to the table, not to the result; like every
            // slot, they stop at max_model_len (so the count above covers them).
            let want = total
                .div_ceil(block_size)
                .saturating_sub(table.blocks.len());
            pool.get_new_blocks(want, &mut table.blocks)?;
        }
        let first_new = if call.skip_zeroing_external {
            table.blocks.len()
        } else {
            first_new
        };
        let want = need_slots
            .div_ceil(block_size)
            .saturating_sub(table.blocks.len());
        let start = out.len();
        pool.get_new_blocks(want, out)?;
        table.blocks.extend_from_slice(&out[start..]);
        if let Some(ids) = &mut self.new_block_ids {
            ids.extend_from_slice(&table.blocks[first_new..]);
        }
        if !call.delay_cache_blocks {
            let num_tokens = total.saturating_add(call.num_new_tokens).min(num_tokens);
            Self::cache_table_blocks(
                pool,
                table,
                num_tokens,
                call.token_ids,
                &LoraInfo::default(),
            )?;
        }
        Ok(true)
    }

    /// vLLM's `cache_blocks`: caches the request's blocks that are full within its
    /// first `num_tokens` tokens and have a hash; `block_hashes` are the request's
    /// hashes from index `hashes_from` (those already known may be left out).
    #[allow(clippy::too_many_arguments)]
    pub fn cache_blocks(
        &mut self,
        pool: &mut BlockPool,
        id: RequestKey<'_>,
        hashes_from: usize,
        block_hashes: HashSlice<'_>,
        num_tokens: usize,
        token_ids: Option<&[i64]>,
        lora: &LoraInfo,
    ) -> PoolResult<()> {
        self.check_hashes(pool, id, hashes_from, block_hashes)?;
        if let Some(table) = self.tables.get_mut(&id) {
            table.hashes.learn(hashes_from, block_hashes);
        }
        self.cache_known_blocks(pool, id, num_tokens, token_ids, lora)
    }

    /// Caches the request's blocks full within `num_tokens` tokens, with the hashes
    /// the tables know.
    fn cache_known_blocks(
        &mut self,
        pool: &mut BlockPool,
        id: RequestKey<'_>,
        num_tokens: usize,
        token_ids: Option<&[i64]>,
        lora: &LoraInfo,
    ) -> PoolResult<()> {
        match self.tables.get_mut(&id) {
            Some(table) => Self::cache_table_blocks(pool, table, num_tokens, token_ids, lora),
            None => Ok(()),
        }
    }

    /// [`Self::cache_known_blocks`] for the request's table.
    fn cache_table_blocks(
        pool: &mut BlockPool,
        table: &mut Table,
        num_tokens: usize,
        token_ids: Option<&[i64]>,
        lora: &LoraInfo,
    ) -> PoolResult<()> {
        if !pool.config().enable_caching {
            return Ok(());
        }
        let block_size = pool.config().block_size as usize;
        let block_hashes = table.hashes.as_slice();
        let num_cached = table.num_cached.unwrap_or(0);
        let num_full =
            (num_tokens.min(block_hashes.len() * block_size) / block_size).min(table.blocks.len());
        if num_cached >= num_full {
            return Ok(());
        }
        let call = CacheBlocks {
            block_ids: &table.blocks,
            block_hashes,
            num_cached_blocks: num_cached,
            num_full_blocks: num_full,
            group: 0,
            token_ids: if pool.config().enable_events {
                token_ids
            } else {
                None
            },
            lora_id: lora.id,
            lora_name: lora.name.as_deref(),
            extra_keys: None,
            block_size: None,
            block_mask: None,
            priority: None,
        };
        pool.cache_full_blocks(call)?;
        table.num_cached = Some(num_full);
        Ok(())
    }

    /// vLLM's `pop_blocks_for_free`: forgets the request and hands its blocks
    /// over, in allocation order, without freeing them.
    pub fn pop_blocks(&mut self, id: RequestKey<'_>) -> Vec<u32> {
        self.tables
            .remove(&id)
            .map(|t| t.blocks)
            .unwrap_or_default()
    }

    /// vLLM's `free`: frees the request's blocks tail first and forgets it (an
    /// unknown request is a no-op, as in vLLM).
    pub fn free(&mut self, pool: &mut BlockPool, id: RequestKey<'_>) -> PoolResult<()> {
        let Some(table) = self.tables.remove(&id) else {
            return Ok(());
        };
        // A refused free changed nothing in the pool; keep the table as it was too.
        pool.free_blocks_reversed(&table.blocks)
            .inspect_err(|_| drop(self.tables.insert(RequestId::from(&id), table)))
    }

    /// vLLM's `record_blocks_for_zeroing`: request `id`'s blocks from token
    /// `start_token` on (a block boundary) are recorded for zeroing again, as blocks a
    /// failed async load left unwritten are. Nothing when not recording or for an
    /// unknown request.
    pub fn record_blocks_for_zeroing(
        &mut self,
        id: RequestKey<'_>,
        start_token: usize,
        block_size: usize,
    ) -> PoolResult<()> {
        let Some(ids) = &mut self.new_block_ids else {
            return Ok(());
        };
        if start_token % block_size != 0 {
            return Err(PoolError::InvalidArgument(format!(
                "start_token {start_token} is not at a block boundary (block size {block_size})"
            )));
        }
        if let Some(table) = self.tables.get(&id) {
            ids.extend(table.blocks.iter().skip(start_token / block_size));
        }
        Ok(())
    }

    /// Ids of blocks allocated since the last call (empty unless recording).
    pub fn take_new_block_ids(&mut self) -> Vec<u32> {
        self.new_block_ids
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Checks the pool and that the tables hold exactly the pool's references.
    pub fn check_invariants(&self, pool: &BlockPool) -> Result<(), Vec<String>> {
        let mut problems = pool.check_invariants().err().unwrap_or_default();
        slots::check_holders(
            pool,
            self.tables.values().flat_map(|t| t.blocks.iter()),
            &mut problems,
        );
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::PoolConfig;

    const BS: usize = 4;

    fn tables(num_blocks: u32) -> (BlockTables, BlockPool) {
        let mut config = PoolConfig::new(num_blocks);
        config.block_size = BS as u32;
        (
            BlockTables::new(1024, true).unwrap(),
            BlockPool::new(config).unwrap(),
        )
    }

    fn hashes(n: usize) -> Vec<u8> {
        (0..n).flat_map(|i| [i as u8 + 1; 8]).collect()
    }

    fn rid(i: i64) -> RequestKey<'static> {
        RequestKey::Int(i)
    }

    #[test]
    fn num_tokens_may_be_left_out_only_where_nothing_reads_it() {
        let (mut t, mut p) = tables(16);
        let mut call = SlotCall::new(0, 10, HashSlice::empty(), 10);
        call.num_tokens = None;
        let mut out = Vec::new();
        assert!(t.allocate_slots(&mut p, rid(1), &call, &mut out).is_err());
        assert!(out.is_empty() && t.blocks(rid(1)).is_empty());
        let mut config = PoolConfig::new(16);
        config.block_size = BS as u32;
        config.enable_caching = false;
        let mut p = BlockPool::new(config).unwrap();
        assert!(t.allocate_slots(&mut p, rid(1), &call, &mut out).unwrap());
        assert_eq!(out, vec![1, 2, 3]);
        call.full_sequence_must_fit = true;
        assert!(t.allocate_slots(&mut p, rid(2), &call, &mut out).is_err());
        t.check_invariants(&p).unwrap();
    }

    #[test]
    fn allocates_caches_and_frees_tail_first() {
        let (mut t, mut p) = tables(16);
        let h = hashes(2);
        let call = SlotCall::new(0, 10, HashSlice::new(&h, 8).unwrap(), 10);
        let mut out = Vec::new();
        assert!(t.allocate_slots(&mut p, rid(1), &call, &mut out).unwrap());
        assert_eq!(out, vec![1, 2, 3]);
        assert_eq!(t.num_cached_blocks(rid(1)), Some(2));
        assert_eq!(p.num_cached_blocks(), 2);
        assert_eq!(t.take_new_block_ids(), vec![1, 2, 3]);
        t.free(&mut p, rid(1)).unwrap();
        // Tail first: the uncached block 3 goes to the front, the cached ones to the back.
        let free: Vec<u32> = p.free_block_ids().collect();
        assert_eq!(&free[..1], &[3]);
        assert_eq!(&free[free.len() - 2..], &[2, 1]);
        t.check_invariants(&p).unwrap();
    }

    #[test]
    fn hits_are_adopted_once_and_only_before_running() {
        let (mut t, mut p) = tables(16);
        let h = hashes(2);
        let slice = HashSlice::new(&h, 8).unwrap();
        let mut out = Vec::new();
        t.allocate_slots(&mut p, rid(1), &SlotCall::new(0, 9, slice, 9), &mut out)
            .unwrap();
        let mut hits = Vec::new();
        p.find_longest_cache_hit(slice, 0, Some(2), &mut hits)
            .unwrap();
        assert_eq!(hits, vec![1, 2]);
        let call = SlotCall {
            num_new_computed_tokens: 8,
            new_computed_blocks: Some(&hits),
            ..SlotCall::new(0, 9, slice, 1)
        };
        out.clear();
        assert!(t.allocate_slots(&mut p, rid(2), &call, &mut out).unwrap());
        assert_eq!(out.len(), 1);
        assert_eq!(t.blocks(rid(2))[..2], [1, 2]);
        assert_eq!(p.ref_count(1).unwrap(), 2);
        // Running now: new hits are refused and nothing changes.
        let before: Vec<u32> = p.ref_counts().collect();
        assert!(t.allocate_slots(&mut p, rid(2), &call, &mut out).is_err());
        assert_eq!(before, p.ref_counts().collect::<Vec<_>>());
        t.check_invariants(&p).unwrap();
    }

    #[test]
    fn gates_refuse_without_changing_anything() {
        let (mut t, mut p) = tables(5); // 4 usable blocks
        let mut out = Vec::new();
        let full = SlotCall {
            full_sequence_must_fit: true,
            ..SlotCall::new(0, 40, HashSlice::empty(), 4)
        };
        assert!(!t.allocate_slots(&mut p, rid(1), &full, &mut out).unwrap());
        let reserved = SlotCall {
            reserved_blocks: 2,
            ..SlotCall::new(0, 12, HashSlice::empty(), 12)
        };
        assert!(!t
            .allocate_slots(&mut p, rid(1), &reserved, &mut out)
            .unwrap());
        let watermark = SlotCall {
            watermark_blocks: 1,
            ..SlotCall::new(0, 16, HashSlice::empty(), 16)
        };
        assert!(!t
            .allocate_slots(&mut p, rid(1), &watermark, &mut out)
            .unwrap());
        assert!(out.is_empty() && t.blocks(rid(1)).is_empty());
        assert_eq!(p.num_free_blocks(), 4);
        assert!(t
            .allocate_slots(
                &mut p,
                rid(1),
                &SlotCall::new(0, 16, HashSlice::empty(), 0),
                &mut out
            )
            .is_err());
    }

    #[test]
    fn external_tokens_get_blocks_outside_the_result() {
        let (mut t, mut p) = tables(16);
        let call = SlotCall {
            num_external_computed_tokens: 8,
            ..SlotCall::new(0, 12, HashSlice::empty(), 4)
        };
        let mut out = Vec::new();
        assert!(t.allocate_slots(&mut p, rid(1), &call, &mut out).unwrap());
        assert_eq!(out, vec![3]);
        assert_eq!(t.blocks(rid(1)), &[1, 2, 3]);
    }

    #[test]
    fn hashes_cross_once_and_gaps_are_refused() {
        let (mut t, mut p) = tables(16);
        let h = hashes(3);
        let mut out = Vec::new();
        let first = SlotCall::new(0, 8, HashSlice::new(&h[..16], 8).unwrap(), 8);
        t.allocate_slots(&mut p, rid(1), &first, &mut out).unwrap();
        assert_eq!(t.num_known_hashes(rid(1)), 2);
        // The third hash alone, from index 2; then a repeat with overlap is skipped.
        let third = HashSlice::new(&h[16..], 8).unwrap();
        t.cache_blocks(&mut p, rid(1), 2, third, 8, None, &LoraInfo::default())
            .unwrap();
        assert_eq!(t.num_known_hashes(rid(1)), 3);
        t.cache_blocks(
            &mut p,
            rid(1),
            0,
            HashSlice::new(&h, 8).unwrap(),
            8,
            None,
            &LoraInfo::default(),
        )
        .unwrap();
        assert_eq!(t.num_known_hashes(rid(1)), 3);
        assert!(t
            .cache_blocks(&mut p, rid(1), 5, third, 8, None, &LoraInfo::default())
            .is_err());
        let other = [9u8; 16];
        assert!(t
            .cache_blocks(
                &mut p,
                rid(1),
                3,
                HashSlice::new(&other, 16).unwrap(),
                8,
                None,
                &LoraInfo::default()
            )
            .is_err());
        t.check_invariants(&p).unwrap();
    }
}
