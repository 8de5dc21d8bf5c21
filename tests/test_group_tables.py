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
