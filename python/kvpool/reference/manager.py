"""A plain-Python ``KVCacheManager`` with exactly the API of ``kvpool._core.KVCacheManager``.

Written for clarity, not speed: the oracle the Rust manager is tested against. It keeps, per
request, its tokens, its block hashes (full blocks only), its block table, how many of those
blocks are in the prefix cache and how many tokens count as computed; all blocks live in a
``kvpool.reference.BlockPool`` (null block 0, hash width fixed to the hash algorithm's digest).

Semantics (``docs/semantics.md``, "Per-request manager"; vLLM's v1 ``KVCacheManager`` for one
full-attention group):

* ``get_computed_blocks``: the longest prefix-cache hit, capped at ``num_tokens - 1`` tokens,
  block-aligned; recorded in the statistics; never changes reference counts.
* ``allocate_slots``: all or nothing. Needs ``ceil((computed + new + lookahead) / block_size)``
  blocks (capped by ``max_model_len``) minus those held and hit, plus the hits whose count is 0
  (touching takes them out of the free queue). If the pool is short it returns ``None`` and
  changes nothing; else it touches the hits, allocates the rest and caches the blocks that
  became full within ``min(computed + new, num_tokens)`` tokens (lookahead never).
* ``free``: the request's blocks in reverse order (tail evicted first); ``preempt``: the same,
  and the request restarts from zero computed tokens.

Every method validates all of its input, in the order the Rust binding does, before it changes
anything, so a call that raises leaves the manager exactly as it was.

Example::

    >>> m = KVCacheManager(8, 4)
    >>> m.add_request("a", list(range(10)))
    >>> m.allocate_slots("a", 10).tolist()          # 3 blocks; the first 2 become cached
    [1, 2, 3]
    >>> m.add_request("b", list(range(10)))
    >>> blocks, hit = m.get_computed_blocks("b")    # "b" hits "a"'s full blocks
    >>> blocks.tolist(), hit
    ([1, 2], 8)
    >>> m.allocate_slots("b", 2, num_new_computed_tokens=hit, new_computed_blocks=blocks).tolist()
    [4]
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from kvpool._errors import (
    BlockStateError,
    CachingDisabledError,
    DuplicateRequestError,
    InvalidArgumentError,
    InvariantError,
    UnknownRequestError,
)
from kvpool.reference._args import (
    I64_MAX,
    RequestExtras,
    RequestId,
    as_block_ids,
    as_bool_arg,
    as_int_arg,
    as_int_list,
    as_opt_int_arg,
    as_opt_str_arg,
    as_per_request,
    as_request_extras,
    as_request_id,
    as_request_ids,
    as_segments,
)
from kvpool.reference.hashing import DIGEST_LEN, MAX_BLOCK_SIZE, BlockHasher, check_hash_algo, event_extra_keys
from kvpool.reference.eviction import BlockPriority
from kvpool.reference.pool import MAX_NUM_BLOCKS, BlockPool, _as_priority
from kvpool.stats import PrefixCacheStats
from kvpool.step_status import StepStatus

__all__ = ["KVCacheManager", "StepResult"]

MAX_STATS_WINDOW = 2**32
DEFAULT_STATS_WINDOW = 1000


# --------------------------------------------------------------------------------------------
# The manager.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepResult:
    """What ``KVCacheManager.schedule_step`` did, per request in order.

    Request ``i``'s new blocks are ``block_ids[offsets[i]:offsets[i + 1]]`` and the blocks of
    its prefix hit (requests admitted in this step) ``hit_block_ids[hit_offsets[i]:hit_offsets[i
    + 1]]``; ``status[i]`` is a ``StepStatus`` code.
    """

    block_ids: npt.NDArray[np.int32]
    offsets: npt.NDArray[np.int64]
    hit_block_ids: npt.NDArray[np.int32]
    hit_offsets: npt.NDArray[np.int64]
    num_scheduled_tokens: npt.NDArray[np.int64]
    num_hit_tokens: npt.NDArray[np.int64]
    allocated: npt.NDArray[np.bool_]
    status: npt.NDArray[np.uint8]

    def __len__(self) -> int:
        """The number of requests in the step."""
        return len(self.status)


@dataclass
class _Request:
    """One tracked request."""

    tokens: list[int]
    extras: RequestExtras
    block_hashes: list[bytes]
    lora_id: int | None
    blocks: list[int] = field(default_factory=list)  # the block table
    num_cached_blocks: int = 0  # blocks[:num_cached_blocks] hold this request's hashes
    num_computed_tokens: int = 0
    num_preemptions: int = 0
    priority: BlockPriority | None = None  # the retention priority of its cached blocks and hits

    @property
    def waiting(self) -> bool:
        """Not started (or preempted): no blocks and nothing computed."""
        return not self.blocks and self.num_computed_tokens == 0


class KVCacheManager:
    """The per-request block manager a scheduler calls (vLLM's ``KVCacheManager``, pure Python)."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_caching: bool | None = None,
        hash_algo: str | None = None,
        seed: str | None = None,
        enable_events: bool | None = None,
        max_model_len: int | None = None,
        stats_window: int | None = None,
        max_pending_events: int | None = None,
        eviction: str | None = None,
        max_pinned_blocks: int | None = None,
        clock: str | None = None,
        adaptive_horizon: int | None = None,
    ) -> None:
        """Build a manager over a fresh pool of ``num_blocks`` blocks (block 0 is the null block).

        ``eviction``, ``max_pinned_blocks``, ``clock`` and ``adaptive_horizon`` go to the pool (``BlockPool``).

        Defaults: caching on, ``sha256_cbor``, seed ``"vllm-none-hash"``, events off, no
        ``max_model_len``, statistics window of the last 1000 admitted requests, at most 1,000,000 queued events.
        """
        num_blocks = as_int_arg(num_blocks, "num_blocks", 1, MAX_NUM_BLOCKS)
        block_size = as_int_arg(block_size, "block_size", 1, MAX_BLOCK_SIZE)
        caching = as_bool_arg(enable_caching, "enable_caching", True)
        algo = check_hash_algo(hash_algo)
        seed = as_opt_str_arg(seed, "seed")
        events = as_bool_arg(enable_events, "enable_events", False)
        max_len = as_opt_int_arg(max_model_len, "max_model_len", 1, I64_MAX)
        window = as_opt_int_arg(stats_window, "stats_window", 0, MAX_STATS_WINDOW)

        self.pool = BlockPool(
            num_blocks,
            enable_caching=caching,
            null_block=True,
            enable_events=events,
            block_size=block_size,
            hash_width=DIGEST_LEN[algo],
            max_pending_events=max_pending_events,
            eviction=eviction,
            max_pinned_blocks=max_pinned_blocks,
            clock=clock,
            adaptive_horizon=adaptive_horizon,
        )
        self._block_size = block_size
        self._hash_algo = algo
        self._hasher = BlockHasher(block_size, hash_algo=algo, seed=seed)
        self._max_model_len = max_len  # None: no cap
        self._requests: dict[RequestId, _Request] = {}
        self._stats = PrefixCacheStats(0, 0, 0, 0)
        self._window_len = DEFAULT_STATS_WINDOW if window is None else window
        # (queries, hits) of the last new and of the last resumed requests admitted
        self._new_window: deque[tuple[int, int]] = deque()
        self._resumed_window: deque[tuple[int, int]] = deque()

    # -- properties ---------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool (block 0 is the null block)."""
        return self.pool.num_blocks

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        return self._block_size

    @property
    def enable_caching(self) -> bool:
        """Whether the prefix cache is on."""
        return self.pool.enable_caching

    @property
    def hash_algo(self) -> str:
        """The block hash algorithm."""
        return self._hash_algo

    def __repr__(self) -> str:
        """A summary: blocks, block size, requests and free blocks."""
        return (
            f"reference.KVCacheManager(num_blocks={self.num_blocks}, block_size={self._block_size}, "
            f"requests={len(self._requests)}, free={self.pool.get_num_free_blocks()})"
        )

    # -- requests -----------------------------------------------------------------------------

    def _get(self, request_id: RequestId) -> _Request:
        """The tracked request (``UnknownRequestError`` if there is none)."""
        try:
            return self._requests[request_id]
        except KeyError:
            raise UnknownRequestError(f"unknown request id {request_id!r}") from None

    def add_request(
        self,
        request_id: RequestId,
        prompt_token_ids: Any,
        *,
        lora: tuple[str, str] | None = None,
        lora_id: int | None = None,
        cache_salt: str | None = None,
        mm_features: Sequence[tuple[str, int, int]] | None = None,
        prompt_embed_digests: Sequence[bytes] | None = None,
        priority: int | None = None,
        retention_s: float | None = None,
    ) -> None:
        """Track a request with its prompt (at least one token) and hash its full blocks.

        ``priority`` (``0..=100``, for ``retention_s`` seconds from now if given) is the retention
        priority of the blocks the request caches; its hits are raised to it, never lowered.
        It needs ``eviction="priority"``.

        ``lora`` is ``(name, path)``; ``lora_id`` and the LoRA name go into ``BlockStored``
        events. Raises ``DtypeError`` / ``InvalidArgumentError`` / ``HashWidthError`` for bad
        arguments, ``DuplicateRequestError`` for a tracked id, ``InvalidArgumentError`` for an
        empty prompt.
        """
        rid = as_request_id(request_id)
        extras = as_request_extras(lora, cache_salt, mm_features, prompt_embed_digests)
        lora_int = as_opt_int_arg(lora_id, "lora_id")
        tokens = self._token_ids(prompt_token_ids, "prompt_token_ids")
        wanted = _as_priority(priority, retention_s)
        if wanted is not None and self.pool.eviction != "priority":
            raise InvalidArgumentError(
                "a request priority needs a manager built with eviction='priority' "
                f"(this one evicts by {self.pool.eviction})"
            )
        if rid in self._requests:
            raise DuplicateRequestError(f"request id {rid!r} is already tracked")
        if not tokens:
            raise InvalidArgumentError("a request needs at least one prompt token")
        if self._max_model_len is not None and len(tokens) > self._max_model_len:
            raise InvalidArgumentError(
                f"the prompt has {len(tokens)} tokens, more than max_model_len ({self._max_model_len})"
            )
        self._requests[rid] = _Request(
            tokens=tokens,
            extras=extras,
            block_hashes=self._block_hashes(tokens, extras),
            lora_id=lora_int,
            priority=None if wanted is None else wanted.at(self.pool.now),
        )

    # -- pins and the clock ---------------------------------------------------------------------

    def pin_prompt(self, token_ids: Any) -> int:
        """Pin the cached full blocks of ``token_ids`` (hashed as a request without extra keys);
        returns the blocks of its longest cached prefix (``PinBudgetError`` beyond the budget)."""
        tokens = self._token_ids(token_ids, "token_ids")
        return self.pool.pin_prefix(self._block_hashes(tokens, as_request_extras(None, None, None, None)))

    def unpin_prompt(self, token_ids: Any) -> int:
        """Unpin what ``pin_prompt(token_ids)`` pinned; returns the blocks unpinned."""
        tokens = self._token_ids(token_ids, "token_ids")
        return self.pool.unpin_prefix(self._block_hashes(tokens, as_request_extras(None, None, None, None)))

    def unpin_all(self) -> int:
        """Unpin every pinned block; returns how many there were."""
        return self.pool.unpin_all()

    def get_num_pinned_blocks(self) -> int:
        """Number of pinned blocks."""
        return self.pool.get_num_pinned_blocks()

    @property
    def eviction(self) -> str:
        """The eviction policy."""
        return self.pool.eviction

    @property
    def adaptive_horizon(self) -> int:
        """The adaptive policy's horizon in blocks freed (unused by the other policies)."""
        return self.pool.adaptive_horizon

    @property
    def now(self) -> float:
        """The pool's clock in seconds."""
        return self.pool.now

    def advance_clock(self, seconds: float) -> None:
        """Move a ``clock="manual"`` manager's clock forward by ``seconds`` (>= 0)."""
        self.pool.advance_clock(seconds)

    def append_token_ids(self, request_id: RequestId, token_ids: Any) -> None:
        """Append generated (or newly known) tokens; the blocks they fill get hashed."""
        rid = as_request_id(request_id)
        tokens = self._token_ids(token_ids, "token_ids")
        request = self._get(rid)
        self._check_room(rid, request, len(tokens))
        self._append(request, tokens)

    def _check_room(self, rid: RequestId, request: _Request, more: int) -> None:
        """A request never grows beyond ``max_model_len`` tokens (``InvalidArgumentError``)."""
        total = len(request.tokens) + more
        if self._max_model_len is not None and total > self._max_model_len:
            raise InvalidArgumentError(
                f"appending {more} tokens would make request {rid!r} {total} tokens long, "
                f"more than max_model_len ({self._max_model_len})"
            )

    def _token_ids(self, values: Any, name: str) -> list[int]:
        """Token ids as the manager takes them: checked and kept with prefix caching on;
        without it nothing reads their values, so a list or tuple is only counted (its
        items are not inspected) and zeros stand in for them."""
        if not self.pool.enable_caching and isinstance(values, (list, tuple)):
            return [0] * len(values)
        return as_int_list(values, name)

    def append_token_ids_many(self, request_ids: Sequence[RequestId], token_ids: Any, offsets: Any = None) -> None:
        """Segment ``i`` of ``token_ids`` (cut by ``offsets``; one token each when None) goes to
        ``request_ids[i]``. All ids are checked before anything is appended."""
        rids = as_request_ids(request_ids)
        tokens, cuts = as_segments(token_ids, offsets, len(rids))
        requests = [self._get(rid) for rid in rids]
        more: dict[RequestId, int] = {}
        for rid, request, start, end in zip(rids, requests, cuts, cuts[1:]):
            more[rid] = more.get(rid, 0) + end - start
            self._check_room(rid, request, more[rid])
        for request, start, end in zip(requests, cuts, cuts[1:]):
            self._append(request, tokens[start:end])

    def _append(self, request: _Request, tokens: list[int]) -> None:
        """Append validated tokens to the request and hash the blocks they fill."""
        request.tokens.extend(tokens)
        # The new blocks are hashed where the chain left off, as vLLM's request block hasher
        # does: with nested multimodal inputs, its walk from the last hashed block finds other
        # inputs than a walk from block 0 would, so hashing again from scratch would differ.
        if self.pool.enable_caching:
            self._hasher.update_chain(request.block_hashes, request.tokens, request.extras)

    def _block_hashes(self, tokens: list[int], extras: RequestExtras) -> list[bytes]:
        """The hashes of the full blocks of ``tokens``; none without prefix caching (as vLLM,
        which has no block hasher then: nothing would read them)."""
        hashes: list[bytes] = []
        if self.pool.enable_caching:
            self._hasher.update_chain(hashes, tokens, extras)
        return hashes

    def get_block_ids_many(self, request_ids: Sequence[RequestId]) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int64]]:
        """The block tables of several requests: ``(block_ids, offsets)``, request ``i``'s blocks
        being ``block_ids[offsets[i]:offsets[i + 1]]``. Every id is checked first."""
        requests = [self._get(rid) for rid in as_request_ids(request_ids)]
        flat = [b for r in requests for b in r.blocks]
        offsets = [0]
        for r in requests:
            offsets.append(offsets[-1] + len(r.blocks))
        return np.array(flat, dtype=np.int32), np.array(offsets, dtype=np.int64)

    def get_num_tokens_many(self, request_ids: Sequence[RequestId]) -> npt.NDArray[np.int64]:
        """``get_num_tokens`` of several requests; every id is checked first."""
        requests = [self._get(rid) for rid in as_request_ids(request_ids)]
        return np.array([len(r.tokens) for r in requests], dtype=np.int64)

    def get_num_computed_tokens_many(self, request_ids: Sequence[RequestId]) -> npt.NDArray[np.int64]:
        """``get_num_computed_tokens`` of several requests; every id is checked first."""
        requests = [self._get(rid) for rid in as_request_ids(request_ids)]
        return np.array([r.num_computed_tokens for r in requests], dtype=np.int64)

    def get_block_ids(self, request_id: RequestId) -> npt.NDArray[np.int32]:
        """The request's block table (int32)."""
        return np.array(self._get(as_request_id(request_id)).blocks, dtype=np.int32)

    def get_block_hashes(self, request_id: RequestId) -> list[bytes]:
        """The request's block hashes (full blocks; none without prefix caching)."""
        return list(self._get(as_request_id(request_id)).block_hashes)

    def get_num_tokens(self, request_id: RequestId) -> int:
        """The request's number of tokens so far."""
        return len(self._get(as_request_id(request_id)).tokens)

    def get_num_computed_tokens(self, request_id: RequestId) -> int:
        """Tokens counted as computed (advanced by each allocation, reset by preemption)."""
        return self._get(as_request_id(request_id)).num_computed_tokens

    def set_num_computed_tokens(self, request_id: RequestId, num_computed_tokens: int) -> None:
        """Set the computed tokens (e.g. after rejected speculative tokens); at most the slots held."""
        rid = as_request_id(request_id)
        n = as_int_arg(num_computed_tokens, "num_computed_tokens", 0, I64_MAX)
        request = self._get(rid)
        slots = len(request.blocks) * self._block_size
        if n > slots:
            raise InvalidArgumentError(f"{n} computed tokens exceed the {slots} slots the request holds")
        request.num_computed_tokens = n

    def request_ids(self) -> tuple[RequestId, ...]:
        """The tracked request ids: ints ascending, then strs ascending."""
        ints = sorted(rid for rid in self._requests if isinstance(rid, int))
        strs = sorted(rid for rid in self._requests if isinstance(rid, str))
        return (*ints, *strs)

    def __contains__(self, request_id: object) -> bool:
        """Whether ``request_id`` is tracked (``DtypeError`` if it cannot be a request id)."""
        return as_request_id(request_id) in self._requests

    def __len__(self) -> int:
        """Number of tracked requests."""
        return len(self._requests)

    # -- prefix hits --------------------------------------------------------------------------

    def get_computed_blocks(self, request_id: RequestId) -> tuple[npt.NDArray[np.int32], int]:
        """The longest prefix-cache hit, capped below the last token: ``(block_ids, tokens)``.

        Changes nothing; the statistics count the request when it is admitted.
        """
        request = self._get(as_request_id(request_id))
        hit = self._lookup(request)
        return np.array(hit, dtype=np.int32), len(hit) * self._block_size

    def _lookup(self, request: _Request) -> list[int]:
        """The request's longest prefix-cache hit, capped below its last token (block ids)."""
        if not self.pool.enable_caching:
            return []
        max_blocks = (len(request.tokens) - 1) // self._block_size
        return [int(b) for b in self.pool.find_longest_cache_hit(request.block_hashes, max_blocks=max_blocks)]

    def _record(self, queries: int, hits: int, preempted: bool) -> None:
        """Count an admitted request (vLLM 0.33 records at admission), resumed ones apart."""
        s = self._stats
        window = self._resumed_window if preempted else self._new_window
        if self._window_len > 0:
            if len(window) == self._window_len:
                window.popleft()
            window.append((queries, hits))
        if preempted:
            self._stats = PrefixCacheStats(
                s.requests, s.queries, s.hits,
                preempted_requests=s.preempted_requests + 1,
                preempted_queries=s.preempted_queries + queries,
                preempted_hits=s.preempted_hits + hits,
            )
            return
        self._stats = PrefixCacheStats(
            requests=s.requests + 1,
            queries=s.queries + queries,
            hits=s.hits + hits,
            preempted_requests=s.preempted_requests,
            preempted_queries=s.preempted_queries,
            preempted_hits=s.preempted_hits,
        )

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        """Statistics over every lookup since the start (or the last successful reset)."""
        return self._stats

    @property
    def recent_prefix_cache_stats(self) -> PrefixCacheStats:
        """Statistics over the last ``stats_window`` new requests admitted (vLLM's
        ``CachingMetrics`` window, which resumed requests do not enter) and, in the preempted
        fields, over the last ``stats_window`` resumed (preempted) ones."""
        new, old = self._new_window, self._resumed_window
        return PrefixCacheStats(
            requests=len(new),
            queries=sum(q for q, _ in new),
            hits=sum(h for _, h in new),
            preempted_requests=len(old),
            preempted_queries=sum(q for q, _ in old),
            preempted_hits=sum(h for _, h in old),
        )

    # -- allocation ---------------------------------------------------------------------------

    def allocate_slots(
        self,
        request_id: RequestId,
        num_new_tokens: int,
        *,
        num_new_computed_tokens: int | None = None,
        new_computed_blocks: Any = None,
        num_lookahead_tokens: int | None = None,
    ) -> npt.NDArray[np.int32] | None:
        """Allocate slots for ``num_new_tokens`` (plus lookahead), first taking the prefix hit
        ``new_computed_blocks`` (``num_new_computed_tokens`` tokens) of a request starting now.

        Returns the new block ids (int32), or ``None`` (nothing changed) when the pool is short.
        """
        rid = as_request_id(request_id)
        num_new = as_int_arg(num_new_tokens, "num_new_tokens", 0, I64_MAX)
        num_hit = as_opt_int_arg(num_new_computed_tokens, "num_new_computed_tokens", 0, I64_MAX) or 0
        lookahead = as_opt_int_arg(num_lookahead_tokens, "num_lookahead_tokens", 0, I64_MAX) or 0
        hits = [] if new_computed_blocks is None else as_block_ids(new_computed_blocks, self.num_blocks)
        new_blocks = self._allocate(self._get(rid), num_new, num_hit, hits, lookahead)
        return None if new_blocks is None else np.array(new_blocks, dtype=np.int32)

    def _allocate(
        self, request: _Request, num_new: int, num_hit: int, hits: list[int], lookahead: int
    ) -> list[int] | None:
        """``allocate_slots`` on validated arguments: the new blocks, or ``None`` if short."""
        bs = self._block_size
        if num_new == 0 and num_hit == 0:
            raise InvalidArgumentError("num_new_tokens must be greater than 0 when there are no new computed tokens")
        if num_hit != len(hits) * bs:
            raise InvalidArgumentError(
                f"num_new_computed_tokens ({num_hit}) must be {len(hits) * bs} for {len(hits)} new computed blocks"
            )
        if hits:
            self._check_hits(request, hits)
        if request.num_computed_tokens + num_hit + num_new + lookahead > I64_MAX:
            raise InvalidArgumentError("the computed, new and lookahead token counts add up past 2**63 - 1")

        admitting, preempted = request.waiting, request.num_preemptions > 0
        num_computed = request.num_computed_tokens + num_hit
        need = num_computed + num_new + lookahead
        if self._max_model_len is not None:
            need = min(need, self._max_model_len)
        required_blocks = -(-need // bs)
        to_allocate = max(required_blocks - len(request.blocks) - len(hits), 0)
        # Hits sitting in the free queue leave it when touched: they count against the free blocks.
        evictable_hits = sum(1 for b in hits if self.pool.ref_count(b) == 0 and b != self.pool.null_block)
        if to_allocate + evictable_hits > self.pool.get_num_free_blocks():
            return None

        self.pool.touch(hits)
        if request.priority is not None:
            self.pool._set_priority(hits, request.priority, only_raise=True)
        new_blocks = [int(b) for b in self.pool.get_new_blocks(to_allocate)]
        if hits:
            request.blocks.extend(hits)
            request.num_cached_blocks = len(request.blocks)
        request.blocks.extend(new_blocks)
        request.num_computed_tokens = num_computed + num_new
        if self.pool.enable_caching:
            if admitting:
                self._record(len(request.tokens), num_hit, preempted)
            self._cache_blocks(request, min(num_computed + num_new, len(request.tokens)))
        return new_blocks

    def _check_hits(self, request: _Request, hits: list[int]) -> None:
        """Hits must be, in order, cached blocks holding this request's hashes, and the request
        must not have started."""
        if not self.pool.enable_caching:
            raise CachingDisabledError("prefix caching is disabled for this pool (enable_caching=False)")
        if not request.waiting:
            raise InvalidArgumentError("new_computed_blocks are only accepted for a request that has not started")
        if len(hits) > len(request.block_hashes):
            raise InvalidArgumentError(
                f"{len(hits)} new computed blocks but the request has only {len(request.block_hashes)} full blocks"
            )
        for i, block_id in enumerate(hits):
            if self.pool.block_hash(block_id) != (request.block_hashes[i], 0):
                raise BlockStateError(f"block {block_id} is not the cached block of this request's prefix at its position")

    def _cache_blocks(self, request: _Request, num_tokens: int) -> None:
        """Enter the request's blocks that are full within its first ``num_tokens`` tokens."""
        num_full = min(num_tokens // self._block_size, len(request.block_hashes), len(request.blocks))
        if num_full <= request.num_cached_blocks:
            return
        self.pool.cache_full_blocks(
            request.blocks,
            request.block_hashes,
            request.num_cached_blocks,
            num_full,
            token_ids=request.tokens if self.pool.enable_events else None,
            lora_id=request.lora_id,
            lora_name=None if request.extras.lora is None else request.extras.lora[0],
            _extra_keys=(event_extra_keys(request.extras, range(request.num_cached_blocks, num_full), self._block_size)
                         if self.pool.enable_events else None),
        )
        if request.priority is not None:
            self.pool._set_priority(request.blocks[request.num_cached_blocks : num_full], request.priority, only_raise=False)
        request.num_cached_blocks = num_full

    def schedule_step(
        self,
        request_ids: Sequence[RequestId],
        num_new_tokens: Any,
        *,
        num_lookahead_tokens: Any = None,
        stop_at_first_failure: bool | None = None,
        token_budget: int | None = None,
        max_num_requests: int | None = None,
        preempt: bool | None = None,
    ) -> StepResult:
        """One scheduler step: for each request in order, a waiting one looks up its prefix hit
        and schedules ``min(num_new_tokens[i], num_tokens - hit)``; a running one schedules
        ``num_new_tokens[i]``; then slots are allocated as by ``allocate_slots``.

        vLLM's step rules, all off by default (then this is exactly the one-by-one calls):
        ``stop_at_first_failure`` skips the rest after the first failure (no blocks, or
        nothing to schedule); ``token_budget`` caps the tokens the step schedules (hits are
        free; each request gets at most what is left); ``max_num_requests`` caps the requests
        it schedules; ``preempt`` lets a running request that does not fit preempt running
        requests from the end of the list, newest first, or itself when none is left, after
        which no waiting request is admitted (ids must then be distinct). ``status`` says
        what happened to each request. Unknown ids fail the whole call before anything
        changes.
        """
        rids = as_request_ids(request_ids)
        stop = as_bool_arg(stop_at_first_failure, "stop_at_first_failure", False)
        budget = as_opt_int_arg(token_budget, "token_budget", 0, I64_MAX)
        cap = as_opt_int_arg(max_num_requests, "max_num_requests", 0, I64_MAX)
        may_preempt = as_bool_arg(preempt, "preempt", False)
        budgets = as_per_request(num_new_tokens, "num_new_tokens", len(rids))
        lookaheads = (
            [0] * len(rids)
            if num_lookahead_tokens is None
            else as_per_request(num_lookahead_tokens, "num_lookahead_tokens", len(rids))
        )
        requests = [self._get(rid) for rid in rids]
        if may_preempt and len(set(rids)) < len(rids):
            dup = next(r for i, r in enumerate(rids) if r in rids[:i])
            raise InvalidArgumentError(f"request {dup} appears twice in a step with preemption")
        # Token counts cross as int64: refused before any request is scheduled. The bound takes
        # every new and lookahead token of the step (a request listed twice is scheduled twice).
        step_tokens = sum(budgets) + sum(lookaheads)
        for rid, request in zip(rids, requests):
            if len(request.tokens) + request.num_computed_tokens + step_tokens > I64_MAX:
                raise InvalidArgumentError(
                    f"request {rid!r}: its tokens and computed tokens and the step's new and lookahead tokens "
                    "add up past 2**63 - 1")

        left = I64_MAX if budget is None else budget
        cap = I64_MAX if cap is None else cap
        block_ids: list[int] = []
        offsets = [0]
        hit_ids: list[int] = []
        hit_offsets = [0]
        scheduled: list[int] = []
        hit_tokens: list[int] = []
        status: list[StepStatus] = []
        preempted: set[int] = set()
        stopped = False
        for i, (request, wanted, lookahead) in enumerate(zip(requests, budgets, lookaheads)):
            num_new = num_hit = 0
            if i in preempted:
                outcome = StepStatus.PREEMPTED
            elif stopped:
                outcome = StepStatus.SKIPPED
            elif left == 0:
                outcome = StepStatus.TOKEN_BUDGET
            elif sum(1 for st in status if st == StepStatus.SCHEDULED) >= cap:
                outcome = StepStatus.REQUEST_CAP
            elif preempted and request.waiting:
                outcome = StepStatus.SKIPPED
            else:
                hits: list[int] = []
                num_new = min(wanted, left)
                if request.waiting:
                    hits = self._lookup(request)
                    num_hit = len(hits) * self._block_size
                    num_new = min(num_new, len(request.tokens) - num_hit)
                while True:
                    if num_new + num_hit == 0:
                        outcome = StepStatus.NO_TOKENS
                        break
                    new_blocks = self._allocate(request, num_new, num_hit, hits, lookahead)
                    if new_blocks is not None:
                        outcome = StepStatus.SCHEDULED
                        block_ids.extend(new_blocks)
                        hit_ids.extend(hits)
                        left -= num_new
                        break
                    if not may_preempt or request.waiting:
                        outcome = StepStatus.NO_BLOCKS
                        break
                    victims = [j for j in range(len(rids) - 1, i, -1) if j not in preempted and not requests[j].waiting]
                    preempted.add(victims[0] if victims else i)
                    self.preempt(rids[victims[0] if victims else i])
                    if not victims:
                        outcome = StepStatus.PREEMPTED
                        break
                if outcome != StepStatus.SCHEDULED:
                    num_new = num_hit = 0
                    stopped = stop and outcome in (StepStatus.NO_BLOCKS, StepStatus.NO_TOKENS)
            scheduled.append(num_new)
            hit_tokens.append(num_hit)
            status.append(outcome)
            offsets.append(len(block_ids))
            hit_offsets.append(len(hit_ids))
        return StepResult(
            block_ids=np.array(block_ids, dtype=np.int32),
            offsets=np.array(offsets, dtype=np.int64),
            hit_block_ids=np.array(hit_ids, dtype=np.int32),
            hit_offsets=np.array(hit_offsets, dtype=np.int64),
            num_scheduled_tokens=np.array(scheduled, dtype=np.int64),
            num_hit_tokens=np.array(hit_tokens, dtype=np.int64),
            allocated=np.array([st == StepStatus.SCHEDULED for st in status], dtype=np.bool_),
            status=np.array([int(st) for st in status], dtype=np.uint8),
        )

    # -- freeing ------------------------------------------------------------------------------

    def free(self, request_id: RequestId) -> None:
        """Free a finished request's blocks (tail first) and forget it."""
        rid = as_request_id(request_id)
        self._release(self._get(rid))
        del self._requests[rid]

    def free_many(self, request_ids: Sequence[RequestId]) -> None:
        """Free several requests in order; all must be known and distinct (checked first)."""
        rids = as_request_ids(request_ids)
        for rid in rids:
            self._get(rid)
        seen: set[RequestId] = set()
        for rid in rids:
            if rid in seen:
                raise InvalidArgumentError(f"request {rid!r} appears twice")
            seen.add(rid)
        for rid in rids:
            self.free(rid)

    def preempt(self, request_id: RequestId) -> None:
        """Free the request's blocks (tail first); it keeps its tokens and restarts from zero
        computed tokens (its next lookup counts as a preempted request's)."""
        request = self._get(as_request_id(request_id))
        self._release(request)
        request.num_computed_tokens = 0
        request.num_cached_blocks = 0
        request.num_preemptions += 1

    def _release(self, request: _Request) -> None:
        """Free the request's blocks, tail first, and empty its block table."""
        blocks, request.blocks = request.blocks, []
        self.pool.free_blocks(blocks[::-1])

    # -- the pool -----------------------------------------------------------------------------

    def free_block_ids(self) -> npt.NDArray[np.int32]:
        """The pool's free queue, head to tail (introspection)."""
        return self.pool.free_block_ids()

    def ref_counts(self) -> npt.NDArray[np.int32]:
        """Every block's reference count, in id order (introspection)."""
        return self.pool.ref_counts()

    def get_usage(self) -> float:
        """Fraction of usable blocks in use."""
        return self.pool.get_usage()

    def get_num_free_blocks(self) -> int:
        """Free blocks in the pool."""
        return self.pool.get_num_free_blocks()

    def take_events(self) -> list[Any]:
        """Queued KV-cache events, oldest first (the queue is emptied)."""
        return self.pool.take_events()

    @property
    def num_pending_events(self) -> int:
        """Number of queued events (what ``take_events`` would return)."""
        return self.pool.num_pending_events

    @property
    def num_dropped_events(self) -> int:
        """Events dropped, oldest first, because ``max_pending_events`` were already queued."""
        return self.pool.num_dropped_events

    def reset_prefix_cache(self) -> bool:
        """Clear the prefix cache and the statistics; refused (``False``) while a block is in use."""
        if not self.pool.reset_prefix_cache():
            return False
        self._stats = PrefixCacheStats(0, 0, 0, 0)
        self._new_window.clear()
        self._resumed_window.clear()
        for request in self._requests.values():
            request.num_cached_blocks = 0
        return True

    def check_invariants(self) -> None:
        """The pool's invariants, plus: every block a request names is in range and held (its
        count at least the number of tables naming it), and a request's cached blocks hold its
        hashes. Raises ``InvariantError`` listing every problem."""
        problems: list[str] = []
        try:
            self.pool.check_invariants()
        except InvariantError as e:
            problems.append(str(e))
        holders = [0] * self.num_blocks
        for rid, request in self._requests.items():
            for block_id in request.blocks:
                if not 0 <= block_id < self.num_blocks:
                    problems.append(f"request {rid!r}: block {block_id} out of range")
                    continue
                holders[block_id] += 1
            for i, block_id in enumerate(request.blocks[: request.num_cached_blocks]):
                if block_id == self.pool.null_block:
                    continue
                key = self.pool.block_hash(block_id)
                if i >= len(request.block_hashes) or key is None or key[0] != request.block_hashes[i]:
                    problems.append(f"request {rid!r}: cached block {i} (id {block_id}) lacks the request's hash")
        counts = self.pool.ref_counts()
        for block_id, held in enumerate(holders):
            if block_id != self.pool.null_block and int(counts[block_id]) < held:
                problems.append(f"block {block_id}: count {int(counts[block_id])} below its {held} holders")
        if problems:
            raise InvariantError("; ".join(problems))

