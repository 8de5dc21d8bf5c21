"""vLLM's schedulers on kvpool, and the switch that puts kvpool under every scheduler.

vLLM's ``Scheduler.__init__`` builds its manager through the module global
``vllm.v1.core.sched.scheduler.KVCacheManager``; ``install()`` points that global (and
``vllm.v1.core.kv_cache_manager.KVCacheManager``) at ``kvpool.vllm.KVCacheManager``.
``Scheduler`` and ``AsyncScheduler`` install it when first built, for
``--scheduler-cls kvpool.vllm.Scheduler``; a class given there bypasses vLLM's automatic
choice of the async scheduler, hence both. ``install()`` also makes ``--kv-events-config``'s
``zmq`` publisher kvpool's, with vLLM's wire, and the engine core's request block hasher
kvpool's (the same hashes, computed in Rust).
"""

from __future__ import annotations

from typing import Any

import vllm.v1.core.kv_cache_manager as _kv_cache_manager_module
import vllm.v1.core.sched.scheduler as _scheduler_module
from vllm.v1.core.sched.async_scheduler import AsyncScheduler as _VllmAsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler as _VllmScheduler

from kvpool.vllm._manager import KVCacheManager
from kvpool.vllm.events import register as register_publisher
from kvpool.vllm.hashing import install as install_hashing


def install() -> None:
    """Make vLLM's schedulers (and vLLM's module name ``KVCacheManager``) build kvpool's
    manager, vLLM's ``zmq`` KV-event publisher kvpool's (:mod:`kvpool.vllm.events`), and
    vLLM's engine core hash request blocks with kvpool (:mod:`kvpool.vllm.hashing`)."""
    _scheduler_module.KVCacheManager = KVCacheManager
    _kv_cache_manager_module.KVCacheManager = KVCacheManager
    register_publisher()
    install_hashing()


class Scheduler(_VllmScheduler):  # type: ignore[misc]
    """vLLM 0.33's ``Scheduler`` with kvpool's ``KVCacheManager``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        install()
        super().__init__(*args, **kwargs)


class AsyncScheduler(_VllmAsyncScheduler):  # type: ignore[misc]
    """vLLM 0.33's ``AsyncScheduler`` with kvpool's ``KVCacheManager``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        install()
        super().__init__(*args, **kwargs)
