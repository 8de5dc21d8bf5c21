"""The ``vllm.general_plugins`` entry point: kvpool under every vLLM scheduler when
``KVPOOL_VLLM=1`` is set, with no change to the engine's command line.

vLLM loads general plugins in ``EngineArgs.__post_init__``, in ``EngineCore.__init__``
before the scheduler is built, and in workers; ``register`` reads the environment first and
imports vLLM's scheduler modules only when it installs.
"""

from __future__ import annotations

import os


def register() -> None:
    """Point vLLM's ``KVCacheManager`` names at ``kvpool.vllm.KVCacheManager`` if
    ``KVPOOL_VLLM=1``."""
    if os.environ.get("KVPOOL_VLLM") == "1":
        from kvpool.vllm.scheduler import install

        install()
