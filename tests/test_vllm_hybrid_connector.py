"""``kvpool.vllm``'s hybrid manager on a KV connector's paths, against vLLM 0.33's own manager: the
coordinator's block count for in-flight prefills (the scheduler sizes async loads' reservations
with it), deferred frees (``pop_blocks_for_free``), and which blocks the worker zeroes when a
cache of mixed precisions needs zeroing and an async load writes some of them."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from vllm_requests import make_request  # noqa: E402


def spec(kind: str, block_size: int, dtype: Any = None) -> Any:
    from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec, FullAttentionSpec, SlidingWindowSpec

    common = dict(block_size=block_size, num_kv_heads=1, head_size=1, dtype=dtype or torch.float32)
    if kind == "full":
        return FullAttentionSpec(**common)
    if kind == "window":
        return SlidingWindowSpec(**common, sliding_window=8)
    return ChunkedLocalAttentionSpec(**common, attention_chunk_size=8)


def managers(specs: list[Any], num_blocks: int = 64) -> list[Any]:
    """vLLM's manager and kvpool's over the same groups (4-token blocks), at most 16 tokens in
    flight per step (so the admission cap of a window group binds)."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    import kvpool.vllm

    config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)])
    args = dict(max_model_len=128, scheduler_block_size=4, hash_block_size=4, enable_caching=True,
                max_in_flight_tokens=16)
    ours = kvpool.vllm.KVCacheManager(config, **args)
    assert type(ours).__module__ == "kvpool.vllm._hybrid", "kvpool fell back to vLLM's manager"
    return [KVCacheManager(config, **args), ours]


LAYOUTS = [["full", "window"], ["full", "chunked"], ["window", "full", "window"]]


@pytest.mark.parametrize("layout", LAYOUTS, ids=["-".join(x) for x in LAYOUTS])
def test_blocks_an_in_flight_prefill_still_needs(layout: list[str]) -> None:
    """``coordinator.get_num_blocks_to_allocate`` as the scheduler calls it for every prefill in
    flight (``apply_admission_cap=True``, no hit), and as an admission check with a hit."""
    seen = []
    for manager in managers([spec(k, 4) for k in layout]):
        counts = []
        warm = make_request("warm", list(range(40)))
        manager.allocate_slots(warm, 40)
        manager.free(warm)
        req = make_request("a", list(range(60)))
        hit, n = manager.get_computed_blocks(req)[:2]
        for cap in (False, True):
            counts.append(manager.coordinator.get_num_blocks_to_allocate(
                request_id="a", num_tokens=60, new_computed_blocks=hit.blocks, num_encoder_tokens=0,
                total_computed_tokens=n, num_local_computed_tokens=n, num_tokens_main_model=60,
                apply_admission_cap=cap, prefill_end=60))
        manager.allocate_slots(req, 12, n, hit)  # a first chunk
        req.num_computed_tokens = n + 12
        manager.remove_skipped_blocks("a", req.num_computed_tokens)
        for num_tokens in (60, 64, 100):
            for cap in (False, True):
                counts.append(manager.coordinator.get_num_blocks_to_allocate(
                    request_id="a", num_tokens=num_tokens, new_computed_blocks=manager.empty_kv_cache_blocks.blocks,
                    num_encoder_tokens=0, total_computed_tokens=req.num_computed_tokens,
                    num_local_computed_tokens=req.num_computed_tokens, num_tokens_main_model=num_tokens,
                    apply_admission_cap=cap, prefill_end=60))
        seen.append(counts)
    assert seen[0] == seen[1]
    assert seen[1][0] != seen[1][1], "the admission cap changed nothing"


@pytest.mark.parametrize("layout", LAYOUTS, ids=["-".join(x) for x in LAYOUTS])
def test_deferred_frees_return_every_groups_blocks(layout: list[str]) -> None:
    """``pop_blocks_for_free`` (vLLM defers frees with async scheduling on a P/D consumer): every
    group's blocks past its leading null ones, group after group, unfreed until the caller frees
    them tail first."""
    seen = []
    for manager in managers([spec(k, 4) for k in layout]):
        req = make_request("a", list(range(30)))
        manager.allocate_slots(req, 30)
        req.num_computed_tokens = 30
        manager.remove_skipped_blocks("a", 30)
        free_before = manager.block_pool.get_num_free_blocks()
        blocks = manager.pop_blocks_for_free(req)
        assert manager.block_pool.get_num_free_blocks() == free_before
        ids = [b.block_id for b in blocks]
        manager.block_pool.free_blocks(reversed(blocks))
        again = manager.allocate_slots(make_request("b", list(range(30))), 30)
        seen.append((ids, manager.block_pool.get_num_free_blocks(), manager.get_block_ids("b"),
                     again is not None, manager.pop_blocks_for_free(make_request("c", [1]))))
    assert seen[0] == seen[1]


def test_async_loaded_blocks_are_not_zeroed_and_failed_loads_are() -> None:
    """A cache of mixed precisions needs zeroing; the connector's blocks that an async load writes
    (``skip_zeroing_group_ids``) are left out of those recorded, and ``record_blocks_for_zeroing``
    records a failed load's blocks again (they used to be recorded anyway, then raise)."""
    specs = [spec("full", 4, torch.float16), spec("window", 4, torch.bfloat16)]
    seen = []
    for manager in managers(specs):
        assert manager.take_new_block_ids() == []
        steps = []
        for rid, skip in (("a", (0, 1)), ("b", (1,)), ("c", ())):
            req = make_request(rid, list(range(100, 120)))
            manager.allocate_slots(req, 4, num_external_computed_tokens=16, delay_cache_blocks=True,
                                   skip_zeroing_group_ids=skip)
            steps.append(manager.take_new_block_ids())
        manager.record_blocks_for_zeroing("a", 8)
        steps.append(manager.take_new_block_ids())
        manager.record_blocks_for_zeroing("unknown", 0)
        steps.append(manager.take_new_block_ids())
        seen.append(steps)
    assert seen[0] == seen[1]
    assert seen[1][0] != seen[1][2], "skipping changed nothing"


def test_block_tables_skip_the_connectors_blocks_when_asked() -> None:
    """The one-group tables: ``skip_zeroing_group_ids`` holding 0 leaves the connector's blocks
    out of those recorded; the step's own new block is still recorded."""
    import kvpool

    for skip, expected in ((None, [1, 2, 3]), ([0], [3]), ([1], [1, 2, 3])):
        pool = kvpool.BlockPool(16, block_size=4)
        tables = kvpool.BlockTables(pool, max_model_len=64, record_new_block_ids=True)
        new = tables.allocate_slots("r", 0, 12, [], 4, num_external_computed_tokens=8,
                                    skip_zeroing_group_ids=skip)
        assert new.tolist() == [3]
        assert tables.take_new_block_ids().tolist() == expected
        tables.record_blocks_for_zeroing("r", 4)
        assert tables.take_new_block_ids().tolist() == [2, 3]
        with pytest.raises(kvpool.InvalidArgumentError, match="block boundary"):
            tables.record_blocks_for_zeroing("r", 6)
        with pytest.raises(kvpool.InvalidArgumentError, match="group indices"):
            tables.allocate_slots("s", 0, 4, [], 4, skip_zeroing_group_ids=[-1])
        tables.check_invariants()
