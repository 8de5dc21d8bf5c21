//! The free queue: a doubly linked list threaded through the slab by `u32` links.
//!
//! Head = next to be reused (least recently used), tail = most recently freed. Every
//! operation is O(1) per block moved and allocation-free; removal from the middle is
//! O(1), which is what lets a prefix-cache hit reclaim a free block cheaply.

use super::slab::{Slab, NIL};

/// Head, tail and length of the list; the links live in the [`Slab`].
#[derive(Clone, Debug)]
pub struct FreeQueue {
    head: u32,
    tail: u32,
    len: u32,
}

impl FreeQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self {
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    /// Number of free blocks.
    #[inline]
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// True when no block is free.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The head block (next to be reused), or [`NIL`].
    pub fn head(&self) -> u32 {
        self.head
    }

    /// The tail block (most recently freed), or [`NIL`].
    pub fn tail(&self) -> u32 {
        self.tail
    }

    /// Links `ids` into one chain, in order, and returns its ends. `ids` is not empty.
    fn link_chain(slab: &mut Slab, ids: &[u32]) -> (u32, u32) {
        let mut prev = NIL;
        for &id in ids {
            let meta = slab.get_mut(id);
            meta.prev = prev;
            meta.next = NIL;
            if prev != NIL {
                slab.get_mut(prev).next = id;
            }
            prev = id;
        }
        (ids[0], prev)
    }

    /// Appends `ids` at the tail, in the order given.
    pub fn push_back_n(&mut self, slab: &mut Slab, ids: &[u32]) {
        if ids.is_empty() {
            return;
        }
        let (first, last) = Self::link_chain(slab, ids);
        if self.tail == NIL {
            self.head = first;
        } else {
            slab.get_mut(self.tail).next = first;
            slab.get_mut(first).prev = self.tail;
        }
        self.tail = last;
        self.len += ids.len() as u32;
    }

    /// Prepends `ids` at the head, in the order given: `ids[0]` becomes the head.
    pub fn push_front_n(&mut self, slab: &mut Slab, ids: &[u32]) {
        if ids.is_empty() {
            return;
        }
        let (first, last) = Self::link_chain(slab, ids);
        if self.head == NIL {
            self.tail = last;
        } else {
            slab.get_mut(self.head).prev = last;
            slab.get_mut(last).next = self.head;
        }
        self.head = first;
        self.len += ids.len() as u32;
    }

    /// Pops `n` blocks from the head, appending them to `out` in queue order.
    /// The caller has checked `n <= len`.
    pub fn pop_front_n(&mut self, slab: &mut Slab, n: usize, out: &mut Vec<u32>) {
        debug_assert!(n <= self.len());
        out.reserve(n);
        let mut id = self.head;
        for _ in 0..n {
            out.push(id);
            let meta = slab.get_mut(id);
            let next = meta.next;
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
        self.len -= n as u32;
    }

    /// Unlinks block `id`, which the caller knows to be in the queue.
    pub fn remove(&mut self, slab: &mut Slab, id: u32) {
        let meta = *slab.get(id);
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
        let meta = slab.get_mut(id);
        meta.prev = NIL;
        meta.next = NIL;
        self.len -= 1;
    }

    /// The queued ids from head to tail.
    pub fn iter<'a>(&self, slab: &'a Slab) -> FreeQueueIter<'a> {
        FreeQueueIter {
            slab,
            next: self.head,
            remaining: self.len as usize,
        }
    }
}

impl Default for FreeQueue {
    fn default() -> Self {
        Self::new()
    }
}

/// Iterator over the free queue, head to tail. Stops after `len` steps even if the
/// links were corrupted into a cycle, so `check_invariants` can always finish.
pub struct FreeQueueIter<'a> {
    slab: &'a Slab,
    next: u32,
    remaining: usize,
}

impl Iterator for FreeQueueIter<'_> {
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
        let mut slab = Slab::new(n);
        let mut q = FreeQueue::new();
        let ids: Vec<u32> = (0..n).collect();
        q.push_back_n(&mut slab, &ids);
        (slab, q)
    }

    fn order(slab: &Slab, q: &FreeQueue) -> Vec<u32> {
        q.iter(slab).collect()
    }

    #[test]
    fn pop_front_takes_head_in_order() {
        let (mut slab, mut q) = queue_of(5);
        let mut out = vec![];
        q.pop_front_n(&mut slab, 2, &mut out);
        assert_eq!(out, vec![0, 1]);
        assert_eq!(order(&slab, &q), vec![2, 3, 4]);
        q.pop_front_n(&mut slab, 3, &mut out);
        assert!(q.is_empty());
        assert_eq!((q.head(), q.tail()), (NIL, NIL));
    }

    #[test]
    fn push_front_keeps_given_order() {
        let (mut slab, mut q) = queue_of(6);
        let mut out = vec![];
        q.pop_front_n(&mut slab, 3, &mut out);
        q.push_front_n(&mut slab, &[2, 0]);
        q.push_back_n(&mut slab, &[1]);
        assert_eq!(order(&slab, &q), vec![2, 0, 3, 4, 5, 1]);
        assert_eq!(q.len(), 6);
    }

    #[test]
    fn remove_from_head_middle_tail() {
        let (mut slab, mut q) = queue_of(5);
        q.remove(&mut slab, 2);
        q.remove(&mut slab, 0);
        q.remove(&mut slab, 4);
        assert_eq!(order(&slab, &q), vec![1, 3]);
        assert_eq!((q.head(), q.tail()), (1, 3));
        q.remove(&mut slab, 1);
        q.remove(&mut slab, 3);
        assert!(q.is_empty());
        q.push_front_n(&mut slab, &[4]);
        assert_eq!(order(&slab, &q), vec![4]);
    }
}
