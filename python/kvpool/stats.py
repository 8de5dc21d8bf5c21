"""Prefix-cache statistics reported by ``KVCacheManager``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PrefixCacheStats:
    """Token-level prefix-cache lookups: how many were asked for and found.

    Recorded as vLLM 0.33 records them: when a waiting request is admitted (its first
    successful allocation), so the lookups of a request that stays waiting do not count.
    ``requests`` / ``queries`` / ``hits``: new requests admitted, their tokens, and those
    found already computed; the ``preempted_*`` fields the same for resumed requests.
    """

    requests: int
    queries: int
    hits: int
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    @property
    def hit_rate(self) -> float:
        """``hits / queries`` (0.0 before any query)."""
        return self.hits / self.queries if self.queries else 0.0


__all__ = ["PrefixCacheStats"]
