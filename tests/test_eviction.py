"""Eviction policies, retention priorities and pins: the behaviour each one promises.

Every test runs on the Rust pool and on the plain-Python reference (the state machines in
``test_pool_state_machine.py`` and ``test_manager_state_machine.py`` compare the two step by
step under every policy; these tests pin down what the policies are for).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kvpool
import kvpool.reference
from kvpool import BlockStateError, DoubleFreeError, DtypeError, InvalidArgumentError, PinBudgetError

POOLS = [pytest.param(kvpool.BlockPool, id="rust"), pytest.param(kvpool.reference.BlockPool, id="reference")]
MANAGERS = [pytest.param(kvpool.KVCacheManager, id="rust"), pytest.param(kvpool.reference.KVCacheManager, id="reference")]


def keys(*ids: int) -> list[bytes]:
    """Hash ids as 8-byte big-endian hashes (what a uint64 id stands for in the Rust pool)."""
    return [i.to_bytes(8, "big") for i in ids]


def serve(pool: Any, chain: list[int], **cache_kwargs: Any) -> list[int]:
    """One request: hit the cached prefix of ``chain``, allocate the rest, cache all, free tail first."""
    hashes = keys(*chain)
    hit = pool.find_longest_cache_hit(hashes).tolist()
    pool.touch(hit)
    new = pool.get_new_blocks(len(chain) - len(hit)).tolist()
    blocks = hit + new
    pool.cache_full_blocks(blocks, hashes, len(hit), len(chain), **cache_kwargs)
    pool.free_blocks(blocks, reverse=True)
    return blocks


def cached(pool: Any, chain: list[int]) -> int:
    """How many blocks of ``chain``'s prefix are cached."""
    return len(pool.find_longest_cache_hit(keys(*chain)))


# ------------------------------------------------------------------ construction and arguments


@pytest.mark.parametrize("pool_cls", POOLS)
def test_policy_names_and_defaults(pool_cls: Any) -> None:
    pool = pool_cls(16)
    assert (pool.eviction, pool.clock, pool.max_pinned_blocks) == ("lru", "monotonic", 4)
    for name in ("lru", "priority", "adaptive"):
        assert pool_cls(16, eviction=name).eviction == name
    with pytest.raises(InvalidArgumentError, match="unknown eviction policy 'lfu'"):
        pool_cls(16, eviction="lfu")
    with pytest.raises(DtypeError):
        pool_cls(16, eviction=3)
    with pytest.raises(InvalidArgumentError, match="clock"):
        pool_cls(16, clock="wall")
    with pytest.raises(InvalidArgumentError):
        pool_cls(16, max_pinned_blocks=17)


@pytest.mark.parametrize("pool_cls", POOLS)
def test_priority_arguments_are_checked_before_any_change(pool_cls: Any) -> None:
    lru = pool_cls(8)
    ids = lru.get_new_blocks(2)
    with pytest.raises(InvalidArgumentError, match="eviction='priority'"):
        lru.cache_full_blocks(ids, keys(1, 2), 0, 2, priority=90)
    assert lru.get_num_cached_blocks() == 0
    pool = pool_cls(8, eviction="priority", clock="manual")
    ids = pool.get_new_blocks(2)
    for bad in ({"priority": 101}, {"priority": -1}, {"retention_s": 5.0}, {"priority": 50, "retention_s": 0},
                {"priority": 50, "retention_s": float("nan")}):
        with pytest.raises(InvalidArgumentError):
            pool.cache_full_blocks(ids, keys(1, 2), 0, 2, **bad)
    with pytest.raises(DtypeError):
        pool.cache_full_blocks(ids, keys(1, 2), 0, 2, priority=50, retention_s="5")
    assert pool.get_num_cached_blocks() == 0
    with pytest.raises(InvalidArgumentError, match="clock='manual'"):
        pool_cls(8).advance_clock(1.0)
    with pytest.raises(InvalidArgumentError):
        pool.advance_clock(-1.0)
    # An int past a float's range is as infinite as inf; a clock never reaches inf.
    with pytest.raises(InvalidArgumentError, match="finite"):
        pool.cache_full_blocks(ids, keys(1, 2), 0, 2, priority=50, retention_s=10**400)
    with pytest.raises(InvalidArgumentError, match="finite"):
        pool.advance_clock(10**400)
    pool.advance_clock(1.5e308)
    with pytest.raises(InvalidArgumentError, match="largest time"):
        pool.advance_clock(1.5e308)
    assert pool.now == 1.5e308
    assert pool.get_num_cached_blocks() == 0


@pytest.mark.parametrize("manager_cls", MANAGERS)
def test_a_manager_shows_the_free_queue_its_next_allocation_takes(manager_cls: Any) -> None:
    """Reading the free queue moves blocks whose retention ran out, as the pool's does; the
    next allocation then evicts the same blocks in both implementations."""
    manager = manager_cls(16, 4, eviction="priority", clock="manual")

    def run(rid: str, base: int, n: int = 9, free: bool = True, **kwargs: Any) -> list[int]:
        tokens = list(range(base, base + n))
        manager.add_request(rid, tokens, **kwargs)
        hits, k = manager.get_computed_blocks(rid)
        new = manager.allocate_slots(rid, n - k, num_new_computed_tokens=k, new_computed_blocks=hits)
        if free:
            manager.free(rid)
        return [int(b) for b in new]

    run("r1", 100, priority=80, retention_s=5)
    run("r2", 200)
    run("r3", 300, priority=50)
    manager.advance_clock(10)
    # r1's blocks (1, 2) ran out of their priority: they now go before r3's (5, 6).
    assert manager.free_block_ids().tolist()[-6:] == [4, 3, 2, 1, 6, 5]
    run("r4", 400)
    assert run("r5", 1000, n=40, free=False) == [9, 10, 11, 12, 13, 14, 15, 4, 3, 2]
    assert manager.free_block_ids().tolist() == [1, 8, 7, 6, 5]


# ------------------------------------------------------------------ retention priorities


@pytest.mark.parametrize("pool_cls", POOLS)
def test_high_priority_outlives_low_priority_then_reverts(pool_cls: Any) -> None:
    pool = pool_cls(9, eviction="priority", clock="manual")  # 8 usable blocks
    serve(pool, [100, 101], priority=90, retention_s=10.0)  # kept for 10 s
    for i in range(20):  # churn of default-priority requests, 6 blocks each
        serve(pool, [1000 + 10 * i + j for j in range(6)])
        assert cached(pool, [100, 101]) == 2, f"evicted by churn round {i}"
    blocks = pool.find_longest_cache_hit(keys(100, 101)).tolist()
    assert pool.block_priority(blocks[0]) == (90, 10.0)
    pool.advance_clock(10.0)  # the priority ran out: back to the default, LRU among the rest
    assert pool.block_priority(blocks[0]) == (35, None)
    serve(pool, [5000 + j for j in range(6)])
    serve(pool, [6000 + j for j in range(6)])
    assert cached(pool, [100, 101]) == 0
    pool.check_invariants()


@pytest.mark.parametrize("pool_cls", POOLS)
def test_a_duration_that_ran_out_is_no_longer_reported(pool_cls: Any) -> None:
    pool = pool_cls(5, eviction="priority", clock="manual")
    blocks = serve(pool, [1, 2], priority=35, retention_s=1.0)
    assert pool.block_priority(blocks[0]) == (35, 1.0)
    pool.advance_clock(5.0)
    assert pool.block_priority(blocks[0]) == (35, None)


@pytest.mark.parametrize("pool_cls", POOLS)
def test_lowest_priority_goes_first_lru_within(pool_cls: Any) -> None:
    pool = pool_cls(7, eviction="priority", clock="manual")
    low = serve(pool, [1, 2], priority=10)
    mid = serve(pool, [3, 4])
    high = serve(pool, [5, 6], priority=80)
    # Fresh blocks go first, then priority 10 (tail first), the default, then 80.
    assert pool.free_block_ids().tolist() == [low[1], low[0], mid[1], mid[0], high[1], high[0]]
    pool.set_priority(mid, 5)  # requeued at their new priority's tail, in the order given
    assert pool.free_block_ids().tolist()[:2] == [mid[0], mid[1]]
    pool.check_invariants()


@pytest.mark.parametrize("peek", [False, True])
@pytest.mark.parametrize("pool_cls", POOLS)
def test_a_block_whose_priority_ran_out_queues_ahead_of_later_frees(pool_cls: Any, peek: bool) -> None:
    """A's priority (90) runs out at t=5; B is freed at t=5.5 at the default priority. A ran
    out first, so it goes first, whether or not ``free_block_ids()`` was read in between
    (the expiry was applied lazily: without the read B went first, with it A)."""
    pool = pool_cls(3, null_block=False, eviction="priority", clock="manual")
    a, b, c = (pool.get_new_blocks(1) for _ in range(3))
    pool.cache_full_blocks(a, keys(1), 0, 1, priority=90, retention_s=5.0)
    pool.cache_full_blocks(b, keys(2), 0, 1)
    pool.free_blocks(a)
    pool.advance_clock(5.5)
    if peek:
        assert pool.free_block_ids().tolist() == [int(a[0])]
    pool.free_blocks(b)
    pool.free_blocks(c)  # uncached: the head
    assert pool.free_block_ids().tolist() == [int(c[0]), int(a[0]), int(b[0])]
    assert pool.get_new_blocks(2).tolist() == [int(c[0]), int(a[0])]
    pool.check_invariants()


@pytest.mark.parametrize("policy", ["lru", "priority", "adaptive"])
@pytest.mark.parametrize("pool_cls", POOLS)
def test_a_free_block_whose_hash_is_evicted_is_reused_before_cached_ones(pool_cls: Any, policy: str) -> None:
    """``evict_blocks`` on a free block: under LRU it keeps its place (vLLM's order); under
    the other policies it joins the uncached blocks at the head (it kept its class, so a
    still-cached block was evicted before it)."""
    pool = pool_cls(3, null_block=False, eviction=policy, clock="manual")
    x, y, z = (pool.get_new_blocks(1) for _ in range(3))
    pool.cache_full_blocks(x, keys(1), 0, 1, **({"priority": 90} if policy == "priority" else {}))
    if policy == "adaptive":  # two requests used X: the reused band
        pool.touch(x)
        pool.free_blocks(x)
    pool.cache_full_blocks(y, keys(2), 0, 1)
    for ids in (x, y, z):
        pool.free_blocks(ids)
    pool.evict_blocks(x)
    taken = pool.get_new_blocks(2).tolist()
    if policy == "lru":
        assert taken == [int(z[0]), int(x[0])]  # z at the head, then the queue: x before y
    else:
        assert taken == [int(x[0]), int(z[0])]  # x joined the uncached head, last in first out
    assert cached(pool, [2]) == 1  # y is still cached
    pool.check_invariants()


@pytest.mark.parametrize("pool_cls", POOLS)
def test_pool_arguments_the_bindings_and_the_reference_read_alike(pool_cls: Any) -> None:
    """``advance_clock(None)`` is refused (the binding took it as 0); ``group_id=None`` is the
    default group and integer hash ids stand for 8-byte big-endian hashes in both (the
    reference refused both)."""
    pool = pool_cls(8, clock="manual")
    with pytest.raises(DtypeError):
        pool.advance_clock(None)
    ids = pool.get_new_blocks(2)
    pool.cache_full_blocks(ids, np.array([7, 8], dtype=np.uint64), 0, 2)
    assert pool.find_longest_cache_hit(keys(7, 8), group_id=None).tolist() == ids.tolist()
    assert pool.find_longest_cache_hit(np.array([7, 8])).tolist() == ids.tolist()
    assert pool.pin_prefix(np.array([7]), group_id=None) == 1
    with pytest.raises(InvalidArgumentError, match=">= 0"):
        pool.find_longest_cache_hit(np.array([-1]))
    pool.check_invariants()


@pytest.mark.parametrize("manager_cls", MANAGERS)
def test_request_priority_reaches_its_blocks(manager_cls: Any) -> None:
    manager = manager_cls(9, 4, eviction="priority", clock="manual")
    prompt = list(range(8))
    manager.add_request("sys", prompt + [99], priority=95, retention_s=60)
    manager.allocate_slots("sys", 9)
    manager.free("sys")
    for i in range(10):  # churn that would evict the prompt's two blocks under LRU
        rid = f"r{i}"
        manager.add_request(rid, [1000 + 10 * i + j for j in range(17)])
        manager.allocate_slots(rid, 17)
        manager.free(rid)
    manager.add_request("again", prompt + [7])
    blocks, computed = manager.get_computed_blocks("again")
    assert computed == 8
    with pytest.raises(InvalidArgumentError, match="eviction='priority'"):
        manager_cls(9, 4).add_request("x", [1, 2], priority=50)


# ------------------------------------------------------------------ pins


@pytest.mark.parametrize("policy", ["lru", "priority", "adaptive"])
@pytest.mark.parametrize("pool_cls", POOLS)
def test_pinned_prefix_survives_any_churn(pool_cls: Any, policy: str) -> None:
    pool = pool_cls(65, eviction=policy, max_pinned_blocks=8, clock="manual")
    system = [7, 8, 9, 10]
    serve(pool, system)
    assert pool.pin_prefix(keys(*system)) == 4
    assert pool.get_num_pinned_blocks() == 4
    assert pool.get_num_free_blocks() == 60
    rng = np.random.default_rng(0)
    for i in range(300):
        chain = [int(x) for x in rng.integers(1000, 1_000_000, size=int(rng.integers(1, 60)))]
        serve(pool, chain)
    assert cached(pool, system) == 4
    hit = pool.find_longest_cache_hit(keys(*system)).tolist()
    assert pool.pinned_block_ids().tolist() == sorted(hit)
    pool.check_invariants()
    assert pool.unpin_prefix(keys(*system)) == 4
    assert pool.get_num_free_blocks() == 64
    serve(pool, list(range(2000, 2064)))  # the whole pool: the system prompt goes now
    assert cached(pool, system) == 0
    pool.check_invariants()


@pytest.mark.parametrize("pool_cls", POOLS)
def test_pin_budget_is_an_error_not_a_silent_unpin(pool_cls: Any) -> None:
    pool = pool_cls(16, max_pinned_blocks=3)
    serve(pool, [1, 2])
    serve(pool, [5, 6])
    assert pool.pin_prefix(keys(1, 2)) == 2
    assert pool.pin_prefix(keys(1, 2)) == 2  # already pinned: nothing more counted
    with pytest.raises(PinBudgetError, match="2 of 3 are pinned"):
        pool.pin_prefix(keys(5, 6))
    assert pool.get_num_pinned_blocks() == 2 and cached(pool, [1, 2]) == 2
    assert isinstance(PinBudgetError("x"), (kvpool.KVPoolError, ValueError))
    assert pool_cls(16, max_pinned_blocks=0).pin_prefix(keys()) == 0


@pytest.mark.parametrize("pool_cls", POOLS)
def test_a_pins_reference_is_only_freed_by_unpinning(pool_cls: Any) -> None:
    pool = pool_cls(8)
    blocks = serve(pool, [1, 2])
    pool.pin_prefix(keys(1, 2))
    counts = pool.ref_counts().tolist()
    with pytest.raises(DoubleFreeError):
        pool.free_blocks(blocks)
    assert pool.ref_counts().tolist() == counts
    assert pool.reset_prefix_cache() is False  # pinned blocks are in use
    pool.evict_blocks([blocks[1]])  # an explicit eviction drops the pin too
    assert pool.get_num_pinned_blocks() == 1 and pool.block_hash(blocks[1]) is None
    assert pool.unpin_all() == 1
    assert pool.reset_prefix_cache() is True
    pool.check_invariants()
    with pytest.raises(BlockStateError):
        pool.cache_full_blocks([blocks[0]], keys(3), 0, 1)  # free: not cacheable, as before


@pytest.mark.parametrize("manager_cls", MANAGERS)
def test_manager_pins_a_prompt(manager_cls: Any) -> None:
    manager = manager_cls(9, 4, max_pinned_blocks=2)
    prompt = list(range(9))
    manager.add_request("sys", prompt)
    manager.allocate_slots("sys", 9)
    manager.free("sys")
    assert manager.pin_prompt(prompt) == 2
    assert manager.get_num_pinned_blocks() == 2
    for i in range(8):
        rid = f"r{i}"
        manager.add_request(rid, [1000 + 10 * i + j for j in range(20)])
        assert manager.allocate_slots(rid, 20) is not None
        manager.free(rid)
    manager.add_request("again", prompt)
    assert manager.get_computed_blocks("again")[1] == 8
    assert manager.unpin_prompt(prompt) == 2
    assert manager.get_num_pinned_blocks() == 0


# ------------------------------------------------------------------ the adaptive policy


@pytest.mark.parametrize("pool_cls", POOLS)
def test_adaptive_keeps_a_reused_prefix_that_lru_evicts(pool_cls: Any) -> None:
    """A prefix used three times outlives a scan of blocks used once; under LRU it does not."""
    results = {}
    for policy in ("lru", "adaptive"):
        pool = pool_cls(33, eviction=policy)
        for _ in range(3):
            serve(pool, [1, 2, 3, 4])
        for i in range(8):  # a scan of 28 blocks, each used once, in 7-block requests
            serve(pool, [100 + 10 * i + j for j in range(7)])
            if i == 4:
                break
        results[policy] = cached(pool, [1, 2, 3, 4])
        pool.check_invariants()
    assert results == {"lru": 0, "adaptive": 4}


@pytest.mark.parametrize("pool_cls", POOLS)
def test_adaptive_remembers_uses_across_an_eviction(pool_cls: Any) -> None:
    """Uses survive in the ghost table: a key evicted after two uses comes back in a higher band."""
    pool = pool_cls(4, eviction="adaptive")  # three usable blocks
    serve(pool, [7])
    serve(pool, [7])
    serve(pool, [8, 9, 10])  # evicts key 7
    assert cached(pool, [7]) == 0
    again = serve(pool, [7])[0]
    serve(pool, [11])
    serve(pool, [12])
    # Key 7 (three uses) outlives the two newer keys used once.
    order = pool.free_block_ids().tolist()
    assert order[-1] == again
    pool.check_invariants()


def test_ghost_fingerprints_equal_the_references() -> None:
    """The ghost table's sets and tags come from the fingerprint: the Rust pool's and the
    reference's agree on every key width, group and shape (structured keys among them), so the
    two tables replace and forget the same records."""
    from kvpool.reference.eviction import ghost_fingerprint as reference_fingerprint

    rng = np.random.default_rng(7)
    keys_ = [rng.bytes(int(w)) for w in rng.integers(1, 33, 200)]
    keys_ += [i.to_bytes(w, order) for w in (8, 16, 32) for order in ("big", "little") for i in range(0, 4096, 37)]
    keys_ += [b"\0" * 32, b"\xff" * 32, b"\x01"]
    for key in keys_:
        for group in (0, 1, 7, 2**32 - 1):
            assert kvpool.ghost_fingerprint(key, group) == reference_fingerprint((key, group)), (key, group)
    with pytest.raises(DtypeError):
        kvpool.ghost_fingerprint("not bytes")  # type: ignore[arg-type]
    with pytest.raises(kvpool.HashWidthError):
        kvpool.ghost_fingerprint(b"")
    with pytest.raises(InvalidArgumentError):
        kvpool.ghost_fingerprint(b"x", -1)


@pytest.mark.parametrize("pool_cls", POOLS)
def test_the_adaptive_horizon_is_how_long_a_reused_block_is_kept(pool_cls: Any) -> None:
    """A horizon of 0 is LRU's order; the default keeps a reused prefix through a scan; a
    horizon shorter than the scan lets it go once the scan's blocks are newer by more."""
    kept = {}
    for horizon in (None, 0, 10, 40):
        pool = pool_cls(33, eviction="adaptive", adaptive_horizon=horizon)
        assert pool.adaptive_horizon == (20_000 if horizon is None else horizon)
        for _ in range(3):
            serve(pool, [1, 2, 3, 4])
        # 56 blocks used once, in 7-block requests: 28 of them evict (the pool has 32
        # usable blocks). Each eviction takes the band head of lowest credit: a scan block's
        # credit is when it was freed (ticks 13-40 for those evicted), a prefix block's
        # when it was last freed (9-12) plus the horizon.
        for i in range(8):
            serve(pool, [100 + 10 * i + j for j in range(7)])
        kept[horizon] = cached(pool, [1, 2, 3, 4])
        pool.check_invariants()
    assert kept == {None: 4, 0: 0, 10: 0, 40: 4}


@pytest.mark.parametrize("pool_cls", POOLS)
@pytest.mark.parametrize("manager", [False, True])
def test_the_default_horizon_fades_out_in_large_pools(pool_cls: Any, manager: bool) -> None:
    """Without ``adaptive_horizon=``, pools up to 25,000 blocks get 20,000 blocks; the horizon
    then falls linearly to 0 at 30,000 blocks (LRU's order from there on), the same in both
    implementations; a horizon that is given is kept at every size."""
    def build(num_blocks: int, **kwargs: Any) -> Any:
        if manager:
            cls = kvpool.KVCacheManager if pool_cls is kvpool.BlockPool else kvpool.reference.KVCacheManager
            return cls(num_blocks, 16, eviction="adaptive", **kwargs)
        return pool_cls(num_blocks, eviction="adaptive", **kwargs)

    expected = {2: 20_000, 25_000: 20_000, 25_001: 19_996, 27_500: 10_000, 29_999: 4, 30_000: 0, 60_000: 0}
    assert {n: build(n).adaptive_horizon for n in expected} == expected
    assert {n: kvpool.reference.eviction.default_adaptive_horizon(n) for n in expected} == expected
    assert build(60_000, adaptive_horizon=20_000).adaptive_horizon == 20_000
    assert build(2, adaptive_horizon=0).adaptive_horizon == 0


def test_a_pool_past_the_fade_evicts_in_lru_order() -> None:
    """At 30,000 blocks the default horizon is 0: a prefix reused three times goes as LRU lets
    it go, while a pool of 25,000 blocks keeps it through the same scan."""
    kept = {}
    for num_blocks in (25_000, 30_000):
        pools = {p: kvpool.BlockPool(num_blocks, eviction=p) for p in ("lru", "adaptive")}
        for pool in pools.values():
            for _ in range(3):
                serve(pool, [1, 2, 3, 4])
            for i in range(num_blocks // 100):  # scans of 100 blocks used once: every block turns over
                serve(pool, list(range(1_000_000 + 100 * i, 1_000_100 + 100 * i)))
        kept[num_blocks] = {p: cached(pool, [1, 2, 3, 4]) for p, pool in pools.items()}
        if num_blocks == 30_000:
            assert pools["adaptive"].free_block_ids().tolist() == pools["lru"].free_block_ids().tolist()
    assert kept == {25_000: {"lru": 0, "adaptive": 4}, 30_000: {"lru": 0, "adaptive": 0}}


@pytest.mark.parametrize("pool_cls", POOLS)
@pytest.mark.parametrize("manager", [False, True])
def test_adaptive_horizon_arguments_are_checked(pool_cls: Any, manager: bool) -> None:
    def build(**kwargs: Any) -> Any:
        if manager:
            cls = kvpool.KVCacheManager if pool_cls is kvpool.BlockPool else kvpool.reference.KVCacheManager
            return cls(16, 4, **kwargs)
        return pool_cls(16, **kwargs)

    assert build(eviction="adaptive", adaptive_horizon=2**40).adaptive_horizon == 2**40
    for bad, error in [(-1, InvalidArgumentError), (2**40 + 1, InvalidArgumentError), ("5", DtypeError),
                       (1.5, DtypeError), (True, DtypeError)]:
        with pytest.raises(error):
            build(eviction="adaptive", adaptive_horizon=bad)
    for other in (None, "lru", "priority"):  # it would be ignored there, so it is refused
        with pytest.raises(InvalidArgumentError, match="adaptive_horizon"):
            build(eviction=other, adaptive_horizon=5)
