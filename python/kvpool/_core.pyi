"""Type stubs for ``kvpool._core``, the compiled Rust extension."""

from collections.abc import Sequence
from typing import Any, Literal, final, overload

import numpy as np
import numpy.typing as npt

from kvpool.events import KVCacheEvent

from kvpool.stats import PrefixCacheStats

__version__: str

_BlockIds = npt.NDArray[np.int32]
_IdsLike = npt.ArrayLike  # numpy integer array, list or any sequence of ints
_HashesLike = Sequence[bytes] | npt.NDArray[np.integer[Any]]  # ints: 8-byte big-endian

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
        enable_caching: bool | None = None,
        null_block: bool | None = None,
        enable_events: bool | None = None,
        block_size: int | None = None,
        hash_width: int | None = None,
        max_pending_events: int | None = None,
        eviction: _EvictionName | None = None,
        max_pinned_blocks: int | None = None,
        clock: _ClockName | None = None,
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
    def get_new_blocks(self, num_blocks: int) -> _BlockIds: ...
    def get_new_blocks_many(self, counts: _IdsLike) -> tuple[_BlockIds, npt.NDArray[np.int64]]: ...
    def free_blocks(self, block_ids: _IdsLike, *, reverse: bool | None = None) -> None: ...
    def free_blocks_many(
        self,
        blocks: Sequence[_IdsLike] | _IdsLike,
        offsets: _IdsLike | None = None,
        *,
        reverse: bool | None = None,
    ) -> None: ...
    def touch(self, block_ids: _IdsLike) -> None: ...
    def cache_full_blocks(
        self,
        block_ids: _IdsLike,
        block_hashes: _HashesLike,
        num_cached_blocks: int,
        num_full_blocks: int,
        *,
        group_id: int | None = None,
        token_ids: _IdsLike | None = None,
        lora_id: int | None = None,
        lora_name: str | None = None,
        priority: int | None = None,
        retention_s: float | None = None,
    ) -> None: ...
    def get_cached_block(self, block_hash: bytes | int, group_id: int | None = None) -> int | None: ...
    def find_longest_cache_hit(
        self,
        block_hashes: _HashesLike,
        *,
        group_id: int | None = None,
        max_blocks: int | None = None,
    ) -> _BlockIds: ...
    def _set_block_hash(self, block_id: int, block_hash: bytes | None, group_id: int | None = None) -> None: ...
    def evict_blocks(self, block_ids: _IdsLike) -> None: ...
    def reset_prefix_cache(self) -> bool: ...
    def get_num_free_blocks(self) -> int: ...
    def get_num_cached_blocks(self) -> int: ...
    def get_usage(self) -> float: ...
    def take_events(self) -> list[KVCacheEvent]: ...
    def take_events_msgpack(
        self,
        ts: float | None = None,
        *,
        data_parallel_rank: int | None = None,
        group_specs: dict[int, tuple[str | None, int | None]] | None = None,
        medium: str | None = None,
    ) -> bytes: ...
    @property
    def max_pending_events(self) -> int: ...
    @property
    def num_pending_events(self) -> int: ...
    @property
    def num_dropped_events(self) -> int: ...
    def free_block_ids(self) -> _BlockIds: ...
    def ref_count(self, block_id: int) -> int: ...
    def ref_counts(self) -> _BlockIds: ...
    def ref_counts_of(self, block_ids: _IdsLike) -> _BlockIds: ...
    def block_hash(self, block_id: int) -> tuple[bytes, int] | None: ...
    def check_invariants(self) -> None: ...
    def set_priority(self, block_ids: _IdsLike, priority: int, *, retention_s: float | None = None) -> None: ...
    def block_priority(self, block_id: int) -> tuple[int, float | None]: ...
    def pin_prefix(self, block_hashes: _HashesLike, *, group_id: int | None = None) -> int: ...
    def unpin_prefix(self, block_hashes: _HashesLike, *, group_id: int | None = None) -> int: ...
    def unpin_all(self) -> int: ...
    def get_num_pinned_blocks(self) -> int: ...
    def pinned_block_ids(self) -> _BlockIds: ...
    @property
    def max_pinned_blocks(self) -> int: ...
    @property
    def eviction(self) -> _EvictionName: ...
    @property
    def clock(self) -> _ClockName: ...
    @property
    def now(self) -> float: ...
    def advance_clock(self, seconds: float) -> None: ...
    @property
    def num_evictions(self) -> int: ...

class UnknownRequestError(KVPoolError, KeyError):
    """A request id that the manager does not track."""

class DuplicateRequestError(KVPoolError, ValueError):
    """A request id that the manager already tracks."""

class OutOfMemoryError(KVPoolError, MemoryError):
    """Memory for a pool, a manager or a batch could not be allocated; nothing was changed."""

class PinBudgetError(KVPoolError, ValueError):
    """Pinning would exceed the pool's budget of pinned blocks (max_pinned_blocks); nothing was pinned."""

_HashAlgoName = Literal["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]
_EvictionName = Literal["lru", "priority", "adaptive"]
_ClockName = Literal["monotonic", "manual"]
_LoraSpec = tuple[str, str]  # (lora_name, lora_path)
_MmFeatureSpec = tuple[str, int, int]  # (identifier, offset, length)

@final
class BlockHashList:
    """A request's block hashes kept in Rust (flat, equal-width digests); append-only."""

    @property
    def width(self) -> int: ...
    @property
    def hash_algo(self) -> _HashAlgoName: ...
    def __len__(self) -> int: ...
    @overload
    def __getitem__(self, index: int, /) -> bytes: ...
    @overload
    def __getitem__(self, index: slice, /) -> BlockHashList: ...
    def to_list(self) -> list[bytes]: ...
    def to_bytes(self) -> bytes: ...
    def to_ints(self) -> npt.NDArray[np.uint64]: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class BlockHasher:
    """Hashes token blocks into chains of vLLM-compatible block hashes."""

    def __new__(cls, block_size: int, *, hash_algo: _HashAlgoName | None = None, seed: str | None = None) -> BlockHasher: ...
    @property
    def block_size(self) -> int: ...
    @property
    def hash_algo(self) -> _HashAlgoName: ...
    @property
    def none_hash(self) -> bytes: ...
    def hash_tokens(
        self,
        token_ids: _IdsLike,
        *,
        lora: _LoraSpec | None = None,
        cache_salt: str | None = None,
        mm_features: Sequence[_MmFeatureSpec] | None = None,
        prompt_embed_digests: Sequence[bytes] | None = None,
    ) -> BlockHashList: ...
    def hash_tokens_many(self, token_lists: Sequence[_IdsLike]) -> list[BlockHashList]: ...
    def extend(
        self,
        hashes: BlockHashList,
        token_ids: _IdsLike,
        *,
        lora: _LoraSpec | None = None,
        cache_salt: str | None = None,
        mm_features: Sequence[_MmFeatureSpec] | None = None,
        prompt_embed_digests: Sequence[bytes] | None = None,
    ) -> int: ...
    def hash_block(self, parent: bytes | None, token_ids: _IdsLike, extra_keys: object = None) -> bytes: ...

def compute_none_hash(hash_algo: _HashAlgoName | None = None, seed: str | None = None) -> bytes: ...
def encode_hash_input(value: object, hash_algo: _HashAlgoName | None = None) -> bytes: ...
def hash_value(value: object, hash_algo: _HashAlgoName | None = None) -> bytes: ...

_RequestId = str | int

@final
class ComputedBlocksTracker:
    """Per-sequence block hashes and computed-token counts read from a pool's prefix cache."""

    def __new__(
        cls, pool: BlockPool, block_size: int, *, hash_algo: _HashAlgoName | None = None, seed: str | None = None
    ) -> ComputedBlocksTracker: ...
    @property
    def pool(self) -> BlockPool: ...
    @property
    def block_size(self) -> int: ...
    @property
    def hash_algo(self) -> _HashAlgoName: ...
    def add_sequence(
        self,
        seq_id: _RequestId,
        token_ids: _IdsLike,
        *,
        lora: _LoraSpec | None = None,
        cache_salt: str | None = None,
        mm_features: Sequence[_MmFeatureSpec] | None = None,
        prompt_embed_digests: Sequence[bytes] | None = None,
    ) -> None: ...
    def append_tokens(self, seq_id: _RequestId, token_ids: _IdsLike) -> int: ...
    def append_tokens_many(self, seq_ids: Sequence[_RequestId], token_ids: _IdsLike, offsets: _IdsLike | None = None) -> None: ...
    def get_num_cached_tokens(self, seq_id: _RequestId) -> int: ...
    def get_num_cached_tokens_many(self, seq_ids: Sequence[_RequestId]) -> npt.NDArray[np.int64]: ...
    def start(self, seq_id: _RequestId) -> int: ...
    def start_many(self, seq_ids: Sequence[_RequestId]) -> npt.NDArray[np.int64]: ...
    def is_started(self, seq_id: _RequestId) -> bool: ...
    def get_block_hashes(self, seq_id: _RequestId) -> BlockHashList: ...
    def get_token_ids(self, seq_id: _RequestId) -> npt.NDArray[np.int64]: ...
    def reset_sequence(self, seq_id: _RequestId) -> None: ...
    def remove_sequence(self, seq_id: _RequestId) -> None: ...
    def __len__(self) -> int: ...
    def __contains__(self, seq_id: object, /) -> bool: ...

@final
class StepResult:
    """What ``KVCacheManager.schedule_step`` did, per request in order."""

    @property
    def block_ids(self) -> _BlockIds: ...
    @property
    def offsets(self) -> npt.NDArray[np.int64]: ...
    @property
    def num_scheduled_tokens(self) -> npt.NDArray[np.int64]: ...
    @property
    def hit_block_ids(self) -> _BlockIds: ...
    @property
    def hit_offsets(self) -> npt.NDArray[np.int64]: ...
    @property
    def num_hit_tokens(self) -> npt.NDArray[np.int64]: ...
    @property
    def allocated(self) -> npt.NDArray[np.bool_]: ...
    @property
    def status(self) -> npt.NDArray[np.uint8]: ...
    def __len__(self) -> int: ...

@final
class BlockTables:
    """Per-request block tables over a ``BlockPool``, whose counters and hashes the caller owns."""

    def __new__(cls, pool: BlockPool, *, max_model_len: int, record_new_block_ids: bool | None = None) -> BlockTables: ...
    @property
    def pool(self) -> BlockPool: ...
    @property
    def max_model_len(self) -> int: ...
    def allocate_slots(
        self,
        request_id: _RequestId,
        num_computed_tokens: int,
        num_tokens: int,
        block_hashes: _HashesLike,
        num_new_tokens: int,
        num_new_computed_tokens: int | None = None,
        new_computed_blocks: _IdsLike | None = None,
        num_lookahead_tokens: int | None = None,
        num_external_computed_tokens: int | None = None,
        delay_cache_blocks: bool | None = None,
        full_sequence_must_fit: bool | None = None,
        reserved_blocks: int | None = None,
        watermark_blocks: int | None = None,
        token_ids: _IdsLike | None = None,
    ) -> _BlockIds | None: ...
    def cache_blocks(
        self,
        request_id: _RequestId,
        block_hashes: _HashesLike,
        num_tokens: int,
        *,
        token_ids: _IdsLike | None = None,
        lora_id: int | None = None,
        lora_name: str | None = None,
    ) -> None: ...
    def num_blocks_to_allocate(
        self, request_id: _RequestId, num_tokens: int, new_computed_blocks: _IdsLike | None = None
    ) -> int: ...
    def get_blocks(self, request_id: _RequestId) -> _BlockIds: ...
    def num_cached_blocks(self, request_id: _RequestId) -> int | None: ...
    def free(self, request_id: _RequestId) -> None: ...
    def pop_blocks(self, request_id: _RequestId) -> _BlockIds: ...
    def take_new_block_ids(self) -> _BlockIds: ...
    def request_ids(self) -> tuple[_RequestId, ...]: ...
    def check_invariants(self) -> None: ...

@final
class GroupManager:
    """``KVCacheManager`` for a hybrid model: several KV-cache groups (full attention, sliding
    window, chunked local) over one pool; per-group results are tuples of int32 arrays."""

    def __new__(
        cls,
        num_blocks: int,
        block_size: int,
        groups: Sequence[str | tuple[str] | tuple[str, int]],
        *,
        enable_caching: bool | None = None,
        hash_algo: _HashAlgoName | None = None,
        seed: str | None = None,
        enable_events: bool | None = None,
        max_model_len: int | None = None,
        max_in_flight_tokens: int | None = None,
        retention_interval: int | None = None,
    ) -> GroupManager: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def num_groups(self) -> int: ...
    def add_request(
        self,
        request_id: _RequestId,
        prompt_token_ids: _IdsLike,
        *,
        lora: _LoraSpec | None = None,
        lora_id: int | None = None,
        cache_salt: str | None = None,
        mm_features: Sequence[_MmFeatureSpec] | None = None,
        prompt_embed_digests: Sequence[bytes] | None = None,
    ) -> None: ...
    def append_token_ids(self, request_id: _RequestId, token_ids: _IdsLike) -> None: ...
    def get_computed_blocks(self, request_id: _RequestId) -> tuple[tuple[_BlockIds, ...], int]: ...
    def allocate_slots(
        self,
        request_id: _RequestId,
        num_new_tokens: int,
        *,
        num_new_computed_tokens: int | None = None,
        new_computed_blocks: Sequence[_IdsLike] | None = None,
        num_lookahead_tokens: int | None = None,
    ) -> tuple[_BlockIds, ...] | None: ...
    def schedule_step(
        self,
        request_ids: Sequence[_RequestId],
        num_new_tokens: int | _IdsLike,
        *,
        num_lookahead_tokens: int | _IdsLike | None = None,
        stop_at_first_failure: bool | None = None,
        token_budget: int | None = None,
        max_num_requests: int | None = None,
        preempt: bool | None = None,
    ) -> StepResult: ...
    def get_block_ids(self, request_id: _RequestId) -> tuple[_BlockIds, ...]: ...
    def get_num_tokens(self, request_id: _RequestId) -> int: ...
    def get_num_computed_tokens(self, request_id: _RequestId) -> int: ...
    def free(self, request_id: _RequestId) -> None: ...
    def preempt(self, request_id: _RequestId) -> None: ...
    def get_usage(self) -> float: ...
    def get_num_free_blocks(self) -> int: ...
    def take_events(self) -> list[KVCacheEvent]: ...
    def take_events_msgpack(
        self,
        ts: float | None = None,
        *,
        data_parallel_rank: int | None = None,
        group_specs: dict[int, tuple[str | None, int | None]] | None = None,
        medium: str | None = None,
    ) -> bytes: ...
    def reset_prefix_cache(self) -> bool: ...
    def check_invariants(self) -> None: ...
    def __len__(self) -> int: ...

@final
class GroupTables:
    """Block tables for the KV-cache groups of a hybrid model (full attention, sliding window,
    chunked local) over one ``BlockPool``, whose counters and hashes the caller owns."""

    def __new__(
        cls,
        pool: BlockPool,
        groups: Sequence[str | tuple[str] | tuple[str, int]],
        *,
        max_model_len: int,
        max_in_flight_tokens: int | None = None,
        retention_interval: int | None = None,
        record_new_block_ids: bool | None = None,
    ) -> GroupTables: ...
    @property
    def pool(self) -> BlockPool: ...
    @property
    def num_groups(self) -> int: ...
    @property
    def groups(self) -> tuple[tuple[str, int | None], ...]: ...
    def find_longest_cache_hit(
        self, block_hashes: _HashesLike, max_length: int
    ) -> tuple[tuple[_BlockIds, ...], int, int]: ...
    def allocate_slots(
        self,
        request_id: _RequestId,
        num_computed_tokens: int,
        num_tokens: int,
        num_prompt_tokens: int,
        block_hashes: _HashesLike,
        num_new_tokens: int,
        num_new_computed_tokens: int | None = None,
        new_computed_blocks: Sequence[_IdsLike] | None = None,
        num_lookahead_tokens: int | None = None,
        num_external_computed_tokens: int | None = None,
        delay_cache_blocks: bool | None = None,
        full_sequence_must_fit: bool | None = None,
        reserved_blocks: int | None = None,
        watermark_blocks: int | None = None,
        token_ids: _IdsLike | None = None,
        num_in_flight_tokens: int | None = None,
        shared_prefix_boundary: int | None = None,
    ) -> tuple[_BlockIds, ...] | None: ...
    def cache_blocks(
        self,
        request_id: _RequestId,
        block_hashes: _HashesLike,
        num_tokens: int,
        num_prompt_tokens: int,
        *,
        shared_prefix_boundary: int | None = None,
        token_ids: _IdsLike | None = None,
        lora_id: int | None = None,
        lora_name: str | None = None,
    ) -> None: ...
    def remove_skipped_blocks(self, request_id: _RequestId, processed_tokens: int) -> None: ...
    def get_blocks(self, request_id: _RequestId) -> tuple[_BlockIds, ...]: ...
    def num_cached_blocks(self, request_id: _RequestId, group: int) -> int | None: ...
    def free(self, request_id: _RequestId) -> None: ...
    def take_new_block_ids(self) -> _BlockIds: ...
    def request_ids(self) -> tuple[_RequestId, ...]: ...
    def check_invariants(self) -> None: ...

@final
class VllmGroupCalls:
    """vLLM 0.33's per-request ``KVCacheManager`` calls over ``GroupTables``, each one Rust call
    (for ``kvpool.vllm``'s hybrid manager)."""

    def __new__(
        cls,
        tables: GroupTables,
        empty_blocks: Any,
        blocks_class: Any,
        group_ids_of: Any,
        waiting_statuses: tuple[Any, ...],
        watermark_blocks: int,
    ) -> VllmGroupCalls: ...
    def allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int | None = None,
        new_computed_blocks: Any = None,
        num_lookahead_tokens: int | None = None,
        num_external_computed_tokens: int | None = None,
        delay_cache_blocks: bool | None = None,
        num_encoder_tokens: int | None = None,
        full_sequence_must_fit: bool | None = None,
        reserved_blocks: int | None = None,
        has_scheduled_reqs: bool | None = None,
        skip_zeroing_group_ids: Any = None,
    ) -> Any: ...
    def get_computed_blocks(self, request: Any, max_cache_hit_length: int | None = None) -> tuple[Any, int, int]: ...
    def get_blocks(self, request_id: _RequestId) -> Any: ...
    def estimate_cached_tokens(self, request: Any) -> int: ...
    def free(self, request: Any) -> None: ...
    def record_no_prefix_cache_stats(self, request: Any, num_hits: int) -> None: ...

@final
class VllmManagerCalls:
    """vLLM 0.33's per-request ``KVCacheManager`` calls, each one Rust call (for ``kvpool.vllm``)."""

    def __new__(
        cls,
        tables: BlockTables,
        empty_blocks: Any,
        blocks_class: Any,
        block_ids_of: Any,
        waiting_statuses: tuple[Any, ...],
        watermark_blocks: int,
    ) -> VllmManagerCalls: ...
    def allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int | None = None,
        new_computed_blocks: Any = None,
        num_lookahead_tokens: int | None = None,
        num_external_computed_tokens: int | None = None,
        delay_cache_blocks: bool | None = None,
        num_encoder_tokens: int | None = None,
        full_sequence_must_fit: bool | None = None,
        reserved_blocks: int | None = None,
        has_scheduled_reqs: bool | None = None,
        skip_zeroing_group_ids: Any = None,
    ) -> Any: ...
    def get_computed_blocks(self, request: Any, max_cache_hit_length: int | None = None) -> tuple[Any, int, int]: ...
    def get_blocks(self, request_id: _RequestId) -> Any: ...
    def estimate_cached_tokens(self, request: Any) -> int: ...
    def free(self, request: Any) -> None: ...
    def record_no_prefix_cache_stats(self, request: Any, num_hits: Any) -> None: ...

@final
class KVCacheManager:
    """The per-request block manager a scheduler calls (vLLM's KVCacheManager semantics)."""

    def __new__(
        cls,
        num_blocks: int,
        block_size: int,
        *,
        enable_caching: bool | None = None,
        hash_algo: _HashAlgoName | None = None,
        seed: str | None = None,
        enable_events: bool | None = None,
        max_model_len: int | None = None,
        stats_window: int | None = None,
        max_pending_events: int | None = None,
        eviction: _EvictionName | None = None,
        max_pinned_blocks: int | None = None,
        clock: _ClockName | None = None,
    ) -> KVCacheManager: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def enable_caching(self) -> bool: ...
    @property
    def hash_algo(self) -> _HashAlgoName: ...
    def add_request(
        self,
        request_id: _RequestId,
        prompt_token_ids: _IdsLike,
        *,
        lora: _LoraSpec | None = None,
        lora_id: int | None = None,
        cache_salt: str | None = None,
        mm_features: Sequence[_MmFeatureSpec] | None = None,
        prompt_embed_digests: Sequence[bytes] | None = None,
        priority: int | None = None,
        retention_s: float | None = None,
    ) -> None: ...
    def pin_prompt(self, token_ids: _IdsLike) -> int: ...
    def unpin_prompt(self, token_ids: _IdsLike) -> int: ...
    def unpin_all(self) -> int: ...
    def get_num_pinned_blocks(self) -> int: ...
    @property
    def eviction(self) -> _EvictionName: ...
    @property
    def now(self) -> float: ...
    def advance_clock(self, seconds: float) -> None: ...
    def get_computed_blocks(self, request_id: _RequestId) -> tuple[_BlockIds, int]: ...
    def allocate_slots(
        self,
        request_id: _RequestId,
        num_new_tokens: int,
        *,
        num_new_computed_tokens: int | None = None,
        new_computed_blocks: _IdsLike | None = None,
        num_lookahead_tokens: int | None = None,
    ) -> _BlockIds | None: ...
    def schedule_step(
        self,
        request_ids: Sequence[_RequestId],
        num_new_tokens: int | _IdsLike,
        *,
        num_lookahead_tokens: int | _IdsLike | None = None,
        stop_at_first_failure: bool | None = None,
        token_budget: int | None = None,
        max_num_requests: int | None = None,
        preempt: bool | None = None,
    ) -> StepResult: ...
    def append_token_ids(self, request_id: _RequestId, token_ids: _IdsLike) -> None: ...
    def append_token_ids_many(self, request_ids: Sequence[_RequestId], token_ids: _IdsLike, offsets: _IdsLike | None = None) -> None: ...
    def free(self, request_id: _RequestId) -> None: ...
    def free_many(self, request_ids: Sequence[_RequestId]) -> None: ...
    def preempt(self, request_id: _RequestId) -> None: ...
    def get_block_ids_many(self, request_ids: Sequence[_RequestId]) -> tuple[_BlockIds, npt.NDArray[np.int64]]: ...
    def get_num_tokens_many(self, request_ids: Sequence[_RequestId]) -> npt.NDArray[np.int64]: ...
    def get_num_computed_tokens_many(self, request_ids: Sequence[_RequestId]) -> npt.NDArray[np.int64]: ...
    def get_block_ids(self, request_id: _RequestId) -> _BlockIds: ...
    def get_block_hashes(self, request_id: _RequestId) -> BlockHashList: ...
    def get_num_tokens(self, request_id: _RequestId) -> int: ...
    def get_num_computed_tokens(self, request_id: _RequestId) -> int: ...
    def set_num_computed_tokens(self, request_id: _RequestId, num_computed_tokens: int) -> None: ...
    def free_block_ids(self) -> _BlockIds: ...
    def ref_counts(self) -> _BlockIds: ...
    def get_usage(self) -> float: ...
    def get_num_free_blocks(self) -> int: ...
    def take_events(self) -> list[KVCacheEvent]: ...
    def take_events_msgpack(
        self,
        ts: float | None = None,
        *,
        data_parallel_rank: int | None = None,
        group_specs: dict[int, tuple[str | None, int | None]] | None = None,
        medium: str | None = None,
    ) -> bytes: ...
    @property
    def num_pending_events(self) -> int: ...
    @property
    def num_dropped_events(self) -> int: ...
    def reset_prefix_cache(self) -> bool: ...
    @property
    def prefix_cache_stats(self) -> PrefixCacheStats: ...
    @property
    def recent_prefix_cache_stats(self) -> PrefixCacheStats: ...
    def request_ids(self) -> tuple[_RequestId, ...]: ...
    def check_invariants(self) -> None: ...
    def __contains__(self, request_id: object, /) -> bool: ...
    def __len__(self) -> int: ...
