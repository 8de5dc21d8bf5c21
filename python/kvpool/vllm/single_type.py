"""vLLM 0.33's ``BlockPool`` and per-type managers (``FullAttentionManager``,
``SlidingWindowManager``, ``ChunkedLocalAttentionManager``) on kvpool.

vLLM's coordinator drives one manager per KV-cache group through these classes' step methods
(count the blocks a step needs, add a prefix hit, allocate for connector tokens, allocate new
blocks, give back blocks that left the window, free); ``kvpool.vllm.KVCacheManager`` does not
need them, since kvpool's ``GroupTables`` runs a whole ``allocate_slots`` in one call. These
classes have vLLM's constructors and methods for code and tests that build the per-type
managers themselves (vLLM's ``test_single_type_kv_cache_manager.py`` runs on them with
``-p kvpool.vllm.pytest_plugin``). Each manager is one group of a ``kvpool.GroupTables`` over
the pool's ``kvpool.BlockPool``, and every rule is the Rust one that ``GroupTables`` uses.

What differs from vLLM's classes, by design:

- Block hashes of another width than 32 bytes (vLLM's SHA-256 digests) are keyed by a
  SHA-256 digest of the hash, since a kvpool pool holds keys of one width: vLLM's tests key
  blocks by ``str(i).encode()``. The pool's ``block_hash`` shows that digest.
- Assigning ``req_to_blocks[request_id]`` (a request without a table) hands the table its
  blocks: a block the caller holds (from ``get_new_blocks``) passes its reference to the
  table; a free block is taken out of the free queue. vLLM's dict keeps such a block free and takes its reference count
  below zero when ``remove_skipped_blocks`` gives it back; kvpool never does. The list
  assigned stays the request's table: calls that change the table update it in place. A
  block whose references a pin or another manager's table on the pool holds is refused
  (``InvalidArgumentError``): the table would take over a reference its caller does not hold.
- Inserting a key for a free block (``cached_block_hash_to_block.insert``) moves it to the
  free queue's tail, as freeing a cached block does; vLLM's dict leaves it where it is.
- Not covered (vLLM's own classes stay in use): Mamba, cross-attention, circular-buffer and
  R-SWA specs, sliding windows with ``extra_retained_tokens``, EAGLE's dropped block,
  context parallelism, partial-block (copy-on-write) hits, sparse ``retention_interval`` in
  ``cache_blocks``, KV events and metrics collectors on the pool.
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Iterable, Iterator, MutableMapping, Sequence
from typing import Any, ClassVar

from vllm.v1.core.kv_cache_utils import get_block_hash, get_group_id, trim_null_head
from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec, FullAttentionSpec, SlidingWindowSpec

import kvpool
from kvpool.vllm._hybrid import _GroupNumCached, group_spec
from kvpool.vllm._manager import COUNTS
from kvpool.vllm._views import BlockPoolView, BlockView, CachedBlocksView, _CacheDict, block_ids_of, request_known

__all__ = ["BlockPool", "ChunkedLocalAttentionManager", "FullAttentionManager", "SlidingWindowManager",
           "pool_key"]

#: The width of vLLM's block hashes (SHA-256), which are kept as they are.
_KEY_WIDTH = 32


def pool_key(block_hash: bytes) -> bytes:
    """The key a block hash has in a stand-in pool: itself if 32 bytes wide, else its SHA-256
    digest (under a prefix of its own, so that no 32-byte hash meets it by chance)."""
    block_hash = bytes(block_hash)
    if len(block_hash) == _KEY_WIDTH:
        return block_hash
    return hashlib.sha256(b"kvpool.vllm.single_type key:" + block_hash).digest()


class _StandInCacheDict(_CacheDict):
    """``_cache`` of a stand-in pool: ``clear()`` empties the pool's prefix cache (with no
    event, as clearing vLLM's dict)."""

    def clear(self) -> None:
        for name in list(self):
            self.pop(name)


class _StandInCachedBlocks(CachedBlocksView):
    """``cached_block_hash_to_block`` of a stand-in pool, with ``insert``."""

    @property
    def _cache(self) -> _CacheDict:
        return _StandInCacheDict(self._pool)

    def insert(self, key: Any, block: Any) -> None:
        """Cache ``block`` under ``key`` (a ``BlockHashWithGroupId``), as vLLM's tests do to
        fake a hit: a held block keeps its place; a free one is taken and freed again, which
        puts it at the free queue's tail with its key (one call, checked first)."""
        self._pool._set_block_hash(block.block_id, pool_key(get_block_hash(key)), get_group_id(key), requeue=True)


class BlockPool(BlockPoolView):
    """vLLM 0.33's ``BlockPool`` on a ``kvpool.BlockPool`` (block 0 is the null block, as in
    vLLM), with vLLM's constructor; blocks are views that read their count and hash from Rust.
    """

    def __init__(self, num_gpu_blocks: int, enable_caching: bool, hash_block_size: int,
                 enable_kv_cache_events: bool = False, metrics_collector: Any = None,
                 num_hash_lookahead_tokens: int = 0, medium: str = "GPU") -> None:  # noqa: D107
        if enable_kv_cache_events or metrics_collector is not None or num_hash_lookahead_tokens:
            raise kvpool.InvalidArgumentError(
                "kvpool.vllm.single_type.BlockPool: KV events, metrics collectors and lookahead hashing "
                "are not covered (vLLM's KVCacheManager on kvpool has them)")
        pool = kvpool.BlockPool(num_gpu_blocks, block_size=hash_block_size, enable_caching=enable_caching,
                                null_block=True)
        super().__init__(pool, hash_block_size)
        self.cached_block_hash_to_block = _StandInCachedBlocks(pool)
        self.medium = medium
        #: The managers built on this pool (each a group), so that a table handed to one
        #: is checked against the others' tables.
        self._managers: weakref.WeakSet[_SingleTypeManager] = weakref.WeakSet()

    def get_cached_block(self, block_hash: bytes, kv_cache_group_ids: Sequence[int]) -> list[BlockView] | None:
        """The block cached under ``block_hash`` for each group, or ``None`` if a group has none."""
        found = []
        for g in kv_cache_group_ids:
            block = self._pool.get_cached_block(pool_key(block_hash), g)
            if block is None:
                return None
            found.append(BlockView(self._pool, block))
        return found

    def get_new_blocks(self, num_blocks: int) -> list[BlockView]:
        """``num_blocks`` blocks from the free queue's head (evicting their keys), each with one
        reference."""
        pool = self._pool
        return BlockView.of_ids(pool, pool.get_new_blocks(num_blocks))


class _RequestBlocks(MutableMapping[Any, list[Any]]):
    """``req_to_blocks``: request id -> its blocks. The tables are in Rust; a list the caller
    assigned is kept as the request's table and brought up to date after every call that
    changes it (``_sync``); any other request's table is read as a new list."""

    def __init__(self, manager: _SingleTypeManager) -> None:
        self._manager = manager
        self._lists: dict[str, list[Any]] = {}

    def _ids(self, request_id: str) -> list[int]:
        return self._manager._tables.get_blocks(request_id)[0].tolist()  # type: ignore[no-any-return]

    def _views(self, ids: list[int]) -> list[BlockView]:
        return BlockView.of_ids(self._manager._pool, ids)

    def _sync(self, request_id: str) -> None:
        held = self._lists.get(request_id)
        if held is None:
            return
        if request_id not in self:
            del self._lists[request_id]
            return
        ids = self._ids(request_id)
        if [b.block_id for b in held] != ids:
            held[:] = self._views(ids)

    def __getitem__(self, request_id: str) -> list[Any]:
        held = self._lists.get(request_id)
        if held is not None:
            return held
        if request_id not in self:
            raise KeyError(request_id)
        return self._views(self._ids(request_id))

    def get(self, request_id: str, default: Any = None) -> Any:
        return self[request_id] if request_id in self else default

    def __setitem__(self, request_id: str, blocks: Any) -> None:
        if request_id in self:
            # vLLM's dict would drop the old table's references on the floor.
            raise kvpool.InvalidArgumentError(
                f"request {request_id!r} has a table already: free it or pop it first")
        ids = block_ids_of(blocks)
        self._check_not_held_elsewhere(ids)
        self._manager._tables.group_adopt_blocks(request_id, 0, ids)
        held = blocks if isinstance(blocks, list) else list(blocks)
        self._lists[request_id] = held
        self._sync(request_id)

    def _check_not_held_elsewhere(self, ids: list[int]) -> None:
        """Refuses blocks that another manager's table on the same pool holds: the reference
        a table takes over must be the caller's (this manager's own tables are checked in
        Rust, with pins)."""
        manager = self._manager
        null = manager._null_block.block_id
        wanted = set(ids) - {null}
        for other in manager.block_pool._managers:
            if other is manager or not wanted:
                continue
            tables = other._tables
            for rid in tables.request_ids():
                taken = wanted.intersection(tables.get_blocks(rid)[0].tolist())
                if taken:
                    raise kvpool.InvalidArgumentError(
                        f"block {min(taken)} is in request {rid!r}'s table of KV-cache group "
                        f"{other.kv_cache_group_id}: a table takes over only references its caller holds")

    def __delitem__(self, request_id: str) -> None:
        self.pop(request_id)

    def pop(self, request_id: str, *default: Any) -> Any:
        """Forgets the request and returns its table without freeing it (the caller now holds
        its blocks' references)."""
        if request_id not in self:
            if default:
                return default[0]
            raise KeyError(request_id)
        held = self._lists.pop(request_id, None)
        tables = self._manager._tables.pop_tables(request_id)
        if held is not None or tables is None:
            return held
        return self._views(tables[0].tolist())

    def __contains__(self, request_id: object) -> bool:
        return request_known(self._manager._tables.__contains__, request_id)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._manager._tables.request_ids())

    def __len__(self) -> int:
        return len(self._manager._tables)


def _ids_of(blocks: Sequence[Any] | None) -> list[int]:
    return [] if not blocks else block_ids_of(blocks)


class _SingleTypeManager:
    """vLLM 0.33's ``SingleTypeKVCacheManager`` on one group of a ``kvpool.GroupTables``."""

    #: The vLLM spec classes this manager takes.
    _SPECS: ClassVar[tuple[type, ...]] = ()
    supports_fine_grained_hash_lookup: ClassVar[bool] = False
    retains_longer_hit: bool = False
    has_positionally_stable_blocks = True

    def __init__(self, kv_cache_spec: Any, block_pool: BlockPool, enable_caching: bool, kv_cache_group_id: int,
                 scheduler_block_size: int, dcp_world_size: int = 1, pcp_world_size: int = 1,
                 needs_kv_cache_zeroing: bool = False,
                 max_admission_blocks_per_request: int | None = None) -> None:  # noqa: D107
        group = _group_of(kv_cache_spec, self._SPECS)
        if not isinstance(block_pool, BlockPool):
            raise kvpool.InvalidArgumentError(
                f"block_pool must be a kvpool.vllm.single_type.BlockPool, got {type(block_pool).__name__}")
        if dcp_world_size != 1 or pcp_world_size != 1:
            raise kvpool.InvalidArgumentError("kvpool does not cover decode or prefill context parallelism")
        self.kv_cache_spec = kv_cache_spec
        self.block_pool = block_pool
        self.block_size = kv_cache_spec.block_size
        self.enable_caching = enable_caching
        self.kv_cache_group_id = kv_cache_group_id
        self.scheduler_block_size = scheduler_block_size
        self.cache_hit_alignment_tokens = scheduler_block_size
        self.dcp_world_size = self.pcp_world_size = 1
        self.max_admission_blocks_per_request = max_admission_blocks_per_request
        self.use_eagle = False
        self._pool = block_pool._pool
        self._tables = kvpool.GroupTables(self._pool, [group], max_model_len=1 << 62,
                                          record_new_block_ids=bool(needs_kv_cache_zeroing),
                                          pool_group_ids=[kv_cache_group_id],
                                          scheduler_block_size=scheduler_block_size)
        block_pool._managers.add(self)
        self._record_new_block_ids = bool(needs_kv_cache_zeroing)
        self._null_block = block_pool.null_block
        self.req_to_blocks = _RequestBlocks(self)
        self.num_cached_block = _GroupNumCached(self._tables, 0)
        COUNTS["kvpool"] += 1

    @property
    def records_new_block_ids(self) -> bool:
        """Whether this manager's new blocks are zeroed by the worker."""
        return self._record_new_block_ids

    def take_new_block_ids(self) -> list[int]:
        """Ids of the blocks allocated since the last call (when recording)."""
        return self._tables.take_new_block_ids().tolist()  # type: ignore[no-any-return]

    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int, new_computed_blocks: Sequence[Any],
                                   total_computed_tokens: int, num_local_computed_tokens: int,
                                   num_tokens_main_model: int, apply_admission_cap: bool = False,
                                   prefill_end: int = 0) -> int:
        """The blocks the request needs for ``num_tokens`` tokens after taking the hit
        ``new_computed_blocks`` (hit blocks in the free queue count)."""
        cap = self.max_admission_blocks_per_request if apply_admission_cap else None
        return self._tables.group_num_blocks_to_allocate(
            request_id, 0, num_tokens, _ids_of(new_computed_blocks), total_computed_tokens,
            num_local_computed_tokens, admission_cap=cap)

    def add_local_computed_blocks(self, request_id: str, new_computed_blocks: Sequence[Any],
                                  num_local_computed_tokens: int, num_external_computed_tokens: int) -> None:
        """The request, which has no blocks yet, takes the prefix hit (touched)."""
        ids = _ids_of(new_computed_blocks)
        if ids and not self.enable_caching:
            raise kvpool.CachingDisabledError("computed blocks without prefix caching")
        self._tables.group_add_computed_blocks(request_id, 0, ids, num_local_computed_tokens,
                                               num_external_computed_tokens)
        self.req_to_blocks._sync(request_id)

    def allocate_external_computed_blocks(self, request_id: str, num_local_computed_tokens: int,
                                          num_external_computed_tokens: int, record_for_zeroing: bool = True) -> None:
        """Blocks for the connector-computed tokens the window keeps."""
        self._tables.group_allocate_external(request_id, 0, num_local_computed_tokens, num_external_computed_tokens,
                                             record_for_zeroing)
        self.req_to_blocks._sync(request_id)

    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_tokens_main_model: int) -> list[BlockView]:
        """New blocks that give the request room for ``num_tokens`` tokens."""
        ids = self._tables.group_allocate_new_blocks(request_id, 0, num_tokens)
        self.req_to_blocks._sync(request_id)
        pool = self._pool
        return BlockView.of_ids(pool, ids)

    def cache_blocks(self, request: Any, num_tokens: int, retention_interval: int | None = None, *,
                     replay_boundaries: Sequence[int] = ()) -> None:
        """Caches the request's blocks full within ``num_tokens`` tokens (dense retention)."""
        if retention_interval is not None:
            raise kvpool.InvalidArgumentError(
                "kvpool.vllm.single_type: sparse retention is set on kvpool.GroupTables, not per call")
        self._tables.cache_blocks(request.request_id, [pool_key(h) for h in request.block_hashes], num_tokens,
                                  request.num_prompt_tokens)

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        """Gives back the blocks that left the window, the null block taking their place."""
        self._tables.remove_skipped_blocks(request_id, processed_computed_tokens)
        self.req_to_blocks._sync(request_id)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Leading tokens the next token does not attend to."""
        return self._tables.num_skipped_tokens(0, num_computed_tokens)

    def pop_blocks_for_free(self, request_id: str) -> list[Any]:
        """Forgets the request and returns its blocks past the leading null ones, unfreed."""
        return trim_null_head(self.req_to_blocks.pop(request_id, []))  # type: ignore[no-any-return]

    def free(self, request_id: str) -> None:
        """Frees the request's blocks, tail first."""
        self._tables.free(request_id)
        self.req_to_blocks._sync(request_id)

    def new_step_starts(self) -> None:
        """Nothing to do at a step's start."""

    @classmethod
    def find_longest_cache_hit(cls, block_hashes: Sequence[bytes], max_length: int, kv_cache_group_ids: list[int],
                               block_pool: BlockPool, kv_cache_spec: Any, drop_eagle_block: bool,
                               alignment_tokens: int, dcp_world_size: int = 1,
                               pcp_world_size: int = 1) -> tuple[tuple[list[BlockView], ...], int]:
        """The longest prefix hit of at most ``max_length`` tokens for every group of
        ``kv_cache_group_ids`` (the null block where the window skips a block)."""
        group = _group_of(kv_cache_spec, cls._SPECS)
        if drop_eagle_block or dcp_world_size != 1 or pcp_world_size != 1:
            raise kvpool.InvalidArgumentError("kvpool does not cover EAGLE's dropped block or context parallelism")
        pool = block_pool._pool
        tables, hit = kvpool.find_group_hit(pool, group, [pool_key(h) for h in block_hashes], max_length,
                                            group_ids=kv_cache_group_ids, alignment_tokens=alignment_tokens)
        return tuple(BlockView.of_ids(pool, t) for t in tables), hit


def _group_of(kv_cache_spec: Any, specs: tuple[type, ...]) -> tuple[str, int | None, int]:
    group = group_spec(kv_cache_spec) if type(kv_cache_spec) in specs else None
    if group is None:
        raise kvpool.InvalidArgumentError(f"kvpool does not cover {type(kv_cache_spec).__name__} here")
    return group


class FullAttentionManager(_SingleTypeManager):
    """vLLM's ``FullAttentionManager`` on kvpool."""

    _SPECS = (FullAttentionSpec,)


class SlidingWindowManager(_SingleTypeManager):
    """vLLM's ``SlidingWindowManager`` on kvpool (no ``extra_retained_tokens``)."""

    _SPECS = (SlidingWindowSpec,)

    def __init__(self, kv_cache_spec: SlidingWindowSpec, **kwargs: Any) -> None:  # noqa: D107
        super().__init__(kv_cache_spec, **kwargs)
        self.sliding_window = kv_cache_spec.sliding_window


class ChunkedLocalAttentionManager(_SingleTypeManager):
    """vLLM's ``ChunkedLocalAttentionManager`` on kvpool."""

    _SPECS = (ChunkedLocalAttentionSpec,)

    def __init__(self, kv_cache_spec: ChunkedLocalAttentionSpec, **kwargs: Any) -> None:  # noqa: D107
        super().__init__(kv_cache_spec, **kwargs)
        self.attention_chunk_size = kv_cache_spec.attention_chunk_size
