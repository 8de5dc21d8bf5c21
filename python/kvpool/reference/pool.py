"""A plain-Python ``BlockPool`` with exactly the API of ``kvpool._core.BlockPool``.

Written for clarity, not speed: it is the oracle the Rust pool is tested against and the
baseline its benchmarks are measured against. Every method validates all of its input before it
changes anything, so a call that raises leaves the pool exactly as it was.

The pool keeps, per block id ``0..num_blocks``:

* a reference count (``_ref_counts``),
* an optional hash key ``(hash_bytes, group_id)`` while the block is in the prefix cache
  (``_block_keys``),
* while its count is 0, a place in the free queue (``_free_queue``, a doubly linked list).

The prefix map (``_prefix_map``) maps a key to the blocks holding it, as an insertion-ordered
``dict`` used as an ordered set; a lookup returns the first inserted block.

Example::

    >>> pool = BlockPool(8, enable_events=True, block_size=2)
    >>> ids = pool.get_new_blocks(2)            # blocks 1 and 2 (block 0 is the null block)
    >>> pool.cache_full_blocks(ids, [b"h0", b"h1"], 0, 2)
    >>> pool.find_longest_cache_hit([b"h0", b"h1", b"h2"]).tolist()
    [1, 2]
    >>> pool.free_blocks(ids[::-1])             # cached blocks go to the tail of the free queue
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from kvpool._errors import (
    BlockStateError,
    DtypeError,
    PinBudgetError,
    CachingDisabledError,
    DoubleFreeError,
    HashWidthError,
    InvalidArgumentError,
    InvariantError,
    NoFreeBlocksError,
)
from kvpool.events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored
from kvpool.reference.eviction import (
    DEFAULT_PRIORITY,
    MAX_ADAPTIVE_HORIZON,
    MAX_PRIORITY,
    BlockPriority,
    Clock,
    PolicyQueue,
    check_policy,
    default_adaptive_horizon,
)
from kvpool.reference.free_queue import FreeQueue
from kvpool.reference._args import (
    as_bool_arg,
    as_hash,
    as_hash_list,
    as_int_arg,
    as_int_list,
    as_opt_int_arg,
    as_opt_str_arg,
    as_sequence,
    check_block_ids,
    check_offsets,
    check_range,
)

__all__ = ["BlockPool", "FreeQueue"]  # FreeQueue re-exported from free_queue.py

MAX_NUM_BLOCKS = 2**31 - 1
MAX_HASH_WIDTH = 32
DEFAULT_MAX_PENDING_EVENTS = 1_000_000
MAX_GROUP_ID = 2**32 - 1

NULL_BLOCK_ID = 0

HashKey = tuple[bytes, int]  # (block hash, KV-cache group id)


# --------------------------------------------------------------------------------------------


class BlockPool:
    """A pool of KV-cache blocks: free queue, reference counts and prefix cache (pure Python)."""

    def __init__(
        self,
        num_blocks: int,
        *,
        enable_caching: bool = True,
        null_block: bool = True,
        enable_events: bool = False,
        block_size: int = 16,
        hash_width: int | None = None,
        max_pending_events: int | None = None,
        eviction: str | None = None,
        max_pinned_blocks: int | None = None,
        clock: str | None = None,
        adaptive_horizon: int | None = None,
    ) -> None:
        """Create a pool of ``num_blocks`` blocks, all free (except the null block, block 0).

        ``eviction`` is ``"lru"`` (default, vLLM's order), ``"priority"`` or ``"adaptive"``
        (``kvpool.reference.eviction``); at most ``max_pinned_blocks`` blocks (default
        ``num_blocks // 4``) may be pinned; ``clock`` is ``"monotonic"`` (default) or
        ``"manual"`` (moved by ``advance_clock``), the clock retention durations run on.
        ``adaptive_horizon`` (``eviction="adaptive"`` only, ``0..=2**40``) replaces the adaptive
        policy's horizon (by default 20,000 in pools up to 25,000 blocks, fading to 0 at 30,000:
        :func:`~kvpool.reference.eviction.default_adaptive_horizon`).

        Raises ``DtypeError`` for a non-int / non-bool argument and ``InvalidArgumentError``
        unless ``1 <= num_blocks <= 2**31 - 1``, ``block_size >= 1``, ``hash_width`` is
        ``None`` or in ``1..=32`` and ``max_pending_events`` is ``None`` or at least 1. At most
        ``max_pending_events`` events (default 1,000,000) are queued: beyond it the oldest is
        dropped and counted in ``num_dropped_events``.
        """
        num_blocks = as_int_arg(num_blocks, "num_blocks")
        enable_caching = as_bool_arg(enable_caching, "enable_caching", True)
        null_block = as_bool_arg(null_block, "null_block", True)
        enable_events = as_bool_arg(enable_events, "enable_events", False)
        block_size = as_int_arg(block_size, "block_size")
        hash_width = as_opt_int_arg(hash_width, "hash_width")
        max_events = as_opt_int_arg(max_pending_events, "max_pending_events")
        max_events = DEFAULT_MAX_PENDING_EVENTS if max_events is None else max_events
        check_range(max_events, "max_pending_events", 1, 2**63 - 1)
        check_range(num_blocks, "num_blocks", 1, MAX_NUM_BLOCKS)
        policy = check_policy(eviction)
        manual = _check_clock(clock)
        horizon = as_opt_int_arg(adaptive_horizon, "adaptive_horizon")
        if horizon is not None:
            check_range(horizon, "adaptive_horizon", 0, MAX_ADAPTIVE_HORIZON)
            if policy != "adaptive":
                raise InvalidArgumentError(f"adaptive_horizon applies to eviction='adaptive', not '{policy}'")
        pin_budget = as_opt_int_arg(max_pinned_blocks, "max_pinned_blocks")
        if pin_budget is not None:
            check_range(pin_budget, "max_pinned_blocks", 0, num_blocks)
        if block_size < 1:
            raise InvalidArgumentError(f"block_size must be >= 1, got {block_size}")
        if hash_width is not None and not 1 <= hash_width <= MAX_HASH_WIDTH:
            raise InvalidArgumentError(f"hash_width must be None or between 1 and {MAX_HASH_WIDTH}, got {hash_width}")

        self._num_blocks = num_blocks
        self._block_size = block_size
        self._enable_caching = enable_caching
        self._enable_events = enable_events
        self._null_block: int | None = NULL_BLOCK_ID if null_block else None
        self._hash_width = hash_width

        self._ref_counts: list[int] = [0] * num_blocks
        self._block_keys: list[HashKey | None] = [None] * num_blocks
        #: Per block, the tokens its last key covered (its end in its chain); read only while
        #: the block holds a key.
        self._block_tokens: dict[int, int] = {}
        self._prefix_map: dict[HashKey, dict[int, None]] = {}
        self._num_cached = 0
        self._events: deque[Any] = deque()
        self._max_pending_events = max_events
        self._dropped_events = 0
        first = 1 if null_block else 0
        self._eviction = policy
        self._adaptive_horizon = default_adaptive_horizon(num_blocks) if horizon is None else horizon
        self._clock = Clock(manual)
        self._max_pinned = num_blocks // 4 if pin_budget is None else pin_budget
        self._pins: set[int] = set()
        self._evictions = 0
        self._policy: PolicyQueue | None = None
        self._free_queue: FreeQueue | PolicyQueue
        if policy == "lru":
            self._free_queue = FreeQueue(range(first, num_blocks))
        else:
            self._policy = PolicyQueue(list(range(first, num_blocks)), num_blocks, policy, self._clock,
                                       self._adaptive_horizon)
            self._free_queue = self._policy

    # -- properties ---------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        """Total number of blocks, the null block included."""
        return self._num_blocks

    @property
    def block_size(self) -> int:
        """Tokens per block (used for the token ids of ``BlockStored`` events)."""
        return self._block_size

    @property
    def enable_caching(self) -> bool:
        """Whether the prefix cache is on."""
        return self._enable_caching

    @property
    def enable_events(self) -> bool:
        """Whether KV events are recorded for ``take_events``."""
        return self._enable_events

    @property
    def null_block(self) -> int | None:
        """The null block's id (0), or ``None`` if the pool has no null block."""
        return self._null_block

    @property
    def hash_width(self) -> int | None:
        """The width of every block hash, in bytes; ``None`` until fixed by the first caching."""
        return self._hash_width

    @property
    def eviction(self) -> str:
        """The eviction policy: ``"lru"``, ``"priority"`` or ``"adaptive"``."""
        return self._eviction

    @property
    def adaptive_horizon(self) -> int:
        """The adaptive policy's horizon in blocks freed (unused by the other policies)."""
        return self._adaptive_horizon

    @property
    def clock(self) -> str:
        """The clock retention durations run on: ``"monotonic"`` or ``"manual"``."""
        return "manual" if self._clock.manual else "monotonic"

    @property
    def now(self) -> float:
        """The pool's clock in seconds."""
        return self._clock.now()

    @property
    def max_pinned_blocks(self) -> int:
        """Most blocks that may be pinned at once."""
        return self._max_pinned

    @property
    def num_evictions(self) -> int:
        """Cached blocks evicted to make room for allocations, since the pool was built."""
        return self._evictions

    def advance_clock(self, seconds: float) -> None:
        """Move a ``clock="manual"`` pool's clock forward by ``seconds`` (>= 0)."""
        value = _as_seconds(seconds, "seconds")
        if not self._clock.manual:
            raise InvalidArgumentError("advance_clock needs a pool built with clock='manual'")
        if value < 0:
            raise InvalidArgumentError(f"advance_clock takes a finite number of seconds >= 0, got {value}")
        if not math.isfinite(self._clock.now() + value):
            raise InvalidArgumentError(f"advance_clock({value}) would move the clock past the largest time")
        self._clock.advance(value)

    def __repr__(self) -> str:
        """A summary: blocks, free and cached counts, caching and null block."""
        return (
            f"reference.BlockPool(num_blocks={self._num_blocks}, free={len(self._free_queue)}, "
            f"cached={self._num_cached}, enable_caching={self._enable_caching}, "
            f"null_block={self._null_block is not None}, eviction={self._eviction!r})"
        )

    # -- validation helpers that need the pool ------------------------------------------------

    def _is_null(self, block_id: int) -> bool:
        """Whether ``block_id`` is the null block."""
        return block_id == self._null_block

    def _check_ids_in_range(self, block_ids: Iterable[int]) -> None:
        """``InvalidBlockIdError`` for the first id outside ``0..num_blocks``."""
        check_block_ids(block_ids, self._num_blocks)

    def _as_block_id(self, value: Any, name: str = "block_id") -> int:
        """One block id, in range."""
        block_id = as_int_arg(value, name)
        self._check_ids_in_range([block_id])
        return block_id

    @staticmethod
    def _check_hash_form(hashes: Sequence[bytes]) -> None:
        """Each hash is 1..=32 bytes, all of one width (checked as the list is read)."""
        if hashes and any(len(h) != len(hashes[0]) for h in hashes):
            raise HashWidthError("block hashes of different widths in one call")
        for h in hashes:
            if not 1 <= len(h) <= MAX_HASH_WIDTH:
                raise HashWidthError(f"a block hash must have 1 to {MAX_HASH_WIDTH} bytes, got {len(h)}")

    def _check_hash_widths(self, hashes: Sequence[bytes]) -> None:
        """:meth:`_check_hash_form`, and once the pool's width is fixed, of that width."""
        self._check_hash_form(hashes)
        for h in hashes:
            if self._hash_width is not None and len(h) != self._hash_width:
                raise HashWidthError(f"the pool's hashes are {self._hash_width} bytes, got {len(h)}")

    def _check_can_free(self, segments: Sequence[Sequence[int]]) -> None:
        """Raise ``DoubleFreeError`` if freeing ``segments`` in order would take a count below 0."""
        pending: dict[int, int] = {}
        for segment in segments:
            for block_id in segment:
                if self._is_null(block_id):
                    continue
                pending[block_id] = pending.get(block_id, 0) + 1
                # A pinned block's last reference is the pin's: only unpinning frees it.
                if pending[block_id] > self._ref_counts[block_id] - (block_id in self._pins):
                    raise DoubleFreeError(f"block {block_id} would be freed while its reference count is 0")

    # -- mutation helpers (no validation: callers validate first) -----------------------------

    def _emit(self, event: Any) -> None:
        """Queue a KV event, if events are on."""
        if self._enable_events:
            if len(self._events) >= self._max_pending_events:
                self._events.popleft()
                self._dropped_events += 1
            self._events.append(event)

    def _drop_key(self, block_id: int) -> None:
        """Take ``block_id`` out of the prefix cache and emit its ``BlockRemoved``."""
        key = self._block_keys[block_id]
        assert key is not None
        entry = self._prefix_map[key]
        del entry[block_id]
        if not entry:
            del self._prefix_map[key]
        self._block_keys[block_id] = None
        self._num_cached -= 1
        block_hash, group_id = key
        self._emit(BlockRemoved(block_hashes=[block_hash], medium=MEDIUM_GPU, group_idx=group_id))

    def _allocate(self, n: int) -> list[int]:
        """Pop ``n`` blocks off the free queue (evicting their hashes) with count 1 each."""
        new_ids = []
        for _ in range(n):
            block_id = self._free_queue.popleft()
            key = self._block_keys[block_id]
            if key is not None:
                self._drop_key(block_id)
                self._evictions += 1
                if self._policy is not None:
                    self._policy.on_evicted(block_id, key)
            self._ref_counts[block_id] = 1
            new_ids.append(block_id)
        return new_ids

    def _free_segment(self, block_ids: Sequence[int]) -> None:
        """Drop one reference to each block; those reaching 0 join the free queue (uncached
        ones at the head as a group, cached ones at the tail)."""
        to_head: list[int] = []
        to_tail: list[int] = []
        for block_id in block_ids:
            if self._is_null(block_id):
                continue
            self._ref_counts[block_id] -= 1
            if self._ref_counts[block_id] == 0:
                cached = self._enable_caching and self._block_keys[block_id] is not None
                (to_tail if cached else to_head).append(block_id)
        self._free_queue.prepend(to_head)
        self._free_queue.extend(to_tail)

    # -- allocation ---------------------------------------------------------------------------

    def get_new_blocks(self, num_blocks: int) -> npt.NDArray[Any]:
        """Allocate ``num_blocks`` blocks from the head of the free queue; return their ids (int32).

        A popped block that still holds a hash is evicted from the prefix cache first (one
        ``BlockRemoved`` event each, in pop order). Each new block gets reference count 1.
        Raises ``InvalidArgumentError`` if ``num_blocks < 0`` and ``NoFreeBlocksError`` if fewer
        blocks are free (nothing is allocated then).
        """
        n = as_int_arg(num_blocks, "num_blocks")
        if n < 0:
            raise InvalidArgumentError(f"num_blocks must be >= 0, got {n}")
        if n > len(self._free_queue):
            raise NoFreeBlocksError(f"asked for {n} blocks, {len(self._free_queue)} are free")
        return np.array(self._allocate(n), dtype=np.int32)

    def get_new_blocks_many(self, counts: Any) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
        """Allocate ``counts[i]`` blocks for each ``i`` in order, as ``get_new_blocks`` would.

        Returns ``(ids, offsets)``: all new ids flat (int32) and int64 offsets of length
        ``len(counts) + 1`` so that request ``i`` got ``ids[offsets[i]:offsets[i + 1]]``.
        All or nothing: a negative count (``InvalidArgumentError``) or a total above the free
        count (``NoFreeBlocksError``) allocates nothing.
        """
        counts_list = as_int_list(counts, "counts")
        for c in counts_list:
            if c < 0:
                raise InvalidArgumentError(f"counts must be >= 0, got {c}")
        total = sum(counts_list)
        if total > len(self._free_queue):
            raise NoFreeBlocksError(f"asked for {total} blocks, {len(self._free_queue)} are free")
        ids: list[int] = []
        offsets = [0]
        for c in counts_list:
            ids.extend(self._allocate(c))
            offsets.append(len(ids))
        return np.array(ids, dtype=np.int32), np.array(offsets, dtype=np.int64)

    # -- freeing ------------------------------------------------------------------------------

    def free_blocks(self, block_ids: Any, *, reverse: bool = False) -> None:
        """Drop one reference to each block, in the order given (pass a request's blocks reversed),
        or from the last to the first with ``reverse=True`` (pass them in table order).

        Blocks reaching count 0 join the free queue: those without a hash are prepended as a
        group in the order given (the first one freed is reused first), those with a hash are
        appended at the tail in the order given. The null block is skipped. Raises
        ``InvalidBlockIdError`` for an id out of range and ``DoubleFreeError`` if a count would
        go below 0 (duplicates in the call counted); nothing changes then.
        """
        reverse = as_bool_arg(reverse, "reverse", False)
        ids = as_int_list(block_ids, "block_ids")
        if reverse:
            ids = ids[::-1]
        self._check_ids_in_range(ids)
        self._check_can_free([ids])
        self._free_segment(ids)

    def free_blocks_many(
        self,
        blocks: Any,
        offsets: Any = None,
        *,
        reverse: bool = False,
    ) -> None:
        """``free_blocks`` on each of several segments in order, all or nothing.

        With ``offsets=None``, ``blocks`` is a sequence of id sequences; otherwise ``blocks`` is
        one flat id array and segment ``i`` is ``blocks[offsets[i]:offsets[i + 1]]``
        (``offsets`` non-decreasing, starting at 0, ending at ``len(blocks)``, else
        ``InvalidArgumentError``). With ``reverse=True`` each segment is freed back to front.
        A bad id or a double free in any segment (counted across segments) changes nothing.
        """
        reverse = as_bool_arg(reverse, "reverse", False)
        segments: list[list[int]]
        if offsets is None:
            if isinstance(blocks, np.ndarray) and blocks.ndim == 2:
                rows: Sequence[Any] = list(blocks)
            else:
                rows = as_sequence(blocks, f"blocks must be a sequence of id sequences, got {type(blocks).__name__}")
            segments = [as_int_list(row, "blocks[i]") for row in rows]
        else:
            flat = as_int_list(blocks, "blocks")
            cuts = as_int_list(offsets, "offsets")
            check_offsets(cuts, len(flat))
            segments = [flat[a:b] for a, b in zip(cuts, cuts[1:])]
        if reverse:
            segments = [segment[::-1] for segment in segments]
        for segment in segments:
            self._check_ids_in_range(segment)
        self._check_can_free(segments)
        for segment in segments:
            self._free_segment(segment)

    # -- reuse --------------------------------------------------------------------------------

    def touch(self, block_ids: Any) -> None:
        """Take one more reference to each block (reusing prefix-cache hits), in order.

        A block with count 0 leaves the free queue first; its hash stays. Duplicates take one
        reference each; the null block is skipped. Raises ``InvalidBlockIdError`` for an id out
        of range (nothing changes then).
        """
        ids = as_int_list(block_ids, "block_ids")
        self._check_ids_in_range(ids)
        for block_id in ids:
            if self._is_null(block_id):
                continue
            if self._ref_counts[block_id] == 0:
                self._free_queue.remove(block_id)
            self._ref_counts[block_id] += 1
            if self._policy is not None:
                self._policy.on_use(block_id)

    # -- prefix cache -------------------------------------------------------------------------

    def cache_full_blocks(
        self,
        block_ids: Any,
        block_hashes: Any,
        num_cached_blocks: int,
        num_full_blocks: int,
        *,
        group_id: int | None = 0,
        token_ids: Any = None,
        lora_id: int | None = None,
        lora_name: str | None = None,
        priority: int | None = None,
        retention_s: float | None = None,
        _extra_keys: list[Any] | None = None,
    ) -> None:
        """Enter a request's newly full blocks in the prefix cache.

        ``_extra_keys`` (the managers', not public) gives the event the new blocks' extra keys,
        one entry per block of ``num_cached_blocks..num_full_blocks``.

        ``priority`` (``0..=100``, for ``retention_s`` seconds if given) is the new blocks'
        retention priority; it needs ``eviction="priority"`` (``InvalidArgumentError``).

        Blocks ``block_ids[num_cached_blocks:num_full_blocks]`` (the null block skipped) get the
        key ``(block_hashes[i], group_id)`` and are appended under it in the prefix map; one
        ``BlockStored`` event covers the call. ``num_cached_blocks == num_full_blocks`` is a
        no-op. Raises, before any change and in this order: ``CachingDisabledError``;
        ``DtypeError`` for wrong argument types, and ``HashWidthError`` for a hash list that
        is not of one width of 1 to 32 bytes (both as the arguments are read, in the order
        ``lora_name``, the counts, ``group_id``, ``lora_id``, ``block_ids``, ``block_hashes``,
        ``token_ids``, ``priority``); ``InvalidArgumentError`` unless
        ``0 <= num_cached <= num_full <= len(block_ids), len(block_hashes)`` and
        ``0 <= group_id < 2**32``; ``InvalidBlockIdError``; ``HashWidthError`` for hashes of
        another width than the pool's (the first successful call fixes it); ``InvalidArgumentError``
        if ``token_ids`` is shorter than ``num_full * block_size``; ``BlockStateError`` if a new
        block is free, already cached, or listed twice among the new blocks.
        """
        if not self._enable_caching:
            raise CachingDisabledError("cache_full_blocks called on a pool with enable_caching=False")
        # The arguments are read in the binding's order; a hash list's form (each hash 1 to
        # 32 bytes, all of one width) is checked as it is read.
        name = as_opt_str_arg(lora_name, "lora_name")
        num_cached = as_int_arg(num_cached_blocks, "num_cached_blocks")
        num_full = as_int_arg(num_full_blocks, "num_full_blocks")
        group = as_opt_int_arg(group_id, "group_id") or 0
        lora = as_opt_int_arg(lora_id, "lora_id")
        ids = as_int_list(block_ids, "block_ids")
        hashes = as_hash_list(block_hashes, "block_hashes")
        self._check_hash_form(hashes)
        tokens = None if token_ids is None else as_int_list(token_ids, "token_ids")
        wanted = _as_priority(priority, retention_s)

        if not 0 <= num_cached <= num_full:
            raise InvalidArgumentError(
                f"need 0 <= num_cached_blocks <= num_full_blocks, got {num_cached} and {num_full}"
            )
        if num_full > len(ids):
            raise InvalidArgumentError(f"num_full_blocks={num_full} but only {len(ids)} block ids")
        if num_full > len(hashes):
            raise InvalidArgumentError(f"num_full_blocks={num_full} but only {len(hashes)} block hashes")
        check_range(group, "group_id", 0, MAX_GROUP_ID)
        self._check_ids_in_range(ids)
        self._check_hash_widths(hashes)
        if tokens is not None and len(tokens) < num_full * self._block_size:
            raise InvalidArgumentError(
                f"token_ids has {len(tokens)} tokens, {num_full} full blocks need {num_full * self._block_size}"
            )
        if wanted is not None and self._eviction != "priority":
            raise InvalidArgumentError(
                f"a retention priority needs a pool built with eviction='priority' (this one evicts by {self._eviction})"
            )
        seen: set[int] = set()
        for block_id in ids[num_cached:num_full]:
            if self._is_null(block_id):
                continue
            if self._ref_counts[block_id] == 0:
                raise BlockStateError(f"block {block_id} is free, it cannot be cached")
            if self._block_keys[block_id] is not None:
                raise BlockStateError(f"block {block_id} is already cached")
            if block_id in seen:
                raise BlockStateError(f"block {block_id} appears twice among the new full blocks")
            seen.add(block_id)

        if num_cached == num_full:
            return
        if self._hash_width is None:
            self._hash_width = len(hashes[0])
        stored: list[bytes] = []
        stored_keys: list[Any] = []
        for i in range(num_cached, num_full):
            block_id = ids[i]
            if self._is_null(block_id):
                continue
            if _extra_keys is not None:
                stored_keys.append(_extra_keys[i - num_cached])
            key = (hashes[i], group)
            self._block_keys[block_id] = key
            self._block_tokens[block_id] = (i + 1) * self._block_size
            self._prefix_map.setdefault(key, {})[block_id] = None
            self._num_cached += 1
            stored.append(hashes[i])
            if self._policy is not None:
                at = None if wanted is None else wanted.at(self.now)
                self._policy.on_cached(block_id, key, at)
        bs = self._block_size
        self._emit(
            BlockStored(
                block_hashes=stored,
                parent_block_hash=hashes[num_cached - 1] if num_cached > 0 else None,
                token_ids=[] if tokens is None else tokens[num_cached * bs : num_full * bs],
                block_size=bs,
                lora_id=lora,
                medium=MEDIUM_GPU,
                lora_name=name,
                group_idx=group,
                extra_keys=None if _extra_keys is None else stored_keys,
            )
        )

    def get_cached_block(self, block_hash: bytes, group_id: int | None = 0) -> int | None:
        """The first-inserted block still cached under ``(block_hash, group_id)``, or ``None``.

        Raises ``DtypeError`` unless ``block_hash`` is bytes, ``InvalidArgumentError`` for a
        group id outside ``0..2**32`` and ``HashWidthError`` for a bad width. Changes nothing.
        """
        h = as_hash(block_hash, "block_hash")
        group = as_opt_int_arg(group_id, "group_id") or 0
        check_range(group, "group_id", 0, MAX_GROUP_ID)
        self._check_hash_widths([h])
        entry = self._prefix_map.get((h, group))
        if not entry:
            return None
        return next(iter(entry))

    def find_longest_cache_hit(
        self,
        block_hashes: Any,
        *,
        group_id: int | None = 0,
        max_blocks: int | None = None,
    ) -> npt.NDArray[Any]:
        """The cached blocks of the longest prefix of ``block_hashes[:max_blocks]`` (int32 ids).

        Scans from the start and stops at the first hash with no cached block. Every hash given
        is width-checked (``HashWidthError``); ``max_blocks`` must be ``None`` or ``>= 0``
        (``InvalidArgumentError``). Changes nothing, reference counts included.
        """
        hashes = as_hash_list(block_hashes, "block_hashes")
        group = as_opt_int_arg(group_id, "group_id") or 0
        limit = as_opt_int_arg(max_blocks, "max_blocks")
        check_range(group, "group_id", 0, MAX_GROUP_ID)
        if limit is not None and limit < 0:
            raise InvalidArgumentError(f"max_blocks must be None or >= 0, got {limit}")
        self._check_hash_widths(hashes)
        hit: list[int] = []
        for h in hashes if limit is None else hashes[:limit]:
            entry = self._prefix_map.get((h, group))
            if not entry:
                break
            hit.append(next(iter(entry)))
        return np.array(hit, dtype=np.int32)

    def evict_blocks(self, block_ids: Any) -> None:
        """Drop the hash of each given block that holds one (one ``BlockRemoved`` each, in order).

        Blocks in use stay in use; free blocks keep their place in the free queue under LRU
        (vLLM's order), while under the other policies, which reuse uncached free blocks before
        any cached one, they move to the head, in the order given. Blocks without a hash and the
        null block are ignored. Raises ``InvalidBlockIdError`` for an id out of range (nothing
        changes then).
        """
        ids = as_int_list(block_ids, "block_ids")
        self._check_ids_in_range(ids)
        uncached_free = []
        for block_id in ids:
            if self._is_null(block_id):
                continue
            if self._block_keys[block_id] is not None:
                self._drop_key(block_id)
                if self._policy is not None and self._policy.in_lists(block_id):
                    uncached_free.append(block_id)
        if self._policy is not None:
            for block_id in uncached_free:
                self._policy.remove(block_id)
            self._policy.prepend(uncached_free)
        unpinned = []
        for block_id in ids:
            if block_id in self._pins:
                self._pins.discard(block_id)
                unpinned.append(block_id)
        self._free_segment(unpinned)

    def reset_prefix_cache(self) -> bool:
        """Drop every cached hash, if no block is in use; return whether it did.

        With any block other than the null block in use, returns ``False`` and changes nothing.
        Otherwise clears every hash and the prefix map, emits ``AllBlocksCleared`` and returns
        ``True`` (also when nothing was cached). The free queue keeps its order.
        """
        for block_id, count in enumerate(self._ref_counts):
            if count > 0 and not self._is_null(block_id):
                return False
        self._block_keys = [None] * self._num_blocks
        self._prefix_map.clear()
        self._num_cached = 0
        if self._policy is not None:
            self._policy.on_reset()
        self._emit(AllBlocksCleared())
        return True

    # -- counters -----------------------------------------------------------------------------

    def get_num_free_blocks(self) -> int:
        """Number of blocks in the free queue."""
        return len(self._free_queue)

    def get_num_cached_blocks(self) -> int:
        """Number of blocks holding a hash (in use or free)."""
        return self._num_cached

    def get_num_cached_keys(self) -> int:
        """Number of distinct keys in the prefix cache (a key several blocks hold counts once)."""
        return len(self._prefix_map)

    def get_usage(self) -> float:
        """Fraction of usable blocks in use: ``1 - free / usable`` (0.0 if nothing is usable).

        Usable blocks are all blocks but the null block.
        """
        usable = self._num_blocks - (1 if self._null_block is not None else 0)
        if usable == 0:
            return 0.0
        return 1.0 - len(self._free_queue) / usable

    def take_events(self) -> list[Any]:
        """The pending KV events, oldest first; clears them. Always ``[]`` with events off."""
        events, self._events = list(self._events), deque()
        return events

    @property
    def max_pending_events(self) -> int:
        """Most events queued before the oldest are dropped."""
        return self._max_pending_events

    @property
    def num_pending_events(self) -> int:
        """Number of queued events (what ``take_events`` would return)."""
        return len(self._events)

    @property
    def num_dropped_events(self) -> int:
        """Events dropped, oldest first, because ``max_pending_events`` were already queued."""
        return self._dropped_events

    # -- introspection ------------------------------------------------------------------------

    def free_block_ids(self) -> npt.NDArray[Any]:
        """The free queue's block ids from head (next allocated) to tail (int32)."""
        if self._policy is not None:
            self._policy.apply_expiries()
        return np.array(list(self._free_queue), dtype=np.int32)

    # -- retention priorities and pins ---------------------------------------------------------

    def set_priority(self, block_ids: Any, priority: int, *, retention_s: float | None = None) -> None:
        """Give blocks (in use or free) a retention priority ``0..=100``, for ``retention_s``
        seconds if given, after which it reverts to the default (35). A free cached block moves to
        the tail of its new priority. Needs ``eviction="priority"``."""
        ids = as_int_list(block_ids, "block_ids")
        self._check_ids_in_range(ids)
        if priority is None:
            raise InvalidArgumentError("priority must be an int in 0..=100, got None")
        wanted = _as_priority(priority, retention_s)
        assert wanted is not None
        self._set_priority(ids, wanted.at(self.now), only_raise=False)

    def _set_priority(self, ids: Sequence[int], p: BlockPriority, *, only_raise: bool) -> None:
        if self._eviction != "priority" or self._policy is None:
            raise InvalidArgumentError(
                f"retention priorities need a pool built with eviction='priority' (this one evicts by {self._eviction})"
            )
        # Expiries due now first (as before every change of the lists), while every pending one
        # still belongs to the priority it ends.
        self._policy.apply_expiries()
        now = self.now
        for block_id in ids:
            if self._is_null(block_id):
                continue
            current = self._policy.priorities.get(block_id, BlockPriority())
            if only_raise and p.effective(now) <= current.effective(now):
                continue
            self._policy.priorities[block_id] = p
            if self._policy.in_lists(block_id):
                self._policy.requeue(block_id)

    def block_priority(self, block_id: int) -> tuple[int, float | None]:
        """The block's retention ``(priority, expires_at)`` in force now (``(35, None)`` by default)."""
        block_id = self._as_block_id(block_id)
        if self._policy is None or self._eviction != "priority":
            return (DEFAULT_PRIORITY, None)
        p = self._policy.priorities.get(block_id, BlockPriority())
        if p.expires_at is not None and p.expires_at <= self.now:
            return (DEFAULT_PRIORITY, None)
        return (p.priority, p.expires_at)

    def pin_prefix(self, block_hashes: Any, *, group_id: int | None = 0) -> int:
        """Pin the blocks of the longest cached prefix of ``block_hashes``: each holds one more
        reference until unpinned, so no policy evicts it. Returns that prefix's length. Raises
        ``PinBudgetError`` (nothing pinned) beyond ``max_pinned_blocks``."""
        chain = [int(b) for b in self.find_longest_cache_hit(block_hashes, group_id=group_id)]
        new = [b for b in dict.fromkeys(chain) if b not in self._pins]  # each once, in order
        if len(self._pins) + len(new) > self._max_pinned:
            raise PinBudgetError(
                f"pinning {len(new)} more blocks would exceed the pin budget: "
                f"{len(self._pins)} of {self._max_pinned} are pinned (max_pinned_blocks)"
            )
        for block_id in new:
            if self._ref_counts[block_id] == 0:
                self._free_queue.remove(block_id)
            self._ref_counts[block_id] += 1
            self._pins.add(block_id)
        return len(chain)

    def unpin_prefix(self, block_hashes: Any, *, group_id: int | None = 0) -> int:
        """Unpin the pinned blocks of the longest cached prefix of ``block_hashes`` (their pin's
        reference is freed, tail first); returns how many were unpinned."""
        chain = [int(b) for b in self.find_longest_cache_hit(block_hashes, group_id=group_id)]
        unpinned = []
        for block_id in chain:
            if block_id in self._pins:
                self._pins.discard(block_id)
                unpinned.append(block_id)
        self._free_segment(unpinned[::-1])
        return len(unpinned)

    def unpin_all(self) -> int:
        """Unpin every pinned block; returns how many there were."""
        ids = sorted(self._pins)
        self._pins.clear()
        self._free_segment(ids[::-1])
        return len(ids)

    def get_num_pinned_blocks(self) -> int:
        """Number of pinned blocks."""
        return len(self._pins)

    def pinned_block_ids(self) -> npt.NDArray[Any]:
        """The pinned blocks' ids, ascending (int32)."""
        return np.array(sorted(self._pins), dtype=np.int32)

    def ref_count(self, block_id: int) -> int:
        """The reference count of one block (``InvalidBlockIdError`` if out of range)."""
        return self._ref_counts[self._as_block_id(block_id)]

    def ref_counts_of(self, block_ids: Any) -> npt.NDArray[np.int32]:
        """The reference counts of ``block_ids`` (int32, in the order given)."""
        ids = as_int_list(block_ids, "block_ids")
        self._check_ids_in_range(ids)
        return np.array([self._ref_counts[b] for b in ids], dtype=np.int32)

    def ref_counts(self) -> npt.NDArray[Any]:
        """The reference counts of all blocks, indexed by block id (int32)."""
        return np.array(self._ref_counts, dtype=np.int32)

    def block_hash(self, block_id: int) -> tuple[bytes, int] | None:
        """The block's key ``(hash_bytes, group_id)`` while it is cached, else ``None``."""
        return self._block_keys[self._as_block_id(block_id)]

    def block_hash_num_tokens(self, block_id: int) -> int | None:
        """Tokens the block's key covers (its end position in its chain), or ``None`` while
        it holds no key."""
        block_id = self._as_block_id(block_id)
        return None if self._block_keys[block_id] is None else self._block_tokens[block_id]

    def extra_block_hashes(self, block_id: int) -> list[tuple[bytes, int]]:
        """Keys beyond the block's own: none here (partial-block entries are made only by
        vLLM's hybrid groups, through ``GroupTables``)."""
        self._as_block_id(block_id)
        return []

    def cached_block_ids(self) -> npt.NDArray[Any]:
        """The blocks that hold a block hash, in id order (int32)."""
        return np.array([b for b, key in enumerate(self._block_keys) if key is not None], dtype=np.int32)

    def blocks_with_extra_hashes(self) -> npt.NDArray[Any]:
        """The blocks holding keys beyond their own: none here (int32)."""
        return np.array([], dtype=np.int32)

    def free_block_ids_after(self, cursor: int | None, max_blocks: int) -> npt.NDArray[Any]:
        """At most ``max_blocks`` free block ids after ``cursor`` in the free queue (from the
        head when ``None``; none when ``cursor`` is not free), int32."""
        start = None if cursor is None else self._as_block_id(cursor)
        max_blocks = as_int_arg(max_blocks, "max_blocks", 0)
        order = self.free_block_ids().tolist()
        if start is None:
            after = order
        elif start in order:
            after = order[order.index(start) + 1:]
        else:
            after = []
        return np.array(after[:max_blocks], dtype=np.int32)

    def free_block_id_before(self, block_id: int | None) -> int | None:
        """The free block just before ``block_id`` in the free queue, toward the head, or
        ``None`` when ``block_id`` is the head or not free; with ``block_id`` None, the
        queue's last block (``None`` when it is empty)."""
        if block_id is None:
            order = self.free_block_ids().tolist()
            return order[-1] if order else None
        block = self._as_block_id(block_id)
        order = self.free_block_ids().tolist()
        if block not in order:
            return None
        index = order.index(block)
        return order[index - 1] if index > 0 else None

    def check_invariants(self) -> None:
        """Check the pool's structure; raise ``InvariantError`` listing every problem found.

        Checked: the free queue's links; a block is in the queue iff its count is 0 (the null
        block is never queued, never counted, never cached); each prefix-map entry is non-empty
        and points at blocks holding its key, and every block holding a key is in that entry;
        the cached counter and hash widths agree with the blocks.
        """
        problems = self._free_queue.problems()
        for block_id in range(self._num_blocks):
            count = self._ref_counts[block_id]
            queued = block_id in self._free_queue
            key = self._block_keys[block_id]
            if self._is_null(block_id):
                if queued or count != 0 or key is not None:
                    problems.append(f"null block: queued={queued}, count={count}, key={key!r}")
                continue
            if count < 0:
                problems.append(f"block {block_id}: negative count {count}")
            if queued != (count == 0):
                problems.append(f"block {block_id}: count {count} but queued={queued}")
            if key is not None:
                if not self._enable_caching:
                    problems.append(f"block {block_id}: holds a key with caching off")
                if block_id not in self._prefix_map.get(key, {}):
                    problems.append(f"block {block_id}: key {key!r} but not in the prefix map under it")
                if self._hash_width is not None and len(key[0]) != self._hash_width:
                    problems.append(f"block {block_id}: hash of {len(key[0])} bytes, pool width {self._hash_width}")
        mapped = 0
        for key, entry in self._prefix_map.items():
            if not entry:
                problems.append(f"prefix map: empty entry for {key!r}")
            for block_id in entry:
                mapped += 1
                if not 0 <= block_id < self._num_blocks or self._block_keys[block_id] != key:
                    problems.append(f"prefix map: {key!r} lists block {block_id}, which does not hold it")
        holding = sum(key is not None for key in self._block_keys)
        if not self._num_cached == holding == mapped:
            problems.append(
                f"cached counter {self._num_cached}, blocks holding a key {holding}, map entries {mapped}"
            )
        if len(self._pins) > self._max_pinned:
            problems.append(f"pins: {len(self._pins)} pinned blocks, over the budget of {self._max_pinned}")
        for block_id in self._pins:
            if self._ref_counts[block_id] == 0 or self._is_null(block_id):
                problems.append(f"pins: block {block_id} is pinned but holds no reference")
        if problems:
            raise InvariantError("; ".join(problems))


# --------------------------------------------------------------------------------------------
# Arguments of the eviction policies.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _PriorityArg:
    """A checked ``priority=`` / ``retention_s=`` pair, turned into a :class:`BlockPriority` at a time."""

    priority: int
    duration_s: float | None

    def at(self, now: float) -> BlockPriority:
        return BlockPriority(self.priority, None if self.duration_s is None else now + self.duration_s)


def _as_seconds(value: Any, name: str) -> float:
    """A finite number of seconds (int or float, not bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DtypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    try:
        seconds = float(value)
    except OverflowError:  # an int past a float's range
        seconds = math.inf
    if not math.isfinite(seconds):
        raise InvalidArgumentError(f"{name} must be finite, got {seconds}")
    return seconds


def _as_priority(priority: Any, retention_s: Any) -> _PriorityArg | None:
    """``priority=`` and ``retention_s=``: ``None`` for neither; a duration needs a priority."""
    p = as_opt_int_arg(priority, "priority")
    d = None if retention_s is None else _as_seconds(retention_s, "retention_s")
    if p is None:
        if d is not None:
            raise InvalidArgumentError("retention_s needs a priority (the priority it keeps for that long)")
        return None
    check_range(p, "priority", 0, MAX_PRIORITY)
    if d is not None and d <= 0:
        raise InvalidArgumentError(f"retention_s must be > 0 seconds, got {d}")
    return _PriorityArg(p, d)


def _check_clock(clock: Any) -> bool:
    """``clock=``: ``"monotonic"`` (default) or ``"manual"``; true for manual."""
    if clock is None or clock == "monotonic":
        return False
    if clock == "manual":
        return True
    if not isinstance(clock, str):
        raise DtypeError(f"clock must be a str, got {type(clock).__name__}")
    raise InvalidArgumentError(f"clock must be 'monotonic' or 'manual', got {clock!r}")
