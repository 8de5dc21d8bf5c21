"""Every bad input raises its specific exception and leaves the pool exactly unchanged.

Each case builds the same pool twice (``make_pool`` is deterministic), makes the bad call on one
of them, and then compares everything observable on both, pending events included.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvpool._errors import (
    BlockStateError,
    CachingDisabledError,
    DoubleFreeError,
    DtypeError,
    HashWidthError,
    InvalidArgumentError,
    InvalidBlockIdError,
    KVPoolError,
    NoFreeBlocksError,
)

H = [bytes([i]) * 4 for i in range(16)]  # the pools below use 4-byte hashes
N = 12  # blocks in the standard pool


def snapshot(pool):
    """Everything observable about a pool; drains its pending events."""
    return (
        pool.free_block_ids().tolist(),
        pool.ref_counts().tolist(),
        [pool.block_hash(b) for b in range(pool.num_blocks)],
        pool.get_num_cached_blocks(),
        pool.get_num_free_blocks(),
        pool.get_usage(),
        pool.hash_width,
        pool.take_events(),
    )


def make_pool(Pool, **kwargs):
    """A pool with blocks in use, cached blocks in use and free, and pending events.

    State: request A holds [1, 2, 3, 4] with 1, 2 cached (H0, H1); block 5 was cached (H2) and
    freed (at the tail, so over-allocation would have to evict it); block 6 freed uncached
    (head). Free queue: [6, 7, 8, 9, 10, 11, 5].
    """
    options = dict(enable_events=True, block_size=2)
    options.update(kwargs)
    pool = Pool(N, **options)
    a = pool.get_new_blocks(4)
    b = pool.get_new_blocks(2)
    if pool.enable_caching:
        pool.cache_full_blocks(a, H[:2], 0, 2, token_ids=list(range(8)))
        pool.cache_full_blocks(b, [H[2]], 0, 1)
    pool.free_blocks(b[::-1])
    return pool


def check_refused(Pool, call, exc, builtin, **pool_kwargs):
    """``call(pool)`` raises ``exc`` (also a ``KVPoolError`` and a ``builtin``) and changes nothing."""
    pool = make_pool(Pool, **pool_kwargs)
    twin = make_pool(Pool, **pool_kwargs)
    with pytest.raises(exc) as info:
        call(pool)
    assert type(info.value) is exc, f"raised {type(info.value).__name__}, expected exactly {exc.__name__}"
    assert isinstance(info.value, KVPoolError)
    assert isinstance(info.value, builtin)
    assert snapshot(pool) == snapshot(twin)
    pool.check_invariants()


def test_standard_pool_state(Pool):
    pool = make_pool(Pool)
    assert pool.free_block_ids().tolist() == [6, 7, 8, 9, 10, 11, 5]
    assert pool.ref_counts().tolist() == [0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0]
    assert pool.get_num_cached_blocks() == 3


# -- allocation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, exc, builtin",
    [
        (lambda p: p.get_new_blocks(8), NoFreeBlocksError, ValueError),
        (lambda p: p.get_new_blocks(2**40), NoFreeBlocksError, ValueError),
        (lambda p: p.get_new_blocks(-1), InvalidArgumentError, ValueError),
        (lambda p: p.get_new_blocks(1.0), DtypeError, TypeError),
        (lambda p: p.get_new_blocks("1"), DtypeError, TypeError),
        (lambda p: p.get_new_blocks(None), DtypeError, TypeError),
        (lambda p: p.get_new_blocks_many([3, 5]), NoFreeBlocksError, ValueError),
        (lambda p: p.get_new_blocks_many(np.array([1, 1, 6], dtype=np.int64)), NoFreeBlocksError, ValueError),
        (lambda p: p.get_new_blocks_many([1, 1, -1]), InvalidArgumentError, ValueError),
        (lambda p: p.get_new_blocks_many(np.array([1.0, 2.0])), DtypeError, TypeError),
        (lambda p: p.get_new_blocks_many([1, 2.0]), DtypeError, TypeError),
        (lambda p: p.get_new_blocks_many(3), DtypeError, TypeError),
    ],
    ids=[
        "one-too-many",
        "huge",
        "negative",
        "float",
        "str",
        "none",
        "many-over",
        "many-last-over",
        "many-negative-last",
        "many-float-array",
        "many-float-element",
        "many-scalar",
    ],
)
def test_allocation_errors(Pool, call, exc, builtin):
    check_refused(Pool, call, exc, builtin)


# -- ids: range and dtype -----------------------------------------------------------------------

ID_CALLS = {
    "free_blocks": lambda p, x: p.free_blocks(x),
    "touch": lambda p, x: p.touch(x),
    "evict_blocks": lambda p, x: p.evict_blocks(x),
    "free_blocks_many": lambda p, x: p.free_blocks_many([x]),
    "free_blocks_many_flat": lambda p, x: p.free_blocks_many(x, [0, len(x)]),
    "cache_full_blocks": lambda p, x: p.cache_full_blocks(x, H[5 : 5 + len(x)], 0, len(x)),
}

BAD_RANGE_IDS = {
    "num_blocks": [4, N],
    "negative": [4, -1],
    "huge": [2**40, 4],
    "numpy-int64": np.array([4, 3, N], dtype=np.int64),
    "numpy-negative": np.array([4, -5], dtype=np.int32),
    "numpy-uint": np.array([4, 2**32 - 1], dtype=np.uint32),
}


@pytest.mark.parametrize("ids_name", list(BAD_RANGE_IDS))
@pytest.mark.parametrize("call_name", list(ID_CALLS))
def test_out_of_range_ids(Pool, call_name, ids_name):
    call, bad = ID_CALLS[call_name], BAD_RANGE_IDS[ids_name]
    check_refused(Pool, lambda p: call(p, bad), InvalidBlockIdError, ValueError)


BAD_DTYPE_IDS = {
    "float-array": np.array([4.0, 3.0]),
    "bool-array": np.array([True, False]),
    "object-array": np.array([4, 3], dtype=object),
    "str-array": np.array(["4", "3"]),
    "2d-array": np.array([[4, 3]], dtype=np.int32),
    "0d-array": np.array(4, dtype=np.int32),
    "float-element": [4, 3.0],
    "str-element": [4, "3"],
    "none-element": [4, None],
    "nested-list": [[4, 3]],
    "str": "43",
    "int": 4,
    "none": None,
}


@pytest.mark.parametrize("ids_name", list(BAD_DTYPE_IDS))
@pytest.mark.parametrize("call_name", ["free_blocks", "touch", "evict_blocks", "free_blocks_many", "cache_full_blocks"])
def test_bad_id_dtypes(Pool, call_name, ids_name):
    bad = BAD_DTYPE_IDS[ids_name]
    if call_name == "cache_full_blocks":
        call = lambda p: p.cache_full_blocks(bad, [H[5]], 0, 0)  # noqa: E731
    else:
        call = lambda p: ID_CALLS[call_name](p, bad)  # noqa: E731
    check_refused(Pool, call, DtypeError, TypeError)


@pytest.mark.parametrize("block_id", [N, -1, 2**40])
def test_introspection_bad_ids(Pool, block_id):
    check_refused(Pool, lambda p: p.ref_count(block_id), InvalidBlockIdError, ValueError)
    check_refused(Pool, lambda p: p.block_hash(block_id), InvalidBlockIdError, ValueError)


@pytest.mark.parametrize("block_id", [1.0, "1", None])
def test_introspection_bad_id_types(Pool, block_id):
    check_refused(Pool, lambda p: p.ref_count(block_id), DtypeError, TypeError)
    check_refused(Pool, lambda p: p.block_hash(block_id), DtypeError, TypeError)


# -- double free --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda p: p.free_blocks([7]),  # free block, never allocated
        lambda p: p.free_blocks([5]),  # free cached block
        lambda p: p.free_blocks([4, 3, 3]),  # duplicate within one call, count 1
        lambda p: p.free_blocks(np.array([4, 4], dtype=np.int16)),
        lambda p: p.free_blocks([4, 3, 2, 1, 1]),
        lambda p: p.free_blocks_many([[4, 3], [2, 1], [3]]),  # counted across segments
        lambda p: p.free_blocks_many([[4, 3], [2, 7]]),  # only a later segment is bad
        lambda p: p.free_blocks_many(np.array([4, 3, 2, 1, 1]), np.array([0, 2, 4, 5])),
        lambda p: p.free_blocks_many([[3, 4], [4]], reverse=True),
    ],
    ids=["free", "free-cached", "dup", "dup-numpy", "dup-last", "across-segments", "later-segment",
         "flat-later-segment", "reverse"],
)
def test_double_free(Pool, call):
    check_refused(Pool, call, DoubleFreeError, ValueError)


def test_double_free_after_touch_is_counted(Pool):
    # Block 4 has count 2 after a touch: two frees are fine, a third is not.
    def call(p):
        p.touch([4])
        p.take_events()
        p.free_blocks([4, 4, 4])

    pool = make_pool(Pool)
    with pytest.raises(DoubleFreeError):
        call(pool)
    assert pool.ref_count(4) == 2


def test_null_block_is_not_double_freed(Pool):
    pool = make_pool(Pool)
    pool.take_events()
    before = snapshot(pool)
    pool.free_blocks([0, 0, 0])
    pool.free_blocks_many([[0], [0]])
    assert snapshot(pool) == before


# -- free_blocks_many structure -----------------------------------------------------------------


@pytest.mark.parametrize(
    "call, exc, builtin",
    [
        (lambda p: p.free_blocks_many([4, 3, 2, 1], [1, 4]), InvalidArgumentError, ValueError),
        (lambda p: p.free_blocks_many([4, 3, 2, 1], [0, 3]), InvalidArgumentError, ValueError),
        (lambda p: p.free_blocks_many([4, 3, 2, 1], [0, 5]), InvalidArgumentError, ValueError),
        (lambda p: p.free_blocks_many([4, 3, 2, 1], [0, 3, 2, 4]), InvalidArgumentError, ValueError),
        (lambda p: p.free_blocks_many([4, 3, 2, 1], []), InvalidArgumentError, ValueError),
        (lambda p: p.free_blocks_many([4, 3, 2, 1], [0, 2.0, 4]), DtypeError, TypeError),
        (lambda p: p.free_blocks_many(np.array([4.0, 3.0]), [0, 2]), DtypeError, TypeError),
        (lambda p: p.free_blocks_many([4, 3, 2, 1]), DtypeError, TypeError),
        (lambda p: p.free_blocks_many([[4, 3], [2, 1.5]]), DtypeError, TypeError),
        (lambda p: p.free_blocks_many([[4, 3], [2, N]]), InvalidBlockIdError, ValueError),
        (lambda p: p.free_blocks_many([4, 3, 2, -1], [0, 2, 4]), InvalidBlockIdError, ValueError),
        (lambda p: p.free_blocks_many([[4, 3]], reverse=1.0), DtypeError, TypeError),
    ],
    ids=["first-not-0", "last-short", "last-long", "decreasing", "empty-offsets", "float-offset",
         "float-flat", "flat-without-offsets", "float-in-later-segment", "bad-id-later-segment",
         "flat-bad-id-later-segment", "reverse-not-bool"],
)
def test_free_blocks_many_errors(Pool, call, exc, builtin):
    check_refused(Pool, call, exc, builtin)


# -- cache_full_blocks --------------------------------------------------------------------------

A = [1, 2, 3, 4]  # request A's blocks in the standard pool; 1 and 2 are cached


@pytest.mark.parametrize(
    "call, exc, builtin",
    [
        # integers
        (lambda p: p.cache_full_blocks(A, H[:4], 3, 2), InvalidArgumentError, ValueError),
        (lambda p: p.cache_full_blocks(A, H[:4], -1, 2), InvalidArgumentError, ValueError),
        (lambda p: p.cache_full_blocks(A, H[:4], 2, 5), InvalidArgumentError, ValueError),
        (lambda p: p.cache_full_blocks(A, H[:3], 2, 4), InvalidArgumentError, ValueError),
        (lambda p: p.cache_full_blocks(A, H[:4], 2, 4, group_id=-1), InvalidArgumentError, ValueError),
        (lambda p: p.cache_full_blocks(A, H[:4], 2, 4, group_id=2**32), InvalidArgumentError, ValueError),
        (lambda p: p.cache_full_blocks(A, H[:4], 2, 4, token_ids=list(range(7))), InvalidArgumentError,
         ValueError),
        # types
        (lambda p: p.cache_full_blocks(A, H[:4], 2.0, 4), DtypeError, TypeError),
        (lambda p: p.cache_full_blocks(A, H[:4], 2, "4"), DtypeError, TypeError),
        (lambda p: p.cache_full_blocks(A, H[:4], 2, 4, group_id=0.0), DtypeError, TypeError),
        (lambda p: p.cache_full_blocks(A, [H[0], H[1], H[2], "abcd"], 2, 4), DtypeError, TypeError),
        (lambda p: p.cache_full_blocks(A, [H[0], H[1], H[2], bytearray(H[3])], 2, 4), DtypeError, TypeError),
        (lambda p: p.cache_full_blocks(A, b"".join(H[:4]), 2, 4), DtypeError, TypeError),
        (lambda p: p.cache_full_blocks(A, H[:4], 2, 4, token_ids=[0.5] * 8), DtypeError, TypeError),
        (lambda p: p.cache_full_blocks(A, H[:4], 2, 4, lora_id="x"), DtypeError, TypeError),
        (lambda p: p.cache_full_blocks(A, H[:4], 2, 4, lora_name=3), DtypeError, TypeError),
        # ids
        (lambda p: p.cache_full_blocks([1, 2, 3, N], H[:4], 2, 4), InvalidBlockIdError, ValueError),
        (lambda p: p.cache_full_blocks([1, 2, 3, 4, -1], H[:4], 2, 4), InvalidBlockIdError, ValueError),
        # hash widths (the pool's width is fixed at 4 by make_pool)
        (lambda p: p.cache_full_blocks(A, H[:3] + [b"\x01" * 8], 2, 4), HashWidthError, ValueError),
        (lambda p: p.cache_full_blocks(A, H[:3] + [b""], 2, 4), HashWidthError, ValueError),
        (lambda p: p.cache_full_blocks(A, H[:3] + [b"\x01" * 33], 2, 4), HashWidthError, ValueError),
        (lambda p: p.cache_full_blocks(A, H[:4] + [b"\x01" * 3], 2, 4), HashWidthError, ValueError),
        # block state
        (lambda p: p.cache_full_blocks([1, 2, 3, 7], H[:4], 2, 4), BlockStateError, ValueError),  # free
        (lambda p: p.cache_full_blocks([1, 2, 3, 5], H[:4], 2, 4), BlockStateError, ValueError),  # free, cached
        (lambda p: p.cache_full_blocks([1, 2, 3, 1], H[:4], 2, 4), BlockStateError, ValueError),  # cached
        (lambda p: p.cache_full_blocks(A, H[:4], 1, 4), BlockStateError, ValueError),  # 2 already cached
        (lambda p: p.cache_full_blocks([1, 2, 3, 3], H[:4], 2, 4), BlockStateError, ValueError),  # twice
    ],
    ids=["cached>full", "cached<0", "full>ids", "full>hashes", "group<0", "group>=2**32", "short-tokens",
         "float-cached", "str-full", "float-group", "str-hash", "bytearray-hash", "bytes-as-hashes",
         "float-tokens", "str-lora-id", "int-lora-name", "id-num_blocks", "id-negative-beyond-full",
         "width-8", "width-0", "width-33", "width-beyond-full", "free-block", "free-cached-block",
         "cached-block", "recache", "duplicate-new"],
)
def test_cache_full_blocks_errors(Pool, call, exc, builtin):
    check_refused(Pool, call, exc, builtin)


def test_cache_full_blocks_error_precedence(Pool):
    free_block = 7
    # Integers before ids before widths before tokens before block state.
    check_refused(Pool, lambda p: p.cache_full_blocks([1, N, free_block], [b"x", b"y", b"z"], 3, 2),
                  InvalidArgumentError, ValueError)
    check_refused(Pool, lambda p: p.cache_full_blocks([3, N, free_block], [b"x", b"y", b"z"], 0, 3),
                  InvalidBlockIdError, ValueError)
    check_refused(Pool, lambda p: p.cache_full_blocks([3, 4, free_block], [b"x", b"y", b"z"], 0, 3,
                                                      token_ids=[]),
                  HashWidthError, ValueError)
    check_refused(Pool, lambda p: p.cache_full_blocks([3, 4, free_block], H[5:8], 0, 3, token_ids=[]),
                  InvalidArgumentError, ValueError)


def test_a_malformed_hash_list_is_refused_as_it_is_read(Pool):
    """A hash list that is not of one width of 1 to 32 bytes is refused when it is read, with the
    argument types, before the counts and ids are checked; hashes of another width than the
    pool's are refused after them (the pool's width is state, not form)."""
    for call in (lambda p: p.cache_full_blocks([1, 9], [b"\x01" * 8, b"\x02" * 9], 0, 2),
                 lambda p: p.cache_full_blocks([9], [b"\x01" * 33], 0, 1),
                 lambda p: p.cache_full_blocks([1], [b"a", b"bb"], 0, 5),
                 lambda p: p.cache_full_blocks([1], [b""], 1, 0)):
        check_refused(Pool, call, HashWidthError, ValueError)
    check_refused(Pool, lambda p: p.cache_full_blocks([1], [b"\x01" * 8], "x", 1), DtypeError, TypeError)


def test_free_blocks_many_checks_offsets_before_ids(Pool):
    for ids, offsets in (([N + 1], [0, 2]), ([N + 1, N + 1], [0, 2, 1, 2])):
        check_refused(Pool, lambda p: p.free_blocks_many(ids, offsets), InvalidArgumentError, ValueError)
    check_refused(Pool, lambda p: p.free_blocks_many([N + 1], [0, 1]), InvalidBlockIdError, ValueError)


def test_mixed_widths_in_first_call(Pool):
    def call(p):
        a = p.get_new_blocks(2)
        p.take_events()
        p.cache_full_blocks(a, [b"\x01" * 8, b"\x02" * 16], 0, 2)

    pool = Pool(6, enable_events=True)
    with pytest.raises(HashWidthError):
        call(pool)
    assert pool.hash_width is None
    assert pool.get_num_cached_blocks() == 0
    assert pool.take_events() == []
    # Mixed widths are refused even beyond num_full.
    a = pool.get_new_blocks(1)
    with pytest.raises(HashWidthError):
        pool.cache_full_blocks(a, [b"\x01" * 8, b"\x02" * 16], 0, 1)
    assert pool.hash_width is None


def test_width_fixed_by_constructor(Pool):
    pool = Pool(6, hash_width=8)
    a = pool.get_new_blocks(1)
    with pytest.raises(HashWidthError):
        pool.cache_full_blocks(a, [b"\x01" * 4], 0, 1)
    with pytest.raises(HashWidthError):
        pool.get_cached_block(b"\x01" * 4)
    assert pool.hash_width == 8
    assert pool.get_num_cached_blocks() == 0
    pool.cache_full_blocks(a, [b"\x01" * 8], 0, 1)
    assert pool.get_cached_block(b"\x01" * 8) == a[0]


def test_caching_disabled_errors(Pool):
    # Checked first: even an otherwise invalid call reports CachingDisabledError.
    for call in (
        lambda p: p.cache_full_blocks([1, 2], H[:2], 0, 2),
        lambda p: p.cache_full_blocks([N], [b""], 5, 2),
        lambda p: p.cache_full_blocks("bad", None, None, None),
    ):
        check_refused(Pool, call, CachingDisabledError, RuntimeError, enable_caching=False)


# -- lookups ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, exc, builtin",
    [
        (lambda p: p.get_cached_block(b"\x00" * 8), HashWidthError, ValueError),
        (lambda p: p.get_cached_block(b""), HashWidthError, ValueError),
        (lambda p: p.get_cached_block(b"\x00" * 33), HashWidthError, ValueError),
        (lambda p: p.get_cached_block("abcd"), DtypeError, TypeError),
        (lambda p: p.get_cached_block(None), DtypeError, TypeError),
        (lambda p: p.get_cached_block(H[0], -1), InvalidArgumentError, ValueError),
        (lambda p: p.get_cached_block(H[0], 1.0), DtypeError, TypeError),
        (lambda p: p.find_longest_cache_hit([H[0], b"\x00" * 5]), HashWidthError, ValueError),
        (lambda p: p.find_longest_cache_hit([H[0], H[1], b""], max_blocks=1), HashWidthError, ValueError),
        (lambda p: p.find_longest_cache_hit([H[0], "abcd"]), DtypeError, TypeError),
        (lambda p: p.find_longest_cache_hit(H[0]), DtypeError, TypeError),
        (lambda p: p.find_longest_cache_hit(H[:2], max_blocks=-1), InvalidArgumentError, ValueError),
        (lambda p: p.find_longest_cache_hit(H[:2], max_blocks=1.0), DtypeError, TypeError),
        (lambda p: p.find_longest_cache_hit(H[:2], group_id=2**32), InvalidArgumentError, ValueError),
    ],
    ids=["width-8", "width-0", "width-33", "str", "none", "group<0", "float-group", "longest-width",
         "longest-width-beyond-max", "longest-str", "longest-bytes", "max<0", "float-max", "group>=2**32"],
)
def test_lookup_errors(Pool, call, exc, builtin):
    check_refused(Pool, call, exc, builtin)


def test_lookup_width_unfixed_pool(Pool):
    pool = Pool(4)
    assert pool.get_cached_block(b"\x00" * 32) is None
    assert pool.find_longest_cache_hit([b"\x00" * 3]).tolist() == []
    with pytest.raises(HashWidthError):
        pool.get_cached_block(b"\x00" * 33)
    with pytest.raises(HashWidthError):
        pool.find_longest_cache_hit([b""])
    assert pool.hash_width is None


# -- constructor --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, kwargs, exc, builtin",
    [
        ((0,), {}, InvalidArgumentError, ValueError),
        ((-1,), {}, InvalidArgumentError, ValueError),
        ((2**31,), {}, InvalidArgumentError, ValueError),
        ((2**64,), {}, InvalidArgumentError, ValueError),
        ((8,), {"block_size": 0}, InvalidArgumentError, ValueError),
        ((8,), {"block_size": -16}, InvalidArgumentError, ValueError),
        ((8,), {"hash_width": 0}, InvalidArgumentError, ValueError),
        ((8,), {"hash_width": 33}, InvalidArgumentError, ValueError),
        ((8.0,), {}, DtypeError, TypeError),
        (("8",), {}, DtypeError, TypeError),
        ((None,), {}, DtypeError, TypeError),
        ((8,), {"block_size": 16.0}, DtypeError, TypeError),
        ((8,), {"hash_width": "32"}, DtypeError, TypeError),
        ((8,), {"enable_caching": "yes"}, DtypeError, TypeError),
        ((8,), {"null_block": 0}, DtypeError, TypeError),
        ((8,), {"enable_events": 1.0}, DtypeError, TypeError),
    ],
    ids=["zero", "negative", "2**31", "2**64", "block_size-0", "block_size-negative", "width-0", "width-33",
         "float", "str", "none", "float-block_size", "str-width", "str-caching", "int-null", "float-events"],
)
def test_constructor_errors(Pool, args, kwargs, exc, builtin):
    with pytest.raises(exc) as info:
        Pool(*args, **kwargs)
    assert type(info.value) is exc
    assert isinstance(info.value, KVPoolError)
    assert isinstance(info.value, builtin)


def test_constructor_limits_accepted(Pool):
    assert Pool(1).num_blocks == 1
    assert Pool(8, block_size=1, hash_width=1).hash_width == 1
    assert Pool(8, hash_width=32).hash_width == 32
    assert Pool(np.int64(8), block_size=np.int32(4)).block_size == 4


def test_constructor_rejects_positional_options(Pool):
    with pytest.raises(TypeError):
        Pool(8, True)
