"""kvpool.vllm inside vLLM 0.33: vLLM's own tests with kvpool swapped in, and the switches.

vLLM 0.33.0's ``tests/v1/core`` files live outside the project (``../shared/vllm-tests``, or
``$KVPOOL_VLLM_TESTS``); they are copied to a temporary folder and run in a subprocess with
``-p kvpool.vllm.pytest_plugin``, deselecting the tests that need hub models (they fail on
plain vLLM too). Every test must pass, and at least the configurations kvpool covers must have
run on kvpool. Skipped without vLLM or without those files.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VLLM_TESTS = Path(os.environ.get("KVPOOL_VLLM_TESTS", ROOT.parent / "shared" / "vllm-tests"))

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"),
    pytest.mark.skipif(not (VLLM_TESTS / "tests" / "v1" / "core").is_dir(), reason=f"no vLLM tests at {VLLM_TESTS}"),
]

#: File -> least number of its tests that must run on kvpool managers (the in-scope ones:
#: full-attention, sliding-window and chunked-local groups without a connector, eagle or
#: context parallelism; in the single-type file, the tests of those managers' own classes).
SUITE = {
    "test_prefix_caching.py": 49,
    "test_scheduler.py": 190,
    "test_kv_cache_utils.py": 0,
    "test_single_type_kv_cache_manager.py": 13,
}


@pytest.fixture(scope="module")
def vllm_tests(tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("vllm-tests") / "vllm-tests"
    shutil.copytree(VLLM_TESTS, copy)
    return copy


def vllm_env(copy: Path) -> dict[str, str]:
    return dict(os.environ, VLLM_TARGET_DEVICE="cpu", HF_HOME=str(copy / "hf_home"), HF_HUB_OFFLINE="1")


@pytest.mark.parametrize("name", list(SUITE))
def test_vllm_own_tests_pass_on_kvpool(name: str, vllm_tests: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    deselect = [line.strip() for line in (vllm_tests / "needs-hub-models.txt").read_text().splitlines()
                if line.strip() and not line.startswith("#") and name in line]
    report = tmp_path / "report.json"
    env = dict(vllm_env(vllm_tests), KVPOOL_VLLM_REPORT=str(report))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "kvpool.vllm.pytest_plugin",
         f"tests/v1/core/{name}", *[f"--deselect={d}" for d in deselect]],
        cwd=vllm_tests, env=env, capture_output=True, text=True, timeout=1800,
    )
    tail = "\n".join(run.stdout.splitlines()[-12:])
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    # vLLM's tests make their requests' block hashers through kvpool's factory (those that
    # make any: the single-type managers' tests hash no request).
    built = int(run.stdout.split("request block hashers built on kvpool: ")[1].split()[0])
    assert built > 0 or name == "test_single_type_kv_cache_manager.py", tail
    results = json.loads(report.read_text())
    by_kind: dict[str, int] = {}
    for row in results.values():
        assert row.get("outcome") in ("passed", "skipped"), row
        by_kind[row.get("manager", "none")] = by_kind.get(row.get("manager", "none"), 0) + 1
    with capsys.disabled():
        print(f"\nkvpool.vllm, vLLM's {name}: {len(results)} tests, by manager {by_kind}, "
              f"{built} request block hashers on kvpool")
    assert by_kind.get("kvpool", 0) >= SUITE[name], tail


SELECT = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, os.getcwd())
    from tests.v1.core.utils import create_scheduler
    from vllm.utils.import_utils import resolve_obj_by_qualname
    mode = sys.argv[1]
    if mode == "plugin":
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        scheduler = create_scheduler(enable_prefix_caching=True)
    else:
        cls = resolve_obj_by_qualname(mode)
        scheduler = create_scheduler(enable_prefix_caching=True, scheduler_cls=cls,
                                     async_scheduling="Async" in mode)
    manager = scheduler.kv_cache_manager
    import vllm.v1.engine.core as engine_core
    hasher = engine_core.get_request_block_hasher
    print(hasher.__module__, type(scheduler).__module__, type(manager).__module__ + "." + type(manager).__name__)
""")


@pytest.mark.parametrize("mode,env", [
    ("kvpool.vllm.Scheduler", {}),
    ("kvpool.vllm.AsyncScheduler", {}),
    ("plugin", {"KVPOOL_VLLM": "1"}),
])
def test_scheduler_classes_and_the_plugin_select_kvpool(mode: str, env: dict[str, str], vllm_tests: Path) -> None:
    """``--scheduler-cls kvpool.vllm.Scheduler`` (resolved by qualified name, as vLLM's
    ``SchedulerConfig.get_scheduler_cls`` does) and ``KVPOOL_VLLM=1`` with vLLM's plugin
    loader both build vLLM's scheduler on kvpool's manager."""
    run = subprocess.run([sys.executable, "-c", SELECT, mode], cwd=vllm_tests,
                         env=dict(vllm_env(vllm_tests), **env), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split()[-1] == "kvpool.vllm._manager.KVCacheManager", run.stdout
    # The engine core's request block hasher factory is kvpool's too.
    assert run.stdout.split()[-3] == "kvpool.vllm.hashing", run.stdout


def test_without_the_flag_the_plugin_changes_nothing(vllm_tests: Path) -> None:
    env = {k: v for k, v in vllm_env(vllm_tests).items() if k != "KVPOOL_VLLM"}
    run = subprocess.run([sys.executable, "-c", SELECT, "plugin"], cwd=vllm_tests, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split()[-1] == "vllm.v1.core.kv_cache_manager.KVCacheManager", run.stdout
    assert run.stdout.split()[-3] == "vllm.v1.core.kv_cache_utils", run.stdout


def run_differential(vllm_tests: Path, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Run ``python -m kvpool.vllm.differential *args`` from vLLM's tests folder; its summary line."""
    run = subprocess.run([sys.executable, "-m", "kvpool.vllm.differential", *args],
                         cwd=vllm_tests, env=vllm_env(vllm_tests), capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    line = run.stdout.strip().splitlines()[-1]
    with capsys.disabled():
        print(f"\n{line}")
    return line


def test_differential_against_vllm_on_random_workloads(vllm_tests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM's real scheduler with vLLM's manager and with kvpool's, 200 random workloads:
    every scheduler output, engine output, event and free count equal on every step."""
    line = run_differential(vllm_tests, capsys, "--workloads", "200")
    assert "200 workloads" in line and "every step equal" in line


def test_differential_with_the_cpu_offload_connector(vllm_tests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM's scheduler with its ``SimpleCPUOffloadConnector`` (eager and lazy) on vLLM's manager and
    on kvpool's, 42 random workloads (one full-attention group, or full attention with sliding
    windows) over pools small enough that blocks go to the CPU and come back: scheduler
    outputs, the connector's loads and stores, engine outputs, free counts and the CPU pool's
    blocks equal on every step, and the workloads, hybrid ones included, did store and load."""
    line = run_differential(vllm_tests, capsys, "--offload", "--workloads", "42")
    assert "42 workloads" in line and "every step equal" in line
    stored, loaded = (int(line.split(word)[0].split()[-1]) for word in (" blocks to the CPU", " back"))
    hybrid_stored, hybrid_loaded = (int(n) for n in line.split("back (")[1].split(" of them")[0].split(" and "))
    assert stored > 0 and loaded > 0 and hybrid_stored > 0 and hybrid_loaded > 0, line
