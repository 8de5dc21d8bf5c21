"""Belady's MIN on a trace replay: the offline bound every eviction policy is measured against.

The replay is :func:`kvpool.simulate.replay`'s, request by request in file order, with the same
accounting (:class:`kvpool.simulate.ReplayResult`); only the eviction choice differs. Knowing the
whole trace, a full pool evicts the cached free block whose hash is next requested farthest in
the future (never again first); among blocks of equal next use, the deeper one in its request
first, so a chain loses its tail before its head. No online policy can know the future, so MIN is
the ceiling a policy can approach at a given capacity, not a policy to run.

Written in plain Python for clarity: a lazy-deletion heap over the free cached blocks, O(log n)
per block; a 290,000-block trace takes a few seconds per capacity.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import defaultdict

from kvpool.simulate import ReplayResult, replay_result, unbounded_capacity
from kvpool.traces import MOONCAKE_BLOCK_TOKENS, Trace

__all__ = ["belady_hits", "simulate_belady"]


def _next_uses(requests: list[list[int]]) -> list[list[float]]:
    """For each request and block, the index of the next request holding the same id (inf: none)."""
    upcoming: dict[int, float] = {}
    out: list[list[float]] = [[] for _ in requests]
    for t in range(len(requests) - 1, -1, -1):
        out[t] = [upcoming.get(h, math.inf) for h in requests[t]]
        for h in requests[t]:
            upcoming[h] = t
    return out


def belady_hits(requests: list[list[int]], capacity: int) -> tuple[list[int], int]:
    """Replay ``requests`` (hash ids, each at most ``capacity`` long) in a pool of ``capacity``
    blocks evicting by MIN; return each request's hit blocks and the blocks cached at the end."""
    next_use = _next_uses(requests)
    holders: dict[int, list[int]] = defaultdict(list)  # hash id -> blocks under it, first inserted first
    key_of: dict[int, int] = {}
    heap: list[tuple[float, int, int, int]] = []  # (-next use, -depth, version, block)
    version: dict[int, int] = {}
    fresh, serial, stamp = capacity, 0, 0
    hits: list[int] = []
    for t, ids in enumerate(requests):
        hit = []
        for h in ids:
            under = holders.get(h)
            if not under:
                break
            hit.append(under[0])
        for block in hit:
            version.pop(block, None)  # in use: no longer a candidate
        new = []
        for _ in range(len(ids) - len(hit)):
            if fresh > 0:
                fresh -= 1
                block, serial = serial, serial + 1
            else:
                while True:
                    _, _, v, block = heapq.heappop(heap)
                    if version.get(block) == v:
                        del version[block]
                        break
                evicted = key_of.pop(block)
                holders[evicted].remove(block)
                if not holders[evicted]:
                    del holders[evicted]
            new.append(block)
        for block, h in zip(new, ids[len(hit):]):
            key_of[block] = h
            holders[h].append(block)
        for depth, block in enumerate(hit + new):
            stamp += 1
            version[block] = stamp
            heapq.heappush(heap, (-next_use[t][depth], -depth, stamp, block))
        hits.append(len(hit))
    return hits, len(key_of)


def simulate_belady(
    trace: Trace, capacity: int, *, block_tokens: int = MOONCAKE_BLOCK_TOKENS
) -> ReplayResult:
    """Replay ``trace`` in a pool of ``capacity`` usable blocks under Belady's MIN (``policy="belady"``)."""
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1 block, got {capacity}")
    usable = min(capacity, unbounded_capacity(trace))  # as simulate_one clamps it
    requests = [[int(h) for h in ids[:usable]] for ids in trace.hash_ids]
    t0 = time.perf_counter()
    hits, cached_at_end = belady_hits(requests, usable)
    seconds = time.perf_counter() - t0
    evictions = sum(len(r) for r in requests) - sum(hits) - cached_at_end
    return replay_result(trace, capacity, hits, block_tokens=block_tokens, evictions=evictions, seconds=seconds,
                         policy="belady")
