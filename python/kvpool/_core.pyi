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
_HashesLike = BlockHashList | Sequence[bytes] | npt.NDArray[np.integer[Any]]  # ints: 8-byte big-endian

class KVPoolError(Exception):
    """Base class of every error kvpool raises."""

class NoFreeBlocksError(KVPoolError, ValueError):
    """Fewer free blocks than requested; nothing was allocated."""

class InvalidBlockIdError(KVPoolError, ValueError):
    """A block id is negative or out of range; nothing was changed."""

class DoubleFreeError(KVPoolError, ValueError):
    """A block would be freed while its reference count is already 0; nothing was changed."""

class BlockStateError(KVPoolError, ValueError):
    """A block is in the wrong state for the operation (caching a free or cached block)."""

class HashWidthError(KVPoolError, ValueError):
    """A block hash is empty, longer than 32 bytes, or of another width than the pool's."""

class DtypeError(KVPoolError, TypeError):
    """An argument has the wrong type or numpy dtype (block ids must be integers)."""

class InvalidArgumentError(KVPoolError, ValueError):
    """An argument is out of its valid range or inconsistent with another one."""

class CachingDisabledError(KVPoolError, RuntimeError):
    """A prefix-cache operation was called on a pool built with enable_caching=False."""

class InvariantError(KVPoolError, AssertionError):
    """check_invariants found the pool's structure inconsistent (a bug in kvpool)."""

@final
class BlockPool:
    """A pool of KV-cache blocks: free queue, reference counts and prefix cache.

    Semantics follow vLLM's v1 ``BlockPool``; block ids are numpy ``int32`` arrays.
    """

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
        adaptive_horizon: int | None = None,
    ) -> BlockPool: ...
    @property
    def num_blocks(self) -> int:
        """Number of blocks (ids ``0..num_blocks``)."""
    @property
    def block_size(self) -> int:
        """Tokens per block."""
    @property
    def enable_caching(self) -> bool:
        """Whether full blocks are kept in a prefix cache."""
    @property
    def enable_events(self) -> bool:
        """Whether KV-cache events are queued."""
    @property
    def null_block(self) -> int | None:
        """The null block's id (0), or None when the pool has none."""
    @property
    def hash_width(self) -> int | None:
        """Width of the pool's block hashes in bytes, None until the first cached hash fixes it."""
    def get_new_blocks(self, num_blocks: int) -> _BlockIds:
        """Allocate ``num_blocks`` blocks from the head of the free queue.

        Cached blocks among them are evicted from the prefix cache first. Raises
        ``NoFreeBlocksError`` (nothing allocated) when fewer are free. The result may be
        an array this pool returned before that nothing references any more, written
        again (a held array, or one with a view, buffer or weak reference, never is).
        """
    def get_new_blocks_many(self, counts: _IdsLike) -> tuple[_BlockIds, npt.NDArray[np.int64]]:
        """Allocate for several requests in one call: ``counts[i]`` blocks for request ``i``.

        Returns ``(ids, offsets)``: request ``i``'s blocks are ``ids[offsets[i]:offsets[i+1]]``.
        All or nothing: raises ``NoFreeBlocksError`` if the total does not fit.
        """
    def free_blocks(self, block_ids: _IdsLike, *, reverse: bool | None = None) -> None:
        """Drop one reference to each block, in the order given (pass a request's blocks
        tail first), or from the last to the first with ``reverse=True`` (pass them in
        table order). Blocks reaching 0 rejoin the free queue: uncached ones at the head,
        cached ones at the tail. Raises ``DoubleFreeError`` (nothing freed) if a count
        would go below 0.
        """
    def free_blocks_many(
        self,
        blocks: Sequence[_IdsLike] | _IdsLike,
        offsets: _IdsLike | None = None,
        *,
        reverse: bool | None = None,
    ) -> None:
        """Free several requests' blocks in one call, all or nothing.

        ``blocks`` is a sequence of id arrays, or one flat id array cut by ``offsets``
        (as returned by ``get_new_blocks_many``). Each segment is freed in turn, reversed
        first when ``reverse`` is true.
        """
    def touch(self, block_ids: _IdsLike) -> None:
        """Take a reference to each block (reusing prefix-cache hits): free ones leave the
        free queue. The null block is skipped.
        """
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
    ) -> None:
        """Enter a request's newly full blocks into the prefix cache.

        ``block_ids`` and ``block_hashes`` are the request's blocks and hashes from its
        first block (``bytes`` of one width, or a numpy integer array of hash ids, each
        standing for its 8-byte big-endian form); blocks ``num_cached_blocks..num_full_blocks`` get their hashes.
        ``token_ids`` (the request's tokens), ``lora_id`` and ``lora_name`` only feed the
        ``BlockStored`` event. ``priority`` (``0..=100``) and ``retention_s`` give the
        new blocks a retention priority, for that many seconds (pools built with
        ``eviction="priority"``).
        """
    def get_cached_block(self, block_hash: bytes | int, group_id: int | None = None) -> int | None:
        """The block cached under ``block_hash`` in ``group_id`` (the first one inserted), or None.

        An int hash stands for its 8-byte big-endian form.
        """
    def find_longest_cache_hit(
        self,
        block_hashes: _HashesLike,
        *,
        group_id: int | None = None,
        max_blocks: int | None = None,
    ) -> _BlockIds:
        """The cached blocks of the longest cached prefix of ``block_hashes`` (at most
        ``max_blocks``); the scan stops at the first miss. Changes nothing.
        """
    def _set_block_hash(self, block_id: int, block_hash: bytes | None, group_id: int | None = None, *,
                        requeue: bool = False, num_tokens: int | None = None) -> None:
        """Give block ``block_id`` the key ``(block_hash, group_id)``, or take its key away
        (``block_hash=None``), where it is: no event, no move in the free queue;
        ``num_tokens`` is what ``block_hash_num_tokens`` then reads (None: unknown). With
        ``requeue=True`` a free block without a key is instead taken from the free queue,
        keyed and freed again (to the queue's tail), all checks first. For
        ``kvpool.vllm``'s view of vLLM's ``cached_block_hash_to_block`` dict, which vLLM's
        tests edit; not for engines.
        """
    def evict_blocks(self, block_ids: _IdsLike) -> None:
        """Drop the cached hash of each block, in use or not; frees nothing."""
    def reset_prefix_cache(self) -> bool:
        """Clear the whole prefix cache. Refused (returns False, nothing changes) while any
        block is in use.
        """
    def get_num_free_blocks(self) -> int:
        """Number of blocks in the free queue."""
    def get_num_cached_blocks(self) -> int:
        """Number of blocks holding a cached hash."""
    def get_num_cached_keys(self) -> int:
        """Number of distinct keys in the prefix cache (a key several blocks hold counts once;
        the extra keys of groups with larger blocks count): the length of vLLM's
        ``cached_block_hash_to_block``.
        """
    def get_usage(self) -> float:
        """Fraction of usable blocks in use (the null block not counted)."""
    def take_events(self) -> list[KVCacheEvent]:
        """The queued KV-cache events, oldest first; the queue is emptied."""
    def take_events_msgpack(
        self,
        ts: float | None = None,
        *,
        data_parallel_rank: int | None = None,
        group_specs: dict[int, tuple[str | None, int | None]] | None = None,
        medium: str | None = None,
        replay: ReplayRing | None = None,
        seq: int | None = None,
    ) -> bytes:
        """The queued events (the queue is emptied) as the msgpack payload vLLM 0.33's
        publisher sends: one ``EventBatch``, hashes as integers (``kvpool.wire``'s bytes,
        encoded in Rust without a Python object per event and without the GIL). ``ts``
        defaults to now; ``group_specs`` maps a group index to ``(kv_cache_spec_kind,
        kv_cache_spec_sliding_window)``.
        With ``replay`` (a ``ReplayRing``) and ``seq``, a batch that has events is also
        held in the ring as batch ``seq`` (written there with stores that bypass the
        cache, on this thread, the GIL released); the ring's refusal (closed, or
        ``seq`` not above its last batch) is raised before any event is taken; a
        refusal caused meanwhile by another thread puts the events back in the queue.
        """
    def send_events(
        self,
        sink: ZmqSink,
        seq: int,
        ts: float | None = None,
        *,
        data_parallel_rank: int | None = None,
        group_specs: dict[int, tuple[str | None, int | None]] | None = None,
        medium: str | None = None,
        replay: ReplayRing | None = None,
    ) -> int:
        """Takes the queued events as one batch, encoded as ``take_events_msgpack`` encodes
        it, holds it in ``replay`` (a ``ReplayRing``, if given) as batch ``seq`` and sends
        it on ``sink`` (a ``ZmqSink``) as vLLM's three frames, the payload lent to ZeroMQ
        rather than copied (``ZmqPublisher.publish_from``). Returns the payload's length
        in bytes; 0 when there was no event, and then nothing is held or sent. A closed
        sink or ring, or ``seq`` not above the ring's last batch, is raised before any
        event is taken (a refusal caused meanwhile by another thread puts the events
        back in the queue); a send that fails after that raises ``TransportError`` with
        the batch held.
        """
    @property
    def max_pending_events(self) -> int:
        """Most events queued before the oldest are dropped."""
    @property
    def num_pending_events(self) -> int:
        """Number of queued events (what ``take_events`` would return)."""
    @property
    def num_dropped_events(self) -> int:
        """Events dropped, oldest first, because ``max_pending_events`` were already
        queued; counted since the pool was built.
        """
    def free_block_ids(self) -> _BlockIds:
        """The free queue's block ids, head (next to be reused) to tail."""
    def ref_count(self, block_id: int) -> int:
        """Block ``block_id``'s reference count."""
    def ref_counts(self) -> _BlockIds:
        """Every block's reference count, in id order."""
    def ref_counts_of(self, block_ids: _IdsLike) -> _BlockIds:
        """The reference counts of ``block_ids`` (int32, in the order given): what a
        scheduler reads to see whether hits are free (count 0) before admitting them.
        """
    def block_hash(self, block_id: int) -> tuple[bytes, int] | None:
        """Block ``block_id``'s cached ``(hash, group_id)``, or None."""
    def block_hash_num_tokens(self, block_id: int) -> int | None:
        """The length of the sequence block ``block_id``'s key covers (vLLM's
        ``KVCacheBlock.block_hash_num_tokens``): the block's end position in its chain
        (``(num_cached_blocks + i + 1) * block_size`` as ``cache_full_blocks`` cached
        it), or None while it holds no key.
        """
    def extra_block_hashes(self, block_id: int) -> list[tuple[bytes, int]]:
        """Block ``block_id``'s keys beyond its primary one (``block_hash``), as
        ``(hash, group_id)`` in the order they were added: the partial-block entries of
        groups whose blocks are larger than the hash granularity (vLLM's
        ``BlockPool.cached_block_hashes_by_block``). Empty for most blocks.
        """
    def cached_block_ids(self) -> _BlockIds:
        """The blocks that hold a block hash (``block_hash(id)`` is not None), in id order:
        one call in O(cached blocks), where asking ``block_hash`` of every block is one
        call per block of the pool.
        """
    def blocks_with_extra_hashes(self) -> _BlockIds:
        """The blocks that hold keys beyond their primary one (see
        ``extra_block_hashes``), in id order.
        """
    def free_block_ids_after(self, cursor: int | None, max_blocks: int) -> _BlockIds:
        """At most ``max_blocks`` free block ids after block ``cursor`` in the free queue,
        head to tail (from the head when ``cursor`` is None; none when ``cursor`` is not
        free): vLLM's ``FreeKVCacheBlockQueue.iter_blocks_after``, in batches. Costs
        O(``max_blocks``) from any free block under LRU and priorities (from a cached
        block under the adaptive policy, also O(its position among the cached blocks)).
        """
    def free_block_id_before(self, block_id: int | None) -> int | None:
        """The free block just before block ``block_id`` in the free queue, toward the head
        (vLLM's ``KVCacheBlock.prev_free_block``), or None when ``block_id`` is the head or
        not free; with ``block_id`` None, the queue's last block (None when it is empty).
        O(1) for a cached block under LRU and priorities, and for the last block whenever
        a cached block is free.
        """
    def check_invariants(self) -> None:
        """Walk the whole structure; raise ``InvariantError`` listing every broken invariant."""
    def set_priority(self, block_ids: _IdsLike, priority: int, *, retention_s: float | None = None) -> None:
        """Give blocks (in use or free) a retention priority ``0..=100``, for
        ``retention_s`` seconds if given, after which it reverts to the default (35).
        A free cached block moves to the tail of its new priority. Needs
        ``eviction="priority"``.
        """
    def block_priority(self, block_id: int) -> tuple[int, float | None]:
        """Block ``block_id``'s retention ``(priority, expires_at)`` in force now
        (``expires_at`` on the pool's clock, None: never); ``(35, None)`` once a
        duration ran out, and under other policies.
        """
    def pin_prefix(self, block_hashes: _HashesLike, *, group_id: int | None = None) -> int:
        """Pin the cached blocks of the longest cached prefix of ``block_hashes`` (in
        ``group_id``): they hold a reference each and are never evicted until
        unpinned. Returns that prefix's length in blocks. Raises ``PinBudgetError``
        (nothing pinned) beyond ``max_pinned_blocks``.
        """
    def unpin_prefix(self, block_hashes: _HashesLike, *, group_id: int | None = None) -> int:
        """Unpin the pinned blocks of the longest cached prefix of ``block_hashes``,
        freeing the pin's reference (tail first); returns how many were unpinned.
        """
    def unpin_all(self) -> int:
        """Unpin every pinned block; returns how many there were."""
    def get_num_pinned_blocks(self) -> int:
        """Number of pinned blocks."""
    def pinned_block_ids(self) -> _BlockIds:
        """The pinned blocks' ids, ascending."""
    @property
    def max_pinned_blocks(self) -> int:
        """Most blocks that may be pinned at once."""
    @property
    def adaptive_horizon(self) -> int:
        """The adaptive policy's horizon in blocks freed (``adaptive_horizon=``; by default
        20,000 in pools up to 25,000 blocks, fading to 0 at 30,000): how much later than
        it was a block two or more requests used counts as freed. Unused by the other
        policies.
        """
    @property
    def eviction(self) -> _EvictionName:
        """The eviction policy: ``"lru"``, ``"priority"`` or ``"adaptive"``."""
    @property
    def clock(self) -> _ClockName:
        """The clock retention durations run on: ``"monotonic"`` or ``"manual"``."""
    @property
    def now(self) -> float:
        """The pool's clock in seconds (since the pool was built, or as advanced)."""
    def advance_clock(self, seconds: float) -> None:
        """Move a ``clock="manual"`` pool's clock forward by ``seconds`` (>= 0)."""
    @property
    def num_evictions(self) -> int:
        """Cached blocks evicted to make room for allocations, since the pool was built."""

class UnknownRequestError(KVPoolError, KeyError):
    """A request id that the manager does not track."""

class DuplicateRequestError(KVPoolError, ValueError):
    """A request id that the manager already tracks."""

class OutOfMemoryError(KVPoolError, MemoryError):
    """Memory for a pool, a manager or a batch could not be allocated; nothing was changed."""

class PinBudgetError(KVPoolError, ValueError):
    """Pinning would exceed the pool's budget of pinned blocks (max_pinned_blocks); nothing was pinned."""

class TransportError(KVPoolError, RuntimeError):
    """A batch could not be handed to ZeroMQ: the socket is closed, its context terminated, or the libzmq pyzmq uses cannot be reached from kvpool."""

_HashAlgoName = Literal["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]
_EvictionName = Literal["lru", "priority", "adaptive"]
_ClockName = Literal["monotonic", "manual"]
_LoraSpec = tuple[str, str]  # (lora_name, lora_path)
_MmFeatureSpec = tuple[str, int, int]  # (identifier, offset, length)
# "full", ("sliding_window", window), ("chunked_local", chunk), or with a block size third:
# ("full", None, 32), ("sliding_window", 128, 32)
_GroupSpec = str | tuple[str] | tuple[str, int] | tuple[str, int | None, int]

@final
class BlockHashList:
    """A request's block hashes, kept in Rust: one flat buffer of equal-width digests.

    Pass it straight to ``BlockPool.cache_full_blocks`` / ``find_longest_cache_hit``;
    ``to_list()`` / indexing give ``bytes`` on request. It grows only by appending.
    """

    @property
    def width(self) -> int:
        """Digest width in bytes (32 for SHA-256, 16 for xxh3-128)."""
    @property
    def hash_algo(self) -> _HashAlgoName:
        """Name of the algorithm that produced the hashes."""
    def __len__(self) -> int: ...
    @overload
    def __getitem__(self, index: int, /) -> bytes: ...
    @overload
    def __getitem__(self, index: slice, /) -> BlockHashList: ...
    def to_list(self) -> list[bytes]:
        """The hashes as a list of ``bytes``."""
    def to_bytes(self) -> bytes:
        """All hashes back to back as one ``bytes`` object."""
    def to_ints(self) -> npt.NDArray[np.uint64]:
        """The hashes as vLLM's KV-event wire format writes them: the last 8 bytes of
        each, big-endian, as ``uint64``.
        """
    def __eq__(self, other: object, /) -> bool: ...

@final
class BlockHasher:
    """Hashes token blocks into chains of vLLM-compatible block hashes.

    ``BlockHasher(block_size, hash_algo="sha256_cbor", seed=None)``: ``hash_algo`` is
    one of ``sha256``, ``sha256_cbor``, ``xxhash``, ``xxhash_cbor``; ``NONE_HASH`` is
    ``H(seed)``, the seed defaulting to vLLM's ``"vllm-none-hash"``.
    """

    def __new__(cls, block_size: int, *, hash_algo: _HashAlgoName | None = None, seed: str | None = None) -> BlockHasher: ...
    @property
    def block_size(self) -> int:
        """Tokens per block."""
    @property
    def hash_algo(self) -> _HashAlgoName:
        """The algorithm's name."""
    @property
    def none_hash(self) -> bytes:
        """``NONE_HASH``, the parent of every first block."""
    def hash_tokens(
        self,
        token_ids: _IdsLike,
        *,
        lora: _LoraSpec | None = None,
        cache_salt: str | None = None,
        mm_features: Sequence[_MmFeatureSpec] | None = None,
        prompt_embed_digests: Sequence[bytes] | None = None,
    ) -> BlockHashList:
        """Hashes every full block of ``token_ids`` (numpy int array or list), with the
        request's extra keys. Returns a ``BlockHashList``.
        """
    def hash_blocks_from(
        self,
        parent: bytes | None,
        token_ids: _IdsLike,
        start_block: int,
        *,
        lora: _LoraSpec | None = None,
        cache_salt: str | None = None,
        mm_features: Sequence[_MmFeatureSpec] | None = None,
        prompt_embed_digests: Sequence[bytes] | None = None,
    ) -> list[bytes]:
        """The hashes of the full blocks of ``token_ids`` (a request's tokens so far) from
        block ``start_block`` on, the first chained to ``parent`` (the hash of block
        ``start_block - 1``; None: this hasher's ``NONE_HASH``), as a list of ``bytes``:
        what vLLM's ``request_block_hasher`` appends to ``request.block_hashes``.
        Multimodal inputs are walked from ``start_block`` as vLLM's hasher resumes.
        Only the tokens from block ``start_block`` on are read (a list's in place).
        """
    def hash_tokens_many(self, token_lists: Sequence[_IdsLike]) -> list[BlockHashList]:
        """Hashes several requests' tokens in one call; returns one ``BlockHashList`` each."""
    def extend(
        self,
        hashes: BlockHashList,
        token_ids: _IdsLike,
        *,
        lora: _LoraSpec | None = None,
        cache_salt: str | None = None,
        mm_features: Sequence[_MmFeatureSpec] | None = None,
        prompt_embed_digests: Sequence[bytes] | None = None,
    ) -> int:
        """Appends to ``hashes`` the hashes of the full blocks of ``token_ids`` (all of
        the request's tokens so far) that it lacks; the old blocks are not rehashed.
        Returns the number of new hashes.
        """
    def hash_block(self, parent: bytes | None, token_ids: _IdsLike, extra_keys: object = None) -> bytes:
        """One block's hash: ``H((parent or NONE_HASH, tuple(token_ids), extra_keys))``,
        ``extra_keys`` any None/int/bytes/str/tuple value (vLLM's tagged tuples). For the
        pickle algorithms, objects the caller shares (the same str twice, vLLM's tag
        literals) are memo references, as in Python's pickle.
        """

def compute_none_hash(hash_algo: _HashAlgoName | None = None, seed: str | None = None) -> bytes:
    """``NONE_HASH`` of ``hash_algo`` for ``seed`` (vLLM's default seed when None)."""
def encode_hash_input(value: object, hash_algo: _HashAlgoName | None = None) -> bytes:
    """The bytes ``hash_algo`` hashes for ``value``: ``cbor2.dumps(value, canonical=True)``
    or ``pickle.dumps(value, protocol=5)``, encoded in Rust. For pickle, every str, bytes
    and tuple is written as a distinct object; where the caller passes the *same* object
    twice, Python's pickler writes a memo reference instead, and the bytes differ.
    """
def hash_value(value: object, hash_algo: _HashAlgoName | None = None) -> bytes:
    """``H(value)`` with ``hash_algo``, as vLLM's hash functions compute it."""
def find_group_hit(
    pool: BlockPool,
    group: _GroupSpec,
    block_hashes: _HashesLike,
    max_length: int,
    *,
    group_ids: Sequence[int] | None = None,
    alignment_tokens: int | None = None,
) -> tuple[tuple[_BlockIds, ...], int]:
    """The longest prefix hit of ``block_hashes`` (one per ``pool.block_size`` tokens)
    for one group kind, at most ``max_length`` tokens: ``(blocks per group id,
    num_tokens)``, the null block where the kind skips a block. ``group`` is a
    spec as ``GroupTables`` takes it (``"full"``, ``("sliding_window", window)``,
    ``("chunked_local", chunk)``, optionally with the group's block size, a
    multiple of the pool's, as a third item); the hit holds for every group of
    ``group_ids`` (default ``(0,)``) and its length is a multiple of
    ``alignment_tokens`` (default: the group's block size). Changes nothing.
    """
def ghost_fingerprint(block_hash: bytes, group: int | None = None) -> int:
    """The fingerprint by which the adaptive policy's ghost table knows the key
    ``(block_hash, group)``: what ``kvpool.reference`` computes in plain Python, so
    that the two tables agree way for way.
    """

_RequestId = str | int

@final
class ComputedBlocksTracker:
    """Tracks, per sequence, its tokens, its block hashes (incremental) and how many
    of its tokens are already computed in ``pool``'s prefix cache.

    The count is looked up afresh on every query until the sequence's prefill
    starts (``start``), then fixed, so blocks other sequences computed while it
    waited count and its own chunks never inflate it. It never changes counts.
    """

    def __new__(
        cls, pool: BlockPool, block_size: int, *, hash_algo: _HashAlgoName | None = None, seed: str | None = None
    ) -> ComputedBlocksTracker: ...
    @property
    def pool(self) -> BlockPool:
        """The pool whose prefix cache is read."""
    @property
    def block_size(self) -> int:
        """Tokens per block."""
    @property
    def hash_algo(self) -> _HashAlgoName:
        """The hash algorithm's name."""
    def add_sequence(
        self,
        seq_id: _RequestId,
        token_ids: _IdsLike,
        *,
        lora: _LoraSpec | None = None,
        cache_salt: str | None = None,
        mm_features: Sequence[_MmFeatureSpec] | None = None,
        prompt_embed_digests: Sequence[bytes] | None = None,
    ) -> None:
        """Starts tracking a sequence with its prompt token ids and extra keys (LoRA
        ``(name, path)``, cache salt, multimodal ``(identifier, offset, length)``
        features sorted by offset, per-block prompt-embedding digests).
        """
    def append_tokens(self, seq_id: _RequestId, token_ids: _IdsLike) -> int:
        """Appends token ids (a chunk, or decoded tokens); returns the number of blocks
        that became full and were hashed.
        """
    def append_tokens_many(self, seq_ids: Sequence[_RequestId], token_ids: _IdsLike, offsets: _IdsLike | None = None) -> None:
        """Appends tokens to several sequences: segment ``i`` of ``token_ids`` (cut by
        ``offsets``, or one token each when ``offsets`` is None) goes to ``seq_ids[i]``.
        All ids are checked first.
        """
    def get_num_cached_tokens(self, seq_id: _RequestId) -> int:
        """Tokens of the sequence already computed in the prefix cache: full blocks
        only, never its last token; fixed once the sequence started.
        """
    def get_num_cached_tokens_many(self, seq_ids: Sequence[_RequestId]) -> npt.NDArray[np.int64]:
        """``get_num_cached_tokens`` for several sequences, as an int64 array."""
    def start(self, seq_id: _RequestId) -> int:
        """Marks the sequence's prefill as started: its computed count is fixed at what
        the pool gives now (returned). A started sequence keeps its count.
        """
    def start_many(self, seq_ids: Sequence[_RequestId]) -> npt.NDArray[np.int64]:
        """``start`` for several sequences, in order; returns their counts."""
    def is_started(self, seq_id: _RequestId) -> bool:
        """Whether the sequence's prefill has started."""
    def get_block_hashes(self, seq_id: _RequestId) -> BlockHashList:
        """The sequence's block hashes (full blocks), as a ``BlockHashList``."""
    def get_token_ids(self, seq_id: _RequestId) -> npt.NDArray[np.int64]:
        """The sequence's token ids so far, as an int64 array."""
    def reset_sequence(self, seq_id: _RequestId) -> None:
        """Preemption: forgets the fixed count (tokens and hashes stay); the next query
        looks up afresh.
        """
    def remove_sequence(self, seq_id: _RequestId) -> None:
        """Stops tracking the sequence (it finished or was freed)."""
    def __len__(self) -> int: ...
    def __contains__(self, seq_id: object, /) -> bool: ...

@final
class ReplayRing:
    """The last ``max_batches`` event payloads within ``max_bytes`` (the newest always
    held), for replay to subscribers that missed them.

    ``append`` copies a payload into the ring, with stores that go straight to memory
    (the ring is written once a step and read only for a replay, so its lines are not
    worth a place in the publishing core's cache). Oldest batches go first, once more
    than ``max_batches`` are held or a new one needs their bytes; a payload larger than
    the ring is held alone.

    The ring's room is reserved, not written, so that memory is used only as batches
    fill it; ``prefault=True`` writes it all once here instead, so that no append faults
    a page in (the first lap otherwise does, on the appending thread).

    The ring's lock is held for a few pointer moves or one batch's copy, and every call
    takes it with the GIL released.
    """

    def __new__(cls, max_batches: int, max_bytes: int, *, prefault: bool | None = None) -> ReplayRing: ...
    def append(self, seq: int, payload: bytes) -> None:
        """Holds ``payload`` (``bytes``) as batch ``seq``. Numbers must increase from call
        to call (``InvalidArgumentError`` otherwise, holding nothing); raises
        ``TransportError`` (a ``RuntimeError``) once closed.
        """
    def batches_from(self, first: int) -> list[tuple[int, bytes]]:
        """The held batches numbered ``first`` or later, oldest first, as ``(seq, bytes)``."""
    @property
    def last_seq(self) -> int | None:
        """The number of the last batch appended (held, or let go since), or ``None``."""
    def __len__(self) -> int: ...
    @property
    def num_bytes(self) -> int:
        """Payload bytes held."""
    def drain(self, timeout: float) -> bool:
        """True: every batch is held once ``append`` returns. Kept from the ring's first
        design, which copied on a thread of its own (``timeout`` is still checked).
        """
    def close(self) -> None:
        """Later appends raise; what is held stays readable."""

@final
class ZmqSink:
    """A pyzmq ``PUB`` (or ``XPUB``) socket that event batches are sent on from Rust, each
    as vLLM's three frames (topic, sequence number as 8 bytes big-endian, payload), the
    payload lent to ZeroMQ without a copy (``send_events`` of a manager, a pool or a
    group manager; ``ZmqPublisher`` uses it when it can).

    Raises ``TransportError`` when the libzmq pyzmq uses cannot be reached from here
    (not Linux, or no single loaded libzmq of pyzmq's version), ``DtypeError`` for
    anything but a ``zmq.Socket`` (and a topic not ``bytes``) and ``InvalidArgumentError``
    for a socket closed or of another type than PUB or XPUB. The
    socket stays pyzmq's: options, binding and closing go through it; the sink keeps it
    alive and sends only while it is open. Like the socket, a sink must not be used by
    two threads at once.
    """

    def __new__(cls, socket: Any, topic: bytes | None = None) -> ZmqSink: ...
    def send(self, seq: int, payload: bytes) -> None:
        """Sends ``payload`` (``bytes``) as batch ``seq``: the topic, the sequence number as 8
        bytes big-endian and the payload, which is lent to ZeroMQ rather than copied (kept
        alive until ZeroMQ is done with it, and let go by a later send). Raises
        ``TransportError`` if the socket is closed or the send fails.
        """
    @property
    def topic(self) -> bytes:
        """The topic frame every batch is sent with."""
    @property
    def libzmq_version(self) -> tuple[int, int, int]:
        """The libzmq version in use, ``(major, minor, patch)``."""

@final
class KVCacheBlockView:
    """One block of a ``kvpool.BlockPool`` as vLLM's ``KVCacheBlock``: ``block_id``,
    ``ref_cnt``, ``block_hash`` (vLLM's ``BlockHashWithGroupId``), ``is_null``,
    ``block_hash_num_tokens`` and the free-list neighbours, read from the pool each
    time. Two views are equal when they show the same block of the same pool.
    """

    def __new__(cls, pool: BlockPool, block_id: int) -> KVCacheBlockView: ...
    @staticmethod
    def of_ids(pool: BlockPool, block_ids: _IdsLike) -> list[KVCacheBlockView]:
        """Views of ``block_ids`` (a numpy integer array or a sequence of ints), in order,
        as a list: what vLLM's ``get_new_blocks`` and ``KVCacheBlocks.blocks`` hold.
        Every id is checked before any view is made.
        """
    @property
    def block_id(self) -> int:
        """The block's id."""
    @property
    def ref_cnt(self) -> int:
        """The block's reference count, now."""
    @property
    def is_null(self) -> bool:
        """True for the pool's null block (block 0 of a pool made with ``null_block=True``,
        the default; a pool without one has no null block).
        """
    @property
    def block_hash(self) -> bytes | None:
        """The block's key as vLLM's ``BlockHashWithGroupId`` (the hash, then the group id
        as 4 big-endian bytes), or None while it holds no key.
        """
    @property
    def block_hash_num_tokens(self) -> int | None:
        """The length of the sequence the block's key covers, or None while it holds none."""
    @property
    def next_free_block(self) -> Any:
        """The next block in the free queue (after the last one, the fake tail of
        ``kvpool.vllm``'s view of the queue, or None without one), or None when the block
        is not free.
        """
    @property
    def prev_free_block(self) -> Any:
        """The previous block in the free queue (before the first one, the fake head of
        ``kvpool.vllm``'s view of the queue, or None without one), or None when the block
        is not free.
        """
    @property
    def _num_tokens_when_unkeyed(self) -> int | None:
        """The token count recorded when the view's key was taken away, or None."""
    @_num_tokens_when_unkeyed.setter
    def _num_tokens_when_unkeyed(self, value: int | None) -> None:
        """The token count recorded when the view's key was taken away, or None."""
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class FreeBlockWalk:
    """The free blocks after a cursor, in eviction order, as ``KVCacheBlockView``s: vLLM's
    ``FreeKVCacheBlockQueue.iter_blocks_after``. Ids are read from the pool in growing
    batches; each step checks the queue's version, and if the pool changed since the
    batch was read, drops what is left of it and reads again after the last block
    yielded. So each step yields what vLLM's linked-list walk would yield at that
    moment: the current successor of the last block yielded, and nothing more once
    that block has left the queue.
    """

    def __new__(cls, pool: BlockPool, cursor: int | None = None) -> FreeBlockWalk: ...
    def __iter__(self) -> FreeBlockWalk: ...
    def __next__(self) -> KVCacheBlockView: ...

@final
class StepResult:
    """What ``schedule_step`` did, per request in the order given.

    With ``G`` groups (1 for ``KVCacheManager``), request ``i``'s group-``g`` new blocks
    are ``block_ids[offsets[i * G + g]:offsets[i * G + g + 1]]``; the blocks of its prefix
    hit (requests admitted in this step) are cut from ``hit_block_ids`` by ``hit_offsets``
    the same way, so an admitted request's whole table is its hit followed by its new
    blocks. ``status[i]`` is a ``kvpool.StepStatus`` code saying what happened to it.
    """

    @property
    def block_ids(self) -> _BlockIds:
        """New block ids of every request, back to back (int32)."""
    @property
    def offsets(self) -> npt.NDArray[np.int64]:
        """Where each request's (and group's) new blocks start and end (int64)."""
    @property
    def num_scheduled_tokens(self) -> npt.NDArray[np.int64]:
        """Tokens scheduled per request (int64; 0 unless scheduled)."""
    @property
    def hit_block_ids(self) -> _BlockIds:
        """The prefix-hit blocks of every request admitted in this step, back to back (int32)."""
    @property
    def hit_offsets(self) -> npt.NDArray[np.int64]:
        """Where each request's (and group's) hit blocks start and end (int64)."""
    @property
    def num_hit_tokens(self) -> npt.NDArray[np.int64]:
        """Prefix-hit tokens per request (int64; non-zero only for requests admitted now)."""
    @property
    def allocated(self) -> npt.NDArray[np.bool_]:
        """Whether each request got its slots (bool; ``status == StepStatus.SCHEDULED``)."""
    @property
    def status(self) -> npt.NDArray[np.uint8]:
        """What happened to each request: a ``kvpool.StepStatus`` code (uint8)."""
    def __len__(self) -> int: ...

@final
class BlockTables:
    """Per-request block tables over a ``BlockPool`` (whose block 0 is vLLM's null block),
    for a caller that owns each request's ``num_computed_tokens`` and ``block_hashes``
    and passes them in: vLLM 0.33's ``KVCacheManager`` with one full-attention group.
    Everything else about the blocks (free queue, counts, prefix cache, events) is the
    pool's, read and changed through ``pool``.

    ``BlockTables(pool, *, max_model_len, record_new_block_ids=False)``.
    """

    def __new__(cls, pool: BlockPool, *, max_model_len: int, record_new_block_ids: bool | None = None) -> BlockTables: ...
    @property
    def pool(self) -> BlockPool:
        """The pool whose blocks the tables hold."""
    @property
    def max_model_len(self) -> int:
        """Longest sequence a request may reach."""
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
        skip_zeroing_group_ids: _IdsLike | None = None,
    ) -> _BlockIds | None:
        """vLLM's ``allocate_slots`` for request ``request_id`` whose state is
        ``num_computed_tokens``, ``num_tokens`` and ``block_hashes``: the new blocks
        (int32; possibly an earlier result nothing references any more, written again),
        or ``None`` (nothing changed) when they do not fit.
        ``new_computed_blocks=None`` is vLLM's empty sentinel (nothing to adopt). Every
        argument may be given by position, so a hot caller avoids keyword parsing.
        ``skip_zeroing_group_ids`` holding 0 leaves the connector's blocks out of those
        recorded for zeroing (an async load writes them).
        """
    def cache_blocks(
        self,
        request_id: _RequestId,
        block_hashes: _HashesLike,
        num_tokens: int,
        *,
        token_ids: _IdsLike | None = None,
        lora_id: int | None = None,
        lora_name: str | None = None,
    ) -> None:
        """vLLM's ``cache_blocks``: caches the request's blocks full within its first
        ``num_tokens`` tokens.
        """
    def num_blocks_to_allocate(
        self, request_id: _RequestId, num_tokens: int, new_computed_blocks: _IdsLike | None = None
    ) -> int:
        """vLLM's ``get_num_blocks_to_allocate`` for the request."""
    def get_blocks(self, request_id: _RequestId) -> _BlockIds:
        """The request's blocks (int32; empty for an unknown request)."""
    def num_cached_blocks(self, request_id: _RequestId) -> int | None:
        """How many of the request's blocks are cached (``None`` until vLLM tracks it)."""
    def free(self, request_id: _RequestId) -> None:
        """Frees the request's blocks tail first and forgets it (unknown: no-op)."""
    def pop_blocks(self, request_id: _RequestId) -> _BlockIds:
        """Forgets the request and returns its blocks (int32, allocation order) without
        freeing them; the caller frees them later with ``pool.free_blocks``.
        """
    def record_blocks_for_zeroing(self, request_id: _RequestId, start_token: int) -> None:
        """vLLM's ``record_blocks_for_zeroing``: the request's blocks from token
        ``start_token`` on (a block boundary) are recorded for zeroing again (blocks a
        failed async load left unwritten). Nothing when not recording.
        """
    def take_new_block_ids(self) -> _BlockIds:
        """Ids of blocks allocated since the last call (int32; empty unless recording)."""
    def request_ids(self) -> tuple[_RequestId, ...]:
        """Requests with a table, sorted."""
    def check_invariants(self) -> None:
        """Raises ``InvariantError`` if the pool or the tables are inconsistent."""
    def __contains__(self, request_id: object, /) -> bool: ...
    def __len__(self) -> int: ...

@final
class GroupManager:
    """The block manager a scheduler calls per request, for a hybrid model: vLLM's
    ``KVCacheManager`` semantics over several KV-cache groups (full attention, sliding
    window, chunked local) in one pool, plus ``schedule_step``.

    ``GroupManager(num_blocks, block_size, groups, *, enable_caching=None,
    hash_algo=None, seed=None, enable_events=None, max_model_len=None,
    max_in_flight_tokens=None, retention_interval=None, eviction=None,
    max_pinned_blocks=None, clock=None, adaptive_horizon=None)``: ``groups`` as for
    ``GroupTables`` (``"full"``, ``("sliding_window", window)``,
    ``("chunked_local", chunk)``, each optionally with a block size of its own, a
    multiple of ``block_size``, as a third item); the eviction arguments as for
    ``KVCacheManager``. Per-group results are tuples of int32 arrays.
    """

    def __new__(
        cls,
        num_blocks: int,
        block_size: int,
        groups: Sequence[_GroupSpec],
        *,
        enable_caching: bool | None = None,
        hash_algo: _HashAlgoName | None = None,
        seed: str | None = None,
        enable_events: bool | None = None,
        max_model_len: int | None = None,
        max_in_flight_tokens: int | None = None,
        retention_interval: int | None = None,
        eviction: _EvictionName | None = None,
        max_pinned_blocks: int | None = None,
        clock: _ClockName | None = None,
        adaptive_horizon: int | None = None,
    ) -> GroupManager: ...
    @property
    def num_blocks(self) -> int:
        """Blocks in the pool (block 0 is the null block)."""
    @property
    def num_groups(self) -> int:
        """Number of KV-cache groups."""
    @property
    def adaptive_horizon(self) -> int:
        """The adaptive policy's horizon in blocks freed (``adaptive_horizon=``; by default
        20,000 in pools up to 25,000 blocks, fading to 0 at 30,000): how much later than
        it was a block two or more requests used counts as freed. Unused by the other
        policies.
        """
    @property
    def eviction(self) -> _EvictionName:
        """The eviction policy: ``"lru"``, ``"priority"`` or ``"adaptive"``."""
    @property
    def now(self) -> float:
        """The pool's clock in seconds (since the manager was built, or as advanced)."""
    def advance_clock(self, seconds: float) -> None:
        """Move a ``clock="manual"`` manager's clock forward by ``seconds`` (>= 0)."""
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
    ) -> None:
        """Adds a request: its prompt token ids and extra keys (as ``KVCacheManager``), and
        optionally the retention ``priority`` (``0..=100``, for ``retention_s`` seconds if
        given) of the blocks it caches or hits (managers built with ``eviction="priority"``).
        """
    def append_token_ids(self, request_id: _RequestId, token_ids: _IdsLike) -> None:
        """Appends token ids (generated, or newly known) to a request."""
    def get_computed_blocks(self, request_id: _RequestId) -> tuple[tuple[_BlockIds, ...], int]:
        """The longest prefix hit valid for every group, capped below the request's last
        token: ``(blocks per group, num_computed_tokens)``. Changes nothing.
        """
    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        """Prefix-cache statistics over every request admitted since the start (or last
        reset), as ``KVCacheManager.prefix_cache_stats``.
        """
    @property
    def recent_prefix_cache_stats(self) -> PrefixCacheStats:
        """Prefix-cache statistics over the last 1,000 new requests admitted (vLLM's
        ``CachingMetrics`` window, which resumed requests do not enter) and, in the
        ``preempted_*`` fields, over the last 1,000 resumed ones.
        """
    def set_num_computed_tokens(self, request_id: _RequestId, num_computed_tokens: int) -> None:
        """Rolls the request's computed tokens back to ``num_computed_tokens`` (at most the
        current count), as vLLM's scheduler does when it rejects speculative tokens.
        """
    def set_num_in_flight_tokens(self, request_id: _RequestId, num_in_flight_tokens: int) -> None:
        """vLLM's ``request.num_in_flight_tokens``: tokens scheduled in steps whose output has
        not come back (async scheduling, pipeline parallelism). Window groups keep the
        blocks those steps still read; set it after each step is scheduled and again when
        its output arrives.
        """
    def allocate_slots(
        self,
        request_id: _RequestId,
        num_new_tokens: int,
        *,
        num_new_computed_tokens: int | None = None,
        new_computed_blocks: Sequence[_IdsLike] | None = None,
        num_lookahead_tokens: int | None = None,
    ) -> tuple[_BlockIds, ...] | None:
        """Allocates slots for ``num_new_tokens`` new tokens (plus lookahead), adopting
        ``new_computed_blocks`` (per group, the hit from ``get_computed_blocks``) for a
        request that starts now. Returns each group's new blocks, or ``None`` when they do
        not fit (as in vLLM, blocks out of a window may have been given back).
        """
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
    ) -> StepResult:
        """One scheduler step in one call (as ``KVCacheManager.schedule_step``). Returns a
        ``StepResult`` whose ``offsets`` cut ``block_ids`` per request and group: request
        ``i``'s group-``g`` blocks are ``block_ids[offsets[i * G + g]:offsets[i * G + g + 1]]``
        for ``G`` groups.
        """
    def get_block_ids(self, request_id: _RequestId) -> tuple[_BlockIds, ...]:
        """The request's blocks, one int32 array per group."""
    def get_num_tokens(self, request_id: _RequestId) -> int:
        """The request's tokens so far."""
    def get_num_computed_tokens(self, request_id: _RequestId) -> int:
        """Tokens counted as computed for the request."""
    def free(self, request_id: _RequestId) -> None:
        """Frees the request's blocks (each group's tail first) and forgets it."""
    def preempt(self, request_id: _RequestId) -> None:
        """Frees the request's blocks; it keeps its tokens and restarts from zero."""
    def get_usage(self) -> float:
        """Fraction of usable blocks in use."""
    def get_num_free_blocks(self) -> int:
        """Free blocks in the pool."""
    @property
    def num_pending_events(self) -> int:
        """Number of queued events (what ``take_events`` would return)."""
    def take_events(self) -> list[KVCacheEvent]:
        """Queued KV-cache events, oldest first (the queue is emptied)."""
    def take_events_msgpack(
        self,
        ts: float | None = None,
        *,
        data_parallel_rank: int | None = None,
        group_specs: dict[int, tuple[str | None, int | None]] | None = None,
        medium: str | None = None,
        replay: ReplayRing | None = None,
        seq: int | None = None,
    ) -> bytes:
        """The queued events (the queue is emptied) as the msgpack payload vLLM 0.33's
        publisher sends: one ``EventBatch``, hashes as integers (``kvpool.wire``'s bytes,
        encoded in Rust without a Python object per event and without the GIL). ``ts``
        defaults to now; ``group_specs`` maps a group index to ``(kv_cache_spec_kind,
        kv_cache_spec_sliding_window)``.
        With ``replay`` (a ``ReplayRing``) and ``seq``, a batch that has events is also
        held in the ring as batch ``seq`` (written there with stores that bypass the
        cache, on this thread, the GIL released); the ring's refusal (closed, or
        ``seq`` not above its last batch) is raised before any event is taken; a
        refusal caused meanwhile by another thread puts the events back in the queue.
        """
    def send_events(
        self,
        sink: ZmqSink,
        seq: int,
        ts: float | None = None,
        *,
        data_parallel_rank: int | None = None,
        group_specs: dict[int, tuple[str | None, int | None]] | None = None,
        medium: str | None = None,
        replay: ReplayRing | None = None,
    ) -> int:
        """Takes the queued events as one batch, encoded as ``take_events_msgpack`` encodes
        it, holds it in ``replay`` (a ``ReplayRing``, if given) as batch ``seq`` and sends
        it on ``sink`` (a ``ZmqSink``) as vLLM's three frames, the payload lent to ZeroMQ
        rather than copied (``ZmqPublisher.publish_from``). Returns the payload's length
        in bytes; 0 when there was no event, and then nothing is held or sent. A closed
        sink or ring, or ``seq`` not above the ring's last batch, is raised before any
        event is taken (a refusal caused meanwhile by another thread puts the events
        back in the queue); a send that fails after that raises ``TransportError`` with
        the batch held.
        """
    def reset_prefix_cache(self) -> bool:
        """Clears the prefix cache (and the statistics); ``False`` (nothing changes) while
        blocks are in use.
        """
    def check_invariants(self) -> None:
        """Raises ``InvariantError`` if the pool, the tables or the requests disagree."""
    def __len__(self) -> int: ...

@final
class GroupTables:
    """Block tables for the KV-cache groups of a hybrid model over one ``BlockPool``
    (whose block 0 is the null block that stands for blocks a group skips).

    ``GroupTables(pool, groups, *, max_model_len, max_in_flight_tokens=None,
    retention_interval=None, record_new_block_ids=False, pool_group_ids=None,
    scheduler_block_size=None)``: ``groups`` lists each group's attention,
    ``"full"``, ``("sliding_window", window)`` or ``("chunked_local", chunk)``, with
    the pool's ``block_size``, or with a block size of its own (a multiple of the
    pool's) as a third item: ``("full", None, 32)``, ``("sliding_window", 128, 32)``.
    ``max_in_flight_tokens`` (default
    ``max_model_len``) bounds what a window group holds per request for the
    full-sequence gate; ``retention_interval`` is vLLM's
    ``prefix_cache_retention_interval``. When the tables are one part of a model's
    groups (vLLM's per-type manager of group ``kv_cache_group_id``),
    ``pool_group_ids`` gives each group's id in the pool's prefix cache (default:
    its index) and ``scheduler_block_size`` the model's hit granularity (default:
    the groups' least common block size). Per-group results are tuples of int32
    arrays, one per group.
    """

    def __new__(
        cls,
        pool: BlockPool,
        groups: Sequence[_GroupSpec],
        *,
        max_model_len: int,
        max_in_flight_tokens: int | None = None,
        retention_interval: int | None = None,
        record_new_block_ids: bool | None = None,
        pool_group_ids: Sequence[int] | None = None,
        scheduler_block_size: int | None = None,
    ) -> GroupTables: ...
    @property
    def pool(self) -> BlockPool:
        """The pool whose blocks the tables hold."""
    @property
    def num_groups(self) -> int:
        """Number of KV-cache groups."""
    @property
    def groups(self) -> tuple[tuple[str, int | None], ...]:
        """Each group's spec: ``("full_attention", None)``, ``("sliding_window", window)``
        or ``("chunked_local_attention", chunk)`` (the kinds' names in vLLM's KV events).
        """
    def find_longest_cache_hit(
        self, block_hashes: _HashesLike, max_length: int
    ) -> tuple[tuple[_BlockIds, ...], int, int]:
        """The longest prefix hit of ``block_hashes``, at most ``max_length`` tokens,
        valid for every group: ``(blocks per group, num_tokens,
        num_uncached_common_prefix_tokens)``. Changes nothing.
        """
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
        skip_zeroing_group_ids: _IdsLike | None = None,
    ) -> tuple[_BlockIds, ...] | None:
        """vLLM's ``allocate_slots`` for a request whose state is ``num_computed_tokens``,
        ``num_tokens``, ``num_prompt_tokens`` and ``block_hashes``: each group's new
        blocks, or ``None`` when they do not fit. ``new_computed_blocks`` is the hit's
        blocks per group (``None``: vLLM's empty sentinel). As in vLLM, blocks that
        fell out of a group's window are given back first, even if the call then
        returns ``None``. ``skip_zeroing_group_ids`` lists the groups whose connector
        blocks are left out of those recorded for zeroing (an async load writes them).
        """
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
    ) -> None:
        """vLLM's coordinator ``cache_blocks``: caches each group's blocks full within the
        first ``num_tokens`` tokens (a sliding-window group only the blocks a later hit
        can use, per ``retention_interval``).
        """
    def remove_skipped_blocks(self, request_id: _RequestId, processed_tokens: int) -> None:
        """vLLM's ``remove_skipped_blocks``: gives back the request's blocks that no group
        attends to once ``processed_tokens`` are computed; the null block takes their
        place.
        """
    def get_blocks(self, request_id: _RequestId) -> tuple[_BlockIds, ...]:
        """The request's blocks, one int32 array per group (empty for an unknown request)."""
    def num_cached_blocks(self, request_id: _RequestId, group: int) -> int | None:
        """How many of the request's blocks in ``group`` are cached (``None`` until
        tracked).
        """
    def free(self, request_id: _RequestId) -> None:
        """Frees the request's blocks, each group's tail first, and forgets it (unknown:
        no-op).
        """
    def record_blocks_for_zeroing(self, request_id: _RequestId, start_token: int) -> None:
        """vLLM's ``record_blocks_for_zeroing``: the request's blocks from token
        ``start_token`` on, in every group, are recorded for zeroing again (blocks a
        failed async load left unwritten); ``start_token`` must be at a block boundary
        of every group. Nothing when not recording.
        """
    def take_new_block_ids(self) -> _BlockIds:
        """Ids of blocks allocated since the last call, group by group (int32; empty
        unless recording).
        """
    def request_ids(self) -> tuple[_RequestId, ...]:
        """Requests with a table, sorted."""
    def num_blocks_to_allocate(
        self,
        request_id: _RequestId,
        num_tokens: int,
        total_computed_tokens: int,
        *,
        new_computed_blocks: Sequence[_IdsLike] | None = None,
        apply_admission_cap: bool | None = None,
    ) -> int:
        """vLLM's coordinator ``get_num_blocks_to_allocate``: the blocks the request needs
        in all groups together for ``num_tokens`` tokens after
        ``total_computed_tokens`` computed ones, with ``new_computed_blocks`` (one id
        sequence per group) the prefix hit it would add (hit blocks in the free queue
        count); ``apply_admission_cap=True`` caps each window group at what it holds at
        a time, as the full-sequence admission gate does. Changes nothing.
        """
    def group_num_blocks_to_allocate(
        self,
        request_id: _RequestId,
        group: int,
        num_tokens: int,
        new_computed_blocks: _IdsLike,
        total_computed_tokens: int,
        num_local_computed_tokens: int,
        *,
        admission_cap: int | None = None,
    ) -> int:
        """vLLM's ``get_num_blocks_to_allocate`` of one group's manager: the blocks the
        request needs in ``group`` for ``num_tokens`` tokens, at most
        ``admission_cap`` held at a time when given, with ``new_computed_blocks``
        the prefix hit it would add (hit blocks in the free queue count). Changes
        nothing.
        """
    def group_add_computed_blocks(
        self,
        request_id: _RequestId,
        group: int,
        new_computed_blocks: _IdsLike,
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        """vLLM's ``add_local_computed_blocks`` of one group's manager: the request's
        ``group`` table, which must be empty, takes the prefix hit (touched), the
        null block standing for blocks the group's window skips.
        """
    def group_allocate_external(
        self,
        request_id: _RequestId,
        group: int,
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
        record_for_zeroing: bool | None = None,
    ) -> None:
        """vLLM's ``allocate_external_computed_blocks`` of one group's manager: blocks
        for the connector-computed tokens the group keeps (recorded for zeroing when
        ``record_for_zeroing`` and the tables record). All or nothing.
        """
    def group_allocate_new_blocks(
        self, request_id: _RequestId, group: int, num_tokens: int
    ) -> _BlockIds:
        """vLLM's ``allocate_new_blocks`` of one group's manager: the new blocks (int32)
        that give the request's ``group`` table room for ``num_tokens`` tokens. All or
        nothing.
        """
    def group_adopt_blocks(self, request_id: _RequestId, group: int, ids: _IdsLike) -> None:
        """Hands the request's ``group`` table, which must be empty, the blocks ``ids``
        (as vLLM's tests assign ``req_to_blocks[request_id]``): a block the caller
        holds passes its reference to the table, a free block is taken out of the
        free queue first; the null block may stand anywhere, no other block twice.
        """
    def pop_tables(self, request_id: _RequestId) -> tuple[_BlockIds, ...] | None:
        """vLLM's ``pop_blocks_for_free``: forgets the request and returns its blocks,
        one int32 array per group, without freeing them (the caller now holds their
        references); ``None`` for an unknown request.
        """
    def num_skipped_tokens(self, group: int, num_computed_tokens: int) -> int:
        """vLLM's ``get_num_skipped_tokens`` of ``group``: the leading tokens the next
        token does not attend to once ``num_computed_tokens`` are computed.
        """
    def check_invariants(self) -> None:
        """Raises ``InvariantError`` if the pool or the tables are inconsistent."""
    def __contains__(self, request_id: object, /) -> bool: ...
    def __len__(self) -> int: ...

@final
class VllmGroupCalls:
    """``VllmGroupCalls(tables, empty_blocks, blocks_class, group_ids_of, waiting_statuses,
    watermark_blocks)``: vLLM's per-request ``KVCacheManager`` calls over ``tables``.
    Results holding blocks are ``empty_blocks`` when no group has one and
    ``blocks_class(tables.pool, groups)`` otherwise (``groups``: one int32 array per
    group); ``group_ids_of(blocks)`` reads the per-group ids of a ``KVCacheBlocks`` that
    is not a ``blocks_class`` (whose own are its ``groups``).
    """

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
    ) -> Any:
        """``KVCacheManager.allocate_slots(request, num_new_tokens, ...)`` with vLLM's
        arguments: ``empty_blocks`` when no group needed a new block, the new blocks, or
        ``None`` when they do not fit (blocks out of a window have still been given back,
        as in vLLM).
        """
    def get_computed_blocks(self, request: Any, max_cache_hit_length: int | None = None) -> tuple[Any, int, int]:
        """``KVCacheManager.get_computed_blocks(request, max_cache_hit_length=None)``: the hit
        valid for every group (at most ``max_cache_hit_length`` tokens, by default all but
        the last), its tokens, and the shared-prefix boundary (the hit plus what some
        group had cached beyond it; 0 when none). Nothing when caching is off or the
        request skips reading the prefix cache. Changes nothing.
        """
    def get_blocks(self, request_id: _RequestId) -> Any:
        """``KVCacheManager.get_blocks(request_id)``: the request's blocks per group."""
    def estimate_cached_tokens(self, request: Any) -> int:
        """``KVCacheManager.estimate_cached_tokens(request)``: per group, where its last cached
        block ends; the least over the groups.
        """
    def free(self, request: Any) -> None:
        """``KVCacheManager.free(request)``: frees the request's blocks, each group's tail
        first, and forgets it.
        """
    def record_no_prefix_cache_stats(self, request: Any, num_hits: int) -> None:
        """``KVCacheManager.record_prefix_cache_stats(request, num_hits)`` for a manager that
        records none: does nothing.
        """

@final
class VllmManagerCalls:
    """``VllmManagerCalls(tables, empty_blocks, blocks_class, block_ids_of, waiting_statuses,
    watermark_blocks)``: vLLM's per-request ``KVCacheManager`` calls over ``tables``.
    Results holding blocks are ``empty_blocks`` when there is none and
    ``blocks_class(tables.pool, ids)`` otherwise; ``block_ids_of(blocks)`` reads the ids of
    a ``KVCacheBlocks`` that is not a ``blocks_class``.
    """

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
    ) -> Any:
        """``KVCacheManager.allocate_slots(request, num_new_tokens, ...)`` with vLLM's
        arguments: ``empty_blocks`` when no new block was needed, the new blocks, or ``None``
        when they do not fit (nothing changes).
        """
    def get_computed_blocks(self, request: Any, max_cache_hit_length: int | None = None) -> tuple[Any, int, int]:
        """``KVCacheManager.get_computed_blocks(request, max_cache_hit_length=None)``: the
        blocks of the request's longest cached prefix (at most ``max_cache_hit_length``
        tokens, by default all but the last token), their token count, and 0 (the
        shared-prefix boundary, always 0 with one group). Nothing when caching is off or the
        request skips reading the prefix cache. Changes nothing.
        """
    def get_blocks(self, request_id: _RequestId) -> Any:
        """``KVCacheManager.get_blocks(request_id)``: the request's blocks."""
    def estimate_cached_tokens(self, request: Any) -> int:
        """``KVCacheManager.estimate_cached_tokens(request)``: the tokens the request's cached
        blocks cover, the end of the last block of its table that still holds a hash (a
        block at table index `i` was cached holding `(i + 1) * block_size` tokens; one
        whose hash was evicted counts no more, as in vLLM); 0 for an unknown request.
        """
    def free(self, request: Any) -> None:
        """``KVCacheManager.free(request)``: frees the request's blocks tail first and forgets
        it (an unknown request: nothing to do).
        """
    def record_no_prefix_cache_stats(self, request: Any, num_hits: Any) -> None:
        """``KVCacheManager.record_prefix_cache_stats(request, num_hits)`` for a manager that
        records none (statistics off, or prefix caching off): checks nothing, does nothing.
        """

@final
class KVCacheManager:
    """The block manager a scheduler calls per request (vLLM's ``KVCacheManager``
    semantics, one full-attention group), plus ``schedule_step`` to hand over a whole
    step in one call.
    """

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
        adaptive_horizon: int | None = None,
    ) -> KVCacheManager: ...
    @property
    def num_blocks(self) -> int:
        """Blocks in the pool (block 0 is the null block)."""
    @property
    def block_size(self) -> int:
        """Tokens per block."""
    @property
    def enable_caching(self) -> bool:
        """Whether the prefix cache is on."""
    @property
    def hash_algo(self) -> _HashAlgoName:
        """The block hash algorithm."""
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
    ) -> None:
        """Adds a request: its prompt token ids and extra keys (LoRA ``(name, path)``
        and ``lora_id`` for events, cache salt, multimodal ``(identifier, offset,
        length)`` features, per-block prompt-embedding digests).
        ``priority`` (``0..=100``, for ``retention_s`` seconds if given) is the
        retention priority of the blocks the request caches or hits (managers built
        with ``eviction="priority"``).
        """
    def pin_prompt(self, token_ids: _IdsLike) -> int:
        """Pin the cached full blocks of ``token_ids`` (a system prompt, hashed as a
        request without extra keys): they are never evicted until unpinned. Returns
        the blocks of its longest cached prefix. Raises ``PinBudgetError`` (nothing
        pinned) beyond ``max_pinned_blocks``.
        """
    def unpin_prompt(self, token_ids: _IdsLike) -> int:
        """Unpin what ``pin_prompt(token_ids)`` pinned; returns the blocks unpinned."""
    def unpin_all(self) -> int:
        """Unpin every pinned block; returns how many there were."""
    def get_num_pinned_blocks(self) -> int:
        """Number of pinned blocks."""
    @property
    def adaptive_horizon(self) -> int:
        """The adaptive policy's horizon in blocks freed (``adaptive_horizon=``; by default
        20,000 in pools up to 25,000 blocks, fading to 0 at 30,000): how much later than
        it was a block two or more requests used counts as freed. Unused by the other
        policies.
        """
    @property
    def eviction(self) -> _EvictionName:
        """The eviction policy: ``"lru"``, ``"priority"`` or ``"adaptive"``."""
    @property
    def now(self) -> float:
        """The pool's clock in seconds (since the manager was built, or as advanced)."""
    def advance_clock(self, seconds: float) -> None:
        """Move a ``clock="manual"`` manager's clock forward by ``seconds`` (>= 0)."""
    def get_computed_blocks(self, request_id: _RequestId) -> tuple[_BlockIds, int]:
        """The longest prefix-cache hit of a waiting request, capped below its last
        token: ``(block_ids, num_computed_tokens)``. Never changes counts.
        """
    def allocate_slots(
        self,
        request_id: _RequestId,
        num_new_tokens: int,
        *,
        num_new_computed_tokens: int | None = None,
        new_computed_blocks: _IdsLike | None = None,
        num_lookahead_tokens: int | None = None,
    ) -> _BlockIds | None:
        """Allocates slots for ``num_new_tokens`` new tokens (plus lookahead), taking
        ``new_computed_blocks`` (the hit from ``get_computed_blocks``) for a request
        that starts now. Returns the new block ids, or None (nothing changed) when the
        pool is short. The array may be an earlier result that nothing references any
        more, written again (as ``BlockPool.get_new_blocks``).
        """
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
    ) -> StepResult:
        """One scheduler step in one call. For each request in order: one that has not
        started looks up its prefix hit and schedules ``min(num_new_tokens[i],
        num_tokens - hit)`` tokens; a running one schedules ``num_new_tokens[i]``; then
        its slots are allocated as by ``allocate_slots``. A request that does not fit
        is marked (``status[i] == StepStatus.NO_BLOCKS``, nothing changed for it).

        vLLM's step rules, all off by default (then this is exactly the one-by-one
        calls): ``stop_at_first_failure`` skips the rest after the first failure;
        ``token_budget`` caps the tokens the whole step schedules (hits are free; a
        prefill is chunked to what is left); ``max_num_requests`` caps the requests it
        schedules; ``preempt`` lets a running request that does not fit preempt running
        requests from the end of the list, newest first, or itself when none is left,
        after which no waiting request is admitted (give running requests first, as
        vLLM orders them; ids must then be distinct). Unknown ids fail the whole call
        before anything changes. Returns a ``StepResult``.
        """
    def append_token_ids(self, request_id: _RequestId, token_ids: _IdsLike) -> None:
        """Appends token ids (generated, or newly known) to a request."""
    def append_token_ids_many(self, request_ids: Sequence[_RequestId], token_ids: _IdsLike, offsets: _IdsLike | None = None) -> None:
        """Appends tokens to several requests: segment ``i`` of ``token_ids`` (cut by
        ``offsets``; one token each when None, as after a decode step) goes to
        ``request_ids[i]``. All ids are checked first.
        """
    def free(self, request_id: _RequestId) -> None:
        """Frees a finished request's blocks (tail first) and forgets it."""
    def free_many(self, request_ids: Sequence[_RequestId]) -> None:
        """Frees several requests in order; all ids are checked first."""
    def preempt(self, request_id: _RequestId) -> None:
        """Preempts a request: frees its blocks (tail first); it keeps its tokens and
        restarts from zero computed tokens.
        """
    def get_block_ids_many(self, request_ids: Sequence[_RequestId]) -> tuple[_BlockIds, npt.NDArray[np.int64]]:
        """The block tables of several requests in one call: ``(block_ids, offsets)``, request
        ``i``'s blocks being ``block_ids[offsets[i]:offsets[i + 1]]`` (int32 ids, int64
        offsets). Every id is checked first (``UnknownRequestError``).
        """
    def get_num_tokens_many(self, request_ids: Sequence[_RequestId]) -> npt.NDArray[np.int64]:
        """``get_num_tokens`` of several requests (int64); every id is checked first."""
    def get_num_computed_tokens_many(self, request_ids: Sequence[_RequestId]) -> npt.NDArray[np.int64]:
        """``get_num_computed_tokens`` of several requests (int64); every id is checked first."""
    def get_block_ids(self, request_id: _RequestId) -> _BlockIds:
        """The request's block table (int32)."""
    def get_block_hashes(self, request_id: _RequestId) -> BlockHashList:
        """The request's block hashes (full blocks)."""
    def get_num_tokens(self, request_id: _RequestId) -> int:
        """The request's number of tokens so far."""
    def get_num_computed_tokens(self, request_id: _RequestId) -> int:
        """Tokens the manager counts as computed for the request (advanced by each
        successful allocation, reset by preemption).
        """
    def set_num_computed_tokens(self, request_id: _RequestId, num_computed_tokens: int) -> None:
        """Sets the request's computed tokens (e.g. after rejected speculative tokens)."""
    def free_block_ids(self) -> _BlockIds:
        """The pool's free queue, head (next to be reused) to tail (introspection)."""
    def ref_counts(self) -> _BlockIds:
        """Every block's reference count, in id order (introspection)."""
    def get_usage(self) -> float:
        """Fraction of usable blocks in use."""
    def get_num_free_blocks(self) -> int:
        """Free blocks in the pool."""
    def take_events(self) -> list[KVCacheEvent]:
        """Queued KV-cache events, oldest first (the queue is emptied)."""
    def take_events_msgpack(
        self,
        ts: float | None = None,
        *,
        data_parallel_rank: int | None = None,
        group_specs: dict[int, tuple[str | None, int | None]] | None = None,
        medium: str | None = None,
        replay: ReplayRing | None = None,
        seq: int | None = None,
    ) -> bytes:
        """The queued events (the queue is emptied) as the msgpack payload vLLM 0.33's
        publisher sends: one ``EventBatch``, hashes as integers (``kvpool.wire``'s bytes,
        encoded in Rust without a Python object per event and without the GIL). ``ts``
        defaults to now; ``group_specs`` maps a group index to ``(kv_cache_spec_kind,
        kv_cache_spec_sliding_window)``.
        With ``replay`` (a ``ReplayRing``) and ``seq``, a batch that has events is also
        held in the ring as batch ``seq`` (written there with stores that bypass the
        cache, on this thread, the GIL released); the ring's refusal (closed, or
        ``seq`` not above its last batch) is raised before any event is taken; a
        refusal caused meanwhile by another thread puts the events back in the queue.
        """
    def send_events(
        self,
        sink: ZmqSink,
        seq: int,
        ts: float | None = None,
        *,
        data_parallel_rank: int | None = None,
        group_specs: dict[int, tuple[str | None, int | None]] | None = None,
        medium: str | None = None,
        replay: ReplayRing | None = None,
    ) -> int:
        """Takes the queued events as one batch, encoded as ``take_events_msgpack`` encodes
        it, holds it in ``replay`` (a ``ReplayRing``, if given) as batch ``seq`` and sends
        it on ``sink`` (a ``ZmqSink``) as vLLM's three frames, the payload lent to ZeroMQ
        rather than copied (``ZmqPublisher.publish_from``). Returns the payload's length
        in bytes; 0 when there was no event, and then nothing is held or sent. A closed
        sink or ring, or ``seq`` not above the ring's last batch, is raised before any
        event is taken (a refusal caused meanwhile by another thread puts the events
        back in the queue); a send that fails after that raises ``TransportError`` with
        the batch held.
        """
    @property
    def num_pending_events(self) -> int:
        """Number of queued events (what ``take_events`` would return)."""
    @property
    def num_dropped_events(self) -> int:
        """Events dropped, oldest first, because ``max_pending_events`` were already
        queued; counted since the manager was built.
        """
    def reset_prefix_cache(self) -> bool:
        """Clears the prefix cache and the statistics; refused (False) while any block
        is in use.
        """
    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        """Prefix-cache statistics over every lookup since the start (or last reset)."""
    @property
    def recent_prefix_cache_stats(self) -> PrefixCacheStats:
        """Prefix-cache statistics over the last ``stats_window`` new requests admitted
        (vLLM's ``CachingMetrics`` window, which resumed requests do not enter) and, in
        the ``preempted_*`` fields, over the last ``stats_window`` resumed ones.
        """
    def request_ids(self) -> tuple[_RequestId, ...]:
        """The tracked request ids."""
    def check_invariants(self) -> None:
        """Walks the pool's structure and the block tables; raises ``InvariantError``."""
    def __contains__(self, request_id: object, /) -> bool: ...
    def __len__(self) -> int: ...
