"""Model test: the Rust ``kvpool.ComputedBlocksTracker`` against ``kvpool.reference.ComputedBlocksTracker``.

A hypothesis ``RuleBasedStateMachine`` drives the Rust tracker over a Rust pool and the reference
tracker over a reference pool with the same operations, as a scheduler would: add sequences
(tokens from a three-token alphabet, so prefixes are shared; sometimes LoRA, a cache salt,
multimodal inputs or prompt-embedding digests), append tokens, look them up, start them, compute
chunks of a started sequence (allocate its blocks in the pool, touch its prefix hits, cache the
blocks it fills), preempt (reset and free) and remove them, and churn or evict the pool. Some
operations are bad on purpose (unknown or duplicate ids, bad token dtypes, unsorted multimodal
inputs). After every step it compares everything observable: return values or raised exception
types, each sequence's count, started flag, block hashes and token ids, and both pools' state.

``KVPOOL_HYPOTHESIS_EXAMPLES`` sets the number of examples (default 300). Skipped without the
extension: comparing the reference with itself would prove nothing.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test

from differential import Outcome, agree, as_form

from kvpool._errors import HAVE_CORE, NoFreeBlocksError
from kvpool.reference import BlockPool as ReferencePool
from kvpool.reference import ComputedBlocksTracker as ReferenceTracker

if not HAVE_CORE:
    pytest.skip("kvpool._core is not built", allow_module_level=True)

import kvpool._core as core  # noqa: E402

SETTINGS = settings(
    max_examples=int(os.environ.get("KVPOOL_HYPOTHESIS_EXAMPLES", "300")),
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

IDS = ["a", "b", "c", 0, 1, "0"]  # few ids, so duplicates and unknown ids occur
ALPHABET = [0, 1, 2]
PREFIXES = [[0, 1, 2] * 4, [2] * 12, [0, 1, 2, 0, 1, 2, 0, 0, 0, 0, 0, 0]]  # prompts start with one of these
LORAS = [None] * 4 + [("lora-a", "/adapters/a"), ("lora-a", "/adapters/b")]
SALTS = [None] * 4 + ["", "salt-1"]
MM = [None] * 5 + [[("img-1", 1, 3)], [("img-1", 1, 3), ("img-2", 5, 6)], [("img-2", 0, 2)]]
DIGESTS = [None] * 6 + [[bytes([k]) * 32 for k in range(3)], [bytes([k]) * 32 for k in range(20)]]
BAD_TOKENS = [[1.5], "abc", np.array([1.0, 2.0]), [2**63], np.zeros((2, 2), dtype=np.int64), None]


@dataclass
class Seq:
    """The engine's side of a tracked sequence: blocks it holds and tokens computed."""

    num_tokens: int
    blocks: list[int] = field(default_factory=list)
    computed: int = 0
    num_cached_blocks: int = 0


class TrackerComparison(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.seqs: dict[Any, Seq] = {}

    # -- plumbing -----------------------------------------------------------------------------

    def tracker(self, method: str, *args: Any, **kwargs: Any) -> Outcome:
        return agree(self.rust, self.ref, method, *args, **kwargs)

    def pool(self, method: str, *args: Any, **kwargs: Any) -> Outcome:
        return agree(self.rust_pool, self.ref_pool, method, *args, **kwargs)

    def hashes(self, seq_id: Any) -> list[bytes]:
        return list(self.ref.get_block_hashes(seq_id))

    def pick_id(self, data: st.DataObject, waiting: bool | None = None) -> Any:
        """Mostly a tracked id (a waiting or started one if asked), sometimes any id."""
        known = [s for s in self.seqs if waiting is None or self.ref.is_started(s) != waiting]
        if known and data.draw(st.integers(0, 9), label="known id?") < 9:
            return data.draw(st.sampled_from(known), label="id")
        return data.draw(st.sampled_from(IDS), label="id")

    def free_held(self, seq_id: Any) -> None:
        seq = self.seqs[seq_id]
        self.pool("free_blocks", seq.blocks[::-1])
        seq.blocks, seq.computed, seq.num_cached_blocks = [], 0, 0

    # -- setup and comparison -----------------------------------------------------------------

    @initialize(
        block_size=st.sampled_from([1, 2, 3, 4]),
        hash_algo=st.sampled_from([None, "sha256", "xxhash", "xxhash_cbor"]),
        seed=st.sampled_from([None, "0"]),
        num_blocks=st.integers(4, 40),
        enable_caching=st.sampled_from([True, True, True, False]),
        data=st.data(),
    )
    def build(self, block_size: int, hash_algo: str | None, seed: str | None, num_blocks: int,
              enable_caching: bool, data: st.DataObject) -> None:
        kwargs = dict(block_size=block_size, enable_events=True, enable_caching=enable_caching)
        self.rust_pool = core.BlockPool(num_blocks, **kwargs)
        self.ref_pool = ReferencePool(num_blocks, **kwargs)
        self.rust = core.ComputedBlocksTracker(self.rust_pool, block_size, hash_algo=hash_algo, seed=seed)
        self.ref = ReferenceTracker(self.ref_pool, block_size, hash_algo=hash_algo, seed=seed)
        self.bs = block_size
        for _ in range(data.draw(st.integers(1, 4), label="first sequences")):
            self.add(data, may_fail=False)

    @invariant()
    def same_observable_state(self) -> None:
        for name in ("block_size", "hash_algo"):
            assert getattr(self.rust, name) == getattr(self.ref, name)
        assert len(self.rust) == len(self.ref) == len(self.seqs)
        for seq_id in IDS:
            assert (seq_id in self.rust) == (seq_id in self.ref) == (seq_id in self.seqs), seq_id
        for seq_id in self.seqs:
            for method in ("get_num_cached_tokens", "is_started", "get_block_hashes", "get_token_ids"):
                self.tracker(method, seq_id)
        ids = list(self.seqs)
        self.tracker("get_num_cached_tokens_many", ids)
        for method in ("ref_counts", "free_block_ids", "get_num_free_blocks", "get_num_cached_blocks", "take_events"):
            self.pool(method)
        for block_id in range(self.ref_pool.num_blocks):
            self.pool("block_hash", block_id)
        self.rust_pool.check_invariants()
        self.ref_pool.check_invariants()

    @invariant()
    def counts_obey_invariants_1_and_4(self) -> None:
        """Full blocks, never the last token; a waiting sequence's count is the pool's answer now."""
        for seq_id, seq in self.seqs.items():
            count = self.ref.get_num_cached_tokens(seq_id)
            assert count % self.bs == 0 and count <= max(seq.num_tokens - 1, 0)
            if not self.ref.is_started(seq_id):
                expected = 0
                if self.ref_pool.enable_caching and seq.num_tokens:
                    hits = self.ref_pool.find_longest_cache_hit(
                        self.hashes(seq_id), max_blocks=(seq.num_tokens - 1) // self.bs)
                    expected = len(hits) * self.bs
                assert count == expected

    # -- sequences ----------------------------------------------------------------------------

    @rule(data=st.data())
    def add_sequence(self, data: st.DataObject) -> None:
        self.add(data, may_fail=True)

    def add(self, data: st.DataObject, may_fail: bool) -> None:
        unused = [s for s in IDS if s not in self.seqs]
        if unused and (not may_fail or data.draw(st.integers(0, 3), label="new id?") > 0):
            seq_id = data.draw(st.sampled_from(unused), label="id")
        else:
            seq_id = data.draw(st.sampled_from(IDS), label="id")
        prefix = data.draw(st.sampled_from(PREFIXES), label="prefix")
        cut = data.draw(st.integers(0, len(prefix)), label="prefix cut")  # simplest: the whole prefix
        tokens = prefix[: len(prefix) - cut]
        tokens = tokens + data.draw(st.lists(st.sampled_from(ALPHABET), max_size=6), label="tail")
        form = data.draw(st.sampled_from(["list", "tuple", "int64", "int32", "uint8"]), label="form")
        kwargs: dict[str, Any] = dict(
            lora=data.draw(st.sampled_from(LORAS), label="lora"),
            cache_salt=data.draw(st.sampled_from(SALTS), label="salt"),
            mm_features=data.draw(st.sampled_from(MM), label="mm"),
            prompt_embed_digests=data.draw(st.sampled_from(DIGESTS), label="digests"),
        )
        bad = data.draw(st.sampled_from([None] * 8 + ["tokens", "mm"]), label="bad") if may_fail else None
        token_ids = as_form(tokens, form)
        if bad == "tokens":
            token_ids = data.draw(st.sampled_from(BAD_TOKENS), label="bad tokens")
        elif bad == "mm":
            kwargs["mm_features"] = [("img-2", 5, 2), ("img-1", 1, 3)]
        outcome = self.tracker("add_sequence", seq_id, token_ids, **kwargs)
        if outcome.ok:
            self.seqs[seq_id] = Seq(num_tokens=len(tokens))

    @rule(data=st.data())
    def append_tokens(self, data: st.DataObject) -> None:
        seq_id = self.pick_id(data)
        tokens = data.draw(st.lists(st.sampled_from(ALPHABET), max_size=6), label="tokens")
        form = data.draw(st.sampled_from(["list", "int64", "tuple"]), label="form")
        outcome = self.tracker("append_tokens", seq_id, as_form(tokens, form))
        if outcome.ok:
            self.seqs[seq_id].num_tokens += len(tokens)

    @rule(data=st.data())
    def append_tokens_many(self, data: st.DataObject) -> None:
        ids = [self.pick_id(data) for _ in range(data.draw(st.integers(0, 3), label="n"))]
        segments = [data.draw(st.lists(st.sampled_from(ALPHABET), max_size=4), label="segment") for _ in ids]
        flat = [t for s in segments for t in s]
        one_each = all(len(s) == 1 for s in segments) and data.draw(st.booleans(), label="no offsets")
        offsets = None if one_each else np.cumsum([0] + [len(s) for s in segments]).tolist()
        if offsets and data.draw(st.integers(0, 9), label="bad offsets") == 0:
            offsets[-1] += 1
        outcome = self.tracker("append_tokens_many", ids, np.array(flat, dtype=np.int64), offsets)
        if outcome.ok:
            for seq_id, s in zip(ids, segments):
                self.seqs[seq_id].num_tokens += len(s)

    @rule(data=st.data())
    def start(self, data: st.DataObject) -> None:
        """Start a sequence's prefill as the scheduler does: fix its count, take its prefix hits."""
        self.start_sequence(self.pick_id(data, waiting=True))

    @rule(data=st.data())
    def schedule(self, data: st.DataObject) -> None:
        """Start a waiting sequence and compute its first chunk in the same step."""
        seq_id = self.pick_id(data, waiting=True)
        if self.start_sequence(seq_id):
            self.compute(seq_id, data)

    def start_sequence(self, seq_id: Any) -> bool:
        """Start ``seq_id`` as the scheduler does; return whether it was waiting and now started."""
        was_started = seq_id in self.seqs and self.ref.is_started(seq_id)
        outcome = self.tracker("start", seq_id)
        if not outcome.ok or was_started:
            return False
        count = outcome.value
        hits = self.pool("find_longest_cache_hit", self.hashes(seq_id), max_blocks=count // self.bs)
        self.pool("touch", hits.value)
        seq = self.seqs[seq_id]
        seq.blocks, seq.computed, seq.num_cached_blocks = hits.value.tolist(), count, len(hits.value)
        return True

    @rule(data=st.data())
    def start_many(self, data: st.DataObject) -> None:
        """``start_many`` of waiting and unknown ids (the engine takes no hits here)."""
        ids = [self.pick_id(data) for _ in range(data.draw(st.integers(0, 3), label="n"))]
        self.tracker("start_many", ids)

    @precondition(lambda self: any(self.ref.is_started(s) for s in self.seqs))
    @rule(data=st.data())
    def compute_chunk(self, data: st.DataObject) -> None:
        """A started sequence computes a chunk: allocate its blocks, cache the ones it fills."""
        started = [s for s in self.seqs if self.ref.is_started(s)]
        self.compute(data.draw(st.sampled_from(started), label="id"), data)

    def compute(self, seq_id: Any, data: st.DataObject) -> None:
        seq = self.seqs[seq_id]
        remaining = seq.num_tokens - seq.computed
        if remaining <= 0:
            return
        total = seq.computed + data.draw(st.one_of(st.just(remaining), st.integers(1, remaining)), label="n")
        outcome = self.pool("get_new_blocks", max(0, math.ceil(total / self.bs) - len(seq.blocks)))
        if not outcome.ok:
            assert isinstance(outcome.error, NoFreeBlocksError)
            return
        seq.blocks += outcome.value.tolist()
        num_full = min(total // self.bs, len(self.hashes(seq_id)))  # no digest, no hash: not cached
        if self.ref_pool.enable_caching and num_full > seq.num_cached_blocks:
            cached = self.pool("cache_full_blocks", seq.blocks, self.hashes(seq_id), seq.num_cached_blocks, num_full)
            assert cached.ok, cached
            seq.num_cached_blocks = num_full
        seq.computed = total

    @rule(data=st.data())
    def preempt(self, data: st.DataObject) -> None:
        """Preemption: the engine frees the sequence's blocks, the tracker resets it."""
        seq_id = self.pick_id(data)
        outcome = self.tracker("reset_sequence", seq_id)
        if outcome.ok:
            self.free_held(seq_id)

    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        """The sequence finished (or was aborted): its blocks are freed, the tracker forgets it."""
        seq_id = self.pick_id(data)
        if seq_id in self.seqs:
            self.free_held(seq_id)
        outcome = self.tracker("remove_sequence", seq_id)
        if outcome.ok:
            del self.seqs[seq_id]

    @rule(data=st.data())
    def query(self, data: st.DataObject) -> None:
        seq_id = data.draw(st.one_of(st.sampled_from(IDS), st.sampled_from([1.5, None, True, b"a"])), label="id")
        method = data.draw(st.sampled_from(["get_num_cached_tokens", "is_started", "get_block_hashes",
                                            "get_token_ids", "__contains__"]), label="method")
        self.tracker(method, seq_id)

    # -- the pool changing under waiting sequences ---------------------------------------------

    @rule(data=st.data())
    def churn(self, data: st.DataObject) -> None:
        """Another request takes free blocks (evicting cached ones from the LRU head) and frees them."""
        n = data.draw(st.integers(0, self.ref_pool.get_num_free_blocks()), label="n")
        outcome = self.pool("get_new_blocks", n)
        if outcome.ok:
            self.pool("free_blocks", outcome.value[::-1])

    @rule(data=st.data())
    def evict(self, data: st.DataObject) -> None:
        ids = data.draw(st.lists(st.integers(0, self.ref_pool.num_blocks - 1), max_size=3), label="ids")
        self.pool("evict_blocks", ids)


def test_tracker_matches_reference() -> None:
    run_state_machine_as_test(TrackerComparison, settings=SETTINGS)
