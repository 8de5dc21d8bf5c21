//! The per-request layer a scheduler calls: prefix hits, slot allocation,
//! caching at allocation time, freeing and preemption, and a batched step.
//!
//! Semantics follow vLLM's v1 `KVCacheManager` for one full-attention KV-cache
//! group (`docs/semantics.md`, "Per-request manager"):
//! - `get_computed_blocks`: the longest hit, capped below the last token;
//! - `allocate_slots`: all or nothing (returns `false` and changes nothing when the
//!   pool is short), touches hits, allocates the rest, caches the blocks that
//!   became full (`min(computed + new, num_tokens)` tokens; lookahead never);
//! - `free`: the request's blocks in reverse order; `preempt`: the same, and the
//!   request restarts from zero computed tokens.

use hashbrown::HashMap;

use super::block_pool::{BlockPool, CacheBlocks, PoolConfig};
use super::error::{PoolError, PoolResult};
use super::events::{EventExtraKey, PoolEvent, TakenEvents};
use super::eviction::BlockPriority;
use super::hash_key::HashSlice;
use super::hashing::HashAlgo;
use super::request_id::{RequestId, RequestLookup};
use super::stats::{PrefixCacheStats, StatsRecorder};
use super::tracker::{Sequence, SequenceExtras, SequenceHasher, TokenIds};

/// How a manager is built.
#[derive(Clone, Debug)]
pub struct ManagerConfig {
    /// Blocks in the pool (block 0 is the null block).
    pub num_blocks: u32,
    /// Tokens per block.
    pub block_size: u32,
    /// Keep a prefix cache.
    pub enable_caching: bool,
    /// Block hash algorithm.
    pub hash_algo: HashAlgo,
    /// `NONE_HASH` seed.
    pub seed: String,
    /// Queue KV-cache events.
    pub enable_events: bool,
    /// Most events queued before the oldest are dropped (and counted).
    pub max_pending_events: usize,
    /// Longest sequence a request may reach; slots beyond it are never allocated.
    pub max_model_len: Option<usize>,
    /// How many recent requests the windowed prefix-cache statistics cover.
    pub stats_window: usize,
    /// Which cached free block is evicted first.
    pub eviction: super::EvictionPolicy,
    /// The adaptive policy's horizon ([`PoolConfig::adaptive_horizon`]).
    pub adaptive_horizon: Option<u64>,
    /// Run retention durations on a clock the caller advances.
    pub manual_clock: bool,
    /// Most blocks that may be pinned at once; `None`: a quarter of the blocks.
    pub max_pinned_blocks: Option<u32>,
}

impl ManagerConfig {
    /// kvpool's defaults: caching on, `sha256_cbor` (vLLM 0.33's default is `sha256`, see
    /// `docs/semantics.md`), seed `"vllm-none-hash"`.
    pub fn new(num_blocks: u32, block_size: u32) -> Self {
        Self {
            num_blocks,
            block_size,
            enable_caching: true,
            hash_algo: HashAlgo::Sha256Cbor,
            seed: super::hashing::DEFAULT_NONE_HASH_SEED.to_owned(),
            enable_events: false,
            max_pending_events: super::block_pool::DEFAULT_MAX_PENDING_EVENTS,
            max_model_len: None,
            stats_window: 1000,
            eviction: super::EvictionPolicy::Lru,
            adaptive_horizon: None,
            manual_clock: false,
            max_pinned_blocks: None,
        }
    }

    /// The configuration of the manager's pool: its blocks, caching, events, hash width
    /// and eviction policy.
    pub fn pool_config(&self) -> PoolConfig {
        let mut pool = PoolConfig::new(self.num_blocks);
        pool.block_size = self.block_size;
        pool.enable_caching = self.enable_caching;
        pool.enable_events = self.enable_events;
        pool.max_pending_events = self.max_pending_events;
        pool.hash_width = Some(self.hash_algo.digest_len());
        pool.eviction = self.eviction;
        pool.adaptive_horizon = self.adaptive_horizon;
        pool.manual_clock = self.manual_clock;
        if let Some(budget) = self.max_pinned_blocks {
            pool.max_pinned_blocks = budget;
        }
        pool
    }
}

/// Per-request LoRA identity for `BlockStored` events.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoraInfo {
    /// Adapter id.
    pub id: Option<i64>,
    /// Adapter name.
    pub name: Option<String>,
}

/// One request: its sequence (tokens, hashes) and its block table, in one record,
/// so each call finds a request with one lookup.
#[derive(Debug)]
pub(super) struct Request {
    pub(super) seq: Sequence,
    pub(super) blocks: Vec<u32>,
    pub(super) num_cached_blocks: usize,
    pub(super) num_computed_tokens: usize,
    pub(super) lora: LoraInfo,
    pub(super) num_preemptions: u32,
    /// The retention priority of the blocks the request caches or hits
    /// ([`EvictionPolicy::Priority`](super::EvictionPolicy::Priority) only).
    pub(super) priority: Option<BlockPriority>,
    /// The last `free_many` call that named the request (see `KVCacheManager::free_calls`).
    pub(super) mark: u64,
}

impl Request {
    /// Not started (or preempted): no blocks and nothing computed.
    pub(super) fn waiting(&self) -> bool {
        self.blocks.is_empty() && self.num_computed_tokens == 0
    }
}

/// One `allocate_slots` call, its inputs checked for shape by the caller.
pub(super) struct SlotRequest<'a> {
    pub(super) num_new_tokens: usize,
    pub(super) num_new_computed_tokens: usize,
    pub(super) new_computed_blocks: &'a [u32],
    pub(super) num_lookahead_tokens: usize,
}

/// The per-request block manager.
#[derive(Debug)]
pub struct KVCacheManager {
    pub(super) pool: BlockPool,
    pub(super) hasher: SequenceHasher,
    pub(super) requests: HashMap<RequestId, Request>,
    pub(super) max_model_len: usize,
    pub(super) stats: StatsRecorder,
    /// Block tables of freed requests, emptied, for new requests to fill: a serving
    /// step then allocates no table (and never regrows one on the first decode block).
    spare_tables: Vec<Vec<u32>>,
    /// The number of the last `free_many` call, which marks each request it names
    /// (`Request::mark`) to find a repeated id in one lookup.
    free_calls: u64,
}

/// How many emptied block tables a manager keeps, and the largest kept (in blocks).
const SPARE_TABLES_MAX: usize = 1024;
const SPARE_TABLE_BLOCKS_MAX: usize = 4096;

pub(super) fn unknown(id: &(impl RequestLookup + ?Sized)) -> PoolError {
    PoolError::UnknownRequest(id.to_string())
}

impl KVCacheManager {
    /// Builds a manager and its pool (with a null block).
    pub fn new(config: ManagerConfig) -> PoolResult<Self> {
        if config.max_model_len == Some(0) {
            return Err(PoolError::InvalidArgument(
                "max_model_len must be at least 1".into(),
            ));
        }
        let pool = BlockPool::new(config.pool_config())?;
        let mut hasher =
            SequenceHasher::new(config.block_size as usize, config.hash_algo, &config.seed)?;
        if !config.enable_caching {
            hasher.disable_hashing(); // as vLLM: no block hasher without prefix caching
        }
        Ok(Self {
            pool,
            hasher,
            requests: HashMap::new(),
            max_model_len: config.max_model_len.unwrap_or(usize::MAX),
            stats: StatsRecorder::new(config.stats_window),
            spare_tables: Vec::new(),
            free_calls: 0,
        })
    }

    /// The pool underneath (read-only: all changes go through the manager).
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Moves the free blocks whose retention ran out to their new list (see
    /// [`BlockPool::apply_expiries`]), so that the free queue reads as the next
    /// allocation will take it.
    pub fn apply_expiries(&mut self) {
        self.pool.apply_expiries();
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.hasher.block_size()
    }

    /// The block hash algorithm.
    pub fn hash_algo(&self) -> HashAlgo {
        self.hasher.algo()
    }

    /// Number of tracked requests.
    pub fn num_requests(&self) -> usize {
        self.requests.len()
    }

    /// Whether `id` is tracked.
    pub fn contains(&self, id: &(impl RequestLookup + ?Sized)) -> bool {
        self.requests.contains_key(id)
    }

    fn request(&self, id: &(impl RequestLookup + ?Sized)) -> PoolResult<&Request> {
        self.requests.get(id).ok_or_else(|| unknown(id))
    }

    /// A request's sequence: tokens, hashes, extras.
    pub fn sequence(&self, id: &(impl RequestLookup + ?Sized)) -> PoolResult<&Sequence> {
        Ok(&self.request(id)?.seq)
    }

    /// Adds a request with its prompt (hashing its full blocks when caching).
    pub fn add_request(
        &mut self,
        id: RequestId,
        prompt: TokenIds<'_>,
        extras: SequenceExtras,
        lora: LoraInfo,
    ) -> PoolResult<()> {
        // One lookup: the vacant entry is filled once the prompt is checked and hashed.
        let entry = match self.requests.entry(id) {
            hashbrown::hash_map::Entry::Occupied(e) => {
                return Err(PoolError::DuplicateRequest(e.key().to_string()))
            }
            hashbrown::hash_map::Entry::Vacant(e) => e,
        };
        if prompt.is_empty() {
            return Err(PoolError::InvalidArgument(
                "a request needs at least one prompt token".into(),
            ));
        }
        if prompt.len() > self.max_model_len {
            return Err(PoolError::InvalidArgument(format!(
                "the prompt has {} tokens, more than max_model_len ({})",
                prompt.len(),
                self.max_model_len
            )));
        }
        let seq = self.hasher.new_sequence(prompt, extras)?;
        entry.insert(Request {
            seq,
            blocks: self.spare_tables.pop().unwrap_or_default(),
            num_cached_blocks: 0,
            num_computed_tokens: 0,
            lora,
            num_preemptions: 0,
            priority: None,
            mark: 0,
        });
        Ok(())
    }

    /// [`add_request`](Self::add_request) with a retention priority: the blocks the
    /// request caches get it, and the hits it takes are raised to it (never
    /// lowered). Needs a manager built with
    /// [`EvictionPolicy::Priority`](super::EvictionPolicy::Priority); checked
    /// before the request is added.
    pub fn add_prioritized_request(
        &mut self,
        id: RequestId,
        prompt: TokenIds<'_>,
        extras: SequenceExtras,
        lora: LoraInfo,
        priority: BlockPriority,
    ) -> PoolResult<()> {
        require_priority_policy(&self.pool)?;
        let key = id.clone();
        self.add_request(id, prompt, extras, lora)?;
        if let Some(request) = self.requests.get_mut(&key) {
            request.priority = Some(priority);
        }
        Ok(())
    }

    /// Appends generated (or newly known) token ids to a request.
    /// A request never grows beyond `max_model_len` tokens (an `Err`, and no change).
    pub fn append_token_ids(
        &mut self,
        id: &(impl RequestLookup + ?Sized),
        tokens: TokenIds<'_>,
    ) -> PoolResult<()> {
        self.check_room(id, tokens.len())?;
        let request = self.requests.get_mut(id).ok_or_else(|| unknown(id))?;
        self.hasher.append_tokens(&mut request.seq, tokens)?;
        Ok(())
    }

    /// Whether request `id` can take `more` tokens within `max_model_len`.
    pub fn check_room(&self, id: &(impl RequestLookup + ?Sized), more: usize) -> PoolResult<()> {
        let total = self.request(id)?.seq.num_tokens().saturating_add(more);
        if total > self.max_model_len {
            return Err(PoolError::InvalidArgument(format!(
                "appending {more} tokens would make request {id} {total} tokens long, more than max_model_len ({})",
                self.max_model_len
            )));
        }
        Ok(())
    }

    /// Whether the manager reads token ids: only with prefix caching on. Without it,
    /// [`add_request`](Self::add_request) and
    /// [`append_token_ids`](Self::append_token_ids) may be given just a count.
    pub fn keeps_tokens(&self) -> bool {
        self.hasher.keeps_tokens()
    }

    /// The request's tokens so far.
    pub fn num_tokens(&self, id: &(impl RequestLookup + ?Sized)) -> PoolResult<usize> {
        Ok(self.request(id)?.seq.num_tokens())
    }

    /// Tokens the manager counts as computed for the request.
    pub fn num_computed_tokens(&self, id: &(impl RequestLookup + ?Sized)) -> PoolResult<usize> {
        Ok(self.request(id)?.num_computed_tokens)
    }

    /// Sets the request's computed tokens (a scheduler rolling back rejected
    /// speculative tokens). It may not exceed the slots the request holds.
    pub fn set_num_computed_tokens(
        &mut self,
        id: &(impl RequestLookup + ?Sized),
        n: usize,
    ) -> PoolResult<()> {
        let block_size = self.hasher.block_size();
        let request = self.requests.get_mut(id).ok_or_else(|| unknown(id))?;
        let slots = request.blocks.len() * block_size;
        if n > slots {
            return Err(PoolError::InvalidArgument(format!(
                "{n} computed tokens exceed the {slots} slots the request holds"
            )));
        }
        request.num_computed_tokens = n;
        Ok(())
    }

    /// The request's block table.
    pub fn block_ids(&self, id: &(impl RequestLookup + ?Sized)) -> PoolResult<&[u32]> {
        Ok(&self.request(id)?.blocks)
    }

    /// The request's block hashes (full blocks).
    pub fn block_hashes(&self, id: &(impl RequestLookup + ?Sized)) -> PoolResult<HashSlice<'_>> {
        Ok(self.request(id)?.seq.block_hashes())
    }

    /// The longest prefix-cache hit of a request that has not started, capped below
    /// its last token: block ids appended to `out`, computed tokens returned.
    /// Changes nothing (statistics are recorded when the request is admitted).
    pub fn get_computed_blocks(
        &self,
        id: &(impl RequestLookup + ?Sized),
        out: &mut Vec<u32>,
    ) -> PoolResult<usize> {
        self.request(id)?
            .seq
            .lookup_computed_blocks(&self.pool, out)
    }

    /// Statistics over every admitted request since the manager was built (or reset).
    pub fn prefix_cache_stats(&self) -> &PrefixCacheStats {
        &self.stats.all
    }

    /// `(requests, queries, hits)` over the last `stats_window` admitted requests.
    pub fn recent_prefix_cache_stats(&self) -> PrefixCacheStats {
        self.stats.recent()
    }

    /// Allocates slots for `num_new_tokens` new tokens (plus lookahead), after
    /// taking `new_computed_blocks` (the prefix hit of `num_new_computed_tokens`
    /// tokens) for a request that starts now. New block ids are appended to `out`.
    /// Returns `Ok(false)`, changing nothing, when the pool is short.
    pub fn allocate_slots(
        &mut self,
        id: &(impl RequestLookup + ?Sized),
        num_new_tokens: usize,
        num_new_computed_tokens: usize,
        new_computed_blocks: &[u32],
        num_lookahead_tokens: usize,
        out: &mut Vec<u32>,
    ) -> PoolResult<bool> {
        let Self {
            pool,
            requests,
            stats,
            max_model_len,
            ..
        } = self;
        let request = requests.get_mut(id).ok_or_else(|| unknown(id))?;
        let call = SlotRequest {
            num_new_tokens,
            num_new_computed_tokens,
            new_computed_blocks,
            num_lookahead_tokens,
        };
        Self::allocate(pool, stats, *max_model_len, request, &call, out)
    }

    /// `allocate_slots` on one request record.
    pub(super) fn allocate(
        pool: &mut BlockPool,
        stats: &mut StatsRecorder,
        max_model_len: usize,
        request: &mut Request,
        call: &SlotRequest<'_>,
        out: &mut Vec<u32>,
    ) -> PoolResult<bool> {
        let block_size = pool.config().block_size as usize;
        let hits = call.new_computed_blocks;
        if call.num_new_tokens == 0 && call.num_new_computed_tokens == 0 {
            return Err(PoolError::InvalidArgument(
                "num_new_tokens must be greater than 0 when there are no new computed tokens"
                    .into(),
            ));
        }
        if call.num_new_computed_tokens != hits.len() * block_size {
            return Err(PoolError::InvalidArgument(format!(
                "num_new_computed_tokens ({}) must be {} for {} new computed blocks",
                call.num_new_computed_tokens,
                hits.len() * block_size,
                hits.len()
            )));
        }
        if !hits.is_empty() {
            Self::check_new_computed_blocks(pool, request, hits)?;
        }
        let Some(wanted) = super::step::token_sum(&[
            request.num_computed_tokens,
            call.num_new_computed_tokens,
            call.num_new_tokens,
            call.num_lookahead_tokens,
        ]) else {
            return Err(PoolError::InvalidArgument(
                "the computed, new and lookahead token counts add up past 2**63 - 1".into(),
            ));
        };
        let admitting = request.waiting();
        // Every sum below is at most `wanted`.
        let num_computed = request.num_computed_tokens + call.num_new_computed_tokens;
        let num_tokens = request.seq.num_tokens();
        let need = wanted.min(max_model_len);
        let required_blocks = need.div_ceil(block_size);
        let held = request.blocks.len();
        if super::slots::blocks_to_allocate(pool, required_blocks, held, hits)
            > pool.num_free_blocks()
        {
            return Ok(false);
        }
        let to_allocate = required_blocks.saturating_sub(held + hits.len());
        // From here on nothing can fail: every input was checked above.
        pool.touch(hits)?;
        if let Some(priority) = request.priority {
            pool.set_priority(hits, priority, true)?;
        }
        let start = out.len();
        pool.get_new_blocks(to_allocate, out)?;
        if !hits.is_empty() {
            request.blocks.extend_from_slice(hits);
            request.num_cached_blocks = request.blocks.len();
        }
        request.blocks.extend_from_slice(&out[start..]);
        request.num_computed_tokens = num_computed + call.num_new_tokens;
        request.seq.start_with(num_computed);
        if pool.config().enable_caching {
            if admitting {
                stats.record(
                    num_tokens as u64,
                    call.num_new_computed_tokens as u64,
                    request.num_preemptions > 0,
                );
            }
            Self::cache_blocks(
                pool,
                request,
                (num_computed + call.num_new_tokens).min(num_tokens),
            )?;
        }
        Ok(true)
    }

    /// Hits must be cached blocks holding this request's hashes, in order, and the
    /// request must not have started.
    fn check_new_computed_blocks(
        pool: &BlockPool,
        request: &Request,
        blocks: &[u32],
    ) -> PoolResult<()> {
        if !pool.config().enable_caching {
            return Err(PoolError::CachingDisabled);
        }
        if !request.waiting() {
            return Err(PoolError::InvalidArgument(
                "new_computed_blocks are only accepted for a request that has not started".into(),
            ));
        }
        let hashes = request.seq.block_hashes();
        if blocks.len() > hashes.len() {
            return Err(PoolError::InvalidArgument(format!(
                "{} new computed blocks but the request has only {} full blocks",
                blocks.len(),
                hashes.len()
            )));
        }
        pool.check_ids(blocks)?;
        for (i, &b) in blocks.iter().enumerate() {
            let key = pool.block_hash(b)?;
            if key.is_none_or(|k| k.group != 0 || k.hash.as_bytes() != hashes.get(i)) {
                return Err(PoolError::BlockState {
                    block_id: b,
                    reason: "is not the cached block of this request's prefix at its position",
                });
            }
        }
        Ok(())
    }

    /// Caches the request's blocks that are full within its first `num_tokens` tokens.
    fn cache_blocks(
        pool: &mut BlockPool,
        request: &mut Request,
        num_tokens: usize,
    ) -> PoolResult<()> {
        let block_size = pool.config().block_size as usize;
        let hashes = request.seq.block_hashes();
        let num_full = (num_tokens / block_size)
            .min(hashes.len())
            .min(request.blocks.len());
        if num_full <= request.num_cached_blocks {
            return Ok(());
        }
        let extra_keys = pool
            .config()
            .enable_events
            .then(|| {
                event_extra_keys(
                    request.seq.extras(),
                    request.num_cached_blocks..num_full,
                    block_size,
                )
            })
            .flatten();
        let call = CacheBlocks {
            block_ids: &request.blocks,
            block_hashes: hashes,
            num_cached_blocks: request.num_cached_blocks,
            num_full_blocks: num_full,
            group: 0,
            token_ids: pool.config().enable_events.then(|| request.seq.tokens()),
            lora_id: request.lora.id,
            lora_name: request.lora.name.as_deref(),
            block_mask: None,
            priority: request.priority,
            extra_keys: extra_keys.as_deref(),
            block_size: None,
        };
        pool.cache_full_blocks(call)?;
        request.num_cached_blocks = num_full;
        Ok(())
    }

    /// Frees the request's blocks (tail first) and forgets the request.
    pub fn free(&mut self, id: &(impl RequestLookup + ?Sized)) -> PoolResult<()> {
        let request = self.requests.remove(id).ok_or_else(|| unknown(id))?;
        let freed = self.pool.free_blocks_reversed(&request.blocks);
        let mut table = request.blocks;
        if self.spare_tables.len() < SPARE_TABLES_MAX && table.capacity() <= SPARE_TABLE_BLOCKS_MAX
        {
            table.clear();
            self.spare_tables.push(table);
        }
        freed
    }

    /// Frees several requests, in order; all must be known and distinct (checked first,
    /// one lookup each: every request named is marked with this call's number).
    pub fn free_many<K: RequestLookup + Eq + std::hash::Hash>(
        &mut self,
        ids: &[K],
    ) -> PoolResult<()> {
        self.free_calls += 1;
        let call = self.free_calls;
        let mut repeated = None;
        for id in ids {
            // An unknown id is reported before a repeated one, wherever it is.
            let request = self.requests.get_mut(id).ok_or_else(|| unknown(id))?;
            if request.mark == call {
                repeated = repeated.or(Some(id));
            }
            request.mark = call;
        }
        if let Some(id) = repeated {
            return Err(PoolError::InvalidArgument(format!(
                "request {id} appears twice"
            )));
        }
        for id in ids {
            self.free(id)?;
        }
        Ok(())
    }

    /// Preemption: frees the request's blocks (tail first); it keeps its tokens and
    /// restarts from zero computed tokens.
    pub fn preempt(&mut self, id: &(impl RequestLookup + ?Sized)) -> PoolResult<()> {
        let request = self.requests.get_mut(id).ok_or_else(|| unknown(id))?;
        let blocks = std::mem::take(&mut request.blocks);
        self.pool.free_blocks_reversed(&blocks)?;
        request.num_computed_tokens = 0;
        request.num_cached_blocks = 0;
        request.num_preemptions += 1;
        request.seq.reset();
        Ok(())
    }

    /// The tracked request ids, in no particular order.
    pub fn request_ids(&self) -> impl Iterator<Item = &RequestId> {
        self.requests.keys()
    }

    /// The pool's invariants, plus: each block's count is at least the number of
    /// tables naming it, and a request's cached blocks hold its hashes.
    pub fn check_invariants(&self) -> Result<(), Vec<String>> {
        let mut problems = self.pool.check_invariants().err().unwrap_or_default();
        let mut holders = vec![0u32; self.pool.num_blocks() as usize];
        for (id, request) in &self.requests {
            for &b in &request.blocks {
                match holders.get_mut(b as usize) {
                    Some(h) => *h += 1,
                    None => problems.push(format!("request {id}: block {b} out of range")),
                }
            }
            let hashes = request.seq.block_hashes();
            for (i, &b) in request
                .blocks
                .iter()
                .take(request.num_cached_blocks)
                .enumerate()
            {
                if self.pool.null_block() == Some(b) {
                    continue;
                }
                let key = self.pool.block_hash(b).ok().flatten();
                if i >= hashes.len() || key.is_none_or(|k| k.hash.as_bytes() != hashes.get(i)) {
                    problems.push(format!(
                        "request {id}: cached block {i} (id {b}) lacks the request's hash"
                    ));
                }
            }
        }
        for (b, (&held, count)) in holders.iter().zip(self.pool.ref_counts()).enumerate() {
            if self.pool.null_block() != Some(b as u32) && count < held {
                problems.push(format!("block {b}: count {count} below its {held} holders"));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }

    /// Fraction of usable blocks in use.
    pub fn usage(&self) -> f64 {
        self.pool.usage()
    }

    /// Queued KV-cache events.
    pub fn take_events(&mut self) -> Vec<PoolEvent> {
        self.pool.take_events()
    }

    /// See [`BlockPool::return_events`].
    pub fn return_events(&mut self, taken: TakenEvents) {
        self.pool.return_events(taken);
    }

    /// Clears the prefix cache if no block is in use (and resets the statistics).
    pub fn reset_prefix_cache(&mut self) -> bool {
        let done = self.pool.reset_prefix_cache();
        if done {
            self.stats.clear();
            for request in self.requests.values_mut() {
                request.num_cached_blocks = 0;
            }
        }
        done
    }
}

/// The `BlockStored` extra keys of a request's blocks `blocks` (vLLM walks the multimodal
/// inputs from the first for each event), or `None` when the LoRA-only form says it all
/// (no multimodal input, cache salt or prompt embeddings).
pub(super) fn event_extra_keys(
    extras: &SequenceExtras,
    blocks: std::ops::Range<usize>,
    block_size: usize,
) -> Option<Vec<Option<Vec<EventExtraKey>>>> {
    let inputs = extras.inputs();
    if inputs.mm_features.is_empty()
        && inputs.cache_salt.is_none_or(str::is_empty)
        && inputs.prompt_embed_digests.is_none()
    {
        return None;
    }
    let mut cursor = inputs.mm_cursor(0, block_size);
    Some(
        blocks
            .map(|i| {
                inputs
                    .block_keys(i, block_size, &mut cursor)
                    .and_then(|keys| keys.event_keys())
            })
            .collect(),
    )
}

/// A request priority needs a pool that evicts by priority: `InvalidArgument` otherwise.
pub(super) fn require_priority_policy(pool: &BlockPool) -> PoolResult<()> {
    if pool.eviction_policy() != super::EvictionPolicy::Priority {
        return Err(PoolError::InvalidArgument(format!(
            "a request priority needs a manager built with eviction='priority' (this one evicts by {})",
            pool.eviction_policy().name()
        )));
    }
    Ok(())
}
