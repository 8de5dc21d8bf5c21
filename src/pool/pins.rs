//! Pinning and retention priorities: keeping chosen cached blocks from eviction.
//!
//! A **pin** holds one reference to each block of a cached chain (a system
//! prompt, say), so its blocks never reach the free queue and no policy can evict
//! them, whatever the churn. Pins count against [`PoolConfig::max_pinned_blocks`]:
//! a pin that would exceed it fails with [`PoolError::PinBudget`] and pins nothing.
//! Pinned blocks count as used (they are not free), which is what they are.
//!
//! A **retention priority** ([`EvictionPolicy::Priority`]) is softer: the block is
//! evicted after every free block of lower priority, and the priority may revert
//! to the default after a duration.
//!
//! [`PoolConfig::max_pinned_blocks`]: super::PoolConfig::max_pinned_blocks

use super::block_pool::BlockPool;
use super::error::{PoolError, PoolResult};
use super::eviction::{BlockPriority, EvictionPolicy};
use super::free_queue::Place;
use super::hash_key::HashSlice;

impl BlockPool {
    /// Pins the cached blocks of the longest cached prefix of `hashes` in `group`;
    /// returns how many blocks that prefix has (pinned now or before). Blocks
    /// already pinned are not pinned twice. All or nothing: over the budget, an
    /// `Err` and no change.
    pub fn pin_prefix(&mut self, hashes: HashSlice<'_>, group: u32) -> PoolResult<usize> {
        let mut chain = Vec::new();
        self.find_longest_cache_hit(hashes, group, None, &mut chain)?;
        // Blocks not pinned yet, each once (hashes may repeat): O(chain), not O(chain²).
        let mut seen = hashbrown::HashSet::with_capacity(chain.len());
        let new: Vec<u32> = chain
            .iter()
            .copied()
            .filter(|id| !self.pins.contains(id) && seen.insert(*id))
            .collect();
        let budget = self.config.max_pinned_blocks as usize;
        if self.pins.len() + new.len() > budget {
            return Err(PoolError::PinBudget {
                requested: new.len(),
                pinned: self.pins.len(),
                budget,
            });
        }
        for &id in &new {
            if self.slab.get(id).ref_cnt == 0 {
                self.queue.remove(&mut self.slab, id);
            }
            self.slab.get_mut(id).ref_cnt += 1;
            self.pins.insert(id);
        }
        Ok(chain.len())
    }

    /// Unpins the pinned blocks of the longest cached prefix of `hashes` in
    /// `group`, freeing the pin's reference to each (tail first, as a request
    /// frees); returns how many it unpinned.
    pub fn unpin_prefix(&mut self, hashes: HashSlice<'_>, group: u32) -> PoolResult<usize> {
        let mut chain = Vec::new();
        self.find_longest_cache_hit(hashes, group, None, &mut chain)?;
        let mut unpinned = Vec::new();
        for id in chain {
            if self.pins.remove(&id) {
                unpinned.push(id);
            }
        }
        self.free_blocks_reversed(&unpinned)?;
        Ok(unpinned.len())
    }

    /// Unpins every pinned block; returns how many there were.
    pub fn unpin_all(&mut self) -> usize {
        let mut ids: Vec<u32> = self.pins.drain().collect();
        ids.sort_unstable();
        let n = ids.len();
        self.free_blocks_reversed(&ids)
            .expect("a pinned block holds the pin's reference");
        n
    }

    /// Blocks pinned now.
    pub fn num_pinned_blocks(&self) -> usize {
        self.pins.len()
    }

    /// Whether block `id` is pinned.
    pub fn is_pinned(&self, id: u32) -> bool {
        self.pins.contains(&id)
    }

    /// The pinned blocks, in id order.
    pub fn pinned_blocks(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.pins.iter().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Releases the pins of the blocks `evict_blocks` just took the hashes of.
    pub(super) fn unpin_evicted(&mut self, ids: &[u32]) {
        if self.pins.is_empty() {
            return;
        }
        let mut unpinned = Vec::new();
        for &id in ids {
            if self.pins.remove(&id) {
                unpinned.push(id);
            }
        }
        self.free_blocks(&unpinned)
            .expect("a pinned block holds the pin's reference");
    }

    /// Sets the retention priority of each block (in use or free; the null block is
    /// skipped). With `only_raise`, a block keeps its priority unless the new one is
    /// higher now. A free cached block moves to the tail of its new priority's list.
    /// Needs [`EvictionPolicy::Priority`].
    pub fn set_priority(
        &mut self,
        ids: &[u32],
        priority: BlockPriority,
        only_raise: bool,
    ) -> PoolResult<()> {
        if self.config.eviction != EvictionPolicy::Priority {
            return Err(PoolError::InvalidArgument(format!(
                "retention priorities need a pool built with eviction='priority' (this one evicts by {})",
                self.config.eviction.name()
            )));
        }
        self.check_ids(ids)?;
        // Expiries due now first (as before every change of the lists), while every
        // pending one still belongs to the priority it ends.
        self.queue.apply_expiries(&mut self.slab);
        let now = self.now();
        for &id in ids {
            if self.is_null(id) {
                continue;
            }
            let current = self.queue.eviction().priority_of(id);
            if only_raise && priority.effective(now) <= current.effective(now) {
                continue;
            }
            self.queue.eviction_mut().set_priority(id, priority);
            let meta = *self.slab.get(id);
            if meta.ref_cnt == 0 && Place::of(&meta) == Place::List {
                self.queue.requeue(&mut self.slab, id);
            }
        }
        Ok(())
    }
}

impl super::KVCacheManager {
    /// Pins the cached blocks of `prompt`'s longest cached prefix of full blocks
    /// (hashed as a request without extra keys would be): a system prompt stays
    /// cached whatever the churn. Returns the blocks of that prefix.
    pub fn pin_prompt(&mut self, prompt: super::TokenIds<'_>) -> PoolResult<usize> {
        let seq = self
            .hasher
            .new_sequence(prompt, super::SequenceExtras::default())?;
        self.pool.pin_prefix(seq.block_hashes(), 0)
    }

    /// Unpins what [`pin_prompt`](Self::pin_prompt) pinned for `prompt`; returns
    /// the blocks unpinned.
    pub fn unpin_prompt(&mut self, prompt: super::TokenIds<'_>) -> PoolResult<usize> {
        let seq = self
            .hasher
            .new_sequence(prompt, super::SequenceExtras::default())?;
        self.pool.unpin_prefix(seq.block_hashes(), 0)
    }

    /// Unpins every pinned block; returns how many there were.
    pub fn unpin_all(&mut self) -> usize {
        self.pool.unpin_all()
    }

    /// Moves a manual clock forward by `seconds`.
    pub fn advance_clock(&mut self, seconds: f64) -> PoolResult<()> {
        self.pool.advance_clock(seconds)
    }
}

#[cfg(test)]
mod tests {
    use crate::pool::{BlockPool, CacheBlocks, EvictionPolicy, HashSlice, PoolConfig};

    fn pool(policy: EvictionPolicy, n: u32) -> BlockPool {
        let mut config = PoolConfig::new(n);
        config.eviction = policy;
        config.manual_clock = true;
        BlockPool::new(config).unwrap()
    }

    /// Allocates `keys.len()` blocks, caches them under `keys` and frees them tail first.
    fn serve(pool: &mut BlockPool, keys: &[u64]) -> Vec<u32> {
        let bytes: Vec<u8> = keys.iter().flat_map(|k| k.to_be_bytes()).collect();
        let hashes = HashSlice::new(&bytes, 8).unwrap();
        let mut hit = Vec::new();
        pool.find_longest_cache_hit(hashes, 0, None, &mut hit)
            .unwrap();
        pool.touch(&hit).unwrap();
        let mut ids = hit.clone();
        pool.get_new_blocks(keys.len() - hit.len(), &mut ids)
            .unwrap();
        pool.cache_full_blocks(CacheBlocks::new(&ids, hashes, hit.len(), keys.len()))
            .unwrap();
        pool.free_blocks_reversed(&ids).unwrap();
        ids
    }

    fn key_bytes(keys: &[u64]) -> Vec<u8> {
        keys.iter().flat_map(|k| k.to_be_bytes()).collect()
    }

    #[test]
    fn a_pinned_prefix_survives_churn_under_every_policy() {
        for policy in EvictionPolicy::ALL {
            let mut p = pool(policy, 17);
            serve(&mut p, &[1, 2, 3]);
            let bytes = key_bytes(&[1, 2, 3]);
            let chain = HashSlice::new(&bytes, 8).unwrap();
            assert_eq!(p.pin_prefix(chain, 0).unwrap(), 3);
            for round in 0..50u64 {
                let keys: Vec<u64> = (0..13).map(|j| 1000 + round * 100 + j).collect();
                serve(&mut p, &keys);
            }
            let mut hit = Vec::new();
            assert_eq!(
                p.find_longest_cache_hit(chain, 0, None, &mut hit).unwrap(),
                3
            );
            p.check_invariants().unwrap();
            assert_eq!(p.unpin_prefix(chain, 0).unwrap(), 3);
            assert_eq!(p.num_free_blocks(), 16);
        }
    }

    #[test]
    fn the_pin_budget_refuses_and_changes_nothing() {
        let mut config = PoolConfig::new(9);
        config.max_pinned_blocks = 2;
        let mut p = BlockPool::new(config).unwrap();
        serve(&mut p, &[1, 2, 3]);
        let bytes = key_bytes(&[1, 2, 3]);
        let err = p.pin_prefix(HashSlice::new(&bytes, 8).unwrap(), 0);
        assert!(matches!(
            err,
            Err(crate::pool::PoolError::PinBudget {
                requested: 3,
                pinned: 0,
                budget: 2
            })
        ));
        assert_eq!((p.num_pinned_blocks(), p.num_free_blocks()), (0, 8));
    }

    #[test]
    fn priorities_order_eviction_and_revert_after_their_duration() {
        let mut p = pool(EvictionPolicy::Priority, 5); // four usable blocks
        let kept = serve(&mut p, &[1, 2]);
        p.set_priority(
            &kept,
            crate::pool::BlockPriority::new(90, Some(5.0), p.now()).unwrap(),
            false,
        )
        .unwrap();
        serve(&mut p, &[3, 4]);
        serve(&mut p, &[5, 6]); // evicts 3 and 4 (priority 35), not 1 and 2 (90)
        let bytes = key_bytes(&[1, 2]);
        let chain = HashSlice::new(&bytes, 8).unwrap();
        let mut hit = Vec::new();
        assert_eq!(
            p.find_longest_cache_hit(chain, 0, None, &mut hit).unwrap(),
            2
        );
        p.advance_clock(5.0).unwrap();
        // Back at 35, at the default list's tail as of their expiry: 5 and 6 go first.
        serve(&mut p, &[7, 8]);
        hit.clear();
        assert_eq!(
            p.find_longest_cache_hit(chain, 0, None, &mut hit).unwrap(),
            2
        );
        serve(&mut p, &[9, 10]);
        hit.clear();
        assert_eq!(
            p.find_longest_cache_hit(chain, 0, None, &mut hit).unwrap(),
            0
        );
        p.check_invariants().unwrap();
    }

    #[test]
    fn adaptive_remembers_uses_across_an_eviction() {
        let mut p = pool(EvictionPolicy::Adaptive, 3); // two usable blocks
        let first = serve(&mut p, &[7]);
        serve(&mut p, &[7]); // a hit: two uses
        assert_eq!(p.eviction().uses(first[0]), 2);
        serve(&mut p, &[8, 9]); // evicts key 7 (and the fresh block)
        let again = serve(&mut p, &[7]);
        assert_eq!(
            p.eviction().uses(again[0]),
            3,
            "the ghost table kept key 7's two uses"
        );
        p.check_invariants().unwrap();
    }
}
