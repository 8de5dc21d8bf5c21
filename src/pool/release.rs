//! Freeing: `free_blocks`, `free_blocks_reversed` and `free_blocks_many`.
//!
//! vLLM drops one reference per block in the order given, then queues the blocks
//! that reached 0: uncached ones at the head of the free queue (the first of them
//! becomes the head), cached ones at the tail, in the order given. kvpool does the
//! same in one pass: each block that reaches 0 goes straight onto the free queue's
//! stack (room for the whole call is reserved first, filled from the top down) or,
//! when cached, into `to_tail`, appended once the pass is done. A double free
//! (a count already 0, or a pinned block's last reference, which is the pin's)
//! undoes every count the pass changed, so an `Err` leaves the pool as it was.

use super::block_pool::{check_offsets, BlockPool};
use super::error::{PoolError, PoolResult};
use super::free_queue::FrontBatch;
use super::slab::{BlockMeta, NIL};

impl BlockPool {
    /// Drops one reference to each block, in the order given (callers pass a
    /// request's blocks tail first). Blocks reaching 0 go to the free queue:
    /// uncached ones to the head (reused first), cached ones to the tail (evicted
    /// last), each group in the order given. The null block is skipped.
    pub fn free_blocks(&mut self, ids: &[u32]) -> PoolResult<()> {
        self.release(&[ids], false)
    }

    /// [`free_blocks`](Self::free_blocks) of `ids` taken from the last to the first:
    /// a request's blocks in table order, freed tail first as vLLM does.
    pub fn free_blocks_reversed(&mut self, ids: &[u32]) -> PoolResult<()> {
        self.release(&[ids], true)
    }

    /// Frees several requests' blocks at once: segment `i` is
    /// `flat[offsets[i]..offsets[i + 1]]`, reversed first when `reverse`. The same as
    /// `free_blocks` on each segment in turn, but all or nothing.
    pub fn free_blocks_many(
        &mut self,
        flat: &[u32],
        offsets: &[usize],
        reverse: bool,
    ) -> PoolResult<()> {
        check_offsets(offsets, flat.len())?;
        let segments: Vec<&[u32]> = offsets.windows(2).map(|w| &flat[w[0]..w[1]]).collect();
        self.release(&segments, reverse)
    }

    /// Frees `segments` in turn (each reversed when `reverse`). The pass checks each
    /// id's range as it reaches it; on any failure it undoes what it did and reports
    /// the first id out of range, if any, else the first double free.
    fn release(&mut self, segments: &[&[u32]], reverse: bool) -> PoolResult<()> {
        self.to_tail.clear();
        let mark = self.queue.front_mark();
        for (done, segment) in segments.iter().enumerate() {
            let mut batch = self.queue.reserve_front(segment.len());
            let outcome = self.release_segment(segment, reverse, &mut batch);
            if let Err((processed, block_id)) = outcome {
                self.queue.rewind_front(mark, batch);
                let partial = if reverse {
                    &segment[segment.len() - processed..]
                } else {
                    &segment[..processed]
                };
                self.restore(partial);
                for earlier in segments[..done].iter().rev() {
                    self.restore(earlier);
                }
                self.to_tail.clear();
                for segment in segments {
                    self.check_ids(segment)?;
                }
                return Err(PoolError::DoubleFree { block_id });
            }
            self.queue.finish_front(&mut self.slab, batch);
        }
        self.queue.push_back_n(&mut self.slab, &self.to_tail);
        Ok(())
    }

    /// One segment's pass. On an id out of range or a double free returns how many
    /// ids it had processed and the offending one, having changed nothing it has not
    /// reported.
    #[inline(always)]
    fn release_segment(
        &mut self,
        ids: &[u32],
        reverse: bool,
        batch: &mut FrontBatch,
    ) -> Result<(), (usize, u32)> {
        let caching = self.config.enable_caching;
        let skip_null = self.config.null_block;
        let pins = (!self.pins.is_empty()).then_some(&self.pins);
        // Borrowed apart, with the stack cursor a local: the loop keeps every address
        // and the cursor in registers instead of reloading them after each write.
        let (slots, mut next) = self.queue.front_slots(batch);
        let metas = self.slab.metas_mut();
        let to_tail = &mut self.to_tail;
        let mut run = ReleaseRun {
            metas,
            slots,
            next: &mut next,
            to_tail,
            pins,
        };
        let outcome = match (reverse, caching, skip_null, pins.is_some()) {
            (false, false, false, false) => run.run::<false, false, false, false>(ids),
            (false, false, true, false) => run.run::<false, false, true, false>(ids),
            (false, true, false, false) => run.run::<false, true, false, false>(ids),
            (false, true, true, false) => run.run::<false, true, true, false>(ids),
            (true, false, false, false) => run.run::<true, false, false, false>(ids),
            (true, false, true, false) => run.run::<true, false, true, false>(ids),
            (true, true, false, false) => run.run::<true, true, false, false>(ids),
            (true, true, true, false) => run.run::<true, true, true, false>(ids),
            // Pinned blocks are rare and their check costs a lookup anyway: one loop
            // per direction, the other settings as arguments.
            (false, _, _, true) => run.run_pinned::<false>(ids, caching, skip_null),
            (true, _, _, true) => run.run_pinned::<true>(ids, caching, skip_null),
        };
        self.queue.set_front_next(batch, next);
        outcome
    }

    /// Gives back the reference `release_segment` took from each of `ids`: they were
    /// all in use before the call, so they are unlinked again.
    fn restore(&mut self, ids: &[u32]) {
        for &id in ids {
            if self.is_null(id) {
                continue;
            }
            let meta = self.slab.get_mut(id);
            meta.ref_cnt += 1;
            meta.prev = NIL;
            meta.next = NIL;
        }
    }
}

/// One free pass's state, borrowed apart from the pool.
struct ReleaseRun<'a, 'b> {
    metas: &'a mut [BlockMeta],
    /// The free queue's stack up to the open batch's end; `*next` is its cursor.
    slots: &'a mut [u32],
    next: &'b mut usize,
    to_tail: &'a mut Vec<u32>,
    pins: Option<&'a hashbrown::HashSet<u32>>,
}

impl ReleaseRun<'_, '_> {
    /// Drops a reference to each of `ids` (from the last when `REVERSE`): uncached
    /// blocks reaching 0 go into `slots` below the cursor (the first one freed
    /// highest), cached ones to `to_tail`. Stops at the first id out of range or
    /// freed once too often, returning how many ids it had processed.
    ///
    /// `CACHING` and `SKIP_NULL` (a null block) are the pool's state, as constants so
    /// that each combination gets a loop without their branches. The common blocks
    /// (count 1, uncached or cached) are handled inline in a few instructions; every
    /// other case in [`Self::other`], out of line. The cursor is a local, written back
    /// once, so that it stays in a register. Out of line itself: inlined into the
    /// pool's call, the loop reloaded four of its addresses from the stack on every
    /// block (19 instructions a block instead of 21 in the core's alloc+free).
    #[inline(never)]
    fn run<const REVERSE: bool, const CACHING: bool, const SKIP_NULL: bool, const PINS: bool>(
        &mut self,
        ids: &[u32],
    ) -> Result<(), (usize, u32)> {
        let mut cursor = *self.next;
        let mut outcome = Ok(());
        let mut left = ids.iter();
        // How many ids were processed when `id`, the last one taken, fails.
        let processed = |left: &std::slice::Iter<'_, u32>| ids.len() - left.len() - 1;
        while let Some(&id) = if REVERSE {
            left.next_back()
        } else {
            left.next()
        } {
            let Some(meta) = self.metas.get_mut(id as usize) else {
                outcome = Err((processed(&left), id));
                break;
            };
            // The null block (count 0, never on the queue) fails this test too, and is
            // skipped out of line.
            if meta.ref_cnt == 1 && !(CACHING && meta.is_cached()) {
                // Uncached: straight onto the free queue's stack, below the blocks
                // this call put there before.
                cursor -= 1;
                self.slots[cursor] = id;
                meta.store(BlockMeta::stacked(cursor as u32));
            } else if CACHING && meta.ref_cnt == 1 {
                // Cached, its last reference: to the tail once the pass is done (the
                // common case of a caching pool, so inline too).
                meta.ref_cnt = 0;
                self.to_tail.push(id);
            } else if SKIP_NULL && id == 0 {
                // The null block: never freed.
            } else if !Self::other(meta, id, self.to_tail) {
                outcome = Err((processed(&left), id));
                break;
            }
        }
        *self.next = cursor;
        outcome
    }

    /// [`Self::run`] for a pool with pinned blocks: the last reference of a pinned
    /// block is the pin's, so freeing it is a double free.
    #[inline(never)]
    fn run_pinned<const REVERSE: bool>(
        &mut self,
        ids: &[u32],
        caching: bool,
        skip_null: bool,
    ) -> Result<(), (usize, u32)> {
        let mut cursor = *self.next;
        let n = ids.len();
        for k in 0..n {
            let id = if REVERSE { ids[n - 1 - k] } else { ids[k] };
            if skip_null && id == 0 {
                continue;
            }
            let pinned = self.pins.is_some_and(|pins| pins.contains(&id));
            let Some(meta) = self.metas.get_mut(id as usize) else {
                *self.next = cursor;
                return Err((k, id));
            };
            if meta.ref_cnt == 1 && pinned {
                *self.next = cursor;
                return Err((k, id));
            }
            if meta.ref_cnt == 1 && !(caching && meta.is_cached()) {
                cursor -= 1;
                self.slots[cursor] = id;
                meta.store(BlockMeta::stacked(cursor as u32));
            } else if !Self::other(meta, id, self.to_tail) {
                *self.next = cursor;
                return Err((k, id));
            }
        }
        *self.next = cursor;
        Ok(())
    }

    /// The blocks the inline paths leave (and, with pins, every block but an uncached
    /// one with count 1): a cached block reaching 0 joins `to_tail`, a block held more
    /// than once loses a reference; false for a block already free (a double free).
    #[cold]
    #[inline(never)]
    fn other(meta: &mut BlockMeta, id: u32, to_tail: &mut Vec<u32>) -> bool {
        match meta.ref_cnt {
            0 => false,
            1 => {
                meta.ref_cnt = 0;
                to_tail.push(id);
                true
            }
            _ => {
                meta.ref_cnt -= 1;
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{CacheBlocks, HashSlice, PoolConfig};

    /// The pool's observable state: the free queue in order and every count.
    fn snapshot(pool: &BlockPool) -> (Vec<u32>, Vec<u32>) {
        (pool.free_block_ids().collect(), pool.ref_counts().collect())
    }

    /// A pool of 16 blocks holding `1..=6` (count 1; 1 and 2 cached) and 7 twice.
    fn busy_pool() -> (BlockPool, Vec<u32>) {
        let mut pool = BlockPool::new(PoolConfig::new(16)).unwrap();
        let mut ids = Vec::new();
        pool.get_new_blocks(7, &mut ids).unwrap();
        pool.touch(&ids[6..]).unwrap();
        let hashes = [[1u8; 32], [2u8; 32]].concat();
        pool.cache_full_blocks(CacheBlocks::new(
            &ids,
            HashSlice::new(&hashes, 32).unwrap(),
            0,
            2,
        ))
        .unwrap();
        (pool, ids)
    }

    #[test]
    fn an_id_out_of_range_wins_over_an_earlier_double_free_and_changes_nothing() {
        let (mut pool, ids) = busy_pool();
        let before = snapshot(&pool);
        // 3 and 2 are freed, 7 loses one of its two references, 3 again is a double
        // free, 99 is out of range: the range error is the one reported.
        let call = [ids[2], ids[1], ids[6], ids[2], 99];
        assert_eq!(
            pool.free_blocks(&call),
            Err(PoolError::InvalidBlockId {
                block_id: 99,
                num_blocks: 16
            })
        );
        assert_eq!(snapshot(&pool), before);
        assert_eq!(
            pool.free_blocks_reversed(&[99, ids[0]]),
            Err(PoolError::InvalidBlockId {
                block_id: 99,
                num_blocks: 16
            })
        );
        assert_eq!(snapshot(&pool), before);
        pool.check_invariants().unwrap();
    }

    #[test]
    fn a_double_free_in_a_later_segment_undoes_the_earlier_ones() {
        let (mut pool, ids) = busy_pool();
        let before = snapshot(&pool);
        let flat = [ids[0], ids[1], ids[2], ids[6], ids[6], ids[6]];
        assert_eq!(
            pool.free_blocks_many(&flat, &[0, 3, 6], true),
            Err(PoolError::DoubleFree { block_id: ids[6] })
        );
        assert_eq!(snapshot(&pool), before);
        pool.check_invariants().unwrap();
        // The same call without the third free of 7 applies.
        pool.free_blocks_many(&flat[..5], &[0, 3, 5], true).unwrap();
        assert_eq!(pool.ref_count(ids[6]), Ok(0));
        pool.check_invariants().unwrap();
    }
}
