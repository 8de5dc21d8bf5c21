"""A plain-Python ``ComputedBlocksTracker`` with the API and semantics of ``kvpool.ComputedBlocksTracker``.

Tracks, per sequence, its tokens as they grow, its block hashes (extended incrementally) and how
many of its tokens are already computed in a pool's prefix cache, so a scheduler charges only
uncached tokens. It works over any pool with ``enable_caching`` and
``find_longest_cache_hit(hashes, max_blocks=...)``: ``kvpool.reference.BlockPool`` and
``kvpool.BlockPool`` alike.

The seven invariants (``docs/semantics.md``, "Computed-blocks tracker") and where they are kept:

1. Full blocks only, block-aligned, never the last token: the lookup is capped at
   ``(num_tokens - 1) // block_size`` blocks (``_lookup``).
2. A prefix: the count is the pool's longest cache hit, a scan that stops at the first miss.
3. Only blocks whose KV is present or will be written before it is read: the pool's prefix map
   holds exactly the blocks cached at allocation time, written by that step before any later
   step reads them.
4. Fixed when the prefill starts (``start``) and looked up afresh on every query until then, so
   blocks other sequences computed while this one waited count, and its own chunks (cached after
   it started) never inflate it. The historic bug memoised a waiting sequence's first answer:
   after a first pass with no hits, every later pass reported nothing computed.
5. Hashes are extended, never recomputed, with the pool's hash chain
   (``kvpool.reference.hashing``, vLLM 0.33's).
6. ``reset_sequence`` (preemption) and ``remove_sequence`` (free) drop the fixed count.
7. The tracker only calls the pool's lookup, which never changes reference counts.

Every method checks all of its input before it changes anything.

Example::

    >>> from kvpool.reference import BlockPool
    >>> pool = BlockPool(16, block_size=4)
    >>> tracker = ComputedBlocksTracker(pool, 4)
    >>> tracker.add_sequence("a", range(10))
    >>> tracker.get_num_cached_tokens("a")            # nothing cached yet
    0
    >>> blocks = pool.get_new_blocks(2)
    >>> pool.cache_full_blocks(blocks, tracker.get_block_hashes("a"), 0, 2)
    >>> tracker.add_sequence("b", range(12))
    >>> tracker.start("b")                              # b's first 8 tokens are a's
    8
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from kvpool._errors import DtypeError, DuplicateRequestError, InvalidArgumentError, UnknownRequestError
from kvpool.reference._args import (
    RequestExtras,
    RequestId,
    as_request_extras,
    as_request_id,
    as_request_ids,
    as_segments,
    as_token_ids,
)
from kvpool.reference.hashing import BlockHasher

__all__ = ["ComputedBlocksTracker", "PrefixCache", "RequestId"]

IntArray = npt.NDArray[np.int64]


class PrefixCache(Protocol):
    """What the tracker reads of a pool: both ``BlockPool`` classes fit."""

    @property
    def enable_caching(self) -> bool:
        """Whether the pool's prefix cache is on."""

    @property
    def block_size(self) -> int:
        """Tokens per block."""

    def find_longest_cache_hit(self, block_hashes: Any, *, group_id: Any = ..., max_blocks: Any = ...) -> Any:
        """The cached blocks of the longest cached prefix of ``block_hashes[:max_blocks]``."""


# --------------------------------------------------------------------------------------------
# The tracker.
# --------------------------------------------------------------------------------------------


@dataclass
class TrackedSequence:
    """One tracked sequence."""

    tokens: list[int]
    num_prompt_tokens: int
    extras: RequestExtras
    hashes: list[bytes]
    started_with: int | None = None  # computed tokens, fixed when the prefill started


class ComputedBlocksTracker:
    """Per-sequence block hashes and computed-token counts read from a pool's prefix cache."""

    def __init__(
        self, pool: PrefixCache, block_size: int, *, hash_algo: str | None = None, seed: str | None = None
    ) -> None:
        """Track sequences against ``pool``, hashing ``block_size``-token blocks with ``hash_algo``
        (default ``sha256_cbor``) and ``NONE_HASH = H(seed)`` (default ``"vllm-none-hash"``).

        ``DtypeError`` if ``pool`` has no prefix-cache lookup or an argument has the wrong type;
        ``InvalidArgumentError`` for ``block_size < 1``, a ``block_size`` other than the pool's, or
        an unknown ``hash_algo``.
        """
        if not all(hasattr(pool, a) for a in ("find_longest_cache_hit", "enable_caching", "block_size")):
            raise DtypeError(f"pool must be a BlockPool, not {type(pool).__name__}")
        self._hasher = BlockHasher(block_size, hash_algo=hash_algo, seed=seed)
        if block_size != pool.block_size:
            raise InvalidArgumentError(
                f"block_size {block_size} differs from the pool's block_size {pool.block_size}"
            )
        self._pool = pool
        self._seqs: dict[RequestId, TrackedSequence] = {}

    # -- properties ---------------------------------------------------------------------------

    @property
    def pool(self) -> PrefixCache:
        """The pool whose prefix cache is read."""
        return self._pool

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        return self._hasher.block_size

    @property
    def hash_algo(self) -> str:
        """The hash algorithm's name."""
        return self._hasher.hash_algo

    def __len__(self) -> int:
        """Number of tracked sequences."""
        return len(self._seqs)

    def __contains__(self, seq_id: object) -> bool:
        """Whether ``seq_id`` is tracked (``DtypeError`` if it cannot be a request id)."""
        return as_request_id(seq_id) in self._seqs

    def __repr__(self) -> str:
        """A summary: block size and number of sequences."""
        return f"reference.ComputedBlocksTracker(block_size={self.block_size}, sequences={len(self._seqs)})"

    def _get(self, seq_id: RequestId) -> TrackedSequence:
        """The tracked sequence (``UnknownRequestError`` if there is none)."""
        try:
            return self._seqs[seq_id]
        except KeyError:
            raise UnknownRequestError(f"unknown request id {seq_id!r}") from None

    def _check_known(self, ids: Sequence[RequestId]) -> None:
        """``UnknownRequestError`` for the first id not tracked."""
        for seq_id in ids:
            self._get(seq_id)

    # -- adding and growing sequences ---------------------------------------------------------

    def add_sequence(
        self,
        seq_id: RequestId,
        token_ids: Any,
        *,
        lora: tuple[str, str] | None = None,
        cache_salt: str | None = None,
        mm_features: Sequence[tuple[str, int, int]] | None = None,
        prompt_embed_digests: Sequence[bytes] | None = None,
    ) -> None:
        """Start tracking a sequence with its prompt and extra keys; hash its full blocks.

        Raises, in this order: ``DtypeError`` for a bad id; the extra-key errors of
        ``BlockHasher.hash_tokens``; ``DtypeError``/``InvalidArgumentError`` for bad token ids;
        ``DuplicateRequestError`` if the id is already tracked.
        """
        key = as_request_id(seq_id)
        extras = as_request_extras(lora, cache_salt, mm_features, prompt_embed_digests)
        tokens = as_token_ids(token_ids)
        if key in self._seqs:
            raise DuplicateRequestError(f"request id {key!r} is already tracked")
        seq = TrackedSequence(tokens=tokens, num_prompt_tokens=len(tokens), extras=extras, hashes=[])
        self._hasher.update_chain(seq.hashes, seq.tokens, seq.extras)
        self._seqs[key] = seq

    def append_tokens(self, seq_id: RequestId, token_ids: Any) -> int:
        """Append token ids (a chunk, or decoded tokens); return how many blocks became full and
        were hashed."""
        key = as_request_id(seq_id)
        tokens = as_token_ids(token_ids)
        seq = self._get(key)
        seq.tokens.extend(tokens)
        return self._hasher.update_chain(seq.hashes, seq.tokens, seq.extras)

    def append_tokens_many(self, seq_ids: Sequence[RequestId], token_ids: Any, offsets: Any = None) -> None:
        """Append segment ``i`` of ``token_ids`` (cut by ``offsets``, or one token each when
        ``offsets`` is None) to ``seq_ids[i]``. Every argument and id is checked first."""
        ids = as_request_ids(seq_ids)
        tokens, cuts = as_segments(token_ids, offsets, len(ids))
        self._check_known(ids)
        for seq_id, a, b in zip(ids, cuts, cuts[1:]):
            seq = self._seqs[seq_id]
            seq.tokens.extend(tokens[a:b])
            self._hasher.update_chain(seq.hashes, seq.tokens, seq.extras)

    # -- computed tokens ----------------------------------------------------------------------

    def _lookup(self, seq: TrackedSequence) -> int:
        """The longest run of the sequence's blocks cached in the pool (group 0), never covering
        its last token, in tokens. Ignores whether the sequence started."""
        if not self._pool.enable_caching or not seq.tokens:
            return 0
        max_blocks = (len(seq.tokens) - 1) // self.block_size
        hits = self._pool.find_longest_cache_hit(seq.hashes, max_blocks=max_blocks)
        return len(hits) * self.block_size

    def _num_computed(self, seq: TrackedSequence) -> int:
        """The fixed count of a started sequence, else a fresh lookup."""
        return seq.started_with if seq.started_with is not None else self._lookup(seq)

    def get_num_cached_tokens(self, seq_id: RequestId) -> int:
        """Tokens of the sequence already computed in the prefix cache: full blocks only, never
        its last token; looked up afresh until the sequence starts, then fixed."""
        return self._num_computed(self._get(as_request_id(seq_id)))

    def get_num_cached_tokens_many(self, seq_ids: Sequence[RequestId]) -> IntArray:
        """``get_num_cached_tokens`` of each id, as an int64 array."""
        ids = as_request_ids(seq_ids)
        return np.array([self._num_computed(self._get(seq_id)) for seq_id in ids], dtype=np.int64)

    def start(self, seq_id: RequestId) -> int:
        """Mark the sequence's prefill as started: its count is fixed at what the pool gives now
        (returned). A started sequence keeps (and returns) its count."""
        seq = self._get(as_request_id(seq_id))
        if seq.started_with is None:
            seq.started_with = self._lookup(seq)
        return seq.started_with

    def start_many(self, seq_ids: Sequence[RequestId]) -> IntArray:
        """``start`` each id in order (all ids checked first); their counts as an int64 array."""
        ids = as_request_ids(seq_ids)
        self._check_known(ids)
        return np.array([self.start(seq_id) for seq_id in ids], dtype=np.int64)

    def is_started(self, seq_id: RequestId) -> bool:
        """Whether the sequence's prefill has started."""
        return self._get(as_request_id(seq_id)).started_with is not None

    # -- introspection ------------------------------------------------------------------------

    def get_block_hashes(self, seq_id: RequestId) -> list[bytes]:
        """The sequence's block hashes (full blocks), as a new list."""
        return list(self._get(as_request_id(seq_id)).hashes)

    def get_token_ids(self, seq_id: RequestId) -> IntArray:
        """The sequence's token ids so far, as an int64 array."""
        return np.array(self._get(as_request_id(seq_id)).tokens, dtype=np.int64)

    # -- preemption and removal ---------------------------------------------------------------

    def reset_sequence(self, seq_id: RequestId) -> None:
        """Preemption: forget the fixed count (tokens and hashes stay); the next query looks up
        afresh."""
        self._get(as_request_id(seq_id)).started_with = None

    def remove_sequence(self, seq_id: RequestId) -> None:
        """Stop tracking the sequence (it finished or was freed)."""
        key = as_request_id(seq_id)
        self._get(key)
        del self._seqs[key]
