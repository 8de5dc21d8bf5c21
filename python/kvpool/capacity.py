"""Capacities in the units a planner thinks in: tokens, or GiB of a model's KV cache.

A model's KV cache takes ``2 * layers * kv_heads * head_dim * dtype_bytes`` bytes per token (a
key and a value per layer and KV head, for full attention); a pool of ``G`` GiB holds
``floor(G * 2**30 / (bytes_per_token * block_tokens))`` blocks of ``block_tokens`` tokens.
``kvpool simulate --capacity-tokens`` / ``--capacity-gib`` convert with these functions, so
each capacity replays as a whole number of blocks, as an engine's pool would hold.

Example::

    >>> kv_bytes_per_token(32, 8, 128, "bf16")      # Llama 3 8B
    131072
    >>> blocks_for_gib(40, 131072, 512)              # 40 GiB of it in 512-token blocks
    640
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "CapacityUnits",
    "DTYPE_BYTES",
    "MODEL_PRESETS",
    "ModelShape",
    "blocks_for_gib",
    "blocks_for_tokens",
    "kv_bytes_per_token",
    "parse_model_shape",
]

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
"""Bytes per element of each KV-cache dtype."""


@dataclass(frozen=True)
class ModelShape:
    """The attention shape that sets a model's KV bytes per token."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: str = "bf16"

    @property
    def bytes_per_token(self) -> int:
        """KV-cache bytes per token (keys and values of every layer)."""
        return kv_bytes_per_token(self.layers, self.kv_heads, self.head_dim, self.dtype)


MODEL_PRESETS = {
    "llama3-8b": ModelShape(32, 8, 128),
    "llama3-70b": ModelShape(80, 8, 128),
    "mistral-7b": ModelShape(32, 8, 128),
    "qwen2.5-7b": ModelShape(28, 4, 128),
}
"""Published attention shapes (from the models' configs) with a bf16 KV cache."""


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype: str) -> int:
    """``2 * layers * kv_heads * head_dim * DTYPE_BYTES[dtype]``; ``ValueError`` for a count
    below 1 or an unknown dtype."""
    for name, value in (("layers", layers), ("kv_heads", kv_heads), ("head_dim", head_dim)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r} (choose from {', '.join(DTYPE_BYTES)})")
    return 2 * layers * kv_heads * head_dim * DTYPE_BYTES[dtype]


def parse_model_shape(text: str) -> ModelShape:
    """A preset name (``llama3-8b``) or ``LAYERS:KV_HEADS:HEAD_DIM[:DTYPE]``; ``ValueError``
    saying what is wrong otherwise."""
    if text in MODEL_PRESETS:
        return MODEL_PRESETS[text]
    parts = text.split(":")
    if len(parts) not in (3, 4):
        raise ValueError(
            f"{text!r} is neither a preset ({', '.join(sorted(MODEL_PRESETS))}) nor LAYERS:KV_HEADS:HEAD_DIM[:DTYPE]"
        )
    try:
        layers, kv_heads, head_dim = (int(p) for p in parts[:3])
    except ValueError:
        raise ValueError(f"{text!r}: LAYERS, KV_HEADS and HEAD_DIM must be integers") from None
    shape = ModelShape(layers, kv_heads, head_dim, parts[3] if len(parts) == 4 else "bf16")
    kv_bytes_per_token(shape.layers, shape.kv_heads, shape.head_dim, shape.dtype)  # ValueError if invalid
    return shape


def blocks_for_tokens(tokens: int, block_tokens: int) -> int:
    """Whole blocks of ``block_tokens`` in ``tokens`` (rounded down)."""
    return tokens // block_tokens


def blocks_for_gib(gib: float, bytes_per_token: int, block_tokens: int) -> int:
    """Whole blocks of ``block_tokens`` tokens that ``gib`` GiB holds at ``bytes_per_token``."""
    if not math.isfinite(gib) or gib < 0:
        raise ValueError(f"a capacity in GiB must be a finite number >= 0, got {gib}")
    total = gib * 2**30
    if not math.isfinite(total):
        return 2**62  # more blocks than any pool holds (callers clamp to what a trace fills)
    return int(total // (bytes_per_token * block_tokens))


@dataclass(frozen=True)
class CapacityUnits:
    """How a capacity in blocks reads in tokens and, when the model's KV bytes per token are
    known, in GiB: the axis and columns of ``kvpool simulate``'s output."""

    block_tokens: int
    bytes_per_token: int | None = None

    def tokens(self, blocks: int) -> int:
        """``blocks`` in tokens."""
        return blocks * self.block_tokens

    def gib(self, blocks: int) -> float | None:
        """``blocks`` in GiB of KV cache (``None`` without bytes per token)."""
        if self.bytes_per_token is None:
            return None
        return blocks * self.block_tokens * self.bytes_per_token / 2**30

    def axis(self, blocks: int) -> float:
        """The plot's x value: GiB when known, else tokens."""
        gib = self.gib(blocks)
        return float(self.tokens(blocks)) if gib is None else gib

    @property
    def axis_label(self) -> str:
        """The plot's x label."""
        if self.bytes_per_token is None:
            return "capacity (tokens)"
        return f"capacity (GiB of KV cache at {self.bytes_per_token:,} bytes per token)"
