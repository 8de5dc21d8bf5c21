"""Read-only views of kvpool's Rust state (a ``BlockPool`` and its ``BlockTables``) under
vLLM 0.33's names.

vLLM's scheduler and tests read its manager's internals: ``KVCacheBlocks.blocks[g][i]``
(a ``KVCacheBlock`` with ``block_id``, ``ref_cnt``, ``block_hash``, ``is_null``),
``block_pool.blocks``, ``block_pool.free_block_queue``, ``coordinator.single_type_managers``.
Here those are views: a block view is made only when indexed, and reads its count and hash
from Rust each time, so it never goes stale and nothing is kept per block in Python. The
allocation rules live in Rust (``kvpool.BlockTables``); nothing here changes state but
``BlockPoolView.free_blocks``/``touch``, which delegate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NoReturn

import numpy as np
import numpy.typing as npt

from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import get_block_hash, get_group_id, make_block_hash_with_group_id

import kvpool
from kvpool import _free_neighbours


#: One block as vLLM's ``KVCacheBlock`` (``block_id``, ``ref_cnt``, ``block_hash``, ``is_null``,
#: ``block_hash_num_tokens``, ``next_free_block``/``prev_free_block``), read from Rust each time;
#: ``BlockView.of_ids(pool, ids)`` makes a list of them in one call.
BlockView = kvpool._core.KVCacheBlockView


class BlockList(Sequence[BlockView]):
    """A request's or a result's blocks: an id array, viewed as ``KVCacheBlock``s on demand."""

    __slots__ = ("_pool", "ids")

    def __init__(self, pool: kvpool.BlockPool, ids: npt.NDArray[Any]) -> None:
        self._pool = pool
        self.ids = ids

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return BlockList(self._pool, self.ids[index])
        return BlockView(self._pool, int(self.ids[index]))

    def __iter__(self) -> Iterator[BlockView]:
        return iter(BlockView.of_ids(self._pool, self.ids))

    def __bool__(self) -> bool:
        return len(self.ids) > 0

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BlockList):
            return other._pool is self._pool and np.array_equal(other.ids, self.ids)
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __repr__(self) -> str:
        return f"BlockList({self.ids.tolist()})"


class KvpoolBlocks(KVCacheBlocks):  # type: ignore[misc]
    """vLLM's ``KVCacheBlocks`` over kvpool ids (one group): ``get_block_ids()`` hands the
    ids over directly; ``blocks[0]`` views them as blocks."""

    def __init__(self, pool: kvpool.BlockPool, ids: npt.NDArray[Any]) -> None:  # noqa: D107
        self.ids = ids
        self._pool = pool

    @property
    def blocks(self) -> tuple[BlockList]:
        """The blocks as ``KVCacheBlock`` views (made on first use)."""
        return (BlockList(self._pool, self.ids),)

    def get_block_ids(self, allow_none: bool = False, *, group_ids: Sequence[int] | None = None) -> Any:
        if allow_none and len(self.ids) == 0:
            return None
        if group_ids is not None and list(group_ids) != [0]:
            return tuple([] for _ in group_ids) if 0 not in group_ids else (self.ids.tolist(),)
        return (self.ids.tolist(),)

    def get_unhashed_block_ids(self) -> list[int]:
        return [b.block_id for b in self.blocks[0] if b.block_hash is None]

    def get_unhashed_block_ids_all_groups(self) -> list[list[int]]:
        return [[b.block_id for b in self.blocks[0] if b.block_hash is None and not b.is_null]]

    def __add__(self, other: KVCacheBlocks) -> KVCacheBlocks:
        if isinstance(other, KvpoolBlocks):
            return KvpoolBlocks(self._pool, np.concatenate([self.ids, other.ids]))
        return KVCacheBlocks((list(self.blocks[0]) + list(other.blocks[0]),))

    def __repr__(self) -> str:
        return f"KvpoolBlocks({self.ids.tolist()})"


def request_known(lookup: Callable[[Any], bool], request_id: object) -> bool:
    """``lookup(request_id)``, or ``False`` for something that is not a request id: the views
    answer ``in`` as a dict does, for any key."""
    try:
        return lookup(request_id)
    except kvpool.DtypeError:
        return False


def block_ids_of(blocks: KVCacheBlocks | Iterable[Any]) -> list[int]:
    """The ids of a ``KVCacheBlocks`` (group 0) or of an iterable of blocks."""
    if isinstance(blocks, KvpoolBlocks):
        return blocks.ids.tolist()  # type: ignore[no-any-return]
    if isinstance(blocks, KVCacheBlocks):
        return [b.block_id for b in blocks.blocks[0]]
    if isinstance(blocks, BlockList):
        return blocks.ids.tolist()  # type: ignore[no-any-return]
    return [b.block_id for b in blocks]


class _End:
    """The free list's fake head or tail: its ``next_free_block`` / ``prev_free_block``."""

    def __init__(self, queue: FreeQueueView, head: bool) -> None:
        self._queue, self._head = queue, head

    @property
    def next_free_block(self) -> Any:
        return self._queue._neighbour(None, +1) if self._head else None

    @property
    def prev_free_block(self) -> Any:
        return None if self._head else self._queue._neighbour(None, -1)


class FreeQueueView:
    """``block_pool.free_block_queue``: the free queue's length and order, and its linked-list
    ends (``fake_free_list_head``/``fake_free_list_tail``) for code that walks it."""

    def __init__(self, pool: kvpool.BlockPool) -> None:
        self._pool = pool
        self.fake_free_list_head = _End(self, head=True)
        self.fake_free_list_tail = _End(self, head=False)
        _free_neighbours.QUEUES[id(pool)] = self

    def _neighbour(self, block_id: int | None, step: int) -> Any:
        """A block's neighbour (see ``kvpool._free_neighbours``), or with ``block_id`` None the
        first free block (``step`` 1, after the fake head) or the last (-1, before the fake
        tail; O(1) whenever a cached block is free)."""
        if block_id is not None:
            return _free_neighbours.neighbour_of(self._pool, block_id, step)
        if step > 0:
            first = self._pool.free_block_ids_after(None, 1)
            return BlockView(self._pool, int(first[0])) if len(first) else self.fake_free_list_tail
        last = self._pool.free_block_id_before(None)
        return self.fake_free_list_head if last is None else BlockView(self._pool, last)

    @property
    def num_free_blocks(self) -> int:
        return self._pool.get_num_free_blocks()

    def get_all_free_blocks(self) -> list[BlockView]:
        return BlockView.of_ids(self._pool, self._pool.free_block_ids())

    def iter_blocks_after(self, cursor: Any) -> Iterator[BlockView]:
        """The free blocks after ``cursor`` (a block, or ``None`` for the head), in eviction
        order, as vLLM's ``iter_blocks_after``: read from Rust in growing batches, so a walk
        that stops early (an offloading connector covering its target) costs what it reads,
        not the whole queue. Each batch continues after the last block read, so a block freed
        or taken meanwhile is seen as vLLM's linked list would show it; nothing when
        ``cursor`` is not free."""
        return kvpool._core.FreeBlockWalk(self._pool, None if cursor is None else cursor.block_id)


class _AllBlocks(Sequence[BlockView]):
    def __init__(self, pool: kvpool.BlockPool) -> None:
        self._pool = pool

    def __len__(self) -> int:
        return self._pool.num_blocks

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return BlockView.of_ids(self._pool, range(self._pool.num_blocks)[index])
        if index < 0:
            index += self._pool.num_blocks
        if not 0 <= index < self._pool.num_blocks:
            raise IndexError(index)
        return BlockView(self._pool, index)


class _CacheDict(dict):  # type: ignore[type-arg]
    """``cached_block_hash_to_block._cache``: the pool's keys (``BlockHashWithGroupId``) to
    their blocks, as a dict made when read, extra keys (partial-block entries of groups
    whose blocks are larger than the hash granularity) included. Tests edit it to fake an
    eviction and undo it: ``pop(key)`` drops the key from the pool's prefix cache and
    assigning a block to a key puts it back, the block staying where it is, with no event
    (as editing vLLM's dict); a popped block view put back keeps its
    ``block_hash_num_tokens``. Unlike vLLM's dict, popping a block's key unkeys the block
    (vLLM's leaves the block's own ``block_hash`` set until its caller resets it, as
    ``_maybe_evict_cached_block`` does at once) and drops its extra keys with it; popping an
    extra key is refused (``InvalidArgumentError``). ``copy.copy`` gives a plain dict."""

    def __init__(self, pool: kvpool.BlockPool) -> None:
        super().__init__()
        self._pool = pool
        self._extra_keys: set[Any] = set()
        if pool.get_num_cached_blocks() == 0:
            return
        extra = {int(b): pool.extra_block_hashes(int(b)) for b in pool.blocks_with_extra_hashes()}
        self._extra_keys = {make_block_hash_with_group_id(h, g) for keys in extra.values() for h, g in keys}
        for block_id in pool.cached_block_ids().tolist():
            key = pool.block_hash(block_id)  # never None: the block holds a hash
            view = BlockView(pool, block_id)
            for h, g in [key, *extra.get(block_id, ())]:
                self._add(make_block_hash_with_group_id(h, g), block_id, view)
        # The pool returns the first-cached block; the dict's first entry must be it.
        for name, held in list(self.items()):
            if isinstance(held, dict):
                first = pool.get_cached_block(get_block_hash(name), get_group_id(name))
                dict.__setitem__(self, name, {first: held[first], **held})

    def _add(self, name: Any, block_id: int, view: BlockView) -> None:
        held = dict.get(self, name)
        if held is None:
            dict.__setitem__(self, name, view)
        elif isinstance(held, dict):
            held[block_id] = view
        else:
            dict.__setitem__(self, name, {held.block_id: held, block_id: view})

    def __copy__(self) -> dict[Any, Any]:
        return dict(self)

    def pop(self, key: Any, *default: Any) -> Any:
        if key in self._extra_keys:
            _refuse_extra_key_pop()
        missing = object()
        value = dict.pop(self, key, missing)
        if value is missing:
            if default:
                return default[0]
            raise KeyError(key)
        for view in _views_of(value):
            view._num_tokens_when_unkeyed = self._pool.block_hash_num_tokens(view.block_id)
            self._pool._set_block_hash(view.block_id, None)
        return value

    def __setitem__(self, key: Any, value: Any) -> None:
        dict.__setitem__(self, key, value)
        for view in _views_of(value):
            self._pool._set_block_hash(view.block_id, get_block_hash(key), get_group_id(key),
                                       num_tokens=getattr(view, "_num_tokens_when_unkeyed", None))


def _refuse_extra_key_pop() -> NoReturn:
    """Popping a partial-block (extra) key from ``cached_block_hash_to_block`` is not
    supported: kvpool keeps a block's extra keys only beside its own, and drops them with it."""
    raise kvpool.InvalidArgumentError(
        "popping a partial-block key from cached_block_hash_to_block is not supported: "
        "kvpool drops a block's extra keys with its own")


def _views_of(value: Any) -> list[BlockView]:
    """The block views of one ``_CacheDict`` value: a view, or a dict of them by block id."""
    return list(value.values()) if isinstance(value, dict) else [value]


class CachedBlocksView:
    """``block_pool.cached_block_hash_to_block``: its length (distinct cached keys) and truth,
    and ``_cache`` (see ``_CacheDict``)."""

    def __init__(self, pool: kvpool.BlockPool) -> None:
        self._pool = pool

    @property
    def _cache(self) -> _CacheDict:
        return _CacheDict(self._pool)

    def __len__(self) -> int:
        """Distinct keys, extra keys included (O(1))."""
        return self._pool.get_num_cached_keys()

    def __bool__(self) -> bool:
        return self._pool.get_num_cached_blocks() > 0

    def _holds(self, key: Any, block_id: int) -> str | None:
        """Whether ``block_id`` holds ``key``: ``"own"`` (its full-block key), ``"extra"`` (a
        partial-block key of a group with larger blocks) or ``None``."""
        held = self._pool.block_hash(block_id)
        if held is None:
            return None
        if make_block_hash_with_group_id(held[0], held[1]) == key:
            return "own"
        extra = self._pool.extra_block_hashes(block_id)
        return "extra" if any(make_block_hash_with_group_id(h, g) == key for h, g in extra) else None

    def contain(self, key: Any, block_id: int) -> bool:
        """Whether ``block_id`` holds ``key``, its own or an extra one."""
        return self._holds(key, block_id) is not None

    def pop(self, key: Any, block_id: int) -> BlockView | None:
        """Take ``block_id`` out from under ``key``, with no event (as vLLM's map does):
        the block, or ``None`` if it did not hold the key. The block is unkeyed, its extra
        keys with it (vLLM's caller resets the block at once); an extra key is refused
        (``InvalidArgumentError``), as in ``_cache``."""
        holds = self._holds(key, block_id)
        if holds is None:
            return None
        if holds == "extra":
            _refuse_extra_key_pop()
        self._pool._set_block_hash(block_id, None)
        return BlockView(self._pool, block_id)


class ExtraHashesView(Mapping[int, "set[Any]"]):
    """``block_pool.cached_block_hashes_by_block``: per block holding keys beyond its own
    (partial-block entries of groups whose blocks are larger than the hash granularity), the
    set of those keys as ``BlockHashWithGroupId``. Read from Rust each time."""

    def __init__(self, pool: kvpool.BlockPool) -> None:
        self._pool = pool

    def __getitem__(self, block_id: int) -> set[Any]:
        if not isinstance(block_id, int) or not 0 <= block_id < self._pool.num_blocks:
            raise KeyError(block_id)
        keys = self._pool.extra_block_hashes(block_id)
        if not keys:
            raise KeyError(block_id)
        return {make_block_hash_with_group_id(h, g) for h, g in keys}

    def __iter__(self) -> Iterator[int]:
        return iter(self._pool.blocks_with_extra_hashes().tolist())

    def __len__(self) -> int:
        return len(self._pool.blocks_with_extra_hashes())


class BlockPoolView:
    """``manager.block_pool``: reads, and the two calls vLLM's scheduler makes on it."""

    def __init__(self, pool: kvpool.BlockPool, hash_block_size: int) -> None:
        self._pool = pool
        self.blocks = _AllBlocks(pool)
        self.free_block_queue = FreeQueueView(pool)
        self.cached_block_hash_to_block = CachedBlocksView(pool)
        self.cached_block_hashes_by_block = ExtraHashesView(pool)
        self.null_block = BlockView(pool, 0)
        self.num_gpu_blocks = pool.num_blocks
        self.enable_caching = pool.enable_caching
        self.enable_kv_cache_events = pool.enable_events
        self.hash_block_size = hash_block_size
        self.medium = "GPU"
        #: The manager's queue of vLLM events (set by the manager).
        self.kv_event_queue: list[Any] = []

    def get_num_free_blocks(self) -> int:
        return self._pool.get_num_free_blocks()

    def get_usage(self) -> float:
        return self._pool.get_usage()

    def free_blocks(self, ordered_blocks: Iterable[Any]) -> None:
        self._pool.free_blocks(block_ids_of(ordered_blocks))

    def touch(self, blocks: Iterable[Any]) -> None:
        self._pool.touch(block_ids_of(blocks))

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        self._pool.evict_blocks(list(block_ids))  # in the set's order, as vLLM walks it

    def reset_prefix_cache(self) -> bool:
        return self._pool.reset_prefix_cache()

    def get_cached_block(self, block_hash: bytes, kv_cache_group_ids: Sequence[int]) -> list[BlockView] | None:
        """The first block cached under ``block_hash`` in each group asked for, or ``None`` if
        any of them misses."""
        found = []
        for g in kv_cache_group_ids:
            block = self._pool.get_cached_block(block_hash, g)
            if block is None:
                return None
            found.append(BlockView(self._pool, block))
        return found


class _RequestTables:
    """``single_type_managers[0].req_to_blocks``: request id -> its blocks (read-only)."""

    def __init__(self, tables: kvpool.BlockTables) -> None:
        self._tables = tables
        self._pool = tables.pool

    def __getitem__(self, request_id: str) -> BlockList:
        return BlockList(self._pool, self._tables.get_blocks(request_id))

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


class _NumCached:
    """``single_type_managers[0].num_cached_block``: request id -> cached blocks (read-only)."""

    def __init__(self, tables: kvpool.BlockTables) -> None:
        self._tables = tables

    def __getitem__(self, request_id: str) -> int:
        n = self._tables.num_cached_blocks(request_id)
        if n is None:
            raise KeyError(request_id)
        return n

    def get(self, request_id: str, default: Any = None) -> Any:
        n = self._tables.num_cached_blocks(request_id)
        return default if n is None else n

    def __contains__(self, request_id: object) -> bool:
        return request_known(lambda r: self._tables.num_cached_blocks(r) is not None, request_id)

    def __iter__(self) -> Iterator[Any]:
        return (r for r in self._tables.request_ids() if r in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)


class SingleTypeView:
    """``coordinator.single_type_managers[0]``: the full-attention group's attributes."""

    def __init__(self, tables: kvpool.BlockTables, kv_cache_spec: Any, block_pool: BlockPoolView) -> None:
        self.kv_cache_spec = kv_cache_spec
        self.block_size = kv_cache_spec.block_size
        self.kv_cache_group_id = 0
        self.block_pool = block_pool
        self.enable_caching = tables.pool.enable_caching
        self.req_to_blocks = _RequestTables(tables)
        self.num_cached_block = _NumCached(tables)
        self.use_eagle = False
        self.retains_longer_hit = False
        self.records_new_block_ids = False


class CoordinatorView:
    """``manager.coordinator``: what the scheduler reads of vLLM's coordinator."""

    enable_partial_hash_hits = False
    num_reprefillable_tokens = 0

    def __init__(self, manager: Any, single: SingleTypeView, retention_interval: int | None) -> None:
        self._manager = manager
        self.retention_interval = retention_interval
        self.single_type_managers = (single,)
        self.block_pool = single.block_pool
        self.eagle_group_ids: set[int] = set()
        self.drop_eagle_group_ids: set[int] = set()

    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int, new_computed_blocks: Any,
                                   num_encoder_tokens: int = 0, total_computed_tokens: int = 0,
                                   num_local_computed_tokens: int = 0, num_tokens_main_model: int = 0,
                                   apply_admission_cap: bool = False, prefill_end: int = 0) -> int:
        hits = block_ids_of(new_computed_blocks[0]) if new_computed_blocks else []
        return self._manager._tables.num_blocks_to_allocate(request_id, num_tokens, hits)  # type: ignore[no-any-return]

    def get_blocks(self, request_id: str) -> tuple[BlockList]:
        return (self.single_type_managers[0].req_to_blocks[request_id],)
