//! `kvpool.KVCacheManager`: the per-request layer, with a batched step.

use std::sync::Mutex;

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyList, PyTuple};

use super::convert::{
    count_tokens, extract_block_ids, extract_i64s, ids_to_numpy, int_arg, opt_bool_arg,
    opt_int_arg, with_scratch,
};
use super::errors::{error, ErrorKind, IntoPyResult};
use super::events::events_to_py;
use super::eviction_args::{seconds_arg, PolicyArgs, PriorityArg};
use super::hashing::{algo_arg, extract_extras, seed_arg, PyBlockHashList};
use super::locking::{init_once, with_detached, with_lock};
use super::recycled_ids::RecycledIds;
use super::requests::{request_id, request_ids};
use super::step::{step_args, step_limits, step_requests, PyStepResult};
use super::tracker::segments;
use crate::pool::{
    KVCacheManager, LoraInfo, ManagerConfig, PrefixCacheStats, RequestId, RequestKey, StepOutcome,
    TokenIds, MAX_BLOCKS,
};

/// The block manager a scheduler calls per request (vLLM's ``KVCacheManager``
/// semantics, one full-attention group), plus ``schedule_step`` to hand over a whole
/// step in one call.
#[pyclass(frozen, module = "kvpool", name = "KVCacheManager")]
pub struct PyKVCacheManager {
    inner: Mutex<KVCacheManager>,
    num_blocks: u32,
    /// Whether the prefix cache is on; without it token ids are never read, so only
    /// their counts cross.
    enable_caching: bool,
    /// `allocate_slots`' recent result arrays, written again once their caller lets go.
    recycled: RecycledIds,
}

static STATS_CLASS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

pub(super) fn stats_to_py<'py>(
    py: Python<'py>,
    stats: &PrefixCacheStats,
) -> PyResult<Bound<'py, PyAny>> {
    let cls = init_once(py, &STATS_CLASS, || {
        py.import("kvpool.stats")
            .and_then(|m| m.getattr("PrefixCacheStats"))
            .map(Bound::unbind)
    })?;
    cls.bind(py).call1((
        stats.requests,
        stats.queries,
        stats.hits,
        stats.preempted_requests,
        stats.preempted_queries,
        stats.preempted_hits,
    ))
}

impl PyKVCacheManager {
    /// Runs `f` on the core manager under its lock (`locking.rs`); `f` returns plain data.
    fn with_manager<R>(&self, py: Python<'_>, f: impl FnOnce(&mut KVCacheManager) -> R) -> R {
        with_lock(py, &self.inner, f)
    }

    /// Token ids from `obj` as the manager takes them ([`manager_token_ids`]).
    fn token_ids<'a>(
        &self,
        obj: &Bound<'_, PyAny>,
        what: &str,
        buf: &'a mut Vec<i64>,
    ) -> PyResult<TokenIds<'a>> {
        manager_token_ids(obj, what, self.enable_caching, buf)
    }
}

/// Token ids from `obj` as a manager takes them: converted into `buf` with prefix
/// caching on, else only counted (nothing reads their values).
pub(super) fn manager_token_ids<'a>(
    obj: &Bound<'_, PyAny>,
    what: &str,
    caching: bool,
    buf: &'a mut Vec<i64>,
) -> PyResult<TokenIds<'a>> {
    if !caching {
        return Ok(TokenIds::Count(count_tokens(obj, what)?));
    }
    extract_i64s(obj, what, buf)?;
    Ok(TokenIds::Values(buf))
}

#[pymethods]
impl PyKVCacheManager {
    #[new]
    #[pyo3(signature = (num_blocks, block_size, *, enable_caching=None, hash_algo=None, seed=None, enable_events=None, max_model_len=None, stats_window=None, max_pending_events=None, eviction=None, max_pinned_blocks=None, clock=None, adaptive_horizon=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        num_blocks: &Bound<'_, PyAny>,
        block_size: &Bound<'_, PyAny>,
        enable_caching: Option<&Bound<'_, PyAny>>,
        hash_algo: Option<&Bound<'_, PyAny>>,
        seed: Option<&Bound<'_, PyAny>>,
        enable_events: Option<&Bound<'_, PyAny>>,
        max_model_len: Option<&Bound<'_, PyAny>>,
        stats_window: Option<&Bound<'_, PyAny>>,
        max_pending_events: Option<&Bound<'_, PyAny>>,
        eviction: Option<&Bound<'_, PyAny>>,
        max_pinned_blocks: Option<&Bound<'_, PyAny>>,
        clock: Option<&Bound<'_, PyAny>>,
        adaptive_horizon: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let num_blocks = int_arg(num_blocks, "num_blocks", 1, MAX_BLOCKS as i64)? as u32;
        let policy = PolicyArgs::extract(py, num_blocks, eviction, max_pinned_blocks, clock)?
            .with_horizon(py, adaptive_horizon)?;
        let config = ManagerConfig {
            num_blocks,
            block_size: int_arg(block_size, "block_size", 1, u32::MAX as i64)? as u32,
            enable_caching: opt_bool_arg(enable_caching, "enable_caching", true)?,
            hash_algo: algo_arg(py, hash_algo)?,
            seed: seed_arg(seed)?,
            enable_events: opt_bool_arg(enable_events, "enable_events", false)?,
            max_pending_events: super::block_pool::max_pending_events_arg(max_pending_events)?,
            max_model_len: opt_int_arg(max_model_len, "max_model_len", 1, i64::MAX)?
                .map(|m| m as usize),
            stats_window: opt_int_arg(stats_window, "stats_window", 0, 1 << 32)?.unwrap_or(1000)
                as usize,
            eviction: policy.eviction,
            adaptive_horizon: policy.adaptive_horizon,
            manual_clock: policy.manual_clock,
            max_pinned_blocks: policy.max_pinned_blocks,
        };
        let (num_blocks, enable_caching) = (config.num_blocks, config.enable_caching);
        let inner = KVCacheManager::new(config).py_err(py)?;
        Ok(Self {
            inner: Mutex::new(inner),
            num_blocks,
            enable_caching,
            recycled: RecycledIds::default(),
        })
    }

    /// Blocks in the pool (block 0 is the null block).
    #[getter]
    fn num_blocks(&self) -> u32 {
        self.num_blocks
    }

    /// Tokens per block.
    #[getter]
    fn block_size(&self, py: Python<'_>) -> usize {
        self.with_manager(py, |m| m.block_size())
    }

    /// Whether the prefix cache is on.
    #[getter]
    fn enable_caching(&self) -> bool {
        self.enable_caching
    }

    /// The block hash algorithm.
    #[getter]
    fn hash_algo(&self, py: Python<'_>) -> &'static str {
        self.with_manager(py, |m| m.hash_algo().name())
    }

    /// Adds a request: its prompt token ids and extra keys (LoRA ``(name, path)``
    /// and ``lora_id`` for events, cache salt, multimodal ``(identifier, offset,
    /// length)`` features, per-block prompt-embedding digests).
    /// ``priority`` (``0..=100``, for ``retention_s`` seconds if given) is the
    /// retention priority of the blocks the request caches or hits (managers built
    /// with ``eviction="priority"``).
    #[pyo3(signature = (request_id, prompt_token_ids, *, lora=None, lora_id=None, cache_salt=None, mm_features=None, prompt_embed_digests=None, priority=None, retention_s=None))]
    #[allow(clippy::too_many_arguments)]
    fn add_request(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        prompt_token_ids: &Bound<'_, PyAny>,
        lora: Option<&Bound<'_, PyAny>>,
        lora_id: Option<&Bound<'_, PyAny>>,
        cache_salt: Option<&Bound<'_, PyAny>>,
        mm_features: Option<&Bound<'_, PyAny>>,
        prompt_embed_digests: Option<&Bound<'_, PyAny>>,
        priority: Option<&Bound<'_, PyAny>>,
        retention_s: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let id = super::requests::request_id(request_id)?;
        let priority = PriorityArg::extract(py, priority, retention_s)?;
        let extras = extract_extras(py, lora, cache_salt, mm_features, prompt_embed_digests)?;
        let lora_info = LoraInfo {
            id: opt_int_arg(lora_id, "lora_id", i64::MIN, i64::MAX)?,
            name: extras.lora.as_ref().map(|(name, _)| name.clone()),
        };
        let mut buf = Vec::new();
        let tokens = self.token_ids(prompt_token_ids, "prompt_token_ids", &mut buf)?;
        let add = |m: &mut KVCacheManager| match priority {
            None => m.add_request(id, tokens, extras, lora_info),
            Some(p) => {
                let p = p.at(m.pool().now());
                m.add_prioritized_request(id, tokens, extras, lora_info, p)
            }
        };
        if tokens.len() > 8192 {
            // Long prompts are hashed with the GIL released, the lock taken inside.
            with_detached(py, &self.inner, add).py_err(py)
        } else {
            self.with_manager(py, add).py_err(py)
        }
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        self.with_manager(py, |m| {
            format!(
                "KVCacheManager(num_blocks={}, block_size={}, requests={}, free={}, enable_caching={}, eviction={:?})",
                self.num_blocks,
                m.block_size(),
                m.num_requests(),
                m.pool().num_free_blocks(),
                if self.enable_caching { "True" } else { "False" },
                m.pool().eviction_policy().name()
            )
        })
    }

    /// Pin the cached full blocks of ``token_ids`` (a system prompt, hashed as a
    /// request without extra keys): they are never evicted until unpinned. Returns
    /// the blocks of its longest cached prefix. Raises ``PinBudgetError`` (nothing
    /// pinned) beyond ``max_pinned_blocks``.
    fn pin_prompt(&self, py: Python<'_>, token_ids: &Bound<'_, PyAny>) -> PyResult<usize> {
        let mut buf = Vec::new();
        let tokens = self.token_ids(token_ids, "token_ids", &mut buf)?;
        self.with_manager(py, |m| m.pin_prompt(tokens)).py_err(py)
    }

    /// Unpin what ``pin_prompt(token_ids)`` pinned; returns the blocks unpinned.
    fn unpin_prompt(&self, py: Python<'_>, token_ids: &Bound<'_, PyAny>) -> PyResult<usize> {
        let mut buf = Vec::new();
        let tokens = self.token_ids(token_ids, "token_ids", &mut buf)?;
        self.with_manager(py, |m| m.unpin_prompt(tokens)).py_err(py)
    }

    /// Unpin every pinned block; returns how many there were.
    fn unpin_all(&self, py: Python<'_>) -> usize {
        self.with_manager(py, |m| m.unpin_all())
    }

    /// Number of pinned blocks.
    fn get_num_pinned_blocks(&self, py: Python<'_>) -> usize {
        self.with_manager(py, |m| m.pool().num_pinned_blocks())
    }

    /// The eviction policy: ``"lru"``, ``"priority"`` or ``"adaptive"``.
    #[getter]
    fn eviction(&self, py: Python<'_>) -> &'static str {
        self.with_manager(py, |m| m.pool().eviction_policy().name())
    }

    /// The adaptive policy's horizon in blocks freed (``adaptive_horizon=``; by default
    /// 20,000 in pools up to 25,000 blocks, fading to 0 at 30,000): how much later than
    /// it was a block two or more requests used counts as freed. Unused by the other
    /// policies.
    #[getter]
    fn adaptive_horizon(&self, py: Python<'_>) -> u64 {
        self.with_manager(py, |m| m.pool().config().horizon())
    }

    /// The pool's clock in seconds (since the manager was built, or as advanced).
    #[getter]
    fn now(&self, py: Python<'_>) -> f64 {
        self.with_manager(py, |m| m.pool().now())
    }

    /// Move a ``clock="manual"`` manager's clock forward by ``seconds`` (>= 0).
    fn advance_clock(&self, py: Python<'_>, seconds: &Bound<'_, PyAny>) -> PyResult<()> {
        let seconds = seconds_arg(seconds, "seconds")?;
        self.with_manager(py, |m| m.advance_clock(seconds))
            .py_err(py)
    }

    /// The longest prefix-cache hit of a waiting request, capped below its last
    /// token: ``(block_ids, num_computed_tokens)``. Never changes counts.
    fn get_computed_blocks<'py>(
        &self,
        py: Python<'py>,
        request_id: &Bound<'py, PyAny>,
    ) -> PyResult<(Bound<'py, PyArray1<i32>>, usize)> {
        let id = super::requests::request_key(request_id)?;
        let mut out = Vec::new();
        let n = self
            .with_manager(py, |m| m.get_computed_blocks(&id, &mut out))
            .py_err(py)?;
        Ok((ids_to_numpy(py, &out), n))
    }

    /// Allocates slots for ``num_new_tokens`` new tokens (plus lookahead), taking
    /// ``new_computed_blocks`` (the hit from ``get_computed_blocks``) for a request
    /// that starts now. Returns the new block ids, or None (nothing changed) when the
    /// pool is short. The array may be an earlier result that nothing references any
    /// more, written again (as ``BlockPool.get_new_blocks``).
    #[pyo3(signature = (request_id, num_new_tokens, *, num_new_computed_tokens=None, new_computed_blocks=None, num_lookahead_tokens=None))]
    fn allocate_slots<'py>(
        &self,
        py: Python<'py>,
        request_id: &Bound<'py, PyAny>,
        num_new_tokens: &Bound<'py, PyAny>,
        num_new_computed_tokens: Option<&Bound<'py, PyAny>>,
        new_computed_blocks: Option<&Bound<'py, PyAny>>,
        num_lookahead_tokens: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyArray1<i32>>>> {
        let id = super::requests::request_key(request_id)?;
        let num_new = int_arg(num_new_tokens, "num_new_tokens", 0, i64::MAX)? as usize;
        let num_computed = opt_int_arg(
            num_new_computed_tokens,
            "num_new_computed_tokens",
            0,
            i64::MAX,
        )?
        .unwrap_or(0) as usize;
        let lookahead = opt_int_arg(num_lookahead_tokens, "num_lookahead_tokens", 0, i64::MAX)?
            .unwrap_or(0) as usize;
        let mut hits = Vec::new();
        if let Some(blocks) = new_computed_blocks.filter(|b| !b.is_none()) {
            extract_block_ids(blocks, self.num_blocks, &mut hits)?;
        }
        with_scratch(|out| {
            let ok = self
                .with_manager(py, |m| {
                    m.allocate_slots(&id, num_new, num_computed, &hits, lookahead, out)
                })
                .py_err(py)?;
            Ok(ok.then(|| self.recycled.to_numpy(py, out)))
        })
    }

    /// One scheduler step in one call. For each request in order: one that has not
    /// started looks up its prefix hit and schedules ``min(num_new_tokens[i],
    /// num_tokens - hit)`` tokens; a running one schedules ``num_new_tokens[i]``; then
    /// its slots are allocated as by ``allocate_slots``. A request that does not fit
    /// is marked (``status[i] == StepStatus.NO_BLOCKS``, nothing changed for it).
    ///
    /// vLLM's step rules, all off by default (then this is exactly the one-by-one
    /// calls): ``stop_at_first_failure`` skips the rest after the first failure;
    /// ``token_budget`` caps the tokens the whole step schedules (hits are free; a
    /// prefill is chunked to what is left); ``max_num_requests`` caps the requests it
    /// schedules; ``preempt`` lets a running request that does not fit preempt running
    /// requests from the end of the list, newest first, or itself when none is left,
    /// after which no waiting request is admitted (give running requests first, as
    /// vLLM orders them; ids must then be distinct). Unknown ids fail the whole call
    /// before anything changes. Returns a ``StepResult``.
    #[pyo3(signature = (request_ids, num_new_tokens, *, num_lookahead_tokens=None, stop_at_first_failure=None, token_budget=None, max_num_requests=None, preempt=None))]
    #[allow(clippy::too_many_arguments)]
    fn schedule_step(
        &self,
        py: Python<'_>,
        request_ids: &Bound<'_, PyAny>,
        num_new_tokens: &Bound<'_, PyAny>,
        num_lookahead_tokens: Option<&Bound<'_, PyAny>>,
        stop_at_first_failure: Option<&Bound<'_, PyAny>>,
        token_budget: Option<&Bound<'_, PyAny>>,
        max_num_requests: Option<&Bound<'_, PyAny>>,
        preempt: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyStepResult> {
        let limits = step_limits(
            stop_at_first_failure,
            token_budget,
            max_num_requests,
            preempt,
        )?;
        let (ids, news, lookaheads) = step_args(request_ids, num_new_tokens, num_lookahead_tokens)?;
        let step = step_requests(&ids, &news, &lookaheads);
        let mut outcome = StepOutcome::default();
        self.with_manager(py, |m| m.schedule_step(&step, limits, &mut outcome))
            .py_err(py)?;
        Ok(PyStepResult::from_outcome(outcome))
    }

    /// Appends token ids (generated, or newly known) to a request.
    fn append_token_ids(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        token_ids: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let id = super::requests::request_key(request_id)?;
        let mut buf = Vec::new();
        let tokens = self.token_ids(token_ids, "token_ids", &mut buf)?;
        self.with_manager(py, |m| m.append_token_ids(&id, tokens))
            .py_err(py)
    }

    /// Appends tokens to several requests: segment ``i`` of ``token_ids`` (cut by
    /// ``offsets``; one token each when None, as after a decode step) goes to
    /// ``request_ids[i]``. All ids are checked first.
    #[pyo3(signature = (request_ids, token_ids, offsets=None))]
    fn append_token_ids_many(
        &self,
        py: Python<'_>,
        request_ids: &Bound<'_, PyAny>,
        token_ids: &Bound<'_, PyAny>,
        offsets: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        super::requests::with_request_keys(request_ids, |ids| {
            let (tokens, cuts) = segments(py, token_ids, offsets, ids.len())?;
            let keeps_tokens = self.enable_caching; // token ids are read only with caching
            self.with_manager(py, |manager| {
                // Every request known, then every one within max_model_len (a request
                // named twice counts both segments), before anything is appended.
                for id in ids {
                    manager.num_tokens(id)?;
                }
                let mut more: hashbrown::HashMap<&RequestKey<'_>, usize> =
                    hashbrown::HashMap::with_capacity(ids.len());
                for (id, w) in ids.iter().zip(cuts.windows(2)) {
                    let n = more.entry(id).or_default();
                    *n += w[1] - w[0];
                    manager.check_room(id, *n)?;
                }
                for (id, w) in ids.iter().zip(cuts.windows(2)) {
                    let segment = &tokens[w[0]..w[1]];
                    let segment = if keeps_tokens {
                        TokenIds::Values(segment)
                    } else {
                        TokenIds::Count(segment.len())
                    };
                    manager.append_token_ids(id, segment)?;
                }
                Ok(())
            })
            .py_err(py)
        })
    }

    /// Frees a finished request's blocks (tail first) and forgets it.
    fn free(&self, py: Python<'_>, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = super::requests::request_key(request_id)?;
        self.with_manager(py, |m| m.free(&id)).py_err(py)
    }

    /// Frees several requests in order; all ids are checked first.
    fn free_many(&self, py: Python<'_>, request_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        super::requests::with_request_keys(request_ids, |ids| {
            self.with_manager(py, |m| m.free_many(ids)).py_err(py)
        })
    }

    /// Preempts a request: frees its blocks (tail first); it keeps its tokens and
    /// restarts from zero computed tokens.
    fn preempt(&self, py: Python<'_>, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = super::requests::request_key(request_id)?;
        self.with_manager(py, |m| m.preempt(&id)).py_err(py)
    }

    /// The request's block table (int32).
    fn get_block_ids<'py>(
        &self,
        py: Python<'py>,
        request_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let id = super::requests::request_key(request_id)?;
        let ids = self
            .with_manager(py, |m| m.block_ids(&id).map(<[u32]>::to_vec))
            .py_err(py)?;
        Ok(ids_to_numpy(py, &ids))
    }

    /// The block tables of several requests in one call: ``(block_ids, offsets)``, request
    /// ``i``'s blocks being ``block_ids[offsets[i]:offsets[i + 1]]`` (int32 ids, int64
    /// offsets). Every id is checked first (``UnknownRequestError``).
    fn get_block_ids_many<'py>(
        &self,
        py: Python<'py>,
        request_ids: &Bound<'py, PyAny>,
    ) -> PyResult<super::block_pool::IdsAndOffsets<'py>> {
        let ids = super::requests::request_ids(request_ids)?;
        let (flat, offsets) = self
            .with_manager(py, |m| {
                let mut flat = Vec::new();
                let mut offsets = Vec::with_capacity(ids.len() + 1);
                offsets.push(0i64);
                for id in &ids {
                    flat.extend_from_slice(m.block_ids(id)?);
                    offsets.push(flat.len() as i64);
                }
                Ok::<_, crate::pool::PoolError>((flat, offsets))
            })
            .py_err(py)?;
        Ok((ids_to_numpy(py, &flat), PyArray1::from_vec(py, offsets)))
    }

    /// ``get_num_tokens`` of several requests (int64); every id is checked first.
    fn get_num_tokens_many<'py>(
        &self,
        py: Python<'py>,
        request_ids: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        self.count_each(py, request_ids, KVCacheManager::num_tokens)
    }

    /// ``get_num_computed_tokens`` of several requests (int64); every id is checked first.
    fn get_num_computed_tokens_many<'py>(
        &self,
        py: Python<'py>,
        request_ids: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        self.count_each(py, request_ids, KVCacheManager::num_computed_tokens)
    }

    /// The request's block hashes (full blocks).
    fn get_block_hashes(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
    ) -> PyResult<PyBlockHashList> {
        let id = super::requests::request_key(request_id)?;
        let (bytes, algo) = self
            .with_manager(py, |m| {
                let algo = m.hash_algo();
                m.block_hashes(&id).map(|h| (h.as_bytes().to_vec(), algo))
            })
            .py_err(py)?;
        Ok(PyBlockHashList::new(bytes, algo))
    }

    /// The request's number of tokens so far.
    fn get_num_tokens(&self, py: Python<'_>, request_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        let id = super::requests::request_key(request_id)?;
        self.with_manager(py, |m| m.num_tokens(&id)).py_err(py)
    }

    /// Tokens the manager counts as computed for the request (advanced by each
    /// successful allocation, reset by preemption).
    fn get_num_computed_tokens(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let id = super::requests::request_key(request_id)?;
        self.with_manager(py, |m| m.num_computed_tokens(&id))
            .py_err(py)
    }

    /// Sets the request's computed tokens (e.g. after rejected speculative tokens).
    fn set_num_computed_tokens(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        num_computed_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let id = super::requests::request_key(request_id)?;
        let n = int_arg(num_computed_tokens, "num_computed_tokens", 0, i64::MAX)? as usize;
        self.with_manager(py, |m| m.set_num_computed_tokens(&id, n))
            .py_err(py)
    }

    /// The pool's free queue, head (next to be reused) to tail (introspection).
    fn free_block_ids<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i32>> {
        let ids: Vec<u32> = self.with_manager(py, |m| {
            m.apply_expiries();
            m.pool().free_block_ids().collect()
        });
        ids_to_numpy(py, &ids)
    }

    /// Every block's reference count, in id order (introspection).
    fn ref_counts<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i32>> {
        let counts: Vec<i32> = self.with_manager(py, |m| {
            m.pool()
                .ref_counts()
                .map(|c| c.min(i32::MAX as u32) as i32)
                .collect()
        });
        PyArray1::from_vec(py, counts)
    }

    /// Fraction of usable blocks in use.
    fn get_usage(&self, py: Python<'_>) -> f64 {
        self.with_manager(py, |m| m.usage())
    }

    /// Free blocks in the pool.
    fn get_num_free_blocks(&self, py: Python<'_>) -> usize {
        self.with_manager(py, |m| m.pool().num_free_blocks())
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
            || self.with_manager(py, |m| m.take_events()),
            |taken| self.with_manager(py, |m| m.return_events(taken)),
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
            || self.with_manager(py, |m| m.take_events()),
            |taken| self.with_manager(py, |m| m.return_events(taken)),
        )
    }

    /// Queued KV-cache events, oldest first (the queue is emptied).
    fn take_events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let events = self.with_manager(py, |m| m.take_events());
        events_to_py(py, events)
    }

    /// Number of queued events (what ``take_events`` would return).
    #[getter]
    fn num_pending_events(&self, py: Python<'_>) -> usize {
        self.with_manager(py, |m| m.pool().num_pending_events())
    }

    /// Events dropped, oldest first, because ``max_pending_events`` were already
    /// queued; counted since the manager was built.
    #[getter]
    fn num_dropped_events(&self, py: Python<'_>) -> u64 {
        self.with_manager(py, |m| m.pool().num_dropped_events())
    }

    /// Clears the prefix cache and the statistics; refused (False) while any block
    /// is in use.
    fn reset_prefix_cache(&self, py: Python<'_>) -> bool {
        self.with_manager(py, |m| m.reset_prefix_cache())
    }

    /// Prefix-cache statistics over every lookup since the start (or last reset).
    #[getter]
    fn prefix_cache_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let stats = self.with_manager(py, |m| m.prefix_cache_stats().clone());
        stats_to_py(py, &stats)
    }

    /// Prefix-cache statistics over the last ``stats_window`` new requests admitted
    /// (vLLM's ``CachingMetrics`` window, which resumed requests do not enter) and, in
    /// the ``preempted_*`` fields, over the last ``stats_window`` resumed ones.
    #[getter]
    fn recent_prefix_cache_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let stats = self.with_manager(py, |m| m.recent_prefix_cache_stats());
        stats_to_py(py, &stats)
    }

    /// The tracked request ids.
    fn request_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let mut ids: Vec<_> = self.with_manager(py, |m| m.request_ids().cloned().collect());
        ids.sort();
        let items = ids
            .iter()
            .map(|id| super::requests::request_id_to_py(py, id))
            .collect::<PyResult<Vec<_>>>()?;
        PyTuple::new(py, items)
    }

    /// Walks the pool's structure and the block tables; raises ``InvariantError``.
    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        self.with_manager(py, |m| m.check_invariants())
            .map_err(|problems| error(py, ErrorKind::Invariant, problems.join("; ")))
    }

    fn __contains__(&self, py: Python<'_>, request_id: &Bound<'_, PyAny>) -> PyResult<bool> {
        let id = super::requests::request_key(request_id)?;
        Ok(self.with_manager(py, |m| m.contains(&id)))
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        self.with_manager(py, |m| m.num_requests())
    }
}

#[allow(unused_imports)]
use {request_id as _, request_ids as _};

impl PyKVCacheManager {
    /// `count(request)` for each of `request_ids` (converted first), as an int64 array.
    fn count_each<'py>(
        &self,
        py: Python<'py>,
        request_ids: &Bound<'py, PyAny>,
        count: fn(&KVCacheManager, &RequestId) -> crate::pool::PoolResult<usize>,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let ids = super::requests::request_ids(request_ids)?;
        let counts = self
            .with_manager(py, |m| {
                ids.iter()
                    .map(|id| count(m, id).map(|n| n as i64))
                    .collect::<Result<Vec<_>, _>>()
            })
            .py_err(py)?;
        Ok(PyArray1::from_vec(py, counts))
    }
}
