//! `BlockPool::check_invariants`: a full walk of the structure, for tests and
//! debugging. It never changes anything and reports every broken invariant.

use super::block_pool::BlockPool;
use super::free_queue::{Place, QueueParts, FRESH, STACKED};
use super::slab::NIL;

impl BlockPool {
    /// Walks the whole structure; returns a description of every broken invariant.
    pub fn check_invariants(&self) -> Result<(), Vec<String>> {
        let mut problems = Vec::new();
        let n = self.config.num_blocks;
        let mut in_queue = vec![false; n as usize];
        let mut walked = 0usize;
        for id in self.queue.iter(&self.slab) {
            walked += 1;
            if in_queue[id as usize] {
                problems.push(format!("free queue: block {id} appears twice"));
                break;
            }
            in_queue[id as usize] = true;
            if self.is_null(id) {
                problems.push("free queue: holds the null block".into());
            }
        }
        if walked != self.queue.len() {
            problems.push(format!(
                "free queue: walked {walked} blocks, length says {}",
                self.queue.len()
            ));
        }
        self.check_queue_parts(&mut problems);
        for (id, meta) in self.slab.iter().enumerate() {
            let id = id as u32;
            if self.is_null(id) {
                if meta.ref_cnt != 0 || meta.is_cached() {
                    problems.push("null block: has a count or a hash".into());
                }
                continue;
            }
            if (meta.ref_cnt == 0) != in_queue[id as usize] {
                problems.push(format!(
                    "block {id}: count {} but {} the free queue",
                    meta.ref_cnt,
                    if in_queue[id as usize] {
                        "in"
                    } else {
                        "not in"
                    }
                ));
            }
            if meta.is_cached() && self.map.block_at(meta.key_slot) != id {
                problems.push(format!("block {id}: its key slot belongs to another block"));
            }
            if meta.is_cached() && !self.config.enable_caching {
                problems.push(format!("block {id}: cached although caching is off"));
            }
        }
        let cached = self.slab.iter().filter(|m| m.is_cached()).count();
        let extra = self.partial.num_extra_keys();
        if cached + extra != self.map.len() {
            problems.push(format!(
                "prefix map: {} entries but {cached} cached blocks and {extra} extra keys",
                self.map.len()
            ));
        }
        let keyed = self
            .partial
            .extra_slots
            .keys()
            .chain(self.partial.primary_tokens.keys());
        for &id in keyed {
            if id >= n || !self.slab.get(id).is_cached() {
                problems.push(format!(
                    "block {id}: a partial or extra key without a primary key"
                ));
            }
        }
        let slab = &self.slab;
        let partial = &self.partial;
        self.map.check(
            |block, slot| {
                block < n
                    && (slab.get(block).key_slot == slot
                        || partial
                            .extra_slots
                            .get(&block)
                            .is_some_and(|slots| slots.contains(&slot)))
            },
            &mut problems,
        );
        if let Some(w) = self.hash_width {
            if (0..n).any(|id| {
                let m = slab.get(id);
                m.is_cached() && self.map.key_at(m.key_slot).hash.width() != w
            }) {
                problems.push("prefix map: a cached hash has another width than the pool's".into());
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }

    /// The free queue's three parts: stack entries know their index and hold no
    /// hash, the fresh range's count is right, the list links back and ends at its
    /// tail.
    fn check_queue_parts(&self, problems: &mut Vec<String>) {
        let QueueParts {
            stack_live,
            fresh_span,
            fresh_live,
            list_len,
        } = self.queue.parts();
        let mut live = 0;
        for (index, &id) in self.queue.stack_entries().iter().enumerate() {
            if id == NIL {
                continue;
            }
            live += 1;
            let meta = self.slab.get(id);
            if Place::of(meta) != Place::Stack(index as u32) {
                problems.push(format!(
                    "free queue: stacked block {id} does not know its index {index}"
                ));
            }
            if meta.is_cached() {
                problems.push(format!("free queue: stacked block {id} holds a hash"));
            }
        }
        if live != stack_live {
            problems.push(format!(
                "free queue: {live} stacked blocks, the count says {stack_live}"
            ));
        }
        let mut fresh = 0;
        for (id, meta) in self.slab.iter().enumerate() {
            let id = id as u32;
            match meta.next {
                FRESH if fresh_span.contains(&id) => fresh += 1,
                FRESH => problems.push(format!(
                    "free queue: block {id} is fresh outside the fresh range"
                )),
                STACKED if self.queue.stack_entries().get(meta.prev as usize) != Some(&id) => {
                    problems.push(format!(
                        "free queue: block {id} is marked stacked but is not on the stack"
                    ))
                }
                _ => {}
            }
            if meta.next == FRESH && meta.is_cached() {
                problems.push(format!("free queue: fresh block {id} holds a hash"));
            }
        }
        if fresh != fresh_live {
            problems.push(format!(
                "free queue: {fresh} fresh blocks, the count says {fresh_live}"
            ));
        }
        let lists = self.queue.lists();
        let mut total = 0;
        for class in 0..lists.num_classes() {
            let ends = lists.ends(class);
            let mut prev = NIL;
            let mut id = ends.head;
            let mut walked = 0;
            while id != NIL && id < self.config.num_blocks && walked <= ends.len {
                let meta = self.slab.get(id);
                if meta.prev != prev {
                    problems.push(format!(
                        "free queue: block {id} links back to {} not {prev}",
                        meta.prev
                    ));
                }
                if self.queue.class_of(id) != class {
                    problems.push(format!(
                        "free queue: block {id} is in list {class} but records list {}",
                        self.queue.class_of(id)
                    ));
                }
                prev = id;
                id = meta.next;
                walked += 1;
            }
            if walked != ends.len || ends.tail != prev {
                problems.push(format!(
                    "free queue: list {class}'s walk ended at {prev} after {walked} blocks; tail {} and length {}",
                    ends.tail, ends.len
                ));
            }
            if (ends.len > 0) != lists.nonempty_classes().any(|c| c == class) {
                problems.push(format!("free queue: list {class}'s non-empty bit is wrong"));
            }
            total += walked as usize;
        }
        if total != list_len {
            problems.push(format!(
                "free queue: the lists hold {total} blocks, the count says {list_len}"
            ));
        }
        self.check_policy(problems);
    }

    /// The eviction policy's state: adaptive credits never decrease along a list
    /// (so each head is its list's minimum); pins
    /// hold a reference each and never the null block.
    fn check_policy(&self, problems: &mut Vec<String>) {
        let lists = self.queue.lists();
        let eviction = self.queue.eviction();
        if eviction.policy() == super::eviction::EvictionPolicy::Adaptive {
            if lists.num_classes() != eviction.num_classes() {
                problems.push(format!(
                    "adaptive policy: {} lists, not {}",
                    lists.num_classes(),
                    eviction.num_classes()
                ));
            }
            // Credits order the lists only when the policy ranks by use (with a
            // horizon of 0 it keeps one list in LRU's order and no credits).
            let ranked = if eviction.ranks_by_use() {
                lists.num_classes()
            } else {
                0
            };
            for class in 0..ranked {
                let mut last = 0;
                for id in lists.iter_class(&self.slab, class) {
                    let credit = eviction.credit(id);
                    if credit < last {
                        problems.push(format!(
                            "adaptive policy: block {id}'s credit {credit} is below its predecessor's {last}"
                        ));
                    }
                    last = credit;
                }
            }
            // The fingerprint kept for each cached block is its key's (an eviction
            // records the block under it).
            if eviction.ranks_by_use() {
                for (id, meta) in self.slab.iter().enumerate() {
                    let id = id as u32;
                    if meta.is_cached() {
                        let key = self.map.key_at(meta.key_slot);
                        if eviction.cached_fingerprint(id)
                            != super::eviction::ghost_fingerprint(key)
                        {
                            problems.push(format!(
                                "adaptive policy: block {id}'s kept fingerprint is not its key's"
                            ));
                        }
                    }
                }
            }
            let capacity =
                super::eviction::ghost_table_ways(self.config.num_blocks, self.config.horizon());
            if eviction.ghosts().capacity() != capacity {
                problems.push(format!(
                    "adaptive policy: {} ghost slots, not {capacity}",
                    eviction.ghosts().capacity()
                ));
            }
            let mismatches = eviction.ghosts().directory_mismatches();
            if mismatches > 0 {
                problems.push(format!(
                    "adaptive policy: {mismatches} ghost directory bytes disagree with their ways"
                ));
            }
        }
        if self.pins.len() > self.config.max_pinned_blocks as usize {
            problems.push(format!(
                "pins: {} pinned blocks, over the budget of {}",
                self.pins.len(),
                self.config.max_pinned_blocks
            ));
        }
        for &id in &self.pins {
            if id >= self.config.num_blocks || self.is_null(id) || self.slab.get(id).ref_cnt == 0 {
                problems.push(format!("pins: block {id} is pinned but holds no reference"));
            }
        }
    }
}
