"""What an engine on ``kvpool.vllm`` chooses through the environment, since vLLM's
configuration has no place for it: ``KVPOOL_EVICTION`` (``lru``, the default and vLLM's order;
``priority``; ``adaptive``: see ``docs/eviction.md``)."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["pool_options"]


def pool_options() -> dict[str, Any]:
    """Keyword arguments for the managers' ``kvpool.BlockPool``; a bad ``KVPOOL_EVICTION`` is
    the pool's own ``InvalidArgumentError`` when the manager is built."""
    eviction = os.environ.get("KVPOOL_EVICTION", "lru")
    return {} if eviction == "lru" else {"eviction": eviction}
