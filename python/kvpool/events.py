"""KV-cache events, with vLLM's field names (``vllm/distributed/kv_events.py``).

kvpool's pool emits these in emission order when built with ``enable_events=True``;
``BlockPool.take_events()`` hands them over and clears the queue. Block hashes are the
raw hash ``bytes`` as the caller gave them; converting to the wire format (the last
8 bytes as an unsigned big-endian int) is left to a publisher.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MEDIUM_GPU = "GPU"


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks entered the prefix cache in one ``cache_full_blocks`` call."""

    block_hashes: list[bytes]
    parent_block_hash: bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = MEDIUM_GPU
    lora_name: str | None = None
    group_idx: int = 0
    extra_keys: list[tuple[Any, ...] | None] | None = None
    """Per block, the extra keys vLLM's event carries (``None`` for a block without any): the
    LoRA name, ``(identifier, offset)`` per multimodal input, the cache salt, the
    prompt-embeddings digest. ``None`` for the LoRA-only form: every block ``(lora_name,)``, or
    no keys without LoRA."""


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """One block's hash left the prefix cache (evicted on reuse or by ``evict_blocks``)."""

    block_hashes: list[bytes]
    medium: str | None = MEDIUM_GPU
    group_idx: int = 0


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """``reset_prefix_cache`` dropped every cached hash."""


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared

__all__ = ["AllBlocksCleared", "BlockRemoved", "BlockStored", "KVCacheEvent", "MEDIUM_GPU"]
