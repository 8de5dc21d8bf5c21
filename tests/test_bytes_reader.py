"""Block hashes given as a list of ``bytes`` are read in place (``src/bindings/bytes_reader.rs``)
up to the first item that is not a plain ``bytes`` of the call's width; the rest goes through
the general conversion. Whatever the list holds, the outcome must be the general path's: a
tuple of the same items (always converted the general way) gives the same pool state or the
same error, and the reference pool agrees."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvpool
from kvpool.reference import BlockPool as RefPool


class BytesSubclass(bytes):
    pass


def item(kind: str, n: int, width: int) -> object:
    raw = n.to_bytes(width, "big") if width else b""
    return {
        "bytes": raw,
        "subclass": BytesSubclass(raw),
        "bytearray": bytearray(raw),
        "memoryview": memoryview(raw),
        "str": raw.hex(),
        "int": n,
    }[kind]


def outcome(pool_cls: type, hashes: object) -> tuple:
    """Cache 6 blocks under ``hashes`` (or fail), then what the pool shows."""
    pool = pool_cls(16, enable_caching=True, block_size=4)
    ids = pool.get_new_blocks(6)
    try:
        pool.cache_full_blocks(ids, hashes, 0, len(hashes) if len(hashes) <= 6 else 6)
    except Exception as e:  # noqa: BLE001 - the error is what is compared
        return ("error", type(e).__name__, str(e), pool.get_num_free_blocks())
    hit = pool.find_longest_cache_hit(hashes[:6] if len(hashes) else hashes)
    return ("ok", np.asarray(hit).tolist(), pool.hash_width)


KINDS = ["bytes", "bytes", "bytes", "subclass", "bytearray", "memoryview", "str", "int"]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(KINDS), st.sampled_from([32, 32, 8, 16, 0, 33])),
        min_size=0,
        max_size=6,
    )
)
def test_a_list_reads_as_the_same_items_in_a_tuple(spec: list[tuple[str, int]]) -> None:
    items = [item(kind, i + 1, width) for i, (kind, width) in enumerate(spec)]
    as_list = outcome(kvpool.BlockPool, items)
    as_tuple = outcome(kvpool.BlockPool, tuple(items))
    assert as_list == as_tuple


@pytest.mark.parametrize("width", [1, 8, 16, 20, 32])
def test_plain_lists_of_each_width_match_the_reference(width: int) -> None:
    hashes = [(7 * i + 1).to_bytes(width, "little") for i in range(6)]
    assert outcome(kvpool.BlockPool, hashes) == outcome(RefPool, hashes)
    assert outcome(kvpool.BlockPool, hashes)[0] == "ok"


def test_a_list_subclass_and_an_odd_item_after_plain_ones() -> None:
    class Hashes(list):
        pass

    plain = [bytes([i]) * 32 for i in range(1, 7)]
    assert outcome(kvpool.BlockPool, Hashes(plain)) == outcome(kvpool.BlockPool, tuple(plain))
    for odd in (bytearray(32), b"x" * 16, "ab", None):
        mixed = plain[:3] + [odd] + plain[4:]
        got = outcome(kvpool.BlockPool, mixed)
        assert got[0] == "error", odd
        assert got == outcome(kvpool.BlockPool, tuple(mixed))
