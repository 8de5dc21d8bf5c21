//! `kvpool.VllmGroupCalls`: [`super::vllm_calls`]'s per-request calls of vLLM 0.33's
//! `KVCacheManager` for several KV-cache groups, over `GroupTables`: `allocate_slots`
//! with its whole signature, `get_computed_blocks`, `get_blocks`,
//! `estimate_cached_tokens` and `free`, each one Rust call that reads vLLM's `Request`
//! (`request_id`, `num_computed_tokens`, `num_tokens`, `num_prompt_tokens`,
//! `num_in_flight_tokens`, `shared_prefix_boundary`, `block_hashes`,
//! `skip_reading_prefix_cache`, `status`) so that the scheduler's hot calls run no Python
//! frame of kvpool's.

use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};

use super::convert::{ids_to_numpy, int_arg, opt_bool_arg, owned_arg};
use super::errors::IntoPyResult;
use super::group_tables::{GroupSlotArgs, PyGroupTables};
use super::hashing::hash_slice_of;
use super::recycled_ids::RecycledIds;
use super::vllm_calls::{request_field, watermark_arg};

/// ``VllmGroupCalls(tables, empty_blocks, blocks_class, group_ids_of, waiting_statuses,
/// watermark_blocks)``: vLLM's per-request ``KVCacheManager`` calls over ``tables``.
/// Results holding blocks are ``empty_blocks`` when no group has one and
/// ``blocks_class(tables.pool, groups)`` otherwise (``groups``: one int32 array per
/// group); ``group_ids_of(blocks)`` reads the per-group ids of a ``KVCacheBlocks`` that
/// is not a ``blocks_class`` (whose own are its ``groups``).
#[pyclass(frozen, module = "kvpool", name = "VllmGroupCalls")]
pub struct PyVllmGroupCalls {
    tables: Py<PyGroupTables>,
    empty_blocks: Py<PyAny>,
    blocks_class: Py<PyAny>,
    group_ids_of: Py<PyAny>,
    waiting_statuses: Py<PyTuple>,
    watermark_blocks: usize,
    /// Recent result arrays of each of the first [`RECYCLED_GROUPS`] groups, written
    /// again once nothing else references them (a group's lengths repeat, not across
    /// groups).
    recycled: [RecycledIds; RECYCLED_GROUPS],
}

/// Groups whose result arrays are recycled; later groups' are made fresh.
const RECYCLED_GROUPS: usize = 8;

impl PyVllmGroupCalls {
    /// `empty_blocks` when no group has a block, else `blocks_class(pool, groups)`.
    fn blocks<'py>(
        &self,
        py: Python<'py>,
        flat: &[u32],
        offsets: &[usize],
    ) -> PyResult<Bound<'py, PyAny>> {
        if flat.is_empty() {
            return Ok(self.empty_blocks.bind(py).clone());
        }
        let groups = PyTuple::new(
            py,
            offsets
                .windows(2)
                .enumerate()
                .map(|(g, w)| match self.recycled.get(g) {
                    Some(ring) => ring.to_numpy(py, &flat[w[0]..w[1]]),
                    None => ids_to_numpy(py, &flat[w[0]..w[1]]),
                }),
        )?;
        self.blocks_class
            .bind(py)
            .call1((self.tables.get().pool.bind(py), groups))
    }
}

#[pymethods]
impl PyVllmGroupCalls {
    #[new]
    fn new(
        tables: &Bound<'_, PyAny>,
        empty_blocks: Py<PyAny>,
        blocks_class: Py<PyAny>,
        group_ids_of: Py<PyAny>,
        waiting_statuses: &Bound<'_, PyAny>,
        watermark_blocks: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let tables = owned_arg::<PyGroupTables>(tables, "tables", "a kvpool.GroupTables")?;
        let waiting_statuses =
            owned_arg::<PyTuple>(waiting_statuses, "waiting_statuses", "a tuple")?;
        Ok(Self {
            tables,
            empty_blocks,
            blocks_class,
            group_ids_of,
            waiting_statuses,
            watermark_blocks: int_arg(watermark_blocks, "watermark_blocks", 0, i64::MAX)? as usize,
            recycled: Default::default(),
        })
    }

    /// ``KVCacheManager.allocate_slots(request, num_new_tokens, ...)`` with vLLM's
    /// arguments: ``empty_blocks`` when no group needed a new block, the new blocks, or
    /// ``None`` when they do not fit (blocks out of a window have still been given back,
    /// as in vLLM).
    #[pyo3(signature = (request, num_new_tokens, num_new_computed_tokens=None, new_computed_blocks=None, num_lookahead_tokens=None, num_external_computed_tokens=None, delay_cache_blocks=None, num_encoder_tokens=None, full_sequence_must_fit=None, reserved_blocks=None, has_scheduled_reqs=None, skip_zeroing_group_ids=None))]
    #[allow(clippy::too_many_arguments)]
    fn allocate_slots<'py>(
        &self,
        py: Python<'py>,
        request: &Bound<'py, PyAny>,
        num_new_tokens: &Bound<'py, PyAny>,
        num_new_computed_tokens: Option<&Bound<'py, PyAny>>,
        new_computed_blocks: Option<&Bound<'py, PyAny>>,
        num_lookahead_tokens: Option<&Bound<'py, PyAny>>,
        num_external_computed_tokens: Option<&Bound<'py, PyAny>>,
        delay_cache_blocks: Option<&Bound<'py, PyAny>>,
        num_encoder_tokens: Option<&Bound<'py, PyAny>>,
        full_sequence_must_fit: Option<&Bound<'py, PyAny>>,
        reserved_blocks: Option<&Bound<'py, PyAny>>,
        has_scheduled_reqs: Option<&Bound<'py, PyAny>>,
        skip_zeroing_group_ids: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = num_encoder_tokens; // no encoder (cross-attention) groups here
        let empty = self.empty_blocks.bind(py);
        // vLLM adopts whatever is not its empty sentinel, even all-empty groups.
        let hits = match new_computed_blocks {
            None => None,
            Some(b) if b.is_none() || b.is(empty) => None,
            Some(b) if b.get_type().is(self.blocks_class.bind(py)) => {
                Some(b.getattr(pyo3::intern!(py, "groups"))?)
            }
            Some(b) => Some(self.group_ids_of.bind(py).call1((b,))?),
        };
        let scheduled = opt_bool_arg(has_scheduled_reqs, "has_scheduled_reqs", true)?;
        let field = |name: &Bound<'py, PyString>| request_field(request, name);
        let watermark = watermark_arg(
            request,
            scheduled,
            self.watermark_blocks,
            self.waiting_statuses.bind(py),
        )?;
        let t = self.tables.get();
        let hashes = if t.config.enable_caching {
            field(pyo3::intern!(py, "block_hashes"))?
        } else {
            PyTuple::empty(py).into_any()
        };
        // A `BlockStored` event carries the tokens of every block its call covered.
        let token_ids = if t.config.enable_events {
            Some(field(pyo3::intern!(py, "all_token_ids"))?)
        } else {
            None
        };
        // `num_tokens` and `num_prompt_tokens` are Python properties: read only where a
        // rule uses them (caching, the full-sequence gate); 0 stands in otherwise.
        let must_fit = opt_bool_arg(full_sequence_must_fit, "full_sequence_must_fit", false)?;
        let unread = || 0usize.into_pyobject(py).map(|o| o.into_any());
        let caching = t.config.enable_caching;
        let num_tokens = if caching || must_fit {
            field(pyo3::intern!(py, "num_tokens"))?
        } else {
            unread()?
        };
        let (num_prompt, boundary) = if caching {
            (
                field(pyo3::intern!(py, "num_prompt_tokens"))?,
                Some(field(pyo3::intern!(py, "shared_prefix_boundary"))?),
            )
        } else {
            (unread()?, None)
        };
        let args = GroupSlotArgs {
            request_id: &field(pyo3::intern!(py, "request_id"))?,
            num_computed_tokens: &field(pyo3::intern!(py, "num_computed_tokens"))?,
            num_tokens: &num_tokens,
            num_prompt_tokens: &num_prompt,
            block_hashes: &hashes,
            num_new_tokens,
            num_new_computed_tokens,
            new_computed_blocks: hits.as_ref(),
            num_lookahead_tokens,
            num_external_computed_tokens,
            delay_cache_blocks,
            full_sequence_must_fit,
            reserved_blocks,
            watermark_blocks: watermark.as_ref(),
            token_ids: token_ids.as_ref(),
            skip_zeroing_group_ids,
            num_in_flight_tokens: Some(&field(pyo3::intern!(py, "num_in_flight_tokens"))?),
            shared_prefix_boundary: boundary.as_ref(),
        };
        let (mut out, mut offsets) = (Vec::new(), Vec::new());
        if t.allocate_into(py, &args, &mut out, &mut offsets)? {
            self.blocks(py, &out, &offsets)
        } else {
            Ok(py.None().into_bound(py))
        }
    }

    /// ``KVCacheManager.get_computed_blocks(request, max_cache_hit_length=None)``: the hit
    /// valid for every group (at most ``max_cache_hit_length`` tokens, by default all but
    /// the last), its tokens, and the shared-prefix boundary (the hit plus what some
    /// group had cached beyond it; 0 when none). Nothing when caching is off or the
    /// request skips reading the prefix cache. Changes nothing.
    #[pyo3(signature = (request, max_cache_hit_length=None))]
    fn get_computed_blocks<'py>(
        &self,
        py: Python<'py>,
        request: &Bound<'py, PyAny>,
        max_cache_hit_length: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let t = self.tables.get();
        let skip = t.config.enable_caching
            && request_field(request, pyo3::intern!(py, "skip_reading_prefix_cache"))?
                .is_truthy()?;
        if !t.config.enable_caching || skip {
            return (self.empty_blocks.bind(py), 0, 0).into_pyobject(py);
        }
        let max_len = match max_cache_hit_length.filter(|o| !o.is_none()) {
            Some(o) => int_arg(o, "max_cache_hit_length", i64::MIN, i64::MAX)?,
            None => {
                let n = request_field(request, pyo3::intern!(py, "num_tokens"))?;
                int_arg(&n, "num_tokens", 0, i64::MAX)? - 1
            }
        };
        let hashes = request_field(request, pyo3::intern!(py, "block_hashes"))?;
        let mut flat = Vec::new();
        let (_, width) = super::convert::extract_hashes_after(&hashes, 0, &mut flat)?;
        let hit = t
            .with_tables_and_pool(py, |tables, pool| {
                tables.find_longest_cache_hit(
                    pool,
                    hash_slice_of(&flat, width),
                    max_len.max(0) as usize,
                )
            })
            .py_err(py)?;
        let mut ids = Vec::new();
        let mut offsets = vec![0];
        for group in &hit.blocks {
            ids.extend_from_slice(group);
            offsets.push(ids.len());
        }
        let uncached = hit.num_uncached_common_prefix_tokens;
        let boundary = if uncached > 0 {
            hit.num_tokens + uncached
        } else {
            0
        };
        (self.blocks(py, &ids, &offsets)?, hit.num_tokens, boundary).into_pyobject(py)
    }

    /// ``KVCacheManager.get_blocks(request_id)``: the request's blocks per group.
    fn get_blocks<'py>(
        &self,
        py: Python<'py>,
        request_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = super::requests::request_key(request_id)?;
        let (mut flat, mut offsets) = (Vec::new(), vec![0]);
        self.tables.get().with_tables(py, |t| {
            for g in 0..t.layout().len() {
                flat.extend_from_slice(t.blocks(id, g));
                offsets.push(flat.len());
            }
        });
        self.blocks(py, &flat, &offsets)
    }

    /// ``KVCacheManager.estimate_cached_tokens(request)``: per group, where its last cached
    /// block ends; the least over the groups.
    fn estimate_cached_tokens(
        &self,
        py: Python<'_>,
        request: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let id_obj = request_field(request, pyo3::intern!(py, "request_id"))?;
        let id = super::requests::request_key(&id_obj)?;
        Ok(self
            .tables
            .get()
            .with_tables_and_pool(py, |t, p| t.estimate_cached_tokens(p, id)))
    }

    /// ``KVCacheManager.free(request)``: frees the request's blocks, each group's tail
    /// first, and forgets it.
    fn free(&self, py: Python<'_>, request: &Bound<'_, PyAny>) -> PyResult<()> {
        let id_obj = request_field(request, pyo3::intern!(py, "request_id"))?;
        let id = super::requests::request_key(&id_obj)?;
        self.tables
            .get()
            .with_tables_and_pool(py, |t, p| t.free(p, id))
            .py_err(py)
    }

    /// ``KVCacheManager.record_prefix_cache_stats(request, num_hits)`` for a manager that
    /// records none: does nothing.
    fn record_no_prefix_cache_stats(
        &self,
        request: &Bound<'_, PyAny>,
        num_hits: &Bound<'_, PyAny>,
    ) {
        let _ = (request, num_hits);
    }
}
