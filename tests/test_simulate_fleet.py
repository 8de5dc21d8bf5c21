"""``kvpool simulate --instances N --router ...``: a fleet of pools behind a router."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvpool.simulate import simulate_one
from kvpool.simulate_fleet import ROUTERS, simulate_fleet
from kvpool.traces import synthetic_trace


@pytest.mark.parametrize("router", ROUTERS)
def test_one_instance_is_the_single_pool_replay(router: str) -> None:
    trace = synthetic_trace()
    fleet = simulate_fleet(trace, 1, 800, router, block_tokens=512)
    alone = simulate_one(trace, 800, block_tokens=512)
    assert (fleet.hit_blocks, fleet.requests_per_instance) == (alone.hit_blocks, [trace.num_requests])


def test_kv_aware_routing_hits_more_and_keeps_the_load_even() -> None:
    trace = synthetic_trace()
    rr = simulate_fleet(trace, 4, 1500, "round-robin", block_tokens=512)
    kv = simulate_fleet(trace, 4, 1500, "kv-aware", block_tokens=512)
    assert kv.hit_blocks > rr.hit_blocks
    assert sum(kv.requests_per_instance) == trace.num_requests
    assert max(kv.requests_per_instance) <= 1.25 * trace.num_requests / 4 + 2
    with pytest.raises(ValueError):
        simulate_fleet(trace, 4, 1500, "random", block_tokens=512)
    with pytest.raises(ValueError):
        simulate_fleet(trace, 0, 1500, "kv-aware", block_tokens=512)


def test_cli(tmp_path: object) -> None:
    trace = synthetic_trace()
    path = f"{tmp_path}/t.jsonl"
    with open(path, "w") as f:
        for i in range(trace.num_requests):
            f.write(json.dumps({"timestamp": i, "input_length": trace.input_lengths[i], "output_length": 1,
                                "hash_ids": [int(h) for h in trace.hash_ids[i]]}) + "\n")
    out = subprocess.run([sys.executable, "-m", "kvpool", "simulate", path, "--instances", "3", "--capacity-blocks",
                          "500", "--json"], capture_output=True, text=True, check=True).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["router"] for r in rows] == list(ROUTERS) and all(r["instances"] == 3 for r in rows)
    assert rows[1]["block_hit_ratio"] > rows[0]["block_hit_ratio"]
