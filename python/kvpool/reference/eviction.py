"""The reference pool's eviction policies, in plain Python (the oracle of ``src/pool/eviction.rs``).

Allocation takes uncached free blocks first (the *front*: freed uncached blocks, then blocks
never used, as in the LRU queue). Only when none is left does it evict a cached block, and the
policy decides which. Each policy keeps the cached free blocks in LRU lists (*classes*):

* ``"lru"``: one list, vLLM's order (the pool then uses :class:`FreeQueue` directly).
* ``"priority"``: one list per retention priority ``0..=100``; the lowest non-empty priority goes
  first. A priority with a duration reverts to the default (35) when it runs out: a free block
  whose priority ran out moves to the tail of the default list, in expiry order, the next time
  allocation reaches the lists or ``free_block_ids`` is read.
* ``"adaptive"``: five bands by use count; a block freed with ``u`` uses joins band
  ``b = min(u, 5) - 1`` with credit ``t + bonus(b)`` (``t`` counts the cached blocks freed so far,
  ``bonus(b) = num_blocks * round(1000 * log2(1 + b)) * 3 // 4000``); the band head with the lowest
  credit goes first (the lowest band on a tie). Uses survive eviction in a ghost table of
  ``2 * num_blocks`` recently evicted keys (first in, first forgotten).
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
    "BAND_LOG2_MILLI",
    "DEFAULT_PRIORITY",
    "EVICTION_POLICIES",
    "MAX_PRIORITY",
    "BlockPriority",
    "Ghosts",
    "PolicyQueue",
    "band_bonuses",
]

EVICTION_POLICIES = ("lru", "priority", "adaptive")
DEFAULT_PRIORITY = 35
MAX_PRIORITY = 100
ADAPTIVE_BANDS = 5
BAND_LOG2_MILLI = (0, 1000, 1585, 2000, 2322)  # round(1000 * log2(1 + b))
GHOSTS_PER_BLOCK = 2

HashKey = tuple[bytes, int]


def band_bonuses(num_blocks: int) -> list[int]:
    """The adaptive policy's credit bonus of each band for a pool of ``num_blocks``."""
    return [num_blocks * milli * 3 // 4000 for milli in BAND_LOG2_MILLI]


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


class Ghosts:
    """Recently evicted keys and their use counts, forgetting the oldest record first."""

    def __init__(self, capacity: int) -> None:
        """An empty table of at most ``capacity`` records (stale ones included)."""
        self._uses: dict[HashKey, tuple[int, int]] = {}
        self._order: deque[tuple[HashKey, int]] = deque()
        self._stamp = 0
        self._capacity = capacity

    def __len__(self) -> int:
        """Keys remembered."""
        return len(self._uses)

    def record(self, key: HashKey, uses: int) -> None:
        """Remember that ``key`` left the cache with ``uses`` uses."""
        self._stamp += 1
        self._uses[key] = (uses, self._stamp)
        self._order.append((key, self._stamp))
        while len(self._order) > self._capacity:
            old, stamp = self._order.popleft()
            if self._uses.get(old, (0, -1))[1] == stamp:
                del self._uses[old]

    def take(self, key: HashKey) -> int:
        """The uses recorded for ``key`` (0 if none), forgotten as they are read."""
        uses, _ = self._uses.pop(key, (0, 0))
        return uses

    def clear(self) -> None:
        """Forget everything."""
        self._uses.clear()
        self._order.clear()


class PolicyQueue:
    """The free queue under the ``priority`` or ``adaptive`` policy (same interface as
    :class:`FreeQueue`: ``prepend`` for freed uncached blocks, ``extend`` for freed cached ones)."""

    def __init__(self, block_ids: Sequence[int], num_blocks: int, policy: str, manual_clock: bool) -> None:
        """All of ``block_ids`` free and uncached, in order."""
        assert policy in ("priority", "adaptive")
        self.policy = policy
        self._front = FreeQueue(block_ids)
        num_classes = MAX_PRIORITY + 1 if policy == "priority" else ADAPTIVE_BANDS
        self._lists = [FreeQueue() for _ in range(num_classes)]
        self._class_of: dict[int, int] = {}
        self._manual_clock = manual_clock
        self._manual_now = 0.0
        self._start = time.monotonic()
        # priority
        self.priorities: dict[int, BlockPriority] = {}
        self._expiry: dict[int, tuple[float, int]] = {}  # queued block -> (expires_at, seq)
        self._seq = 0
        # adaptive
        self.uses: dict[int, int] = {}
        self.credit: dict[int, int] = {}
        self._tick = 0
        self._bonus = band_bonuses(num_blocks)
        self.ghosts = Ghosts(GHOSTS_PER_BLOCK * num_blocks)

    # -- the clock ------------------------------------------------------------------------------

    def now(self) -> float:
        """The pool's clock in seconds."""
        return self._manual_now if self._manual_clock else time.monotonic() - self._start

    def advance(self, seconds: float) -> None:
        """Move a manual clock forward."""
        self._manual_now += seconds

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
        """Freed cached blocks, each at the tail of its class, in the order given."""
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
            self.credit[block_id] = self._tick + self._bonus[cls]
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
        """A free cached block whose priority changed moves to the tail of its new class."""
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
