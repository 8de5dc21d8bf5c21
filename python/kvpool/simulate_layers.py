"""Prefix caching of a hybrid model on a trace: ``kvpool simulate --model-layers``.

A hybrid model's layers fall into KV-cache groups (full attention, sliding window, chunked
local attention), every group holding one block per ``block_tokens`` tokens of a request,
all from one pool. This replays a Mooncake trace through ``kvpool.GroupTables`` (vLLM 0.33's
hybrid rules, :mod:`kvpool.reference` has none of them) and reports what a capacity planner
asks: how much of the prompt a request finds cached, and how many blocks a request still
holds once its prefill is done, against a model whose groups are all full attention.

Per request, in file order: the longest hit valid for every group (at most the prompt's
blocks), allocation of the rest, caching (a sliding-window group keeps only the tails a later
hit can use, per ``retention_interval``), the blocks that fell out of each window given back
(``remove_skipped_blocks`` once the prompt is computed), then every block freed tail first.

Layouts are a comma list of groups, ``full``, ``swa:W`` (a W-token window) or ``chunked:C``,
each optionally ``xN`` for N equal groups, or a preset name (:data:`PRESETS`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

import kvpool
from kvpool.simulate import unbounded_capacity
from kvpool.traces import Trace

#: Layouts of common model families, as vLLM groups their layers (equal-size groups).
PRESETS: dict[str, str] = {
    "gemma3": "swa:1024x5,full",
    "gpt-oss": "swa:128,full",
    "llama4": "chunked:8192x3,full",
    "full": "full",
}


#: The most KV-cache groups a simulated layout may have (models have a handful).
MAX_GROUPS = 1024


def parse_layout(spec: str) -> list[Any]:
    """``GroupTables`` groups from ``spec`` (a preset name or a comma list), or ``ValueError``."""
    spec = PRESETS.get(spec, spec)
    groups: list[Any] = []
    for part in spec.split(","):
        part = part.strip()
        name, _, count = part.partition("x")
        n = int(count) if count.isdigit() else (1 if not count else -1)
        if n > MAX_GROUPS:
            raise kvpool.InvalidArgumentError(f"at most {MAX_GROUPS} KV-cache groups, got {part!r}")
        kind, _, size = name.partition(":")
        if kind == "full" and not size:
            group: Any = "full"
        elif kind in ("swa", "sliding_window") and size.isdigit() and int(size) > 0:
            group = ("sliding_window", int(size))
        elif kind in ("chunked", "chunked_local") and size.isdigit() and int(size) > 0:
            group = ("chunked_local", int(size))
        else:
            raise kvpool.InvalidArgumentError(f"unknown group {part!r}: use full, swa:W or chunked:C, optionally xN, or a preset "
                             f"({', '.join(sorted(PRESETS))})")
        if n < 1:
            raise kvpool.InvalidArgumentError(f"a group count must be at least 1, got {part!r}")
        groups += [group] * n
        if len(groups) > MAX_GROUPS:
            raise kvpool.InvalidArgumentError(f"at most {MAX_GROUPS} KV-cache groups in a layout")
    return groups


@dataclass(frozen=True)
class LayersResult:
    """One replay of a trace through a hybrid layout at one capacity."""

    trace: str
    layout: str
    groups: int
    capacity_blocks: int
    requests: int
    token_hit_ratio: float
    resident_blocks_per_request: float
    full_attention_blocks_per_request: float
    cached_blocks: int

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("token_hit_ratio", "resident_blocks_per_request", "full_attention_blocks_per_request"):
            out[key] = round(out[key], 6)
        return out


def simulate_layers(trace: Trace, layout: str, capacity: int, *, block_tokens: int,
                    retention_interval: int | None = None) -> LayersResult:
    """Replay ``trace`` through ``layout``'s groups in a pool of ``capacity`` usable blocks
    (shared by all groups). A request whose blocks for every group do not fit keeps its
    first ones."""
    groups = parse_layout(layout)
    if capacity < len(groups):
        raise kvpool.InvalidArgumentError(
            f"a capacity of {capacity} blocks cannot hold one block for each of the layout's {len(groups)} groups")
    # A pool larger than every request's blocks for every group changes nothing.
    usable = min(capacity, max(unbounded_capacity(trace), trace.max_request_blocks) * len(groups))
    per_request = max(1, usable // len(groups))
    pool = kvpool.BlockPool(usable + 1, block_size=block_tokens, enable_caching=True)
    tables = kvpool.GroupTables(pool, groups, max_model_len=(trace.max_request_blocks + 1) * block_tokens,
                                retention_interval=retention_interval)
    hit_tokens = resident = full = 0
    for i, ids in enumerate(trace.hash_ids):
        hashes = np.asarray(ids[:per_request], dtype=np.uint64)
        n_tokens = len(hashes) * block_tokens
        if n_tokens == 0:
            continue
        blocks, hit, _ = tables.find_longest_cache_hit(hashes, n_tokens)
        adopt = blocks if any(len(b) for b in blocks) else None
        rid = f"r{i}"
        new = tables.allocate_slots(rid, 0, n_tokens, n_tokens, hashes, n_tokens - hit,
                                    num_new_computed_tokens=hit, new_computed_blocks=adopt)
        if new is None:
            raise RuntimeError(f"request {i} does not fit in {usable} blocks")
        # After its prefill a request has computed its prompt, whose last block is partial
        # unless the prompt fills it: the window groups drop what lies out of reach of that.
        tables.remove_skipped_blocks(rid, min(n_tokens, trace.input_lengths[i]))
        held = tables.get_blocks(rid)
        resident += sum(int(np.count_nonzero(b)) for b in held)
        full += len(hashes) * len(groups)
        tables.free(rid)
        hit_tokens += min(hit, trace.input_lengths[i])
    inputs = sum(trace.input_lengths)
    n = max(trace.num_requests, 1)
    return LayersResult(
        trace=trace.name, layout=layout, groups=len(groups), capacity_blocks=capacity,
        requests=trace.num_requests, token_hit_ratio=hit_tokens / inputs if inputs else 0.0,
        resident_blocks_per_request=resident / n, full_attention_blocks_per_request=full / n,
        cached_blocks=pool.get_num_cached_blocks())


def layers_table(results: Sequence[LayersResult], block_tokens: int) -> str:
    """The text output of ``kvpool simulate --model-layers``."""
    lines = [f"{'layout':<22} {'groups':>6} {'capacity':>9} {'token_hit':>9} {'held/req':>9} "
             f"{'all-full/req':>12} {'cached':>8}   ({block_tokens} tokens per block; held/req: blocks a "
             f"request still holds after its prefill, all groups)"]
    for r in results:
        lines.append(f"{r.layout:<22} {r.groups:>6} {r.capacity_blocks:>9} {r.token_hit_ratio:>9.4f} "
                     f"{r.resident_blocks_per_request:>9.1f} {r.full_attention_blocks_per_request:>12.1f} "
                     f"{r.cached_blocks:>8}")
    return "\n".join(lines)
