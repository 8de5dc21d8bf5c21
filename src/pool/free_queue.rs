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
//! 3. **the lists**: cached blocks (and blocks whose hash was dropped while free),
//!    doubly linked lists threaded through the slab by `u32` links, with O(1)
//!    removal from the middle, which is what lets a prefix-cache hit reclaim a free
//!    block. Under LRU there is one list; other eviction policies keep several and
//!    choose which head goes next (`eviction.rs`, `class_lists.rs`).
//!
//! Head to tail the queue is stack (top first), fresh range, lists in the policy's
//! eviction order: under LRU exactly vLLM's order (the invariant walk and the model
//! tests check it). Every operation is O(1) per block moved, amortized, and
//! allocation-free once the stack has grown.

use super::class_lists::{ClassIter, ClassLists};
use super::eviction::{Clock, Eviction, EvictionPolicy};
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
    /// Blocks in the lists.
    pub list_len: usize,
}

/// Where a free block sits in the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// On the stack at this index.
    Stack(u32),
    /// In the fresh range.
    Fresh,
    /// In one of the lists.
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

/// The stack, the fresh range and the lists with their eviction policy; the links
/// live in the [`Slab`].
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
    /// Cached free blocks, one list per class of the policy.
    lists: ClassLists,
    /// The policy: each freed block's class and which class goes next.
    eviction: Eviction,
    /// Changes whenever the queue's order or membership may have changed (see
    /// [`Self::version`]).
    version: u64,
}

impl FreeQueue {
    /// An LRU queue holding the blocks `first..end` in id order, all fresh: the
    /// caller has built their slab entries as [`BlockMeta::FRESH`]. Costs O(1).
    pub fn fresh(first: u32, end: u32) -> Self {
        let eviction = Eviction::new(EvictionPolicy::Lru, 0, Clock::Manual(0.0))
            .expect("LRU keeps no per-block state");
        Self::with_policy(first, end, eviction)
    }

    /// A queue of the blocks `first..end`, all fresh, evicting cached blocks by
    /// `eviction`'s policy (its per-block state sized for at least `end` blocks).
    pub fn with_policy(first: u32, end: u32, eviction: Eviction) -> Self {
        Self {
            stack: Vec::new(),
            stack_live: 0,
            fresh_next: first,
            fresh_end: end.max(first),
            fresh_live: end.saturating_sub(first),
            lists: ClassLists::new(
                eviction.num_classes(),
                end,
                eviction.policy() != EvictionPolicy::Adaptive,
            ),
            eviction,
            version: 0,
        }
    }

    /// An empty queue.
    pub fn new() -> Self {
        Self::fresh(0, 0)
    }

    /// Number of free blocks.
    #[inline]
    pub fn len(&self) -> usize {
        (self.stack_live + self.fresh_live + self.lists.len()) as usize
    }

    /// The eviction policy's state.
    pub fn eviction(&self) -> &Eviction {
        &self.eviction
    }

    /// The eviction policy's state, mutably (the pool reports uses, cachings and
    /// evictions to it). Counts as a change of the queue ([`Self::version`]): the
    /// adaptive policy's order depends on it.
    #[inline]
    pub fn eviction_mut(&mut self) -> &mut Eviction {
        self.changed();
        &mut self.eviction
    }

    /// A number that differs from any earlier one whenever the queue may have changed
    /// since (a block taken, freed, moved or re-classed; the policy's state updated);
    /// the same number means the same queue, in the same order. For readers that
    /// walk the queue in pieces across calls (`kvpool.vllm.FreeBlockWalk`) and must
    /// notice the pool changing between them. Reading it costs nothing; keeping it
    /// costs one increment per change.
    #[inline]
    pub fn version(&self) -> u64 {
        self.version
    }

    #[inline(always)]
    fn changed(&mut self) {
        self.version = self.version.wrapping_add(1);
    }

    /// The lists of cached free blocks.
    pub fn lists(&self) -> &ClassLists {
        &self.lists
    }

    /// The list block `id`, free in the lists, is in.
    #[inline]
    pub fn class_of(&self, id: u32) -> usize {
        if self.lists.tracks_classes() {
            self.lists.class_of(id)
        } else {
            self.eviction.band(id)
        }
    }

    /// Puts free block `id`, queued in one of the lists, at the tail of the list its
    /// policy now assigns it (after its priority changed; the caller applied the
    /// expiries due before changing it).
    pub fn requeue(&mut self, slab: &mut Slab, id: u32) {
        self.changed();
        self.lists.unlink_class(slab, id, self.class_of(id));
        self.eviction.on_dequeued(id);
        let class = self.eviction.class_for(id);
        self.lists.push_back(slab, class, id);
    }

    /// Moves every free block whose raised priority ran out to the tail of the
    /// default priority's list, in expiry order. A no-op without pending expiries
    /// (one heap peek). Run before every change of the lists (a block joining one, a
    /// requeue, allocation reaching them), so a block whose priority ran out queues
    /// ahead of every block that joined the default list after it ran out, and
    /// applying them at any other moment (`free_block_ids`) changes nothing
    /// observable.
    pub fn apply_expiries(&mut self, slab: &mut Slab) {
        let lists = &self.lists;
        let due = self.eviction.due_expiries(|id| {
            Place::of(slab.get(id)) == Place::List
                && slab.get(id).ref_cnt == 0
                && lists.class_of(id) != super::eviction::DEFAULT_PRIORITY as usize
        });
        for id in due {
            self.changed();
            self.lists.unlink(slab, id);
            let class = self.eviction.class_for(id);
            self.lists.push_back(slab, class, id);
        }
    }

    /// True when no block is free.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
            list_len: self.lists.len() as usize,
        }
    }

    /// Takes `n` blocks from the head (the caller has checked `n <= len`), appends
    /// them to `out` in queue order and marks each in use with count 1. Returns the
    /// position in `out` from which blocks came from the list: only those can still
    /// hold a cached hash.
    pub fn take_front_n(&mut self, slab: &mut Slab, n: usize, out: &mut Vec<u32>) -> usize {
        debug_assert!(n <= self.len());
        if n > 0 {
            self.changed();
        }
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
        // 2. The fresh range, in id order, skipping blocks taken from it earlier. With
        // no such gaps (the usual case), the next `take` ids in one run.
        if left > 0 && self.fresh_live == self.fresh_end - self.fresh_next {
            let take = left.min(self.fresh_live as usize) as u32;
            let run = self.fresh_next..self.fresh_next + take;
            out.extend(run.clone());
            slab.metas_mut()[run.start as usize..run.end as usize].fill(in_use);
            self.fresh_next = run.end;
            self.fresh_live -= take;
            left -= take as usize;
        }
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
        // 3. The lists, in the policy's order.
        let from_list = out.len();
        if left > 0 {
            if self.lists.num_classes() == 1 {
                self.lists.take_front_run(slab, 0, left, out);
            } else if self.eviction.ranks_by_use() {
                // Two bands, each in credit order: the lower head first, in one walk
                // (no expiries, nothing to do as a block leaves).
                let eviction = &self.eviction;
                self.lists
                    .take_merged_two(slab, left, out, |id| eviction.credit(id));
            } else {
                self.apply_expiries(slab);
                for _ in 0..left {
                    let class = self.eviction.choose(&self.lists);
                    let id = self.lists.pop_front(slab, class);
                    self.eviction.on_dequeued(id);
                    slab.get_mut(id).ref_cnt = 1;
                    out.push(id);
                }
            }
        }
        from_list
    }

    /// Opens room for up to `max` uncached blocks at the head, put there one by one
    /// through [`front_slots`](Self::front_slots) (the first put becomes the head) and
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

    /// The stack up to `batch`'s end, borrowed apart from the queue, and the batch's
    /// cursor (an index into it): blocks are put from the cursor down, at most down
    /// to the batch's start (the first put becomes the head), and
    /// [`set_front_next`](Self::set_front_next) records where the cursor ended.
    #[inline]
    pub fn front_slots(&mut self, batch: &FrontBatch) -> (&mut [u32], usize) {
        (&mut self.stack[..batch.end], batch.next)
    }

    /// Records that `batch`'s blocks now start at `next` in its
    /// [`front_slots`](Self::front_slots), each block put there with metadata
    /// [`BlockMeta::stacked`] at its index.
    #[inline]
    pub fn set_front_next(&mut self, batch: &mut FrontBatch, next: usize) {
        debug_assert!(batch.base <= next && next <= batch.next);
        batch.next = next;
    }

    /// Commits `batch`: its blocks are now the head of the queue, the first put on top.
    pub fn finish_front(&mut self, slab: &mut Slab, batch: FrontBatch) {
        let FrontBatch { base, end, next } = batch;
        let put = end - next;
        if put > 0 {
            self.changed();
        }
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
        self.changed();
        self.stack.truncate(mark.0);
        self.stack_live = mark.1;
    }

    /// Appends freed cached blocks, in the order given, each at the tail of the list
    /// its policy puts it in.
    pub fn push_back_n(&mut self, slab: &mut Slab, ids: &[u32]) {
        if !ids.is_empty() {
            self.changed();
        }
        if self.lists.num_classes() == 1 {
            for &id in ids {
                self.lists.push_back(slab, 0, id);
            }
            return;
        }
        if self.eviction.ranks_by_use() {
            for &id in ids {
                let class = self.eviction.adaptive_class_for(id);
                self.lists.push_back(slab, class, id);
            }
            return;
        }
        self.apply_expiries(slab);
        for &id in ids {
            let class = self.eviction.class_for(id);
            self.lists.push_back(slab, class, id);
        }
    }

    /// Puts free uncached blocks, out of the queue, at its head: the first given
    /// becomes the head, as a free call queues uncached blocks.
    pub fn push_front_n(&mut self, slab: &mut Slab, ids: &[u32]) {
        if !ids.is_empty() {
            self.changed();
        }
        for &id in ids.iter().rev() {
            slab.get_mut(id)
                .store(BlockMeta::stacked(self.stack.len() as u32));
            self.stack.push(id);
        }
        self.stack_live += ids.len() as u32;
    }

    /// Takes block `id`, which the caller knows to be free, out of the queue.
    pub fn remove(&mut self, slab: &mut Slab, id: u32) {
        self.changed();
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
                self.lists.unlink_class(slab, id, self.class_of(id));
                self.eviction.on_dequeued(id);
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
        stack
            .chain(self.fresh_from(slab, self.fresh_next))
            .chain(self.list_order(slab))
    }

    /// The fresh range's blocks from id `first` on, in id order.
    fn fresh_from<'a>(&'a self, slab: &'a Slab, first: u32) -> impl Iterator<Item = u32> + 'a {
        // Live fresh blocks at or after `first`: all of them from the range's start;
        // from inside it, at most all (the scan stops at the range's end).
        let bound = if first <= self.fresh_next {
            self.fresh_live as usize
        } else {
            usize::MAX
        };
        (first.max(self.fresh_next)..self.fresh_end)
            .filter(move |&id| id < slab.len() && slab.get(id).next == FRESH)
            .take(bound)
    }

    /// The queued ids after `cursor`, head to tail (from the head when `cursor` is
    /// `None`; nothing when `cursor` is not queued), at most `max`, appended to `out`.
    /// O(max) to go on from a block on the stack or in the fresh range, and from one in
    /// the lists under LRU and priorities (the walk starts at the cursor's own place: a
    /// stacked block's index, a fresh block's id, a listed block's links, the lists
    /// read one after another); O(position of `cursor` in the lists + max) from a
    /// listed block under the adaptive policy, whose lists are merged by credit as they
    /// are read.
    pub fn ids_after(&self, slab: &Slab, cursor: Option<u32>, max: usize, out: &mut Vec<u32>) {
        let Some(cursor) = cursor else {
            out.extend(self.iter(slab).take(max));
            return;
        };
        if cursor >= slab.len() || slab.get(cursor).ref_cnt != 0 {
            return;
        }
        match Place::of(slab.get(cursor)) {
            Place::Stack(index) => {
                // A stacked block's `prev` is its index (the invariant walk checks it).
                let Some(below) = self
                    .stack
                    .get(..index as usize)
                    .filter(|_| self.stack.get(index as usize) == Some(&cursor))
                else {
                    debug_assert!(false, "block {cursor} is not at stack index {index}");
                    return;
                };
                let below = below.iter().rev().copied().filter(|&id| id != NIL);
                let rest = below
                    .chain(self.fresh_from(slab, self.fresh_next))
                    .chain(self.list_order(slab));
                out.extend(rest.take(max));
            }
            Place::Fresh => {
                let rest = self
                    .fresh_from(slab, cursor + 1)
                    .chain(self.list_order(slab));
                out.extend(rest.take(max));
            }
            Place::List if !self.eviction.ranks_by_use() => {
                let class = self.class_of(cursor);
                self.lists
                    .ids_after_in_class_order(slab, cursor, class, max, out);
            }
            Place::List => {
                let mut rest = self.list_order(slab).skip_while(|&id| id != cursor);
                if rest.next().is_some() {
                    out.extend(rest.take(max));
                }
            }
        }
    }

    /// The queued block just before `cursor`, toward the head: `None` when `cursor` is
    /// the head or not queued. vLLM's `KVCacheBlock.prev_free_block`. O(1) for a listed
    /// block under LRU and priorities (its link, or the tail of the class before its
    /// own); otherwise O(the stack's tombstones or the fresh range's gaps crossed), and
    /// under the adaptive policy O(its position among the cached blocks), as
    /// [`Self::ids_after`].
    pub fn id_before(&self, slab: &Slab, cursor: u32) -> Option<u32> {
        if cursor >= slab.len() || slab.get(cursor).ref_cnt != 0 {
            return None;
        }
        let meta = slab.get(cursor);
        // Before the lists: the fresh range's last block, else the stack's last.
        let before_lists = || self.unlisted_last(slab);
        match Place::of(meta) {
            Place::Stack(index) => {
                if self.stack.get(index as usize) != Some(&cursor) {
                    debug_assert!(false, "block {cursor} is not at stack index {index}");
                    return None;
                }
                // Toward the head is up the stack.
                let above = &self.stack[index as usize + 1..];
                above.iter().copied().find(|&id| id != NIL)
            }
            Place::Fresh => (self.fresh_next..cursor)
                .rev()
                .find(|&id| slab.get(id).next == FRESH)
                .or_else(|| self.stack_last()),
            Place::List if !self.eviction.ranks_by_use() => {
                let class = self.class_of(cursor);
                if self.lists.ends(class).head != cursor {
                    // Linked within its class's list (a block in no list has no link).
                    return (meta.prev != NIL).then_some(meta.prev);
                }
                self.lists
                    .nonempty_classes()
                    .filter(|&c| c < class)
                    .last()
                    .map(|c| self.lists.ends(c).tail)
                    .or_else(before_lists)
            }
            Place::List => {
                let mut before = None;
                for id in self.list_order(slab) {
                    if id == cursor {
                        return before.or_else(before_lists);
                    }
                    before = Some(id);
                }
                None
            }
        }
    }

    /// The queue's last block (its tail: vLLM's `fake_free_list_tail.prev_free_block`),
    /// or `None` when the queue is empty. With cached blocks free, O(1) under every
    /// policy: the tail of the list that the policy's order ends with (the last
    /// non-empty class; under the adaptive policy, the band tail with the greater
    /// credit, band 1 on a tie, since each band is in credit order and the merge takes
    /// band 0 first on a tie). Otherwise O(the fresh range's gaps or the stack's
    /// tombstones crossed), as [`Self::id_before`].
    pub fn last_id(&self, slab: &Slab) -> Option<u32> {
        let adaptive = self.eviction.ranks_by_use();
        let mut last: Option<(u64, u32)> = None;
        for class in self.lists.nonempty_classes() {
            let tail = self.lists.ends(class).tail;
            let key = if adaptive {
                self.eviction.credit(tail)
            } else {
                0
            };
            if last.is_none_or(|(k, _)| key >= k) {
                last = Some((key, tail));
            }
        }
        let last = last.map(|(_, id)| id).or_else(|| self.unlisted_last(slab));
        debug_assert_eq!(
            last,
            self.list_order(slab)
                .last()
                .or_else(|| self.unlisted_last(slab)),
            "the last block by the lists' tails differs from the walk's"
        );
        last
    }

    /// The last block before the lists: the fresh range's last, else the stack's.
    fn unlisted_last(&self, slab: &Slab) -> Option<u32> {
        self.fresh_last(slab).or_else(|| self.stack_last())
    }

    /// The stack's last block in queue order (its lowest live entry).
    fn stack_last(&self) -> Option<u32> {
        self.stack.iter().copied().find(|&id| id != NIL)
    }

    /// The fresh range's last block still fresh.
    fn fresh_last(&self, slab: &Slab) -> Option<u32> {
        if self.fresh_live == 0 {
            return None;
        }
        (self.fresh_next..self.fresh_end)
            .rev()
            .find(|&id| slab.get(id).next == FRESH)
    }

    /// The lists' blocks in the order the policy would evict them now.
    pub fn list_order<'a>(&'a self, slab: &'a Slab) -> ListOrder<'a> {
        let heads = self
            .lists
            .nonempty_classes()
            .map(|class| {
                let mut it = self.lists.iter_class(slab, class);
                let head = it.next();
                (class, head, it)
            })
            .collect();
        ListOrder {
            heads,
            eviction: &self.eviction,
        }
    }
}

impl Default for FreeQueue {
    fn default() -> Self {
        Self::new()
    }
}

/// The lists merged in eviction order: each step yields the head the policy would
/// choose (lowest class under priority, lowest credit then lowest class under the
/// adaptive policy).
pub struct ListOrder<'a> {
    heads: Vec<(usize, Option<u32>, ClassIter<'a>)>,
    eviction: &'a Eviction,
}

impl Iterator for ListOrder<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        let adaptive = self.eviction.ranks_by_use();
        let mut best: Option<(u64, usize)> = None;
        for (index, (_, head, _)) in self.heads.iter().enumerate() {
            let Some(id) = *head else { continue };
            let key = if adaptive {
                self.eviction.credit(id)
            } else {
                0
            };
            if best.is_none_or(|(k, _)| key < k) {
                best = Some((key, index));
            }
        }
        let (_, index) = best?;
        let (_, head, rest) = &mut self.heads[index];
        let id = head.take();
        *head = rest.next();
        id
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
            let (slots, mut next) = q.front_slots(&batch);
            next -= 1;
            slots[next] = id;
            *slab.get_mut(id) = BlockMeta::stacked(next as u32);
            q.set_front_next(&mut batch, next);
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
    fn ids_after_a_cursor_in_every_part() {
        let (mut slab, mut q) = queue_of(8);
        take(&mut slab, &mut q, 5);
        push_front(&mut q, &mut slab, &[3, 2]);
        q.push_back_n(&mut slab, &[0, 1, 4]);
        // stack [3, 2], fresh [5..8], list [0, 1, 4]
        let after = |q: &FreeQueue, slab: &Slab, cursor, max| {
            let mut out = vec![];
            q.ids_after(slab, cursor, max, &mut out);
            out
        };
        assert_eq!(after(&q, &slab, None, 99), order(&slab, &q));
        assert_eq!(after(&q, &slab, None, 2), vec![3, 2]);
        assert_eq!(after(&q, &slab, Some(3), 99), vec![2, 5, 6, 7, 0, 1, 4]);
        assert_eq!(after(&q, &slab, Some(2), 99), vec![5, 6, 7, 0, 1, 4]);
        assert_eq!(after(&q, &slab, Some(6), 2), vec![7, 0]);
        assert_eq!(after(&q, &slab, Some(5), 99), vec![6, 7, 0, 1, 4]);
        // From the list: read by its links, up to the tail.
        assert_eq!(after(&q, &slab, Some(0), 99), vec![1, 4]);
        assert_eq!(after(&q, &slab, Some(1), 1), vec![4]);
        assert_eq!(after(&q, &slab, Some(4), 99), Vec::<u32>::new());
        // A block in use has nothing after it.
        q.remove(&mut slab, 1);
        slab.get_mut(1).ref_cnt = 1;
        assert_eq!(after(&q, &slab, Some(1), 99), Vec::<u32>::new());
        assert_eq!(after(&q, &slab, Some(0), 99), vec![4]);
    }

    #[test]
    fn ids_after_skip_tombstones_and_taken_fresh_blocks() {
        let (mut slab, mut q) = queue_of(10);
        take(&mut slab, &mut q, 4);
        push_front(&mut q, &mut slab, &[0, 1, 2, 3]);
        // stack [0, 1, 2, 3] (0 on top), fresh [4..10]; take 2 from the stack's middle
        // (a tombstone) and 6 from the fresh range's middle.
        q.remove(&mut slab, 2);
        slab.get_mut(2).ref_cnt = 1;
        q.remove(&mut slab, 6);
        slab.get_mut(6).ref_cnt = 1;
        let after = |cursor| {
            let mut out = vec![];
            q.ids_after(&slab, Some(cursor), 99, &mut out);
            out
        };
        let whole = order(&slab, &q);
        assert_eq!(whole, vec![0, 1, 3, 4, 5, 7, 8, 9]);
        for (i, &cursor) in whole.iter().enumerate() {
            assert_eq!(after(cursor), whole[i + 1..].to_vec(), "after {cursor}");
        }
        assert_eq!(after(2), Vec::<u32>::new());
        assert_eq!(after(6), Vec::<u32>::new());
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
        assert!(q.lists().is_empty());
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
