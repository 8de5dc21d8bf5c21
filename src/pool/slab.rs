//! Per-block metadata, one 16-byte slot per block, indexed by block id.

/// The "no block" link and "no key" slot.
pub const NIL: u32 = u32::MAX;

/// Everything the pool knows about one block besides its hash, which lives in the
/// prefix map's arena at `key_slot`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockMeta {
    /// How many requests hold the block. 0 exactly when the block is in the free queue
    /// (the null block excepted).
    pub ref_cnt: u32,
    /// Previous block in the free queue, or [`NIL`].
    pub prev: u32,
    /// Next block in the free queue, or [`NIL`].
    pub next: u32,
    /// The block's entry in the prefix map, or [`NIL`] while it holds no hash.
    pub key_slot: u32,
}

impl BlockMeta {
    const EMPTY: Self = Self {
        ref_cnt: 0,
        prev: NIL,
        next: NIL,
        key_slot: NIL,
    };

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
    /// `num_blocks` blocks, unlinked, uncached, with count 0.
    pub fn new(num_blocks: u32) -> Self {
        Self {
            metas: vec![BlockMeta::EMPTY; num_blocks as usize],
        }
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

    /// All metadata in block-id order.
    pub fn iter(&self) -> impl Iterator<Item = &BlockMeta> {
        self.metas.iter()
    }

    /// All metadata, mutably.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut BlockMeta> {
        self.metas.iter_mut()
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
    fn new_slab_is_empty_and_unlinked() {
        let slab = Slab::new(3);
        assert_eq!(slab.len(), 3);
        assert!(slab
            .iter()
            .all(|m| m.ref_cnt == 0 && !m.is_cached() && m.next == NIL));
    }
}
