//! `KVCacheBlockView`: one block of a `kvpool.BlockPool` read as vLLM 0.33's
//! `KVCacheBlock`, for `kvpool.vllm`'s views of the pool.
//!
//! vLLM's scheduler and its connectors take blocks as objects (`get_new_blocks`
//! returns them; the CPU offload connector walks the free queue block by block and
//! reads each one's hash). A view holds the pool and an id and reads everything else
//! from Rust when asked, so it never goes stale. Views are made here, in bulk, from
//! id arrays: a Python class made one per block cost about 170 ns each, and its
//! properties each went through a Python call before reaching Rust.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyList};

use super::block_pool::{pool_arg, PyBlockPool};
use super::convert::int_arg;
use super::errors::IntoPyResult;
use crate::pool::BlockHashKey;

/// No token count recorded (`_num_tokens_when_unkeyed` is None).
const NO_COUNT: i64 = -1;

/// One block of a ``kvpool.BlockPool`` as vLLM's ``KVCacheBlock``: ``block_id``,
/// ``ref_cnt``, ``block_hash`` (vLLM's ``BlockHashWithGroupId``), ``is_null``,
/// ``block_hash_num_tokens`` and the free-list neighbours, read from the pool each
/// time. Two views are equal when they show the same block of the same pool.
#[pyclass(frozen, module = "kvpool.vllm", name = "KVCacheBlockView")]
pub struct PyBlockView {
    pool: Py<PyBlockPool>,
    /// The block's id.
    #[pyo3(get)]
    block_id: u32,
    /// What ``block_hash_num_tokens`` read when the view's key was taken away by
    /// editing ``cached_block_hash_to_block._cache`` ([`NO_COUNT`]: nothing), so that
    /// putting the view back restores it, as vLLM's block keeps its fields.
    num_tokens_when_unkeyed: AtomicI64,
}

impl PyBlockView {
    /// A view of a block already checked against `pool`.
    fn new_unchecked(pool: Py<PyBlockPool>, block_id: u32) -> Self {
        Self {
            pool,
            block_id,
            num_tokens_when_unkeyed: AtomicI64::new(NO_COUNT),
        }
    }

    /// A new view of a block already checked against `pool`, taken off the garbage
    /// collector's lists: it refers to nothing but its pool, which refers to no view,
    /// so it can never be part of a cycle. A walk that makes thousands of views would
    /// otherwise set off collections, a full one now and then, which walk every object
    /// of the process (torch's included).
    #[allow(unsafe_code)]
    fn make<'py>(py: Python<'py>, pool: Py<PyBlockPool>, id: u32) -> PyResult<Bound<'py, Self>> {
        let view = Bound::new(py, Self::new_unchecked(pool, id))?;
        let object = view.as_ptr();
        // SAFETY: `object` is live (held by `view`), made here and not yet shared.
        // `PyObject_GC_IsTracked` is defined for any object (0 for one of a type
        // without GC support, which has no GC header), and untracking is done only
        // for an object it reports tracked, so it is sound whether or not PyO3 makes
        // this class a GC type.
        unsafe {
            if pyo3::ffi::PyObject_GC_IsTracked(object) != 0 {
                pyo3::ffi::PyObject_GC_UnTrack(object.cast());
            }
        }
        Ok(view)
    }

    /// Views of `ids` (already checked against the pool), as a list.
    fn list_of<'py>(pool: &Bound<'py, PyBlockPool>, ids: &[u32]) -> PyResult<Bound<'py, PyList>> {
        let py = pool.py();
        let views = ids
            .iter()
            .map(|&id| Self::make(py, pool.clone().unbind(), id))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, views)
    }
}

#[pymethods]
impl PyBlockView {
    /// A view of block ``block_id`` of ``pool`` (``InvalidBlockIdError`` when the pool
    /// has no such block).
    #[new]
    fn py_new(pool: &Bound<'_, PyAny>, block_id: &Bound<'_, PyAny>) -> PyResult<Self> {
        let pool = pool_arg(pool)?;
        let id = pool.get().one_id(block_id)?;
        Ok(Self::new_unchecked(pool.clone().unbind(), id))
    }

    /// Views of ``block_ids`` (a numpy integer array or a sequence of ints), in order,
    /// as a list: what vLLM's ``get_new_blocks`` and ``KVCacheBlocks.blocks`` hold.
    /// Every id is checked before any view is made.
    #[staticmethod]
    fn of_ids<'py>(
        pool: &Bound<'py, PyAny>,
        block_ids: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let pool = pool_arg(pool)?;
        let ids = pool.get().ids(block_ids)?;
        Self::list_of(pool, &ids)
    }

    /// The block's reference count, now.
    #[getter]
    fn ref_cnt(&self, py: Python<'_>) -> PyResult<u32> {
        let id = self.block_id;
        self.pool
            .get()
            .with_pool(py, |p| p.ref_count(id))
            .py_err(py)
    }

    /// True for the pool's null block (block 0 of a pool made with ``null_block=True``,
    /// the default; a pool without one has no null block).
    #[getter]
    fn is_null(&self) -> bool {
        self.block_id == 0 && self.pool.get().config.null_block
    }

    /// The block's key as vLLM's ``BlockHashWithGroupId`` (the hash, then the group id
    /// as 4 big-endian bytes), or None while it holds no key.
    #[getter]
    fn block_hash<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let id = self.block_id;
        let key = self
            .pool
            .get()
            .with_pool(py, |p| p.block_hash(id))
            .py_err(py)?;
        key.map(|key| hash_with_group_id(py, &key)).transpose()
    }

    /// The length of the sequence the block's key covers, or None while it holds none.
    #[getter]
    fn block_hash_num_tokens(&self, py: Python<'_>) -> PyResult<Option<u32>> {
        let id = self.block_id;
        self.pool
            .get()
            .with_pool(py, |p| p.block_hash_num_tokens(id))
            .py_err(py)
    }

    /// The next block in the free queue (after the last one, the fake tail of
    /// ``kvpool.vllm``'s view of the queue, or None without one), or None when the block
    /// is not free.
    #[getter]
    fn next_free_block<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.neighbour(py, 1)
    }

    /// The previous block in the free queue (before the first one, the fake head of
    /// ``kvpool.vllm``'s view of the queue, or None without one), or None when the block
    /// is not free.
    #[getter]
    fn prev_free_block<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.neighbour(py, -1)
    }

    /// The token count recorded when the view's key was taken away, or None.
    #[getter(_num_tokens_when_unkeyed)]
    fn num_tokens_when_unkeyed(&self) -> Option<i64> {
        let n = self.num_tokens_when_unkeyed.load(Ordering::Relaxed);
        (n != NO_COUNT).then_some(n)
    }

    #[setter(_num_tokens_when_unkeyed)]
    fn set_num_tokens_when_unkeyed(&self, value: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let n = match value.filter(|v| !v.is_none()) {
            Some(v) => int_arg(v, "_num_tokens_when_unkeyed", 0, i64::MAX)?,
            None => NO_COUNT,
        };
        self.num_tokens_when_unkeyed.store(n, Ordering::Relaxed);
        Ok(())
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PyBlockView>()
            .is_ok_and(|o| o.get().block_id == self.block_id && o.get().pool.is(&self.pool))
    }

    fn __hash__(&self) -> u64 {
        u64::from(self.block_id)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let hash = match self.block_hash(py)? {
            Some(h) => h.repr()?.to_string(),
            None => "None".to_owned(),
        };
        Ok(format!(
            "KVCacheBlock(block_id={}, ref_cnt={}, block_hash={hash})",
            self.block_id,
            self.ref_cnt(py)?
        ))
    }
}

impl PyBlockView {
    /// The free-list neighbour `step` away (`kvpool._free_neighbours`: the pool's
    /// free-queue view, if `kvpool.vllm` made one, supplies the queue's fake ends).
    fn neighbour<'py>(&self, py: Python<'py>, step: i32) -> PyResult<Bound<'py, PyAny>> {
        static NEIGHBOUR: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
        let f = NEIGHBOUR.import(py, "kvpool._free_neighbours", "neighbour_of")?;
        f.call1((self.pool.bind(py), self.block_id, step))
    }
}

/// `key` as vLLM's `make_block_hash_with_group_id` packs it.
fn hash_with_group_id<'py>(py: Python<'py>, key: &BlockHashKey) -> PyResult<Bound<'py, PyBytes>> {
    let hash = key.hash.as_bytes();
    PyBytes::new_with(py, hash.len() + 4, |buf| {
        buf[..hash.len()].copy_from_slice(hash);
        buf[hash.len()..].copy_from_slice(&key.group.to_be_bytes());
        Ok(())
    })
}

/// The first batch a walk reads; each next one is [`WALK_GROWTH`] times larger, up to
/// [`WALK_MAX_BATCH`]: a walk that stops early costs what it reads, a long one takes
/// the pool's lock once per few thousand blocks.
const WALK_FIRST_BATCH: usize = 16;
const WALK_GROWTH: usize = 4;
const WALK_MAX_BATCH: usize = 4096;

/// Where a walk of the free queue stands: the ids read and not yet yielded, the
/// queue's version when they were read, and where the next read starts.
struct WalkState {
    ids: Vec<u32>,
    next: usize,
    /// The queue's version when `ids` were read (`PyBlockPool::queue_version`).
    version: u64,
    /// The last block yielded (the walk's cursor before the first): the next read
    /// starts after it.
    after: Option<u32>,
    batch: usize,
    /// The last read reached the queue's tail.
    at_tail: bool,
    /// The walk has ended (returned `None` once); it stays ended, as a generator does.
    ended: bool,
}

/// The free blocks after a cursor, in eviction order, as ``KVCacheBlockView``s: vLLM's
/// ``FreeKVCacheBlockQueue.iter_blocks_after``. Ids are read from the pool in growing
/// batches; each step checks the queue's version, and if the pool changed since the
/// batch was read, drops what is left of it and reads again after the last block
/// yielded. So each step yields what vLLM's linked-list walk would yield at that
/// moment: the current successor of the last block yielded, and nothing more once
/// that block has left the queue.
#[pyclass(frozen, module = "kvpool.vllm", name = "FreeBlockWalk")]
pub struct PyFreeBlockWalk {
    pool: Py<PyBlockPool>,
    state: Mutex<WalkState>,
}

#[pymethods]
impl PyFreeBlockWalk {
    /// A walk of ``pool``'s free queue from after block ``cursor`` (None: from the head).
    #[new]
    #[pyo3(signature = (pool, cursor=None))]
    fn py_new(pool: &Bound<'_, PyAny>, cursor: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let pool = pool_arg(pool)?;
        let after = match cursor.filter(|c| !c.is_none()) {
            Some(c) => Some(pool.get().one_id(c)?),
            None => None,
        };
        Ok(Self {
            pool: pool.clone().unbind(),
            state: Mutex::new(WalkState {
                ids: Vec::new(),
                next: 0,
                version: 0,
                after,
                batch: WALK_FIRST_BATCH,
                at_tail: false,
                ended: false,
            }),
        })
    }

    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBlockView>>> {
        let pool = self.pool.get();
        loop {
            // The walk's lock is a leaf: released before the pool's lock is taken and
            // before any Python object is made.
            let (after, batch) = {
                let mut state = self.lock_state();
                if state.ended {
                    return Ok(None);
                }
                if pool.queue_version() != state.version {
                    // The pool changed since the batch was read: what is left of it
                    // may be stale, and the tail may have grown.
                    state.ids.clear();
                    state.next = 0;
                    state.at_tail = false;
                }
                if let Some(&id) = state.ids.get(state.next) {
                    state.next += 1;
                    state.after = Some(id);
                    drop(state);
                    return PyBlockView::make(py, self.pool.clone_ref(py), id).map(Some);
                }
                if state.at_tail {
                    state.ended = true;
                    return Ok(None);
                }
                (state.after, state.batch)
            };
            let mut ids = Vec::with_capacity(batch);
            let version = pool
                .with_pool(py, |p| {
                    p.free_block_ids_after(after, batch, &mut ids)
                        .map(|()| p.free_queue_version())
                })
                .py_err(py)?;
            let mut state = self.lock_state();
            // Another thread may have read (or yielded) meanwhile: then keep its state.
            if state.after == after && state.next == state.ids.len() && !state.ended {
                state.at_tail = ids.len() < batch;
                state.batch = (batch * WALK_GROWTH).min(WALK_MAX_BATCH);
                state.ids = ids;
                state.next = 0;
                state.version = version;
            }
        }
    }
}

impl PyFreeBlockWalk {
    fn lock_state(&self) -> std::sync::MutexGuard<'_, WalkState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}
