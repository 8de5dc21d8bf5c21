"""NVIDIA Dynamo's own KV indexer (``ai-dynamo-runtime==1.6.1``, ``python -m dynamo.indexer``)
reading three kvpool managers' events over ZeroMQ: after shared prefixes, evictions, a
prefix-cache reset, a late joiner and a batch lost on the wire, its ``/query`` scores equal
each manager's own longest prefix hit (``tests/dynamo_scenario.py``). The indexer binds
0.0.0.0, so everything runs in a private network namespace (``unshare -n``, loopback only).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("dynamo") is None, reason="ai-dynamo-runtime is not installed"),
    pytest.mark.skipif(shutil.which("unshare") is None or shutil.which("ip") is None,
                       reason="needs unshare and ip (util-linux, iproute2)"),
]

SCENARIO = Path(__file__).with_name("dynamo_scenario.py")


def test_dynamos_indexer_scores_equal_each_managers_hits(capsys: pytest.CaptureFixture[str]) -> None:
    run = subprocess.run(["unshare", "-n", "sh", "-c", f'ip link set lo up && "{sys.executable}" "{SCENARIO}"'],
                         capture_output=True, text=True, timeout=300)
    phases = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    with capsys.disabled():
        for p in phases:
            print(f"\nDynamo indexer, {p['phase']}: {p['probes']} probes equal={p['equal']} "
                  f"({p['hit_tokens']} hit tokens)", end="")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert [p["phase"] for p in phases] == ["shared prefixes", "evictions", "prefix-cache reset", "late joiner",
                                            "sequence gap"]
    assert all(p["equal"] for p in phases)
