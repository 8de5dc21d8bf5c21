"""What vLLM 0.33's offloading connectors read from the GPU block pool, against vLLM's own
manager on the same random serving steps: each block's ``block_hash_num_tokens`` (its end in
its chain) and ``block_hash``, the pool's ``cached_block_hashes_by_block`` (partial-block
entries of groups whose blocks are larger than the hash granularity), and the free queue
walked from a cursor with ``iter_blocks_after`` (the ``SimpleCPUOffloadConnector``'s lazy
mode)."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from vllm_requests import make_request  # noqa: E402


def full(block_size: int) -> Any:
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    return FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)


LAYOUTS = {
    # one group, hashes at the block size
    "one group": ([full(16)], 16, 16),
    # blocks of 32 tokens over hashes of 16: a prompt's last block also gets a partial entry
    "partial entries": ([full(16), full(32)], 32, 16),
}


def managers(layout: str, num_blocks: int) -> list[Any]:
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    import kvpool.vllm

    specs, scheduler_block_size, hash_block_size = LAYOUTS[layout]
    config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)])
    return [cls(config, max_model_len=4096, scheduler_block_size=scheduler_block_size,
                hash_block_size=hash_block_size, enable_caching=True)
            for cls in (KVCacheManager, kvpool.vllm.KVCacheManager)]


def observe(manager: Any, rng: random.Random) -> dict[str, Any]:
    """Everything a connector reads, with cursors chosen by ``rng`` (the same draws for both
    managers: the caller seeds it alike)."""
    pool = manager.block_pool
    queue = pool.free_block_queue
    order = [b.block_id for b in queue.get_all_free_blocks()]
    cursors = [None, *rng.sample(order, min(3, len(order)))]
    walks = {}
    for cursor in cursors:
        view = None if cursor is None else pool.blocks[cursor]
        walks[cursor] = (
            [b.block_id for b in queue.iter_blocks_after(view)],
            [b.block_id for b in itertools.islice(queue.iter_blocks_after(view), 5)],
        )
    in_use = [b for b in range(1, pool.num_gpu_blocks) if pool.blocks[b].ref_cnt > 0][:1]
    walks.update({b: [x.block_id for x in queue.iter_blocks_after(pool.blocks[b])] for b in in_use})
    blocks = [(b.block_hash, b.block_hash_num_tokens) for b in (pool.blocks[i] for i in range(pool.num_gpu_blocks))]
    extra = {block_id: set(keys) for block_id, keys in pool.cached_block_hashes_by_block.items() if keys}
    # The list's ends, as code walking vLLM's linked list from either end reads them.
    last = queue.fake_free_list_tail.prev_free_block
    first = queue.fake_free_list_head.next_free_block
    ends = ("head" if last is queue.fake_free_list_head else last.block_id,
            "tail" if first is queue.fake_free_list_tail else first.block_id)
    return {"order": order, "walks": walks, "blocks": blocks, "extra": extra, "ends": ends}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("seed", range(4))
def test_connector_reads_match_vllm_on_random_steps(layout: str, seed: int) -> None:
    sides = managers(layout, num_blocks=48)
    script = random.Random(seed)
    # Prompts share prefixes so that hits, partial entries and evictions all happen.
    stems = [[script.randrange(1000) for _ in range(script.randrange(8, 90))] for _ in range(4)]
    live: list[tuple[str, int]] = []
    history = []
    for step in range(40):
        action = script.random()
        if live and (action < 0.4 or len(live) > 3):
            request_id, _ = live.pop(script.randrange(len(live)))
            ops: tuple[Any, ...] = ("free", request_id)
        else:
            stem = script.choice(stems)
            tail = [script.randrange(1000) for _ in range(script.randrange(0, 40))]
            tokens = stem[:script.randrange(1, len(stem) + 1)] + tail
            request_id = f"r{step}"
            live.append((request_id, len(tokens)))
            ops = ("serve", request_id, tokens)
        seen = []
        for manager in sides:
            if ops[0] == "free":
                manager.free(manager_requests(manager)[ops[1]])
            else:
                req = make_request(ops[1], ops[2], 16, max_tokens=64)
                manager_requests(manager)[ops[1]] = req
                blocks, n = manager.get_computed_blocks(req)[:2]
                ok = manager.allocate_slots(req, req.num_tokens - n, n, blocks) is not None
                seen.append(ok)
            seen.append(observe(manager, random.Random(seed * 1000 + step)))
        history.append(ops[:2])
        half = len(seen) // 2
        assert seen[half:] == seen[:half], f"after {history}"


def manager_requests(manager: Any) -> dict[str, Any]:
    """The requests served by ``manager``, kept beside it (a request is mutated by the manager
    that serves it, so each side has its own)."""
    if not hasattr(manager, "_test_requests"):
        manager._test_requests = {}
    return manager._test_requests  # type: ignore[no-any-return]


def test_a_walk_continues_after_the_last_block_read() -> None:
    """A walk read in batches continues after the block it last yielded, wherever the queue's
    other blocks went meanwhile, as vLLM's linked list does."""
    sides = managers("one group", num_blocks=128)
    seen = []
    for manager in sides:
        reqs = [make_request(f"r{i}", [i * 1000 + t for t in range(64)], 16) for i in range(20)]
        for r in reqs:
            manager.allocate_slots(r, r.num_tokens)
        for r in reqs:
            manager.free(r)
        walk = manager.block_pool.free_block_queue.iter_blocks_after(None)
        first = [next(walk).block_id for _ in range(30)]
        # Take a block the walk has not reached yet out of the queue, then go on.
        hit = make_request("again", [19 * 1000 + t for t in range(64)], 16)
        blocks, n = manager.get_computed_blocks(hit)[:2]
        manager.allocate_slots(hit, hit.num_tokens - n, n, blocks)
        seen.append((first, [b.block_id for b in walk], n))
    assert seen[1] == seen[0]
    assert seen[0][2] == 48


def test_a_key_popped_from_the_cache_dict_and_put_back_keeps_its_token_count() -> None:
    """vLLM's tests fake an eviction by popping a key from ``cached_block_hash_to_block._cache``
    and undo it by assigning the block back; vLLM's block keeps its fields meanwhile, so the
    block read after the undo has the token count it had before."""
    seen = []
    for manager in managers("one group", num_blocks=32):
        req = make_request("r", list(range(64)), 16)
        manager.allocate_slots(req, req.num_tokens)
        manager.free(req)
        pool = manager.block_pool
        block = next(b for b in pool.blocks if b.block_hash is not None and b.block_hash_num_tokens == 32)
        key = block.block_hash
        before = (block.block_id, block.block_hash_num_tokens)
        popped = pool.cached_block_hash_to_block._cache.pop(key)
        pool.cached_block_hash_to_block._cache[key] = popped
        block = pool.blocks[before[0]]
        seen.append((before, block.block_hash == key, block.block_hash_num_tokens))
    assert seen[1] == seen[0]
    assert seen[0][1:] == (True, 32)
