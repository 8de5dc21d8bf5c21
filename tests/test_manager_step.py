"""``schedule_step`` is exactly the one-by-one calls a scheduler would make.

For a waiting request (no blocks, nothing computed) a scheduler calls ``get_computed_blocks``,
then ``allocate_slots(id, min(budget, num_tokens - hit), num_new_computed_tokens=hit,
new_computed_blocks=blocks, num_lookahead_tokens=...)``; for a running one
``allocate_slots(id, budget, num_lookahead_tokens=...)``; with ``stop_at_first_failure`` it stops
at the first request that does not fit. A request with nothing to schedule (``budget`` 0 and no
hit) is not allocated (``allocate_slots`` would refuse it) and counts as a failure. Under vLLM's
step rules (a shared token budget, a request cap, FCFS preemption) the same calls are made as
vLLM's scheduler makes them; see ``step_by_calls``.

Hypothesis draws a history of steps mixed with appends, frees and preemptions, and plays it on
two managers built identically: one takes each step through ``schedule_step``, the other through
those calls. After every operation the returned values and everything observable (block tables,
token and computed counts, free blocks, usage, statistics, events) must agree. The same history
then compares the Rust ``schedule_step`` with the reference's.

``KVPOOL_HYPOTHESIS_EXAMPLES`` sets the number of examples (default 300).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import kvpool.reference
from kvpool import StepStatus
from step_calls import step_by_calls
from kvpool.reference.manager import UnknownRequestError

ReferenceManager = kvpool.reference.KVCacheManager
RustManager = getattr(sys.modules["kvpool"], "KVCacheManager", None)

SETTINGS = settings(
    max_examples=int(os.environ.get("KVPOOL_HYPOTHESIS_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

RIDS: list[str | int] = ["a", "b", "c", 0, 1]
STEP_FIELDS = (
    "block_ids", "offsets", "hit_block_ids", "hit_offsets", "num_scheduled_tokens", "num_hit_tokens", "allocated", "status",
)
STEP_DTYPES = {"block_ids": np.int32, "hit_block_ids": np.int32, "allocated": np.bool_, "status": np.uint8}


def needs_rust() -> Any:
    if RustManager is None:
        pytest.skip("kvpool._core is not built")
    return RustManager


def step_result(result: Any) -> dict[str, Any]:
    """A ``StepResult`` (Rust or reference) as ``{field: (dtype, values)}``."""
    out = {}
    for name in STEP_FIELDS:
        array = getattr(result, name)
        assert isinstance(array, np.ndarray) and array.ndim == 1 and array.dtype == STEP_DTYPES.get(name, np.int64)
        out[name] = (array.dtype.str, array.tolist())
    assert len(result) == len(out["allocated"][1])
    return out


def observe(m: Any) -> dict[str, Any]:
    """Everything observable through the public API (takes the pending events)."""
    requests = {}
    for rid in m.request_ids():
        h = m.get_block_hashes(rid)
        requests[rid] = (
            m.get_block_ids(rid).tolist(),
            m.get_num_tokens(rid),
            m.get_num_computed_tokens(rid),
            list(h.to_list() if hasattr(h, "to_list") else h),
        )
    return {
        "requests": requests,
        "free": m.get_num_free_blocks(),
        "usage": m.get_usage(),
        "stats": m.prefix_cache_stats,
        "recent": m.recent_prefix_cache_stats,
        "events": m.take_events(),
    }


# --------------------------------------------------------------------------------------------
# Histories
# --------------------------------------------------------------------------------------------


@dataclass
class Config:
    num_blocks: int
    block_size: int
    kwargs: dict[str, Any]

    def build(self, cls: Any) -> Any:
        return cls(self.num_blocks, self.block_size, enable_events=True, **self.kwargs)


@st.composite
def configs(draw: st.DrawFn) -> Config:
    kwargs: dict[str, Any] = {}
    if draw(st.integers(0, 7)) == 0:
        kwargs["enable_caching"] = False
    if draw(st.integers(0, 3)) == 0:
        kwargs["max_model_len"] = draw(st.integers(1, 40))
    kwargs["stats_window"] = draw(st.integers(0, 3))
    return Config(draw(st.integers(4, 40)), draw(st.integers(1, 4)), kwargs)


@st.composite
def prompts(draw: st.DrawFn) -> list[int]:
    """Token lists over a tiny alphabet, often sharing a prefix with another prompt."""
    base = [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2]
    shared = base[: draw(st.integers(0, len(base)))]
    return shared + draw(st.lists(st.integers(0, 3), max_size=8))


def per_request_form(draw: st.DrawFn, values: list[int], allow_none: bool = False) -> Any:
    """One int for all (when they agree), a list or a numpy array, or None for all zeros."""
    forms = ["list", "int64", "int32"]
    if values and len(set(values)) == 1:
        forms.append("scalar")
    if allow_none and not any(values):
        forms.append("none")
    form = draw(st.sampled_from(forms))
    if form == "scalar":
        return values[0]
    if form == "none":
        return None
    if form == "list":
        return list(values)
    return np.array(values, dtype=form)


@st.composite
def operations(draw: st.DrawFn) -> list[tuple[Any, ...]]:
    ops: list[tuple[Any, ...]] = [("add", rid, draw(prompts())) for rid in RIDS[: draw(st.integers(1, len(RIDS)))]]
    for _ in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(["step", "step", "step", "step", "append", "free", "preempt", "add"]))
        rid = draw(st.sampled_from(RIDS))
        if kind == "step":
            ids = draw(st.lists(st.sampled_from(RIDS), max_size=5))
            budgets = draw(st.lists(st.integers(0, 12), min_size=len(ids), max_size=len(ids)))
            if draw(st.booleans()) and ids:
                budgets = [budgets[0]] * len(ids)
            lookaheads = draw(st.lists(st.integers(0, 3), min_size=len(ids), max_size=len(ids)))
            if draw(st.booleans()):
                lookaheads = [0] * len(ids)
            budget_arg = per_request_form(draw, budgets)
            lookahead_arg = per_request_form(draw, lookaheads, allow_none=True)
            limits: dict[str, Any] = {"stop_at_first_failure": draw(st.sampled_from([None, False, True]))}
            if draw(st.booleans()):
                limits["token_budget"] = draw(st.integers(0, 24))
            if draw(st.integers(0, 3)) == 0:
                limits["max_num_requests"] = draw(st.integers(0, 4))
            if draw(st.booleans()):
                limits["preempt"] = True
                ids = list(dict.fromkeys(ids))
                budgets, lookaheads = budgets[: len(ids)], lookaheads[: len(ids)]
                budget_arg = per_request_form(draw, budgets)
                lookahead_arg = per_request_form(draw, lookaheads, allow_none=True)
            ops.append(("step", ids, budgets, lookaheads, budget_arg, lookahead_arg, limits))
        elif kind == "append":
            ops.append(("append", rid, draw(st.lists(st.integers(0, 3), min_size=1, max_size=4))))
        elif kind == "add":
            ops.append(("add", rid, draw(prompts())))
        else:
            ops.append((kind, rid))
    return ops


def play(ops: list[tuple[Any, ...]], subject: Any, oracle: Any, *, oracle_steps_by_calls: bool) -> None:
    """Apply ``ops`` to both managers, comparing results and state after each one."""
    for op in ops:
        kind = op[0]
        if kind == "step":
            _, ids, budgets, lookaheads, budget_arg, lookahead_arg, limits = op
            known = all(rid in oracle for rid in ids)
            kwargs = {"num_lookahead_tokens": lookahead_arg, **limits}
            if not known:
                for m in (subject, oracle):
                    with pytest.raises(UnknownRequestError):
                        m.schedule_step(ids, budget_arg, **kwargs)
            else:
                got = step_result(subject.schedule_step(ids, budget_arg, **kwargs))
                if oracle_steps_by_calls:
                    want = step_by_calls(oracle, ids, budgets, lookaheads, limits)
                else:
                    want = step_result(oracle.schedule_step(ids, budget_arg, **kwargs))
                assert got == want, f"step {ids} {budgets} {lookaheads} {limits}"
                for code in set(got["status"][1]):
                    event(f"step status {StepStatus(code).name}")
        else:
            outcomes = []
            for m in (subject, oracle):
                try:
                    if kind == "add":
                        m.add_request(op[1], op[2])
                    elif kind == "append":
                        m.append_token_ids(op[1], op[2])
                    elif kind == "free":
                        m.free(op[1])
                    else:
                        m.preempt(op[1])
                    outcomes.append(None)
                except Exception as e:  # noqa: BLE001  (compared below)
                    outcomes.append(type(e))
            assert outcomes[0] == outcomes[1], f"{op}: {outcomes}"
        assert observe(subject) == observe(oracle), f"after {op}"
        subject.check_invariants()
        oracle.check_invariants()


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------


@SETTINGS
@given(config=configs(), ops=operations())
def test_reference_step_is_the_one_by_one_calls(config: Config, ops: list[tuple[Any, ...]]) -> None:
    play(ops, config.build(ReferenceManager), config.build(ReferenceManager), oracle_steps_by_calls=True)


def test_rust_step_is_the_one_by_one_calls() -> None:
    cls = needs_rust()

    @SETTINGS
    @given(config=configs(), ops=operations())
    def check(config: Config, ops: list[tuple[Any, ...]]) -> None:
        play(ops, config.build(cls), config.build(cls), oracle_steps_by_calls=True)

    check()


def test_rust_step_matches_reference_step() -> None:
    cls = needs_rust()

    @SETTINGS
    @given(config=configs(), ops=operations())
    def check(config: Config, ops: list[tuple[Any, ...]]) -> None:
        play(ops, config.build(cls), config.build(ReferenceManager), oracle_steps_by_calls=False)

    check()


@pytest.mark.parametrize("kind", ["KVCacheManager", "GroupManager"])
def test_a_step_whose_counts_overflow_fails_before_scheduling_anyone(kind: str) -> None:
    big = 2**63 - 1
    if kind == "GroupManager":
        manager: Any = kvpool.GroupManager(64, 16, ["full"], max_model_len=64)
    else:
        manager = kvpool.KVCacheManager(num_blocks=64, block_size=16, max_model_len=64)
    manager.add_request("a", list(range(10)))
    manager.add_request("b", list(range(20, 30)))
    manager.allocate_slots("a", 10)

    def state() -> Any:
        return (manager.get_num_free_blocks(), manager.get_num_computed_tokens("b"),
                np.asarray(manager.get_block_ids("b"), dtype=object).tolist())

    before = state()
    with pytest.raises(kvpool.InvalidArgumentError, match="add up"):
        manager.schedule_step(["b", "a"], [5, big], num_lookahead_tokens=[0, big])
    assert state() == before
