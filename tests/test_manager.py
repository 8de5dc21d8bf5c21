"""Scheduler scenarios on every ``KVCacheManager`` implementation (plain-Python reference, Rust).

Each test plays what vLLM's scheduler does (``get_computed_blocks`` for a waiting request, then
``allocate_slots``; appending decoded tokens; freeing; preempting) and checks the exact block ids,
block tables, computed tokens, events and statistics (``docs/semantics.md``, "Per-request
manager"). Where only the reference can show it (free-queue order, reference counts), the test
also looks at ``manager.pool``, the reference's ``BlockPool``.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest

import kvpool.reference
from kvpool._errors import (
    BlockStateError,
    CachingDisabledError,
    DtypeError,
    InvalidArgumentError,
    InvalidBlockIdError,
    KVPoolError,
)
from kvpool.events import AllBlocksCleared, BlockRemoved, BlockStored
from kvpool.reference.manager import DuplicateRequestError, UnknownRequestError
from kvpool.stats import PrefixCacheStats

ReferenceManager = kvpool.reference.KVCacheManager
RustManager = getattr(sys.modules["kvpool"], "KVCacheManager", None)

MANAGER_IMPLS = [
    pytest.param(ReferenceManager, id="reference"),
    pytest.param(RustManager, id="rust", marks=pytest.mark.skipif(RustManager is None, reason="kvpool._core is not built")),
]


@pytest.fixture(params=MANAGER_IMPLS)
def Manager(request: pytest.FixtureRequest) -> Any:
    """Each KVCacheManager implementation in turn (the Rust one only when built)."""
    return request.param


PROMPT = list(range(100, 110))  # 10 tokens: 2 full blocks of 4 and a partial one


def ids(array: Any) -> list[int]:
    """Block ids as a list, checking they came as a 1-D int32 array."""
    assert isinstance(array, np.ndarray) and array.dtype == np.int32 and array.ndim == 1, array
    return [int(v) for v in array.tolist()]


def hashes(m: Any, rid: Any) -> list[bytes]:
    h = m.get_block_hashes(rid)
    return list(h.to_list() if hasattr(h, "to_list") else h)


def snapshot(m: Any) -> dict[str, Any]:
    """Everything observable through the public API, plus the reference pool's internals."""
    state: dict[str, Any] = {
        "requests": {
            rid: (
                ids(m.get_block_ids(rid)),
                m.get_num_tokens(rid),
                m.get_num_computed_tokens(rid),
                hashes(m, rid),
            )
            for rid in m.request_ids()
        },
        "free": m.get_num_free_blocks(),
        "usage": m.get_usage(),
        "stats": m.prefix_cache_stats,
        "recent": m.recent_prefix_cache_stats,
    }
    if isinstance(m, ReferenceManager):
        state["free_queue"] = m.pool.free_block_ids().tolist()
        state["ref_counts"] = m.pool.ref_counts().tolist()
        state["keys"] = [m.pool.block_hash(b) for b in range(m.num_blocks)]
    return state


def free_queue(m: Any) -> list[int] | None:
    """The free queue, head first (reference only: the Rust manager has no API for it)."""
    return m.pool.free_block_ids().tolist() if isinstance(m, ReferenceManager) else None


def ref_counts(m: Any, blocks: list[int]) -> list[int] | None:
    return [m.pool.ref_count(b) for b in blocks] if isinstance(m, ReferenceManager) else None


def schedule(m: Any, rid: Any, budget: int, lookahead: int = 0) -> Any:
    """What a scheduler does for one request: a waiting one looks up its prefix hit first."""
    if len(m.get_block_ids(rid)) == 0 and m.get_num_computed_tokens(rid) == 0:
        blocks, hit = m.get_computed_blocks(rid)
        n = min(budget, m.get_num_tokens(rid) - hit)
        return m.allocate_slots(rid, n, num_new_computed_tokens=hit, new_computed_blocks=blocks, num_lookahead_tokens=lookahead)
    return m.allocate_slots(rid, budget, num_lookahead_tokens=lookahead)


def stored(hs: list[bytes], parent: bytes | None, tokens: list[int], block_size: int = 4, **kw: Any) -> BlockStored:
    return BlockStored(block_hashes=hs, parent_block_hash=parent, token_ids=tokens, block_size=block_size, **kw)


# --------------------------------------------------------------------------------------------
# Scenarios
# --------------------------------------------------------------------------------------------


def test_construction_and_properties(Manager: Any) -> None:
    m = Manager(10, 4)
    assert (m.num_blocks, m.block_size, m.enable_caching, m.hash_algo) == (10, 4, True, "sha256_cbor")
    assert m.get_num_free_blocks() == 9 and m.get_usage() == 0.0 and len(m) == 0
    assert m.prefix_cache_stats == PrefixCacheStats(0, 0, 0, 0)
    assert Manager(10, 4, hash_algo="xxhash", enable_caching=False).hash_algo == "xxhash"
    with pytest.raises(InvalidArgumentError):
        Manager(10, 4, hash_algo="md5")
    with pytest.raises(InvalidArgumentError):
        Manager(0, 4)
    with pytest.raises(InvalidArgumentError):
        Manager(10, 0)
    with pytest.raises(InvalidArgumentError):
        Manager(10, 4, max_model_len=0)
    with pytest.raises(TypeError):
        Manager(10.0, 4)


def test_reference_hashes_match_rust() -> None:
    if RustManager is None:
        pytest.skip("kvpool._core is not built")
    for kw in [{}, {"hash_algo": "sha256"}, {"hash_algo": "xxhash_cbor", "seed": "s"}]:
        a, b = ReferenceManager(8, 2, **kw), RustManager(8, 2, **kw)
        extras = {"lora": ("l", "/p"), "cache_salt": "salt", "mm_features": [("img", 1, 2)]}
        for m in (a, b):
            m.add_request("r", [1, 2, 3, 4, 5], **extras)
            m.append_token_ids("r", [6, 7])
        assert hashes(a, "r") == hashes(b, "r") and len(hashes(a, "r")) == 3


def test_prefill(Manager: Any) -> None:
    m = Manager(10, 4, enable_events=True)
    m.add_request("a", PROMPT)
    assert "a" in m and m.request_ids() == ("a",) and m.get_num_tokens("a") == 10
    blocks, hit = m.get_computed_blocks("a")
    assert ids(blocks) == [] and hit == 0
    assert ids(m.allocate_slots("a", 10, num_new_computed_tokens=0, new_computed_blocks=blocks)) == [1, 2, 3]
    assert ids(m.get_block_ids("a")) == [1, 2, 3]
    assert m.get_num_computed_tokens("a") == 10
    assert m.get_num_free_blocks() == 6 and m.get_usage() == pytest.approx(3 / 9)
    h = hashes(m, "a")
    assert len(h) == 2 and all(len(x) == 32 for x in h)
    assert m.take_events() == [stored(h, None, PROMPT[:8])]
    assert free_queue(m) in (None, [4, 5, 6, 7, 8, 9])
    m.check_invariants()


def test_chunked_prefill(Manager: Any) -> None:
    prompt = list(range(20))  # 5 full blocks
    m = Manager(12, 4, enable_events=True)
    m.add_request("a", prompt)
    m.add_request("b", prompt)
    h = hashes(m, "a")
    assert ids(schedule(m, "a", 6)) == [1, 2]  # chunk 1: tokens 0..6, one full block
    assert m.take_events() == [stored(h[:1], None, prompt[:4])]
    assert ids(m.allocate_slots("a", 6)) == [3]  # chunk 2: tokens 6..12
    assert m.take_events() == [stored(h[1:3], h[0], prompt[4:12])]
    # A waiting request sees what is cached so far.
    blocks, hit = m.get_computed_blocks("b")
    assert (ids(blocks), hit) == ([1, 2, 3], 12)
    assert ids(m.allocate_slots("a", 8)) == [4, 5]  # chunk 3: tokens 12..20
    assert m.take_events() == [stored(h[3:5], h[2], prompt[12:20])]
    assert m.get_num_computed_tokens("a") == 20
    blocks, hit = m.get_computed_blocks("b")
    assert (ids(blocks), hit) == ([1, 2, 3, 4], 16)  # capped below the last token
    # A running request is never looked up again: its own cached chunks are no "hit".
    m.append_token_ids("a", [99])
    result = m.schedule_step(["a"], 1)
    assert result.num_hit_tokens.tolist() == [0] and result.num_scheduled_tokens.tolist() == [1]
    assert ids(result.block_ids) == [6] and result.allocated.tolist() == [True]
    # Statistics count admissions (as vLLM 0.33): "a" once; "b"'s lookups alone do not count.
    assert m.prefix_cache_stats == PrefixCacheStats(requests=1, queries=20, hits=0)
    m.check_invariants()


def test_chunked_prefill_through_steps(Manager: Any) -> None:
    prompt = list(range(20))
    m = Manager(12, 4)
    m.add_request("a", prompt)
    # A running request's budget is the scheduler's chunk: the step does not cap it.
    steps = [m.schedule_step(["a"], budget) for budget in (8, 8, 4)]
    assert [s.num_scheduled_tokens.tolist() for s in steps] == [[8], [8], [4]]
    assert [s.num_hit_tokens.tolist() for s in steps] == [[0], [0], [0]]
    assert [ids(s.block_ids) for s in steps] == [[1, 2], [3, 4], [5]]
    assert m.prefix_cache_stats.requests == 1  # looked up only while waiting
    m.add_request("b", prompt)
    s = m.schedule_step(["b"], 100)
    assert s.num_hit_tokens.tolist() == [16] and s.num_scheduled_tokens.tolist() == [4]
    assert ids(s.block_ids) == [6] and ids(m.get_block_ids("b")) == [1, 2, 3, 4, 6]
    # The whole table of an admitted request is its hit, then its new blocks.
    assert ids(s.hit_block_ids) == [1, 2, 3, 4] and s.hit_offsets.tolist() == [0, 4]
    assert s.status.tolist() == [kvpool.StepStatus.SCHEDULED] and len(s) == 1
    assert s.block_ids is s.block_ids and s.status is s.status  # each array is built once


def test_decode_across_block_boundaries(Manager: Any) -> None:
    m = Manager(8, 4, enable_events=True)
    prompt = PROMPT[:7]
    m.add_request("a", prompt)
    assert ids(schedule(m, "a", 7)) == [1, 2]
    h0 = hashes(m, "a")
    assert m.take_events() == [stored(h0, None, prompt[:4])]
    m.append_token_ids("a", [7])  # the 8th token fills block 2: cached once computed
    assert ids(m.allocate_slots("a", 1)) == []
    h = hashes(m, "a")
    assert h[:1] == h0 and len(h) == 2
    assert m.take_events() == [stored(h[1:2], h[0], [*prompt, 7][4:8])]
    m.append_token_ids("a", [8])  # the 9th token needs a third block
    assert ids(m.allocate_slots("a", 1)) == [3]
    assert m.take_events() == []
    for t in (9, 10):
        m.append_token_ids("a", [t])
        assert ids(m.allocate_slots("a", 1)) == []
    m.append_token_ids("a", [11])
    assert ids(m.allocate_slots("a", 1)) == []
    [event] = m.take_events()
    assert isinstance(event, BlockStored) and event.token_ids == [8, 9, 10, 11]
    assert m.get_num_computed_tokens("a") == 12 and ids(m.get_block_ids("a")) == [1, 2, 3]
    m.check_invariants()


def test_prefix_hits_between_requests(Manager: Any) -> None:
    m = Manager(10, 4)
    m.add_request("a", PROMPT)
    assert ids(schedule(m, "a", 10)) == [1, 2, 3]
    m.free("a")
    assert "a" not in m and m.get_num_free_blocks() == 9
    # Freed tail first: the partial block 3 goes to the head, the cached 2 and 1 to the tail.
    assert free_queue(m) in (None, [3, 4, 5, 6, 7, 8, 9, 2, 1])

    m.add_request("b", [*PROMPT[:8], 50, 51, 52])
    blocks, hit = m.get_computed_blocks("b")
    assert (ids(blocks), hit) == ([1, 2], 8)
    assert ref_counts(m, [1, 2]) in (None, [0, 0])  # a lookup never touches
    assert ids(m.allocate_slots("b", 3, num_new_computed_tokens=8, new_computed_blocks=blocks)) == [3]
    assert ids(m.get_block_ids("b")) == [1, 2, 3] and m.get_num_computed_tokens("b") == 11
    assert m.get_num_free_blocks() == 6  # the hits left the free queue
    assert free_queue(m) in (None, [4, 5, 6, 7, 8, 9])

    m.add_request("c", PROMPT[:9])  # 2 full blocks + 1 token: both blocks hit
    blocks, hit = m.get_computed_blocks("c")
    assert (ids(blocks), hit) == ([1, 2], 8)
    assert ids(m.allocate_slots("c", 1, num_new_computed_tokens=8, new_computed_blocks=blocks)) == [4]
    assert ref_counts(m, [1, 2, 3, 4]) in (None, [2, 2, 1, 1])
    assert m.get_num_free_blocks() == 5
    m.free("b")
    assert ref_counts(m, [1, 2, 3]) in (None, [1, 1, 0])
    assert m.get_num_free_blocks() == 6
    m.check_invariants()


def test_prompt_of_exactly_k_full_blocks_hits_at_most_k_minus_1(Manager: Any) -> None:
    m = Manager(10, 4)
    prompt = list(range(12))  # 3 full blocks
    m.add_request("a", [*prompt, 12])
    schedule(m, "a", 13)
    m.add_request("b", prompt)
    blocks, hit = m.get_computed_blocks("b")
    assert (ids(blocks), hit) == ([1, 2], 8)
    s = m.schedule_step(["b"], 100)
    assert s.num_hit_tokens.tolist() == [8] and s.num_scheduled_tokens.tolist() == [4]
    assert ids(s.block_ids) == [5]  # the third block is recomputed in a new block
    m.add_request("c", prompt[:4])  # one full block: no hit at all
    assert (ids(m.get_computed_blocks("c")[0]), m.get_computed_blocks("c")[1]) == ([], 0)


def test_preemption_and_resume(Manager: Any) -> None:
    m = Manager(10, 4, enable_events=True)
    m.add_request("a", PROMPT)
    assert ids(schedule(m, "a", 10)) == [1, 2, 3]
    m.take_events()
    m.preempt("a")
    assert "a" in m and m.get_num_tokens("a") == 10
    assert m.get_num_computed_tokens("a") == 0 and ids(m.get_block_ids("a")) == []
    assert m.get_num_free_blocks() == 9
    assert free_queue(m) in (None, [3, 4, 5, 6, 7, 8, 9, 2, 1])
    assert m.take_events() == []  # freeing keeps hashes
    blocks, hit = m.get_computed_blocks("a")
    assert (ids(blocks), hit) == ([1, 2], 8)  # its own former blocks
    assert m.prefix_cache_stats == PrefixCacheStats(requests=1, queries=10, hits=0)  # a lookup records nothing
    assert ids(m.allocate_slots("a", 2, num_new_computed_tokens=8, new_computed_blocks=blocks)) == [3]
    # Readmitted: counted apart, as vLLM counts preempted requests.
    assert m.prefix_cache_stats == PrefixCacheStats(
        requests=1, queries=10, hits=0, preempted_requests=1, preempted_queries=10, preempted_hits=8
    )
    assert ids(m.get_block_ids("a")) == [1, 2, 3] and m.get_num_computed_tokens("a") == 10
    assert m.take_events() == []  # nothing newly full
    m.check_invariants()


def test_preemption_and_resume_through_a_step(Manager: Any) -> None:
    m = Manager(10, 4)
    m.add_request("a", PROMPT)
    m.schedule_step(["a"], 10)
    m.append_token_ids("a", [7, 8, 9])  # 13 tokens: 3 full blocks
    m.allocate_slots("a", 3)
    m.preempt("a")
    s = m.schedule_step(["a"], 100)
    assert s.num_hit_tokens.tolist() == [12] and s.num_scheduled_tokens.tolist() == [1]
    assert ids(s.block_ids) == [4] and ids(m.get_block_ids("a")) == [1, 2, 3, 4]
    assert m.prefix_cache_stats.preempted_requests == 1


def test_allocation_failure_changes_nothing(Manager: Any) -> None:
    m = Manager(5, 4, enable_events=True)  # 4 usable blocks
    m.add_request("a", PROMPT)
    assert ids(schedule(m, "a", 10)) == [1, 2, 3]
    m.add_request("b", [*PROMPT[:8], *range(10)])  # 18 tokens, hits blocks 1 and 2 (in use)
    blocks, hit = m.get_computed_blocks("b")
    assert (ids(blocks), hit) == ([1, 2], 8)
    m.take_events()
    before = snapshot(m)
    assert m.allocate_slots("b", 10, num_new_computed_tokens=8, new_computed_blocks=blocks) is None
    assert snapshot(m) == before and m.take_events() == []
    assert m.allocate_slots("a", 10) is None  # a running request too
    assert snapshot(m) == before and m.take_events() == []

    # Hits in the free queue count against the free blocks: 3 new + 2 evictable > 4 free.
    m.free("a")
    m.add_request("c", [*PROMPT[:8], *range(9)])  # 17 tokens: 5 blocks, 2 of them hits
    blocks, hit = m.get_computed_blocks("c")
    assert (ids(blocks), hit) == ([1, 2], 8)
    m.take_events()
    before = snapshot(m)
    assert m.allocate_slots("c", 9, num_new_computed_tokens=8, new_computed_blocks=blocks) is None
    assert snapshot(m) == before and m.take_events() == []
    # A step marks it and changes nothing, statistics included (it was not admitted).
    s = m.schedule_step(["c"], 100)
    assert s.allocated.tolist() == [False] and s.num_hit_tokens.tolist() == [0] and len(s.block_ids) == 0
    assert snapshot(m) == before and m.take_events() == []
    # Without the hits, 4 blocks fit (evicting the cached ones from the queue's tail).
    assert ids(m.allocate_slots("c", 16)) == [3, 4, 2, 1]
    m.check_invariants()


def test_step_stop_at_first_failure(Manager: Any) -> None:
    m = Manager(5, 4)
    for rid, n in [("a", 8), ("b", 20), ("c", 4)]:
        m.add_request(rid, list(range(1000 * len(rid) + n, 1000 * len(rid) + 2 * n)))
    s = m.schedule_step(["a", "b", "c"], 100)
    assert s.allocated.tolist() == [True, False, True]
    assert s.num_scheduled_tokens.tolist() == [8, 0, 4]
    assert s.offsets.tolist() == [0, 2, 2, 3] and ids(s.block_ids) == [1, 2, 3]
    m2 = Manager(5, 4)
    for rid, n in [("a", 8), ("b", 20), ("c", 4)]:
        m2.add_request(rid, list(range(1000 * len(rid) + n, 1000 * len(rid) + 2 * n)))
    s = m2.schedule_step(["a", "b", "c"], [100, 100, 100], stop_at_first_failure=True)
    assert s.allocated.tolist() == [True, False, False] and ids(s.block_ids) == [1, 2]
    assert m2.prefix_cache_stats.requests == 1  # only "a" was admitted; "c" was not tried
    for field in ("block_ids", "offsets", "num_scheduled_tokens", "num_hit_tokens", "allocated"):
        assert getattr(s, field).dtype == {"block_ids": np.int32, "allocated": np.bool_}.get(field, np.int64)
    assert len(s) == 3


def test_lookahead_slots_are_never_cached(Manager: Any) -> None:
    m = Manager(10, 4, enable_events=True)
    m.add_request("a", list(range(8)))  # 2 full blocks, both hashed
    assert ids(m.allocate_slots("a", 4, num_lookahead_tokens=4)) == [1, 2]
    h = hashes(m, "a")
    assert m.take_events() == [stored(h[:1], None, list(range(4)))]  # only the computed block
    assert m.get_num_computed_tokens("a") == 4
    m.add_request("b", list(range(8)) + [9])
    assert m.get_computed_blocks("b")[1] == 4
    # Draft tokens inside num_new_tokens are capped at the known tokens.
    assert ids(m.allocate_slots("a", 4 + 3, num_lookahead_tokens=2)) == [3, 4]
    assert m.take_events() == [stored(h[1:2], h[0], list(range(4, 8)))]
    assert m.get_num_computed_tokens("a") == 11
    m.set_num_computed_tokens("a", 9)  # drafts rejected
    assert m.get_num_computed_tokens("a") == 9
    with pytest.raises(InvalidArgumentError):
        m.set_num_computed_tokens("a", 17)


def test_reset_prefix_cache(Manager: Any) -> None:
    m = Manager(10, 4, enable_events=True)
    m.add_request("a", PROMPT)
    schedule(m, "a", 10)
    m.take_events()
    before = snapshot(m)
    assert m.reset_prefix_cache() is False
    assert snapshot(m) == before and m.take_events() == []
    m.add_request("b", PROMPT)
    assert m.get_computed_blocks("b")[1] == 8  # still cached
    m.free("a")
    queue = free_queue(m)
    assert m.reset_prefix_cache() is True
    assert m.take_events() == [AllBlocksCleared()]
    assert m.prefix_cache_stats == PrefixCacheStats(0, 0, 0, 0)
    assert m.recent_prefix_cache_stats == PrefixCacheStats(0, 0, 0, 0)
    assert free_queue(m) == queue  # the queue keeps its order
    assert m.get_computed_blocks("b")[1] == 0
    assert m.reset_prefix_cache() is True  # also when nothing is cached
    m.check_invariants()


def test_max_model_len_caps_slots(Manager: Any) -> None:
    m = Manager(10, 4, max_model_len=10)
    m.add_request("a", list(range(8)))
    assert ids(m.allocate_slots("a", 8, num_lookahead_tokens=8)) == [1, 2, 3]  # min(16, 10) slots
    assert ids(m.allocate_slots("a", 1, num_lookahead_tokens=100)) == []
    assert ids(m.get_block_ids("a")) == [1, 2, 3] and m.get_num_free_blocks() == 6


def test_max_model_len_bounds_every_request(Manager: Any) -> None:
    """No request is ever longer than max_model_len: a longer prompt or an append past it is an
    InvalidArgumentError and changes nothing; a batched append checks every segment first."""
    m = Manager(10, 4, max_model_len=10)
    with pytest.raises(InvalidArgumentError, match="max_model_len"):
        m.add_request("long", list(range(11)))
    assert "long" not in m.request_ids()
    m.add_request("a", list(range(8)))
    m.add_request("b", list(range(10)))
    with pytest.raises(InvalidArgumentError, match="max_model_len"):
        m.append_token_ids("a", [1, 2, 3])
    with pytest.raises(InvalidArgumentError, match="max_model_len"):
        m.append_token_ids_many(["a", "a"], [1, 2, 3], [0, 2, 3])  # 8 + 2 + 1 > 10
    with pytest.raises(InvalidArgumentError, match="max_model_len"):
        m.append_token_ids_many(["a", "b"], [1, 2])  # "b" is full
    assert (m.get_num_tokens("a"), m.get_num_tokens("b")) == (8, 10)
    m.append_token_ids_many(["a", "a"], [1, 2], [0, 1, 2])
    assert m.get_num_tokens("a") == 10


def test_stats(Manager: Any) -> None:
    m = Manager(20, 4, stats_window=2)
    m.add_request("a", PROMPT)
    schedule(m, "a", 10)  # lookup: 10 tokens, 0 hits
    m.add_request("b", PROMPT)
    m.add_request("c", [*PROMPT, 1, 2])
    m.get_computed_blocks("b")  # a lookup alone records nothing ...
    assert m.prefix_cache_stats == PrefixCacheStats(requests=1, queries=10, hits=0)
    schedule(m, "b", 10)  # ... admission does: 10 tokens, 8 hits
    schedule(m, "c", 12)  # 12 tokens, 8 hits (the third block is partial in "a")
    s = m.prefix_cache_stats
    assert s == PrefixCacheStats(requests=3, queries=32, hits=16, preempted_requests=0)
    assert s.hit_rate == 0.5
    assert m.recent_prefix_cache_stats == PrefixCacheStats(requests=2, queries=22, hits=16)
    assert Manager(4, 4).prefix_cache_stats.hit_rate == 0.0
    off = Manager(20, 4, stats_window=0)
    off.add_request("a", PROMPT)
    schedule(off, "a", 10)
    assert off.prefix_cache_stats.requests == 1 and off.recent_prefix_cache_stats.requests == 0
    no_cache = Manager(20, 4, enable_caching=False)
    no_cache.add_request("a", PROMPT)
    assert ids(no_cache.get_computed_blocks("a")[0]) == []
    schedule(no_cache, "a", 10)
    assert no_cache.prefix_cache_stats.requests == 0  # no lookup without a cache



def test_recent_stats_window_counts_new_requests_as_vllm_does(Manager: Any) -> None:
    """vLLM's ``CachingMetrics`` window holds the last N new requests; resumed (preempted)
    requests do not enter it, so they cannot push new ones out (they did, before: a window of
    2 after new "a", new "b" and resumed "a" held "b" and the resumed "a" alone)."""
    m = Manager(20, 4, stats_window=2)
    m.add_request("a", PROMPT)
    schedule(m, "a", 10)  # new: 10 tokens, 0 hits
    m.add_request("b", PROMPT)
    schedule(m, "b", 10)  # new: 10 tokens, 8 hits
    m.preempt("a")
    schedule(m, "a", 10)  # resumed: 10 tokens, 8 hits
    assert m.recent_prefix_cache_stats == PrefixCacheStats(
        requests=2, queries=20, hits=8, preempted_requests=1, preempted_queries=10, preempted_hits=8)
    m.add_request("c", PROMPT)
    schedule(m, "c", 10)  # new: 10 tokens, 8 hits; "a" (new) leaves the window
    assert m.recent_prefix_cache_stats == PrefixCacheStats(
        requests=2, queries=20, hits=16, preempted_requests=1, preempted_queries=10, preempted_hits=8)


def test_token_counts_past_int64_are_refused_and_change_nothing(Manager: Any) -> None:
    """Counts cross to Python as int64. With ``max_model_len`` capping the slots, an
    allocation of 2**63 - 1 tokens succeeds; a second one took the computed count past
    2**63 - 1 (the Rust core saturated and ``get_num_computed_tokens_many`` wrapped negative;
    the reference raised numpy's ``OverflowError``). Now an ``InvalidArgumentError``,
    before anything changes, in ``allocate_slots`` and in ``schedule_step``."""
    big = 2**63 - 1
    m = Manager(8, 4, max_model_len=8)
    m.add_request("a", [1, 2, 3])
    m.add_request("b", [1, 2, 3])
    assert ids(m.allocate_slots("a", big)) == [1, 2]
    before = (m.get_num_computed_tokens("a"), ids(m.get_block_ids("a")), m.get_num_free_blocks())
    with pytest.raises(InvalidArgumentError, match="2\\*\\*63 - 1"):
        m.allocate_slots("a", 1)
    with pytest.raises(InvalidArgumentError, match="2\\*\\*63 - 1"):
        m.schedule_step(["a"], 1)
    # "b" alone fits, but the step's tokens with "a"'s computed ones do not: nothing is scheduled.
    with pytest.raises(InvalidArgumentError, match="request 'a'|request \"a\""):
        m.schedule_step(["b", "a"], [1, 0])
    assert (m.get_num_computed_tokens("a"), ids(m.get_block_ids("a")), m.get_num_free_blocks()) == before
    assert m.get_num_computed_tokens("b") == 0
    assert m.get_num_computed_tokens_many(["a"]).tolist() == [big]
    # A step's tokens are bounded by 2**63 - 1 with each request's own, so no budget never
    # runs out (Rust scheduled a second request of 2**63 - 1 the reference refused).
    fresh = Manager(8, 4, max_model_len=8)
    fresh.add_request("x", [1, 2, 3])
    fresh.add_request("y", [1, 2, 3])
    with pytest.raises(InvalidArgumentError, match="2\\*\\*63 - 1"):
        fresh.schedule_step(["x", "y"], [big, big])
    step = fresh.schedule_step(["x", "y"], [(big - 3) // 2, (big - 3) // 2])
    assert step.status.tolist() == [0, 0]
    m.check_invariants()


def test_events_evictions_before_stores(Manager: Any) -> None:
    m = Manager(4, 2, enable_events=True)  # 3 usable blocks of 2 tokens
    m.add_request("a", [0, 1, 2, 3, 4, 5], lora=("adapter", "/path"), lora_id=7)
    assert ids(schedule(m, "a", 6)) == [1, 2, 3]
    ha = hashes(m, "a")
    assert m.take_events() == [stored(ha, None, [0, 1, 2, 3, 4, 5], 2, lora_id=7, lora_name="adapter")]
    m.free("a")  # all cached: appended in reverse, 3 first
    m.add_request("b", [9, 9, 9, 9, 9])
    assert ids(schedule(m, "b", 5)) == [3, 2, 1]
    hb = hashes(m, "b")
    assert m.take_events() == [
        BlockRemoved(block_hashes=[ha[2]]),
        BlockRemoved(block_hashes=[ha[1]]),
        BlockRemoved(block_hashes=[ha[0]]),
        stored(hb, None, [9, 9, 9, 9], 2),
    ]
    assert Manager(4, 2).take_events() == []  # events off


def test_free_many_and_append_many(Manager: Any) -> None:
    m = Manager(10, 2)
    for rid in ("a", 1, "b"):
        m.add_request(rid, [5, 6, 7])
        schedule(m, rid, 3)
    assert m.request_ids() == (1, "a", "b") and len(m) == 3
    m.append_token_ids_many(["a", 1], [8, 9])
    assert (m.get_num_tokens("a"), m.get_num_tokens(1)) == (4, 4)
    m.append_token_ids_many(["a", "b"], np.array([1, 2, 3], dtype=np.int64), [0, 1, 3])
    assert (m.get_num_tokens("a"), m.get_num_tokens("b")) == (5, 5)
    m.free_many(["a", 1])
    assert m.request_ids() == ("b",)


# --------------------------------------------------------------------------------------------
# Errors: each raises its specific exception and changes nothing.
# --------------------------------------------------------------------------------------------


def started_manager(Manager: Any) -> Any:
    m = Manager(10, 4, enable_events=True)
    m.add_request("a", PROMPT)
    schedule(m, "a", 10)
    m.add_request("b", [*PROMPT[:8], 1, 2, 3])
    m.add_request("w", [7, 7, 7, 7, 7])  # waiting, no hit
    m.add_request("1", [3])  # a str id, not the int 1
    m.take_events()
    return m


ERROR_CASES: list[tuple[str, type[BaseException], Any]] = [
    # unknown ids
    ("get_computed_blocks unknown", UnknownRequestError, lambda m: m.get_computed_blocks("zz")),
    ("allocate_slots unknown", UnknownRequestError, lambda m: m.allocate_slots("zz", 1)),
    ("append unknown", UnknownRequestError, lambda m: m.append_token_ids("zz", [1])),
    ("free unknown", UnknownRequestError, lambda m: m.free("zz")),
    ("preempt unknown", UnknownRequestError, lambda m: m.preempt("zz")),
    ("get_block_ids unknown", UnknownRequestError, lambda m: m.get_block_ids(3)),
    ("str and int ids differ", UnknownRequestError, lambda m: m.free(1)),
    ("set computed unknown", UnknownRequestError, lambda m: m.set_num_computed_tokens("zz", 0)),
    ("step with an unknown id", UnknownRequestError, lambda m: m.schedule_step(["w", "zz"], 4)),
    ("free_many with an unknown id", UnknownRequestError, lambda m: m.free_many(["a", "zz"])),
    ("append_many with an unknown id", UnknownRequestError, lambda m: m.append_token_ids_many(["a", "zz"], [1, 2])),
    # adding
    ("duplicate add", DuplicateRequestError, lambda m: m.add_request("a", [1, 2, 3])),
    ("empty prompt", InvalidArgumentError, lambda m: m.add_request("new", [])),
    ("unsorted mm features", InvalidArgumentError, lambda m: m.add_request("new", [1], mm_features=[("x", 3, 1), ("y", 1, 1)])),
    ("bad lora", DtypeError, lambda m: m.add_request("new", [1], lora=["n", "p"])),
    # allocate_slots arguments
    ("nothing to allocate", InvalidArgumentError, lambda m: m.allocate_slots("w", 0)),
    ("nothing to allocate with lookahead", InvalidArgumentError, lambda m: m.allocate_slots("w", 0, num_lookahead_tokens=4)),
    ("hit tokens without blocks", InvalidArgumentError, lambda m: m.allocate_slots("b", 3, num_new_computed_tokens=8)),
    ("hit tokens not matching the blocks", InvalidArgumentError,
     lambda m: m.allocate_slots("b", 3, num_new_computed_tokens=4, new_computed_blocks=[1, 2])),
    ("hits out of order", BlockStateError, lambda m: m.allocate_slots("b", 3, num_new_computed_tokens=8, new_computed_blocks=[2, 1])),
    ("another prefix's blocks", BlockStateError, lambda m: m.allocate_slots("w", 1, num_new_computed_tokens=4, new_computed_blocks=[1])),
    ("an uncached block", BlockStateError, lambda m: m.allocate_slots("b", 3, num_new_computed_tokens=8, new_computed_blocks=[1, 3])),
    ("the null block", BlockStateError, lambda m: m.allocate_slots("b", 7, num_new_computed_tokens=4, new_computed_blocks=[0])),
    ("more hits than full blocks", InvalidArgumentError,
     lambda m: m.allocate_slots("w", 1, num_new_computed_tokens=8, new_computed_blocks=[1, 2])),
    ("hits for a running request", InvalidArgumentError,
     lambda m: m.allocate_slots("a", 1, num_new_computed_tokens=4, new_computed_blocks=[1])),
    ("a block id out of range", InvalidBlockIdError, lambda m: m.allocate_slots("b", 3, num_new_computed_tokens=4, new_computed_blocks=[10])),
    ("a negative block id", InvalidBlockIdError, lambda m: m.allocate_slots("b", 3, num_new_computed_tokens=4, new_computed_blocks=[-1])),
    # dtypes
    ("float count", DtypeError, lambda m: m.allocate_slots("w", 1.0)),
    ("float block ids", DtypeError, lambda m: m.allocate_slots("b", 3, num_new_computed_tokens=8, new_computed_blocks=np.array([1.0, 2.0]))),
    ("2-D block ids", DtypeError, lambda m: m.allocate_slots("b", 3, num_new_computed_tokens=8, new_computed_blocks=np.array([[1, 2]]))),
    ("str prompt", DtypeError, lambda m: m.add_request("new", "abc")),
    ("float tokens", DtypeError, lambda m: m.append_token_ids("a", [1.5])),
    ("bool request id", DtypeError, lambda m: m.get_num_tokens(True)),
    ("float request id", DtypeError, lambda m: m.free(1.5)),
    ("one str as request ids", DtypeError, lambda m: m.free_many("a")),
    ("int as stop flag", DtypeError, lambda m: m.schedule_step(["w"], 4, stop_at_first_failure=1)),
    ("float budget", DtypeError, lambda m: m.schedule_step(["w"], 4.0)),
    # negative counts
    ("negative num_new_tokens", InvalidArgumentError, lambda m: m.allocate_slots("a", -1)),
    ("negative lookahead", InvalidArgumentError, lambda m: m.allocate_slots("a", 1, num_lookahead_tokens=-1)),
    ("negative hit tokens", InvalidArgumentError, lambda m: m.allocate_slots("a", 1, num_new_computed_tokens=-4)),
    ("negative computed tokens", InvalidArgumentError, lambda m: m.set_num_computed_tokens("a", -1)),
    ("negative step budget", InvalidArgumentError, lambda m: m.schedule_step(["w", "b"], [4, -1])),
    ("negative step lookahead", InvalidArgumentError, lambda m: m.schedule_step(["w"], 4, num_lookahead_tokens=-1)),
    ("budgets of the wrong length", InvalidArgumentError, lambda m: m.schedule_step(["w", "b"], [4])),
    ("negative token budget", InvalidArgumentError, lambda m: m.schedule_step(["w"], 4, token_budget=-1)),
    ("float token budget", DtypeError, lambda m: m.schedule_step(["w"], 4, token_budget=4.0)),
    ("bool token budget", DtypeError, lambda m: m.schedule_step(["w"], 4, token_budget=True)),
    ("str request cap", DtypeError, lambda m: m.schedule_step(["w"], 4, max_num_requests="2")),
    ("negative request cap", InvalidArgumentError, lambda m: m.schedule_step(["w"], 4, max_num_requests=-1)),
    ("int as preempt flag", DtypeError, lambda m: m.schedule_step(["w"], 4, preempt=1)),
    ("a request twice in a preempting step", InvalidArgumentError,
     lambda m: m.schedule_step(["a", "b", "a"], 1, preempt=True)),
    ("an unknown request in a preempting step", UnknownRequestError,
     lambda m: m.schedule_step(["a", "nope"], 1, preempt=True)),
    # many
    ("free_many with a duplicate", InvalidArgumentError, lambda m: m.free_many(["a", "b", "a"])),
    # an unknown id is reported before a repeated one, wherever it is
    ("free_many with a duplicate, then an unknown id", UnknownRequestError, lambda m: m.free_many(["a", "a", "zz"])),
    ("append_many with bad offsets", InvalidArgumentError, lambda m: m.append_token_ids_many(["a", "b"], [1, 2], [0, 2, 1])),
    ("append_many with too few tokens", InvalidArgumentError, lambda m: m.append_token_ids_many(["a", "b"], [1])),
]


@pytest.mark.parametrize(("case", "error", "call"), ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_errors_change_nothing(Manager: Any, case: str, error: type[BaseException], call: Any) -> None:
    m = started_manager(Manager)
    before = snapshot(m)
    with pytest.raises(error) as info:
        call(m)
    assert type(info.value) is error and isinstance(info.value, KVPoolError)
    assert snapshot(m) == before and m.take_events() == []
    m.check_invariants()


def test_free_many_after_a_refused_free_many(Manager: Any) -> None:
    """A refused call leaves nothing behind that a later call could take for a repeat."""
    m = started_manager(Manager)
    with pytest.raises(UnknownRequestError):
        m.free_many(["a", "b", "zz"])
    with pytest.raises(InvalidArgumentError):
        m.free_many(["b", "a", "b"])
    m.free_many(["a", "b"])
    assert "a" not in m.request_ids() and "b" not in m.request_ids()
    m.check_invariants()


UNCACHED_TOKEN_ERRORS: list[tuple[str, Any]] = [
    ("a float array prompt", lambda m: m.add_request("new", np.array([1.0, 2.0]))),
    ("a 2-D prompt", lambda m: m.add_request("new", np.array([[1, 2]]))),
    ("a str as the prompt", lambda m: m.add_request("new", "abc")),
    ("None as the prompt", lambda m: m.add_request("new", None)),
    ("a float in an iterated prompt", lambda m: m.add_request("new", iter([1, 2.5]))),
    ("a float array appended", lambda m: m.append_token_ids("a", np.array([1.5]))),
    ("an int appended, not a sequence", lambda m: m.append_token_ids("a", 7)),
]


@pytest.mark.parametrize(("case", "call"), UNCACHED_TOKEN_ERRORS, ids=[c[0] for c in UNCACHED_TOKEN_ERRORS])
def test_token_ids_are_checked_without_caching(Manager: Any, case: str, call: Any) -> None:
    """Without prefix caching the manager keeps only token counts, but still rejects
    what is not a sequence of integers, changing nothing."""
    m = Manager(10, 4, enable_caching=False)
    m.add_request("a", [1, 2, 3])
    m.allocate_slots("a", 3)
    before = snapshot(m)
    with pytest.raises(DtypeError):
        call(m)
    assert snapshot(m) == before
    m.check_invariants()


def test_lists_are_only_counted_without_caching(Manager: Any) -> None:
    """Without prefix caching nothing reads token values, so a list or tuple is counted in
    O(1) and its items are not inspected (with caching on the same prompts are refused)."""
    m = Manager(10, 4, enable_caching=False)
    m.add_request("a", [1, "2", 3])
    m.append_token_ids("a", (None, 2.5))
    assert m.get_num_tokens("a") == 5
    cached = Manager(10, 4)
    for call in (lambda: cached.add_request("b", [1, "2", 3]), lambda: cached.add_request("c", (1, 2.5))):
        with pytest.raises(DtypeError):
            call()
    assert len(cached) == 0


def test_token_counts_without_caching(Manager: Any) -> None:
    """Every accepted form counts its tokens: lists, tuples, int arrays, numpy scalars."""
    m = Manager(64, 4, enable_caching=False)
    m.add_request("list", [5] * 9)
    m.add_request("tuple", tuple(range(6)))
    m.add_request("array", np.arange(7, dtype=np.int32))
    m.add_request("scalars", [np.int64(3), np.int64(4)])
    m.append_token_ids("list", (1, 2))
    m.append_token_ids("array", np.array([9], dtype=np.uint8))
    m.append_token_ids("scalars", [])
    assert [m.get_num_tokens(r) for r in ("list", "tuple", "array", "scalars")] == [11, 6, 8, 2]
    assert len(m.allocate_slots("list", 11)) == 3


def test_error_classes(Manager: Any) -> None:
    m = Manager(4, 4)
    with pytest.raises(KeyError):
        m.free("nope")
    m.add_request("a", [1])
    with pytest.raises(ValueError):
        m.add_request("a", [1])


def test_caching_disabled(Manager: Any) -> None:
    m = Manager(10, 4, enable_caching=False, enable_events=True)
    m.add_request("a", PROMPT)
    assert hashes(m, "a") == []  # as vLLM: no block hashing without prefix caching
    assert ids(schedule(m, "a", 10)) == [1, 2, 3]
    assert m.take_events() == []
    m.free("a")  # uncached blocks are prepended in the order freed: 3, 2, 1
    assert free_queue(m) in (None, [3, 2, 1, 4, 5, 6, 7, 8, 9])
    m.add_request("b", PROMPT)
    assert ids(m.get_computed_blocks("b")[0]) == []
    before = snapshot(m)
    with pytest.raises(CachingDisabledError):
        m.allocate_slots("b", 2, num_new_computed_tokens=4, new_computed_blocks=[1])
    assert snapshot(m) == before
    assert ids(schedule(m, "b", 10)) == [3, 2, 1]


def test_huge_counts_do_not_wrap_around(Manager: Any) -> None:
    """``computed + new + lookahead`` beyond 2**64 needs more blocks than any pool has: the call
    must fail (``None``, or an ``InvalidArgumentError``) and change nothing."""
    m = Manager(10, 4)
    m.add_request("a", PROMPT)
    m.allocate_slots("a", 10)
    before = snapshot(m)
    huge = 2**63 - 1
    try:
        assert m.allocate_slots("a", huge, num_lookahead_tokens=huge) is None
    except InvalidArgumentError:
        pass
    assert snapshot(m) == before
    try:
        assert m.schedule_step(["a"], huge, num_lookahead_tokens=huge).allocated.tolist() == [False]
    except InvalidArgumentError:
        pass
    assert snapshot(m) == before


def test_batched_getters_equal_the_one_by_one_calls(Manager: Any) -> None:
    m = Manager(32, 4)
    for rid, n in (("a", 9), ("b", 3), ("c", 14)):
        m.add_request(rid, list(range(n)))
        m.allocate_slots(rid, n)
    m.add_request("waiting", [1, 2, 3])
    rids = ["c", "waiting", "a", "c"]
    flat, offsets = m.get_block_ids_many(rids)
    assert offsets.dtype == np.int64 and flat.dtype == np.int32
    assert [flat[a:b].tolist() for a, b in zip(offsets, offsets[1:])] == [m.get_block_ids(r).tolist() for r in rids]
    assert m.get_num_tokens_many(rids).tolist() == [m.get_num_tokens(r) for r in rids]
    assert m.get_num_computed_tokens_many(rids).tolist() == [m.get_num_computed_tokens(r) for r in rids]
    with pytest.raises(UnknownRequestError):
        m.get_block_ids_many(["a", "nope"])
    flat, offsets = m.get_block_ids_many([])
    assert flat.tolist() == [] and offsets.tolist() == [0]


def test_appended_blocks_are_hashed_where_the_chain_left_off() -> None:
    """Nested multimodal inputs (sorted by offset, one inside another, one empty): vLLM's request
    block hasher walks them from the last block it hashed, which finds other inputs than a walk
    from block 0 would, so the hashes depend on where the prompt ends and the appends begin. The
    reference rehashed every block after an append and disagreed with Rust (which extends, as
    vLLM does) at 8 of the 10 places the 11 tokens can be split."""
    from kvpool._errors import HAVE_CORE

    if not HAVE_CORE:
        pytest.skip("kvpool._core is not built")
    import kvpool

    mm = [("a", 2, 7), ("bb", 2, 0), ("a", 4, 7)]
    tokens = list(range(1, 12))
    for split in range(1, len(tokens)):
        seen = []
        for manager in (kvpool.KVCacheManager(30, 2, hash_algo="sha256"),
                        ReferenceManager(30, 2, hash_algo="sha256")):
            manager.add_request("q", tokens[:split], mm_features=mm)
            manager.append_token_ids("q", tokens[split:])
            got = manager.get_block_hashes("q")
            seen.append(got if isinstance(got, list) else got.to_list())
        assert seen[0] == seen[1], split
