//! The pyo3-free core: block metadata, free queue, prefix map, the pool and its events.
//!
//! Arrows point one way: `block_pool` uses `free_queue`, `prefix_map`, `slab`,
//! `events`; `hash_key` and `error` are leaves. Nothing here knows Python exists.

mod block_pool;
mod error;
mod events;
mod free_queue;
mod hash_key;
mod prefix_map;
mod slab;

pub use block_pool::{check_offsets, BlockPool, CacheBlocks, PoolConfig, MAX_BLOCKS};
pub use error::{PoolError, PoolResult};
pub use events::PoolEvent;
pub use free_queue::FreeQueue;
pub use hash_key::{BlockHash, BlockHashKey, HashSlice, MAX_HASH_WIDTH};
pub use prefix_map::PrefixMap;
pub use slab::{BlockMeta, Slab, NIL};
