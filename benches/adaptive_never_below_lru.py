#!/usr/bin/env python3
"""The adaptive eviction policy against LRU at many capacities, on Mooncake-format traces.

For each trace, replays it (:func:`kvpool.simulate.replay`, the semantics of ``kvpool
simulate``) in a pool of each capacity under LRU and under ``eviction="adaptive"`` (its default
horizon, or ``--horizon``), and lists every capacity where the adaptive policy hits fewer blocks
than LRU. The capacities: ``--points`` spaced evenly in log from ``--low`` to ``--high``, plus
every ``--step`` blocks across ``--dense`` (where the default horizon fades out). Exits with 1
if the adaptive policy is below LRU anywhere. About 35 s for both shared traces.

Usage: ``python benches/adaptive_never_below_lru.py [TRACE ...] [--points 150] [--horizon H]``
(default traces: ``../shared/traces/{conversation,synthetic}_trace.jsonl``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from kvpool.simulate import get_impl, prepare_hashes, simulate_one
from kvpool.traces import load_trace

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "traces"
DEFAULT_TRACES = [SHARED / "conversation_trace.jsonl", SHARED / "synthetic_trace.jsonl"]


def capacities(low: int, high: int, points: int, dense: tuple[int, int], step: int) -> list[int]:
    """``points`` capacities spaced evenly in log from ``low`` to ``high``, and every ``step``
    blocks from ``dense[0]`` to ``dense[1]``."""
    spread = {int(round(x)) for x in np.logspace(np.log10(low), np.log10(high), points)}
    return sorted(spread | set(range(dense[0], dense[1] + 1, step)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="*", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--low", type=int, default=1_000)
    parser.add_argument("--high", type=int, default=100_000)
    parser.add_argument("--points", type=int, default=150)
    parser.add_argument("--dense", type=int, nargs=2, default=(24_000, 31_000), metavar=("FROM", "TO"))
    parser.add_argument("--step", type=int, default=100)
    parser.add_argument("--horizon", type=int, default=None, help="adaptive_horizon= (default: the pool's default)")
    args = parser.parse_args()
    impl = get_impl("kvpool")
    policy = "adaptive" if args.horizon is None else f"adaptive:{args.horizon}"
    below_anywhere = False
    for path in args.traces:
        trace = load_trace(str(path))
        trace_hashes = prepare_hashes(trace, impl)
        caps = capacities(args.low, args.high, args.points, tuple(args.dense), args.step)
        below, worst = [], (float("inf"), 0)
        for c in caps:
            lru, adaptive = (simulate_one(trace, c, impl=impl, hashes=trace_hashes, policy=p).hit_blocks
                             for p in ("lru", policy))
            worst = min(worst, (adaptive / lru if lru else 1.0, c))
            if adaptive < lru:
                below.append((c, adaptive - lru))
        print(f"{path.name}: {len(caps)} capacities, worst adaptive/LRU {worst[0]:.4f} at {worst[1]:,} blocks; "
              f"below LRU at {len(below)}" + (f": {below}" if below else ""))
        below_anywhere |= bool(below)
    return 1 if below_anywhere else 0


if __name__ == "__main__":
    sys.exit(main())
