"""Result arrays of ``BlockPool.get_new_blocks`` written again once nobody holds them.

``src/bindings/recycled_ids.rs`` keeps the last few arrays a pool returned and writes the
next result of the same length into one that only it still references. Nothing a caller can
see may change: an array anyone still reaches (by name, a view, a buffer export, a weak
reference) keeps its contents; an array its holder changed (shape, dtype, flags, size) is not
written again; every result is a fresh-looking contiguous native ``int32`` array with the ids
the reference pool gives.
"""

from __future__ import annotations

import gc
import threading
import tracemalloc
import warnings
import weakref

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool._errors import HAVE_CORE

pytestmark = pytest.mark.skipif(not HAVE_CORE, reason="kvpool._core is not built")

if HAVE_CORE:
    import kvpool._core as core

from kvpool.reference.pool import BlockPool as RefPool


def _plain_int32(a: np.ndarray, n: int) -> None:
    assert type(a) is np.ndarray
    assert a.dtype == np.int32 and a.dtype.isnative
    assert a.shape == (n,) and (n == 0 or a.strides == (4,))
    assert a.flags.c_contiguous and a.flags.writeable and a.flags.owndata and a.base is None


def _peak_allocation(work) -> int:
    """Bytes ``work()`` allocated at its peak beyond what was allocated before it
    (tracemalloc sees Python objects and numpy's array memory alike)."""
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        work()
        _, peak = tracemalloc.get_traced_memory()
        return peak - before
    finally:
        tracemalloc.stop()


def test_an_array_dropped_by_its_caller_is_written_again() -> None:
    pool = core.BlockPool(64, enable_caching=False)
    first = pool.get_new_blocks(3)
    address = id(first)
    pool.free_blocks(first, reverse=True)
    del first
    second = pool.get_new_blocks(3)
    assert id(second) == address  # the same object, now holding the new ids
    _plain_int32(second, 3)
    pool.free_blocks(second)
    del second

    def churn() -> None:
        for _ in range(100):
            pool.free_blocks(pool.get_new_blocks(3))

    def idle() -> None:
        for _ in range(100):
            pass

    churn()
    # No array made: each call rewrote a kept one (the loop itself allocates alike).
    # tracemalloc sees every thread, so a stray allocation elsewhere may spoil one
    # measurement; a recycling that does not happen spoils all of them.
    assert any(_peak_allocation(churn) == _peak_allocation(idle) for _ in range(3))
    pool_off = core.BlockPool(64, enable_caching=False)
    held = [pool_off.get_new_blocks(1) for _ in range(8)]  # every slot held
    kept: list = [None] * 3

    def fresh(i: int) -> None:
        kept[i] = pool_off.get_new_blocks(2)  # kept too: no array to rewrite, a fresh one

    assert any(_peak_allocation(lambda: fresh(i)) > _peak_allocation(idle) for i in range(3))
    del held


def test_held_results_never_change() -> None:
    pool = core.BlockPool(4096, enable_caching=False)
    held = []
    for n in [1, 2, 1, 3, 1, 1, 2, 5, 1]:
        ids = pool.get_new_blocks(n)
        held.append((ids, ids.copy()))
    for ids, snapshot in held:
        assert np.array_equal(ids, snapshot)
    assert len({id(ids) for ids, _ in held}) == len(held)


@pytest.mark.parametrize("keep", [
    lambda a: a[::-1],
    lambda a: a[:],
    lambda a: memoryview(a),
    lambda a: np.frombuffer(a, dtype=np.int32),
    lambda a: a.view(np.uint32),
    lambda a: weakref.ref(a),
], ids=["reversed view", "slice", "memoryview", "frombuffer", "view as uint32", "weakref"])
def test_what_still_reaches_an_array_keeps_it_from_reuse(keep) -> None:
    pool = core.BlockPool(64, enable_caching=False)
    a = pool.get_new_blocks(4)
    before = a.tolist()
    kept = keep(a)
    pool.free_blocks(a)
    address = id(a)
    del a
    for _ in range(6):  # more calls than the ring has slots
        b = pool.get_new_blocks(4)
        assert id(b) != address
        pool.free_blocks(b)
        del b
    seen = kept() if isinstance(kept, weakref.ref) else kept
    if seen is not None:
        values = np.asarray(seen).astype(np.int64).tolist()
        assert sorted(values) == sorted(before)


@pytest.mark.parametrize("change", [
    lambda a: setattr(a, "shape", (2, 2)),
    lambda a: setattr(a, "dtype", np.uint32),
    lambda a: setattr(a, "dtype", np.dtype(">i4")),
    lambda a: a.setflags(write=False),
    lambda a: a.resize(8, refcheck=False),
    lambda a: a.resize(4, refcheck=False),  # same length, memory reallocated: still plain
], ids=["reshaped", "uint32", "big-endian", "read-only", "grown", "resized in place"])
def test_an_array_changed_by_its_holder_comes_back_plain(change) -> None:
    pool = core.BlockPool(64, enable_caching=False)
    ref = RefPool(64, enable_caching=False)
    a = pool.get_new_blocks(4)
    assert a.tolist() == ref.get_new_blocks(4).tolist()
    pool.free_blocks(a.copy())
    ref.free_blocks(a.tolist())
    with warnings.catch_warnings():
        # numpy 2.5 deprecates setting an array's shape or dtype in place; callers on older
        # numpy still do it, and numpy versions that removed it cannot make such an array.
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            change(a)
        except AttributeError:
            pytest.skip("this numpy cannot change an array's shape or dtype in place")
    del a
    for _ in range(6):
        b = pool.get_new_blocks(4)
        _plain_int32(b, 4)
        assert b.tolist() == ref.get_new_blocks(4).tolist()
        pool.free_blocks(b)
        ref.free_blocks(b.tolist())
        del b


def test_long_results_are_not_kept() -> None:
    pool = core.BlockPool(20_000, enable_caching=False)
    a = pool.get_new_blocks(5000)
    gone = weakref.ref(a)
    pool.free_blocks(a)
    del a
    gc.collect()
    assert gone() is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.booleans(), st.booleans()), max_size=60))
def test_results_match_the_reference_whatever_the_caller_keeps(steps) -> None:
    """Allocate ``n``, keep the result or not, free it now or later: every result equals
    the reference pool's, and every kept result keeps its ids."""
    pool = core.BlockPool(48, enable_caching=False)
    ref = RefPool(48, enable_caching=False)
    kept: list[tuple[np.ndarray, list[int]]] = []
    for n, keep, free_now in steps:
        if pool.get_num_free_blocks() < n:
            for ids, snapshot in kept:
                assert ids.tolist() == snapshot
                pool.free_blocks(ids, reverse=True)
                ref.free_blocks(snapshot[::-1])
            kept.clear()
        ids = pool.get_new_blocks(n)
        assert ids.tolist() == ref.get_new_blocks(n).tolist()
        _plain_int32(ids, n)
        if free_now:
            pool.free_blocks(ids[::-1])
            ref.free_blocks(ids.tolist()[::-1])
            if keep:
                kept_free = ids  # held, but already freed: its ids must not change either
                snapshot = ids.tolist()
                ids = None
                assert kept_free.tolist() == snapshot
        elif keep:
            kept.append((ids, ids.tolist()))
        else:
            pool.free_blocks(ids, reverse=True)
            ref.free_blocks(ids.tolist()[::-1])
        del ids
        assert pool.free_block_ids().tolist() == ref.free_block_ids().tolist()
    for ids, snapshot in kept:
        assert ids.tolist() == snapshot


def test_threads_never_see_each_others_results_change() -> None:
    pool = core.BlockPool(4096, enable_caching=False)
    errors: list[str] = []

    def work() -> None:
        for _ in range(2000):
            a = pool.get_new_blocks(3)
            b = pool.get_new_blocks(3)
            snap_a, snap_b = a.tolist(), b.tolist()
            if set(snap_a) & set(snap_b):
                errors.append(f"{snap_a} and {snap_b} share a block")
            pool.free_blocks(b, reverse=True)
            if a.tolist() != snap_a:
                errors.append(f"{snap_a} became {a.tolist()}")
            pool.free_blocks(a, reverse=True)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert pool.get_num_free_blocks() == 4095
    pool.check_invariants()


def _manager_allocations():
    """``KVCacheManager.allocate_slots`` for requests of one to three blocks, caching off."""
    mgr = core.KVCacheManager(64, 4, enable_caching=False)
    for i in range(20):
        rid = f"r{i}"
        mgr.add_request(rid, list(range(4 * (1 + i % 3))))
        yield mgr.allocate_slots(rid, 4 * (1 + i % 3)), (lambda rid=rid: mgr.free(rid))


def _table_allocations():
    """``BlockTables.allocate_slots`` alike, over a pool with a null block."""
    pool = core.BlockPool(64, enable_caching=False, null_block=True, block_size=4)
    tables = core.BlockTables(pool, max_model_len=64)
    for i in range(20):
        rid = f"r{i}"
        n = 4 * (1 + i % 3)
        yield tables.allocate_slots(rid, 0, n, [], n), (lambda rid=rid: tables.free(rid))


@pytest.mark.parametrize("allocations", [_manager_allocations, _table_allocations],
                         ids=["KVCacheManager", "BlockTables"])
def test_allocate_slots_results_held_never_change(allocations) -> None:
    """Results held across later calls keep their ids."""
    held = []
    for i, (ids, free) in enumerate(allocations()):
        _plain_int32(ids, len(ids))
        if i % 2:
            held.append((ids, ids.tolist()))
        free()
        del ids
        for kept, snapshot in held:
            assert kept.tolist() == snapshot
    assert len({id(ids) for ids, _ in held}) == len(held)
