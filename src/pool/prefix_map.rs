//! The prefix map: block-hash key to the blocks cached under it.
//!
//! Several blocks may hold the same key (two requests computed the same content
//! at once; block tables stay append-only), and a lookup returns the first one
//! inserted, as vLLM does. Layout:
//!
//! - an arena of entries `{key, block, next_dup}`; a block's `key_slot` is its
//!   entry's index, so evicting a block finds its key in O(1);
//! - a `hashbrown::HashTable<u32>` holding, per distinct key, the arena slot of
//!   its first entry; entries with the same key are chained through `next_dup`
//!   in insertion order.
//!
//! The table stores 4-byte slots and hashes them with [`BlockHashKey::table_hash`]
//! (a cheap fold: the keys are already digests), never SipHash.

use hashbrown::HashTable;

use super::hash_key::BlockHashKey;
use super::slab::NIL;

#[derive(Clone, Copy, Debug)]
struct Entry {
    key: BlockHashKey,
    block: u32,
    next_dup: u32,
}

/// Hash key to block(s), with first-inserted-wins lookup and O(1) removal by slot.
#[derive(Clone, Debug, Default)]
pub struct PrefixMap {
    table: HashTable<u32>,
    entries: Vec<Entry>,
    vacant: Vec<u32>,
}

impl PrefixMap {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of cached blocks (entries), counting every block under a shared key.
    pub fn len(&self) -> usize {
        self.entries.len() - self.vacant.len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of distinct keys.
    pub fn num_keys(&self) -> usize {
        self.table.len()
    }

    /// The first-inserted block still cached under `key`.
    #[inline]
    pub fn get(&self, key: &BlockHashKey) -> Option<u32> {
        let entries = &self.entries;
        self.table
            .find(key.table_hash(), |&slot| entries[slot as usize].key == *key)
            .map(|&slot| entries[slot as usize].block)
    }

    /// The key held at `slot`.
    #[inline]
    pub fn key_at(&self, slot: u32) -> &BlockHashKey {
        &self.entries[slot as usize].key
    }

    /// The block held at `slot`.
    pub fn block_at(&self, slot: u32) -> u32 {
        self.entries[slot as usize].block
    }

    /// Caches `block` under `key`, after any blocks already there, and returns the
    /// entry's slot (to be stored as the block's `key_slot`).
    pub fn insert(&mut self, key: BlockHashKey, block: u32) -> u32 {
        let entry = Entry {
            key,
            block,
            next_dup: NIL,
        };
        let slot = match self.vacant.pop() {
            Some(slot) => {
                self.entries[slot as usize] = entry;
                slot
            }
            None => {
                self.entries.push(entry);
                (self.entries.len() - 1) as u32
            }
        };
        let entries = &mut self.entries;
        let hash = key.table_hash();
        match self.table.find(hash, |&s| entries[s as usize].key == key) {
            Some(&head) => {
                let mut last = head;
                while entries[last as usize].next_dup != NIL {
                    last = entries[last as usize].next_dup;
                }
                entries[last as usize].next_dup = slot;
            }
            None => {
                self.table
                    .insert_unique(hash, slot, |&s| entries[s as usize].key.table_hash());
            }
        }
        slot
    }

    /// Removes the entry at `slot` (a live slot) and returns its key. The other
    /// blocks under the same key keep their order.
    pub fn remove(&mut self, slot: u32) -> BlockHashKey {
        let removed = self.entries[slot as usize];
        let entries = &mut self.entries;
        let hash = removed.key.table_hash();
        if let Ok(head) = self.table.find_entry(hash, |&s| s == slot) {
            // `slot` heads its chain: promote its successor, or drop the key.
            if removed.next_dup == NIL {
                head.remove();
            } else {
                *head.into_mut() = removed.next_dup;
            }
        } else {
            // Not a head: unlink it from its key's chain (chains are short).
            let head = self
                .table
                .find(hash, |&s| entries[s as usize].key == removed.key);
            debug_assert!(head.is_some(), "a live entry's key is in the table");
            if let Some(&head) = head {
                let mut prev = head;
                while prev != NIL && entries[prev as usize].next_dup != slot {
                    prev = entries[prev as usize].next_dup;
                }
                if prev != NIL {
                    entries[prev as usize].next_dup = removed.next_dup;
                }
            }
        }
        self.entries[slot as usize].next_dup = NIL;
        self.vacant.push(slot);
        removed.key
    }

    /// Drops every entry.
    pub fn clear(&mut self) {
        self.table.clear();
        self.entries.clear();
        self.vacant.clear();
    }

    /// Checks the map's own structure against `block_key_slot` (each block's slot,
    /// [`NIL`] when uncached); pushes a description of every broken invariant.
    pub fn check(&self, block_key_slot: impl Fn(u32) -> Option<u32>, problems: &mut Vec<String>) {
        let mut seen = vec![false; self.entries.len()];
        for &slot in &self.vacant {
            if let Some(flag) = seen.get_mut(slot as usize) {
                *flag = true;
            }
        }
        for &head in self.table.iter() {
            let key = self.entries[head as usize].key;
            if self.get(&key) != Some(self.entries[head as usize].block) {
                problems.push(format!(
                    "prefix map: key at slot {head} is not found by lookup"
                ));
            }
            let mut slot = head;
            let mut steps = 0;
            while slot != NIL && steps <= self.entries.len() {
                let entry = &self.entries[slot as usize];
                if seen[slot as usize] {
                    problems.push(format!(
                        "prefix map: slot {slot} is reachable twice or vacant"
                    ));
                    break;
                }
                seen[slot as usize] = true;
                if entry.key != key {
                    problems.push(format!(
                        "prefix map: slot {slot} is chained under another key"
                    ));
                }
                if block_key_slot(entry.block) != Some(slot) {
                    problems.push(format!(
                        "prefix map: slot {slot} names block {} which does not point back to it",
                        entry.block
                    ));
                }
                slot = entry.next_dup;
                steps += 1;
            }
        }
        if let Some(lost) = seen.iter().position(|&s| !s) {
            problems.push(format!(
                "prefix map: slot {lost} is neither live nor vacant"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::hash_key::BlockHash;

    fn key(b: u8, group: u32) -> BlockHashKey {
        BlockHashKey::new(BlockHash::new(&[b; 32]).unwrap(), group)
    }

    #[test]
    fn first_inserted_wins_and_successor_is_promoted() {
        let mut m = PrefixMap::new();
        let s1 = m.insert(key(1, 0), 10);
        let s2 = m.insert(key(1, 0), 11);
        let s3 = m.insert(key(1, 0), 12);
        assert_eq!(m.get(&key(1, 0)), Some(10));
        assert_eq!(m.num_keys(), 1);
        assert_eq!(m.len(), 3);
        m.remove(s2);
        assert_eq!(m.get(&key(1, 0)), Some(10));
        m.remove(s1);
        assert_eq!(m.get(&key(1, 0)), Some(12));
        m.remove(s3);
        assert_eq!(m.get(&key(1, 0)), None);
        assert!(m.is_empty());
        assert_eq!(m.num_keys(), 0);
    }

    #[test]
    fn groups_are_separate_keys() {
        let mut m = PrefixMap::new();
        m.insert(key(1, 0), 1);
        m.insert(key(1, 1), 2);
        assert_eq!(m.get(&key(1, 0)), Some(1));
        assert_eq!(m.get(&key(1, 1)), Some(2));
        assert_eq!(m.get(&key(2, 0)), None);
    }

    #[test]
    fn slots_are_reused() {
        let mut m = PrefixMap::new();
        let s = m.insert(key(1, 0), 1);
        m.remove(s);
        assert_eq!(m.insert(key(2, 0), 2), s);
        assert_eq!(*m.key_at(s), key(2, 0));
        assert_eq!(m.block_at(s), 2);
    }
}
