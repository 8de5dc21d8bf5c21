"""kvpool: a KV-cache block manager for LLM inference engines, written in Rust.

``BlockPool`` keeps a fixed number of KV-cache blocks: an LRU free queue, reference
counts and a prefix cache from block hashes to blocks, with vLLM's v1 semantics.
Block ids cross the boundary as numpy ``int32`` arrays, one call per batch.
``kvpool.reference`` holds the same semantics in plain Python.
"""

# Block ids cross as numpy arrays: without numpy (a declared dependency) the extension could
# not build a single result, so its absence is an import error here, not a failure later.
try:
    import numpy as _numpy  # noqa: F401
except ImportError as e:  # pragma: no cover - numpy is a declared dependency
    raise ImportError("kvpool needs numpy (pip install 'numpy>=1.26,<3')") from e

from kvpool._core import (
    BlockHasher,
    BlockHashList,
    BlockPool,
    BlockStateError,
    BlockTables,
    CachingDisabledError,
    ComputedBlocksTracker,
    DoubleFreeError,
    DtypeError,
    DuplicateRequestError,
    GroupManager,
    GroupTables,
    HashWidthError,
    InvalidArgumentError,
    InvalidBlockIdError,
    InvariantError,
    KVCacheManager,
    KVPoolError,
    NoFreeBlocksError,
    OutOfMemoryError,
    PinBudgetError,
    ReplayRing,
    StepResult,
    TransportError,
    UnknownRequestError,
    VllmGroupCalls,
    VllmManagerCalls,
    ZmqSink,
    __version__,
    compute_none_hash,
    encode_hash_input,
    find_group_hit,
    ghost_fingerprint,
    hash_value,
)
from kvpool.stats import PrefixCacheStats
from kvpool.step_status import StepStatus
from kvpool.events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent

__all__ = [
    "AllBlocksCleared",
    "BlockHashList",
    "BlockHasher",
    "BlockPool",
    "BlockRemoved",
    "BlockStateError",
    "BlockStored",
    "BlockTables",
    "CachingDisabledError",
    "ComputedBlocksTracker",
    "DoubleFreeError",
    "DtypeError",
    "DuplicateRequestError",
    "GroupManager",
    "GroupTables",
    "HashWidthError",
    "InvalidArgumentError",
    "InvalidBlockIdError",
    "InvariantError",
    "KVCacheEvent",
    "KVCacheManager",
    "KVPoolError",
    "NoFreeBlocksError",
    "OutOfMemoryError",
    "PinBudgetError",
    "PrefixCacheStats",
    "ReplayRing",
    "StepResult",
    "StepStatus",
    "TransportError",
    "UnknownRequestError",
    "VllmGroupCalls",
    "VllmManagerCalls",
    "ZmqSink",
    "__version__",
    "compute_none_hash",
    "encode_hash_input",
    "find_group_hit",
    "ghost_fingerprint",
    "hash_value",
]
