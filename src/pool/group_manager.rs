//! `GroupManager`: [`super::KVCacheManager`] for a hybrid model, several KV-cache
//! groups (full attention, sliding window, chunked local) over one pool. The manager
//! owns each request's tokens, block hashes and computed-token count; the block rules
//! are [`super::GroupTables`]'s (vLLM 0.33's hybrid coordinator), which it drives with
//! that state.

use hashbrown::HashMap;

use super::block_pool::BlockPool;
use super::error::{PoolError, PoolResult};
use super::events::{PoolEvent, TakenEvents};
use super::eviction::BlockPriority;
use super::group_hits::GroupHit;
use super::group_tables::{GroupBlocks, GroupSlotCall, GroupTables};
use super::kv_groups::{GroupSpec, KvGroups};
use super::manager::{require_priority_policy, LoraInfo, ManagerConfig};
use super::request_id::RequestId;
use super::stats::{PrefixCacheStats, StatsRecorder};
use super::step::{run_step, Attempt, StepLimits, StepManager, StepOutcome, StepRequest};
use super::tracker::{Sequence, SequenceExtras, SequenceHasher, TokenIds};

/// One request: its tokens and hashes, and how far it is computed.
#[derive(Debug)]
struct GroupRequest {
    seq: Sequence,
    num_computed_tokens: usize,
    /// vLLM's `request.shared_prefix_boundary`, set by each hit lookup.
    shared_prefix_boundary: usize,
    lora: LoraInfo,
    /// The retention priority of the blocks the request caches or hits.
    priority: Option<BlockPriority>,
    /// vLLM's `request.num_in_flight_tokens`: tokens scheduled in steps whose output has
    /// not come back (async scheduling, pipeline parallelism), whose windows still read
    /// blocks a window group would otherwise give back.
    num_in_flight_tokens: usize,
    /// Whether it was preempted (its next admission counts in the `preempted_*` stats).
    preempted: bool,
}

/// The per-request block manager for several KV-cache groups.
#[derive(Debug)]
pub struct GroupManager {
    pool: BlockPool,
    tables: GroupTables,
    hasher: SequenceHasher,
    requests: HashMap<RequestId, GroupRequest>,
    /// Prefix-cache statistics, recorded as requests are admitted (as `KVCacheManager`).
    stats: StatsRecorder,
}

fn unknown(id: &RequestId) -> PoolError {
    PoolError::UnknownRequest(id.to_string())
}

impl GroupManager {
    /// A manager and its pool (with a null block) for the groups `specs`, all of
    /// `config.block_size` tokens per block; `max_in_flight_tokens` bounds what a
    /// window group holds per request for the full-sequence gate (default
    /// `max_model_len`), `retention_interval` is vLLM's sliding-window retention.
    pub fn new(
        config: ManagerConfig,
        specs: Vec<GroupSpec>,
        max_in_flight_tokens: Option<usize>,
        retention_interval: Option<usize>,
    ) -> PoolResult<Self> {
        let block_size = config.block_size as usize;
        let layout = KvGroups::new(specs, block_size, retention_interval)?;
        let pool = BlockPool::new(config.pool_config())?;
        let mut hasher = SequenceHasher::new(block_size, config.hash_algo, &config.seed)?;
        if !config.enable_caching {
            hasher.disable_hashing();
        }
        let max_model_len = config.max_model_len.unwrap_or(usize::MAX / 2);
        let tables = GroupTables::new(
            layout,
            max_model_len,
            max_in_flight_tokens.unwrap_or(max_model_len),
            false,
        )?;
        Ok(Self {
            pool,
            tables,
            hasher,
            requests: HashMap::new(),
            stats: StatsRecorder::new(config.stats_window),
        })
    }

    /// The pool underneath (read-only: all changes go through the manager).
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// The layout.
    pub fn layout(&self) -> &KvGroups {
        self.tables.layout()
    }

    /// Whether the manager reads token ids (only with prefix caching on).
    pub fn keeps_tokens(&self) -> bool {
        self.hasher.keeps_tokens()
    }

    fn request(&self, id: &RequestId) -> PoolResult<&GroupRequest> {
        self.requests.get(id).ok_or_else(|| unknown(id))
    }

    /// Starts tracking a request with its prompt (at least one token).
    pub fn add_request(
        &mut self,
        id: RequestId,
        prompt: TokenIds<'_>,
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
        let seq = self.hasher.new_sequence(prompt, extras)?;
        self.requests.insert(
            id,
            GroupRequest {
                seq,
                num_computed_tokens: 0,
                shared_prefix_boundary: 0,
                lora,
                priority: None,
                num_in_flight_tokens: 0,
                preempted: false,
            },
        );
        Ok(())
    }

    /// [`add_request`](Self::add_request) with a retention priority for the blocks the
    /// request caches and hits (hits are only raised), as
    /// [`super::KVCacheManager::add_prioritized_request`]; needs a manager built with
    /// [`EvictionPolicy::Priority`](super::EvictionPolicy::Priority).
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

    /// Moves a manual clock forward by `seconds` (see [`BlockPool::advance_clock`]).
    pub fn advance_clock(&mut self, seconds: f64) -> PoolResult<()> {
        self.pool.advance_clock(seconds)
    }

    /// Appends generated (or newly known) token ids to a request.
    pub fn append_token_ids(&mut self, id: &RequestId, tokens: TokenIds<'_>) -> PoolResult<()> {
        let request = self.requests.get_mut(id).ok_or_else(|| unknown(id))?;
        self.hasher.append_tokens(&mut request.seq, tokens)?;
        Ok(())
    }

    /// The request's tokens so far.
    pub fn num_tokens(&self, id: &RequestId) -> PoolResult<usize> {
        Ok(self.request(id)?.seq.num_tokens())
    }

    /// Tokens the manager counts as computed for the request.
    pub fn num_computed_tokens(&self, id: &RequestId) -> PoolResult<usize> {
        Ok(self.request(id)?.num_computed_tokens)
    }

    /// Rolls the request's computed tokens back to `n` (at most the current count), as
    /// vLLM's scheduler does when it rejects speculative tokens; the blocks stay, and the
    /// next allocation counts from `n`.
    pub fn set_num_computed_tokens(&mut self, id: &RequestId, n: usize) -> PoolResult<()> {
        let request = self.requests.get_mut(id).ok_or_else(|| unknown(id))?;
        if n > request.num_computed_tokens {
            return Err(PoolError::InvalidArgument(format!(
                "{n} computed tokens exceed the request's {} (only a rollback is allowed)",
                request.num_computed_tokens
            )));
        }
        request.num_computed_tokens = n;
        Ok(())
    }

    /// Sets vLLM's `request.num_in_flight_tokens` for the request: tokens scheduled in
    /// steps whose output has not come back. Window groups keep the blocks those steps
    /// still read (vLLM frees below `num_computed_tokens - num_in_flight_tokens` only).
    pub fn set_num_in_flight_tokens(&mut self, id: &RequestId, n: usize) -> PoolResult<()> {
        let request = self.requests.get_mut(id).ok_or_else(|| unknown(id))?;
        if n > request.num_computed_tokens {
            return Err(PoolError::InvalidArgument(format!(
                "{n} tokens in flight exceed the request's {} computed tokens",
                request.num_computed_tokens
            )));
        }
        request.num_in_flight_tokens = n;
        Ok(())
    }

    /// The request's blocks in group `g`.
    pub fn block_ids(&self, id: &RequestId, g: usize) -> PoolResult<&[u32]> {
        self.request(id)?;
        Ok(self.tables.blocks(id.key(), g))
    }

    /// The longest prefix hit valid for every group, capped below the request's last
    /// token (none without prefix caching). Records the request's shared-prefix
    /// boundary (the hit plus what some group had cached beyond it), which its later
    /// caching keeps reachable, as vLLM's scheduler does.
    pub fn get_computed_blocks(&mut self, id: &RequestId) -> PoolResult<GroupHit> {
        let Self {
            pool,
            tables,
            requests,
            ..
        } = self;
        let request = requests.get_mut(id).ok_or_else(|| unknown(id))?;
        Self::lookup(pool, tables, request)
    }

    fn lookup(
        pool: &BlockPool,
        tables: &GroupTables,
        request: &mut GroupRequest,
    ) -> PoolResult<GroupHit> {
        let max = request.seq.num_tokens().saturating_sub(1);
        let hit = tables.find_longest_cache_hit(pool, request.seq.block_hashes(), max)?;
        let uncached = hit.num_uncached_common_prefix_tokens;
        request.shared_prefix_boundary = if uncached > 0 {
            hit.num_tokens + uncached
        } else {
            0
        };
        Ok(hit)
    }

    /// vLLM's `allocate_slots` for `num_new_tokens` more tokens (and
    /// `num_lookahead_tokens` speculative slots), adopting the hit `hits` (per
    /// group, `None`: nothing to adopt) of `num_new_computed_tokens` tokens: each
    /// group's new blocks appended to `out`, `n_groups + 1` offsets to `offsets`;
    /// `Ok(false)` when they do not fit. On success the request's computed tokens
    /// advance by the hit and the new tokens.
    #[allow(clippy::too_many_arguments)]
    pub fn allocate_slots(
        &mut self,
        id: &RequestId,
        num_new_tokens: usize,
        num_new_computed_tokens: usize,
        hits: Option<GroupBlocks<'_>>,
        num_lookahead_tokens: usize,
        out: &mut Vec<u32>,
        offsets: &mut Vec<usize>,
    ) -> PoolResult<bool> {
        let admitting = self.is_waiting(id);
        let Self {
            pool,
            tables,
            requests,
            stats,
            ..
        } = self;
        let request = requests.get_mut(id).ok_or_else(|| unknown(id))?;
        Self::allocate(
            pool,
            tables,
            stats,
            admitting,
            id,
            request,
            num_new_tokens,
            num_new_computed_tokens,
            hits,
            num_lookahead_tokens,
            out,
            offsets,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn allocate(
        pool: &mut BlockPool,
        tables: &mut GroupTables,
        stats: &mut StatsRecorder,
        admitting: bool,
        id: &RequestId,
        request: &mut GroupRequest,
        num_new_tokens: usize,
        num_new_computed_tokens: usize,
        hits: Option<GroupBlocks<'_>>,
        num_lookahead_tokens: usize,
        out: &mut Vec<u32>,
        offsets: &mut Vec<usize>,
    ) -> PoolResult<bool> {
        let seq = &request.seq;
        let call = GroupSlotCall {
            num_new_computed_tokens,
            new_computed_blocks: hits,
            num_lookahead_tokens,
            num_prompt_tokens: seq.num_prompt_tokens(),
            shared_prefix_boundary: request.shared_prefix_boundary,
            token_ids: (pool.config().enable_events && seq.tokens().len() == seq.num_tokens())
                .then(|| seq.tokens()),
            lora: &request.lora,
            extras: Some(seq.extras()),
            priority: request.priority,
            num_in_flight_tokens: request.num_in_flight_tokens,
            ..GroupSlotCall::new(
                request.num_computed_tokens,
                seq.num_tokens(),
                seq.block_hashes(),
                num_new_tokens,
            )
        };
        let ok = tables.allocate_slots(pool, id.key(), &call, out, offsets)?;
        if ok {
            if admitting && pool.config().enable_caching {
                stats.record(
                    request.seq.num_tokens() as u64,
                    num_new_computed_tokens as u64,
                    request.preempted,
                );
            }
            request.num_computed_tokens += num_new_computed_tokens + num_new_tokens;
        }
        Ok(ok)
    }

    /// One scheduler step in one call, as [`super::KVCacheManager::schedule_step`]:
    /// a request that has not started looks its hit up first and schedules
    /// `min(num_new_tokens, num_tokens - hit)` tokens; a running one schedules
    /// `num_new_tokens`; `limits` adds vLLM's step rules ([`StepLimits`]). Unknown ids
    /// fail the whole step first.
    pub fn schedule_step(
        &mut self,
        step: &[StepRequest<'_>],
        limits: StepLimits,
        out: &mut StepOutcome,
    ) -> PoolResult<()> {
        run_step(self, step, limits, out)
    }

    /// Frees the request's blocks (each group's tail first) and forgets it.
    pub fn free(&mut self, id: &RequestId) -> PoolResult<()> {
        self.request(id)?;
        self.tables.free(&mut self.pool, id.key())?;
        self.requests.remove(id);
        Ok(())
    }

    /// Preemption: frees the request's blocks; it keeps its tokens and restarts from
    /// zero computed tokens.
    pub fn preempt(&mut self, id: &RequestId) -> PoolResult<()> {
        self.request(id)?;
        self.tables.free(&mut self.pool, id.key())?;
        let request = self.requests.get_mut(id).ok_or_else(|| unknown(id))?;
        request.num_computed_tokens = 0;
        request.num_in_flight_tokens = 0;
        request.preempted = true;
        request.seq.reset();
        Ok(())
    }

    /// The tracked request ids, in no particular order.
    pub fn request_ids(&self) -> impl Iterator<Item = &RequestId> {
        self.requests.keys()
    }

    /// The pool's and the tables' invariants, and that every table belongs to a
    /// tracked request.
    pub fn check_invariants(&self) -> Result<(), Vec<String>> {
        let mut problems = self
            .tables
            .check_invariants(&self.pool)
            .err()
            .unwrap_or_default();
        for id in self.tables.request_ids() {
            if !self.requests.contains_key(id) {
                problems.push(format!("request {id} has tables but is not tracked"));
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

    /// Clears the prefix cache if no block is in use.
    pub fn reset_prefix_cache(&mut self) -> bool {
        let done = self.pool.reset_prefix_cache();
        if done {
            self.stats.clear();
        }
        done
    }

    /// `(requests, queries, hits)` over every request admitted since the start (or the
    /// last reset), as [`super::KVCacheManager::prefix_cache_stats`].
    pub fn prefix_cache_stats(&self) -> &PrefixCacheStats {
        &self.stats.all
    }

    /// The same over the last `stats_window` admitted requests.
    pub fn recent_prefix_cache_stats(&self) -> PrefixCacheStats {
        self.stats.recent()
    }

    /// The request's LoRA identity (for events).
    pub fn lora(&self, id: &RequestId) -> PoolResult<&LoraInfo> {
        Ok(&self.request(id)?.lora)
    }
}

impl StepManager for GroupManager {
    fn num_groups(&self) -> usize {
        self.tables.layout().len()
    }

    fn knows(&self, id: &RequestId) -> bool {
        self.requests.contains_key(id)
    }

    fn num_tokens_of(&self, id: &RequestId) -> usize {
        self.requests.get(id).map_or(0, |r| r.seq.num_tokens())
    }

    fn num_computed_of(&self, id: &RequestId) -> usize {
        self.requests.get(id).map_or(0, |r| r.num_computed_tokens)
    }

    fn is_waiting(&self, id: &RequestId) -> bool {
        let started = self
            .requests
            .get(id)
            .is_none_or(|r| r.num_computed_tokens > 0);
        !started && (0..self.num_groups()).all(|g| self.tables.blocks(id.key(), g).is_empty())
    }

    fn try_schedule(
        &mut self,
        req: &StepRequest<'_>,
        max_new: usize,
        out: &mut StepOutcome,
    ) -> PoolResult<Attempt> {
        let waiting = self.is_waiting(req.id);
        let Self {
            pool,
            tables,
            requests,
            stats,
            ..
        } = self;
        let request = requests.get_mut(req.id).ok_or_else(|| unknown(req.id))?;
        let mut num_new = req.num_new_tokens.min(max_new);
        let (mut hit_tokens, hit_start) = (0, out.hit_block_ids.len());
        let mut hit_offsets = Vec::new();
        if waiting {
            let hit = Self::lookup(pool, tables, request)?;
            hit_tokens = hit.num_tokens;
            num_new = num_new.min(request.seq.num_tokens() - hit_tokens);
            hit_offsets.push(0);
            for group in &hit.blocks {
                out.hit_block_ids.extend_from_slice(group);
                hit_offsets.push(out.hit_block_ids.len() - hit_start);
            }
        }
        if num_new + hit_tokens == 0 {
            out.hit_block_ids.truncate(hit_start);
            return Ok(Attempt::NoTokens);
        }
        let hits = (out.hit_block_ids.len() > hit_start).then(|| GroupBlocks {
            flat: &out.hit_block_ids[hit_start..],
            offsets: &hit_offsets,
        });
        let mut offsets = Vec::with_capacity(hit_offsets.len().max(2));
        let ok = Self::allocate(
            pool,
            tables,
            stats,
            waiting,
            req.id,
            request,
            num_new,
            hit_tokens,
            hits,
            req.num_lookahead_tokens,
            &mut out.block_ids,
            &mut offsets,
        )?;
        if !ok {
            out.hit_block_ids.truncate(hit_start);
            return Ok(Attempt::NoBlocks);
        }
        out.offsets.extend(offsets.iter().skip(1));
        if hit_offsets.is_empty() {
            let end = out.hit_block_ids.len();
            out.hit_offsets
                .extend(std::iter::repeat_n(end, self.tables.layout().len()));
        } else {
            out.hit_offsets
                .extend(hit_offsets.iter().skip(1).map(|&o| hit_start + o));
        }
        Ok(Attempt::Scheduled(num_new, hit_tokens))
    }

    fn preempt_request(&mut self, id: &RequestId) -> PoolResult<()> {
        self.preempt(id)
    }
}
