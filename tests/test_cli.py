"""The ``kvpool`` command line: options, output formats, and errors (exit 2, no traceback)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import kvpool
from kvpool.bench import Row, resolve_names
from kvpool.cli import Progress, main

HAVE_CORE = hasattr(kvpool, "BlockPool")  # conftest registers a bare package when not built
needs_core = pytest.mark.skipif(not HAVE_CORE, reason="kvpool._core is not built")

# The hand-worked trace of test_simulate.py (4 tokens per block): 16 blocks, 57 input tokens;
# capacity 4 hits 7 blocks and evicts 3, unbounded hits 8.
HAND = [([1, 2, 3], 10), ([1, 2, 4, 5], 15), ([1, 2, 3, 6, 7, 8], 22), ([1, 2, 3], 10)]
SIM_KEYS = ["trace", "capacity_blocks", "requests", "blocks", "hit_blocks", "block_hit_ratio",
            "token_hit_ratio", "evictions", "seconds", "policy", "adaptive_horizon", "capacity_tokens", "capacity_gib",
            "mode"]


@pytest.fixture
def hand_trace(tmp_path: Path) -> Path:
    path = tmp_path / "hand.jsonl"
    path.write_text("".join(
        json.dumps({"timestamp": i, "input_length": n, "output_length": 1, "hash_ids": ids}) + "\n"
        for i, (ids, n) in enumerate(HAND)))
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``main(argv)``: exit status, stdout, stderr."""
    status = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return status, out, err


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


# --------------------------------------------------------------------------------------------
# Top level.
# --------------------------------------------------------------------------------------------


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(capsys)
    assert status == 2 and "usage: kvpool" in err


def test_help_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "--help")
    assert status == 0 and "bench" in out and "simulate" in out
    status, out, _ = run(capsys, "--version")
    assert status == 0 and out.startswith("kvpool ")


def test_the_installed_version_is_the_crates() -> None:
    """The package's metadata takes its version from Cargo.toml (``dynamic = ["version"]``), so
    the installed distribution, ``kvpool.__version__`` and the crate agree."""
    import importlib.metadata

    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later
    try:
        installed = importlib.metadata.version("kvpool")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("kvpool is not installed (run from a source tree through PYTHONPATH)")
    crate = tomllib.loads((Path(__file__).parents[1] / "Cargo.toml").read_text())["package"]["version"]
    assert installed == kvpool.__version__ == crate


def test_python_dash_m(hand_trace: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "kvpool", "simulate", str(hand_trace), "--block-tokens", "4",
                           "--impl", "reference", "--json"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert json_lines(done.stdout)[0]["hit_blocks"] == 8
    done = subprocess.run([sys.executable, "-m", "kvpool", "simulate", "/nonexistent/trace.jsonl"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert "cannot read the trace" in done.stderr and "Traceback" not in done.stderr


# --------------------------------------------------------------------------------------------
# simulate
# --------------------------------------------------------------------------------------------


@needs_core
def test_simulate_json_sweep(capsys: pytest.CaptureFixture[str], hand_trace: Path) -> None:
    status, out, err = run(capsys, "simulate", str(hand_trace), "--capacity-blocks", "4", "2",
                           "--block-tokens", "4", "--json")
    assert status == 0 and err == ""  # no progress bar: stderr is not a tty
    rows = json_lines(out)
    assert [list(r) for r in rows] == [SIM_KEYS, SIM_KEYS]
    assert [(r["capacity_blocks"], r["hit_blocks"], r["evictions"]) for r in rows] == [(4, 7, 3), (2, 6, 0)]
    assert rows[0]["trace"] == "hand.jsonl" and rows[0]["blocks"] == 16 and rows[0]["requests"] == 4
    assert rows[0]["block_hit_ratio"] == round(7 / 16, 6)
    assert rows[0]["token_hit_ratio"] == round(26 / 57, 6)


@needs_core
def test_simulate_defaults_to_unbounded(capsys: pytest.CaptureFixture[str], hand_trace: Path) -> None:
    status, out, _ = run(capsys, "simulate", str(hand_trace), "--block-tokens", "4", "--json")
    rows = json_lines(out)
    assert status == 0 and len(rows) == 1
    assert rows[0]["capacity_blocks"] is None and rows[0]["hit_blocks"] == 8 and rows[0]["evictions"] == 0


@needs_core
def test_simulate_unbounded_comes_last(capsys: pytest.CaptureFixture[str], hand_trace: Path) -> None:
    _, out, _ = run(capsys, "simulate", str(hand_trace), "--unbounded", "--capacity-blocks", "4", "4", "1",
                    "--block-tokens", "4", "--json")
    assert [r["capacity_blocks"] for r in json_lines(out)] == [4, 1, None]  # duplicates dropped


def test_simulate_reference_impl(capsys: pytest.CaptureFixture[str], hand_trace: Path) -> None:
    status, out, _ = run(capsys, "simulate", str(hand_trace), "--capacity-blocks", "4", "--block-tokens", "4",
                         "--impl", "reference", "--json")
    assert status == 0 and json_lines(out)[0]["hit_blocks"] == 7


def test_simulate_block_tokens_changes_token_ratio(capsys: pytest.CaptureFixture[str], hand_trace: Path) -> None:
    # With the default 512 tokens per block every hit counts the request's whole input.
    _, out, _ = run(capsys, "simulate", str(hand_trace), "--impl", "reference", "--json")
    assert json_lines(out)[0]["token_hit_ratio"] == round((15 + 22 + 10) / 57, 6)


@needs_core
def test_simulate_table(capsys: pytest.CaptureFixture[str], hand_trace: Path) -> None:
    status, out, _ = run(capsys, "simulate", str(hand_trace), "--capacity-blocks", "4", "--unbounded",
                         "--block-tokens", "4")
    lines = out.splitlines()
    assert status == 0
    assert lines[0] == "hand.jsonl: 4 requests, 16 blocks (8 distinct ids), 4 tokens per block"
    assert lines[1].split() == ["capacity", "tokens", "hit_blocks", "block_hit", "token_hit", "evictions", "pool_s"]
    assert lines[2].split()[:6] == ["4", "16", "7", "0.4375", f"{26 / 57:.4f}", "3"]
    assert lines[3].split()[:5] == ["unbounded", "8", "0.5000", f"{30 / 57:.4f}", "0"]


BAD_TRACES = [
    ('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}\n{oops\n', "bad.jsonl:2: not valid JSON"),
    ('{"timestamp": 0, "input_length": 1, "hash_ids": [1]}\n', "bad.jsonl:1: missing field 'output_length'"),
    ('{"timestamp": 0, "input_length": -3, "output_length": 1, "hash_ids": [1]}\n', "bad.jsonl:1: 'input_length' must be >= 0"),
    ('{"timestamp": 0, "input_length": 3, "output_length": -1, "hash_ids": [1]}\n', "bad.jsonl:1: 'output_length' must be >= 0"),
    ("", "bad.jsonl: the trace is empty"),
    ("[" * 200_000 + "\n", "bad.jsonl:1: not valid JSON for a trace (nested too deeply)"),
    ('{"timestamp": 0, "input_length": 100000000000000000000000, "output_length": 1, "hash_ids": [1]}\n',
     "bad.jsonl:1: 'input_length' must be below 2**63"),
]


@pytest.mark.parametrize(("text", "message"), BAD_TRACES)
def test_simulate_bad_trace(capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    status, out, err = run(capsys, "simulate", str(path), "--impl", "reference")
    assert status == 2 and out == ""
    assert err.startswith("kvpool simulate: error: ") and message in err


def test_simulate_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    status, _, err = run(capsys, "simulate", str(tmp_path / "none.jsonl"))
    assert status == 2 and "none.jsonl: cannot read the trace: No such file or directory" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--capacity-blocks", "0"], "expected a positive integer, got 0"),
        (["--capacity-blocks", "x"], "expected a positive integer, got 'x'"),
        (["--capacity-blocks"], "expected at least one argument"),
        (["--block-tokens", "-1"], "expected a positive integer"),
        (["--impl", "vllm"], "invalid choice"),
        (["--bogus"], "unrecognized arguments"),
        (["--capacity-gib", "40"], "--capacity-gib needs the model's KV bytes per token"),
        (["--capacity-gib", "-1", "--model", "llama3-8b"], "expected a positive number"),
        (["--capacity-gib", "0.01", "--model", "llama3-8b"], "--capacity-gib 0.01 holds less than one block"),
        (["--capacity-tokens", "3"], "--capacity-tokens 3 holds less than one block of 512 tokens"),
        (["--capacity-tokens", "9", "--capacity-blocks", "2"], "not allowed with argument"),
        (["--model", "gpt-9"], "--model: 'gpt-9' is neither a preset"),
        (["--model", "llama3-8b", "--kv-bytes-per-token", "2"], "not allowed with argument"),
        (["--timed", "--max-running", "0"], "expected a positive integer"),
        (["--timed", "--decode-tps", "nan"], "expected a positive number"),
        (["--model-layers", "gemma3", "--timed"], "--capacity-blocks only and no --timed"),
        (["--block-tokens", "99999999999999999999"], "expected at most 4294967295 tokens per block"),
        (["--model-layers", "gemma3", "--capacity-blocks", "3"], "cannot hold one block for each"),
        (["--model-layers", "fullx1000000000"], "at most 1024 KV-cache groups"),
        (["--instances", "100"], "at most one instance per request"),
        # Options another model would ignore, and contradictions.
        (["--mode", "sequential", "--timed"], "contradict each other"),
        (["--router", "kv-aware"], "--router needs --instances"),
        (["--model-layers", "full", "--instances", "2"], "two models: pick one"),
        (["--model-layers", "full", "--policy", "adaptive"], "--policy applies to the sequential and timed"),
        (["--instances", "2", "--unbounded"], "--unbounded applies to the sequential and timed"),
        (["--retention-interval", "512"], "--retention-interval needs --model-layers"),
        (["--prefill-tps", "5", "--max-running", "2"], "--prefill-tps, --max-running apply to the timed mode"),
    ],
)
def test_simulate_bad_options(capsys: pytest.CaptureFixture[str], hand_trace: Path, args: list[str], message: str) -> None:
    status, _, err = run(capsys, "simulate", str(hand_trace), *args)
    assert status == 2 and message in err


def test_simulate_needs_a_trace(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(capsys, "simulate")
    assert status == 2 and "TRACE" in err


def test_simulate_plot_without_matplotlib(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                          hand_trace: Path, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    status, out, err = run(capsys, "simulate", str(hand_trace), "--impl", "reference", "--plot", str(tmp_path / "p.png"))
    assert status == 2 and out == ""  # checked before the replay
    assert "--plot needs matplotlib" in err and "pip install 'kvpool[plot]'" in err


def test_simulate_plot(capsys: pytest.CaptureFixture[str], hand_trace: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "p.png"
    status, out, _ = run(capsys, "simulate", str(hand_trace), "--impl", "reference", "--block-tokens", "4",
                         "--plot", str(path), "--json")
    rows = json_lines(out)
    assert status == 0 and path.read_bytes()[:4] == b"\x89PNG"
    # The default sweep (8 geometric points, fewer where a tiny trace makes them coincide)
    # then the unbounded ceiling.
    capacities = [r["capacity_blocks"] for r in rows]
    assert capacities[-1] is None and 2 <= len(capacities) <= 9
    assert capacities[:-1] == sorted(set(capacities[:-1]))


# --------------------------------------------------------------------------------------------
# The progress bar.
# --------------------------------------------------------------------------------------------


def test_progress_draws_and_erases() -> None:
    stream = io.StringIO()
    bar = Progress("capacity 10", 200, stream=stream, enabled=True, delay=0, interval=0)
    bar(50)
    bar(200)
    assert stream.getvalue().count("\r") == 2
    assert "capacity 10 [" in stream.getvalue() and "200/200" in stream.getvalue()
    bar.close()
    assert stream.getvalue().endswith("\r") and stream.getvalue().rstrip("\r").endswith(" ")


def test_progress_off_when_not_a_tty_or_short() -> None:
    stream = io.StringIO()  # not a tty
    bar = Progress("x", 10, stream=stream, delay=0, interval=0)
    bar(5)
    bar.close()
    short = Progress("x", 10, stream=stream, enabled=True, delay=60)  # a run shorter than delay
    short(5)
    short.close()
    assert stream.getvalue() == ""


# --------------------------------------------------------------------------------------------
# bench
# --------------------------------------------------------------------------------------------


def test_bench_json_reference_only(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "bench", "--only", "serve-random", "--reps", "1", "--impl", "reference", "--json")
    [obj] = json_lines(out)
    assert status == 0
    assert obj["workload"] == "serve-random" and obj["reps"] == 1
    assert obj["params"] == {"requests": 100, "blocks_per_req": 44, "block_size": 16, "pool_blocks": 32768,
                             "caching": False}
    results = obj["results"]
    assert [r["variant"] for r in results] == ["pool-per-request", "pool-batch", "pool-many",
                                               "manager-per-request", "manager-step"]
    assert all(r["kvpool"] is None and r["ratio"] is None and r["reference"] > 0 for r in results)


@needs_core
def test_bench_table_both(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "bench", "--only", "W1", "--reps", "1")
    lines = out.splitlines()
    assert status == 0
    assert lines[1].split() == ["workload", "variant", "metric", "kvpool", "reference", "ratio"]
    assert lines[3].split()[:2] == ["serve-random", "pool-per-request"] and lines[3].endswith("x")
    assert lines[-1].startswith("total wall time: ")


@needs_core
def test_bench_trace_option(capsys: pytest.CaptureFixture[str], hand_trace: Path) -> None:
    status, out, _ = run(capsys, "bench", "--only", "trace-replay", "--trace", str(hand_trace), "--reps", "1", "--json")
    [obj] = json_lines(out)
    assert status == 0 and obj["params"]["trace"] == "hand.jsonl"
    [total, rate, hit] = obj["results"]
    assert (total["metric"], rate["metric"], hit["metric"]) == ("total_s", "requests_per_s", "hit_ratio")
    assert hit["kvpool"] == hit["reference"] == 0.5  # 8 of 16 blocks: the pool never fills


def test_bench_bad_options(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    status, _, err = run(capsys, "bench", "--only", "serve-random,nope")
    assert status == 2 and "unknown workload 'nope'" in err
    status, _, err = run(capsys, "bench", "--reps", "0")
    assert status == 2 and "positive integer" in err
    status, _, err = run(capsys, "bench", "--trace", str(tmp_path / "none.jsonl"))
    assert status == 2 and "cannot read the trace" in err
    status, _, err = run(capsys, "bench", "--impl", "vllm")
    assert status == 2 and "invalid choice" in err


def test_resolve_names() -> None:
    assert resolve_names(None) == ["serve-random", "prefix-warmup", "churn", "trace-replay"]
    assert resolve_names("W4, churn,w1") == ["serve-random", "churn", "trace-replay"]  # canonical order
    with pytest.raises(ValueError, match="unknown workload"):
        resolve_names(",")


def test_row_ratio() -> None:
    assert Row("v", "us_per_req", "time", {"kvpool": 2.0, "reference": 10.0}).ratio() == 5.0
    assert Row("v", "requests_per_s", "rate", {"kvpool": 10.0, "reference": 2.0}).ratio() == 5.0
    assert Row("v", "hit_ratio", "value", {"kvpool": 0.5, "reference": 0.5}).ratio() is None
    assert Row("v", "us_per_req", "time", {"kvpool": 2.0}).ratio() is None


@needs_core
def test_simulate_policies_side_by_side(capsys: pytest.CaptureFixture[str], hand_trace: Path) -> None:
    """``--policy``: one row per policy and capacity, Belady's MIN added; LRU's counts are the
    default run's, and no policy beats MIN."""
    status, out, _ = run(capsys, "simulate", str(hand_trace), "--capacity-blocks", "4", "2", "--json", "--quiet")
    assert status == 0
    default = {r["capacity_blocks"]: r["hit_blocks"] for r in json_lines(out)}
    status, out, _ = run(capsys, "simulate", str(hand_trace), "--capacity-blocks", "4", "2",
                         "--policy", "lru", "adaptive", "priority", "--json", "--quiet")
    assert status == 0
    rows = json_lines(out)
    assert [(r["policy"], r["capacity_blocks"]) for r in rows] == [
        ("lru", 4), ("lru", 2), ("adaptive", 4), ("adaptive", 2), ("priority", 4), ("priority", 2),
        ("belady", 4), ("belady", 2)]
    hits = {(r["policy"], r["capacity_blocks"]): r["hit_blocks"] for r in rows}
    assert {c: hits[("lru", c)] for c in (4, 2)} == default
    for c in (4, 2):
        assert hits[("belady", c)] >= max(hits[(p, c)] for p in ("lru", "adaptive", "priority"))
    status, out, _ = run(capsys, "simulate", str(hand_trace), "--capacity-blocks", "4", "--policy", "adaptive",
                         "--unbounded", "--quiet")
    assert status == 0 and "belady" in out and "unbounded" in out


def test_simulate_rejects_an_unknown_policy(capsys: pytest.CaptureFixture[str], hand_trace: Path) -> None:
    for bad in ("lfu", "lru:5", "adaptive:", "adaptive:-1", "adaptive:x", f"adaptive:{2**40 + 1}"):
        status, _, err = run(capsys, "simulate", str(hand_trace), "--policy", bad)
        assert status == 2 and "--policy" in err and bad in err, bad


@needs_core
def test_simulate_compares_adaptive_horizons(capsys: pytest.CaptureFixture[str], hand_trace: Path) -> None:
    """``adaptive:H`` is the adaptive policy with horizon ``H``: ``adaptive:0`` gives LRU's
    counts, and the default horizon's row is ``adaptive``'s."""
    status, out, _ = run(capsys, "simulate", str(hand_trace), "--capacity-blocks", "4", "2", "--policy", "lru",
                         "adaptive", "adaptive:0", "adaptive:20000", "adaptive:3", "--json", "--quiet")
    assert status == 0
    hits = {(r["policy"], r["capacity_blocks"]): r["hit_blocks"] for r in json_lines(out)}
    for c in (4, 2):
        assert hits[("adaptive:0", c)] == hits[("lru", c)]
        assert hits[("adaptive:20000", c)] == hits[("adaptive", c)]
        assert ("adaptive:3", c) in hits


@needs_core
def test_a_capacity_beyond_the_trace_replays_as_unbounded(capsys: pytest.CaptureFixture[str], hand_trace: Path) -> None:
    """A huge capacity is clamped to what the trace can fill: the unbounded counts, no huge pool."""
    status, out, _ = run(capsys, "simulate", str(hand_trace), "--capacity-blocks", "2147483647", "--unbounded",
                         "--json", "--quiet")
    assert status == 0
    huge, unbounded = json_lines(out)
    assert huge["capacity_blocks"] == 2147483647
    assert (huge["hit_blocks"], huge["evictions"]) == (unbounded["hit_blocks"], unbounded["evictions"]) == (8, 0)


@needs_core
@pytest.mark.parametrize("bad", ["plot.txt", "no/such/dir/plot.png"])
def test_a_bad_plot_path_fails_before_any_replay(capsys: pytest.CaptureFixture[str], hand_trace: Path,
                                                  tmp_path: Path, bad: str) -> None:
    pytest.importorskip("matplotlib")
    for extra in ([], ["--policy", "lru", "adaptive"]):
        status, out, err = run(capsys, "simulate", str(hand_trace), "--plot", str(tmp_path / bad), "--quiet", *extra)
        assert status == 2 and out == "" and "--plot" in err


@needs_core
def test_simulate_capacity_in_tokens_and_gib(capsys: pytest.CaptureFixture[str], hand_trace: Path) -> None:
    """Tokens and GiB become whole blocks; each row says its capacity in all three units."""
    _, out, _ = run(capsys, "simulate", str(hand_trace), "--block-tokens", "4", "--capacity-tokens", "17", "8", "--json")
    rows = json_lines(out)
    assert [(r["capacity_blocks"], r["capacity_tokens"], r["capacity_gib"]) for r in rows] == [(4, 16, None), (2, 8, None)]
    assert rows[0]["hit_blocks"] == 7  # as --capacity-blocks 4
    _, out, _ = run(capsys, "simulate", str(hand_trace), "--block-tokens", "4", "--capacity-gib", "1",
                    "--kv-bytes-per-token", str(2**26), "--json")
    (row,) = json_lines(out)
    assert (row["capacity_blocks"], row["capacity_gib"]) == (4, 1.0)
    status, out, _ = run(capsys, "simulate", str(hand_trace), "--block-tokens", "4", "--capacity-gib", "1",
                         "--model", f"1:1:{2**20}:bf16")
    assert status == 0 and "GiB" in out.splitlines()[1] and "4,194,304 KV bytes per token" in out.splitlines()[0]


@needs_core
def test_simulate_timed(capsys: pytest.CaptureFixture[str], hand_trace: Path) -> None:
    status, out, _ = run(capsys, "simulate", str(hand_trace), "--block-tokens", "4", "--capacity-blocks", "6",
                         "--timed", "--prefill-tps", "1", "--decode-tps", "1", "--max-running", "2", "--json")
    (row,) = json_lines(out)
    assert status == 0 and row["mode"] == "timed" and row["capacity_tokens"] == 24
    assert (row["max_running"], row["prefill_tokens_per_s"]) == (2, 1.0) and row["peak_running"] <= 2
    status, out, _ = run(capsys, "simulate", str(hand_trace), "--block-tokens", "4", "--capacity-blocks", "6",
                         "--timed", "--policy", "lru", "adaptive", "--unbounded")
    lines = out.splitlines()
    assert status == 0 and lines[1].startswith("timed: prefill 10000 tokens/s")
    assert [line.split()[:2] for line in lines[3:]] == [["lru", "6"], ["lru", "unbounded"],
                                                       ["adaptive", "6"], ["adaptive", "unbounded"]]


@needs_core
def test_simulate_reads_stdin_and_warns(hand_trace: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "kvpool", "simulate", "-", "--capacity-blocks", "4", "--json"],
                          input=hand_trace.read_text(), capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert json_lines(done.stdout)[0]["trace"] == "stdin"
    # The hand trace counts 4 tokens per id: at the default 512 its lengths disagree with its ids.
    assert "warning: 4 of 4 requests have an input_length" in done.stderr


def test_simulate_a_corrupt_gzip_trace(capsys: pytest.CaptureFixture[str], hand_trace: Path, tmp_path: Path) -> None:
    import gzip

    data = bytearray(gzip.compress(hand_trace.read_bytes() * 50))
    data[40:80] = bytes(40)  # the deflate stream, past the header
    path = tmp_path / "corrupt.jsonl.gz"
    path.write_bytes(bytes(data))
    status, _, err = run(capsys, "simulate", str(path))
    assert status == 2 and "cannot read the trace" in err


def test_simulate_huge_capacities_are_clamped(capsys: pytest.CaptureFixture[str], hand_trace: Path) -> None:
    for args in (["--capacity-gib", "1e300", "--model", "llama3-8b"], ["--instances", "2", "--capacity-blocks", "2000000000"],
                 ["--model-layers", "full", "--capacity-blocks", "200000000"]):
        status, out, err = run(capsys, "simulate", str(hand_trace), *args)
        assert status == 0, err


def test_simulate_refuses_a_plot_path_that_is_a_directory(capsys: pytest.CaptureFixture[str], hand_trace: Path,
                                                          tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    (tmp_path / "d.png").mkdir()
    status, out, err = run(capsys, "simulate", str(hand_trace), "--plot", str(tmp_path / "d.png"))
    assert status == 2 and out == "" and "exists and is not a file" in err


@pytest.mark.parametrize("line", ["[1, 2]", '{"seq": 1}', '{"seq": 1, "events": [{"type": "BlockStored", '
                                  '"block_hashes": [[1]]}]}', '{"seq": "1", "events": []}'])
def test_events_stats_names_a_bad_record(capsys: pytest.CaptureFixture[str], tmp_path: Path, line: str) -> None:
    path = tmp_path / "rec.jsonl"
    path.write_text('{"seq": 0, "events": []}\n' + line + "\n")
    status, _, err = run(capsys, "events", "stats", str(path))
    assert status == 2 and "rec.jsonl:2: not a recorded batch" in err


def test_events_listen_refuses_a_bad_endpoint(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("zmq")
    status, _, err = run(capsys, "events", "listen", "nonsense://x", "--count", "1")
    assert status == 2 and "cannot connect" in err


def test_events_listen_without_the_wire_extra_says_what_to_install(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``events listen`` needs pyzmq and msgspec (the ``wire`` extra, not a dependency): without
    them a one-line error naming the extra, not an import traceback."""
    for module in ("zmq", "msgspec", "kvpool.publisher", "kvpool.wire"):
        monkeypatch.setitem(sys.modules, module, None)  # what an absent package looks like
    status, _, err = run(capsys, "events", "listen", "tcp://127.0.0.1:1", "--count", "1")
    assert status == 2 and "pip install 'kvpool[wire]'" in err


def test_simulate_leaves_min_out_where_it_is_no_bound(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """ids reached through different prefixes: the next request holding an id may not hit it,
    so Belady's MIN (which counts on it) is no bound and is left out, with a note."""
    path = tmp_path / "nc.jsonl"
    path.write_text("".join(json.dumps({"timestamp": i, "input_length": 512 * len(ids), "output_length": 1,
                                        "hash_ids": ids}) + "\n" for i, ids in enumerate([[3, 4], [1, 4], [3]])))
    status, out, err = run(capsys, "simulate", str(path), "--capacity-blocks", "3", "--policy", "lru")
    assert status == 0 and "belady" not in out and "Belady's MIN left out" in err


def test_simulate_refuses_a_vanishing_token_rate(capsys: pytest.CaptureFixture[str], hand_trace: Path) -> None:
    status, _, err = run(capsys, "simulate", str(hand_trace), "--timed", "--prefill-tps", "1e-310")
    assert status == 2 and "at least 0.001 tokens per second" in err
