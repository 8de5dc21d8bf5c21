"""The computed-blocks tracker: its seven invariants, the historic regression, and its errors.

Every test runs on the Rust ``kvpool.ComputedBlocksTracker`` over a Rust pool, on the plain-Python
``kvpool.reference.ComputedBlocksTracker`` over a reference pool, and on the reference tracker
over a Rust pool. The invariants (``docs/semantics.md``, "Computed-blocks tracker"):

1. counts only full blocks, block-aligned, and never the last prompt token;
2. reports a prefix: if block ``i`` counts, so do blocks ``0..i``;
3. counts a block only if its KV is present or will be written before it is read;
4. fixes the count when the prefill starts and keeps it across chunks: its own chunks never
   inflate it, and blocks computed by other sequences before it started do count;
5. hashes incrementally with exactly the pool's hash, appending only;
6. drops its state on free or preemption and starts afresh on reschedule;
7. never changes reference counts.

``test_regression_*`` replays the historic bug (a tracker that memoised a waiting sequence's
first answer: after a first pass with no hits, every later pass reported nothing computed) with a
small scheduler over a batch sharing a long prefix, compares computed-token totals (never wall
time), and shows that a memoising tracker fails it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from kvpool._errors import HAVE_CORE, DtypeError, HashWidthError, InvalidArgumentError
from kvpool.reference import BlockPool as ReferencePool
from kvpool.reference import ComputedBlocksTracker as ReferenceTracker
from kvpool.reference import hashing as ref

if HAVE_CORE:
    import kvpool._core as core
    from kvpool._core import DuplicateRequestError, UnknownRequestError
else:  # pragma: no cover
    core = None
    from kvpool.reference.tracker import DuplicateRequestError, UnknownRequestError

_needs_core = pytest.mark.skipif(not HAVE_CORE, reason="kvpool._core is not built")
IMPLS = [
    pytest.param(("rust", "rust"), id="rust", marks=_needs_core),
    pytest.param(("reference", "reference"), id="reference"),
    pytest.param(("reference", "rust"), id="reference-over-rust-pool", marks=_needs_core),
]


def as_list(hashes: Any) -> list[bytes]:
    return hashes.to_list() if hasattr(hashes, "to_list") else list(hashes)


class Env:
    """A pool and a tracker over it, with the scheduler-side helpers the tests need."""

    def __init__(self, impl: tuple[str, str], num_blocks: int = 64, block_size: int = 4,
                 enable_caching: bool = True, **tracker_kwargs: Any) -> None:
        tracker_impl, pool_impl = impl
        pool_cls = core.BlockPool if pool_impl == "rust" else ReferencePool
        self.tracker_cls = core.ComputedBlocksTracker if tracker_impl == "rust" else ReferenceTracker
        self.pool = pool_cls(num_blocks, block_size=block_size, enable_events=True, enable_caching=enable_caching)
        self.tracker = self.tracker_cls(self.pool, block_size, **tracker_kwargs)
        self.bs = block_size

    def hashes(self, seq_id: Any) -> list[bytes]:
        return as_list(self.tracker.get_block_hashes(seq_id))

    def compute(self, seq_id: Any, num_tokens: int | None = None) -> list[int]:
        """Allocate blocks for the first ``num_tokens`` tokens of ``seq_id`` (all by default) and
        cache the full ones, as the step computing them would; returns the block ids."""
        n = len(self.tracker.get_token_ids(seq_id)) if num_tokens is None else num_tokens
        ids = self.pool.get_new_blocks(math.ceil(n / self.bs)).tolist()
        self.pool.cache_full_blocks(ids, self.hashes(seq_id), 0, n // self.bs)
        return ids

    def cache_hashes(self, hashes: list[bytes]) -> list[int]:
        """Cache one new block under each of ``hashes`` (any hashes, not necessarily a chain)."""
        ids = self.pool.get_new_blocks(len(hashes)).tolist()
        self.pool.cache_full_blocks(ids, hashes, 0, len(hashes))
        return ids

    def snapshot(self) -> Any:
        return (self.pool.ref_counts().tolist(), self.pool.free_block_ids().tolist(),
                self.pool.get_num_cached_blocks(), [self.pool.block_hash(i) for i in range(self.pool.num_blocks)])


@pytest.fixture(params=IMPLS)
def impl(request: pytest.FixtureRequest) -> tuple[str, str]:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def env(impl: tuple[str, str]) -> Env:
    return Env(impl)


# --------------------------------------------------------------------------------------------
# Invariant 1: full blocks only, block-aligned, never the last prompt token.
# --------------------------------------------------------------------------------------------


def test_inv1_counts_full_blocks_only(env: Env) -> None:
    env.tracker.add_sequence("writer", range(12))
    env.compute("writer")
    env.tracker.add_sequence("a", range(10))  # blocks [0..4) and [4..8) are full; 8, 9 are not
    assert env.tracker.get_num_cached_tokens("a") == 8


def test_inv1_never_the_last_prompt_token(env: Env) -> None:
    env.tracker.add_sequence("writer", range(20))
    env.compute("writer")
    env.tracker.add_sequence("exact", range(12))  # exactly 3 cached blocks: the last token is recomputed
    env.tracker.add_sequence("one-more", range(13))
    assert env.tracker.get_num_cached_tokens("exact") == 8
    assert env.tracker.get_num_cached_tokens("one-more") == 12
    assert env.tracker.start("exact") == 8


def test_inv1_block_aligned_and_below_the_prompt_length(env: Env) -> None:
    env.tracker.add_sequence("writer", range(40))
    env.compute("writer")
    for n in range(0, 30):
        env.tracker.add_sequence(n, range(n))
        count = env.tracker.get_num_cached_tokens(n)
        assert count % env.bs == 0 and count <= max(n - 1, 0)
        assert count == ((n - 1) // env.bs) * env.bs if n else count == 0


# --------------------------------------------------------------------------------------------
# Invariant 2: a prefix of the blocks.
# --------------------------------------------------------------------------------------------


def test_inv2_counts_a_prefix_stopping_at_the_first_miss(env: Env) -> None:
    env.tracker.add_sequence("a", range(21))  # 5 full blocks
    h = env.hashes("a")
    env.cache_hashes([h[1], h[3]])
    assert env.tracker.get_num_cached_tokens("a") == 0  # block 0 missing: nothing counts
    env.cache_hashes([h[0]])
    assert env.tracker.get_num_cached_tokens("a") == 8  # blocks 0, 1; block 2 missing
    env.cache_hashes([h[2], h[4]])
    assert env.tracker.get_num_cached_tokens("a") == 20


# --------------------------------------------------------------------------------------------
# Invariant 3: only blocks whose KV is present or will be written before it is read.
# --------------------------------------------------------------------------------------------


def test_inv3_allocated_but_uncached_blocks_do_not_count(env: Env) -> None:
    env.tracker.add_sequence("writer", range(12))
    env.pool.get_new_blocks(3)  # allocated, never cached (KV not known to hold these tokens)
    env.tracker.add_sequence("a", range(12))
    assert env.tracker.get_num_cached_tokens("a") == 0


def test_inv3_evicted_blocks_stop_counting(env: Env) -> None:
    env.tracker.add_sequence("writer", range(12))
    ids = env.compute("writer")
    env.tracker.add_sequence("a", range(13))
    assert env.tracker.get_num_cached_tokens("a") == 12
    env.pool.evict_blocks([ids[1]])
    assert env.tracker.get_num_cached_tokens("a") == 4


def test_inv3_freed_blocks_count_until_reused(env: Env) -> None:
    env.tracker.add_sequence("writer", range(12))
    ids = env.compute("writer")
    env.pool.free_blocks(ids[::-1])  # still cached, at the tail of the free queue
    env.tracker.add_sequence("a", range(13))
    assert env.tracker.get_num_cached_tokens("a") == 12
    env.pool.get_new_blocks(env.pool.get_num_free_blocks())  # reuses (and evicts) every free block
    assert env.tracker.get_num_cached_tokens("a") == 0


def test_inv3_reset_prefix_cache(env: Env) -> None:
    env.tracker.add_sequence("writer", range(12))
    env.pool.free_blocks(env.compute("writer")[::-1])
    env.tracker.add_sequence("a", range(13))
    assert env.tracker.get_num_cached_tokens("a") == 12
    assert env.pool.reset_prefix_cache()
    assert env.tracker.get_num_cached_tokens("a") == 0


def test_inv3_other_groups_do_not_count(env: Env) -> None:
    env.tracker.add_sequence("a", range(13))
    ids = env.pool.get_new_blocks(3)
    env.pool.cache_full_blocks(ids, env.hashes("a"), 0, 3, group_id=1)
    assert env.tracker.get_num_cached_tokens("a") == 0


def test_inv3_caching_off_counts_nothing(impl: tuple[str, str]) -> None:
    env = Env(impl, enable_caching=False)
    env.tracker.add_sequence("a", range(13))
    assert env.tracker.get_num_cached_tokens("a") == 0
    assert env.tracker.start("a") == 0


def test_inv3_blocks_of_other_extra_keys_do_not_count(env: Env) -> None:
    env.tracker.add_sequence("writer", range(12), cache_salt="tenant-1", lora=("l1", "/p/l1"))
    env.compute("writer")
    env.tracker.add_sequence("no-salt", range(13), lora=("l1", "/p/l1"))
    env.tracker.add_sequence("other-path", range(13), cache_salt="tenant-1", lora=("l1", "/p/other"))
    env.tracker.add_sequence("same", range(13), cache_salt="tenant-1", lora=("l1", "/p/l1"))
    assert env.tracker.get_num_cached_tokens("no-salt") == 0
    assert env.tracker.get_num_cached_tokens("other-path") == 0
    assert env.tracker.get_num_cached_tokens("same") == 12


# --------------------------------------------------------------------------------------------
# Invariant 4: fixed at start; blocks others computed while it waited count.
# --------------------------------------------------------------------------------------------


def test_inv4_waiting_count_is_looked_up_afresh(env: Env) -> None:
    env.tracker.add_sequence("a", range(13))
    env.tracker.add_sequence("writer", range(12))
    assert env.tracker.get_num_cached_tokens("a") == 0  # first pass: nothing cached
    env.compute("writer", 8)
    assert env.tracker.get_num_cached_tokens("a") == 8  # not memoised
    env.tracker.append_tokens("writer", [99])
    env.compute("writer")
    assert env.tracker.get_num_cached_tokens("a") == 12
    assert env.tracker.start("a") == 12


def test_inv4_own_chunks_never_inflate_the_count(env: Env) -> None:
    env.tracker.add_sequence("a", range(17))
    assert env.tracker.start("a") == 0
    blocks: list[int] = []
    for done in (8, 16, 17):  # chunked prefill, each chunk's full blocks cached
        blocks += env.pool.get_new_blocks(math.ceil(done / env.bs) - len(blocks)).tolist()
        cached = sum(env.pool.block_hash(b) is not None for b in blocks)
        env.pool.cache_full_blocks(blocks, env.hashes("a"), cached, done // env.bs)
        assert env.tracker.get_num_cached_tokens("a") == 0
        assert env.tracker.is_started("a")


def test_inv4_fixed_count_ignores_later_changes_of_the_pool(env: Env) -> None:
    env.tracker.add_sequence("writer", range(16))
    ids = env.compute("writer", 8)
    env.tracker.add_sequence("a", range(17))
    assert env.tracker.start("a") == 8
    env.cache_hashes(env.hashes("writer")[2:4])  # more of a's prefix appears: not counted
    assert env.tracker.get_num_cached_tokens("a") == 8
    env.pool.evict_blocks(ids)  # a's hits disappear: still fixed (a holds them in a real engine)
    assert env.tracker.get_num_cached_tokens("a") == 8
    assert env.tracker.start("a") == 8  # starting again keeps the first count
    assert env.tracker.get_num_cached_tokens_many(["a"]).tolist() == [8]


def test_inv4_start_many_fixes_each_count(env: Env) -> None:
    env.tracker.add_sequence("writer", range(16))
    env.compute("writer")
    env.tracker.add_sequence("a", range(9))
    env.tracker.add_sequence("b", range(17))
    env.tracker.add_sequence(7, [1000, 1001])
    counts = env.tracker.start_many(["a", "b", 7, "a"])
    assert counts.dtype == np.int64 and counts.tolist() == [8, 16, 0, 8]
    assert all(env.tracker.is_started(s) for s in ("a", "b", 7))


# --------------------------------------------------------------------------------------------
# Invariant 5: incremental hashes, exactly the pool's hash chain.
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algo", [None, *ref.HASH_ALGOS])
@pytest.mark.parametrize("seed", [None, "0"])
def test_inv5_hashes_are_the_hash_chain(impl: tuple[str, str], algo: str | None, seed: str | None) -> None:
    env = Env(impl, hash_algo=algo, seed=seed)
    assert env.tracker.hash_algo == (algo or "sha256_cbor") and env.tracker.block_size == 4
    extras: dict[str, Any] = dict(lora=("my-lora", "/adapters/x"), cache_salt="salt-1",
                                  mm_features=[("img-1", 3, 6), ("img-2", 10, 2)],
                                  prompt_embed_digests=[bytes([k]) * 32 for k in range(8)])
    tokens = [7 * k % 1000 for k in range(30)]
    for name, kwargs in (("plain", {}), ("extras", extras)):
        env.tracker.add_sequence(name, tokens, **kwargs)
        hasher = ref.BlockHasher(4, hash_algo=algo, seed=seed)
        assert env.hashes(name) == hasher.hash_tokens(tokens, **kwargs)
        if HAVE_CORE:
            assert env.hashes(name) == core.BlockHasher(4, hash_algo=algo, seed=seed).hash_tokens(
                tokens, **kwargs).to_list()
        assert env.tracker.get_token_ids(name).tolist() == tokens


@pytest.mark.parametrize("chunks", [[1] * 20, [3, 5, 0, 9, 4], [16, 1, 1, 1], [0, 19]])
def test_inv5_append_only_and_equal_to_hashing_at_once(env: Env, chunks: list[int]) -> None:
    tokens = list(range(100, 120))
    extras: dict[str, Any] = dict(lora=("lora-x", "/x"), mm_features=[("image", 2, 7), ("video", 12, 3)])
    env.tracker.add_sequence("a", [], **extras)
    env.tracker.add_sequence("b", [])
    pos = 0
    for n in chunks:
        chunk = tokens[pos:pos + n]
        before = env.hashes("a")
        added = env.tracker.append_tokens("a", chunk)
        env.tracker.append_tokens_many(["b"], np.array(chunk, dtype=np.int64), [0, len(chunk)])
        pos += len(chunk)
        after = env.hashes("a")
        assert after[: len(before)] == before and added == len(after) - len(before)
    hasher = ref.BlockHasher(4)
    assert env.hashes("a") == hasher.hash_tokens(tokens[:pos], **extras)
    assert env.hashes("b") == hasher.hash_tokens(tokens[:pos])


def test_inv5_append_tokens_many_one_token_each(env: Env) -> None:
    env.tracker.add_sequence("a", range(7))
    env.tracker.add_sequence("b", range(3))
    env.tracker.append_tokens_many(["a", "b", "a"], [7, 3, 8])
    assert env.tracker.get_token_ids("a").tolist() == list(range(9))
    assert env.tracker.get_token_ids("b").tolist() == list(range(4))
    assert env.hashes("a") == ref.BlockHasher(4).hash_tokens(range(9))


def test_inv5_trackers_sharing_a_pool_see_each_others_blocks(impl: tuple[str, str]) -> None:
    env = Env(impl, hash_algo="sha256")
    env.tracker.add_sequence("writer", range(12))
    env.compute("writer")
    same = env.tracker_cls(env.pool, 4, hash_algo="sha256")
    other_seed = env.tracker_cls(env.pool, 4, hash_algo="sha256", seed="another")
    other_width = env.tracker_cls(env.pool, 4, hash_algo="xxhash")
    for t in (same, other_seed, other_width):
        t.add_sequence("a", range(13))
    assert same.get_num_cached_tokens("a") == 12
    assert other_seed.get_num_cached_tokens("a") == 0
    with pytest.raises(HashWidthError):  # the pool holds 32-byte hashes
        other_width.get_num_cached_tokens("a")


# --------------------------------------------------------------------------------------------
# Invariant 6: state dropped on free or preemption.
# --------------------------------------------------------------------------------------------


def test_inv6_reset_forgets_the_fixed_count(env: Env) -> None:
    env.tracker.add_sequence("writer", range(12))
    ids = env.compute("writer")
    env.tracker.add_sequence("a", range(13))
    hashes, tokens = env.hashes("a"), env.tracker.get_token_ids("a").tolist()
    assert env.tracker.start("a") == 12
    env.pool.evict_blocks(ids)
    assert env.tracker.get_num_cached_tokens("a") == 12
    env.tracker.reset_sequence("a")  # preempted
    assert not env.tracker.is_started("a")
    assert env.tracker.get_num_cached_tokens("a") == 0  # looked up afresh
    assert env.hashes("a") == hashes and env.tracker.get_token_ids("a").tolist() == tokens


def test_inv6_rescheduled_sequence_counts_its_own_cached_blocks(env: Env) -> None:
    env.tracker.add_sequence("a", range(13))
    assert env.tracker.start("a") == 0
    ids = env.compute("a")  # its prefill cached 3 full blocks
    env.tracker.append_tokens("a", [500, 501])  # decoded two tokens
    env.pool.free_blocks(ids[::-1])  # preempted: blocks freed, still cached
    env.tracker.reset_sequence("a")
    assert env.tracker.get_num_cached_tokens("a") == 12  # recomputes from block 3 on


def test_inv6_remove_then_add_again_starts_afresh(env: Env) -> None:
    env.tracker.add_sequence("a", range(9))
    env.tracker.add_sequence(1, range(5))
    assert env.tracker.start("a") == 0
    env.tracker.remove_sequence("a")
    assert "a" not in env.tracker and 1 in env.tracker and len(env.tracker) == 1
    with pytest.raises(UnknownRequestError):
        env.tracker.get_num_cached_tokens("a")
    env.tracker.add_sequence("writer", range(9))
    env.compute("writer")
    env.tracker.add_sequence("a", range(9))
    assert not env.tracker.is_started("a")
    assert env.tracker.get_num_cached_tokens("a") == 8


# --------------------------------------------------------------------------------------------
# Invariant 7: reference counts never change.
# --------------------------------------------------------------------------------------------


def test_inv7_never_changes_the_pool(env: Env) -> None:
    env.tracker.add_sequence("writer", range(16))
    ids = env.compute("writer")
    env.pool.free_blocks(ids[2:][::-1])  # two blocks in use, two free but cached
    env.pool.take_events()
    before = env.snapshot()
    t = env.tracker
    t.add_sequence("a", range(17))
    t.add_sequence("b", range(9))
    calls: list[Callable[[], Any]] = [
        lambda: t.get_num_cached_tokens("a"), lambda: t.get_num_cached_tokens_many(["a", "b"]),
        lambda: t.start("a"), lambda: t.start_many(["a", "b"]), lambda: t.append_tokens("a", [1, 2, 3]),
        lambda: t.append_tokens_many(["a", "b"], [4, 5]), lambda: t.get_block_hashes("a"),
        lambda: t.get_token_ids("b"), lambda: t.is_started("a"), lambda: t.reset_sequence("a"),
        lambda: t.get_num_cached_tokens("a"), lambda: t.remove_sequence("b"), lambda: "a" in t, lambda: len(t),
    ]
    for call in calls:
        call()
        assert env.snapshot() == before
    assert env.pool.take_events() == []
    env.pool.check_invariants()


# --------------------------------------------------------------------------------------------
# The historic bug: a batch sharing a prefix, prefilled in chunks over several passes.
# --------------------------------------------------------------------------------------------

BLOCK_SIZE = 16
PREFIX_LEN = 1000
UNIQUE_LEN = 40
BATCH = 12
TOKEN_BUDGET = 512  # tokens per scheduler pass, across the batch
PREFIX_BLOCKS = PREFIX_LEN // BLOCK_SIZE  # 62 full blocks of shared prefix (992 tokens)


def batch_prompts(n: int) -> list[list[int]]:
    prefix = [(7919 * k) % 32000 for k in range(PREFIX_LEN)]
    return [prefix + [40000 + 100 * r + k for k in range(UNIQUE_LEN)] for r in range(n)]


@dataclass
class SimRequest:
    rid: str
    prompt: list[int]
    computed: int = 0  # tokens whose KV exists (prefix hits + computed chunks)
    blocks: list[int] = field(default_factory=list)
    num_cached_blocks: int = 0  # leading blocks already in the prefix cache
    started_pass: int | None = None
    hit_tokens: int | None = None  # what the tracker reported at start
    expected_hit: int | None = None  # the same, looked up independently of the tracker


@dataclass
class BatchRun:
    requests: list[SimRequest]
    passes: int
    computed_tokens: int  # tokens the batch actually computed (prompt tokens minus prefix hits)
    waiting_queries: list[dict[str, int]]  # per pass: get_num_cached_tokens of every waiting request


def run_batch(pool: Any, tracker: Any, prompts: list[list[int]], budget: int = TOKEN_BUDGET) -> BatchRun:
    """Schedule ``prompts`` as vLLM's scheduler does with chunked prefill: each pass, running
    requests continue first, then waiting requests start in order while the token budget lasts.
    A waiting request is looked up (``get_num_cached_tokens``) every pass; when it starts, the
    tracker fixes its count, the scheduler touches its hit blocks, and each chunk allocates its
    blocks and caches the blocks it fills (before any later pass reads them)."""
    bs = tracker.block_size
    checker = ref.BlockHasher(bs, hash_algo=tracker.hash_algo)
    reqs = [SimRequest(f"req-{i}", p) for i, p in enumerate(prompts)]
    for r in reqs:
        tracker.add_sequence(r.rid, r.prompt)
    waiting, running = deque(reqs), []
    computed_tokens, passes, queries = 0, 0, []

    def run_chunk(r: SimRequest, n: int) -> None:
        nonlocal computed_tokens
        total = r.computed + n
        r.blocks += pool.get_new_blocks(math.ceil(total / bs) - len(r.blocks)).tolist()
        num_full = total // bs
        pool.cache_full_blocks(r.blocks, as_list(tracker.get_block_hashes(r.rid)), r.num_cached_blocks, num_full)
        r.num_cached_blocks, r.computed = num_full, total
        computed_tokens += n

    while waiting or running:
        passes += 1
        budget_left = budget
        for r in list(running):
            if budget_left == 0:
                break
            n = min(budget_left, len(r.prompt) - r.computed)
            run_chunk(r, n)
            budget_left -= n
            if r.computed == len(r.prompt):
                running.remove(r)
        queries.append({r.rid: tracker.get_num_cached_tokens(r.rid) for r in waiting})
        while waiting and budget_left > 0:
            r = waiting.popleft()
            max_blocks = (len(r.prompt) - 1) // bs
            r.expected_hit = bs * len(pool.find_longest_cache_hit(checker.hash_tokens(r.prompt), max_blocks=max_blocks))
            r.hit_tokens = tracker.start(r.rid)
            r.started_pass = passes
            hits = pool.find_longest_cache_hit(as_list(tracker.get_block_hashes(r.rid)),
                                               max_blocks=r.hit_tokens // bs)
            pool.touch(hits)
            r.blocks, r.computed, r.num_cached_blocks = hits.tolist(), r.hit_tokens, len(hits)
            n = min(budget_left, len(r.prompt) - r.computed)
            run_chunk(r, n)
            budget_left -= n
            if r.computed < len(r.prompt):
                running.append(r)
    for r in reqs:
        pool.free_blocks(r.blocks[::-1])
        tracker.remove_sequence(r.rid)
    return BatchRun(reqs, passes, computed_tokens, queries)


def check_batch_shares_the_prefix(make_env: Callable[[], Env], wrap: Callable[[Any], Any] = lambda t: t) -> None:
    """The regression test proper; ``wrap`` substitutes a tracker (to show the test bites)."""
    one_env, batch_env = make_env(), make_env()
    one = run_batch(one_env.pool, wrap(one_env.tracker), batch_prompts(1))
    run = run_batch(batch_env.pool, wrap(batch_env.tracker), batch_prompts(BATCH))
    prompt_len = PREFIX_LEN + UNIQUE_LEN

    assert one.computed_tokens == prompt_len
    assert run.passes >= 3, "the budget must split the batch's prefill over several passes"
    assert set(run.waiting_queries[0].values()) == {0}, "first pass: nothing is cached yet"
    for p, queries in enumerate(run.waiting_queries[1:], start=2):
        for rid, count in queries.items():
            assert count > 0, f"pass {p}: {rid} reports nothing computed although the prefix is being cached"
    later = [r for r in run.requests if r.started_pass and r.started_pass >= 2]
    assert later, "some requests must start after the first pass"
    for r in later:
        assert r.hit_tokens == r.expected_hit == PREFIX_BLOCKS * BLOCK_SIZE, (
            f"{r.rid} started on pass {r.started_pass} with {r.hit_tokens} computed tokens, "
            f"expected the {PREFIX_BLOCKS} cached prefix blocks ({r.expected_hit} tokens by lookup)"
        )
    # A batch of N costs about N * unique + prefix computed tokens: the prefix once, then each
    # request its own tokens (plus the partial prefix block it shares with them).
    per_request = (run.computed_tokens - one.computed_tokens) / (BATCH - 1)
    assert per_request <= UNIQUE_LEN + BLOCK_SIZE, f"{per_request:.0f} computed tokens per extra request"
    assert run.computed_tokens <= PREFIX_LEN + BATCH * (UNIQUE_LEN + BLOCK_SIZE)
    for e in (one_env, batch_env):
        e.pool.check_invariants()
        assert e.pool.get_num_free_blocks() == e.pool.num_blocks - 1 and len(e.tracker) == 0


class MemoisingTracker:
    """The historic bug: a waiting sequence's first answer is memoised and reused at start."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._memo: dict[Any, int] = {}

    def get_num_cached_tokens(self, seq_id: Any) -> int:
        if seq_id not in self._memo:
            self._memo[seq_id] = self._inner.get_num_cached_tokens(seq_id)
        return self._memo[seq_id]

    def start(self, seq_id: Any) -> int:
        return self.get_num_cached_tokens(seq_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def make_regression_env(impl: tuple[str, str]) -> Callable[[], Env]:
    return lambda: Env(impl, num_blocks=1024, block_size=BLOCK_SIZE)


def test_regression_batch_shares_prefix_across_chunked_prefill_passes(impl: tuple[str, str]) -> None:
    check_batch_shares_the_prefix(make_regression_env(impl))


def test_regression_test_fails_for_a_memoising_tracker(impl: tuple[str, str]) -> None:
    with pytest.raises(AssertionError, match="reports nothing computed"):
        check_batch_shares_the_prefix(make_regression_env(impl), wrap=MemoisingTracker)
    env = make_regression_env(impl)()
    run = run_batch(env.pool, MemoisingTracker(env.tracker), batch_prompts(BATCH))
    assert run.computed_tokens == BATCH * (PREFIX_LEN + UNIQUE_LEN)  # every request recomputes the prefix


# --------------------------------------------------------------------------------------------
# Errors.
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda t: t.append_tokens("nope", [1]),
        lambda t: t.append_tokens_many(["a", "nope"], [1, 2]),
        lambda t: t.get_num_cached_tokens("nope"),
        lambda t: t.get_num_cached_tokens_many(["a", "nope"]),
        lambda t: t.start("nope"),
        lambda t: t.start_many(["a", "nope"]),
        lambda t: t.is_started("nope"),
        lambda t: t.get_block_hashes("nope"),
        lambda t: t.get_token_ids(1),  # the int 1, not the str "1"
        lambda t: t.reset_sequence("nope"),
        lambda t: t.remove_sequence("nope"),
    ],
)
def test_unknown_ids(env: Env, call: Callable[[Any], Any]) -> None:
    env.tracker.add_sequence("a", range(6))
    env.tracker.add_sequence("1", range(6))
    with pytest.raises(UnknownRequestError):
        call(env.tracker)
    assert issubclass(UnknownRequestError, KeyError)
    # all-or-nothing: "a" got no tokens and did not start
    assert env.tracker.get_token_ids("a").tolist() == list(range(6)) and not env.tracker.is_started("a")


def test_duplicate_ids(env: Env) -> None:
    env.tracker.add_sequence("a", range(6))
    env.tracker.add_sequence(1, range(3))
    env.tracker.add_sequence("1", range(2))  # str and int ids are distinct
    for seq_id in ("a", 1, np.int64(1), "1"):
        with pytest.raises(DuplicateRequestError):
            env.tracker.add_sequence(seq_id, [9, 9, 9])
    assert issubclass(DuplicateRequestError, ValueError)
    assert env.tracker.get_token_ids(1).tolist() == [0, 1, 2] and len(env.tracker) == 3


BAD_TOKENS = [[1.0], [1, "2"], "abc", b"abc", None, 3, np.array([1.5]), np.array([True]), np.zeros((1, 2), dtype=int)]


@pytest.mark.parametrize("tokens", BAD_TOKENS, ids=repr)
def test_bad_token_dtypes(env: Env, tokens: Any) -> None:
    env.tracker.add_sequence("a", range(6))
    with pytest.raises(DtypeError):
        env.tracker.add_sequence("b", tokens)
    with pytest.raises(DtypeError):
        env.tracker.append_tokens("a", tokens)
    with pytest.raises(DtypeError):
        env.tracker.append_tokens_many(["a"], tokens, [0, 1])
    assert "b" not in env.tracker and env.tracker.get_token_ids("a").tolist() == list(range(6))


@pytest.mark.parametrize("tokens", [[2**63], [-(2**63) - 1], np.array([2**64 - 1], dtype=np.uint64)], ids=repr)
def test_token_ids_beyond_int64(env: Env, tokens: Any) -> None:
    with pytest.raises(InvalidArgumentError):
        env.tracker.add_sequence("b", tokens)


@pytest.mark.parametrize("seq_id", [1.5, None, True, np.bool_(False), b"a", ("a",)], ids=repr)
def test_bad_id_types(env: Env, seq_id: Any) -> None:
    with pytest.raises(DtypeError):
        env.tracker.add_sequence(seq_id, [1])
    with pytest.raises(DtypeError):
        seq_id in env.tracker  # noqa: B015
    assert len(env.tracker) == 0


def test_int_id_beyond_int64(env: Env) -> None:
    with pytest.raises(InvalidArgumentError):
        env.tracker.add_sequence(2**64, [1])


def test_ids_sequence_arguments(env: Env) -> None:
    env.tracker.add_sequence("a", range(6))
    with pytest.raises(DtypeError):
        env.tracker.start_many("a")  # one str is not a sequence of ids
    with pytest.raises(DtypeError):
        env.tracker.get_num_cached_tokens_many(5)
    assert env.tracker.start_many(("a",)).tolist() == [0]


def test_unsorted_mm_features(env: Env) -> None:
    with pytest.raises(InvalidArgumentError, match="sorted"):
        env.tracker.add_sequence("a", range(20), mm_features=[("img-b", 8, 2), ("img-a", 2, 3)])
    assert "a" not in env.tracker
    env.tracker.add_sequence("a", range(20), mm_features=[("img-a", 2, 3), ("img-b", 2, 2)])  # ties are sorted


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [(dict(lora=["n", "p"]), DtypeError), (dict(cache_salt=1), DtypeError),
     (dict(mm_features=[("img", -1, 2)]), InvalidArgumentError),
     (dict(prompt_embed_digests=[b"short"]), HashWidthError)],
    ids=repr,
)
def test_bad_extra_keys(env: Env, kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        env.tracker.add_sequence("a", range(8), **kwargs)
    assert "a" not in env.tracker


def test_append_tokens_many_bad_segments(env: Env) -> None:
    env.tracker.add_sequence("a", range(3))
    env.tracker.add_sequence("b", range(3))
    for args in (([1, 2, 3],), ([1, 2], [0, 1]), ([1, 2], [0, 2, 1]), ([1, 2], [0, 1, 3]), ([1, 2], [0, -1, 2])):
        with pytest.raises(InvalidArgumentError):
            env.tracker.append_tokens_many(["a", "b"], *args)
    with pytest.raises(DtypeError):
        env.tracker.append_tokens_many(["a", "b"], [1, 2], [0, 1.0, 2])
    assert env.tracker.get_token_ids("a").tolist() == [0, 1, 2]
    env.tracker.append_tokens_many([], [])
    env.tracker.append_tokens_many(["a", "b"], [5, 6, 7], np.array([0, 0, 3]))
    assert env.tracker.get_token_ids("b").tolist() == [0, 1, 2, 5, 6, 7]


@pytest.mark.parametrize(("kwargs", "error"), [(dict(block_size=0), InvalidArgumentError),
                                               (dict(block_size=1.5), DtypeError),
                                               (dict(hash_algo="md5"), InvalidArgumentError)], ids=repr)
def test_bad_constructor_arguments(impl: tuple[str, str], kwargs: dict[str, Any], error: type[Exception]) -> None:
    env = Env(impl)
    args = dict(block_size=4) | kwargs
    with pytest.raises(error):
        env.tracker_cls(env.pool, args.pop("block_size"), **args)
