"""The type stubs match the compiled module (``mypy.stubtest``), and the package type-checks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy")
pytest.importorskip("kvpool._core")

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m ARGS`` from the repository root."""
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_stubs_match_the_extension() -> None:
    result = run("mypy.stubtest", "kvpool._core", "--ignore-missing-stub")
    assert result.returncode == 0, result.stdout + result.stderr


def test_package_is_mypy_strict_clean() -> None:
    result = run("mypy", "python/kvpool")
    assert result.returncode == 0, result.stdout + result.stderr
