"""``kvpool.GroupTables``: every entry point refuses bad input with a clear error and changes
nothing (the rules themselves are compared with vLLM in ``test_hybrid_differential.py``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kvpool

BS = 4
GROUPS: list[Any] = ["full", ("sliding_window", 8)]
HASHES = [bytes([i + 1]) * 32 for i in range(6)]


def tables(caching: bool = True) -> kvpool.GroupTables:
    pool = kvpool.BlockPool(40, block_size=BS, enable_caching=caching)
    t = kvpool.GroupTables(pool, GROUPS, max_model_len=1000)
    t.allocate_slots("a", 0, 21, 21, HASHES[:5], 21)
    return t


def snapshot(t: kvpool.GroupTables) -> Any:
    pool = t.pool
    return (pool.free_block_ids().tolist(), pool.ref_counts().tolist(), pool.get_num_cached_blocks(),
            [g.tolist() for g in t.get_blocks("a")], t.num_cached_blocks("a", 0), t.request_ids())


ERRORS: list[tuple[str, type[BaseException], Any]] = [
    ("hits for the wrong number of groups", kvpool.InvalidArgumentError,
     lambda t: t.allocate_slots("b", 0, 8, 8, HASHES[:2], 4, num_new_computed_tokens=4, new_computed_blocks=[[1]])),
    ("a hit id out of range", kvpool.InvalidBlockIdError,
     lambda t: t.allocate_slots("b", 0, 8, 8, HASHES[:2], 4, num_new_computed_tokens=4,
                                new_computed_blocks=[[99], [0]])),
    ("hits for a running request", kvpool.InvalidArgumentError,
     lambda t: t.allocate_slots("a", 21, 22, 21, HASHES[:5], 1, num_new_computed_tokens=4,
                                new_computed_blocks=[[1], [0]])),
    ("a hit off a block boundary", kvpool.InvalidArgumentError,
     lambda t: t.allocate_slots("b", 2, 8, 8, HASHES[:2], 4, num_new_computed_tokens=4,
                                new_computed_blocks=[[1], [0]])),
    ("nothing to allocate or adopt", kvpool.InvalidArgumentError,
     lambda t: t.allocate_slots("b", 0, 8, 8, HASHES[:2], 0)),
    ("a negative count", kvpool.InvalidArgumentError, lambda t: t.allocate_slots("b", 0, 8, 8, HASHES[:2], -1)),
    ("a float count", kvpool.DtypeError, lambda t: t.allocate_slots("b", 0, 8, 8, HASHES[:2], 1.5)),
    ("hashes of another width", kvpool.HashWidthError,
     lambda t: t.allocate_slots("b", 0, 8, 8, [b"x" * 16], 4)),
    ("hashes that are not bytes", kvpool.DtypeError, lambda t: t.allocate_slots("b", 0, 8, 8, ["x"], 4)),
    ("hits that are not id arrays", kvpool.DtypeError,
     lambda t: t.allocate_slots("b", 0, 8, 8, HASHES[:2], 4, num_new_computed_tokens=4, new_computed_blocks=5)),
    ("a request id of a bad type", kvpool.DtypeError, lambda t: t.allocate_slots(1.5, 0, 8, 8, HASHES[:2], 4)),
    ("a bad group in remove_skipped_blocks' count", kvpool.InvalidArgumentError,
     lambda t: t.remove_skipped_blocks("a", -3)),
    ("num_cached_blocks of a group that does not exist", kvpool.InvalidArgumentError,
     lambda t: t.num_cached_blocks("a", 2)),
    ("cache_blocks with hashes of another width", kvpool.HashWidthError,
     lambda t: t.cache_blocks("a", np.array([7], dtype=np.uint64), 21, 21)),
    ("cache_blocks with a bad count", kvpool.InvalidArgumentError, lambda t: t.cache_blocks("a", HASHES, -1, 21)),
    ("a per-group step on a group that does not exist", kvpool.InvalidArgumentError,
     lambda t: t.group_allocate_new_blocks("a", 2, 40)),
    ("a per-group allocation beyond the free blocks", kvpool.NoFreeBlocksError,
     lambda t: t.group_allocate_new_blocks("b", 0, 1000)),
    ("connector blocks beyond the free blocks", kvpool.NoFreeBlocksError,
     lambda t: t.group_allocate_external("b", 0, 0, 1000)),
    ("a per-group hit for a table that has blocks", kvpool.InvalidArgumentError,
     lambda t: t.group_add_computed_blocks("a", 0, [30], 4, 0)),
    ("a per-group hit off a block boundary", kvpool.InvalidArgumentError,
     lambda t: t.group_add_computed_blocks("b", 0, [30], 2, 0)),
    ("a per-group count with a hit for a running request", kvpool.InvalidArgumentError,
     lambda t: t.group_num_blocks_to_allocate("a", 0, 24, [30], 20, 20)),
    ("a per-group count with a negative token count", kvpool.InvalidArgumentError,
     lambda t: t.group_num_blocks_to_allocate("b", 0, -1, [], 0, 0)),
    ("handing a table the same block twice", kvpool.InvalidArgumentError,
     lambda t: t.group_adopt_blocks("b", 0, [30, 0, 30])),
    ("handing a table an id out of range", kvpool.InvalidBlockIdError,
     lambda t: t.group_adopt_blocks("b", 0, [30, 99])),
    ("handing blocks to a table that has some", kvpool.InvalidArgumentError,
     lambda t: t.group_adopt_blocks("a", 0, [30])),
    ("find_group_hit with a window of 0", kvpool.InvalidArgumentError,
     lambda t: kvpool.find_group_hit(t.pool, ("sliding_window", 0), HASHES, 8)),
    ("find_group_hit with no group ids", kvpool.InvalidArgumentError,
     lambda t: kvpool.find_group_hit(t.pool, "full", HASHES, 8, group_ids=[])),
    ("find_group_hit with hashes of another width", kvpool.HashWidthError,
     lambda t: kvpool.find_group_hit(t.pool, "full", [b"x" * 16], 8)),
    ("find_group_hit on something that is not a pool", kvpool.DtypeError,
     lambda t: kvpool.find_group_hit(t, "full", HASHES, 8)),
    # A window search reads every hash below max_length, and a chunked-local one pads its
    # answer with a null block per skipped block: a max_length past the hashes is refused,
    # not a vector of 2**63 blocks.
    ("find_group_hit, a window, max_length past the hashes", kvpool.InvalidArgumentError,
     lambda t: kvpool.find_group_hit(t.pool, ("sliding_window", 4), HASHES[:1], 2**63 - 1)),
    ("find_group_hit, chunked local, max_length past the hashes", kvpool.InvalidArgumentError,
     lambda t: kvpool.find_group_hit(t.pool, ("chunked_local", 4), HASHES[:1], 2**44)),
    ("a hit search longer than max_model_len", kvpool.InvalidArgumentError,
     lambda t: t.find_longest_cache_hit(HASHES, 2**63 - 1)),
    ("find_group_hit, full attention, a partial-block hit", kvpool.InvalidArgumentError,
     lambda t: kvpool.find_group_hit(t.pool, ("full", None, 8), HASHES, 16, alignment_tokens=4)),
    ("a group spec nested deeper than one tuple", kvpool.InvalidArgumentError,
     lambda t: kvpool.find_group_hit(t.pool, (("full",),), HASHES, 8)),
    ("token counts that add up past the largest count", kvpool.InvalidArgumentError,
     lambda t: t.allocate_slots("b", 2**63 - 1, 10, 10, [], 1, num_new_computed_tokens=2**63 - 1,
                                num_external_computed_tokens=2)),
    ("lookahead tokens that add up past the largest count", kvpool.InvalidArgumentError,
     lambda t: t.allocate_slots("b", 0, 10, 10, [], 2**63 - 1, num_lookahead_tokens=2**63 - 1,
                                num_external_computed_tokens=2**63 - 1)),
]


@pytest.mark.parametrize(("case", "error", "call"), ERRORS, ids=[e[0] for e in ERRORS])
def test_bad_input_changes_nothing(case: str, error: type[BaseException], call: Any) -> None:
    t = tables()
    before = snapshot(t)
    with pytest.raises(error):
        call(t)
    assert snapshot(t) == before
    t.check_invariants()


def test_caching_off_refuses_hits_and_still_gives_window_blocks_back() -> None:
    t = tables(caching=False)
    before = snapshot(t)
    with pytest.raises(kvpool.CachingDisabledError):
        t.allocate_slots("b", 0, 8, 8, [], 4, num_new_computed_tokens=4, new_computed_blocks=[[1], [0]])
    assert snapshot(t) == before
    assert t.find_longest_cache_hit(HASHES, 20)[1] == 0
    t.remove_skipped_blocks("a", 21)
    assert t.get_blocks("a")[1].tolist()[:3] == [0, 0, 0]
    t.check_invariants()


def test_bad_layouts_and_pools_are_refused() -> None:
    pool = kvpool.BlockPool(10, block_size=BS)
    for groups, error in [
        ([], kvpool.InvalidArgumentError),
        (["window"], kvpool.InvalidArgumentError),
        ([("sliding_window", 0)], kvpool.InvalidArgumentError),
        ([("chunked_local", "x")], kvpool.DtypeError),
        (5, kvpool.DtypeError),
    ]:
        with pytest.raises(error):
            kvpool.GroupTables(pool, groups, max_model_len=100)
    with pytest.raises(kvpool.DtypeError):
        kvpool.GroupTables(object(), ["full"], max_model_len=100)  # type: ignore[arg-type]
    with pytest.raises(kvpool.InvalidArgumentError):
        kvpool.GroupTables(kvpool.BlockPool(10, block_size=BS, null_block=False), ["full"], max_model_len=100)
    with pytest.raises(kvpool.InvalidArgumentError):
        kvpool.GroupTables(pool, ["full"], max_model_len=100, retention_interval=8)
    assert kvpool.GroupTables(pool, GROUPS, max_model_len=100).groups == (
        ("full_attention", None), ("sliding_window", 8))


def test_groups_of_larger_blocks() -> None:
    """A group's third item is its block size, a multiple of the pool's (the hash size)."""
    pool = kvpool.BlockPool(64, block_size=16)
    tables = kvpool.GroupTables(pool, [("full", None, 32), ("sliding_window", 64, 16)], max_model_len=512)
    hashes = [bytes([i]) * 32 for i in range(4)]  # 64 tokens of 16-token hashes
    got = tables.allocate_slots("a", 0, 64, 64, hashes, 64)
    assert got is not None and [len(g) for g in got] == [2, 4]
    tables.check_invariants()
    for bad in ([("full", None, 24)], [("sliding_window", 64, 0)], [("full", 3, 32)]):
        with pytest.raises(kvpool.InvalidArgumentError):
            kvpool.GroupTables(pool, bad, max_model_len=512)


def test_per_group_steps_give_what_allocate_slots_gives() -> None:
    """vLLM's coordinator calls each group's steps in turn (add the hit to every group, then
    allocate new blocks group by group); ``allocate_slots`` runs the same rules in one call."""
    one_call, steps = tables(), tables()
    for t in (one_call, steps):
        t.free("a")
    blocks, hit, _ = one_call.find_longest_cache_hit(HASHES, 23)
    assert hit == 20
    assert [g.tolist() for g in blocks] == [g.tolist() for g in steps.find_longest_cache_hit(HASHES, 23)[0]]
    for g, spec in enumerate(GROUPS):
        # Each group's own search finds what the combined one gives it.
        alone, n = kvpool.find_group_hit(steps.pool, spec, HASHES, 23, group_ids=[g], alignment_tokens=BS)
        assert n == hit and alone[0].tolist() == blocks[g].tolist()
    need = [steps.group_num_blocks_to_allocate("b", g, 28, blocks[g], hit, hit) for g in range(2)]
    one_call.allocate_slots("b", 0, 28, 28, HASHES, 8, num_new_computed_tokens=hit,
                            new_computed_blocks=blocks, delay_cache_blocks=True)
    free = steps.pool.get_num_free_blocks()
    for g in range(2):
        steps.group_add_computed_blocks("b", g, blocks[g], hit, 0)
    new = [steps.group_allocate_new_blocks("b", g, 28).tolist() for g in range(2)]
    assert free - steps.pool.get_num_free_blocks() == sum(need)
    assert [len(n) for n in new] == [2, 2]
    for t in (one_call, steps):
        t.check_invariants()
    assert [g.tolist() for g in steps.get_blocks("b")] == [g.tolist() for g in one_call.get_blocks("b")]
    assert steps.pool.free_block_ids().tolist() == one_call.pool.free_block_ids().tolist()
    assert steps.pool.ref_counts().tolist() == one_call.pool.ref_counts().tolist()
    assert [steps.num_cached_blocks("b", g) for g in range(2)] == [one_call.num_cached_blocks("b", g)
                                                                   for g in range(2)]
    # Popping hands the tables over unfreed; freeing them by hand gives the blocks back.
    assert "b" in steps and len(steps) == 1
    popped = steps.pop_tables("b")
    assert popped is not None and "b" not in steps.request_ids()
    assert "b" not in steps and len(steps) == 0
    with pytest.raises(kvpool.DtypeError):
        _ = 1.5 in steps
    assert steps.pop_tables("b") is None
    for ids in popped:
        steps.pool.free_blocks([i for i in ids[::-1].tolist() if i != 0])
    one_call.free("b")
    assert steps.pool.get_num_free_blocks() == one_call.pool.get_num_free_blocks()


def test_per_group_entry_points_on_empty_integer_and_shared_keys() -> None:
    """Empty inputs, integer keys (8-byte big-endian) and one key over many blocks."""
    pool = kvpool.BlockPool(64, block_size=BS)
    t = kvpool.GroupTables(pool, ["full"], max_model_len=1000)
    assert [g.tolist() for g in kvpool.find_group_hit(pool, "full", [], 100)[0]] == [[]]
    assert kvpool.find_group_hit(pool, ("sliding_window", 8), HASHES, 0)[1] == 0
    t.group_adopt_blocks("empty", 0, [])
    assert t.get_blocks("empty")[0].tolist() == [] and t.group_allocate_new_blocks("empty", 0, 0).tolist() == []
    # Integer keys: a prefix of sequential ids cached, then found as a numpy array.
    keys = np.arange(1, 9, dtype=np.uint64)
    ids = t.group_allocate_new_blocks("ints", 0, 8 * BS)
    pool.cache_full_blocks(ids, keys, 0, 8)
    blocks, n = kvpool.find_group_hit(pool, "full", keys, 8 * BS)
    assert n == 8 * BS and blocks[0].tolist() == ids.tolist()
    blocks, n = kvpool.find_group_hit(pool, ("sliding_window", 9), keys[:6], 6 * BS)
    # The window needs only the last two blocks; the ones before are the null block.
    assert n == 6 * BS and blocks[0].tolist() == [0] * 4 + ids.tolist()[4:6]
    # One key over many blocks: every search finds the first block cached under it.
    same = np.full(1, 77, dtype=np.uint64)
    first = None
    for _ in range(20):
        b = pool.get_new_blocks(1)
        pool.cache_full_blocks(b, same, 0, 1)
        first = first if first is not None else int(b[0])
    assert kvpool.find_group_hit(pool, "full", same, BS)[0][0].tolist() == [first]
    t.check_invariants()


def test_a_deeply_nested_spec_is_refused_without_recursion() -> None:
    spec: Any = "full"
    for _ in range(50_000):
        spec = (spec,)
    pool = kvpool.BlockPool(8, block_size=2)
    with pytest.raises(kvpool.InvalidArgumentError):
        kvpool.find_group_hit(pool, spec, [], 4)
    with pytest.raises(kvpool.InvalidArgumentError):
        kvpool.GroupTables(pool, [spec], max_model_len=16)
    assert kvpool.find_group_hit(pool, ("full",), [], 4)[1] == 0


def test_a_pinned_block_is_not_handed_to_a_table() -> None:
    pool = kvpool.BlockPool(16, block_size=BS, max_pinned_blocks=4)
    t = kvpool.GroupTables(pool, ["full"], max_model_len=1000)
    t.allocate_slots("a", 0, 8, 8, HASHES[:2], 8)
    t.free("a")
    assert pool.pin_prefix(HASHES[:2]) == 2
    pinned = pool.find_longest_cache_hit(HASHES[:2]).tolist()
    before = (pool.free_block_ids().tolist(), pool.ref_counts().tolist(), t.request_ids())
    # The pin's reference is not the caller's to hand over.
    with pytest.raises(kvpool.InvalidArgumentError, match="pin"):
        t.group_adopt_blocks("r", 0, pinned)
    assert (pool.free_block_ids().tolist(), pool.ref_counts().tolist(), t.request_ids()) == before
    # A reference the caller took on top of the pin is.
    pool.touch(pinned)
    t.group_adopt_blocks("r", 0, pinned)
    t.free("r")
    assert pool.ref_counts()[pinned].tolist() == [1, 1]
    t.check_invariants()


def test_tables_cache_under_the_pool_group_ids_they_are_given() -> None:
    pool = kvpool.BlockPool(16, block_size=BS)
    t = kvpool.GroupTables(pool, ["full"], max_model_len=1000, pool_group_ids=[2])
    t.allocate_slots("a", 0, 8, 8, HASHES[:2], 8)
    t.free("a")
    assert len(pool.find_longest_cache_hit(HASHES[:2], group_id=2)) == 2
    assert len(pool.find_longest_cache_hit(HASHES[:2], group_id=0)) == 0
    blocks, hit, _ = t.find_longest_cache_hit(HASHES[:2], 7)
    assert hit == 4 and len(blocks[0]) == 1
    assert kvpool.find_group_hit(pool, "full", HASHES[:2], 8, group_ids=[2])[1] == 8
    with pytest.raises(kvpool.InvalidArgumentError, match="two groups"):
        kvpool.GroupTables(pool, ["full", "full"], max_model_len=1000, pool_group_ids=[1, 1])
    with pytest.raises(kvpool.InvalidArgumentError, match="pool group ids"):
        kvpool.GroupTables(pool, ["full"], max_model_len=1000, pool_group_ids=[1, 2])
    with pytest.raises(kvpool.InvalidArgumentError, match="multiple"):
        kvpool.GroupTables(pool, ["full"], max_model_len=1000, scheduler_block_size=6)


def test_block_sizes_without_a_common_multiple_in_range_are_refused() -> None:
    pool = kvpool.BlockPool(8, block_size=1)
    sizes = [2**32 - 1, 2**32 - 5, 2**31 - 1]
    with pytest.raises(kvpool.InvalidArgumentError, match="common multiple"):
        kvpool.GroupTables(pool, [("full", None, s) for s in sizes], max_model_len=16)
