"""The reference pool's eviction policies, in plain Python (the oracle of ``src/pool/eviction.rs``).

Allocation takes uncached free blocks first (the *front*: freed uncached blocks, then blocks
never used, as in the LRU queue). Only when none is left does it evict a cached block, and the
policy decides which. Each policy keeps the cached free blocks in LRU lists (*classes*):

* ``"lru"``: one list, vLLM's order (the pool then uses :class:`FreeQueue` directly).
* ``"priority"``: one list per retention priority ``0..=100``; the lowest non-empty priority goes
  first. A priority with a duration reverts to the default (35) when it runs out: a free block
  whose priority ran out moves to the tail of the default list, in expiry order, before the
  lists next change (blocks join them, a priority changes, allocation reaches them), so it queues
  ahead of every block that joined the default list after it ran out; ``free_block_ids`` shows
  them applied, which changes nothing observable.
* ``"adaptive"``: two bands by use count; a block freed after one use joins band 0 with credit
  ``t``, one used by two or more requests band 1 with credit ``t + H`` (``t`` counts the cached
  blocks freed so far; the horizon ``H`` is :func:`default_adaptive_horizon` of the pool's size
  unless given); the band head with the lower credit goes first (band 0 on a tie). Uses survive
  eviction in a ghost table (:class:`Ghosts`: ``4 * W`` ways in 8-way sets) that forgets a record ``W = max(num_blocks, 8000)`` evictions after writing it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from kvpool.reference.free_queue import FreeQueue

__all__ = [
    "ADAPTIVE_BANDS",
    "ADAPTIVE_HORIZON",
    "DEFAULT_PRIORITY",
    "EVICTION_POLICIES",
    "MAX_ADAPTIVE_HORIZON",
    "MAX_PRIORITY",
    "BlockPriority",
    "Clock",
    "Ghosts",
    "PolicyQueue",
    "default_adaptive_horizon",
    "ghost_window",
]

EVICTION_POLICIES = ("lru", "priority", "adaptive")
DEFAULT_PRIORITY = 35
MAX_PRIORITY = 100
ADAPTIVE_BANDS = 2  # blocks used by one request; by two or more
ADAPTIVE_HORIZON = 20_000  # a reused block counts as freed this many cached blocks later
FULL_HORIZON_UNTIL = ADAPTIVE_HORIZON * 5 // 4  # pools up to this size get all of it by default
NO_HORIZON_FROM = ADAPTIVE_HORIZON * 3 // 2  # pools from this size get none: LRU's order
MAX_ADAPTIVE_HORIZON = 1 << 40
MIN_GHOST_WINDOW = 8_000
GHOSTS_PER_BLOCK = 4

HashKey = tuple[bytes, int]


def default_adaptive_horizon(num_blocks: int) -> int:
    """The adaptive policy's horizon when none is given: :data:`ADAPTIVE_HORIZON` in pools of up
    to :data:`FULL_HORIZON_UNTIL` blocks, fading linearly to 0 at :data:`NO_HORIZON_FROM`.

    A pool that spans more than the horizon already keeps reused blocks that long by recency, and
    the bonus would only evict recent first uses before old reused blocks (``docs/eviction.md``).
    """
    if num_blocks <= FULL_HORIZON_UNTIL:
        return ADAPTIVE_HORIZON
    if num_blocks >= NO_HORIZON_FROM:
        return 0
    return ADAPTIVE_HORIZON * (NO_HORIZON_FROM - num_blocks) // (NO_HORIZON_FROM - FULL_HORIZON_UNTIL)


def ghost_window(num_blocks: int) -> int:
    """The evictions a ghost record of a pool of ``num_blocks`` counts for."""
    return max(num_blocks, MIN_GHOST_WINDOW)


@dataclass(frozen=True)
class BlockPriority:
    """A retention priority and when (on the pool's clock) it reverts to the default."""

    priority: int = DEFAULT_PRIORITY
    expires_at: float | None = None

    def effective(self, now: float) -> int:
        """The priority in force at ``now``."""
        if self.expires_at is not None and self.expires_at <= now:
            return DEFAULT_PRIORITY
        return self.priority


MASK64 = (1 << 64) - 1
GHOST_WAYS = 8


def _splitmix64(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


_WORD_MULTIPLIERS = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93)


def ghost_fingerprint(key: HashKey) -> int:
    """The key's 32 bytes (zero-padded) as four little-endian words, each times an odd constant of
    its own, xored together with the key's width and group, then splitmix64's finaliser: the Rust
    pool's ``ghost_fingerprint``."""
    block_hash, group = key
    padded = block_hash.ljust(32, b"\0")
    folded = (len(block_hash) << 32) | group
    for i, multiplier in zip(range(0, 32, 8), _WORD_MULTIPLIERS):
        folded ^= (int.from_bytes(padded[i : i + 8], "little") * multiplier) & MASK64
    return _splitmix64(folded)


class Ghosts:
    """Recently evicted keys and their use counts: 8-way sets, a record forgotten once ``window``
    evictions have passed since it was written (forgetting by age keeps a chain's blocks, evicted
    together, remembered or forgotten together); a full set replaces its oldest record."""

    def __init__(self, ways: int, window: int) -> None:
        """A table of at least ``ways`` ways, rounded up to a power-of-two number of 8-way sets."""
        sets = 1
        while sets * GHOST_WAYS < ways:
            sets *= 2
        self._sets = sets
        self._ways: list[tuple[int, int, int] | None] = [None] * (sets * GHOST_WAYS)  # (tag, uses, stamp)
        self._stamp = 0
        self._window = window

    def __len__(self) -> int:
        """Ways holding a record (live or forgotten)."""
        return sum(w is not None for w in self._ways)

    @property
    def capacity(self) -> int:
        """Ways in the table."""
        return len(self._ways)

    def _age(self, stamp: int) -> int:
        return (self._stamp - stamp) % (1 << 32)

    def _set(self, fingerprint: int) -> range:
        start = (fingerprint & (self._sets - 1)) * GHOST_WAYS
        return range(start, start + GHOST_WAYS)

    def record(self, key: HashKey, uses: int) -> None:
        """Remember that ``key`` left the cache with ``uses`` uses."""
        if uses == 0:
            return
        self._stamp = (self._stamp + 1) % (1 << 32)
        fingerprint = ghost_fingerprint(key)
        ways = self._set(fingerprint)
        victim = None
        for i in ways:  # the first empty or forgotten way
            way = self._ways[i]
            if way is None or self._age(way[2]) > self._window:
                victim = i
                break
        if victim is None:  # else the oldest record, the first on a tie
            victim = max(ways, key=lambda i: (self._age(self._ways[i][2]), -i))  # type: ignore[index]
        self._ways[victim] = (fingerprint >> 40, uses, self._stamp)

    def take(self, key: HashKey) -> int:
        """The uses recorded for ``key`` (0 if none or forgotten), cleared as they are read."""
        fingerprint = ghost_fingerprint(key)
        for i in self._set(fingerprint):
            way = self._ways[i]
            if way is not None and way[0] == fingerprint >> 40:
                self._ways[i] = None
                return 0 if self._age(way[2]) > self._window else way[1]
        return 0

    def clear(self) -> None:
        """Forget everything."""
        self._ways = [None] * len(self._ways)


class Clock:
    """The clock retention durations run on: seconds since it was made, or set by the caller."""

    def __init__(self, manual: bool) -> None:
        """A monotonic clock, or with ``manual`` one that only ``advance`` moves (from 0)."""
        self.manual = manual
        self._now = 0.0
        self._start = time.monotonic()

    def now(self) -> float:
        """The time in seconds."""
        return self._now if self.manual else time.monotonic() - self._start

    def advance(self, seconds: float) -> None:
        """Move a manual clock forward."""
        self._now += seconds


class PolicyQueue:
    """The free queue under the ``priority`` or ``adaptive`` policy (same interface as
    :class:`FreeQueue`: ``prepend`` for freed uncached blocks, ``extend`` for freed cached ones)."""

    def __init__(self, block_ids: Sequence[int], num_blocks: int, policy: str, clock: Clock,
                 adaptive_horizon: int = ADAPTIVE_HORIZON) -> None:
        """All of ``block_ids`` free and uncached, in order; ``adaptive_horizon`` replaces
        :data:`ADAPTIVE_HORIZON` as band 1's bonus."""
        assert policy in ("priority", "adaptive")
        self.policy = policy
        self._front = FreeQueue(block_ids)
        num_classes = MAX_PRIORITY + 1 if policy == "priority" else ADAPTIVE_BANDS
        self._lists = [FreeQueue() for _ in range(num_classes)]
        self._class_of: dict[int, int] = {}
        self._clock = clock
        # priority
        self.priorities: dict[int, BlockPriority] = {}
        self._expiry: dict[int, tuple[float, int]] = {}  # queued block -> (expires_at, seq)
        self._seq = 0
        # adaptive
        self.uses: dict[int, int] = {}
        self.credit: dict[int, int] = {}
        self._tick = 0
        self._horizon = adaptive_horizon  # band 1's credit bonus; band 0 has none
        window = ghost_window(num_blocks)
        self.ghosts = Ghosts(GHOSTS_PER_BLOCK * window, window)

    def now(self) -> float:
        """The pool's clock in seconds."""
        return self._clock.now()

    # -- the FreeQueue interface ------------------------------------------------------------------

    def __len__(self) -> int:
        """Free blocks."""
        return len(self._front) + len(self._class_of)

    def __contains__(self, block_id: object) -> bool:
        """Whether ``block_id`` is free."""
        return block_id in self._front or block_id in self._class_of

    def __iter__(self) -> Iterator[int]:
        """Free blocks in the order allocation would take them now."""
        yield from self._front
        heads = [list(q) for q in self._lists]
        while any(heads):
            band = self._choose([q[0] if q else None for q in heads])
            yield heads[band].pop(0)

    def prepend(self, block_ids: Sequence[int]) -> None:
        """Freed uncached blocks, at the head in the order given."""
        self._front.prepend(block_ids)

    def extend(self, block_ids: Sequence[int]) -> None:
        """Freed cached blocks, each at the tail of its class, in the order given (after the
        expiries due now, as before every change of the lists)."""
        if self.policy == "priority":
            self.apply_expiries()
        for block_id in block_ids:
            self._enqueue(block_id)

    def popleft(self) -> int:
        """The next block to allocate."""
        if len(self._front):
            return self._front.popleft()
        self.apply_expiries()
        band = self._choose([q._head for q in self._lists])
        block_id = self._lists[band].popleft()
        self._dequeued(block_id)
        return block_id

    def remove(self, block_id: int) -> None:
        """Take a free block out (a hit reclaims it)."""
        if block_id in self._front:
            self._front.remove(block_id)
            return
        self._lists[self._class_of[block_id]].remove(block_id)
        self._dequeued(block_id)

    def problems(self) -> list[str]:
        """Inconsistencies in the lists."""
        found = self._front.problems()
        for cls, q in enumerate(self._lists):
            found += [f"list {cls}: {p}" for p in q.problems()]
            found += [f"block {b} is in list {cls} but records {self._class_of.get(b)}" for b in q if self._class_of.get(b) != cls]
        if sum(len(q) for q in self._lists) != len(self._class_of):
            found.append("the lists and the class map disagree on their length")
        return found

    # -- the policy -------------------------------------------------------------------------------

    def _enqueue(self, block_id: int) -> None:
        """Put a freed cached block at the tail of the class its policy gives it now."""
        if self.policy == "priority":
            p = self.priorities.get(block_id, BlockPriority())
            cls = p.effective(self.now() if p.expires_at is not None else 0.0)
            if p.expires_at is not None and cls != DEFAULT_PRIORITY:
                self._expiry[block_id] = (p.expires_at, self._seq)
                self._seq += 1
        else:
            cls = min(max(self.uses.get(block_id, 0), 1), ADAPTIVE_BANDS) - 1
            self._tick += 1
            self.credit[block_id] = self._tick + (self._horizon if cls else 0)
        self._class_of[block_id] = cls
        self._lists[cls].append(block_id)

    def _dequeued(self, block_id: int) -> None:
        del self._class_of[block_id]
        self._expiry.pop(block_id, None)

    def _choose(self, heads: Sequence[int | None]) -> int:
        """The class whose head goes next, given each class's head (``None``: empty)."""
        if self.policy == "priority":
            return next(cls for cls, head in enumerate(heads) if head is not None)
        credits = [(self.credit[h], cls) for cls, h in enumerate(heads) if h is not None]
        return min(credits)[1]

    def apply_expiries(self) -> None:
        """Free blocks whose raised priority ran out move to the default list's tail, in expiry order."""
        if not self._expiry:
            return
        now = self.now()
        due = sorted((at, seq, b) for b, (at, seq) in self._expiry.items() if at <= now)
        for _, _, block_id in due:
            self._lists[self._class_of[block_id]].remove(block_id)
            self._dequeued(block_id)
            self.priorities[block_id] = BlockPriority()
            self._enqueue(block_id)

    def requeue(self, block_id: int) -> None:
        """A free cached block whose priority changed moves to the tail of its new class (the
        caller applied the expiries due before changing it)."""
        self._lists[self._class_of[block_id]].remove(block_id)
        self._dequeued(block_id)
        self._enqueue(block_id)

    def in_lists(self, block_id: int) -> bool:
        """Whether ``block_id`` is a free block in the lists (not in the front)."""
        return block_id in self._class_of

    # -- what the pool reports --------------------------------------------------------------------

    def on_use(self, block_id: int) -> None:
        """A request took a reference to the block."""
        if self.policy == "adaptive":
            self.uses[block_id] = min(self.uses.get(block_id, 0) + 1, 255)

    def on_cached(self, block_id: int, key: HashKey, priority: BlockPriority | None) -> None:
        """The block now holds ``key``."""
        if self.policy == "priority":
            self.priorities[block_id] = priority or BlockPriority()
        else:
            self.uses[block_id] = min(self.ghosts.take(key) + 1, 255)

    def on_evicted(self, block_id: int, key: HashKey) -> None:
        """Allocation evicted the block, which held ``key``."""
        if self.policy == "adaptive":
            self.ghosts.record(key, self.uses.get(block_id, 0))

    def on_reset(self) -> None:
        """The prefix cache was cleared."""
        self.ghosts.clear()


def check_policy(name: Any) -> str:
    """``name`` as an eviction policy name (``None``: ``"lru"``)."""
    from kvpool._errors import DtypeError, InvalidArgumentError

    if name is None:
        return "lru"
    if not isinstance(name, str):
        raise DtypeError(f"eviction must be a str, got {type(name).__name__}")
    if name not in EVICTION_POLICIES:
        raise InvalidArgumentError(f"unknown eviction policy {name!r}: choose lru, priority or adaptive")
    return name
