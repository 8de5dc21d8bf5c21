"""The scheduler loops of ``docs/integration.md`` and the README's examples run as written (the
loops' own asserts check them)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import kvpool

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "integration.md"


def test_the_guides_code_runs(capsys: pytest.CaptureFixture[str]) -> None:
    if not hasattr(kvpool, "KVCacheManager"):
        pytest.skip("kvpool._core is not built")
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    assert blocks, "docs/integration.md has no python block"
    for code in blocks:
        exec(compile(code, str(GUIDE), "exec"), {"__name__": "integration_guide"})
    assert "prefix-cache hit rate" in capsys.readouterr().out


def test_the_readmes_code_runs(capsys: pytest.CaptureFixture[str]) -> None:
    if not hasattr(kvpool, "KVCacheManager"):
        pytest.skip("kvpool._core is not built")
    readme = ROOT / "README.md"
    blocks = re.findall(r"```python\n(.*?)```", readme.read_text(), flags=re.S)
    assert len(blocks) >= 2, "the README lost its examples"
    namespace = {"__name__": "readme"}
    for code in blocks:  # the later examples use the first one's import
        exec(compile(code, str(readme), "exec"), namespace)
    assert "BlockStored" in capsys.readouterr().out
