"""What an engine on ``kvpool.vllm`` chooses through the environment, since vLLM's
configuration has no place for it: ``KVPOOL_EVICTION`` (``lru``, the default and vLLM's order;
``priority``; ``adaptive``, or ``adaptive:H`` for a horizon of ``H`` blocks freed: see
``docs/eviction.md``)."""

from __future__ import annotations

import os
from typing import Any

from kvpool.simulate import policy_args

__all__ = ["pool_options"]


def pool_options() -> dict[str, Any]:
    """Keyword arguments for the managers' ``kvpool.BlockPool``; a bad ``KVPOOL_EVICTION`` is
    the pool's own ``InvalidArgumentError`` when the manager is built."""
    eviction = os.environ.get("KVPOOL_EVICTION", "lru")
    try:
        args = policy_args(eviction)
    except ValueError:
        return {"eviction": eviction}  # the pool names what is wrong with it
    return {} if args == {"eviction": "lru"} else args
