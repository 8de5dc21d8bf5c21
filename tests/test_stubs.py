"""The type stubs match the compiled module (``mypy.stubtest``), and the package type-checks."""

from __future__ import annotations

import os
import re
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
    # Checked as the running interpreter's version: the numpy stubs installed for it may
    # use syntax older versions lack (numpy 2.4's stubs need 3.12).
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    result = run("mypy", "--python-version", version, "python/kvpool")
    assert result.returncode == 0, result.stdout + result.stderr


def test_stub_docstrings_are_the_extensions() -> None:
    """Every documented item of ``_core.pyi`` carries the compiled module's docstring."""
    result = subprocess.run([sys.executable, "scripts/stub_docstrings.py", "--check"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_documented_examples_type_check(tmp_path: Path) -> None:
    """The README's and the integration guide's Python examples pass ``mypy --strict``
    against the stubs, as an engine's code would check them (a ``BlockHashList`` passed as
    block hashes, the README's first example, was refused by the stubs)."""
    def examples(doc: str) -> list[str]:
        blocks = re.findall(r"```python\n(.*?)```", (ROOT / doc).read_text(), re.S)
        assert blocks, f"{doc} lost its examples"
        return blocks

    # The README's examples run one after the other (the second uses the first's import);
    # each of the guide's stands alone.
    (tmp_path / "readme.py").write_text("\n".join(examples("README.md")))
    for i, block in enumerate(examples("docs/integration.md")):
        (tmp_path / f"integration_{i}.py").write_text(block)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--python-version", version, "--no-incremental",
         "--allow-redefinition", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "MYPYPATH": str(ROOT / "python")},
    )
    assert result.returncode == 0, result.stdout + result.stderr
