"""Type stubs for ``kvpool._core``, the compiled Rust extension."""

from collections.abc import Sequence
from typing import Any, final

import numpy as np
import numpy.typing as npt

__version__: str

BlockIds = npt.NDArray[np.int32]
IdsLike = npt.ArrayLike  # numpy integer array, list or any sequence of ints
HashesLike = Sequence[bytes] | npt.NDArray[np.integer[Any]]  # ints: 8-byte big-endian

class KVPoolError(Exception):
    """Base class of every error kvpool raises."""

class NoFreeBlocksError(KVPoolError, ValueError):
    """Fewer free blocks than requested; nothing was allocated."""

class InvalidBlockIdError(KVPoolError, ValueError):
    """A block id is negative, out of range, or the null block where it is not allowed."""

class DoubleFreeError(KVPoolError, ValueError):
    """A block would be freed while its reference count is already 0."""

class BlockStateError(KVPoolError, ValueError):
    """A block is in the wrong state for the operation (caching a free or already cached block)."""

class HashWidthError(KVPoolError, ValueError):
    """A block hash is empty, longer than 32 bytes, or of another width than the pool's."""

class DtypeError(KVPoolError, TypeError):
    """An argument has the wrong type or numpy dtype (block ids must be integers)."""

class InvalidArgumentError(KVPoolError, ValueError):
    """An argument is out of its valid range or inconsistent with another one."""

class CachingDisabledError(KVPoolError, RuntimeError):
    """A prefix-cache operation was called on a pool built with ``enable_caching=False``."""

class InvariantError(KVPoolError, AssertionError):
    """``check_invariants`` found the pool's structure inconsistent (a bug in kvpool)."""

@final
class BlockPool:
    """A pool of KV-cache blocks: free queue, reference counts and prefix cache."""

    def __new__(
        cls,
        num_blocks: int,
        *,
        enable_caching: bool = True,
        null_block: bool = True,
        enable_events: bool = False,
        block_size: int = 16,
        hash_width: int | None = None,
    ) -> BlockPool: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def enable_caching(self) -> bool: ...
    @property
    def enable_events(self) -> bool: ...
    @property
    def null_block(self) -> int | None: ...
    @property
    def hash_width(self) -> int | None: ...
    def get_new_blocks(self, num_blocks: int) -> BlockIds: ...
    def get_new_blocks_many(self, counts: IdsLike) -> tuple[BlockIds, npt.NDArray[np.int64]]: ...
    def free_blocks(self, block_ids: IdsLike) -> None: ...
    def free_blocks_many(
        self,
        blocks: Sequence[IdsLike] | IdsLike,
        offsets: IdsLike | None = None,
        *,
        reverse: bool = False,
    ) -> None: ...
    def touch(self, block_ids: IdsLike) -> None: ...
    def cache_full_blocks(
        self,
        block_ids: IdsLike,
        block_hashes: HashesLike,
        num_cached_blocks: int,
        num_full_blocks: int,
        *,
        group_id: int = 0,
        token_ids: IdsLike | None = None,
        lora_id: int | None = None,
        lora_name: str | None = None,
    ) -> None: ...
    def get_cached_block(self, block_hash: bytes | int, group_id: int = 0) -> int | None: ...
    def find_longest_cache_hit(
        self,
        block_hashes: HashesLike,
        *,
        group_id: int = 0,
        max_blocks: int | None = None,
    ) -> BlockIds: ...
    def evict_blocks(self, block_ids: IdsLike) -> None: ...
    def reset_prefix_cache(self) -> bool: ...
    def get_num_free_blocks(self) -> int: ...
    def get_num_cached_blocks(self) -> int: ...
    def get_usage(self) -> float: ...
    def take_events(self) -> list[Any]: ...
    def free_block_ids(self) -> BlockIds: ...
    def ref_count(self, block_id: int) -> int: ...
    def ref_counts(self) -> BlockIds: ...
    def block_hash(self, block_id: int) -> tuple[bytes, int] | None: ...
    def check_invariants(self) -> None: ...

class UnknownRequestError(KVPoolError, KeyError):
    """A request id that the manager does not track."""

class DuplicateRequestError(KVPoolError, ValueError):
    """A request id that the manager already tracks."""
