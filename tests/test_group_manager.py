"""``kvpool.GroupManager``: the manager for hybrid models (several KV-cache groups).

Its block rules are ``GroupTables``' (compared with vLLM's own hybrid coordinator in
``test_hybrid_differential.py``, where the manager is fed the same calls); here: a batched
step equals the one-by-one calls, window groups give blocks back, and bad input is refused
without changing anything.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

import kvpool
from kvpool import StepStatus
from step_calls import step_by_calls

GROUPS: list[Any] = [("sliding_window", 16), "full", ("chunked_local", 32)]


def manager(**kwargs: Any) -> kvpool.GroupManager:
    return kvpool.GroupManager(400, 4, GROUPS, enable_events=True, **kwargs)


def one_by_one(m: kvpool.GroupManager, rids: list[str], num_new: int) -> list[Any]:
    out = []
    for rid in rids:
        n = num_new
        hits, hit_tokens = (None, 0)
        if m.get_num_computed_tokens(rid) == 0:
            blocks, hit_tokens = m.get_computed_blocks(rid)
            hits = blocks if any(len(b) for b in blocks) else None
            n = min(n, m.get_num_tokens(rid) - hit_tokens)
        got = m.allocate_slots(rid, n, num_new_computed_tokens=hit_tokens, new_computed_blocks=hits)
        out.append(None if got is None else ([g.tolist() for g in got], n, hit_tokens))
    return out


def stepped(m: kvpool.GroupManager, rids: list[str], num_new: int) -> list[Any]:
    r = m.schedule_step(rids, num_new)
    g = m.num_groups
    out = []
    for i in range(len(rids)):
        if not r.allocated[i]:
            out.append(None)
            continue
        cuts = r.offsets[i * g:(i + 1) * g + 1]
        groups = [r.block_ids[a:b].tolist() for a, b in zip(cuts, cuts[1:])]
        out.append((groups, int(r.num_scheduled_tokens[i]), int(r.num_hit_tokens[i])))
    return out


@pytest.mark.parametrize("seed", range(8))
def test_schedule_step_equals_the_one_by_one_calls(seed: int) -> None:
    rng = random.Random(seed)
    a, b = manager(), manager()
    prefix = [rng.randrange(1000) for _ in range(40)]
    rids: list[str] = []
    next_id = 0
    for step in range(12):
        for _ in range(rng.randint(0, 3)):
            rid = f"r{next_id}"
            next_id += 1
            prompt = prefix[: rng.randint(0, 40)] + [rng.randrange(1000) for _ in range(rng.randint(1, 30))]
            for m in (a, b):
                m.add_request(rid, prompt)
            rids.append(rid)
        live = list(rids)
        num_new = rng.choice([1, 4, 16, 64])
        assert one_by_one(a, live, num_new) == stepped(b, live, num_new)
        for rid in list(live):
            if a.get_num_computed_tokens(rid) >= a.get_num_tokens(rid):
                tok = rng.randrange(1000)
                a.append_token_ids(rid, [tok])
                b.append_token_ids(rid, [tok])
            if rng.random() < 0.2:
                a.free(rid)
                b.free(rid)
                rids.remove(rid)
        assert [g.tolist() for r in rids for g in a.get_block_ids(r)] == [g.tolist() for r in rids for g in b.get_block_ids(r)]
        assert a.get_num_free_blocks() == b.get_num_free_blocks()
        assert a.take_events() == b.take_events()
        a.check_invariants()
        b.check_invariants()


def test_window_groups_give_back_blocks_and_a_resend_hits() -> None:
    m = manager()
    prompt = list(range(64))
    m.add_request("a", prompt)
    blocks = m.allocate_slots("a", 64)
    assert blocks is not None and [len(g) for g in blocks] == [16, 16, 16]
    m.append_token_ids("a", [1])
    m.allocate_slots("a", 1)  # 64 computed: the window (16) and the chunk (32) skip blocks
    window, full, local = (g.tolist() for g in m.get_block_ids("a"))
    assert window[:12] == [0] * 12 and 0 not in full and local[:16] == [0] * 16
    m.free("a")
    m.add_request("b", prompt)
    hits, n = m.get_computed_blocks("b")
    assert n == 60 and len(hits[1]) == 15
    m.check_invariants()


def test_preempt_restarts_and_bad_input_changes_nothing() -> None:
    m = manager()
    m.add_request("a", list(range(20)))
    m.allocate_slots("a", 20)
    before = (m.get_num_free_blocks(), [g.tolist() for g in m.get_block_ids("a")])
    for call, error in [
        (lambda: m.allocate_slots("nope", 1), kvpool.UnknownRequestError),
        (lambda: m.add_request("a", [1]), kvpool.DuplicateRequestError),
        (lambda: m.add_request("b", []), kvpool.InvalidArgumentError),
        (lambda: m.add_request("b", "abc"), kvpool.DtypeError),
        (lambda: m.allocate_slots("a", 4, num_new_computed_tokens=4, new_computed_blocks=[[999_999], [], []]),
         kvpool.InvalidBlockIdError),
        (lambda: m.schedule_step(["a", "nope"], 1), kvpool.UnknownRequestError),
        (lambda: m.schedule_step(["a"], np.array([1, 2])), kvpool.InvalidArgumentError),
    ]:
        with pytest.raises(error):
            call()
        assert (m.get_num_free_blocks(), [g.tolist() for g in m.get_block_ids("a")]) == before
    m.preempt("a")
    assert m.get_num_computed_tokens("a") == 0 and m.get_num_free_blocks() == 399
    with pytest.raises(kvpool.InvalidArgumentError):
        kvpool.GroupManager(10, 4, [("sliding_window", 0)])
    with pytest.raises(kvpool.InvalidArgumentError):
        kvpool.GroupManager(10, 4, ["full"], retention_interval=8)
    m.check_invariants()


def step_fields(r: Any) -> dict[str, Any]:
    names = ("block_ids", "offsets", "hit_block_ids", "hit_offsets", "num_scheduled_tokens", "num_hit_tokens", "allocated", "status")
    return {name: (getattr(r, name).dtype.str, getattr(r, name).tolist()) for name in names}


@pytest.mark.parametrize("seed", range(24))
def test_schedule_step_under_limits_equals_the_one_by_one_calls(seed: int) -> None:
    """Budget, request cap, stop and preemption on a pool small enough to run short."""
    rng = random.Random(seed)
    num_blocks = rng.choice([24, 40, 64])
    eviction = rng.choice(["lru", "adaptive", "priority"])
    a, b = (kvpool.GroupManager(num_blocks, 4, GROUPS, enable_events=True, eviction=eviction) for _ in range(2))
    assert b.eviction == eviction
    prefix = [rng.randrange(1000) for _ in range(40)]
    rids: list[str] = []
    seen: set[int] = set()
    added = 0
    for step in range(16):
        for _ in range(rng.randint(0, 2)):
            rid = f"r{added}"
            added += 1
            prompt = prefix[: rng.randint(0, 40)] + [rng.randrange(1000) for _ in range(rng.randint(1, 30))]
            for m in (a, b):
                m.add_request(rid, prompt)
            rids.append(rid)
        # vLLM's order: running requests first, then waiting ones.
        live = sorted(rids, key=lambda r: a.get_num_computed_tokens(r) == 0)
        limits: dict[str, Any] = {"stop_at_first_failure": rng.random() < 0.5, "preempt": rng.random() < 0.6}
        if rng.random() < 0.7:
            limits["token_budget"] = rng.choice([0, 8, 32, 96])
        if rng.random() < 0.3:
            limits["max_num_requests"] = rng.randint(0, 4)
        num_new = [rng.choice([1, 4, 16, 64]) for _ in live]
        want = step_by_calls(a, live, num_new, [0] * len(live), limits)
        got = step_fields(b.schedule_step(live, num_new, **limits))
        assert got == want, (live, num_new, limits)
        seen.update(got["status"][1])
        for rid in list(rids):
            if a.get_num_computed_tokens(rid) >= a.get_num_tokens(rid) > 0:
                tok = rng.randrange(1000)
                a.append_token_ids(rid, [tok])
                b.append_token_ids(rid, [tok])
            if rng.random() < 0.1:
                a.free(rid)
                b.free(rid)
                rids.remove(rid)
        assert [g.tolist() for r in rids for g in a.get_block_ids(r)] == [g.tolist() for r in rids for g in b.get_block_ids(r)]
        assert a.get_num_free_blocks() == b.get_num_free_blocks()
        assert a.take_events() == b.take_events()
        b.check_invariants()
    assert StepStatus.SCHEDULED in seen


def test_eviction_policy_argument() -> None:
    assert manager().eviction == "lru"
    with pytest.raises(kvpool.InvalidArgumentError, match="eviction"):
        manager(eviction="fifo")
    with pytest.raises(kvpool.InvalidArgumentError, match="max_pinned_blocks"):
        manager(max_pinned_blocks=10**6)


def test_request_priorities_keep_a_requests_blocks_longest() -> None:
    """With ``eviction="priority"``, a high-priority request's cached blocks outlive a
    low-priority one's under churn in every group, until its duration ends."""
    m = kvpool.GroupManager(40, 4, ["full", ("sliding_window", 8)], eviction="priority", clock="manual")
    keep, drop = list(range(1000, 1016)), list(range(2000, 2016))
    m.add_request("keep", keep, priority=90, retention_s=10.0)
    m.add_request("drop", drop, priority=10)
    for rid in ("keep", "drop"):
        assert m.allocate_slots(rid, 16) is not None
        m.free(rid)
    # Fresh requests churn the pool past its never-used blocks: the low-priority blocks go
    # first, then the churn's own (default priority), never the high-priority ones.
    for i in range(6):
        m.add_request(f"c{i}", list(range(3000 + 100 * i, 3000 + 100 * i + 16)))
        assert m.allocate_slots(f"c{i}", 16) is not None
        m.free(f"c{i}")

    def hit(prompt: list[int]) -> int:
        m.add_request("probe", prompt)
        _, n = m.get_computed_blocks("probe")
        m.free("probe")
        return n

    assert hit(keep) == 12 and hit(drop) == 0
    m.advance_clock(11.0)  # the duration is over: back to the default, behind newer blocks
    for i in range(6, 12):
        m.add_request(f"c{i}", list(range(3000 + 100 * i, 3000 + 100 * i + 16)))
        assert m.allocate_slots(f"c{i}", 16) is not None
        m.free(f"c{i}")
    assert hit(keep) == 0
    with pytest.raises(kvpool.InvalidArgumentError, match="eviction='priority'"):
        manager().add_request("x", [1, 2, 3], priority=50)
    m.check_invariants()


def test_prefix_cache_stats_count_admissions_as_the_single_group_manager() -> None:
    """``GroupManager`` records a request's tokens and hit tokens when it is admitted (its first
    allocation), a preempted one's again in the ``preempted_*`` fields, as ``KVCacheManager``
    does; a reset of the prefix cache clears them."""
    groups: list[Any] = [("sliding_window", 8), "full"]
    ours = kvpool.GroupManager(64, 4, groups)
    single = kvpool.KVCacheManager(64, 4)
    for manager in (ours, single):
        for rid in ("a", "b"):
            manager.add_request(rid, list(range(20)))
            blocks, hit = manager.get_computed_blocks(rid)
            manager.allocate_slots(rid, 20 - hit, num_new_computed_tokens=hit, new_computed_blocks=blocks)
        manager.append_token_ids("b", [7])
        manager.allocate_slots("b", 1)  # running: not counted again
        manager.preempt("b")
        blocks, hit = manager.get_computed_blocks("b")
        manager.allocate_slots("b", 20 - hit, num_new_computed_tokens=hit, new_computed_blocks=blocks)
    assert ours.prefix_cache_stats == single.prefix_cache_stats
    stats = ours.prefix_cache_stats
    assert (stats.requests, stats.queries, stats.preempted_requests) == (2, 40, 1) and stats.hits > 0
    assert ours.recent_prefix_cache_stats == single.recent_prefix_cache_stats
    for rid in ("a", "b"):
        ours.free(rid)
    assert ours.reset_prefix_cache()
    assert ours.prefix_cache_stats.requests == 0
