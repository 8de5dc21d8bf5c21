"""Python objects read in place.

Token lists (``src/bindings/int_reader.rs``): CPython ``int`` objects are read
from their digits, not converted one call each. The reader must give exactly what the general
conversion gives, for every value on both sides of its digit boundaries, and leave everything
else (other types, ``bool``, ``int`` subclasses, ints beyond two digits, lists changed while
they are read) to the general path, with the same results and errors as before.

Each case compares a list with the same tokens as an ``int64`` array (read without the
reader) or with the reference hasher, through ``BlockHasher.hash_tokens`` (which reads lists
block by block while it hashes), ``BlockHasher.hash_block`` and ``KVCacheManager.add_request``
(which convert the whole list first).

Block-id arrays (``src/bindings/array_reader.rs``): plain 1-D numpy arrays of 4- or 8-byte
integers are copied once from their memory, at any stride (``ids[::-1]`` among them), and
``free_blocks`` (a contiguous 4-byte array or its reversed view) and ``cache_full_blocks``
(a contiguous one) read the ids straight from the array's memory, with no copy. Every dtype, stride and range must give what the general conversion
gives, and every other array the same error as before.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool._errors import HAVE_CORE, DtypeError, InvalidArgumentError
from kvpool.reference import hashing as ref

pytestmark = pytest.mark.skipif(not HAVE_CORE, reason="kvpool._core is not built")

if HAVE_CORE:
    import kvpool._core as core

ALGOS = ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]
DIGIT = 2**30
# Both sides of every boundary the reader and the block encoders handle: digit counts (0, 1,
# 2, 3 digits of 30 bits), the pickle and CBOR integer forms, the 32-bit range of the short
# hashing path, and int64's ends.
EDGES = sorted({
    e + d for e in (0, 23, 24, 255, 256, 65_535, 65_536, DIGIT, 2**31, 2**32, DIGIT**2, 2**62)
    for d in (-1, 0, 1)
} | {2**63 - 1})
EDGES = sorted(set(EDGES) | {-e for e in EDGES} | {-(2**63)})


def test_the_reader_is_on_where_the_layout_is_known() -> None:
    # Wheels for CPython with the GIL read in place; the stable-ABI build and free-threaded
    # builds do not (then every other test here checks the general path).
    free_threaded = bool(getattr(sys, "_is_gil_enabled", lambda: True)() is False)
    limited = core.__file__.endswith(".abi3.so")
    if sys.implementation.name == "cpython" and not free_threaded and not limited:
        assert core._reads_ints_in_place is True
    else:
        assert core._reads_ints_in_place is False


@pytest.mark.parametrize("algo", ALGOS)
def test_every_edge_value_reads_as_the_array_does(algo: str) -> None:
    hasher = core.BlockHasher(4, hash_algo=algo)
    tokens = [7, 8, 9] + EDGES + [5, 6]  # the edges fall in every position of a block
    for start in range(4):
        chunk = tokens[start:]
        expected = hasher.hash_tokens(np.array(chunk, dtype=np.int64)).to_list()
        assert hasher.hash_tokens(chunk).to_list() == expected
        assert hasher.hash_tokens(tuple(chunk)).to_list() == expected
        assert ref.BlockHasher(4, hash_algo=algo).hash_tokens(chunk) == expected


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("tokens", [[], [5], [1, 2, 3]], ids=repr)
def test_lists_without_a_full_block_hash_to_nothing(algo: str, tokens: list[int]) -> None:
    # An empty list has no item array at all (a null pointer in CPython): nothing is read.
    hasher = core.BlockHasher(4, hash_algo=algo)
    assert hasher.hash_tokens(tokens).to_list() == []
    assert hasher.hash_tokens(tuple(tokens)).to_list() == []


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.lists(st.one_of(st.sampled_from(EDGES), st.integers(-(2**63), 2**63 - 1),
                              st.integers(0, 200_000)), max_size=70),
    block_size=st.integers(1, 9),
    algo=st.sampled_from(ALGOS),
)
def test_random_lists_hash_as_arrays_do(tokens: list[int], block_size: int, algo: str) -> None:
    hasher = core.BlockHasher(block_size, hash_algo=algo)
    expected = hasher.hash_tokens(np.array(tokens, dtype=np.int64)).to_list()
    assert hasher.hash_tokens(tokens).to_list() == expected
    # vLLM's form, a list of bytes made as the chain runs, from every block on.
    for start in range(len(expected) + 1):
        parent = expected[start - 1] if start else None
        assert hasher.hash_blocks_from(parent, tokens, start) == expected[start:]
    full = len(tokens) // block_size * block_size
    if full:
        assert hasher.hash_block(None, tokens[:block_size]) == expected[0]


class Index:
    """Not an int, but has ``__index__`` (as numpy's integers do)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


class Int(int):
    """A subclass of ``int``: read through the general path, with its value."""


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("odd", [np.int64(70_000), np.int32(-5), Index(3), Int(2**40), Int(9)],
                         ids=repr)
def test_other_int_like_items_take_the_general_path(algo: str, odd: Any) -> None:
    for position in (0, 5, 9):  # first block, mid-block, the partial tail
        tokens: list[Any] = list(range(1000, 1010))
        tokens[position] = odd
        plain = [int(t) for t in tokens]
        hasher = core.BlockHasher(4, hash_algo=algo)
        whole = hasher.hash_tokens(plain).to_list()
        assert hasher.hash_tokens(tokens).to_list() == whole
        # The list's pass stops at the odd item and the general path goes on from there.
        for start in range(3):
            assert hasher.hash_blocks_from(whole[start - 1] if start else None, tokens, start) == whole[start:]
        manager = core.KVCacheManager(64, 4, max_model_len=64, enable_caching=True, hash_algo=algo)
        manager.add_request("r", tokens)
        assert list(manager.get_block_hashes("r")) == hasher.hash_tokens(plain).to_list()


@pytest.mark.parametrize("bad", [True, False, 1.0, "1", None, b"x", [1]], ids=repr)
@pytest.mark.parametrize("position", [0, 5, 9])
def test_bad_items_raise_wherever_they_are(bad: Any, position: int) -> None:
    tokens: list[Any] = list(range(10))
    tokens[position] = bad
    hasher = core.BlockHasher(4, hash_algo="sha256")
    with pytest.raises(DtypeError):
        hasher.hash_tokens(tokens)
    with pytest.raises(DtypeError):
        hasher.hash_tokens(tuple(tokens))


@pytest.mark.parametrize("big", [2**63, -(2**63) - 1, 2**100])
@pytest.mark.parametrize("position", [0, 5, 9])
def test_ints_beyond_int64_raise_wherever_they_are(big: int, position: int) -> None:
    tokens = list(range(10))
    tokens[position] = big
    with pytest.raises(InvalidArgumentError):
        core.BlockHasher(4, hash_algo="xxhash").hash_tokens(tokens)


def test_a_list_emptied_while_it_is_read() -> None:
    # An item's __index__ (Python code, run by the general path) empties the list: the
    # conversion stops where the list now ends, as iterating it would, and nothing crashes.
    tokens: list[Any] = list(range(12))

    class Clearing:
        def __index__(self) -> int:
            tokens.clear()
            return 77

    tokens[6] = Clearing()
    hashes = core.BlockHasher(4, hash_algo="sha256").hash_tokens(tokens)
    expected = core.BlockHasher(4, hash_algo="sha256").hash_tokens([0, 1, 2, 3, 4, 5, 77])
    assert hashes.to_list() == expected.to_list()


def test_a_list_grown_while_it_is_read() -> None:
    # As PyO3's list iterator (and so the stable-ABI build): the items the list had when
    # the call began; those appended meanwhile are not read.
    tokens: list[Any] = list(range(8))

    class Growing:
        def __index__(self) -> int:
            tokens.extend(range(100, 104))
            return 7

    tokens[6] = Growing()
    hashes = core.BlockHasher(4, hash_algo="xxhash").hash_tokens(tokens)
    expected = core.BlockHasher(4, hash_algo="xxhash").hash_tokens([0, 1, 2, 3, 4, 5, 7, 7])
    assert hashes.to_list() == expected.to_list()
    assert len(tokens) == 12


def test_block_ids_from_lists_read_in_place() -> None:
    pool = core.BlockPool(100, enable_caching=False)
    ids = pool.get_new_blocks(10)
    pool.free_blocks([int(i) for i in ids])
    assert pool.get_num_free_blocks() == 99
    with pytest.raises(DtypeError):
        pool.free_blocks([1, True])
    assert pool.get_num_free_blocks() == 99


def freed_order(ids: Any, reverse: bool = False) -> tuple[list[int], list[int]]:
    """Free ``ids`` (a view of blocks just allocated) from a fresh pool; the free queue after."""
    pool = core.BlockPool(64, enable_caching=False)
    held = pool.get_new_blocks(20)
    view = ids(held)
    pool.free_blocks(view, reverse=reverse)
    return pool.free_block_ids()[:25].tolist(), [int(x) for x in np.asarray(view)]


VIEWS = {
    "contiguous": lambda a: a,
    "reversed": lambda a: a[::-1],
    "every other": lambda a: a[::2],
    "every third reversed": lambda a: a[::-3],
    "int64 copy reversed": lambda a: a.astype(np.int64)[::-1],
    "uint32": lambda a: a.astype(np.uint32),
    "uint32 reversed": lambda a: a.astype(np.uint32)[::-1],
    "reversed twice": lambda a: a[::-1][::-1],
    "part of a reversed view": lambda a: a[::-1][3:15],
    "one element reversed": lambda a: a[4:5][::-1],
    "empty reversed": lambda a: a[:0][::-1],
    "uint64 reversed": lambda a: a.astype(np.uint64)[::-1],
    "int16": lambda a: a.astype(np.int16),
    "a column of a 2-D array": lambda a: np.stack([a, a], axis=1)[:, 0],
    "a column of a Fortran array": lambda a: np.asfortranarray(np.stack([a, a], axis=1))[:, 1],
    "big-endian": lambda a: a.astype(">i4"),
}


@pytest.mark.parametrize("view", VIEWS.values(), ids=VIEWS.keys())
@pytest.mark.parametrize("reverse", [False, True])
def test_id_arrays_free_as_lists_do(view: Any, reverse: bool) -> None:
    queue, ids = freed_order(view, reverse)
    pool = core.BlockPool(64, enable_caching=False)
    pool.get_new_blocks(20)
    pool.free_blocks(ids, reverse=reverse)
    assert pool.free_block_ids()[:25].tolist() == queue


BAD_ID_ARRAYS = {
    "negative int32": (np.array([3, -1], dtype=np.int32), "InvalidBlockIdError", "-1"),
    "negative int32 reversed": (np.array([-7, 3], dtype=np.int32)[::-1], "InvalidBlockIdError", "-7"),
    "past the pool, reversed": (np.array([64, 3], dtype=np.int32)[::-1], "InvalidBlockIdError", "64"),
    "freed twice in one call": (np.array([3, 5, 3], dtype=np.int32), "DoubleFreeError", "3"),
    "already free, reversed": (np.array([40, 3], dtype=np.int32)[::-1], "DoubleFreeError", "40"),
    "negative int64 reversed": (np.array([-5, 3], dtype=np.int64)[::-1], "InvalidBlockIdError", "-5"),
    "past the pool": (np.array([3, 64], dtype=np.int32), "InvalidBlockIdError", "64"),
    "past the pool, uint32": (np.array([2**32 - 1], dtype=np.uint32), "InvalidBlockIdError", str(2**32 - 1)),
    "past int32, int64": (np.array([2**40], dtype=np.int64), "InvalidBlockIdError", str(2**40)),
    "beyond int64, uint64": (np.array([2**64 - 1], dtype=np.uint64), "InvalidArgumentError", "int64"),
    "bool": (np.array([True, False]), "DtypeError", "bool"),
    "float": (np.array([1.0, 2.0]), "DtypeError", "float"),
    "2-D": (np.zeros((2, 2), dtype=np.int32), "DtypeError", ""),
}


FREE_CALLS = {
    "free_blocks": lambda pool, ids: pool.free_blocks(ids),
    # One segment: the ids are copied out (read once, checked as a whole) rather than lent.
    "free_blocks_many": lambda pool, ids: pool.free_blocks_many(ids, np.array([0, len(ids)], dtype=np.int64)),
}


BAD_ID_CALLS = [
    pytest.param(array, error, text, call, id=f"{name}-{call_name}")
    for name, (array, error, text) in BAD_ID_ARRAYS.items()
    for call_name, call in FREE_CALLS.items()
    # A 2-D array has no segments to give free_blocks_many.
    if array.ndim == 1 or call_name == "free_blocks"
]


@pytest.mark.parametrize("array,error,text,call", BAD_ID_CALLS)
def test_bad_id_arrays_raise_and_change_nothing(array: Any, error: str, text: str, call: Any) -> None:
    import kvpool

    pool = core.BlockPool(64, enable_caching=False)
    pool.get_new_blocks(10)
    before = (pool.free_block_ids().tolist(), pool.get_num_free_blocks())
    with pytest.raises(getattr(kvpool, error)) as info:
        call(pool, array)
    assert text in str(info.value) or not text
    assert (pool.free_block_ids().tolist(), pool.get_num_free_blocks()) == before


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("view", [lambda a: a, lambda a: a[::-1]], ids=["contiguous", "reversed"])
def test_the_first_bad_id_in_logical_order_is_reported(view: Any, reverse: bool) -> None:
    # The copy checks a whole array at once, then finds the first bad id as the array orders
    # its elements (a reversed view's first is the last in memory).
    pool = core.BlockPool(64, enable_caching=False)
    pool.get_new_blocks(10)
    ids = view(np.array([3, 70, 80, 4], dtype=np.int32))
    with pytest.raises(core.InvalidBlockIdError, match=str(ids[1])):
        pool.free_blocks_many(ids, np.array([0, 4], dtype=np.int64), reverse=reverse)


def test_a_masked_array_is_refused_not_read() -> None:
    pool = core.BlockPool(64, enable_caching=False)
    ids = pool.get_new_blocks(4)
    with pytest.raises(DtypeError, match="masked"):
        pool.free_blocks(np.ma.masked_array(ids, mask=[0, 1, 0, 0]))
    pool.free_blocks(ids)


def test_a_misaligned_array_is_copied_not_read() -> None:
    pool = core.BlockPool(64, enable_caching=False)
    ids = pool.get_new_blocks(4)
    raw = np.zeros(4 * 4 + 1, dtype=np.uint8)
    misaligned = raw[1:].view(np.int32)
    misaligned[:] = ids
    assert not misaligned.flags.aligned
    pool.free_blocks(misaligned, reverse=True)
    assert pool.get_num_free_blocks() == 63


@pytest.mark.parametrize("view", [lambda a: a, lambda a: a[::-1][::-1], lambda a: a[::-1]],
                         ids=["as handed out", "reversed twice", "reversed"])
def test_cache_full_blocks_reads_id_arrays_as_lists(view: Any) -> None:
    def cached(ids_of: Any) -> list[Any]:
        pool = core.BlockPool(64, enable_caching=True)
        held = pool.get_new_blocks(6)
        keys = [bytes([i]) * 32 for i in range(6)]
        pool.cache_full_blocks(ids_of(held), keys, 0, 6)
        return [pool.get_cached_block(k) for k in keys]

    assert cached(view) == cached(lambda a: [int(x) for x in view(a)])


def test_cache_full_blocks_refuses_a_bad_id_in_an_array_and_changes_nothing() -> None:
    import kvpool

    pool = core.BlockPool(64, enable_caching=True)
    held = pool.get_new_blocks(3)
    bad = held.copy()
    bad[2] = -4
    with pytest.raises(kvpool.InvalidBlockIdError, match="-4"):
        pool.cache_full_blocks(bad, [b"a" * 32, b"b" * 32, b"c" * 32], 0, 3)
    assert pool.get_cached_block(b"a" * 32) is None
    pool.check_invariants()
