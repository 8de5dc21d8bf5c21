"""Memory with KV events on and never taken: the queue is bounded, so memory is too.

Runs the evicting churn (allocate 64 blocks that evict cached ones, cache them under new
hashes, free them) on a 100,000-block pool with ``enable_events=True`` and never calls
``take_events()``; prints the resident set size and the event counters as it goes.

    python benches/event_memory.py [--ops 1000000] [--max-pending-events N]
"""

from __future__ import annotations

import argparse
import os

import numpy as np

import kvpool


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=1_000_000, help="pool operations (calls) to run")
    parser.add_argument("--max-pending-events", type=int, default=None, help="the pool's bound (default 1,000,000)")
    args = parser.parse_args()
    pool = kvpool.BlockPool(100_000, enable_events=True, block_size=16, max_pending_events=args.max_pending_events)
    print(f"start: rss {rss_mb():.0f} MB, bound {pool.max_pending_events:,} events")
    step, ops, key = 64, 0, 0
    report = max(args.ops // 10, 1)
    while ops < args.ops:
        ids = pool.get_new_blocks(step)
        hashes = [(key + i).to_bytes(32, "big") for i in range(step)]
        key += step
        pool.cache_full_blocks(ids, hashes, 0, step)
        pool.free_blocks(ids, reverse=True)
        ops += 3
        if ops % report < 3:
            print(f"{ops:>10,} ops: rss {rss_mb():6.0f} MB, pending {pool.num_pending_events:>9,}, "
                  f"dropped {pool.num_dropped_events:>10,}")
    print(f"end: rss {rss_mb():.0f} MB, pending {pool.num_pending_events:,}, dropped {pool.num_dropped_events:,}")


if __name__ == "__main__":
    main()
