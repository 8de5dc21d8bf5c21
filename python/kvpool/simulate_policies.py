"""The side-by-side table of ``kvpool simulate --policy``: hit ratio per policy (its plot is
:func:`kvpool.simulate.save_plot`, one curve per policy).

Rows are capacities, columns the policies and Belady's MIN (the offline bound); each cell is the
block hit ratio, with the ratio to LRU's hits when LRU is among the columns.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvpool.simulate import ReplayResult
from kvpool.traces import Trace

__all__ = ["policies_table"]


def policies_table(trace: Trace, results: Sequence[ReplayResult], columns: Sequence[str]) -> str:
    """A text table: one row per bounded capacity, one block-hit-ratio column per policy."""
    by_key = {(r.capacity_blocks, r.policy): r for r in results}
    capacities = sorted({r.capacity_blocks for r in results if r.capacity_blocks is not None})
    lines = [
        f"{trace.name}: {trace.num_requests} requests, {trace.num_blocks} blocks "
        f"({trace.distinct_ids()} distinct ids); block hit ratio per eviction policy "
        "(x LRU's hits)" + ("; belady = Belady's MIN, the offline bound" if "belady" in columns else ""),
        f"{'capacity':>10}  " + "  ".join(f"{c:>15}" for c in columns),
    ]
    for capacity in capacities:
        lru = by_key.get((capacity, "lru"))
        cells = []
        for column in columns:
            r = by_key.get((capacity, column))
            if r is None:
                cells.append(f"{'-':>15}")
                continue
            ratio = f" ({r.hit_blocks / lru.hit_blocks:.2f}x)" if lru and lru.hit_blocks and column != "lru" else ""
            cells.append(f"{100 * r.block_hit_ratio:>6.2f}%{ratio:>8}")
        lines.append(f"{capacity:>10}  " + "  ".join(cells))
    ceiling = next((r for r in results if r.capacity_blocks is None), None)
    if ceiling is not None:
        lines.append(f"{'unbounded':>10}  {100 * ceiling.block_hit_ratio:>6.2f}% (every policy)")
    return "\n".join(lines)
