"""``kvpool simulate --model-layers``: hybrid layouts replayed through ``GroupTables``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvpool.simulate import simulate_one
from kvpool.simulate_layers import PRESETS, parse_layout, simulate_layers
from kvpool.traces import synthetic_trace


def test_layouts_parse() -> None:
    assert parse_layout("full") == ["full"]
    assert parse_layout("swa:1024x2,full,chunked:64") == [
        ("sliding_window", 1024), ("sliding_window", 1024), "full", ("chunked_local", 64)]
    assert len(parse_layout("gemma3")) == 6
    for bad in ("swa", "swa:0", "window:8", "fullx0", "chunked:x"):
        with pytest.raises(ValueError):
            parse_layout(bad)


@pytest.mark.parametrize("capacity", [200, 1500])
def test_one_full_group_hits_exactly_what_the_pool_replay_hits(capacity: int) -> None:
    """The oracle: one full-attention group is the plain pool replay, hit for hit."""
    trace = synthetic_trace()
    ours = simulate_layers(trace, "full", capacity, block_tokens=512)
    plain = simulate_one(trace, capacity, block_tokens=512)
    assert ours.token_hit_ratio == pytest.approx(plain.token_hit_ratio)
    assert ours.resident_blocks_per_request == ours.full_attention_blocks_per_request


def test_windows_hold_fewer_blocks_and_every_preset_runs() -> None:
    trace = synthetic_trace()
    for name in PRESETS:
        r = simulate_layers(trace, name, 4000, block_tokens=512)
        assert 0.0 <= r.token_hit_ratio <= 1.0
        if name != "full":
            assert r.resident_blocks_per_request < r.full_attention_blocks_per_request


def test_a_window_keeps_what_a_partial_last_block_still_reaches() -> None:
    """A window group drops the blocks out of reach of the prompt's last token, which is the
    prompt's length, not its blocks' (hand-worked, 4-token blocks, a 4-token window: vLLM
    skips the first ``length - 4 + 1`` tokens). 12 tokens: window blocks 2 (tokens 9-12) and
    full 3; 16 tokens: 1 + 4; 10 tokens: tokens 7-10 span blocks 1 and 2, so 2 + 3 (counted as
    1 + 3 when the last block was taken as full)."""
    from kvpool.traces import parse_trace

    rows = [(12, [1, 2, 3]), (16, [1, 2, 3, 4]), (10, [1, 2, 5])]
    trace = parse_trace([json.dumps({"timestamp": 0, "input_length": n, "output_length": 1, "hash_ids": ids})
                         for n, ids in rows], name="hand")
    r = simulate_layers(trace, "swa:4,full", 100, block_tokens=4)
    assert r.resident_blocks_per_request == pytest.approx((4 + 5 + 5) / 3)


def test_cli_prints_a_table_and_json(tmp_path: object) -> None:
    from kvpool.traces import synthetic_trace as make

    path = f"{tmp_path}/t.jsonl"
    trace = make()
    with open(path, "w") as f:
        for i in range(trace.num_requests):
            f.write(json.dumps({"timestamp": i, "input_length": trace.input_lengths[i], "output_length": 1,
                                "hash_ids": [int(h) for h in trace.hash_ids[i]]}) + "\n")
    run = subprocess.run([sys.executable, "-m", "kvpool", "simulate", path, "--model-layers", "gpt-oss", "full",
                          "--capacity-blocks", "800", "--json"], capture_output=True, text=True, check=True)
    rows = [json.loads(line) for line in run.stdout.splitlines()]
    assert [r["layout"] for r in rows] == ["gpt-oss", "full"]
    bad = subprocess.run([sys.executable, "-m", "kvpool", "simulate", path, "--model-layers", "swa:0"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "swa:0" in bad.stderr
