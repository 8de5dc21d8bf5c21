//! The pyo3-free core: block metadata, free queue, prefix map, the pool and its events.
//!
//! Arrows point one way: `manager` -> `tracker` -> `block_pool` -> (`free_queue`
//! -> (`class_lists`, `eviction`), `prefix_map`, `slab`, `events`); `pins` and
//! `release` extend `block_pool`; `block_tables` (the caller-owned variant of the
//! manager, for vLLM's scheduler) -> `block_pool`; `group_tables` (the same for
//! several KV-cache groups) -> `group_hits`, `retention`, `kv_groups`,
//! `block_pool`; the managers and tables -> `slots`, `known_hashes`;
//! `hashing`, `hash_key`, `request_id`, `error` and `replay_ring` (an event
//! publisher's replay buffer) are leaves. Nothing here knows Python exists.

mod block_pool;
mod block_tables;
mod class_lists;
mod error;
mod events;
mod events_wire;
mod eviction;
mod free_queue;
mod group_hits;
mod group_manager;
mod group_steps;
mod group_tables;
mod hash_key;
pub mod hashing;
mod invariants;
mod key_hasher;
mod known_hashes;
mod kv_groups;
mod manager;
mod meta_store;
mod partial_keys;
pub use partial_keys::PartialBlock;
mod pins;
mod prefetch;
mod prefix_map;
mod release;
mod replay_ring;
mod request_id;
mod retention;
mod slab;
mod slots;
mod stats;
mod step;
mod stream_copy;
mod tracker;

pub use block_pool::{
    check_offsets, first_out_of_range, BlockPool, CacheBlocks, PoolConfig,
    DEFAULT_MAX_PENDING_EVENTS, MAX_BLOCKS, RECYCLED_EVENTS_MAX,
};
pub use block_tables::{BlockTables, SlotCall};
pub use class_lists::{ClassLists, ListEnds, MAX_CLASSES};
pub use error::{PoolError, PoolResult};
pub use events::{EventExtraKey, PoolEvent, StoredBlocks, TakenEvents};
pub use events_wire::{encode_event_batch, wire_hash, WireBatch};
pub use eviction::{
    default_adaptive_horizon, ghost_fingerprint, ghost_slots, ghost_table_ways, ghost_window,
    BlockPriority, Clock, Eviction, EvictionPolicy, ADAPTIVE_BANDS, ADAPTIVE_HORIZON,
    DEFAULT_PRIORITY, FULL_HORIZON_UNTIL, GHOSTS_PER_BLOCK, MAX_ADAPTIVE_HORIZON, MAX_PRIORITY,
    MIN_GHOST_WINDOW, NO_HORIZON_FROM,
};
pub use free_queue::{FreeQueue, FrontBatch, ListOrder, Place, QueueParts};
pub use group_hits::{check_window_max_length, find_longest_hit, find_spec_hit, GroupHit};
pub use group_manager::GroupManager;
pub use group_tables::{GroupBlocks, GroupSlotCall, GroupTables};
pub use hash_key::{BlockHash, BlockHashKey, HashSlice, MAX_HASH_WIDTH};
pub use key_hasher::KeyHasher;
pub use known_hashes::{KnownHashes, KnowsHashes};
pub use kv_groups::{AttentionKind, GroupSpec, KvGroups, SpecGroup};
pub use manager::{KVCacheManager, LoraInfo, ManagerConfig};
pub use prefix_map::PrefixMap;
pub use replay_ring::{AppendError, ReplayRing};
pub use request_id::{RequestId, RequestKey, RequestLookup};
pub use retention::{reachable_block_mask, replay_boundary};
pub use slab::{BlockMeta, Slab, NIL};
pub use stats::PrefixCacheStats;
pub use step::{StepLimits, StepOutcome, StepRequest, StepStatus, MAX_TOKEN_COUNT};
pub use tracker::{ComputedBlocksTracker, Sequence, SequenceExtras, SequenceHasher, TokenIds};
