//! `kvpool.VllmSlotAllocator`: vLLM 0.33's `KVCacheManager.allocate_slots`, signature and
//! all, as one Rust call for `kvpool.vllm.KVCacheManager`. It reads vLLM's `Request`
//! (`request_id`, `num_computed_tokens`, `num_tokens`, `block_hashes`, and `status` for the
//! watermark) and delegates to `BlockTables.allocate_slots`, so the scheduler's hottest
//! call runs no Python frame of kvpool's.

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::block_tables::PyBlockTables;
use super::convert::{ids_to_numpy, int_arg, opt_bool_arg, type_name, with_scratch};
use super::errors::{error, ErrorKind};

/// ``VllmSlotAllocator(tables, empty_blocks, blocks_class, block_ids_of, waiting_statuses,
/// watermark_blocks)``: calling it is ``KVCacheManager.allocate_slots(request,
/// num_new_tokens, ...)`` with vLLM's arguments; it returns ``empty_blocks`` when no new
/// block was needed, ``blocks_class(tables.pool, ids)`` for new blocks, ``None`` when they do
/// not fit.
#[pyclass(frozen, module = "kvpool", name = "VllmSlotAllocator")]
pub struct PyVllmSlotAllocator {
    tables: Py<PyBlockTables>,
    empty_blocks: Py<PyAny>,
    blocks_class: Py<PyAny>,
    block_ids_of: Py<PyAny>,
    waiting_statuses: Py<PyTuple>,
    watermark_blocks: usize,
}

#[pymethods]
impl PyVllmSlotAllocator {
    #[new]
    fn new(
        tables: Py<PyBlockTables>,
        empty_blocks: Py<PyAny>,
        blocks_class: Py<PyAny>,
        block_ids_of: Py<PyAny>,
        waiting_statuses: Py<PyTuple>,
        watermark_blocks: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        Ok(Self {
            tables,
            empty_blocks,
            blocks_class,
            block_ids_of,
            waiting_statuses,
            watermark_blocks: int_arg(watermark_blocks, "watermark_blocks", 0, i64::MAX)? as usize,
        })
    }

    #[pyo3(signature = (request, num_new_tokens, num_new_computed_tokens=None, new_computed_blocks=None, num_lookahead_tokens=None, num_external_computed_tokens=None, delay_cache_blocks=None, num_encoder_tokens=None, full_sequence_must_fit=None, reserved_blocks=None, has_scheduled_reqs=None, skip_zeroing_group_ids=None))]
    #[allow(clippy::too_many_arguments)]
    fn __call__<'py>(
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
        let _ = (num_encoder_tokens, skip_zeroing_group_ids); // no encoder or async loads here
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
        let watermark = if scheduled && self.watermark_blocks > 0 {
            let status = request.getattr(pyo3::intern!(py, "status")).map_err(|_| {
                error(
                    py,
                    ErrorKind::Dtype,
                    "request must be a vLLM Request with a status",
                )
            })?;
            if self.waiting_statuses.bind(py).contains(status)? {
                Some(self.watermark_blocks.into_pyobject(py)?.into_any())
            } else {
                None
            }
        } else {
            None
        };
        let field = |name: &Bound<'py, pyo3::types::PyString>| {
            request.getattr(name).map_err(|_| {
                error(
                    py,
                    ErrorKind::Dtype,
                    format!(
                        "request must be a vLLM Request with {name}, got {}",
                        type_name(request)
                    ),
                )
            })
        };
        let id = field(pyo3::intern!(py, "request_id"))?;
        let computed = field(pyo3::intern!(py, "num_computed_tokens"))?;
        let num_tokens = field(pyo3::intern!(py, "num_tokens"))?;
        let t = tables.get();
        let hashes = if t.config.enable_caching {
            field(pyo3::intern!(py, "block_hashes"))?
        } else {
            PyTuple::empty(py).into_any()
        };
        with_scratch(|out| {
            let ok = t.allocate_into(
                py,
                &id,
                &computed,
                &num_tokens,
                &hashes,
                num_new_tokens,
                num_new_computed_tokens,
                hits.as_ref(),
                num_lookahead_tokens,
                num_external_computed_tokens,
                delay_cache_blocks,
                full_sequence_must_fit,
                reserved_blocks,
                watermark.as_ref(),
                None,
                out,
            )?;
            // No array at all on the common decode step that needs no new block.
            if !ok {
                Ok(py.None().into_bound(py))
            } else if out.is_empty() {
                Ok(empty.clone())
            } else {
                self.blocks_class
                    .bind(py)
                    .call1((t.pool.bind(py), ids_to_numpy(py, out)))
            }
        })
    }
}
