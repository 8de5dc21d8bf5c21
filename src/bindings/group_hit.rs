//! `kvpool.find_group_hit`: one attention kind's prefix-hit search over a pool,
//! vLLM 0.33's per-type `find_longest_cache_hit` classmethods (full attention,
//! sliding window, chunked local).

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::block_pool::pool_arg;
use super::convert::{extract_hashes_after, ids_to_numpy, int_arg, opt_int_arg};
use super::errors::{error, ErrorKind, IntoPyResult};
use super::group_tables::{group_id_list, group_spec};
use super::hashing::hash_slice_of;
use crate::pool::{check_window_max_length, find_spec_hit, KvGroups, PoolError};

/// The longest prefix hit of ``block_hashes`` (one per ``pool.block_size`` tokens)
/// for one group kind, at most ``max_length`` tokens: ``(blocks per group id,
/// num_tokens)``, the null block where the kind skips a block. ``group`` is a
/// spec as ``GroupTables`` takes it (``"full"``, ``("sliding_window", window)``,
/// ``("chunked_local", chunk)``, optionally with the group's block size, a
/// multiple of the pool's, as a third item); the hit holds for every group of
/// ``group_ids`` (default ``(0,)``) and its length is a multiple of
/// ``alignment_tokens`` (default: the group's block size). Changes nothing.
#[pyfunction]
#[pyo3(signature = (pool, group, block_hashes, max_length, *, group_ids=None, alignment_tokens=None))]
pub fn find_group_hit<'py>(
    py: Python<'py>,
    pool: &Bound<'py, PyAny>,
    group: &Bound<'py, PyAny>,
    block_hashes: &Bound<'py, PyAny>,
    max_length: &Bound<'py, PyAny>,
    group_ids: Option<&Bound<'py, PyAny>>,
    alignment_tokens: Option<&Bound<'py, PyAny>>,
) -> PyResult<(Bound<'py, PyTuple>, usize)> {
    let pool = pool_arg(pool)?;
    let hash_block_size = pool.get().config.block_size as usize;
    let spec = group_spec(group, hash_block_size)?;
    // The layout checks the spec (its window, chunk and block size).
    let layout = KvGroups::new(vec![spec], hash_block_size, None).py_err(py)?;
    let spec = &layout.specs()[0];
    let max_length = int_arg(max_length, "max_length", 0, i64::MAX)? as usize;
    let ids: Vec<u32> = match group_ids {
        None => vec![0],
        Some(obj) => group_id_list(obj, "group_ids")?,
    };
    if ids.is_empty() {
        return Err(error(
            py,
            ErrorKind::InvalidArgument,
            "group_ids must not be empty",
        ));
    }
    let alignment = opt_int_arg(alignment_tokens, "alignment_tokens", 1, i64::MAX)?
        .map_or(spec.block_size, |n| n as usize);
    if spec.is_full() && alignment < spec.block_size {
        // vLLM's fine-grained lookup: a hit ending inside a block, copied on write.
        return Err(error(
            py,
            ErrorKind::InvalidArgument,
            format!(
                "alignment_tokens {alignment} is below the block size {}: kvpool does not cover \
                 partial-block (fine-grained) hits",
                spec.block_size
            ),
        ));
    }
    let mut flat = Vec::new();
    let (_, width) = extract_hashes_after(block_hashes, 0, &mut flat)?;
    let hashes = hash_slice_of(&flat, width);
    if !spec.is_full() {
        check_window_max_length(max_length, hashes.len(), hash_block_size).py_err(py)?;
    }
    let (tables, hit) = pool
        .get()
        .with_pool(py, |p| {
            if let Some(w) = p.hash_width() {
                if !hashes.is_empty() && hashes.width() != w {
                    return Err(PoolError::HashWidth {
                        expected: Some(w),
                        got: hashes.width(),
                    });
                }
            }
            let mut buf = Vec::new();
            let view = hashes.every(spec.block_size / hash_block_size, &mut buf);
            Ok(find_spec_hit(p, view, max_length, spec, &ids, alignment))
        })
        .py_err(py)?;
    let blocks = PyTuple::new(py, tables.iter().map(|t| ids_to_numpy(py, t)))?;
    Ok((blocks, hit))
}
