"""The hostile-input tests on a debug build of the extension.

A debug build checks what a release build does not (integer overflow, rust-numpy's
alignment assertions), so the bad-input, pickle-identity and thread tests run again, in a
subprocess, against ``kvpool._core`` built with ``cargo build`` (no ``--release``) into
``target/debug-ext``. Skipped without cargo; set ``KVPOOL_SKIP_DEBUG_BUILD=1`` to skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = [
    "tests/test_bad_input.py", "tests/test_pickle_identity.py", "tests/test_threads.py",
    "tests/test_in_place_reads.py",
]

pytestmark = pytest.mark.skipif(
    shutil.which("cargo") is None or os.environ.get("KVPOOL_SKIP_DEBUG_BUILD") == "1",
    reason="needs cargo (or KVPOOL_SKIP_DEBUG_BUILD=1 is set)",
)


def test_hostile_inputs_on_a_debug_build(tmp_path: Path) -> None:
    target = ROOT / "target" / "debug-ext"
    env = dict(os.environ, PYO3_PYTHON=sys.executable)
    subprocess.run(
        ["cargo", "build", "--quiet", "--features", "python", "--lib", "--target-dir", str(target)],
        cwd=ROOT, env=env, check=True, timeout=900,
    )
    package = tmp_path / "kvpool"
    shutil.copytree(ROOT / "python" / "kvpool", package, ignore=shutil.ignore_patterns("_core*.so", "__pycache__"))
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    shutil.copy(target / "debug" / "libkvpool.so", package / f"_core{suffix}")
    env = dict(os.environ, PYTHONPATH=str(tmp_path), KVPOOL_HYPOTHESIS_EXAMPLES="50")
    probe = subprocess.run([sys.executable, "-c", "import kvpool._core as c; print(c.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert probe.stdout.strip().startswith(str(tmp_path)), probe.stdout
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", f"pythonpath={tmp_path}",
         "--rootdir", str(ROOT), *[str(ROOT / t) for t in TESTS]],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
