"""The scheduler loop of ``docs/integration.md`` runs as written (its own asserts check it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import kvpool

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "integration.md"


def test_the_guides_code_runs(capsys: pytest.CaptureFixture[str]) -> None:
    if not hasattr(kvpool, "KVCacheManager"):
        pytest.skip("kvpool._core is not built")
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    assert blocks, "docs/integration.md has no python block"
    for code in blocks:
        exec(compile(code, str(GUIDE), "exec"), {"__name__": "integration_guide"})
    assert "prefix-cache hit rate" in capsys.readouterr().out
