"""The lazy offload connector's walk of the free queue under each eviction policy, on
``kvpool.BlockPool`` alone (vLLM has only LRU; ``benches/offload_walk.py`` compares that with
vLLM's own pool).

A pool of ``--blocks`` blocks, every one cached (under the default priority) and freed in
reverse, is walked as vLLM's ``SimpleCPUOffloadConnector`` does in lazy mode: each step
goes on from the block it last visited (``FreeBlockWalk(pool, cursor)``) for up to
``--target`` blocks, until the queue's tail. Prints µs per step, the policies interleaved
round by round in one process, and each one's ratio to LRU.

    OPENBLAS_NUM_THREADS=1 python benches/free_walk_policies.py [--blocks 100000] [--target 1024] [--rounds 3]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import numpy as np

import kvpool
from kvpool._core import FreeBlockWalk

POLICIES = ("lru", "priority", "adaptive")


def cached_pool(num_blocks: int, eviction: str) -> kvpool.BlockPool:
    """A pool whose free queue holds every block, each with a hash of its own."""
    pool = kvpool.BlockPool(num_blocks, enable_caching=True, block_size=16, eviction=eviction)
    ids = pool.get_new_blocks(num_blocks - 1)
    pool.cache_full_blocks(ids, np.arange(1, num_blocks, dtype=np.int64), 0, num_blocks - 1)
    pool.free_blocks(ids[::-1].copy())
    return pool


def walk(pool: kvpool.BlockPool, target: int) -> float:
    """µs per step of the connector's walk over the whole queue."""
    cursor = None
    steps = 0
    start = time.perf_counter()
    while True:
        last = cursor
        for covered, view in enumerate(FreeBlockWalk(pool, cursor)):
            if covered >= target:
                break
            last = view.block_id
            _ = view.block_hash  # the connector reads each block's hash
        steps += 1
        if last == cursor:
            break
        cursor = last
    return (time.perf_counter() - start) / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=100_000)
    parser.add_argument("--target", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    per_step: dict[str, list[float]] = {p: [] for p in POLICIES}
    for r in range(args.rounds):
        for policy in POLICIES if r % 2 == 0 else POLICIES[::-1]:
            pool = cached_pool(args.blocks, policy)
            gc.collect()
            per_step[policy].append(walk(pool, args.target))
    for policy in POLICIES:
        ratios = [p / lru for p, lru in zip(per_step[policy], per_step["lru"])]
        print(f"{policy:9} {args.blocks:,} blocks, {args.target} a step: "
              f"{statistics.median(per_step[policy]):8.1f} µs/step, {statistics.median(ratios):.2f}x LRU's",
              flush=True)


if __name__ == "__main__":
    main()
