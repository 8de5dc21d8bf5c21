"""``kvpool.vllm.KVCacheManager``: vLLM 0.33's ``KVCacheManager`` on kvpool's Rust block tables.

Same constructor and methods as vLLM's class; each call converts vLLM's ``Request`` (its
``request_id``, ``num_computed_tokens``, ``num_tokens`` and ``block_hashes``, which the
scheduler owns) and delegates to ``kvpool.BlockTables``, where the allocation rules are.
Results are ``KVCacheBlocks`` whose ``get_block_ids()`` hands the ids over directly.

Covered: one full-attention KV-cache group with ``hash_block_size == block_size``, with or
without prefix caching, stats, watermark, reserved blocks, external (connector) tokens,
delayed caching and KV events; and, through ``kvpool.vllm._hybrid`` on
``kvpool.GroupTables``, several groups of full, sliding-window and chunked-local attention
(block sizes multiples of ``hash_block_size``). Everything else (Mamba, encoder caches,
eagle, context parallelism, hisparse, a metrics collector) is built by vLLM's own class
instead, and logged once per reason.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import numpy.typing as npt

import vllm.v1.core.kv_cache_manager as _vllm_kvm
from vllm.distributed.kv_events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored
from vllm.v1.core.kv_cache_utils import (
    generate_block_hash_extra_keys,
    maybe_convert_block_hash,
    resolve_block_hashes,
    to_event_extra_keys,
)
from vllm.v1.kv_cache_interface import get_kv_cache_spec_kind, get_kv_cache_spec_sliding_window
from vllm.v1.core.kv_cache_coordinator import _validate_prefix_cache_retention_interval as _validate_retention
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig
from vllm.v1.metrics.stats import PrefixCacheStats
from vllm.v1.request import Request, RequestStatus

import kvpool
from kvpool.vllm._options import pool_options
from kvpool.vllm._views import BlockPoolView, CoordinatorView, KvpoolBlocks, SingleTypeView, block_ids_of

logger = logging.getLogger("kvpool.vllm")

#: vLLM's own manager class, for configurations kvpool does not cover.
VllmKVCacheManager = _vllm_kvm.KVCacheManager

_WAITING = (RequestStatus.WAITING, RequestStatus.PREEMPTED)

#: How many managers were built on kvpool and how many fell back to vLLM's class.
COUNTS = {"kvpool": 0, "fallback": 0}
#: Why managers fell back, with how many times each.
FALLBACK_REASONS: dict[str, int] = {}
_LOGGED: set[str] = set()


def unsupported_reason(kv_cache_config: KVCacheConfig, scheduler_block_size: int, hash_block_size: int,
                       options: dict[str, Any]) -> str | None:
    """Why kvpool does not cover this configuration, or ``None`` when it does."""
    from kvpool.vllm._hybrid import groups_unsupported_reason

    groups = kv_cache_config.kv_cache_groups
    if not groups:
        return "no KV-cache groups"
    if options.get("use_eagle"):
        return "eagle"
    if options.get("num_hash_lookahead_tokens", 0) or options.get("num_prefill_lookahead", 0) > 1:
        return "lookahead hashing"
    if options.get("dcp_world_size", 1) > 1 or options.get("pcp_world_size", 1) > 1:
        return "context parallelism"
    if options.get("metrics_collector") is not None:
        return "a KV-cache metrics collector"
    if getattr(kv_cache_config, "hisparse_host_num_blocks", None) is not None:
        return "hisparse"
    if is_single_full_group(kv_cache_config):
        spec = groups[0].kv_cache_spec
        if not spec.block_size == scheduler_block_size == hash_block_size:
            return "hash_block_size or scheduler_block_size differing from the block size"
        return None
    return groups_unsupported_reason(kv_cache_config, scheduler_block_size, hash_block_size)


def is_single_full_group(kv_cache_config: KVCacheConfig) -> bool:
    """One full-attention group: the layout ``kvpool.BlockTables`` serves (others go to
    ``kvpool.GroupTables``)."""
    groups = kv_cache_config.kv_cache_groups
    return len(groups) == 1 and type(groups[0].kv_cache_spec) is FullAttentionSpec


def reused_block_stored(request: Request, num_blocks: int, block_size: int, hash_block_size: int,
                        group_idx: int) -> BlockStored:
    """vLLM's ``BlockStored`` for the first ``num_blocks`` blocks of ``request`` in a group of
    ``block_size``-token blocks, reused from the prefix cache (``BlockPool.emit_cached_block_events``)."""
    hashes = resolve_block_hashes(request.block_hashes, hash_block_size, block_size)
    extra_keys_list, mm_idx = [], 0
    for b in range(num_blocks):
        keys, mm_idx = generate_block_hash_extra_keys(request, b * block_size, (b + 1) * block_size, mm_idx)
        extra_keys_list.append(keys)
    lora = request.lora_request
    return BlockStored(
        block_hashes=[maybe_convert_block_hash(hashes[b]) for b in range(num_blocks)],
        parent_block_hash=None,
        token_ids=request.all_token_ids[:num_blocks * block_size],
        block_size=block_size,
        lora_id=lora.adapter_id if lora else None,
        medium=MEDIUM_GPU,
        lora_name=lora.name if lora else None,
        extra_keys=to_event_extra_keys(extra_keys_list),
        group_idx=group_idx,
        session_id=request.session_id,
        lookahead_token_ids=None,
    )


class ManagerCommon:
    """What kvpool's two vLLM managers (one full-attention group, several groups) share: the
    statistics, the event drain and the calls whose answer does not depend on the groups."""

    _pool: kvpool.BlockPool
    _tables: kvpool.BlockTables | kvpool.GroupTables
    _events: list[Any]
    _calls: kvpool.VllmManagerCalls | kvpool.VllmGroupCalls
    _group_block_sizes: tuple[int, ...]
    block_pool: BlockPoolView
    log_stats: bool
    enable_caching: bool
    prefix_cache_stats: PrefixCacheStats | None

    def _block_stored(self, request: Request, event: Any) -> BlockStored:
        raise NotImplementedError

    def get_computed_blocks(self, request: Request, max_cache_hit_length: int | None = None
                            ) -> tuple[KVCacheBlocks, int, int]:
        raise NotImplementedError

    def _get_computed_blocks_reporting(self, request: Request, max_cache_hit_length: int | None = None
                                       ) -> tuple[KVCacheBlocks, int, int]:
        """``get_computed_blocks`` with KV events on: a request in vLLM's
        ``kv_cache_report_mode="full"`` (its sampling ``extra_args``) has its hit announced
        again, as vLLM's ``emit_cached_block_events`` does on every lookup: one ``BlockStored``
        per group of the reused blocks, from block 0 (no parent), after the events already
        queued."""
        result = self._calls.get_computed_blocks(request, max_cache_hit_length)
        if result[1] > 0 and getattr(request, "kv_cache_report_mode", "incremental") == "full":
            self._drain_events()
            for group, blocks in enumerate(result[0].blocks):
                if len(blocks):
                    self._events.append(reused_block_stored(
                        request, len(blocks), self._group_block_sizes[group], self.block_pool.hash_block_size, group))
        return result

    def _drain_events(self, request: Request | None = None) -> None:
        """Moves the Rust pool's new events into vLLM's event classes, in order. A
        ``BlockStored`` belongs to ``request``, whose blocks it just cached: its token ids,
        LoRA and extra keys come from the request, as vLLM's block pool takes them."""
        for event in self._pool.take_events():
            if isinstance(event, kvpool.BlockRemoved):
                self._events.extend(
                    BlockRemoved(block_hashes=[maybe_convert_block_hash(h)], medium=MEDIUM_GPU, group_idx=event.group_idx)
                    for h in event.block_hashes
                )
            elif isinstance(event, kvpool.AllBlocksCleared):
                self._events.append(AllBlocksCleared())
            elif isinstance(event, kvpool.BlockStored) and request is not None:
                self._events.append(self._block_stored(request, event))

    @property
    def usage(self) -> float:
        """The KV cache usage (between 0.0 and 1.0)."""
        return self._pool.get_usage()

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """Get (and reset) the prefix cache stats; ``None`` without ``log_stats``."""
        if not self.log_stats:
            return None
        stats = self.prefix_cache_stats
        self.prefix_cache_stats = PrefixCacheStats()
        return stats

    def prefix_cache_lookup_enabled(self, request: Request) -> bool:
        """Whether a local prefix cache lookup may be run for this request."""
        return self.enable_caching and not request.skip_reading_prefix_cache

    def record_prefix_cache_stats(self, request: Request, num_hits: int) -> None:
        if not self.log_stats or not self.prefix_cache_lookup_enabled(request):
            return
        assert self.prefix_cache_stats is not None
        self.prefix_cache_stats.record(num_tokens=request.num_tokens, num_hits=num_hits,
                                       preempted=request.num_preemptions > 0)

    def get_computed_blocks_for_connector(self, request: Request, max_cache_hit_length: int | None = None
                                          ) -> tuple[KVCacheBlocks, int, int, bool]:
        return *self.get_computed_blocks(request, max_cache_hit_length), False

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        """Record the request's blocks from ``start_token`` on (a block boundary) for zeroing
        again, as blocks a failed async KV load left unwritten; nothing unless the cache needs
        zeroing."""
        self._tables.record_blocks_for_zeroing(request_id, start_token)

    def take_kv_cache_block_copies(self) -> tuple[list[Any], list[Any]]:
        return [], []

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        return {}

    def finalize_partial_tail_offloads(self, request: Request) -> list[tuple[int, int, int]]:
        return []



class KVCacheManager(ManagerCommon):
    """vLLM 0.33's ``KVCacheManager`` (one full-attention group) on kvpool's Rust core.

    Building it for a configuration kvpool does not cover returns vLLM's own manager.
    """

    _tables: kvpool.BlockTables

    def __new__(cls, kv_cache_config: KVCacheConfig, max_model_len: int, scheduler_block_size: int,
                hash_block_size: int, *args: Any, **kwargs: Any) -> Any:
        if args:
            return cls._fallback("positional arguments beyond hash_block_size", kv_cache_config, max_model_len,
                                 scheduler_block_size, hash_block_size, *args, **kwargs)
        reason = unsupported_reason(kv_cache_config, scheduler_block_size, hash_block_size, kwargs)
        if reason is not None:
            return cls._fallback(reason, kv_cache_config, max_model_len, scheduler_block_size, hash_block_size,
                                 **kwargs)
        COUNTS["kvpool"] += 1
        if not is_single_full_group(kv_cache_config):
            from kvpool.vllm._hybrid import HybridKVCacheManager

            # Not an instance of this class, so Python does not run __init__ on it again.
            return HybridKVCacheManager(kv_cache_config, max_model_len, scheduler_block_size, hash_block_size,
                                        **kwargs)
        return super().__new__(cls)

    @staticmethod
    def _fallback(reason: str, *args: Any, **kwargs: Any) -> Any:
        COUNTS["fallback"] += 1
        FALLBACK_REASONS[reason] = FALLBACK_REASONS.get(reason, 0) + 1
        if reason not in _LOGGED:
            _LOGGED.add(reason)
            logger.info("kvpool.vllm: %s is not covered; using vLLM's own KVCacheManager", reason)
        return VllmKVCacheManager(*args, **kwargs)

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
        spec = kv_cache_config.kv_cache_groups[0].kv_cache_spec
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.enable_kv_cache_events = enable_kv_cache_events
        self.use_eagle = use_eagle
        self.log_stats = log_stats
        self.metrics_collector = metrics_collector
        self.prefix_cache_stats = PrefixCacheStats() if log_stats else None
        self.block_size: int = spec.block_size
        self._pool = kvpool.BlockPool(
            kv_cache_config.num_blocks,
            block_size=spec.block_size,
            enable_caching=enable_caching,
            enable_events=enable_kv_cache_events,
            **pool_options(),
        )
        # When the engine zeroes new blocks, their ids are kept for take_new_block_ids.
        zeroing = bool(getattr(kv_cache_config, "needs_kv_cache_zeroing", False))
        self._tables = kvpool.BlockTables(
            self._pool,
            max_model_len=max_model_len,
            record_new_block_ids=zeroing,
        )
        self.block_pool = BlockPoolView(self._pool, hash_block_size)
        single = SingleTypeView(self._tables, spec, self.block_pool)
        single.records_new_block_ids = zeroing
        retention = kv_cache_config.prefix_cache_retention_interval
        _validate_retention(retention, scheduler_block_size, kv_cache_config)
        self.coordinator = CoordinatorView(self, single, retention)
        self.mamba_shared_prefix_checkpoint = False
        self.num_kv_cache_groups = 1
        self.retained_hit_group_ids: tuple[int, ...] = ()
        self.kv_cache_config = kv_cache_config
        if watermark < 0.0:
            raise kvpool.InvalidArgumentError("watermark must be non-negative")
        self.watermark_blocks = int(watermark * kv_cache_config.num_blocks)
        self.empty_kv_cache_blocks = KVCacheBlocks(((),))
        self._events: list[Any] = []
        self.block_pool.kv_event_queue = self._events
        self._records_new_block_ids = zeroing
        self._calls = kvpool.VllmManagerCalls(
            self._tables, self.empty_kv_cache_blocks, KvpoolBlocks, block_ids_of, _WAITING,
            self.watermark_blocks,
        )
        # The scheduler's per-request calls, bound straight to Rust: no Python frame of
        # kvpool's on them (the methods below document them and delegate alike).
        self._group_block_sizes = (spec.block_size,)
        self.get_computed_blocks = (  # type: ignore[method-assign]
            self._get_computed_blocks_reporting if enable_kv_cache_events and enable_caching
            else self._calls.get_computed_blocks)
        self.get_blocks = self._calls.get_blocks  # type: ignore[method-assign]
        self.estimate_cached_tokens = self._calls.estimate_cached_tokens  # type: ignore[method-assign]
        self.free = self._calls.free  # type: ignore[method-assign]
        if not enable_kv_cache_events:
            self.allocate_slots = self._calls.allocate_slots  # type: ignore[method-assign]
        if not (log_stats and enable_caching):
            self.record_prefix_cache_stats = self._calls.record_no_prefix_cache_stats  # type: ignore[method-assign]
        self._event_metadata = (get_kv_cache_spec_kind(spec).value, get_kv_cache_spec_sliding_window(spec))

    # -- events ------------------------------------------------------------------------------

    def _block_stored(self, request: Request, event: Any) -> BlockStored:
        bs = self.block_size
        # The first newly cached block: where the event's first hash is in the request's
        # chain (hashes are chained, so it is there once; new blocks are near the end).
        hashes, first_hash = request.block_hashes, event.block_hashes[0]
        first_block = next(i for i in range(len(hashes) - 1, -1, -1) if hashes[i] == first_hash)
        start, end = first_block * bs, (first_block + len(event.block_hashes)) * bs
        extra_keys_list, mm_idx = [], 0
        for b in range(first_block, first_block + len(event.block_hashes)):
            keys, mm_idx = generate_block_hash_extra_keys(request, b * bs, (b + 1) * bs, mm_idx)
            extra_keys_list.append(keys)
        lora = request.lora_request
        parent = event.parent_block_hash
        return BlockStored(
            block_hashes=[maybe_convert_block_hash(h) for h in event.block_hashes],
            parent_block_hash=None if parent is None else maybe_convert_block_hash(parent),
            token_ids=request.all_token_ids[start:end],
            block_size=bs,
            lora_id=lora.adapter_id if lora else None,
            medium=MEDIUM_GPU,
            lora_name=lora.name if lora else None,
            extra_keys=to_event_extra_keys(extra_keys_list),
            group_idx=0,
            session_id=request.session_id,
            lookahead_token_ids=None,
        )

    def take_events(self) -> list[Any]:
        """The KV cache events since the last call, as vLLM's event classes."""
        if not self.enable_kv_cache_events:
            return []
        self._drain_events()
        events = list(self._events)
        self._events.clear()
        kind, sliding_window = self._event_metadata
        for event in events:
            if not isinstance(event, BlockStored) or event.group_idx is None:
                continue
            if event.group_idx != 0:
                _vllm_kvm.logger.warning("Group index `%s` not in KV cache metadata", event.group_idx)
                continue
            event.kv_cache_spec_kind = kind
            event.kv_cache_spec_sliding_window = sliding_window
        return events

    # -- reads -------------------------------------------------------------------------------

    def _blocks(self, ids: npt.NDArray[Any]) -> KVCacheBlocks:
        return KvpoolBlocks(self._pool, ids) if len(ids) else self.empty_kv_cache_blocks

    def get_computed_blocks(self, request: Request, max_cache_hit_length: int | None = None
                            ) -> tuple[KVCacheBlocks, int, int]:
        """The cached blocks of the request's longest cached prefix, their token count, and
        the shared-prefix boundary (always 0 with one group)."""
        return self._calls.get_computed_blocks(request, max_cache_hit_length)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        """The request's blocks."""
        return self._calls.get_blocks(request_id)

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's block ids, per group."""
        return (self._tables.get_blocks(request_id).tolist(),)

    def get_block_ids_for_computed_tokens(self, request_id: str, num_computed_tokens: int) -> tuple[list[int], ...]:
        n = -(-num_computed_tokens // self.block_size)
        return (self._tables.get_blocks(request_id)[:n].tolist(),)

    def estimate_cached_tokens(self, request: Request) -> int:
        """Tokens covered by the request's cached blocks."""
        return self._calls.estimate_cached_tokens(request)

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return [0]

    # -- changes -----------------------------------------------------------------------------

    def allocate_slots(self, request: Request, num_new_tokens: int, *args: Any, **kwargs: Any
                       ) -> KVCacheBlocks | None:
        """vLLM's ``allocate_slots``: the new blocks, or ``None`` when they do not fit.

        The work, argument mapping included, is one call of ``kvpool.VllmManagerCalls``;
        without KV events that callable replaces this method on the instance, and with
        them this method only converts the events the call caused."""
        blocks = self._calls.allocate_slots(request, num_new_tokens, *args, **kwargs)
        self._drain_events(request)
        return blocks

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Cache the request's blocks full within its first ``num_computed_tokens`` tokens."""
        if self.enable_caching:
            self._tables.cache_blocks(request.request_id, request.block_hashes, num_computed_tokens)
            if self.enable_kv_cache_events:
                self._drain_events(request)

    def free(self, request: Request) -> None:
        """Free the request's blocks, tail first."""
        self._calls.free(request)

    def pop_blocks_for_free(self, request: Request) -> list[Any]:
        """Forget the request and return its blocks (allocation order) without freeing them."""
        ids = self._tables.pop_blocks(request.request_id)
        return list(KvpoolBlocks(self._pool, ids).blocks[0])

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        """Nothing is skipped with full attention."""

    def evict_blocks(self, block_ids: set[int]) -> None:
        """Evict blocks from the prefix cache by id."""
        self._pool.evict_blocks(list(block_ids))  # in the set's order, as vLLM walks it

    def reset_prefix_cache(self) -> bool:
        """Clear the prefix cache; ``False`` while blocks are in use."""
        if not self._pool.reset_prefix_cache():
            return False
        if self.log_stats:
            assert self.prefix_cache_stats is not None
            self.prefix_cache_stats.reset = True
        return True

    def create_kv_cache_blocks(self, blocks: tuple[list[Any], ...]) -> KVCacheBlocks:
        return KVCacheBlocks(blocks) if any(blocks) else self.empty_kv_cache_blocks

    def truncate_computed_blocks(self, blocks: KVCacheBlocks, num_computed_tokens: int) -> KVCacheBlocks:
        n = num_computed_tokens // self.block_size
        ids = np.asarray(block_ids_of(blocks)[:n], dtype=np.int32)
        return self._blocks(ids)

    def take_new_block_ids(self) -> list[int]:
        """Ids of blocks allocated since the last call, for zeroing."""
        if not self._records_new_block_ids:
            return []
        return self._tables.take_new_block_ids().tolist()  # type: ignore[no-any-return]

    def new_step_starts(self) -> None:
        """Nothing to do per step with one full-attention group."""
