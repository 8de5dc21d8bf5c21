"""vLLM's ``kv_cache_report_mode="full"`` on ``kvpool.vllm.KVCacheManager``, against vLLM 0.33's
own manager: a request that asks for it (``SamplingParams(extra_args=...)``) has its prefix-cache
hit announced again on every lookup, one ``BlockStored`` per group from block 0, so a router
learns that the reused blocks are still there. kvpool's manager announced nothing."""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from vllm_requests import make_request  # noqa: E402

FULL = {"kv_cache_report_mode": "full"}


def spec(kind: str, block_size: int) -> Any:
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    common = {"block_size": block_size, "num_kv_heads": 1, "head_size": 1, "dtype": torch.float32}
    if kind == "full":
        return FullAttentionSpec(**common)
    return SlidingWindowSpec(sliding_window=int(kind), **common)


LAYOUTS = {
    "one full group": [("full", 16)],
    "full and window": [("full", 16), ("48", 16)],
    "full 32 over 16-token hashes, window": [("full", 32), ("64", 16)],
}


def managers(layout: list[tuple[str, int]], num_blocks: int) -> list[Any]:
    """vLLM's manager and kvpool's over the same groups, events on (hashes of 16 tokens)."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    import kvpool.vllm

    config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec([f"l{i}"], spec(kind, bs)) for i, (kind, bs) in enumerate(layout)])
    scheduler_block_size = max(bs for _, bs in layout)
    built = [cls(config, max_model_len=4096, scheduler_block_size=scheduler_block_size, hash_block_size=16,
                 enable_caching=True, enable_kv_cache_events=True)
             for cls in (KVCacheManager, kvpool.vllm.KVCacheManager)]
    assert type(built[1]).__module__.startswith("kvpool"), "kvpool's manager fell back to vLLM's"
    return built


def described(events: list[Any]) -> list[str]:
    return [repr(e) for e in events]


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_reused_blocks_are_announced_again_as_vllm_does(layout: str) -> None:
    """Random requests over a few shared prefixes, some in the full report mode (looked up
    twice at times, as a request that waits is), served and freed in a small pool, so that
    hits, evictions and re-announcements mix: the events equal vLLM's after every call."""
    rng = random.Random(7)
    sides = managers(LAYOUTS[layout], 48)
    prefixes = [[rng.randrange(1000) for _ in range(64)] for _ in range(3)]
    announced = 0
    for i in range(60):
        tokens = rng.choice(prefixes)[: rng.choice([16, 32, 48, 64])] + [rng.randrange(1000) for _ in range(20)]
        mode = FULL if rng.random() < 0.5 else None
        again = rng.random() < 0.3  # a waiting request looks up again
        seen = []
        for manager in sides:
            req = make_request(f"r{i}", tokens, 16, extra_args=mode)
            blocks, n = manager.get_computed_blocks(req)[:2]
            if again:
                blocks, n = manager.get_computed_blocks(req)[:2]
            new = manager.allocate_slots(req, req.num_tokens - n, n, blocks)
            events = manager.take_events()
            if new is not None:
                manager.free(req)
            seen.append((n, new is not None, described(events + manager.take_events())))
        assert seen[1] == seen[0], f"request {i}"
        announced += sum(1 for e in seen[0][2] if "parent_block_hash=None" in e and mode)
    assert announced > 5, "the workload never reused a prefix in the full report mode"


def test_the_default_mode_announces_nothing_for_a_hit() -> None:
    for manager in managers(LAYOUTS["one full group"], 32):
        first = make_request("a", list(range(40)), 16)
        blocks, n = manager.get_computed_blocks(first)[:2]
        manager.allocate_slots(first, first.num_tokens - n, n, blocks)
        manager.take_events()
        again = make_request("b", list(range(40)), 16)
        assert manager.get_computed_blocks(again)[1] == 32
        assert manager.take_events() == []
        full = make_request("c", list(range(40)), 16, extra_args=FULL)
        assert manager.get_computed_blocks(full)[1] == 32
        (event,) = manager.take_events()
        assert (event.parent_block_hash, len(event.block_hashes), event.token_ids) == (None, 2, list(range(32)))
