"""Behaviour of every BlockPool method, run against each implementation (see conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest

from kvpool.events import AllBlocksCleared, BlockRemoved, BlockStored

H = [bytes([i]) * 4 for i in range(16)]  # 4-byte hashes; H[i] is distinct for each i


def ids(arr) -> list[int]:
    """An int32 id array as a list, checking its dtype and shape on the way."""
    assert isinstance(arr, np.ndarray)
    assert arr.dtype == np.int32
    assert arr.ndim == 1
    return arr.tolist()


def free_ids(pool) -> list[int]:
    return ids(pool.free_block_ids())


def stored(hashes, parent=None, tokens=(), block_size=16, lora_id=None, lora_name=None, group=0):
    return BlockStored(
        block_hashes=list(hashes),
        parent_block_hash=parent,
        token_ids=list(tokens),
        block_size=block_size,
        lora_id=lora_id,
        medium="GPU",
        lora_name=lora_name,
        group_idx=group,
    )


def removed(h, group=0):
    return BlockRemoved(block_hashes=[h], medium="GPU", group_idx=group)


def full_state(pool):
    return (
        free_ids(pool),
        ids(pool.ref_counts()),
        [pool.block_hash(b) for b in range(pool.num_blocks)],
        pool.get_num_cached_blocks(),
        pool.get_num_free_blocks(),
        pool.get_usage(),
        pool.hash_width,
        pool.take_events(),
    )


# -- construction and properties ----------------------------------------------------------------


def test_fresh_pool(Pool):
    pool = Pool(8)
    assert pool.num_blocks == 8
    assert pool.block_size == 16
    assert pool.enable_caching is True
    assert pool.enable_events is False
    assert pool.null_block == 0
    assert pool.hash_width is None
    assert pool.get_num_free_blocks() == 7
    assert free_ids(pool) == [1, 2, 3, 4, 5, 6, 7]
    assert ids(pool.ref_counts()) == [0] * 8
    assert pool.ref_count(0) == 0
    assert pool.get_num_cached_blocks() == 0
    assert pool.get_usage() == 0.0
    assert pool.take_events() == []
    assert all(pool.block_hash(b) is None for b in range(8))
    assert pool.check_invariants() is None


def test_constructor_options(Pool):
    pool = Pool(5, enable_caching=False, null_block=False, enable_events=True, block_size=4, hash_width=8)
    assert pool.enable_caching is False
    assert pool.enable_events is True
    assert pool.null_block is None
    assert pool.block_size == 4
    assert pool.hash_width == 8
    assert free_ids(pool) == [0, 1, 2, 3, 4]


def test_single_block_pool_with_null_block(Pool):
    pool = Pool(1)
    assert pool.get_num_free_blocks() == 0
    assert pool.get_usage() == 0.0
    assert ids(pool.get_new_blocks(0)) == []
    pool.check_invariants()


# -- allocation ---------------------------------------------------------------------------------


def test_allocation_pops_from_head_in_order(Pool):
    pool = Pool(8)
    assert ids(pool.get_new_blocks(3)) == [1, 2, 3]
    assert ids(pool.get_new_blocks(2)) == [4, 5]
    assert free_ids(pool) == [6, 7]
    assert ids(pool.ref_counts()) == [0, 1, 1, 1, 1, 1, 0, 0]
    assert pool.get_num_free_blocks() == 2
    pool.check_invariants()


def test_allocate_zero_and_everything(Pool):
    pool = Pool(4)
    assert ids(pool.get_new_blocks(0)) == []
    assert ids(pool.get_new_blocks(3)) == [1, 2, 3]
    assert pool.get_num_free_blocks() == 0
    assert pool.get_usage() == 1.0
    assert ids(pool.get_new_blocks(0)) == []


def test_allocate_accepts_numpy_integer(Pool):
    pool = Pool(4)
    assert ids(pool.get_new_blocks(np.int64(2))) == [1, 2]


def test_reuse_of_cached_free_block_evicts_it(Pool):
    pool = Pool(4, enable_events=True, block_size=1)
    a = pool.get_new_blocks(2)  # [1, 2]
    pool.cache_full_blocks(a, [H[0], H[1]], 0, 2)
    pool.free_blocks(a[::-1])
    assert free_ids(pool) == [3, 2, 1]
    pool.take_events()
    assert ids(pool.get_new_blocks(2)) == [3, 2]  # 3 was never cached, 2 was
    assert pool.take_events() == [removed(H[1])]
    assert pool.block_hash(2) is None
    assert pool.get_cached_block(H[1]) is None
    assert pool.get_cached_block(H[0]) == 1
    assert pool.get_num_cached_blocks() == 1
    pool.check_invariants()


def test_reuse_evicts_in_pop_order_with_group(Pool):
    pool = Pool(4, enable_events=True, block_size=1, null_block=False)
    a = pool.get_new_blocks(3)  # [0, 1, 2]
    pool.cache_full_blocks(a, [H[0], H[1], H[2]], 0, 3, group_id=5)
    pool.free_blocks(a)  # forward order: queue [3, 0, 1, 2]
    pool.take_events()
    assert ids(pool.get_new_blocks(4)) == [3, 0, 1, 2]
    assert pool.take_events() == [removed(H[0], 5), removed(H[1], 5), removed(H[2], 5)]
    assert pool.get_num_cached_blocks() == 0


# -- free ---------------------------------------------------------------------------------------


def test_free_uncached_blocks_go_to_head_in_given_order(Pool):
    pool = Pool(8)
    a = pool.get_new_blocks(4)  # [1, 2, 3, 4]
    pool.free_blocks(a[::-1])
    assert free_ids(pool) == [4, 3, 2, 1, 5, 6, 7]
    assert ids(pool.get_new_blocks(2)) == [4, 3]


def test_free_cached_blocks_go_to_tail_in_given_order(Pool):
    pool = Pool(8, block_size=1)
    a = pool.get_new_blocks(4)
    pool.cache_full_blocks(a, H[:4], 0, 4)
    pool.free_blocks(a[::-1])
    assert free_ids(pool) == [5, 6, 7, 4, 3, 2, 1]


def test_free_mixed_cached_and_uncached(Pool):
    pool = Pool(8, block_size=1)
    a = pool.get_new_blocks(4)  # [1, 2, 3, 4], cache the first two
    pool.cache_full_blocks(a, H[:2], 0, 2)
    pool.free_blocks([4, 3, 2, 1])
    assert free_ids(pool) == [4, 3, 5, 6, 7, 2, 1]
    pool.check_invariants()


def test_free_shared_block_stays_in_use_until_last_reference(Pool):
    pool = Pool(6)
    a = ids(pool.get_new_blocks(2))  # [1, 2]
    pool.touch([1])
    assert pool.ref_count(1) == 2
    pool.free_blocks(a[::-1])
    assert pool.ref_count(1) == 1
    assert free_ids(pool) == [2, 3, 4, 5]
    pool.free_blocks([1])
    assert free_ids(pool) == [1, 2, 3, 4, 5]


def test_free_duplicate_in_one_call_queues_where_count_reaches_zero(Pool):
    pool = Pool(6)
    pool.get_new_blocks(3)  # [1, 2, 3]
    pool.touch([2])  # count 2
    pool.free_blocks([2, 3, 2, 1])  # 2 reaches 0 at its second occurrence
    assert free_ids(pool) == [3, 2, 1, 4, 5]
    assert ids(pool.ref_counts()) == [0] * 6


def test_free_accepts_ids_like(Pool):
    for form in (list, tuple, lambda x: np.array(x, dtype=np.int64), lambda x: np.array(x, dtype=np.uint16)):
        pool = Pool(6)
        pool.get_new_blocks(3)
        pool.free_blocks(form([3, 2, 1]))
        assert free_ids(pool) == [3, 2, 1, 4, 5]
    pool = Pool(6)
    pool.get_new_blocks(3)
    pool.free_blocks(range(3, 0, -1))
    assert free_ids(pool) == [3, 2, 1, 4, 5]
    pool.free_blocks([])
    pool.free_blocks(np.array([], dtype=np.int32))
    assert free_ids(pool) == [3, 2, 1, 4, 5]


def test_free_with_caching_disabled_goes_to_head(Pool):
    pool = Pool(6, enable_caching=False)
    a = pool.get_new_blocks(3)
    pool.free_blocks(a[::-1])
    assert free_ids(pool) == [3, 2, 1, 4, 5]


# -- touch --------------------------------------------------------------------------------------


def test_touch_takes_free_block_out_of_queue_and_keeps_hash(Pool):
    pool = Pool(6, block_size=1)
    a = pool.get_new_blocks(2)  # [1, 2]
    pool.cache_full_blocks(a, H[:2], 0, 2)
    pool.free_blocks(a[::-1])  # queue [3, 4, 5, 2, 1]
    pool.touch([1, 2])
    assert free_ids(pool) == [3, 4, 5]
    assert ids(pool.ref_counts()) == [0, 1, 1, 0, 0, 0]
    assert pool.block_hash(1) == (H[0], 0)
    assert pool.block_hash(2) == (H[1], 0)
    assert pool.get_num_cached_blocks() == 2
    pool.check_invariants()


def test_touch_in_use_block_and_duplicates(Pool):
    pool = Pool(6)
    pool.get_new_blocks(1)  # [1]
    pool.touch([1, 1, 3, 3])
    assert pool.ref_count(1) == 3
    assert pool.ref_count(3) == 2
    assert free_ids(pool) == [2, 4, 5]
    pool.check_invariants()


def test_touch_skips_null_block(Pool):
    pool = Pool(4)
    pool.touch([0, 0])
    assert pool.ref_count(0) == 0
    assert free_ids(pool) == [1, 2, 3]
    pool.free_blocks([0])
    assert pool.ref_count(0) == 0
    pool.check_invariants()


# -- cache_full_blocks and lookups --------------------------------------------------------------


def test_cache_full_blocks_stores_keys_and_event(Pool):
    pool = Pool(8, enable_events=True, block_size=2)
    a = pool.get_new_blocks(3)  # [1, 2, 3]
    tokens = list(range(100, 106))
    pool.cache_full_blocks(a, H[:3], 0, 2, token_ids=tokens, lora_id=7, lora_name="ad")
    assert pool.hash_width == 4
    assert pool.block_hash(1) == (H[0], 0)
    assert pool.block_hash(2) == (H[1], 0)
    assert pool.block_hash(3) is None
    assert pool.get_num_cached_blocks() == 2
    assert pool.get_cached_block(H[0]) == 1
    assert pool.get_cached_block(H[1], 0) == 2
    assert pool.get_cached_block(H[2]) is None
    assert pool.take_events() == [
        stored(H[:2], None, [100, 101, 102, 103], block_size=2, lora_id=7, lora_name="ad")
    ]
    # The next block becomes full: parent is the last already-cached hash.
    pool.cache_full_blocks(a, H[:3], 2, 3, token_ids=tokens)
    assert pool.take_events() == [stored([H[2]], H[1], [104, 105], block_size=2)]
    assert pool.get_num_cached_blocks() == 3
    # Caching never changes counts or the free queue.
    assert ids(pool.ref_counts()) == [0, 1, 1, 1, 0, 0, 0, 0]
    assert free_ids(pool) == [4, 5, 6, 7]
    pool.check_invariants()


def test_cache_full_blocks_without_tokens_has_empty_token_ids(Pool):
    pool = Pool(4, enable_events=True, block_size=2)
    a = pool.get_new_blocks(1)
    pool.cache_full_blocks(a, [H[0]], 0, 1)
    assert pool.take_events() == [stored([H[0]], None, [], block_size=2)]


def test_cache_full_blocks_noop_when_nothing_new(Pool):
    pool = Pool(4, enable_events=True)
    a = pool.get_new_blocks(2)
    pool.cache_full_blocks(a, H[:2], 1, 1)
    pool.cache_full_blocks(a, [], 0, 0)
    assert pool.take_events() == []
    assert pool.get_num_cached_blocks() == 0
    assert all(pool.block_hash(b) is None for b in range(4))


def test_cache_full_blocks_group_id_separates_keys(Pool):
    pool = Pool(6, enable_events=True, block_size=1)
    a = ids(pool.get_new_blocks(2))
    pool.cache_full_blocks(a[:1], [H[0]], 0, 1, group_id=0)
    pool.cache_full_blocks(a[1:], [H[0]], 0, 1, group_id=3)
    assert pool.get_cached_block(H[0]) == a[0]
    assert pool.get_cached_block(H[0], 3) == a[1]
    assert pool.get_cached_block(H[0], 1) is None
    assert pool.block_hash(a[1]) == (H[0], 3)
    assert pool.take_events()[1] == stored([H[0]], None, [], block_size=1, group=3)
    assert ids(pool.find_longest_cache_hit([H[0]], group_id=3)) == [a[1]]


def test_cache_full_blocks_skips_null_block(Pool):
    pool = Pool(6, enable_events=True, block_size=1)
    a = ids(pool.get_new_blocks(2))  # [1, 2]
    table = [0, a[0], 0, a[1]]  # sliding-window style gaps
    pool.cache_full_blocks(table, H[:4], 0, 4, token_ids=[9, 8, 7, 6])
    assert pool.block_hash(0) is None
    assert pool.block_hash(1) == (H[1], 0)
    assert pool.block_hash(2) == (H[3], 0)
    assert pool.get_num_cached_blocks() == 2
    assert pool.get_cached_block(H[0]) is None
    assert pool.take_events() == [stored([H[1], H[3]], None, [9, 8, 7, 6], block_size=1)]
    pool.check_invariants()


def test_multiple_blocks_under_one_key_first_inserted_wins(Pool):
    pool = Pool(8, enable_events=True, block_size=1)
    r1 = ids(pool.get_new_blocks(2))  # [1, 2]
    r2 = ids(pool.get_new_blocks(2))  # [3, 4]
    pool.cache_full_blocks(r2, [H[0], H[1]], 0, 2)
    pool.cache_full_blocks(r1, [H[0], H[1]], 0, 2)
    assert pool.get_cached_block(H[0]) == 3
    assert ids(pool.find_longest_cache_hit([H[0], H[1]])) == [3, 4]
    assert pool.get_num_cached_blocks() == 4
    # Evicting the first inserted exposes the second.
    pool.evict_blocks([3])
    assert pool.get_cached_block(H[0]) == 1
    # Freeing and reusing the other one drops it too; then the key is gone.
    pool.free_blocks(r1[::-1])  # queue [5, 6, 7, 2, 1]
    pool.take_events()
    assert ids(pool.get_new_blocks(5)) == [5, 6, 7, 2, 1]
    assert pool.take_events() == [removed(H[1]), removed(H[0])]
    assert pool.get_cached_block(H[0]) is None
    assert pool.get_cached_block(H[1]) == 4
    pool.check_invariants()


def test_longest_cache_hit_stops_at_first_miss(Pool):
    pool = Pool(8, block_size=1)
    a = ids(pool.get_new_blocks(4))
    pool.cache_full_blocks(a, [H[0], H[1], H[2], H[3]], 0, 4)
    pool.evict_blocks([a[2]])  # hole at position 2
    assert ids(pool.find_longest_cache_hit([H[0], H[1], H[2], H[3]])) == a[:2]
    assert ids(pool.find_longest_cache_hit([H[5], H[0]])) == []
    assert ids(pool.find_longest_cache_hit([])) == []
    assert ids(pool.find_longest_cache_hit((H[0], H[1]), max_blocks=1)) == a[:1]
    assert ids(pool.find_longest_cache_hit([H[0], H[1]], max_blocks=0)) == []
    assert ids(pool.find_longest_cache_hit([H[0], H[1]], max_blocks=10)) == a[:2]
    assert ids(pool.find_longest_cache_hit([H[0], H[1]], max_blocks=None)) == a[:2]
    # Repeated hashes hit the same block each time.
    assert ids(pool.find_longest_cache_hit([H[0], H[0]])) == [a[0], a[0]]


def test_lookups_change_nothing(Pool):
    pool = Pool(8, enable_events=True, block_size=1)
    a = pool.get_new_blocks(3)
    pool.cache_full_blocks(a, H[:3], 0, 3)
    pool.free_blocks(a[::-1])
    pool.take_events()
    before = full_state(pool)
    pool.get_cached_block(H[0])
    pool.find_longest_cache_hit(H[:3])
    pool.ref_counts()
    pool.free_block_ids()
    assert full_state(pool) == before


def test_hash_width_fixed_by_first_cache(Pool):
    pool = Pool(6, block_size=1)
    assert pool.hash_width is None
    a = pool.get_new_blocks(2)
    pool.cache_full_blocks(a, [b"x" * 32, b"y" * 32], 0, 1)
    assert pool.hash_width == 32


# -- evict and reset ----------------------------------------------------------------------------


def test_evict_in_use_block_keeps_it_in_use(Pool):
    pool = Pool(6, enable_events=True, block_size=1)
    a = ids(pool.get_new_blocks(2))
    pool.cache_full_blocks(a, H[:2], 0, 2)
    pool.take_events()
    pool.evict_blocks([a[1], a[0], a[0]])
    assert pool.take_events() == [removed(H[1]), removed(H[0])]
    assert ids(pool.ref_counts()) == [0, 1, 1, 0, 0, 0]
    assert pool.block_hash(a[0]) is None
    assert pool.get_num_cached_blocks() == 0
    # No longer cached, so freeing puts them at the head.
    pool.free_blocks(a[::-1])
    assert free_ids(pool) == [2, 1, 3, 4, 5]
    pool.check_invariants()


def test_evict_free_block_keeps_queue_position(Pool):
    pool = Pool(6, enable_events=True, block_size=1)
    a = pool.get_new_blocks(2)
    pool.cache_full_blocks(a, H[:2], 0, 2)
    pool.free_blocks(a[::-1])  # [3, 4, 5, 2, 1]
    pool.take_events()
    pool.evict_blocks(np.array([2, 3, 0], dtype=np.int64))  # 3 uncached, 0 null: ignored
    assert free_ids(pool) == [3, 4, 5, 2, 1]
    assert pool.take_events() == [removed(H[1])]
    assert pool.get_cached_block(H[1]) is None
    assert pool.get_num_cached_blocks() == 1
    pool.check_invariants()


def test_reset_prefix_cache_refused_while_in_use(Pool):
    pool = Pool(6, enable_events=True, block_size=1)
    a = pool.get_new_blocks(2)
    pool.cache_full_blocks(a, H[:2], 0, 2)
    pool.take_events()
    pool.free_blocks(a[1:])  # a[0] still in use
    before = full_state(pool)
    assert pool.reset_prefix_cache() is False
    assert full_state(pool) == before
    pool.free_blocks(a[:1])
    queue = free_ids(pool)
    assert pool.reset_prefix_cache() is True
    assert pool.take_events() == [AllBlocksCleared()]
    assert free_ids(pool) == queue
    assert pool.get_num_cached_blocks() == 0
    assert all(pool.block_hash(b) is None for b in range(6))
    assert pool.get_cached_block(H[0]) is None
    # The pool's width stays fixed.
    assert pool.hash_width == 4
    pool.check_invariants()


def test_reset_prefix_cache_on_empty_cache(Pool):
    pool = Pool(4, enable_events=True)
    assert pool.reset_prefix_cache() is True
    assert pool.take_events() == [AllBlocksCleared()]


def test_reset_prefix_cache_counts_block_zero_without_null_block(Pool):
    pool = Pool(4, null_block=False)
    a = pool.get_new_blocks(1)
    assert ids(a) == [0]
    assert pool.reset_prefix_cache() is False
    pool.free_blocks(a)
    assert pool.reset_prefix_cache() is True


# -- usage and events ---------------------------------------------------------------------------


def test_usage(Pool):
    pool = Pool(5)  # 4 usable blocks
    pool.get_new_blocks(1)
    assert pool.get_usage() == 0.25
    pool.get_new_blocks(3)
    assert pool.get_usage() == 1.0
    pool = Pool(4, null_block=False)
    pool.get_new_blocks(1)
    assert pool.get_usage() == 0.25


def test_usage_counts_cached_free_blocks_as_free(Pool):
    pool = Pool(5, block_size=1)
    a = pool.get_new_blocks(2)
    pool.cache_full_blocks(a, H[:2], 0, 2)
    pool.free_blocks(a)
    assert pool.get_usage() == 0.0


def test_events_are_in_emission_order(Pool):
    pool = Pool(4, enable_events=True, block_size=1)
    a = pool.get_new_blocks(3)  # [1, 2, 3]
    pool.cache_full_blocks(a, H[:3], 0, 3)
    pool.free_blocks(a[::-1])  # queue [3, 2, 1]
    b = pool.get_new_blocks(2)  # evicts 3 then 2
    pool.cache_full_blocks(b, [H[5], H[6]], 0, 2, token_ids=[1, 2])
    pool.evict_blocks([1])
    pool.free_blocks(b)
    assert pool.reset_prefix_cache() is True
    assert pool.take_events() == [
        stored(H[:3], block_size=1),
        removed(H[2]),
        removed(H[1]),
        stored([H[5], H[6]], None, [1, 2], block_size=1),
        removed(H[0]),
        AllBlocksCleared(),
    ]
    assert pool.take_events() == []


def test_events_disabled_records_nothing(Pool):
    pool = Pool(4, block_size=1)
    a = pool.get_new_blocks(2)
    pool.cache_full_blocks(a, H[:2], 0, 2)
    pool.evict_blocks(a)
    pool.free_blocks(a)
    pool.reset_prefix_cache()
    assert pool.take_events() == []


# -- batched forms ------------------------------------------------------------------------------


def test_get_new_blocks_many_equals_one_by_one(Pool):
    counts = [2, 0, 3, 1]

    def setup():
        pool = Pool(12, enable_events=True, block_size=1)
        a = pool.get_new_blocks(4)
        pool.cache_full_blocks(a, H[:4], 0, 4)
        pool.free_blocks(a[::-1])
        return pool

    batched, single = setup(), setup()
    flat, offsets = batched.get_new_blocks_many(np.array(counts, dtype=np.int64))
    assert offsets.dtype == np.int64 and offsets.ndim == 1
    one_by_one = [ids(single.get_new_blocks(c)) for c in counts]
    assert ids(flat) == [b for seg in one_by_one for b in seg]
    assert offsets.tolist() == [0, 2, 2, 5, 6]
    assert full_state(batched) == full_state(single)


def test_get_new_blocks_many_empty(Pool):
    pool = Pool(4)
    flat, offsets = pool.get_new_blocks_many([])
    assert ids(flat) == []
    assert offsets.dtype == np.int64
    assert offsets.tolist() == [0]


def _pool_with_requests(Pool):
    """A pool with three requests holding blocks, some cached, one block shared."""
    pool = Pool(16, enable_events=True, block_size=1)
    r1 = ids(pool.get_new_blocks(3))  # [1, 2, 3]
    r2 = ids(pool.get_new_blocks(2))  # [4, 5]
    pool.cache_full_blocks(r1, H[:3], 0, 2)
    pool.cache_full_blocks(r2, [H[7], H[8]], 0, 1)
    pool.touch([r1[0]])
    r3 = [r1[0]] + ids(pool.get_new_blocks(2))  # shares block 1
    return pool, [r1, r2, r3]


@pytest.mark.parametrize("reverse", [False, True])
def test_free_blocks_many_equals_one_by_one(Pool, reverse):
    batched, reqs = _pool_with_requests(Pool)
    single, _ = _pool_with_requests(Pool)
    batched.free_blocks_many(reqs, reverse=reverse)
    for r in reqs:
        single.free_blocks(r[::-1] if reverse else r)
    assert full_state(batched) == full_state(single)
    batched.check_invariants()


@pytest.mark.parametrize("reverse", [False, True])
def test_free_blocks_many_with_offsets_equals_one_by_one(Pool, reverse):
    batched, reqs = _pool_with_requests(Pool)
    single, _ = _pool_with_requests(Pool)
    flat = np.array([b for r in reqs for b in r], dtype=np.int32)
    offsets = np.cumsum([0] + [len(r) for r in reqs]).astype(np.int64)
    batched.free_blocks_many(flat, offsets, reverse=reverse)
    for r in reqs:
        single.free_blocks(r[::-1] if reverse else r)
    assert full_state(batched) == full_state(single)


def test_free_blocks_many_prepends_per_segment(Pool):
    # Segment by segment: the later segment's uncached blocks end up in front.
    pool = Pool(8)
    pool.get_new_blocks(4)
    pool.free_blocks_many([[1, 2], [3, 4]])
    assert free_ids(pool) == [3, 4, 1, 2, 5, 6, 7]


def test_free_blocks_many_empty_segments(Pool):
    pool = Pool(6)
    pool.get_new_blocks(2)
    pool.free_blocks_many([[], [2], [], [1]], reverse=True)
    assert free_ids(pool) == [1, 2, 3, 4, 5]
    pool.free_blocks_many([])
    pool.free_blocks_many([], [0])
    assert free_ids(pool) == [1, 2, 3, 4, 5]


# -- null_block=False and enable_caching=False ---------------------------------------------------


def test_without_null_block_block_zero_is_ordinary(Pool):
    pool = Pool(4, null_block=False, enable_events=True, block_size=1)
    assert pool.null_block is None
    assert pool.get_num_free_blocks() == 4
    a = ids(pool.get_new_blocks(2))
    assert a == [0, 1]
    pool.touch([0])
    assert pool.ref_count(0) == 2
    pool.cache_full_blocks(a, H[:2], 0, 2)
    assert pool.block_hash(0) == (H[0], 0)
    assert pool.get_cached_block(H[0]) == 0
    pool.free_blocks([0, 1, 0])
    assert free_ids(pool) == [2, 3, 1, 0]
    assert pool.get_usage() == 0.0
    pool.check_invariants()


def test_caching_disabled(Pool):
    from kvpool._errors import CachingDisabledError

    pool = Pool(6, enable_caching=False, enable_events=True)
    a = pool.get_new_blocks(2)
    with pytest.raises(CachingDisabledError):
        pool.cache_full_blocks(a, H[:2], 0, 2)
    pool.free_blocks(a[::-1])
    assert free_ids(pool) == [2, 1, 3, 4, 5]
    assert pool.get_num_cached_blocks() == 0
    assert pool.take_events() == []
    pool.check_invariants()


# -- introspection ------------------------------------------------------------------------------


def test_introspection(Pool):
    pool = Pool(5, block_size=1)
    a = ids(pool.get_new_blocks(2))
    pool.touch([a[0]])
    pool.cache_full_blocks(a, H[:1], 0, 1, group_id=2**32 - 1)
    counts = pool.ref_counts()
    assert counts.dtype == np.int32 and counts.shape == (5,)
    assert counts.tolist() == [0, 2, 1, 0, 0]
    assert pool.ref_count(np.int32(1)) == 2
    assert pool.block_hash(a[0]) == (H[0], 2**32 - 1)
    assert pool.block_hash(np.int64(a[1])) is None
    assert free_ids(pool) == [3, 4]
    assert pool.check_invariants() is None


def test_free_reverse_equals_freeing_the_reversed_ids(Pool):
    import kvpool

    a, b = Pool(16, enable_caching=False), Pool(16, enable_caching=False)
    for pool in (a, b):
        pool.get_new_blocks(3)
    ids_a, ids_b = a.get_new_blocks(5), b.get_new_blocks(5)
    a.free_blocks(ids_a, reverse=True)
    b.free_blocks(ids_b[::-1])
    assert free_ids(a) == free_ids(b)
    assert free_ids(a)[:5] == ids(ids_a)[::-1]
    with pytest.raises(kvpool.DtypeError):
        a.free_blocks(a.get_new_blocks(1), reverse="yes")


def test_free_reverse_rolls_back_a_double_free(Pool):
    import kvpool

    pool = Pool(8, enable_caching=False)
    held = pool.get_new_blocks(3)
    before = (free_ids(pool), pool.ref_counts().tolist())
    with pytest.raises(kvpool.DoubleFreeError):
        pool.free_blocks(np.concatenate([held, held[:1]]), reverse=True)
    assert (free_ids(pool), pool.ref_counts().tolist()) == before


@pytest.mark.parametrize("bad", [-1, -2, -(2**31)])
def test_negative_int32_ids_are_rejected_by_every_call(Pool, bad):
    import kvpool

    pool = Pool(8)
    held = pool.get_new_blocks(2)
    before = (free_ids(pool), pool.ref_counts().tolist(), pool.get_num_cached_blocks())
    ids32 = np.array([int(held[0]), bad], dtype=np.int32)
    calls = [
        lambda: pool.free_blocks(ids32),
        lambda: pool.free_blocks(ids32, reverse=True),
        lambda: pool.free_blocks(ids32[::-1]),
        lambda: pool.touch(ids32),
        lambda: pool.cache_full_blocks(ids32, [b"h" * 8, b"i" * 8], 0, 2),
    ]
    for call in calls:
        with pytest.raises(kvpool.InvalidBlockIdError, match=str(bad)):
            call()
        assert (free_ids(pool), pool.ref_counts().tolist(), pool.get_num_cached_blocks()) == before


def test_empty_batches_change_nothing(Pool):
    pool = Pool(16, enable_caching=True)
    held = pool.get_new_blocks(3)
    before = (free_ids(pool), pool.ref_counts().tolist(), pool.get_num_cached_blocks())
    empty = np.array([], dtype=np.int32)
    pool.free_blocks(empty, reverse=True)
    pool.free_blocks([], reverse=True)
    pool.free_blocks(held[:0][::-1])
    pool.free_blocks_many([], reverse=True)
    pool.free_blocks_many([empty, [], empty[::-1]], reverse=True)
    pool.free_blocks_many(empty, np.array([0, 0, 0]), reverse=True)
    pool.touch(empty)
    pool.cache_full_blocks(held, [b"x" * 8] * 3, 2, 2)
    assert ids(pool.find_longest_cache_hit([])) == []
    assert (free_ids(pool), pool.ref_counts().tolist(), pool.get_num_cached_blocks()) == before
    pool.check_invariants()


def test_whole_pool_batches(Pool):
    """Every block in one call, both ways, and one block more than there are."""
    import kvpool

    n = 20_000 if Pool.__module__.startswith("kvpool.reference") else 1_000_000
    pool = Pool(n, enable_caching=False)
    everything = pool.get_new_blocks(n - 1)
    assert pool.get_num_free_blocks() == 0
    with pytest.raises(kvpool.NoFreeBlocksError):
        pool.get_new_blocks(1)
    pool.free_blocks(everything, reverse=True)  # tail first: the last block is reused first
    assert free_ids(pool)[:3] == [n - 1, n - 2, n - 3] and pool.get_num_free_blocks() == n - 1
    ids_, offsets = pool.get_new_blocks_many(np.array([n // 2, n // 2 - 1]))
    with pytest.raises(kvpool.NoFreeBlocksError):
        pool.get_new_blocks_many(np.array([0, 1]))
    pool.free_blocks_many(ids_, offsets, reverse=True)
    assert pool.get_num_free_blocks() == n - 1
    pool.check_invariants()


def test_touching_free_uncached_blocks_from_the_middle_keeps_the_order(Pool):
    """Free uncached blocks taken out of the middle of the queue's front (kvpool's stack and
    fresh range, with tombstones and compaction) leave the rest in vLLM's order."""
    pool = Pool(400, enable_caching=False)
    held = pool.get_new_blocks(300)
    pool.free_blocks(held, reverse=True)  # 300..1 at the head, 301..399 never used behind
    touched = [int(b) for b in held[1:-1]] + list(range(320, 390, 3))  # tombstones compacted
    pool.touch(touched)
    expected = [b for b in [*range(300, 0, -1), *range(301, 400)] if b not in set(touched)]
    assert free_ids(pool) == expected
    pool.free_blocks(touched)
    assert free_ids(pool) == touched + expected
    pool.check_invariants()


@pytest.mark.parametrize("impl", ["rust", "reference"])
def test_ref_counts_of_reads_many_counts(impl: str) -> None:
    import kvpool
    import kvpool.reference

    if impl == "rust" and not hasattr(kvpool, "BlockPool"):
        pytest.skip("kvpool._core is not built")
    pool = (kvpool.BlockPool if impl == "rust" else kvpool.reference.BlockPool)(8)
    ids = pool.get_new_blocks(3).tolist()
    pool.touch([ids[0]])
    assert pool.ref_counts_of([ids[0], 7, ids[2], ids[0]]).tolist() == [2, 0, 1, 2]
    from kvpool._errors import InvalidBlockIdError

    with pytest.raises(InvalidBlockIdError):
        pool.ref_counts_of([1, 8])
