//! `kvpool.BlockTables`: per-request block tables whose counters and hashes the
//! caller owns (what `kvpool.vllm.KVCacheManager` delegates to).

use std::sync::Mutex;

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::block_pool::{pool_arg, PyBlockPool};
use super::convert::{
    extract_block_ids, extract_hashes_after, group_index_list, ids_to_numpy, int_arg, opt_bool_arg,
    opt_int_arg, sync_known_hashes, with_scratch,
};
use super::errors::{error, ErrorKind, IntoPyResult};
use super::hashing::hash_slice_of;
use super::locking::with_lock;
use super::recycled_ids::RecycledIds;
use super::requests::request_id_to_py;
use crate::pool::{self, BlockPool, BlockTables, LoraInfo, PoolConfig, SlotCall};

/// Per-request block tables over a ``BlockPool`` (whose block 0 is vLLM's null block),
/// for a caller that owns each request's ``num_computed_tokens`` and ``block_hashes``
/// and passes them in: vLLM 0.33's ``KVCacheManager`` with one full-attention group.
/// Everything else about the blocks (free queue, counts, prefix cache, events) is the
/// pool's, read and changed through ``pool``.
///
/// ``BlockTables(pool, *, max_model_len, record_new_block_ids=False)``.
#[pyclass(frozen, module = "kvpool", name = "BlockTables")]
pub struct PyBlockTables {
    inner: Mutex<BlockTables>,
    pub(super) pool: Py<PyBlockPool>,
    /// The pool's configuration, which never changes.
    pub(super) config: PoolConfig,
    /// `allocate_slots`' recent result arrays, written again once their caller lets go.
    recycled: RecycledIds,
}

/// One `allocate_slots` call's arguments as Python gave them, by name (they share one
/// type, so a positional list could swap two unnoticed); `None` is an argument's
/// default. [`PyBlockTables::allocate_into`] converts and checks them.
pub(super) struct SlotArgs<'a, 'py> {
    pub request_id: &'a Bound<'py, PyAny>,
    pub num_computed_tokens: &'a Bound<'py, PyAny>,
    /// `None`: not read (allowed when [`SlotCall::needs_num_tokens`] is false).
    pub num_tokens: Option<&'a Bound<'py, PyAny>>,
    pub block_hashes: &'a Bound<'py, PyAny>,
    pub num_new_tokens: &'a Bound<'py, PyAny>,
    pub num_new_computed_tokens: Option<&'a Bound<'py, PyAny>>,
    pub new_computed_blocks: Option<&'a Bound<'py, PyAny>>,
    pub num_lookahead_tokens: Option<&'a Bound<'py, PyAny>>,
    pub num_external_computed_tokens: Option<&'a Bound<'py, PyAny>>,
    pub delay_cache_blocks: Option<&'a Bound<'py, PyAny>>,
    pub full_sequence_must_fit: Option<&'a Bound<'py, PyAny>>,
    pub reserved_blocks: Option<&'a Bound<'py, PyAny>>,
    pub watermark_blocks: Option<&'a Bound<'py, PyAny>>,
    pub token_ids: Option<&'a Bound<'py, PyAny>>,
    /// vLLM's `skip_zeroing_group_ids` (group 0 is the tables' one group).
    pub skip_zeroing_group_ids: Option<&'a Bound<'py, PyAny>>,
}

impl PyBlockTables {
    /// `allocate_slots` with the new block ids appended to `out`; `Ok(false)` when they
    /// do not fit.
    pub(super) fn allocate_into<'py>(
        &self,
        py: Python<'py>,
        args: &SlotArgs<'_, 'py>,
        out: &mut Vec<u32>,
    ) -> PyResult<bool> {
        let SlotArgs {
            request_id,
            num_computed_tokens,
            num_tokens,
            block_hashes,
            num_new_tokens,
            num_new_computed_tokens,
            new_computed_blocks,
            num_lookahead_tokens,
            num_external_computed_tokens,
            delay_cache_blocks,
            full_sequence_must_fit,
            reserved_blocks,
            watermark_blocks,
            token_ids,
            skip_zeroing_group_ids,
        } = *args;
        let id = super::requests::request_key(request_id)?;
        let count = |o: Option<&Bound<'py, PyAny>>, what: &str| -> PyResult<usize> {
            Ok(opt_int_arg(o, what, 0, i64::MAX)?.unwrap_or(0) as usize)
        };
        // Only the hashes the tables do not have yet cross (a request's hashes only grow);
        // without prefix caching none is read.
        let known = if self.config.enable_caching && !block_hashes.is_empty().unwrap_or(true) {
            sync_known_hashes(py, &self.inner, id, block_hashes)
        } else {
            0
        };
        let mut flat = Vec::new();
        let (hashes_from, width) = extract_hashes_after(block_hashes, known, &mut flat)?;
        let hits = match new_computed_blocks.filter(|o| !o.is_none()) {
            Some(o) => Some(self.ids(o)?),
            None => None,
        };
        let mut tokens = Vec::new();
        let token_ids =
            super::convert::event_token_ids(token_ids, self.config.enable_events, &mut tokens)?
                .then_some(&tokens[..]);
        let call = SlotCall {
            num_computed_tokens: int_arg(num_computed_tokens, "num_computed_tokens", 0, i64::MAX)?
                as usize,
            num_tokens: match num_tokens {
                Some(n) => Some(int_arg(n, "num_tokens", 0, i64::MAX)? as usize),
                None => None,
            },
            block_hashes: hash_slice_of(&flat, width),
            hashes_from,
            num_new_tokens: int_arg(num_new_tokens, "num_new_tokens", 0, i64::MAX)? as usize,
            num_new_computed_tokens: count(num_new_computed_tokens, "num_new_computed_tokens")?,
            new_computed_blocks: hits.as_deref(),
            num_lookahead_tokens: count(num_lookahead_tokens, "num_lookahead_tokens")?,
            num_external_computed_tokens: count(
                num_external_computed_tokens,
                "num_external_computed_tokens",
            )?,
            delay_cache_blocks: opt_bool_arg(delay_cache_blocks, "delay_cache_blocks", false)?,
            full_sequence_must_fit: opt_bool_arg(
                full_sequence_must_fit,
                "full_sequence_must_fit",
                false,
            )?,
            reserved_blocks: count(reserved_blocks, "reserved_blocks")?,
            watermark_blocks: count(watermark_blocks, "watermark_blocks")?,
            token_ids,
            skip_zeroing_external: group_index_list(
                skip_zeroing_group_ids,
                "skip_zeroing_group_ids",
            )?
            .contains(&0),
        };
        self.with_tables_and_pool(py, |t, p| t.allocate_slots(p, id, &call, out))
            .py_err(py)
    }

    pub(super) fn with_tables<R>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut BlockTables) -> R,
    ) -> R {
        with_lock(py, &self.inner, f)
    }

    /// Runs `f` on the tables and the pool, locked in that order (as the tracker and
    /// its pool are).
    pub(super) fn with_tables_and_pool<R>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut BlockTables, &mut BlockPool) -> R,
    ) -> R {
        let pool = self.pool.get();
        self.with_tables(py, |tables| pool.with_pool(py, |pool| f(tables, pool)))
    }

    fn ids(&self, obj: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
        let mut ids = Vec::new();
        extract_block_ids(obj, self.config.num_blocks, &mut ids)?;
        Ok(ids)
    }
}

#[pymethods]
impl PyBlockTables {
    #[new]
    #[pyo3(signature = (pool, *, max_model_len, record_new_block_ids=None))]
    fn new(
        py: Python<'_>,
        pool: &Bound<'_, PyAny>,
        max_model_len: &Bound<'_, PyAny>,
        record_new_block_ids: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let pool = pool_arg(pool)?;
        let max_model_len = int_arg(max_model_len, "max_model_len", 1, i64::MAX)? as usize;
        let record = opt_bool_arg(record_new_block_ids, "record_new_block_ids", false)?;
        let inner = BlockTables::new(max_model_len, record).py_err(py)?;
        Ok(Self {
            inner: Mutex::new(inner),
            config: pool.get().config.clone(),
            recycled: RecycledIds::default(),
            pool: pool.clone().unbind(),
        })
    }

    /// The pool whose blocks the tables hold.
    #[getter]
    fn pool(&self, py: Python<'_>) -> Py<PyBlockPool> {
        self.pool.clone_ref(py)
    }

    /// Longest sequence a request may reach.
    #[getter]
    fn max_model_len(&self, py: Python<'_>) -> usize {
        self.with_tables(py, |t| t.max_model_len())
    }

    /// vLLM's ``allocate_slots`` for request ``request_id`` whose state is
    /// ``num_computed_tokens``, ``num_tokens`` and ``block_hashes``: the new blocks
    /// (int32; possibly an earlier result nothing references any more, written again),
    /// or ``None`` (nothing changed) when they do not fit.
    /// ``new_computed_blocks=None`` is vLLM's empty sentinel (nothing to adopt). Every
    /// argument may be given by position, so a hot caller avoids keyword parsing.
    /// ``skip_zeroing_group_ids`` holding 0 leaves the connector's blocks out of those
    /// recorded for zeroing (an async load writes them).
    #[pyo3(signature = (request_id, num_computed_tokens, num_tokens, block_hashes, num_new_tokens, num_new_computed_tokens=None, new_computed_blocks=None, num_lookahead_tokens=None, num_external_computed_tokens=None, delay_cache_blocks=None, full_sequence_must_fit=None, reserved_blocks=None, watermark_blocks=None, token_ids=None, skip_zeroing_group_ids=None))]
    #[allow(clippy::too_many_arguments)]
    fn allocate_slots<'py>(
        &self,
        py: Python<'py>,
        request_id: &Bound<'py, PyAny>,
        num_computed_tokens: &Bound<'py, PyAny>,
        num_tokens: &Bound<'py, PyAny>,
        block_hashes: &Bound<'py, PyAny>,
        num_new_tokens: &Bound<'py, PyAny>,
        num_new_computed_tokens: Option<&Bound<'py, PyAny>>,
        new_computed_blocks: Option<&Bound<'py, PyAny>>,
        num_lookahead_tokens: Option<&Bound<'py, PyAny>>,
        num_external_computed_tokens: Option<&Bound<'py, PyAny>>,
        delay_cache_blocks: Option<&Bound<'py, PyAny>>,
        full_sequence_must_fit: Option<&Bound<'py, PyAny>>,
        reserved_blocks: Option<&Bound<'py, PyAny>>,
        watermark_blocks: Option<&Bound<'py, PyAny>>,
        token_ids: Option<&Bound<'py, PyAny>>,
        skip_zeroing_group_ids: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyArray1<i32>>>> {
        let args = SlotArgs {
            request_id,
            num_computed_tokens,
            num_tokens: Some(num_tokens),
            block_hashes,
            num_new_tokens,
            num_new_computed_tokens,
            new_computed_blocks,
            num_lookahead_tokens,
            num_external_computed_tokens,
            delay_cache_blocks,
            full_sequence_must_fit,
            reserved_blocks,
            watermark_blocks,
            token_ids,
            skip_zeroing_group_ids,
        };
        with_scratch(|out| {
            let ok = self.allocate_into(py, &args, out)?;
            Ok(ok.then(|| self.recycled.to_numpy(py, out)))
        })
    }

    /// vLLM's ``cache_blocks``: caches the request's blocks full within its first
    /// ``num_tokens`` tokens.
    #[pyo3(signature = (request_id, block_hashes, num_tokens, *, token_ids=None, lora_id=None, lora_name=None))]
    #[allow(clippy::too_many_arguments)]
    fn cache_blocks(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        block_hashes: &Bound<'_, PyAny>,
        num_tokens: &Bound<'_, PyAny>,
        token_ids: Option<&Bound<'_, PyAny>>,
        lora_id: Option<&Bound<'_, PyAny>>,
        lora_name: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let id = super::requests::request_key(request_id)?;
        let n = int_arg(num_tokens, "num_tokens", 0, i64::MAX)? as usize;
        let known = sync_known_hashes(py, &self.inner, id, block_hashes);
        let mut flat = Vec::new();
        let (hashes_from, width) = extract_hashes_after(block_hashes, known, &mut flat)?;
        let mut tokens = Vec::new();
        let token_ids =
            super::convert::event_token_ids(token_ids, self.config.enable_events, &mut tokens)?
                .then_some(&tokens[..]);
        let lora = LoraInfo {
            id: opt_int_arg(lora_id, "lora_id", i64::MIN, i64::MAX)?,
            name: super::convert::opt_str_arg(lora_name, "lora_name")?,
        };
        self.with_tables_and_pool(py, |t, p| {
            t.cache_blocks(
                p,
                id,
                hashes_from,
                hash_slice_of(&flat, width),
                n,
                token_ids,
                &lora,
            )
        })
        .py_err(py)
    }

    /// vLLM's ``get_num_blocks_to_allocate`` for the request.
    #[pyo3(signature = (request_id, num_tokens, new_computed_blocks=None))]
    fn num_blocks_to_allocate(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        num_tokens: &Bound<'_, PyAny>,
        new_computed_blocks: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        let id = super::requests::request_key(request_id)?;
        let n = int_arg(num_tokens, "num_tokens", 0, i64::MAX)? as usize;
        let hits = match new_computed_blocks.filter(|o| !o.is_none()) {
            Some(o) => self.ids(o)?,
            None => Vec::new(),
        };
        Ok(self.with_tables_and_pool(py, |t, p| t.num_blocks_to_allocate(p, id, n, &hits)))
    }

    /// The request's blocks (int32; empty for an unknown request).
    fn get_blocks<'py>(
        &self,
        py: Python<'py>,
        request_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let id = super::requests::request_key(request_id)?;
        with_scratch(|out| {
            self.with_tables(py, |t| out.extend_from_slice(t.blocks(id)));
            Ok(ids_to_numpy(py, out))
        })
    }

    /// How many of the request's blocks are cached (``None`` until vLLM tracks it).
    fn num_cached_blocks(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
    ) -> PyResult<Option<usize>> {
        let id = super::requests::request_key(request_id)?;
        Ok(self.with_tables(py, |t| t.num_cached_blocks(id)))
    }

    /// Frees the request's blocks tail first and forgets it (unknown: no-op).
    fn free(&self, py: Python<'_>, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = super::requests::request_key(request_id)?;
        self.with_tables_and_pool(py, |t, p| t.free(p, id))
            .py_err(py)
    }

    /// Forgets the request and returns its blocks (int32, allocation order) without
    /// freeing them; the caller frees them later with ``pool.free_blocks``.
    fn pop_blocks<'py>(
        &self,
        py: Python<'py>,
        request_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let id = super::requests::request_key(request_id)?;
        let blocks = self.with_tables(py, |t| t.pop_blocks(id));
        Ok(ids_to_numpy(py, &blocks))
    }

    /// vLLM's ``record_blocks_for_zeroing``: the request's blocks from token
    /// ``start_token`` on (a block boundary) are recorded for zeroing again (blocks a
    /// failed async load left unwritten). Nothing when not recording.
    fn record_blocks_for_zeroing(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        start_token: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let id = super::requests::request_key(request_id)?;
        let start = int_arg(start_token, "start_token", 0, i64::MAX)? as usize;
        let block_size = self.config.block_size as usize;
        self.with_tables(py, |t| t.record_blocks_for_zeroing(id, start, block_size))
            .py_err(py)
    }

    /// Ids of blocks allocated since the last call (int32; empty unless recording).
    fn take_new_block_ids<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i32>> {
        let ids = self.with_tables(py, |t| t.take_new_block_ids());
        ids_to_numpy(py, &ids)
    }

    /// Requests with a table, sorted.
    fn request_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let mut ids: Vec<pool::RequestId> =
            self.with_tables(py, |t| t.request_ids().cloned().collect());
        ids.sort();
        let items = ids
            .iter()
            .map(|id| request_id_to_py(py, id))
            .collect::<PyResult<Vec<_>>>()?;
        PyTuple::new(py, items)
    }

    fn __contains__(&self, py: Python<'_>, request_id: &Bound<'_, PyAny>) -> PyResult<bool> {
        let id = super::requests::request_key(request_id)?;
        Ok(self.with_tables(py, |t| t.contains(id)))
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        self.with_tables(py, |t| t.num_requests())
    }

    /// Raises ``InvariantError`` if the pool or the tables are inconsistent.
    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        let result = self.with_tables_and_pool(py, |t, p| t.check_invariants(p));
        result.map_err(|problems| error(py, ErrorKind::Invariant, problems.join("; ")))
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "BlockTables(num_blocks={}, block_size={}, requests={})",
            self.config.num_blocks,
            self.config.block_size,
            self.with_tables(py, |t| t.request_ids().count())
        )
    }
}
