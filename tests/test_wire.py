"""``kvpool.wire``: KV-cache events in vLLM 0.33's msgpack form, byte for byte.

Against vectors made by vLLM's own encoder (``tests/data/wire_vectors.json``, written by
``scripts/make_wire_vectors.py``; no vLLM needed here) and, with vLLM installed, against its
``KVEventBatch`` on random events; plus the conversion from kvpool's own events.
"""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path
from typing import Any

import msgspec
import pytest

import kvpool
from kvpool import wire

VECTORS = json.loads((Path(__file__).parent / "data" / "wire_vectors.json").read_text())["vectors"]


def build(events: list[dict[str, Any]]) -> list[wire.WireEvent]:
    return [getattr(wire, e["type"])(**e["fields"]) for e in events]


@pytest.mark.parametrize("i", range(len(VECTORS)))
def test_matches_vllms_bytes(i: int) -> None:
    v = VECTORS[i]
    payload = wire.encode_batch(build(v["events"]), v["ts"], v["data_parallel_rank"])
    assert payload.hex() == v["msgpack"]
    back = wire.decode_batch(payload)
    assert wire.encode_batch(back.events, back.ts, back.data_parallel_rank) == payload


def test_vectors_cover_every_shape() -> None:
    types = {e["type"] for v in VECTORS for e in v["events"]}
    fields = {f for v in VECTORS for e in v["events"] for f in e["fields"]}
    assert types == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}
    assert {"extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"} <= fields
    assert {v["data_parallel_rank"] for v in VECTORS} >= {None, 0}


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_random_batches_match_vllm() -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import vllm.distributed.kv_events as kv
    from make_wire_vectors import random_fields

    rng = random.Random(7)
    encoder = msgspec.msgpack.Encoder()
    for _ in range(300):
        events = [random_fields(rng) for _ in range(rng.randint(0, 6))]
        ts, rank = rng.random() * 1e9, rng.choice([None, 0, 1])
        theirs = encoder.encode(kv.KVEventBatch(ts=ts, events=[getattr(kv, k)(**f) for k, f in events],
                                                data_parallel_rank=rank))
        ours = wire.encode_batch([getattr(wire, k)(**f) for k, f in events], ts, rank)
        assert ours == theirs


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_a_managers_events_encode_as_vllms_publisher_would() -> None:
    """The same cache operations through vLLM 0.33's ``BlockPool`` (its events as its
    ``KVCacheManager`` annotates them) and kvpool's: equal payloads, byte for byte."""
    import msgspec as ms
    import torch
    from vllm.distributed.kv_events import KVEventBatch
    from vllm.lora.request import LoRARequest
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request

    init_none_hash(sha256)
    spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1, dtype=torch.float32)
    config = KVCacheConfig(num_blocks=32, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l"], spec)])
    theirs = KVCacheManager(config, max_model_len=1000, scheduler_block_size=4, hash_block_size=4,
                            enable_kv_cache_events=True)
    ours = kvpool.KVCacheManager(32, 4, hash_algo="sha256", enable_events=True)
    for i, lora in enumerate([None, LoRARequest("adapter", 7, "/x")]):
        prompt = [i * 100 + t for t in range(14)]
        params = SamplingParams(max_tokens=5)
        params.update_from_generation_config({}, eos_token_id=100_000)
        req = Request(request_id=f"r{i}", prompt_token_ids=prompt, mm_features=None, sampling_params=params,
                      pooling_params=None, lora_request=lora, cache_salt=None,
                      block_hasher=get_request_block_hasher(4, sha256))
        theirs.allocate_slots(req, 14)
        theirs.free(req)
        ours.add_request(f"r{i}", prompt, lora=None if lora is None else ("adapter", "/x"),
                         lora_id=None if lora is None else 7)
        ours.allocate_slots(f"r{i}", 14)
        ours.free(f"r{i}")
    expected = ms.msgpack.Encoder().encode(KVEventBatch(ts=3.0, events=theirs.take_events(), data_parallel_rank=0))
    got = wire.encode_batch(wire.from_pool_events(ours.take_events(), group_specs={0: ("full_attention", None)}),
                            3.0, 0)
    assert got == expected


def test_pool_events_convert_as_vllm_publishes_them() -> None:
    pool = kvpool.BlockPool(8, block_size=2, enable_events=True)
    ids = pool.get_new_blocks(2)
    hashes = [bytes(range(32)), bytes(range(1, 33))]
    pool.cache_full_blocks(ids, hashes, 0, 2, group_id=1, token_ids=[5, 6, 7, 8])
    pool.evict_blocks(ids)
    pool.free_blocks(ids)
    assert pool.reset_prefix_cache()
    events = wire.from_pool_events(pool.take_events(), group_specs={1: ("sliding_window", 128)})
    stored, removed_a, removed_b, cleared = events
    assert isinstance(stored, wire.BlockStored) and isinstance(cleared, wire.AllBlocksCleared)
    assert stored.block_hashes == [wire.wire_hash(h) for h in hashes] == [
        int.from_bytes(h[-8:], "big") for h in hashes]
    assert (stored.token_ids, stored.block_size, stored.group_idx, stored.parent_block_hash) == ([5, 6, 7, 8], 2, 1, None)
    assert (stored.kv_cache_spec_kind, stored.kv_cache_spec_sliding_window, stored.medium) == ("sliding_window", 128, "GPU")
    assert stored.extra_keys == [None, None]  # vLLM sends one None per block, not nothing
    assert isinstance(removed_a, wire.BlockRemoved) and len(removed_a.block_hashes) == 1
    assert [removed_a.block_hashes[0], removed_b.block_hashes[0]] == stored.block_hashes
    payload = wire.encode_batch(events, 12.5, 0)
    assert msgspec.msgpack.decode(payload)[0] == 12.5
    with pytest.raises(TypeError):
        wire.from_pool_events([object()])
    with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
        wire.decode_batch(b"\x93\x01")


def random_pool_events(seed: int) -> tuple[kvpool.BlockPool, list[Any]]:
    """A pool's events from random caching, evictions and resets; also returns the pool."""
    rng = random.Random(seed)
    pool = kvpool.BlockPool(40, block_size=rng.choice([1, 4, 16]), enable_events=True)
    taken = []
    for _ in range(rng.randint(1, 12)):
        n = rng.randint(1, 5)
        if pool.get_num_free_blocks() < n:
            break
        ids = pool.get_new_blocks(n)
        hashes = [rng.getrandbits(256).to_bytes(32, "big") for _ in range(n)]
        k = rng.randint(1, n)
        lora = rng.choice([None, ("a", 3), ("adapter-name-longer-than-thirty-two-bytes", 9)])
        pool.cache_full_blocks(ids, hashes, 0, k, group_id=rng.randint(0, 2),
                               token_ids=[rng.randrange(-5, 300_000) for _ in range(k * pool.block_size)],
                               lora_id=None if lora is None else lora[1], lora_name=None if lora is None else lora[0])
        if rng.random() < 0.4:
            pool.evict_blocks(ids[:1])
        pool.free_blocks(ids)
        if rng.random() < 0.1:
            pool.reset_prefix_cache()
    return pool, taken


@pytest.mark.parametrize("seed", range(30))
def test_the_rust_encoder_writes_kvpool_wires_bytes(seed: int) -> None:
    """``take_events_msgpack`` (Rust) against ``kvpool.wire`` (checked against vLLM above)."""
    pool, _ = random_pool_events(seed)
    twin, _ = random_pool_events(seed)
    specs = {0: ("full_attention", None), 1: ("sliding_window", 128)}
    rank = [None, 0, 5][seed % 3]
    payload = pool.take_events_msgpack(7.25, data_parallel_rank=rank, group_specs=specs)
    assert payload == wire.encode_batch(wire.from_pool_events(twin.take_events(), group_specs=specs), 7.25, rank)


def test_take_events_msgpack_checks_its_arguments_and_empties_the_queue() -> None:
    pool, _ = random_pool_events(3)
    with pytest.raises(kvpool.DtypeError):
        pool.take_events_msgpack("now")  # type: ignore[arg-type]
    with pytest.raises(kvpool.DtypeError):
        pool.take_events_msgpack(1.0, group_specs={0: "full"})  # type: ignore[dict-item]
    assert pool.num_pending_events > 0
    assert wire.decode_batch(pool.take_events_msgpack(1.0)).events
    assert pool.num_pending_events == 0
    assert wire.decode_batch(pool.take_events_msgpack()).events == []
    m = kvpool.KVCacheManager(16, 4, enable_events=True)
    m.add_request("a", list(range(9)))
    m.allocate_slots("a", 9)
    assert len(wire.decode_batch(m.take_events_msgpack(0.0)).events) == 1


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
@pytest.mark.parametrize("manager_kind", ["KVCacheManager", "GroupManager"])
def test_extra_keys_encode_as_vllms_publisher_would(manager_kind: str) -> None:
    """Requests with multimodal inputs (one spanning blocks, two in one block), a cache salt,
    prompt embeddings and LoRA, through vLLM 0.33's manager and kvpool's: the Rust encoder's
    payload (``take_events_msgpack``) and ``kvpool.wire``'s are the bytes of vLLM's."""
    import hashlib

    import msgspec as ms
    import torch
    from vllm.distributed.kv_events import KVEventBatch
    from vllm.lora.request import LoRARequest
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.utils import tensor_data
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request

    init_none_hash(sha256)
    spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1, dtype=torch.float32)
    config = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l"], spec)])
    theirs = KVCacheManager(config, max_model_len=1000, scheduler_block_size=4, hash_block_size=4,
                            enable_kv_cache_events=True)
    def make() -> Any:
        if manager_kind == "KVCacheManager":
            return kvpool.KVCacheManager(64, 4, hash_algo="sha256", enable_events=True)
        return kvpool.GroupManager(64, 4, ["full"], hash_algo="sha256", enable_events=True)

    ours, ours_py = make(), make()
    cases: list[dict[str, Any]] = [
        {"cache_salt": "tenant-1"},
        {"mm": [("img-a", 2, 7)]},                                   # spans blocks 0-2
        {"mm": [("img-a", 1, 2), ("img-b", 3, 2), ("img-c", 9, 3)], "cache_salt": "s", "lora": True},
        {"embeds": True},
        {"embeds": True, "cache_salt": "t"},
    ]
    for i, case in enumerate(cases):
        prompt = [i * 100 + t for t in range(14)]
        params = SamplingParams(max_tokens=5)
        params.update_from_generation_config({}, eos_token_id=100_000)
        mm = [MultiModalFeatureSpec(data=None, modality="image", identifier=name,
                                    mm_position=PlaceholderRange(offset=off, length=n))
              for name, off, n in case.get("mm", [])]
        embeds = torch.arange(14 * 3, dtype=torch.float32).reshape(14, 3) + i if case.get("embeds") else None
        lora = LoRARequest("adapter", 7, "/x") if case.get("lora") else None
        req = Request(request_id=f"r{i}", prompt_token_ids=prompt, mm_features=mm or None, sampling_params=params,
                      pooling_params=None, lora_request=lora, cache_salt=case.get("cache_salt"),
                      prompt_embeds=embeds, block_hasher=get_request_block_hasher(4, sha256))
        theirs.allocate_slots(req, 14)
        theirs.free(req)
        digests = None if embeds is None else [hashlib.sha256(tensor_data(embeds[b * 4:(b + 1) * 4])).digest()
                                               for b in range(3)]
        for m in (ours, ours_py):
            m.add_request(f"r{i}", prompt, cache_salt=case.get("cache_salt"),
                          mm_features=[(name, off, n) for name, off, n in case.get("mm", [])] or None,
                          prompt_embed_digests=digests, lora=("adapter", "/x") if lora else None,
                          lora_id=7 if lora else None)
            m.allocate_slots(f"r{i}", 14)
            m.free(f"r{i}")
    vllm_events = theirs.take_events()
    assert any(e.extra_keys and any(k and len(k) > 1 for k in e.extra_keys) for e in vllm_events
               if hasattr(e, "extra_keys"))
    expected = ms.msgpack.Encoder().encode(KVEventBatch(ts=3.0, events=vllm_events, data_parallel_rank=0))
    specs = {0: ("full_attention", None)}
    assert ours.take_events_msgpack(3.0, data_parallel_rank=0, group_specs=specs) == expected
    assert wire.encode_batch(wire.from_pool_events(ours_py.take_events(), group_specs=specs), 3.0, 0) == expected


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_a_block_stored_of_no_hashes_is_vllms_bytes() -> None:
    """Caching only null blocks stores no hash; vLLM's event then has ``extra_keys=None``, which
    its encoder leaves out (a field at its default), and so must both of kvpool's encoders."""
    import numpy as np
    from vllm.distributed.kv_events import KVEventBatch
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    params = SamplingParams(max_tokens=10)
    params.update_from_generation_config({}, eos_token_id=100000)
    request = Request(request_id="a", prompt_token_ids=list(range(32)), mm_features=None, sampling_params=params,
                      pooling_params=None, lora_request=None, cache_salt=None,
                      block_hasher=get_request_block_hasher(16, sha256))
    theirs = BlockPool(8, True, 16, enable_kv_cache_events=True)
    theirs.cache_full_blocks(request, [theirs.null_block, theirs.null_block], 0, 2, 16, 0)
    expected = msgspec.msgpack.Encoder().encode(KVEventBatch(ts=1.0, events=theirs.take_events()))
    pool = kvpool.BlockPool(8, block_size=16, enable_events=True)

    def cache_null_blocks() -> None:
        pool.cache_full_blocks(np.zeros(2, np.int32), list(request.block_hashes), 0, 2, token_ids=list(range(32)))

    cache_null_blocks()
    assert pool.take_events_msgpack(1.0) == expected
    cache_null_blocks()
    assert wire.encode_batch(wire.from_pool_events(pool.take_events()), 1.0) == expected


def test_a_long_spec_kind_costs_only_the_events_that_name_it() -> None:
    """The encoder's size estimate counts a group's spec once per ``BlockStored`` of that group:
    20,000 removals beside a 5 MB spec kind are a small payload, not a failed allocation."""
    n = 20_000
    pool = kvpool.BlockPool(n + 1, block_size=1, enable_events=True)
    hashes = kvpool.BlockHasher(1).hash_tokens(list(range(n)))
    blocks = pool.get_new_blocks(n)
    pool.cache_full_blocks(blocks, hashes, 0, n)
    pool.free_blocks(blocks)
    pool.evict_blocks(blocks)
    out = pool.take_events_msgpack(1.0, group_specs={7: ("x" * 5_000_000, None)})
    assert len(out) < 2_000_000
