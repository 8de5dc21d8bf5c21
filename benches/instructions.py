"""Workloads for counting instructions under callgrind, which unlike a clock gives the same
figure on every run of the same build.

Run one workload at two sizes and divide the difference by the extra work, so that start-up
(imports, building the pool, making keys) cancels out::

    CG="valgrind --tool=callgrind --callgrind-out-file=/dev/null"
    PY=$(python -c 'import sys; print(sys.executable)')   # the real binary, not a shim
    PYTHONHASHSEED=0 $CG $PY benches/instructions.py alloc 1000     # "I refs: A"
    PYTHONHASHSEED=0 $CG $PY benches/instructions.py alloc 11000    # "I refs: B"
    # (B - A) / 10,000 instructions per request

Workloads:

* ``alloc N``: N requests of ``get_new_blocks(44)`` then ``free_blocks(ids, reverse=True)``
  (add ``--view`` for the caller's ``free_blocks(ids[::-1])``), caching off, 32,768 blocks.
* ``churn N``: the evicting churn of ``benches/vs_vllm.py`` on a 100,000-block pool: one cycle
  to fill the cache, then N more cycles of 1,562 batches (64 blocks each: allocate, cache
  under new keys, free reversed); divide by ``N * 99,968`` blocks. ``--keys`` picks the key
  shape (``sha256``, ``int32-be``, ``int32-le``, ``one-key``; default ``sha256``). Keys for
  three cycles are made whatever N is, so that making them cancels out too. ``--eviction``
  picks the pool's policy (default ``lru``).

* ``manager N``: the manager row of ``benches/vs_vllm.py``, N times: a fresh ``KVCacheManager``
  (32,768 blocks of 16 tokens, caching off), then 100 requests of 700 prompt tokens given as
  lists: ``add_request`` and ``allocate_slots`` each, one decode token each (``append_token_ids``
  and ``allocate_slots``), ``free`` each; divide by ``100 * N`` requests (building the manager
  is counted too, about 700 instructions a request).

``PYTHONHASHSEED=0`` keeps Python's own dictionaries alike in both runs.
"""

from __future__ import annotations

import argparse

import numpy as np

import kvpool
from kvpool.bench import churn_keys


def alloc(requests: int, view: bool) -> None:
    """``requests`` requests of 44 blocks, allocated and freed tail first."""
    pool = kvpool.BlockPool(32_768, enable_caching=False, block_size=16)
    get, free = pool.get_new_blocks, pool.free_blocks
    if view:
        for _ in range(requests):
            free(get(44)[::-1])
    else:
        for _ in range(requests):
            free(get(44), reverse=True)


def churn(cycles: int, shape: str, eviction: str = "lru") -> None:
    """One filling cycle, then ``cycles`` evicting ones."""
    pool_blocks, batch = 100_000, 64
    per_cycle = (pool_blocks - 1) // batch
    keys = [churn_keys(shape, np.arange(i, i + batch, dtype=np.uint64))
            for i in range(0, 3 * per_cycle * batch, batch)]
    # The adaptive policy with the full horizon its default fades out of at this size (the
    # instructions do not depend on it; the counts stay comparable with earlier ones).
    horizon = {"adaptive_horizon": 20_000} if eviction == "adaptive" else {}
    pool = kvpool.BlockPool(pool_blocks, enable_caching=True, block_size=16, eviction=eviction, **horizon)
    for k in keys[:(1 + cycles) * per_cycle]:
        blocks = pool.get_new_blocks(batch)
        pool.cache_full_blocks(blocks, k, 0, batch)
        pool.free_blocks(blocks, reverse=True)


def manager(runs: int) -> None:
    """``runs`` times 100 requests through a fresh manager (``vs_vllm.manager_requests``)."""
    from vs_vllm import manager_requests  # this folder is on the path when run as a script

    prompts = [[(i * 7919 + t) % 32_000 for t in range(700)] for i in range(100)]
    rids = [f"w1-{i}" for i in range(100)]
    for _ in range(runs):
        manager_requests(kvpool.KVCacheManager(32_768, 16, enable_caching=False), rids, prompts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workload", choices=["alloc", "churn", "manager"])
    parser.add_argument("n", type=int,
                        help="requests (alloc), evicting cycles (churn, at most 2) or runs (manager)")
    parser.add_argument("--view", action="store_true", help="alloc: free ids[::-1]")
    parser.add_argument("--keys", default="sha256", help="churn: the key shape")
    parser.add_argument("--eviction", default="lru", help="churn: the pool's eviction policy")
    args = parser.parse_args()
    if args.workload == "alloc":
        alloc(args.n, args.view)
    elif args.workload == "manager":
        manager(args.n)
    else:
        if not 0 <= args.n <= 2:
            parser.error("churn runs 0 to 2 evicting cycles")
        churn(args.n, args.keys, args.eviction)


if __name__ == "__main__":
    main()
