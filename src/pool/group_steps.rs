//! One group's steps of an allocation, as vLLM 0.33's per-type managers
//! (`SingleTypeKVCacheManager` and its full-attention, sliding-window and
//! chunked-local subclasses) expose them: count the blocks a step needs, add a
//! prefix hit, allocate for connector-computed tokens, allocate new blocks, hand
//! a table over and take it back.
//!
//! [`GroupTables::allocate_slots`] runs the same steps for every group in one
//! call and shares the rules below with them; these methods are for callers that
//! drive one group at a time (kvpool.vllm's stand-ins for vLLM's per-type
//! managers). Each checks its inputs before it changes anything.

use hashbrown::HashMap;

use super::block_pool::BlockPool;
use super::error::{PoolError, PoolResult};
use super::eviction::BlockPriority;
use super::group_tables::{GroupBlocks, GroupTables, Table};
use super::kv_groups::GroupSpec;
use super::request_id::RequestKey;

impl Table {
    /// vLLM's `add_local_computed_blocks` on group `g`, whose table is empty:
    /// the hit blocks past those `num_computed` tokens skip are touched (given
    /// `priority` if any) and appended after one null block per skipped block;
    /// the group counts them all as cached.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn adopt_hits(
        &mut self,
        pool: &mut BlockPool,
        g: usize,
        spec: &GroupSpec,
        hits: &[u32],
        num_computed: usize,
        null: u32,
        priority: Option<BlockPriority>,
    ) -> PoolResult<()> {
        let skipped = spec.num_skipped_tokens(num_computed) / spec.block_size;
        let hits = &hits[skipped.min(hits.len())..];
        if pool.config().enable_caching {
            pool.touch(hits)?;
            if let Some(priority) = priority {
                pool.set_priority(hits, priority, true)?;
            }
        }
        let blocks = &mut self.blocks[g];
        if blocks.is_empty() {
            // Skipped blocks are held as the null block.
            blocks.resize(skipped, null);
        }
        blocks.extend_from_slice(hits);
        self.num_cached[g] = Some(blocks.len());
        Ok(())
    }
}

/// Of `num_external` connector-computed tokens after `num_local` local ones, how
/// many the group keeps (those its window does not skip).
fn external_kept(spec: &GroupSpec, num_local: usize, num_external: usize) -> usize {
    let all = num_local + num_external;
    let skipped = spec.num_skipped_tokens(all);
    if skipped > 0 {
        (all - skipped).min(num_external)
    } else {
        num_external
    }
}

/// vLLM's `allocate_external_computed_blocks` on one group's `blocks`: when the
/// group keeps any of the `num_external` tokens, new blocks up to the end of all
/// computed tokens are appended.
pub(super) fn allocate_external(
    pool: &mut BlockPool,
    spec: &GroupSpec,
    blocks: &mut Vec<u32>,
    num_local: usize,
    num_external: usize,
) -> PoolResult<()> {
    if external_kept(spec, num_local, num_external) == 0 {
        return Ok(());
    }
    let want = (num_local + num_external)
        .div_ceil(spec.block_size)
        .saturating_sub(blocks.len());
    pool.get_new_blocks(want, blocks)
}

/// vLLM's `allocate_new_blocks` on one group: appends to `out` the new blocks
/// that give a table of `blocks` room for `num_tokens` tokens.
pub(super) fn grow_to(
    pool: &mut BlockPool,
    spec: &GroupSpec,
    blocks: &[u32],
    num_tokens: usize,
    out: &mut Vec<u32>,
) -> PoolResult<()> {
    let want = num_tokens
        .div_ceil(spec.block_size)
        .saturating_sub(blocks.len());
    pool.get_new_blocks(want, out)
}

/// A prefix hit must end on one of the group's block boundaries (kvpool does not
/// copy a partly hit block on write, as vLLM's fine-grained lookup does).
pub(super) fn check_hit_boundary(spec: &GroupSpec, num_local: usize) -> PoolResult<()> {
    if num_local % spec.block_size != 0 {
        return Err(PoolError::InvalidArgument(format!(
            "a hit must end on a block boundary: {num_local} computed tokens, blocks of {}",
            spec.block_size
        )));
    }
    Ok(())
}

impl GroupTables {
    /// Group `g`'s spec, or an error naming the groups there are.
    fn group_spec(&self, g: usize) -> PoolResult<GroupSpec> {
        self.layout.specs().get(g).cloned().ok_or_else(|| {
            PoolError::InvalidArgument(format!(
                "group {g} out of range: the layout has {} groups",
                self.layout.len()
            ))
        })
    }

    /// Runs `step` on request `id`'s table, made empty if the request is new; a
    /// table made for a step that fails is dropped again.
    fn with_table<R>(
        &mut self,
        id: RequestKey<'_>,
        step: impl FnOnce(&mut Table, &mut Option<Vec<Vec<u32>>>) -> PoolResult<R>,
    ) -> PoolResult<R> {
        let n = self.layout.len();
        let Self {
            tables,
            new_block_ids,
            ..
        } = self;
        let made = !tables.contains_key(&id);
        let table = tables.entry_ref(&id).or_insert_with(|| Table::new(n));
        let result = step(table, new_block_ids);
        if made && result.is_err() {
            tables.remove(&id);
        }
        result
    }

    /// vLLM's per-type `get_num_blocks_to_allocate` for group `g` alone: the
    /// blocks request `id` needs there for `num_tokens` tokens, held at most
    /// `cap` at a time when given (vLLM's `max_admission_blocks_per_request`),
    /// with `hits` the prefix hit it would add after `num_local` local and
    /// `total_computed` computed tokens in all (hit blocks that sit in the free
    /// queue count, as taking them uses up free blocks). Changes nothing.
    #[allow(clippy::too_many_arguments)]
    pub fn group_num_blocks_to_allocate(
        &self,
        pool: &BlockPool,
        id: RequestKey<'_>,
        g: usize,
        num_tokens: usize,
        hits: &[u32],
        total_computed: usize,
        num_local: usize,
        cap: Option<usize>,
    ) -> PoolResult<usize> {
        let spec = self.group_spec(g)?;
        pool.check_ids(hits)?;
        let table = self.tables.get(&id);
        if !hits.is_empty() {
            if table.is_some_and(|t| t.num_cached[g].is_some()) {
                return Err(PoolError::InvalidArgument(
                    "a running request takes no new computed blocks".into(),
                ));
            }
            check_hit_boundary(&spec, num_local)?;
        }
        Ok(self.group_blocks_to_allocate(pool, table, g, num_tokens, hits, total_computed, cap))
    }

    /// vLLM's coordinator-level `get_num_blocks_to_allocate`: the blocks request `id`
    /// needs in all groups together for `num_tokens` tokens after `total_computed`
    /// computed ones, taking the prefix hit `hits` (one list per group; hit blocks in
    /// the free queue count), each window group capped at what it holds at a time
    /// when `apply_cap` (vLLM's full-sequence admission gate: the scheduler sizes the
    /// blocks that prefills in flight still need with it). Changes nothing.
    pub fn num_blocks_to_allocate(
        &self,
        pool: &BlockPool,
        id: RequestKey<'_>,
        num_tokens: usize,
        hits: Option<GroupBlocks<'_>>,
        total_computed: usize,
        apply_cap: bool,
    ) -> PoolResult<usize> {
        let table = self.tables.get(&id);
        if let Some(hits) = hits.filter(|h| !h.no_blocks()) {
            if hits.len() != self.layout.len() {
                return Err(PoolError::InvalidArgument(format!(
                    "new_computed_blocks has {} groups for {} groups",
                    hits.len(),
                    self.layout.len()
                )));
            }
            pool.check_ids(hits.flat)?;
            if table.is_some_and(|t| t.num_cached.iter().any(Option::is_some)) {
                return Err(PoolError::InvalidArgument(
                    "a running request takes no new computed blocks".into(),
                ));
            }
        }
        Ok(self.blocks_to_allocate(pool, table, num_tokens, hits, total_computed, apply_cap))
    }

    /// vLLM's per-type `add_local_computed_blocks`: request `id`'s group-`g`
    /// table, which must be empty, takes the prefix hit `hits` (touched), null
    /// blocks standing for those the window skips after `num_local +
    /// num_external` computed tokens.
    pub fn group_add_computed_blocks(
        &mut self,
        pool: &mut BlockPool,
        id: RequestKey<'_>,
        g: usize,
        hits: &[u32],
        num_local: usize,
        num_external: usize,
    ) -> PoolResult<()> {
        let null = Self::null(pool)?;
        let spec = self.group_spec(g)?;
        pool.check_ids(hits)?;
        if self
            .tables
            .get(&id)
            .is_some_and(|t| !t.blocks[g].is_empty())
        {
            return Err(PoolError::InvalidArgument(
                "computed blocks are added only to a group table without blocks".into(),
            ));
        }
        if !hits.is_empty() {
            if !pool.config().enable_caching {
                return Err(PoolError::CachingDisabled);
            }
            check_hit_boundary(&spec, num_local)?;
        }
        self.with_table(id, |table, _| {
            table.adopt_hits(pool, g, &spec, hits, num_local + num_external, null, None)
        })
    }

    /// vLLM's per-type `allocate_external_computed_blocks`: blocks for the
    /// connector-computed tokens group `g` keeps, up to `num_local +
    /// num_external` tokens; kept for zeroing when `record` and the tables record
    /// new blocks. All or nothing.
    pub fn group_allocate_external(
        &mut self,
        pool: &mut BlockPool,
        id: RequestKey<'_>,
        g: usize,
        num_local: usize,
        num_external: usize,
        record: bool,
    ) -> PoolResult<()> {
        let spec = self.group_spec(g)?;
        if external_kept(&spec, num_local, num_external) == 0 {
            return Ok(());
        }
        self.with_table(id, |table, new_block_ids| {
            let blocks = &mut table.blocks[g];
            let start = blocks.len();
            allocate_external(pool, &spec, blocks, num_local, num_external)?;
            if let (true, Some(ids)) = (record, new_block_ids) {
                ids[g].extend_from_slice(&blocks[start..]);
            }
            Ok(())
        })
    }

    /// vLLM's per-type `allocate_new_blocks`: new blocks giving request `id`'s
    /// group-`g` table room for `num_tokens` tokens, appended to the table and to
    /// `out` (and kept for zeroing when recording). All or nothing.
    pub fn group_allocate_new_blocks(
        &mut self,
        pool: &mut BlockPool,
        id: RequestKey<'_>,
        g: usize,
        num_tokens: usize,
        out: &mut Vec<u32>,
    ) -> PoolResult<()> {
        let spec = self.group_spec(g)?;
        self.with_table(id, |table, new_block_ids| {
            let blocks = &mut table.blocks[g];
            let start = out.len();
            grow_to(pool, &spec, blocks, num_tokens, out)?;
            blocks.extend_from_slice(&out[start..]);
            if let Some(ids) = new_block_ids {
                ids[g].extend_from_slice(&out[start..]);
            }
            Ok(())
        })
    }

    /// Hands request `id`'s group-`g` table, which must be empty, the blocks
    /// `ids` (vLLM's tests assign `req_to_blocks[request_id]` directly). A block
    /// the caller holds (a reference no table here accounts for) passes its
    /// reference to the table; a free block is taken out of the free queue first
    /// (touched), so that no table holds a block the pool counts as free. (vLLM keeps such a block free and takes its count
    /// below zero when the table gives it back.) The null block may stand
    /// anywhere; no other block twice.
    pub fn group_adopt_blocks(
        &mut self,
        pool: &mut BlockPool,
        id: RequestKey<'_>,
        g: usize,
        ids: &[u32],
    ) -> PoolResult<()> {
        let null = Self::null(pool)?;
        self.group_spec(g)?;
        pool.check_ids(ids)?;
        if self
            .tables
            .get(&id)
            .is_some_and(|t| !t.blocks[g].is_empty())
        {
            return Err(PoolError::InvalidArgument(
                "blocks are handed only to a group table without blocks".into(),
            ));
        }
        let mut seen: Vec<u32> = ids.iter().copied().filter(|&b| b != null).collect();
        seen.sort_unstable();
        if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
            return Err(PoolError::InvalidArgument(format!(
                "block {} appears twice in one table",
                w[0]
            )));
        }
        let (free, held): (Vec<u32>, Vec<u32>) = seen
            .into_iter()
            .partition(|&b| pool.ref_count(b).is_ok_and(|c| c == 0));
        self.check_caller_holds(pool, &held)?;
        self.with_table(id, |table, _| {
            pool.touch(&free)?;
            table.blocks[g] = ids.to_vec();
            Ok(())
        })
    }

    /// Each of `held` has a reference no table here and no pin accounts for, one
    /// the caller can hand over. (Tables of another `GroupTables` on the pool are not
    /// seen: `kvpool.vllm.single_type` checks its other managers' tables itself.)
    fn check_caller_holds(&self, pool: &BlockPool, held: &[u32]) -> PoolResult<()> {
        if held.is_empty() {
            return Ok(());
        }
        let mut named: HashMap<u32, u32> = held.iter().map(|&b| (b, 0)).collect();
        for blocks in self.tables.values().flat_map(|t| &t.blocks) {
            for b in blocks {
                if let Some(n) = named.get_mut(b) {
                    *n += 1;
                }
            }
        }
        for &b in held {
            // A pin's reference is the pin's, not the caller's.
            let accounted = named[&b] + u32::from(pool.is_pinned(b));
            if accounted >= pool.ref_count(b)? {
                return Err(PoolError::InvalidArgument(format!(
                    "block {b}'s references are all held by block tables or a pin: the caller \
                     holds none to hand over"
                )));
            }
        }
        Ok(())
    }

    /// vLLM's `pop_blocks_for_free` for every group: forgets request `id` and
    /// hands its tables to the caller, who now holds their references (nothing
    /// is freed). `None` for an unknown request.
    pub fn pop_tables(&mut self, id: RequestKey<'_>) -> Option<Vec<Vec<u32>>> {
        self.tables.remove(&id).map(|t| t.blocks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{GroupSpec, KvGroups, PoolConfig, RequestId};

    fn setup(spec: GroupSpec, num_blocks: u32) -> (GroupTables, BlockPool) {
        let layout = KvGroups::new(vec![spec], 2, None).unwrap();
        let tables = GroupTables::new(layout, 1 << 20, 1 << 20, true).unwrap();
        let mut config = PoolConfig::new(num_blocks);
        config.block_size = 2;
        let pool = BlockPool::new(config).unwrap();
        (tables, pool)
    }

    fn key(name: &str) -> RequestId {
        RequestId::from(name)
    }

    #[test]
    fn steps_allocate_as_one_call_would() {
        let (mut tables, mut pool) = setup(GroupSpec::sliding_window(2, 4), 20);
        let id = key("r");
        let need = tables
            .group_num_blocks_to_allocate(&pool, id.key(), 0, 8, &[], 0, 0, None)
            .unwrap();
        assert_eq!(need, 4);
        let mut out = Vec::new();
        tables
            .group_allocate_new_blocks(&mut pool, id.key(), 0, 8, &mut out)
            .unwrap();
        assert_eq!(out.len(), 4);
        assert_eq!(tables.blocks(id.key(), 0), &out[..]);
        assert_eq!(tables.take_new_block_ids(), out);
        // Seven computed tokens: the window of 4 skips tokens 0-3, two blocks.
        tables
            .remove_skipped_blocks(&mut pool, id.key(), 7)
            .unwrap();
        assert_eq!(&tables.blocks(id.key(), 0)[..2], &[0, 0]);
        assert_eq!(pool.num_free_blocks(), 19 - 2);
        assert_eq!(tables.pop_tables(id.key()).unwrap()[0][2..], out[2..]);
        assert!(tables.check_invariants(&pool).is_ok());
    }

    #[test]
    fn a_failed_step_leaves_no_table_and_no_change() {
        let (mut tables, mut pool) = setup(GroupSpec::full(2), 4);
        let id = key("r");
        let mut out = Vec::new();
        let err = tables.group_allocate_new_blocks(&mut pool, id.key(), 0, 100, &mut out);
        assert!(matches!(err, Err(PoolError::NoFreeBlocks { .. })));
        assert_eq!(tables.request_ids().count(), 0);
        assert_eq!(pool.num_free_blocks(), 3);
        assert!(tables
            .group_allocate_new_blocks(&mut pool, id.key(), 1, 2, &mut out)
            .is_err());
        assert!(tables
            .group_adopt_blocks(&mut pool, id.key(), 0, &[1, 2, 1])
            .is_err());
        assert!(tables
            .group_adopt_blocks(&mut pool, id.key(), 0, &[1, 9])
            .is_err());
        assert_eq!(pool.num_free_blocks(), 3);
        assert_eq!(tables.request_ids().count(), 0);
    }

    #[test]
    fn adopting_takes_free_blocks_and_keeps_held_ones() {
        let (mut tables, mut pool) = setup(GroupSpec::full(2), 8);
        let mut held = Vec::new();
        pool.get_new_blocks(1, &mut held).unwrap();
        let free = (1..8).find(|b| !held.contains(b)).unwrap();
        let id = key("r");
        tables
            .group_adopt_blocks(&mut pool, id.key(), 0, &[0, held[0], free])
            .unwrap();
        assert_eq!(pool.ref_count(held[0]).unwrap(), 1);
        assert_eq!(pool.ref_count(free).unwrap(), 1);
        assert!(tables.check_invariants(&pool).is_ok());
        // Block `held`'s one reference is the table's now: no other table takes it.
        let other = key("s");
        assert!(tables
            .group_adopt_blocks(&mut pool, other.key(), 0, &[held[0]])
            .is_err());
        tables.free(&mut pool, id.key()).unwrap();
        assert_eq!(pool.num_free_blocks(), 7);
    }
}
