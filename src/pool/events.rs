//! KV-cache events, queued in emission order while events are enabled.
//!
//! Field names follow vLLM's `BlockStored` / `BlockRemoved` / `AllBlocksCleared`
//! (`vllm/distributed/kv_events.py`); the binding turns them into the dataclasses
//! of `kvpool.events`.

use super::hash_key::BlockHash;

/// One entry of a block's extra keys in a `BlockStored` event, untagged as vLLM 0.33's
/// `to_event_extra_keys` publishes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventExtraKey {
    /// A LoRA adapter's name or a cache salt.
    Text(String),
    /// A multimodal input: its identifier and its offset from the block's first token
    /// (negative when it began in an earlier block).
    Mm(String, i64),
    /// The SHA-256 digest of the block's prompt embeddings.
    Digest([u8; 32]),
}

/// What one `cache_full_blocks` call entered into the prefix cache (vLLM's
/// `BlockStored`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredBlocks {
    /// Hashes of the newly cached blocks, in block order.
    pub block_hashes: Vec<BlockHash>,
    /// Hash of the block before the first new one, if any.
    pub parent_block_hash: Option<BlockHash>,
    /// Token ids of the new blocks (empty when the caller gave none).
    pub token_ids: Vec<i64>,
    /// Tokens per block.
    pub block_size: u32,
    /// LoRA adapter id, if any.
    pub lora_id: Option<i64>,
    /// LoRA adapter name, if any.
    pub lora_name: Option<String>,
    /// KV-cache group.
    pub group_idx: u32,
    /// Each new block's extra keys as vLLM's event carries them, one entry per hash
    /// (`None`: a block without keys); `None` for the LoRA-only form, every block
    /// `[lora_name]` (or no keys without LoRA), which needs no list.
    pub extra_keys: Option<Vec<Option<Vec<EventExtraKey>>>>,
}

/// What became of events a caller took from a pool's queue.
#[derive(Debug)]
pub enum TakenEvents {
    /// Delivered (encoded, sent, handed on): only the buffer comes back, for its room.
    Consumed(Vec<PoolEvent>),
    /// Not delivered (the destination refused them): they go back to the front of the
    /// queue, ahead of any queued since, as if never taken.
    Refused(Vec<PoolEvent>),
}

/// One event of the prefix cache.
///
/// `BlockStored` is boxed so that the queue's slot for each event is small (40 bytes,
/// not 160): a step that evicts 4,000 blocks queues 4,000 `BlockRemoved`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolEvent {
    /// One `cache_full_blocks` call entered blocks into the prefix cache.
    BlockStored(Box<StoredBlocks>),
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

#[cfg(test)]
mod tests {
    #[test]
    fn a_queued_event_stays_small() {
        // A step that evicts thousands of blocks queues a `BlockRemoved` for each.
        assert!(std::mem::size_of::<super::PoolEvent>() <= 40);
    }
}
