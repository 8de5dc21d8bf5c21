#!/usr/bin/env python3
"""What one request's allocate-and-free costs through Python, piece by piece: the floor under
``benches/vs_vllm.py``'s per-request rows.

Times, in ns per iteration of a Python loop (medians of ``--rounds``, ``--iters`` iterations
each, on one pool with caching off): the loop alone; a method call that returns an int; a
``get_new_blocks(0)`` (a call and an empty numpy array, made and dropped); ``np.empty(44,
np.int32)`` from Python, for comparison; ``free_blocks`` of an empty array, positional and
with ``reverse=True``; then the per-request rows themselves: ``free_blocks(get_new_blocks(44),
reverse=True)`` and ``free_blocks(ids[::-1])``. What the whole request costs beyond the
pieces is the core's work on 44 blocks (``cargo bench --bench alloc_free``, ``no_caching``).

``OPENBLAS_NUM_THREADS=1 python benches/ffi_floor.py [--rounds 7] [--iters 200000]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

import kvpool


def contestants(pool: kvpool.BlockPool, n: int) -> dict[str, Callable[[], None]]:
    empty = pool.get_new_blocks(0)

    def loop() -> None:
        for _ in range(n):
            pass

    def method_call() -> None:
        for _ in range(n):
            pool.get_num_free_blocks()

    def empty_allocation() -> None:
        for _ in range(n):
            pool.get_new_blocks(0)

    def numpy_empty() -> None:
        for _ in range(n):
            np.empty(44, np.int32)

    def free_nothing() -> None:
        for _ in range(n):
            pool.free_blocks(empty)

    def free_nothing_reverse() -> None:
        for _ in range(n):
            pool.free_blocks(empty, reverse=True)

    def request_reverse() -> None:
        for _ in range(n):
            pool.free_blocks(pool.get_new_blocks(44), reverse=True)

    def request_view() -> None:
        for _ in range(n):
            ids = pool.get_new_blocks(44)
            pool.free_blocks(ids[::-1])

    return {
        "the loop alone": loop,
        "a method call (get_num_free_blocks)": method_call,
        "get_new_blocks(0): a call and an empty array": empty_allocation,
        "np.empty(44, np.int32) from Python": numpy_empty,
        "free_blocks(empty)": free_nothing,
        "free_blocks(empty, reverse=True)": free_nothing_reverse,
        "alloc 44 + free_blocks(ids, reverse=True)": request_reverse,
        "alloc 44 + free_blocks(ids[::-1])": request_view,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=200_000)
    args = ap.parse_args()
    pool = kvpool.BlockPool(32_768, enable_caching=False, block_size=16)
    runs = contestants(pool, args.iters)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(args.rounds + 1):  # round 0 warms up
        for name, run in (runs.items() if r % 2 == 0 else reversed(runs.items())):
            t0 = time.perf_counter_ns()
            run()
            if r:
                times[name].append((time.perf_counter_ns() - t0) / args.iters)
    width = max(map(len, times))
    for name, ts in times.items():
        print(f"{name:<{width}}  {statistics.median(ts):7.1f} ns")
    print(f"(medians of {args.rounds} rounds of {args.iters:,} iterations; Python {sys.version.split()[0]}, "
          f"numpy {np.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
