"""A pytest plugin that runs vLLM's own tests with kvpool's manager swapped in.

``python -m pytest -p kvpool.vllm.pytest_plugin tests/v1/core/...`` (from a copy of vLLM's
tests): before the test modules are imported, vLLM's ``KVCacheManager`` names point at
``kvpool.vllm.KVCacheManager``. In a test module that imports vLLM's per-type managers
(``test_single_type_kv_cache_manager.py``), each test whose code names only the kinds kvpool
covers runs with the module's ``BlockPool``, ``FullAttentionManager``, ``SlidingWindowManager``
and ``ChunkedLocalAttentionManager`` bound to ``kvpool.vllm.single_type``'s; a test that names
another per-type manager (Mamba, circular buffer, R-SWA) keeps vLLM's classes and counts as a
fallback. Each test is classified by the managers it built: on kvpool, fallen back to vLLM's
own class (configurations kvpool does not cover), or none; the counts are printed at the end
and written as JSON to ``$KVPOOL_VLLM_REPORT`` if set.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from types import CodeType
from typing import Any

import pytest

_RESULTS: dict[str, dict[str, str]] = {}

#: The names ``kvpool.vllm.single_type`` stands in for.
_STAND_INS = ("BlockPool", "FullAttentionManager", "SlidingWindowManager", "ChunkedLocalAttentionManager")


def _names(code: CodeType) -> Iterator[str]:
    """The global names a function's code (and the functions it defines) refers to."""
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _names(const)


def _stand_ins_for(item: pytest.Item) -> tuple[dict[str, Any], str | None]:
    """The module globals to bind to kvpool's per-type classes for this test, or why it keeps
    vLLM's (``None`` if the module imports no per-type manager)."""
    module, function = getattr(item, "module", None), getattr(item, "function", None)
    if module is None or function is None:
        return {}, None
    import vllm.v1.core.block_pool as vllm_block_pool
    import vllm.v1.core.single_type_kv_cache_manager as vllm_managers

    g = vars(module)
    if not any(g.get(n) is getattr(vllm_managers, n) for n in _STAND_INS[1:]):
        return {}, None
    others = sorted({n for n in _names(function.__code__)
                     if n not in _STAND_INS and isinstance(g.get(n), type)
                     and issubclass(g[n], vllm_managers.SingleTypeKVCacheManager)})
    if others:
        return {}, f"per-type managers kvpool does not cover: {', '.join(others)}"
    from kvpool.vllm import single_type

    swap = {n: getattr(single_type, n) for n in _STAND_INS if n in g}
    if g.get("BlockPool") is not vllm_block_pool.BlockPool:
        swap.pop("BlockPool", None)
    return swap, None


def pytest_configure(config: pytest.Config) -> None:
    from kvpool.vllm.scheduler import install

    install()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    from kvpool.vllm import COUNTS
    from kvpool.vllm._manager import FALLBACK_REASONS

    before, reasons = dict(COUNTS), dict(FALLBACK_REASONS)
    swap, kept_reason = _stand_ins_for(item)
    g: dict[str, Any] = vars(getattr(item, "module")) if swap else {}
    saved = {n: g[n] for n in swap}
    g.update(swap)
    try:
        yield
    finally:
        g.update(saved)
    built = {k: COUNTS[k] - before[k] for k in COUNTS}
    new_reasons = sorted(r for r, n in FALLBACK_REASONS.items() if n > reasons.get(r, 0))
    if kept_reason is not None:
        built["fallback"] += 1
        new_reasons.append(kept_reason)
    if new_reasons:
        _RESULTS.setdefault(item.nodeid, {})["fallback_reasons"] = "; ".join(new_reasons)
    kind = "kvpool" if built["kvpool"] and not built["fallback"] else (
        "mixed" if built["kvpool"] else ("fallback" if built["fallback"] else "none"))
    _RESULTS.setdefault(item.nodeid, {})["manager"] = kind


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        _RESULTS.setdefault(report.nodeid, {})["outcome"] = report.outcome


def pytest_terminal_summary(terminalreporter: Any) -> None:
    table: dict[str, dict[str, int]] = {}
    for row in _RESULTS.values():
        by = table.setdefault(row.get("manager", "none"), {})
        by[row.get("outcome", "?")] = by.get(row.get("outcome", "?"), 0) + 1
    terminalreporter.section("kvpool.vllm")
    for kind in ("kvpool", "mixed", "fallback", "none"):
        if kind in table:
            counts = ", ".join(f"{n} {o}" for o, n in sorted(table[kind].items()))
            terminalreporter.write_line(f"tests on {kind} managers: {counts}")
    from kvpool.vllm import hashing

    fallbacks = ", ".join(f"{n} {r}" for r, n in sorted(hashing.FALLBACKS.items())) or "none"
    terminalreporter.write_line(
        f"request block hashers built on kvpool: {hashing.BUILT['kvpool']} (vLLM's own hashed: {fallbacks})")
    path = os.environ.get("KVPOOL_VLLM_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(_RESULTS, f, indent=1, sort_keys=True)
