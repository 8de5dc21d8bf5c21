//! The pyo3-free core: block metadata, free queue, prefix map, the pool and its events.
//!
//! Arrows point one way: `manager` -> `tracker` -> `block_pool` -> (`free_queue`,
//! `prefix_map`, `slab`, `events`); `block_tables` (the caller-owned variant of the
//! manager, for vLLM's scheduler) -> `block_pool`; both managers -> `slots`;
//! `hashing`, `hash_key`, `request_id` and `error` are leaves. Nothing here knows
//! Python exists.

mod block_pool;
mod block_tables;
mod error;
mod events;
mod free_queue;
mod hash_key;
pub mod hashing;
mod invariants;
mod key_hasher;
mod manager;
mod prefix_map;
mod release;
mod request_id;
mod slab;
mod slots;
mod stats;
mod step;
mod tracker;

pub use block_pool::{
    check_offsets, first_out_of_range, BlockPool, CacheBlocks, PoolConfig,
    DEFAULT_MAX_PENDING_EVENTS, MAX_BLOCKS,
};
pub use block_tables::{BlockTables, SlotCall};
pub use error::{PoolError, PoolResult};
pub use events::PoolEvent;
pub use free_queue::{FreeQueue, FrontBatch, Place, QueueParts};
pub use hash_key::{BlockHash, BlockHashKey, HashSlice, MAX_HASH_WIDTH};
pub use key_hasher::KeyHasher;
pub use manager::{KVCacheManager, LoraInfo, ManagerConfig};
pub use prefix_map::PrefixMap;
pub use request_id::{RequestId, RequestKey};
pub use slab::{BlockMeta, Slab, NIL};
pub use stats::PrefixCacheStats;
pub use step::{StepOutcome, StepRequest};
pub use tracker::{ComputedBlocksTracker, Sequence, SequenceExtras, SequenceHasher, TokenIds};
