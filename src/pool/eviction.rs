//! Eviction policies: which cached free block a full pool reuses first.
//!
//! Allocation always takes uncached free blocks first (the free queue's stack and
//! fresh range, `free_queue.rs`); only when none is left does it evict a cached
//! block from the queue's lists (`class_lists.rs`). The policy decides which list
//! (class) each freed cached block joins and which list's head goes next:
//!
//! - [`EvictionPolicy::Lru`]: one list, vLLM's order. The default; every observable
//!   is what it was before policies existed.
//! - [`EvictionPolicy::Priority`]: TensorRT-LLM's retention model. A cached block
//!   carries a priority `0..=100` (default 35), optionally with a duration after
//!   which it reverts to the default. One list per priority; the lowest non-empty
//!   priority goes first, LRU within it. O(1) per block; an expiry costs O(log n).
//! - [`EvictionPolicy::Adaptive`]: recency with a horizon for reused blocks. A
//!   block's *uses* count the requests that cached or hit it, remembered across
//!   evictions by a ghost table of recently evicted keys (for the last
//!   `max(num_blocks, MIN_GHOST_WINDOW)` evictions). A freed block used once joins
//!   band 0 with credit `t`, one used by two or more requests band 1 with credit
//!   `t + H`, where `t` counts the cached blocks freed so far: a reused block stays
//!   as if it had been freed `H` blocks later. The horizon `H` is
//!   [`default_adaptive_horizon`] of the pool's size unless given: `ADAPTIVE_HORIZON`
//!   in pools up to 1.25 times as large, fading to 0 (LRU's order) at 1.5 times.
//!   Eviction takes the band head with the lower credit (each band is in `t`
//!   order, so its head is its minimum). With a horizon of 0 this is LRU, and
//!   it runs as LRU: one list, no uses, no ghosts ([`Eviction::ranks_by_use`]). The
//!   horizon is bounded, so a block that stops being used does age out (no LFU
//!   pollution). O(1) per block (two heads compared, one ghost-table operation).
//!   The measurements behind the choice, and the alternatives tried, are in
//!   `docs/eviction.md`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

use super::class_lists::ClassLists;
use super::error::{PoolError, PoolResult};
use super::hash_key::BlockHashKey;
use super::prefetch::prefetch;

/// The retention priority blocks get unless told otherwise (TensorRT-LLM's default).
pub const DEFAULT_PRIORITY: u8 = 35;
/// The highest retention priority.
pub const MAX_PRIORITY: u8 = 100;
/// Use-count bands of the adaptive policy: blocks used by one request, and by two
/// or more.
pub const ADAPTIVE_BANDS: usize = 2;
// The free queue takes the adaptive policy's blocks by merging exactly two bands.
const _: () = assert!(ADAPTIVE_BANDS == 2);
/// How much later than it was a block used by two or more requests counts as freed,
/// in cached blocks freed: the adaptive policy's one parameter, chosen by measurement
/// on the Mooncake traces (`docs/eviction.md`).
pub const ADAPTIVE_HORIZON: u64 = 20_000;
/// Pools up to this many blocks get the whole [`ADAPTIVE_HORIZON`] by default.
pub const FULL_HORIZON_UNTIL: u64 = ADAPTIVE_HORIZON * 5 / 4;
/// Pools of this many blocks or more get a horizon of 0 by default: LRU's order.
pub const NO_HORIZON_FROM: u64 = ADAPTIVE_HORIZON * 3 / 2;

/// The adaptive policy's horizon when none is given, for a pool of `num_blocks`:
/// [`ADAPTIVE_HORIZON`] up to [`FULL_HORIZON_UNTIL`] blocks (25,000), then fading
/// linearly to 0 at [`NO_HORIZON_FROM`] (30,000) and beyond.
///
/// A pool that spans more than the horizon already keeps reused blocks that long by
/// recency alone; there the bonus only makes the policy evict recent first uses
/// (a conversation's next turn) before old reused blocks. On the Mooncake
/// conversation trace a full horizon cost up to 1.1% of LRU's hits between 36,000
/// and 41,000 blocks (and less at some larger sizes); faded, the policy is never
/// below LRU from 1,000 to 100,000 blocks on either trace (`docs/eviction.md`).
pub fn default_adaptive_horizon(num_blocks: u32) -> u64 {
    let blocks = u64::from(num_blocks);
    if blocks <= FULL_HORIZON_UNTIL {
        ADAPTIVE_HORIZON
    } else if blocks >= NO_HORIZON_FROM {
        0
    } else {
        ADAPTIVE_HORIZON * (NO_HORIZON_FROM - blocks) / (NO_HORIZON_FROM - FULL_HORIZON_UNTIL)
    }
}

/// The largest horizon a pool takes: credits (the clock plus the horizon) live in 56
/// bits, and this leaves the clock 2^55 blocks freed.
pub const MAX_ADAPTIVE_HORIZON: u64 = 1 << 40;

/// The fewest evictions a ghost record of the adaptive policy counts for; a pool of
/// more blocks keeps records for as many evictions as it has blocks. Small pools
/// need the longer memory: a conversation's next turn comes hundreds of requests
/// later, long after a small pool has evicted the turn before.
pub const MIN_GHOST_WINDOW: u32 = 8_000;

/// Ghost-table slots the adaptive policy keeps per eviction of its window.
pub const GHOSTS_PER_BLOCK: usize = 4;

/// The evictions a ghost record of a pool of `num_blocks` counts for.
pub fn ghost_window(num_blocks: u32) -> u32 {
    num_blocks.max(MIN_GHOST_WINDOW)
}

/// The ghost-table slots asked for by a pool of `num_blocks` (rounded up to whole
/// sets of a power-of-two count by the table).
pub fn ghost_slots(num_blocks: u32) -> usize {
    (ghost_window(num_blocks) as usize).saturating_mul(GHOSTS_PER_BLOCK)
}

/// The ways of the ghost table a pool of `num_blocks` keeps under the adaptive
/// policy with `horizon`: none at a horizon of 0, where uses change nothing (every
/// credit is its block's tick), else [`ghost_slots`] rounded up to a power-of-two
/// number of sets.
pub fn ghost_table_ways(num_blocks: u32, horizon: u64) -> usize {
    if horizon == 0 {
        0
    } else {
        Ghosts::rounded(ghost_slots(num_blocks))
    }
}

/// Which cached free block is evicted first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EvictionPolicy {
    /// Least recently freed first (vLLM's order).
    #[default]
    Lru,
    /// Lowest retention priority first, least recently freed within a priority.
    Priority,
    /// Recency with a horizon for blocks used by two or more requests; see the
    /// module docs.
    Adaptive,
}

impl EvictionPolicy {
    /// Every policy, in the order `kvpool simulate --policy` lists them.
    pub const ALL: [Self; 3] = [Self::Lru, Self::Priority, Self::Adaptive];

    /// The stable name (`"lru"`, `"priority"`, `"adaptive"`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Lru => "lru",
            Self::Priority => "priority",
            Self::Adaptive => "adaptive",
        }
    }

    /// The policy called `name`.
    pub fn from_name(name: &str) -> PoolResult<Self> {
        Self::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .ok_or_else(|| {
                PoolError::InvalidArgument(format!(
                    "unknown eviction policy '{name}': choose lru, priority or adaptive"
                ))
            })
    }

    /// How many lists the free queue keeps for this policy.
    pub fn num_classes(self) -> usize {
        match self {
            Self::Lru => 1,
            Self::Priority => MAX_PRIORITY as usize + 1,
            Self::Adaptive => ADAPTIVE_BANDS,
        }
    }
}

/// A block's retention under [`EvictionPolicy::Priority`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockPriority {
    /// `0..=`[`MAX_PRIORITY`]; higher stays longer.
    pub priority: u8,
    /// When (on the pool's clock, in seconds) the priority reverts to
    /// [`DEFAULT_PRIORITY`]; `None`: never.
    pub expires_at: Option<f64>,
}

impl BlockPriority {
    /// The default retention: [`DEFAULT_PRIORITY`], forever.
    pub const DEFAULT: Self = Self {
        priority: DEFAULT_PRIORITY,
        expires_at: None,
    };

    /// Priority `priority` for `duration_s` seconds from `now` (forever when `None`).
    pub fn new(priority: i64, duration_s: Option<f64>, now: f64) -> PoolResult<Self> {
        if !(0..=i64::from(MAX_PRIORITY)).contains(&priority) {
            return Err(PoolError::InvalidArgument(format!(
                "priority must be between 0 and {MAX_PRIORITY}, got {priority}"
            )));
        }
        if let Some(d) = duration_s {
            if !(d.is_finite() && d > 0.0) {
                return Err(PoolError::InvalidArgument(format!(
                    "retention_s must be a positive number of seconds, got {d}"
                )));
            }
        }
        Ok(Self {
            priority: priority as u8,
            expires_at: duration_s.map(|d| now + d),
        })
    }

    /// The priority in force at `now`.
    #[inline]
    pub fn effective(&self, now: f64) -> u8 {
        match self.expires_at {
            Some(t) if t <= now => DEFAULT_PRIORITY,
            _ => self.priority,
        }
    }
}

/// The clock retention durations run on.
#[derive(Clone, Copy, Debug)]
pub enum Clock {
    /// Seconds since the pool was built, from the OS's monotonic clock.
    Monotonic(Instant),
    /// Seconds set by the caller (`advance_clock`), for tests and simulations.
    Manual(f64),
}

impl Clock {
    /// The current time in seconds.
    #[inline]
    pub fn now(&self) -> f64 {
        match self {
            Self::Monotonic(start) => start.elapsed().as_secs_f64(),
            Self::Manual(t) => *t,
        }
    }
}

/// `x` mixed by splitmix64's finaliser.
#[inline]
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Odd multipliers, one per hash word, for [`ghost_fingerprint`].
const WORD_MULTIPLIERS: [u64; 4] = [
    0x9E37_79B9_7F4A_7C15,
    0xC2B2_AE3D_27D4_EB4F,
    0x1656_67B1_9E37_79F9,
    0xD6E8_FEB8_6659_FD93,
];

/// The fingerprint the ghost table knows a key by: each of the key's four hash words
/// times an odd constant of its own (a bijection of the word), the products and the
/// key's width and group folded by xor, then splitmix64's finaliser over the fold.
/// The four products are independent, so they run side by side: a third of the
/// latency of folding splitmix64 word by word, which this replaced. Deterministic,
/// so that the plain-Python reference computes the same; a collision only blurs a
/// use count, never a cost.
#[inline(always)]
pub fn ghost_fingerprint(key: &BlockHashKey) -> u64 {
    let w = key.hash.words();
    let folded = ((key.hash.width() as u64) << 32 | u64::from(key.group))
        ^ w[0].wrapping_mul(WORD_MULTIPLIERS[0])
        ^ w[1].wrapping_mul(WORD_MULTIPLIERS[1])
        ^ w[2].wrapping_mul(WORD_MULTIPLIERS[2])
        ^ w[3].wrapping_mul(WORD_MULTIPLIERS[3]);
    splitmix64(folded)
}

/// Evicted blocks whose ghost-table lines are asked for ahead of recording them, at
/// most: enough misses in flight to overlap, few enough that the lines are still in
/// cache when they are written (a whole pool's would not be).
pub const GHOST_BATCH: usize = 64;

/// Ways per set of the ghost table (8 ways of 8 bytes: one cache line).
pub const GHOST_WAYS: usize = 8;

/// Recently evicted keys and their use counts, in an 8-way set-associative table.
///
/// A key's record lives in set `fingerprint & (sets - 1)`, as one `u64`: the
/// eviction count when it was written (bits 32..64), 24 bits of the fingerprint
/// (8..32) and the uses (0..8; 0 is an empty way). A record counts only while fewer
/// than `window` evictions (the pool's size) have happened since: forgetting goes by
/// age, as a FIFO's would, so the blocks of one chain, evicted together, are
/// forgotten together. A set full of live records replaces its oldest. O(1) per
/// operation (one cache line, no division), no allocation after construction.
///
/// A directory of one byte per way (8 bits of its tag, 0 for an empty way) lets a
/// lookup of a key that has no record, the common case, skip the table: the
/// directory is an eighth of its size, so it mostly stays in cache where the
/// table's lines would not. It changes no answer: a record whose tag matches always
/// has a matching byte.
#[derive(Clone, Debug, Default)]
pub struct Ghosts {
    /// The ways, from `ways[base]`: `base` puts each set on one cache line (the
    /// allocator only aligns to 16 bytes, and a set across two lines costs two
    /// misses); the slack around them is never used.
    ways: Vec<u64>,
    base: usize,
    /// Per way of the table (so as long as it), [`Self::directory_byte`] of its
    /// record's tag, or 0 while it holds none.
    directory: Vec<u8>,
    /// `sets - 1`; `sets` is a power of two.
    set_mask: u64,
    /// Evictions recorded so far (wrapping).
    stamp: u32,
    /// Records older than this many evictions are forgotten.
    window: u32,
}

impl Ghosts {
    /// `ways` rounded up to whole sets of a power-of-two count (at least one).
    fn rounded(ways: usize) -> usize {
        ways.div_ceil(GHOST_WAYS).max(1).next_power_of_two() * GHOST_WAYS
    }

    /// A table of at least `ways` ways (rounded up to a power-of-two number of
    /// sets), forgetting after `window` evictions.
    fn new(ways: usize, window: u32) -> PoolResult<Self> {
        let n = Self::rounded(ways);
        let sets = n / GHOST_WAYS;
        let mut table = Vec::new();
        table
            .try_reserve_exact(n + GHOST_WAYS - 1)
            .map_err(|_| PoolError::OutOfMemory {
                what: "the adaptive policy's ghost table",
                bytes: n.saturating_mul(8),
            })?;
        table.resize(n + GHOST_WAYS - 1, 0);
        let line = GHOST_WAYS * std::mem::size_of::<u64>();
        let misalign = table.as_ptr() as usize % line;
        let base = if misalign == 0 {
            0
        } else {
            (line - misalign) / std::mem::size_of::<u64>()
        };
        let mut directory = Vec::new();
        directory
            .try_reserve_exact(n)
            .map_err(|_| PoolError::OutOfMemory {
                what: "the adaptive policy's ghost table",
                bytes: n.saturating_mul(9),
            })?;
        directory.resize(n, 0);
        Ok(Self {
            ways: table,
            base,
            directory,
            set_mask: sets as u64 - 1,
            stamp: 0,
            // Below `u32::MAX`, the age `record` gives an empty way.
            window: window.min(u32::MAX - 1),
        })
    }

    #[inline]
    fn set_start(&self, fingerprint: u64) -> usize {
        (fingerprint & self.set_mask) as usize * GHOST_WAYS
    }

    #[inline]
    fn tag(fingerprint: u64) -> u64 {
        (fingerprint >> 40) << 8
    }

    /// The directory's byte for a record's `tag` (as [`Self::tag`] places it): its
    /// low 8 bits, never 0.
    #[inline]
    fn directory_byte(tag: u64) -> u8 {
        ((tag >> 8) as u8) | 1
    }

    /// Evictions since `way` was written.
    #[inline]
    fn age(&self, way: u64) -> u32 {
        self.stamp.wrapping_sub((way >> 32) as u32)
    }

    /// Remembers that the key of `fingerprint` left the cache with `uses` uses.
    #[inline]
    fn record(&mut self, fingerprint: u64, uses: u8) {
        if self.ways.is_empty() || uses == 0 {
            return;
        }
        self.stamp = self.stamp.wrapping_add(1);
        let start = self.set_start(fingerprint);
        let set: &[u64; GHOST_WAYS] = self.ways[self.base + start..][..GHOST_WAYS]
            .try_into()
            .unwrap_or(&[0; GHOST_WAYS]);
        // The first empty or forgotten way, else the oldest record (the first on a
        // tie). Each way's age, an empty way's taken as the largest there is, so that
        // a way is free exactly when its age exceeds the window. Records go to the
        // first free way, so the live ones gather at the front and the first half
        // mostly has a free way: it is checked on its own first, without branches.
        let age = |way: u64| {
            if way & 0xFF == 0 {
                u32::MAX
            } else {
                self.age(way)
            }
        };
        let free_in = |ways: &[u64]| {
            ways.iter().enumerate().fold(0u32, |mask, (i, &way)| {
                mask | u32::from(age(way) > self.window) << i
            })
        };
        let (front, back) = set.split_at(GHOST_WAYS / 2);
        let mut free = free_in(front);
        if free == 0 {
            free = free_in(back) << (GHOST_WAYS / 2);
        }
        let way = if free != 0 {
            free.trailing_zeros() as usize
        } else {
            let mut best = (0u32, 0usize);
            for (i, age) in set.iter().map(|&way| age(way)).enumerate() {
                if age > best.0 {
                    best = (age, i);
                }
            }
            best.1
        };
        let victim = start + way;
        self.ways[self.base + victim] =
            (u64::from(self.stamp) << 32) | Self::tag(fingerprint) | u64::from(uses);
        self.directory[victim] = Self::directory_byte(Self::tag(fingerprint));
    }

    /// The uses recorded for `fingerprint` (0 if none or forgotten), cleared as they
    /// are read. Inline for the common answer, a key the directory does not know;
    /// the table itself is read out of line.
    #[inline(always)]
    fn take(&mut self, fingerprint: u64) -> u8 {
        if self.ways.is_empty() {
            return 0;
        }
        let start = self.set_start(fingerprint);
        let tag = Self::tag(fingerprint);
        // The set's eight directory bytes as one word: a byte equal to the tag's makes
        // a zero byte of the xor (the classic has-a-zero-byte test, exact for whether
        // there is one).
        let bytes: [u8; GHOST_WAYS] = self.directory[start..start + GHOST_WAYS]
            .try_into()
            .unwrap_or([0; GHOST_WAYS]);
        const ONES: u64 = 0x0101_0101_0101_0101;
        let x = u64::from_le_bytes(bytes) ^ (ONES * u64::from(Self::directory_byte(tag)));
        if x.wrapping_sub(ONES) & !x & (ONES << 7) == 0 {
            return 0;
        }
        self.take_from_set(start, tag)
    }

    /// [`take`](Self::take) once the directory has a byte for `tag` in the set at
    /// `start`.
    #[inline(never)]
    fn take_from_set(&mut self, start: usize, tag: u64) -> u8 {
        // The first way holding the tag, found without branches.
        let mut hit = GHOST_WAYS;
        for i in (0..GHOST_WAYS).rev() {
            let way = self.ways[self.base + start + i];
            let matches = (way & 0xFF != 0) & (way & 0xFFFF_FF00 == tag);
            hit = if matches { i } else { hit };
        }
        if hit == GHOST_WAYS {
            return 0;
        }
        let way = std::mem::take(&mut self.ways[self.base + start + hit]);
        self.directory[start + hit] = 0;
        if self.age(way) > self.window {
            0
        } else {
            (way & 0xFF) as u8
        }
    }

    /// Asks ahead for the lines a [`record`](Self::record) of `fingerprint` writes:
    /// its set and the set's directory bytes ([`prefetch`]).
    #[inline(always)]
    fn prefetch_record(&self, fingerprint: u64) {
        if !self.directory.is_empty() {
            let start = self.set_start(fingerprint);
            prefetch(&self.ways, self.base + start);
            prefetch(&self.directory, start);
        }
    }

    /// Asks ahead for the line a [`take`](Self::take) of `fingerprint` reads first:
    /// its set's directory bytes ([`prefetch`]).
    #[inline(always)]
    fn prefetch_take(&self, fingerprint: u64) {
        if !self.directory.is_empty() {
            prefetch(&self.directory, self.set_start(fingerprint));
        }
    }

    /// Ways holding a record (live or forgotten).
    pub fn len(&self) -> usize {
        self.table().iter().filter(|&&w| w & 0xFF != 0).count()
    }

    /// True when no way holds a record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Ways in the table.
    pub fn capacity(&self) -> usize {
        self.directory.len()
    }

    /// The ways in use, without the slack.
    fn table(&self) -> &[u64] {
        &self.ways[self.base..self.base + self.capacity()]
    }

    fn clear(&mut self) {
        self.ways.fill(0);
        self.directory.fill(0);
    }

    /// Ways whose directory byte disagrees with the record they hold (the invariant
    /// walk's check; always 0).
    pub fn directory_mismatches(&self) -> usize {
        self.table()
            .iter()
            .zip(&self.directory)
            .filter(|&(&way, &byte)| {
                let expected = if way & 0xFF == 0 {
                    0
                } else {
                    Self::directory_byte(way & 0xFFFF_FF00)
                };
                byte != expected
            })
            .count()
    }
}

/// An expiry waiting in the heap: when, in which order it was queued, which block.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Expiry {
    at: f64,
    seq: u64,
    id: u32,
}

impl Eq for Expiry {}

impl Ord for Expiry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.at.total_cmp(&other.at).then(self.seq.cmp(&other.seq))
    }
}

impl PartialOrd for Expiry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// The policy's per-block state and its choice of class.
#[derive(Clone, Debug)]
pub struct Eviction {
    policy: EvictionPolicy,
    clock: Clock,
    /// Priority: each block's retention (empty under other policies).
    priorities: Vec<BlockPriority>,
    /// Priority: expiries of free blocks queued above the default priority.
    expiries: BinaryHeap<Reverse<Expiry>>,
    /// Priority: the `seq` of each block's live expiry entry (stale entries differ).
    expiry_seq: Vec<u64>,
    next_seq: u64,
    /// Adaptive: each block's use count (low 8 bits) and, while it is queued, its
    /// credit (the high 56): one word, so a block's policy state is one memory access.
    adaptive: Vec<u64>,
    /// Adaptive: the ghost fingerprint of each cached block's key, kept from when it
    /// was cached, so that an eviction can ask for its ghost lines before the key
    /// comes out of the prefix map.
    fingerprints: Vec<u64>,
    /// Adaptive: cached blocks freed so far (the policy's clock).
    tick: u64,
    /// Adaptive: band 1's credit bonus (band 0 has none).
    horizon: u64,
    ghosts: Ghosts,
}

impl Eviction {
    /// The state of `policy` for `num_blocks` blocks, on `clock`, the adaptive policy
    /// with the default horizon for the pool's size ([`default_adaptive_horizon`]).
    pub fn new(policy: EvictionPolicy, num_blocks: u32, clock: Clock) -> PoolResult<Self> {
        Self::with_horizon(
            policy,
            num_blocks,
            clock,
            default_adaptive_horizon(num_blocks),
        )
    }

    /// [`new`](Self::new) with the adaptive policy's horizon given. With a horizon of 0
    /// the policy evicts in LRU's order whatever the blocks' uses, so it keeps neither
    /// the ghost table nor the uses, credits and fingerprints (4.7 MB and 1.6 MB of a
    /// 100,000-block pool), and the queue runs it as LRU, one list
    /// ([`Self::ranks_by_use`]).
    pub fn with_horizon(
        policy: EvictionPolicy,
        num_blocks: u32,
        clock: Clock,
        horizon: u64,
    ) -> PoolResult<Self> {
        let n = num_blocks as usize;
        let side = |bytes_per_block: usize| PoolError::OutOfMemory {
            what: "the eviction policy's per-block state",
            bytes: n.saturating_mul(bytes_per_block),
        };
        let mut state = Self {
            policy,
            clock,
            priorities: Vec::new(),
            expiries: BinaryHeap::new(),
            expiry_seq: Vec::new(),
            next_seq: 0,
            adaptive: Vec::new(),
            fingerprints: Vec::new(),
            tick: 0,
            horizon,
            ghosts: Ghosts::default(),
        };
        match policy {
            EvictionPolicy::Lru => {}
            EvictionPolicy::Priority => {
                state
                    .priorities
                    .try_reserve_exact(n)
                    .map_err(|_| side(24))?;
                state.priorities.resize(n, BlockPriority::DEFAULT);
                state
                    .expiry_seq
                    .try_reserve_exact(n)
                    .map_err(|_| side(24))?;
                state.expiry_seq.resize(n, u64::MAX);
            }
            EvictionPolicy::Adaptive if !state.ranks_by_use() => {}
            EvictionPolicy::Adaptive => {
                state.adaptive.try_reserve_exact(n).map_err(|_| side(8))?;
                state.adaptive.resize(n, 0);
                state
                    .fingerprints
                    .try_reserve_exact(n)
                    .map_err(|_| side(8))?;
                state.fingerprints.resize(n, 0);
                let ways = ghost_table_ways(num_blocks, horizon);
                if ways > 0 {
                    state.ghosts = Ghosts::new(ways, ghost_window(num_blocks))?;
                }
            }
        }
        Ok(state)
    }

    /// The policy.
    #[inline]
    pub fn policy(&self) -> EvictionPolicy {
        self.policy
    }

    /// True when blocks are ranked by their uses: the adaptive policy with a horizon
    /// above 0. With a horizon of 0 its order is LRU's whatever the uses (each band's
    /// credit would be its freeing tick), so it counts no uses, keeps no ghosts and
    /// queues its blocks in one list, at LRU's cost.
    #[inline]
    pub fn ranks_by_use(&self) -> bool {
        self.policy == EvictionPolicy::Adaptive && self.horizon > 0
    }

    /// The lists the free queue keeps: the policy's classes, but one for the adaptive
    /// policy with a horizon of 0 ([`Self::ranks_by_use`]).
    #[inline]
    pub fn num_classes(&self) -> usize {
        if self.policy == EvictionPolicy::Adaptive && !self.ranks_by_use() {
            1
        } else {
            self.policy.num_classes()
        }
    }

    /// The pool's clock, in seconds.
    pub fn now(&self) -> f64 {
        self.clock.now()
    }

    /// Moves a manual clock forward by `seconds`.
    pub fn advance_clock(&mut self, seconds: f64) -> PoolResult<()> {
        match &mut self.clock {
            Clock::Manual(t) if seconds.is_finite() && seconds >= 0.0 => {
                if !(*t + seconds).is_finite() {
                    return Err(PoolError::InvalidArgument(format!(
                        "advance_clock({seconds}) would move the clock past the largest time"
                    )));
                }
                *t += seconds;
                Ok(())
            }
            Clock::Manual(_) => Err(PoolError::InvalidArgument(format!(
                "advance_clock takes a finite number of seconds >= 0, got {seconds}"
            ))),
            Clock::Monotonic(_) => Err(PoolError::InvalidArgument(
                "advance_clock needs a pool built with clock='manual'".into(),
            )),
        }
    }

    /// Whether the clock is manual.
    pub fn manual_clock(&self) -> bool {
        matches!(self.clock, Clock::Manual(_))
    }

    /// Block `id`'s retention (the default under other policies).
    pub fn priority_of(&self, id: u32) -> BlockPriority {
        self.priorities
            .get(id as usize)
            .copied()
            .unwrap_or(BlockPriority::DEFAULT)
    }

    /// Sets block `id`'s retention (priority policy only; the caller validated).
    pub fn set_priority(&mut self, id: u32, retention: BlockPriority) {
        if let Some(r) = self.priorities.get_mut(id as usize) {
            *r = retention;
        }
    }

    /// Block `id`'s use count (adaptive with a horizon above 0 only; 0 otherwise).
    pub fn uses(&self, id: u32) -> u8 {
        self.adaptive.get(id as usize).map_or(0, |&w| w as u8)
    }

    /// The band of block `id` under the adaptive policy: 1 when two or more requests
    /// used it, else 0. Constant while the block is queued (a block's uses change
    /// only while it is in use).
    #[inline]
    pub fn band(&self, id: u32) -> usize {
        self.adaptive
            .get(id as usize)
            .map_or(0, |&w| usize::from(w as u8 >= 2))
    }

    /// Block `id`'s credit while queued (adaptive only).
    #[inline]
    pub fn credit(&self, id: u32) -> u64 {
        self.adaptive.get(id as usize).map_or(0, |&w| w >> 8)
    }

    /// The ghost table (adaptive only; empty otherwise).
    pub fn ghosts(&self) -> &Ghosts {
        &self.ghosts
    }

    // ------------------------------------------------------------ events of the pool

    /// A request took a reference to block `id` (a hit, or a block shared while in use).
    #[inline]
    pub fn on_use(&mut self, id: u32) {
        if let Some(w) = self.adaptive.get_mut(id as usize) {
            if *w as u8 != u8::MAX {
                *w += 1;
            }
        }
    }

    /// Block `id` was cached under the key of fingerprint `fingerprint`.
    #[inline]
    pub fn on_cached(&mut self, id: u32, fingerprint: u64) {
        if self.ranks_by_use() {
            let before = self.ghosts.take(fingerprint);
            self.set_uses(id, before.saturating_add(1));
            self.fingerprints[id as usize] = fingerprint;
        }
    }

    #[inline]
    fn set_uses(&mut self, id: u32, uses: u8) {
        let w = &mut self.adaptive[id as usize];
        *w = (*w & !0xFF) | u64::from(uses);
    }

    /// Asks ahead for the ghost-table lines that recording the eviction of a block
    /// whose key has `fingerprint` will write (nothing unless the policy ranks by
    /// use). The pool asks for a batch of at most [`GHOST_BATCH`] evicted blocks, by
    /// their [`cached_fingerprint`](Self::cached_fingerprint)s, before it takes their
    /// keys out of the prefix map, then records the batch with
    /// [`on_evicted_many`](Self::on_evicted_many): the batch's misses overlap each
    /// other and the prefix map's.
    #[inline(always)]
    pub fn prefetch_eviction(&self, fingerprint: u64) {
        self.ghosts.prefetch_record(fingerprint);
    }

    /// Asks ahead for the ghost-table line that [`on_cached_many`](Self::on_cached_many)
    /// reads for a key of `fingerprint` (as [`prefetch_eviction`](Self::prefetch_eviction)).
    #[inline(always)]
    pub fn prefetch_caching(&self, fingerprint: u64) {
        self.ghosts.prefetch_take(fingerprint);
    }

    /// Free block `id` was given a key of fingerprint `fingerprint` where it stands
    /// (`BlockPool::set_block_key`): its uses and credit stay (its place in its band
    /// depends on them), only the fingerprint its eviction records it under changes.
    #[inline]
    pub fn on_key_set_while_free(&mut self, id: u32, fingerprint: u64) {
        if self.ranks_by_use() {
            self.fingerprints[id as usize] = fingerprint;
        }
    }

    /// The ghost fingerprint of cached block `id`'s key (the policy ranks by use).
    #[inline(always)]
    pub fn cached_fingerprint(&self, id: u32) -> u64 {
        self.fingerprints[id as usize]
    }

    /// Allocation evicted each `(block, fingerprint)`, in order: their uses go to the
    /// ghost table.
    pub fn on_evicted_many(&mut self, evicted: &[(u32, u64)]) {
        if self.ranks_by_use() {
            for &(id, fingerprint) in evicted {
                self.ghosts
                    .record(fingerprint, self.adaptive[id as usize] as u8);
            }
        }
    }

    /// [`on_cached`](Self::on_cached) for each `(block, fingerprint)`, in order.
    pub fn on_cached_many(&mut self, cached: &[(u32, u64)]) {
        if self.ranks_by_use() {
            for &(id, fingerprint) in cached {
                let before = self.ghosts.take(fingerprint);
                self.set_uses(id, before.saturating_add(1));
                self.fingerprints[id as usize] = fingerprint;
            }
        }
    }

    /// The prefix cache was cleared.
    pub fn on_reset(&mut self) {
        self.ghosts.clear();
    }

    // ------------------------------------------------------------ the queue's lists

    /// The class freed cached block `id` joins, and its per-class state set up.
    #[inline(always)]
    pub fn class_for(&mut self, id: u32) -> usize {
        match self.policy {
            EvictionPolicy::Lru => 0,
            EvictionPolicy::Priority => self.priority_class_for(id),
            EvictionPolicy::Adaptive if !self.ranks_by_use() => 0,
            EvictionPolicy::Adaptive => self.adaptive_class_for(id),
        }
    }

    /// [`class_for`](Self::class_for) under the adaptive policy (the caller knows it
    /// is): the block's band, its credit set from the clock.
    #[inline(always)]
    pub fn adaptive_class_for(&mut self, id: u32) -> usize {
        debug_assert!(self.ranks_by_use());
        self.tick += 1;
        let band = self.band(id);
        let w = &mut self.adaptive[id as usize];
        let bonus = if band == 0 { 0 } else { self.horizon };
        *w = ((self.tick + bonus) << 8) | (*w & 0xFF);
        band
    }

    /// [`class_for`](Self::class_for) under the priority policy: the block's priority
    /// in force now, its expiry queued when it is above the default for a while.
    #[inline(always)]
    fn priority_class_for(&mut self, id: u32) -> usize {
        let retention = self.priorities[id as usize];
        let now = if retention.expires_at.is_some() {
            self.clock.now()
        } else {
            0.0
        };
        let priority = retention.effective(now);
        if let (Some(at), true) = (retention.expires_at, priority != DEFAULT_PRIORITY) {
            let seq = self.next_seq;
            self.next_seq += 1;
            self.expiry_seq[id as usize] = seq;
            self.expiries.push(Reverse(Expiry { at, seq, id }));
        }
        priority as usize
    }

    /// The class whose head is evicted next (`lists` is not empty).
    #[inline]
    pub fn choose(&self, lists: &ClassLists) -> usize {
        match self.policy {
            EvictionPolicy::Lru => 0,
            EvictionPolicy::Priority => lists.lowest_nonempty().unwrap_or(0),
            EvictionPolicy::Adaptive => {
                let mut best = (u64::MAX, 0);
                for class in lists.nonempty_classes() {
                    let credit = self.adaptive[lists.ends(class).head as usize] >> 8;
                    if credit < best.0 {
                        best = (credit, class);
                    }
                }
                best.1
            }
        }
    }

    /// Free blocks whose raised priority has run out by now, in expiry order; each
    /// is checked to still be the entry's block (`is_queued_above_default`).
    pub fn due_expiries(&mut self, mut still_queued: impl FnMut(u32) -> bool) -> Vec<u32> {
        let mut due = Vec::new();
        let Some(Reverse(first)) = self.expiries.peek() else {
            return due;
        };
        let now = self.clock.now();
        if first.at > now {
            return due;
        }
        while let Some(Reverse(e)) = self.expiries.peek().copied() {
            if e.at > now {
                break;
            }
            self.expiries.pop();
            if self.expiry_seq[e.id as usize] == e.seq && still_queued(e.id) {
                self.expiry_seq[e.id as usize] = u64::MAX;
                self.priorities[e.id as usize] = BlockPriority::DEFAULT;
                due.push(e.id);
            }
        }
        due
    }

    /// Block `id` left the queue: its pending expiry entry, if any, goes stale
    /// (priority policy only; nothing to do under the others).
    #[inline(always)]
    pub fn on_dequeued(&mut self, id: u32) {
        if self.policy == EvictionPolicy::Priority {
            self.priority_dequeued(id);
        }
    }

    #[inline(always)]
    fn priority_dequeued(&mut self, id: u32) {
        if let Some(seq) = self.expiry_seq.get_mut(id as usize) {
            *seq = u64::MAX;
        }
        // Stale entries are dropped as they come due; a heap much larger than the
        // pool is rebuilt from its live entries.
        if self.expiries.len() > 2 * self.expiry_seq.len() + 64 {
            let live: Vec<_> = self
                .expiries
                .drain()
                .filter(|Reverse(e)| self.expiry_seq[e.id as usize] == e.seq)
                .collect();
            self.expiries = live.into();
        }
    }

    /// Pending expiry entries (live and stale), for the invariant walk.
    pub fn num_expiry_entries(&self) -> usize {
        self.expiries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_horizon_fades_out_between_one_and_a_quarter_and_one_and_a_half_horizons() {
        let at = |blocks: u32| default_adaptive_horizon(blocks);
        assert_eq!(at(1), ADAPTIVE_HORIZON);
        assert_eq!(at(25_000), ADAPTIVE_HORIZON);
        assert_eq!(at(25_001), 19_996);
        assert_eq!(at(27_500), ADAPTIVE_HORIZON / 2);
        assert_eq!(at(29_999), 4);
        assert_eq!(at(30_000), 0);
        assert_eq!(at(u32::MAX), 0);
        // Never rising with the pool's size, and what a pool built without a horizon uses.
        let sizes = [
            1u32, 24_999, 25_000, 25_001, 26_000, 29_000, 29_999, 30_000, 40_000,
        ];
        assert!(sizes.windows(2).all(|w| at(w[0]) >= at(w[1])));
        for blocks in sizes {
            let config = super::super::PoolConfig::new(blocks);
            assert_eq!(config.horizon(), at(blocks));
            let given = super::super::PoolConfig {
                adaptive_horizon: Some(7),
                ..config
            };
            assert_eq!(given.horizon(), 7);
        }
    }

    #[test]
    fn a_horizon_of_zero_keeps_no_ghost_table() {
        let at = |blocks: u32, horizon: u64| {
            Eviction::with_horizon(
                EvictionPolicy::Adaptive,
                blocks,
                Clock::Manual(0.0),
                horizon,
            )
            .unwrap()
            .ghosts()
            .capacity()
        };
        assert_eq!(at(1_000, 0), 0);
        assert!(at(1_000, 1) >= ghost_slots(1_000));
        let default = |blocks: u32| {
            Eviction::new(EvictionPolicy::Adaptive, blocks, Clock::Manual(0.0))
                .unwrap()
                .ghosts()
                .capacity()
        };
        assert!(default(29_999) >= ghost_slots(29_999));
        assert_eq!(default(30_000), 0);
    }

    #[test]
    fn a_horizon_of_zero_runs_as_lru() {
        let build = |horizon: u64| {
            Eviction::with_horizon(EvictionPolicy::Adaptive, 100, Clock::Manual(0.0), horizon)
                .unwrap()
        };
        let mut lru_like = build(0);
        assert!(!lru_like.ranks_by_use());
        assert_eq!(lru_like.num_classes(), 1);
        // Uses are not counted, nothing is recorded, every block joins the one list.
        lru_like.on_cached(7, 12345);
        lru_like.on_use(7);
        lru_like.on_evicted_many(&[(7, 12345)]);
        assert_eq!(lru_like.uses(7), 0);
        assert_eq!(lru_like.class_for(7), 0);
        let mut ranked = build(1);
        assert!(ranked.ranks_by_use());
        assert_eq!(ranked.num_classes(), ADAPTIVE_BANDS);
        ranked.on_cached(7, 12345);
        ranked.on_use(7);
        assert_eq!(ranked.uses(7), 2);
        assert_eq!(ranked.class_for(7), 1);
    }

    #[test]
    fn names_round_trip() {
        for p in EvictionPolicy::ALL {
            assert_eq!(EvictionPolicy::from_name(p.name()).unwrap(), p);
        }
        assert!(EvictionPolicy::from_name("lfu").is_err());
    }

    #[test]
    fn retention_reverts_after_its_duration() {
        let r = BlockPriority::new(90, Some(10.0), 5.0).unwrap();
        assert_eq!(r.effective(14.9), 90);
        assert_eq!(r.effective(15.0), DEFAULT_PRIORITY);
        assert!(BlockPriority::new(101, None, 0.0).is_err());
        assert!(BlockPriority::new(50, Some(0.0), 0.0).is_err());
        assert!(BlockPriority::new(50, Some(f64::NAN), 0.0).is_err());
    }

    #[test]
    fn ghosts_read_once_replace_the_oldest_and_forget_by_age() {
        let fp = |set: u64, tag: u64| (tag << 40) | set;
        let mut g = Ghosts::new(16, 100).unwrap(); // two sets of eight ways
        for i in 0..8 {
            g.record(fp(0, i + 1), i as u8 + 1);
        }
        assert_eq!(g.take(fp(0, 1)), 1);
        assert_eq!(g.take(fp(0, 1)), 0, "read once");
        g.record(fp(0, 20), 9); // the way tag 1 left
        g.record(fp(0, 21), 7); // set 0 full: replaces the oldest, tag 2
        assert_eq!(g.take(fp(0, 2)), 0);
        assert_eq!(
            (g.take(fp(0, 3)), g.take(fp(0, 20)), g.take(fp(0, 21))),
            (3, 9, 7)
        );
        let mut old = Ghosts::new(8, 2).unwrap();
        old.record(fp(0, 1), 5);
        old.record(fp(0, 2), 5);
        old.record(fp(0, 3), 5);
        assert_eq!(old.take(fp(0, 2)), 5, "one eviction ago");
        old.record(fp(0, 4), 5);
        old.record(fp(0, 5), 5);
        assert_eq!(old.take(fp(0, 1)), 0, "four evictions ago: forgotten");
        assert_eq!(
            (g.directory_mismatches(), old.directory_mismatches()),
            (0, 0)
        );
    }

    /// The way `record` replaces, as the rule states it: the first way that is empty
    /// or older than the window, else the oldest (the first on a tie).
    fn victim_by_the_rule(g: &Ghosts, set: &[u64]) -> usize {
        let free = |&way: &u64| way & 0xFF == 0 || g.age(way) > g.window;
        match set.iter().position(free) {
            Some(i) => i,
            None => {
                let oldest = set.iter().map(|&w| g.age(w)).max().unwrap_or(0);
                set.iter().position(|&w| g.age(w) == oldest).unwrap_or(0)
            }
        }
    }

    proptest::proptest! {
        /// Whatever a set holds (empty ways, live and forgotten records, stamps about
        /// to wrap), `record` writes the way the rule names and no other.
        #[test]
        fn record_replaces_the_way_the_rule_names(
            ways in proptest::collection::vec((0u32..12, 0u8..3), GHOST_WAYS),
            stamp in proptest::prop_oneof![0u32..40, (u32::MAX - 20)..=u32::MAX],
            window in 1u32..10,
        ) {
            let mut g = Ghosts::new(GHOST_WAYS, window).unwrap();
            g.stamp = stamp;
            // Way i written `back` evictions before the record's own stamp, with
            // `uses` (0: empty).
            for (i, &(back, uses)) in ways.iter().enumerate() {
                let written = stamp.wrapping_add(1).wrapping_sub(back);
                g.ways[g.base + i] = if uses == 0 {
                    0
                } else {
                    (u64::from(written) << 32) | ((i as u64 + 1) << 8) | u64::from(uses)
                };
            }
            let before: Vec<u64> = g.table().to_vec();
            let mut expected = g.clone();
            expected.stamp = stamp.wrapping_add(1);
            let victim = victim_by_the_rule(&expected, &before);
            g.record(0x00AB_CD00_0000_0000, 2);
            for (i, (&now, &was)) in g.table().iter().zip(&before).enumerate() {
                if i == victim {
                    proptest::prop_assert_eq!(now & 0xFF, 2);
                    proptest::prop_assert_eq!((now >> 32) as u32, stamp.wrapping_add(1));
                } else {
                    proptest::prop_assert_eq!(now, was);
                }
            }
        }
    }

    #[test]
    fn the_directory_only_skips_keys_without_a_record() {
        let fp = |set: u64, tag: u64| (tag << 40) | set;
        let mut g = Ghosts::new(64, 1_000).unwrap(); // eight sets
                                                     // Tags 0x101 and 0x201 share their directory byte: the second is no record,
                                                     // which the table, not the directory, decides.
        g.record(fp(3, 0x101), 4);
        assert_eq!(g.take(fp(3, 0x201)), 0);
        assert_eq!(g.take(fp(4, 0x101)), 0, "another set");
        assert_eq!(g.take(fp(3, 0x101)), 4);
        for i in 0..200u64 {
            g.record(fp(i % 8, i * 7 + 1), (i % 9) as u8);
            if i % 3 == 0 {
                g.take(fp((i / 2) % 8, (i / 2) * 7 + 1));
            }
            assert_eq!(g.directory_mismatches(), 0);
        }
        g.clear();
        assert_eq!((g.len(), g.directory_mismatches()), (0, 0));
        // Each set on one cache line.
        assert_eq!(g.table().as_ptr() as usize % 64, 0);
        assert_eq!(g.table().len(), g.capacity());
    }
}
