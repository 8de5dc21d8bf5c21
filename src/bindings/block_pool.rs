//! `kvpool.BlockPool`: the Python face of [`crate::pool::BlockPool`].
//!
//! Each method converts its arguments (all of them, before touching the pool),
//! takes the lock once, calls the core, and converts the result. Block ids leave as
//! numpy `int32` arrays; no Python object is created per block.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

use super::convert::{
    borrow_block_ids, extract_block_ids, extract_hashes, extract_i64s, ids_to_numpy, int_arg,
    opt_bool_arg, opt_int_arg, opt_str_arg, type_name, with_scratch,
};
use super::errors::{error, ErrorKind, IntoPyResult};
use super::events::events_to_py;
use super::eviction_args::{seconds_arg, PolicyArgs, PriorityArg};
use super::hashing::hash_slice_of;
use super::locking::{try_with_lock, with_lock};
use super::recycled_ids::RecycledIds;
use crate::pool::{self, CacheBlocks, HashSlice, PoolConfig, MAX_BLOCKS};

/// Block ids of several requests back to back, and where each request's start.
pub(super) type IdsAndOffsets<'py> = (Bound<'py, PyArray1<i32>>, Bound<'py, PyArray1<i64>>);

/// A pool of KV-cache blocks: free queue, reference counts and prefix cache.
///
/// Semantics follow vLLM's v1 ``BlockPool``; block ids are numpy ``int32`` arrays.
#[pyclass(frozen, module = "kvpool", name = "BlockPool")]
pub struct PyBlockPool {
    inner: Mutex<pool::BlockPool>,
    /// The pool's configuration, which never changes: read without taking the lock.
    pub(super) config: PoolConfig,
    /// `get_new_blocks`' recent result arrays, written again once their caller lets go.
    recycled: RecycledIds,
    /// The free queue's version (`pool::BlockPool::free_queue_version`) as of the last
    /// call that held the lock, for readers that must not take it (`FreeBlockWalk`
    /// checks it on every step).
    queue_version: AtomicU64,
}

/// `obj` as a `kvpool.BlockPool`, or a `DtypeError` naming what it is.
pub(super) fn pool_arg<'a, 'py>(
    obj: &'a Bound<'py, PyAny>,
) -> PyResult<&'a Bound<'py, PyBlockPool>> {
    super::convert::typed_arg(obj, "pool", "a kvpool.BlockPool")
}

impl PyBlockPool {
    /// Runs `f` on the core pool under its lock (`locking.rs`); `f` returns plain data.
    #[inline]
    pub(crate) fn with_pool<R>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut pool::BlockPool) -> R,
    ) -> R {
        with_lock(py, &self.inner, |pool| self.noting_queue_version(pool, f))
    }

    /// `f(pool)`, then the queue's version mirrored for [`Self::queue_version`]: every
    /// path that holds the pool's lock goes through here.
    #[inline]
    fn noting_queue_version<R>(
        &self,
        pool: &mut pool::BlockPool,
        f: impl FnOnce(&mut pool::BlockPool) -> R,
    ) -> R {
        let result = f(pool);
        self.queue_version
            .store(pool.free_queue_version(), Ordering::Release);
        result
    }

    /// The free queue's version as of the last call that held the pool's lock (every
    /// call that can change the queue does), read without taking it.
    pub(crate) fn queue_version(&self) -> u64 {
        self.queue_version.load(Ordering::Acquire)
    }

    /// Runs `f` on the pool if its lock is free now, the GIL held throughout (see
    /// [`try_with_lock`]); true if it ran and succeeded. For ids lent in place by a numpy
    /// array: on false the caller takes its general path, which finds the pool as it
    /// was (a failed call changes nothing) and reports any error.
    fn done_in_place(&self, f: impl FnOnce(&mut pool::BlockPool) -> pool::PoolResult<()>) -> bool {
        let in_place = |pool: &mut pool::BlockPool| self.noting_queue_version(pool, f);
        matches!(try_with_lock(&self.inner, in_place), Some(Ok(())))
    }

    /// `find_longest_cache_hit` with the hit's ids appended to `out`.
    pub(crate) fn longest_cache_hit_into(
        &self,
        py: Python<'_>,
        block_hashes: &Bound<'_, PyAny>,
        group: u32,
        max_blocks: Option<usize>,
        out: &mut Vec<u32>,
    ) -> PyResult<()> {
        let hashes = FlatHashes::extract(block_hashes)?;
        self.with_pool(py, |pool| {
            pool.find_longest_cache_hit(hashes.slice(), group, max_blocks, out)
        })
        .py_err(py)
        .map(drop)
    }

    /// `obj`'s block ids (numpy array or sequence), each checked against the pool.
    pub(super) fn ids(&self, obj: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
        let mut ids = Vec::new();
        extract_block_ids(obj, self.config.num_blocks, &mut ids)?;
        Ok(ids)
    }
}

/// Hashes given from Python, flattened; empty when none.
pub struct FlatHashes {
    bytes: Vec<u8>,
    width: usize,
}

impl FlatHashes {
    /// Reads a `BlockHashList`, a sequence of `bytes` or a numpy integer array.
    pub fn extract(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        let mut bytes = Vec::new();
        let width = extract_hashes(obj, &mut bytes)?;
        Ok(Self { bytes, width })
    }

    /// The core's view of them.
    pub fn slice(&self) -> HashSlice<'_> {
        hash_slice_of(&self.bytes, self.width)
    }
}

/// The ``max_pending_events`` argument: at least 1, default
/// [`pool::DEFAULT_MAX_PENDING_EVENTS`].
pub fn max_pending_events_arg(obj: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
    Ok(opt_int_arg(obj, "max_pending_events", 1, i64::MAX)?
        .map_or(pool::DEFAULT_MAX_PENDING_EVENTS, |n| n as usize))
}

#[pymethods]
impl PyBlockPool {
    #[new]
    #[pyo3(signature = (num_blocks, *, enable_caching=None, null_block=None, enable_events=None, block_size=None, hash_width=None, max_pending_events=None, eviction=None, max_pinned_blocks=None, clock=None, adaptive_horizon=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        num_blocks: &Bound<'_, PyAny>,
        enable_caching: Option<&Bound<'_, PyAny>>,
        null_block: Option<&Bound<'_, PyAny>>,
        enable_events: Option<&Bound<'_, PyAny>>,
        block_size: Option<&Bound<'_, PyAny>>,
        hash_width: Option<&Bound<'_, PyAny>>,
        max_pending_events: Option<&Bound<'_, PyAny>>,
        eviction: Option<&Bound<'_, PyAny>>,
        max_pinned_blocks: Option<&Bound<'_, PyAny>>,
        clock: Option<&Bound<'_, PyAny>>,
        adaptive_horizon: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let flag = |obj: Option<&Bound<'_, PyAny>>, what: &str, default: bool| {
            opt_bool_arg(obj, what, default)
        };
        let num_blocks = int_arg(num_blocks, "num_blocks", 1, MAX_BLOCKS as i64)? as u32;
        let policy = PolicyArgs::extract(py, num_blocks, eviction, max_pinned_blocks, clock)?
            .with_horizon(py, adaptive_horizon)?;
        let config = PoolConfig {
            num_blocks,
            enable_caching: flag(enable_caching, "enable_caching", true)?,
            null_block: flag(null_block, "null_block", true)?,
            enable_events: flag(enable_events, "enable_events", false)?,
            block_size: opt_int_arg(block_size, "block_size", 1, u32::MAX as i64)?.unwrap_or(16)
                as u32,
            hash_width: opt_int_arg(hash_width, "hash_width", 1, pool::MAX_HASH_WIDTH as i64)?
                .map(|w| w as usize),
            max_pending_events: max_pending_events_arg(max_pending_events)?,
            eviction: policy.eviction,
            adaptive_horizon: policy.adaptive_horizon,
            manual_clock: policy.manual_clock,
            max_pinned_blocks: policy.max_pinned_blocks.unwrap_or(num_blocks / 4),
        };
        let inner = pool::BlockPool::new(config.clone()).py_err(py)?;
        Ok(Self {
            queue_version: AtomicU64::new(inner.free_queue_version()),
            inner: Mutex::new(inner),
            config,
            recycled: RecycledIds::default(),
        })
    }

    /// Number of blocks (ids ``0..num_blocks``).
    #[getter]
    fn num_blocks(&self) -> u32 {
        self.config.num_blocks
    }

    /// Tokens per block.
    #[getter]
    fn block_size(&self) -> u32 {
        self.config.block_size
    }

    /// Whether full blocks are kept in a prefix cache.
    #[getter]
    fn enable_caching(&self) -> bool {
        self.config.enable_caching
    }

    /// Whether KV-cache events are queued.
    #[getter]
    fn enable_events(&self) -> bool {
        self.config.enable_events
    }

    /// The null block's id (0), or None when the pool has none.
    #[getter]
    fn null_block(&self) -> Option<u32> {
        self.config.null_block.then_some(0)
    }

    /// Width of the pool's block hashes in bytes, None until the first cached hash fixes it.
    #[getter]
    fn hash_width(&self, py: Python<'_>) -> Option<usize> {
        self.with_pool(py, |pool| pool.hash_width())
    }

    /// Allocate ``num_blocks`` blocks from the head of the free queue.
    ///
    /// Cached blocks among them are evicted from the prefix cache first. Raises
    /// ``NoFreeBlocksError`` (nothing allocated) when fewer are free. The result may be
    /// an array this pool returned before that nothing references any more, written
    /// again (a held array, or one with a view, buffer or weak reference, never is).
    fn get_new_blocks<'py>(
        &self,
        py: Python<'py>,
        num_blocks: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let n = int_arg(num_blocks, "num_blocks", 0, i64::MAX)? as usize;
        with_scratch(|out| {
            self.with_pool(py, |pool| pool.get_new_blocks(n, out))
                .py_err(py)?;
            Ok(self.recycled.to_numpy(py, out))
        })
    }

    /// Allocate for several requests in one call: ``counts[i]`` blocks for request ``i``.
    ///
    /// Returns ``(ids, offsets)``: request ``i``'s blocks are ``ids[offsets[i]:offsets[i+1]]``.
    /// All or nothing: raises ``NoFreeBlocksError`` if the total does not fit.
    fn get_new_blocks_many<'py>(
        &self,
        py: Python<'py>,
        counts: &Bound<'py, PyAny>,
    ) -> PyResult<IdsAndOffsets<'py>> {
        let mut raw = Vec::new();
        extract_i64s(counts, "counts", &mut raw)?;
        let mut wanted = Vec::with_capacity(raw.len());
        for c in raw {
            if c < 0 {
                return Err(error(
                    py,
                    ErrorKind::InvalidArgument,
                    format!("counts must be >= 0, got {c}"),
                ));
            }
            wanted.push(c as usize);
        }
        let mut out = Vec::new();
        let mut offsets = Vec::new();
        self.with_pool(py, |pool| {
            pool.get_new_blocks_many(&wanted, &mut out, &mut offsets)
        })
        .py_err(py)?;
        let offsets = PyArray1::from_iter(py, offsets.into_iter().map(|o| o as i64));
        Ok((ids_to_numpy(py, &out), offsets))
    }

    /// Drop one reference to each block, in the order given (pass a request's blocks
    /// tail first), or from the last to the first with ``reverse=True`` (pass them in
    /// table order). Blocks reaching 0 rejoin the free queue: uncached ones at the head,
    /// cached ones at the tail. Raises ``DoubleFreeError`` (nothing freed) if a count
    /// would go below 0.
    #[pyo3(signature = (block_ids, *, reverse=None))]
    fn free_blocks(
        &self,
        py: Python<'_>,
        block_ids: &Bound<'_, PyAny>,
        reverse: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let reverse = opt_bool_arg(reverse, "reverse", false)?;
        // The common case, an int32 array as handed out (or its reversed view), freed
        // from its own memory.
        if let Some(lent) = borrow_block_ids(block_ids) {
            let freed = self.done_in_place(|pool| {
                if reverse != lent.reversed {
                    pool.free_blocks_reversed(lent.ids)
                } else {
                    pool.free_blocks(lent.ids)
                }
            });
            if freed {
                return Ok(());
            }
        }
        with_scratch(|ids| {
            extract_block_ids(block_ids, self.config.num_blocks, ids)?;
            self.with_pool(py, |pool| {
                if reverse {
                    pool.free_blocks_reversed(ids)
                } else {
                    pool.free_blocks(ids)
                }
            })
            .py_err(py)
        })
    }

    /// Free several requests' blocks in one call, all or nothing.
    ///
    /// ``blocks`` is a sequence of id arrays, or one flat id array cut by ``offsets``
    /// (as returned by ``get_new_blocks_many``). Each segment is freed in turn, reversed
    /// first when ``reverse`` is true.
    #[pyo3(signature = (blocks, offsets=None, *, reverse=None))]
    fn free_blocks_many(
        &self,
        py: Python<'_>,
        blocks: &Bound<'_, PyAny>,
        offsets: Option<&Bound<'_, PyAny>>,
        reverse: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let reverse = opt_bool_arg(reverse, "reverse", false)?;
        let mut flat = Vec::new();
        let mut cuts = vec![0usize];
        match offsets {
            Some(offsets) if !offsets.is_none() => {
                // Ranges are checked by the core, after the offsets (the reference's order).
                extract_block_ids(blocks, u32::MAX, &mut flat)?;
                let mut raw = Vec::new();
                extract_i64s(offsets, "offsets", &mut raw)?;
                cuts = raw
                    .into_iter()
                    .map(|o| usize::try_from(o).unwrap_or(usize::MAX))
                    .collect();
            }
            _ => {
                let iter = blocks.try_iter().map_err(|_| {
                    error(
                        py,
                        ErrorKind::Dtype,
                        format!(
                            "blocks must be a sequence of id arrays, got {}",
                            type_name(blocks)
                        ),
                    )
                })?;
                for segment in iter {
                    extract_block_ids(&segment?, self.config.num_blocks, &mut flat)?;
                    cuts.push(flat.len());
                }
            }
        }
        self.with_pool(py, |pool| pool.free_blocks_many(&flat, &cuts, reverse))
            .py_err(py)
    }

    /// Take a reference to each block (reusing prefix-cache hits): free ones leave the
    /// free queue. The null block is skipped.
    fn touch(&self, py: Python<'_>, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = self.ids(block_ids)?;
        self.with_pool(py, |pool| pool.touch(&ids)).py_err(py)
    }

    /// Enter a request's newly full blocks into the prefix cache.
    ///
    /// ``block_ids`` and ``block_hashes`` are the request's blocks and hashes from its
    /// first block (``bytes`` of one width, or a numpy integer array of hash ids, each
    /// standing for its 8-byte big-endian form); blocks ``num_cached_blocks..num_full_blocks`` get their hashes.
    /// ``token_ids`` (the request's tokens), ``lora_id`` and ``lora_name`` only feed the
    /// ``BlockStored`` event. ``priority`` (``0..=100``) and ``retention_s`` give the
    /// new blocks a retention priority, for that many seconds (pools built with
    /// ``eviction="priority"``).
    #[pyo3(signature = (block_ids, block_hashes, num_cached_blocks, num_full_blocks, *, group_id=None, token_ids=None, lora_id=None, lora_name=None, priority=None, retention_s=None))]
    #[allow(clippy::too_many_arguments)]
    fn cache_full_blocks(
        &self,
        py: Python<'_>,
        block_ids: &Bound<'_, PyAny>,
        block_hashes: &Bound<'_, PyAny>,
        num_cached_blocks: &Bound<'_, PyAny>,
        num_full_blocks: &Bound<'_, PyAny>,
        group_id: Option<&Bound<'_, PyAny>>,
        token_ids: Option<&Bound<'_, PyAny>>,
        lora_id: Option<&Bound<'_, PyAny>>,
        lora_name: Option<&Bound<'_, PyAny>>,
        priority: Option<&Bound<'_, PyAny>>,
        retention_s: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let lora_name = opt_str_arg(lora_name, "lora_name")?;
        if !self.config.enable_caching {
            return Err(error(
                py,
                ErrorKind::CachingDisabled,
                pool::PoolError::CachingDisabled.to_string(),
            ));
        }
        let num_cached = int_arg(num_cached_blocks, "num_cached_blocks", 0, i64::MAX)? as usize;
        let num_full = int_arg(num_full_blocks, "num_full_blocks", 0, i64::MAX)? as usize;
        let group = opt_int_arg(group_id, "group_id", 0, u32::MAX as i64)?.unwrap_or(0) as u32;
        let lora_id = opt_int_arg(lora_id, "lora_id", i64::MIN, i64::MAX)?;
        // The ids as handed out (a contiguous int32 array) are read in place, as in
        // `free_blocks`; any other ids are converted first, so that their errors come
        // before the hashes' (range errors come from the core, after the count arguments:
        // the documented order). The in-place borrow is taken only after the other
        // arguments are converted: their conversion can run Python code, which could
        // resize the array under a borrow taken earlier.
        let lend = |ids| borrow_block_ids(ids).filter(|lent| !lent.reversed);
        let mut ids = Vec::new();
        let in_place = lend(block_ids).is_some();
        if !in_place {
            extract_block_ids(block_ids, u32::MAX, &mut ids)?;
        }
        let hashes = FlatHashes::extract(block_hashes)?;
        let tokens = match token_ids {
            Some(t) if !t.is_none() => {
                let mut v = Vec::new();
                extract_i64s(t, "token_ids", &mut v)?;
                Some(v)
            }
            _ => None,
        };
        let priority = PriorityArg::extract(py, priority, retention_s)?;
        let cache = |pool: &mut pool::BlockPool, ids: &[u32]| {
            pool.cache_full_blocks(CacheBlocks {
                block_ids: ids,
                block_hashes: hashes.slice(),
                num_cached_blocks: num_cached,
                num_full_blocks: num_full,
                group,
                token_ids: tokens.as_deref(),
                lora_id,
                lora_name: lora_name.as_deref(),
                block_mask: None,
                priority: priority.map(|p| p.at(pool.now())),
                extra_keys: None,
                block_size: None,
            })
        };
        if in_place {
            // Lendable when checked above, unless a conversion since changed the array.
            if let Some(lent) = lend(block_ids) {
                if self.done_in_place(|pool| cache(pool, lent.ids)) {
                    return Ok(());
                }
            }
            extract_block_ids(block_ids, u32::MAX, &mut ids)?;
        }
        self.with_pool(py, |pool| cache(pool, &ids)).py_err(py)
    }

    /// Give blocks (in use or free) a retention priority ``0..=100``, for
    /// ``retention_s`` seconds if given, after which it reverts to the default (35).
    /// A free cached block moves to the tail of its new priority. Needs
    /// ``eviction="priority"``.
    #[pyo3(signature = (block_ids, priority, *, retention_s=None))]
    fn set_priority(
        &self,
        py: Python<'_>,
        block_ids: &Bound<'_, PyAny>,
        priority: &Bound<'_, PyAny>,
        retention_s: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let ids = self.ids(block_ids)?;
        let priority = PriorityArg::extract(py, Some(priority), retention_s)?.ok_or_else(|| {
            error(
                py,
                ErrorKind::InvalidArgument,
                "priority must be an int in 0..=100, got None",
            )
        })?;
        self.with_pool(py, |pool| {
            let p = priority.at(pool.now());
            pool.set_priority(&ids, p, false)
        })
        .py_err(py)
    }

    /// Block ``block_id``'s retention ``(priority, expires_at)`` in force now
    /// (``expires_at`` on the pool's clock, None: never); ``(35, None)`` once a
    /// duration ran out, and under other policies.
    fn block_priority(
        &self,
        py: Python<'_>,
        block_id: &Bound<'_, PyAny>,
    ) -> PyResult<(u8, Option<f64>)> {
        let id = self.one_id(block_id)?;
        Ok(self.with_pool(py, |pool| {
            let p = pool.eviction().priority_of(id);
            match p.expires_at {
                Some(t) if t <= pool.now() => (pool::DEFAULT_PRIORITY, None),
                expires_at => (p.priority, expires_at),
            }
        }))
    }

    /// Pin the cached blocks of the longest cached prefix of ``block_hashes`` (in
    /// ``group_id``): they hold a reference each and are never evicted until
    /// unpinned. Returns that prefix's length in blocks. Raises ``PinBudgetError``
    /// (nothing pinned) beyond ``max_pinned_blocks``.
    #[pyo3(signature = (block_hashes, *, group_id=None))]
    fn pin_prefix(
        &self,
        py: Python<'_>,
        block_hashes: &Bound<'_, PyAny>,
        group_id: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        let chain = ChainArg::extract(block_hashes, group_id)?;
        self.with_pool(py, |pool| pool.pin_prefix(chain.hashes(), chain.group))
            .py_err(py)
    }

    /// Unpin the pinned blocks of the longest cached prefix of ``block_hashes``,
    /// freeing the pin's reference (tail first); returns how many were unpinned.
    #[pyo3(signature = (block_hashes, *, group_id=None))]
    fn unpin_prefix(
        &self,
        py: Python<'_>,
        block_hashes: &Bound<'_, PyAny>,
        group_id: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        let chain = ChainArg::extract(block_hashes, group_id)?;
        self.with_pool(py, |pool| pool.unpin_prefix(chain.hashes(), chain.group))
            .py_err(py)
    }

    /// Unpin every pinned block; returns how many there were.
    fn unpin_all(&self, py: Python<'_>) -> usize {
        self.with_pool(py, |pool| pool.unpin_all())
    }

    /// Number of pinned blocks.
    fn get_num_pinned_blocks(&self, py: Python<'_>) -> usize {
        self.with_pool(py, |pool| pool.num_pinned_blocks())
    }

    /// The pinned blocks' ids, ascending.
    fn pinned_block_ids<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i32>> {
        let ids = self.with_pool(py, |pool| pool.pinned_blocks());
        ids_to_numpy(py, &ids)
    }

    /// Most blocks that may be pinned at once.
    #[getter]
    fn max_pinned_blocks(&self) -> u32 {
        self.config.max_pinned_blocks
    }

    /// The eviction policy: ``"lru"``, ``"priority"`` or ``"adaptive"``.
    #[getter]
    fn eviction(&self) -> &'static str {
        self.config.eviction.name()
    }

    /// The adaptive policy's horizon in blocks freed (``adaptive_horizon=``; by default
    /// 20,000 in pools up to 25,000 blocks, fading to 0 at 30,000): how much later than
    /// it was a block two or more requests used counts as freed. Unused by the other
    /// policies.
    #[getter]
    fn adaptive_horizon(&self) -> u64 {
        self.config.horizon()
    }

    /// The clock retention durations run on: ``"monotonic"`` or ``"manual"``.
    #[getter]
    fn clock(&self) -> &'static str {
        if self.config.manual_clock {
            "manual"
        } else {
            "monotonic"
        }
    }

    /// The pool's clock in seconds (since the pool was built, or as advanced).
    #[getter]
    fn now(&self, py: Python<'_>) -> f64 {
        self.with_pool(py, |pool| pool.now())
    }

    /// Move a ``clock="manual"`` pool's clock forward by ``seconds`` (>= 0).
    fn advance_clock(&self, py: Python<'_>, seconds: &Bound<'_, PyAny>) -> PyResult<()> {
        let seconds = seconds_arg(seconds, "seconds")?;
        self.with_pool(py, |pool| pool.advance_clock(seconds))
            .py_err(py)
    }

    /// Cached blocks evicted to make room for allocations, since the pool was built.
    #[getter]
    fn num_evictions(&self, py: Python<'_>) -> u64 {
        self.with_pool(py, |pool| pool.num_evictions())
    }

    /// The block cached under ``block_hash`` in ``group_id`` (the first one inserted), or None.
    ///
    /// An int hash stands for its 8-byte big-endian form.
    #[pyo3(signature = (block_hash, group_id=None))]
    fn get_cached_block(
        &self,
        py: Python<'_>,
        block_hash: &Bound<'_, PyAny>,
        group_id: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<u32>> {
        let group = opt_int_arg(group_id, "group_id", 0, u32::MAX as i64)?.unwrap_or(0) as u32;
        if let Ok(hash) = block_hash.cast::<PyBytes>() {
            let hash = hash.as_bytes();
            return self
                .with_pool(py, |pool| pool.get_cached_block(hash, group))
                .py_err(py);
        }
        match block_hash.extract::<u64>() {
            Ok(id) if !super::convert::is_bool_like(block_hash) => self
                .with_pool(py, |pool| pool.get_cached_block(&id.to_be_bytes(), group))
                .py_err(py),
            _ => Err(error(
                py,
                ErrorKind::Dtype,
                format!(
                    "block_hash must be bytes or a non-negative int, got {}",
                    type_name(block_hash)
                ),
            )),
        }
    }

    /// The cached blocks of the longest cached prefix of ``block_hashes`` (at most
    /// ``max_blocks``); the scan stops at the first miss. Changes nothing.
    #[pyo3(signature = (block_hashes, *, group_id=None, max_blocks=None))]
    fn find_longest_cache_hit<'py>(
        &self,
        py: Python<'py>,
        block_hashes: &Bound<'py, PyAny>,
        group_id: Option<&Bound<'py, PyAny>>,
        max_blocks: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let group = opt_int_arg(group_id, "group_id", 0, u32::MAX as i64)?.unwrap_or(0) as u32;
        let max_blocks = opt_int_arg(max_blocks, "max_blocks", 0, i64::MAX)?.map(|m| m as usize);
        let mut out = Vec::new();
        self.longest_cache_hit_into(py, block_hashes, group, max_blocks, &mut out)?;
        Ok(ids_to_numpy(py, &out))
    }

    /// Give block ``block_id`` the key ``(block_hash, group_id)``, or take its key away
    /// (``block_hash=None``), where it is: no event, no move in the free queue;
    /// ``num_tokens`` is what ``block_hash_num_tokens`` then reads (None: unknown). With
    /// ``requeue=True`` a free block without a key is instead taken from the free queue,
    /// keyed and freed again (to the queue's tail), all checks first. For
    /// ``kvpool.vllm``'s view of vLLM's ``cached_block_hash_to_block`` dict, which vLLM's
    /// tests edit; not for engines.
    #[pyo3(signature = (block_id, block_hash, group_id=None, *, requeue=false, num_tokens=None))]
    fn _set_block_hash(
        &self,
        py: Python<'_>,
        block_id: &Bound<'_, PyAny>,
        block_hash: Option<&Bound<'_, PyAny>>,
        group_id: Option<&Bound<'_, PyAny>>,
        requeue: bool,
        num_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let id = self.one_id(block_id)?;
        let group = opt_int_arg(group_id, "group_id", 0, u32::MAX as i64)?.unwrap_or(0) as u32;
        let tokens = opt_int_arg(num_tokens, "num_tokens", 1, u32::MAX as i64)?.unwrap_or(0) as u32;
        let key = match block_hash.filter(|h| !h.is_none()) {
            None => None,
            Some(h) => {
                let bytes = h.cast::<PyBytes>().map_err(|_| {
                    error(
                        py,
                        ErrorKind::Dtype,
                        format!("block_hash must be bytes, got {}", type_name(h)),
                    )
                })?;
                let hash = pool::BlockHash::new(bytes.as_bytes()).py_err(py)?;
                Some(pool::BlockHashKey::new(hash, group))
            }
        };
        self.with_pool(py, |pool| match key {
            Some(key) if requeue => pool.insert_block_key(id, key, tokens),
            key => pool.set_block_key(id, key, tokens),
        })
        .py_err(py)
    }

    /// Drop the cached hash of each block, in use or not; frees nothing.
    fn evict_blocks(&self, py: Python<'_>, block_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = self.ids(block_ids)?;
        self.with_pool(py, |pool| pool.evict_blocks(&ids))
            .py_err(py)
    }

    /// Clear the whole prefix cache. Refused (returns False, nothing changes) while any
    /// block is in use.
    fn reset_prefix_cache(&self, py: Python<'_>) -> bool {
        self.with_pool(py, |pool| pool.reset_prefix_cache())
    }

    /// Number of blocks in the free queue.
    fn get_num_free_blocks(&self, py: Python<'_>) -> usize {
        self.with_pool(py, |pool| pool.num_free_blocks())
    }

    /// Number of blocks holding a cached hash.
    fn get_num_cached_blocks(&self, py: Python<'_>) -> usize {
        self.with_pool(py, |pool| pool.num_cached_blocks())
    }

    /// Number of distinct keys in the prefix cache (a key several blocks hold counts once;
    /// the extra keys of groups with larger blocks count): the length of vLLM's
    /// ``cached_block_hash_to_block``.
    fn get_num_cached_keys(&self, py: Python<'_>) -> usize {
        self.with_pool(py, |pool| pool.num_cached_keys())
    }

    /// Fraction of usable blocks in use (the null block not counted).
    fn get_usage(&self, py: Python<'_>) -> f64 {
        self.with_pool(py, |pool| pool.usage())
    }

    /// The queued events (the queue is emptied) as the msgpack payload vLLM 0.33's
    /// publisher sends: one ``EventBatch``, hashes as integers (``kvpool.wire``'s bytes,
    /// encoded in Rust without a Python object per event and without the GIL). ``ts``
    /// defaults to now; ``group_specs`` maps a group index to ``(kv_cache_spec_kind,
    /// kv_cache_spec_sliding_window)``.
    /// With ``replay`` (a ``ReplayRing``) and ``seq``, a batch that has events is also
    /// held in the ring as batch ``seq`` (written there with stores that bypass the
    /// cache, on this thread, the GIL released); the ring's refusal (closed, or
    /// ``seq`` not above its last batch) is raised before any event is taken; a
    /// refusal caused meanwhile by another thread puts the events back in the queue.
    #[pyo3(signature = (ts=None, *, data_parallel_rank=None, group_specs=None, medium=None, replay=None, seq=None))]
    #[allow(clippy::too_many_arguments)]
    fn take_events_msgpack<'py>(
        &self,
        py: Python<'py>,
        ts: Option<&Bound<'py, PyAny>>,
        data_parallel_rank: Option<&Bound<'py, PyAny>>,
        group_specs: Option<&Bound<'py, PyAny>>,
        medium: Option<&Bound<'py, PyAny>>,
        replay: Option<&Bound<'py, PyAny>>,
        seq: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        super::events::take_encoded(
            py,
            ts,
            data_parallel_rank,
            group_specs,
            medium,
            replay,
            seq,
            || self.with_pool(py, |pool| pool.take_events()),
            |taken| self.with_pool(py, |pool| pool.return_events(taken)),
        )
    }

    /// Takes the queued events as one batch, encoded as ``take_events_msgpack`` encodes
    /// it, holds it in ``replay`` (a ``ReplayRing``, if given) as batch ``seq`` and sends
    /// it on ``sink`` (a ``ZmqSink``) as vLLM's three frames, the payload lent to ZeroMQ
    /// rather than copied (``ZmqPublisher.publish_from``). Returns the payload's length
    /// in bytes; 0 when there was no event, and then nothing is held or sent. A closed
    /// sink or ring, or ``seq`` not above the ring's last batch, is raised before any
    /// event is taken (a refusal caused meanwhile by another thread puts the events
    /// back in the queue); a send that fails after that raises ``TransportError`` with
    /// the batch held.
    #[pyo3(signature = (sink, seq, ts=None, *, data_parallel_rank=None, group_specs=None, medium=None, replay=None))]
    #[allow(clippy::too_many_arguments)]
    fn send_events(
        &self,
        py: Python<'_>,
        sink: &Bound<'_, PyAny>,
        seq: &Bound<'_, PyAny>,
        ts: Option<&Bound<'_, PyAny>>,
        data_parallel_rank: Option<&Bound<'_, PyAny>>,
        group_specs: Option<&Bound<'_, PyAny>>,
        medium: Option<&Bound<'_, PyAny>>,
        replay: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        super::events::take_sent(
            py,
            sink,
            seq,
            ts,
            data_parallel_rank,
            group_specs,
            medium,
            replay,
            || self.with_pool(py, |pool| pool.take_events()),
            |taken| self.with_pool(py, |pool| pool.return_events(taken)),
        )
    }

    /// The queued KV-cache events, oldest first; the queue is emptied.
    fn take_events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let events = self.with_pool(py, |pool| pool.take_events());
        events_to_py(py, events)
    }

    /// Most events queued before the oldest are dropped.
    #[getter]
    fn max_pending_events(&self) -> usize {
        self.config.max_pending_events
    }

    /// Number of queued events (what ``take_events`` would return).
    #[getter]
    fn num_pending_events(&self, py: Python<'_>) -> usize {
        self.with_pool(py, |pool| pool.num_pending_events())
    }

    /// Events dropped, oldest first, because ``max_pending_events`` were already
    /// queued; counted since the pool was built.
    #[getter]
    fn num_dropped_events(&self, py: Python<'_>) -> u64 {
        self.with_pool(py, |pool| pool.num_dropped_events())
    }

    /// The free queue's block ids, head (next to be reused) to tail.
    fn free_block_ids<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i32>> {
        let ids: Vec<u32> = self.with_pool(py, |pool| {
            pool.apply_expiries();
            pool.free_block_ids().collect()
        });
        ids_to_numpy(py, &ids)
    }

    /// Block ``block_id``'s reference count.
    fn ref_count(&self, py: Python<'_>, block_id: &Bound<'_, PyAny>) -> PyResult<u32> {
        let id = self.one_id(block_id)?;
        self.with_pool(py, |pool| pool.ref_count(id)).py_err(py)
    }

    /// The reference counts of ``block_ids`` (int32, in the order given): what a
    /// scheduler reads to see whether hits are free (count 0) before admitting them.
    fn ref_counts_of<'py>(
        &self,
        py: Python<'py>,
        block_ids: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let ids = self.ids(block_ids)?;
        let counts: Vec<i32> = self.with_pool(py, |pool| {
            ids.iter()
                .map(|&id| {
                    pool.ref_count(id)
                        .map_or(0, |c| c.min(i32::MAX as u32) as i32)
                })
                .collect()
        });
        Ok(PyArray1::from_vec(py, counts))
    }

    /// Every block's reference count, in id order.
    fn ref_counts<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i32>> {
        let counts: Vec<i32> = self.with_pool(py, |pool| {
            pool.ref_counts()
                .map(|c| c.min(i32::MAX as u32) as i32)
                .collect()
        });
        PyArray1::from_vec(py, counts)
    }

    /// Block ``block_id``'s cached ``(hash, group_id)``, or None.
    fn block_hash<'py>(
        &self,
        py: Python<'py>,
        block_id: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let id = self.one_id(block_id)?;
        let key = self.with_pool(py, |pool| pool.block_hash(id)).py_err(py)?;
        key.map(|k| key_tuple(py, &k)).transpose()
    }

    /// The length of the sequence block ``block_id``'s key covers (vLLM's
    /// ``KVCacheBlock.block_hash_num_tokens``): the block's end position in its chain
    /// (``(num_cached_blocks + i + 1) * block_size`` as ``cache_full_blocks`` cached
    /// it), or None while it holds no key.
    fn block_hash_num_tokens(
        &self,
        py: Python<'_>,
        block_id: &Bound<'_, PyAny>,
    ) -> PyResult<Option<u32>> {
        let id = self.one_id(block_id)?;
        self.with_pool(py, |pool| pool.block_hash_num_tokens(id))
            .py_err(py)
    }

    /// Block ``block_id``'s keys beyond its primary one (``block_hash``), as
    /// ``(hash, group_id)`` in the order they were added: the partial-block entries of
    /// groups whose blocks are larger than the hash granularity (vLLM's
    /// ``BlockPool.cached_block_hashes_by_block``). Empty for most blocks.
    fn extra_block_hashes<'py>(
        &self,
        py: Python<'py>,
        block_id: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let id = self.one_id(block_id)?;
        let keys = self
            .with_pool(py, |pool| pool.extra_block_keys(id))
            .py_err(py)?;
        keys.iter().map(|k| key_tuple(py, k)).collect()
    }

    /// The blocks that hold a block hash (``block_hash(id)`` is not None), in id order:
    /// one call in O(cached blocks), where asking ``block_hash`` of every block is one
    /// call per block of the pool.
    fn cached_block_ids<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i32>> {
        let ids = self.with_pool(py, |pool| pool.cached_block_ids());
        ids_to_numpy(py, &ids)
    }

    /// The blocks that hold keys beyond their primary one (see
    /// ``extra_block_hashes``), in id order.
    fn blocks_with_extra_hashes<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i32>> {
        let ids = self.with_pool(py, |pool| pool.blocks_with_extra_keys());
        ids_to_numpy(py, &ids)
    }

    /// At most ``max_blocks`` free block ids after block ``cursor`` in the free queue,
    /// head to tail (from the head when ``cursor`` is None; none when ``cursor`` is not
    /// free): vLLM's ``FreeKVCacheBlockQueue.iter_blocks_after``, in batches. Costs
    /// O(``max_blocks``) from any free block under LRU and priorities (from a cached
    /// block under the adaptive policy, also O(its position among the cached blocks)).
    #[pyo3(signature = (cursor, max_blocks))]
    fn free_block_ids_after<'py>(
        &self,
        py: Python<'py>,
        cursor: Option<&Bound<'py, PyAny>>,
        max_blocks: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let cursor = match cursor.filter(|c| !c.is_none()) {
            Some(c) => Some(self.one_id(c)?),
            None => None,
        };
        let max = int_arg(max_blocks, "max_blocks", 0, i64::MAX)? as usize;
        let mut out = Vec::new();
        self.with_pool(py, |pool| pool.free_block_ids_after(cursor, max, &mut out))
            .py_err(py)?;
        Ok(ids_to_numpy(py, &out))
    }

    /// The free block just before block ``block_id`` in the free queue, toward the head
    /// (vLLM's ``KVCacheBlock.prev_free_block``), or None when ``block_id`` is the head or
    /// not free; with ``block_id`` None, the queue's last block (None when it is empty).
    /// O(1) for a cached block under LRU and priorities, and for the last block whenever
    /// a cached block is free.
    fn free_block_id_before(
        &self,
        py: Python<'_>,
        block_id: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<u32>> {
        match block_id {
            Some(block_id) => {
                let id = self.one_id(block_id)?;
                self.with_pool(py, |pool| pool.free_block_id_before(id))
                    .py_err(py)
            }
            None => Ok(self.with_pool(py, |pool| pool.last_free_block_id())),
        }
    }

    /// Walk the whole structure; raise ``InvariantError`` listing every broken invariant.
    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        self.with_pool(py, |pool| pool.check_invariants())
            .map_err(|problems| error(py, ErrorKind::Invariant, problems.join("; ")))
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        self.with_pool(py, |pool| {
            format!(
                "BlockPool(num_blocks={}, free={}, cached={}, enable_caching={}, eviction={:?})",
                pool.num_blocks(),
                pool.num_free_blocks(),
                pool.num_cached_blocks(),
                if pool.config().enable_caching {
                    "True"
                } else {
                    "False"
                },
                pool.eviction_policy().name()
            )
        })
    }
}

impl PyBlockPool {
    /// `obj` as one of the pool's block ids (`InvalidBlockIdError` when out of range).
    pub(super) fn one_id(&self, obj: &Bound<'_, PyAny>) -> PyResult<u32> {
        let id = int_arg(obj, "block_id", i64::MIN, i64::MAX)?;
        if id < 0 || id >= self.config.num_blocks as i64 {
            return Err(error(
                obj.py(),
                ErrorKind::InvalidBlockId,
                format!(
                    "block id {id} is out of range for a pool of {} blocks",
                    self.config.num_blocks
                ),
            ));
        }
        Ok(id as u32)
    }
}

/// A hash chain in a group, as ``pin_prefix`` and ``unpin_prefix`` take it.
pub struct ChainArg {
    flat: FlatHashes,
    /// The KV-cache group.
    pub group: u32,
}

impl ChainArg {
    /// ``block_hashes`` and ``group_id=`` (default 0).
    pub fn extract(
        block_hashes: &Bound<'_, PyAny>,
        group_id: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let group = opt_int_arg(group_id, "group_id", 0, u32::MAX as i64)?.unwrap_or(0) as u32;
        Ok(Self {
            flat: FlatHashes::extract(block_hashes)?,
            group,
        })
    }

    /// The chain's hashes.
    pub fn hashes(&self) -> HashSlice<'_> {
        self.flat.slice()
    }
}

/// A key as Python's ``(hash bytes, group_id)``.
fn key_tuple<'py>(py: Python<'py>, key: &pool::BlockHashKey) -> PyResult<Bound<'py, PyTuple>> {
    PyTuple::new(
        py,
        [
            PyBytes::new(py, key.hash.as_bytes()).into_any(),
            key.group.into_pyobject(py)?.into_any(),
        ],
    )
}
