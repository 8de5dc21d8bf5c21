//! Prefix-cache hits across KV-cache groups: each attention kind's own search
//! (vLLM 0.33's `find_longest_cache_hit` of `FullAttentionManager`,
//! `SlidingWindowManager` and `ChunkedLocalAttentionManager`) and the
//! coordinator's fixed point that makes one hit length valid for every group
//! (`HybridKVCacheCoordinator.find_longest_cache_hit`).
//!
//! A hit is a table per group: cached blocks where the group needs them, the
//! null block where it does not (tokens out of its window). Every search only
//! reads the pool.

use super::block_pool::BlockPool;
use super::error::{PoolError, PoolResult};
use super::hash_key::HashSlice;
use super::kv_groups::{AttentionKind, GroupSpec, KvGroups, SpecGroup};

/// The per-group result of a hit search.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupHit {
    /// Per group index: the hit's blocks (the null block where a group skips them).
    pub blocks: Vec<Vec<u32>>,
    /// The hit, in tokens, valid for every group.
    pub num_tokens: usize,
    /// Tokens some group had cached beyond the combined hit: a shared prefix a
    /// sliding-window group has not cached yet (vLLM's
    /// `num_uncached_common_prefix_tokens`).
    pub num_uncached_common_prefix_tokens: usize,
}

/// A sliding-window or chunked-local search reads the hashes of every block
/// below `max_length` (vLLM's raises `IndexError` past the last one) and a
/// chunked-local one pads its hit with a null block per block before the chunk:
/// `max_length` must stay below the start of the block after the last of
/// `num_hashes` hashes of `block_size` tokens (vLLM asks for `num_tokens - 1`).
pub fn check_window_max_length(
    max_length: usize,
    num_hashes: usize,
    block_size: usize,
) -> PoolResult<()> {
    let limit = num_hashes.saturating_add(1).saturating_mul(block_size);
    if max_length >= limit {
        return Err(PoolError::InvalidArgument(format!(
            "max_length {max_length} reaches past the tokens {num_hashes} block hashes of \
             {block_size} tokens cover (at most {})",
            limit.saturating_sub(1)
        )));
    }
    Ok(())
}

/// The cached blocks of `group_ids` under hash `i`, all or nothing.
fn cached_all(
    pool: &BlockPool,
    hashes: HashSlice<'_>,
    i: usize,
    group_ids: &[u32],
    out: &mut [u32],
) -> bool {
    let hash = hashes.block_hash(i);
    for (slot, &group) in out.iter_mut().zip(group_ids) {
        match pool.cached_block(hash, group) {
            Some(b) => *slot = b,
            None => return false,
        }
    }
    true
}

/// One spec group's longest hit of at most `max_length` tokens: per member
/// group, its blocks; and the hit length in tokens.
pub fn find_spec_hit(
    pool: &BlockPool,
    hashes: HashSlice<'_>,
    max_length: usize,
    spec: &GroupSpec,
    group_ids: &[u32],
    alignment_tokens: usize,
) -> (Vec<Vec<u32>>, usize) {
    let null = pool.null_block().unwrap_or(0);
    let bs = spec.block_size;
    let n_groups = group_ids.len();
    let mut row = vec![0u32; n_groups];
    // Hashes past the request's known ones never hit.
    let max_blocks = (max_length / bs).min(hashes.len());
    let mut tables: Vec<Vec<u32>> = vec![Vec::new(); n_groups];
    match spec.kind {
        AttentionKind::Full => {
            for i in 0..max_blocks {
                if !cached_all(pool, hashes, i, group_ids, &mut row) {
                    break;
                }
                for (t, &b) in tables.iter_mut().zip(&row) {
                    t.push(b);
                }
            }
            let mut hit = tables[0].len() * bs;
            hit -= hit % alignment_tokens;
            let keep = hit.div_ceil(bs);
            for t in &mut tables {
                t.truncate(keep);
            }
            (tables, hit)
        }
        AttentionKind::SlidingWindow { .. } => {
            let need = spec.contiguous_blocks_for_hit();
            // vLLM sizes the table from max_length alone; blocks past the
            // request's hashes are never hits, so the scan starts below them, and
            // the table is cut to at most `max_blocks` whatever it finds.
            let table_len = max_blocks;
            for t in &mut tables {
                t.resize(table_len, null);
            }
            let mut run = 0usize;
            let mut found = false;
            for i in (0..max_blocks).rev() {
                if cached_all(pool, hashes, i, group_ids, &mut row) {
                    if run == 0 && bs != alignment_tokens && ((i + 1) * bs) % alignment_tokens != 0
                    {
                        continue;
                    }
                    for (t, &b) in tables.iter_mut().zip(&row) {
                        t[i] = b;
                    }
                    run += 1;
                    if run >= need {
                        for t in &mut tables {
                            t.truncate(i + run);
                        }
                        found = true;
                        break;
                    }
                } else {
                    run = 0;
                }
            }
            if !found {
                // A run from the start is a hit even if shorter than the window.
                for t in &mut tables {
                    t.truncate(run);
                }
                while bs != alignment_tokens && (tables[0].len() * bs) % alignment_tokens != 0 {
                    for t in &mut tables {
                        t.pop();
                    }
                }
            }
            let hit = tables[0].len() * bs;
            (tables, hit)
        }
        AttentionKind::ChunkedLocal { chunk } => {
            let start_token = if max_length > 0 {
                max_length / chunk * chunk
            } else {
                0
            };
            let start_block = start_token / bs;
            for t in &mut tables {
                t.resize(start_block, null);
            }
            for i in start_block..max_length / bs {
                if i >= hashes.len() || !cached_all(pool, hashes, i, group_ids, &mut row) {
                    break;
                }
                for (t, &b) in tables.iter_mut().zip(&row) {
                    t.push(b);
                }
            }
            let hit = tables[0].len() * bs;
            (tables, hit)
        }
    }
}

/// The longest prefix hit of at most `max_length` tokens valid for every group
/// of `layout` (vLLM's coordinator rules, without EAGLE): each spec group in
/// turn either accepts the candidate length or shortens it, until none does;
/// full-attention tables are then cut to the final length.
pub fn find_longest_hit(
    pool: &BlockPool,
    layout: &KvGroups,
    hashes: HashSlice<'_>,
    max_length: usize,
) -> GroupHit {
    let n = layout.len();
    let alignment = layout.scheduler_block_size();
    let spec_groups: &[SpecGroup] = layout.spec_groups();
    // Each spec group reads the hashes at its own block size (copied only for groups of
    // larger blocks: when every block is a hash block, the least common size is too).
    let uniform = layout.scheduler_block_size() == layout.hash_block_size();
    let mut bufs: Vec<Vec<u8>> = Vec::new();
    if !uniform {
        bufs.resize(spec_groups.len(), Vec::new());
    }
    let views: Vec<HashSlice<'_>> = bufs
        .iter_mut()
        .zip(spec_groups)
        .map(|(buf, g)| hashes.every(g.spec.block_size / layout.hash_block_size(), buf))
        .collect();
    let view = |i: usize| if uniform { hashes } else { views[i] };
    let mut blocks: Vec<Option<Vec<u32>>> = vec![None; n];
    let mut lengths = vec![0usize; n];
    if n == 1 {
        // vLLM's unitary coordinator: one search.
        let g = &spec_groups[0];
        let (mut tables, hit) = find_spec_hit(
            pool,
            view(0),
            max_length,
            &g.spec,
            &g.pool_group_ids,
            alignment,
        );
        return GroupHit {
            blocks: vec![tables.swap_remove(0)],
            num_tokens: hit,
            num_uncached_common_prefix_tokens: 0,
        };
    }
    let simple = spec_groups.len() == 2 && spec_groups[0].spec.is_full();
    let mut hit_length = max_length;
    let mut longest = 0usize;
    loop {
        let mut current = hit_length;
        for (i, g) in spec_groups.iter().enumerate() {
            let first = g.group_ids[0] as usize;
            if g.spec.is_full() && blocks[first].is_some() {
                // Downward-closed: found once, only cut afterwards.
                current = current.min(lengths[first]);
                continue;
            }
            let (tables, found) = find_spec_hit(
                pool,
                view(i),
                current,
                &g.spec,
                &g.pool_group_ids,
                alignment,
            );
            current = found;
            for (&gid, table) in g.group_ids.iter().zip(tables) {
                blocks[gid as usize] = Some(table);
                lengths[gid as usize] = found;
            }
            longest = longest.max(current);
        }
        if current >= hit_length {
            break;
        }
        hit_length = current;
        if simple {
            break;
        }
    }
    for g in spec_groups.iter().filter(|g| g.spec.is_full()) {
        let keep = hit_length.div_ceil(g.spec.block_size);
        for &gid in &g.group_ids {
            if let Some(table) = &mut blocks[gid as usize] {
                table.truncate(keep);
            }
        }
    }
    GroupHit {
        blocks: blocks.into_iter().map(Option::unwrap_or_default).collect(),
        num_tokens: hit_length,
        num_uncached_common_prefix_tokens: longest - hit_length,
    }
}
