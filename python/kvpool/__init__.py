"""kvpool: a KV-cache block manager for LLM inference engines, written in Rust.

``BlockPool`` keeps a fixed number of KV-cache blocks: an LRU free queue, reference
counts and a prefix cache from block hashes to blocks, with vLLM's v1 semantics.
Block ids cross the boundary as numpy ``int32`` arrays, one call per batch.
``kvpool.reference`` holds the same semantics in plain Python.
"""

from kvpool._core import (
    BlockPool,
    BlockStateError,
    CachingDisabledError,
    DoubleFreeError,
    DtypeError,
    DuplicateRequestError,
    HashWidthError,
    InvalidArgumentError,
    InvalidBlockIdError,
    InvariantError,
    KVPoolError,
    NoFreeBlocksError,
    UnknownRequestError,
    __version__,
)
from kvpool.events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent

__all__ = [
    "AllBlocksCleared",
    "BlockPool",
    "BlockRemoved",
    "BlockStateError",
    "BlockStored",
    "CachingDisabledError",
    "DoubleFreeError",
    "DtypeError",
    "DuplicateRequestError",
    "HashWidthError",
    "InvalidArgumentError",
    "InvalidBlockIdError",
    "InvariantError",
    "KVCacheEvent",
    "KVPoolError",
    "NoFreeBlocksError",
    "UnknownRequestError",
    "__version__",
]
