"""``kvpool.vllm.KVCacheManager.evict_blocks`` against vLLM 0.33's manager: the removals'
events come in the order vLLM walks the id set, and a request whose blocks lost their hashes
no longer counts them in ``estimate_cached_tokens``; a dropped manager lets its pool go."""

from __future__ import annotations

import gc
from typing import Any

import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from vllm_requests import make_request  # noqa: E402


def request(request_id: str, tokens: list[int]) -> Any:
    return make_request(request_id, tokens)


def managers(events: bool = False) -> list[Any]:
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    import kvpool.vllm

    spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1, dtype=torch.float32)
    config = KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l"], spec)])
    return [cls(config, max_model_len=1024, scheduler_block_size=4, hash_block_size=4,
                enable_kv_cache_events=events) for cls in (KVCacheManager, kvpool.vllm.KVCacheManager)]


def test_removals_follow_the_sets_order() -> None:
    seen = []
    for manager in managers(events=True):
        for i in range(4):
            manager.allocate_slots(request(f"r{i}", [i * 100 + j for j in range(8)]), 8)
        manager.take_events()
        ids = {8, 1}
        manager.evict_blocks(ids)
        seen.append((list(ids), [e.block_hashes for e in manager.take_events()]))
    assert seen[1] == seen[0]


def test_evicted_hashes_no_longer_count_as_cached_tokens() -> None:
    seen = []
    for manager in managers():
        r = request("a", list(range(12)))
        manager.allocate_slots(r, 12)
        counts = [manager.estimate_cached_tokens(r)]
        for ids in ({3}, {1, 2}):
            manager.evict_blocks(ids)
            counts.append(manager.estimate_cached_tokens(r))
        seen.append(counts)
    assert seen[1] == seen[0] == [12, 8, 0]


def test_a_dropped_manager_lets_its_free_queue_view_go() -> None:
    from kvpool import _free_neighbours

    gc.collect()
    before = len(_free_neighbours.QUEUES)
    manager = managers()[1]
    assert len(_free_neighbours.QUEUES) == before + 1
    del manager
    gc.collect()
    assert len(_free_neighbours.QUEUES) == before


def test_the_pool_view_looks_a_hash_up_in_each_group_asked_for() -> None:
    """``block_pool.get_cached_block(hash, group_ids)``: one block per group, or ``None`` if
    any group misses, as vLLM's pool answers (the one-group view looked in group 0 alone)."""
    seen = []
    for manager in managers():
        req = request("a", list(range(8)))
        manager.allocate_slots(req, 8)
        first = req.block_hashes[0]
        pool = manager.block_pool
        seen.append([None if found is None else [b.block_id for b in found]
                     for found in (pool.get_cached_block(first, [0]), pool.get_cached_block(first, [0, 0]),
                                   pool.get_cached_block(first, [1]), pool.get_cached_block(first, [0, 1]))])
    assert seen[1] == seen[0] == [[1], [1, 1], None, None]
