"""Model test: the Rust ``kvpool.KVCacheManager`` against ``kvpool.reference.KVCacheManager``.

A hypothesis ``RuleBasedStateMachine`` builds both managers with the same arguments (small pools,
so allocations fail and cached blocks get evicted) and applies the same random operations:
adding requests over a tiny token alphabet with shared prefixes, a scheduler's
``get_computed_blocks`` + ``allocate_slots``, raw ``allocate_slots`` calls with odd or bad
arguments, ``schedule_step``, appending tokens, freeing, preempting, ``set_num_computed_tokens``
and ``reset_prefix_cache``. Each call must return the same value (numpy dtypes included) or
raise the same exception type on both. After every step everything observable must agree:
every request's block table, token and computed counts and block hashes, the free-block count,
the usage, both statistics, the pending events; ``check_invariants()`` runs on both.

The Rust manager has no API for the free queue's order or the reference counts, so those are
compared only through their effects (the block ids each allocation hands out, the free count).

``KVPOOL_HYPOTHESIS_EXAMPLES`` sets the number of examples (default 300). The test is skipped
when the extension is not built: comparing the reference with itself would prove nothing.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from differential import Outcome, agree, as_form, normalize

import kvpool.reference

ReferenceManager = kvpool.reference.KVCacheManager
RustManager = getattr(sys.modules["kvpool"], "KVCacheManager", None)

SETTINGS = settings(
    max_examples=int(os.environ.get("KVPOOL_HYPOTHESIS_EXAMPLES", "300")),
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

RIDS: list[str | int] = ["a", "b", "c", "d", 0, 1, "1"]  # "1" and 1 are different requests
UNKNOWN: list[Any] = ["zz", 99]
BAD_IDS: list[Any] = [1.5, True, None, b"a"]
BASE = [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0]  # shared prefixes come from here
ID_FORMS = ["list", "tuple", "int32", "int64", "uint8"]


def observe(m: Any) -> dict[str, Any]:
    """Everything observable through the public API (takes the pending events)."""
    requests = {}
    for rid in m.request_ids():
        requests[rid] = (
            normalize(m.get_block_ids(rid)),
            m.get_num_tokens(rid),
            m.get_num_computed_tokens(rid),
            normalize(m.get_block_hashes(rid)),
        )
    return {
        "request_ids": m.request_ids(),
        "len": len(m),
        "requests": requests,
        "free": m.get_num_free_blocks(),
        "usage": m.get_usage(),
        "stats": m.prefix_cache_stats,
        "hit_rate": m.prefix_cache_stats.hit_rate,
        "recent": m.recent_prefix_cache_stats,
        "pinned": m.get_num_pinned_blocks(),
        "now": m.now,
        "eviction": m.eviction,
        "adaptive_horizon": m.adaptive_horizon,
        "pending": m.num_pending_events,
        "dropped": m.num_dropped_events,
        "events": m.take_events(),
    }


class ManagerComparison(RuleBasedStateMachine):
    """Drive ``subject_cls`` and ``oracle_cls`` with the same operations; compare after each."""

    subject_cls: Any = ReferenceManager
    oracle_cls: Any = ReferenceManager

    def __init__(self) -> None:
        super().__init__()
        self.subject: Any = None
        self.oracle: Any = None

    # -- plumbing -----------------------------------------------------------------------------

    def call(self, method: str, *args: Any, **kwargs: Any) -> Outcome:
        """Call ``method`` on both managers, check they agree, return the oracle's outcome."""
        return agree(self.subject, self.oracle, method, *args, **kwargs)

    def known(self) -> list[Any]:
        return list(self.oracle.request_ids())

    def waiting(self, rid: Any) -> bool:
        return len(self.oracle.get_block_ids(rid)) == 0 and self.oracle.get_num_computed_tokens(rid) == 0

    def some_id(self, data: st.DataObject) -> Any:
        """Mostly a tracked request, sometimes any id, rarely an unknown one."""
        choice = data.draw(st.integers(0, 9), label="id kind")
        known = self.known()
        if known and choice < 7:
            return data.draw(st.sampled_from(known), label="known id")
        if choice < 9:
            return data.draw(st.sampled_from(RIDS), label="any id")
        return data.draw(st.sampled_from(UNKNOWN), label="unknown id")

    # -- set-up -------------------------------------------------------------------------------

    @initialize(
        num_blocks=st.integers(4, 40),
        block_size=st.integers(1, 4),
        caching=st.sampled_from([True, True, True, False]),
        hash_algo=st.sampled_from([None, "sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]),
        max_model_len=st.one_of(st.none(), st.integers(1, 48)),
        stats_window=st.one_of(st.none(), st.integers(0, 3)),
        max_pending_events=st.sampled_from([None, None, 1, 3]),
        eviction=st.sampled_from(["lru", "priority", "adaptive"]),
        data=st.data(),
    )
    def build(
        self,
        num_blocks: int,
        block_size: int,
        caching: bool,
        hash_algo: str | None,
        max_model_len: int | None,
        stats_window: int | None,
        max_pending_events: int | None,
        eviction: str,
        data: st.DataObject,
    ) -> None:
        kwargs = {
            "eviction": eviction,
            "clock": "manual",
            "max_pinned_blocks": data.draw(st.sampled_from([None, 0, 2]), label="pin budget"),
            # Small horizons, so that the adaptive policy's bands interleave in small pools.
            "adaptive_horizon": data.draw(st.sampled_from([None, 0, 1, 5, 30]), label="horizon")
            if eviction == "adaptive" else None,
            "enable_caching": caching,
            "hash_algo": hash_algo,
            "enable_events": True,
            "max_model_len": max_model_len,
            "stats_window": stats_window,
            "max_pending_events": max_pending_events,
        }
        self.subject = self.subject_cls(num_blocks, block_size, **kwargs)
        self.oracle = self.oracle_cls(num_blocks, block_size, **kwargs)
        self.block_size = block_size
        for attr in ("num_blocks", "block_size", "enable_caching", "hash_algo"):
            assert getattr(self.subject, attr) == getattr(self.oracle, attr), attr
        for rid in RIDS[: data.draw(st.integers(1, 5), label="initial requests")]:
            self.call("add_request", rid, self.draw_prompt(data))

    def draw_prompt(self, data: st.DataObject) -> list[int]:
        """A token list over a tiny alphabet, often sharing a prefix with other prompts."""
        prefix = BASE[: data.draw(st.integers(0, len(BASE)), label="shared prefix")]
        return prefix + data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=8), label="suffix")

    # -- rules --------------------------------------------------------------------------------

    @rule(data=st.data())
    def add_request(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(RIDS + BAD_IDS[:1]), label="rid")
        prompt = [] if data.draw(st.integers(0, 19), label="empty?") == 0 else self.draw_prompt(data)
        form = data.draw(st.sampled_from(ID_FORMS), label="form")
        kwargs: dict[str, Any] = {}
        extra = data.draw(st.integers(0, 9), label="extras")
        if extra == 0:
            kwargs["cache_salt"] = data.draw(st.sampled_from(["", "s1", "s2"]), label="salt")
        elif extra == 1:
            kwargs["lora"] = ("adapter", "/path")
            kwargs["lora_id"] = data.draw(st.sampled_from([None, 3]), label="lora id")
        elif extra == 2:
            kwargs["mm_features"] = [("img", data.draw(st.integers(0, 6), label="mm offset"), 3)]
        elif extra in (3, 4):
            kwargs["priority"] = data.draw(st.sampled_from([0, 10, 90, 100, 101]), label="priority")
            kwargs["retention_s"] = data.draw(st.sampled_from([None, 1.0, 2]), label="retention_s")
        self.call("add_request", rid, as_form(prompt, form), **kwargs)

    @rule(data=st.data())
    def pin_prompt(self, data: st.DataObject) -> None:
        prompt = self.draw_prompt(data)
        action = data.draw(st.sampled_from(["pin", "pin", "unpin", "unpin_all"]), label="action")
        if action == "unpin_all":
            self.call("unpin_all")
        else:
            self.call(f"{action}_prompt", prompt)

    @rule(seconds=st.sampled_from([0, 0.5, 1.5, -1.0]))
    def advance_clock(self, seconds: float) -> None:
        self.call("advance_clock", seconds)

    @rule(data=st.data())
    def schedule(self, data: st.DataObject) -> None:
        """What a scheduler does for one request: a waiting one looks its prefix hit up first."""
        rid = self.some_id(data)
        budget = data.draw(st.integers(1, 12), label="budget")
        lookahead = data.draw(st.sampled_from([None, 0, 1, 2, 5]), label="lookahead")
        if rid not in self.oracle:
            self.call("get_computed_blocks", rid)
            self.call("allocate_slots", rid, budget)
            return
        if self.waiting(rid):
            hit = self.call("get_computed_blocks", rid).value
            blocks, num_hit = hit
            num_new = min(budget, self.oracle.get_num_tokens(rid) - num_hit)
            form = data.draw(st.sampled_from(ID_FORMS), label="form")
            self.call(
                "allocate_slots",
                rid,
                num_new,
                num_new_computed_tokens=num_hit,
                new_computed_blocks=as_form(blocks.tolist(), form),
                num_lookahead_tokens=lookahead,
            )
        else:
            self.call("allocate_slots", rid, budget, num_lookahead_tokens=lookahead)

    @rule(data=st.data())
    def allocate_raw(self, data: st.DataObject) -> None:
        """``allocate_slots`` with arbitrary, often inconsistent, arguments."""
        rid = self.some_id(data)
        num_new = data.draw(st.one_of(st.integers(-1, 10), st.sampled_from([1.0, None])), label="num_new")
        blocks = data.draw(st.lists(st.integers(-1, self.oracle.num_blocks), max_size=4), label="blocks")
        kind = data.draw(st.integers(0, 3), label="hit tokens kind")
        hit: Any = [len(blocks) * self.block_size, None, -1, len(blocks) * self.block_size + 1][kind]
        form = data.draw(st.sampled_from(ID_FORMS + ["none", "float"]), label="form")
        given: Any = None if form == "none" else np.array(blocks, dtype=float) if form == "float" else as_form(blocks, form)
        lookahead = data.draw(st.sampled_from([None, 0, 3, -1]), label="lookahead")
        self.call(
            "allocate_slots",
            rid,
            num_new,
            num_new_computed_tokens=hit,
            new_computed_blocks=given,
            num_lookahead_tokens=lookahead,
        )

    @rule(data=st.data())
    def allocate_own_prefix(self, data: st.DataObject) -> None:
        """Hits for a waiting request taken from its own lookup, maybe shortened or tampered."""
        known = self.known()
        if not known:
            return
        rid = data.draw(st.sampled_from(known), label="rid")
        blocks = self.call("get_computed_blocks", rid).value[0].tolist()
        blocks = blocks[: data.draw(st.integers(0, len(blocks)), label="keep")]
        if blocks and data.draw(st.booleans(), label="tamper"):
            blocks[data.draw(st.integers(0, len(blocks) - 1), label="at")] = data.draw(
                st.integers(0, self.oracle.num_blocks - 1), label="other block"
            )
        num_new = data.draw(st.integers(0, 6), label="num_new")
        self.call(
            "allocate_slots",
            rid,
            num_new,
            num_new_computed_tokens=len(blocks) * self.block_size,
            new_computed_blocks=blocks,
        )

    @rule(data=st.data())
    def schedule_step(self, data: st.DataObject) -> None:
        ids = [self.some_id(data) for _ in range(data.draw(st.integers(0, 5), label="n"))]
        budgets = data.draw(st.lists(st.integers(0, 12), min_size=len(ids), max_size=len(ids)), label="budgets")
        budget_form = data.draw(st.sampled_from(["scalar", "list", "int64", "scalar", "list", "int64", "bad"]), label="budget form")
        budget_arg: Any = {
            "scalar": budgets[0] if budgets else 4,
            "list": budgets,
            "int64": np.array(budgets, dtype=np.int64),
            "bad": [*budgets, 1] if data.draw(st.booleans(), label="too long") else -1,
        }[budget_form]
        lookahead: Any = data.draw(st.sampled_from([None, 0, 2, "list"]), label="lookahead")
        if lookahead == "list":
            lookahead = data.draw(st.lists(st.integers(0, 3), min_size=len(ids), max_size=len(ids)), label="lookaheads")
        stop = data.draw(st.sampled_from([None, False, True]), label="stop")
        self.call("schedule_step", ids, budget_arg, num_lookahead_tokens=lookahead, stop_at_first_failure=stop)

    @rule(data=st.data())
    def lookup(self, data: st.DataObject) -> None:
        self.call("get_computed_blocks", self.some_id(data))

    @rule(data=st.data())
    def append_tokens(self, data: st.DataObject) -> None:
        rid = self.some_id(data)
        tokens = data.draw(st.lists(st.integers(0, 3), max_size=4), label="tokens")
        self.call("append_token_ids", rid, as_form(tokens, data.draw(st.sampled_from(ID_FORMS), label="form")))

    @rule(data=st.data())
    def append_tokens_many(self, data: st.DataObject) -> None:
        ids = [self.some_id(data) for _ in range(data.draw(st.integers(0, 3), label="n"))]
        if data.draw(st.booleans(), label="one each"):
            tokens = data.draw(st.lists(st.integers(0, 3), min_size=len(ids), max_size=len(ids)), label="tokens")
            self.call("append_token_ids_many", ids, tokens)
        else:
            lengths = data.draw(st.lists(st.integers(0, 3), min_size=len(ids), max_size=len(ids)), label="lengths")
            offsets = [0]
            for n in lengths:
                offsets.append(offsets[-1] + n)
            tokens = data.draw(st.lists(st.integers(0, 3), min_size=offsets[-1], max_size=offsets[-1]), label="tokens")
            self.call("append_token_ids_many", ids, np.array(tokens, dtype=np.int64), offsets)

    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        self.call("free", self.some_id(data))

    @rule(data=st.data())
    def free_many(self, data: st.DataObject) -> None:
        ids = [self.some_id(data) for _ in range(data.draw(st.integers(0, 3), label="n"))]
        self.call("free_many", ids)

    @rule(data=st.data())
    def preempt(self, data: st.DataObject) -> None:
        self.call("preempt", self.some_id(data))

    @rule(data=st.data())
    def set_num_computed_tokens(self, data: st.DataObject) -> None:
        rid = self.some_id(data)
        slots = len(self.oracle.get_block_ids(rid)) * self.block_size if rid in self.oracle else 4
        n = data.draw(st.one_of(st.integers(0, slots), st.sampled_from([-1, slots + 1])), label="n")
        self.call("set_num_computed_tokens", rid, n)

    @rule(data=st.data())
    def reset_prefix_cache(self, data: st.DataObject) -> None:
        if data.draw(st.integers(0, 4), label="rarely") != 0:
            return  # a successful reset wipes the cache: keep it rare
        in_use = self.oracle.get_num_free_blocks() < self.oracle.num_blocks - 1
        outcome = self.call("reset_prefix_cache")
        assert outcome.value is (not in_use)

    @rule(data=st.data())
    def bad_ids(self, data: st.DataObject) -> None:
        bad = data.draw(st.sampled_from(BAD_IDS), label="bad id")
        method = data.draw(st.sampled_from(["free", "preempt", "get_num_tokens", "get_block_ids", "__contains__"]), label="method")
        self.call(method, bad)
        unknown = data.draw(st.sampled_from(UNKNOWN), label="unknown id")
        for method in ("__contains__", "get_num_computed_tokens", "get_block_hashes", "get_num_tokens"):
            self.call(method, unknown)

    # -- comparison ---------------------------------------------------------------------------

    @invariant()
    def agree(self) -> None:
        if self.oracle is None:
            return
        subject, oracle = observe(self.subject), observe(self.oracle)
        assert subject == oracle, f"subject {subject!r}\nreference {oracle!r}"
        self.subject.check_invariants()
        self.oracle.check_invariants()


def make_machine(subject_cls: Any, oracle_cls: Any = ReferenceManager) -> type[ManagerComparison]:
    """A ``ManagerComparison`` subclass that compares ``subject_cls`` with ``oracle_cls``."""
    return type(
        f"ManagerComparison_{subject_cls.__module__.replace('.', '_')}",
        (ManagerComparison,),
        {"subject_cls": subject_cls, "oracle_cls": oracle_cls},
    )


def test_rust_manager_matches_reference() -> None:
    if RustManager is None:
        pytest.skip("kvpool._core is not built")
    run_state_machine_as_test(make_machine(RustManager), settings=SETTINGS)
