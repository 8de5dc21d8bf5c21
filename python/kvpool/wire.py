"""KV-cache events on the wire, as vLLM 0.33 publishes them: the msgpack bytes KV-aware
routers (NVIDIA Dynamo's KV router and indexer, llm-d's indexer) read.

vLLM's ``ZmqEventPublisher`` encodes an ``EventBatch`` with ``msgspec.msgpack.Encoder()``: a
three-element array ``[ts, events, data_parallel_rank]`` (the rank left out when ``None``),
each event a map tagged ``"type": "BlockStored" | "BlockRemoved" | "AllBlocksCleared"`` with
the fields left at their defaults omitted, block hashes as integers (the last 8 bytes of the
hash, big-endian, as vLLM's default ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``). The structs
below have vLLM 0.33's fields, order and defaults, so the same events encode to the same
bytes; ``tests/test_wire.py`` checks that against vLLM's own classes and pinned vectors.

``from_pool_events`` turns kvpool's events (raw hash bytes) into these; ``encode_batch`` and
``decode_batch`` go to and from bytes. Needs ``msgspec`` (``pip install 'kvpool[wire]'``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import msgspec

import kvpool
import kvpool.events as _events

MEDIUM_GPU = "GPU"


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One published batch: a timestamp, its events, the data-parallel rank."""

    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """A KV-cache event: a map tagged with its class name under ``"type"``."""


class BlockStored(KVCacheEvent):
    """Blocks entered the prefix cache: their hashes, parent, tokens and where they live."""

    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class BlockRemoved(KVCacheEvent):
    """Blocks left the prefix cache."""

    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    """The whole prefix cache was reset."""


WireEvent = BlockStored | BlockRemoved | AllBlocksCleared


class _Batch(EventBatch):
    events: list[WireEvent]


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(_Batch)


def wire_hash(block_hash: bytes) -> int:
    """A block hash as vLLM puts it on the wire: its last 8 bytes, big-endian."""
    return int.from_bytes(block_hash[-8:], "big")


def plain_extra_keys(event: Any) -> list[tuple[Any, ...] | None]:
    """vLLM's per-block ``extra_keys`` of a ``BlockStored`` for a request whose only extra
    key is its LoRA, if any: ``(lora_name,)`` per block, else ``None`` per block (vLLM sends
    a list of ``None``, not nothing)."""
    key = None if event.lora_name is None else (event.lora_name,)
    return [key] * len(event.block_hashes)


def from_pool_events(
    events: Iterable[Any],
    *,
    group_specs: Mapping[int, tuple[str | None, int | None]] | None = None,
    medium: str = MEDIUM_GPU,
    extra_keys: Callable[[Any], list[tuple[Any, ...] | None] | None] = plain_extra_keys,
) -> list[WireEvent]:
    """kvpool's events (``kvpool.BlockStored`` and friends, hashes as bytes) in vLLM's wire
    form. ``group_specs`` maps a group index to its ``(kv_cache_spec_kind,
    kv_cache_spec_sliding_window)`` for ``BlockStored`` (vLLM's manager adds them);
    A ``BlockStored`` from a manager carries its blocks' extra keys; for one without them (a
    pool's, or the LoRA-only form), ``extra_keys(event)`` gives them (the default,
    :func:`plain_extra_keys`, is exact without multimodal inputs, cache salt or prompt
    embeddings). A ``BlockRemoved`` of several hashes
    becomes one event per hash, as vLLM's pool emits them."""
    out: list[WireEvent] = []
    specs = group_specs or {}
    for e in events:
        if isinstance(e, _events.BlockStored):
            kind, window = specs.get(e.group_idx, (None, None))
            parent = e.parent_block_hash
            out.append(BlockStored(
                block_hashes=[wire_hash(h) for h in e.block_hashes],
                parent_block_hash=None if parent is None else wire_hash(parent),
                token_ids=list(e.token_ids), block_size=e.block_size, lora_id=e.lora_id, medium=medium,
                lora_name=e.lora_name,
                # vLLM's `to_event_extra_keys` gives None (left off the wire) for no blocks.
                extra_keys=(extra_keys(e) if e.extra_keys is None else list(e.extra_keys)) or None,
                group_idx=e.group_idx, kv_cache_spec_kind=kind,
                kv_cache_spec_sliding_window=window))
        elif isinstance(e, _events.BlockRemoved):
            out.extend(BlockRemoved(block_hashes=[wire_hash(h)], medium=medium, group_idx=e.group_idx)
                       for h in e.block_hashes)
        elif isinstance(e, _events.AllBlocksCleared):
            out.append(AllBlocksCleared())
        else:
            raise kvpool.DtypeError(f"not a kvpool KV-cache event: {type(e).__name__}")
    return out


def encode_batch(events: Sequence[WireEvent], ts: float, data_parallel_rank: int | None = None) -> bytes:
    """The msgpack payload vLLM's publisher sends for ``events``."""
    return _ENCODER.encode(EventBatch(ts=ts, events=list(events), data_parallel_rank=data_parallel_rank))


def decode_batch(payload: bytes) -> EventBatch:
    """A payload back to an ``EventBatch`` of wire events (``msgspec.ValidationError`` or
    ``msgspec.DecodeError`` for bytes that are not one)."""
    batch = _DECODER.decode(payload)
    return EventBatch(ts=batch.ts, events=list(batch.events), data_parallel_rank=batch.data_parallel_rank)
