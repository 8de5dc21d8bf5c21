//! `kvpool.GroupTables`: block tables for several KV-cache groups (full attention,
//! sliding window, chunked local) over one pool, for a caller that owns its
//! requests: vLLM 0.33's `KVCacheManager` over a hybrid coordinator.

use std::sync::Mutex;

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};

use super::block_pool::{pool_arg, PyBlockPool};
use super::convert::{
    extract_block_ids, extract_hashes_after, group_index_list, ids_to_numpy, int_arg, opt_bool_arg,
    opt_int_arg, sync_known_hashes, type_name, utf8_str,
};
use super::errors::{error, ErrorKind, IntoPyResult};
use super::hashing::hash_slice_of;
use super::locking::with_lock;
use super::requests::request_id_to_py;
use crate::pool::{
    self, AttentionKind, BlockPool, GroupBlocks, GroupSlotCall, GroupSpec, GroupTables, KvGroups,
    LoraInfo, PoolConfig,
};

/// Block tables for the KV-cache groups of a hybrid model over one ``BlockPool``
/// (whose block 0 is the null block that stands for blocks a group skips).
///
/// ``GroupTables(pool, groups, *, max_model_len, max_in_flight_tokens=None,
/// retention_interval=None, record_new_block_ids=False, pool_group_ids=None,
/// scheduler_block_size=None)``: ``groups`` lists each group's attention,
/// ``"full"``, ``("sliding_window", window)`` or ``("chunked_local", chunk)``, with
/// the pool's ``block_size``, or with a block size of its own (a multiple of the
/// pool's) as a third item: ``("full", None, 32)``, ``("sliding_window", 128, 32)``.
/// ``max_in_flight_tokens`` (default
/// ``max_model_len``) bounds what a window group holds per request for the
/// full-sequence gate; ``retention_interval`` is vLLM's
/// ``prefix_cache_retention_interval``. When the tables are one part of a model's
/// groups (vLLM's per-type manager of group ``kv_cache_group_id``),
/// ``pool_group_ids`` gives each group's id in the pool's prefix cache (default:
/// its index) and ``scheduler_block_size`` the model's hit granularity (default:
/// the groups' least common block size). Per-group results are tuples of int32
/// arrays, one per group.
#[pyclass(frozen, module = "kvpool", name = "GroupTables")]
pub struct PyGroupTables {
    inner: Mutex<GroupTables>,
    pub(super) pool: Py<PyBlockPool>,
    pub(super) config: PoolConfig,
    specs: Vec<GroupSpec>,
}

/// One `allocate_slots` call's arguments as Python gave them, by name; `None` is an
/// argument's default. [`PyGroupTables::allocate_into`] converts and checks them.
pub(super) struct GroupSlotArgs<'a, 'py> {
    pub request_id: &'a Bound<'py, PyAny>,
    pub num_computed_tokens: &'a Bound<'py, PyAny>,
    pub num_tokens: &'a Bound<'py, PyAny>,
    pub num_prompt_tokens: &'a Bound<'py, PyAny>,
    pub block_hashes: &'a Bound<'py, PyAny>,
    pub num_new_tokens: &'a Bound<'py, PyAny>,
    pub num_new_computed_tokens: Option<&'a Bound<'py, PyAny>>,
    /// Per-group ids (a sequence of id arrays); `None`: nothing to adopt.
    pub new_computed_blocks: Option<&'a Bound<'py, PyAny>>,
    pub num_lookahead_tokens: Option<&'a Bound<'py, PyAny>>,
    pub num_external_computed_tokens: Option<&'a Bound<'py, PyAny>>,
    pub delay_cache_blocks: Option<&'a Bound<'py, PyAny>>,
    pub full_sequence_must_fit: Option<&'a Bound<'py, PyAny>>,
    pub reserved_blocks: Option<&'a Bound<'py, PyAny>>,
    pub watermark_blocks: Option<&'a Bound<'py, PyAny>>,
    pub token_ids: Option<&'a Bound<'py, PyAny>>,
    /// vLLM's `skip_zeroing_group_ids`: groups whose connector blocks are not zeroed.
    pub skip_zeroing_group_ids: Option<&'a Bound<'py, PyAny>>,
    pub num_in_flight_tokens: Option<&'a Bound<'py, PyAny>>,
    pub shared_prefix_boundary: Option<&'a Bound<'py, PyAny>>,
}

/// A sequence of KV-cache group ids (each `0..=u32::MAX`), named `what` in errors.
pub(super) fn group_id_list(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u32>> {
    obj.try_iter()
        .map_err(|_| {
            error(
                obj.py(),
                ErrorKind::Dtype,
                format!("{what} must be a sequence of ints"),
            )
        })?
        .map(|g| Ok(int_arg(&g?, "a group id", 0, u32::MAX as i64)? as u32))
        .collect()
}

/// A group spec from ``"full"``, ``("sliding_window", n)`` or ``("chunked_local", n)``,
/// with the pool's block size; a third item, as in ``("full", None, 32)`` or
/// ``("sliding_window", 128, 32)``, gives the group its own block size (a multiple of the
/// pool's).
pub(super) fn group_spec(obj: &Bound<'_, PyAny>, block_size: usize) -> PyResult<GroupSpec> {
    let py = obj.py();
    let bad = || {
        error(
            py,
            ErrorKind::InvalidArgument,
            format!(
                "a group is \"full\", (\"sliding_window\", window) or (\"chunked_local\", chunk), optionally with a block size as a third item, got {}",
                obj.repr().map(|r| r.to_string()).unwrap_or_else(|_| type_name(obj))
            ),
        )
    };
    if let Ok(name) = obj.cast::<PyString>() {
        return match utf8_str(name, "a group spec")? {
            "full" | "full_attention" => Ok(GroupSpec::full(block_size)),
            _ => Err(bad()),
        };
    }
    let tuple = obj.cast::<PyTuple>().map_err(|_| bad())?;
    let (block_size, len) = match tuple.len() {
        3 => (
            int_arg(
                &tuple.get_item(2)?,
                "a group's block size",
                1,
                u32::MAX as i64,
            )? as usize,
            2,
        ),
        n => (block_size, n),
    };
    if len == 1 {
        // `("full",)`: one level only (a deeper nesting is not a spec, and recursing
        // through it would run out of stack).
        let inner = tuple.get_item(0)?;
        if inner.cast::<PyString>().is_err() {
            return Err(bad());
        }
        return group_spec(&inner, block_size);
    }
    if len != 2 {
        return Err(bad());
    }
    let kind = tuple.get_item(0)?;
    let kind = kind
        .cast::<PyString>()
        .map_err(|_| bad())
        .and_then(|kind| utf8_str(kind, "a group spec").map(str::to_owned))?;
    let param = tuple.get_item(1)?;
    if matches!(kind.as_str(), "full" | "full_attention") && param.is_none() {
        return Ok(GroupSpec::full(block_size));
    }
    let n = int_arg(&param, "a group's window or chunk", 1, u32::MAX as i64)? as usize;
    match kind.as_str() {
        "sliding_window" => Ok(GroupSpec::sliding_window(block_size, n)),
        "chunked_local" | "chunked_local_attention" => Ok(GroupSpec::chunked_local(block_size, n)),
        _ => Err(bad()),
    }
}

/// A count of tokens or blocks: an int from 0 up.
fn count_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<usize> {
    Ok(int_arg(obj, what, 0, i64::MAX)? as usize)
}

/// Per-group block ids from a sequence of id arrays, flat with offsets.
pub(super) fn group_ids(
    obj: &Bound<'_, PyAny>,
    num_blocks: u32,
    flat: &mut Vec<u32>,
    offsets: &mut Vec<usize>,
) -> PyResult<()> {
    let py = obj.py();
    let iter = obj.try_iter().map_err(|_| {
        error(
            py,
            ErrorKind::Dtype,
            format!(
                "per-group blocks must be a sequence of id arrays, got {}",
                type_name(obj)
            ),
        )
    })?;
    offsets.push(0);
    for group in iter {
        extract_block_ids(&group?, num_blocks, flat)?;
        offsets.push(flat.len());
    }
    Ok(())
}

/// One int32 array per group of `flat` cut at `offsets`.
fn group_arrays<'py>(
    py: Python<'py>,
    flat: &[u32],
    offsets: &[usize],
) -> PyResult<Bound<'py, PyTuple>> {
    PyTuple::new(
        py,
        offsets
            .windows(2)
            .map(|w| ids_to_numpy(py, &flat[w[0]..w[1]])),
    )
}

impl PyGroupTables {
    pub(super) fn with_tables<R>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut GroupTables) -> R,
    ) -> R {
        with_lock(py, &self.inner, f)
    }

    /// Runs `f` on the tables and the pool, locked in that order.
    pub(super) fn with_tables_and_pool<R>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut GroupTables, &mut BlockPool) -> R,
    ) -> R {
        let pool = self.pool.get();
        self.with_tables(py, |tables| pool.with_pool(py, |pool| f(tables, pool)))
    }

    /// A group index of the layout.
    fn group_arg(&self, group: &Bound<'_, PyAny>) -> PyResult<usize> {
        Ok(int_arg(group, "group", 0, self.specs.len() as i64 - 1)? as usize)
    }

    /// Block hashes of `request` past those the tables know: `(from, width, flat)`.
    pub(super) fn new_hashes(
        &self,
        py: Python<'_>,
        id: pool::RequestKey<'_>,
        hashes: &Bound<'_, PyAny>,
    ) -> PyResult<(usize, usize, Vec<u8>)> {
        let known = if self.config.enable_caching {
            sync_known_hashes(py, &self.inner, id, hashes)
        } else {
            0
        };
        let mut flat = Vec::new();
        let (from, width) = extract_hashes_after(hashes, known, &mut flat)?;
        Ok((from, width, flat))
    }

    /// `allocate_slots` with each group's new blocks appended to `out` and the group
    /// offsets to `offsets`; `Ok(false)` when they do not fit.
    pub(super) fn allocate_into<'py>(
        &self,
        py: Python<'py>,
        args: &GroupSlotArgs<'_, 'py>,
        out: &mut Vec<u32>,
        offsets: &mut Vec<usize>,
    ) -> PyResult<bool> {
        let GroupSlotArgs {
            request_id,
            num_computed_tokens,
            num_tokens,
            num_prompt_tokens,
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
            num_in_flight_tokens,
            shared_prefix_boundary,
        } = *args;
        let id = super::requests::request_key(request_id)?;
        let count = |o: Option<&Bound<'py, PyAny>>, what: &str| -> PyResult<usize> {
            Ok(opt_int_arg(o, what, 0, i64::MAX)?.unwrap_or(0) as usize)
        };
        let required = |o: &Bound<'py, PyAny>, what: &str| -> PyResult<usize> {
            Ok(int_arg(o, what, 0, i64::MAX)? as usize)
        };
        let (hashes_from, width, flat) = self.new_hashes(py, id, block_hashes)?;
        let (mut hit_flat, mut hit_offsets) = (Vec::new(), Vec::new());
        let hits = match new_computed_blocks.filter(|o| !o.is_none()) {
            Some(o) => {
                group_ids(o, self.config.num_blocks, &mut hit_flat, &mut hit_offsets)?;
                true
            }
            None => false,
        };
        let mut tokens = Vec::new();
        let has_tokens = self.token_ids(token_ids, &mut tokens)?;
        let skip_zeroing = group_index_list(skip_zeroing_group_ids, "skip_zeroing_group_ids")?;
        let call = GroupSlotCall {
            num_computed_tokens: required(num_computed_tokens, "num_computed_tokens")?,
            num_tokens: required(num_tokens, "num_tokens")?,
            num_prompt_tokens: required(num_prompt_tokens, "num_prompt_tokens")?,
            num_in_flight_tokens: count(num_in_flight_tokens, "num_in_flight_tokens")?,
            shared_prefix_boundary: count(shared_prefix_boundary, "shared_prefix_boundary")?,
            block_hashes: hash_slice_of(&flat, width),
            hashes_from,
            num_new_tokens: required(num_new_tokens, "num_new_tokens")?,
            num_new_computed_tokens: count(num_new_computed_tokens, "num_new_computed_tokens")?,
            new_computed_blocks: hits.then_some(GroupBlocks {
                flat: &hit_flat,
                offsets: &hit_offsets,
            }),
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
            token_ids: has_tokens.then_some(&tokens[..]),
            skip_zeroing_groups: &skip_zeroing,
            ..GroupSlotCall::new(0, 0, pool::HashSlice::empty(), 0)
        };
        self.with_tables_and_pool(py, |t, p| t.allocate_slots(p, id, &call, out, offsets))
            .py_err(py)
    }

    fn token_ids(&self, obj: Option<&Bound<'_, PyAny>>, buf: &mut Vec<i64>) -> PyResult<bool> {
        super::convert::event_token_ids(obj, self.config.enable_events, buf)
    }
}

#[pymethods]
impl PyGroupTables {
    #[new]
    #[pyo3(signature = (pool, groups, *, max_model_len, max_in_flight_tokens=None, retention_interval=None, record_new_block_ids=None, pool_group_ids=None, scheduler_block_size=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        pool: &Bound<'_, PyAny>,
        groups: &Bound<'_, PyAny>,
        max_model_len: &Bound<'_, PyAny>,
        max_in_flight_tokens: Option<&Bound<'_, PyAny>>,
        retention_interval: Option<&Bound<'_, PyAny>>,
        record_new_block_ids: Option<&Bound<'_, PyAny>>,
        pool_group_ids: Option<&Bound<'_, PyAny>>,
        scheduler_block_size: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let pool = pool_arg(pool)?;
        let config = pool.get().config.clone();
        let block_size = config.block_size as usize;
        let iter = groups.try_iter().map_err(|_| {
            error(
                py,
                ErrorKind::Dtype,
                "groups must be a sequence of group specs",
            )
        })?;
        let specs = iter
            .map(|g| group_spec(&g?, block_size))
            .collect::<PyResult<Vec<_>>>()?;
        let max_model_len = int_arg(max_model_len, "max_model_len", 1, i64::MAX)? as usize;
        let in_flight = opt_int_arg(max_in_flight_tokens, "max_in_flight_tokens", 0, i64::MAX)?
            .map_or(max_model_len, |n| n as usize);
        let retention =
            opt_int_arg(retention_interval, "retention_interval", 0, i64::MAX)?.map(|n| n as usize);
        let record = opt_bool_arg(record_new_block_ids, "record_new_block_ids", false)?;
        let pool_groups = pool_group_ids
            .map(|obj| group_id_list(obj, "pool_group_ids"))
            .transpose()?;
        let scheduler_block_size = opt_int_arg(
            scheduler_block_size,
            "scheduler_block_size",
            1,
            u32::MAX as i64,
        )?;
        if !config.null_block {
            return Err(error(
                py,
                ErrorKind::InvalidArgument,
                "KV-cache groups need a pool with a null block (null_block=True)",
            ));
        }
        let mut layout = KvGroups::new(specs.clone(), block_size, retention).py_err(py)?;
        if let Some(ids) = pool_groups {
            layout = layout.with_pool_groups(ids).py_err(py)?;
        }
        if let Some(n) = scheduler_block_size {
            layout = layout.with_scheduler_block_size(n as usize).py_err(py)?;
        }
        let inner = GroupTables::new(layout, max_model_len, in_flight, record).py_err(py)?;
        Ok(Self {
            inner: Mutex::new(inner),
            pool: pool.clone().unbind(),
            config,
            specs,
        })
    }

    /// The pool whose blocks the tables hold.
    #[getter]
    fn pool(&self, py: Python<'_>) -> Py<PyBlockPool> {
        self.pool.clone_ref(py)
    }

    /// Number of KV-cache groups.
    #[getter]
    fn num_groups(&self) -> usize {
        self.specs.len()
    }

    /// Each group's spec: ``("full_attention", None)``, ``("sliding_window", window)``
    /// or ``("chunked_local_attention", chunk)`` (the kinds' names in vLLM's KV events).
    #[getter]
    fn groups<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let items = self.specs.iter().map(|s| {
            let n = match s.kind {
                AttentionKind::Full => None,
                AttentionKind::SlidingWindow { window } => Some(window),
                AttentionKind::ChunkedLocal { chunk } => Some(chunk),
            };
            (s.kind.name(), n)
        });
        PyTuple::new(py, items.collect::<Vec<_>>())
    }

    /// The longest prefix hit of ``block_hashes``, at most ``max_length`` tokens,
    /// valid for every group: ``(blocks per group, num_tokens,
    /// num_uncached_common_prefix_tokens)``. Changes nothing.
    fn find_longest_cache_hit<'py>(
        &self,
        py: Python<'py>,
        block_hashes: &Bound<'py, PyAny>,
        max_length: &Bound<'py, PyAny>,
    ) -> PyResult<(Bound<'py, PyTuple>, usize, usize)> {
        let max_length = int_arg(max_length, "max_length", 0, i64::MAX)? as usize;
        let mut flat = Vec::new();
        let (_, width) = extract_hashes_after(block_hashes, 0, &mut flat)?;
        let hit = self
            .with_tables_and_pool(py, |t, p| {
                t.find_longest_cache_hit(p, hash_slice_of(&flat, width), max_length)
            })
            .py_err(py)?;
        let blocks = PyTuple::new(py, hit.blocks.iter().map(|b| ids_to_numpy(py, b)))?;
        Ok((
            blocks,
            hit.num_tokens,
            hit.num_uncached_common_prefix_tokens,
        ))
    }

    /// vLLM's ``allocate_slots`` for a request whose state is ``num_computed_tokens``,
    /// ``num_tokens``, ``num_prompt_tokens`` and ``block_hashes``: each group's new
    /// blocks, or ``None`` when they do not fit. ``new_computed_blocks`` is the hit's
    /// blocks per group (``None``: vLLM's empty sentinel). As in vLLM, blocks that
    /// fell out of a group's window are given back first, even if the call then
    /// returns ``None``. ``skip_zeroing_group_ids`` lists the groups whose connector
    /// blocks are left out of those recorded for zeroing (an async load writes them).
    #[pyo3(signature = (request_id, num_computed_tokens, num_tokens, num_prompt_tokens, block_hashes, num_new_tokens, num_new_computed_tokens=None, new_computed_blocks=None, num_lookahead_tokens=None, num_external_computed_tokens=None, delay_cache_blocks=None, full_sequence_must_fit=None, reserved_blocks=None, watermark_blocks=None, token_ids=None, num_in_flight_tokens=None, shared_prefix_boundary=None, skip_zeroing_group_ids=None))]
    #[allow(clippy::too_many_arguments)]
    fn allocate_slots<'py>(
        &self,
        py: Python<'py>,
        request_id: &Bound<'py, PyAny>,
        num_computed_tokens: &Bound<'py, PyAny>,
        num_tokens: &Bound<'py, PyAny>,
        num_prompt_tokens: &Bound<'py, PyAny>,
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
        num_in_flight_tokens: Option<&Bound<'py, PyAny>>,
        shared_prefix_boundary: Option<&Bound<'py, PyAny>>,
        skip_zeroing_group_ids: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let args = GroupSlotArgs {
            request_id,
            num_computed_tokens,
            num_tokens,
            num_prompt_tokens,
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
            num_in_flight_tokens,
            shared_prefix_boundary,
        };
        let (mut out, mut offsets) = (Vec::new(), Vec::new());
        let ok = self.allocate_into(py, &args, &mut out, &mut offsets)?;
        if ok {
            Ok(Some(group_arrays(py, &out, &offsets)?))
        } else {
            Ok(None)
        }
    }

    /// vLLM's coordinator ``cache_blocks``: caches each group's blocks full within the
    /// first ``num_tokens`` tokens (a sliding-window group only the blocks a later hit
    /// can use, per ``retention_interval``).
    #[pyo3(signature = (request_id, block_hashes, num_tokens, num_prompt_tokens, *, shared_prefix_boundary=None, token_ids=None, lora_id=None, lora_name=None))]
    #[allow(clippy::too_many_arguments)]
    fn cache_blocks(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        block_hashes: &Bound<'_, PyAny>,
        num_tokens: &Bound<'_, PyAny>,
        num_prompt_tokens: &Bound<'_, PyAny>,
        shared_prefix_boundary: Option<&Bound<'_, PyAny>>,
        token_ids: Option<&Bound<'_, PyAny>>,
        lora_id: Option<&Bound<'_, PyAny>>,
        lora_name: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let id = super::requests::request_key(request_id)?;
        let n = int_arg(num_tokens, "num_tokens", 0, i64::MAX)? as usize;
        let prompt = int_arg(num_prompt_tokens, "num_prompt_tokens", 0, i64::MAX)? as usize;
        let boundary = opt_int_arg(
            shared_prefix_boundary,
            "shared_prefix_boundary",
            0,
            i64::MAX,
        )?
        .unwrap_or(0) as usize;
        let (from, width, flat) = self.new_hashes(py, id, block_hashes)?;
        let mut tokens = Vec::new();
        let has_tokens = self.token_ids(token_ids, &mut tokens)?;
        let lora = LoraInfo {
            id: opt_int_arg(lora_id, "lora_id", i64::MIN, i64::MAX)?,
            name: super::convert::opt_str_arg(lora_name, "lora_name")?,
        };
        self.with_tables_and_pool(py, |t, p| {
            t.cache_blocks(
                p,
                id,
                from,
                hash_slice_of(&flat, width),
                n,
                prompt,
                boundary,
                has_tokens.then_some(&tokens[..]),
                &lora,
            )
        })
        .py_err(py)
    }

    /// vLLM's ``remove_skipped_blocks``: gives back the request's blocks that no group
    /// attends to once ``processed_tokens`` are computed; the null block takes their
    /// place.
    fn remove_skipped_blocks(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        processed_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let id = super::requests::request_key(request_id)?;
        let n = int_arg(processed_tokens, "processed_tokens", 0, i64::MAX)? as usize;
        self.with_tables_and_pool(py, |t, p| t.remove_skipped_blocks(p, id, n))
            .py_err(py)
    }

    /// The request's blocks, one int32 array per group (empty for an unknown request).
    fn get_blocks<'py>(
        &self,
        py: Python<'py>,
        request_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let id = super::requests::request_key(request_id)?;
        let (mut flat, mut offsets) = (Vec::new(), vec![0]);
        self.with_tables(py, |t| {
            for g in 0..t.layout().len() {
                flat.extend_from_slice(t.blocks(id, g));
                offsets.push(flat.len());
            }
        });
        group_arrays(py, &flat, &offsets)
    }

    /// How many of the request's blocks in ``group`` are cached (``None`` until
    /// tracked).
    fn num_cached_blocks(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        group: &Bound<'_, PyAny>,
    ) -> PyResult<Option<usize>> {
        let id = super::requests::request_key(request_id)?;
        let g = int_arg(group, "group", 0, self.specs.len() as i64 - 1)? as usize;
        Ok(self.with_tables(py, |t| t.num_cached_blocks(id, g)))
    }

    /// Frees the request's blocks, each group's tail first, and forgets it (unknown:
    /// no-op).
    fn free(&self, py: Python<'_>, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = super::requests::request_key(request_id)?;
        self.with_tables_and_pool(py, |t, p| t.free(p, id))
            .py_err(py)
    }

    /// vLLM's ``record_blocks_for_zeroing``: the request's blocks from token
    /// ``start_token`` on, in every group, are recorded for zeroing again (blocks a
    /// failed async load left unwritten); ``start_token`` must be at a block boundary
    /// of every group. Nothing when not recording.
    fn record_blocks_for_zeroing(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        start_token: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let id = super::requests::request_key(request_id)?;
        let start = count_arg(start_token, "start_token")?;
        self.with_tables(py, |t| t.record_blocks_for_zeroing(id, start))
            .py_err(py)
    }

    /// Ids of blocks allocated since the last call, group by group (int32; empty
    /// unless recording).
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

    /// vLLM's coordinator ``get_num_blocks_to_allocate``: the blocks the request needs
    /// in all groups together for ``num_tokens`` tokens after
    /// ``total_computed_tokens`` computed ones, with ``new_computed_blocks`` (one id
    /// sequence per group) the prefix hit it would add (hit blocks in the free queue
    /// count); ``apply_admission_cap=True`` caps each window group at what it holds at
    /// a time, as the full-sequence admission gate does. Changes nothing.
    #[pyo3(signature = (request_id, num_tokens, total_computed_tokens, *, new_computed_blocks=None, apply_admission_cap=None))]
    fn num_blocks_to_allocate(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        num_tokens: &Bound<'_, PyAny>,
        total_computed_tokens: &Bound<'_, PyAny>,
        new_computed_blocks: Option<&Bound<'_, PyAny>>,
        apply_admission_cap: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        let id = super::requests::request_key(request_id)?;
        let num_tokens = count_arg(num_tokens, "num_tokens")?;
        let total = count_arg(total_computed_tokens, "total_computed_tokens")?;
        let (mut flat, mut offsets) = (Vec::new(), Vec::new());
        let hits = match new_computed_blocks.filter(|o| !o.is_none()) {
            Some(o) => {
                group_ids(o, self.config.num_blocks, &mut flat, &mut offsets)?;
                Some(GroupBlocks {
                    flat: &flat,
                    offsets: &offsets,
                })
            }
            None => None,
        };
        let apply_cap = opt_bool_arg(apply_admission_cap, "apply_admission_cap", false)?;
        self.with_tables_and_pool(py, |t, p| {
            t.num_blocks_to_allocate(p, id, num_tokens, hits, total, apply_cap)
        })
        .py_err(py)
    }

    /// vLLM's ``get_num_blocks_to_allocate`` of one group's manager: the blocks the
    /// request needs in ``group`` for ``num_tokens`` tokens, at most
    /// ``admission_cap`` held at a time when given, with ``new_computed_blocks``
    /// the prefix hit it would add (hit blocks in the free queue count). Changes
    /// nothing.
    #[pyo3(signature = (request_id, group, num_tokens, new_computed_blocks, total_computed_tokens, num_local_computed_tokens, *, admission_cap=None))]
    #[allow(clippy::too_many_arguments)]
    fn group_num_blocks_to_allocate(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        group: &Bound<'_, PyAny>,
        num_tokens: &Bound<'_, PyAny>,
        new_computed_blocks: &Bound<'_, PyAny>,
        total_computed_tokens: &Bound<'_, PyAny>,
        num_local_computed_tokens: &Bound<'_, PyAny>,
        admission_cap: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        let id = super::requests::request_key(request_id)?;
        let g = self.group_arg(group)?;
        let num_tokens = count_arg(num_tokens, "num_tokens")?;
        let mut hits = Vec::new();
        extract_block_ids(new_computed_blocks, self.config.num_blocks, &mut hits)?;
        let total = count_arg(total_computed_tokens, "total_computed_tokens")?;
        let local = count_arg(num_local_computed_tokens, "num_local_computed_tokens")?;
        let cap = opt_int_arg(admission_cap, "admission_cap", 0, i64::MAX)?.map(|n| n as usize);
        self.with_tables_and_pool(py, |t, p| {
            t.group_num_blocks_to_allocate(p, id, g, num_tokens, &hits, total, local, cap)
        })
        .py_err(py)
    }

    /// vLLM's ``add_local_computed_blocks`` of one group's manager: the request's
    /// ``group`` table, which must be empty, takes the prefix hit (touched), the
    /// null block standing for blocks the group's window skips.
    fn group_add_computed_blocks(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        group: &Bound<'_, PyAny>,
        new_computed_blocks: &Bound<'_, PyAny>,
        num_local_computed_tokens: &Bound<'_, PyAny>,
        num_external_computed_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let id = super::requests::request_key(request_id)?;
        let g = self.group_arg(group)?;
        let mut hits = Vec::new();
        extract_block_ids(new_computed_blocks, self.config.num_blocks, &mut hits)?;
        let local = count_arg(num_local_computed_tokens, "num_local_computed_tokens")?;
        let ext = count_arg(num_external_computed_tokens, "num_external_computed_tokens")?;
        self.with_tables_and_pool(py, |t, p| {
            t.group_add_computed_blocks(p, id, g, &hits, local, ext)
        })
        .py_err(py)
    }

    /// vLLM's ``allocate_external_computed_blocks`` of one group's manager: blocks
    /// for the connector-computed tokens the group keeps (recorded for zeroing when
    /// ``record_for_zeroing`` and the tables record). All or nothing.
    #[pyo3(signature = (request_id, group, num_local_computed_tokens, num_external_computed_tokens, record_for_zeroing=None))]
    fn group_allocate_external(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        group: &Bound<'_, PyAny>,
        num_local_computed_tokens: &Bound<'_, PyAny>,
        num_external_computed_tokens: &Bound<'_, PyAny>,
        record_for_zeroing: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let id = super::requests::request_key(request_id)?;
        let g = self.group_arg(group)?;
        let local = count_arg(num_local_computed_tokens, "num_local_computed_tokens")?;
        let ext = count_arg(num_external_computed_tokens, "num_external_computed_tokens")?;
        let record = opt_bool_arg(record_for_zeroing, "record_for_zeroing", true)?;
        self.with_tables_and_pool(py, |t, p| {
            t.group_allocate_external(p, id, g, local, ext, record)
        })
        .py_err(py)
    }

    /// vLLM's ``allocate_new_blocks`` of one group's manager: the new blocks (int32)
    /// that give the request's ``group`` table room for ``num_tokens`` tokens. All or
    /// nothing.
    fn group_allocate_new_blocks<'py>(
        &self,
        py: Python<'py>,
        request_id: &Bound<'py, PyAny>,
        group: &Bound<'py, PyAny>,
        num_tokens: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let id = super::requests::request_key(request_id)?;
        let g = self.group_arg(group)?;
        let num_tokens = count_arg(num_tokens, "num_tokens")?;
        let mut out = Vec::new();
        self.with_tables_and_pool(py, |t, p| {
            t.group_allocate_new_blocks(p, id, g, num_tokens, &mut out)
        })
        .py_err(py)?;
        Ok(ids_to_numpy(py, &out))
    }

    /// Hands the request's ``group`` table, which must be empty, the blocks ``ids``
    /// (as vLLM's tests assign ``req_to_blocks[request_id]``): a block the caller
    /// holds passes its reference to the table, a free block is taken out of the
    /// free queue first; the null block may stand anywhere, no other block twice.
    fn group_adopt_blocks(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        group: &Bound<'_, PyAny>,
        ids: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let id = super::requests::request_key(request_id)?;
        let g = self.group_arg(group)?;
        let mut blocks = Vec::new();
        extract_block_ids(ids, self.config.num_blocks, &mut blocks)?;
        self.with_tables_and_pool(py, |t, p| t.group_adopt_blocks(p, id, g, &blocks))
            .py_err(py)
    }

    /// vLLM's ``pop_blocks_for_free``: forgets the request and returns its blocks,
    /// one int32 array per group, without freeing them (the caller now holds their
    /// references); ``None`` for an unknown request.
    fn pop_tables<'py>(
        &self,
        py: Python<'py>,
        request_id: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let id = super::requests::request_key(request_id)?;
        let Some(groups) = self.with_tables(py, |t| t.pop_tables(id)) else {
            return Ok(None);
        };
        PyTuple::new(py, groups.iter().map(|b| ids_to_numpy(py, b))).map(Some)
    }

    /// vLLM's ``get_num_skipped_tokens`` of ``group``: the leading tokens the next
    /// token does not attend to once ``num_computed_tokens`` are computed.
    fn num_skipped_tokens(
        &self,
        group: &Bound<'_, PyAny>,
        num_computed_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let g = self.group_arg(group)?;
        let n = count_arg(num_computed_tokens, "num_computed_tokens")?;
        Ok(self.specs[g].num_skipped_tokens(n))
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
        let kinds: Vec<String> = self
            .specs
            .iter()
            .map(|s| match s.kind {
                AttentionKind::Full => "full".to_owned(),
                AttentionKind::SlidingWindow { window } => format!("sliding_window({window})"),
                AttentionKind::ChunkedLocal { chunk } => format!("chunked_local({chunk})"),
            })
            .collect();
        format!(
            "GroupTables(groups=[{}], block_size={}, requests={})",
            kinds.join(", "),
            self.config.block_size,
            self.with_tables(py, |t| t.request_ids().count())
        )
    }
}
