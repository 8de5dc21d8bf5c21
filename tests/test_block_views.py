"""``KVCacheBlockView`` and ``FreeBlockWalk``: the block objects ``kvpool.vllm`` hands to vLLM's
code, made in Rust. Each reads its pool when asked; the walk yields the free queue as
``free_block_ids_after`` reads it, batch after batch. (Compared with vLLM's own blocks and
free queue in ``test_vllm_offload_reads.py`` and the offload differential.)"""

from __future__ import annotations

import gc
import random
import threading

import numpy as np
import pytest

import kvpool
from kvpool._core import FreeBlockWalk, KVCacheBlockView


def scrambled_pool(num_blocks: int, seed: int = 0) -> kvpool.BlockPool:
    """A pool whose free queue holds cached blocks in a shuffled order and uncached ones."""
    rng = random.Random(seed)
    pool = kvpool.BlockPool(num_blocks, enable_caching=True, block_size=16)
    ids = pool.get_new_blocks(num_blocks - 1)
    hashed = ids[: len(ids) // 2]
    pool.cache_full_blocks(hashed, [i.to_bytes(32, "big") for i in range(len(hashed))], 0, len(hashed))
    order = ids.tolist()
    rng.shuffle(order)
    pool.free_blocks(np.array(order, dtype=np.int32))
    return pool


def test_a_view_reads_its_block_now() -> None:
    pool = kvpool.BlockPool(8, enable_caching=True, block_size=16)
    view = KVCacheBlockView(pool, 3)
    assert (view.block_id, view.ref_cnt, view.block_hash, view.is_null) == (3, 0, None, False)
    assert KVCacheBlockView(pool, 0).is_null
    # A pool without a null block hands out block 0 like any other.
    plain = kvpool.BlockPool(8, enable_caching=True, block_size=16, null_block=False)
    assert plain.get_new_blocks(1).tolist() == [0] and not KVCacheBlockView(plain, 0).is_null
    ids = pool.get_new_blocks(7)
    views = KVCacheBlockView.of_ids(pool, ids)
    assert [v.block_id for v in views] == ids.tolist()
    pool.cache_full_blocks(ids[:1], [b"\x07" * 32], 0, 1, group_id=2)
    first = views[0]
    assert first.ref_cnt == 1
    # vLLM's BlockHashWithGroupId: the hash, then the group as 4 bytes big-endian.
    assert first.block_hash == b"\x07" * 32 + (2).to_bytes(4, "big")
    assert first.block_hash_num_tokens == 16
    assert repr(first) == f"KVCacheBlock(block_id={first.block_id}, ref_cnt=1, block_hash={first.block_hash!r})"
    pool.free_blocks(ids)
    assert first.ref_cnt == 0


def test_views_compare_by_pool_and_block() -> None:
    a, b = (kvpool.BlockPool(4, enable_caching=True, block_size=16) for _ in range(2))
    assert KVCacheBlockView(a, 1) == KVCacheBlockView(a, 1)
    assert KVCacheBlockView(a, 1) != KVCacheBlockView(a, 2)
    assert KVCacheBlockView(a, 1) != KVCacheBlockView(b, 1)
    assert KVCacheBlockView(a, 1) != 1
    assert len({KVCacheBlockView(a, 1), KVCacheBlockView(a, 1), KVCacheBlockView(a, 2)}) == 2


def test_views_keep_their_pool_and_stay_off_the_collectors_lists() -> None:
    pool = kvpool.BlockPool(6, enable_caching=True, block_size=16)
    views = KVCacheBlockView.of_ids(pool, [1, 2])
    walked = list(FreeBlockWalk(pool))
    del pool
    gc.collect()
    assert views[0].ref_cnt == 0 and len(walked) == 5
    # A view refers to nothing that could refer back to it: the collector need not see it.
    assert not any(gc.is_tracked(v) for v in views + walked)


def test_the_unkeyed_token_count_is_kept_on_the_view() -> None:
    view = KVCacheBlockView(kvpool.BlockPool(4, enable_caching=True, block_size=16), 1)
    assert view._num_tokens_when_unkeyed is None
    view._num_tokens_when_unkeyed = 48
    assert view._num_tokens_when_unkeyed == 48
    with pytest.raises(kvpool.InvalidArgumentError):
        view._num_tokens_when_unkeyed = -5
    with pytest.raises(kvpool.DtypeError):
        view._num_tokens_when_unkeyed = "48"
    assert view._num_tokens_when_unkeyed == 48
    view._num_tokens_when_unkeyed = None
    assert view._num_tokens_when_unkeyed is None


def test_bad_input_is_refused() -> None:
    pool = kvpool.BlockPool(4, enable_caching=True, block_size=16)
    with pytest.raises(kvpool.DtypeError):
        KVCacheBlockView(object(), 1)  # type: ignore[arg-type]
    with pytest.raises(kvpool.DtypeError):
        KVCacheBlockView(pool, "1")  # type: ignore[arg-type]
    for bad in (-1, 4, 2**40):
        with pytest.raises(kvpool.InvalidBlockIdError):
            KVCacheBlockView(pool, bad)
        with pytest.raises(kvpool.InvalidBlockIdError):
            KVCacheBlockView.of_ids(pool, [1, 2, bad])
        with pytest.raises(kvpool.InvalidBlockIdError):
            FreeBlockWalk(pool, bad)
    with pytest.raises(kvpool.DtypeError):
        KVCacheBlockView.of_ids(pool, [1.5])
    with pytest.raises(kvpool.DtypeError):
        FreeBlockWalk(None)  # type: ignore[arg-type]
    assert pool.get_num_free_blocks() == 3  # nothing changed
    pool.check_invariants()


@pytest.mark.parametrize("num_blocks", [1, 2, 17, 100, 6_000])
def test_a_walk_yields_the_free_queue_in_order(num_blocks: int) -> None:
    # 6,000 blocks cross every batch size (16, 64, 256, 1,024, 4,096, then 4,096 again).
    pool = scrambled_pool(num_blocks, seed=num_blocks)
    order = pool.free_block_ids().tolist()
    assert [v.block_id for v in FreeBlockWalk(pool)] == order
    rng = random.Random(num_blocks)
    for cursor in rng.sample(order, min(5, len(order))):
        after = order[order.index(cursor) + 1:]
        assert [v.block_id for v in FreeBlockWalk(pool, cursor)] == after


def test_a_walk_from_a_block_in_use_yields_nothing() -> None:
    pool = scrambled_pool(50)
    taken = int(pool.get_new_blocks(1)[0])
    assert list(FreeBlockWalk(pool, taken)) == []


def test_a_walk_goes_on_after_the_last_block_it_yielded() -> None:
    # After the pool changes, the walk goes on after the last block it yielded, as vLLM's
    # list goes on from the block the walk stands on: blocks taken from the head meanwhile
    # do not matter, unless that block was one of them, which ends the walk (vLLM unlinks a
    # taken block, so its walk ends there too).
    for taken, rest in ((10, slice(16, None)), (20, slice(0, 0))):
        pool = scrambled_pool(200, seed=3)
        order = pool.free_block_ids().tolist()
        walk = FreeBlockWalk(pool)
        assert [next(walk).block_id for _ in range(16)] == order[:16]  # the first batch
        assert pool.get_new_blocks(taken).tolist() == order[:taken]
        assert [v.block_id for v in walk] == order[rest]


def test_threads_sharing_a_walk_see_each_block_once() -> None:
    pool = scrambled_pool(30_000, seed=5)
    order = pool.free_block_ids().tolist()
    walk = FreeBlockWalk(pool)
    seen: list[list[int]] = [[], []]

    def take(out: list[int]) -> None:
        for view in walk:
            out.append(view.block_id)

    threads = [threading.Thread(target=take, args=(seen[i],)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen[0] + seen[1]) == sorted(order)
    for part in seen:  # each thread's share comes in queue order
        position = [order.index(b) for b in part[:200]]
        assert position == sorted(position)


@pytest.mark.parametrize("eviction", ["lru", "priority", "adaptive"])
def test_every_cursor_goes_on_in_eviction_order(eviction: str) -> None:
    # Cached blocks under three retention priorities (the priority policy's classes), some
    # hit twice (the adaptive policy's), freed in a shuffled order, beside uncached ones.
    rng = random.Random(11)
    pool = kvpool.BlockPool(400, enable_caching=True, block_size=16, eviction=eviction)
    ids = pool.get_new_blocks(399)
    hashed = ids[:300]
    for part, priority in zip(np.array_split(hashed, 3), (90, 10, 50)):
        hashes = [int(i).to_bytes(32, "big") for i in part]
        pool.cache_full_blocks(part, hashes, 0, len(part),
                               **({"priority": priority} if eviction == "priority" else {}))
        if eviction == "adaptive":
            pool.touch(part[::2])
            pool.free_blocks(part[::2])
    order = ids.tolist()
    rng.shuffle(order)
    pool.free_blocks(np.array(order, dtype=np.int32))
    queue = pool.free_block_ids().tolist()
    for i, cursor in enumerate(queue):
        assert pool.free_block_ids_after(cursor, 1_000).tolist() == queue[i + 1:], cursor
    for cursor in rng.sample(queue, 10):
        after = queue[queue.index(cursor) + 1:]
        assert [v.block_id for v in FreeBlockWalk(pool, cursor)] == after


@pytest.mark.parametrize("eviction", ["lru", "priority", "adaptive"])
def test_each_step_yields_the_current_successor_of_the_last_block(eviction: str) -> None:
    # vLLM's walk reads ``next_free_block`` of the block it last yielded when asked for the
    # next one, so it sees the pool as it is at that moment: blocks taken, freed, hit or
    # moved between steps. kvpool's walk reads ahead in batches and must agree step by step.
    rng = random.Random(f"walk-{eviction}")
    for seed in range(8):
        pool = kvpool.BlockPool(120, enable_caching=True, block_size=16, eviction=eviction)
        ids = pool.get_new_blocks(119)
        pool.cache_full_blocks(ids[:80], [int(i).to_bytes(32, "big") for i in ids[:80]], 0, 80)
        order = ids.tolist()
        rng.shuffle(order)
        pool.free_blocks(np.array(order, dtype=np.int32))
        held: list[int] = []
        walk = FreeBlockWalk(pool)
        last: int | None = None
        for _ in range(300):
            expected = pool.free_block_ids_after(last, 1).tolist()
            if last is not None and pool.ref_count(last) != 0:
                expected = []  # the block the walk stood on left the queue: the walk ends
            got = next(walk, None)
            assert (got.block_id if got is not None else None) == (expected[0] if expected else None), seed
            if got is None:
                assert next(walk, None) is None  # an ended walk stays ended
                break
            last = got.block_id
            move = rng.randrange(5)
            free_ids = pool.free_block_ids().tolist()
            if move == 0 and free_ids:  # take blocks from the head
                held += pool.get_new_blocks(rng.randint(1, 3)).tolist()
            elif move == 1 and held:  # free some back (uncached to the head, cached to a tail)
                rng.shuffle(held)
                back, held = held[:2], held[2:]
                pool.free_blocks(np.array(back, dtype=np.int32))
            elif move == 2 and free_ids:  # a prefix hit on free blocks, maybe the walk's own
                hit = rng.sample(free_ids, min(2, len(free_ids))) + ([last] if rng.random() < 0.2 else [])
                hit = [b for b in dict.fromkeys(hit) if pool.ref_count(b) == 0]
                pool.touch(np.array(hit, dtype=np.int32))
                if rng.random() < 0.5:
                    pool.free_blocks(np.array(hit, dtype=np.int32))  # back at a tail
                else:
                    held += hit
        pool.check_invariants()


@pytest.mark.parametrize("eviction", ["lru", "priority", "adaptive"])
def test_neighbours_follow_the_queue_and_end_in_none_without_a_queue_view(eviction: str) -> None:
    pool = kvpool.BlockPool(200, enable_caching=True, block_size=16, eviction=eviction)
    ids = pool.get_new_blocks(150)
    for part, priority in zip(np.array_split(ids[:120], 3), (70, 20, 50)):
        pool.cache_full_blocks(part, [int(i).to_bytes(32, "big") for i in part], 0, len(part),
                               **({"priority": priority} if eviction == "priority" else {}))
    rng = random.Random(4)
    order = ids.tolist()
    rng.shuffle(order)
    pool.free_blocks(np.array(order[:100], dtype=np.int32))  # 50 stay in use
    pool.touch(np.array([i for i in range(160, 170)], dtype=np.int32))  # gaps in the fresh range
    queue = pool.free_block_ids().tolist()
    assert queue and len(queue) > 100
    for i, block in enumerate(queue):
        view = KVCacheBlockView(pool, block)
        before, after = view.prev_free_block, view.next_free_block
        assert (before.block_id if before is not None else None) == (queue[i - 1] if i else None)
        assert (after.block_id if after is not None else None) == (queue[i + 1] if i + 1 < len(queue) else None)
        assert pool.free_block_id_before(block) == (queue[i - 1] if i else None)
    assert pool.free_block_id_before(None) == queue[-1]
    for block in [0, *order[100:], *range(160, 170)]:  # the null block, blocks in use
        view = KVCacheBlockView(pool, block)
        assert (view.prev_free_block, view.next_free_block, pool.free_block_id_before(block)) == (None, None, None)


@pytest.mark.parametrize("eviction", ["lru", "priority", "adaptive"])
def test_walks_beside_a_thread_that_changes_the_pool(eviction: str) -> None:
    # Two walks run while a third thread takes, frees and hits blocks: the walk's version
    # check reads an atomic and never waits on the pool's lock while holding its own, so
    # nothing hangs or fails and the pool stays whole. (A walk may yield a block twice here,
    # as vLLM's does: a cached block it passed, hit and freed again, rejoins ahead of it at
    # the tail. Step-by-step agreement is checked single-threaded above.)
    pool = scrambled_pool(3_000, seed=9)
    if eviction != "lru":
        pool = kvpool.BlockPool(3_000, enable_caching=True, block_size=16, eviction=eviction)
        ids = pool.get_new_blocks(2_999)
        pool.cache_full_blocks(ids[:1_500], [int(i).to_bytes(32, "big") for i in ids[:1_500]], 0, 1_500)
        pool.free_blocks(ids[::-1].copy())
    errors: list[BaseException] = []
    stop = threading.Event()

    def churn() -> None:
        rng = random.Random(2)
        try:
            while not stop.is_set():
                taken = pool.get_new_blocks(rng.randint(1, 8))
                free = pool.free_block_ids()
                hit = np.array(rng.sample(free.tolist(), min(3, len(free))), dtype=np.int32)
                pool.touch(hit)
                pool.free_blocks(np.concatenate([taken, hit]))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    seen: list[list[int]] = [[], []]

    def walk(out: list[int]) -> None:
        try:
            for _ in range(20):
                out.clear()
                out.extend(view.block_id for view in FreeBlockWalk(pool))
                assert all(0 < b < 3_000 for b in out)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=churn)] + [threading.Thread(target=walk, args=(s,)) for s in seen]
    for t in threads:
        t.start()
    for t in threads[1:]:
        t.join(timeout=120)
    stop.set()
    threads[0].join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert errors == []
    pool.check_invariants()
