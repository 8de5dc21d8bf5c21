"""Bad input, by category: each gives a specific ``KVPoolError`` subclass and changes nothing.

Categories: dtype (wrong Python or numpy types), range (out-of-range values), encoding
(strings UTF-8 cannot hold), aliasing (one object or id used twice in a call, arrays that
are views of odd memory), re-entrancy (Python code run by a conversion calling back into
kvpool), size (huge, empty and nested inputs, allocation failure). Every case snapshots the
object's observable state before and after the call.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from kvpool._errors import HAVE_CORE

pytestmark = pytest.mark.skipif(not HAVE_CORE, reason="kvpool._core is not built")

if HAVE_CORE:
    import kvpool
    from kvpool import (
        DoubleFreeError,
        DtypeError,
        HashWidthError,
        InvalidArgumentError,
        InvalidBlockIdError,
        KVPoolError,
        NoFreeBlocksError,
        OutOfMemoryError,
    )

BS = 4
DIGEST = b"\x01" * 32


def make_pool() -> Any:
    """A pool with held, cached and free blocks, and pending events."""
    pool = kvpool.BlockPool(32, block_size=BS, enable_events=True)
    held = pool.get_new_blocks(6)
    pool.cache_full_blocks(held, [bytes([i + 1]) * 32 for i in range(4)], 0, 4)
    pool.free_blocks(held[4:], reverse=True)
    return pool


def pool_state(pool: Any) -> Any:
    return (pool.free_block_ids().tolist(), pool.ref_counts().tolist(), pool.get_num_cached_blocks(),
            [pool.block_hash(i) for i in range(pool.num_blocks)], pool.num_pending_events, pool.num_dropped_events)


def make_manager() -> Any:
    m = kvpool.KVCacheManager(64, BS, enable_events=True, hash_algo="sha256")
    m.add_request("a", list(range(10)))
    m.allocate_slots("a", 10)
    m.add_request("b", list(range(6)))
    return m


def manager_state(m: Any) -> Any:
    rows = [(r, m.get_block_ids(r).tolist(), list(m.get_block_hashes(r)), m.get_num_tokens(r),
             m.get_num_computed_tokens(r)) for r in m.request_ids()]
    return (rows, m.free_block_ids().tolist(), m.ref_counts().tolist(), m.num_pending_events)


def make_tracker() -> Any:
    pool = make_pool()
    tracker = kvpool.ComputedBlocksTracker(pool, BS, hash_algo="sha256")
    tracker.add_sequence("s", list(range(9)))
    return tracker


def tracker_state(t: Any) -> Any:
    return (pool_state(t.pool), list(t.get_block_hashes("s")), t.get_token_ids("s").tolist(), len(t))


def make_hasher() -> Any:
    return kvpool.BlockHasher(BS, hash_algo="sha256")


def hasher_state(h: Any) -> Any:
    return (h.block_size, h.hash_algo, list(h.hash_tokens(list(range(8)))))


def make_tables() -> Any:
    """Block tables (vLLM's caller-owned form) with one running and one cached request."""
    pool = kvpool.BlockPool(32, block_size=BS, enable_events=True)
    tables = kvpool.BlockTables(pool, max_model_len=64)
    tables.allocate_slots("a", 0, 9, [DIGEST, b"\x02" * 32], 9)
    tables.allocate_slots("b", 0, 3, [], 3)
    return tables


def tables_state(t: Any) -> Any:
    rows = [(r, t.get_blocks(r).tolist(), t.num_cached_blocks(r)) for r in t.request_ids()]
    return (pool_state(t.pool), rows)


class FakeRequest:
    """What vLLM's scheduler hands ``allocate_slots``: a ``Request``'s four fields."""

    def __init__(self, request_id: Any, num_computed_tokens: Any, num_tokens: Any, block_hashes: Any) -> None:
        self.request_id, self.num_computed_tokens = request_id, num_computed_tokens
        self.num_tokens, self.block_hashes = num_tokens, block_hashes
        self.skip_reading_prefix_cache = False


def allocator(t: Any) -> Any:
    return kvpool.VllmManagerCalls(t, "EMPTY", tuple, list, (), 0)


TARGETS: dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]] = {
    "tables": (make_tables, tables_state),
    "pool": (make_pool, pool_state),
    "manager": (make_manager, manager_state),
    "tracker": (make_tracker, tracker_state),
    "hasher": (make_hasher, hasher_state),
}


def check(target: str, call: Callable[[Any], Any], error: type[BaseException]) -> None:
    make, state = TARGETS[target]
    obj = make()
    before = state(obj)
    with pytest.raises(error) as info:
        call(obj)
    assert isinstance(info.value, KVPoolError), f"{type(info.value).__name__} is not a KVPoolError"
    assert state(obj) == before, "a failed call changed the state"
    if target in ("pool", "manager", "tables"):
        assert obj.check_invariants() is None


def misaligned_int64(values: list[int]) -> np.ndarray:
    raw = b"\0" + np.array(values, np.int64).tobytes()
    arr = np.frombuffer(raw, np.int64, offset=1)
    assert not arr.flags.aligned
    return arr


DEEP: Any = 1
for _ in range(25_000):
    DEEP = (DEEP,)

# --------------------------------------------------------------------------------------------
# dtype: bools, unordered or bytes-like containers, floats, masked and object arrays.
# --------------------------------------------------------------------------------------------

DTYPE_CASES = [
    ("pool", lambda p: p.get_new_blocks(True)),
    ("pool", lambda p: p.get_new_blocks(np.True_)),
    ("pool", lambda p: p.free_blocks([True])),
    ("pool", lambda p: p.free_blocks(np.array([True, False]))),
    ("pool", lambda p: p.free_blocks(bytearray([1, 2]))),
    ("pool", lambda p: p.free_blocks(memoryview(b"\x01\x02"))),
    ("pool", lambda p: p.free_blocks({1, 2})),
    ("pool", lambda p: p.free_blocks(frozenset([1]))),
    ("pool", lambda p: p.free_blocks({1: 0, 2: 0})),
    ("pool", lambda p: p.free_blocks(b"\x01")),
    ("pool", lambda p: p.free_blocks("12")),
    ("pool", lambda p: p.free_blocks([1.0])),
    ("pool", lambda p: p.free_blocks(np.array([1.0]))),
    ("pool", lambda p: p.free_blocks(np.array([1, 2], dtype=object))),
    ("pool", lambda p: p.free_blocks(np.array([[1, 2]]))),
    ("pool", lambda p: p.free_blocks(np.ma.array([1, 2], mask=[0, 1]))),
    ("pool", lambda p: p.free_blocks(np.ma.array(np.array([1, 2], np.int32), mask=[0, 0]))),
    ("pool", lambda p: p.touch([True])),
    ("pool", lambda p: p.touch({1})),
    ("pool", lambda p: p.evict_blocks([False])),
    ("pool", lambda p: p.get_new_blocks_many([True, 1])),
    ("pool", lambda p: p.cache_full_blocks([1], [DIGEST], True, 1)),
    ("pool", lambda p: p.find_longest_cache_hit([DIGEST], max_blocks=True)),
    ("pool", lambda p: p.get_cached_block(True)),
    # The offload connector's reads.
    ("pool", lambda p: p.block_hash_num_tokens(1.0)),
    ("pool", lambda p: p.extra_block_hashes("1")),
    ("pool", lambda p: p.free_block_ids_after(True, 4)),
    ("pool", lambda p: p.free_block_ids_after(None, 4.0)),
    ("pool", lambda p: p.free_block_id_before(True)),
    ("pool", lambda p: p._set_block_hash(1, DIGEST, num_tokens=1.5)),
    ("manager", lambda m: m.allocate_slots("b", True)),
    ("manager", lambda m: m.schedule_step(["b"], True)),
    ("manager", lambda m: m.schedule_step(["b"], [True])),
    ("manager", lambda m: m.add_request(True, [1, 2])),
    ("manager", lambda m: m.add_request("c", [True, 2])),
    ("manager", lambda m: m.add_request("c", {1, 2})),
    ("manager", lambda m: m.add_request("c", np.ma.array([1, 2], mask=[1, 0]))),
    ("manager", lambda m: m.append_token_ids("b", [1.5])),
    ("manager", lambda m: m.set_num_computed_tokens("b", True)),
    ("tracker", lambda t: t.append_tokens("s", [True])),
    ("hasher", lambda h: h.hash_tokens([True, 1, 2, 3])),
    ("hasher", lambda h: h.hash_block(None, [1], True)),
    ("hasher", lambda h: h.hash_block(None, [1], [1])),
    ("hasher", lambda h: h.hash_block(bytearray(b"x"), [1])),
]


@pytest.mark.parametrize("target,call", DTYPE_CASES, ids=[f"{t}-{i}" for i, (t, _) in enumerate(DTYPE_CASES)])
def test_dtype(target: str, call: Callable[[Any], Any]) -> None:
    check(target, call, DtypeError)


def test_constructors_reject_bools() -> None:
    for make in (lambda: kvpool.BlockPool(True), lambda: kvpool.BlockPool(8, block_size=True),
                 lambda: kvpool.KVCacheManager(True, 4), lambda: kvpool.KVCacheManager(8, True),
                 lambda: kvpool.BlockHasher(True), lambda: kvpool.BlockPool(8, max_pending_events=True)):
        with pytest.raises(DtypeError):
            make()


# --------------------------------------------------------------------------------------------
# range: negative, too large, beyond int64, mismatched sizes.
# --------------------------------------------------------------------------------------------

RANGE_CASES: list[tuple[str, Callable[[Any], Any], type[BaseException]]] = [
    ("pool", lambda p: p.free_blocks([-1]), InvalidBlockIdError),
    ("pool", lambda p: p.free_blocks(np.array([-1], np.int32)), InvalidBlockIdError),
    ("pool", lambda p: p.free_blocks(np.array([2**63 - 1], np.uint64)), InvalidBlockIdError),
    ("pool", lambda p: p.free_blocks(np.array([2**64 - 1], np.uint64)), KVPoolError),
    ("pool", lambda p: p.free_blocks([2**70]), InvalidArgumentError),
    ("pool", lambda p: p.touch([32]), InvalidBlockIdError),
    ("pool", lambda p: p.evict_blocks([10**9]), InvalidBlockIdError),
    ("pool", lambda p: p.get_new_blocks(-1), InvalidArgumentError),
    ("pool", lambda p: p.get_new_blocks(2**62), NoFreeBlocksError),
    ("pool", lambda p: p.get_new_blocks_many([2**62, 2**62, 2**62]), NoFreeBlocksError),
    ("pool", lambda p: p.cache_full_blocks([1], [b""], 0, 1), HashWidthError),
    ("pool", lambda p: p.cache_full_blocks([1], [b"x" * 33], 0, 1), HashWidthError),
    ("pool", lambda p: p.find_longest_cache_hit([DIGEST], group_id=-1), InvalidArgumentError),
    ("pool", lambda p: p.block_hash_num_tokens(32), InvalidBlockIdError),
    ("pool", lambda p: p.extra_block_hashes(-1), InvalidBlockIdError),
    ("pool", lambda p: p.free_block_ids_after(10**9, 4), InvalidBlockIdError),
    ("pool", lambda p: p.free_block_id_before(10**9), InvalidBlockIdError),
    ("pool", lambda p: p.free_block_id_before(-1), InvalidBlockIdError),
    ("pool", lambda p: p.free_block_ids_after(None, -1), InvalidArgumentError),
    ("pool", lambda p: p.free_block_ids_after(None, 2**64), InvalidArgumentError),
    ("pool", lambda p: p._set_block_hash(1, DIGEST, num_tokens=0), InvalidArgumentError),
    ("manager", lambda m: m.allocate_slots("b", -1), InvalidArgumentError),
    ("manager", lambda m: m.schedule_step(["b", "a"], [1]), InvalidArgumentError),
    ("manager", lambda m: m.set_num_computed_tokens("b", 10**6), InvalidArgumentError),
    # Int-like request ids past int64 are out of range, as ints are (not of a wrong type).
    ("manager", lambda m: m.add_request(np.uint64(2**64 - 1), [1]), InvalidArgumentError),
    ("manager", lambda m: m.free_many(np.array([2**64 - 1], np.uint64)), InvalidArgumentError),
    ("hasher", lambda h: h.hash_block(b"", [1]), HashWidthError),
    ("hasher", lambda h: h.hash_block(b"x" * 33, [1]), HashWidthError),
    ("hasher", lambda h: h.hash_block(None, [1], 2**200), InvalidArgumentError),
]


@pytest.mark.parametrize("target,call,error", RANGE_CASES, ids=[f"{t}-{i}" for i, (t, _, _) in enumerate(RANGE_CASES)])
def test_range(target: str, call: Callable[[Any], Any], error: type[BaseException]) -> None:
    check(target, call, error)


TABLES_CASES: list[tuple[Callable[[Any], Any], type[BaseException]]] = [
    (lambda t: t.allocate_slots("c", 0, 8, [], True), DtypeError),
    (lambda t: t.allocate_slots("c", 0, 8, [], -1), InvalidArgumentError),
    (lambda t: t.allocate_slots("c", 0, 8, [], 0), InvalidArgumentError),
    (lambda t: t.allocate_slots("c", 0, 8, ["h"], 4), DtypeError),
    (lambda t: t.allocate_slots("c", 0, 8, [b"x" * 33], 4), HashWidthError),
    (lambda t: t.allocate_slots("a", 9, 10, [DIGEST, b"\x02" * 32, b"\x03" * 16], 1), HashWidthError),
    (lambda t: t.allocate_slots("c", 0, 8, [], 8, 4, [99]), InvalidBlockIdError),
    (lambda t: t.allocate_slots("c", 0, 8, [], 8, 4, {1}), DtypeError),
    (lambda t: t.allocate_slots("a", 9, 13, [DIGEST, b"\x02" * 32], 4, 4, [1]), InvalidArgumentError),
    (lambda t: t.allocate_slots(S, 0, 8, [], 4), InvalidArgumentError),
    (lambda t: t.cache_blocks("a", [DIGEST, b"\x02" * 32, b"\x03" * 16], 12), HashWidthError),
    # Token ids (for the events) too few for the blocks the call caches: refused before
    # any block is allocated.
    (lambda t: t.allocate_slots("c", 0, 8, [DIGEST, b"\x02" * 32], 8, token_ids=[1, 2, 3]),
     InvalidArgumentError),
    (lambda t: t.num_blocks_to_allocate("a", True), DtypeError),
    (lambda t: allocator(t).allocate_slots(FakeRequest("c", 0, 8, []), True), DtypeError),
    (lambda t: allocator(t).allocate_slots(object(), 4), DtypeError),
    (lambda t: allocator(t).allocate_slots(FakeRequest("c", 0, 8, [1]), 4), DtypeError),
    (lambda t: allocator(t).get_computed_blocks(object()), DtypeError),
    (lambda t: allocator(t).get_computed_blocks(FakeRequest("c", 0, 8, ["h"])), DtypeError),
    (lambda t: allocator(t).get_computed_blocks(FakeRequest("c", 0, 8, [b"x" * 33])), HashWidthError),
    (lambda t: allocator(t).get_computed_blocks(FakeRequest("c", 0, True, [DIGEST])), DtypeError),
    (lambda t: allocator(t).get_computed_blocks(FakeRequest("c", 0, 8, [DIGEST]), 2.0), DtypeError),
    (lambda t: allocator(t).get_blocks(1.5), DtypeError),
    (lambda t: allocator(t).estimate_cached_tokens(object()), DtypeError),
    (lambda t: allocator(t).free(object()), DtypeError),
    (lambda t: allocator(t).free(FakeRequest(b"a", 0, 8, [])), DtypeError),
    (lambda t: allocator(t).free(FakeRequest(S, 0, 8, [])), InvalidArgumentError),
]


@pytest.mark.parametrize("call,error", TABLES_CASES, ids=[f"tables-{i}" for i in range(len(TABLES_CASES))])
def test_block_tables_and_the_vllm_allocator(call: Callable[[Any], Any], error: type[BaseException]) -> None:
    """The caller-owned tables and vLLM's allocate_slots entry point validate every argument."""
    check("tables", call, error)


def test_block_tables_need_a_pool_and_a_length() -> None:
    for make in (lambda: kvpool.BlockTables(object(), max_model_len=8),
                 lambda: kvpool.BlockTables(kvpool.BlockPool(8), max_model_len=True)):
        with pytest.raises(DtypeError):
            make()
    with pytest.raises(InvalidArgumentError):
        kvpool.BlockTables(kvpool.BlockPool(8), max_model_len=0)


def test_tracker_block_size_must_match_the_pool() -> None:
    pool = kvpool.BlockPool(8, block_size=16)
    with pytest.raises(InvalidArgumentError):
        kvpool.ComputedBlocksTracker(pool, 4)
    assert kvpool.ComputedBlocksTracker(pool, 16).block_size == 16


def test_event_bound_must_be_positive() -> None:
    for make in (lambda: kvpool.BlockPool(8, max_pending_events=0),
                 lambda: kvpool.KVCacheManager(8, 4, max_pending_events=-1)):
        with pytest.raises(InvalidArgumentError):
            make()


# --------------------------------------------------------------------------------------------
# encoding: lone surrogates in every str argument.
# --------------------------------------------------------------------------------------------

S = "\ud800"
ENCODING_CASES = [
    ("manager", lambda m: m.add_request(S, [1, 2])),
    ("manager", lambda m: m.add_request("c", [1, 2], cache_salt=S)),
    ("manager", lambda m: m.add_request("c", [1, 2], lora=(S, "/p"))),
    ("manager", lambda m: m.add_request("c", [1, 2], lora=("n", S))),
    ("manager", lambda m: m.add_request("c", [1, 2], mm_features=[(S, 0, 1)])),
    ("manager", lambda m: m.free(S)),
    ("pool", lambda p: p.cache_full_blocks([1], [DIGEST], 0, 1, lora_name=S)),
    ("tracker", lambda t: t.add_sequence(S, [1, 2])),
    ("hasher", lambda h: h.hash_tokens([1, 2, 3, 4], cache_salt=S)),
    ("hasher", lambda h: h.hash_block(None, [1], (S,))),
]


@pytest.mark.parametrize("target,call", ENCODING_CASES, ids=[f"{t}-{i}" for i, (t, _) in enumerate(ENCODING_CASES)])
def test_encoding(target: str, call: Callable[[Any], Any]) -> None:
    check(target, call, InvalidArgumentError)


def test_encoding_in_constructors_and_functions() -> None:
    for call in (lambda: kvpool.BlockHasher(4, hash_algo=S), lambda: kvpool.BlockHasher(4, seed=S),
                 lambda: kvpool.KVCacheManager(8, 4, seed=S), lambda: kvpool.hash_value(S),
                 lambda: kvpool.encode_hash_input((1, S), "sha256"), lambda: kvpool.compute_none_hash("sha256", S)):
        with pytest.raises(InvalidArgumentError):
            call()


# --------------------------------------------------------------------------------------------
# aliasing: one id twice in a call, one object twice, views of odd memory.
# --------------------------------------------------------------------------------------------

ALIASING_CASES: list[tuple[str, Callable[[Any], Any], type[BaseException]]] = [
    ("pool", lambda p: p.free_blocks([1, 2, 3, 1, 2, 3, 1]), DoubleFreeError),
    ("pool", lambda p: p.free_blocks_many([[1, 2], [2, 3], [3]]), DoubleFreeError),
    ("pool", lambda p: p.cache_full_blocks([1, 1], [DIGEST, DIGEST], 0, 2), KVPoolError),
    ("manager", lambda m: m.free_many(["a", "a"]), KVPoolError),
    ("manager", lambda m: m.add_request("a", [1, 2]), KVPoolError),
]


@pytest.mark.parametrize("target,call,error", ALIASING_CASES,
                         ids=[f"{t}-{i}" for i, (t, _, _) in enumerate(ALIASING_CASES)])
def test_aliasing(target: str, call: Callable[[Any], Any], error: type[BaseException]) -> None:
    check(target, call, error)


@pytest.mark.parametrize("method", ["free_blocks", "touch", "evict_blocks"])
def test_misaligned_and_byte_swapped_arrays_are_read_correctly(method: str) -> None:
    """Arrays kvpool cannot read in place are copied, never read through a bad pointer."""
    for ids in (misaligned_int64([3, 4]), np.array([3, 4], dtype=">i8"), np.array([3, 4], dtype=">i4"),
                np.array([0, 3, 0, 4], np.int64)[1::2], np.array([4, 3], np.int32)[::-1]):
        pool, twin = make_pool(), make_pool()
        getattr(pool, method)(ids)
        getattr(twin, method)([3, 4])
        assert pool_state(pool) == pool_state(twin)


def test_misaligned_token_arrays() -> None:
    tokens = misaligned_int64(list(range(9)))
    h = make_hasher()
    assert list(h.hash_tokens(tokens)) == list(h.hash_tokens(list(range(9))))
    m = make_manager()
    m.add_request("c", tokens)
    assert m.get_num_tokens("c") == 9


def test_shared_objects_in_one_call() -> None:
    """The same object twice (a LoRA's name and path, a tuple in extra keys) is not an error."""
    name = "adapter-" + "z" * 10
    h = make_hasher()
    h.hash_tokens(list(range(8)), lora=(name, name))
    t = ("x", 1)
    assert h.hash_block(None, [1], (t, t)) == kvpool.hash_value(
        (kvpool.compute_none_hash("sha256"), (1,), (t, t)), "sha256")


# --------------------------------------------------------------------------------------------
# re-entrancy: conversions that run Python code calling back into the same object.
# --------------------------------------------------------------------------------------------


class CallsBack(int):
    """An int whose ``__index__`` calls ``hook`` first (run during conversion)."""

    hook: Callable[[], Any] = staticmethod(lambda: None)

    def __index__(self) -> int:
        type(self).hook()
        return int(self)


def test_index_calling_back_into_the_pool() -> None:
    pool = make_pool()
    seen: list[int] = []
    CallsBack.hook = staticmethod(lambda: seen.append(pool.get_num_free_blocks()))
    ids = pool.get_new_blocks(2).tolist()
    pool.free_blocks([np.int64(ids[0]), CallsBack(ids[1])])  # no deadlock
    assert pool.check_invariants() is None
    CallsBack.hook = staticmethod(lambda: None)


def test_generator_calling_back_into_the_hasher() -> None:
    h = make_hasher()

    def tokens() -> Any:
        for i in range(8):
            h.hash_tokens([1, 2, 3, 4])  # the same hasher, mid-conversion
            yield i

    assert list(h.hash_tokens(tokens())) == list(h.hash_tokens(list(range(8))))


def test_gc_callback_calling_back_into_the_manager() -> None:
    m = make_manager()
    calls: list[Any] = []

    def callback(phase: str, info: dict[str, Any]) -> None:
        calls.append(m.request_ids())

    gc.callbacks.append(callback)
    try:
        for _ in range(50):
            m.request_ids()
            m.get_block_ids("a")
            gc.collect()
    finally:
        gc.callbacks.remove(callback)
    assert calls and m.check_invariants() is None


# --------------------------------------------------------------------------------------------
# size: huge, empty and nested inputs, allocation failure.
# --------------------------------------------------------------------------------------------


def test_deep_nesting_is_an_error_not_a_crash() -> None:
    for call in (lambda: kvpool.hash_value(DEEP), lambda: kvpool.encode_hash_input(DEEP, "sha256"),
                 lambda: kvpool.encode_hash_input(DEEP, "sha256_cbor")):
        with pytest.raises(InvalidArgumentError):
            call()
    check("hasher", lambda h: h.hash_block(None, [1], DEEP), InvalidArgumentError)
    ok: Any = 1
    for _ in range(99):
        ok = (ok,)
    kvpool.hash_value(ok)  # 99 tuples deep is fine


@pytest.mark.parametrize("make", [lambda: kvpool.BlockPool(2**31 - 1), lambda: kvpool.KVCacheManager(2**31 - 1, 16)],
                         ids=["pool", "manager"])
def test_pools_too_large_for_memory_raise_memory_errors(make: Callable[[], Any]) -> None:
    """A 32 GiB block table on a machine without it: an error, never an abort."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (8 << 30, hard))
    try:
        with pytest.raises(OutOfMemoryError) as info:
            make()
        assert isinstance(info.value, MemoryError)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_empty_batches_change_nothing() -> None:
    pool = make_pool()
    before = pool_state(pool)
    pool.free_blocks([])
    pool.touch(np.array([], np.int32))
    pool.evict_blocks(())
    pool.get_new_blocks(0)
    pool.get_new_blocks_many([])
    assert pool.find_longest_cache_hit([]).tolist() == []
    assert pool_state(pool) == before
    m = make_manager()
    before = manager_state(m)
    m.schedule_step([], 4)
    m.free_many([])
    assert manager_state(m) == before


def test_a_manager_without_caching_refuses_uint64_tokens_past_int64() -> None:
    manager = kvpool.KVCacheManager(16, 4, enable_caching=False)
    with pytest.raises(InvalidArgumentError, match="beyond int64"):
        manager.add_request("a", np.array([1, 2**64 - 1], dtype=np.uint64))
    assert "a" not in manager
    assert manager.add_request("a", np.array([1, 2**63 - 1], dtype=np.uint64)) is None


def test_connector_tokens_past_max_model_len_get_no_blocks_past_it() -> None:
    pool = kvpool.BlockPool(64, block_size=BS)
    tables = kvpool.BlockTables(pool, max_model_len=8)
    tables.allocate_slots("r", 0, 8, [], 1, num_external_computed_tokens=100)
    assert len(tables.get_blocks("r")) == 8 // BS
    tables.check_invariants()


class _BadIndex:
    def __index__(self) -> int:
        raise ValueError("no")


PARITY_CASES: list[tuple[str, Callable[[Any], Any], type[BaseException]]] = [
    ("hash_tokens, a masked array", lambda m: m.BlockHasher(4).hash_tokens(np.ma.array(np.arange(8))), DtypeError),
    ("hash_tokens, a dict", lambda m: m.BlockHasher(4).hash_tokens({1: 2, 3: 4}), DtypeError),
    ("hash_tokens, a bytearray", lambda m: m.BlockHasher(4).hash_tokens(bytearray(8)), DtypeError),
    ("hash_tokens, an __index__ that raises", lambda m: m.BlockHasher(4).hash_tokens([1, _BadIndex()]), DtypeError),
    ("hash_blocks_from past block 0, a dict", lambda m: m.BlockHasher(4).hash_blocks_from(None, {1: 2}, 1), DtypeError),
    ("hash_blocks_from past block 0, an int", lambda m: m.BlockHasher(4).hash_blocks_from(None, 5, 1), DtypeError),
    ("a request id with a lone surrogate", lambda m: m.KVCacheManager(8, 4).add_request("\ud800", [1]),
     InvalidArgumentError),
    ("a cache salt with a lone surrogate", lambda m: m.BlockHasher(4).hash_tokens([1] * 8, cache_salt="\ud800"),
     InvalidArgumentError),
    ("a hash-input str with a lone surrogate", lambda m: m.BlockHasher(4).hash_block(None, [1], ("\ud800",)),
     InvalidArgumentError),
]


@pytest.mark.parametrize("case,call,error", PARITY_CASES, ids=[c[0] for c in PARITY_CASES])
def test_the_reference_refuses_what_rust_refuses(case: str, call: Callable[[Any], Any],
                                                 error: type[BaseException]) -> None:
    import kvpool.reference

    for module in (kvpool, kvpool.reference):
        with pytest.raises(error):
            call(module)


class _StickyArray(np.ndarray):
    """An array subclass whose ``astype`` returns the array itself (as a lazy or caching
    wrapper might): kvpool casts with ``numpy.ndarray.astype`` instead (the subclass's own
    sent the conversions into endless recursion, a crash)."""

    def astype(self, *args: Any, **kwargs: Any) -> Any:
        return self


def test_an_array_subclass_is_cast_by_numpy_not_by_its_own_astype() -> None:
    import kvpool.reference

    int16 = np.array([1, 2, 3, 4], dtype=np.int16).view(_StickyArray)
    swapped = np.array([1, 2, 3, 4], dtype=">i8").view(_StickyArray)
    for tokens in (int16, swapped):
        got = kvpool.BlockHasher(2).hash_tokens(tokens)
        assert list(got) == kvpool.reference.BlockHasher(2).hash_tokens(tokens)
    pool = kvpool.BlockPool(8)
    pool.touch(np.array([1, 2], dtype=np.int16).view(_StickyArray))
    assert [pool.ref_count(i) for i in (1, 2)] == [1, 1]
    pool.check_invariants()


@pytest.mark.parametrize("spec", ["\ud800", ("\ud800", 4), ("\ud800", None, 8)])
def test_group_specs_with_a_lone_surrogate(spec: Any) -> None:
    pool = kvpool.BlockPool(64, block_size=4)
    for call in (lambda: kvpool.GroupTables(pool, [spec], max_model_len=64),
                 lambda: kvpool.GroupManager(64, 4, [spec]),
                 lambda: kvpool.find_group_hit(pool, spec, [], 10)):
        with pytest.raises(InvalidArgumentError, match="lone surrogate"):
            call()


def test_arguments_pyo3_used_to_convert_raise_kvpool_errors() -> None:
    """Arguments that were typed in the binding's signature (so PyO3 raised its own
    TypeError or ValueError) are now checked by kvpool."""
    pool = kvpool.BlockPool(64, block_size=4)
    tables = kvpool.BlockTables(pool, max_model_len=64)
    with pytest.raises(DtypeError, match="timeout"):
        kvpool.ReplayRing(4, 1000).drain("x")
    with pytest.raises(InvalidArgumentError, match="timeout"):
        kvpool.ReplayRing(4, 1000).drain(-1)
    with pytest.raises(DtypeError, match="kvpool.BlockTables"):
        kvpool.VllmManagerCalls(pool, (), list, list, (), 0)
    with pytest.raises(DtypeError, match="waiting_statuses must be a tuple"):
        kvpool.VllmManagerCalls(tables, (), list, list, [], 0)
    group_tables = kvpool.GroupTables(pool, ["full"], max_model_len=64)
    with pytest.raises(DtypeError, match="kvpool.GroupTables"):
        kvpool.VllmGroupCalls(tables, (), list, list, (), 0)
    with pytest.raises(DtypeError, match="waiting_statuses must be a tuple"):
        kvpool.VllmGroupCalls(group_tables, (), list, list, [], 0)
    hashes = kvpool.BlockHasher(4).hash_tokens(list(range(16)))
    with pytest.raises(InvalidArgumentError, match="slice step cannot be zero"):
        hashes[::0]
