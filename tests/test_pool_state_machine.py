"""Model test: the Rust ``kvpool.BlockPool`` against ``kvpool.reference.BlockPool``.

A hypothesis ``RuleBasedStateMachine`` builds both pools with the same arguments, applies the
same random operations to both and, after every step, compares everything observable: the
returned values or the raised exception type, the free queue's order, every reference count,
every block hash, the counters, the usage and the pending events; ``check_invariants()`` runs
on both. The machine keeps track of which blocks each "request" holds so that most operations
are valid, and mixes in bad ones (too many blocks, bad ids, double frees, bad hashes, ...).

``KVPOOL_HYPOTHESIS_EXAMPLES`` sets the number of examples (default 300). The test is skipped
when the extension is not built: comparing the reference with itself would prove nothing.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test

from differential import Outcome, agree, as_form, normalize

from kvpool._errors import (
    BlockStateError,
    CachingDisabledError,
    DoubleFreeError,
    InvalidArgumentError,
    InvalidBlockIdError,
    NoFreeBlocksError,
    PinBudgetError,
)
from kvpool.reference import BlockPool as ReferencePool

SETTINGS = settings(
    max_examples=int(os.environ.get("KVPOOL_HYPOTHESIS_EXAMPLES", "300")),
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

WIDTH = 2
ALPHABET = [bytes([0xA0 + i, i]) for i in range(5)]  # few hashes, so keys collide often
BAD_HASHES = [b"\x01", b"\x02" * 3, b"", b"\x03" * 33]  # every one of them has a bad width
GROUPS = [0, 1]

hashes_st = st.sampled_from(ALPHABET)
ID_FORMS = ["list", "tuple", "int32", "int64", "uint16"]


@dataclass
class Request:
    """Blocks a request holds (one reference per entry) and the hashes of its full blocks."""

    blocks: list[int]
    hashes: list[bytes] = field(default_factory=list)
    num_cached: int = 0
    group: int = 0


class PoolComparison(RuleBasedStateMachine):
    """Drive ``subject_cls`` and ``oracle_cls`` with the same operations; compare after each."""

    subject_cls: type = ReferencePool
    oracle_cls: type = ReferencePool

    def __init__(self) -> None:
        super().__init__()
        self.subject: Any = None
        self.oracle: Any = None
        self.requests: list[Request] = []

    # -- plumbing -----------------------------------------------------------------------------

    def call(self, method: str, *args: Any, expect: type | str | None = None, **kwargs: Any) -> Outcome:
        """Call ``method`` on both pools, check they agree, return the oracle's outcome.

        ``expect`` ("ok" or an exception type) also checks the oracle against what the test
        knows must happen.
        """
        oracle = agree(self.subject, self.oracle, method, *args, **kwargs)
        if expect == "ok":
            assert oracle.ok, f"{method}: expected success, reference {oracle!r}"
        elif expect is not None:
            assert not oracle.ok and type(oracle.error) is expect, (
                f"{method}: expected {expect.__name__}, reference {oracle!r}"
            )
        return oracle

    @property
    def num_blocks(self) -> int:
        return self.oracle.num_blocks

    def free_list(self) -> list[int]:
        return self.oracle.free_block_ids().tolist()

    def is_null(self, block_id: int) -> bool:
        return block_id == self.oracle.null_block

    def release(self, freed: list[int], owners: list[Request]) -> None:
        """Book-keep a successful free: drop ``owners`` entirely, then one reference per extra id."""
        remaining = Counter(b for b in freed if not self.is_null(b))
        for request in owners:
            remaining.subtract(request.blocks)
            self.requests.remove(request)
        assert all(n >= 0 for n in remaining.values()), "freed fewer references than the owners hold"
        for block_id, n in remaining.items():
            for _ in range(n):
                holder = next((r for r in self.requests if block_id in r.blocks), None)
                assert holder is not None, f"freed block {block_id} that no request holds"
                position = holder.blocks.index(block_id)
                del holder.blocks[position]
                holder.num_cached = min(holder.num_cached, position)
                del holder.hashes[holder.num_cached :]

    def held_count(self, block_id: int) -> int:
        return sum(r.blocks.count(block_id) for r in self.requests)

    # -- setup and comparison -----------------------------------------------------------------

    @initialize(
        num_blocks=st.integers(2, 40),
        enable_caching=st.sampled_from([True, True, True, False]),
        null_block=st.booleans(),
        block_size=st.sampled_from([1, 2, 4]),
        hash_width=st.sampled_from([None, None, WIDTH]),
        max_pending_events=st.sampled_from([None, None, 1, 2]),
        eviction=st.sampled_from(["lru", "priority", "adaptive"]),
        max_pinned_blocks=st.sampled_from([None, 0, 3]),
        # Small horizons, so that the adaptive policy's two bands interleave in pools this
        # small (the default, 20,000 blocks freed, always puts reused blocks last).
        adaptive_horizon=st.sampled_from([None, 0, 1, 5, 30]),
    )
    def build(self, num_blocks: int, enable_caching: bool, null_block: bool, block_size: int,
              hash_width: int | None, max_pending_events: int | None, eviction: str,
              max_pinned_blocks: int | None, adaptive_horizon: int | None) -> None:
        kwargs = dict(
            enable_caching=enable_caching,
            null_block=null_block,
            enable_events=True,
            block_size=block_size,
            hash_width=hash_width,
            max_pending_events=max_pending_events,
            eviction=eviction,
            max_pinned_blocks=None if max_pinned_blocks is None else min(max_pinned_blocks, num_blocks),
            clock="manual",
            adaptive_horizon=adaptive_horizon if eviction == "adaptive" else None,
        )
        self.subject = self.subject_cls(num_blocks, **kwargs)
        self.oracle = self.oracle_cls(num_blocks, **kwargs)

    @invariant()
    def same_observable_state(self) -> None:
        for pool in (self.subject, self.oracle):
            assert pool.check_invariants() is None
        for name in ("num_blocks", "block_size", "enable_caching", "enable_events", "null_block", "hash_width",
                     "eviction", "adaptive_horizon", "clock", "now", "max_pinned_blocks", "num_evictions"):
            assert getattr(self.subject, name) == getattr(self.oracle, name), name
        for method in ("free_block_ids", "ref_counts", "get_num_free_blocks", "get_num_cached_blocks",
                       "get_num_cached_keys", "get_usage",
                       "get_num_pinned_blocks", "pinned_block_ids", "cached_block_ids"):
            got, want = getattr(self.subject, method)(), getattr(self.oracle, method)()
            assert normalize(got) == normalize(want), f"{method}: subject {got!r}, reference {want!r}"
        for block_id in range(self.num_blocks):
            got, want = self.subject.block_hash(block_id), self.oracle.block_hash(block_id)
            assert got == want, f"block_hash({block_id}): subject {got!r}, reference {want!r}"
            got, want = self.subject.block_priority(block_id), self.oracle.block_priority(block_id)
            assert got == want, f"block_priority({block_id}): subject {got!r}, reference {want!r}"
            got, want = self.subject.block_hash_num_tokens(block_id), self.oracle.block_hash_num_tokens(block_id)
            assert got == want, f"block_hash_num_tokens({block_id}): subject {got!r}, reference {want!r}"
        # The free queue walked from cursors (vLLM's iter_blocks_after): from the head, from
        # free blocks in each part of the queue, and from a block in use (nothing after it).
        order = self.oracle.free_block_ids().tolist()
        in_use = [b for b in range(self.num_blocks) if b not in order][:1]
        for cursor in [None, *order[:2], *order[len(order) // 2:][:1], *order[-2:], *in_use]:
            for max_blocks in (0, 2, self.num_blocks):
                got, want = (pool.free_block_ids_after(cursor, max_blocks) for pool in (self.subject, self.oracle))
                assert normalize(got) == normalize(want), f"free_block_ids_after({cursor}, {max_blocks})"
        # And backwards, from every block (vLLM's prev_free_block) and from the tail.
        for block_id in [None, *range(self.num_blocks)]:
            got, want = (pool.free_block_id_before(block_id) for pool in (self.subject, self.oracle))
            assert got == want, f"free_block_id_before({block_id}): subject {got!r}, reference {want!r}"
        for name in ("max_pending_events", "num_pending_events", "num_dropped_events"):
            assert getattr(self.subject, name) == getattr(self.oracle, name), name
        got_events, want_events = self.subject.take_events(), self.oracle.take_events()
        assert got_events == want_events, f"events: subject {got_events!r}, reference {want_events!r}"

    @invariant()
    def bookkeeping_matches_counts(self) -> None:
        counts = self.oracle.ref_counts().tolist()
        pinned = set(self.oracle.pinned_block_ids().tolist())
        for block_id in range(self.num_blocks):
            if not self.is_null(block_id):
                held = self.held_count(block_id) + (block_id in pinned)
                assert counts[block_id] == held, f"block {block_id}"

    # -- allocation ---------------------------------------------------------------------------

    @rule(data=st.data())
    def allocate(self, data: st.DataObject) -> None:
        free = self.oracle.get_num_free_blocks()
        n = data.draw(st.one_of(st.integers(0, free), st.integers(free + 1, free + 3)), label="n")
        outcome = self.call("get_new_blocks", n, expect="ok" if n <= free else NoFreeBlocksError)
        if outcome.ok:
            self.requests.append(Request(blocks=outcome.value.tolist(), group=data.draw(st.sampled_from(GROUPS))))

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def extend_request(self, data: st.DataObject) -> None:
        request = data.draw(st.sampled_from(self.requests), label="request")
        free = self.oracle.get_num_free_blocks()
        n = data.draw(st.integers(0, free + 1), label="n")
        outcome = self.call("get_new_blocks", np.int64(n))
        if outcome.ok:
            request.blocks.extend(outcome.value.tolist())

    @rule(data=st.data())
    def allocate_many(self, data: st.DataObject) -> None:
        free = self.oracle.get_num_free_blocks()
        counts = data.draw(st.lists(st.integers(0, max(1, free // 2 + 1)), max_size=4), label="counts")
        if data.draw(st.booleans(), label="negative"):
            counts.append(-1)
        form = data.draw(st.sampled_from(["list", "int32", "int64"]), label="form")
        outcome = self.call("get_new_blocks_many", as_form(counts, form))
        if outcome.ok:
            flat, offsets = outcome.value
            for a, b in zip(offsets.tolist(), offsets.tolist()[1:]):
                self.requests.append(Request(blocks=flat[a:b].tolist()))

    # -- freeing ------------------------------------------------------------------------------

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def free_request(self, data: st.DataObject) -> None:
        request = data.draw(st.sampled_from(self.requests), label="request")
        forward = data.draw(st.sampled_from([False, False, False, True]), label="forward")
        ids = list(request.blocks) if forward else request.blocks[::-1]
        form = data.draw(st.sampled_from(ID_FORMS), label="form")
        if data.draw(st.booleans(), label="reverse=True"):
            # The same free, the ids given in table order and reversed by the pool.
            outcome = self.call("free_blocks", as_form(ids[::-1], form), reverse=True, expect="ok")
        else:
            outcome = self.call("free_blocks", as_form(ids, form), expect="ok")
        if outcome.ok:
            self.release(ids, [request])

    @rule(data=st.data())
    def free_bad(self, data: st.DataObject) -> None:
        """Free a request's blocks plus something wrong: a bad id, a duplicate, a free block."""
        request = data.draw(st.sampled_from(self.requests), label="request") if self.requests else None
        ids = request.blocks[::-1] if request else []
        kind = data.draw(st.sampled_from(["bad_id", "duplicate", "free_block"]), label="kind")
        expect: Any = None
        if kind == "bad_id":
            extra = data.draw(st.sampled_from([-1, self.num_blocks, self.num_blocks + 7, 2**40]), label="bad")
            expect = InvalidBlockIdError
        elif kind == "duplicate" and ids:
            extra = data.draw(st.sampled_from(ids), label="duplicate")
        else:
            extra = data.draw(st.integers(0, self.num_blocks - 1), label="block")
        position = data.draw(st.integers(0, len(ids)), label="position")
        ids = ids[:position] + [extra] + ids[position:]
        if expect is None:
            counts = self.oracle.ref_counts().tolist()
            pinned = set(self.oracle.pinned_block_ids().tolist())
            ok = self.is_null(extra) or Counter(ids)[extra] <= counts[extra] - (extra in pinned)
            expect = "ok" if ok else DoubleFreeError
        outcome = self.call("free_blocks", as_form(ids, data.draw(st.sampled_from(ID_FORMS))), expect=expect)
        if outcome.ok:
            self.release(ids, [request] if request else [])

    @rule(data=st.data())
    def free_many(self, data: st.DataObject) -> None:
        chosen = data.draw(st.lists(st.sampled_from(self.requests), unique_by=id, max_size=3), label="requests") \
            if self.requests else []
        reverse = data.draw(st.booleans(), label="reverse")
        # The caller wants each request freed back to front.
        segments = [list(r.blocks) if reverse else r.blocks[::-1] for r in chosen]
        bad = data.draw(st.sampled_from([None, None, None, "bad_id", "duplicate", "offsets"]), label="bad")
        if bad == "bad_id":
            segments.append([data.draw(st.sampled_from([-1, self.num_blocks]), label="bad id")])
        elif bad == "duplicate" and any(segments):
            segments.append([data.draw(st.sampled_from([b for s in segments for b in s]), label="dup")])
        use_offsets = data.draw(st.booleans(), label="offsets")
        if use_offsets:
            flat = [b for s in segments for b in s]
            offsets = np.cumsum([0] + [len(s) for s in segments]).tolist()
            if bad == "offsets":
                offsets[-1] += 1
            outcome = self.call(
                "free_blocks_many",
                as_form(flat, data.draw(st.sampled_from(ID_FORMS), label="form")),
                as_form(offsets, data.draw(st.sampled_from(["list", "int64"]), label="offsets form")),
                reverse=reverse,
            )
        else:
            form = data.draw(st.sampled_from(ID_FORMS), label="form")
            outcome = self.call("free_blocks_many", [as_form(s, form) for s in segments], reverse=reverse)
        if outcome.ok:
            self.release([b for s in segments for b in s], chosen)

    # -- touching prefix-cache hits -----------------------------------------------------------

    @rule(data=st.data())
    def touch_cached_hits(self, data: st.DataObject) -> None:
        """Look up a request's hashes (or random ones) and take references to the hit blocks."""
        cached = [r for r in self.requests if r.num_cached > 0]
        if cached and data.draw(st.booleans(), label="from request"):
            source = data.draw(st.sampled_from(cached), label="source")
            hashes, group = list(source.hashes), source.group
            hashes += data.draw(st.lists(hashes_st, max_size=2), label="more")
        else:
            hashes = data.draw(st.lists(hashes_st, max_size=6), label="hashes")
            group = data.draw(st.sampled_from(GROUPS), label="group")
        max_blocks = data.draw(st.one_of(st.none(), st.integers(0, 6)), label="max_blocks")
        outcome = self.call("find_longest_cache_hit", hashes, group_id=group, max_blocks=max_blocks)
        if not outcome.ok:
            return
        hit = outcome.value.tolist()
        touched = self.call("touch", as_form(hit, data.draw(st.sampled_from(ID_FORMS), label="form")), expect="ok")
        if touched.ok and hit:
            self.requests.append(Request(blocks=hit, hashes=hashes[: len(hit)], num_cached=len(hit), group=group))

    @rule(data=st.data())
    def touch_any(self, data: st.DataObject) -> None:
        """Take references to arbitrary blocks (free, in use, null, sometimes out of range)."""
        ids = data.draw(st.lists(st.integers(0, self.num_blocks - 1), max_size=5), label="ids")
        if data.draw(st.integers(0, 4), label="bad?") == 0:
            ids.append(data.draw(st.sampled_from([-1, self.num_blocks]), label="bad id"))
        outcome = self.call("touch", as_form(ids, data.draw(st.sampled_from(ID_FORMS), label="form")))
        if outcome.ok:
            self.requests.append(Request(blocks=[b for b in ids if not self.is_null(b)]))

    # -- caching ------------------------------------------------------------------------------

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def cache_request(self, data: st.DataObject) -> None:
        """Cache a request's newly full blocks, as a scheduler would."""
        request = data.draw(st.sampled_from(self.requests), label="request")
        num_full = data.draw(st.integers(request.num_cached, len(request.blocks)), label="num_full")
        hashes = request.hashes[:num_full]
        hashes += data.draw(st.lists(hashes_st, min_size=num_full - len(hashes), max_size=num_full - len(hashes)))
        extra = data.draw(st.lists(hashes_st, max_size=2), label="hashes beyond num_full")
        bs = self.oracle.block_size
        tokens = data.draw(
            st.sampled_from([None, "list", "array"]), label="tokens"
        )
        token_ids = None
        if tokens is not None:
            token_ids = [1000 + i for i in range(len(request.blocks) * bs)]
            if tokens == "array":
                token_ids = np.array(token_ids, dtype=np.int64)
        lora = data.draw(st.sampled_from([(None, None), (3, "adapter")]), label="lora")
        priority = data.draw(st.sampled_from([{}, {}, {"priority": 80}, {"priority": 5, "retention_s": 2.0},
                                              {"priority": 90, "retention_s": 1}]), label="priority")
        outcome = self.call(
            "cache_full_blocks",
            as_form(request.blocks, data.draw(st.sampled_from(ID_FORMS), label="form")),
            hashes + extra,
            request.num_cached,
            num_full,
            group_id=request.group,
            token_ids=token_ids,
            lora_id=lora[0],
            lora_name=lora[1],
            **priority,
        )
        if outcome.ok:
            request.hashes = hashes
            request.num_cached = num_full

    @rule(data=st.data())
    def new_cached_request(self, data: st.DataObject) -> None:
        """Allocate a request's blocks and cache the full ones at once, reusing known hashes often."""
        free = self.oracle.get_num_free_blocks()
        if free == 0:
            return
        n = data.draw(st.integers(1, min(free, 6)), label="n")
        num_full = data.draw(st.integers(0, n), label="num_full")
        known = [r.hashes for r in self.requests if r.hashes]
        hashes: list[bytes] = []
        if known and data.draw(st.booleans(), label="shared prefix"):
            hashes = list(data.draw(st.sampled_from(known), label="prefix"))[:num_full]
        hashes += data.draw(st.lists(hashes_st, min_size=num_full - len(hashes), max_size=num_full - len(hashes)))
        group = data.draw(st.sampled_from(GROUPS), label="group")
        outcome = self.call("get_new_blocks", n, expect="ok")
        if not outcome.ok:
            return
        request = Request(blocks=outcome.value.tolist(), group=group)
        self.requests.append(request)
        bs = self.oracle.block_size
        cached = self.call(
            "cache_full_blocks", outcome.value, hashes, 0, num_full, group_id=group,
            token_ids=list(range(n * bs)),
            expect="ok" if self.oracle.enable_caching else CachingDisabledError,
        )
        if cached.ok:
            request.hashes, request.num_cached = hashes, num_full

    @rule(data=st.data())
    def cache_bad(self, data: st.DataObject) -> None:
        """A cache_full_blocks call with one thing wrong."""
        kind = data.draw(
            st.sampled_from(
                ["cached>full", "few hashes", "bad width", "bad id", "short tokens", "bad group", "free block",
                 "cached block", "duplicate"]
            ),
            label="kind",
        )
        held = [b for r in self.requests for b in r.blocks]
        blocks = data.draw(st.lists(st.sampled_from(held), max_size=4), label="blocks") if held else []
        hashes = data.draw(st.lists(hashes_st, min_size=len(blocks), max_size=len(blocks) + 1), label="hashes")
        num_cached, num_full, group, token_ids = 0, len(blocks), 0, None
        expect: Any = None
        if kind == "cached>full":
            num_cached, num_full = len(blocks) + 1, len(blocks)
            expect = InvalidArgumentError
        elif kind == "few hashes":
            hashes = hashes[: max(0, len(blocks) - 1)]
            expect = InvalidArgumentError if blocks else None
        elif kind == "bad width":
            hashes.insert(data.draw(st.integers(0, len(hashes))), data.draw(st.sampled_from(BAD_HASHES)))
        elif kind == "bad id":
            blocks.insert(data.draw(st.integers(0, len(blocks))), data.draw(st.sampled_from([-1, self.num_blocks])))
            hashes.append(ALPHABET[0])
            expect = InvalidBlockIdError
        elif kind == "short tokens":
            token_ids = [7] * max(0, num_full * self.oracle.block_size - 1)
            expect = InvalidArgumentError if blocks else None
        elif kind == "bad group":
            group = data.draw(st.sampled_from([-1, 2**32]))
            expect = InvalidArgumentError
        elif kind == "free block":
            free = self.free_list()
            if free:
                blocks.append(data.draw(st.sampled_from(free), label="free block"))
                hashes = hashes[: len(blocks) - 1] + [ALPHABET[1]] + hashes[len(blocks) - 1 :]
                num_full = len(blocks)
                expect = BlockStateError
        elif kind == "cached block":
            cached = [b for b in range(self.num_blocks) if self.oracle.block_hash(b) is not None]
            if cached:
                blocks.append(data.draw(st.sampled_from(cached), label="cached block"))
                hashes = hashes[: len(blocks) - 1] + [ALPHABET[2]] + hashes[len(blocks) - 1 :]
                num_full = len(blocks)
                expect = BlockStateError
        elif kind == "duplicate" and blocks:
            blocks.append(blocks[0])
            hashes.append(ALPHABET[3])
            num_full = len(blocks)
            expect = BlockStateError
        if not self.oracle.enable_caching:
            expect = CachingDisabledError
        self.call(
            "cache_full_blocks", blocks, hashes, num_cached, num_full, group_id=group, token_ids=token_ids,
            expect=expect,
        )

    # -- lookups, eviction, reset -------------------------------------------------------------

    @rule(
        block_hash=st.one_of(hashes_st, st.sampled_from(BAD_HASHES)),
        group=st.sampled_from(GROUPS),
    )
    def get_cached_block(self, block_hash: bytes, group: int) -> None:
        self.call("get_cached_block", block_hash, group)

    @rule(
        hashes=st.lists(st.one_of(hashes_st, hashes_st, hashes_st, st.sampled_from(BAD_HASHES)), max_size=6),
        group=st.sampled_from(GROUPS),
        max_blocks=st.one_of(st.none(), st.integers(-1, 6)),
    )
    def longest_cache_hit(self, hashes: list[bytes], group: int, max_blocks: int | None) -> None:
        self.call("find_longest_cache_hit", hashes, group_id=group, max_blocks=max_blocks)

    @rule(data=st.data())
    def evict_blocks(self, data: st.DataObject) -> None:
        ids = data.draw(st.lists(st.integers(0, self.num_blocks - 1), max_size=6), label="ids")
        if data.draw(st.integers(0, 5), label="bad?") == 0:
            ids.append(data.draw(st.sampled_from([-1, self.num_blocks]), label="bad id"))
        self.call("evict_blocks", as_form(ids, data.draw(st.sampled_from(ID_FORMS), label="form")))

    @rule(data=st.data())
    def reset_prefix_cache(self, data: st.DataObject) -> None:
        if data.draw(st.integers(0, 7), label="rarely") != 0:
            return  # a successful reset wipes the cache: keep it rare
        in_use = any(r.blocks for r in self.requests) or self.oracle.get_num_pinned_blocks() > 0
        outcome = self.call("reset_prefix_cache", expect="ok")
        assert outcome.value is (not in_use)

    # -- retention priorities, the clock and pins --------------------------------------------

    @rule(data=st.data())
    def set_priority(self, data: st.DataObject) -> None:
        ids = data.draw(st.lists(st.integers(0, self.num_blocks - 1), max_size=4), label="ids")
        if data.draw(st.integers(0, 5), label="bad id?") == 0:
            ids.append(data.draw(st.sampled_from([-1, self.num_blocks]), label="bad id"))
        priority = data.draw(st.one_of(st.integers(0, 100), st.sampled_from([-1, 101])), label="priority")
        retention = data.draw(st.sampled_from([None, None, 1.5, 3, 0, -1.0]), label="retention_s")
        self.call("set_priority", ids, priority, retention_s=retention)

    @rule(seconds=st.sampled_from([0, 0.5, 1, 2.5, -1.0]))
    def advance_clock(self, seconds: float) -> None:
        self.call("advance_clock", seconds)

    @rule(data=st.data())
    def pin_prefix(self, data: st.DataObject) -> None:
        known = [r.hashes for r in self.requests if r.hashes]
        if known and data.draw(st.booleans(), label="known"):
            hashes = list(data.draw(st.sampled_from(known), label="prefix"))
        else:
            hashes = data.draw(st.lists(hashes_st, max_size=4), label="hashes")
        group = data.draw(st.sampled_from(GROUPS), label="group")
        outcome = self.call("pin_prefix", hashes, group_id=group)
        assert outcome.ok or type(outcome.error) is PinBudgetError or not self.oracle.enable_caching, outcome

    @rule(data=st.data())
    def unpin(self, data: st.DataObject) -> None:
        if data.draw(st.integers(0, 3), label="all?") == 0:
            self.call("unpin_all", expect="ok")
            return
        known = [r.hashes for r in self.requests if r.hashes] or [[ALPHABET[0]]]
        hashes = list(data.draw(st.sampled_from(known), label="prefix"))
        self.call("unpin_prefix", hashes, group_id=data.draw(st.sampled_from(GROUPS), label="group"))

    @rule(data=st.data())
    def introspect(self, data: st.DataObject) -> None:
        block_id = data.draw(st.integers(-1, self.num_blocks), label="id")
        self.call("ref_count", block_id)
        self.call("block_hash", block_id)
        self.call("block_hash_num_tokens", block_id)
        self.call("extra_block_hashes", block_id)
        self.call("free_block_ids_after", block_id, data.draw(st.integers(-1, 3), label="max_blocks"))
        self.call("free_block_id_before", block_id)


def make_machine(subject_cls: type, oracle_cls: type = ReferencePool) -> type[PoolComparison]:
    """A ``PoolComparison`` subclass that compares ``subject_cls`` with ``oracle_cls``."""
    return type(
        f"PoolComparison_{subject_cls.__module__.replace('.', '_')}",
        (PoolComparison,),
        {"subject_cls": subject_cls, "oracle_cls": oracle_cls},
    )


def test_rust_pool_matches_reference(rust_pool_cls: type) -> None:
    run_state_machine_as_test(make_machine(rust_pool_cls), settings=SETTINGS)
