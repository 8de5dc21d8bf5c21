"""``KVPOOL_EVICTION`` picks the eviction policy of ``kvpool.vllm``'s pools."""

from __future__ import annotations

import importlib.util

import pytest

import kvpool

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")


def build(groups: str) -> object:
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec

    import kvpool.vllm

    full = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1, dtype=torch.float32)
    specs = [KVCacheGroupSpec(["f"], full)]
    if groups == "hybrid":
        window = SlidingWindowSpec(block_size=4, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=8)
        specs.append(KVCacheGroupSpec(["w"], window))
    config = KVCacheConfig(num_blocks=32, kv_cache_tensors=[], kv_cache_groups=specs)
    return kvpool.vllm.KVCacheManager(config, max_model_len=64, scheduler_block_size=4, hash_block_size=4)


@pytest.mark.parametrize("groups", ["single", "hybrid"])
def test_the_environment_picks_the_policy(monkeypatch: pytest.MonkeyPatch, groups: str) -> None:
    assert build(groups)._pool.eviction == "lru"  # type: ignore[attr-defined]
    monkeypatch.setenv("KVPOOL_EVICTION", "adaptive")
    assert build(groups)._pool.eviction == "adaptive"  # type: ignore[attr-defined]
    assert build(groups)._pool.adaptive_horizon == 20_000  # type: ignore[attr-defined]
    monkeypatch.setenv("KVPOOL_EVICTION", "adaptive:500")
    pool = build(groups)._pool  # type: ignore[attr-defined]
    assert (pool.eviction, pool.adaptive_horizon) == ("adaptive", 500)
    for bad in ("fifo", "adaptive:x", "lru:5"):
        monkeypatch.setenv("KVPOOL_EVICTION", bad)
        with pytest.raises(kvpool.InvalidArgumentError, match="eviction"):
            build(groups)
