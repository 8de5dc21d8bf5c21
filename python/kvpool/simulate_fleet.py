"""A fleet of engine instances behind a router, on a trace: ``kvpool simulate --instances N
--router round-robin|kv-aware``.

Each instance is a kvpool pool of the same capacity; requests go out in file order, each to one
instance, which serves it as :func:`kvpool.simulate.replay` does. ``round-robin`` sends request
``i`` to instance ``i % N``; ``kv-aware`` sends it to the instance holding the longest cached
prefix of its blocks (what a KV-aware router such as Dynamo's learns from the indexer), ties to
the one that has served the fewest blocks, among the instances whose load (requests served) is
within ``load_slack`` of the fleet's mean: without that bound a prefix every request shares (a
system prompt) would send the whole trace to the first instance that cached it. The result is
what a planner asks: the fleet's hit ratio at a given size and per-instance capacity, and how
evenly the load falls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import kvpool
from kvpool.simulate import get_impl, prepare_hashes, serve_one, truncate, unbounded_capacity
from kvpool.traces import Trace

ROUTERS = ("round-robin", "kv-aware")


@dataclass(frozen=True)
class FleetResult:
    """One replay of a trace through ``instances`` pools behind ``router``."""

    trace: str
    router: str
    instances: int
    capacity_blocks: int
    requests: int
    blocks: int
    hit_blocks: int
    block_hit_ratio: float
    token_hit_ratio: float
    requests_per_instance: list[int]
    blocks_per_instance: list[int]

    @property
    def load_imbalance(self) -> float:
        """The busiest instance's blocks over the mean (1.0: even)."""
        mean = sum(self.blocks_per_instance) / max(len(self.blocks_per_instance), 1)
        return max(self.blocks_per_instance) / mean if mean else 1.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["load_imbalance"] = round(self.load_imbalance, 4)
        for key in ("block_hit_ratio", "token_hit_ratio"):
            out[key] = round(out[key], 6)
        return out


def simulate_fleet(trace: Trace, instances: int, capacity: int, router: str, *,
                   block_tokens: int, load_slack: float = 0.25) -> FleetResult:
    """Replay ``trace`` through ``instances`` pools of ``capacity`` usable blocks each."""
    if router not in ROUTERS:
        raise kvpool.InvalidArgumentError(f"unknown router {router!r}: use one of {', '.join(ROUTERS)}")
    if instances < 1 or capacity < 1:
        raise kvpool.InvalidArgumentError("instances and capacity must be at least 1")
    if instances > max(trace.num_requests, 1):
        raise kvpool.InvalidArgumentError(
            f"{instances} instances for {trace.num_requests} requests: at most one instance per request")
    impl = get_impl("kvpool")
    # A pool that holds the whole trace never evicts: a larger one changes nothing.
    usable = min(capacity, max(unbounded_capacity(trace), trace.max_request_blocks))
    pools = [impl.pool_cls(usable + 1, enable_caching=True, block_size=block_tokens) for _ in range(instances)]
    requests = truncate(prepare_hashes(trace, impl), capacity)
    served_requests = [0] * instances
    served_blocks = [0] * instances
    hit_blocks = hit_tokens = 0
    for i, h in enumerate(requests):
        if router == "round-robin":
            target = i % instances
        else:
            bound = (1 + load_slack) * (i / instances) + 1
            allowed = [k for k in range(instances) if served_requests[k] <= bound]
            cached = {k: len(pools[k].find_longest_cache_hit(h)) for k in allowed}
            target = max(allowed, key=lambda k: (cached[k], -served_blocks[k], -k))
        hit = serve_one(pools[target], h)
        served_requests[target] += 1
        served_blocks[target] += len(h)
        hit_blocks += hit
        hit_tokens += min(hit * block_tokens, trace.input_lengths[i])
    inputs = sum(trace.input_lengths)
    return FleetResult(
        trace=trace.name, router=router, instances=instances, capacity_blocks=capacity,
        requests=trace.num_requests, blocks=trace.num_blocks, hit_blocks=hit_blocks,
        block_hit_ratio=hit_blocks / trace.num_blocks if trace.num_blocks else 0.0,
        token_hit_ratio=hit_tokens / inputs if inputs else 0.0,
        requests_per_instance=served_requests, blocks_per_instance=served_blocks)


def fleet_table(results: Sequence[FleetResult]) -> str:
    """The text output of ``kvpool simulate --instances``."""
    lines = [f"{'router':<12} {'instances':>9} {'capacity':>9} {'block_hit':>9} {'token_hit':>9} "
             f"{'imbalance':>9}  requests per instance"]
    for r in results:
        lines.append(f"{r.router:<12} {r.instances:>9} {r.capacity_blocks:>9} {r.block_hit_ratio:>9.4f} "
                     f"{r.token_hit_ratio:>9.4f} {r.load_imbalance:>9.2f}  {r.requests_per_instance}")
    return "\n".join(lines)
