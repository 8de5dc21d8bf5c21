//! The slot rules both managers share ([`super::KVCacheManager`], which owns its
//! requests, and [`super::BlockTables`], whose caller owns them): how many free
//! blocks giving a request more slots takes.

use super::block_pool::BlockPool;

/// Free blocks needed to give a request `required` blocks in all when it holds
/// `held` and adopts the prefix hits `hits` (vLLM's `get_num_blocks_to_allocate`
/// for a full-attention group): the missing blocks, plus every hit that is free
/// now (count 0, in the free queue), since adopting it takes it off the queue.
pub fn blocks_to_allocate(pool: &BlockPool, required: usize, held: usize, hits: &[u32]) -> usize {
    required.saturating_sub(held.saturating_add(hits.len())) + evictable(pool, hits)
}

/// How many of `hits` are free (count 0) and not the null block.
pub fn evictable(pool: &BlockPool, hits: &[u32]) -> usize {
    let null = pool.null_block();
    hits.iter()
        .filter(|&&b| Some(b) != null && pool.ref_count(b).is_ok_and(|c| c == 0))
        .count()
}

/// The tables' side of both tables' invariants: no block is named by more table
/// entries than its reference count (the null block aside). Pushes a description of
/// each block that is.
pub fn check_holders<'a>(
    pool: &BlockPool,
    entries: impl Iterator<Item = &'a u32>,
    problems: &mut Vec<String>,
) {
    let mut holders = vec![0u32; pool.num_blocks() as usize];
    for &b in entries {
        if let Some(h) = holders.get_mut(b as usize) {
            *h += 1;
        }
    }
    for (id, count) in pool.ref_counts().enumerate() {
        if Some(id as u32) != pool.null_block() && count < holders[id] {
            problems.push(format!(
                "block {id} has count {count} but {} table entries",
                holders[id]
            ));
        }
    }
}
