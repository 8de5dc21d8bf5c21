"""Token lists read in place (``src/bindings/int_reader.rs``): CPython ``int`` objects are read
from their digits, not converted one call each. The reader must give exactly what the general
conversion gives, for every value on both sides of its digit boundaries, and leave everything
else (other types, ``bool``, ``int`` subclasses, ints beyond two digits, lists changed while
they are read) to the general path, with the same results and errors as before.

Each case compares a list with the same tokens as an ``int64`` array (read without the
reader) or with the reference hasher, through ``BlockHasher.hash_tokens`` (which reads lists
block by block while it hashes), ``BlockHasher.hash_block`` and ``KVCacheManager.add_request``
(which convert the whole list first).
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
        assert hasher.hash_tokens(tokens).to_list() == hasher.hash_tokens(plain).to_list()
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
    tokens: list[Any] = list(range(8))

    class Growing:
        def __index__(self) -> int:
            tokens.extend(range(100, 104))
            return 7

    tokens[7] = Growing()
    hashes = core.BlockHasher(4, hash_algo="xxhash").hash_tokens(tokens)
    expected = core.BlockHasher(4, hash_algo="xxhash").hash_tokens(
        [0, 1, 2, 3, 4, 5, 6, 7, 100, 101, 102, 103])
    assert hashes.to_list() == expected.to_list()


def test_block_ids_from_lists_read_in_place() -> None:
    pool = core.BlockPool(100, enable_caching=False)
    ids = pool.get_new_blocks(10)
    pool.free_blocks([int(i) for i in ids])
    assert pool.get_num_free_blocks() == 99
    with pytest.raises(DtypeError):
        pool.free_blocks([1, True])
    assert pool.get_num_free_blocks() == 99
