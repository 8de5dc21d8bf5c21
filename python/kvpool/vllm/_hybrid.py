"""``kvpool.vllm.KVCacheManager`` for hybrid models: several KV-cache groups (full attention,
sliding window, chunked local attention) on kvpool's Rust ``GroupTables``.

vLLM 0.33 builds a ``HybridKVCacheCoordinator`` (or a unitary one for a single window group)
over one manager per group; here each of vLLM's calls is one call of ``kvpool.GroupTables``,
where the rules are: the hit valid for every group, per-group allocation, blocks given back
when they leave a window (``remove_skipped_blocks``), sliding-window retention. Results are
``KVCacheBlocks`` over one id array per group.

Covered: groups of ``FullAttentionSpec``, ``SlidingWindowSpec`` (no ``extra_retained_tokens``)
and ``ChunkedLocalAttentionSpec`` whose block sizes are multiples of ``hash_block_size`` (the
scheduler block size their least common multiple), with or without prefix caching, with
``retention_interval``, stats, watermark, reserved blocks, external tokens, delayed caching and
KV events. Not covered (vLLM's own class is built, as for one group): Mamba and cross-attention
groups, eagle, lookahead hashing, context parallelism, metrics collectors.
"""

from __future__ import annotations

import logging
import math

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import trim_null_head
from vllm.v1.core.kv_cache_coordinator import _validate_prefix_cache_retention_interval as _validate_retention
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    KVCacheGroupRole,
    FullAttentionSpec,
    KVCacheConfig,
    SlidingWindowSpec,
    get_kv_cache_spec_kind,
    get_kv_cache_spec_sliding_window,
)
from vllm.v1.metrics.stats import PrefixCacheStats
from vllm.v1.request import Request, RequestStatus

import kvpool
from kvpool.vllm._manager import ManagerCommon
from kvpool.vllm._options import pool_options
from kvpool.vllm._views import BlockList, BlockPoolView, BlockView, block_ids_of, request_known

_LOG = logging.getLogger(__name__)

_WAITING = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
_DEFAULT_ROLE = getattr(KVCacheGroupRole, "DEFAULT", None)


def group_spec(spec: Any) -> tuple[str, int | None, int] | None:
    """A vLLM spec as a ``kvpool.GroupTables`` group (kind, window or chunk, block size), or
    ``None`` if kvpool does not cover it."""
    if type(spec) is FullAttentionSpec:
        return ("full", None, spec.block_size)
    if type(spec) is SlidingWindowSpec and not getattr(spec, "extra_retained_tokens", 0):
        return ("sliding_window", spec.sliding_window, spec.block_size)
    if type(spec) is ChunkedLocalAttentionSpec:
        return ("chunked_local", spec.attention_chunk_size, spec.block_size)
    return None


def groups_unsupported_reason(kv_cache_config: KVCacheConfig, scheduler_block_size: int,
                              hash_block_size: int) -> str | None:
    """Why kvpool's group tables do not cover these KV-cache groups, or ``None``."""
    for group in kv_cache_config.kv_cache_groups:
        spec = group.kv_cache_spec
        if group_spec(spec) is None:
            return f"a {type(spec).__name__} group"
        if spec.block_size % hash_block_size:
            return "a KV-cache group whose block size is not a multiple of hash_block_size"
        if getattr(group, "role", _DEFAULT_ROLE) != _DEFAULT_ROLE or getattr(group, "is_eagle_group", False):
            return "a KV-cache group with a role"
        if not getattr(spec, "prefix_cacheable", True):
            return "a KV-cache group that opts out of prefix caching"
    sizes = [g.kv_cache_spec.block_size for g in kv_cache_config.kv_cache_groups]
    if scheduler_block_size != math.lcm(*sizes):
        return "a scheduler_block_size other than the groups' least common block size"
    if len(sizes) == 1 and sizes[0] != hash_block_size:
        return "one group whose block size differs from hash_block_size"  # vLLM's unitary coordinator refuses it
    return None


class GroupBlocks(KVCacheBlocks):  # type: ignore[misc]
    """vLLM's ``KVCacheBlocks`` over kvpool ids, one int32 array per group; ``blocks[g]``
    views group ``g``'s as blocks."""

    def __init__(self, pool: kvpool.BlockPool, groups: tuple[npt.NDArray[Any], ...]) -> None:  # noqa: D107
        self.groups = groups
        self._pool = pool

    @property
    def blocks(self) -> tuple[BlockList, ...]:
        """The blocks as ``KVCacheBlock`` views (made on first use)."""
        return tuple(BlockList(self._pool, ids) for ids in self.groups)

    def get_block_ids(self, allow_none: bool = False, *, group_ids: Sequence[int] | None = None) -> Any:
        groups = self.groups if group_ids is None else tuple(self.groups[g] for g in group_ids)
        if allow_none and all(len(g) == 0 for g in groups):
            return None
        return tuple(g.tolist() for g in groups)

    def get_unhashed_block_ids_all_groups(self) -> list[list[int]]:
        out = []
        for ids in self.groups:
            values = ids.tolist()
            start = next((i for i, b in enumerate(values) if b != 0), len(values))
            out.append([b for b in values[start:] if b != 0 and self._pool.block_hash(b) is None])
        return out

    def __add__(self, other: KVCacheBlocks) -> KVCacheBlocks:
        if isinstance(other, GroupBlocks):
            return GroupBlocks(self._pool, tuple(np.concatenate([a, b]) for a, b in zip(self.groups, other.groups)))
        return KVCacheBlocks(tuple(list(a) + list(b) for a, b in zip(self.blocks, other.blocks)))

    def __repr__(self) -> str:
        return f"GroupBlocks({[g.tolist() for g in self.groups]})"


def group_ids_of(blocks: Any, num_groups: int) -> list[list[int]]:
    """Per-group ids of a ``KVCacheBlocks`` (kvpool's or vLLM's)."""
    if isinstance(blocks, GroupBlocks):
        return [g.tolist() for g in blocks.groups]
    return [block_ids_of(g) for g in blocks.blocks][:num_groups]


class _GroupRequestTables:
    """``single_type_managers[g].req_to_blocks``: request id -> its group-``g`` blocks."""

    def __init__(self, tables: kvpool.GroupTables, group: int) -> None:
        self._tables, self._group, self._pool = tables, group, tables.pool

    def __getitem__(self, request_id: str) -> BlockList:
        return BlockList(self._pool, self._tables.get_blocks(request_id)[self._group])

    def get(self, request_id: str, default: Any = None) -> Any:
        return self[request_id] if request_id in self else default

    def __contains__(self, request_id: object) -> bool:
        return request_known(self._tables.__contains__, request_id)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._tables.request_ids())

    def __len__(self) -> int:
        return len(self._tables)

    def keys(self) -> tuple[Any, ...]:
        return self._tables.request_ids()


class _GroupNumCached:
    """``single_type_managers[g].num_cached_block``: request id -> cached blocks."""

    def __init__(self, tables: kvpool.GroupTables, group: int) -> None:
        self._tables, self._group = tables, group

    def __getitem__(self, request_id: str) -> int:
        n = self._tables.num_cached_blocks(request_id, self._group)
        if n is None:
            raise KeyError(request_id)
        return n

    def get(self, request_id: str, default: Any = None) -> Any:
        n = self._tables.num_cached_blocks(request_id, self._group)
        return default if n is None else n

    def __contains__(self, request_id: object) -> bool:
        return request_known(lambda r: self._tables.num_cached_blocks(r, self._group) is not None, request_id)

    def __iter__(self) -> Iterator[Any]:
        return (r for r in self._tables.request_ids() if r in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)


class GroupView:
    """``coordinator.single_type_managers[g]``: group ``g``'s attributes."""

    def __init__(self, tables: kvpool.GroupTables, group: int, kv_cache_spec: Any, block_pool: Any) -> None:
        self.kv_cache_spec = kv_cache_spec
        self.block_size = kv_cache_spec.block_size
        self.kv_cache_group_id = group
        self.block_pool = block_pool
        self.enable_caching = tables.pool.enable_caching
        self.req_to_blocks = _GroupRequestTables(tables, group)
        self.num_cached_block = _GroupNumCached(tables, group)
        self.sliding_window = getattr(kv_cache_spec, "sliding_window", None)
        self.attention_chunk_size = getattr(kv_cache_spec, "attention_chunk_size", None)
        self.use_eagle = False
        self.retains_longer_hit = False
        self.records_new_block_ids = False


class GroupsPoolView(BlockPoolView):
    """``manager.block_pool`` for several groups: lookups take the group ids; allocation and
    caching by hand (as vLLM's tests do) go to the pool, their events to the manager."""

    #: The manager's event drain, called with the request after caching (set by it).
    on_cached: Any = None

    def get_new_blocks(self, num_blocks: int) -> BlockList:
        return BlockList(self._pool, self._pool.get_new_blocks(num_blocks))

    def cache_full_blocks(self, request: Request, blocks: Any, num_cached_blocks: int, num_full_blocks: int,
                          block_size: int, kv_cache_group_id: int, block_mask: list[bool] | None = None) -> None:
        if block_mask is not None and not all(block_mask):
            raise NotImplementedError("kvpool.vllm caches masked blocks only through its group tables")
        token_ids = request.all_token_ids if self._pool.enable_events else None
        if block_size != self.hash_block_size:
            # The pool's keys are hashes of hash_block_size tokens; a larger block would be
            # keyed by its last one, which GroupTables does (vLLM's hashes at that size).
            raise NotImplementedError(
                f"kvpool.vllm caches blocks of {block_size} tokens (hash_block_size {self.hash_block_size}) "
                "only through its group tables")
        self._pool.cache_full_blocks(block_ids_of(blocks), request.block_hashes, num_cached_blocks, num_full_blocks,
                                     group_id=kv_cache_group_id, token_ids=token_ids)
        if self.on_cached is not None:
            self.on_cached(request)


class GroupsCoordinatorView:
    """``manager.coordinator``: what the scheduler and tests read of vLLM's coordinator. The
    subclasses below carry the name of the coordinator vLLM would have built."""

    enable_partial_hash_hits = False
    num_reprefillable_tokens = 0

    def __init__(self, manager: HybridKVCacheManager, views: tuple[GroupView, ...],
                 retention_interval: int | None) -> None:
        self._manager = manager
        self.single_type_managers = views
        self.block_pool = manager.block_pool
        self.retention_interval = retention_interval
        self.eagle_group_ids: set[int] = set()
        self.drop_eagle_group_ids: set[int] = set()

    def get_blocks(self, request_id: str) -> tuple[BlockList, ...]:
        return self._manager.get_blocks(request_id).blocks  # type: ignore[no-any-return]

    def find_longest_cache_hit(self, block_hashes: list[bytes], max_cache_hit_length: int
                               ) -> tuple[tuple[BlockList, ...], int, int]:
        blocks, n, uncached = self._manager._tables.find_longest_cache_hit(block_hashes, max_cache_hit_length)
        pool = self._manager._pool
        return tuple(BlockList(pool, b) for b in blocks), n, uncached

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        self._manager.remove_skipped_blocks(request_id, processed_computed_tokens, num_prompt_tokens)

    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int, new_computed_blocks: Any,
                                   num_encoder_tokens: int = 0, total_computed_tokens: int = 0,
                                   num_local_computed_tokens: int = 0, num_tokens_main_model: int = 0,
                                   apply_admission_cap: bool = False, prefill_end: int = 0) -> int:
        """The blocks the request needs in all groups for ``num_tokens`` tokens after taking the
        hit ``new_computed_blocks`` (one list per group), each window group capped at what it
        holds at a time with ``apply_admission_cap`` (the scheduler sizes in-flight prefills'
        reservations so)."""
        hits = [block_ids_of(g) for g in new_computed_blocks] if any(new_computed_blocks) else None
        return self._manager._tables.num_blocks_to_allocate(
            request_id, num_tokens, total_computed_tokens, new_computed_blocks=hits,
            apply_admission_cap=apply_admission_cap)


class HybridKVCacheCoordinator(GroupsCoordinatorView):
    """Several groups, prefix caching on."""

    def __init__(self, manager: HybridKVCacheManager, views: tuple[GroupView, ...],
                 retention_interval: int | None) -> None:
        super().__init__(manager, views, retention_interval)
        # The first full-attention group, the dense reference vLLM's coordinator keeps (read by
        # connectors that look hashes up in one group); None without one.
        self.full_attention_group_id: int | None = next(
            (g for g, view in enumerate(views) if isinstance(view.kv_cache_spec, FullAttentionSpec)), None)


class UnitaryKVCacheCoordinator(GroupsCoordinatorView):
    """One (window) group, prefix caching on."""


class KVCacheCoordinatorNoPrefixCache(GroupsCoordinatorView):
    """Prefix caching off."""


class HybridKVCacheManager(ManagerCommon):
    """vLLM 0.33's ``KVCacheManager`` for full-attention, sliding-window and chunked-local
    groups, on ``kvpool.GroupTables`` (built by ``kvpool.vllm.KVCacheManager``)."""

    _tables: kvpool.GroupTables

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        scheduler_block_size: int,
        hash_block_size: int,
        max_in_flight_tokens: int | None = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        num_hash_lookahead_tokens: int = 0,
        num_prefill_lookahead: int = 0,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        metrics_collector: Any = None,
        watermark: float = 0.0,
        enable_mamba_shared_prefix_checkpoint: bool = False,
    ) -> None:
        specs = [g.kv_cache_spec for g in kv_cache_config.kv_cache_groups]
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.enable_kv_cache_events = enable_kv_cache_events
        self.use_eagle = use_eagle
        self.log_stats = log_stats
        self.metrics_collector = metrics_collector
        self.prefix_cache_stats = PrefixCacheStats() if log_stats else None
        self.block_size: int = specs[0].block_size
        #: Each group's block size, by group index.
        self._block_sizes = [spec.block_size for spec in specs]
        retention = kv_cache_config.prefix_cache_retention_interval
        _validate_retention(retention, scheduler_block_size, kv_cache_config)
        self._pool = kvpool.BlockPool(kv_cache_config.num_blocks, block_size=hash_block_size,
                                      enable_caching=enable_caching, enable_events=enable_kv_cache_events,
                                      **pool_options())
        zeroing = bool(getattr(kv_cache_config, "needs_kv_cache_zeroing", False))
        groups = [g for g in map(group_spec, specs) if g is not None]  # all covered (checked by the caller)
        self._tables = kvpool.GroupTables(
            self._pool, groups, max_model_len=max_model_len,
            max_in_flight_tokens=max_model_len if max_in_flight_tokens is None else max_in_flight_tokens,
            retention_interval=retention, record_new_block_ids=zeroing)
        self._records_new_block_ids = zeroing
        self.block_pool = GroupsPoolView(self._pool, hash_block_size)
        views = tuple(GroupView(self._tables, g, s, self.block_pool) for g, s in enumerate(specs))
        for view in views:
            view.records_new_block_ids = zeroing
        coordinator = (KVCacheCoordinatorNoPrefixCache if not enable_caching
                       else UnitaryKVCacheCoordinator if len(specs) == 1 else HybridKVCacheCoordinator)
        self.coordinator = coordinator(self, views, retention)
        self.mamba_shared_prefix_checkpoint = False
        self.num_kv_cache_groups = len(specs)
        self.retained_hit_group_ids: tuple[int, ...] = ()
        self.kv_cache_config = kv_cache_config
        if watermark < 0.0:
            raise kvpool.InvalidArgumentError("watermark must be non-negative")
        self.watermark_blocks = int(watermark * kv_cache_config.num_blocks)
        self.empty_kv_cache_blocks = KVCacheBlocks(tuple(() for _ in specs))
        self._events: list[Any] = []
        self.block_pool.kv_event_queue = self._events
        if enable_kv_cache_events:
            self.block_pool.on_cached = self._drain_events
        self._event_metadata = tuple(
            (get_kv_cache_spec_kind(s).value, get_kv_cache_spec_sliding_window(s)) for s in specs)
        n = len(specs)
        self._calls = kvpool.VllmGroupCalls(self._tables, self.empty_kv_cache_blocks, GroupBlocks,
                                            lambda blocks: group_ids_of(blocks, n), _WAITING, self.watermark_blocks)
        # The scheduler's per-request calls, bound straight to Rust: no Python frame of
        # kvpool's on them (the methods below document them and delegate alike).
        self._group_block_sizes = tuple(s.block_size for s in specs)
        self.get_computed_blocks = (  # type: ignore[method-assign]
            self._get_computed_blocks_reporting if enable_kv_cache_events and enable_caching
            else self._calls.get_computed_blocks)
        self.get_blocks = self._calls.get_blocks  # type: ignore[method-assign]
        self.estimate_cached_tokens = self._calls.estimate_cached_tokens  # type: ignore[method-assign]
        if not enable_kv_cache_events:
            self.allocate_slots = self._calls.allocate_slots  # type: ignore[method-assign]
            self.free = self._calls.free  # type: ignore[method-assign]
        if not (log_stats and enable_caching):
            self.record_prefix_cache_stats = self._calls.record_no_prefix_cache_stats  # type: ignore[method-assign]

    # -- results -----------------------------------------------------------------------------

    def create_kv_cache_blocks(self, blocks: tuple[Any, ...]) -> KVCacheBlocks:
        if not any(len(g) for g in blocks):
            return self.empty_kv_cache_blocks
        if all(isinstance(g, np.ndarray) for g in blocks):
            return GroupBlocks(self._pool, tuple(blocks))
        return KVCacheBlocks(blocks)

    # -- events ------------------------------------------------------------------------------

    def _block_stored(self, request: Request, event: Any) -> Any:
        """vLLM's ``BlockStored`` for one ``cache_full_blocks`` call of a group: its token
        ids span every block the call covered (``num_cached..num_full``), its hashes and
        extra keys only the blocks it cached (not the null block, not blocks a window's
        retention leaves out)."""
        from vllm.distributed.kv_events import MEDIUM_GPU, BlockStored
        from vllm.v1.core.kv_cache_utils import (
            generate_block_hash_extra_keys,
            maybe_convert_block_hash,
            to_event_extra_keys,
        )

        # The group's blocks, each keyed by the last hash within it (vLLM's view of the
        # hashes at the group's block size).
        bs = event.block_size
        scale = bs // self.block_pool.hash_block_size
        hashes, parent = request.block_hashes, event.parent_block_hash
        first = 0 if parent is None else (next(i for i in range(len(hashes) - 1, -1, -1)
                                               if hashes[i] == parent) + 1) // scale
        stored = event.block_hashes
        extra_keys_list, mm_idx, k = [], 0, 0
        for b in range(first, first + len(event.token_ids) // bs):
            last = (b + 1) * scale - 1
            if k < len(stored) and last < len(hashes) and hashes[last] == stored[k]:
                keys, mm_idx = generate_block_hash_extra_keys(request, b * bs, (b + 1) * bs, mm_idx)
                extra_keys_list.append(keys)
                k += 1
        lora = request.lora_request
        return BlockStored(
            block_hashes=[maybe_convert_block_hash(h) for h in stored],
            parent_block_hash=None if parent is None else maybe_convert_block_hash(parent),
            token_ids=list(event.token_ids),
            block_size=bs,
            lora_id=lora.adapter_id if lora else None,
            medium=MEDIUM_GPU,
            lora_name=lora.name if lora else None,
            extra_keys=to_event_extra_keys(extra_keys_list),
            group_idx=event.group_idx,
            session_id=request.session_id,
            lookahead_token_ids=None,
        )

    def take_events(self) -> list[Any]:
        """The KV cache events since the last call, as vLLM's event classes, each
        ``BlockStored`` with its group's spec kind and window."""
        from vllm.distributed.kv_events import BlockStored

        if not self.enable_kv_cache_events:
            return []
        self._drain_events()
        events = list(self._events)
        self._events.clear()
        for event in events:
            if not isinstance(event, BlockStored) or event.group_idx is None:
                continue
            if not 0 <= event.group_idx < len(self._event_metadata):
                # vLLM's manager warns and passes the event on as it is.
                _LOG.warning("Group index `%s` not in KV cache metadata", event.group_idx)
                continue
            event.kv_cache_spec_kind, event.kv_cache_spec_sliding_window = self._event_metadata[event.group_idx]
        return events

    # -- reads -------------------------------------------------------------------------------

    def get_computed_blocks(self, request: Request, max_cache_hit_length: int | None = None
                            ) -> tuple[KVCacheBlocks, int, int]:
        """The hit valid for every group: its blocks per group, its tokens, and the
        shared-prefix boundary (where a lagging window group stops plus the prefix it has
        not cached yet; 0 when none)."""
        return self._calls.get_computed_blocks(request, max_cache_hit_length)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return self._calls.get_blocks(request_id)

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return tuple(g.tolist() for g in self._tables.get_blocks(request_id))

    def get_block_ids_for_computed_tokens(self, request_id: str, num_computed_tokens: int) -> tuple[list[int], ...]:
        return tuple(g[:-(-num_computed_tokens // bs)].tolist()
                     for g, bs in zip(self._tables.get_blocks(request_id), self._block_sizes))

    def estimate_cached_tokens(self, request: Request) -> int:
        """Tokens covered by every group's cached blocks: per group, the end of its last
        cached block; the least of those."""
        return self._calls.estimate_cached_tokens(request)

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return [0] * self.num_kv_cache_groups

    # -- changes -----------------------------------------------------------------------------

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
        skip_zeroing_group_ids: tuple[int, ...] = (),
    ) -> KVCacheBlocks | None:
        """vLLM's ``allocate_slots``: each group's new blocks, or ``None`` when they do not
        fit (out-of-window blocks have then still been given back, as in vLLM)."""
        blocks = self._calls.allocate_slots(
            request, num_new_tokens, num_new_computed_tokens, new_computed_blocks, num_lookahead_tokens,
            num_external_computed_tokens, delay_cache_blocks, num_encoder_tokens, full_sequence_must_fit,
            reserved_blocks, has_scheduled_reqs, skip_zeroing_group_ids)
        if self.enable_kv_cache_events:
            self._drain_events(request)
        return blocks

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        if self.enable_caching:
            self._tables.cache_blocks(
                request.request_id, request.block_hashes, num_computed_tokens, request.num_prompt_tokens,
                shared_prefix_boundary=request.shared_prefix_boundary,
                token_ids=request.all_token_ids if self.enable_kv_cache_events else None)
            if self.enable_kv_cache_events:
                self._drain_events(request)

    def free(self, request: Request) -> None:
        """Free the request's blocks, each group's tail first."""
        self._calls.free(request)
        if self.enable_kv_cache_events:
            self._drain_events()

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        """Give back the blocks no group attends to any more; the null block takes their place."""
        self._tables.remove_skipped_blocks(request_id, processed_computed_tokens)
        if self.enable_kv_cache_events:
            self._drain_events()

    def evict_blocks(self, block_ids: set[int]) -> None:
        self._pool.evict_blocks(list(block_ids))  # in the set's order, as vLLM walks it
        if self.enable_kv_cache_events:
            self._drain_events()

    def reset_prefix_cache(self) -> bool:
        if not self._pool.reset_prefix_cache():
            return False
        if self.enable_kv_cache_events:
            self._drain_events()
        if self.log_stats:
            assert self.prefix_cache_stats is not None
            self.prefix_cache_stats.reset = True
        return True

    def truncate_computed_blocks(self, blocks: KVCacheBlocks, num_computed_tokens: int) -> KVCacheBlocks:
        groups = group_ids_of(blocks, self.num_kv_cache_groups)
        return self.create_kv_cache_blocks(tuple(np.asarray(g[:num_computed_tokens // bs], dtype=np.int32)
                                                 for g, bs in zip(groups, self._block_sizes)))

    def take_new_block_ids(self) -> list[int]:
        if not self._records_new_block_ids:
            return []
        return self._tables.take_new_block_ids().tolist()  # type: ignore[no-any-return]

    def pop_blocks_for_free(self, request: Request) -> list[Any]:
        """Forget the request and return its blocks, group after group, each past its leading
        null blocks, without freeing them (vLLM's coordinator order)."""
        groups = self._tables.pop_tables(request.request_id)
        blocks: list[Any] = []
        for ids in groups or ():
            blocks.extend(trim_null_head(BlockList(self._pool, ids)))
        return blocks

    def new_step_starts(self) -> None:
        """Nothing to do per step."""
