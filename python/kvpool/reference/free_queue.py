"""The reference pool's free queue: a plain doubly linked list of block ids, LRU first.

O(1) removal from the middle, as the Rust queue has, so that the reference is a fair
baseline; written for clarity.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

__all__ = ["FreeQueue"]


class FreeQueue:
    """A doubly linked list of block ids: the free blocks, least recently used first.

    Links are kept in two dicts keyed by block id (``_prev``, ``_next``; ``None`` ends the list),
    so membership, pushing and popping at either end and removing from the middle are all O(1).
    """

    def __init__(self, block_ids: Iterable[int] = ()) -> None:
        """Build a queue holding ``block_ids`` in the given order, head first."""
        self._prev: dict[int, int | None] = {}
        self._next: dict[int, int | None] = {}
        self._head: int | None = None
        self._tail: int | None = None
        for block_id in block_ids:
            self.append(block_id)

    def __len__(self) -> int:
        """Number of blocks in the queue."""
        return len(self._next)

    def __contains__(self, block_id: object) -> bool:
        """Whether ``block_id`` is in the queue (O(1))."""
        return block_id in self._next

    def __iter__(self) -> Iterator[int]:
        """The block ids from head to tail."""
        block_id = self._head
        while block_id is not None:
            yield block_id
            block_id = self._next[block_id]

    def append(self, block_id: int) -> None:
        """Put ``block_id`` at the tail (it becomes the most recently used)."""
        assert block_id not in self._next, f"block {block_id} is already in the free queue"
        self._prev[block_id] = self._tail
        self._next[block_id] = None
        if self._tail is None:
            self._head = block_id
        else:
            self._next[self._tail] = block_id
        self._tail = block_id

    def appendleft(self, block_id: int) -> None:
        """Put ``block_id`` at the head (it is the next one popped)."""
        assert block_id not in self._next, f"block {block_id} is already in the free queue"
        self._prev[block_id] = None
        self._next[block_id] = self._head
        if self._head is None:
            self._tail = block_id
        else:
            self._prev[self._head] = block_id
        self._head = block_id

    def extend(self, block_ids: Sequence[int]) -> None:
        """Append ``block_ids`` at the tail in the order given."""
        for block_id in block_ids:
            self.append(block_id)

    def prepend(self, block_ids: Sequence[int]) -> None:
        """Put ``block_ids`` at the head as a group in the order given: ``block_ids[0]`` is the new head."""
        for block_id in reversed(block_ids):
            self.appendleft(block_id)

    def popleft(self) -> int:
        """Remove and return the head block."""
        block_id = self._head
        if block_id is None:
            raise IndexError("pop from an empty free queue")
        self.remove(block_id)
        return block_id

    def remove(self, block_id: int) -> None:
        """Unlink ``block_id`` from wherever it is in the queue (O(1))."""
        prev = self._prev.pop(block_id)
        nxt = self._next.pop(block_id)
        if prev is None:
            self._head = nxt
        else:
            self._next[prev] = nxt
        if nxt is None:
            self._tail = prev
        else:
            self._prev[nxt] = prev

    def problems(self) -> list[str]:
        """Inconsistencies in the links (empty when the list is well formed)."""
        found: list[str] = []
        if set(self._prev) != set(self._next):
            found.append("free queue: prev and next links cover different blocks")
        seen: set[int] = set()
        prev: int | None = None
        block_id = self._head
        while block_id is not None:
            if block_id in seen:
                found.append(f"free queue: cycle at block {block_id}")
                return found
            if block_id not in self._next:
                found.append(f"free queue: block {block_id} is linked but has no entry")
                return found
            if self._prev.get(block_id) != prev:
                found.append(f"free queue: block {block_id} has prev {self._prev.get(block_id)}, expected {prev}")
            seen.add(block_id)
            prev, block_id = block_id, self._next[block_id]
        if self._tail != prev:
            found.append(f"free queue: tail is {self._tail}, the walk ends at {prev}")
        if len(seen) != len(self._next):
            found.append(f"free queue: {len(self._next)} entries but {len(seen)} reachable from the head")
        return found


# --------------------------------------------------------------------------------------------
# The pool.
