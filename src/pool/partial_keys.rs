//! Prefix-cache keys beyond a block's one full-block key: vLLM 0.33's partial entries
//! (`BlockPool.cache_partial_block`).
//!
//! When a KV-cache group's blocks are larger than the hash granularity
//! (`hash_block_size`), vLLM also caches a prompt's last block under the hash at the
//! prompt's last hash boundary inside it, a *partial* entry. Such a block's key covers
//! fewer tokens than the block; when the block fills, caching it promotes it: the partial
//! key goes (a `BlockRemoved`) and the full one comes. A block that already holds its
//! full key takes the partial one as an extra key, and eviction then removes both.
//!
//! The slab keeps one key per block (its primary); this side table keeps the rest: the
//! token count of each partial primary, and the prefix-map slots of extra keys. Pools
//! without such groups never fill it, and every path tests it for emptiness first.

use hashbrown::HashMap;

use super::block_pool::BlockPool;
use super::error::{PoolError, PoolResult};
use super::events::{EventExtraKey, PoolEvent, StoredBlocks};
use super::hash_key::{BlockHash, BlockHashKey};
use super::slab::NIL;

/// A block's keys beyond its full-block primary key.
#[derive(Clone, Debug, Default)]
pub(super) struct PartialKeys {
    /// Per block whose primary key is a partial entry: the tokens it covers.
    pub(super) primary_tokens: HashMap<u32, u32>,
    /// Per block: the prefix-map slots of its extra keys, in insertion order.
    pub(super) extra_slots: HashMap<u32, Vec<u32>>,
}

impl PartialKeys {
    /// True when no block holds a partial or extra key.
    #[inline]
    pub(super) fn is_empty(&self) -> bool {
        self.primary_tokens.is_empty() && self.extra_slots.is_empty()
    }

    /// Extra keys held, over all blocks.
    pub(super) fn num_extra_keys(&self) -> usize {
        if self.extra_slots.is_empty() {
            return 0;
        }
        self.extra_slots.values().map(Vec::len).sum()
    }

    /// Forgets everything (the prefix cache was reset).
    pub(super) fn clear(&mut self) {
        self.primary_tokens.clear();
        self.extra_slots.clear();
    }
}

/// One `cache_partial_block` call: block `block_id` becomes reachable from the prefix
/// boundary at `num_tokens` (a multiple of the hash granularity inside the block).
#[derive(Clone, Debug)]
pub struct PartialBlock<'a> {
    /// The block.
    pub block_id: u32,
    /// The chained hash at the boundary.
    pub hash: BlockHash,
    /// KV-cache group of the entry.
    pub group: u32,
    /// Tokens the entry covers (the boundary).
    pub num_tokens: u32,
    /// For the `BlockStored` event: the hash one hash block before the boundary.
    pub parent: Option<BlockHash>,
    /// For the event: the tokens of the last hash block before the boundary.
    pub token_ids: &'a [i64],
    /// For the event: the hash granularity.
    pub hash_block_size: u32,
    /// For the event: the LoRA adapter's id and name.
    pub lora_id: Option<i64>,
    /// See [`PartialBlock::lora_id`].
    pub lora_name: Option<&'a str>,
    /// For the event: the extra keys of the last hash block before the boundary.
    pub extra_keys: Option<Option<Vec<EventExtraKey>>>,
}

impl BlockPool {
    /// vLLM's `cache_partial_block`: makes `call.block_id` reachable under the partial
    /// key, as its primary key when it has none, else as an extra one. A block whose
    /// partial primary covers fewer tokens first loses its keys (`BlockRemoved`
    /// events). The first registration emits one `BlockStored`; the null block is
    /// skipped.
    pub fn cache_partial_block(&mut self, call: PartialBlock<'_>) -> PoolResult<()> {
        if !self.config.enable_caching {
            return Err(PoolError::CachingDisabled);
        }
        self.check_ids(&[call.block_id])?;
        self.check_hash_width(call.hash.as_bytes().len())?;
        let id = call.block_id;
        if self.is_null(id) {
            return Ok(());
        }
        if self.slab.get(id).ref_cnt == 0 {
            return Err(PoolError::BlockState {
                block_id: id,
                reason: "is free: only a block in use can be cached",
            });
        }
        let key = BlockHashKey::new(call.hash, call.group);
        let mut already = self.holds_key(id, &key);
        if !already
            && self.slab.get(id).is_cached()
            && self
                .partial
                .primary_tokens
                .get(&id)
                .is_some_and(|&t| t < call.num_tokens)
        {
            self.drop_key(id);
            already = false;
        }
        if already {
            return Ok(());
        }
        let slot = self.map.insert(key, id, call.num_tokens);
        if self.slab.get(id).key_slot == NIL {
            self.slab.get_mut(id).key_slot = slot;
            self.partial.primary_tokens.insert(id, call.num_tokens);
            self.note_cached(id, &key, None);
        } else {
            self.partial.extra_slots.entry(id).or_default().push(slot);
        }
        if self.hash_width.is_none() {
            self.hash_width = Some(call.hash.as_bytes().len());
        }
        if self.config.enable_events {
            self.emit(PoolEvent::BlockStored(Box::new(StoredBlocks {
                block_hashes: vec![call.hash],
                parent_block_hash: call.parent,
                token_ids: call.token_ids.to_vec(),
                block_size: call.hash_block_size,
                lora_id: call.lora_id,
                lora_name: call.lora_name.map(str::to_owned),
                group_idx: call.group,
                extra_keys: call.extra_keys.map(|keys| vec![keys]),
            })));
        }
        Ok(())
    }

    /// Block `id`'s keys beyond its primary one (vLLM's
    /// `BlockPool.cached_block_hashes_by_block[id]`), in insertion order.
    pub fn extra_block_keys(&self, id: u32) -> PoolResult<Vec<BlockHashKey>> {
        self.check_ids(&[id])?;
        Ok(self
            .partial
            .extra_slots
            .get(&id)
            .map_or_else(Vec::new, |slots| {
                slots.iter().map(|&s| *self.map.key_at(s)).collect()
            }))
    }

    /// The blocks holding keys beyond their primary one, in id order.
    pub fn blocks_with_extra_keys(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.partial.extra_slots.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Tokens block `id`'s primary key covers when it is a partial entry.
    pub fn partial_key_tokens(&self, id: u32) -> Option<u32> {
        self.partial.primary_tokens.get(&id).copied()
    }

    /// Whether block `id` holds `key` (as its primary key or an extra one).
    fn holds_key(&self, id: u32, key: &BlockHashKey) -> bool {
        let slot = self.slab.get(id).key_slot;
        if slot != NIL && self.map.key_at(slot) == key {
            return true;
        }
        self.partial
            .extra_slots
            .get(&id)
            .is_some_and(|slots| slots.iter().any(|&s| self.map.key_at(s) == key))
    }

    /// Drops block `id`'s extra keys (one `BlockRemoved` each, in insertion order) and
    /// its partial-primary record; called once its primary key is gone.
    pub(super) fn drop_partial_keys(&mut self, id: u32) {
        self.partial.primary_tokens.remove(&id);
        let Some(slots) = self.partial.extra_slots.remove(&id) else {
            return;
        };
        for slot in slots {
            let key = self.map.remove(slot);
            if self.config.enable_events {
                self.emit(PoolEvent::BlockRemoved {
                    block_hash: key.hash,
                    group_idx: key.group,
                });
            }
        }
    }

    /// Whether caching block `id` as full over `num_tokens` tokens promotes a partial
    /// primary key (rather than finding the block already cached).
    pub(super) fn promotes(&self, id: u32, num_tokens: usize) -> bool {
        self.partial
            .primary_tokens
            .get(&id)
            .is_some_and(|&t| (t as usize) < num_tokens)
    }

    /// Before a `cache_full_blocks` that may promote partial keys: every new block must
    /// be in use, listed once, and uncached or promotable.
    pub(super) fn check_promotions(
        &self,
        new_blocks: &[u32],
        call: &super::block_pool::CacheBlocks<'_>,
        block_size: usize,
    ) -> PoolResult<()> {
        let mut seen = hashbrown::HashSet::with_capacity(new_blocks.len());
        for (i, &id) in new_blocks.iter().enumerate() {
            if self.is_null(id) || call.block_mask.is_some_and(|m| !m[i]) {
                continue;
            }
            let meta = self.slab.get(id);
            let tokens = (call.num_cached_blocks + i + 1) * block_size;
            let reason = if meta.ref_cnt == 0 {
                Some("is free: only a block in use can be cached")
            } else if meta.is_cached() && !self.promotes(id, tokens) {
                Some("already holds a block hash")
            } else if !seen.insert(id) {
                Some("appears twice among the new full blocks")
            } else {
                None
            };
            if let Some(reason) = reason {
                return Err(PoolError::BlockState {
                    block_id: id,
                    reason,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{CacheBlocks, HashSlice, PoolConfig};

    fn hash(b: u8) -> BlockHash {
        BlockHash::new(&[b; 8]).unwrap()
    }

    fn pool() -> BlockPool {
        let mut config = PoolConfig::new(4);
        config.enable_events = true;
        config.block_size = 16;
        BlockPool::new(config).unwrap()
    }

    fn partial(id: u32, b: u8, num_tokens: u32) -> PartialBlock<'static> {
        PartialBlock {
            block_id: id,
            hash: hash(b),
            group: 0,
            num_tokens,
            parent: None,
            token_ids: &[],
            hash_block_size: 8,
            lora_id: None,
            lora_name: None,
            extra_keys: None,
        }
    }

    fn cache_full(pool: &mut BlockPool, id: u32, b: u8) -> PoolResult<()> {
        let bytes = [b; 8];
        let ids = [id];
        let mut call = CacheBlocks::new(&ids, HashSlice::new(&bytes, 8).unwrap(), 0, 1);
        call.block_size = Some(16);
        pool.cache_full_blocks(call)
    }

    fn kinds(pool: &mut BlockPool) -> Vec<(&'static str, u8)> {
        pool.take_events()
            .into_iter()
            .map(|e| match e {
                PoolEvent::BlockStored(stored) => ("stored", stored.block_hashes[0].as_bytes()[0]),
                PoolEvent::BlockRemoved { block_hash, .. } => ("removed", block_hash.as_bytes()[0]),
                PoolEvent::AllBlocksCleared => ("cleared", 0),
            })
            .collect()
    }

    #[test]
    fn a_partial_key_is_promoted_then_kept_as_an_extra_key() {
        let mut pool = pool();
        let mut ids = Vec::new();
        pool.get_new_blocks(1, &mut ids).unwrap();
        let id = ids[0];
        // A partial primary key at 8 tokens, found by lookups.
        pool.cache_partial_block(partial(id, 7, 8)).unwrap();
        pool.cache_partial_block(partial(id, 7, 8)).unwrap(); // registered once
        assert_eq!(pool.cached_block(hash(7), 0), Some(id));
        assert_eq!(pool.partial_key_tokens(id), Some(8));
        assert_eq!(kinds(&mut pool), [("stored", 7)]);
        // Full at 16 tokens: promoted, the partial key gone first.
        cache_full(&mut pool, id, 9).unwrap();
        assert_eq!(kinds(&mut pool), [("removed", 7), ("stored", 9)]);
        assert_eq!(
            (pool.cached_block(hash(7), 0), pool.partial_key_tokens(id)),
            (None, None)
        );
        // Full now: caching it again is refused, and the partial key comes back as an extra one.
        assert!(cache_full(&mut pool, id, 9).is_err());
        pool.cache_partial_block(partial(id, 7, 8)).unwrap();
        assert_eq!(kinds(&mut pool), [("stored", 7)]);
        assert_eq!(pool.cached_block(hash(7), 0), Some(id));
        assert_eq!(pool.num_cached_blocks(), 1); // one block, two keys
        pool.check_invariants().unwrap();
        // Evicted on reuse: both keys leave, the primary first.
        pool.free_blocks(&[id]).unwrap();
        let mut all = Vec::new();
        pool.get_new_blocks(3, &mut all).unwrap();
        assert_eq!(kinds(&mut pool), [("removed", 9), ("removed", 7)]);
        assert!(pool.cached_block(hash(7), 0).is_none());
        pool.check_invariants().unwrap();
    }

    #[test]
    fn a_refused_promotion_changes_nothing() {
        let mut pool = pool();
        let mut ids = Vec::new();
        pool.get_new_blocks(2, &mut ids).unwrap();
        pool.cache_partial_block(partial(ids[0], 1, 8)).unwrap();
        cache_full(&mut pool, ids[1], 2).unwrap();
        pool.take_events();
        // Block 0 would be promoted, but block 1 is already cached in full: nothing happens.
        let bytes = [[3u8; 8], [4u8; 8]].concat();
        let mut call = CacheBlocks::new(&ids, HashSlice::new(&bytes, 8).unwrap(), 0, 2);
        call.block_size = Some(16);
        assert!(pool.cache_full_blocks(call).is_err());
        assert!(pool.take_events().is_empty());
        assert_eq!(pool.cached_block(hash(1), 0), Some(ids[0]));
        assert_eq!(pool.partial_key_tokens(ids[0]), Some(8));
        pool.check_invariants().unwrap();
        // A reset forgets every partial and extra key.
        pool.free_blocks(&ids).unwrap();
        assert!(pool.reset_prefix_cache());
        assert_eq!(pool.partial_key_tokens(ids[0]), None);
        pool.check_invariants().unwrap();
    }
}
