//! Model test: random operation sequences run against `BlockPool` and a plain,
//! obviously-correct model (vectors and a linear-scan map); every observable is
//! compared after every step: ids handed out, errors, free-queue order, counts,
//! hashes, hits and events. In the manner of slotmap's `slotmap_equiv_hashmap`.

use kvpool::pool::{
    BlockHash, BlockPool, CacheBlocks, HashSlice, PoolConfig, PoolError, PoolEvent, StoredBlocks,
};
use proptest::prelude::*;

const WIDTH: usize = 4;

/// A prefix-map key in the model: (hash bytes, group).
type Key = (Vec<u8>, u32);

/// The model: everything in plain vectors.
struct Model {
    null: bool,
    caching: bool,
    counts: Vec<u32>,
    hashes: Vec<Option<(Vec<u8>, u32)>>,
    queue: Vec<u32>,
    /// (key, blocks in insertion order)
    map: Vec<(Key, Vec<u32>)>,
    events: Vec<PoolEvent>,
}

impl Model {
    fn new(n: u32, caching: bool, null: bool) -> Self {
        Self {
            null,
            caching,
            counts: vec![0; n as usize],
            hashes: vec![None; n as usize],
            queue: (u32::from(null)..n).collect(),
            map: Vec::new(),
            events: Vec::new(),
        }
    }

    fn is_null(&self, id: u32) -> bool {
        self.null && id == 0
    }

    fn drop_hash(&mut self, id: u32) {
        if let Some(key) = self.hashes[id as usize].take() {
            let pos = self.map.iter().position(|(k, _)| *k == key).unwrap();
            self.map[pos].1.retain(|&b| b != id);
            if self.map[pos].1.is_empty() {
                self.map.remove(pos);
            }
            self.events.push(PoolEvent::BlockRemoved {
                block_hash: BlockHash::new(&key.0).unwrap(),
                group_idx: key.1,
            });
        }
    }

    fn alloc(&mut self, n: usize) -> Result<Vec<u32>, ()> {
        if n > self.queue.len() {
            return Err(());
        }
        let ids: Vec<u32> = self.queue.drain(..n).collect();
        for &id in &ids {
            self.drop_hash(id);
            self.counts[id as usize] = 1;
        }
        Ok(ids)
    }

    fn free(&mut self, ids: &[u32]) -> Result<(), ()> {
        let mut counts = self.counts.clone();
        let (mut head, mut tail) = (vec![], vec![]);
        for &id in ids {
            if self.is_null(id) {
                continue;
            }
            if counts[id as usize] == 0 {
                return Err(());
            }
            counts[id as usize] -= 1;
            if counts[id as usize] == 0 {
                if self.caching && self.hashes[id as usize].is_some() {
                    tail.push(id);
                } else {
                    head.push(id);
                }
            }
        }
        self.counts = counts;
        head.append(&mut self.queue);
        self.queue = head;
        self.queue.extend(tail);
        Ok(())
    }

    fn touch(&mut self, ids: &[u32]) {
        for &id in ids {
            if self.is_null(id) {
                continue;
            }
            if self.counts[id as usize] == 0 {
                self.queue.retain(|&b| b != id);
            }
            self.counts[id as usize] += 1;
        }
    }

    fn cache(&mut self, ids: &[u32], hashes: &[Vec<u8>], from: usize, to: usize) -> Result<(), ()> {
        if from == to {
            return Ok(());
        }
        let new = &ids[from..to];
        for (i, &id) in new.iter().enumerate() {
            if self.is_null(id) {
                continue;
            }
            if self.counts[id as usize] == 0
                || self.hashes[id as usize].is_some()
                || new[..i].contains(&id)
            {
                return Err(());
            }
        }
        let mut stored = vec![];
        for (i, &id) in new.iter().enumerate() {
            if self.is_null(id) {
                continue;
            }
            let key = (hashes[from + i].clone(), 0);
            self.hashes[id as usize] = Some(key.clone());
            match self.map.iter_mut().find(|(k, _)| *k == key) {
                Some((_, blocks)) => blocks.push(id),
                None => self.map.push((key, vec![id])),
            }
            stored.push(BlockHash::new(&hashes[from + i]).unwrap());
        }
        self.events
            .push(PoolEvent::BlockStored(Box::new(StoredBlocks {
                block_hashes: stored,
                parent_block_hash: from
                    .checked_sub(1)
                    .map(|i| BlockHash::new(&hashes[i]).unwrap()),
                token_ids: vec![],
                block_size: 16,
                lora_id: None,
                lora_name: None,
                group_idx: 0,
                extra_keys: None,
            })));
        Ok(())
    }

    fn lookup(&self, hash: &[u8]) -> Option<u32> {
        self.map
            .iter()
            .find(|(k, _)| k.0 == hash && k.1 == 0)
            .map(|(_, b)| b[0])
    }

    fn reset(&mut self) -> bool {
        let free = self.queue.len() + usize::from(self.null);
        if free != self.counts.len() {
            return false;
        }
        self.hashes.iter_mut().for_each(|h| *h = None);
        self.map.clear();
        self.events.push(PoolEvent::AllBlocksCleared);
        true
    }
}

#[derive(Debug, Clone)]
enum Op {
    Alloc(usize),
    AllocMany(Vec<usize>),
    /// Free request `i` (mod the number held), reversed or not.
    Free(usize, bool),
    FreeMany(bool),
    FreeBad(u32),
    /// Cache request `i`'s blocks `[a, b)` under hashes drawn from a small alphabet.
    Cache(usize, usize, usize, Vec<u8>),
    /// Look up a chain of hashes; touch the hits as a new request.
    HitAndTouch(Vec<u8>),
    Evict(Vec<u32>),
    /// Touch any blocks, free or not, cached or not (uncached free ones leave the
    /// free queue's stack or fresh range from the middle), held as a new request.
    Touch(Vec<u32>),
    Reset,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..8).prop_map(Op::Alloc),
        1 => prop::collection::vec(0usize..5, 0..4).prop_map(Op::AllocMany),
        4 => (any::<usize>(), any::<bool>()).prop_map(|(i, r)| Op::Free(i, r)),
        1 => any::<bool>().prop_map(Op::FreeMany),
        1 => (0u32..24).prop_map(Op::FreeBad),
        4 => (any::<usize>(), 0usize..8, 0usize..8, prop::collection::vec(0u8..6, 8)).prop_map(|(i, a, b, h)| Op::Cache(i, a.min(b), a.max(b), h)),
        3 => prop::collection::vec(0u8..6, 0..6).prop_map(Op::HitAndTouch),
        1 => prop::collection::vec(0u32..20, 0..4).prop_map(Op::Evict),
        2 => prop::collection::vec(0u32..20, 0..4).prop_map(Op::Touch),
        1 => Just(Op::Reset),
    ]
}

fn hash_of(symbol: u8, position: usize) -> Vec<u8> {
    vec![symbol, position as u8, 0xAB, 0xCD]
}

fn compare(pool: &mut BlockPool, model: &mut Model) {
    pool.check_invariants().unwrap();
    assert_eq!(
        pool.free_block_ids().collect::<Vec<_>>(),
        model.queue,
        "free queue"
    );
    assert_eq!(
        pool.last_free_block_id(),
        model.queue.last().copied(),
        "last free block"
    );
    assert_eq!(
        pool.ref_counts().collect::<Vec<_>>(),
        model.counts,
        "counts"
    );
    for id in 0..model.counts.len() as u32 {
        let got = pool
            .block_hash(id)
            .unwrap()
            .map(|k| (k.hash.as_bytes().to_vec(), k.group));
        assert_eq!(got, model.hashes[id as usize], "hash of block {id}");
    }
    let cached: Vec<u32> = (0..model.hashes.len() as u32)
        .filter(|&id| model.hashes[id as usize].is_some())
        .collect();
    assert_eq!(pool.cached_block_ids(), cached, "cached blocks");
    assert_eq!(
        pool.num_cached_blocks(),
        model.map.iter().map(|(_, b)| b.len()).sum::<usize>()
    );
    assert_eq!(
        pool.take_events(),
        std::mem::take(&mut model.events),
        "events"
    );
}

fn run(num_blocks: u32, caching: bool, null: bool, ops: Vec<Op>) {
    let mut config = PoolConfig::new(num_blocks);
    config.enable_caching = caching;
    config.null_block = null;
    config.enable_events = true;
    let mut pool = BlockPool::new(config).unwrap();
    let mut model = Model::new(num_blocks, caching, null);
    let mut held: Vec<Vec<u32>> = Vec::new();
    for op in ops {
        match op {
            Op::Alloc(n) => {
                let mut out = vec![];
                let got = pool.get_new_blocks(n, &mut out).map(|_| out.clone());
                let want = model.alloc(n);
                assert_eq!(got.is_ok(), want.is_ok());
                if let (Ok(got), Ok(want)) = (got, want) {
                    assert_eq!(got, want, "allocated ids");
                    held.push(got);
                }
            }
            Op::AllocMany(counts) => {
                let (mut out, mut offsets) = (vec![], vec![]);
                let got = pool.get_new_blocks_many(&counts, &mut out, &mut offsets);
                let total: usize = counts.iter().sum();
                let want = model.alloc(total);
                assert_eq!(got.is_ok(), want.is_ok());
                if let Ok(want) = want {
                    assert_eq!(out, want);
                    for w in offsets.windows(2) {
                        held.push(out[w[0]..w[1]].to_vec());
                    }
                }
            }
            Op::Free(i, reverse) if !held.is_empty() => {
                let mut blocks = held.remove(i % held.len());
                if reverse {
                    blocks.reverse();
                }
                assert_eq!(
                    pool.free_blocks(&blocks).is_ok(),
                    model.free(&blocks).is_ok()
                );
            }
            Op::Free(..) => {}
            Op::FreeMany(reverse) => {
                let mut flat = vec![];
                let mut offsets = vec![0];
                let mut segments = vec![];
                for mut blocks in held.drain(..) {
                    flat.extend(&blocks);
                    offsets.push(flat.len());
                    if reverse {
                        blocks.reverse();
                    }
                    segments.push(blocks);
                }
                let got = pool.free_blocks_many(&flat, &offsets, reverse);
                // The model frees segment by segment, all or nothing.
                let saved = (model.counts.clone(), model.queue.clone());
                let want = segments.iter().try_for_each(|s| model.free(s));
                if want.is_err() {
                    (model.counts, model.queue) = saved;
                }
                assert_eq!(got.is_ok(), want.is_ok());
            }
            Op::FreeBad(id) => {
                let ids = [id];
                let got = pool.free_blocks(&ids);
                if id >= num_blocks {
                    assert!(matches!(got, Err(PoolError::InvalidBlockId { .. })));
                } else {
                    assert_eq!(got.is_ok(), model.free(&ids).is_ok());
                    if got.is_ok() {
                        // A legitimate free of a block some request held: forget one holder.
                        if let Some(pos) = held.iter().position(|b| b.contains(&id)) {
                            let b = &mut held[pos];
                            let at = b.iter().position(|&x| x == id).unwrap();
                            b.remove(at);
                        }
                    }
                }
            }
            Op::Cache(i, from, to, symbols) if !held.is_empty() => {
                let blocks = &held[i % held.len()];
                let to = to.min(blocks.len());
                let from = from.min(to);
                let hashes: Vec<Vec<u8>> = (0..blocks.len())
                    .map(|p| hash_of(symbols[p % 8], p))
                    .collect();
                let flat: Vec<u8> = hashes.concat();
                let slice = HashSlice::new(&flat, WIDTH).unwrap_or(HashSlice::empty());
                let got = pool.cache_full_blocks(CacheBlocks::new(blocks, slice, from, to));
                if !caching {
                    assert_eq!(got, Err(PoolError::CachingDisabled));
                } else {
                    assert_eq!(
                        got.is_ok(),
                        model.cache(blocks, &hashes, from, to).is_ok(),
                        "{got:?}"
                    );
                }
            }
            Op::Cache(..) => {}
            Op::HitAndTouch(symbols) => {
                let hashes: Vec<Vec<u8>> = symbols
                    .iter()
                    .enumerate()
                    .map(|(p, &s)| hash_of(s, p))
                    .collect();
                let flat = hashes.concat();
                let mut hits = vec![];
                if !flat.is_empty() {
                    pool.find_longest_cache_hit(
                        HashSlice::new(&flat, WIDTH).unwrap(),
                        0,
                        None,
                        &mut hits,
                    )
                    .unwrap();
                }
                let mut want = vec![];
                for h in &hashes {
                    match model.lookup(h) {
                        Some(b) => want.push(b),
                        None => break,
                    }
                }
                assert_eq!(hits, want, "longest hit");
                if let Some(h) = hashes.first() {
                    assert_eq!(pool.get_cached_block(h, 0).unwrap(), model.lookup(h));
                }
                pool.touch(&hits).unwrap();
                model.touch(&hits);
                held.push(hits);
            }
            Op::Evict(ids) => {
                let got = pool.evict_blocks(&ids);
                if ids.iter().any(|&id| id >= num_blocks) {
                    assert!(got.is_err());
                } else {
                    got.unwrap();
                    for id in ids {
                        model.drop_hash(id);
                    }
                }
            }
            Op::Touch(ids) => {
                let got = pool.touch(&ids);
                if ids.iter().any(|&id| id >= num_blocks) {
                    assert!(got.is_err());
                } else {
                    got.unwrap();
                    model.touch(&ids);
                    held.push(ids);
                }
            }
            Op::Reset => assert_eq!(pool.reset_prefix_cache(), model.reset()),
        }
        compare(&mut pool, &mut model);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn pool_matches_model(
        num_blocks in 1u32..20,
        caching in any::<bool>(),
        null in any::<bool>(),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        run(num_blocks, caching, null, ops);
    }
}
