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

use std::collections::VecDeque;

use hashbrown::HashMap;

use super::block_pool::{BlockPool, CacheBlocks, PoolConfig};
use super::error::{PoolError, PoolResult};
use super::events::PoolEvent;
use super::hashing::HashAlgo;
use super::request_id::RequestId;
use super::tracker::{ComputedBlocksTracker, SequenceExtras};

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
    /// Longest sequence a request may reach; slots beyond it are never allocated.
    pub max_model_len: Option<usize>,
    /// How many recent requests the windowed prefix-cache statistics cover.
    pub stats_window: usize,
}

impl ManagerConfig {
    /// vLLM's defaults: caching on, `sha256_cbor`, seed `"vllm-none-hash"`.
    pub fn new(num_blocks: u32, block_size: u32) -> Self {
        Self {
            num_blocks,
            block_size,
            enable_caching: true,
            hash_algo: HashAlgo::Sha256Cbor,
            seed: super::hashing::DEFAULT_NONE_HASH_SEED.to_owned(),
            enable_events: false,
            max_model_len: None,
            stats_window: 1000,
        }
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

#[derive(Clone, Debug, Default)]
struct RequestState {
    blocks: Vec<u32>,
    num_cached_blocks: usize,
    num_computed_tokens: usize,
    lora: LoraInfo,
    num_preemptions: u32,
}

/// Prefix-cache statistics, recorded as vLLM 0.33 records them: when a waiting
/// request is admitted (its first successful allocation), so lookups of requests
/// that stay waiting are not counted; resumed (preempted) requests apart.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PrefixCacheStats {
    /// New requests admitted.
    pub requests: u64,
    /// Their tokens (what was looked up).
    pub queries: u64,
    /// Their tokens found computed in the prefix cache.
    pub hits: u64,
    /// Preempted requests admitted again.
    pub preempted_requests: u64,
    /// Their tokens.
    pub preempted_queries: u64,
    /// Their tokens found computed.
    pub preempted_hits: u64,
}

impl PrefixCacheStats {
    /// `hits / queries`, 0 when nothing was queried.
    pub fn hit_rate(&self) -> f64 {
        if self.queries == 0 {
            0.0
        } else {
            self.hits as f64 / self.queries as f64
        }
    }
}

/// One request's part in a batched step.
#[derive(Clone, Debug)]
pub struct StepRequest<'a> {
    /// The request.
    pub id: &'a RequestId,
    /// Tokens to schedule. For a request that has not started: the most to compute
    /// beyond its prefix hit (the manager looks the hit up first).
    pub num_new_tokens: usize,
    /// Speculative slots to allocate beyond them (never cached).
    pub num_lookahead_tokens: usize,
}

/// What a batched step did, per request in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepOutcome {
    /// New block ids of every request, back to back.
    pub block_ids: Vec<u32>,
    /// `block_ids[offsets[i]..offsets[i + 1]]` are request `i`'s new blocks.
    pub offsets: Vec<usize>,
    /// Tokens scheduled per request (0 where allocation failed or was not tried).
    pub num_scheduled_tokens: Vec<usize>,
    /// Prefix-hit tokens per request (non-zero only for requests starting now).
    pub num_hit_tokens: Vec<usize>,
    /// Whether each request got its slots.
    pub allocated: Vec<bool>,
}

/// The per-request block manager.
#[derive(Debug)]
pub struct KVCacheManager {
    pool: BlockPool,
    tracker: ComputedBlocksTracker,
    requests: HashMap<RequestId, RequestState>,
    block_size: usize,
    max_model_len: usize,
    stats: PrefixCacheStats,
    window: VecDeque<(u64, u64)>,
    window_len: usize,
    hits_scratch: Vec<u32>,
}

impl KVCacheManager {
    /// Builds a manager and its pool (with a null block).
    pub fn new(config: ManagerConfig) -> PoolResult<Self> {
        let mut pool_config = PoolConfig::new(config.num_blocks);
        pool_config.block_size = config.block_size;
        pool_config.enable_caching = config.enable_caching;
        pool_config.enable_events = config.enable_events;
        pool_config.hash_width = Some(config.hash_algo.digest_len());
        let pool = BlockPool::new(pool_config)?;
        let mut tracker =
            ComputedBlocksTracker::new(config.block_size as usize, config.hash_algo, &config.seed)?;
        if !config.enable_caching {
            tracker.disable_hashing(); // as vLLM: no block hasher without prefix caching
        }
        if config.max_model_len == Some(0) {
            return Err(PoolError::InvalidArgument(
                "max_model_len must be at least 1".into(),
            ));
        }
        Ok(Self {
            pool,
            tracker,
            requests: HashMap::new(),
            block_size: config.block_size as usize,
            max_model_len: config.max_model_len.unwrap_or(usize::MAX),
            stats: PrefixCacheStats::default(),
            window: VecDeque::new(),
            window_len: config.stats_window,
            hits_scratch: Vec::new(),
        })
    }

    /// The pool underneath (read-only: all changes go through the manager).
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// The tracker underneath.
    pub fn tracker(&self) -> &ComputedBlocksTracker {
        &self.tracker
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Number of tracked requests.
    pub fn num_requests(&self) -> usize {
        self.requests.len()
    }

    fn state(&self, id: &RequestId) -> PoolResult<&RequestState> {
        self.requests
            .get(id)
            .ok_or_else(|| PoolError::UnknownRequest(id.to_string()))
    }

    /// Adds a request with its prompt (hashing its full blocks when caching).
    pub fn add_request(
        &mut self,
        id: RequestId,
        prompt: &[i64],
        extras: SequenceExtras,
        lora: LoraInfo,
    ) -> PoolResult<()> {
        if self.requests.contains_key(&id) {
            return Err(PoolError::DuplicateRequest(id.to_string()));
        }
        if prompt.is_empty() {
            return Err(PoolError::InvalidArgument(
                "a request needs at least one prompt token".into(),
            ));
        }
        self.tracker.add_sequence(id.clone(), prompt, extras)?;
        self.requests.insert(
            id,
            RequestState {
                lora,
                ..RequestState::default()
            },
        );
        Ok(())
    }

    /// Appends generated (or newly known) token ids to a request.
    pub fn append_token_ids(&mut self, id: &RequestId, tokens: &[i64]) -> PoolResult<()> {
        self.state(id)?;
        self.tracker.append_tokens(id, tokens)?;
        Ok(())
    }

    /// The request's tokens so far.
    pub fn num_tokens(&self, id: &RequestId) -> PoolResult<usize> {
        Ok(self.tracker.get(id)?.tokens().len())
    }

    /// Tokens the manager counts as computed for the request.
    pub fn num_computed_tokens(&self, id: &RequestId) -> PoolResult<usize> {
        Ok(self.state(id)?.num_computed_tokens)
    }

    /// Sets the request's computed tokens (a scheduler rolling back rejected
    /// speculative tokens). It may not exceed the slots the request holds.
    pub fn set_num_computed_tokens(&mut self, id: &RequestId, n: usize) -> PoolResult<()> {
        let block_size = self.block_size;
        let state = self
            .requests
            .get_mut(id)
            .ok_or_else(|| PoolError::UnknownRequest(id.to_string()))?;
        if n > state.blocks.len() * block_size {
            return Err(PoolError::InvalidArgument(format!(
                "{n} computed tokens exceed the {} slots the request holds",
                state.blocks.len() * block_size
            )));
        }
        state.num_computed_tokens = n;
        Ok(())
    }

    /// The request's block table.
    pub fn block_ids(&self, id: &RequestId) -> PoolResult<&[u32]> {
        Ok(&self.state(id)?.blocks)
    }

    /// The longest prefix-cache hit of a request that has not started, capped below
    /// its last token: block ids appended to `out`, computed tokens returned.
    /// Changes nothing (statistics are recorded when the request is admitted).
    pub fn get_computed_blocks(&self, id: &RequestId, out: &mut Vec<u32>) -> PoolResult<usize> {
        self.state(id)?;
        if !self.pool.config().enable_caching {
            return Ok(0);
        }
        self.tracker.lookup_computed_blocks(id, &self.pool, out)
    }

    fn record(&mut self, queries: u64, hits: u64, preempted: bool) {
        if preempted {
            self.stats.preempted_requests += 1;
            self.stats.preempted_queries += queries;
            self.stats.preempted_hits += hits;
            return;
        }
        self.stats.requests += 1;
        self.stats.queries += queries;
        self.stats.hits += hits;
        if self.window_len > 0 {
            if self.window.len() == self.window_len {
                self.window.pop_front();
            }
            self.window.push_back((queries, hits));
        }
    }

    /// Statistics over all lookups since the manager was built (or reset).
    pub fn prefix_cache_stats(&self) -> &PrefixCacheStats {
        &self.stats
    }

    /// `(requests, queries, hits)` over the last `stats_window` lookups.
    pub fn recent_prefix_cache_stats(&self) -> PrefixCacheStats {
        let mut s = PrefixCacheStats {
            requests: self.window.len() as u64,
            ..Default::default()
        };
        for &(q, h) in &self.window {
            s.queries += q;
            s.hits += h;
        }
        s
    }

    /// Allocates slots for `num_new_tokens` new tokens (plus lookahead), after
    /// taking `new_computed_blocks` (the prefix hit of `num_new_computed_tokens`
    /// tokens) for a request that starts now. New block ids are appended to `out`.
    /// Returns `Ok(false)`, changing nothing, when the pool is short.
    pub fn allocate_slots(
        &mut self,
        id: &RequestId,
        num_new_tokens: usize,
        num_new_computed_tokens: usize,
        new_computed_blocks: &[u32],
        num_lookahead_tokens: usize,
        out: &mut Vec<u32>,
    ) -> PoolResult<bool> {
        let block_size = self.block_size;
        let state = self.state(id)?;
        let seq = self.tracker.get(id)?;
        let num_tokens = seq.tokens().len();
        if num_new_tokens == 0 && num_new_computed_tokens == 0 {
            return Err(PoolError::InvalidArgument(
                "num_new_tokens must be greater than 0 when there are no new computed tokens"
                    .into(),
            ));
        }
        if num_new_computed_tokens != new_computed_blocks.len() * block_size {
            return Err(PoolError::InvalidArgument(format!(
                "num_new_computed_tokens ({num_new_computed_tokens}) must be {} for {} new computed blocks",
                new_computed_blocks.len() * block_size,
                new_computed_blocks.len()
            )));
        }
        if !new_computed_blocks.is_empty() {
            self.check_new_computed_blocks(id, state, new_computed_blocks)?;
        }
        let admitting = state.blocks.is_empty() && state.num_computed_tokens == 0;
        let preempted = state.num_preemptions > 0;
        // Saturating: absurd counts must make the allocation fail, not wrap around.
        let num_computed = state
            .num_computed_tokens
            .saturating_add(num_new_computed_tokens);
        let need = num_computed
            .saturating_add(num_new_tokens)
            .saturating_add(num_lookahead_tokens)
            .min(self.max_model_len);
        let required_blocks = need.div_ceil(block_size);
        let held = state.blocks.len() + new_computed_blocks.len();
        let evictable_hits = new_computed_blocks
            .iter()
            .filter(|&&b| {
                self.pool.ref_count(b).map_or(false, |c| c == 0)
                    && self.pool.null_block() != Some(b)
            })
            .count();
        let to_allocate = required_blocks.saturating_sub(held);
        if to_allocate.saturating_add(evictable_hits) > self.pool.num_free_blocks() {
            return Ok(false);
        }
        // From here on nothing can fail: every input was checked above.
        let caching = self.pool.config().enable_caching;
        self.pool.touch(new_computed_blocks)?;
        let start = out.len();
        self.pool.get_new_blocks(to_allocate, out)?;
        let state = self
            .requests
            .get_mut(id)
            .ok_or_else(|| PoolError::UnknownRequest(id.to_string()))?;
        if !new_computed_blocks.is_empty() {
            state.blocks.extend_from_slice(new_computed_blocks);
            state.num_cached_blocks = state.blocks.len();
        }
        state.blocks.extend_from_slice(&out[start..]);
        state.num_computed_tokens = num_computed.saturating_add(num_new_tokens);
        if !self.tracker.get(id)?.is_started() {
            self.tracker.start_with(id, num_computed)?;
        }
        if caching {
            if admitting {
                self.record(num_tokens as u64, num_new_computed_tokens as u64, preempted);
            }
            self.cache_blocks(
                id,
                num_computed.saturating_add(num_new_tokens).min(num_tokens),
            )?;
        }
        Ok(true)
    }

    /// Hits must be cached blocks holding this request's hashes, in order, and the
    /// request must not have started.
    fn check_new_computed_blocks(
        &self,
        id: &RequestId,
        state: &RequestState,
        blocks: &[u32],
    ) -> PoolResult<()> {
        if !self.pool.config().enable_caching {
            return Err(PoolError::CachingDisabled);
        }
        if !state.blocks.is_empty() || state.num_computed_tokens > 0 {
            return Err(PoolError::InvalidArgument(
                "new_computed_blocks are only accepted for a request that has not started".into(),
            ));
        }
        let hashes = self.tracker.block_hashes(id)?;
        if blocks.len() > hashes.len() {
            return Err(PoolError::InvalidArgument(format!(
                "{} new computed blocks but the request has only {} full blocks",
                blocks.len(),
                hashes.len()
            )));
        }
        self.pool.check_ids(blocks)?;
        for (i, &b) in blocks.iter().enumerate() {
            let key = self.pool.block_hash(b)?;
            if key.map_or(true, |k| k.group != 0 || k.hash.as_bytes() != hashes.get(i)) {
                return Err(PoolError::BlockState {
                    block_id: b,
                    reason: "is not the cached block of this request's prefix at its position",
                });
            }
        }
        Ok(())
    }

    /// Caches the request's blocks that are full within its first `num_tokens` tokens.
    fn cache_blocks(&mut self, id: &RequestId, num_tokens: usize) -> PoolResult<()> {
        let state = self
            .requests
            .get(id)
            .ok_or_else(|| PoolError::UnknownRequest(id.to_string()))?;
        let hashes = self.tracker.block_hashes(id)?;
        let num_full = (num_tokens / self.block_size)
            .min(hashes.len())
            .min(state.blocks.len());
        if num_full <= state.num_cached_blocks {
            return Ok(());
        }
        let seq = self.tracker.get(id)?;
        let call = CacheBlocks {
            block_ids: &state.blocks,
            block_hashes: hashes,
            num_cached_blocks: state.num_cached_blocks,
            num_full_blocks: num_full,
            group: 0,
            token_ids: self.pool.config().enable_events.then(|| seq.tokens()),
            lora_id: state.lora.id,
            lora_name: state.lora.name.as_deref(),
        };
        self.pool.cache_full_blocks(call)?;
        if let Some(state) = self.requests.get_mut(id) {
            state.num_cached_blocks = num_full;
        }
        Ok(())
    }

    /// Frees the request's blocks (tail first) and forgets the request.
    pub fn free(&mut self, id: &RequestId) -> PoolResult<()> {
        self.release_blocks(id)?;
        self.requests.remove(id);
        self.tracker.remove(id)?;
        Ok(())
    }

    /// Frees several requests, in order; all must be known (checked first).
    pub fn free_many(&mut self, ids: &[RequestId]) -> PoolResult<()> {
        self.check_known(ids.iter())?;
        let mut seen = hashbrown::HashSet::with_capacity(ids.len());
        if let Some(dup) = ids.iter().find(|id| !seen.insert(*id)) {
            return Err(PoolError::InvalidArgument(format!(
                "request {dup} appears twice"
            )));
        }
        for id in ids {
            self.free(id)?;
        }
        Ok(())
    }

    /// Preemption: frees the request's blocks (tail first); it keeps its tokens and
    /// restarts from zero computed tokens.
    pub fn preempt(&mut self, id: &RequestId) -> PoolResult<()> {
        self.release_blocks(id)?;
        if let Some(state) = self.requests.get_mut(id) {
            state.num_computed_tokens = 0;
            state.num_cached_blocks = 0;
            state.num_preemptions += 1;
        }
        self.tracker.reset(id)
    }

    fn release_blocks(&mut self, id: &RequestId) -> PoolResult<()> {
        let state = self
            .requests
            .get_mut(id)
            .ok_or_else(|| PoolError::UnknownRequest(id.to_string()))?;
        let mut blocks = std::mem::take(&mut state.blocks);
        blocks.reverse();
        self.pool.free_blocks(&blocks)
    }

    fn check_known<'a>(&self, mut ids: impl Iterator<Item = &'a RequestId>) -> PoolResult<()> {
        match ids.find(|id| !self.requests.contains_key(*id)) {
            Some(id) => Err(PoolError::UnknownRequest(id.to_string())),
            None => Ok(()),
        }
    }

    /// One scheduler step in one call: for each request in order, a request that
    /// has not started first looks up its prefix hit and schedules
    /// `min(num_new_tokens, num_tokens - hit)` tokens; a running one schedules
    /// `num_new_tokens`. Then its slots are allocated as by
    /// [`Self::allocate_slots`]. A request that does not fit is marked and, with
    /// `stop_at_first_failure`, ends the step (vLLM's waiting queue does so).
    /// Unknown ids fail the whole step before anything changes.
    pub fn schedule_step(
        &mut self,
        step: &[StepRequest<'_>],
        stop_at_first_failure: bool,
        out: &mut StepOutcome,
    ) -> PoolResult<()> {
        self.check_known(step.iter().map(|r| r.id))?;
        out.offsets.push(out.block_ids.len());
        let mut stopped = false;
        let mut hits = std::mem::take(&mut self.hits_scratch);
        for req in step {
            let (mut scheduled, mut hit_tokens, mut ok) = (0, 0, false);
            if !stopped {
                hits.clear();
                let state = self.state(req.id)?;
                let waiting = state.blocks.is_empty() && state.num_computed_tokens == 0;
                let mut num_new = req.num_new_tokens;
                if waiting {
                    hit_tokens = self.get_computed_blocks(req.id, &mut hits)?;
                    num_new = num_new.min(self.num_tokens(req.id)? - hit_tokens);
                }
                ok = num_new + hit_tokens > 0
                    && self.allocate_slots(
                        req.id,
                        num_new,
                        hit_tokens,
                        &hits,
                        req.num_lookahead_tokens,
                        &mut out.block_ids,
                    )?;
                if ok {
                    scheduled = num_new;
                } else {
                    hit_tokens = 0;
                    stopped = stop_at_first_failure;
                }
            }
            out.num_scheduled_tokens.push(scheduled);
            out.num_hit_tokens.push(hit_tokens);
            out.allocated.push(ok);
            out.offsets.push(out.block_ids.len());
        }
        self.hits_scratch = hits;
        Ok(())
    }

    /// The tracked request ids, in no particular order.
    pub fn request_ids(&self) -> impl Iterator<Item = &RequestId> {
        self.requests.keys()
    }

    /// The pool's invariants, plus: every request's blocks are held (count > 0 or
    /// the null block), each block's count is at least the number of tables naming
    /// it, and a request's cached blocks hold its hashes.
    pub fn check_invariants(&self) -> Result<(), Vec<String>> {
        let mut problems = self.pool.check_invariants().err().unwrap_or_default();
        let mut holders = vec![0u32; self.pool.num_blocks() as usize];
        for (id, state) in &self.requests {
            for &b in &state.blocks {
                if b >= self.pool.num_blocks() {
                    problems.push(format!("request {id}: block {b} out of range"));
                    continue;
                }
                holders[b as usize] += 1;
            }
            if let Ok(hashes) = self.tracker.block_hashes(id) {
                for (i, &b) in state
                    .blocks
                    .iter()
                    .take(state.num_cached_blocks)
                    .enumerate()
                {
                    if self.pool.null_block() == Some(b) {
                        continue;
                    }
                    let key = self.pool.block_hash(b).ok().flatten();
                    if i >= hashes.len()
                        || key
                            .map(|k| k.hash.as_bytes() != hashes.get(i))
                            .unwrap_or(true)
                    {
                        problems.push(format!(
                            "request {id}: cached block {i} (id {b}) lacks the request's hash"
                        ));
                    }
                }
            }
            if !self.tracker.contains(id) {
                problems.push(format!("request {id}: not tracked by the tracker"));
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

    /// Clears the prefix cache if no block is in use (and resets the statistics).
    pub fn reset_prefix_cache(&mut self) -> bool {
        let done = self.pool.reset_prefix_cache();
        if done {
            self.stats = PrefixCacheStats::default();
            self.window.clear();
            for state in self.requests.values_mut() {
                state.num_cached_blocks = 0;
            }
        }
        done
    }
}
