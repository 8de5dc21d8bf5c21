"""A module loaded from a file path under a name of its own, for the benchmark scripts: the
shared vLLM peer (``vs_vllm.py``) and compiled builds of kvpool's extension side by side
(``ab_builds.py``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def load_module(name: str, path: str | Path) -> ModuleType:
    """The module in ``path`` (a ``.py`` file or a compiled extension, whose ``name`` must be
    the one it was built under), executed as a new module object not put in ``sys.modules``."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load a module from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
