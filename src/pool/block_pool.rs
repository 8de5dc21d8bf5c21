//! The block pool: allocation, freeing, touching, prefix caching and lookup.
//!
//! Semantics follow vLLM's v1 `BlockPool` (see `docs/semantics.md` of the
//! project). Every operation validates its whole input before it changes
//! anything, so an `Err` leaves the pool exactly as it was.

use super::error::{PoolError, PoolResult};
use std::collections::VecDeque;

use super::events::{EventExtraKey, PoolEvent, StoredBlocks, TakenEvents};
use super::eviction::{BlockPriority, Clock, Eviction, EvictionPolicy, GHOST_BATCH};
use super::free_queue::FreeQueue;
use super::hash_key::{BlockHash, BlockHashKey, HashSlice, MAX_HASH_WIDTH};
use super::key_hasher::KeyHasher;
use super::prefix_map::PrefixMap;
use super::slab::{BlockMeta, Slab, NIL};

/// Largest pool: block ids must fit in a numpy `int32`.
pub const MAX_BLOCKS: u32 = i32::MAX as u32;

/// How a pool is built.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// Number of blocks, ids `0..num_blocks`.
    pub num_blocks: u32,
    /// Keep a prefix cache of full blocks.
    pub enable_caching: bool,
    /// Reserve block 0 as vLLM's null block (never allocated, freed or cached).
    pub null_block: bool,
    /// Queue [`PoolEvent`]s.
    pub enable_events: bool,
    /// Tokens per block (for `BlockStored` events).
    pub block_size: u32,
    /// Width of every block hash in bytes; `None` fixes it at the first cached hash.
    pub hash_width: Option<usize>,
    /// Most events queued before the oldest are dropped (and counted).
    pub max_pending_events: usize,
    /// Which cached free block is evicted first (`eviction.rs`).
    pub eviction: EvictionPolicy,
    /// The adaptive policy's horizon: how much later than it was a block two or more
    /// requests used counts as freed, in cached blocks freed; `None` for the default
    /// of the pool's size ([`default_adaptive_horizon`]); 0 makes the policy LRU's
    /// order, and the pool keeps no ghost table then.
    ///
    /// [`default_adaptive_horizon`]: super::eviction::default_adaptive_horizon
    pub adaptive_horizon: Option<u64>,
    /// Run retention durations on a clock the caller advances
    /// ([`BlockPool::advance_clock`]) instead of the OS's monotonic clock.
    pub manual_clock: bool,
    /// Most blocks that may be pinned at once ([`BlockPool::pin_prefix`]).
    pub max_pinned_blocks: u32,
}

/// The most events whose room [`BlockPool::recycle_event_buffer`] keeps (40 bytes
/// each: 2.6 MB): a serving step of 100 requests queues about 4,400.
pub const RECYCLED_EVENTS_MAX: usize = 1 << 16;

/// Default bound on queued events: 1,000,000 (about 270 MB of `BlockStored`
/// events of 16 tokens), far beyond what one scheduler step emits.
pub const DEFAULT_MAX_PENDING_EVENTS: usize = 1_000_000;

impl PoolConfig {
    /// vLLM's defaults for a pool of `num_blocks`: caching on, a null block, no events,
    /// 16 tokens per block.
    pub fn new(num_blocks: u32) -> Self {
        Self {
            num_blocks,
            enable_caching: true,
            null_block: true,
            enable_events: false,
            block_size: 16,
            hash_width: None,
            max_pending_events: DEFAULT_MAX_PENDING_EVENTS,
            eviction: EvictionPolicy::Lru,
            adaptive_horizon: None,
            manual_clock: false,
            max_pinned_blocks: num_blocks / 4,
        }
    }

    /// The adaptive policy's horizon in force: the one given, else the default for
    /// the pool's size ([`default_adaptive_horizon`]).
    ///
    /// [`default_adaptive_horizon`]: super::eviction::default_adaptive_horizon
    pub fn horizon(&self) -> u64 {
        self.adaptive_horizon
            .unwrap_or_else(|| super::eviction::default_adaptive_horizon(self.num_blocks))
    }
}

/// One `cache_full_blocks` call: a request's blocks and hashes, of which blocks
/// `num_cached_blocks..num_full_blocks` are newly full.
#[derive(Clone, Copy, Debug)]
pub struct CacheBlocks<'a> {
    /// The request's block ids, from its first block.
    pub block_ids: &'a [u32],
    /// The request's block hashes, from its first block.
    pub block_hashes: HashSlice<'a>,
    /// Blocks of the request already cached.
    pub num_cached_blocks: usize,
    /// Blocks of the request now full.
    pub num_full_blocks: usize,
    /// KV-cache group of the blocks.
    pub group: u32,
    /// The request's token ids, for the `BlockStored` event.
    pub token_ids: Option<&'a [i64]>,
    /// LoRA adapter id for the event.
    pub lora_id: Option<i64>,
    /// LoRA adapter name for the event.
    pub lora_name: Option<&'a str>,
    /// Which of the new blocks (`num_cached_blocks..num_full_blocks`) to cache:
    /// `None` caches them all; a masked-out block is skipped as the null block is
    /// (a sliding-window group's blocks that no hit can use, `retention.rs`).
    pub block_mask: Option<&'a [bool]>,
    /// The new blocks' retention priority ([`EvictionPolicy::Priority`] only);
    /// `None`: the default.
    pub priority: Option<BlockPriority>,
    /// The new blocks' extra keys for the event, one entry per block of
    /// `num_cached_blocks..num_full_blocks` (`None`: the LoRA-only form).
    pub extra_keys: Option<&'a [Option<Vec<EventExtraKey>>]>,
    /// Tokens per block of the call's group, when it is not the pool's (a group whose
    /// blocks are larger than the hash granularity).
    pub block_size: Option<u32>,
}

impl<'a> CacheBlocks<'a> {
    /// A call with no token ids, no LoRA, group 0.
    pub fn new(
        block_ids: &'a [u32],
        block_hashes: HashSlice<'a>,
        num_cached_blocks: usize,
        num_full_blocks: usize,
    ) -> Self {
        Self {
            block_ids,
            block_hashes,
            num_cached_blocks,
            num_full_blocks,
            group: 0,
            token_ids: None,
            lora_id: None,
            lora_name: None,
            block_mask: None,
            priority: None,
            extra_keys: None,
            block_size: None,
        }
    }

    /// Whether the `i`-th new block (from `num_cached_blocks`) is to be cached.
    #[inline]
    pub(super) fn wanted(&self, i: usize) -> bool {
        self.block_mask.is_none_or(|m| m[i])
    }
}

/// A pool of KV-cache blocks with an LRU free queue and a prefix cache.
///
/// ```
/// use kvpool::pool::{BlockPool, PoolConfig, HashSlice};
/// let mut pool = BlockPool::new(PoolConfig::new(8)).unwrap();
/// let mut ids = Vec::new();
/// pool.get_new_blocks(2, &mut ids).unwrap();          // blocks 1 and 2 (0 is the null block)
/// let hashes = [1u8; 16];                              // two 8-byte hashes
/// let hashes = HashSlice::new(&hashes, 8).unwrap();
/// pool.cache_full_blocks(kvpool::pool::CacheBlocks::new(&ids, hashes, 0, 2)).unwrap();
/// pool.free_blocks(&[2, 1]).unwrap();                  // tail first
/// assert_eq!(pool.get_cached_block(&[1u8; 8], 0).unwrap(), Some(1));
/// ```
#[derive(Clone, Debug)]
pub struct BlockPool {
    // pub(super): `invariants.rs` walks them.
    pub(super) config: PoolConfig,
    pub(super) slab: Slab,
    pub(super) queue: FreeQueue,
    pub(super) map: PrefixMap,
    events: VecDeque<PoolEvent>,
    /// Events dropped because the queue was full, since the pool was built.
    dropped_events: u64,
    pub(super) hash_width: Option<usize>,
    /// Cached blocks of one free call that reached 0, bound for the tail
    /// (`release.rs`).
    pub(super) to_tail: Vec<u32>,
    /// Blocks held by a pin (`pins.rs`); each holds one reference.
    pub(super) pins: hashbrown::HashSet<u32>,
    /// Cached blocks evicted to make room, since the pool was built.
    evictions: u64,
    /// `(block, ghost fingerprint)` pairs of one call, for the adaptive policy.
    ghost_scratch: Vec<(u32, u64)>,
    /// Partial and extra keys (`partial_keys.rs`); empty unless a group's blocks are
    /// larger than the hash granularity.
    pub(super) partial: super::partial_keys::PartialKeys,
}

impl BlockPool {
    /// Builds a pool; every block starts free, in id order.
    pub fn new(config: PoolConfig) -> PoolResult<Self> {
        if config.num_blocks == 0 || config.num_blocks > MAX_BLOCKS {
            return Err(PoolError::InvalidArgument(format!(
                "num_blocks must be between 1 and {MAX_BLOCKS}, got {}",
                config.num_blocks
            )));
        }
        if config.block_size == 0 {
            return Err(PoolError::InvalidArgument(
                "block_size must be at least 1".into(),
            ));
        }
        if config.max_pending_events == 0 {
            return Err(PoolError::InvalidArgument(
                "max_pending_events must be at least 1".into(),
            ));
        }
        if let Some(horizon) = config.adaptive_horizon {
            if horizon > super::eviction::MAX_ADAPTIVE_HORIZON {
                return Err(PoolError::InvalidArgument(format!(
                    "adaptive_horizon must be between 0 and {}, got {horizon}",
                    super::eviction::MAX_ADAPTIVE_HORIZON,
                )));
            }
        }
        if let Some(w) = config.hash_width {
            if w == 0 || w > MAX_HASH_WIDTH {
                return Err(PoolError::InvalidArgument(format!(
                    "hash_width must be between 1 and {MAX_HASH_WIDTH}, got {w}"
                )));
            }
        }
        let reserved_keys = if config.enable_caching {
            config.num_blocks as usize
        } else {
            0
        };
        let mut slab = Slab::new(config.num_blocks)?;
        let first = u32::from(config.null_block);
        if config.null_block {
            *slab.get_mut(0) = BlockMeta::EMPTY;
        }
        let clock = if config.manual_clock {
            Clock::Manual(0.0)
        } else {
            Clock::Monotonic(std::time::Instant::now())
        };
        let eviction =
            Eviction::with_horizon(config.eviction, config.num_blocks, clock, config.horizon())?;
        let queue = FreeQueue::with_policy(first, config.num_blocks, eviction);
        Ok(Self {
            hash_width: config.hash_width,
            config,
            slab,
            queue,
            map: PrefixMap::with_hasher(KeyHasher::process(), reserved_keys)?,
            events: VecDeque::new(),
            dropped_events: 0,
            to_tail: Vec::new(),
            pins: hashbrown::HashSet::new(),
            evictions: 0,
            ghost_scratch: Vec::new(),
            partial: super::partial_keys::PartialKeys::default(),
        })
    }

    /// The eviction policy.
    pub fn eviction_policy(&self) -> EvictionPolicy {
        self.config.eviction
    }

    /// The eviction policy's state (uses, credits, priorities), for tests and stats.
    pub fn eviction(&self) -> &Eviction {
        self.queue.eviction()
    }

    /// The clock retention durations run on, in seconds.
    pub fn now(&self) -> f64 {
        self.queue.eviction().now()
    }

    /// Moves a manual clock ([`PoolConfig::manual_clock`]) forward by `seconds`.
    pub fn advance_clock(&mut self, seconds: f64) -> PoolResult<()> {
        self.queue.eviction_mut().advance_clock(seconds)
    }

    /// Lets every raised priority that ran out by now revert, so that
    /// [`free_block_ids`](Self::free_block_ids) shows the order allocation would use.
    pub fn apply_expiries(&mut self) {
        self.queue.apply_expiries(&mut self.slab);
    }

    /// Cached blocks evicted to make room for allocations, since the pool was built.
    pub fn num_evictions(&self) -> u64 {
        self.evictions
    }

    /// The fingerprint the adaptive policy's ghost table knows a key by.
    #[inline]
    fn fingerprint(key: &BlockHashKey) -> u64 {
        super::eviction::ghost_fingerprint(key)
    }

    /// The configuration the pool was built with.
    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    /// Number of blocks.
    pub fn num_blocks(&self) -> u32 {
        self.config.num_blocks
    }

    /// The null block's id, if the pool has one.
    pub fn null_block(&self) -> Option<u32> {
        self.config.null_block.then_some(0)
    }

    /// The width of the pool's block hashes, once fixed.
    pub fn hash_width(&self) -> Option<usize> {
        self.hash_width
    }

    #[inline]
    pub(super) fn is_null(&self, id: u32) -> bool {
        self.config.null_block && id == 0
    }

    /// Fails on the first id outside `0..num_blocks`.
    #[inline]
    pub fn check_ids(&self, ids: &[u32]) -> PoolResult<()> {
        let n = self.config.num_blocks;
        match first_out_of_range(ids, n) {
            Some(id) => Err(PoolError::InvalidBlockId {
                block_id: id as i64,
                num_blocks: n,
            }),
            None => Ok(()),
        }
    }

    pub(super) fn check_hash_width(&self, width: usize) -> PoolResult<()> {
        match self.hash_width {
            Some(w) if w != width => Err(PoolError::HashWidth {
                got: width,
                expected: Some(w),
            }),
            _ if width == 0 || width > MAX_HASH_WIDTH => Err(PoolError::HashWidth {
                got: width,
                expected: None,
            }),
            _ => Ok(()),
        }
    }

    // ------------------------------------------------------------ allocation

    /// Pops `n` blocks from the head of the free queue into `out`, evicting any
    /// cached hash they still hold; each gets reference count 1.
    pub fn get_new_blocks(&mut self, n: usize, out: &mut Vec<u32>) -> PoolResult<()> {
        if n > self.queue.len() {
            return Err(PoolError::NoFreeBlocks {
                requested: n,
                free: self.queue.len(),
            });
        }
        let from_list = self.queue.take_front_n(&mut self.slab, n, out);
        // Only blocks from the queue's lists can still hold a hash.
        if from_list == out.len() {
            return Ok(());
        }
        let adaptive = self.queue.eviction().ranks_by_use();
        let mut ghosts = std::mem::take(&mut self.ghost_scratch);
        // The adaptive policy records a batch at a time, its ghost lines asked for
        // (by the fingerprints kept since caching) before the keys leave the map
        // (`Eviction::prefetch_eviction`).
        for batch in out[from_list..].chunks(GHOST_BATCH) {
            ghosts.clear();
            if adaptive {
                let eviction = self.queue.eviction();
                for &id in batch {
                    if self.slab.get(id).key_slot != NIL {
                        let fingerprint = eviction.cached_fingerprint(id);
                        eviction.prefetch_eviction(fingerprint);
                        ghosts.push((id, fingerprint));
                    }
                }
            }
            for &id in batch {
                if let Some(_key) = self.drop_key(id) {
                    self.evictions += 1;
                    debug_assert!(!adaptive || ghosts.contains(&(id, Self::fingerprint(&_key))));
                }
            }
            if adaptive {
                self.queue.eviction_mut().on_evicted_many(&ghosts);
            }
        }
        self.ghost_scratch = ghosts;
        Ok(())
    }

    /// Removes block `id` from the prefix cache, if it is there (one `BlockRemoved`);
    /// returns the key it held.
    #[inline]
    pub(super) fn drop_key(&mut self, id: u32) -> Option<BlockHashKey> {
        let slot = std::mem::replace(&mut self.slab.get_mut(id).key_slot, NIL);
        if slot == NIL {
            return None;
        }
        let key = self.map.remove(slot);
        if self.config.enable_events {
            self.emit(PoolEvent::BlockRemoved {
                block_hash: key.hash,
                group_idx: key.group,
            });
        }
        if !self.partial.is_empty() {
            self.drop_partial_keys(id);
        }
        Some(key)
    }

    /// Allocates for several requests at once: `counts[i]` blocks for request `i`,
    /// appended to `out` in order, with `offsets` (`counts.len() + 1` entries, from 0)
    /// marking where each request's blocks start. All or nothing.
    pub fn get_new_blocks_many(
        &mut self,
        counts: &[usize],
        out: &mut Vec<u32>,
        offsets: &mut Vec<usize>,
    ) -> PoolResult<()> {
        let total = counts.iter().try_fold(0usize, |acc, &c| acc.checked_add(c));
        let total = total.unwrap_or(usize::MAX);
        if total > self.queue.len() {
            return Err(PoolError::NoFreeBlocks {
                requested: total,
                free: self.queue.len(),
            });
        }
        out.reserve(total);
        offsets.reserve(counts.len() + 1);
        offsets.push(out.len());
        for &c in counts {
            self.get_new_blocks(c, out)?;
            offsets.push(out.len());
        }
        Ok(())
    }

    /// Takes a reference to each block (a prefix-cache hit reused by a request):
    /// a free block leaves the free queue. Its hash stays. The null block is skipped.
    pub fn touch(&mut self, ids: &[u32]) -> PoolResult<()> {
        self.check_ids(ids)?;
        for &id in ids {
            if self.is_null(id) {
                continue;
            }
            if self.slab.get(id).ref_cnt == 0 {
                self.queue.remove(&mut self.slab, id);
            }
            let meta = self.slab.get_mut(id);
            meta.ref_cnt = meta.ref_cnt.saturating_add(1);
            self.queue.eviction_mut().on_use(id);
        }
        Ok(())
    }

    // ------------------------------------------------------------ prefix cache

    /// Enters a request's newly full blocks into the prefix cache (see
    /// [`CacheBlocks`]) and queues one `BlockStored` event.
    pub fn cache_full_blocks(&mut self, call: CacheBlocks<'_>) -> PoolResult<()> {
        if !self.config.enable_caching {
            return Err(PoolError::CachingDisabled);
        }
        let CacheBlocks {
            block_ids,
            block_hashes,
            num_cached_blocks,
            num_full_blocks,
            ..
        } = call;
        if num_cached_blocks > num_full_blocks {
            return Err(PoolError::InvalidArgument(format!(
                "num_cached_blocks ({num_cached_blocks}) exceeds num_full_blocks ({num_full_blocks})"
            )));
        }
        if num_full_blocks > block_ids.len() || num_full_blocks > block_hashes.len() {
            return Err(PoolError::InvalidArgument(format!(
                "num_full_blocks ({num_full_blocks}) exceeds the {} block ids or the {} block hashes given",
                block_ids.len(),
                block_hashes.len()
            )));
        }
        self.check_ids(block_ids)?;
        if !block_hashes.is_empty() {
            self.check_hash_width(block_hashes.width())?;
        }
        if let Some(mask) = call.block_mask {
            if mask.len() != num_full_blocks - num_cached_blocks {
                return Err(PoolError::InvalidArgument(format!(
                    "block_mask has {} entries for {} new full blocks",
                    mask.len(),
                    num_full_blocks - num_cached_blocks
                )));
            }
        }
        let block_size = call.block_size.unwrap_or(self.config.block_size) as usize;
        if let Some(tokens) = call.token_ids {
            if tokens.len() < num_full_blocks * block_size {
                return Err(PoolError::InvalidArgument(format!(
                    "{} token ids cannot fill {num_full_blocks} blocks of {block_size} tokens",
                    tokens.len()
                )));
            }
        }
        if call.priority.is_some() && self.config.eviction != EvictionPolicy::Priority {
            return Err(PoolError::InvalidArgument(format!(
                "a retention priority needs a pool built with eviction='priority' (this one evicts by {})",
                self.config.eviction.name()
            )));
        }
        if num_cached_blocks == num_full_blocks {
            return Ok(());
        }
        let new_blocks = &block_ids[num_cached_blocks..num_full_blocks];
        if !self.partial.is_empty() {
            // Promotions drop keys (and emit events) as they go: check the whole call
            // first, so that a refused one changes nothing.
            self.check_promotions(new_blocks, &call, block_size)?;
        }
        // The adaptive policy's ghost lookups, each key's fingerprint taken while the
        // key is at hand; the policy is told once every block is in.
        let adaptive = self.queue.eviction().ranks_by_use();
        let mut cached = std::mem::take(&mut self.ghost_scratch);
        cached.clear();
        for (i, &id) in new_blocks.iter().enumerate() {
            if self.is_null(id) || !call.wanted(i) {
                continue;
            }
            let meta = *self.slab.get(id);
            if meta.is_cached() && self.promotes(id, (num_cached_blocks + i + 1) * block_size) {
                self.drop_key(id);
            }
            let meta = *self.slab.get(id);
            let problem = if meta.ref_cnt == 0 {
                Some("is free: only a block in use can be cached")
            } else if meta.is_cached() {
                Some("already holds a block hash")
            } else {
                None
            };
            if let Some(reason) = problem {
                self.uncache(&new_blocks[..i], &call);
                self.ghost_scratch = cached;
                return Err(PoolError::BlockState {
                    block_id: id,
                    reason,
                });
            }
            let hash = block_hashes.block_hash(num_cached_blocks + i);
            // The block's end position in its chain (vLLM's block_hash_num_tokens);
            // a sequence past u32::MAX tokens reads u32::MAX.
            let tokens = (num_cached_blocks + i + 1).saturating_mul(block_size);
            let tokens = u32::try_from(tokens).unwrap_or(u32::MAX);
            let key = BlockHashKey::new(hash, call.group);
            if adaptive {
                let fingerprint = Self::fingerprint(&key);
                self.queue.eviction().prefetch_caching(fingerprint);
                cached.push((id, fingerprint));
            }
            let slot = self.map.insert(key, id, tokens);
            self.slab.get_mut(id).key_slot = slot;
        }
        // Only once every block is in: a refused call leaves the policy untouched.
        match self.config.eviction {
            EvictionPolicy::Lru => {}
            EvictionPolicy::Priority => {
                let priority = call.priority.unwrap_or(BlockPriority::DEFAULT);
                for (i, &id) in new_blocks.iter().enumerate() {
                    if !self.is_null(id) && call.wanted(i) {
                        self.queue.eviction_mut().set_priority(id, priority);
                    }
                }
            }
            EvictionPolicy::Adaptive => self.queue.eviction_mut().on_cached_many(&cached),
        }
        self.ghost_scratch = cached;
        if self.hash_width.is_none() {
            self.hash_width = Some(block_hashes.width());
        }
        if self.config.enable_events {
            let hashes = new_blocks
                .iter()
                .enumerate()
                .filter(|&(i, &id)| !self.is_null(id) && call.wanted(i))
                .map(|(i, _)| block_hashes.block_hash(num_cached_blocks + i))
                .collect();
            let token_ids = call
                .token_ids
                .map(|t| t[num_cached_blocks * block_size..num_full_blocks * block_size].to_vec())
                .unwrap_or_default();
            let extra_keys = call.extra_keys.map(|keys| {
                new_blocks
                    .iter()
                    .enumerate()
                    .filter(|&(i, &id)| !self.is_null(id) && call.wanted(i))
                    .map(|(i, _)| keys[i].clone())
                    .collect()
            });
            self.emit(PoolEvent::BlockStored(Box::new(StoredBlocks {
                block_hashes: hashes,
                parent_block_hash: num_cached_blocks
                    .checked_sub(1)
                    .map(|i| block_hashes.block_hash(i)),
                token_ids,
                block_size: block_size as u32,
                lora_id: call.lora_id,
                lora_name: call.lora_name.map(str::to_owned),
                group_idx: call.group,
                extra_keys,
            })));
        }
        Ok(())
    }

    /// Tells the eviction policy that block `id` now holds `key`.
    #[inline]
    pub(super) fn note_cached(
        &mut self,
        id: u32,
        key: &BlockHashKey,
        priority: Option<BlockPriority>,
    ) {
        match self.config.eviction {
            EvictionPolicy::Lru => {}
            EvictionPolicy::Priority => self
                .queue
                .eviction_mut()
                .set_priority(id, priority.unwrap_or(BlockPriority::DEFAULT)),
            EvictionPolicy::Adaptive => {
                if self.queue.eviction().ranks_by_use() {
                    let fingerprint = Self::fingerprint(key);
                    self.queue.eviction_mut().on_cached(id, fingerprint);
                }
            }
        }
    }

    /// Rolls back a partial `cache_full_blocks`: drops the keys just given to `ids`
    /// (the first new blocks of `call`).
    fn uncache(&mut self, ids: &[u32], call: &CacheBlocks<'_>) {
        for (i, &id) in ids.iter().enumerate() {
            if self.is_null(id) || !call.wanted(i) {
                continue;
            }
            let slot = std::mem::replace(&mut self.slab.get_mut(id).key_slot, NIL);
            if slot != NIL {
                self.map.remove(slot);
            }
        }
    }

    /// The first-inserted block cached under `hash` in `group`, if any (a hash of
    /// another width than the pool's simply misses).
    #[inline]
    pub fn cached_block(&self, hash: BlockHash, group: u32) -> Option<u32> {
        self.map.get(&BlockHashKey::new(hash, group))
    }

    /// The first-inserted block cached under `hash` in `group`, if any.
    pub fn get_cached_block(&self, hash: &[u8], group: u32) -> PoolResult<Option<u32>> {
        self.check_hash_width(hash.len())?;
        let key = BlockHashKey::new(BlockHash::new(hash)?, group);
        Ok(self.map.get(&key))
    }

    /// Appends to `out` the cached blocks of the longest prefix of `hashes` (at most
    /// `max_blocks`) that is cached in `group`: the scan stops at the first miss.
    /// Returns the number of hits. Changes nothing.
    pub fn find_longest_cache_hit(
        &self,
        hashes: HashSlice<'_>,
        group: u32,
        max_blocks: Option<usize>,
        out: &mut Vec<u32>,
    ) -> PoolResult<usize> {
        if hashes.is_empty() {
            return Ok(0);
        }
        self.check_hash_width(hashes.width())?;
        let limit = max_blocks.map_or(hashes.len(), |m| m.min(hashes.len()));
        let start = out.len();
        for i in 0..limit {
            match self
                .map
                .get(&BlockHashKey::new(hashes.block_hash(i), group))
            {
                Some(id) => out.push(id),
                None => break,
            }
        }
        Ok(out.len() - start)
    }

    /// Drops the cached hash of each block (in use or not); frees nothing, except
    /// that a pinned block loses its pin (and the reference the pin held). A free
    /// block keeps its place under LRU; under the other policies it moves to the head.
    pub fn evict_blocks(&mut self, ids: &[u32]) -> PoolResult<()> {
        self.check_ids(ids)?;
        // Under LRU a free block keeps its place (vLLM's order). Under the other
        // policies uncached free blocks are reused before any cached one, so a free
        // block that loses its key joins them at the head, in the order given.
        let mut uncached_free = Vec::new();
        for &id in ids {
            if self.drop_key(id).is_some() && self.config.eviction != EvictionPolicy::Lru {
                let meta = *self.slab.get(id);
                if meta.ref_cnt == 0
                    && super::free_queue::Place::of(&meta) == super::free_queue::Place::List
                {
                    uncached_free.push(id);
                }
            }
        }
        for &id in &uncached_free {
            self.queue.remove(&mut self.slab, id);
        }
        self.queue.push_front_n(&mut self.slab, &uncached_free);
        self.unpin_evicted(ids);
        Ok(())
    }

    /// Gives block `id`, which has no key, the key `key` as inserting into vLLM's
    /// `cached_block_hash_to_block` dict does (`kvpool.vllm`'s stand-in pool): a block
    /// in use keeps its place; a free one is taken out of the free queue, keyed and
    /// freed again, so it goes to the queue's tail with its key, as freeing a cached
    /// block puts it. `tokens` as for [`Self::set_block_key`]. Every check comes
    /// first: a refused call changes nothing.
    pub fn insert_block_key(&mut self, id: u32, key: BlockHashKey, tokens: u32) -> PoolResult<()> {
        let meta = self.keyable_block(id)?;
        self.check_new_key(id, &meta, &key)?;
        if meta.ref_cnt > 0 {
            return self.set_block_key(id, Some(key), tokens);
        }
        self.touch(&[id])?;
        self.set_block_key(id, Some(key), tokens)?;
        self.free_blocks(&[id])
    }

    /// Block `id`'s metadata, if it may hold a key: caching is on, the id is in range
    /// and not the null block.
    fn keyable_block(&self, id: u32) -> PoolResult<BlockMeta> {
        if !self.config.enable_caching {
            return Err(PoolError::CachingDisabled);
        }
        self.check_ids(&[id])?;
        if self.is_null(id) {
            return Err(PoolError::BlockState {
                block_id: id,
                reason: "is the null block",
            });
        }
        Ok(*self.slab.get(id))
    }

    /// Block `id` (of metadata `meta`) has no key yet, and `key` is of the pool's width.
    fn check_new_key(&self, id: u32, meta: &BlockMeta, key: &BlockHashKey) -> PoolResult<()> {
        self.check_hash_width(key.hash.as_bytes().len())?;
        if meta.is_cached() {
            return Err(PoolError::BlockState {
                block_id: id,
                reason: "already holds a block hash",
            });
        }
        Ok(())
    }

    /// Gives block `id` the prefix-cache key `key`, or takes its key away (`None`),
    /// where it is: no event, no move in the free queue. This is what editing vLLM's
    /// `cached_block_hash_to_block` dict does, which vLLM's own tests do to fake an
    /// eviction and undo it (`kvpool.vllm`'s views). A key goes only to a block
    /// without one that is in use or free in the queue's list; an uncached free block
    /// (on the queue's stack or fresh) has no place for one. `tokens` is the length of
    /// the sequence the key covers ([`Self::block_hash_num_tokens`]; 0: unknown).
    pub fn set_block_key(
        &mut self,
        id: u32,
        key: Option<BlockHashKey>,
        tokens: u32,
    ) -> PoolResult<()> {
        let meta = self.keyable_block(id)?;
        let Some(key) = key else {
            if meta.key_slot != NIL {
                self.map.remove(meta.key_slot);
                self.slab.get_mut(id).key_slot = NIL;
                self.partial.primary_tokens.remove(&id);
                for slot in self.partial.extra_slots.remove(&id).unwrap_or_default() {
                    self.map.remove(slot);
                }
            }
            return Ok(());
        };
        self.check_new_key(id, &meta, &key)?;
        if meta.ref_cnt == 0
            && super::free_queue::Place::of(&meta) != super::free_queue::Place::List
        {
            return Err(PoolError::BlockState {
                block_id: id,
                reason: "is free and uncached: it has no place in the queue for a key",
            });
        }
        let slot = self.map.insert(key, id, tokens);
        self.slab.get_mut(id).key_slot = slot;
        if meta.ref_cnt > 0 {
            self.note_cached(id, &key, None);
        } else if self.queue.eviction().ranks_by_use() {
            // A free block keeps its policy state (its list depends on it), but the
            // adaptive policy records its eviction under its key's fingerprint.
            let fingerprint = Self::fingerprint(&key);
            self.queue
                .eviction_mut()
                .on_key_set_while_free(id, fingerprint);
        }
        if self.hash_width.is_none() {
            self.hash_width = Some(key.hash.as_bytes().len());
        }
        Ok(())
    }

    /// Clears the whole prefix cache if no block is in use; returns whether it did.
    pub fn reset_prefix_cache(&mut self) -> bool {
        if self.num_used_blocks() > 0 {
            return false;
        }
        let slab = &mut self.slab;
        self.map.drain_blocks(|id| slab.get_mut(id).key_slot = NIL);
        self.partial.clear();
        self.queue.eviction_mut().on_reset();
        if self.config.enable_events {
            self.emit(PoolEvent::AllBlocksCleared);
        }
        true
    }

    // ------------------------------------------------------------ observation

    /// Blocks in the free queue.
    pub fn num_free_blocks(&self) -> usize {
        self.queue.len()
    }

    /// Blocks holding a cached hash.
    pub fn num_cached_blocks(&self) -> usize {
        // A block with extra keys (`partial_keys.rs`) counts once.
        self.map.len() - self.partial.num_extra_keys()
    }

    /// Distinct keys in the prefix cache (a key shared by several blocks counts once;
    /// a block's extra keys, `partial_keys.rs`, count): the length of vLLM's
    /// `cached_block_hash_to_block`. O(1).
    pub fn num_cached_keys(&self) -> usize {
        self.map.num_keys()
    }

    /// Blocks held by requests (the null block not counted).
    pub fn num_used_blocks(&self) -> usize {
        self.usable_blocks() - self.queue.len()
    }

    fn usable_blocks(&self) -> usize {
        self.config.num_blocks as usize - usize::from(self.config.null_block)
    }

    /// Fraction of usable blocks in use: `1 - free / usable`.
    pub fn usage(&self) -> f64 {
        let usable = self.usable_blocks();
        if usable == 0 {
            return 0.0;
        }
        1.0 - self.queue.len() as f64 / usable as f64
    }

    /// Hands over the queued events, oldest first.
    pub fn take_events(&mut self) -> Vec<PoolEvent> {
        Vec::from(std::mem::take(&mut self.events))
    }

    /// Gives back a buffer [`take_events`](Self::take_events) returned, once its events
    /// are consumed: the next events are queued in its room (when the queue is still
    /// empty and smaller), so that a step's events do not grow a fresh queue by
    /// doubling, copying it each time into memory no cache holds. Drop the events
    /// first (`clear`) to keep that work out of the caller's lock.
    ///
    /// A buffer with room for more than [`RECYCLED_EVENTS_MAX`] events (a burst) is
    /// dropped instead, so that one burst does not keep its memory for good.
    pub fn recycle_event_buffer(&mut self, mut buffer: Vec<PoolEvent>) {
        buffer.clear();
        if self.events.is_empty()
            && buffer.capacity() > self.events.capacity()
            && buffer.capacity() <= RECYCLED_EVENTS_MAX
        {
            self.events = VecDeque::from(buffer);
        }
    }

    /// Takes back events [`take_events`](Self::take_events) returned: a consumed
    /// batch's buffer is recycled ([`recycle_event_buffer`](Self::recycle_event_buffer));
    /// refused events are queued again in front of any queued since, in their order,
    /// the oldest dropped (and counted) beyond [`PoolConfig::max_pending_events`].
    pub fn return_events(&mut self, taken: TakenEvents) {
        match taken {
            TakenEvents::Consumed(buffer) => self.recycle_event_buffer(buffer),
            TakenEvents::Refused(events) => {
                let newer = std::mem::replace(&mut self.events, VecDeque::from(events));
                self.events.extend(newer);
                let excess = self
                    .events
                    .len()
                    .saturating_sub(self.config.max_pending_events);
                self.events.drain(..excess);
                self.dropped_events += excess as u64;
            }
        }
    }

    /// Number of queued events.
    pub fn num_pending_events(&self) -> usize {
        self.events.len()
    }

    /// Events dropped, oldest first, because [`PoolConfig::max_pending_events`]
    /// were already queued; counted since the pool was built.
    pub fn num_dropped_events(&self) -> u64 {
        self.dropped_events
    }

    /// Queues `event`, dropping the oldest if the queue is full.
    #[inline]
    pub(super) fn emit(&mut self, event: PoolEvent) {
        if self.events.len() >= self.config.max_pending_events {
            self.events.pop_front();
            self.dropped_events += 1;
        }
        self.events.push_back(event);
    }

    /// The free queue, head (next to be reused) to tail.
    pub fn free_block_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.queue.iter(&self.slab)
    }

    /// Block `id`'s reference count.
    pub fn ref_count(&self, id: u32) -> PoolResult<u32> {
        self.check_ids(&[id])?;
        Ok(self.slab.get(id).ref_cnt)
    }

    /// Every block's reference count, in id order.
    pub fn ref_counts(&self) -> impl Iterator<Item = u32> + '_ {
        self.slab.iter().map(|m| m.ref_cnt)
    }

    /// The blocks that hold a key (their own: [`Self::block_hash`] is `Some`), in id
    /// order. O(cached keys) from the prefix map, plus a sort, not O(blocks of the pool).
    pub fn cached_block_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self
            .map
            .live_entries()
            .filter(|&(slot, block)| self.slab.get(block).key_slot == slot)
            .map(|(_, block)| block)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// Block `id`'s cached key, if it holds one.
    pub fn block_hash(&self, id: u32) -> PoolResult<Option<BlockHashKey>> {
        self.check_ids(&[id])?;
        let slot = self.slab.get(id).key_slot;
        Ok((slot != NIL).then(|| *self.map.key_at(slot)))
    }

    /// The length of the sequence block `id`'s key covers (vLLM's
    /// `KVCacheBlock.block_hash_num_tokens`): its end position in its chain, or the
    /// boundary of a partial entry. `None` while the block holds no key, or when the
    /// key was given without a count (`set_block_key`).
    pub fn block_hash_num_tokens(&self, id: u32) -> PoolResult<Option<u32>> {
        self.check_ids(&[id])?;
        let slot = self.slab.get(id).key_slot;
        Ok((slot != NIL)
            .then(|| self.map.tokens_at(slot))
            .filter(|&t| t > 0))
    }

    /// The free block just before block `id` in the free queue, toward the head:
    /// vLLM's `KVCacheBlock.prev_free_block`. `None` when `id` is the head or not free.
    /// O(1) for a cached block under LRU and priorities; see the free queue's
    /// `id_before` for the rest. Expiries due are applied first, as for every read of
    /// the order.
    pub fn free_block_id_before(&mut self, id: u32) -> PoolResult<Option<u32>> {
        self.check_ids(&[id])?;
        self.apply_expiries();
        Ok(self.queue.id_before(&self.slab, id))
    }

    /// The free queue's last block (vLLM's `fake_free_list_tail.prev_free_block`), or
    /// `None` when no block is free. O(1) whenever a cached block is free, under every
    /// policy; see the free queue's `last_id`. Expiries due are applied first, as for
    /// every read of the order.
    pub fn last_free_block_id(&mut self) -> Option<u32> {
        self.apply_expiries();
        self.queue.last_id(&self.slab)
    }

    /// A number that changes whenever the free queue may have changed (a block
    /// taken, freed, moved or re-classed; the eviction policy's state updated): equal
    /// numbers mean the same queue in the same order, so a walk that read part of it
    /// ([`Self::free_block_ids_after`]) can go on from where it stopped.
    pub fn free_queue_version(&self) -> u64 {
        self.queue.version()
    }

    /// The free queue after block `cursor`, head to tail (from the head when `None`;
    /// nothing when `cursor` is not free), at most `max` ids appended to `out`: vLLM's
    /// `FreeKVCacheBlockQueue.iter_blocks_after`, which offloading connectors walk in
    /// steps. O(max) from any free block under LRU and priorities, and from an
    /// uncached one under every policy; from a cached block under the adaptive policy
    /// also O(its position among the cached blocks); from a never-used block, also
    /// O(the never-used blocks after it taken out of order, by `touch`, which engines
    /// do not do: each such gap is paid once by a walk). Expiries due are applied
    /// first, as for every read of the order.
    pub fn free_block_ids_after(
        &mut self,
        cursor: Option<u32>,
        max: usize,
        out: &mut Vec<u32>,
    ) -> PoolResult<()> {
        if let Some(cursor) = cursor {
            self.check_ids(&[cursor])?;
        }
        self.apply_expiries();
        self.queue.ids_after(&self.slab, cursor, max, out);
        Ok(())
    }
}

/// The first id of `ids` that is not below `num_blocks`, if any. One branch-free
/// pass (it vectorizes); the culprit is looked up only when there is one.
#[inline(always)]
pub fn first_out_of_range(ids: &[u32], num_blocks: u32) -> Option<u32> {
    if ids.iter().fold(true, |ok, &id| ok & (id < num_blocks)) {
        return None;
    }
    ids.iter().copied().find(|&id| id >= num_blocks)
}

/// Offsets cutting a flat array of `len` items into segments: from 0, non-decreasing,
/// ending at `len`.
pub fn check_offsets(offsets: &[usize], len: usize) -> PoolResult<()> {
    let ok = offsets.first() == Some(&0)
        && offsets.last() == Some(&len)
        && offsets.windows(2).all(|w| w[0] <= w[1]);
    if ok {
        Ok(())
    } else {
        Err(PoolError::InvalidArgument(format!(
            "offsets must start at 0, never decrease and end at {len} (the number of ids)"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool_with_events() -> BlockPool {
        let mut config = PoolConfig::new(8);
        config.enable_events = true;
        BlockPool::new(config).unwrap()
    }

    #[test]
    fn a_recycled_event_buffer_takes_the_next_events() {
        let mut pool = pool_with_events();
        pool.recycle_event_buffer(Vec::with_capacity(1_000));
        assert!(pool.events.capacity() >= 1_000);
        assert!(pool.reset_prefix_cache());
        let events = pool.take_events();
        assert_eq!(events, vec![PoolEvent::AllBlocksCleared]);
        assert!(
            events.capacity() >= 1_000,
            "the events came in the recycled room"
        );
        // A queue that already holds events keeps them, and its own room.
        assert!(pool.reset_prefix_cache());
        pool.recycle_event_buffer(events);
        assert_eq!(pool.take_events(), vec![PoolEvent::AllBlocksCleared]);
        // A burst's room is not kept.
        pool.recycle_event_buffer(Vec::with_capacity(RECYCLED_EVENTS_MAX + 1));
        assert!(pool.events.capacity() <= RECYCLED_EVENTS_MAX);
    }

    /// A free cached block given another key where it stands (what editing vLLM's
    /// `cached_block_hash_to_block` does) is evicted under that key: the adaptive
    /// policy's ghost table remembers the new key's uses, not the old one's.
    #[test]
    fn a_key_set_on_a_free_block_is_the_one_its_eviction_records() {
        let mut config = PoolConfig::new(5);
        config.eviction = EvictionPolicy::Adaptive;
        config.adaptive_horizon = Some(100);
        let mut pool = BlockPool::new(config).unwrap();
        let key = |n: u8| BlockHashKey::new(BlockHash::new(&[n; 32]).unwrap(), 0);
        let mut ids = Vec::new();
        pool.get_new_blocks(1, &mut ids).unwrap();
        let id = ids[0];
        pool.set_block_key(id, Some(key(1)), 16).unwrap();
        pool.free_blocks(&[id]).unwrap();
        // Free and cached: its key replaced where it stands.
        pool.set_block_key(id, None, 0).unwrap();
        pool.set_block_key(id, Some(key(2)), 16).unwrap();
        pool.check_invariants().unwrap();
        // Allocating the whole pool evicts it, recorded under key 2 with its one use:
        // key 2 comes back with two uses, key 1 as new.
        let mut all = Vec::new();
        pool.get_new_blocks(4, &mut all).unwrap();
        pool.set_block_key(all[0], Some(key(2)), 16).unwrap();
        pool.set_block_key(all[1], Some(key(1)), 16).unwrap();
        assert_eq!(pool.queue.eviction().uses(all[0]), 2);
        assert_eq!(pool.queue.eviction().uses(all[1]), 1);
        pool.check_invariants().unwrap();
    }

    #[test]
    fn refused_events_go_back_in_front_of_newer_ones() {
        let mut config = PoolConfig::new(8);
        config.enable_events = true;
        config.max_pending_events = 3;
        let mut pool = BlockPool::new(config).unwrap();
        let removed = |n: u32| PoolEvent::BlockRemoved {
            block_hash: BlockHash::new(&[n as u8; 32]).unwrap(),
            group_idx: n,
        };
        pool.emit(removed(1));
        pool.emit(removed(2));
        let taken = pool.take_events();
        pool.emit(removed(3));
        pool.emit(removed(4));
        pool.return_events(TakenEvents::Refused(taken));
        // Four events for three places: the oldest goes, and is counted.
        let ids: Vec<_> = pool
            .take_events()
            .into_iter()
            .map(|e| match e {
                PoolEvent::BlockRemoved { group_idx, .. } => group_idx,
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(ids, vec![2, 3, 4]);
        assert_eq!(pool.num_dropped_events(), 1);
        // A consumed batch only lends its room.
        pool.return_events(TakenEvents::Consumed(Vec::with_capacity(100)));
        assert_eq!(pool.num_pending_events(), 0);
    }
}
