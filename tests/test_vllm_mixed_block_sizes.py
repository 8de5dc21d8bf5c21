"""``kvpool.vllm.KVCacheManager`` with KV-cache groups of different block sizes, against vLLM
0.33's own manager: the calls that read or cut a request's blocks per group, and the
``BlockStored`` events of each group (its block size, hashes and extra keys)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from vllm_requests import make_request  # noqa: E402


def request(request_id: str, cache_salt: str | None = None) -> Any:
    return make_request(request_id, list(range(100)), 16, cache_salt=cache_salt, max_tokens=100)


def managers(specs: list[Any], events: bool = False, num_blocks: int = 64) -> list[Any]:
    """vLLM's manager and kvpool's over the same groups (hashes of 16 tokens)."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    import kvpool.vllm

    config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)])
    return [cls(config, max_model_len=1024, scheduler_block_size=32, hash_block_size=16, enable_caching=True,
                enable_kv_cache_events=events) for cls in (KVCacheManager, kvpool.vllm.KVCacheManager)]


def full(block_size: int) -> Any:
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    return FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)


def window(block_size: int, tokens: int) -> Any:
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    return SlidingWindowSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32,
                             sliding_window=tokens)


def serve(manager: Any, req: Any) -> None:
    blocks, n = manager.get_computed_blocks(req)[:2]
    manager.allocate_slots(req, req.num_tokens - n, n, blocks)


def ids(blocks: Any) -> list[list[int]]:
    return [[b.block_id for b in group] for group in blocks.blocks]


def test_each_group_is_cut_at_its_own_block_size() -> None:
    seen = []
    for manager in managers([full(16), full(32)]):
        serve(manager, request("a"))
        hit, n = manager.get_computed_blocks(request("b"))[:2]
        seen.append((manager.get_block_ids_for_computed_tokens("a", 64), n, ids(hit),
                     ids(manager.truncate_computed_blocks(hit, 32))))
    vllm, kvpool_side = seen
    assert kvpool_side == vllm
    assert vllm[0] == ([1, 2, 3, 4], [8, 9])  # 64 tokens: four blocks of 16, two of 32


@pytest.mark.parametrize("sizes", [(16, 32), (32, 16)])
def test_each_groups_block_stored_has_its_block_size_and_extra_keys(sizes: tuple[int, int]) -> None:
    seen = []
    for manager in managers([full(sizes[0]), window(sizes[1], 64)], events=True):
        serve(manager, request("a", cache_salt="salt"))
        seen.append([(e.group_idx, e.block_size, e.block_hashes, e.extra_keys) for e in manager.take_events()])
    assert seen[1] == seen[0]
    assert all(keys[0] == ("salt",) for _, _, _, keys in seen[0])


def test_an_event_of_a_group_outside_the_layout_is_passed_on() -> None:
    seen = []
    for manager in managers([full(16), window(16, 32)], events=True):
        pool = manager.block_pool
        pool.cache_full_blocks(request("a"), pool.get_new_blocks(2), 0, 2, 16, 5)
        seen.append([(type(e).__name__, e.group_idx, e.kv_cache_spec_kind) for e in manager.take_events()])
    assert seen[1] == seen[0] == [("BlockStored", 5, None)]


@pytest.mark.parametrize("layout", [
    [window(16, 64), full(16)], [full(32), window(16, 64)], [window(16, 64), window(16, 32)],
    [window(16, 32), full(16), full(32)]])
def test_the_coordinator_names_vllms_full_attention_group(layout: list[Any]) -> None:
    """Connectors read ``coordinator.full_attention_group_id`` (getattr, default 0) to look
    hashes up in a full-attention group; kvpool's hybrid coordinator lacked it, so they
    looked in group 0, a window's group in the first layout."""
    vllm, ours = managers(layout)
    assert type(ours.coordinator).__name__ == type(vllm.coordinator).__name__ == "HybridKVCacheCoordinator"
    assert ours.coordinator.full_attention_group_id == vllm.coordinator.full_attention_group_id


def test_the_cache_map_view_shows_extra_keys_as_vllms_map_does() -> None:
    # A prompt whose last 32-token block of the second group is cached whole under its full
    # key and then, as another prompt ends inside it, under a partial (extra) key too: vLLM's
    # cached_block_hash_to_block holds both; its length counts distinct keys.
    import random

    import kvpool

    script = random.Random(3)
    stems = [[script.randrange(1000) for _ in range(script.randrange(8, 90))] for _ in range(4)]
    ops: list[tuple[Any, ...]] = []
    live: list[str] = []
    for step in range(9):
        draw = script.random()
        if live and (draw < 0.4 or len(live) > 3):
            ops.append(("free", live.pop(script.randrange(len(live)))))
        else:
            stem = script.choice(stems)
            tail = [script.randrange(1000) for _ in range(script.randrange(0, 40))]
            ops.append(("serve", f"r{step}", stem[:script.randrange(1, len(stem) + 1)] + tail))
            live.append(f"r{step}")
    seen = []
    for manager in managers([full(16), full(32)], num_blocks=48):
        requests: dict[str, Any] = {}
        for op in ops:
            if op[0] == "free":
                manager.free(requests[op[1]])
            else:
                requests[op[1]] = req = make_request(op[1], op[2], 16, max_tokens=64)
                blocks, hit = manager.get_computed_blocks(req)[:2]
                manager.allocate_slots(req, req.num_tokens - hit, hit, blocks)
        cache_map = manager.block_pool.cached_block_hash_to_block
        extra = {block: set(keys) for block, keys in manager.block_pool.cached_block_hashes_by_block.items()}
        assert extra, "the script leaves a block with an extra key"
        contained = sorted((block, cache_map.contain(key, block)) for block, keys in extra.items() for key in keys)
        snapshot = {key: sorted(b.block_id for b in (v.values() if isinstance(v, dict) else [v]))
                    for key, v in cache_map._cache.items()}
        seen.append((len(cache_map), contained, snapshot))
        if type(manager).__module__.startswith("kvpool"):
            block, keys = next(iter(extra.items()))
            with pytest.raises(kvpool.InvalidArgumentError):
                cache_map.pop(next(iter(keys)), block)
            with pytest.raises(kvpool.InvalidArgumentError):
                cache_map._cache.pop(next(iter(keys)))
    assert seen[0] == seen[1]
