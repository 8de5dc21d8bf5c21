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
use super::slab::NIL;

impl BlockPool {
    /// Drops one reference to each block, in the order given (callers pass a
    /// request's blocks tail first). Blocks reaching 0 go to the free queue:
    /// uncached ones to the head (reused first), cached ones to the tail (evicted
    /// last), each group in the order given. The null block is skipped.
    pub fn free_blocks(&mut self, ids: &[u32]) -> PoolResult<()> {
        self.check_ids(ids)?;
        self.release(&[ids], false)
    }

    /// [`free_blocks`](Self::free_blocks) of `ids` taken from the last to the first:
    /// a request's blocks in table order, freed tail first as vLLM does.
    pub fn free_blocks_reversed(&mut self, ids: &[u32]) -> PoolResult<()> {
        self.check_ids(ids)?;
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
        self.check_ids(flat)?;
        let segments: Vec<&[u32]> = offsets.windows(2).map(|w| &flat[w[0]..w[1]]).collect();
        self.release(&segments, reverse)
    }

    /// Frees `segments` in turn (each reversed when `reverse`); ids are in range.
    fn release(&mut self, segments: &[&[u32]], reverse: bool) -> PoolResult<()> {
        self.to_tail.clear();
        let mark = self.queue.front_mark();
        for (done, segment) in segments.iter().enumerate() {
            let mut batch = self.queue.reserve_front(segment.len());
            let outcome = if reverse {
                self.release_segment(segment.iter().rev().copied(), &mut batch)
            } else {
                self.release_segment(segment.iter().copied(), &mut batch)
            };
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
                return Err(PoolError::DoubleFree { block_id });
            }
            self.queue.finish_front(&mut self.slab, batch);
        }
        self.queue.push_back_n(&mut self.slab, &self.to_tail);
        Ok(())
    }

    /// One segment's pass over ids in range. On a double free returns how many ids
    /// it had processed and the offending block, having changed nothing it has not
    /// reported.
    #[inline(always)]
    fn release_segment(
        &mut self,
        ids: impl Iterator<Item = u32>,
        batch: &mut FrontBatch,
    ) -> Result<(), (usize, u32)> {
        let caching = self.config.enable_caching;
        let skip_null = self.config.null_block;
        let has_pins = !self.pins.is_empty();
        for (processed, id) in ids.enumerate() {
            if skip_null && id == 0 {
                continue;
            }
            let meta = self.slab.get_mut(id);
            match meta.ref_cnt {
                0 => return Err((processed, id)),
                // The last reference of a pinned block is the pin's: only unpinning frees it.
                1 if has_pins && self.pins.contains(&id) => return Err((processed, id)),
                1 if caching && meta.is_cached() => {
                    meta.ref_cnt = 0;
                    self.to_tail.push(id);
                }
                // Uncached: straight onto the free queue's stack, below the blocks
                // this call put there before.
                1 => self.queue.put_front(batch, meta, id),
                _ => meta.ref_cnt -= 1,
            }
        }
        Ok(())
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
