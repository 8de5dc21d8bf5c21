"""kvpool inside vLLM 0.33's own scheduler.

``kvpool.vllm.KVCacheManager`` has vLLM's constructor and methods and runs on kvpool's Rust
block tables; ``kvpool.vllm.Scheduler`` and ``kvpool.vllm.AsyncScheduler`` are vLLM's
schedulers building it (``--scheduler-cls kvpool.vllm.Scheduler``), and the
``vllm.general_plugins`` entry point does the same for every scheduler when ``KVPOOL_VLLM=1``
is set. Configurations kvpool does not cover are built by vLLM's own manager, logged once.
Needs ``pip install 'kvpool[vllm]'`` (vLLM 0.33.0); ``import kvpool`` never imports vLLM.
"""

from __future__ import annotations

from kvpool.vllm._manager import COUNTS, KVCacheManager, VllmKVCacheManager, unsupported_reason
from kvpool.vllm.scheduler import AsyncScheduler, Scheduler, install

__all__ = [
    "COUNTS",
    "AsyncScheduler",
    "KVCacheManager",
    "Scheduler",
    "VllmKVCacheManager",
    "install",
    "unsupported_reason",
]
