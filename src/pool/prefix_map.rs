//! The prefix map: block-hash key to the blocks cached under it.
//!
//! Several blocks may hold the same key (two requests computed the same content
//! at once; block tables stay append-only), and a lookup returns the first one
//! inserted, as vLLM does. Layout:
//!
//! - an arena of entries `{key, hash, block, tokens, prev_dup, next_dup}`; a block's
//!   `key_slot` is its entry's index, so evicting a block finds its key in O(1);
//! - a `hashbrown::HashTable<u32>` holding, per distinct key, the arena slot of
//!   its first entry; entries with the same key form a doubly linked chain in
//!   insertion order, whose head's `prev_dup` points at the chain's tail, so an
//!   insert appends and a removal unlinks in O(1) however long the chain is.
//!
//! The table stores 4-byte slots hashed by a keyed [`KeyHasher`] (full avalanche,
//! per-process seeds), so the cost of an operation does not depend on what the keys
//! look like. Each entry keeps its table hash: a rehash never recomputes it, and a
//! probe compares 8 bytes before the whole key.

use hashbrown::HashTable;

use super::error::{PoolError, PoolResult};
use super::hash_key::BlockHashKey;
use super::key_hasher::KeyHasher;
use super::slab::NIL;

#[derive(Clone, Copy, Debug)]
struct Entry {
    key: BlockHashKey,
    hash: u64,
    /// The cached block, or [`NIL`] while the entry is vacant.
    block: u32,
    /// Tokens of the sequence the key covers (its end position in its chain: vLLM's
    /// `block_hash_num_tokens`), or 0 where the caller did not say. It fills the
    /// entry's padding: an entry is 64 bytes with or without it.
    tokens: u32,
    /// The previous entry under the same key; for the chain's head, its tail.
    prev_dup: u32,
    /// The next entry under the same key, or [`NIL`].
    next_dup: u32,
}

/// Most table capacity reserved up front; a larger cache grows the table as it fills.
const MAX_RESERVED_KEYS: usize = 1 << 21;

/// Table room reserved per key the map is sized for. A cache that stays full
/// removes and inserts keys all the time; at hashbrown's full load (7/8) its
/// removals leave tombstones, which use up the room left and make the table
/// grow or rehash in the middle of a step. At twice the room the table stays
/// below half full, where almost every removal frees its bucket outright. It
/// costs 5 bytes per bucket: about 1.3 MB for a 100,000-block pool.
const ROOM_PER_KEY: usize = 2;

/// Hash key to block(s), with first-inserted-wins lookup and O(1) insert and removal.
#[derive(Clone, Debug)]
pub struct PrefixMap {
    table: HashTable<u32>,
    entries: Vec<Entry>,
    vacant: Vec<u32>,
    hasher: KeyHasher,
}

impl Default for PrefixMap {
    fn default() -> Self {
        Self::new()
    }
}

impl PrefixMap {
    /// An empty map hashing with the process's [`KeyHasher`].
    pub fn new() -> Self {
        Self {
            table: HashTable::new(),
            entries: Vec::new(),
            vacant: Vec::new(),
            hasher: KeyHasher::process(),
        }
    }

    /// An empty map sized for `keys` distinct keys, with `ROOM_PER_KEY` times
    /// their room reserved (at most 2^21 keys' room up front);
    /// [`PoolError::OutOfMemory`] if that room cannot be had.
    pub fn with_hasher(hasher: KeyHasher, keys: usize) -> PoolResult<Self> {
        let room = keys.saturating_mul(ROOM_PER_KEY).min(MAX_RESERVED_KEYS);
        let mut table = HashTable::new();
        table
            .try_reserve(room, |_: &u32| 0)
            .map_err(|_| PoolError::OutOfMemory {
                what: "the prefix map",
                bytes: room.saturating_mul(std::mem::size_of::<u32>() + 1),
            })?;
        // The arena is reserved too, so that filling the cache never moves it (its
        // pages are only touched as entries arrive).
        let mut entries = Vec::new();
        let arena = keys.min(MAX_RESERVED_KEYS);
        entries
            .try_reserve_exact(arena)
            .map_err(|_| PoolError::OutOfMemory {
                what: "the prefix map's entries",
                bytes: arena.saturating_mul(std::mem::size_of::<Entry>()),
            })?;
        Ok(Self {
            table,
            entries,
            vacant: Vec::new(),
            hasher,
        })
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

    #[inline]
    fn find_head(&self, key: &BlockHashKey, hash: u64) -> Option<u32> {
        let entries = &self.entries;
        self.table
            .find(hash, |&slot| {
                let e = &entries[slot as usize];
                e.hash == hash && e.key == *key
            })
            .copied()
    }

    /// The first-inserted block still cached under `key`.
    #[inline]
    pub fn get(&self, key: &BlockHashKey) -> Option<u32> {
        self.find_head(key, self.hasher.hash(key))
            .map(|slot| self.entries[slot as usize].block)
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

    /// The tokens the key at `slot` covers, as given to [`Self::insert`] (0: not given).
    #[inline]
    pub fn tokens_at(&self, slot: u32) -> u32 {
        self.entries[slot as usize].tokens
    }

    /// Caches `block` under `key`, after any blocks already there, and returns the
    /// entry's slot (to be stored as the block's `key_slot`). `tokens` is the length
    /// of the sequence the key covers (0 where unknown), read back by
    /// [`Self::tokens_at`].
    pub fn insert(&mut self, key: BlockHashKey, block: u32, tokens: u32) -> u32 {
        let hash = self.hasher.hash(&key);
        let head = self.find_head(&key, hash);
        let entry = Entry {
            key,
            hash,
            block,
            tokens,
            prev_dup: NIL,
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
        match head {
            Some(head) => {
                // Append after the tail, which the head's prev_dup names.
                let tail = entries[head as usize].prev_dup;
                entries[tail as usize].next_dup = slot;
                entries[slot as usize].prev_dup = tail;
                entries[head as usize].prev_dup = slot;
            }
            None => {
                entries[slot as usize].prev_dup = slot;
                self.table
                    .insert_unique(hash, slot, |&s| entries[s as usize].hash);
            }
        }
        slot
    }

    /// Removes the entry at `slot` (a live slot) and returns its key. The other
    /// blocks under the same key keep their order.
    pub fn remove(&mut self, slot: u32) -> BlockHashKey {
        let removed = self.entries[slot as usize];
        let entries = &mut self.entries;
        let head_of_chain = entries[removed.prev_dup as usize].next_dup != slot;
        if head_of_chain {
            // `slot` heads its chain: promote its successor, or drop the key.
            let head = self.table.find_entry(removed.hash, |&s| s == slot);
            debug_assert!(head.is_ok(), "a chain's head is in the table");
            if let Ok(head) = head {
                if removed.next_dup == NIL {
                    head.remove();
                } else {
                    *head.into_mut() = removed.next_dup;
                    // The new head inherits the pointer to the tail.
                    entries[removed.next_dup as usize].prev_dup = removed.prev_dup;
                }
            }
        } else {
            entries[removed.prev_dup as usize].next_dup = removed.next_dup;
            if removed.next_dup == NIL {
                // `slot` was the tail: the head now points at its predecessor.
                let head = self.find_head(&removed.key, removed.hash);
                debug_assert!(head.is_some(), "a live entry's key is in the table");
                if let Some(head) = head {
                    self.entries[head as usize].prev_dup = removed.prev_dup;
                }
            } else {
                entries[removed.next_dup as usize].prev_dup = removed.prev_dup;
            }
        }
        let entry = &mut self.entries[slot as usize];
        entry.block = NIL;
        entry.prev_dup = NIL;
        entry.next_dup = NIL;
        if self.vacant.len() + 1 == self.entries.len() {
            // The map is empty: start the arena afresh (O(1) for plain data).
            self.entries.clear();
            self.vacant.clear();
        } else {
            self.vacant.push(slot);
        }
        removed.key
    }

    /// Every live entry as `(slot, block)`, in slot order: O(entries since the map was
    /// last empty), not O(blocks of the pool).
    pub fn live_entries(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.block != NIL)
            .map(|(slot, e)| (slot as u32, e.block))
    }

    /// Calls `f` with every cached block, then drops every entry. Costs O(entries
    /// since the map was last empty), not O(blocks of the pool).
    pub fn drain_blocks(&mut self, mut f: impl FnMut(u32)) {
        for e in &self.entries {
            if e.block != NIL {
                f(e.block);
            }
        }
        self.clear();
    }

    /// Drops every entry.
    pub fn clear(&mut self) {
        self.table.clear();
        self.entries.clear();
        self.vacant.clear();
    }

    /// Checks the map's own structure against `owns(block, slot)` (whether `block`
    /// holds the entry at `slot`); pushes a description of every broken invariant.
    pub fn check(&self, owns: impl Fn(u32, u32) -> bool, problems: &mut Vec<String>) {
        let mut seen = vec![false; self.entries.len()];
        for &slot in &self.vacant {
            if let Some(flag) = seen.get_mut(slot as usize) {
                *flag = true;
            }
            if self
                .entries
                .get(slot as usize)
                .is_some_and(|e| e.block != NIL)
            {
                problems.push(format!("prefix map: vacant slot {slot} names a block"));
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
            let mut prev = NIL;
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
                if entry.key != key || entry.hash != self.hasher.hash(&key) {
                    problems.push(format!(
                        "prefix map: slot {slot} is chained under another key or hash"
                    ));
                }
                if slot != head && entry.prev_dup != prev {
                    problems.push(format!(
                        "prefix map: slot {slot} links back to {} not {prev}",
                        entry.prev_dup
                    ));
                }
                if !owns(entry.block, slot) {
                    problems.push(format!(
                        "prefix map: slot {slot} names block {} which does not point back to it",
                        entry.block
                    ));
                }
                prev = slot;
                slot = entry.next_dup;
                steps += 1;
            }
            if self.entries[head as usize].prev_dup != prev {
                problems.push(format!(
                    "prefix map: the chain at slot {head} does not point at its tail {prev}"
                ));
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
    use crate::pool::key_hasher::KeyHasher;

    fn key(b: u8, group: u32) -> BlockHashKey {
        BlockHashKey::new(BlockHash::new(&[b; 32]).unwrap(), group)
    }

    #[test]
    fn an_entry_fills_one_cache_line_with_its_token_count() {
        assert_eq!(std::mem::size_of::<Entry>(), 64);
        let mut m = PrefixMap::new();
        let s = m.insert(key(1, 0), 3, 48);
        let t = m.insert(key(1, 0), 4, 0);
        assert_eq!((m.tokens_at(s), m.tokens_at(t)), (48, 0));
        m.remove(s);
        assert_eq!(m.tokens_at(t), 0);
    }

    #[test]
    fn first_inserted_wins_and_successor_is_promoted() {
        let mut m = PrefixMap::new();
        let s1 = m.insert(key(1, 0), 10, 0);
        let s2 = m.insert(key(1, 0), 11, 0);
        let s3 = m.insert(key(1, 0), 12, 0);
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
    fn long_chains_keep_insertion_order_under_any_removal_order() {
        // One key under 2,000 blocks and a second key under 500, removed in a
        // scrambled order; after each removal the lookup names the oldest survivor
        // and the structure checks out.
        let mut m = PrefixMap::with_hasher(KeyHasher::with_seed(9), 16).unwrap();
        let mut live: Vec<(u32, u32, u8)> = Vec::new(); // (slot, block, key byte)
        for block in 0..2_500u32 {
            let b = if block % 5 == 4 { 2 } else { 1 };
            live.push((m.insert(key(b, 0), block, 0), block, b));
        }
        let mut order: Vec<usize> = (0..live.len()).collect();
        let mut x = 12345u64;
        for i in (1..order.len()).rev() {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            order.swap(i, (x >> 33) as usize % (i + 1));
        }
        let mut removed = vec![false; live.len()];
        for (n, &i) in order.iter().enumerate() {
            let (slot, _, b) = live[i];
            assert_eq!(m.remove(slot), key(b, 0));
            removed[i] = true;
            for kb in [1u8, 2] {
                let oldest = live
                    .iter()
                    .zip(&removed)
                    .find(|((_, _, k), &r)| *k == kb && !r)
                    .map(|((_, block, _), _)| *block);
                assert_eq!(m.get(&key(kb, 0)), oldest);
            }
            if n % 97 == 0 {
                let mut problems = Vec::new();
                let slots: Vec<Option<u32>> = (0..live.len())
                    .map(|j| (!removed[j]).then_some(live[j].0))
                    .collect();
                m.check(
                    |block, slot| slots[block as usize] == Some(slot),
                    &mut problems,
                );
                assert!(problems.is_empty(), "{problems:?}");
            }
        }
        assert!(m.is_empty());
    }

    #[test]
    fn drain_visits_every_cached_block_once() {
        let mut m = PrefixMap::new();
        let s = m.insert(key(1, 0), 5, 0);
        m.insert(key(1, 0), 6, 0);
        m.insert(key(2, 0), 7, 0);
        m.remove(s);
        let mut seen = Vec::new();
        m.drain_blocks(|b| seen.push(b));
        seen.sort_unstable();
        assert_eq!(seen, vec![6, 7]);
        assert!(m.is_empty() && m.num_keys() == 0);
    }

    #[test]
    fn groups_are_separate_keys() {
        let mut m = PrefixMap::new();
        m.insert(key(1, 0), 1, 0);
        m.insert(key(1, 1), 2, 0);
        assert_eq!(m.get(&key(1, 0)), Some(1));
        assert_eq!(m.get(&key(1, 1)), Some(2));
        assert_eq!(m.get(&key(2, 0)), None);
    }

    #[test]
    fn slots_are_reused() {
        let mut m = PrefixMap::new();
        let s = m.insert(key(1, 0), 1, 0);
        m.remove(s);
        assert_eq!(m.insert(key(2, 0), 2, 0), s);
        assert_eq!(*m.key_at(s), key(2, 0));
        assert_eq!(m.block_at(s), 2);
    }
}
