//! `kvpool.GroupManager`: `kvpool.KVCacheManager` for a hybrid model's KV-cache groups.

use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use super::convert::{ids_to_numpy, int_arg, opt_bool_arg, opt_int_arg};
use super::errors::{error, ErrorKind, IntoPyResult};
use super::events::events_to_py;
use super::eviction_args::{seconds_arg, PolicyArgs, PriorityArg};
use super::group_tables::{group_ids, group_spec};
use super::hashing::{algo_arg, extract_extras, seed_arg};
use super::locking::with_lock;
use super::manager::manager_token_ids;
use super::step::{step_args, step_limits, step_requests, PyStepResult};
use crate::pool::{GroupBlocks, GroupManager, LoraInfo, ManagerConfig, StepOutcome, MAX_BLOCKS};

/// The block manager a scheduler calls per request, for a hybrid model: vLLM's
/// ``KVCacheManager`` semantics over several KV-cache groups (full attention, sliding
/// window, chunked local) in one pool, plus ``schedule_step``.
///
/// ``GroupManager(num_blocks, block_size, groups, *, enable_caching=None,
/// hash_algo=None, seed=None, enable_events=None, max_model_len=None,
/// max_in_flight_tokens=None, retention_interval=None, eviction=None,
/// max_pinned_blocks=None, clock=None, adaptive_horizon=None)``: ``groups`` as for
/// ``GroupTables`` (``"full"``, ``("sliding_window", window)``,
/// ``("chunked_local", chunk)``, each optionally with a block size of its own, a
/// multiple of ``block_size``, as a third item); the eviction arguments as for
/// ``KVCacheManager``. Per-group results are tuples of int32 arrays.
#[pyclass(frozen, module = "kvpool", name = "GroupManager")]
pub struct PyGroupManager {
    inner: Mutex<GroupManager>,
    num_blocks: u32,
    num_groups: usize,
    enable_caching: bool,
}

impl PyGroupManager {
    fn with_manager<R>(&self, py: Python<'_>, f: impl FnOnce(&mut GroupManager) -> R) -> R {
        with_lock(py, &self.inner, f)
    }

    /// One int32 array per group of `flat` cut at `offsets`.
    fn groups<'py>(
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
}

#[pymethods]
impl PyGroupManager {
    #[new]
    #[pyo3(signature = (num_blocks, block_size, groups, *, enable_caching=None, hash_algo=None, seed=None, enable_events=None, max_model_len=None, max_in_flight_tokens=None, retention_interval=None, eviction=None, max_pinned_blocks=None, clock=None, adaptive_horizon=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        num_blocks: &Bound<'_, PyAny>,
        block_size: &Bound<'_, PyAny>,
        groups: &Bound<'_, PyAny>,
        enable_caching: Option<&Bound<'_, PyAny>>,
        hash_algo: Option<&Bound<'_, PyAny>>,
        seed: Option<&Bound<'_, PyAny>>,
        enable_events: Option<&Bound<'_, PyAny>>,
        max_model_len: Option<&Bound<'_, PyAny>>,
        max_in_flight_tokens: Option<&Bound<'_, PyAny>>,
        retention_interval: Option<&Bound<'_, PyAny>>,
        eviction: Option<&Bound<'_, PyAny>>,
        max_pinned_blocks: Option<&Bound<'_, PyAny>>,
        clock: Option<&Bound<'_, PyAny>>,
        adaptive_horizon: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let mut config = ManagerConfig::new(
            int_arg(num_blocks, "num_blocks", 1, MAX_BLOCKS as i64)? as u32,
            int_arg(block_size, "block_size", 1, u32::MAX as i64)? as u32,
        );
        let policy =
            PolicyArgs::extract(py, config.num_blocks, eviction, max_pinned_blocks, clock)?
                .with_horizon(py, adaptive_horizon)?;
        config.eviction = policy.eviction;
        config.adaptive_horizon = policy.adaptive_horizon;
        config.manual_clock = policy.manual_clock;
        config.max_pinned_blocks = policy.max_pinned_blocks;
        config.enable_caching = opt_bool_arg(enable_caching, "enable_caching", true)?;
        config.hash_algo = algo_arg(py, hash_algo)?;
        config.seed = seed_arg(seed)?;
        config.enable_events = opt_bool_arg(enable_events, "enable_events", false)?;
        config.max_model_len =
            opt_int_arg(max_model_len, "max_model_len", 1, i64::MAX)?.map(|m| m as usize);
        let iter = groups.try_iter().map_err(|_| {
            error(
                py,
                ErrorKind::Dtype,
                "groups must be a sequence of group specs",
            )
        })?;
        let specs = iter
            .map(|g| group_spec(&g?, config.block_size as usize))
            .collect::<PyResult<Vec<_>>>()?;
        let in_flight = opt_int_arg(max_in_flight_tokens, "max_in_flight_tokens", 0, i64::MAX)?
            .map(|n| n as usize);
        let retention =
            opt_int_arg(retention_interval, "retention_interval", 0, i64::MAX)?.map(|n| n as usize);
        let (n_blocks, caching, n_groups) = (config.num_blocks, config.enable_caching, specs.len());
        let inner = GroupManager::new(config, specs, in_flight, retention).py_err(py)?;
        Ok(Self {
            inner: Mutex::new(inner),
            num_blocks: n_blocks,
            num_groups: n_groups,
            enable_caching: caching,
        })
    }

    /// Blocks in the pool (block 0 is the null block).
    #[getter]
    fn num_blocks(&self) -> u32 {
        self.num_blocks
    }

    /// Number of KV-cache groups.
    #[getter]
    fn num_groups(&self) -> usize {
        self.num_groups
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

    /// Adds a request: its prompt token ids and extra keys (as ``KVCacheManager``), and
    /// optionally the retention ``priority`` (``0..=100``, for ``retention_s`` seconds if
    /// given) of the blocks it caches or hits (managers built with ``eviction="priority"``).
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
        let tokens = manager_token_ids(
            prompt_token_ids,
            "prompt_token_ids",
            self.enable_caching,
            &mut buf,
        )?;
        self.with_manager(py, |m| match priority {
            None => m.add_request(id, tokens, extras, lora_info),
            Some(p) => {
                let p = p.at(m.pool().now());
                m.add_prioritized_request(id, tokens, extras, lora_info, p)
            }
        })
        .py_err(py)
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

    /// Appends token ids (generated, or newly known) to a request.
    fn append_token_ids(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        token_ids: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let id = super::requests::request_id(request_id)?;
        let mut buf = Vec::new();
        let tokens = manager_token_ids(token_ids, "token_ids", self.enable_caching, &mut buf)?;
        self.with_manager(py, |m| m.append_token_ids(&id, tokens))
            .py_err(py)
    }

    /// The longest prefix hit valid for every group, capped below the request's last
    /// token: ``(blocks per group, num_computed_tokens)``. Changes nothing.
    fn get_computed_blocks<'py>(
        &self,
        py: Python<'py>,
        request_id: &Bound<'py, PyAny>,
    ) -> PyResult<(Bound<'py, PyTuple>, usize)> {
        let id = super::requests::request_id(request_id)?;
        let hit = self
            .with_manager(py, |m| m.get_computed_blocks(&id))
            .py_err(py)?;
        let blocks = PyTuple::new(py, hit.blocks.iter().map(|b| ids_to_numpy(py, b)))?;
        Ok((blocks, hit.num_tokens))
    }

    /// Rolls the request's computed tokens back to ``num_computed_tokens`` (at most the
    /// current count), as vLLM's scheduler does when it rejects speculative tokens.
    fn set_num_computed_tokens(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        num_computed_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let id = super::requests::request_id(request_id)?;
        let n = int_arg(num_computed_tokens, "num_computed_tokens", 0, i64::MAX)? as usize;
        self.with_manager(py, |m| m.set_num_computed_tokens(&id, n))
            .py_err(py)
    }

    /// vLLM's ``request.num_in_flight_tokens``: tokens scheduled in steps whose output has
    /// not come back (async scheduling, pipeline parallelism). Window groups keep the
    /// blocks those steps still read; set it after each step is scheduled and again when
    /// its output arrives.
    fn set_num_in_flight_tokens(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
        num_in_flight_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let id = super::requests::request_id(request_id)?;
        let n = int_arg(num_in_flight_tokens, "num_in_flight_tokens", 0, i64::MAX)? as usize;
        self.with_manager(py, |m| m.set_num_in_flight_tokens(&id, n))
            .py_err(py)
    }

    /// Allocates slots for ``num_new_tokens`` new tokens (plus lookahead), adopting
    /// ``new_computed_blocks`` (per group, the hit from ``get_computed_blocks``) for a
    /// request that starts now. Returns each group's new blocks, or ``None`` when they do
    /// not fit (as in vLLM, blocks out of a window may have been given back).
    #[pyo3(signature = (request_id, num_new_tokens, *, num_new_computed_tokens=None, new_computed_blocks=None, num_lookahead_tokens=None))]
    fn allocate_slots<'py>(
        &self,
        py: Python<'py>,
        request_id: &Bound<'py, PyAny>,
        num_new_tokens: &Bound<'py, PyAny>,
        num_new_computed_tokens: Option<&Bound<'py, PyAny>>,
        new_computed_blocks: Option<&Bound<'py, PyAny>>,
        num_lookahead_tokens: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let id = super::requests::request_id(request_id)?;
        let num_new = int_arg(num_new_tokens, "num_new_tokens", 0, i64::MAX)? as usize;
        let computed = opt_int_arg(
            num_new_computed_tokens,
            "num_new_computed_tokens",
            0,
            i64::MAX,
        )?
        .unwrap_or(0) as usize;
        let lookahead = opt_int_arg(num_lookahead_tokens, "num_lookahead_tokens", 0, i64::MAX)?
            .unwrap_or(0) as usize;
        let (mut hit_flat, mut hit_offsets) = (Vec::new(), Vec::new());
        let hits = match new_computed_blocks.filter(|o| !o.is_none()) {
            Some(o) => {
                group_ids(o, self.num_blocks, &mut hit_flat, &mut hit_offsets)?;
                !hit_flat.is_empty()
            }
            None => false,
        };
        let hits = hits.then_some(GroupBlocks {
            flat: &hit_flat,
            offsets: &hit_offsets,
        });
        let (mut out, mut offsets) = (Vec::new(), Vec::new());
        let ok = self
            .with_manager(py, |m| {
                m.allocate_slots(
                    &id,
                    num_new,
                    computed,
                    hits,
                    lookahead,
                    &mut out,
                    &mut offsets,
                )
            })
            .py_err(py)?;
        if ok {
            Ok(Some(Self::groups(py, &out, &offsets)?))
        } else {
            Ok(None)
        }
    }

    /// One scheduler step in one call (as ``KVCacheManager.schedule_step``). Returns a
    /// ``StepResult`` whose ``offsets`` cut ``block_ids`` per request and group: request
    /// ``i``'s group-``g`` blocks are ``block_ids[offsets[i * G + g]:offsets[i * G + g + 1]]``
    /// for ``G`` groups.
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

    /// The request's blocks, one int32 array per group.
    fn get_block_ids<'py>(
        &self,
        py: Python<'py>,
        request_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let id = super::requests::request_id(request_id)?;
        let (mut flat, mut offsets) = (Vec::new(), vec![0]);
        self.with_manager(py, |m| -> crate::pool::PoolResult<()> {
            for g in 0..m.layout().len() {
                flat.extend_from_slice(m.block_ids(&id, g)?);
                offsets.push(flat.len());
            }
            Ok(())
        })
        .py_err(py)?;
        Self::groups(py, &flat, &offsets)
    }

    /// The request's tokens so far.
    fn get_num_tokens(&self, py: Python<'_>, request_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        let id = super::requests::request_id(request_id)?;
        self.with_manager(py, |m| m.num_tokens(&id)).py_err(py)
    }

    /// Tokens counted as computed for the request.
    fn get_num_computed_tokens(
        &self,
        py: Python<'_>,
        request_id: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let id = super::requests::request_id(request_id)?;
        self.with_manager(py, |m| m.num_computed_tokens(&id))
            .py_err(py)
    }

    /// Frees the request's blocks (each group's tail first) and forgets it.
    fn free(&self, py: Python<'_>, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = super::requests::request_id(request_id)?;
        self.with_manager(py, |m| m.free(&id)).py_err(py)
    }

    /// Frees the request's blocks; it keeps its tokens and restarts from zero.
    fn preempt(&self, py: Python<'_>, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = super::requests::request_id(request_id)?;
        self.with_manager(py, |m| m.preempt(&id)).py_err(py)
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

    /// Number of queued events (what ``take_events`` would return).
    #[getter]
    fn num_pending_events(&self, py: Python<'_>) -> usize {
        self.with_manager(py, |m| m.pool().num_pending_events())
    }

    /// Queued KV-cache events, oldest first (the queue is emptied).
    fn take_events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let events = self.with_manager(py, |m| m.take_events());
        events_to_py(py, events)
    }

    /// Clears the prefix cache (and the statistics); ``False`` (nothing changes) while
    /// blocks are in use.
    fn reset_prefix_cache(&self, py: Python<'_>) -> bool {
        self.with_manager(py, |m| m.reset_prefix_cache())
    }

    /// Prefix-cache statistics over every request admitted since the start (or last
    /// reset), as ``KVCacheManager.prefix_cache_stats``.
    #[getter]
    fn prefix_cache_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let stats = self.with_manager(py, |m| m.prefix_cache_stats().clone());
        super::manager::stats_to_py(py, &stats)
    }

    /// Prefix-cache statistics over the last 1,000 new requests admitted (vLLM's
    /// ``CachingMetrics`` window, which resumed requests do not enter) and, in the
    /// ``preempted_*`` fields, over the last 1,000 resumed ones.
    #[getter]
    fn recent_prefix_cache_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let stats = self.with_manager(py, |m| m.recent_prefix_cache_stats());
        super::manager::stats_to_py(py, &stats)
    }

    /// Raises ``InvariantError`` if the pool, the tables or the requests disagree.
    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        let result = self.with_manager(py, |m| m.check_invariants());
        result.map_err(|problems| error(py, ErrorKind::Invariant, problems.join("; ")))
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        self.with_manager(py, |m| m.request_ids().count())
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "GroupManager(num_blocks={}, groups={}, requests={})",
            self.num_blocks,
            self.num_groups,
            self.__len__(py)
        )
    }
}
