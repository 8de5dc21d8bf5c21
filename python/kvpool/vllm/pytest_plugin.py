"""A pytest plugin that runs vLLM's own tests with kvpool's manager swapped in.

``python -m pytest -p kvpool.vllm.pytest_plugin tests/v1/core/...`` (from a copy of vLLM's
tests): before the test modules are imported, vLLM's ``KVCacheManager`` names point at
``kvpool.vllm.KVCacheManager``. Each test is classified by the managers it built: on kvpool,
fallen back to vLLM's own class (configurations kvpool does not cover), or none; the counts
are printed at the end and written as JSON to ``$KVPOOL_VLLM_REPORT`` if set.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

_RESULTS: dict[str, dict[str, str]] = {}


def pytest_configure(config: pytest.Config) -> None:
    from kvpool.vllm.scheduler import install

    install()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    from kvpool.vllm import COUNTS
    from kvpool.vllm._manager import FALLBACK_REASONS

    before, reasons = dict(COUNTS), dict(FALLBACK_REASONS)
    yield
    built = {k: COUNTS[k] - before[k] for k in COUNTS}
    new_reasons = sorted(r for r, n in FALLBACK_REASONS.items() if n > reasons.get(r, 0))
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
