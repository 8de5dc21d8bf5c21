"""``kvpool.GroupTables`` against vLLM 0.33's own ``KVCacheManager`` over its hybrid
coordinator (``HybridKVCacheCoordinator`` with ``FullAttentionManager``,
``SlidingWindowManager`` and ``ChunkedLocalAttentionManager``), step by step.

Each random workload admits requests that share prefixes, looks up their prefix hits,
prefills them in chunks, decodes, lets the pool run short (refused allocations),
finishes requests and resets the prefix cache now and then; both sides get the same
calls. After every call the hit (per-group blocks, tokens, shared-prefix boundary), the
allocation (per-group new blocks or a refusal), every live request's per-group table,
the free-block count and the KV events must be equal. Layouts: Gemma-style five
sliding-window groups of 1,024 tokens beside one full group, gpt-oss-style alternating
128-token windows and full attention, chunked local attention beside full attention;
retention off (dense) and on (sparse segments, and replay boundaries only).
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

import kvpool  # noqa: E402

LAYOUTS: dict[str, tuple[int, list[Any]]] = {
    "gemma 5x swa1024 + full": (16, [("sliding_window", 1024)] * 5 + ["full"]),
    "gpt-oss swa128 / full": (16, [("sliding_window", 128), "full", ("sliding_window", 128), "full"]),
    "chunked local 64 + full": (16, [("chunked_local", 64), "full"]),
    "small windows": (4, [("sliding_window", 12), "full", ("sliding_window", 9)]),
    # Groups of larger blocks than the hash granularity (a third item): vLLM views the
    # hashes at each group's size, aligns hits to the least common block size and caches
    # a full-attention group's partial prompt tail under an extra key.
    "full32 + swa16, hashes of 16": (16, [("full", None, 32), ("sliding_window", 64, 16)]),
    "swa32 + full16 + chunked32": (16, [("sliding_window", 96, 32), "full", ("chunked_local", 64, 32)]),
}


def group_block_size(group: Any, hash_block_size: int) -> int:
    """A layout group's block size: its third item, else the hash granularity."""
    return group[2] if isinstance(group, tuple) and len(group) == 3 else hash_block_size


def vllm_manager(block_size: int, groups: list[Any], num_blocks: int, retention: int | None,
                 max_model_len: int, caching: bool, max_in_flight_tokens: int | None = None) -> Any:
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        SlidingWindowSpec,
    )

    specs = []
    for g in groups:
        common = dict(block_size=group_block_size(g, block_size), num_kv_heads=1, head_size=1, dtype=torch.float32)
        if g == "full" or g[0] == "full":
            specs.append(FullAttentionSpec(**common))
        elif g[0] == "sliding_window":
            specs.append(SlidingWindowSpec(**common, sliding_window=g[1]))
        else:
            specs.append(ChunkedLocalAttentionSpec(**common, attention_chunk_size=g[1]))
    config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec([f"layer{i}"], s) for i, s in enumerate(specs)],
        prefix_cache_retention_interval=retention,
    )
    scheduler_block_size = math.lcm(*(s.block_size for s in specs))
    return KVCacheManager(config, max_model_len=max_model_len, scheduler_block_size=scheduler_block_size,
                          hash_block_size=block_size, enable_caching=caching, enable_kv_cache_events=True,
                          max_in_flight_tokens=max_in_flight_tokens)


def make_request(rid: str, prompt: list[int], block_size: int) -> Any:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    params = SamplingParams(max_tokens=10_000)
    params.update_from_generation_config({}, eos_token_id=100_000)
    return Request(request_id=rid, prompt_token_ids=prompt, mm_features=None, sampling_params=params,
                   pooling_params=None, lora_request=None, cache_salt=None,
                   block_hasher=get_request_block_hasher(block_size, sha256))


def ids(blocks: Any) -> list[list[int]]:
    """vLLM's per-group blocks (KVCacheBlocks or a tuple of lists) as ids."""
    groups = blocks.blocks if hasattr(blocks, "blocks") else blocks
    return [[b.block_id for b in g] for g in groups]


def vllm_events(events: list[Any]) -> list[tuple[Any, ...]]:
    out = []
    for e in events:
        name = type(e).__name__
        if name == "BlockStored":
            out.append((name, list(e.block_hashes), e.parent_block_hash, list(e.token_ids), e.block_size,
                        e.group_idx))
        elif name == "BlockRemoved":
            out.append((name, list(e.block_hashes), e.group_idx))
        else:
            out.append((name,))
    return out


def as_int(h: bytes | None) -> int | None:
    return None if h is None else int.from_bytes(h[-8:], "big")


def kvpool_events(events: list[Any]) -> list[tuple[Any, ...]]:
    out = []
    for e in events:
        name = type(e).__name__
        if name == "BlockStored":
            out.append((name, [as_int(h) for h in e.block_hashes], as_int(e.parent_block_hash), list(e.token_ids),
                        e.block_size, e.group_idx))
        elif name == "BlockRemoved":
            out.append((name, [as_int(h) for h in e.block_hashes], e.group_idx))
        else:
            out.append((name,))
    return out


#: What the workloads exercised, so that a test that compares nothing cannot pass.
SEEN = {"hit_tokens": 0, "null_hit_blocks": 0, "refused": 0, "window_frees": 0, "stored": 0, "removed": 0,
        "gated": 0}


class Pair:
    """vLLM's manager and kvpool's tables, fed the same calls, compared after each."""

    def __init__(self, block_size: int, groups: list[Any], num_blocks: int, retention: int | None,
                 caching: bool, max_model_len: int, gates: random.Random | None = None) -> None:
        self.block_size = block_size
        # With gates, a small in-flight budget, so that window groups' admission caps bind.
        in_flight = gates.choice([block_size, 4 * block_size, 16 * block_size]) if gates else None
        self.vllm = vllm_manager(block_size, groups, num_blocks, retention, max_model_len, caching, in_flight)
        self.pool = kvpool.BlockPool(num_blocks, block_size=block_size, enable_caching=caching,
                                     enable_events=True, null_block=True)
        self.tables = kvpool.GroupTables(self.pool, groups, max_model_len=max_model_len,
                                         retention_interval=retention, max_in_flight_tokens=in_flight)
        # kvpool's own manager, which keeps the tokens itself, fed the same calls; with
        # ``gates`` (the full-sequence gate, reserved blocks, lookahead drawn at random) the
        # tables alone, since the manager has no gates.
        self.gates = gates
        self.manager = None if gates else kvpool.GroupManager(
            num_blocks, block_size, groups, enable_caching=caching, hash_algo="sha256", enable_events=True,
            max_model_len=max_model_len, retention_interval=retention)
        self.caching = caching
        self.steps = 0
        self.added: set[str] = set()
        #: Every event compared so far.
        self.log: list[tuple[Any, ...]] = []

    def hit(self, req: Any) -> tuple[Any, list[list[int]] | None, int]:
        theirs, n, boundary = self.vllm.get_computed_blocks(req)
        if not self.caching or req.skip_reading_prefix_cache:
            ours_blocks, ours_n, uncached = [[] for _ in ids(theirs)], 0, 0
        else:
            blocks, ours_n, uncached = self.tables.find_longest_cache_hit(req.block_hashes, req.num_tokens - 1)
            ours_blocks = [b.tolist() for b in blocks]
        ours_boundary = ours_n + uncached if uncached else 0
        assert (ids(theirs), n, boundary) == (ours_blocks, ours_n, ours_boundary), req.request_id
        if self.manager is not None:
            if req.request_id not in self.added:
                self.manager.add_request(req.request_id, req.prompt_token_ids)
                self.added.add(req.request_id)
            blocks, managed_n = self.manager.get_computed_blocks(req.request_id)
            assert ([b.tolist() for b in blocks], managed_n) == (ours_blocks, ours_n), req.request_id
        SEEN["hit_tokens"] += n
        SEEN["null_hit_blocks"] += sum(b == 0 for g in ours_blocks for b in g)
        req.shared_prefix_boundary = boundary
        # vLLM's empty sentinel (no group has a block) adopts nothing: None for kvpool.
        return theirs, ours_blocks if any(ours_blocks) else None, n

    def allocate(self, req: Any, num_new: int, hit: tuple[Any, list[list[int]] | None, int] | None) -> bool:
        kwargs: dict[str, Any] = {}
        ours_kwargs: dict[str, Any] = {}
        if hit is not None:
            theirs_blocks, ours_blocks, n = hit
            kwargs = dict(num_new_computed_tokens=n, new_computed_blocks=theirs_blocks)
            ours_kwargs = dict(num_new_computed_tokens=n, new_computed_blocks=ours_blocks)
        if self.gates is not None:
            rng = self.gates
            extra = dict(full_sequence_must_fit=rng.random() < 0.3, num_lookahead_tokens=rng.choice([0, 0, 1, 3]),
                         reserved_blocks=rng.choice([0, 0, 2]))
            kwargs.update(extra)
            ours_kwargs.update(extra)
            SEEN["gated"] += extra["full_sequence_must_fit"]
        theirs = self.vllm.allocate_slots(req, num_new, **kwargs)
        ours = self.tables.allocate_slots(
            req.request_id, req.num_computed_tokens, req.num_tokens, req.num_prompt_tokens, req.block_hashes,
            num_new, shared_prefix_boundary=req.shared_prefix_boundary,
            token_ids=req.all_token_ids, **ours_kwargs)
        managed = ours if self.manager is None else self.manager.allocate_slots(req.request_id, num_new, **ours_kwargs)
        assert (theirs is None) == (ours is None) == (managed is None), (req.request_id, theirs, ours)
        if ours is not None and managed is not None:
            assert [o.tolist() for o in ours] == [m.tolist() for m in managed], req.request_id
        SEEN["refused"] += theirs is None
        if theirs is not None:
            assert ids(theirs) == [o.tolist() for o in ours], req.request_id
        self.steps += 1
        return theirs is not None

    def free(self, req: Any) -> None:
        self.vllm.free(req)
        self.tables.free(req.request_id)
        if self.manager is not None:
            self.manager.free(req.request_id)
        self.added.discard(req.request_id)

    def decode(self, req: Any, token: int) -> None:
        req.append_output_token_ids(token)
        if self.manager is not None:
            self.manager.append_token_ids(req.request_id, [token])

    def reset(self) -> None:
        done = self.vllm.reset_prefix_cache()
        assert done == self.pool.reset_prefix_cache()
        if self.manager is not None:
            assert done == self.manager.reset_prefix_cache()

    def compare(self, live: list[Any]) -> None:
        for req in live:
            theirs = [list(g) for g in self.vllm.get_block_ids(req.request_id)]
            ours = [g.tolist() for g in self.tables.get_blocks(req.request_id)]
            assert theirs == ours, req.request_id
            if self.manager is not None:
                assert ours == [g.tolist() for g in self.manager.get_block_ids(req.request_id)], req.request_id
                assert self.manager.get_num_computed_tokens(req.request_id) == req.num_computed_tokens
            SEEN["window_frees"] += sum(b == 0 for g in ours for b in g)
        assert self.vllm.block_pool.get_num_free_blocks() == self.pool.get_num_free_blocks()
        events = vllm_events(self.vllm.take_events())
        assert events == kvpool_events(self.pool.take_events())
        self.log.extend(events)
        if self.manager is not None:
            assert self.manager.get_num_free_blocks() == self.pool.get_num_free_blocks()
            assert kvpool_events(self.manager.take_events()) == events
            self.manager.check_invariants()
        SEEN["stored"] += sum(e[0] == "BlockStored" for e in events)
        SEEN["removed"] += sum(e[0] == "BlockRemoved" for e in events)
        self.tables.check_invariants()


def run(seed: int, layout: str, retention_choice: str, gates: bool = False) -> int:
    rng = random.Random(seed)
    block_size, groups = LAYOUTS[layout]
    windows = [g[1] for g in groups if g != "full" and g[0] != "full"]
    span = max(windows + [4 * block_size])
    retention = {"dense": None, "replay only": 0, "segments": block_size * rng.choice([2, 4, 8])}[retention_choice]
    if not any(g != "full" and g[0] == "sliding_window" for g in groups) and retention:
        retention = None
    caching = rng.random() < 0.9
    num_blocks = rng.randint(len(groups) * 4, len(groups) * (3 * span // block_size + 8))
    pair = Pair(block_size, groups, num_blocks, retention, caching, max_model_len=8 * span,
                gates=random.Random(seed + 1000) if gates else None)
    prefixes = [[rng.randrange(50_000) for _ in range(rng.randint(0, 2 * span))] for _ in range(3)]
    waiting: list[Any] = []
    running: list[Any] = []
    next_id = 0
    for _ in range(rng.randint(8, 30)):
        for _ in range(rng.choice([0, 1, 1, 2])):
            prompt = rng.choice(prefixes) + [rng.randrange(50_000) for _ in range(rng.randint(1, span))]
            if rng.random() < 0.2 and running:
                prompt = list(rng.choice(running).prompt_token_ids)  # an exact resend
            waiting.append(make_request(f"r{next_id}", prompt, block_size))
            next_id += 1
        # Decode the running requests (one token each), then admit and prefill waiting ones.
        for req in list(running):
            if req.num_computed_tokens < req.num_tokens:
                num_new = min(req.num_tokens - req.num_computed_tokens, rng.choice([block_size, span]))
            else:
                pair.decode(req, rng.randrange(50_000))
                num_new = 1
            if pair.allocate(req, num_new, None):
                req.num_computed_tokens += num_new
            else:
                pair.free(req)
                running.remove(req)
        for req in list(waiting):
            hit = pair.hit(req)
            chunk = min(req.num_tokens - hit[2], rng.choice([block_size, span, 4 * span]))
            if pair.allocate(req, chunk, hit):
                req.num_computed_tokens = hit[2] + chunk
                waiting.remove(req)
                running.append(req)
        for req in list(running):
            if rng.random() < 0.15:
                pair.free(req)
                running.remove(req)
        if rng.random() < 0.05 and not running:
            pair.reset()
        pair.compare(running)
    for req in running:
        pair.free(req)
    pair.compare([])
    return pair.steps


@pytest.mark.parametrize("retention", ["dense", "replay only", "segments"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_group_tables_match_vllm(layout: str, retention: str) -> None:
    before = dict(SEEN)
    steps = sum(run(seed, layout, retention) for seed in range(12))
    seen = {k: SEEN[k] - before[k] for k in SEEN if k != "gated"}
    assert steps > 100 and all(seen.values()), seen


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_gates_and_lookahead_match_vllm(layout: str) -> None:
    """The full-sequence gate with each window group's admission cap, reserved blocks and
    lookahead slots, drawn at random on every allocation (``GroupTables`` only)."""
    before = dict(SEEN)
    steps = sum(run(seed, layout, "segments", gates=True) for seed in range(12))
    seen = {k: SEEN[k] - before[k] for k in ("gated", "refused", "window_frees")}
    assert steps > 100 and all(seen.values()), seen


def test_partial_tail_keys_match_vllm() -> None:
    """A full-attention group of 32-token blocks over 16-token hashes: once the block
    holding the prompt's last hash boundary (48 of 50 tokens) is cached in full, it also
    takes the partial key at the boundary, an extra key; eviction removes both. (In a
    hybrid layout hits and caching align to the least common block size, so a partial key
    never comes before its block is full.) Every event as vLLM's."""
    pair = Pair(16, [("full", None, 32), ("sliding_window", 64, 16)], num_blocks=12, retention=None,
                caching=True, max_model_len=512)
    req = make_request("a", list(range(100, 150)), 16)  # 50 tokens: the last boundary is 48
    hit = pair.hit(req)
    assert pair.allocate(req, 50, hit)
    req.num_computed_tokens = 50
    pair.compare([req])
    for token in range(20):  # decode past the end of the block holding the boundary
        pair.decode(req, 7 + token)
        assert pair.allocate(req, 1, None)
        req.num_computed_tokens += 1
        pair.compare([req])
    pair.free(req)
    pair.compare([])
    other = make_request("b", list(range(900, 1200)), 16)  # long enough to evict everything
    assert pair.allocate(other, 64, pair.hit(other))
    other.num_computed_tokens = 64
    pair.compare([other])
    group0 = [e for e in pair.log if e[-1] == 0]
    partial = [e for e in group0 if e[0] == "BlockStored" and e[4] == 16]
    assert len(partial) == 1  # the tail at 48 tokens, registered once
    partial_hash = partial[0][1][0]
    removed = [e[1][0] for e in group0 if e[0] == "BlockRemoved"]
    assert removed.count(partial_hash) == 1  # evicted with its block
    full = {h for e in group0 if e[0] == "BlockStored" and e[4] == 32 for h in e[1]}
    at = pair.log.index(("BlockRemoved", [partial_hash], 0))
    assert pair.log[at - 1][0] == "BlockRemoved" and pair.log[at - 1][1][0] in full  # its block's full key first


def test_tokens_in_flight_and_rejected_drafts_as_vllms() -> None:
    """Under async scheduling a step's tokens are in flight until its output comes back, and its
    window still reads blocks below them: vLLM frees window blocks only below
    ``num_computed_tokens - num_in_flight_tokens`` (``GroupManager.set_num_in_flight_tokens``;
    without it the manager gave back three blocks the step in flight reads). Rejected draft
    tokens roll ``num_computed_tokens`` back (``GroupManager.set_num_computed_tokens``; without
    it the manager allocated ahead of vLLM at every later step)."""
    groups: list[Any] = [("sliding_window", 4), "full"]
    theirs = vllm_manager(4, groups, 40, None, 4096, True)
    ours = kvpool.GroupManager(40, 4, groups, hash_algo="sha256", max_model_len=4096)

    def same() -> None:
        assert [list(x) for x in theirs.get_block_ids("a")] == [x.tolist() for x in ours.get_block_ids("a")]
        assert theirs.block_pool.get_num_free_blocks() == ours.get_num_free_blocks()
        assert ours.get_num_computed_tokens("a") == req.num_computed_tokens

    req = make_request("a", list(range(16)), 4)
    ours.add_request("a", list(range(16)))
    theirs.allocate_slots(req, 16)
    ours.allocate_slots("a", 16)
    req.num_computed_tokens = 16
    req.num_in_flight_tokens = 16  # the prefill's output has not come back
    ours.set_num_in_flight_tokens("a", 16)
    for tok in (7, 8):
        req.append_output_token_ids(tok)
        ours.append_token_ids("a", [tok])
        theirs.allocate_slots(req, 1)
        ours.allocate_slots("a", 1)
        req.num_computed_tokens += 1
        same()
    req.num_in_flight_tokens = 0  # the outputs came back
    ours.set_num_in_flight_tokens("a", 0)
    for tok in (9, 10, 11):
        # The sampled token and three drafts, all three drafts rejected.
        theirs.allocate_slots(req, 4)
        ours.allocate_slots("a", 4)
        req.num_computed_tokens += 1
        ours.set_num_computed_tokens("a", req.num_computed_tokens)
        req.append_output_token_ids(tok)
        ours.append_token_ids("a", [tok])
        same()
    with pytest.raises(kvpool.InvalidArgumentError):
        ours.set_num_computed_tokens("a", 10_000)
    with pytest.raises(kvpool.InvalidArgumentError):
        ours.set_num_in_flight_tokens("a", 10_000)
    ours.check_invariants()
