#!/usr/bin/env python3
"""The cost of each eviction policy through Python, against LRU, in one process, runs interleaved.

Workloads (every run on a fresh pool built outside the clock, ``gc.collect()`` before it):

* ``churn``: a 100,000-block pool filled with cached blocks, then 1,000 requests that each
  allocate 64 blocks (evicting 64 cached ones), cache them under new 8-byte keys and free them
  tail first. Per block.
* ``churn-25k``: the churn in a pool of 25,000 blocks, the largest whose adaptive policy keeps
  its full horizon by default (``kvpool.reference.eviction.default_adaptive_horizon``): the
  ghost table of the policy as shipped at its largest, where ``churn``'s 100,000-block pool,
  given the full horizon explicitly, has one four times the size.
* ``hits``: the same full pool; 1,000 requests that each look up a cached 64-block chain, touch
  it and free it tail first (no eviction: the policy's bookkeeping on hits and frees). Per block.
* ``replay``: the Mooncake conversation trace (``--trace``; skipped when absent) in a pool of
  20,000 blocks, :func:`kvpool.simulate.replay`'s calls. Per block of the trace.

Adversarial shapes, so that no policy's cost depends on what the input looks like:

* ``churn-one-key``: the churn with every new block cached under one and the same key (one
  chain of duplicates in the prefix map; every evicted block lands in the same ghost set of the
  adaptive policy, the worst collision there is).
* ``churn-32be``: the churn with 32-byte big-endian integer keys (they differ in their last
  bytes only), given as ``bytes``.
* ``churn-priorities``: the churn with each request at another retention priority (0..100, so
  the priority policy keeps many classes; the other policies are given no priority).
* ``empty``: 1,000 requests of zero blocks (allocate, cache and free nothing). Per request.
* ``whole-pool``: allocate every block in one call (evicting all), cache them, free them in one
  call. Per block.

Policies: ``lru``, ``priority``, ``adaptive`` (with its full horizon, 20,000 blocks freed) and
``adaptive-0`` (a horizon of 0: what pools of 30,000 blocks or more get by default, LRU's order
without the ghost table). Each round runs every policy once, the order rotating; the figures
are the medians per policy and their ratio to LRU's. Usage: ``python benches/eviction_policies.py [--rounds 7] [--json]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import kvpool  # noqa: E402
from kvpool.simulate import replay  # noqa: E402
from kvpool.traces import load_trace  # noqa: E402

POLICIES = ("lru", "priority", "adaptive", "adaptive-0")
POOL = 100_000
REQUEST = 64
REQUESTS = 1_000
DEFAULT_TRACE = Path(__file__).resolve().parent.parent.parent / "shared" / "traces" / "conversation_trace.jsonl"


def pool_args(policy: str) -> dict[str, Any]:
    """The constructor arguments of a benchmark policy. ``"adaptive"`` gets the full horizon
    (20,000 blocks freed) that its default fades out of in pools of 30,000 blocks or more, so that
    its costs are those of the policy at work; ``"adaptive-0"`` is what such a pool gets by
    default, a horizon of 0 (LRU's order, no ghost table)."""
    if policy == "adaptive":
        return {"eviction": "adaptive", "adaptive_horizon": 20_000}
    if policy == "adaptive-0":
        return {"eviction": "adaptive", "adaptive_horizon": 0}
    return {"eviction": policy}


def new_pool(policy: str, size: int = POOL) -> Any:
    """An empty pool of ``size`` blocks under ``policy`` (:func:`pool_args`)."""
    return kvpool.BlockPool(size, block_size=16, **pool_args(policy))


def filled_pool(policy: str, size: int = POOL) -> tuple[Any, int]:
    """A pool of ``size`` blocks whose every usable block is cached under keys ``0..``, and the next key."""
    pool = new_pool(policy, size)
    usable = size - 1
    ids = pool.get_new_blocks(usable)
    pool.cache_full_blocks(ids, np.arange(usable, dtype=np.uint64), 0, usable)
    pool.free_blocks(ids, reverse=True)
    return pool, usable


def churn(state: tuple[Any, int]) -> None:
    """Allocate (evicting), cache under new keys, free tail first."""
    pool, next_key = state
    for r in range(REQUESTS):
        ids = pool.get_new_blocks(REQUEST)
        keys = np.arange(next_key + r * REQUEST, next_key + (r + 1) * REQUEST, dtype=np.uint64)
        pool.cache_full_blocks(ids, keys, 0, REQUEST)
        pool.free_blocks(ids, reverse=True)


def churn_one_key(state: tuple[Any, int]) -> None:
    """The churn, every new block cached under the same key."""
    pool, _ = state
    key = np.full(REQUEST, 2**63 + 12345, dtype=np.uint64)
    for _ in range(REQUESTS):
        ids = pool.get_new_blocks(REQUEST)
        pool.cache_full_blocks(ids, key, 0, REQUEST)
        pool.free_blocks(ids, reverse=True)


def churn_32be(state: tuple[Any, list[list[bytes]]]) -> None:
    """The churn under 32-byte big-endian integer keys (bytes made outside the clock)."""
    pool, keys = state
    for r in range(REQUESTS):
        ids = pool.get_new_blocks(REQUEST)
        pool.cache_full_blocks(ids, keys[r], 0, REQUEST)
        pool.free_blocks(ids, reverse=True)


def filled_32be(policy: str) -> tuple[Any, list[list[bytes]]]:
    """A pool filled under 32-byte keys, and each request's new keys."""
    pool = new_pool(policy)
    usable = POOL - 1
    ids = pool.get_new_blocks(usable)
    pool.cache_full_blocks(ids, [i.to_bytes(32, "big") for i in range(usable)], 0, usable)
    pool.free_blocks(ids, reverse=True)
    keys = [[(usable + r * REQUEST + i).to_bytes(32, "big") for i in range(REQUEST)] for r in range(REQUESTS)]
    return pool, keys


def churn_priorities(state: tuple[Any, int]) -> None:
    """The churn, request ``r`` at retention priority ``r % 101`` (priority policy only)."""
    pool, next_key = state
    with_priority = pool.eviction == "priority"
    for r in range(REQUESTS):
        ids = pool.get_new_blocks(REQUEST)
        keys = np.arange(next_key + r * REQUEST, next_key + (r + 1) * REQUEST, dtype=np.uint64)
        if with_priority:
            pool.cache_full_blocks(ids, keys, 0, REQUEST, priority=r % 101)
        else:
            pool.cache_full_blocks(ids, keys, 0, REQUEST)
        pool.free_blocks(ids, reverse=True)


def empty(state: tuple[Any, int]) -> None:
    """Requests of no blocks."""
    pool, _ = state
    none = np.zeros(0, dtype=np.uint64)
    for _ in range(REQUESTS):
        ids = pool.get_new_blocks(0)
        pool.cache_full_blocks(ids, none, 0, 0)
        pool.free_blocks(ids, reverse=True)


def whole_pool(state: tuple[Any, int]) -> None:
    """Every block at once: allocate (evicting all), cache, free."""
    pool, next_key = state
    usable = POOL - 1
    ids = pool.get_new_blocks(usable)
    pool.cache_full_blocks(ids, np.arange(next_key, next_key + usable, dtype=np.uint64), 0, usable)
    pool.free_blocks(ids, reverse=True)


def hits(state: tuple[Any, int]) -> None:
    """Look up cached chains, touch them, free them tail first."""
    pool, usable = state
    stride = usable // REQUESTS
    for r in range(REQUESTS):
        start = r * stride
        hit = pool.find_longest_cache_hit(np.arange(start, start + REQUEST, dtype=np.uint64))
        pool.touch(hit)
        pool.free_blocks(hit, reverse=True)


def run(rounds: int, trace_path: Path | None) -> list[dict[str, Any]]:
    """Every workload, ``rounds`` interleaved rounds; one result row per workload and policy."""
    workloads: list[tuple[str, Callable[[Any], None], Callable[[str], Any], int]] = [
        ("churn", churn, filled_pool, REQUESTS * REQUEST),
        ("churn-25k", churn, lambda policy: filled_pool(policy, 25_000), REQUESTS * REQUEST),
        ("hits", hits, filled_pool, REQUESTS * REQUEST),
        ("churn-one-key", churn_one_key, filled_pool, REQUESTS * REQUEST),
        ("churn-32be", churn_32be, filled_32be, REQUESTS * REQUEST),
        ("churn-priorities", churn_priorities, filled_pool, REQUESTS * REQUEST),
        ("empty", empty, filled_pool, REQUESTS),
        ("whole-pool", whole_pool, filled_pool, POOL - 1),
    ]
    if trace_path is not None and trace_path.exists():
        trace = load_trace(str(trace_path))
        requests = [ids[:20_000] for ids in trace.hash_ids]

        def replay_setup(policy: str) -> Any:
            return kvpool.BlockPool(20_001, block_size=512, **pool_args(policy))

        workloads.append(("replay", lambda pool: replay(pool, requests), replay_setup, trace.num_blocks))
    rows = []
    for name, body, setup, per in workloads:
        times: dict[str, list[float]] = {p: [] for p in POLICIES}
        for round_ in range(rounds):
            order = POLICIES[round_ % len(POLICIES):] + POLICIES[: round_ % len(POLICIES)]
            for policy in order:
                state = setup(policy)
                gc.collect()
                t0 = time.perf_counter()
                body(state)
                times[policy].append(time.perf_counter() - t0)
        lru = statistics.median(times["lru"])
        for policy in POLICIES:
            median = statistics.median(times[policy])
            rows.append({"workload": name, "policy": policy, "ns_per_block": round(median / per * 1e9, 1),
                         "x_lru": round(median / lru, 3)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = run(args.rounds, args.trace)
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return
    print(f"eviction policies through Python, median of {args.rounds} interleaved rounds")
    print(f"{'workload':<17} {'policy':<10} {'ns/block':>9} {'x LRU':>7}")
    for row in rows:
        print(f"{row['workload']:<17} {row['policy']:<10} {row['ns_per_block']:>9} {row['x_lru']:>7}")


if __name__ == "__main__":
    main()
