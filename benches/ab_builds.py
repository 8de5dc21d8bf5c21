"""Two builds of kvpool's extension in one process, interleaved: is a change faster?

On these machines a criterion run of one build against a saved baseline of another moves by
up to 10% for changes that do not touch the code measured (code placement; see
``docs/benchmarks.md``), and runs minutes apart drift as much. This loads two compiled
``_core`` modules side by side (each under its own module object, so their types never
mix) and times the same calls on both, alternating which goes first round by round, and
prints each workload's median time per build and their ratio.

    cargo build --release --features python --lib && cp target/release/libkvpool.so /tmp/new.so
    git stash && cargo build --release --features python --lib && cp target/release/libkvpool.so /tmp/old.so && git stash pop
    OPENBLAS_NUM_THREADS=1 python benches/ab_builds.py /tmp/old.so /tmp/new.so [--rounds 15] [--only hash,alloc]

Workloads (calls per round in brackets):
* ``hash-ALGO-list``: ``BlockHasher(16, hash_algo=ALGO).hash_blocks_from(None, prompt, 0)``,
  vLLM's output (a list of 32- or 16-byte ``bytes``), 1,200-token prompts as lists [320];
* ``hash-ALGO-rust``: ``hash_tokens(prompt)``, the hashes kept in Rust [320];
* ``alloc-free``: ``get_new_blocks(44)`` then ``free_blocks(ids, reverse=True)`` on a pool of
  32,768 blocks, caching off [3,200];
* ``churn-SHAPE``: vs_vllm's evicting churn on a 100,000-block pool: ``get_new_blocks(64)``
  (each block evicted from the prefix cache), ``cache_full_blocks`` under new keys, ``free_blocks(
  ..., reverse=True)``; each round one cycle of the pool, the keys alternating between two sets
  so that every round evicts the one before; SHAPE ``sha256`` and ``int32-be`` [1,562];
* ``adaptive-churn-SHAPE`` (``--only adaptive``): the same churn under ``eviction="adaptive"``
  with its full horizon (20,000 blocks freed) [1,562].
Each build's results are checked equal before timing.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import random
import statistics
import time
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from module_files import load_module

HASH_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")


def load_build(path: str) -> ModuleType:
    """The extension module compiled at ``path``, loaded as a module of its own."""
    return load_module("_core", path)


def hash_workloads(core: ModuleType, prompts: list[list[int]]) -> dict[str, Callable[[], Any]]:
    """The hashing calls on one build, each a function running one round's calls."""
    out: dict[str, Callable[[], Any]] = {}
    for algo in HASH_ALGOS:
        hasher = core.BlockHasher(16, hash_algo=algo)

        def as_list(h: Any = hasher) -> list[Any]:
            return [h.hash_blocks_from(None, p, 0) for _ in range(10) for p in prompts]

        def in_rust(h: Any = hasher) -> list[Any]:
            return [h.hash_tokens(p) for _ in range(10) for p in prompts]

        out[f"hash-{algo}-list"] = as_list
        out[f"hash-{algo}-rust"] = in_rust
    return out


def alloc_workload(core: ModuleType) -> dict[str, Callable[[], Any]]:
    """Allocate 44 blocks and free them tail first, 3,200 times."""
    pool = core.BlockPool(32_768, enable_caching=False)

    def run() -> None:
        for _ in range(3_200):
            ids = pool.get_new_blocks(44)
            pool.free_blocks(ids, reverse=True)

    return {"alloc-free": run}


CHURN_POOL, CHURN_BATCH = 100_000, 64
CHURN_CALLS = (CHURN_POOL - 1) // CHURN_BATCH


def churn_workloads(core: ModuleType, eviction: str = "lru") -> dict[str, Callable[[], Any]]:
    """The evicting churn, one pool cycle a round, for each key shape, under ``eviction``."""
    import numpy as np

    from kvpool.bench import churn_keys

    out: dict[str, Callable[[], Any]] = {}
    for shape in ("sha256", "int32-be"):
        keys = [churn_keys(shape, np.arange(i, i + CHURN_BATCH, dtype=np.uint64))
                for i in range(0, 2 * CHURN_CALLS * CHURN_BATCH, CHURN_BATCH)]
        sets = itertools.cycle([keys[:CHURN_CALLS], keys[CHURN_CALLS:]])
        policy = {} if eviction == "lru" else {"eviction": eviction, "adaptive_horizon": 20_000}
        pool = core.BlockPool(CHURN_POOL, enable_caching=True, block_size=16, **policy)

        def cycle(pool: Any = pool, sets: Iterator[list[Any]] = sets) -> None:
            for k in next(sets):
                blocks = pool.get_new_blocks(CHURN_BATCH)
                pool.cache_full_blocks(blocks, k, 0, CHURN_BATCH)
                pool.free_blocks(blocks, reverse=True)

        cycle()  # fill the cache, untimed
        out[("" if eviction == "lru" else f"{eviction}-") + f"churn-{shape}"] = cycle
    return out


def calls_per_round(name: str) -> int:
    if "churn" in name:
        return CHURN_CALLS
    return 3_200 if name == "alloc-free" else 320


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", help="the baseline build (a compiled _core .so)")
    parser.add_argument("new", help="the build to compare with it")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--only", default="hash,alloc", help="comma-separated: hash, alloc, churn, adaptive")
    args = parser.parse_args()
    only = set(args.only.split(","))
    builds = {"old": load_build(args.old), "new": load_build(args.new)}
    rng = random.Random(0)
    prompts = [[rng.randrange(0, 32_000) for _ in range(1_200)] for _ in range(32)]
    work: dict[str, dict[str, Callable[[], Any]]] = {}
    for label, core in builds.items():
        work[label] = {}
        if "hash" in only:
            work[label].update(hash_workloads(core, prompts))
        if "alloc" in only:
            work[label].update(alloc_workload(core))
        if "churn" in only:
            work[label].update(churn_workloads(core))
        if "adaptive" in only:
            work[label].update(churn_workloads(core, "adaptive"))
    for name in work["old"]:
        if name.startswith("hash"):
            old, new = work["old"][name](), work["new"][name]()
            as_bytes = [[bytes(h) for h in hashes] for hashes in old], [[bytes(h) for h in hashes] for hashes in new]
            if as_bytes[0] != as_bytes[1]:
                raise SystemExit(f"{name}: the two builds hash differently")
    times: dict[tuple[str, str], list[float]] = {(b, n): [] for b in builds for n in work["old"]}
    for rnd in range(args.rounds):
        for name in work["old"]:
            order = ("old", "new") if rnd % 2 == 0 else ("new", "old")
            for label in order:
                gc.collect()
                start = time.perf_counter()
                work[label][name]()
                times[(label, name)].append((time.perf_counter() - start) / calls_per_round(name) * 1e6)
    print(f"{'workload':24} {'old µs':>9} {'new µs':>9} {'new/old':>8}   (medians of {args.rounds} rounds)")
    for name in work["old"]:
        old_t, new_t = statistics.median(times[("old", name)]), statistics.median(times[("new", name)])
        print(f"{name:24} {old_t:9.3f} {new_t:9.3f} {new_t / old_t:8.3f}")


if __name__ == "__main__":
    main()
