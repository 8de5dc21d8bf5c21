"""The free-queue walk of vLLM 0.33's ``SimpleCPUOffloadConnector`` in lazy mode, on vLLM's own
``BlockPool`` and on kvpool's (``kvpool.vllm.single_type.BlockPool``, the pool view vLLM's
code reads).

Each scheduler step the connector goes on from the block it last visited
(``free_block_queue.iter_blocks_after(cursor)``), covering up to a target number of free
blocks (``2 * cdiv(max_num_batched_tokens, block_size)``, 1,024 for 8,192 tokens in 16-token
blocks), and keeps the last one as its cursor. Measured over a queue of

- ``fresh``: a pool as built, every block never used;
- ``freed``: every block allocated and freed without a hash (vLLM puts such blocks at the
  queue's head; kvpool keeps them on a stack);
- ``cached``: every block allocated, given a 32-byte hash (so that the walk reads a
  ``BlockHashWithGroupId`` from each, as on a warm server) and freed;

until the walk reaches the queue's tail. Prints µs per step for each pool, both pools
interleaved in one process, and the ratio. Needs vLLM (imported for its ``BlockPool``;
kvpool's side alone runs without it).

    OPENBLAS_NUM_THREADS=1 python benches/offload_walk.py [--blocks 100000] [--target 1024] [--rounds 5]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from typing import Any


def make_pool(which: str, num_blocks: int, shape: str) -> Any:
    """A pool of ``num_blocks`` (block 0 the null block) whose free queue has ``shape``."""
    if which == "vllm":
        from vllm.v1.core.block_pool import BlockPool
    else:
        from kvpool.vllm.single_type import BlockPool
    pool = BlockPool(num_blocks, enable_caching=True, hash_block_size=16)
    if shape in ("freed", "cached"):
        blocks = pool.get_new_blocks(pool.get_num_free_blocks())
        if shape == "cached":
            for block in blocks:
                key = block.block_id.to_bytes(32, "big")
                if which == "vllm":
                    from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

                    block.set_block_hash(make_block_hash_with_group_id(key, 0), 16)
                else:
                    pool._pool._set_block_hash(block.block_id, key, 0, num_tokens=16)  # its own hook
        pool.free_blocks(reversed(blocks))
    return pool


def walk(pool: Any, target: int) -> tuple[int, float]:
    """Walks the queue as the lazy connector does until a step covers nothing new; returns
    the steps taken and the seconds they took."""
    queue = pool.free_block_queue
    cursor = None
    steps = 0
    start = time.perf_counter()
    while True:
        if cursor is not None and cursor.ref_cnt > 0:
            cursor = None
        last = cursor
        covered = 0
        for covered, node in enumerate(queue.iter_blocks_after(cursor)):
            if covered >= target:
                break
            last = node
            _ = node.block_hash  # the connector reads each block's hash
        steps += 1
        if last is cursor:
            break
        cursor = last
    return steps, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=100_000)
    parser.add_argument("--target", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    try:
        import vllm.v1.core.block_pool  # noqa: F401

        sides = ["vllm", "kvpool"]
    except ImportError:
        sides = ["kvpool"]
    for shape in ("fresh", "freed", "cached"):
        per_step: dict[str, list[float]] = {side: [] for side in sides}
        for _ in range(args.rounds):
            for side in sides:
                pool = make_pool(side, args.blocks, shape)
                gc.collect()
                steps, seconds = walk(pool, args.target)
                per_step[side].append(seconds / steps * 1e6)
        line = f"{shape:6} {args.blocks:,} blocks, {args.target} a step:"
        for side in sides:
            line += f"  {side} {statistics.median(per_step[side]):8.1f} µs/step"
        if len(sides) == 2:
            ratios = [v / k for v, k in zip(per_step["vllm"], per_step["kvpool"])]
            line += f"  vLLM/kvpool {statistics.median(ratios):.2f}x"
        print(line, flush=True)


if __name__ == "__main__":
    main()
