//! The free queue's list part: cached free blocks in one or more LRU lists.
//!
//! Each list (a *class*) is doubly linked through the slab's `prev`/`next`, least
//! recently freed at its head. Under LRU there is one class and this is vLLM's
//! queue. Other eviction policies (`eviction.rs`) sort blocks into several classes
//! (a retention priority, a use-count band) and pick which class's head goes next;
//! within a class the order stays LRU. Every operation is O(1).

use super::slab::{Slab, NIL};

/// Most classes a queue can have (the non-empty set is a 128-bit mask).
pub const MAX_CLASSES: usize = 128;

/// One list's ends and length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListEnds {
    /// First block (the next to go), or [`NIL`].
    pub head: u32,
    /// Last block (the most recently queued), or [`NIL`].
    pub tail: u32,
    /// Blocks in the list.
    pub len: u32,
}

impl ListEnds {
    const EMPTY: Self = Self {
        head: NIL,
        tail: NIL,
        len: 0,
    };
}

/// The lists, and which list each queued block is in.
#[derive(Clone, Debug)]
pub struct ClassLists {
    ends: Vec<ListEnds>,
    /// Each block's class, indexed by block id; empty with one class.
    class_of: Vec<u8>,
    /// Bit `c` set when class `c` is non-empty.
    nonempty: u128,
    len: u32,
}

impl ClassLists {
    /// `classes` empty lists (1..=[`MAX_CLASSES`]) for a slab of `num_blocks`. With
    /// `track`, the lists record each queued block's class; without, the caller
    /// knows it (it passes the class to [`unlink_class`](Self::unlink_class)).
    pub fn new(classes: usize, num_blocks: u32, track: bool) -> Self {
        assert!((1..=MAX_CLASSES).contains(&classes));
        let class_of = if classes > 1 && track {
            vec![0; num_blocks as usize]
        } else {
            Vec::new()
        };
        Self {
            ends: vec![ListEnds::EMPTY; classes],
            class_of,
            nonempty: 0,
            len: 0,
        }
    }

    /// Blocks in all lists.
    #[inline]
    pub fn len(&self) -> u32 {
        self.len
    }

    /// True when every list is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of classes.
    pub fn num_classes(&self) -> usize {
        self.ends.len()
    }

    /// Class `class`'s ends.
    #[inline]
    pub fn ends(&self, class: usize) -> ListEnds {
        self.ends[class]
    }

    /// Whether the lists record each block's class.
    pub fn tracks_classes(&self) -> bool {
        !self.class_of.is_empty() || self.ends.len() == 1
    }

    /// The class of queued block `id` (with one class, or when tracked).
    #[inline]
    pub fn class_of(&self, id: u32) -> usize {
        if self.class_of.is_empty() {
            0
        } else {
            self.class_of[id as usize] as usize
        }
    }

    /// The lowest non-empty class, if any.
    #[inline]
    pub fn lowest_nonempty(&self) -> Option<usize> {
        (self.nonempty != 0).then(|| self.nonempty.trailing_zeros() as usize)
    }

    /// The non-empty classes, lowest first.
    pub fn nonempty_classes(&self) -> impl Iterator<Item = usize> {
        let mut mask = self.nonempty;
        std::iter::from_fn(move || {
            (mask != 0).then(|| {
                let c = mask.trailing_zeros() as usize;
                mask &= mask - 1;
                c
            })
        })
    }

    /// Appends `id` (free, in no list) at the tail of `class`.
    #[inline]
    pub fn push_back(&mut self, slab: &mut Slab, class: usize, id: u32) {
        let ends = &mut self.ends[class];
        let meta = slab.get_mut(id);
        meta.prev = ends.tail;
        meta.next = NIL;
        if ends.tail == NIL {
            ends.head = id;
        } else {
            slab.get_mut(ends.tail).next = id;
        }
        ends.tail = id;
        ends.len += 1;
        self.len += 1;
        self.nonempty |= 1 << class;
        if !self.class_of.is_empty() {
            self.class_of[id as usize] = class as u8;
        }
    }

    /// Unlinks queued block `id` from its list (its own links are left to the caller).
    #[inline]
    pub fn unlink(&mut self, slab: &mut Slab, id: u32) {
        self.unlink_class(slab, id, self.class_of(id));
    }

    /// Unlinks queued block `id` from list `class`, which holds it.
    #[inline]
    pub fn unlink_class(&mut self, slab: &mut Slab, id: u32, class: usize) {
        let meta = *slab.get(id);
        let ends = &mut self.ends[class];
        if meta.prev == NIL {
            ends.head = meta.next;
        } else {
            slab.get_mut(meta.prev).next = meta.next;
        }
        if meta.next == NIL {
            ends.tail = meta.prev;
        } else {
            slab.get_mut(meta.next).prev = meta.prev;
        }
        ends.len -= 1;
        self.len -= 1;
        if ends.len == 0 {
            self.nonempty &= !(1 << class);
        }
    }

    /// Takes the head of `class` (non-empty) out, its links reset to [`NIL`].
    #[inline]
    pub fn pop_front(&mut self, slab: &mut Slab, class: usize) -> u32 {
        let id = self.ends[class].head;
        debug_assert!(id != NIL);
        self.unlink_class(slab, id, class);
        let meta = slab.get_mut(id);
        meta.prev = NIL;
        meta.next = NIL;
        id
    }

    /// Takes the first `n` blocks of `class` (it has them) in one walk, appending
    /// them to `out` with count 1 and no links: the LRU queue's allocation loop.
    #[inline]
    pub fn take_front_run(&mut self, slab: &mut Slab, class: usize, n: usize, out: &mut Vec<u32>) {
        debug_assert!(n as u32 <= self.ends[class].len);
        let mut id = self.ends[class].head;
        for _ in 0..n {
            out.push(id);
            id = take_block(slab, id);
        }
        self.cut_front(slab, class, id, n as u32);
    }

    /// Makes `head` the first block of `class`, whose `taken` blocks before it were
    /// taken out (their links already reset).
    #[inline(always)]
    fn cut_front(&mut self, slab: &mut Slab, class: usize, head: u32, taken: u32) {
        let ends = &mut self.ends[class];
        ends.head = head;
        if head == NIL {
            ends.tail = NIL;
        } else {
            slab.get_mut(head).prev = NIL;
        }
        ends.len -= taken;
        self.len -= taken;
        if ends.len == 0 {
            self.nonempty &= !(1 << class);
        }
    }

    /// Takes the `n` blocks (the lists have them) that come first when classes 0 and
    /// 1, each in ascending `key` order head to tail, are merged, class 0 first on
    /// equal keys; appends them to `out` with count 1 and no links. What taking the
    /// head of the class with the lower key `n` times does, in one walk: the adaptive
    /// policy's allocation loop.
    #[inline]
    pub fn take_merged_two(
        &mut self,
        slab: &mut Slab,
        n: usize,
        out: &mut Vec<u32>,
        key: impl Fn(u32) -> u64,
    ) {
        debug_assert!(self.ends.len() == 2 && n as u32 <= self.len);
        let key_of = |id: u32| if id == NIL { u64::MAX } else { key(id) };
        // When a class has the `n` blocks and its last comes before the other's first
        // (the list in key order, class 0 first on a tie), the merge's first `n` are
        // that class's: taken in LRU's walk, no key read per block. The usual case: a
        // pool with no reused block free, or whose reused blocks' credits are ahead of
        // every block used once.
        for class in 0..2 {
            let ends = self.ends[class];
            if n as u32 <= ends.len {
                let last = key_of(ends.tail);
                let first_other = key_of(self.ends[1 - class].head);
                if last < first_other || (class == 0 && last == first_other) {
                    self.take_front_run(slab, class, n, out);
                    return;
                }
            }
        }
        let mut heads = [self.ends[0].head, self.ends[1].head];
        let mut keys = [key_of(heads[0]), key_of(heads[1])];
        let mut taken = [0u32; 2];
        for _ in 0..n {
            let class = usize::from(keys[1] < keys[0]);
            let id = heads[class];
            out.push(id);
            heads[class] = take_block(slab, id);
            keys[class] = key_of(heads[class]);
            taken[class] += 1;
        }
        for class in 0..2 {
            self.cut_front(slab, class, heads[class], taken[class]);
        }
    }

    /// The blocks of `class`, head to tail. Stops after the list's length even if
    /// the links were corrupted into a cycle, so the invariant walk always finishes.
    pub fn iter_class<'a>(&self, slab: &'a Slab, class: usize) -> ClassIter<'a> {
        ClassIter {
            slab,
            next: self.ends[class].head,
            remaining: self.ends[class].len as usize,
        }
    }
}

impl ClassLists {
    /// Appends to `out` at most `max` of the blocks after `id` when the classes are
    /// read one after another, lowest first (the order of every policy but the
    /// adaptive one, which merges its classes by credit): the rest of `id`'s list,
    /// then every higher non-empty class's list, each read in a loop of its own.
    /// Nothing when `id` is linked into no list of class `class` (the caller,
    /// `FreeQueue::ids_after`, has checked that it is a free block neither stacked nor
    /// fresh, and passes the class its policy keeps it in). O(1) to start.
    pub fn ids_after_in_class_order(
        &self,
        slab: &Slab,
        id: u32,
        class: usize,
        max: usize,
        out: &mut Vec<u32>,
    ) {
        let Some(ends) = self.ends.get(class) else {
            return;
        };
        let meta = slab.get(id);
        if meta.prev == NIL && ends.head != id {
            return;
        }
        let start = out.len();
        extend_from(slab, meta.next, max.min(ends.len as usize), out);
        for higher in self.nonempty_classes().filter(|&c| c > class) {
            let room = max - (out.len() - start);
            if room == 0 {
                return;
            }
            let ends = self.ends[higher];
            extend_from(slab, ends.head, room.min(ends.len as usize), out);
        }
    }
}

/// Appends to `out` at most `limit` blocks of a list, from `first` on by their links.
#[inline]
fn extend_from(slab: &Slab, first: u32, limit: usize, out: &mut Vec<u32>) {
    out.reserve(limit);
    let mut next = first;
    for _ in 0..limit {
        if next == NIL || next >= slab.len() {
            return;
        }
        out.push(next);
        next = slab.get(next).next;
    }
}

/// Marks queued block `id` in use (count 1, no links); returns the block after it.
#[inline(always)]
fn take_block(slab: &mut Slab, id: u32) -> u32 {
    let meta = slab.get_mut(id);
    let next = meta.next;
    meta.ref_cnt = 1;
    meta.prev = NIL;
    meta.next = NIL;
    next
}

/// Iterator over one class's list, head to tail.
pub struct ClassIter<'a> {
    slab: &'a Slab,
    next: u32,
    remaining: usize,
}

impl Iterator for ClassIter<'_> {
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

    proptest::proptest! {
        /// Merging the two classes in one walk takes the same blocks, in the same
        /// order, and leaves the same lists as taking the head with the lower key (class
        /// 0 on a tie) one block at a time. Each class's keys ascend from a start of
        /// its own (the policy's band 1 credits are raised by its horizon), so either
        /// class may come wholly first (the walk without a merge), ties at the
        /// boundary included.
        #[test]
        fn take_merged_two_is_taking_the_lower_head_n_times(
            classes in proptest::collection::vec(0usize..2, 0..16),
            steps in proptest::collection::vec(0u64..2, 16),
            starts in (0u64..12, 0u64..12),
            take in 0usize..16,
        ) {
            let n = classes.len() as u32;
            let take = take.min(classes.len());
            let mut next = [starts.0, starts.1];
            let keys: Vec<u64> = classes
                .iter()
                .zip(&steps)
                .map(|(&class, &step)| {
                    let k = next[class];
                    next[class] += step;
                    k
                })
                .collect();
            let key = |id: u32| keys[id as usize];
            let build = || {
                let mut slab = Slab::new(n.max(1)).unwrap();
                let mut lists = ClassLists::new(2, n.max(1), true);
                for (id, &class) in classes.iter().enumerate() {
                    slab.get_mut(id as u32).ref_cnt = 0;
                    lists.push_back(&mut slab, class, id as u32);
                }
                (slab, lists)
            };
            let (mut slab_a, mut a) = build();
            let mut merged = Vec::new();
            a.take_merged_two(&mut slab_a, take, &mut merged, key);
            let (mut slab_b, mut b) = build();
            let mut one_by_one = Vec::new();
            for _ in 0..take {
                let credit = |c: usize| {
                    let head = b.ends(c).head;
                    if head == NIL { u64::MAX } else { key(head) }
                };
                let class = usize::from(credit(1) < credit(0));
                let id = b.pop_front(&mut slab_b, class);
                slab_b.get_mut(id).ref_cnt = 1;
                one_by_one.push(id);
            }
            proptest::prop_assert_eq!(&merged, &one_by_one);
            for class in 0..2 {
                proptest::prop_assert_eq!(a.ends(class), b.ends(class));
                proptest::prop_assert_eq!(
                    a.iter_class(&slab_a, class).collect::<Vec<_>>(),
                    b.iter_class(&slab_b, class).collect::<Vec<_>>()
                );
            }
            proptest::prop_assert_eq!(a.len(), b.len());
            proptest::prop_assert_eq!(a.lowest_nonempty(), b.lowest_nonempty());
            for id in 0..n {
                proptest::prop_assert_eq!(slab_a.get(id), slab_b.get(id));
            }
        }
    }

    #[test]
    fn classes_keep_lru_order_and_the_mask() {
        let mut slab = Slab::new(8).unwrap();
        let mut lists = ClassLists::new(3, 8, true);
        for (id, class) in [(1, 2), (2, 0), (3, 2), (4, 0)] {
            lists.push_back(&mut slab, class, id);
        }
        assert_eq!(lists.lowest_nonempty(), Some(0));
        assert_eq!(lists.nonempty_classes().collect::<Vec<_>>(), vec![0, 2]);
        assert_eq!(lists.iter_class(&slab, 2).collect::<Vec<_>>(), vec![1, 3]);
        lists.unlink(&mut slab, 2);
        assert_eq!(lists.pop_front(&mut slab, 0), 4);
        assert_eq!(lists.lowest_nonempty(), Some(2));
        assert_eq!(lists.class_of(3), 2);
        assert_eq!(lists.len(), 2);
    }
}
