"""Prefix-cache statistics reported by ``KVCacheManager``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PrefixCacheStats:
    """Token-level prefix-cache lookups: how many were asked for and found.

    ``queries`` counts the tokens of every request looked up by
    ``get_computed_blocks`` (or a step that started it); ``hits`` the tokens found
    already computed. ``preempted_requests`` counts lookups by resumed requests.
    """

    requests: int
    queries: int
    hits: int
    preempted_requests: int = 0

    @property
    def hit_rate(self) -> float:
        """``hits / queries`` (0.0 before any query)."""
        return self.hits / self.queries if self.queries else 0.0


__all__ = ["PrefixCacheStats"]
