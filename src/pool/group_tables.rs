//! Block tables for several KV-cache groups over one pool: vLLM 0.33's
//! `KVCacheManager` over a `HybridKVCacheCoordinator` (or a unitary one), with
//! full-attention, sliding-window and chunked-local groups, for a caller that
//! owns its requests (the scheduler passes each request's counts and block
//! hashes in, as with [`super::BlockTables`]).
//!
//! What the groups add to one full-attention table:
//! - a request's table per group, where a sliding-window or chunked-local group
//!   gives back the blocks that fell out of its window
//!   ([`GroupTables::remove_skipped_blocks`]), the null block taking their place;
//! - one prefix hit valid for every group (`group_hits.rs`);
//! - per-group caching, a sliding-window group caching only the blocks a later
//!   hit can use (`retention.rs`);
//! - admission that counts what each group will hold.
//!
//! Not covered (vLLM features beyond these three kinds): EAGLE's last-block
//! drop, decode/prefill context parallelism, Mamba and cross-attention groups,
//! groups of different block sizes (partial tail blocks), partial-hit
//! copy-on-write.
//!
//! Every input is checked before anything changes. As in vLLM, a refused
//! allocation (`Ok(None)`) may still have given back out-of-window blocks: that
//! happens before the pool is asked.

use hashbrown::HashMap;

use super::block_pool::{BlockPool, CacheBlocks};
use super::error::{PoolError, PoolResult};
use super::eviction::BlockPriority;
use super::group_hits::{find_longest_hit, GroupHit};
use super::group_steps::{allocate_external, check_hit_boundary, grow_to};
use super::hash_key::HashSlice;
use super::known_hashes::{check_event_tokens, KnownHashes, KnowsHashes};
use super::kv_groups::{AttentionKind, KvGroups};
use super::manager::{event_extra_keys, LoraInfo};
use super::partial_keys::PartialBlock;
use super::request_id::{RequestId, RequestKey};
use super::retention::{reachable_block_mask, replay_boundary};
use super::slots;
use super::tracker::SequenceExtras;

/// Blocks per group, flat: group `g`'s are `flat[offsets[g]..offsets[g + 1]]`.
#[derive(Clone, Copy, Debug)]
pub struct GroupBlocks<'a> {
    /// All groups' blocks back to back.
    pub flat: &'a [u32],
    /// `num_groups + 1` increasing offsets into `flat`, from 0.
    pub offsets: &'a [usize],
}

impl<'a> GroupBlocks<'a> {
    /// Group `g`'s blocks.
    pub fn group(&self, g: usize) -> &'a [u32] {
        &self.flat[self.offsets[g]..self.offsets[g + 1]]
    }

    /// Number of groups.
    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// True with no groups.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when no group has a block.
    pub fn no_blocks(&self) -> bool {
        self.flat.is_empty()
    }
}

/// One `allocate_slots` call: the request as the scheduler holds it and vLLM's
/// arguments.
#[derive(Clone, Copy, Debug)]
pub struct GroupSlotCall<'a> {
    /// `request.num_computed_tokens`.
    pub num_computed_tokens: usize,
    /// `request.num_tokens`.
    pub num_tokens: usize,
    /// `request.num_prompt_tokens` (where a resend's hit would stop).
    pub num_prompt_tokens: usize,
    /// `request.num_in_flight_tokens` (scheduled, not yet processed: their
    /// window is still read, so blocks below it are not given back yet).
    pub num_in_flight_tokens: usize,
    /// `request.shared_prefix_boundary` (0: none).
    pub shared_prefix_boundary: usize,
    /// `request.block_hashes[hashes_from..]`.
    pub block_hashes: HashSlice<'a>,
    /// Index in `request.block_hashes` of `block_hashes[0]`.
    pub hashes_from: usize,
    /// Tokens to compute this step.
    pub num_new_tokens: usize,
    /// Tokens of `new_computed_blocks`.
    pub num_new_computed_tokens: usize,
    /// The prefix hit to adopt, per group; `None` for vLLM's empty sentinel.
    pub new_computed_blocks: Option<GroupBlocks<'a>>,
    /// Speculative slots beyond the new tokens.
    pub num_lookahead_tokens: usize,
    /// Tokens a KV connector provides, after the local hits.
    pub num_external_computed_tokens: usize,
    /// Do not cache the blocks now.
    pub delay_cache_blocks: bool,
    /// Allocate only if the whole request would fit.
    pub full_sequence_must_fit: bool,
    /// Free blocks to leave for other requests.
    pub reserved_blocks: usize,
    /// Further free blocks to leave (the watermark for waiting requests).
    pub watermark_blocks: usize,
    /// The request's token ids, for `BlockStored` events.
    pub token_ids: Option<&'a [i64]>,
    /// The request's LoRA, for `BlockStored` events.
    pub lora: &'a LoraInfo,
    /// The request's extra keys, for `BlockStored` events beyond the LoRA-only form
    /// (multimodal inputs, cache salt, prompt embeddings); `None`: LoRA only.
    pub extras: Option<&'a SequenceExtras>,
    /// The retention priority of the blocks the request caches or hits (hits are only
    /// raised); `None`: the default.
    pub priority: Option<BlockPriority>,
    /// Groups (by index) whose connector blocks (for `num_external_computed_tokens`)
    /// are left out of the blocks recorded for zeroing: an async load writes them
    /// after this step, which zeroing would race (vLLM's `skip_zeroing_group_ids`).
    pub skip_zeroing_groups: &'a [usize],
}

/// No LoRA.
static NO_LORA: LoraInfo = LoraInfo {
    id: None,
    name: None,
};

impl<'a> GroupSlotCall<'a> {
    /// A call for `num_new_tokens` of a request with no hits, lookahead,
    /// connector or gates, nothing in flight.
    pub fn new(
        num_computed_tokens: usize,
        num_tokens: usize,
        block_hashes: HashSlice<'a>,
        num_new_tokens: usize,
    ) -> Self {
        Self {
            num_computed_tokens,
            num_tokens,
            num_prompt_tokens: num_tokens,
            num_in_flight_tokens: 0,
            shared_prefix_boundary: 0,
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
            lora: &NO_LORA,
            extras: None,
            priority: None,
            skip_zeroing_groups: &[],
        }
    }
}

/// One request: a table per group, and its block hashes.
#[derive(Clone, Debug)]
pub(super) struct Table {
    pub(super) blocks: Vec<Vec<u32>>,
    /// vLLM's per-manager `num_cached_block[request_id]`.
    pub(super) num_cached: Vec<Option<usize>>,
    hashes: KnownHashes,
}

impl Table {
    pub(super) fn new(num_groups: usize) -> Self {
        Self {
            blocks: vec![Vec::new(); num_groups],
            num_cached: vec![None; num_groups],
            hashes: KnownHashes::default(),
        }
    }

    /// A request some group tracks as running takes no new hits.
    pub(super) fn running(&self) -> bool {
        self.num_cached.iter().any(Option::is_some)
    }
}

/// Block tables for the groups of one layout.
#[derive(Debug)]
pub struct GroupTables {
    pub(super) layout: KvGroups,
    pub(super) tables: HashMap<RequestId, Table>,
    max_model_len: usize,
    max_in_flight_tokens: usize,
    /// Per group, the blocks allocated since the last take, when recording.
    pub(super) new_block_ids: Option<Vec<Vec<u32>>>,
}

impl KnowsHashes for GroupTables {
    fn known_hashes_of(&self, id: RequestKey<'_>) -> Option<&KnownHashes> {
        self.tables.get(&id).map(|t| &t.hashes)
    }

    fn forget_known_hashes_from(&mut self, id: RequestKey<'_>, n: usize) {
        if let Some(t) = self.tables.get_mut(&id) {
            t.hashes.truncate(n);
        }
    }
}

impl GroupTables {
    /// Empty tables for `layout`, sequences of at most `max_model_len` tokens and
    /// at most `max_in_flight_tokens` scheduled but unprocessed (the admission
    /// cap of window groups); `record_new_block_ids` keeps new blocks' ids for
    /// zeroing.
    pub fn new(
        layout: KvGroups,
        max_model_len: usize,
        max_in_flight_tokens: usize,
        record_new_block_ids: bool,
    ) -> PoolResult<Self> {
        if max_model_len == 0 {
            return Err(PoolError::InvalidArgument(
                "max_model_len must be at least 1".into(),
            ));
        }
        let n = layout.len();
        Ok(Self {
            layout,
            tables: HashMap::new(),
            max_model_len,
            max_in_flight_tokens,
            new_block_ids: record_new_block_ids.then(|| vec![Vec::new(); n]),
        })
    }

    /// The layout.
    pub fn layout(&self) -> &KvGroups {
        &self.layout
    }

    /// Longest sequence a request may reach.
    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    /// The request's blocks in group `g` (empty for an unknown request).
    pub fn blocks(&self, id: RequestKey<'_>, g: usize) -> &[u32] {
        self.tables
            .get(&id)
            .and_then(|t| t.blocks.get(g))
            .map_or(&[], Vec::as_slice)
    }

    /// How many of the request's group-`g` blocks are cached (`None`: not tracked).
    pub fn num_cached_blocks(&self, id: RequestKey<'_>, g: usize) -> Option<usize> {
        self.tables
            .get(&id)
            .and_then(|t| t.num_cached.get(g).copied().flatten())
    }

    /// How many of the request's block hashes the tables hold.
    pub fn num_known_hashes(&self, id: RequestKey<'_>) -> usize {
        self.tables.get(&id).map_or(0, |t| t.hashes.len())
    }

    /// vLLM's `estimate_cached_tokens`: per group, the end of the request's last
    /// cached block (a block cached at table index `i` holds `(i + 1) * block_size`
    /// tokens of the chain); the least over the groups, 0 for an unknown request.
    pub fn estimate_cached_tokens(&self, pool: &BlockPool, id: RequestKey<'_>) -> usize {
        let Some(table) = self.tables.get(&id) else {
            return 0;
        };
        let null = pool.null_block();
        self.layout
            .specs()
            .iter()
            .zip(&table.blocks)
            .map(|(spec, blocks)| {
                blocks
                    .iter()
                    .rposition(|&b| {
                        Some(b) != null && pool.block_hash(b).is_ok_and(|k| k.is_some())
                    })
                    .map_or(0, |i| (i + 1) * spec.block_size)
            })
            .min()
            .unwrap_or(0)
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

    pub(super) fn null(pool: &BlockPool) -> PoolResult<u32> {
        pool.null_block().ok_or_else(|| {
            PoolError::InvalidArgument(
                "KV-cache groups need a pool with a null block (null_block=True)".into(),
            )
        })
    }

    /// vLLM's `get_computed_blocks` hit search: the longest prefix of `hashes`
    /// (at most `max_length` tokens) cached for every group. Without prefix
    /// caching, no hit.
    pub fn find_longest_cache_hit(
        &self,
        pool: &BlockPool,
        hashes: HashSlice<'_>,
        max_length: usize,
    ) -> PoolResult<GroupHit> {
        Self::null(pool)?;
        if !pool.config().enable_caching {
            return Ok(GroupHit {
                blocks: vec![Vec::new(); self.layout.len()],
                ..GroupHit::default()
            });
        }
        if let Some(w) = pool.hash_width() {
            if !hashes.is_empty() && hashes.width() != w {
                return Err(PoolError::HashWidth {
                    expected: Some(w),
                    got: hashes.width(),
                });
            }
        }
        if max_length > self.max_model_len {
            // A chunked-local group pads its hit with a null block per skipped block.
            return Err(PoolError::InvalidArgument(format!(
                "max_length {max_length} is longer than max_model_len {}",
                self.max_model_len
            )));
        }
        Ok(find_longest_hit(pool, &self.layout, hashes, max_length))
    }

    /// vLLM's `get_num_blocks_to_allocate` for group `g`, the blocks it needs for
    /// `num_tokens` held at most `cap` at a time (vLLM's admission cap) when given.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn group_blocks_to_allocate(
        &self,
        pool: &BlockPool,
        table: Option<&Table>,
        g: usize,
        num_tokens: usize,
        hits: &[u32],
        total_computed: usize,
        cap: Option<usize>,
    ) -> usize {
        let spec = &self.layout.specs()[g];
        let bs = spec.block_size;
        let mut required = num_tokens.div_ceil(bs);
        if let Some(cap) = cap {
            required = required.min(cap);
        }
        let held = table.map_or(0, |t| t.blocks[g].len());
        if table.is_some_and(|t| t.num_cached[g].is_some()) {
            return required.saturating_sub(held);
        }
        let skipped = spec.num_skipped_tokens(total_computed) / bs;
        let new = required.saturating_sub(skipped.max(hits.len() + held));
        let from = skipped.saturating_sub(held).min(hits.len());
        new + slots::evictable(pool, &hits[from..])
    }

    /// The sum of [`Self::group_blocks_to_allocate`] over the groups.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn blocks_to_allocate(
        &self,
        pool: &BlockPool,
        table: Option<&Table>,
        num_tokens: usize,
        hits: Option<GroupBlocks<'_>>,
        total_computed: usize,
        apply_cap: bool,
    ) -> usize {
        (0..self.layout.len())
            .map(|g| {
                let h = hits.map_or(&[][..], |h| h.group(g));
                let cap = apply_cap
                    .then(|| {
                        self.layout.specs()[g]
                            .admission_cap(self.max_in_flight_tokens, self.max_model_len)
                    })
                    .flatten();
                self.group_blocks_to_allocate(pool, table, g, num_tokens, h, total_computed, cap)
            })
            .sum()
    }

    /// Checks a call's inputs; nothing has changed yet.
    fn check_call(
        &self,
        pool: &BlockPool,
        table: Option<&Table>,
        call: &GroupSlotCall<'_>,
    ) -> PoolResult<()> {
        Self::null(pool)?;
        KnownHashes::check(
            table.map(|t| &t.hashes),
            pool,
            call.hashes_from,
            call.block_hashes,
        )?;
        // The token counts add up within an int64 (`allocate_slots` sums them, and the
        // group manager keeps the sum as the request's computed tokens).
        super::step::token_sum(&[
            call.num_computed_tokens,
            call.num_new_computed_tokens,
            call.num_external_computed_tokens,
            call.num_new_tokens,
            call.num_lookahead_tokens,
        ])
        .ok_or_else(|| {
            PoolError::InvalidArgument(
                "the computed, new and lookahead token counts add up past 2**63 - 1".into(),
            )
        })?;
        if call.num_new_tokens == 0
            && call.num_external_computed_tokens == 0
            && call.num_new_computed_tokens == 0
        {
            return Err(PoolError::InvalidArgument(
                "num_new_tokens must be greater than 0 when there are no computed tokens to adopt"
                    .into(),
            ));
        }
        let Some(hits) = call.new_computed_blocks else {
            return Ok(());
        };
        super::block_pool::check_offsets(hits.offsets, hits.flat.len())?;
        if hits.len() != self.layout.len() {
            return Err(PoolError::InvalidArgument(format!(
                "new_computed_blocks has {} groups, the layout {}",
                hits.len(),
                self.layout.len()
            )));
        }
        if hits.no_blocks() {
            return Ok(());
        }
        if table.is_some_and(Table::running) {
            return Err(PoolError::InvalidArgument(
                "a running request takes no new computed blocks".into(),
            ));
        }
        if table.is_some_and(|t| t.blocks.iter().any(|b| !b.is_empty())) {
            return Err(PoolError::InvalidArgument(
                "new computed blocks are adopted only by a request without blocks".into(),
            ));
        }
        if !pool.config().enable_caching {
            return Err(PoolError::CachingDisabled);
        }
        pool.check_ids(hits.flat)?;
        let num_local = call.num_computed_tokens + call.num_new_computed_tokens;
        for (g, spec) in self.layout.specs().iter().enumerate() {
            if !hits.group(g).is_empty() {
                check_hit_boundary(spec, num_local)?;
            }
        }
        Ok(())
    }

    /// vLLM's `allocate_slots`: `Ok(Some(n))` with each group's new blocks
    /// appended to `out` (group `g`'s at `out[offsets[g]..offsets[g + 1]]`, the
    /// `n + 1` offsets pushed to `offsets`), `Ok(None)` when they do not fit.
    pub fn allocate_slots(
        &mut self,
        pool: &mut BlockPool,
        id: RequestKey<'_>,
        call: &GroupSlotCall<'_>,
        out: &mut Vec<u32>,
        offsets: &mut Vec<usize>,
    ) -> PoolResult<bool> {
        self.check_call(pool, self.tables.get(&id), call)?;
        let null = Self::null(pool)?;
        let max_len = self.max_model_len;
        let num_local = call.num_computed_tokens + call.num_new_computed_tokens;
        let total = (num_local + call.num_external_computed_tokens).min(max_len);
        let free = pool.num_free_blocks() as i128;
        if call.full_sequence_must_fit {
            let full = call.num_tokens.min(max_len);
            let need = self.blocks_to_allocate(
                pool,
                self.tables.get(&id),
                full,
                call.new_computed_blocks,
                total,
                true,
            );
            if (need + call.watermark_blocks) as i128 > free {
                return Ok(false);
            }
        }
        let main = total + call.num_new_tokens;
        let need_slots = (main + call.num_lookahead_tokens).min(max_len);
        // Out-of-window blocks go back first, even if the call is then refused.
        self.remove_skipped_blocks(pool, id, total.saturating_sub(call.num_in_flight_tokens))?;
        let table = self.tables.get(&id);
        let need = self.blocks_to_allocate(
            pool,
            table,
            need_slots,
            call.new_computed_blocks,
            num_local + call.num_external_computed_tokens,
            false,
        );
        if !call.delay_cache_blocks {
            // The tokens of the blocks this call caches (a hybrid layout caches whole hit
            // steps), for the events.
            let known = KnownHashes::len_after(
                table.map(|t| &t.hashes),
                call.hashes_from,
                call.block_hashes,
            );
            let mut cached_to = (total + call.num_new_tokens)
                .min(call.num_tokens)
                .min(known.saturating_mul(self.layout.hash_block_size()));
            if self.layout.len() > 1 {
                let sbs = self.layout.scheduler_block_size();
                cached_to = cached_to / sbs * sbs;
            }
            let sizes = self.layout.specs().iter().map(|s| s.block_size);
            check_event_tokens(pool, call.token_ids, cached_to, sizes)?;
        }
        let free = pool.num_free_blocks() as i128;
        if need.saturating_add(call.watermark_blocks) as i128 > free - call.reserved_blocks as i128
        {
            return Ok(false);
        }
        // From here on nothing fails: the inputs are checked and the blocks fit.
        let Self {
            layout,
            tables,
            new_block_ids,
            ..
        } = self;
        let specs = layout.specs();
        let table = tables
            .entry_ref(&id)
            .or_insert_with(|| Table::new(specs.len()));
        table.hashes.learn(call.hashes_from, call.block_hashes);
        let mut first_new: Vec<usize> = table.blocks.iter().map(Vec::len).collect();
        let adopting = call.new_computed_blocks.is_some() || call.num_external_computed_tokens > 0;
        if adopting && !table.running() {
            let ext = call.num_external_computed_tokens;
            // Every group's hits are taken before any connector block is
            // allocated, so no allocation can evict another group's hit.
            for (g, spec) in specs.iter().enumerate() {
                let hits = call.new_computed_blocks.map_or(&[][..], |h| h.group(g));
                table.adopt_hits(pool, g, spec, hits, num_local + ext, null, call.priority)?;
            }
            first_new = table.blocks.iter().map(Vec::len).collect();
            if ext > 0 {
                for (g, spec) in specs.iter().enumerate() {
                    allocate_external(pool, spec, &mut table.blocks[g], num_local, ext)?;
                    if call.skip_zeroing_groups.contains(&g) {
                        first_new[g] = table.blocks[g].len();
                    }
                }
            }
        }
        offsets.push(out.len());
        for (g, spec) in specs.iter().enumerate() {
            let blocks = &mut table.blocks[g];
            let start = out.len();
            grow_to(pool, spec, blocks, need_slots, out)?;
            blocks.extend_from_slice(&out[start..]);
            offsets.push(out.len());
            if let Some(ids) = new_block_ids {
                ids[g].extend_from_slice(&blocks[first_new[g]..]);
            }
        }
        if !call.delay_cache_blocks {
            let num_tokens = (total + call.num_new_tokens).min(call.num_tokens);
            Self::cache_table(
                layout,
                pool,
                table,
                num_tokens,
                call.num_prompt_tokens,
                call.shared_prefix_boundary,
                call.token_ids,
                call.lora,
                call.extras,
                call.priority,
            )?;
        }
        Ok(true)
    }

    /// vLLM's coordinator `cache_blocks`: caches each group's blocks full within
    /// the first `num_tokens` tokens (a sliding-window group only those a later
    /// hit can use).
    #[allow(clippy::too_many_arguments)]
    pub fn cache_blocks(
        &mut self,
        pool: &mut BlockPool,
        id: RequestKey<'_>,
        hashes_from: usize,
        block_hashes: HashSlice<'_>,
        num_tokens: usize,
        num_prompt_tokens: usize,
        shared_prefix_boundary: usize,
        token_ids: Option<&[i64]>,
        lora: &LoraInfo,
    ) -> PoolResult<()> {
        KnownHashes::check(
            self.tables.get(&id).map(|t| &t.hashes),
            pool,
            hashes_from,
            block_hashes,
        )?;
        let Some(table) = self.tables.get_mut(&id) else {
            return Ok(());
        };
        table.hashes.learn(hashes_from, block_hashes);
        Self::cache_table(
            &self.layout,
            pool,
            table,
            num_tokens,
            num_prompt_tokens,
            shared_prefix_boundary,
            token_ids,
            lora,
            None,
            None,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn cache_table(
        layout: &KvGroups,
        pool: &mut BlockPool,
        table: &mut Table,
        num_tokens: usize,
        num_prompt_tokens: usize,
        shared_prefix_boundary: usize,
        token_ids: Option<&[i64]>,
        lora: &LoraInfo,
        extras: Option<&SequenceExtras>,
        priority: Option<BlockPriority>,
    ) -> PoolResult<()> {
        if !pool.config().enable_caching {
            return Ok(());
        }
        let sbs = layout.scheduler_block_size();
        // A hybrid layout caches whole hit steps only; one group, every block.
        let cacheable = if layout.len() > 1 {
            num_tokens / sbs * sbs
        } else {
            num_tokens
        };
        let known_tokens = table.hashes.as_slice().len() * layout.hash_block_size();
        let mut boundaries = vec![replay_boundary(num_prompt_tokens)];
        if shared_prefix_boundary > 0 {
            boundaries.push(shared_prefix_boundary);
        }
        for (g, spec) in layout.specs().iter().enumerate() {
            let bs = spec.block_size;
            let num_cached = table.num_cached[g].unwrap_or(0);
            let num_full = (cacheable.min(known_tokens) / bs).min(table.blocks[g].len());
            if num_cached < num_full {
                Self::cache_group(
                    layout,
                    pool,
                    table,
                    g,
                    num_cached,
                    num_full,
                    &boundaries,
                    token_ids,
                    lora,
                    extras,
                    priority,
                )?;
            }
            Self::cache_partial_tail(
                layout,
                pool,
                table,
                g,
                cacheable,
                num_prompt_tokens,
                token_ids,
                lora,
                extras,
            )?;
        }
        Ok(())
    }

    /// One group's blocks `num_cached..num_full` into the prefix cache (a sliding-window
    /// group's only where a later hit can use them), at the group's block size.
    #[allow(clippy::too_many_arguments)]
    fn cache_group(
        layout: &KvGroups,
        pool: &mut BlockPool,
        table: &mut Table,
        g: usize,
        num_cached: usize,
        num_full: usize,
        boundaries: &[usize],
        token_ids: Option<&[i64]>,
        lora: &LoraInfo,
        extras: Option<&SequenceExtras>,
        priority: Option<BlockPriority>,
    ) -> PoolResult<()> {
        let spec = &layout.specs()[g];
        let (bs, sbs) = (spec.block_size, layout.scheduler_block_size());
        let hashes = table.hashes.as_slice();
        let mask = match spec.kind {
            AttentionKind::SlidingWindow { .. } => reachable_block_mask(
                spec,
                num_cached,
                num_full,
                sbs,
                layout.retention_interval(),
                boundaries,
            ),
            _ => None,
        };
        let extra_keys = extras
            .filter(|_| pool.config().enable_events)
            .and_then(|e| event_extra_keys(e, num_cached..num_full, bs));
        let mut buf = Vec::new();
        let view = hashes.every(layout.scale(g), &mut buf);
        let call = CacheBlocks {
            block_ids: &table.blocks[g],
            block_hashes: view,
            num_cached_blocks: num_cached,
            num_full_blocks: num_full,
            group: layout.pool_group(g),
            token_ids: if pool.config().enable_events {
                token_ids
            } else {
                None
            },
            lora_id: lora.id,
            lora_name: lora.name.as_deref(),
            block_mask: mask.as_deref(),
            priority,
            extra_keys: extra_keys.as_deref(),
            block_size: Some(bs as u32),
        };
        pool.cache_full_blocks(call)?;
        table.num_cached[g] = Some(num_full);
        Ok(())
    }

    /// vLLM 0.33's `FullAttentionManager._cache_partial_tail_block`: a full-attention
    /// group whose blocks are larger than the hash granularity also caches the block
    /// holding the prompt's last hash boundary (short of its last token) under the hash
    /// at that boundary, once the request has computed that far.
    #[allow(clippy::too_many_arguments)]
    fn cache_partial_tail(
        layout: &KvGroups,
        pool: &mut BlockPool,
        table: &Table,
        g: usize,
        num_tokens: usize,
        num_prompt_tokens: usize,
        token_ids: Option<&[i64]>,
        lora: &LoraInfo,
        extras: Option<&SequenceExtras>,
    ) -> PoolResult<()> {
        let spec = &layout.specs()[g];
        let (bs, hbs) = (spec.block_size, layout.hash_block_size());
        if bs == hbs || !spec.is_full() {
            return Ok(());
        }
        let hashes = table.hashes.as_slice();
        let boundary = (num_prompt_tokens.saturating_sub(1) / hbs).min(hashes.len()) * hbs;
        if boundary == 0 || boundary > num_tokens || boundary % bs == 0 {
            return Ok(());
        }
        let Some(&block_id) = table.blocks[g].get(boundary / bs) else {
            return Ok(());
        };
        let n = boundary / hbs;
        let start = (n - 1) * hbs;
        let events = pool.config().enable_events;
        let event_keys = extras.filter(|_| events).map(|e| {
            let inputs = e.inputs();
            let mut cursor = inputs.mm_cursor(n - 1, hbs);
            inputs
                .block_keys(n - 1, hbs, &mut cursor)
                .and_then(|keys| keys.event_keys())
        });
        let window = token_ids
            .filter(|t| events && t.len() >= boundary)
            .map_or(&[][..], |t| &t[start..boundary]);
        pool.cache_partial_block(PartialBlock {
            block_id,
            hash: hashes.block_hash(n - 1),
            group: layout.pool_group(g),
            num_tokens: boundary as u32,
            parent: (n > 1).then(|| hashes.block_hash(n - 2)),
            token_ids: window,
            hash_block_size: hbs as u32,
            lora_id: lora.id,
            lora_name: lora.name.as_deref(),
            extra_keys: event_keys,
        })
    }

    /// vLLM's `remove_skipped_blocks`: gives back each group's blocks that no
    /// longer serve attention once `processed_tokens` are computed (tail first
    /// within a group), the null block taking their place.
    pub fn remove_skipped_blocks(
        &mut self,
        pool: &mut BlockPool,
        id: RequestKey<'_>,
        processed_tokens: usize,
    ) -> PoolResult<()> {
        let null = Self::null(pool)?;
        let Some(table) = self.tables.get_mut(&id) else {
            return Ok(());
        };
        let mut freed = Vec::new();
        for (g, spec) in self.layout.specs().iter().enumerate() {
            let skipped = spec.num_skipped_tokens(processed_tokens);
            if skipped == 0 {
                continue;
            }
            let blocks = &mut table.blocks[g];
            let n = (skipped / spec.block_size).min(blocks.len());
            freed.clear();
            for slot in blocks[..n].iter_mut().rev() {
                if *slot == null {
                    break;
                }
                freed.push(std::mem::replace(slot, null));
            }
            if !freed.is_empty() {
                pool.free_blocks(&freed)?;
            }
        }
        Ok(())
    }

    /// vLLM's `free`: each group's blocks tail first, group by group, all or
    /// nothing; forgets the request (an unknown one is a no-op).
    pub fn free(&mut self, pool: &mut BlockPool, id: RequestKey<'_>) -> PoolResult<()> {
        let Some(table) = self.tables.remove(&id) else {
            return Ok(());
        };
        let mut offsets = Vec::with_capacity(table.blocks.len() + 1);
        let mut flat = Vec::new();
        offsets.push(0);
        for blocks in &table.blocks {
            flat.extend_from_slice(blocks);
            offsets.push(flat.len());
        }
        pool.free_blocks_many(&flat, &offsets, true)
            .inspect_err(|_| drop(self.tables.insert(RequestId::from(&id), table)))
    }

    /// vLLM's `record_blocks_for_zeroing`: request `id`'s blocks from token
    /// `start_token` on, in every group, are recorded for zeroing again, as blocks a
    /// failed async load left unwritten are. `start_token` must be at a block
    /// boundary of every group (nothing is recorded otherwise). Nothing when not
    /// recording or for an unknown request.
    pub fn record_blocks_for_zeroing(
        &mut self,
        id: RequestKey<'_>,
        start_token: usize,
    ) -> PoolResult<()> {
        let Some(ids) = &mut self.new_block_ids else {
            return Ok(());
        };
        let specs = self.layout.specs();
        if let Some(spec) = specs.iter().find(|s| start_token % s.block_size != 0) {
            return Err(PoolError::InvalidArgument(format!(
                "start_token {start_token} is not at a block boundary (block size {})",
                spec.block_size
            )));
        }
        if let Some(table) = self.tables.get(&id) {
            for (g, spec) in specs.iter().enumerate() {
                ids[g].extend(table.blocks[g].iter().skip(start_token / spec.block_size));
            }
        }
        Ok(())
    }

    /// The ids of blocks allocated since the last call, group by group (empty
    /// unless recording).
    pub fn take_new_block_ids(&mut self) -> Vec<u32> {
        self.new_block_ids
            .as_mut()
            .map(|groups| groups.iter_mut().flat_map(std::mem::take).collect())
            .unwrap_or_default()
    }

    /// Checks the pool and that the tables hold no more references than the pool
    /// counts.
    pub fn check_invariants(&self, pool: &BlockPool) -> Result<(), Vec<String>> {
        let mut problems = pool.check_invariants().err().unwrap_or_default();
        slots::check_holders(
            pool,
            self.tables.values().flat_map(|t| t.blocks.iter().flatten()),
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
    use crate::pool::{GroupSpec, PoolConfig};

    const BS: usize = 4;

    fn setup(specs: Vec<GroupSpec>, num_blocks: u32) -> (GroupTables, BlockPool) {
        let mut config = PoolConfig::new(num_blocks);
        config.block_size = BS as u32;
        let layout = KvGroups::new(specs, BS, None).unwrap();
        (
            GroupTables::new(layout, 1024, 1024, false).unwrap(),
            BlockPool::new(config).unwrap(),
        )
    }

    fn hashes(n: usize) -> Vec<u8> {
        (0..n).flat_map(|i| [i as u8 + 1; 8]).collect()
    }

    fn allocate(
        t: &mut GroupTables,
        p: &mut BlockPool,
        call: &GroupSlotCall<'_>,
    ) -> Option<Vec<Vec<u32>>> {
        let (mut out, mut offsets) = (Vec::new(), Vec::new());
        t.allocate_slots(p, RequestKey::Int(1), call, &mut out, &mut offsets)
            .unwrap()
            .then(|| {
                offsets
                    .windows(2)
                    .map(|w| out[w[0]..w[1]].to_vec())
                    .collect()
            })
    }

    #[test]
    fn a_window_group_gives_back_blocks_it_no_longer_attends_to() {
        let specs = vec![GroupSpec::full(BS), GroupSpec::sliding_window(BS, 8)];
        let (mut t, mut p) = setup(specs, 32);
        let h = hashes(5);
        let call = GroupSlotCall::new(0, 21, HashSlice::new(&h, 8).unwrap(), 21);
        let new = allocate(&mut t, &mut p, &call).unwrap();
        assert_eq!(new, vec![vec![1, 2, 3, 4, 5, 6], vec![7, 8, 9, 10, 11, 12]]);
        let free = p.num_free_blocks();
        // 21 tokens computed: the next one attends to tokens 14..21, so the window
        // group's blocks 0..3 (tokens 0..12) go back, the null block in their place.
        t.remove_skipped_blocks(&mut p, RequestKey::Int(1), 21)
            .unwrap();
        assert_eq!(t.blocks(RequestKey::Int(1), 1), &[0, 0, 0, 10, 11, 12]);
        assert_eq!(t.blocks(RequestKey::Int(1), 0), &[1, 2, 3, 4, 5, 6]);
        assert_eq!(p.num_free_blocks(), free + 3);
        t.check_invariants(&p).unwrap();
        t.free(&mut p, RequestKey::Int(1)).unwrap();
        assert_eq!(p.num_free_blocks(), 31);
    }

    #[test]
    fn a_hit_is_valid_for_every_group() {
        let specs = vec![GroupSpec::full(BS), GroupSpec::sliding_window(BS, 5)];
        let (mut t, mut p) = setup(specs, 32);
        let h = hashes(4);
        let slice = HashSlice::new(&h, 8).unwrap();
        allocate(&mut t, &mut p, &GroupSlotCall::new(0, 17, slice, 17)).unwrap();
        t.free(&mut p, RequestKey::Int(1)).unwrap();
        // All four blocks cached in both groups: a resend of 17 tokens hits 16; the
        // window group needs only the block before the end (window 5 -> 1 block).
        let hit = t.find_longest_cache_hit(&p, slice, 16).unwrap();
        assert_eq!(hit.num_tokens, 16);
        assert_eq!(hit.blocks[0].len(), 4);
        assert_eq!(hit.blocks[1][..3], [0, 0, 0]);
        // The window group lost its last block: the hit falls back to where it
        // still has one, and full attention is cut to match.
        let mut p2 = p;
        let last = hit.blocks[1][3];
        p2.touch(&[last]).unwrap();
        p2.free_blocks(&[last]).unwrap();
        p2.evict_blocks(&[last]).unwrap();
        let hit = t.find_longest_cache_hit(&p2, slice, 16).unwrap();
        assert_eq!(hit.num_tokens, 12);
        assert_eq!(hit.blocks[0].len(), 3);
        assert_eq!(hit.num_uncached_common_prefix_tokens, 4);
    }
}
