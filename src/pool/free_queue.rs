//! The free queue, in three parts that together keep vLLM's LRU order.
//!
//! Head = next to be reused, tail = most recently freed cached block. vLLM's queue is
//! one doubly linked list; freed blocks without a hash go to its head, freed cached
//! blocks to its tail, and allocation pops the head. So the front of the queue only
//! ever holds uncached blocks, taken and returned at the very front: a LIFO stack.
//! kvpool stores the queue as
//!
//! 1. **the stack**: uncached freed blocks, its top the queue's head. Pushing and
//!    popping are a `Vec` push and pop; a block taken from the middle (a `touch` of
//!    a free uncached block) leaves a tombstone, skipped when popped and compacted
//!    away once tombstones outnumber the live entries;
//! 2. **the fresh range**: blocks never allocated since the pool was built, in id
//!    order, so building a pool links nothing; a fresh block taken from the middle
//!    is unmarked and skipped;
//! 3. **the list**: cached blocks (and blocks whose hash was dropped while free), a
//!    doubly linked list threaded through the slab by `u32` links, with O(1) removal
//!    from the middle, which is what lets a prefix-cache hit reclaim a free block.
//!
//! Head to tail the queue is stack (top first), fresh range, list: exactly vLLM's
//! order (the invariant walk and the model tests check it). Every operation is O(1)
//! per block moved, amortized, and allocation-free once the stack has grown.

use super::slab::{BlockMeta, Slab, NIL};

/// `next` of a block on the stack (its `prev` is then its index in the stack).
pub const STACKED: u32 = NIL - 1;
/// `next` of a block still in the fresh range.
pub const FRESH: u32 = NIL - 2;

/// Tombstones tolerated beyond the live entries before the stack is compacted.
const TOMBSTONE_SLACK: usize = 64;

/// Room opened at the head of the queue by [`FreeQueue::reserve_front`].
#[derive(Debug)]
#[must_use = "a batch is committed with finish_front or dropped with rewind_front"]
pub struct FrontBatch {
    base: usize,
    end: usize,
    next: usize,
}

/// The sizes of the queue's parts, for the invariant walk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueParts {
    /// Live entries on the stack.
    pub stack_live: usize,
    /// Ids still to scan in the fresh range.
    pub fresh_span: std::ops::Range<u32>,
    /// Blocks of the fresh range still fresh.
    pub fresh_live: usize,
    /// Blocks in the list.
    pub list_len: usize,
}

/// Where a free block sits in the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// On the stack at this index.
    Stack(u32),
    /// In the fresh range.
    Fresh,
    /// In the linked list.
    List,
}

impl Place {
    /// The place recorded in a free block's links.
    #[inline]
    pub fn of(meta: &BlockMeta) -> Self {
        match meta.next {
            STACKED => Place::Stack(meta.prev),
            FRESH => Place::Fresh,
            _ => Place::List,
        }
    }
}

/// The stack, the fresh range and the list's ends; the links live in the [`Slab`].
#[derive(Clone, Debug)]
pub struct FreeQueue {
    /// Uncached free blocks, the last one the queue's head; [`NIL`] marks a tombstone.
    stack: Vec<u32>,
    /// Live (non-tombstone) entries of `stack`.
    stack_live: u32,
    /// The fresh range still to scan, `fresh_next..fresh_end`, and how many of its
    /// blocks are still fresh.
    fresh_next: u32,
    fresh_end: u32,
    fresh_live: u32,
    /// The list's head, tail and length.
    head: u32,
    tail: u32,
    list_len: u32,
}

impl FreeQueue {
    /// A queue holding the blocks `first..end` in id order, all fresh: the caller has
    /// built their slab entries as [`BlockMeta::FRESH`]. Costs O(1).
    pub fn fresh(first: u32, end: u32) -> Self {
        Self {
            stack: Vec::new(),
            stack_live: 0,
            fresh_next: first,
            fresh_end: end.max(first),
            fresh_live: end.saturating_sub(first),
            head: NIL,
            tail: NIL,
            list_len: 0,
        }
    }

    /// An empty queue.
    pub fn new() -> Self {
        Self::fresh(0, 0)
    }

    /// Number of free blocks.
    #[inline]
    pub fn len(&self) -> usize {
        (self.stack_live + self.fresh_live + self.list_len) as usize
    }

    /// True when no block is free.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The list's tail (the most recently freed cached block), or [`NIL`].
    pub fn tail(&self) -> u32 {
        self.tail
    }

    /// The list's head, or [`NIL`].
    pub fn list_head(&self) -> u32 {
        self.head
    }

    /// The stack's entries, bottom to top, tombstones ([`NIL`]) included.
    pub fn stack_entries(&self) -> &[u32] {
        &self.stack
    }

    /// How many blocks each part holds, and the fresh range's remaining span.
    pub fn parts(&self) -> QueueParts {
        QueueParts {
            stack_live: self.stack_live as usize,
            fresh_span: self.fresh_next..self.fresh_end,
            fresh_live: self.fresh_live as usize,
            list_len: self.list_len as usize,
        }
    }

    /// Takes `n` blocks from the head (the caller has checked `n <= len`), appends
    /// them to `out` in queue order and marks each in use with count 1. Returns the
    /// position in `out` from which blocks came from the list: only those can still
    /// hold a cached hash.
    pub fn take_front_n(&mut self, slab: &mut Slab, n: usize, out: &mut Vec<u32>) -> usize {
        debug_assert!(n <= self.len());
        out.reserve(n);
        let in_use = BlockMeta::in_use();
        let mut left = n;
        // 1. The stack, top first.
        if left > 0 && self.stack_live > 0 {
            let take = left.min(self.stack_live as usize);
            if self.stack.len() == self.stack_live as usize {
                // No tombstones: the top `take` entries, top first.
                let start = self.stack.len() - take;
                let popped = &self.stack[start..];
                out.extend(popped.iter().rev());
                for &id in popped {
                    *slab.get_mut(id) = in_use;
                }
                self.stack.truncate(start);
            } else {
                let mut taken = 0;
                while taken < take {
                    let id = self.stack.pop().unwrap_or(NIL);
                    if id != NIL {
                        *slab.get_mut(id) = in_use;
                        out.push(id);
                        taken += 1;
                    }
                }
                self.drop_top_tombstones();
            }
            self.stack_live -= take as u32;
            left -= take;
        }
        // 2. The fresh range, in id order, skipping blocks taken from it earlier.
        while left > 0 && self.fresh_live > 0 {
            let id = self.fresh_next;
            self.fresh_next += 1;
            let meta = slab.get_mut(id);
            if meta.next == FRESH {
                *meta = in_use;
                out.push(id);
                self.fresh_live -= 1;
                left -= 1;
            }
        }
        if self.fresh_live == 0 {
            self.fresh_next = self.fresh_end;
        }
        // 3. The list, from its head.
        let from_list = out.len();
        if left > 0 {
            let mut id = self.head;
            for _ in 0..left {
                out.push(id);
                let meta = slab.get_mut(id);
                let next = meta.next;
                meta.ref_cnt = 1;
                meta.prev = NIL;
                meta.next = NIL;
                id = next;
            }
            self.head = id;
            if id == NIL {
                self.tail = NIL;
            } else {
                slab.get_mut(id).prev = NIL;
            }
            self.list_len -= left as u32;
        }
        from_list
    }

    /// Opens room for up to `max` uncached blocks at the head, put there one by one
    /// with [`put_front`](Self::put_front) (the first put becomes the head) and
    /// committed by [`finish_front`](Self::finish_front) or dropped, with every batch
    /// since a mark, by [`rewind_front`](Self::rewind_front). This is how a free call queues its
    /// blocks in the same pass that drops their counts.
    #[inline]
    pub fn reserve_front(&mut self, max: usize) -> FrontBatch {
        let base = self.stack.len();
        self.stack.resize(base + max, NIL);
        FrontBatch {
            base,
            end: base + max,
            next: base + max,
        }
    }

    /// Puts block `id`, uncached and just released (whose metadata is `meta`), below
    /// the ones already put in `batch`, leaving it free with count 0. At most the
    /// batch's `max` blocks may be put.
    #[inline(always)]
    pub fn put_front(&mut self, batch: &mut FrontBatch, meta: &mut BlockMeta, id: u32) {
        batch.next -= 1;
        self.stack[batch.next] = id;
        *meta = BlockMeta {
            ref_cnt: 0,
            prev: batch.next as u32,
            next: STACKED,
            key_slot: NIL,
        };
    }

    /// Commits `batch`: its blocks are now the head of the queue, the first put on top.
    pub fn finish_front(&mut self, slab: &mut Slab, batch: FrontBatch) {
        let FrontBatch { base, end, next } = batch;
        let put = end - next;
        if next > base {
            // Fewer blocks than reserved: move them down onto the stack.
            self.stack.copy_within(next..end, base);
            for index in base..base + put {
                slab.get_mut(self.stack[index]).prev = index as u32;
            }
        }
        self.stack.truncate(base + put);
        self.stack_live += put as u32;
    }

    /// The stack's state, to [`rewind_front`](Self::rewind_front) to.
    pub fn front_mark(&self) -> (usize, u32) {
        (self.stack.len(), self.stack_live)
    }

    /// Drops every block put or committed at the head since `mark` was taken (with
    /// no other change to the queue in between), the open `batch` included; the
    /// caller restores their metadata.
    pub fn rewind_front(&mut self, mark: (usize, u32), batch: FrontBatch) {
        debug_assert!(batch.base >= mark.0);
        self.stack.truncate(mark.0);
        self.stack_live = mark.1;
    }

    /// Appends blocks at the tail of the list, in the order given.
    pub fn push_back_n(&mut self, slab: &mut Slab, ids: &[u32]) {
        let Some(&first) = ids.first() else {
            return;
        };
        let mut prev = self.tail;
        for &id in ids {
            let meta = slab.get_mut(id);
            meta.prev = prev;
            meta.next = NIL;
            if prev != NIL {
                slab.get_mut(prev).next = id;
            }
            prev = id;
        }
        if self.tail == NIL {
            self.head = first;
        }
        self.tail = prev;
        self.list_len += ids.len() as u32;
    }

    /// Takes block `id`, which the caller knows to be free, out of the queue.
    pub fn remove(&mut self, slab: &mut Slab, id: u32) {
        let meta = *slab.get(id);
        match Place::of(&meta) {
            Place::Stack(index) => {
                self.stack[index as usize] = NIL;
                self.stack_live -= 1;
                self.drop_top_tombstones();
                if self.stack.len() > 2 * self.stack_live as usize + TOMBSTONE_SLACK {
                    self.compact_stack(slab);
                }
            }
            Place::Fresh => self.fresh_live -= 1,
            Place::List => {
                if meta.prev == NIL {
                    self.head = meta.next;
                } else {
                    slab.get_mut(meta.prev).next = meta.next;
                }
                if meta.next == NIL {
                    self.tail = meta.prev;
                } else {
                    slab.get_mut(meta.next).prev = meta.prev;
                }
                self.list_len -= 1;
            }
        }
        let meta = slab.get_mut(id);
        meta.prev = NIL;
        meta.next = NIL;
    }

    fn drop_top_tombstones(&mut self) {
        while self.stack.last() == Some(&NIL) {
            self.stack.pop();
        }
    }

    /// Removes the tombstones, keeping the live entries' order and their indices right.
    fn compact_stack(&mut self, slab: &mut Slab) {
        self.stack.retain(|&id| id != NIL);
        for (index, &id) in self.stack.iter().enumerate() {
            slab.get_mut(id).prev = index as u32;
        }
    }

    /// The queued ids from head to tail.
    pub fn iter<'a>(&'a self, slab: &'a Slab) -> impl Iterator<Item = u32> + 'a {
        let stack = self.stack.iter().rev().copied().filter(|&id| id != NIL);
        let fresh = (self.fresh_next..self.fresh_end)
            .filter(move |&id| id < slab.len() && slab.get(id).next == FRESH)
            .take(self.fresh_live as usize);
        let list = ListIter {
            slab,
            next: self.head,
            remaining: self.list_len as usize,
        };
        stack.chain(fresh).chain(list)
    }
}

impl Default for FreeQueue {
    fn default() -> Self {
        Self::new()
    }
}

/// Iterator over the list, head to tail. Stops after `len` steps even if the links
/// were corrupted into a cycle, so `check_invariants` can always finish.
struct ListIter<'a> {
    slab: &'a Slab,
    next: u32,
    remaining: usize,
}

impl Iterator for ListIter<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        if self.next == NIL || self.remaining == 0 || self.next >= self.slab.len() {
            return None;
        }
        let id = self.next;
        self.next = self.slab.get(id).next;
        self.remaining -= 1;
        Some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue_of(n: u32) -> (Slab, FreeQueue) {
        (Slab::new(n).unwrap(), FreeQueue::fresh(0, n))
    }

    /// Puts uncached free blocks at the head, `ids[0]` on top, as a free call does.
    fn push_front(q: &mut FreeQueue, slab: &mut Slab, ids: &[u32]) {
        let mut batch = q.reserve_front(ids.len());
        for &id in ids {
            q.put_front(&mut batch, slab.get_mut(id), id);
        }
        q.finish_front(slab, batch);
    }

    fn order(slab: &Slab, q: &FreeQueue) -> Vec<u32> {
        q.iter(slab).collect()
    }

    fn take(slab: &mut Slab, q: &mut FreeQueue, n: usize) -> Vec<u32> {
        let mut out = vec![];
        q.take_front_n(slab, n, &mut out);
        for &id in &out {
            assert_eq!(slab.get(id).ref_cnt, 1);
            slab.get_mut(id).ref_cnt = 0; // as the pool does before queueing again
        }
        out
    }

    #[test]
    fn fresh_blocks_come_out_in_id_order() {
        let (mut slab, mut q) = queue_of(5);
        assert_eq!(take(&mut slab, &mut q, 2), vec![0, 1]);
        assert_eq!(order(&slab, &q), vec![2, 3, 4]);
        assert_eq!(take(&mut slab, &mut q, 3), vec![2, 3, 4]);
        assert!(q.is_empty());
    }

    #[test]
    fn stack_then_fresh_then_list() {
        let (mut slab, mut q) = queue_of(6);
        take(&mut slab, &mut q, 3);
        push_front(&mut q, &mut slab, &[2, 0]);
        q.push_back_n(&mut slab, &[1]);
        assert_eq!(order(&slab, &q), vec![2, 0, 3, 4, 5, 1]);
        assert_eq!(q.len(), 6);
        assert_eq!(take(&mut slab, &mut q, 6), vec![2, 0, 3, 4, 5, 1]);
    }

    #[test]
    fn remove_from_every_part() {
        let (mut slab, mut q) = queue_of(8);
        take(&mut slab, &mut q, 4);
        push_front(&mut q, &mut slab, &[3, 2]);
        q.push_back_n(&mut slab, &[0, 1]);
        // stack [3, 2], fresh [4..8], list [0, 1]
        q.remove(&mut slab, 2); // stack, under the top
        q.remove(&mut slab, 5); // fresh, in the middle
        q.remove(&mut slab, 0); // list head
        assert_eq!(order(&slab, &q), vec![3, 4, 6, 7, 1]);
        q.remove(&mut slab, 3);
        q.remove(&mut slab, 1);
        assert_eq!(order(&slab, &q), vec![4, 6, 7]);
        assert_eq!(q.stack_entries(), &[] as &[u32]);
        assert_eq!((q.list_head(), q.tail()), (NIL, NIL));
        let mut out = vec![];
        let from_list = q.take_front_n(&mut slab, 3, &mut out);
        assert_eq!((out, from_list), (vec![4, 6, 7], 3));
    }

    #[test]
    fn tombstones_are_compacted_and_order_kept() {
        let n = 1_000;
        let (mut slab, mut q) = queue_of(n);
        let all = take(&mut slab, &mut q, n as usize);
        push_front(&mut q, &mut slab, &all);
        // Take every block but the top one out of the stack's middle.
        for &id in &all[1..n as usize - 1] {
            q.remove(&mut slab, id);
        }
        assert!(q.stack_entries().len() <= 2 * 2 + TOMBSTONE_SLACK);
        assert_eq!(order(&slab, &q), vec![0, n - 1]);
        for (i, &id) in q.stack_entries().iter().enumerate() {
            if id != NIL {
                assert_eq!(Place::of(slab.get(id)), Place::Stack(i as u32));
            }
        }
        assert_eq!(take(&mut slab, &mut q, 2), vec![0, n - 1]);
    }
}
