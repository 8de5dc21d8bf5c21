//! `kvpool.ComputedBlocksTracker`: per-sequence block hashes and computed-token
//! counts read from a `BlockPool`'s prefix cache.

use std::sync::Mutex;

use numpy::PyArray1;
use pyo3::prelude::*;

use super::block_pool::{pool_arg, PyBlockPool};
use super::convert::{extract_i64s, int_arg};
use super::errors::{error, ErrorKind, IntoPyResult};
use super::hashing::{algo_arg, extract_extras, seed_arg, PyBlockHashList};
use super::locking::with_lock;
use super::requests::{request_id, request_ids};
use crate::pool::{check_offsets, BlockPool, ComputedBlocksTracker, RequestId};

/// Tracks, per sequence, its tokens, its block hashes (incremental) and how many
/// of its tokens are already computed in ``pool``'s prefix cache.
///
/// The count is looked up afresh on every query until the sequence's prefill
/// starts (``start``), then fixed, so blocks other sequences computed while it
/// waited count and its own chunks never inflate it. It never changes counts.
#[pyclass(frozen, module = "kvpool", name = "ComputedBlocksTracker")]
pub struct PyComputedBlocksTracker {
    pool: Py<PyBlockPool>,
    inner: Mutex<ComputedBlocksTracker>,
}

impl PyComputedBlocksTracker {
    /// Runs `f` on the tracker under its lock (`locking.rs`); `f` returns plain data.
    fn with_tracker<R>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut ComputedBlocksTracker) -> R,
    ) -> R {
        with_lock(py, &self.inner, f)
    }

    /// Runs `f` on the tracker and its pool, locked in that order (the only order in
    /// which any call takes both).
    fn with_tracker_and_pool<R>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut ComputedBlocksTracker, &BlockPool) -> R,
    ) -> R {
        let pool = self.pool.get();
        self.with_tracker(py, |tracker| pool.with_pool(py, |pool| f(tracker, pool)))
    }
}

#[pymethods]
impl PyComputedBlocksTracker {
    #[new]
    #[pyo3(signature = (pool, block_size, *, hash_algo=None, seed=None))]
    fn new(
        py: Python<'_>,
        pool: &Bound<'_, PyAny>,
        block_size: &Bound<'_, PyAny>,
        hash_algo: Option<&Bound<'_, PyAny>>,
        seed: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let pool = pool_arg(pool)?.clone().unbind();
        let block_size = int_arg(block_size, "block_size", 1, u32::MAX as i64)? as usize;
        let pool_block_size = pool.bind(py).get().config.block_size as usize;
        if block_size != pool_block_size {
            return Err(error(
                py,
                ErrorKind::InvalidArgument,
                format!(
                    "block_size {block_size} differs from the pool's block_size {pool_block_size}"
                ),
            ));
        }
        let algo = algo_arg(py, hash_algo)?;
        let inner = ComputedBlocksTracker::new(block_size, algo, &seed_arg(seed)?).py_err(py)?;
        Ok(Self {
            pool,
            inner: Mutex::new(inner),
        })
    }

    /// The pool whose prefix cache is read.
    #[getter]
    fn pool(&self, py: Python<'_>) -> Py<PyBlockPool> {
        self.pool.clone_ref(py)
    }

    /// Tokens per block.
    #[getter]
    fn block_size(&self, py: Python<'_>) -> usize {
        self.with_tracker(py, |t| t.block_size())
    }

    /// The hash algorithm's name.
    #[getter]
    fn hash_algo(&self, py: Python<'_>) -> &'static str {
        self.with_tracker(py, |t| t.algo().name())
    }

    /// Starts tracking a sequence with its prompt token ids and extra keys (LoRA
    /// ``(name, path)``, cache salt, multimodal ``(identifier, offset, length)``
    /// features sorted by offset, per-block prompt-embedding digests).
    #[pyo3(signature = (seq_id, token_ids, *, lora=None, cache_salt=None, mm_features=None, prompt_embed_digests=None))]
    #[allow(clippy::too_many_arguments)]
    fn add_sequence(
        &self,
        py: Python<'_>,
        seq_id: &Bound<'_, PyAny>,
        token_ids: &Bound<'_, PyAny>,
        lora: Option<&Bound<'_, PyAny>>,
        cache_salt: Option<&Bound<'_, PyAny>>,
        mm_features: Option<&Bound<'_, PyAny>>,
        prompt_embed_digests: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let id = request_id(seq_id)?;
        let extras = extract_extras(py, lora, cache_salt, mm_features, prompt_embed_digests)?;
        let mut tokens = Vec::new();
        extract_i64s(token_ids, "token_ids", &mut tokens)?;
        self.with_tracker(py, |t| t.add_sequence(id, &tokens, extras))
            .py_err(py)
    }

    /// Appends token ids (a chunk, or decoded tokens); returns the number of blocks
    /// that became full and were hashed.
    fn append_tokens(
        &self,
        py: Python<'_>,
        seq_id: &Bound<'_, PyAny>,
        token_ids: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let id = request_id(seq_id)?;
        let mut tokens = Vec::new();
        extract_i64s(token_ids, "token_ids", &mut tokens)?;
        self.with_tracker(py, |t| t.append_tokens(&id, &tokens))
            .py_err(py)
    }

    /// Appends tokens to several sequences: segment ``i`` of ``token_ids`` (cut by
    /// ``offsets``, or one token each when ``offsets`` is None) goes to ``seq_ids[i]``.
    /// All ids are checked first.
    #[pyo3(signature = (seq_ids, token_ids, offsets=None))]
    fn append_tokens_many(
        &self,
        py: Python<'_>,
        seq_ids: &Bound<'_, PyAny>,
        token_ids: &Bound<'_, PyAny>,
        offsets: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let ids = request_ids(seq_ids)?;
        let (tokens, cuts) = segments(py, token_ids, offsets, ids.len())?;
        self.with_tracker(py, |tracker| {
            tracker.check_known(&ids)?;
            for (id, w) in ids.iter().zip(cuts.windows(2)) {
                tracker.append_tokens(id, &tokens[w[0]..w[1]])?;
            }
            Ok(())
        })
        .py_err(py)
    }

    /// Tokens of the sequence already computed in the prefix cache: full blocks
    /// only, never its last token; fixed once the sequence started.
    fn get_num_cached_tokens(&self, py: Python<'_>, seq_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        let id = request_id(seq_id)?;
        self.with_tracker_and_pool(py, |tracker, pool| tracker.num_computed_tokens(&id, pool))
            .py_err(py)
    }

    /// ``get_num_cached_tokens`` for several sequences, as an int64 array.
    fn get_num_cached_tokens_many<'py>(
        &self,
        py: Python<'py>,
        seq_ids: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let ids = request_ids(seq_ids)?;
        let counts = self
            .with_tracker_and_pool(py, |tracker, pool| {
                ids.iter()
                    .map(|id| tracker.num_computed_tokens(id, pool).map(|n| n as i64))
                    .collect::<Result<Vec<_>, _>>()
            })
            .py_err(py)?;
        Ok(PyArray1::from_vec(py, counts))
    }

    /// Marks the sequence's prefill as started: its computed count is fixed at what
    /// the pool gives now (returned). A started sequence keeps its count.
    fn start(&self, py: Python<'_>, seq_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        let id = request_id(seq_id)?;
        self.with_tracker_and_pool(py, |tracker, pool| tracker.start(&id, pool))
            .py_err(py)
    }

    /// ``start`` for several sequences, in order; returns their counts.
    fn start_many<'py>(
        &self,
        py: Python<'py>,
        seq_ids: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let ids = request_ids(seq_ids)?;
        let counts = self
            .with_tracker_and_pool(py, |tracker, pool| {
                tracker.check_known(&ids)?;
                ids.iter()
                    .map(|id| tracker.start(id, pool).map(|n| n as i64))
                    .collect::<Result<Vec<_>, _>>()
            })
            .py_err(py)?;
        Ok(PyArray1::from_vec(py, counts))
    }

    /// Whether the sequence's prefill has started.
    fn is_started(&self, py: Python<'_>, seq_id: &Bound<'_, PyAny>) -> PyResult<bool> {
        let id = request_id(seq_id)?;
        self.with_tracker(py, |t| t.get(&id).map(|s| s.is_started()))
            .py_err(py)
    }

    /// The sequence's block hashes (full blocks), as a ``BlockHashList``.
    fn get_block_hashes(
        &self,
        py: Python<'_>,
        seq_id: &Bound<'_, PyAny>,
    ) -> PyResult<PyBlockHashList> {
        let id = request_id(seq_id)?;
        let (bytes, algo) = self
            .with_tracker(py, |t| {
                let algo = t.algo();
                t.block_hashes(&id).map(|h| (h.as_bytes().to_vec(), algo))
            })
            .py_err(py)?;
        Ok(PyBlockHashList::new(bytes, algo))
    }

    /// The sequence's token ids so far, as an int64 array.
    fn get_token_ids<'py>(
        &self,
        py: Python<'py>,
        seq_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let id = request_id(seq_id)?;
        let tokens = self
            .with_tracker(py, |t| t.get(&id).map(|seq| seq.tokens().to_vec()))
            .py_err(py)?;
        Ok(PyArray1::from_vec(py, tokens))
    }

    /// Preemption: forgets the fixed count (tokens and hashes stay); the next query
    /// looks up afresh.
    fn reset_sequence(&self, py: Python<'_>, seq_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = request_id(seq_id)?;
        self.with_tracker(py, |t| t.reset(&id)).py_err(py)
    }

    /// Stops tracking the sequence (it finished or was freed).
    fn remove_sequence(&self, py: Python<'_>, seq_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = request_id(seq_id)?;
        self.with_tracker(py, |t| t.remove(&id).map(|_| ()))
            .py_err(py)
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        self.with_tracker(py, |t| t.len())
    }

    fn __contains__(&self, py: Python<'_>, seq_id: &Bound<'_, PyAny>) -> PyResult<bool> {
        let id: RequestId = request_id(seq_id)?;
        Ok(self.with_tracker(py, |t| t.contains(&id)))
    }
}

/// A flat token array cut into `n` segments by `offsets` (or one token each).
pub fn segments(
    py: Python<'_>,
    token_ids: &Bound<'_, PyAny>,
    offsets: Option<&Bound<'_, PyAny>>,
    n: usize,
) -> PyResult<(Vec<i64>, Vec<usize>)> {
    let mut tokens = Vec::new();
    extract_i64s(token_ids, "token_ids", &mut tokens)?;
    let cuts: Vec<usize> = match offsets.filter(|o| !o.is_none()) {
        Some(offsets) => {
            let mut raw = Vec::new();
            extract_i64s(offsets, "offsets", &mut raw)?;
            raw.into_iter()
                .map(|o| usize::try_from(o).unwrap_or(usize::MAX))
                .collect()
        }
        None => (0..=tokens.len()).collect(),
    };
    if cuts.len() != n + 1 {
        return Err(error(
            py,
            ErrorKind::InvalidArgument,
            format!(
                "{} segments of token ids for {n} ids",
                cuts.len().saturating_sub(1)
            ),
        ));
    }
    check_offsets(&cuts, tokens.len()).map_err(|e| super::errors::to_py(py, e))?;
    Ok((tokens, cuts))
}
