//! KV-cache groups: the layer types of a hybrid model, each with its own block
//! tables over one shared pool, as vLLM 0.33 lays them out (`KVCacheConfig`'s
//! `kv_cache_groups`, one `SingleTypeKVCacheManager` per group).
//!
//! A group's [`GroupSpec`] says which tokens its layers attend to, and so which
//! blocks a request can give back early ([`GroupSpec::num_skipped_tokens`]) and
//! which cached blocks make a prefix hit (`group_hits.rs`). Groups with equal
//! specs are looked up together, as vLLM's `HybridKVCacheCoordinator` batches
//! them into one `SpecGroup`.

use super::error::{PoolError, PoolResult};

/// What a group's layers attend to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttentionKind {
    /// Every earlier token (vLLM's `FullAttentionSpec`).
    Full,
    /// The last `window` tokens, the current one included (`SlidingWindowSpec`).
    SlidingWindow {
        /// `sliding_window`, in tokens.
        window: usize,
    },
    /// The tokens of the current `chunk`-token chunk (`ChunkedLocalAttentionSpec`).
    ChunkedLocal {
        /// `attention_chunk_size`, in tokens.
        chunk: usize,
    },
}

impl AttentionKind {
    /// vLLM's name for the kind (`KVCacheSpecKind` in KV events).
    pub fn name(self) -> &'static str {
        match self {
            AttentionKind::Full => "full_attention",
            AttentionKind::SlidingWindow { .. } => "sliding_window",
            AttentionKind::ChunkedLocal { .. } => "chunked_local_attention",
        }
    }
}

/// One KV-cache group: its attention kind and block size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GroupSpec {
    /// What the group's layers attend to.
    pub kind: AttentionKind,
    /// Tokens per block.
    pub block_size: usize,
}

impl GroupSpec {
    /// A full-attention group.
    pub fn full(block_size: usize) -> Self {
        Self {
            kind: AttentionKind::Full,
            block_size,
        }
    }

    /// A sliding-window group of `window` tokens.
    pub fn sliding_window(block_size: usize, window: usize) -> Self {
        Self {
            kind: AttentionKind::SlidingWindow { window },
            block_size,
        }
    }

    /// A chunked-local group of `chunk`-token chunks.
    pub fn chunked_local(block_size: usize, chunk: usize) -> Self {
        Self {
            kind: AttentionKind::ChunkedLocal { chunk },
            block_size,
        }
    }

    /// True for full attention.
    pub fn is_full(&self) -> bool {
        self.kind == AttentionKind::Full
    }

    /// vLLM's `get_num_skipped_tokens`: how many leading tokens the next token
    /// does not attend to once `num_computed_tokens` are computed. Their whole
    /// blocks can be freed (`remove_skipped_blocks`) and need not be hits.
    ///
    /// ```
    /// use kvpool::pool::GroupSpec;
    /// assert_eq!(GroupSpec::sliding_window(4, 4).num_skipped_tokens(7), 4);
    /// assert_eq!(GroupSpec::chunked_local(4, 8).num_skipped_tokens(13), 8);
    /// assert_eq!(GroupSpec::full(4).num_skipped_tokens(100), 0);
    /// ```
    pub fn num_skipped_tokens(&self, num_computed_tokens: usize) -> usize {
        match self.kind {
            AttentionKind::Full => 0,
            AttentionKind::SlidingWindow { window } => {
                (num_computed_tokens + 1).saturating_sub(window)
            }
            AttentionKind::ChunkedLocal { chunk } => num_computed_tokens / chunk * chunk,
        }
    }

    /// For a sliding window: the cached blocks in a row a hit needs, those that
    /// hold the last `window - 1` tokens before the next one (vLLM's
    /// `_contiguous_blocks_for_hit`, without EAGLE).
    pub fn contiguous_blocks_for_hit(&self) -> usize {
        match self.kind {
            AttentionKind::SlidingWindow { window } => (window - 1).div_ceil(self.block_size),
            _ => 0,
        }
    }

    /// vLLM's per-request admission cap (`max_admission_blocks_per_request`): the
    /// most blocks a request of this group holds at once, for the full-sequence
    /// gate. `None` for full attention, which holds every block.
    pub fn admission_cap(
        &self,
        max_in_flight_tokens: usize,
        max_model_len: usize,
    ) -> Option<usize> {
        match self.kind {
            AttentionKind::Full => None,
            AttentionKind::SlidingWindow { window } => Some(
                (window - 1 + max_in_flight_tokens)
                    .min(max_model_len)
                    .div_ceil(self.block_size)
                    + 1,
            ),
            AttentionKind::ChunkedLocal { chunk } => Some(
                (chunk + max_in_flight_tokens)
                    .min(max_model_len)
                    .div_ceil(self.block_size),
            ),
        }
    }

    fn validate(&self) -> PoolResult<()> {
        if self.block_size == 0 {
            return Err(PoolError::InvalidArgument(
                "a group's block_size must be at least 1".into(),
            ));
        }
        match self.kind {
            AttentionKind::SlidingWindow { window: 0 } => Err(PoolError::InvalidArgument(
                "a sliding window must be at least 1 token".into(),
            )),
            AttentionKind::ChunkedLocal { chunk: 0 } => Err(PoolError::InvalidArgument(
                "an attention chunk must be at least 1 token".into(),
            )),
            _ => Ok(()),
        }
    }
}

/// Groups that share a spec, looked up together (vLLM's `SpecGroup`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecGroup {
    /// The shared spec.
    pub spec: GroupSpec,
    /// The group indices, in order.
    pub group_ids: Vec<u32>,
    /// The groups' ids in the pool's prefix cache, in the same order (the group
    /// indices unless [`KvGroups::with_pool_groups`] says otherwise).
    pub pool_group_ids: Vec<u32>,
}

/// A model's KV-cache layout: its groups, the hashing granularity and the
/// sliding-window retention rule, validated as vLLM 0.33 validates them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvGroups {
    specs: Vec<GroupSpec>,
    hash_block_size: usize,
    scheduler_block_size: usize,
    retention_interval: Option<usize>,
    spec_groups: Vec<SpecGroup>,
    /// Per group index, the group id its blocks are cached under in the pool.
    pool_groups: Vec<u32>,
}

impl KvGroups {
    /// The layout of `specs` (at least one group). Block hashes are computed over
    /// `hash_block_size` tokens; hits land on multiples of the scheduler block
    /// size, the least common multiple of the groups' block sizes.
    /// `retention_interval` is vLLM's `prefix_cache_retention_interval`: `None`
    /// caches a sliding-window tail at every hit boundary, `Some(0)` only at the
    /// prompt's replay boundary, `Some(n)` once per `n`-token segment.
    ///
    /// Every group's block size must be a multiple of `hash_block_size` (an
    /// `InvalidArgument` otherwise); a full-attention group with larger blocks also
    /// caches its prompt's last block under a partial key, as vLLM does.
    pub fn new(
        specs: Vec<GroupSpec>,
        hash_block_size: usize,
        retention_interval: Option<usize>,
    ) -> PoolResult<Self> {
        if specs.is_empty() {
            return Err(PoolError::InvalidArgument(
                "a KV-cache layout needs at least one group".into(),
            ));
        }
        if specs.len() > u32::MAX as usize {
            return Err(PoolError::InvalidArgument(
                "too many KV-cache groups".into(),
            ));
        }
        for spec in &specs {
            spec.validate()?;
            if hash_block_size == 0 || spec.block_size % hash_block_size != 0 {
                return Err(PoolError::InvalidArgument(format!(
                    "every group's block_size must be a multiple of hash_block_size ({hash_block_size}), got {}",
                    spec.block_size
                )));
            }
        }
        let scheduler_block_size = specs
            .iter()
            .try_fold(1, |acc, s| lcm(acc, s.block_size))
            .ok_or_else(|| {
                PoolError::InvalidArgument(
                    "the groups' block sizes have no common multiple within the largest count"
                        .into(),
                )
            })?;
        let sparse = specs
            .iter()
            .any(|s| matches!(s.kind, AttentionKind::SlidingWindow { .. }));
        match retention_interval {
            Some(r) if r > 0 && !sparse => {
                return Err(PoolError::InvalidArgument(
                    "retention_interval is set but no group has a sliding window, so it has no effect; set it to 0 or None".into(),
                ))
            }
            Some(r) if r % scheduler_block_size != 0 => {
                return Err(PoolError::InvalidArgument(format!(
                    "retention_interval ({r}) must be a multiple of the scheduler block size ({scheduler_block_size})"
                )))
            }
            _ => {}
        }
        let mut spec_groups: Vec<SpecGroup> = Vec::new();
        for (i, spec) in specs.iter().enumerate() {
            match spec_groups.iter_mut().find(|g| g.spec == *spec) {
                Some(group) => {
                    group.group_ids.push(i as u32);
                    group.pool_group_ids.push(i as u32);
                }
                None => spec_groups.push(SpecGroup {
                    spec: *spec,
                    group_ids: vec![i as u32],
                    pool_group_ids: vec![i as u32],
                }),
            }
        }
        // Full attention first (a stable sort, as vLLM's): its left-to-right scan
        // bounds the others.
        spec_groups.sort_by_key(|g| !g.spec.is_full());
        let pool_groups = (0..specs.len() as u32).collect();
        Ok(Self {
            specs,
            hash_block_size,
            scheduler_block_size,
            retention_interval,
            spec_groups,
            pool_groups,
        })
    }

    /// The layout with its groups cached under the pool's group ids `ids` (one per
    /// group, distinct) instead of their indices: a layout that is one part of a
    /// model's groups, as vLLM's per-type manager of group `kv_cache_group_id` is.
    pub fn with_pool_groups(mut self, ids: Vec<u32>) -> PoolResult<Self> {
        if ids.len() != self.specs.len() {
            return Err(PoolError::InvalidArgument(format!(
                "{} pool group ids for {} groups",
                ids.len(),
                self.specs.len()
            )));
        }
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(PoolError::InvalidArgument(format!(
                "pool group id {} is given to two groups",
                w[0]
            )));
        }
        for g in &mut self.spec_groups {
            g.pool_group_ids = g.group_ids.iter().map(|&i| ids[i as usize]).collect();
        }
        self.pool_groups = ids;
        Ok(self)
    }

    /// The layout with hits and sliding-window tails on multiples of
    /// `scheduler_block_size`, a multiple of the groups' least common block size:
    /// a layout that is one part of a model whose other groups have other block
    /// sizes (vLLM's per-type managers take the model's).
    pub fn with_scheduler_block_size(mut self, scheduler_block_size: usize) -> PoolResult<Self> {
        if scheduler_block_size == 0 || scheduler_block_size % self.scheduler_block_size != 0 {
            return Err(PoolError::InvalidArgument(format!(
                "scheduler_block_size ({scheduler_block_size}) must be a multiple of the groups' \
                 least common block size ({})",
                self.scheduler_block_size
            )));
        }
        if let Some(r) = self.retention_interval {
            if r % scheduler_block_size != 0 {
                return Err(PoolError::InvalidArgument(format!(
                    "retention_interval ({r}) must be a multiple of the scheduler block size \
                     ({scheduler_block_size})"
                )));
            }
        }
        self.scheduler_block_size = scheduler_block_size;
        Ok(self)
    }

    /// The pool's group id for the blocks of group `g`.
    pub fn pool_group(&self, g: usize) -> u32 {
        self.pool_groups[g]
    }

    /// One full-attention group of `block_size` (vLLM's unitary layout).
    pub fn single_full(block_size: usize) -> PoolResult<Self> {
        Self::new(vec![GroupSpec::full(block_size)], block_size, None)
    }

    /// The groups' specs, by group index.
    pub fn specs(&self) -> &[GroupSpec] {
        &self.specs
    }

    /// Number of groups.
    pub fn len(&self) -> usize {
        self.specs.len()
    }

    /// Never true: a layout has at least one group.
    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }

    /// Tokens per block hash.
    pub fn hash_block_size(&self) -> usize {
        self.hash_block_size
    }

    /// The granularity of hits and of cacheable prefixes: the least common multiple
    /// of the groups' block sizes.
    pub fn scheduler_block_size(&self) -> usize {
        self.scheduler_block_size
    }

    /// How many hash blocks make one block of group `g`.
    pub fn scale(&self, g: usize) -> usize {
        self.specs[g].block_size / self.hash_block_size
    }

    /// The sliding-window retention interval.
    pub fn retention_interval(&self) -> Option<usize> {
        self.retention_interval
    }

    /// Groups batched by spec, full attention first.
    pub fn spec_groups(&self) -> &[SpecGroup] {
        &self.spec_groups
    }
}

/// The least common multiple of `a` and `b` (both at least 1).
/// The least common multiple of `a` and `b` (both at least 1), `None` past `usize`.
fn lcm(a: usize, b: usize) -> Option<usize> {
    let (mut x, mut y) = (a, b);
    while y != 0 {
        (x, y) = (y, x % y);
    }
    (a / x).checked_mul(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skipped_tokens_follow_vllm() {
        let swa = GroupSpec::sliding_window(4, 4);
        assert_eq!(swa.num_skipped_tokens(0), 0);
        assert_eq!(swa.num_skipped_tokens(3), 0);
        assert_eq!(swa.num_skipped_tokens(7), 4);
        let local = GroupSpec::chunked_local(4, 8);
        assert_eq!(local.num_skipped_tokens(7), 0);
        assert_eq!(local.num_skipped_tokens(8), 8);
        assert_eq!(local.num_skipped_tokens(13), 8);
        assert_eq!(
            GroupSpec::sliding_window(16, 1024).contiguous_blocks_for_hit(),
            64
        );
        assert_eq!(
            GroupSpec::sliding_window(16, 128).contiguous_blocks_for_hit(),
            8
        );
    }

    #[test]
    fn equal_specs_share_a_lookup_and_full_attention_goes_first() {
        let specs = vec![
            GroupSpec::sliding_window(16, 1024),
            GroupSpec::full(16),
            GroupSpec::sliding_window(16, 1024),
            GroupSpec::chunked_local(16, 64),
        ];
        let groups = KvGroups::new(specs, 16, None).unwrap();
        let ids: Vec<Vec<u32>> = groups
            .spec_groups()
            .iter()
            .map(|g| g.group_ids.clone())
            .collect();
        assert_eq!(ids, vec![vec![1], vec![0, 2], vec![3]]);
    }

    #[test]
    fn pool_group_ids_follow_their_groups_into_the_spec_groups() {
        let specs = vec![
            GroupSpec::sliding_window(16, 1024),
            GroupSpec::full(16),
            GroupSpec::sliding_window(16, 1024),
        ];
        let groups = KvGroups::new(specs, 16, None)
            .unwrap()
            .with_pool_groups(vec![7, 3, 5])
            .unwrap();
        let ids: Vec<(Vec<u32>, Vec<u32>)> = groups
            .spec_groups()
            .iter()
            .map(|g| (g.group_ids.clone(), g.pool_group_ids.clone()))
            .collect();
        assert_eq!(ids, vec![(vec![1], vec![3]), (vec![0, 2], vec![7, 5])]);
        assert_eq!(groups.pool_group(2), 5);
        let layout = || KvGroups::new(vec![GroupSpec::full(16)], 16, None).unwrap();
        assert!(layout().with_pool_groups(vec![]).is_err());
        assert!(KvGroups::new(vec![GroupSpec::full(16); 2], 16, None)
            .unwrap()
            .with_pool_groups(vec![1, 1])
            .is_err());
        assert_eq!(
            layout()
                .with_scheduler_block_size(64)
                .unwrap()
                .scheduler_block_size(),
            64
        );
        assert!(layout().with_scheduler_block_size(24).is_err());
        assert!(layout().with_scheduler_block_size(0).is_err());
    }

    #[test]
    fn bad_layouts_are_refused() {
        assert!(KvGroups::new(vec![], 16, None).is_err());
        assert!(KvGroups::new(vec![GroupSpec::full(24)], 16, None).is_err()); // not a multiple
        assert!(KvGroups::new(vec![GroupSpec::sliding_window(16, 0)], 16, None).is_err());
        assert!(KvGroups::new(vec![GroupSpec::full(16)], 16, Some(32)).is_err());
        assert!(KvGroups::new(vec![GroupSpec::full(16)], 16, Some(0)).is_ok());
        let swa = vec![GroupSpec::full(16), GroupSpec::sliding_window(16, 64)];
        assert!(KvGroups::new(swa.clone(), 16, Some(24)).is_err());
        assert!(KvGroups::new(swa, 16, Some(64)).is_ok());
        // Larger blocks: the scheduler block size is their least common multiple.
        let mixed = vec![GroupSpec::full(32), GroupSpec::sliding_window(48, 96)];
        let layout = KvGroups::new(mixed.clone(), 16, None).unwrap();
        assert_eq!(
            (
                layout.scheduler_block_size(),
                layout.scale(0),
                layout.scale(1)
            ),
            (96, 2, 3)
        );
        assert!(KvGroups::new(mixed, 16, Some(48)).is_err()); // not a multiple of 96
    }
}
