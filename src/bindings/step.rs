//! ``schedule_step``'s arguments and its result, ``kvpool.StepResult``, shared by
//! ``KVCacheManager`` and ``GroupManager``.

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use super::convert::{extract_i64s, ids_to_numpy, opt_bool_arg, opt_int_arg};
use super::errors::{error, ErrorKind};
use crate::pool::{StepLimits, StepOutcome, StepRequest, StepStatus};

/// What ``schedule_step`` did, per request in the order given.
///
/// With ``G`` groups (1 for ``KVCacheManager``), request ``i``'s group-``g`` new blocks
/// are ``block_ids[offsets[i * G + g]:offsets[i * G + g + 1]]``; the blocks of its prefix
/// hit (requests admitted in this step) are cut from ``hit_block_ids`` by ``hit_offsets``
/// the same way, so an admitted request's whole table is its hit followed by its new
/// blocks. ``status[i]`` is a ``kvpool.StepStatus`` code saying what happened to it.
#[pyclass(frozen, module = "kvpool", name = "StepResult")]
pub struct PyStepResult {
    outcome: StepOutcome,
    /// The arrays, each built on first read (a scheduler reads only some of them).
    arrays: StepArrays,
}

/// [`PyStepResult`]'s numpy arrays, built once each, when first read.
struct StepArrays {
    block_ids: PyOnceLock<Py<PyArray1<i32>>>,
    offsets: PyOnceLock<Py<PyArray1<i64>>>,
    hit_block_ids: PyOnceLock<Py<PyArray1<i32>>>,
    hit_offsets: PyOnceLock<Py<PyArray1<i64>>>,
    num_scheduled_tokens: PyOnceLock<Py<PyArray1<i64>>>,
    num_hit_tokens: PyOnceLock<Py<PyArray1<i64>>>,
    allocated: PyOnceLock<Py<PyArray1<bool>>>,
    status: PyOnceLock<Py<PyArray1<u8>>>,
}

/// `cell`'s array, built by `make` on first use.
fn cached<'py, T: numpy::Element>(
    py: Python<'py>,
    cell: &PyOnceLock<Py<PyArray1<T>>>,
    make: impl FnOnce() -> Bound<'py, PyArray1<T>>,
) -> Bound<'py, PyArray1<T>> {
    if let Some(arr) = cell.get(py) {
        return arr.bind(py).clone();
    }
    // Built with the cell not held (object creation can run the garbage collector,
    // whose callbacks may read the same property); the first array stored wins.
    let arr = make();
    match cell.set(py, arr.clone().unbind()) {
        Ok(()) => arr,
        Err(_) => cell.get(py).map_or(arr, |won| won.bind(py).clone()),
    }
}

fn counts_to_numpy<'py>(py: Python<'py>, v: &[usize]) -> Bound<'py, PyArray1<i64>> {
    PyArray1::from_iter(py, v.iter().map(|&x| x as i64))
}

#[pymethods]
impl PyStepResult {
    /// New block ids of every request, back to back (int32).
    #[getter]
    fn block_ids<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i32>> {
        cached(py, &self.arrays.block_ids, || {
            ids_to_numpy(py, &self.outcome.block_ids)
        })
    }

    /// Where each request's (and group's) new blocks start and end (int64).
    #[getter]
    fn offsets<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        cached(py, &self.arrays.offsets, || {
            counts_to_numpy(py, &self.outcome.offsets)
        })
    }

    /// The prefix-hit blocks of every request admitted in this step, back to back (int32).
    #[getter]
    fn hit_block_ids<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i32>> {
        cached(py, &self.arrays.hit_block_ids, || {
            ids_to_numpy(py, &self.outcome.hit_block_ids)
        })
    }

    /// Where each request's (and group's) hit blocks start and end (int64).
    #[getter]
    fn hit_offsets<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        cached(py, &self.arrays.hit_offsets, || {
            counts_to_numpy(py, &self.outcome.hit_offsets)
        })
    }

    /// Tokens scheduled per request (int64; 0 unless scheduled).
    #[getter]
    fn num_scheduled_tokens<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        cached(py, &self.arrays.num_scheduled_tokens, || {
            counts_to_numpy(py, &self.outcome.num_scheduled_tokens)
        })
    }

    /// Prefix-hit tokens per request (int64; non-zero only for requests admitted now).
    #[getter]
    fn num_hit_tokens<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        cached(py, &self.arrays.num_hit_tokens, || {
            counts_to_numpy(py, &self.outcome.num_hit_tokens)
        })
    }

    /// Whether each request got its slots (bool; ``status == StepStatus.SCHEDULED``).
    #[getter]
    fn allocated<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<bool>> {
        cached(py, &self.arrays.allocated, || {
            PyArray1::from_slice(py, &self.outcome.allocated)
        })
    }

    /// What happened to each request: a ``kvpool.StepStatus`` code (uint8).
    #[getter]
    fn status<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u8>> {
        cached(py, &self.arrays.status, || {
            PyArray1::from_iter(py, self.outcome.status.iter().map(|&s| s as u8))
        })
    }

    fn __len__(&self) -> usize {
        self.outcome.status.len()
    }

    fn __repr__(&self) -> String {
        let status = &self.outcome.status;
        let count = |s: StepStatus| status.iter().filter(|&&c| c == s).count();
        format!(
            "StepResult(requests={}, allocated={}, new_blocks={}, hit_blocks={}, preempted={})",
            status.len(),
            count(StepStatus::Scheduled),
            self.outcome.block_ids.len(),
            self.outcome.hit_block_ids.len(),
            count(StepStatus::Preempted),
        )
    }
}

impl StepArrays {
    fn new() -> Self {
        Self {
            block_ids: PyOnceLock::new(),
            offsets: PyOnceLock::new(),
            hit_block_ids: PyOnceLock::new(),
            hit_offsets: PyOnceLock::new(),
            num_scheduled_tokens: PyOnceLock::new(),
            num_hit_tokens: PyOnceLock::new(),
            allocated: PyOnceLock::new(),
            status: PyOnceLock::new(),
        }
    }
}

impl PyStepResult {
    /// The result of a core step (its arrays built when first read).
    pub(super) fn from_outcome(outcome: StepOutcome) -> Self {
        Self {
            outcome,
            arrays: StepArrays::new(),
        }
    }
}

/// A step's limits from ``schedule_step``'s keyword arguments.
pub(super) fn step_limits(
    stop_at_first_failure: Option<&Bound<'_, PyAny>>,
    token_budget: Option<&Bound<'_, PyAny>>,
    max_num_requests: Option<&Bound<'_, PyAny>>,
    preempt: Option<&Bound<'_, PyAny>>,
) -> PyResult<StepLimits> {
    let count = |obj, what| -> PyResult<Option<usize>> {
        Ok(opt_int_arg(obj, what, 0, i64::MAX)?.map(|v| v as usize))
    };
    Ok(StepLimits {
        token_budget: count(token_budget, "token_budget")?,
        max_num_requests: count(max_num_requests, "max_num_requests")?,
        stop_at_first_failure: opt_bool_arg(stop_at_first_failure, "stop_at_first_failure", false)?,
        preempt: opt_bool_arg(preempt, "preempt", false)?,
    })
}

/// A step's request ids and per-request new and lookahead token counts, converted.
#[allow(clippy::type_complexity)]
pub(super) fn step_args(
    request_ids: &Bound<'_, PyAny>,
    num_new_tokens: &Bound<'_, PyAny>,
    num_lookahead_tokens: Option<&Bound<'_, PyAny>>,
) -> PyResult<(Vec<crate::pool::RequestId>, Vec<usize>, Vec<usize>)> {
    let ids = super::requests::request_ids(request_ids)?;
    let news = per_request_counts(num_new_tokens, ids.len(), "num_new_tokens")?;
    let lookaheads = match num_lookahead_tokens.filter(|o| !o.is_none()) {
        Some(obj) => per_request_counts(obj, ids.len(), "num_lookahead_tokens")?,
        None => vec![0; ids.len()],
    };
    Ok((ids, news, lookaheads))
}

/// The step of [`step_args`]' result, borrowing its ids.
pub(super) fn step_requests<'a>(
    ids: &'a [crate::pool::RequestId],
    news: &[usize],
    lookaheads: &[usize],
) -> Vec<StepRequest<'a>> {
    ids.iter()
        .zip(news.iter().zip(lookaheads))
        .map(
            |(id, (&num_new_tokens, &num_lookahead_tokens))| StepRequest {
                id,
                num_new_tokens,
                num_lookahead_tokens,
            },
        )
        .collect()
}

/// A per-request count for a step of `n` requests: one int for all, or a sequence
/// of `n` non-negative ints.
pub(super) fn per_request_counts(
    obj: &Bound<'_, PyAny>,
    n: usize,
    what: &str,
) -> PyResult<Vec<usize>> {
    let py = obj.py();
    if let Some(v) = obj
        .extract::<i64>()
        .ok()
        .filter(|_| !super::convert::is_bool_like(obj))
    {
        if v < 0 {
            return Err(error(
                py,
                ErrorKind::InvalidArgument,
                format!("{what} must be >= 0"),
            ));
        }
        return Ok(vec![v as usize; n]);
    }
    let mut raw = Vec::new();
    extract_i64s(obj, what, &mut raw)?;
    if raw.len() != n {
        return Err(error(
            py,
            ErrorKind::InvalidArgument,
            format!("{what} has {} entries for {n} requests", raw.len()),
        ));
    }
    raw.into_iter()
        .map(|v| {
            usize::try_from(v).map_err(|_| {
                error(
                    py,
                    ErrorKind::InvalidArgument,
                    format!("{what} must be >= 0"),
                )
            })
        })
        .collect()
}
