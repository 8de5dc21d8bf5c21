//! Per-block metadata, one 16-byte slot per block, indexed by block id.

use super::error::{PoolError, PoolResult};

/// The "no block" link and "no key" slot.
pub const NIL: u32 = u32::MAX;

/// Everything the pool knows about one block besides its hash, which lives in the
/// prefix map's arena at `key_slot`.
/// `repr(C)`: four `u32` in this order, 16 bytes (written in one store by
/// `meta_store.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct BlockMeta {
    /// How many requests hold the block. 0 exactly when the block is in the free queue
    /// (the null block excepted).
    pub ref_cnt: u32,
    /// While free: in the free queue's list, the previous block (or [`NIL`]); on its
    /// stack, the block's index there. [`NIL`] while in use.
    pub prev: u32,
    /// While free: in the free queue's list, the next block (or [`NIL`]); on its
    /// stack, `STACKED`; in its fresh range, `FRESH` (see `free_queue.rs`). [`NIL`]
    /// while in use.
    pub next: u32,
    /// The block's entry in the prefix map, or [`NIL`] while it holds no hash.
    pub key_slot: u32,
}

impl BlockMeta {
    /// A block that is in no queue, holds no hash and has count 0 (the null block).
    pub const EMPTY: Self = Self {
        ref_cnt: 0,
        prev: NIL,
        next: NIL,
        key_slot: NIL,
    };

    /// A free block in the free queue's fresh range: how every block starts.
    pub const FRESH: Self = Self {
        ref_cnt: 0,
        prev: NIL,
        next: super::free_queue::FRESH,
        key_slot: NIL,
    };

    /// A block just allocated: count 1, unlinked, no hash.
    #[inline]
    pub const fn in_use() -> Self {
        Self {
            ref_cnt: 1,
            prev: NIL,
            next: NIL,
            key_slot: NIL,
        }
    }

    /// A free uncached block at `index` on the free queue's stack, count 0.
    #[inline]
    pub const fn stacked(index: u32) -> Self {
        Self {
            ref_cnt: 0,
            prev: index,
            next: super::free_queue::STACKED,
            key_slot: NIL,
        }
    }

    /// True while the block is in the prefix cache.
    #[inline]
    pub fn is_cached(&self) -> bool {
        self.key_slot != NIL
    }
}

/// The slab: block metadata in one contiguous vector.
#[derive(Clone, Debug)]
pub struct Slab {
    metas: Vec<BlockMeta>,
}

impl Slab {
    /// `num_blocks` blocks, all [`BlockMeta::FRESH`]: free, uncached, count 0.
    /// [`PoolError::OutOfMemory`] if the memory cannot be had (the allocation is
    /// fallible, never an abort).
    pub fn new(num_blocks: u32) -> PoolResult<Self> {
        let n = num_blocks as usize;
        let mut metas = Vec::new();
        metas
            .try_reserve_exact(n)
            .map_err(|_| PoolError::OutOfMemory {
                what: "the block table",
                bytes: n.saturating_mul(std::mem::size_of::<BlockMeta>()),
            })?;
        metas.resize(n, BlockMeta::FRESH);
        Ok(Self { metas })
    }

    /// Number of blocks.
    #[inline]
    pub fn len(&self) -> u32 {
        self.metas.len() as u32
    }

    /// True for an empty slab (never the case in a pool).
    pub fn is_empty(&self) -> bool {
        self.metas.is_empty()
    }

    /// Block `id`'s metadata. `id` must be in range (the pool validates ids first).
    #[inline]
    pub fn get(&self, id: u32) -> &BlockMeta {
        &self.metas[id as usize]
    }

    /// Block `id`'s metadata, mutably.
    #[inline]
    pub fn get_mut(&mut self, id: u32) -> &mut BlockMeta {
        &mut self.metas[id as usize]
    }

    /// All metadata, mutably, indexed by block id: for loops that keep the slab's
    /// address in a register across their writes.
    #[inline]
    pub fn metas_mut(&mut self) -> &mut [BlockMeta] {
        &mut self.metas
    }

    /// All metadata in block-id order.
    pub fn iter(&self) -> impl Iterator<Item = &BlockMeta> {
        self.metas.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_is_16_bytes() {
        assert_eq!(std::mem::size_of::<BlockMeta>(), 16);
    }

    #[test]
    fn new_slab_is_fresh() {
        let slab = Slab::new(3).unwrap();
        assert_eq!(slab.len(), 3);
        assert!(slab
            .iter()
            .all(|m| *m == BlockMeta::FRESH && !m.is_cached()));
    }
}
