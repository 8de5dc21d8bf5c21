//! `BlockPool::check_invariants`: a full walk of the structure, for tests and
//! debugging. It never changes anything and reports every broken invariant.

use super::block_pool::BlockPool;
use super::slab::NIL;

impl BlockPool {
    /// Walks the whole structure; returns a description of every broken invariant.
    pub fn check_invariants(&self) -> Result<(), Vec<String>> {
        let mut problems = Vec::new();
        let n = self.config.num_blocks;
        let mut in_queue = vec![false; n as usize];
        let mut prev = NIL;
        let mut walked = 0usize;
        for id in self.queue.iter(&self.slab) {
            walked += 1;
            if in_queue[id as usize] {
                problems.push(format!("free queue: block {id} appears twice"));
                break;
            }
            in_queue[id as usize] = true;
            let meta = self.slab.get(id);
            if meta.prev != prev {
                problems.push(format!(
                    "free queue: block {id} links back to {} not {prev}",
                    meta.prev
                ));
            }
            if self.is_null(id) {
                problems.push("free queue: holds the null block".into());
            }
            prev = id;
        }
        if walked != self.queue.len() {
            problems.push(format!(
                "free queue: walked {walked} blocks, length says {}",
                self.queue.len()
            ));
        }
        if self.queue.tail() != prev {
            problems.push(format!(
                "free queue: tail is {} but the walk ended at {prev}",
                self.queue.tail()
            ));
        }
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
        if cached != self.map.len() {
            problems.push(format!(
                "prefix map: {} entries but {cached} cached blocks",
                self.map.len()
            ));
        }
        let slab = &self.slab;
        self.map.check(
            |block| {
                (block < n)
                    .then(|| slab.get(block).key_slot)
                    .filter(|&s| s != NIL)
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
}
