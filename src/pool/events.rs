//! KV-cache events, queued in emission order while events are enabled.
//!
//! Field names follow vLLM's `BlockStored` / `BlockRemoved` / `AllBlocksCleared`
//! (`vllm/distributed/kv_events.py`); the binding turns them into the dataclasses
//! of `kvpool.events`.

use super::hash_key::BlockHash;

/// One event of the prefix cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolEvent {
    /// One `cache_full_blocks` call entered blocks into the prefix cache.
    BlockStored {
        /// Hashes of the newly cached blocks, in block order.
        block_hashes: Vec<BlockHash>,
        /// Hash of the block before the first new one, if any.
        parent_block_hash: Option<BlockHash>,
        /// Token ids of the new blocks (empty when the caller gave none).
        token_ids: Vec<i64>,
        /// Tokens per block.
        block_size: u32,
        /// LoRA adapter id, if any.
        lora_id: Option<i64>,
        /// LoRA adapter name, if any.
        lora_name: Option<String>,
        /// KV-cache group.
        group_idx: u32,
    },
    /// One block's hash left the prefix cache.
    BlockRemoved {
        /// The removed hash (one per event, as vLLM emits them).
        block_hash: BlockHash,
        /// KV-cache group.
        group_idx: u32,
    },
    /// The whole prefix cache was reset.
    AllBlocksCleared,
}
