"""kvpool inside vLLM 0.33's own scheduler.

``kvpool.vllm.KVCacheManager`` has vLLM's constructor and methods and runs on kvpool's Rust
block tables; ``kvpool.vllm.Scheduler`` and ``kvpool.vllm.AsyncScheduler`` are vLLM's
schedulers building it (``--scheduler-cls kvpool.vllm.Scheduler``), and the
``vllm.general_plugins`` entry point (``kvpool.vllm.plugin:register``) does the same for every
scheduler when ``KVPOOL_VLLM=1`` is set. Configurations kvpool does not cover are built by
vLLM's own manager, logged once. Needs ``pip install 'kvpool[vllm]'`` (vLLM 0.33.0);
``import kvpool`` never imports vLLM, and this package imports it only when one of the names
below is first used.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "COUNTS": "kvpool.vllm._manager",
    "FALLBACK_REASONS": "kvpool.vllm._manager",
    "HASHING_FALLBACKS": "kvpool.vllm.hashing",
    "KVCacheManager": "kvpool.vllm._manager",
    "VllmKVCacheManager": "kvpool.vllm._manager",
    "get_request_block_hasher": "kvpool.vllm.hashing",
    "unsupported_reason": "kvpool.vllm._manager",
    "AsyncScheduler": "kvpool.vllm.scheduler",
    "KvpoolEventPublisher": "kvpool.vllm.events",
    "Scheduler": "kvpool.vllm.scheduler",
    "install": "kvpool.vllm.scheduler",
    # Blocks as vLLM's ``KVCacheBlock``, made in Rust (no vLLM import).
    "FreeBlockWalk": "kvpool._core",
    "KVCacheBlockView": "kvpool._core",
}

#: Names exported under another name than their module's.
_ALIASES = {"HASHING_FALLBACKS": "FALLBACKS"}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'kvpool.vllm' has no attribute {name!r}")
    return getattr(importlib.import_module(module), _ALIASES.get(name, name))
