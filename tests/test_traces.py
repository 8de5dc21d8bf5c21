"""Loading and validating Mooncake traces, and the seeded synthetic trace (``kvpool.traces``)."""

from __future__ import annotations

import gzip
import io
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from kvpool.traces import (
    MOONCAKE_BLOCK_TOKENS,
    TraceError,
    dump_trace,
    is_prefix_consistent,
    load_trace,
    parse_trace,
    synthetic_trace,
    trace_warnings,
)

SHARED = Path("/work/shared/traces")
GOOD = '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1, 2, 3]}'


def write(tmp_path: Path, text: str, name: str = "t.jsonl") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --------------------------------------------------------------------------------------------
# Loading.
# --------------------------------------------------------------------------------------------


def test_load_valid_trace(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD + "\n\n" + '{"timestamp": 1.5, "input_length": 0, "output_length": 0, "hash_ids": []}\n')
    trace = load_trace(path)
    assert trace.name == "t.jsonl"
    assert trace.num_requests == 2  # the blank line is skipped
    assert trace.timestamps == [0.0, 1.5]
    assert trace.input_lengths == [10, 0]
    assert trace.output_lengths == [2, 0]
    assert [ids.tolist() for ids in trace.hash_ids] == [[1, 2, 3], []]
    assert all(ids.dtype == np.uint64 for ids in trace.hash_ids)
    assert trace.num_blocks == 3
    assert trace.distinct_ids() == 3
    assert trace.max_request_blocks == 3


def test_hash_ids_up_to_64_bits(tmp_path: Path) -> None:
    top = 2**64 - 1
    trace = load_trace(write(tmp_path, json.dumps({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0, top]})))
    assert trace.hash_ids[0].tolist() == [0, top]


def test_extra_fields_are_ignored(tmp_path: Path) -> None:
    obj = json.loads(GOOD) | {"session": "abc"}
    assert load_trace(write(tmp_path, json.dumps(obj))).num_requests == 1


BAD_LINES = [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object, got an array"),
    ('"text"', "expected a JSON object, got a string"),
    ('{"timestamp": 0, "input_length": 1, "output_length": 1}', "missing field 'hash_ids'"),
    ('{"hash_ids": []}', "missing field 'timestamp', 'input_length', 'output_length'"),
    ('{"timestamp": 0, "input_length": -1, "output_length": 1, "hash_ids": []}', "'input_length' must be >= 0, got -1"),
    ('{"timestamp": 0, "input_length": 1, "output_length": -5, "hash_ids": []}', "'output_length' must be >= 0, got -5"),
    ('{"timestamp": 0, "input_length": 1.5, "output_length": 1, "hash_ids": []}', "'input_length' must be an integer, got 1.5"),
    ('{"timestamp": 0, "input_length": true, "output_length": 1, "hash_ids": []}', "'input_length' must be an integer, got true"),
    ('{"timestamp": "0", "input_length": 1, "output_length": 1, "hash_ids": []}', "'timestamp' must be a finite number"),
    ('{"timestamp": NaN, "input_length": 1, "output_length": 1, "hash_ids": []}', "'timestamp' must be a finite number"),
    ('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": 3}', "'hash_ids' must be an array of integers"),
    ('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1, -2]}', "'hash_ids'[1] = -2 is outside"),
    ('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [18446744073709551616]}', "is outside 0..2**64-1"),
    ('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1, "2"]}', "'hash_ids'[1] must be an integer"),
    ('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1.0]}', "'hash_ids'[0] must be an integer"),
]


@pytest.mark.parametrize(("line", "reason"), BAD_LINES)
def test_bad_line_names_file_and_line(tmp_path: Path, line: str, reason: str) -> None:
    path = write(tmp_path, f"{GOOD}\n\n{line}\n{GOOD}\n")
    with pytest.raises(TraceError) as info:
        load_trace(path)
    message = str(info.value)
    assert message.startswith(f"{path}:3: "), message  # blank lines still count
    assert reason in message


def test_invalid_utf8_is_a_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(GOOD.encode() + b"\n\xff\xfe\n")
    with pytest.raises(TraceError, match=r"t\.jsonl:2: not valid UTF-8"):
        load_trace(path)


@pytest.mark.parametrize("text", ["", "\n\n  \n"])
def test_empty_file(tmp_path: Path, text: str) -> None:
    with pytest.raises(TraceError, match="the trace is empty"):
        load_trace(write(tmp_path, text))


def test_gzip_and_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = GOOD + "\n" + GOOD + "\n"
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(gzip.compress(text.encode()))
    trace = load_trace(path)
    assert trace.name == "t.jsonl" and trace.num_requests == 2
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    trace = load_trace("-")
    assert trace.name == "stdin" and trace.num_requests == 2


def test_bad_gzip(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(b"not gzip at all")
    with pytest.raises(TraceError, match="cannot read the trace"):
        load_trace(path)
    path.write_bytes(gzip.compress(((GOOD + "\n") * 50).encode())[:-12])
    with pytest.raises(TraceError, match="truncated|cannot read"):
        load_trace(path)


def test_warnings() -> None:
    def row(t: float, n: int, ids: list[int]) -> str:
        return json.dumps({"timestamp": t, "input_length": n, "output_length": 0, "hash_ids": ids})

    good = parse_trace([row(0, 8, [1, 2]), row(1, 5, [1, 3])])
    assert trace_warnings(good, 4) == []
    (lengths,) = trace_warnings(good, 2)
    assert "2 of 2 requests" in lengths and "--block-tokens" in lengths
    back = parse_trace([row(5, 8, [1, 2]), row(1, 4, [1])])
    assert any("timestamps go back 1 times (first at request 1)" in w for w in trace_warnings(back, 4))
    tangled = parse_trace([row(0, 8, [1, 2]), row(1, 8, [3, 2])])
    assert any("not prefix-chained" in w for w in trace_warnings(tangled, 4))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"nope\.jsonl: cannot read the trace: No such file"):
        load_trace(tmp_path / "nope.jsonl")


def test_directory_is_not_a_trace(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read the trace"):
        load_trace(tmp_path)


def test_trace_error_is_a_value_error() -> None:
    assert issubclass(TraceError, ValueError)


def test_parse_trace_accepts_str_lines() -> None:
    trace = parse_trace([GOOD, GOOD], name="mem")
    assert trace.name == "mem" and trace.num_requests == 2
    with pytest.raises(TraceError, match=r"^mem:2: "):
        parse_trace([GOOD, "{"], name="mem")


def test_dump_round_trip(tmp_path: Path) -> None:
    trace = synthetic_trace(50, seed=3)
    again = load_trace(write(tmp_path, dump_trace(trace)))
    assert list(again.requests()) == list(trace.requests())


# --------------------------------------------------------------------------------------------
# Prefix consistency.
# --------------------------------------------------------------------------------------------


def test_prefix_consistency() -> None:
    def make(*requests: list[int]) -> str:
        return "\n".join(json.dumps({"timestamp": 0, "input_length": 1, "output_length": 0, "hash_ids": r}) for r in requests)

    assert is_prefix_consistent(parse_trace(make([1, 2, 3], [1, 2, 4], [5]).splitlines()))
    assert not is_prefix_consistent(parse_trace(make([1, 2], [3, 2]).splitlines()))  # 2 after 1, then after 3
    assert not is_prefix_consistent(parse_trace(make([1, 2], [2]).splitlines()))  # 2 first, after 1 before
    assert not is_prefix_consistent(parse_trace(make([7, 7]).splitlines()))  # repeats within a request


# --------------------------------------------------------------------------------------------
# The synthetic trace.
# --------------------------------------------------------------------------------------------


def test_synthetic_is_deterministic() -> None:
    a, b = synthetic_trace(300, seed=7), synthetic_trace(300, seed=7)
    assert list(a.requests()) == list(b.requests())
    assert list(a.requests()) != list(synthetic_trace(300, seed=8).requests())


def test_synthetic_is_well_formed() -> None:
    trace = synthetic_trace()
    assert trace.num_requests == 4000
    assert is_prefix_consistent(trace)
    assert trace.timestamps == sorted(trace.timestamps)
    for length, ids in zip(trace.input_lengths, trace.hash_ids):
        assert len(ids) == math.ceil(length / MOONCAKE_BLOCK_TOKENS)
    assert all(n >= 1 for n in trace.output_lengths)
    # Shares prefixes (a fair share of ids repeat) but not everything, and more distinct ids
    # than the trace-replay pool (20,000 blocks) holds, so that pool evicts.
    assert 0.3 < 1 - trace.distinct_ids() / trace.num_blocks < 0.7
    assert trace.distinct_ids() > 20_000


def test_synthetic_block_tokens() -> None:
    trace = synthetic_trace(100, seed=1, block_tokens=64)
    for length, ids in zip(trace.input_lengths, trace.hash_ids):
        assert len(ids) == math.ceil(length / 64)


@pytest.mark.parametrize("kwargs", [{"num_requests": 0}, {"block_tokens": 0}])
def test_synthetic_rejects_bad_arguments(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        synthetic_trace(**({"num_requests": 10} | kwargs))


# --------------------------------------------------------------------------------------------
# The shared Mooncake traces.
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "requests"), [("conversation_trace.jsonl", 12_031), ("synthetic_trace.jsonl", 3_993)])
def test_shared_traces_load(name: str, requests: int) -> None:
    path = SHARED / name
    if not path.exists():
        pytest.skip(f"{path} is absent")
    trace = load_trace(path)
    assert trace.num_requests == requests
    assert is_prefix_consistent(trace)
