//! `kvpool.VllmManagerCalls`: the per-request calls vLLM 0.33's scheduler makes on its
//! `KVCacheManager` most often (`allocate_slots` with its whole signature,
//! `get_computed_blocks`, `get_blocks`, `estimate_cached_tokens`, `free`), each as one Rust
//! call for `kvpool.vllm.KVCacheManager`, which binds them as its own methods. They read
//! vLLM's `Request` (`request_id`, `num_computed_tokens`, `num_tokens`, `block_hashes`,
//! `skip_reading_prefix_cache`, and `status` for the watermark) and delegate to
//! `BlockTables` and its `BlockPool`, so the scheduler's hot calls run no Python frame of
//! kvpool's.

use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};

use super::block_tables::{PyBlockTables, SlotArgs};
use super::convert::{int_arg, opt_bool_arg, owned_arg, type_name, with_scratch};
use super::errors::{error, ErrorKind, IntoPyResult};
use super::recycled_ids::RecycledIds;
use crate::pool::SlotCall;

/// ``VllmManagerCalls(tables, empty_blocks, blocks_class, block_ids_of, waiting_statuses,
/// watermark_blocks)``: vLLM's per-request ``KVCacheManager`` calls over ``tables``.
/// Results holding blocks are ``empty_blocks`` when there is none and
/// ``blocks_class(tables.pool, ids)`` otherwise; ``block_ids_of(blocks)`` reads the ids of
/// a ``KVCacheBlocks`` that is not a ``blocks_class``.
#[pyclass(frozen, module = "kvpool", name = "VllmManagerCalls")]
pub struct PyVllmManagerCalls {
    tables: Py<PyBlockTables>,
    empty_blocks: Py<PyAny>,
    blocks_class: Py<PyAny>,
    block_ids_of: Py<PyAny>,
    waiting_statuses: Py<PyTuple>,
    watermark_blocks: usize,
    /// The pool's block size.
    block_size: usize,
    /// Recent result arrays, written again once nothing else references them.
    recycled: RecycledIds,
}

impl PyVllmManagerCalls {
    /// `empty_blocks` for no id, else `blocks_class(pool, ids)`.
    fn blocks<'py>(&self, py: Python<'py>, ids: &[u32]) -> PyResult<Bound<'py, PyAny>> {
        if ids.is_empty() {
            Ok(self.empty_blocks.bind(py).clone())
        } else {
            self.blocks_class.bind(py).call1((
                self.tables.get().pool.bind(py),
                self.recycled.to_numpy(py, ids),
            ))
        }
    }
}

/// The watermark of one `allocate_slots` call, as an argument: vLLM keeps
/// `watermark_blocks` free only for a waiting or preempted request while others are
/// scheduled (`request.status` is read only then). `None` for no watermark.
pub(super) fn watermark_arg<'py>(
    request: &Bound<'py, PyAny>,
    scheduled: bool,
    watermark_blocks: usize,
    waiting_statuses: &Bound<'py, PyTuple>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    if !scheduled || watermark_blocks == 0 {
        return Ok(None);
    }
    let py = request.py();
    let status = request_field(request, pyo3::intern!(py, "status"))?;
    if waiting_statuses.contains(status)? {
        Ok(Some(watermark_blocks.into_pyobject(py)?.into_any()))
    } else {
        Ok(None)
    }
}

/// `request.<name>`, or a `DtypeError` naming what a vLLM `Request` should have.
pub(super) fn request_field<'py>(
    request: &Bound<'py, PyAny>,
    name: &Bound<'py, PyString>,
) -> PyResult<Bound<'py, PyAny>> {
    request.getattr(name).map_err(|_| {
        error(
            request.py(),
            ErrorKind::Dtype,
            format!(
                "request must be a vLLM Request with {name}, got {}",
                type_name(request)
            ),
        )
    })
}

#[pymethods]
impl PyVllmManagerCalls {
    #[new]
    fn new(
        tables: &Bound<'_, PyAny>,
        empty_blocks: Py<PyAny>,
        blocks_class: Py<PyAny>,
        block_ids_of: Py<PyAny>,
        waiting_statuses: &Bound<'_, PyAny>,
        watermark_blocks: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let tables = owned_arg::<PyBlockTables>(tables, "tables", "a kvpool.BlockTables")?;
        let waiting_statuses =
            owned_arg::<PyTuple>(waiting_statuses, "waiting_statuses", "a tuple")?;
        let block_size = tables.get().config.block_size as usize;
        Ok(Self {
            tables,
            empty_blocks,
            blocks_class,
            block_ids_of,
            waiting_statuses,
            watermark_blocks: int_arg(watermark_blocks, "watermark_blocks", 0, i64::MAX)? as usize,
            block_size,
            recycled: RecycledIds::default(),
        })
    }

    /// ``KVCacheManager.allocate_slots(request, num_new_tokens, ...)`` with vLLM's
    /// arguments: ``empty_blocks`` when no new block was needed, the new blocks, or ``None``
    /// when they do not fit (nothing changes).
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
        let tables = self.tables.bind(py);
        let empty = self.empty_blocks.bind(py);
        let hits = match new_computed_blocks {
            None => None,
            Some(b) if b.is_none() || b.is(empty) => None,
            Some(b) if b.get_type().is(self.blocks_class.bind(py)) => {
                Some(b.getattr(pyo3::intern!(py, "ids"))?)
            }
            Some(b) => Some(self.block_ids_of.bind(py).call1((b,))?),
        };
        let scheduled = opt_bool_arg(has_scheduled_reqs, "has_scheduled_reqs", true)?;
        let watermark = watermark_arg(
            request,
            scheduled,
            self.watermark_blocks,
            self.waiting_statuses.bind(py),
        )?;
        let field = |name: &Bound<'py, PyString>| request_field(request, name);
        let id = field(pyo3::intern!(py, "request_id"))?;
        let computed = field(pyo3::intern!(py, "num_computed_tokens"))?;
        let t = tables.get();
        // `Request.num_tokens` is a Python property: read only when the call needs it.
        let must_fit = opt_bool_arg(full_sequence_must_fit, "full_sequence_must_fit", false)?;
        let num_tokens = if SlotCall::needs_num_tokens(t.config.enable_caching, must_fit) {
            Some(field(pyo3::intern!(py, "num_tokens"))?)
        } else {
            None
        };
        let hashes = if t.config.enable_caching {
            field(pyo3::intern!(py, "block_hashes"))?
        } else {
            PyTuple::empty(py).into_any()
        };
        with_scratch(|out| {
            let args = SlotArgs {
                request_id: &id,
                num_computed_tokens: &computed,
                num_tokens: num_tokens.as_ref(),
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
                token_ids: None,
                skip_zeroing_group_ids,
            };
            let ok = t.allocate_into(py, &args, out)?;
            // No array at all on the common decode step that needs no new block.
            if !ok {
                Ok(py.None().into_bound(py))
            } else {
                self.blocks(py, out)
            }
        })
    }

    /// ``KVCacheManager.get_computed_blocks(request, max_cache_hit_length=None)``: the
    /// blocks of the request's longest cached prefix (at most ``max_cache_hit_length``
    /// tokens, by default all but the last token), their token count, and 0 (the
    /// shared-prefix boundary, always 0 with one group). Nothing when caching is off or the
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
        let max_blocks = max_len.max(0) as usize / self.block_size;
        let hashes = request_field(request, pyo3::intern!(py, "block_hashes"))?;
        with_scratch(|out| {
            let pool = t.pool.get();
            pool.longest_cache_hit_into(py, &hashes, 0, Some(max_blocks), out)?;
            let tokens = out.len() * self.block_size;
            (self.blocks(py, out)?, tokens, 0).into_pyobject(py)
        })
    }

    /// ``KVCacheManager.get_blocks(request_id)``: the request's blocks.
    fn get_blocks<'py>(
        &self,
        py: Python<'py>,
        request_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = super::requests::request_key(request_id)?;
        let t = self.tables.get();
        with_scratch(|out| {
            t.with_tables(py, |tables| out.extend_from_slice(tables.blocks(id)));
            self.blocks(py, out)
        })
    }

    /// ``KVCacheManager.estimate_cached_tokens(request)``: the tokens the request's cached
    /// blocks cover, the end of the last block of its table that still holds a hash (a
    /// block at table index `i` was cached holding `(i + 1) * block_size` tokens; one
    /// whose hash was evicted counts no more, as in vLLM); 0 for an unknown request.
    fn estimate_cached_tokens(
        &self,
        py: Python<'_>,
        request: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let id_obj = request_field(request, pyo3::intern!(py, "request_id"))?;
        let id = super::requests::request_key(&id_obj)?;
        let held = self.tables.get().with_tables_and_pool(py, |t, pool| {
            let blocks = t.blocks(id);
            let cached = t.num_cached_blocks(id).unwrap_or(0).min(blocks.len());
            blocks[..cached]
                .iter()
                .rposition(|&b| pool.block_hash(b).is_ok_and(|h| h.is_some()))
                .map_or(0, |i| i + 1)
        });
        Ok(held * self.block_size)
    }

    /// ``KVCacheManager.free(request)``: frees the request's blocks tail first and forgets
    /// it (an unknown request: nothing to do).
    fn free(&self, py: Python<'_>, request: &Bound<'_, PyAny>) -> PyResult<()> {
        let id_obj = request_field(request, pyo3::intern!(py, "request_id"))?;
        let id = super::requests::request_key(&id_obj)?;
        self.tables
            .get()
            .with_tables_and_pool(py, |t, p| t.free(p, id))
            .py_err(py)
    }

    /// ``KVCacheManager.record_prefix_cache_stats(request, num_hits)`` for a manager that
    /// records none (statistics off, or prefix caching off): checks nothing, does nothing.
    fn record_no_prefix_cache_stats(
        &self,
        request: &Bound<'_, PyAny>,
        num_hits: &Bound<'_, PyAny>,
    ) {
        let _ = (request, num_hits);
    }
}
