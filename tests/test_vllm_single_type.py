"""``kvpool.vllm.single_type`` (vLLM's ``BlockPool`` and per-type managers on kvpool) against
vLLM 0.33's own classes, step by step, and its checks.

Each random workload drives one manager of each side with the same calls, as vLLM's
coordinator does: a new request looks up its prefix hit (``find_longest_cache_hit``), counts
the blocks it needs (with and without the admission cap), adds the hit, allocates blocks for
tokens a connector computed now and then, allocates new blocks and caches them; a running request
decodes (gives back out-of-window blocks, counts, allocates, caches); finished requests are
freed or popped and freed by hand. After every call, every result and the state must be
equal: hits, counts, new block ids, each request's table and cached-block count, the free
count and the free queue's order. A quarter of the workloads run without prefix caching. vLLM's ``test_single_type_kv_cache_manager.py`` itself runs
on these classes in ``tests/test_vllm.py``.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

import kvpool  # noqa: E402

SPECS = [("full", None), ("sliding_window", 5), ("sliding_window", 16), ("chunked_local", 8)]


def vllm_spec(kind: str, n: int | None, block_size: int) -> Any:
    from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec, FullAttentionSpec, SlidingWindowSpec

    common = dict(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
    if kind == "full":
        return FullAttentionSpec(**common)
    if kind == "sliding_window":
        return SlidingWindowSpec(**common, sliding_window=n)
    return ChunkedLocalAttentionSpec(**common, attention_chunk_size=n)


def build(kind: str, n: int | None, block_size: int, num_blocks: int, kvpool_side: bool, caching: bool = True,
          cap: int = 10**9, group_id: int = 0, scheduler_block_size: int | None = None) -> tuple[Any, Any]:
    """A block pool and a manager of one side (of KV-cache group ``group_id``)."""
    if kvpool_side:
        from kvpool.vllm import single_type as classes
        from kvpool.vllm.single_type import BlockPool
    else:
        import vllm.v1.core.single_type_kv_cache_manager as classes
        from vllm.v1.core.block_pool import BlockPool
    spec = vllm_spec(kind, n, block_size)
    manager_class = {"full": classes.FullAttentionManager, "sliding_window": classes.SlidingWindowManager,
                     "chunked_local": classes.ChunkedLocalAttentionManager}[kind]
    pool = BlockPool(num_gpu_blocks=num_blocks, enable_caching=caching, hash_block_size=block_size)
    manager = manager_class(spec, block_pool=pool, enable_caching=caching, kv_cache_group_id=group_id,
                            scheduler_block_size=scheduler_block_size or block_size,
                            max_admission_blocks_per_request=cap)
    return pool, manager


def make_request(request_id: str, tokens: list[int], block_size: int) -> Any:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    return Request(request_id=request_id, prompt_token_ids=list(tokens),
                   sampling_params=SamplingParams(max_tokens=64), pooling_params=None,
                   block_hasher=get_request_block_hasher(block_size, sha256))


def ids(blocks: Any) -> list[int]:
    return [b.block_id for b in blocks]


class Sides:
    """The two sides, called alike; every call's results compared."""

    def __init__(self, kind: str, n: int | None, block_size: int, num_blocks: int, caching: bool, cap: int,
                 group_id: int = 0, scheduler_block_size: int | None = None) -> None:
        self.sides = [build(kind, n, block_size, num_blocks, kvpool_side, caching, cap, group_id,
                            scheduler_block_size) for kvpool_side in (False, True)]
        self.spec = vllm_spec(kind, n, block_size)
        self.block_size = block_size
        self.cls = [type(m) for _, m in self.sides]

    def same(self, what: str, f: Any) -> Any:
        a, b = (f(pool, manager) for pool, manager in self.sides)
        assert a == b, f"{what}: vLLM {a!r}, kvpool {b!r}"
        return a

    def state(self, requests: dict[str, Any]) -> None:
        self.same("free blocks", lambda p, m: p.get_num_free_blocks())
        self.same("free queue", lambda p, m: ids(p.free_block_queue.get_all_free_blocks()))
        for rid in requests:
            self.same(f"table of {rid}", lambda p, m: ids(m.req_to_blocks[rid]) if rid in m.req_to_blocks else None)
            self.same(f"cached blocks of {rid}", lambda p, m: m.num_cached_block.get(rid))


def run_workload(seed: int, kind: str, n: int | None) -> tuple[int, int]:
    """One workload: the steps taken and the hit tokens found."""
    rng = random.Random(seed)
    block_size = rng.choice([2, 4])
    # Every fourth workload runs without prefix caching; caps on what a request holds are
    # checked where the scheduler applies them (admission).
    caching = seed % 4 != 3
    # The manager is one group of a model: its group id is the key's, and the model's
    # scheduler block size may be a multiple of the group's block size.
    group_id = rng.choice([0, 0, 1, 3])
    scheduler_block_size = block_size * rng.choice([1, 1, 2, 4])
    sides = Sides(kind, n, block_size, rng.randint(12, 48), caching, rng.choice([2, 5, 10**9]), group_id,
                  scheduler_block_size)
    prefixes = [[rng.randrange(50) for _ in range(rng.randint(0, 20))] for _ in range(3)]
    running: dict[str, Any] = {}
    steps = hit_tokens = 0
    for step in range(60):
        op = rng.random()
        if op < 0.35 or not running:
            rid = f"r{step}"
            tokens = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randint(1, 24))]
            request = make_request(rid, tokens, block_size)
            num_tokens = len(tokens)
            hits_of: dict[int, list[Any]] = {id(m): [] for _, m in sides.sides}
            local = 0
            if caching:
                # vLLM's manager leaves the last token to compute.
                hit = sides.same("hit", lambda p, m: (lambda r: ([ids(g) for g in r[0]], r[1]))(
                    type(m).find_longest_cache_hit(request.block_hashes, num_tokens - 1, [group_id], p,
                                                   sides.spec, False, block_size)))
                hits_of = {id(m): type(m).find_longest_cache_hit(request.block_hashes, num_tokens - 1, [group_id],
                                                                 p, sides.spec, False, block_size)[0][0]
                           for p, m in sides.sides}
                local = hit[1]
                hit_tokens += local
            # Tokens a KV connector computed past the local hit, now and then.
            external = rng.randint(1, num_tokens - 1 - local) if rng.random() < 0.3 and num_tokens - 1 > local else 0
            computed = local + external
            sides.same("blocks to admit", lambda p, m: m.get_num_blocks_to_allocate(
                rid, num_tokens, hits_of[id(m)], computed, local, num_tokens, apply_admission_cap=True))
            need = sides.same("blocks to allocate", lambda p, m: m.get_num_blocks_to_allocate(
                rid, num_tokens, hits_of[id(m)], computed, local, num_tokens))
            if need > sides.sides[0][0].get_num_free_blocks():
                continue
            sides.same("add hit", lambda p, m: m.add_local_computed_blocks(rid, hits_of[id(m)], local, external))
            sides.same("external blocks", lambda p, m: m.allocate_external_computed_blocks(rid, local, external))
            sides.same("new blocks", lambda p, m: ids(m.allocate_new_blocks(rid, num_tokens, num_tokens)))
            if caching:
                sides.same("cache", lambda p, m: m.cache_blocks(request, num_tokens, replay_boundaries=(0,)))
            request.num_computed_tokens = num_tokens
            running[rid] = request
        elif op < 0.75:
            rid = rng.choice(list(running))
            request = running[rid]
            computed = request.num_computed_tokens
            sides.same("skip", lambda p, m: m.remove_skipped_blocks(rid, computed))
            request.append_output_token_ids(rng.randrange(50))
            num_tokens = request.num_tokens
            need = sides.same("blocks to allocate", lambda p, m: m.get_num_blocks_to_allocate(
                rid, num_tokens, [], computed, 0, num_tokens))
            if need > sides.sides[0][0].get_num_free_blocks():
                continue
            sides.same("new blocks", lambda p, m: ids(m.allocate_new_blocks(rid, num_tokens, num_tokens)))
            if caching:
                sides.same("cache", lambda p, m: m.cache_blocks(request, num_tokens, replay_boundaries=(0,)))
            request.num_computed_tokens = num_tokens
        else:
            rid = rng.choice(list(running))
            del running[rid]
            if rng.random() < 0.5:
                sides.same("free", lambda p, m: m.free(rid))
            else:
                # The scheduler's batched free: pop, then free tail first.
                popped = sides.same("pop", lambda p, m: ids(m.pop_blocks_for_free(rid)))
                assert popped is not None
                for p, _ in sides.sides:
                    p.free_blocks([p.blocks[i] for i in reversed(popped)])
        sides.state(running)
        steps += 1
    return steps, hit_tokens


@pytest.mark.parametrize("kind,n", SPECS, ids=[f"{k}-{n}" for k, n in SPECS])
def test_per_type_managers_match_vllm_step_by_step(kind: str, n: int | None) -> None:
    runs = [run_workload(seed, kind, n) for seed in range(12)]
    assert sum(steps for steps, _ in runs) > 300
    # The workloads reach prefix hits (shared prefixes of up to 20 tokens).
    assert sum(hits for _, hits in runs) > 100


@pytest.fixture
def manager() -> Any:
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    from kvpool.vllm.single_type import BlockPool, SlidingWindowManager

    spec = SlidingWindowSpec(block_size=2, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=4)
    pool = BlockPool(num_gpu_blocks=10, enable_caching=True, hash_block_size=2)
    return SlidingWindowManager(spec, block_pool=pool, enable_caching=True, kv_cache_group_id=0,
                                scheduler_block_size=2)


def test_bad_calls_raise_and_change_nothing(manager: Any) -> None:
    pool = manager.block_pool
    manager.allocate_new_blocks("r", 4, 4)
    before = (pool.get_num_free_blocks(), ids(manager.req_to_blocks["r"]))
    with pytest.raises(kvpool.NoFreeBlocksError):
        manager.allocate_new_blocks("r", 100, 100)
    with pytest.raises(kvpool.NoFreeBlocksError):
        manager.allocate_new_blocks("fresh", 100, 100)
    assert "fresh" not in manager.req_to_blocks
    with pytest.raises(kvpool.InvalidArgumentError, match="without blocks"):
        manager.add_local_computed_blocks("r", [pool.blocks[5]], 2, 0)
    with pytest.raises(kvpool.InvalidBlockIdError):
        manager.req_to_blocks["other"] = [pool.blocks[5], type("B", (), {"block_id": 99})()]
    with pytest.raises(kvpool.InvalidArgumentError, match="twice"):
        manager.req_to_blocks["other"] = [pool.blocks[5], pool.blocks[5]]
    with pytest.raises(kvpool.InvalidArgumentError, match="block boundary"):
        manager.get_num_blocks_to_allocate("new", 8, [pool.blocks[5]], 3, 3, 8)
    with pytest.raises(kvpool.KVPoolError):
        manager.allocate_new_blocks("r", -1, -1)
    assert (pool.get_num_free_blocks(), ids(manager.req_to_blocks["r"])) == before
    assert "other" not in manager.req_to_blocks


def test_an_assigned_table_takes_free_blocks_and_is_kept_up_to_date(manager: Any) -> None:
    pool = manager.block_pool
    held = pool.get_new_blocks(1)
    table = [pool.null_block, held[0], pool.blocks[7], pool.blocks[8]]
    free = pool.get_num_free_blocks()
    manager.req_to_blocks["r"] = table
    # The free blocks 7 and 8 are taken; the held one keeps its single reference.
    assert [b.ref_cnt for b in table[1:]] == [1, 1, 1]
    assert pool.get_num_free_blocks() == free - 2
    # Seven tokens computed: the window of 4 skips tokens 0-3, blocks 0 and 1.
    manager.remove_skipped_blocks("r", 7)
    assert manager.req_to_blocks["r"] is table
    assert ids(table) == [0, 0, 7, 8]
    assert held[0].ref_cnt == 0
    with pytest.raises(kvpool.InvalidArgumentError, match="has a table already"):
        manager.req_to_blocks["r"] = [pool.blocks[6]]
    # Block 7's one reference is the table's: no other table can be handed it.
    with pytest.raises(kvpool.InvalidArgumentError, match="caller holds none"):
        manager.req_to_blocks["s"] = [pool.blocks[7]]
    manager.free("r")
    assert "r" not in manager.req_to_blocks
    assert pool.get_num_free_blocks() == 9


def test_uncovered_specs_are_refused() -> None:
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    from kvpool.vllm.single_type import BlockPool, FullAttentionManager, SlidingWindowManager

    pool = BlockPool(num_gpu_blocks=10, enable_caching=True, hash_block_size=2)
    spec = SlidingWindowSpec(block_size=2, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=4)
    with pytest.raises(kvpool.InvalidArgumentError, match="SlidingWindowSpec"):
        FullAttentionManager(spec, block_pool=pool, enable_caching=True, kv_cache_group_id=0, scheduler_block_size=2)
    full = FullAttentionSpec(block_size=2, num_kv_heads=1, head_size=1, dtype=torch.float32)
    with pytest.raises(kvpool.InvalidArgumentError, match="context parallelism"):
        FullAttentionManager(full, block_pool=pool, enable_caching=True, kv_cache_group_id=0,
                             scheduler_block_size=2, dcp_world_size=2)
    with pytest.raises(kvpool.InvalidArgumentError, match="events"):
        BlockPool(num_gpu_blocks=10, enable_caching=True, hash_block_size=2, enable_kv_cache_events=True)
    with pytest.raises(kvpool.InvalidArgumentError, match="EAGLE"):
        SlidingWindowManager.find_longest_cache_hit([b"x"], 4, [0], pool, spec, True, 2)


def test_a_refused_insert_leaves_the_free_queue_as_it_was(manager: Any) -> None:
    from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

    pool = manager.block_pool
    cached = pool.cached_block_hash_to_block
    cached.insert(make_block_hash_with_group_id(b"a" * 32, 0), pool.blocks[2])
    queue = ids(pool.free_block_queue.get_all_free_blocks())
    with pytest.raises(kvpool.BlockStateError, match="already holds"):
        cached.insert(make_block_hash_with_group_id(b"b" * 32, 0), pool.blocks[2])
    with pytest.raises(kvpool.BlockStateError, match="null block"):
        cached.insert(make_block_hash_with_group_id(b"c" * 32, 0), pool.null_block)
    assert ids(pool.free_block_queue.get_all_free_blocks()) == queue


def test_a_table_is_not_handed_blocks_another_managers_table_holds() -> None:
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from kvpool.vllm.single_type import BlockPool, FullAttentionManager

    pool = BlockPool(num_gpu_blocks=10, enable_caching=True, hash_block_size=2)
    spec = FullAttentionSpec(block_size=2, num_kv_heads=1, head_size=1, dtype=torch.float32)
    m0, m1 = (FullAttentionManager(spec, block_pool=pool, enable_caching=True, kv_cache_group_id=g,
                                   scheduler_block_size=2) for g in (0, 1))
    blocks = m0.allocate_new_blocks("r", 4, 4)
    free = pool.get_num_free_blocks()
    with pytest.raises(kvpool.InvalidArgumentError, match="group 0"):
        m1.req_to_blocks["s"] = blocks
    assert "s" not in m1.req_to_blocks and pool.get_num_free_blocks() == free
    m0.free("r")
    assert pool.get_num_free_blocks() == 9


def test_full_attention_refuses_partial_block_hits() -> None:
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from kvpool.vllm.single_type import BlockPool, FullAttentionManager

    pool = BlockPool(num_gpu_blocks=10, enable_caching=True, hash_block_size=2)
    spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1, dtype=torch.float32)
    with pytest.raises(kvpool.InvalidArgumentError, match="fine-grained"):
        FullAttentionManager.find_longest_cache_hit([b"x" * 32] * 3, 6, [0], pool, spec, False, 2)


def test_req_to_blocks_is_a_mapping_of_the_ids_given(manager: Any) -> None:
    manager.allocate_new_blocks(7, 4, 4)
    manager.allocate_new_blocks("r", 2, 2)
    table = manager.req_to_blocks
    assert dict(table.items()).keys() == {7, "r"}
    assert None not in table and 1.5 not in table and 7 in table
    manager.free(7)
    manager.free("r")
